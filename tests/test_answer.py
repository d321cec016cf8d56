"""Citations footer, marker renumbering and the usage block (SPEC §7)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crag.answer import STATS_HEADING, compose, renumber, stats_block, without_source_list
from crag.prompts import clean_answer
from crag.state import Completion, EvidenceItem, Usage

from .fakes import item


def test_markers_renumbered_by_first_use_and_lists_understood():
    text, order = renumber("A [3]. B [1, 3]. C [2][3]. D [1-2].", 3)
    assert text == "A [1]. B [2][1]. C [3][1]. D [2][3]."
    assert order == [2, 0, 1]


def test_markers_pointing_at_no_evidence_are_removed():
    text, order = renumber("A [7]. B [2]. C [0, 2].", 2)
    assert text == "A. B [1]. C [1]."
    assert order == [1]


def test_a_marker_too_long_for_int_is_removed_like_any_marker_naming_no_item():
    """int() refuses a number of more than 4300 digits: a model's "[999...9]" was a traceback."""
    huge = "9" * 5000
    assert renumber(f"A [{huge}]. B [2]. C [[{huge}]]. D [1-{huge}]. E [0000000002].", 2) == (
        "A. B [1]. C. D [2]. E [1].", [1, 0])


def test_code_links_and_footnotes_are_left_alone():
    text, order = renumber("Use `arr[1]` and [docs](https://x) [^1]\n```\nx = y[2]\n```\nok [2]", 2)
    assert "`arr[1]`" in text and "[docs](https://x)" in text and "[^1]" in text and "y[2]" in text
    assert text.endswith("ok [1]") and order == [1]


def test_a_longer_fence_holding_a_shorter_one_is_code_to_its_end():
    """A README shows an answer in a ````console block that holds a ```sh block and the answer's
    own footer: the inner ``` was taken for the end of the code, so the offline answer quoting it
    renumbered the example's "[2] README.md:L116" as a citation ("[4] README.md:L116", one
    dropped) beside crag's own footer, and a code block must stay as the file writes it."""
    example = "````console\ncrag log\n```\n[3]\n\n- Ollama: [4]\n\n[1] README.md:L191\n[2] README.md:L116\n````"
    text, order = renumber(f"Intro [2]:\n\n{example}\n[2]\n\nAfter [1].", 2)
    assert text == f"Intro [1]:\n\n{example}\n[1]\n\nAfter [2]." and order == [1, 0]
    tilde = "~~~~\n~~~\n[3] a.md:L1\n~~~~"
    assert renumber(f"Run [2]:\n{tilde}\n[1]", 2)[0] == f"Run [1]:\n{tilde}\n[2]"


def test_an_answer_citing_nothing_has_no_footer():
    # The footer lists only what the body cites (grounding adds the markers the model left out).
    items = [item(1, source="a.md", start=3), item(2, source="b.md", start=None)]
    answer, citations = compose("No markers here.", items, Usage("m"))
    assert "a.md" not in answer and "b.md" not in answer
    assert answer.startswith("No markers here.\n\n---\n") and citations == ()


def test_a_source_list_the_model_wrote_at_its_end_is_left_out_for_the_footer():
    listed = "Port 8080 [1].\n\nSources:\n[1] docs/setup.md:L7\n\n- [2]: https://example.com/a (Setup)\n"
    assert without_source_list(listed) == "Port 8080 [1]."
    assert without_source_list("Port [1].\n\n**References:**\n[2] setup.md") == "Port [1]."
    assert without_source_list("Port [1].\n\n## Source\n* [1] https://example.com/a") == "Port [1]."
    assert clean_answer(listed + f"\n---\n{STATS_HEADING}\n- **API calls:** 9") == "Port 8080 [1]."
    # Prose that opens with a marker, a list the answer goes on after, code, a heading in prose: kept.
    for kept in ("[1] Done.", "Port [1].\n[1] Restart the server.", "See:\n[1] docs/a.md\n\nMore [1].",
                 "Port [1].\n```\n[1] docs/a.md\n```", "Port [1].\n\nSources: the setup guide."):
        assert without_source_list(kept) == kept



def test_a_code_block_the_answer_leaves_open_is_closed_as_it_was_opened():
    # A reply cut by its budget mid-code: left open, the block held the footer and usage block.
    assert clean_answer("Run [1]:\n\n```sh\nmake") == "Run [1]:\n\n```sh\nmake\n```"
    assert clean_answer("Run:\n> ~~~~\n> make") == "Run:\n> ~~~~\n> make\n> ~~~~"
    assert clean_answer("A\n```\nx\n```\nB\n````py\n```\ny") == "A\n```\nx\n```\nB\n````py\n```\ny\n````"
    assert clean_answer("Run [1].\n\n```sh\n") == "Run [1]."  # an empty block opened last goes
    assert clean_answer("Run:\n```sh\nmake\n```") == "Run:\n```sh\nmake\n```"


@pytest.mark.parametrize("listed", [
    "\n\n**Sources:** [1], [2]", "\n\nReferences: docs/setup.md:L7, docs/faq.md:L5", "\n\nSources: docs/setup.md",
    "\n\n**Sources**\n1. docs/setup.md\n2. docs/faq.md", "\n\n### References\n- docs/setup.md:L7 (Setup)\n- https://x.org/a",
])
def test_a_source_list_of_markers_or_bare_paths_is_left_out_for_the_footer(listed):
    """Models list their sources as "**Sources:** [1], [2]" or as a list of paths under a heading:
    kept, the markers cited whole chunks that support no sentence, and each path was a sentence
    judged unsupported, one more toward refusing a right answer."""
    assert without_source_list(f"Port 8080 [1].{listed}") == "Port 8080 [1]."
    files = "The files are:\n\n- app/main.py\n- docs/setup.md"  # paths the answer lists, with no sources heading
    assert without_source_list(files) == files
    assert without_source_list("Port [1].\n\nSources: see the setup guide [1].") == "Port [1].\n\nSources: see the setup guide [1]."


def test_grep_match_cites_the_matching_line():
    match = EvidenceItem("grep_search", "src/app.py", "a\nb\nmatch\nd\ne", 8, 12, anchor_line=10)
    answer, citations = compose("See [1].", [match], Usage("m"))
    assert "[1] src/app.py:L10" in answer and citations[0].line == 10


def test_remote_sources_have_no_line():
    jira = EvidenceItem("jira_fetch", "FSR-123", "text", url="https://jira/browse/FSR-123")
    page = EvidenceItem("web_fetch", "https://example.com/page", "text")
    answer, _ = compose("See [1] and [2].", [jira, page], Usage("m"))
    assert "[1] FSR-123\n[2] https://example.com/page\n" in answer


def test_stats_block_lists_model_calls_tokens_latency_in_total_and_per_node():
    usage = Usage("gpt-4o-mini").add("plan", Completion("x", "gpt-4o-mini", 300, 40, 410.0))
    usage = usage.add("synthesize", Completion("x", "gpt-4o-mini", 900, 110, 1200.0))
    block = stats_block(usage)
    assert block.startswith("---\n" + STATS_HEADING + "\n")
    for text in ("gpt-4o-mini", "API calls:** 2", "1,200 prompt / 150 completion / 1,350 total", "1,610 ms",
                 "`plan`: 1 call, 300 prompt / 40 completion / 340 total tokens, 410 ms"):
        assert text in block


@given(st.text(max_size=200), st.integers(0, 6))
def test_renumbered_markers_are_always_in_range_and_in_first_use_order(text, n):
    _out, order = renumber(text, n)
    assert len(order) == len(set(order)) and all(0 <= i < n for i in order)
    answer, citations = compose(text, [item(k + 1) for k in range(n)], Usage("m"))
    assert answer.count(STATS_HEADING) >= 1
    assert [c.n for c in citations] == list(range(1, len(citations) + 1))


def test_markers_listed_as_prose_are_renumbered_as_one_run_and_leave_no_stray_commas() -> None:
    # Qwen2.5-Coder-1.5B wrote "According to the evidence, [1], [2], [3], and [4], there were
    # ..."; with only [1] pointing at evidence the answer read "evidence,, [1],,, and, there".
    text = "According to the evidence, [1], [2], [3], and [4], there were 500,000 [4]."
    assert renumber(text, 1) == ("According to the evidence, [1], there were 500,000.", [0])
    assert renumber(text, 0)[0] == "According to the evidence, there were 500,000."
    assert renumber("See [2] and [1]; [2].", 2) == ("See [1][2].", [1, 0])
    assert renumber("Use `a[1], [2]` as [3] and [1] do.", 3)[0] == "Use `a[1], [2]` as [1][2] do."
    # joined by "or" too: dropping the second left "See [1] or." and "Also see [1] or for retries."
    assert renumber("The port is set in [1] or [9].", 1)[0] == "The port is set in [1]."
    assert renumber("Also see [1] or [9] for retries.", 1)[0] == "Also see [1] for retries."
    assert renumber("Use [1], or [2] for it.", 2)[0] == "Use [1][2] for it."


def test_a_sentence_that_only_pointed_at_no_evidence_goes_whole() -> None:
    # "See [9]." after a cited sentence, with no item 9: "See" went with its marker and its full
    # stop stayed, "... 30 days [1]. ." (chitchat, which cites nothing: "I am fine..").
    assert renumber("Kept for 30 days [1]. See [9].", 1)[0] == "Kept for 30 days [1]."
    assert renumber("Kept for 30 days [1]. [4]. Restore [1].", 1)[0] == "Kept for 30 days [1]. Restore [1]."
    assert renumber("Hi there! I am fine [1]. See [2].", 0)[0] == "Hi there! I am fine."
    assert renumber("See [3].\nPort [1].", 1)[0] == "Port [1]."
    assert renumber("Use v1.2 [9]. Then 8080 [1].", 1)[0] == "Use v1.2. Then 8080 [1]."
    # as a list item or after "Sources:" (it left "-." and "1 [unsupported].")
    assert renumber("Kept [1].\n- See [9].\n- Restore [1].", 1)[0] == "Kept [1].\n- Restore [1]."
    assert renumber("Kept [1].\n1. See [9].\n2. Restore [1].", 1)[0] == "Kept [1].\n2. Restore [1]."
    assert renumber("Kept [1].\n\nSources: [9].", 1)[0].rstrip() == "Kept [1]."
    # the words that led up to the "see" at a sentence's start go too: "Also." and "For more
    # details." were left, fragments of crag's making
    for lead in ("Also see", "Also, see", "For more details, see", "For details see", "You can also see",
                 "Please see", "For further information, see"):
        assert renumber(f"Kept [1]. {lead} [9].", 1)[0] == "Kept [1].", lead
        assert renumber(f"Kept [1].\n- {lead} [9].\n- Restore [1].", 1)[0] == "Kept [1].\n- Restore [1].", lead
    assert renumber("Kept [1]. For more details, see [1].", 1)[0] == "Kept [1]. For more details, see [1]."
    assert renumber("Kept [1] (also see [9]).", 1)[0] == "Kept [1]."
    # only when the sentence ends at the marker: one that goes on keeps the words it opens with
    # ("I can help.; ask me anything." and "and the FAQ." were left)
    assert renumber("I can help. For details see [9]; ask me anything.", 1)[0].startswith("I can help. For details")
    for lead in ("For more details, see", "You can also see"):
        assert renumber(f"Kept [1]. {lead} [9] and the FAQ.", 1)[0].startswith(f"Kept [1]. {lead.rsplit(None, 1)[0]}")
    # with one space where the "see" and its marker stood ("details,  and the FAQ" had two)
    assert renumber("Kept [1]. For more details, see [9] and the FAQ.", 1)[0] == (
        "Kept [1]. For more details, and the FAQ.")
    assert renumber("The port, see [9] and the FAQ, is 80 [1].", 1)[0] == "The port, and the FAQ, is 80 [1]."


def test_markers_in_superscript_or_in_brackets_of_their_own_are_markers() -> None:
    # A model's "[¹]", "[[2]]" (a wiki's link) or "[1]]]" (brackets doubled) were half read:
    # "[¹]" stayed as written, "[[9]]" left "[]", "[1]]]" kept its stray "]]".
    assert renumber("A [²]. B [¹, ²]. C [[2]]. D [1]]]. E [[1]", 2)[0] == "A [1]. B [2][1]. C [1]. D [2]. E [2]"
    assert renumber("A [[9]]. B [[1], [9]]. C [[2][1]].", 2)[0] == "A. B [1]. C [2][1]."
    # a bracket that pairs with another on its line, a link's text and code stay as written
    assert renumber("[see [1]] and [[2]](https://x)", 2)[0] == "[see [1]] and [[2]](https://x)"
    assert renumber("Use `a[[1]]` [[1]].\n```\nb = [[2]]\n```", 2)[0] == "Use `a[[1]]` [1].\n```\nb = [[2]]\n```"
