"""Grounding: each answer sentence is checked against the evidence, and citations open at
the supporting line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from crag import Agent, Settings
from crag.answer import NO_EVIDENCE, STATS_HEADING, StreamRenderer, compose
from crag.grounding import UNSUPPORTED_TAG, claims, clauses, ground, note_line, passages, render_prefix, split
from crag.index.chunker import chunk_text
from crag.llm.scripted import ScriptedChatModel
from crag.prompts import clean_answer, strip_think
from crag.state import EvidenceItem, Usage

from .fakes import FakeToolbox, route, search_plan

PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SETUP = EvidenceItem(
    "vector_search", "docs/setup.md",
    "## Ports\n\nThe server listens on port 8080 by default.\n"
    "Set `SERVICE_PORT` to change the port the server listens on.\n\n"
    "## Retries\n\nThe client retries failed uploads three times before it gives up.",
    20, 28, 0.7,
)
BACKUP = EvidenceItem(
    "grep_search", "docs/backup.md",
    "# Backups\n\nNightly backups are written to the object store at 02:00 UTC.\nA backup is kept for thirty days.",
    1, 4, anchor_line=3,
)
ITEMS = (SETUP, BACKUP)


def lines_of(g):
    return [(s.source, s.start_line) for s in g.sources]


# -- what is supported ---------------------------------------------------------------------


def test_a_copied_sentence_gets_a_marker_at_the_line_where_it_starts():
    g = ground("The client retries failed uploads three times before it gives up.", ITEMS)
    assert g.body == "The client retries failed uploads three times before it gives up [1]."
    assert lines_of(g) == [("docs/setup.md", 27)]
    assert g.report.sentences == 1 and g.report.supported == 1 and g.report.unsupported == ()


def test_terminal_escape_sequences_are_neither_words_nor_numbers_of_a_sentence():
    """A reply that colours a word (``\\x1b[31m...\\x1b[0m``: what a terminal-trained model may
    write) made "31mretries" a word and 31 and 0 numbers the sentence claims, so a sentence
    copied from the evidence was unsupported and the simple path refused the answer. The
    escape sequences are read as the terminal shows them: not at all."""
    g = ground("The client \x1b[31mretries\x1b[0m failed uploads three times before it gives up.", ITEMS)
    assert g.report.sentences == 1 and g.report.supported == 1 and g.report.unsupported == ()
    assert lines_of(g) == [("docs/setup.md", 27)]
    assert claims("The \x1b]0;title\x07server listens on port \x1b[1m8080\x1b[0m.") == claims(
        "The server listens on port 8080.")
    from crag.grounding import missing

    assert missing("\x1b[31mWhen\x1b[0m does the server listen on port 8080?", [SETUP.text]) == []


def test_escape_sequences_in_the_evidence_are_not_part_of_its_words():
    """A log captured with its colours (``\\x1b[31mretries``) made "31mretry" a word of the
    evidence, so a sentence quoting it as a terminal shows it lacked its words there."""
    from crag.grounding.evidence import vocabulary

    coloured = "\x1b[1;31mretries\x1b[0m \x1b[33mfailed\x1b[0m \x1b[1muploads\x1b[0m three times."
    assert vocabulary(coloured) == vocabulary("retries failed uploads three times.")
    log = EvidenceItem("vector_search", "logs/ci.log", f"Upload step\n{coloured}\n", 1, 2, 0.7)
    g = ground("Retries failed uploads three times.", (log,))
    assert g.report.supported == 1 and g.report.unsupported == ()


def test_a_marker_on_an_item_that_does_not_support_the_sentence_moves_to_the_one_that_does():
    g = ground("A backup is kept for thirty days [1].", ITEMS)
    assert g.body == "A backup is kept for thirty days [1]." and lines_of(g) == [("docs/backup.md", 4)]


def test_a_grep_item_is_cited_at_the_supporting_line_of_its_window():
    g = ground("Nightly backups go to the object store at 02:00 UTC [2].", ITEMS)
    assert lines_of(g) == [("docs/backup.md", 3)]


def test_lines_with_no_full_stop_are_cited_at_the_line_that_holds_the_sentence():
    """Lines with no full stop (a PDF page, a plain-text note, a list of settings) read as one
    passage; the citation opens at the line holding the sentence, not at the passage's first line."""
    page = EvidenceItem(
        "vector_search", "kb/guide.pdf",
        "Page three\nalpha\nbeta\ngamma\nThe flux capacitor needs 1.21 gigawatts.\nend of page three.", 2001, 2006, 0.4,
    )
    notes = EvidenceItem("grep_search", "kb/notes.txt", "plain text notes\nthe zebra protocol uses port 4242\nend", 1, 3,
                         anchor_line=2)
    config = EvidenceItem("read_file", "kb/app.conf", "port: 8080\nhost: example.org\nupload timeout: 30 seconds", 1, 3)
    g = ground("The flux capacitor needs 1.21 gigawatts [1]. The zebra protocol uses port 4242 [2]. "
               "The upload timeout is 30 seconds [3].", (page, notes, config))
    assert lines_of(g) == [("kb/guide.pdf", 2005), ("kb/notes.txt", 2), ("kb/app.conf", 3)]
    assert [(s.start_line, s.end_line) for s in g.sources] == [(2005, 2005), (2, 2), (3, 3)]


def test_a_title_line_sharing_a_word_with_the_sentence_is_not_where_its_citation_opens():
    """A short title line above a sentence (a PDF page's header, a plain-text note's heading)
    with no full stop reads as one passage with it; when the title shares a word with the
    sentence ("Wombat notes" / "The wombat digs ..."), the citation still opens at the line
    where the sentence starts: the lines below hold all of it."""
    notes = EvidenceItem("vector_search", "kb/notes.txt",
                         "Wombat notes\nThe wombat digs burrows at night.", 4, 5, 0.4)
    wrapped = EvidenceItem("vector_search", "kb/wrapped.txt",
                           "Quokka feeder\nThe quokka feeder\nrefills every six hours.", 10, 12, 0.4)
    g = ground("The wombat digs burrows at night [1]. The quokka feeder refills every six hours [2].",
               (notes, wrapped))
    assert g.report.supported == 2
    assert [(s.start_line, s.end_line) for s in g.sources] == [(5, 5), (11, 12)]


def test_a_version_written_on_after_letters_is_held_where_it_is_written_and_nowhere_else():
    """"py3.12" read as the number "12" (the digits after its dot), which no text holds as a
    number of its own, so a sentence copied word for word from its passage was unsupported,
    and so was any table row quoting a container image ("...-transformers5.8.1-gpu"). The
    number is "3.12", and a changed version is still caught."""
    text = "The image runs on py3.12 with cuda12.1 and transformers5.8.1 installed."
    item = EvidenceItem("vector_search", "docs/image.md", text, 3, 3, 0.5)
    assert ground(text + " [1]", (item,)).report.supported == 1
    for old, new in (("py3.12", "py3.11"), ("cuda12.1", "cuda12.2"), ("transformers5.8.1", "transformers5.9.1")):
        assert ground(text.replace(old, new) + " [1]", (item,)).report.supported == 0, new


@pytest.mark.parametrize("include", [
    "{* ../../docs_src/request_forms_and_files/tutorial001_py310.py hl[10:12] *}",
    '--8<-- "docs_src/request_forms_and_files/tutorial001.py"',
    "{% include 'request_forms_and_files.md' %}",
])
def test_an_include_line_is_not_text_a_sentence_is_cited_at(include):
    """An include directive's words are a file's path ("request forms and files"): a sentence
    about uploading files and form data is cited where the document says it, not at the
    directive above it."""
    doc = EvidenceItem("vector_search", "docs/forms.md",
                       f"Create file parameters:\n\n{include}\n\n"
                       "The files and fields will be uploaded as form data.", 20, 24, 0.5)
    g = ground("The files are uploaded in the request as form data [1].", (doc,))
    assert g.report.supported == 1
    assert [(s.start_line, s.end_line) for s in g.sources] == [(24, 24)]


def test_a_sentence_copied_from_the_evidence_is_cited_where_it_is_written():
    """A sentence copied word for word (what the offline answer quotes) was cited at the first
    passage holding its words: a heading above it ("## Available responses" for "Here are
    some of the available responses."), or another sentence about the same thing."""
    doc = EvidenceItem("vector_search", "docs/responses.md",
                       "## Available responses\n\nHere are some of the available responses.\n\n"
                       "Running `fastapi dev` initiates development mode.\n\n"
                       "By default, auto-reload is enabled. You should only use it for development.", 94, 100, 0.5)
    g = ground("Here are some of the available responses. You should only use it for development [1].", (doc,))
    assert g.report.supported == 2
    assert [s.start_line for s in g.sources] == [96, 100]



def test_a_copied_lead_in_that_is_not_judged_is_cited_where_it_is_written():
    """A lead-in ("You could have a `.env` file with:") is not judged; its marker pointed at
    the whole item, so the footer opened at the chunk's first line (its heading), not at the
    line the quoted sentence starts on."""
    doc = EvidenceItem("vector_search", "docs/settings.md",
                       "### The `.env` file\n\nYou could have a `.env` file with:\n\n```bash\nAPP_NAME=\"App\"\n```",
                       207, 213, 0.5)
    g = ground("- You could have a `.env` file with: [1]", (doc,), question="How do I read a `.env` file?")
    assert g.report.sentences == 0
    assert [s.start_line for s in g.sources] == [209]


LLM_TEST = EvidenceItem(
    "vector_search", "kb/llm.md",
    "# LLM test file { #llm-test-file }\n\nThis document tests if the translation prompt is understood.\n\n"
    "Tests added here will be seen by all designers of language specific prompts.\n\nUse as follows:",
    1, 7, 0.5,
)


@pytest.mark.parametrize("mode", ["note", "strict", "off"])
def test_a_short_line_that_is_not_judged_is_cited_at_the_line_it_is_on(mode: str):
    """"Use as follows:" has no content word of its own, so it is not judged, and it is shorter
    than a sentence found word for word: its marker (the offline answer quotes it) pointed at
    the whole item and the footer opened at the chunk's first line, its heading (L1), not at
    L7, where the quoted sentence is."""
    for answer in ("- Use as follows: [1]", "Use as follows [1]:"):  # the offline quote, a model's copy
        g = ground(answer, (LLM_TEST,), mode, "How are abbr titles translated?")
        assert lines_of(g) == [("kb/llm.md", 7)] and g.body == answer
    # three words at least, standing as words of their own: two words, or a piece a word runs
    # into, are no quote of that line, and stay where they were
    assert lines_of(ground("Use as [1].", (LLM_TEST,), mode, "q")) == [("kb/llm.md", 1)]
    assert lines_of(ground("e as follows [1]:", (LLM_TEST,), mode, "q")) == [("kb/llm.md", 1)]


SPACES = EvidenceItem(
    "vector_search", "docs/spaces.md",
    "# Spaces\n\nThe sync action keeps a Space in step with GitHub.\nIt runs on every push.",
    1, 4, 0.6,
)
REPOS = EvidenceItem(
    "vector_search", "docs/repos.md",
    "# Repositories\n\nIntro.\n\nThe sync action keeps a repository in step with a GitHub repository.",
    10, 15, 0.6,
)
OTHER_CHUNK = EvidenceItem(
    "vector_search", "docs/spaces.md",
    "The sync action keeps a Space in step with GitHub.", 3, 3, 0.5,
)


def test_other_files_that_hold_the_sentence_are_cited_beside_the_models_marker():
    g = ground("The sync action keeps a repository in step with a GitHub repository [1].", (SPACES, OTHER_CHUNK, REPOS))
    assert g.body == "The sync action keeps a repository in step with a GitHub repository [1][2]."
    assert lines_of(g) == [("docs/spaces.md", 3), ("docs/repos.md", 14)]  # not the second chunk of spaces.md


def test_an_unmarked_sentence_gets_the_best_item_first_then_the_others_that_hold_it():
    g = ground("The sync action keeps a repository in step with a GitHub repository.", (SPACES, REPOS))
    assert g.body == "The sync action keeps a repository in step with a GitHub repository [1][2]."
    assert lines_of(g) == [("docs/repos.md", 14), ("docs/spaces.md", 3)]  # five of its six words


def test_the_offline_answers_quotes_cite_only_the_line_they_were_copied_from():
    # SPEC §7: the offline answer "cites the line where each quoted sentence starts"; a file that
    # holds most of a quote's words was cited beside it, at a line that does not show it.
    from crag.answer import OFFLINE_PREFACE

    body = f"{OFFLINE_PREFACE}\n\n- The sync action keeps a repository in step with a GitHub repository. [2]"
    g = ground(body, (SPACES, REPOS))
    assert g.body.endswith("GitHub repository. [1]") and lines_of(g) == [("docs/repos.md", 14)]


def test_a_file_holding_fewer_of_a_sentences_words_does_not_corroborate_it():
    items = [EvidenceItem("vector_search", f"kb/{a}.md", f"The {a} lives in the north.", 1, 1, 0.5)
             for a in ("walrus", "narwhal", "ocelot")]
    g = ground("The walrus lives in the north [1].", items)
    assert g.body == "The walrus lives in the north [1]."
    g = ground("The walrus lives in the north.", items)
    assert g.body == "The walrus lives in the north [1]." and lines_of(g) == [("kb/walrus.md", 1)]


def test_an_evidence_header_copied_as_a_reference_becomes_its_marker():
    g = ground("1. The server listens on port 8080 by default, see `docs/setup.md:L20-L28`.\n"
               "2. A backup is kept for thirty days [docs/backup.md:L4].\n"
               "3. Edit `docs/setup.md` and `docs/setup.md:L99` to change it.", ITEMS)
    assert g.body.splitlines()[:2] == ["1. The server listens on port 8080 by default, see [1].",
                                       "2. A backup is kept for thirty days [2]."]
    assert "`docs/setup.md` and `docs/setup.md:L99`" in g.body  # a path without a line, or a line no item holds
    assert lines_of(g) == [("docs/setup.md", 22), ("docs/backup.md", 4)]


@pytest.mark.parametrize("written", ["[Source 1]", "(source 1)", "[source #1]", "[Evidence 1]", "(Item 1)", "[Ref 1]",
                                     "[^1]", "(1)"])
def test_a_marker_written_with_a_word_is_the_marker_of_that_item(written):
    """Models write "[Source 1]" or "(source 1)" for [1]; its number is no claim of the sentence."""
    g = ground(f"The server listens on port 8080 by default {written}. A backup is kept for thirty days {written[:-2]}2{written[-1]}.",
               ITEMS)
    assert g.body == "The server listens on port 8080 by default [1]. A backup is kept for thirty days [2]."
    assert g.report.supported == 2 and lines_of(g) == [("docs/setup.md", 22), ("docs/backup.md", 4)]
    kept = ground("Our source 1 of truth is the server on port 8080 [Source 3].", ITEMS)  # no item 3: left as written
    assert "[Source 3]" in kept.body
    link = ground("The server listens on port 8080 [Source 1](https://example.org/s1) [1].", ITEMS)
    assert "[Source 1](https://example.org/s1)" in link.body  # a link's text, not a marker


def test_a_markdown_link_whose_text_is_an_items_number_is_its_marker():
    """Models that cite with links write "[2](docs/backup.md)": read as a link, its "2" was a
    number no evidence holds, and a right answer was refused. A page's anchor stays a link."""
    g = ground("The server listens on port 8080 by default [1](docs/setup.md). "
               "A backup is kept for thirty days ([2](https://example.org/backup)).", ITEMS)
    assert g.body == "The server listens on port 8080 by default [1]. A backup is kept for thirty days ([2])."
    assert g.report.supported == 2 and lines_of(g) == [("docs/setup.md", 22), ("docs/backup.md", 4)]
    kept = ground("The server listens on port 8080, as step [1](#step-1) shows [1].", ITEMS)
    assert "[1](#step-1)" in kept.body


def test_a_number_in_parentheses_is_a_marker_only_where_a_citation_goes():
    """ "... 8080 (1)." cites item 1 (it was a number no item holds: the answer was refused); a
    number naming no item, "(1, 2)", one opening a list item or inside a sentence or code, and
    any after a bracketed marker (a reply citing so means it as written), are left as written."""
    g = ground("The server listens on port 8080 by default (1), and a backup is kept for thirty days (2)",
               ITEMS)
    assert g.report.supported == 1 and "(" not in g.body and "[1]" in g.body
    for kept in ("The server listens on port 8080 by default (3).", "(1) The server listens on port 8080 by default.",
                 "The server listens on port 8080 (1) by default.", "Call `f (1).` on port 8080 by default.",
                 "The server listens on port 8080 by default (1, 2).",
                 # a reply citing with brackets means its numbers in parentheses as written
                 "The server listens on port 8080 by default [1]. Its exit status is (1)."):
        assert ("(3)" if "(3)" in kept else "(1") in ground(kept, ITEMS).body, kept
    # before any bracketed marker it is one, in a reply mixing the two forms
    mixed = ground("The server listens on port 8080 by default (1), and a backup is kept for thirty days [2].", ITEMS)
    assert mixed.body == "The server listens on port 8080 by default [1], and a backup is kept for thirty days [2]."


def test_markdown_footnotes_are_markers_and_their_definitions_a_source_list():
    """A model writing Markdown footnotes: "[^1]" is [1], and its "[^1]: path:L22" lines are the
    source list crag writes itself (a footnote in code stays)."""
    from crag.prompts import clean_answer

    body = clean_answer("The server listens on port 8080 by default.[^1] Run `x[^2]`.\n\n[^1]: docs/setup.md:L22\n")
    g = ground(body, ITEMS)
    assert g.body.startswith("The server listens on port 8080 by default.[1]") and "`x[^2]`" in g.body
    assert "docs/setup.md:L22" not in g.body and lines_of(g)[0] == ("docs/setup.md", 22)


def test_corroborating_files_are_few_and_each_supports_the_sentence():
    copies = tuple(EvidenceItem("vector_search", f"docs/copy{k}.md", SETUP.text, 1, 9, 0.5) for k in range(5))
    g = ground("The server listens on port 8080 by default [1].", (*copies, BACKUP))
    assert g.body == "The server listens on port 8080 by default [1][2][3]."
    assert [s for s, _ in lines_of(g)] == ["docs/copy0.md", "docs/copy1.md", "docs/copy2.md"]
    g = ground("The server listens on port 8080 by default [1]. Nightly backups are written at 02:00 UTC [2].",
               (SETUP, BACKUP))
    assert g.body == "The server listens on port 8080 by default [1]. Nightly backups are written at 02:00 UTC [2]."


@pytest.mark.parametrize("sentence", [
    "The server listens on port 9090 by default.",  # a changed number
    "The server does not listen on port 8080 by default.",  # a negated claim
    "A backup is kept for ninety days.",  # a changed number word
    "The service was released on October 22, 2024 [1].",  # a date no item holds
    "Uploads are encrypted with AES before they leave the client [1].",  # invented
])
def test_changed_negated_and_invented_sentences_are_not_supported(sentence):
    g = ground(sentence, ITEMS)
    assert g.report.supported == 0 and len(g.report.unsupported) == 1
    assert UNSUPPORTED_TAG in g.body and "[1]" not in g.body and g.sources == ()


NARWHAL = EvidenceItem("vector_search", "narwhal.md",
                       "# Narwhal\n\nThe narwhal lives in the Arctic.\nIts tusk can grow to 3 metres long.\n"
                       "Narwhals do not live in captivity for long.", 1, 5)
AGENT_OS = EvidenceItem("vector_search", "os.md",
                        "The agent is not supported on Windows.\nThe agent is supported on Linux and macOS.", 1, 2)


@pytest.mark.parametrize("sentence, item, supported", [
    ("Narwhals live in captivity for long.", NARWHAL, False),  # the "not" dropped
    ("Narwhals do not live in captivity for long.", NARWHAL, True),
    ("The agent is supported on Windows.", AGENT_OS, False),
    ("The agent is not supported on Windows.", AGENT_OS, True),
    ("The agent is supported on Linux.", AGENT_OS, True),
])
def test_negation_is_read_in_the_passage_of_the_item_holding_most_of_the_sentence(sentence, item, supported):
    """A sentence with its "not" dropped was supported by a neighbouring passage that holds
    fewer of its words and does not negate ("The narwhal lives in the Arctic. Its tusk can
    grow to 3 metres long." for "Narwhals live in captivity for long.")."""
    g = ground(sentence, (item,))
    assert g.report.supported == int(supported)


OXYGEN = EvidenceItem("vector_search", "Oxygen.txt",
                      "Oxygen is the oxidant, not the fuel, but nevertheless the source of most of the chemical "
                      "energy released in combustion.", 8, 8)
CACHE = EvidenceItem("vector_search", "cache.md",
                     "The cache is enabled by default, but it does not persist across restarts.", 1, 1)
AMA = EvidenceItem("grep_search", "Pharmacy.txt",
                   "However, the American Medical Association (AMA) Code of Ethics provides that physicians may "
                   "dispense drugs within their office practices as long as there is no patient exploitation.", 21, 21)
UPLOADS = EvidenceItem("vector_search", "uploads.md",
                       "Uploads are retried three times unless the server does not answer at all.", 1, 1)


@pytest.mark.parametrize("sentence, item, supported", [
    ("Oxygen is the oxidant in combustion.", OXYGEN, True),  # the "not" is the fuel's
    ("Oxygen is the fuel.", OXYGEN, False),
    ("Oxygen is not the fuel.", OXYGEN, True),
    ("Oxygen is the oxidant, not the fuel.", OXYGEN, True),
    ("The cache is enabled by default.", CACHE, True),
    ("The cache persists across restarts.", CACHE, False),
    ("The cache does not persist across restarts.", CACHE, True),
    # a condition is a clause of its own ("as long as", "unless", "if")
    ("The body that has stated that physicians can also dispense drugs under specific conditions is the "
     "American Medical Association (AMA).", AMA, True),
    ("Physicians may dispense drugs within their office practices.", AMA, True),
    ("Uploads are retried three times.", UPLOADS, True),
    ("The server always answers at all.", UPLOADS, False),  # the condition's own "not" still denies it
])
def test_a_sentence_negates_where_its_clause_holding_the_claim_does(sentence, item, supported):
    """A passage's "not" in another clause than the claim's does not deny the claim: Qwen's
    "Oxygen is the oxidant in combustion [1]" was unsupported by "Oxygen is the oxidant, not the
    fuel, ..." and a right answer was refused; "X may dispense drugs as long as there is no
    patient exploitation" states that X may (Qwen's right answer naming the American Medical
    Association got the no-evidence answer)."""
    assert ground(sentence, (item,)).report.supported == int(supported)


PAULI = EvidenceItem("vector_search", "Force.txt",
                     "The rigidity of solid matter actually results from the Pauli exclusion principle. Since "
                     "electrons are fermions, they cannot occupy the same quantum mechanical state as other "
                     "electrons.", 30, 30)
TIMING = EvidenceItem("vector_search", "auth.md",
                      "Comparing in constant time prevents attackers from guessing the password.", 1, 1)


@pytest.mark.parametrize("sentence, item, supported", [
    ("Rigidity is caused by the Pauli exclusion principle, which prevents electrons from occupying the same "
     "quantum mechanical state as other electrons.", PAULI, True),
    ("Electrons can occupy the same quantum mechanical state as other electrons.", PAULI, False),
    ("Attackers cannot guess the password when it is compared in constant time.", TIMING, True),
    ("Attackers guess the password when it is compared in constant time.", TIMING, False),
])
def test_a_thing_kept_from_doing_another_negates(sentence, item, supported):
    """"X prevents electrons from occupying" says what "electrons cannot occupy" does: Qwen's
    right answer about the Pauli exclusion principle was unsupported (a positive claim against a
    passage that negates) and refused, and "prevents attackers from guessing" read as saying
    that they guess."""
    assert ground(sentence, (item,)).report.supported == int(supported)


PLAN_LIST = EvidenceItem("vector_search", "plans.md",
                         "# Plans\n\n- Basic plan: 5 GB storage\n- Pro plan: 50 GB storage\n", 1, 4)
PLAN_TABLE = EvidenceItem("vector_search", "prices.md",
                          "| Plan | Price | Storage |\n| --- | --- | --- |\n| Basic | $0 | 5 GB |\n"
                          "| Pro | $9 | 50 GB |\n| Team | $29 | 500 GB |\n", 1, 5)


@pytest.mark.parametrize("sentence, item, supported", [
    ("The Pro plan offers 5 GB storage.", PLAN_LIST, False),  # "Pro" from one item, "5" from the other
    ("The Pro plan includes 500 GB of storage.", PLAN_TABLE, False),  # a cell of the row below
    ("The Pro plan offers 50 GB storage.", PLAN_LIST, True),
    ("The Basic plan has 5 GB of storage and the Pro plan has 50 GB.", PLAN_LIST, True),
    ("The Team plan includes 500 GB of storage.", PLAN_TABLE, True),
    ("The Basic plan offers 5 GB storage.", PLAN_TABLE, True),  # a few cells of one row, under its header
])
def test_a_sentence_is_not_read_from_two_rows_or_list_items_unless_it_states_both(sentence, item, supported):
    """A window over two list items (or table rows) lent a sentence the number of one and the
    subject of the other: "The Pro plan offers 5 GB storage" was cited to "- Basic plan: 5 GB
    storage" and "- Pro plan: 50 GB storage"."""
    assert ground(sentence, (item,)).report.supported == int(supported)


NEW_YORK = EvidenceItem(
    "vector_search", "New_York_City.txt",
    "In 1664, Peter Stuyvesant, the Director-General of the colony of New Netherland, surrendered New "
    "Amsterdam to the English without bloodshed. The English promptly renamed the fledgling city \"New York\".",
    12, 12, 0.6,
)


def test_an_ordinal_no_item_holds_is_a_claim_not_supported():
    # Qwen2.5-Coder-1.5B's answer; every other word of it is in the passage or near it.
    g = ground("New York City was founded in 1664 and was the third English colony in North America [1].", (NEW_YORK,))
    assert g.report.supported == 0
    held = EvidenceItem("vector_search", "colonies.md", "New York, taken in 1664, was the 3rd English colony.", 1, 1)
    assert ground("New York was the third English colony, taken in 1664 [1].", (held,)).report.supported == 1
    assert claims("First, restart the server a second time.").anchors == ()  # instructions and units


def test_a_name_of_letters_and_digits_is_held_only_as_that_name():
    # "The item106 belongs to the bison herd." was cited to f1.md, which says item1.
    items = tuple(EvidenceItem("vector_search", f"kb/f{i}.md", f"# F{i}\n\nThe item{i} belongs to the bison herd.", 1, 3)
                  for i in (1, 106))
    g = ground("The item106 belongs to the bison herd [1].", items)
    assert g.report.supported == 1 and [s.source for s in g.sources] == ["kb/f106.md"]
    http = EvidenceItem("vector_search", "docs/http.md", "Uvicorn serves HTTP/2 with Python 3.11.", 1, 1)
    assert ground("Uvicorn serves HTTP2 with Python3.", (http,)).report.supported == 1  # written apart, the same name
    assert ground("Uvicorn serves HTTP3 with Python3.", (http,)).report.supported == 0


QUANT = EvidenceItem("vector_search", "docs/quant.md",
                     "| type | source | description |\n| --- | --- | --- |\n"
                     "| Q4_1 | [GH](https://example.com/pull/615) | 4-bit quantization. Legacy method (not used widely). |\n"
                     "| Q4_K | [GH](https://example.com/pull/1684) | 4-bit quantization with super-blocks. |", 10, 13, 0.5)


@pytest.mark.parametrize(("sentence", "supported"), [
    ("- Q4_1: [GH](https://example.com/pull/615)", True),  # the row's "not" is in a cell the claim does not use
    ("Q4_1 is a legacy method, not used widely.", True),
    ("Q4_1 is a legacy method that is used widely.", False),  # the cell it comes from says "not"
])
def test_a_table_row_is_negated_only_in_the_cells_a_claim_draws_on(sentence, supported):
    g = ground(sentence, (QUANT,))
    assert g.report.supported == int(supported)
    assert (g.sources[0].source == "docs/quant.md") if supported else UNSUPPORTED_TAG in g.body


def test_a_sentence_no_item_holds_whole_is_judged_clause_by_clause():
    # steps from two pages joined in one sentence: each clause cites its own page
    g = ground("To change the port, set `SERVICE_PORT` to change the port the server listens on, "
               "and nightly backups are written to the object store at 02:00 UTC.", ITEMS,
               question="How do I change the port?")
    assert g.body == ("To change the port, set `SERVICE_PORT` to change the port the server listens on [1], "
                      "and nightly backups are written to the object store at 02:00 UTC [2].")
    assert lines_of(g) == [("docs/setup.md", 23), ("docs/backup.md", 3)]
    assert g.report.sentences == 1 and g.report.supported == 1  # the report counts sentences
    # a supported clause and an invented one: the marker and the tag each go where they belong
    g = ground("A backup is kept for thirty days [2], and every copy is encrypted with a key the security "
               "team holds.", ITEMS)
    assert g.body == ("A backup is kept for thirty days [1], and every copy is encrypted with a key the security "
                      "team holds [unsupported].")
    assert lines_of(g) == [("docs/backup.md", 4)]
    assert g.report.sentences == 1 and g.report.supported == 0 and g.report.unsupported == (
        "A backup is kept for thirty days, and every copy is encrypted with a key the security team holds.",)


@pytest.mark.parametrize("sentence", [
    "The server listens on port 9090 by default, and backups are kept for ninety days.",  # no clause holds
    "Uploads are encrypted with AES, signed with a client key, and checked by the server.",
])
def test_a_sentence_none_of_whose_clauses_is_supported_is_tagged_once(sentence):
    g = ground(sentence, ITEMS)
    assert g.body.count(UNSUPPORTED_TAG) == 1 and g.report.sentences == 1 and g.sources == ()


def test_strict_mode_removes_a_sentence_that_is_only_partly_supported():
    g = ground("A backup is kept for thirty days, and every copy is encrypted with a key the security "
               "team holds.", ITEMS, "strict")
    assert g.body == "" and g.report.supported == 0


@pytest.mark.parametrize(("sentence", "parts"), [
    ("Import `Path`, `Query` and `Cookie` from `fastapi`.", 1),  # a list of names stays whole
    ("It runs on Linux, macOS and Windows, and the installer is signed.", 1),  # a short part joins its clause
    ("Import the class from the package, declare the cookie parameters like query ones, then read the value "
     "in the endpoint.", 3),
])
def test_clauses_are_cut_at_commas_into_parts_that_say_enough(sentence, parts):
    cut = clauses(sentence)
    assert "".join(cut) == sentence and len(cut) == parts


def test_sentences_of_a_blockquote_are_cut_across_its_lines():
    tip = EvidenceItem("vector_search", "docs/tip.md",
                       "> [!TIP]\n> Set a `SECRET_KEY` secret to keep user sessions alive across restarts.\n"
                       "> Without it, a random key is made on each boot and all users are logged out.", 5, 7, 0.5)
    g = ground("Set a `SECRET_KEY` secret to keep user sessions alive across restarts.", (tip,))
    assert g.report.supported == 1 and lines_of(g) == [("docs/tip.md", 6)]  # the next line's "without" is not its
    assert [p.text for p in split("> One line.\n> Another one.") if p.kind == "sentence"] == [
        "> One line.", "> Another one."]


def test_a_sentence_opening_with_an_emoji_is_judged_and_cited_on_its_own():
    """A sentence opening with an emoji ("🚀 The rocket ...", as READMEs write) was read as the
    end of the sentence before it: the two were judged as one, cited at the first one's line,
    and a wrong first sentence took the right second one down with it."""
    doc = EvidenceItem("vector_search", "docs/launch.md",
                       "# Launch\n\nThe launch window opens at 09:00 UTC.\n\n🚀 The rocket lifts off at 09:30 UTC.", 1, 5, 0.5)
    g = ground("The launch window opens at 09:00 UTC [1]. 🚀 The rocket lifts off at 09:30 UTC [1].", (doc,))
    assert g.report.sentences == 2 and g.report.supported == 2
    assert [(s.start_line, s.end_line) for s in g.sources] == [(3, 3), (5, 5)]
    g = ground("The launch window opens at 10:00 UTC [1]. 🚀 The rocket lifts off at 09:30 UTC [1].", (doc,))
    assert g.report.unsupported == ("The launch window opens at 10:00 UTC.",)
    assert lines_of(g) == [("docs/launch.md", 5)]


def test_a_container_fence_the_answer_writes_is_left_as_written():
    """A container the model writes (":::note" ... ":::", as Docusaurus and MyST write
    admonitions) ran into the sentence above its closing fence: the marker grounding gave that
    sentence went before the fence's last colon, ":: [2]:", and the container was never closed."""
    doc = EvidenceItem("vector_search", "docs/launch.md",
                       "# Launch\n\nThe launch window opens at 09:00 UTC.\n\nThe rocket lifts off at 09:30 UTC.", 1, 5, 0.5)
    g = ground("The launch window opens at 09:00 UTC [1].\n\n:::note\nThe rocket lifts off at 09:30 UTC.\n:::\n\n"
               "::: tip Timing\nThe launch window opens at 09:00 UTC.\n:::", (doc,))
    assert g.body == ("The launch window opens at 09:00 UTC [1].\n\n:::note\nThe rocket lifts off at 09:30 UTC [2].\n:::"
                      "\n\n::: tip Timing\nThe launch window opens at 09:00 UTC [1].\n:::"), g.body
    assert g.report.sentences == 3 and g.report.supported == 3


def test_a_sentence_ending_in_a_unit_after_a_number_ends_there():
    """A sentence ending in a one-letter unit ("heats to 80 °C.", "runs at 12 V.") was read as
    ending in an initial ("J. Smith"): it ran on into the next sentence, so the two were
    judged as one and cited at the first one's line, the offline answer quoting both as one."""
    doc = EvidenceItem("vector_search", "docs/boiler.md", "# Boiler\n\nThe boiler heats the water to 80 °C.\n"
                       "The boiler is serviced every March.\nThe fan runs at 12 V.\nThe fan is replaced yearly.", 1, 6, 0.5)
    g = ground("The boiler heats the water to 80 °C. The boiler is serviced every March. "
               "The fan runs at 12 V. The fan is replaced yearly.", (doc,))
    assert g.report.sentences == 4 and g.report.supported == 4
    assert [s.start_line for s in g.sources] == [3, 4, 5, 6]
    assert [p.text for p in split("J. Smith wrote it. Use plan B. Then stop.") if p.kind == "sentence"] == [
        "J. Smith wrote it.", "Use plan B. Then stop."]
    # so does one whose number and unit a no-break space joins, as typeset text writes them
    for space in ("\u00a0", "\u202f"):
        assert [p.text for p in split(f"The fan runs at 12{space}V. The fan is replaced yearly.")
                if p.kind == "sentence"] == [f"The fan runs at 12{space}V.", "The fan is replaced yearly."], space


def test_a_sentence_ending_in_a_file_name_with_a_one_letter_extension_ends_there():
    """"Edit main.c." was read as ending in an initial, as "J. Smith" and "U.S." are: the sentence
    ran on into the next one, the two judged as one and cited at the first one's line."""
    cut = [p.text for p in split("Edit main.c. Then open config.h. The U.S. Army and J. R. R. Tolkien "
                                 "wrote it. He has a Ph.D. Then stop.") if p.kind == "sentence"]
    assert cut == ["Edit main.c.", "Then open config.h.", "The U.S. Army and J. R. R. Tolkien wrote it.",
                   "He has a Ph.D.", "Then stop."]


@pytest.mark.parametrize("text, answer", [
    ("يفتح مكتب القاهرة في الساعة التاسعة صباحا؟ المكتب مغلق يوم الجمعة.",  # Arabic ؟
     "يفتح مكتب القاهرة في الساعة التاسعة صباحا [1]؟ المكتب مغلق يوم الخميس ولا يعمل أحد هناك أبدا [1]."),
    ("दिल्ली कार्यालय सुबह नौ बजे खुलता है। शनिवार को कार्यालय बंद रहता है।",  # the Devanagari danda
     "दिल्ली कार्यालय सुबह नौ बजे खुलता है [1]। मुंबई का गोदाम रविवार को पांच बजे खुलता है [1]।"),
    ("لاہور کا دفتر صبح نو بجے کھلتا ہے۔ اتوار کو دفتر بند رہتا ہے۔",  # Urdu ۔
     "لاہور کا دفتر صبح نو بجے کھلتا ہے [1]۔ کراچی کا گودام رات گیارہ بجے کھلتا ہے [1]۔"),
], ids=["arabic", "hindi", "urdu"])
def test_sentences_end_at_the_sentence_ends_of_other_scripts(text, answer):
    item = EvidenceItem("vector_search", "docs/office.md", f"# Office\n\n{text}", 1, 3, 0.5)
    g = ground(answer, (item,))
    assert g.report.sentences == 2 and g.report.supported == 1  # the invented second sentence rode on the first
    assert g.body.startswith(answer.split(" [1]")[0] + " [1]")
    assert g.body.splitlines()[0].endswith(f" {UNSUPPORTED_TAG}{answer[-1]}")


def test_a_tag_goes_before_a_chinese_exclamation_mark_as_before_a_full_stop():
    g = ground("北京办公室周末营业[1]！", (EvidenceItem("vector_search", "docs/zh.md", "上海办公室永久关闭了。", 1, 1),))
    assert g.body.startswith(f"北京办公室周末营业 {UNSUPPORTED_TAG}！")


def test_passages_opening_at_one_line_are_one_source_spanning_the_longer():
    item = EvidenceItem("vector_search", "docs/net.md",
                        "The server listens on port 8080 by default.\nIt answers health checks on that port too.",
                        7, 8, 0.5)
    g = ground("The server listens on port 8080 by default. "
               "The server listens on port 8080 by default and answers health checks on that port too.", (item,))
    assert g.body.count("[1]") == 2 and "[2]" not in g.body
    assert [(s.source, s.start_line, s.end_line) for s in g.sources] == [("docs/net.md", 7, 8)]


def test_a_number_written_as_a_word_matches_its_digits():
    assert ground("A backup is kept for 30 days.", ITEMS).report.supported == 1


WALRUS = EvidenceItem("vector_search", "walrus.md",
                      "# Walrus\n\nA walrus weighs up to 1,500 kg.\nA herd counts 12000 animals.\n"
                      "A calf drinks 1\u202f000 litres of milk.", 1, 5)


@pytest.mark.parametrize("sentence", ["A walrus weighs up to 1500 kg.", "A walrus weighs up to 1,500 kg.",
                                      "A herd counts 12,000 animals.", "A calf drinks 1000 litres of milk."])
def test_a_number_is_the_same_with_or_without_separators_between_its_thousands(sentence):
    """"1500" was not held by "1,500" (nor "12,000" by "12000"): a right sentence was unsupported."""
    g = ground(sentence, (WALRUS,))
    assert g.report.supported == 1 and "[1]" in g.body


@pytest.mark.parametrize("sentence", ["A walrus weighs up to 500 kg.", "A walrus weighs up to 1,50 kg.",
                                      "A walrus weighs up to 21,500 kg.", "A herd counts 1,200 animals."])
def test_separators_never_make_another_number_held(sentence):
    assert ground(sentence, (WALRUS,)).report.supported == 0


ALUMNI = EvidenceItem("vector_search", "wiki/Harvard_University.txt",
                      "Other: philosopher Henry David Thoreau; poets Wallace Stevens and T. S. Eliot; "
                      "conductor Leonard Bernstein; cellist Yo Yo Ma.", 29, 29)


def test_a_passage_holds_the_question_words_its_documents_name_holds():
    """"Leonard Bernstein went to Harvard" was unsupported by the Harvard article's list of
    alumni: the list does not write "Harvard", its document's name does."""
    g = ground("Leonard Bernstein went to Harvard.", (ALUMNI,), question="What famous conductor went to Harvard?")
    assert g.report.supported == 1 and "[1]" in g.body


@pytest.mark.parametrize(("question", "sentence"), [
    ("What famous conductor went to Yale?", "Leonard Bernstein went to Yale."),  # not the document's name
    ("What famous conductor studied there?", "Leonard Bernstein studied at Harvard."),  # not the question's word
    ("What famous conductor went to Harvard?", "Leonard Bernstein went to Harvard in 1939."),  # a number it does not write
])
def test_a_documents_name_holds_only_the_questions_words(question, sentence):
    assert ground(sentence, (ALUMNI,), question=question).report.supported == 0


FLED = EvidenceItem("vector_search", "wiki/Huguenot.txt",
                    "While nearly three-quarters eventually were killed or submitted, roughly 500,000 Huguenots "
                    "had fled France by the early 18th century.", 9, 9)
SETTLED = EvidenceItem("vector_search", "wiki/Huguenot.txt",
                       "In 1700 several hundred French Huguenots migrated from England to the colony of Virginia.", 29, 29)


def test_a_decade_the_question_names_is_held_by_a_year_or_century_within_it():
    """"How many Huguenots fled France by the 1700s?" answered "... by the 1700s ... 500,000" was
    unsupported: another passage writes the year 1700, so the question's "1700s" was checked
    as that year in the passage that says "by the early 18th century"."""
    sentence = "Roughly 500,000 Huguenots had fled France by the 1700s."
    g = ground(sentence, (FLED, SETTLED), question="How many Huguenots fled France by the 1700s?")
    assert g.report.supported == 1 and "[1]" in g.body


@pytest.mark.parametrize("sentence", ["Roughly 500,000 Huguenots had fled France by the 1600s.",
                                      "Roughly 500,000 Huguenots had fled France by the 1710s.",
                                      "Roughly 500,000 Huguenots had fled France by 1700."])
def test_a_decade_is_never_held_by_a_year_outside_it(sentence):
    assert ground(sentence, (FLED,)).report.supported == 0


PLAGUE = EvidenceItem("vector_search", "plague.txt",
                      "An outbreak in 1471 took as much as 10\u201315% of the population, while the death rate "
                      "of the plague of 1479\u201380 could have been as high as 20%.", 1, 1)


@pytest.mark.parametrize("sentence", ["The outbreak in 1471 took as much as 10-15% of the population.",
                                      "The outbreak in 1471 took as much as 10\u201315% of the population.",
                                      "The plague of 1479-80 had a death rate as high as 20%."])
def test_a_range_written_with_a_hyphen_is_held_by_the_same_range_with_a_dash(sentence):
    """"10-15%" (a model types a hyphen) was not held by "10\u201315%" (an en dash, as most prose
    writes a range): a right answer from the passage was unsupported and the question refused."""
    g = ground(sentence, (PLAGUE,))
    assert g.report.supported == 1 and "[1]" in g.body


@pytest.mark.parametrize("sentence", ["The outbreak in 1471 took as much as 10-16% of the population.",
                                      "The outbreak in 1471 took as much as 10.15% of the population.",
                                      "The plague of 1479-81 had a death rate as high as 20%."])
def test_a_dash_never_makes_another_range_held(sentence):
    assert ground(sentence, (PLAGUE,)).report.supported == 0


@pytest.mark.parametrize("sentence", ["Here is what I found:", "Based on the documentation:", "[1]", "Sure!"])
def test_sentences_with_no_content_of_their_own_are_not_judged(sentence):
    g = ground(sentence, ITEMS)
    assert g.report.sentences == 0 and UNSUPPORTED_TAG not in g.body


def test_courtesy_is_not_judged_but_a_claim_beside_it_is():
    # a small model answering "thanks!" after retrieval ran: nothing in it is a claim
    reply = ("You're welcome! I'm glad I could help. If you have any other questions, feel free to ask. "
             "Don't hesitate to reach out if you need anything else.")
    g = ground(reply, ITEMS)
    assert g.report.sentences == 0 and UNSUPPORTED_TAG not in g.body and g.body == reply
    g = ground("You're welcome! You'll need port 9090 for that.", ITEMS)
    assert g.report.sentences == 1 and g.report.unsupported == ("You'll need port 9090 for that.",)


def test_a_lead_in_that_restates_the_question_is_not_judged():
    question = "How do I render Jinja2 HTML templates from an endpoint?"
    lead = "To render Jinja2 HTML templates from an endpoint, follow these steps:"
    g = ground(lead + "\n\n1. The server listens on port 8080.", ITEMS, question=question)
    assert g.report.sentences == 1 and g.report.supported == 1 and UNSUPPORTED_TAG not in g.body
    assert ground(lead, ITEMS).report.unsupported == (lead,)  # without the question it is a claim
    assert ground(lead, ITEMS, question="How do I render a page?").report.sentences == 1  # words not asked
    claim = "To render Jinja2 HTML templates, set `SERVICE_PORT`:"  # an anchor makes it a claim
    assert ground(claim, ITEMS, question=question).report.sentences == 1
    answer = "You render Jinja2 HTML templates from an endpoint."  # not a lead-in: judged
    assert ground(answer, ITEMS, question=question).report.sentences == 1
    assert ground("Here's an example:", ITEMS).report.sentences == 0


def test_code_blocks_and_tables_are_kept_whole_and_list_items_cut_into_sentences():
    body = "Intro text here.\n\n- one. Two.\n- three\n\n```\na. B.\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    kinds = [(p.kind, p.text) for p in split(body) if p.kind != "space"]
    assert [k for k, _ in kinds] == ["sentence", "item", "sentence", "item", "code", "table"]
    assert kinds[1:4] == [("item", "- one."), ("sentence", "Two."), ("item", "- three")]
    assert [p.text for p in split("1. Install it. Then run it.")] == ["1. Install it.", " ", "Then run it."]
    assert "".join(p.text for p in split(body)) == body


def test_a_code_block_from_the_evidence_is_cited_at_its_fence():
    doc = EvidenceItem("read_file", "README.md", "Run:\n\n```sh\npip install crag\ncrag index docs\n```\n", 10, 15)
    g = ground("Like this:\n\n```sh\npip install crag\ncrag index docs\n```", (doc,))
    assert g.report.supported == 1 and lines_of(g) == [("README.md", 12)]
    assert g.body.endswith("```\n[1]")



def test_a_code_block_in_a_blockquote_is_judged_by_its_lines_not_the_quote_markers():
    # "> ```sh" / "> pip install crag": the "> " of each line is no part of the code. Read with
    # it, no line was in the evidence, and a simple answer that was only this block was refused.
    doc = EvidenceItem("read_file", "README.md", "Run:\n\n```sh\npip install crag\ncrag index docs\n```\n", 10, 15)
    g = ground("Like this:\n\n> ```sh\n> pip install crag\n>  crag index docs\n> ```", (doc,))
    assert g.report.supported == 1 and lines_of(g) == [("README.md", 12)]
    assert g.body.endswith("> ```\n[1]")
    nested = ground("Like this:\n\n> > ```sh\n> > pip install crag\n> > crag index docs\n> > ```", (doc,))
    assert nested.report.supported == 1


DEPLOYS = EvidenceItem("vector_search", "kb/codes.md", (
    "# Deploy recipes\n\nAlpha deploy:\n\n```sh\nset -e\ncd /srv/alpha\n./deploy --region eu\n```\n\n"
    "Beta deploy:\n\n```sh\nset -e\ncd /srv/beta\n./deploy --region us\n```\n\n"
    "The trundlewick deploy is special:\n\n```sh\nset -e\ncd /srv/trundlewick\n./deploy --region ap --canary 5\n```\n"),
    1, 25)
TRUNDLEWICK = "```sh\nset -e\ncd /srv/trundlewick\n./deploy --region ap --canary 5\n```"


def test_a_code_block_is_cited_where_the_whole_block_is_not_where_its_first_line_first_occurs():
    """SPEC §7: the line is where the cited text starts. Three blocks of one page open with the
    same lines (```` ```sh ````, ``set -e``); the third, quoted, was cited at the first block's
    fence (L5), where its first line first occurs. So was a settings quote whose first line
    (``metadata: {}``) every entry of the file has."""
    from crag.answer import OFFLINE_PREFACE

    g = ground(f"{OFFLINE_PREFACE}\n\n{TRUNDLEWICK}\n[1]", (DEPLOYS,))
    assert g.report.supported == 1 and lines_of(g) == [("kb/codes.md", 21)]
    assert (g.sources[0].start_line, g.sources[0].end_line) == (21, 24)  # fence to last line
    conf = EvidenceItem("read_file", "kb/conf.yaml", "".join(
        f"{name}:\n  metadata: {{}}\n  port: {port}\n  enabled: true\n"
        for name, port in (("service0", 8000), ("service1", 8001), ("snoodle", 7311))), 1, 12)
    g = ground("It is set here:\n\n```\n  metadata: {}\n  port: 7311\n  enabled: true\n```", (conf,))
    assert g.report.supported == 1 and lines_of(g) == [("kb/conf.yaml", 10)]
    # a line the model left out, or blank lines in the file, do not move it either
    g = ground("```sh\nset -e\n./deploy --region ap --canary 5\n```", (DEPLOYS,))
    assert lines_of(g) == [("kb/codes.md", 21)]


def test_a_lead_in_marker_opens_where_its_item_says_it_not_at_the_chunks_first_line():
    """A lead-in is not judged, and its marker went to the chunk's first line (L1, the page's
    title) when the item did not write it word for word: "Run the trundlewick deploy like
    this [1]:" now opens at the passage holding most of its words."""
    g = ground(f"Run the trundlewick deploy like this [1]:\n\n{TRUNDLEWICK}", (DEPLOYS,),
               "note", "How do I run the trundlewick deploy?")
    assert g.body.startswith("Run the trundlewick deploy like this [1]:")
    assert lines_of(g) == [("kb/codes.md", 19), ("kb/codes.md", 21)]
    assert lines_of(ground("Here is what I found [1]:", (DEPLOYS,), "note", "q")) == [("kb/codes.md", 1)]


PARTS = ("Parts list\nFiller paragraph 5 about ordinary parts matters.\n"
         "The table below lists the parts of the hobblex engine.\npart | material | size\n"
         "hobblex piston | steel | 8 cm\nhobblex valve | brass | 2 cm\nhobblex gasket | cork | 1 mm\n"
         "The hobblex engine was first run in 1931.")


def test_a_fact_of_a_table_row_without_a_leading_pipe_is_cited_at_its_row():
    """A DOCX table's rows are read as ``cell | cell | cell`` lines, with no blank line before
    them, so the paragraph above the table ran on through its rows as one sentence, and a
    row's fact was cited at that paragraph (L8 for L11 and L12). The same for Markdown rows
    written ``x | y`` right under a paragraph."""
    docx = EvidenceItem("vector_search", "kb/parts.docx", PARTS, 6, 13)
    g = ground("The hobblex valve is brass and 2 cm [1]. The hobblex gasket is cork, 1 mm [1]. "
               "The hobblex engine was first run in 1931 [1].", (docx,))
    assert g.report.supported == 3
    assert lines_of(g) == [("kb/parts.docx", 11), ("kb/parts.docx", 12), ("kb/parts.docx", 13)]
    md = EvidenceItem("vector_search", "kb/parts.md",
                      "# Parts\n\nThe parts of the snarfle pump are below.\nsnarfle rotor | titanium\n"
                      "snarfle seal | rubber\n\nA prose line with a | b in it stays a sentence.", 1, 7)
    g = ground("The snarfle seal is rubber [1].", (md,))
    assert g.report.supported == 1 and lines_of(g) == [("kb/parts.md", 5)]
    kinds = [(p.kind, p.text) for p in passages(md.text)]
    assert ("sentence", "A prose line with a | b in it stays a sentence.") in kinds
    assert ("table", "snarfle rotor | titanium") in kinds


def test_a_sentence_of_an_org_file_is_cited_at_its_line_not_at_the_markup_above_it():
    """Org's ``#+BEGIN_QUOTE`` and headline lines are no Markdown heading or list item, so the
    sentence below them ran from the headline, and was cited there (L6) when the headline
    shares a word with it, for L8."""
    org = ("#+TITLE: Org guide\n\n* Heading\nFiller line 0 about ordinary org matters.\n\n"
           "** Pellucid dynamo\n#+BEGIN_QUOTE\nThe pellucid dynamo yields power, five kilowatts of it.\n#+END_QUOTE\n"
           "Filler line 2 about ordinary org matters.\n")
    g = ground("The pellucid dynamo yields five kilowatts [1].", (EvidenceItem("vector_search", "kb/doc.org", org, 1, 10),))
    assert g.report.supported == 1 and lines_of(g) == [("kb/doc.org", 8)]
    kinds = [(p.kind, p.text) for p in passages(org, org=True)]
    assert kinds[:3] == [("heading", "#+TITLE: Org guide"), ("heading", "Heading"),
                         ("item", "Filler line 0 about ordinary org matters.")]
    assert ("heading", "** Pellucid dynamo") in kinds and not any("BEGIN" in text or "END" in text for _, text in kinds)


def test_a_sentence_in_a_container_admonition_is_cited_at_its_line_not_at_the_fence():
    # ":::note" opens the text below it, as "> [!NOTE]" does; read as its first words, the
    # sentence was cited at the fence (L3), for L4.
    doc = "# Frob\n\n:::note\nThe frobnicator calibration log is kept in /var/log/frob.log.\n:::\n"
    g = ground("The calibration log is kept in /var/log/frob.log [1].", (EvidenceItem("vector_search", "kb/f.md", doc, 1, 5),))
    assert g.report.supported == 1 and lines_of(g) == [("kb/f.md", 4)]
    assert [p.text for p in passages(doc)] == ["# Frob", "The frobnicator calibration log is kept in /var/log/frob.log."]


def test_a_sentence_pointing_at_its_source_keeps_its_see_with_the_marker_after_it():
    # "See [2] for the rollback command." whose marker moved to another passage (or item) lost
    # its "See" with the marker: " for the rollback command [2]." was printed, and an
    # unsupported one read " for the moon landing [unsupported]."
    doc = EvidenceItem("vector_search", "kb/deploy.md",
                       "# Deploy\n\nDeployments run every Tuesday.\nRollbacks use the command `widget rollback`.\n", 1, 4)
    other = EvidenceItem("vector_search", "kb/other.md", "# Other\n\nThe cafeteria opens at noon.\n", 1, 3)
    for see in ("See", "Also see", "You can also see"):
        g = ground(f"Deployments run every Tuesday [1]. {see} [2] for the rollback command `widget rollback`. "
                   f"{see} [9] for the moon landing.", (doc, other))
        assert g.body.startswith(f"Deployments run every Tuesday [1]. {see} [2] for the rollback command `widget "
                                 f"rollback`. {see} [unsupported] for the moon landing."), g.body
        assert lines_of(g) == [("kb/deploy.md", 3), ("kb/deploy.md", 4)]
    g = ground("Deployments run every Tuesday. See [2] for the rollback command `widget rollback`.", (doc, other),
               mode="strict")
    assert g.body == "Deployments run every Tuesday [1]. See [2] for the rollback command `widget rollback`."
    # so does a run of markers, whatever joins them: "See [2] and for ..." was left of the first
    # and " for ... [2]." of a run joined by a comma
    for run in ("[2] and [9]", "[9], [2]", "[2] or [9]", "[9]; [2]", "[2][9]", "[9], [2], and [8]"):
        g = ground(f"Deployments run every Tuesday [1]. See {run} for the rollback command `widget rollback`.",
                   (doc, other))
        assert g.body.startswith("Deployments run every Tuesday [1]. See [2] for the rollback command `widget "
                                 "rollback`."), (run, g.body)
    # so does "According to [2], ..." ("According to, the rollback ... [2]." was left)
    for lead in ("According to", "As described in"):
        g = ground(f"Deployments run every Tuesday [1]. {lead} [9], the rollback command is `widget rollback`.",
                   (doc, other))
        assert g.body.startswith(f"Deployments run every Tuesday [1]. {lead} [2], the rollback command is `widget "
                                 "rollback`."), (lead, g.body)
    # whatever follows its comma, and in a list item or a quote: "According to, `widget rollback` is
    # ... [2]." was left, and "- for the rollback command ... [2]." of "- See [9] for the ..."
    for said, kept in (("According to [9], `widget rollback` is the rollback command.",
                        "According to [2], `widget rollback` is the rollback command."),
                       ("As stated in [9], 30 seconds is what a rollback takes.",
                        "As stated in [2], 30 seconds is what a rollback takes."),
                       ("- See [9] for the rollback command `widget rollback`.",
                        "- See [2] for the rollback command `widget rollback`."),
                       ("> According to [9], the rollback command is `widget rollback`.",
                        "> According to [2], the rollback command is `widget rollback`."),
                       ("2. According to [9], the rollback command is `widget rollback`.",
                        "2. According to [2], the rollback command is `widget rollback`.")):
        timed = EvidenceItem("vector_search", "kb/deploy.md", doc.text + "A rollback takes 30 seconds.\n", 1, 5)
        g = ground(f"- Deployments run every Tuesday [1].\n{said}", (timed, other))
        assert g.body.startswith(f"- Deployments run every Tuesday [1].\n{kept}"), (said, g.body)


def test_claims_see_numbers_identifiers_and_code():
    c = claims("Set `SERVICE_PORT` in config/app.yaml to 8080 with --port, since v2.1 [3].")
    kinds = {kind for kind, _ in c.anchors}
    assert {"code", "number", "ident"} <= kinds and ("number", "3") not in c.anchors


# -- modes -----------------------------------------------------------------------------------

MIXED = "The server listens on port 8080 by default. It was released on October 22, 2024 [2]."


def test_note_mode_marks_unsupported_sentences_and_counts_them():
    g = ground(MIXED, ITEMS, "note")
    assert g.body == "The server listens on port 8080 by default [1]. It was released on October 22, 2024 [unsupported]."
    assert note_line(g.report, "note") == (
        "_Note: 1 sentence of this answer is not supported by the evidence found (marked [unsupported])._")


def test_strict_mode_removes_unsupported_sentences():
    g = ground(MIXED + "\n\nA backup is kept for thirty days.", ITEMS, "strict")
    assert g.body == "The server listens on port 8080 by default [1].\n\nA backup is kept for thirty days [2]."
    assert note_line(g.report, "strict") is None


def test_off_mode_keeps_the_models_markers():
    g = ground(MIXED, ITEMS, "off")
    assert g.body == "The server listens on port 8080 by default. It was released on October 22, 2024 [1]."
    assert g.sources == (BACKUP,)


def agent_answer(reply: str, mode: str):
    model = ScriptedChatModel({"analyze_and_route": [route("simple")], "plan": [search_plan()],
                               "synthesize": [reply]})
    agent = Agent(model, FakeToolbox({"vector_search": [list(ITEMS)]}), Settings(grounding=mode))
    return agent.ask("What port does the server use?")


def test_the_models_refusal_in_the_no_evidence_sentence_cites_nothing():
    """A model told to say crag's no-evidence sentence may cite it ("... this question [1]."): it
    was left unjudged with its marker, and the footer cited a whole chunk supporting nothing."""
    g = ground(NO_EVIDENCE[:-1] + " [1][2].", ITEMS)
    assert g.body == NO_EVIDENCE and g.sources == () and g.report.sentences == 0
    result = agent_answer(NO_EVIDENCE[:-1] + " [1].", "note")
    assert result.answer.startswith(NO_EVIDENCE + "\n\n---\n") and result.citations == ()


def test_strict_answer_with_no_supported_sentence_is_the_no_evidence_sentence():
    result = agent_answer("It was released on October 22, 2024 [1].", "strict")
    assert result.answer.startswith(NO_EVIDENCE + "\n\n---\n") and result.citations == ()
    assert result.state.grounding.unsupported == ("It was released on October 22, 2024.",)


def test_the_answer_ends_its_body_with_the_count_then_footer_then_usage():
    result = agent_answer(MIXED, "note")
    body, _, stats = result.answer.partition("\n\n---\n" + STATS_HEADING)
    assert body.endswith("(marked [unsupported])._\n\n[1] docs/setup.md:L22")
    assert [(c.path, c.line, c.end_line) for c in result.citations] == [("docs/setup.md", 22, 22)]
    assert stats


def test_grounding_is_validated_like_every_setting():
    from crag.config import SETTINGS_TABLE

    assert SETTINGS_TABLE["grounding"][0] == "KB_AGENT_GROUNDING"
    assert "KB_AGENT_GROUNDING=note" in (Path(__file__).resolve().parents[1] / ".env.example").read_text()


# -- properties ------------------------------------------------------------------------------

VOCAB = ("uploads server client backups token index chunk retries queue worker cache port store "
         "config deploy image build release policy limit file path user model").split()


@st.composite
def documents(draw):
    """A Markdown file: headings, hard-wrapped paragraphs, list items; distinct sentences."""
    lines: list[str] = []
    sentences: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["para", "list", "heading"]))
        if kind == "heading":
            lines += [f"## {draw(st.sampled_from(VOCAB)).title()}", ""]
            continue
        paragraph = []
        for _ in range(draw(st.integers(1, 4))):
            words = draw(st.lists(st.sampled_from(VOCAB), min_size=3, max_size=9))
            n = len(sentences)
            sentence = f"The {' '.join(words)} number {n} holds {n * 7 + 3}."
            sentences.append(sentence)
            paragraph.append(sentence)
        if kind == "list":
            lines += [f"- {s}" for s in paragraph] + [""]
        else:
            text, width = " ".join(paragraph), draw(st.integers(30, 100))
            row = ""
            for word in text.split(" "):
                if row and len(row) + 1 + len(word) > width:
                    lines.append(row)
                    row = word
                else:
                    row = f"{row} {word}" if row else word
            lines += [row, ""]
    return "\n".join(lines) + "\n", sentences


def flat(text: str) -> str:
    return " ".join(text.replace("\n- ", "\n").split())


@PROPS
@given(documents().filter(lambda doc: doc[1]), st.data())
def test_property_a_copied_sentence_is_cited_at_the_line_where_it_starts(tmp_path_factory, doc, data):
    text, sentences = doc
    path = tmp_path_factory.mktemp("kb") / "doc.md"
    path.write_text(text, encoding="utf-8")
    file_lines = path.read_text(encoding="utf-8").splitlines()
    tool = data.draw(st.sampled_from(["vector_search", "read_file", "grep_search"]))
    chunks = chunk_text(text, ".md", max_tokens=data.draw(st.integers(20, 200)), min_tokens=5)
    items = [EvidenceItem(tool, str(path), c.text, c.start_line, c.end_line,
                          anchor_line=c.start_line if tool == "grep_search" else None) for c in chunks]
    whole = [s for s in sentences if any(s in flat(item.text) for item in items)]  # not cut by a chunk edge
    assume(whole)
    picked = data.draw(st.lists(st.sampled_from(whole), min_size=1, max_size=3, unique=True))
    answer = " ".join(picked)
    g = ground(answer, items)
    final, citations = compose(g.body, g.sources, Usage("m"))
    assert g.report.supported == len(picked)
    body = final.split("\n\n")[0]
    markers = [int(n) for n in re.findall(r"\[(\d+)\]", body)]
    assert len(markers) == len(picked)  # one marker per sentence, in order
    for sentence, n in zip(picked, markers):
        cite = citations[n - 1]
        start = file_lines[cite.line - 1]
        # The cited line holds the start of the sentence (which may begin after another one ends).
        head = " ".join(sentence.split(" ")[:2])
        assert head in start or start.rstrip().endswith(head.split(" ")[0]), (sentence, cite, start)
        assert flat(sentence) in flat("\n".join(file_lines[cite.line - 1 : cite.end_line]))


PIECES = ["The server listens on port 8080 by default.", " ", "\n", "\n\n", "[1]", "[2]", "[1, 2]",
          "A backup is kept for thirty days.", "It was released on October 22, 2024.", "Here is what I found:",
          "- ", "\n```\nx = [1]\n```\n", "Set `SERVICE_PORT` to change the port.", "| a | b |\n", "e.g. ",
          "The client retries failed uploads three times before it gives up",
          ", and every copy is encrypted with a key the security team holds",  # a clause judged on its own
          ", and nightly backups are written to the object store at 02:00 UTC"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=16), st.sampled_from(["note", "strict"]), st.data())
def test_property_a_grounded_answer_streams_to_exactly_the_final_answer(pieces, mode, data):
    reply = "".join(pieces)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(reply)), max_size=10))))
    renderer = StreamRenderer(len(ITEMS), clean_answer, strip_think, every=data.draw(st.sampled_from([0, 8])),
                              ground=lambda text, others: render_prefix(text, ITEMS, mode, "", others))
    shown, last = [], 0
    for cut in [*cuts, len(reply)]:
        shown.append(renderer.feed(reply[last:cut]))
        last = cut
    g = ground(clean_answer(reply), ITEMS, mode)
    if mode == "strict" and not g.report.supported:
        final, _ = compose(NO_EVIDENCE, (), Usage("m"), cite=False)
    else:
        final, _ = compose(g.body, g.sources, Usage("m"), note=note_line(g.report, mode))
    assert "".join(shown) + renderer.rest(final) == final


def test_a_passage_keeps_its_emphasis_and_loses_only_list_and_quote_marks():
    from crag.grounding import passages

    texts = [p.text for p in passages("**`fullWidth`**: _boolean_\n\n- item one\n\n> quoted text\n\n1. first step")]
    assert texts == ["**`fullWidth`**: _boolean_", "item one", "quoted text", "first step"]


# -- each verdict names its rule -------------------------------------------------------------


def rules_of(g):
    return [(j.rule, j.supported) for j in g.report.judgements]


@pytest.mark.parametrize(("body", "items", "expected"), [
    ("The client retries failed uploads three times before it gives up.", ITEMS, [("passage", True)]),
    # a paraphrase around the exact name: all anchors, a third of the words, half of them in the item
    ("Put a value in `SERVICE_PORT` and the server listens on that port instead of the default.", ITEMS,
     [("anchored", True)]),
    ("Uploads are encrypted with AES before they leave the client.", ITEMS, [("none", False)]),
    ("| type | source |\n| --- | --- |\n| Q4_K | [GH](https://example.com/pull/1684) |", (QUANT,), [("table", True)]),
    ("```sh\npip install crag\ncrag index docs\n```",
     (EvidenceItem("read_file", "README.md", "```sh\npip install crag\ncrag index docs\n```\n", 10, 13),),
     [("code_lines", True)]),
    ("Here is what I found: A backup is kept for thirty days.", ITEMS, [("passage", True)]),  # scaffolding unjudged
])
def test_every_verdict_names_the_rule_that_decided_it(body, items, expected):
    g = ground(body, items)
    assert rules_of(g) == expected
    assert g.report.sentences == len(g.report.judgements)
    assert g.report.unsupported == tuple(j.sentence for j in g.report.judgements if not j.supported)


def test_a_sentence_judged_clause_by_clause_names_the_clauses_rule_and_each_clause_its_own():
    g = ground("A backup is kept for thirty days [2], and every copy is encrypted with a key the security "
               "team holds.", ITEMS)
    (j,) = g.report.judgements
    assert (j.rule, j.supported) == ("clauses", False)
    assert [(c.rule, c.supported) for c in j.clauses] == [("passage", True), ("none", False)]
    assert [c.sentence for c in j.clauses] == [
        "A backup is kept for thirty days,", "and every copy is encrypted with a key the security team holds."]


def test_the_rules_are_a_table_with_one_name_each():
    from crag.grounding import RULES, rule_names

    names = rule_names()
    assert len(set(names)) == len(names) == len(RULES) + 2 and names[-2:] == ("clauses", "none")
    assert all(rule.kinds and 0 < rule.min_coverage <= 1 for rule in RULES)


def test_a_verdict_is_in_the_json_and_the_audit_and_spec_grounding_keeps_its_fields():
    agent = Agent(ScriptedChatModel({"analyze_and_route": [route("simple", "vector_search")],
                                     "plan": [search_plan("port")],
                                     "synthesize": ["The server listens on port 8080 by default [1]. "
                                                    "It was released on October 22, 2024 [1]."]}),
                  FakeToolbox({"vector_search": [[SETUP]]}), Settings())
    out = agent.ask("Which port?").to_dict()
    assert out["grounding"] == {"sentences": 2, "supported": 1, "unsupported": ["It was released on October 22, 2024."],
                                "verdict": "answered"}  # the answer's verdict (SPEC §7), not a sentence's
    assert out["judgements"] == [
        {"sentence": "The server listens on port 8080 by default.", "supported": True, "rule": "passage"},
        {"sentence": "It was released on October 22, 2024.", "supported": False, "rule": "none"}]
    audited = [(e["rule"], e["supported"]) for e in out["audit"] if e["event"] == "sentence_judged"]
    assert audited == [("passage", True), ("none", False)]


HUGUENOTS = EvidenceItem(
    "vector_search", "corpus/Huguenot.txt",
    "After this, Huguenots (with estimates ranging from 200,000 to 1,000,000) fled to surrounding "
    "Protestant countries: England, the Netherlands, Switzerland and Prussia. Following this exodus, "
    "Huguenots remained in large numbers in only one region of France.",
    12, 12, 0.21,
)


def test_an_anchor_the_question_names_is_not_a_claim_of_the_answer():
    """A sentence repeating the question's year ("by the 1700s") is supported by a passage
    that holds the rest of it (the figures) in its own words ("the early 18th century");
    without the question, the year is the sentence's own claim and must be held."""
    question = "How many Huguenots fled France by the 1700s?"
    answer = ("The number of Huguenots who fled France by the 1700s is estimated to be between "
              "200,000 and 1,000,000 [1].")
    assert ground(answer, (HUGUENOTS,), question=question).report.supported == 1
    assert ground(answer, (HUGUENOTS,)).report.supported == 0
    wrong = "The number of Huguenots who fled France by the 1700s is 500,000 [1]."  # a figure it does not hold
    assert ground(wrong, (HUGUENOTS,), question=question).report.supported == 0


def test_an_anchor_the_question_names_and_the_evidence_writes_is_still_checked():
    """The question's anchors are spared only where no evidence item writes them: when the
    question names services 3 and 7 and their pages say what each retries, "Service 7
    retries 3 times" pairs them wrongly and no page supports it, and a right sentence about
    service 3 cites service 3's page alone, not every page with the same words."""
    pages = tuple(EvidenceItem(tool="vector_search", source=f"docs/service{k}.md", start_line=1, end_line=3,
                               score=0.9, text=f"# Service {k}\n\nService {k} keeps an upload retry policy "
                                            f"of its own: it retries {k} times.")
                  for k in (3, 7, 27))
    question = "Compare the upload retry policy of service 3 and service 7"
    wrong = ground("Service 7 retries 3 times [1].", pages, question=question)
    assert wrong.report.supported == 0
    right = ground("Service 3 keeps an upload retry policy of its own: it retries 3 times [2].", pages,
                   question=question)
    assert right.report.supported == 1
    assert right.body == "Service 3 keeps an upload retry policy of its own: it retries 3 times [1]."
    assert right.sources[0].source == "docs/service3.md"


def test_inline_code_over_a_line_break_is_one_span_in_the_evidence():
    # Markdown lets inline code run over a line break. Paired line by line, the backtick that
    # closes it was paired with the next span's, so the paragraph was one passage holding "no"
    # ("It sends no `usage`") and a quote of its first sentence was judged negated: unsupported.
    item = EvidenceItem(
        "vector_search", "docs/wire.md",
        'Run it, then `OPENAI_BASE_URL=http://127.0.0.1:8765/v1 python -m crag ask "Which port does\n'
        'the server listen on?" --kb docs`. It sends no `usage`, so crag counts tokens with tiktoken.\n',
        602, 603,
    )
    body = ('Run it, then `OPENAI_BASE_URL=http://127.0.0.1:8765/v1 python -m crag ask "Which port does the '
            'server listen on?" --kb docs` [1]. It sends no `usage`, so crag counts tokens with tiktoken. [1]')
    done = ground(body, (item,), "note", "how do I run a test server?")
    assert [j.supported for j in done.report.judgements] == [True, True] and UNSUPPORTED_TAG not in done.body
    assert [p.text[:12] for p in split(item.text) if p.kind == "sentence"] == ["Run it, then", "It sends no "]


def test_a_sentence_ending_in_inline_code_ends_there_and_code_does_not_negate():
    # "... one line: `_Note: ... not supported ..._`" ended no sentence (its period is inside
    # the code), so the next sentence, which says "no", joined its passage; and the "not"
    # inside the code negated the passage. A verbatim quote of it was judged unsupported.
    item = EvidenceItem(
        "vector_search", "docs/grounding.md",
        "With `KB_AGENT_GROUNDING=note` (the default)\nit stays, tagged `[unsupported]`, and the body ends with "
        "one line:\n`_Note: 2 sentences of this answer are not supported by the evidence found._`\n"
        "With `strict` it is removed; an answer left with no supported sentence becomes the\nno-evidence sentence.\n",
        70, 74,
    )
    body = ("With `KB_AGENT_GROUNDING=note` (the default) it stays, tagged `[unsupported]`, and the body ends "
            "with one line: `_Note: 2 sentences of this answer are not supported by the evidence found._` [1]")
    done = ground(body, (item,), "note", "What does KB_AGENT_GROUNDING do?")
    assert [j.supported for j in done.report.judgements] == [True] and done.body.count(UNSUPPORTED_TAG) == 1  # the code's
    assert [p.text[:10] for p in split(item.text) if p.kind == "sentence"] == ["With `KB_A", "With `stri"]
    # a sentence that does say no is still read as a negation
    denied = ground("The body does not end with one line [1].", (item,), "note", "q")
    assert [j.supported for j in denied.report.judgements] == [False]


def test_a_lead_in_naming_the_code_it_introduces_is_not_judged():
    # A real model's "Here's an example code snippet:" before a code block was marked
    # [unsupported]: a lead-in is not a claim, whether it restates the question or names
    # what it introduces. With a name or a claim of its own it is still judged.
    body = ("The server listens on port 8080 by default [1]. Here's an example code snippet:\n\n"
            "```sh\nSERVICE_PORT=9000 serve\n```\n")
    done = ground(body, ITEMS, "note", "Which port does the server listen on?")
    assert done.report.judgements[0].sentence.startswith("The server listens")
    assert "snippet:" in done.body and "snippet: [unsupported]" not in done.body
    assert not any(j.sentence.startswith("Here's") for j in done.report.judgements)
    judged = ground("Here's a snippet that retries uploads forever:", ITEMS, "note", "q")
    assert [j.supported for j in judged.report.judgements] == [False]


@pytest.mark.parametrize(("question", "sources", "left"), [
    ("Which port? See docs/setup.md.", ["docs/setup.md"], "Which port? See  ."),
    ("Which port? See ./docs/v2/setup.md", ["docs/v2/setup.md"], "Which port? See  "),
    ("Which port? See /srv/kb/docs/setup.md", ["docs/setup.md"], "Which port? See  "),
    ("Which port? See docs/setup.md", ["/srv/kb/docs/setup.md"], "Which port? See  "),
    ("Which port? See docs/setup.md", ["docs/other.md"], "Which port? See docs/setup.md"),  # not a source
])
def test_a_path_the_question_points_at_is_no_term_when_the_evidence_comes_from_it(question, sources, left):
    from crag.grounding import missing, unpointed

    assert unpointed(question, sources) == left
    assert missing(unpointed("What does docs/v2/setup.md set?", ["docs/v2/setup.md"]), ["port = 8080"]) == []


PAGE = "https://wiki.example/pages/viewpage.action?pageId=1001"


@pytest.mark.parametrize(("question", "sources", "terms"), [
    ("What does Confluence page 1001 say about deploying?", [PAGE], []),
    ("What does pageId=1001 say about deploying?", [PAGE], []),
    (f"What does {PAGE} say about Terraform?", [PAGE], ["Terraform"]),
    ("How does http://127.0.0.1:18310/web/page say to deploy?", ["http://127.0.0.1:18310/web/page"], []),
    ("How does https://x.example/api say to deploy?", ["https://x.example/api#item-2"], []),
    ("What is the status of OPS-42 in Jira?", ["OPS-42"], []),
    ("When does it restart? see http://localhost:18615/wiki/pages/viewpage.action?pageId=1001&focusedCommentId=5",
     [PAGE], []),  # another URL of the page fetched
    ("What is the status of http://127.0.0.1:18611/browse/OPS-42?", ["OPS-42"], []),
    ("What does Confluence page 2002 say about deploying?", [PAGE], ["Confluence"]),  # another page
    ("What is the status of OPS-42 in Jira?", ["docs/a.md"], ["OPS-42", "Jira"]),  # not fetched
])
def test_a_page_url_or_issue_the_question_points_at_is_no_term_when_the_evidence_comes_from_it(question, sources, terms):
    """The ways the tools take a source ("Confluence page 1001", ``pageId=``, a URL, an issue key)
    were named terms no page's text writes: a supported answer from that very page opened with
    "none of the documents found mentions Confluence" (verdict not_answered)."""
    from crag.grounding import missing, unpointed

    assert missing(unpointed(question, sources), ["Deploy with docker compose up; the status is done."]) == terms


@pytest.mark.parametrize("mode", ["note", "off"])
@pytest.mark.parametrize("marks", ["[1][1]", "[1] [1]", "[1][1][1]"])
def test_one_item_marked_twice_side_by_side_is_cited_once(marks, mode):
    """"A walrus weighs up to 1,500 kg [1][1]." kept both markers: side by side they were not
    read as one run, as "[1, 1]" and "[1], [1]" are."""
    item = EvidenceItem("vector_search", "walrus.md", "# Walrus\n\nA walrus weighs up to 1,500 kg.", 1, 3)
    g = ground(f"A walrus weighs up to 1,500 kg {marks}.", (item,), mode)
    assert g.body == "A walrus weighs up to 1,500 kg [1]."


RELEASE = EvidenceItem("vector_search", "release.md", "# Release\n\nVersion 2.1 was released on 22 October 2024.", 1, 3)


@pytest.mark.parametrize("sentence, supported", [
    ("Version v2.1 was released on October 22, 2024.", True),  # "v2.1" was a name held only as written
    ("Version 2.1 was released on October 22, 2024.", True),
    ("Version v2.2 was released on October 22, 2024.", False),
    ("Version v21 was released on October 22, 2024.", False),
])
def test_a_version_written_with_a_v_is_its_number(sentence, supported):
    assert ground(sentence, (RELEASE,)).report.supported == int(supported)


@pytest.mark.parametrize("table, supported", [
    ("| Plan | Storage |\n| --- | --- |\n| Pro | 500 GB |", False),  # 500 GB is the Team row's
    ("| Plan | Price | Storage |\n| --- | --- | --- |\n| Pro | $9 | 500 GB |", False),
    ("| Plan | Price | Storage |\n| --- | --- | --- |\n| Pro | $9 | 50 GB |", True),
    ("| Plan | Price |\n| --- | --- |\n| Pro | $9 |\n| Team | $29 |", True),
])
def test_each_row_of_a_table_is_held_by_one_row_of_the_evidence(table, supported):
    """A table was held by the item as a whole: "| Pro | 500 GB |" took the name from one row
    of the evidence and the number from another."""
    assert ground(table, (PLAN_TABLE,)).report.supported == int(supported)


SERVICES = EvidenceItem(
    "vector_search", "services.md",
    "".join(f"| {i} | service{i} | team{i % 7} | keeps logs for {i % 90} days |\n" for i in range(2984, 3000))
    + "| 3000 | quasarium | teamX | the quasarium rotates keys every 45 days |\n| 3001 | service3001 | team5 | keeps logs for 31 days |\n",
    2989, 3006)


def test_a_table_copied_from_the_evidence_is_cited_at_the_row_that_holds_it():
    """A table was cited at the item's first passage sharing one word with it: the row in the
    middle of a long table was cited at the chunk's first row (another service that "keeps logs
    for 14 days"), and a settings table at the heading above it ("# Settings")."""
    g = ground("| 3000 | quasarium | teamX | the quasarium rotates keys every 45 days |", (SERVICES,))
    assert g.report.supported == 1 and lines_of(g) == [("services.md", 3005)]
    assert g.sources[0].text == "| 3000 | quasarium | teamX | the quasarium rotates keys every 45 days |"
    settings_md = EvidenceItem(
        "vector_search", "settings.md",
        "# Settings\n\nThe service reads these settings.\n\n| Setting | Default | Meaning |\n|---|---|---|\n"
        "| upload_retries | 5 | how often an upload is retried |\n| timeout | 30 s | how long a request may take |", 1, 8)
    g = ground("| Setting | Default |\n|---|---|\n| upload_retries | 5 |", (settings_md,))
    assert g.report.supported == 1 and lines_of(g) == [("settings.md", 5)]  # its header row, where it starts


LIMITS = EvidenceItem("vector_search", "limits.md",
                      "# Limits\n\nUploads are limited to 5 MB.\nTokens expire after 24 hours.\n"
                      "A backup is kept for thirty days.\nThe cache holds 2GB.\n"
                      "The cache keeps 3 copies for 7 days.", 1, 7)


@pytest.mark.parametrize("sentence, supported", [
    ("Uploads are limited to 5 GB.", False),  # another unit of the same kind
    ("Tokens expire after 24 minutes.", False),
    ("The cache holds 2 MB.", False),
    ("Uploads are limited to 5 MB.", True),
    ("Uploads are limited to 5 megabytes.", True),
    ("Tokens expire after 24 h.", True),
    ("A backup is kept for 30 days.", True),
    ("The cache holds 2 GB.", True),
    ("The cache keeps 7 copies for 3 days.", False),  # the numbers swapped
    ("The cache keeps 3 copies for 7 days.", True),
])
def test_a_number_is_held_with_its_unit(sentence, supported):
    """"Uploads are limited to 5 GB" was supported by "limited to 5 MB": the number was
    held, its unit was a content word among several."""
    assert ground(sentence, (LIMITS,)).report.supported == int(supported)


@pytest.mark.parametrize("sentence, text, supported", [
    ("The quota is 10 GB a user.", "The quota is 10.0 GB a user.", True),
    ("The quota is 10.0 GB a user.", "The quota is 10 GB a user.", True),
    ("The quota is 10 GB a user.", "The quota is 10.05 GB a user.", False),
    ("The job runs every 2 hours.", "The job runs every 2.00 hours.", True),
    ("The server needs Python 3.1.", "The server needs Python 3.10.", False),  # versions, not decimals
    ("The server needs Python 3.", "The server needs Python 3.0.1.", False),
    ("The window is 10-15 minutes.", "The window is 10.0-15.0 minutes.", True),  # a range's ends
    ("The window is 10.0-15.0 minutes.", "The window is 10–15 minutes.", True),
    ("The window is 10-15 minutes.", "The window is 10.5-15 minutes.", False),
    ("The export holds 1000-2000 rows.", "The export holds 1,000.00-2,000.00 rows.", True),
])
def test_a_whole_number_is_held_with_a_decimal_part_of_zeros(sentence, text, supported):
    """"The quota is 10 GB" was unsupported by "10.0 GB": the same number, written with its
    decimal zeros."""
    item = EvidenceItem("vector_search", "quota.md", text, 1, 1)
    assert ground(sentence, (item,)).report.supported == int(supported)


def test_the_anchored_rule_reads_a_number_in_a_passage_that_holds_some_of_the_sentence():
    """"The API allows 5 requests per minute" was supported (rule ``anchored``) by "The API
    allows 100 requests per minute. Uploads are limited to 5 MB.": the 5 of another sentence."""
    item = EvidenceItem("vector_search", "api.md",
                        "The API allows 100 requests per minute.\nUploads are limited to 5 MB.", 1, 2)
    assert ground("The API allows 5 requests per minute.", (item,)).report.supported == 0
    assert ground("The API allows 100 requests per minute.", (item,)).report.supported == 1


def test_a_number_wrapped_to_a_line_start_inside_a_numbered_item_is_its_text_not_a_new_item() -> None:
    """A chunk opening mid-paragraph at "3. ... holds" made "10. The ..." (the sentence's end,
    wrapped) a second list item, and the sentence was not read across two items. Found by
    the copied-sentence property test."""
    text = "3. The token token token number 1 holds\n10. The uploads uploads uploads uploads\nnumber 2 holds 17.\n"
    assert [p.kind for p in split(text) if p.kind != "space"] == ["item", "sentence"]
    item = EvidenceItem("vector_search", "doc.md", text, 3, 5)
    assert ground("The token token token number 1 holds 10.", [item]).report.supported == 1
    steps = "1. Open the page.\n2. Click Save.\n2. Click Save again.\n- a bullet\n"
    assert [p.text.split()[0] for p in split(steps) if p.kind == "item"] == ["1.", "2.", "2.", "-"]


STEPS = ("To set it up:\n\n"
         "1. The server listens on port 8080 by default.\n"
         "2. The moon is made of green cheese.\n"
         "3. The client retries failed uploads three times.\n"
         "4. Bananas grow on the moon.\n"
         "5. A backup is kept for thirty days.")


def test_strict_numbers_a_list_again_when_it_removes_items():
    """A refusal keeps an answer's supported steps: "1.", "3.", "5." read as a list with
    steps missing, and a Markdown renderer numbers from the first one only."""
    body = ground(STEPS, ITEMS, "strict").body
    numbers = re.findall(r"^(\d+)\. ", body, re.M)
    assert numbers == ["1", "2", "3"]
    assert "2. The client retries failed uploads three times" in body and "moon" not in body


def test_note_mode_leaves_the_models_numbers_as_written():
    body = ground(STEPS, ITEMS, "note").body
    assert re.findall(r"^(\d+)\. ", body, re.M) == ["1", "2", "3", "4", "5"]


def test_a_list_that_starts_later_keeps_its_first_number():
    body = ground("3. The moon is made of green cheese.\n4. The server listens on port 8080 by default.\n"
                  "5. A backup is kept for thirty days.", ITEMS, "strict").body
    assert re.findall(r"^(\d+)\. ", body, re.M) == ["3", "4"]


def test_a_marker_moved_off_a_sentence_ending_in_code_keeps_its_full_stop():
    """"... using `StaticFiles` [1]. Mount it [1]." with the sentence held by item 2 became
    "... using `StaticFiles` [1] Mount it ...": the text after a code span was read as a line
    holding only a marker, and the marker's full stop went with it."""
    from crag.grounding.claims import strip_markers

    other = EvidenceItem("vector_search", "docs/mount.md", "Mounting means adding an independent application.", 1, 1, 0.9)
    static = EvidenceItem("vector_search", "docs/static.md", "You can serve static files using `StaticFiles`.", 1, 1, 0.9)
    done = ground("You can serve static files using `StaticFiles` [1]. Mount it on the app [1].", [other, static], "note",
                  "How do I serve static files?")
    assert done.body.startswith("You can serve static files using `StaticFiles` [1]. Mount it")
    assert strip_markers("using `x` [1].") == "using `x`." and strip_markers("```\nx\n```\n[1].\nNext") == "```\nx\n```\nNext"


@pytest.mark.parametrize("passage", ["The kaltrox mirror syncs every 88 hours without fail.",
                                     "Without doubt, the kaltrox mirror syncs every 88 hours.",
                                     "The kaltrox mirror not only syncs every 88 hours but also logs each sync."])
def test_a_passage_affirming_in_a_negations_words_supports_the_plain_statement(passage):
    """"syncs every 88 hours without fail" was read as a negation, so "The kaltrox mirror syncs
    every 88 hours [1]." was unsupported and a right answer became the no-evidence sentence."""
    item = EvidenceItem("vector_search", "kb/mirror.md", f"# Mirror\n\n{passage}\n", 1, 3, 0.9)
    done = ground("The kaltrox mirror syncs every 88 hours [1].", [item], "note", "How often does the kaltrox mirror sync?")
    assert done.report.supported == 1
    refused = ground("The kaltrox mirror never syncs every 88 hours [1].", [item], "note", "Does the mirror sync?")
    assert refused.report.supported == 0  # a real negation still differs


def test_a_file_about_another_thing_does_not_corroborate_what_the_question_asks_about():
    """"The drumwick archive keeps 12 years of records [1]." was also cited to bellwhap.md, whose
    archive keeps as many but which never mentions drumwick, the one word the question asks about."""
    drumwick = EvidenceItem("vector_search", "kb/drumwick.md", "# Drumwick\n\nThe drumwick archive keeps 12 years of records in the basement.\n", 1, 3, 0.9)
    bellwhap = EvidenceItem("vector_search", "kb/bellwhap.md", "# Bellwhap\n\nThe bellwhap archive keeps 12 years of records in the basement.\n", 1, 3, 0.9)
    another = EvidenceItem("vector_search", "kb/vaults.md", "# Vaults\n\nThe drumwick archive keeps 12 years of records in its basement vault.\n", 1, 3, 0.9)
    done = ground("The drumwick archive keeps 12 years of records in the basement [1].", [drumwick, bellwhap, another],
                  "note", "How long does the drumwick archive keep records?")
    assert done.body == "The drumwick archive keeps 12 years of records in the basement [1][2]."
    assert [s.source for s in done.sources] == ["kb/drumwick.md", "kb/vaults.md"]


@pytest.mark.parametrize("text", [
    "The wuzzle switch accepts the modes fast | slow | auto and\nthe default wuzzle mode is slow, which saves power.\n",
    "To find the frobnitz errors, run cat frob.log | grep ERROR and then\nsort the lines | uniq -c to count them.\n",
    "The brushes of the pellucid dynamo are\ncarbon | graphite | copper\n",
])
def test_a_prose_sentence_with_pipes_in_it_is_one_passage_not_table_rows(text):
    """A wrapped line with pipes in it ("fast | slow | auto", a shell pipeline) was cut out of its
    sentence as a pipe-less table row, and the offline answer quoted half sentences."""
    from crag.grounding.evidence import passages

    prose = [p for p in passages(text) if p.kind != "table"]
    assert len(prose) == 1 and " ".join(prose[0].text.split()) == " ".join(text.split())


@pytest.mark.parametrize(("passage", "answer"), [
    ("The snarfle backup is restored without interruption of the snarfle service.",
     "Restoring the snarfle backup causes an interruption of the snarfle service [1]."),
    ("The glimmer alert is sent without delay to the on-call engineer.",
     "The glimmer alert is sent with a delay to the on-call engineer [1]."),
])
def test_without_a_thing_still_negates_that_thing(passage, answer):
    """Only phrases that affirm ("without fail") negate nothing: "without interruption" says
    there is none, and an answer saying there is one is not supported."""
    item = EvidenceItem("vector_search", "kb/snarfle.md", f"# Snarfle\n\n{passage}\n", 1, 3, 0.9)
    assert ground(answer, [item], "note", "What happens when the snarfle backup is restored?").report.supported == 0


def test_a_question_written_decomposed_is_answered_as_the_same_question_composed() -> None:
    """A question written decomposed (NFD: Korean as jamo, as a name copied on macOS holds it)
    found its passage, but its words were none of the composed passage's: the right answer was
    judged about something else and replaced, where the same question composed was answered."""
    import unicodedata

    item = EvidenceItem("vector_search", "kb/ko.md", "# 설정\n\n서버 설정은 매일 갱신됩니다.", 1, 3, 0.5)
    question = "서버 설정은 언제 갱신되나요?"
    answers = []
    for form in ("NFC", "NFD"):
        replies = {"analyze_and_route": [route("simple")], "plan": [search_plan("서버 설정")],
                   "synthesize": ["서버 설정은 매일 갱신됩니다 [1]."]}
        agent = Agent(ScriptedChatModel(replies), FakeToolbox({"vector_search": [[item]]}), Settings())
        result = agent.ask(unicodedata.normalize(form, question))
        answers.append((result.state.grounding.verdict, result.answer.split("\n")[0]))
    assert answers[1] == answers[0] == ("answered", "서버 설정은 매일 갱신됩니다 [1].")
