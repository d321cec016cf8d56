"""SPEC §7: "supported" means the cited evidence addresses the question, and a refusal opens an
answer only when the evidence does not hold the answer (``crag.grounding.verdict``)."""

from __future__ import annotations

import pytest

from crag import Agent, Settings
from crag.answer import NOT_ADDRESSED, NOT_ANSWERED, ONLY_RESTATED
from crag.grounding import HELD_SHARE, addresses, cited, holds_focus, says_nothing_new
from crag.grounding.verdict import Verdict, judge, may_rewrite
from crag.llm.offline import OfflineChatModel
from crag.llm.scripted import ScriptedChatModel
from crag.state import EvidenceItem, GroundingReport

from .fakes import FakeToolbox, item, route, search_plan

CLIMATE = item(1, text="The record high temperature of 105 °F was set on July 8, 1936.")
WINTER = item(3, text="January is the coldest month of the year in the city.")
PORTS = item(2, text="The server listens on port 8080 by default.")
OIL = item(4, text="The problem consists of trying to increase oil supplies while keeping prices low.")


def simple(question: str, reply: str, items) -> object:
    replies = {"analyze_and_route": [route("simple")], "plan": [search_plan("record")], "synthesize": [reply]}
    return Agent(ScriptedChatModel(replies), FakeToolbox({"vector_search": [list(items)]}), Settings()).ask(question)


def test_an_answer_from_a_passage_about_something_else_is_not_answered():
    result = simple("What is the record high in January?",
                    "The record high temperature of 105 °F was set on July 8, 1936 [1].", [CLIMATE, WINTER])
    assert result.state.grounding.supported == 1  # the sentence quotes its evidence...
    assert result.state.grounding.verdict == "not_answered"  # ...which is about July, not January
    assert result.answer.startswith(NOT_ADDRESSED)
    assert any(e["event"] == "question_not_addressed" and e["rule"] == "focus" for e in result.audit)


def test_the_same_passage_answers_the_question_it_addresses():
    result = simple("What is the record high in July?",
                    "The record high temperature of 105 °F was set on July 8, 1936 [1].", [CLIMATE])
    assert result.state.grounding.verdict == "answered" and not result.answer.startswith(NOT_ANSWERED)


def test_a_right_answer_padded_with_unsupported_sentences_is_not_refused():
    reply = ("The server listens on port 8080 by default [1]. It was chosen in 1998 by the founders. "
             "Most teams never change it because firewalls are configured for it.")
    result = simple("Which port does the server listen on?", reply, [PORTS])
    g = result.state.grounding
    assert g.sentences == 3 and g.supported == 1  # most sentences unsupported
    assert g.verdict == "answered" and not result.answer.startswith(NOT_ANSWERED)
    assert result.answer.startswith("The server listens on port 8080 by default [1].")
    assert "[unsupported]" in result.answer  # the padding stays visibly marked (note)


FORCED = EvidenceItem(
    tool="vector_search", source="docs/inference-providers/guides/function-calling.md", start_line=386, end_line=386,
    text="Here, we're forcing the model to call the `get_current_weather` function, and not call any other functions.",
    score=0.5, title="Function Calling with Inference Providers > Tool Choice")
CALLING = "How do I let a chat model call my own functions as tools?"


def test_a_passage_holds_the_focus_its_document_name_gives_it():
    """The passage writes call, function and model of the question's five words; its section's
    heading adds tool: two thirds."""
    assert not addresses(CALLING, [FORCED.text], HELD_SHARE)
    assert holds_focus(CALLING, [FORCED])
    assert cited([FORCED], [PORTS, FORCED]) == [FORCED]
    elsewhere = EvidenceItem(tool="vector_search", source="docs/hub/spaces-overview.md", text=FORCED.text,
                             start_line=386, end_line=386, title="Spaces Overview")
    assert not holds_focus(CALLING, [elsewhere])  # the same words under another document's name
    assert not holds_focus("Which port does the server listen on?", [FORCED])  # nor a question about something else


def test_a_right_answer_padded_with_unsupported_sentences_from_a_named_document_is_not_refused():
    reply = ("Set `tool_choice` to `auto` in the request and the model decides on its own. "
             "Here, we're forcing the model to call the `get_current_weather` function, and not call any "
             "other functions [1]. The function's result is then returned to the user as a streamed reply.")
    result = simple(CALLING, reply, [FORCED])
    g = result.state.grounding
    assert g.sentences == 3 and g.supported == 1  # most sentences unsupported...
    assert g.verdict == "answered" and not result.answer.startswith(NOT_ANSWERED)  # ...on the page that answers
    assert "[unsupported]" in result.answer


def test_the_verdict_table():
    one_of_three = GroundingReport(sentences=3, supported=1)
    none = GroundingReport(sentences=2, supported=0)
    assert judge(GroundingReport(), graded=False) is None
    assert judge(GroundingReport(sentences=3, supported=2), graded=False) is Verdict.ANSWERED
    assert judge(one_of_three, graded=False) is Verdict.NOT_ANSWERED  # mostly unsupported...
    assert judge(one_of_three, graded=False, held=True) is Verdict.ANSWERED  # ...but it holds the question's focus
    assert judge(one_of_three, graded=False, absent=["gRPC"], held=True) is Verdict.NOT_ANSWERED
    assert judge(one_of_three, graded=False, addressed=False) is Verdict.NOT_ANSWERED
    assert judge(one_of_three, graded=True, addressed=False) is Verdict.UNSUPPORTED
    assert judge(none, graded=True) is Verdict.UNSUPPORTED and judge(none, graded=False) is Verdict.NOT_ANSWERED
    assert may_rewrite(graded=False) and not may_rewrite(graded=True) and may_rewrite(True, ["gRPC"])


def test_what_addresses_a_question():
    assert not addresses("What is the record high in January?", ["The record high of 105 F was set on July 8."])
    assert addresses("What is the record high in January?", ["The record high for January is 76 F."])
    assert not addresses("How far apart are some of the neighborhood's features?",
                         ["The Picturephone used a bandwidth of 1 MHz."])
    assert addresses("How do I point crag at a local Ollama server?",
                     ["To point crag at a local Ollama server, set OPENAI_BASE_URL=http://localhost:11434/v1."])


def test_a_question_that_negates_is_addressed_only_by_a_passage_that_negates_about_it():
    broadcasts = "Encrypted broadcasts require a monthly subscription and a decoder card."
    question = "What do encrypted broadcasts never require?"
    assert not addresses(question, [broadcasts])
    assert addresses(question, ["Encrypted broadcasts never require a dish wider than one metre."])
    assert addresses(question, ["Encrypted broadcasts don't require a licence."])
    # the sentence that negates must be about what the question asks, not any "not" in the passage
    assert not addresses(question, [broadcasts + " The weather was not good that year."])
    assert not addresses("What is represented by non-binary notation?", ["Integers are represented in binary notation."])
    assert addresses("What is represented by non-binary notation?", ["Non-binary notation represents graphs."])
    assert addresses("How many schools are not public?", ["Twelve of the city's schools are not public."])
    assert not addresses("How many schools are not public?", ["Twelve of the city's schools are public."])
    # a passage negates without "not" too: "invalid" for "not valid", "missing", "lacks"
    token = "What status code is returned when the token is not valid?"
    assert addresses(token, ["When the token is invalid, the server returns status code 401."])
    assert not addresses(token, ["When the token is valid, the server returns status code 200."])
    assert addresses("What is returned when the header is not sent?", ["If the header is missing, 400 is returned."])
    assert addresses("What do ctenophores not have?", ["Ctenophores lack the stinging cells of cnidarians."])
    # "how" and "why" questions are answered by how a thing is done, in words that need not negate;
    # a question answered yes or no may be answered "no" in other words
    assert addresses("How do I make a field not required?", ["Give the field a default value to make it optional."])
    assert addresses("Why doesn't my server start?", ["The server starts only when port 8080 is free."])
    assert addresses("Is the server not running on port 8080?", ["The server listens on port 8080 by default."])
    assert addresses("In FastAPI, how do I make a field not required?", ["In FastAPI, give the field a default value."])
    assert addresses("With the default settings, is the server not running?", ["The server runs by default."])
    assert addresses("What does `is not None` test in the server code?", ["In the server code, `is not None` tests whether a value was given."])


def test_a_question_that_negates_a_word_with_a_prefix_is_addressed_only_where_the_passage_negates_it():
    """SQuAD 2.0 makes questions unanswerable with a prefix ("insignificant", "uninvited") or a
    spaced "non" ("non paid"): asked of passages that write the word alone, they were answered
    from them ("three more flows carry significant amounts of water")."""
    flows = "Three more flows carry significant amounts of water: the Nieuwe Merwede, the Oude Maas and the Noord."
    assert not addresses("How many more flows carry insignificant amounts of water?", [flows])
    assert addresses("How many more flows carry significant amounts of water?", [flows])
    assert addresses("How many more flows carry insignificant amounts of water?",
                     [flows + " Two flows carry insignificant amounts of water."])
    assert not addresses("Who uninvited Washington to dine with him?", ["Braddock invited Washington to dine with him."])
    assert addresses("Who uninvited Washington to dine with him?", ["Braddock uninvited Washington the next day."])
    # the passage's sentence that negates must negate the word itself, not something else
    delta = flows + " The Noord does not carry ships upstream of Dordrecht, whose flows carry water."
    assert not addresses("How many more flows carry insignificant amounts of water?", [delta])
    assert addresses("How many more flows carry insignificant amounts of water?",
                     [flows + " The Noord does not carry significant amounts of water."])
    assert not addresses("How many non paid holidays does the directive require?",
                         ["The directive requires four weeks of paid holidays each year."])
    # a word that only opens with the letters of a prefix is no negation where the passage writes
    # it, nor where what follows the prefix is short ("index": "dex")
    assert addresses("What does the index store?", ["The index stores each chunk's dex and its vectors."])
    assert addresses("What information does the log keep?", ["The log keeps the information of each answer."])


def test_an_answer_to_a_question_that_negates_from_a_passage_that_does_not_is_not_answered():
    passage = item(5, text="Encrypted broadcasts require a monthly subscription and a decoder card.")
    result = simple("What do encrypted broadcasts never require?",
                    "Encrypted broadcasts require a monthly subscription [1].", [passage])
    assert result.state.grounding.verdict == "not_answered"
    assert result.state.grounding.supported == 1 and result.answer.startswith(NOT_ADDRESSED)
    assert [e["rule"] for e in result.audit if e["event"] == "question_not_addressed"] == ["negation"]


def test_a_decade_or_century_the_question_names_is_held_by_a_year_within_it():
    question = "How many Huguenots fled France by the 1700s?"
    assert addresses(question, ["Some 200,000 Huguenots fled; in the early 18th century a group rioted."])
    assert addresses(question, ["By 1715 some 200,000 Huguenots had fled France."])
    assert not addresses(question, ["Huguenots fled France in 1685."])
    assert addresses("What bands were popular in the 1990s?", ["In 1994 the bands Oasis and Blur were popular."])
    assert not addresses("What bands were popular in the 1990s?", ["In 1984 the bands were popular."])


def test_a_number_the_question_names_is_held_when_a_passage_writes_it_in_words():
    """"Developed 100 years before whose theory?" answered from "almost a hundred years before
    ... Charles Darwin's theory" was refused: the question's "100" was looked for as written."""
    question = "The principle of faunal succession was developed 100 years before whose theory of evolution?"
    passage = ("Based on principles laid out by William Smith almost a hundred years before the "
               "publication of Charles Darwin's theory of evolution, the principles of succession developed.")
    assert addresses(question, [passage])
    assert addresses("What meets every 3 months?", ["The council meets every three months."])
    assert addresses("How many people live there?", ["Some 1,500 people live there."])  # no number asked
    assert not addresses(question, [passage.replace("a hundred", "fifty")])
    assert not addresses("What meets every 3 months?", ["The council meets every three weeks."])
    assert not addresses("Who won in 13 games?", ["The team won three games."])


def test_an_identifier_the_question_names_is_held_when_a_passage_quotes_it_as_code():
    """A passage that writes ``secrets.compare_digest()`` in backticks holds it as code, not as
    the words secret, compare and digest: those are the question's anchor, checked as one."""
    question = "Why should a username and password check use secrets.compare_digest to avoid timing attacks?"
    passage = ("Use a dependency to check if the username and password are correct.\n\n"
               "But by using the `secrets.compare_digest()` it will be secure against a type of "
               "attacks called \"timing attacks\".")
    assert addresses(question, [passage], HELD_SHARE)
    assert not addresses(question, [passage.replace("secrets.compare_digest", "hmac.new")], HELD_SHARE)
    assert not addresses(question, ["The `secrets.compare_digest()` function compares two strings."], HELD_SHARE)


def test_two_words_written_as_one_are_the_same_words():
    question = "How can I put the dataset viewer into my own web page?"
    passage = "You can embed the Dataset Viewer in your own webpage using an iframe."
    assert addresses(question, [passage], HELD_SHARE)
    assert addresses("How do I embed the viewer in a webpage?", ["Embed the viewer in a web page with an iframe."],
                     HELD_SHARE)
    assert not addresses(question, ["You can embed the Dataset Viewer using an iframe."], HELD_SHARE)


def test_an_answer_that_only_repeats_the_question_is_not_answered():
    question = "What problem consists of trying to increase oil supplies?"
    result = simple(question, "The problem consists of trying to increase oil supplies [1].", [OIL])
    assert result.state.grounding.supported == 1  # it quotes its evidence, and answers nothing
    assert result.state.grounding.verdict == "not_answered"
    assert result.answer.startswith(ONLY_RESTATED)
    assert any(e["event"] == "answer_restates_question" for e in result.audit)
    answered = simple(question, "The problem consists of trying to increase oil supplies while keeping "
                      "prices low [1].", [OIL])
    assert answered.state.grounding.verdict == "answered"
    assert not any(e["event"] == "answer_restates_question" for e in answered.audit)


def test_what_says_nothing_new():
    question = "What problem consists of trying to increase oil supplies and threats to US energy security?"
    assert says_nothing_new(question, ["The problem consists of trying to increase oil supplies [1]."])
    assert not says_nothing_new("When did the Democratic Republic of Afghanistan collapse?",
                                ["The Democratic Republic of Afghanistan collapsed in 1992 [1]."])  # a year
    assert not says_nothing_new("What are the small tentacles on Cydippids called?",
                                ["The small tentacles on Cydippids are called tentilla [1]."])  # a word
    assert not says_nothing_new("How many homes had the service in 2010?",
                                ["In 2010 the service reached 10 million homes [1]."])  # the question's year aside
    assert says_nothing_new("How many homes had the service in 2010?", ["The service had homes in 2010 [1]."])
    assert not says_nothing_new("What did the treaty limit?", ["The treaty did not limit anything [1]."])  # a no
    assert not says_nothing_new("Does the server retry failed requests?",  # yes or no: may repeat it
                                ["The server retries failed requests [1]."])
    assert not says_nothing_new("What problem consists of trying to increase oil supplies?", [])
    # a capital letter names something: "B cells and T cells" answers; "A" opening a phrase does not
    immune = "What are the key cell types of the adaptive immune system?"
    assert not says_nothing_new(immune, ["The key cell types of the adaptive immune system are B cells and T cells [1]."])
    assert says_nothing_new(immune, ["A key cell type of the adaptive immune system [1]."])
    assert says_nothing_new("What is vitamin D for?", ["Vitamin D is for it [1]."])  # the question's own letter


def test_a_sentence_naming_a_term_no_evidence_holds_is_not_kept_as_supported():
    """The question names HTTP/3, no item holds it: the opening says so, and the sentence that
    claims HTTP/3 support from a passage about uvicorn is not kept as what the evidence says."""
    uvicorn = item(5, text="Run uvicorn main:app --host 0.0.0.0 --port 80 to start the server.")
    reply = ("Run uvicorn main:app --host 0.0.0.0 --port 80 to start the server [1]. "
             "Run uvicorn main:app --host 0.0.0.0 --port 80 to start the server over HTTP/3 [1].")
    result = simple("How do I serve my app over HTTP/3 with QUIC?", reply, [uvicorn])
    assert result.state.grounding.verdict == "not_answered"
    assert result.state.grounding.supported == 1  # the sentence that writes HTTP/3 is not
    assert "over HTTP/3" not in result.body.split("\n\n", 1)[1]  # only what the evidence says
    assert "Run uvicorn main:app" in result.body


BRANCH = item(6, text="The Court of Justice has had the most influence on the development of EU law.")


def test_a_question_asked_with_the_opposite_of_what_the_passage_writes_is_not_answered():
    """SQuAD 2.0 makes questions unanswerable with an opposite: "the least influence" asked of
    a passage on the branch with the most. The model answered it from that passage."""
    result = simple("Which branch of the EU has had the least influence on the development of EU law?",
                    "The Court of Justice has had the least influence on the development of EU law [1].", [BRANCH])
    assert result.state.grounding.verdict == "not_answered" and result.answer.startswith(NOT_ADDRESSED)
    assert [e["rule"] for e in result.audit if e["event"] == "question_not_addressed"] == ["opposite"]


def test_an_opposite_leaves_alone_a_passage_that_writes_the_word_and_questions_it_does_not_fit():
    most = "Which branch of the EU has had the most influence on the development of EU law?"
    assert addresses(most, [BRANCH.text])
    least = most.replace("most", "least")
    assert addresses(least, [BRANCH.text + " The Council has had the least."])  # it writes the word too
    assert addresses("Has the Council had the least influence on EU law?", [BRANCH.text])  # yes or no: "no, the most"
    assert addresses("How did the branch with the least influence vote?", [BRANCH.text])  # how and why
    assert addresses("How many people, at most, have died of plague in Baghdad?",
                     ["At least 100,000 people died of plague in Baghdad."])  # "at most" is a bound
    assert not addresses("What area of science is understanding slowly changing?",
                         ["In an area of science where our scientific understanding is rapidly changing."])


def test_an_answer_opening_with_the_instruction_written_back_is_grounded_without_it():
    factory = item(5, text="In 2005 the factory was bought by AvtoZAZ, a Ukrainian car manufacturer.")
    result = simple("Who bought the factory in 2005?",
                    'The direct answer to "Who bought the factory in 2005?" is AvtoZAZ [1].', [factory])
    assert result.body.startswith("AvtoZAZ [1].")
    assert result.state.grounding.verdict == "answered"


def test_a_name_written_without_its_accents_is_the_name_the_evidence_writes_with_them():
    """Typed without accents ("Schrodinger", as most keyboards write it), a name the evidence
    writes with them ("Schrödinger") is one the evidence holds: the answer is not refused for
    it, and a sentence that writes it either way is supported (accents folded as the search folds them)."""
    force = item(5, text="The notion of force keeps its meaning in both Newtonian and Schrödinger equations.")
    reply = "The notion of force keeps its meaning in both Newtonian and Schrodinger equations [1]."
    result = simple("What notion keeps its meaning in both Newtonian and Schrodinger equations?", reply, [force])
    assert not any(e["event"] == "question_terms_missing" for e in result.audit)
    assert result.state.grounding.supported == 1 and result.state.grounding.verdict == "answered"
    result = simple("How large is Zu\u0308rich among the cities of the country?",  # an accent as a combining mark
                    "Zurich is the largest city of the country, with banks and a lake [1].",
                    [item(5, text="Zu\u0308rich is the largest city of the country, with banks and a lake.")])
    assert not any(e["event"] == "question_terms_missing" for e in result.audit)
    assert result.state.grounding.supported == 1 and result.state.grounding.verdict == "answered"


@pytest.mark.parametrize("question, text", [
    ("Who was Boleslaw II of Masovia?", "Bolesław II of Masovia was a duke who ruled from Płock."),
    ("What river runs through Lodz?", "No large river runs through Łódź, a city of textile mills."),
    ("When was the Oresund Bridge opened?", "The Øresund Bridge was opened on 1 July 2000."),
    ("When was the parish church of Hamrun built?", "The parish church of Ħamrun was built in 1875."),
    ("Where does the IJssel river flow?", "The Ĳssel river flows north past the town of Deventer."),
])
def test_a_name_typed_with_plain_letters_is_the_name_the_evidence_writes_with_its_own(question, text):
    """"Boleslaw" typed for "Bolesław" (letters that no accent folding reads as another: ł, ø,
    ß, æ ...) was a term "none of the documents found mentions", and a right answer was refused."""
    reply = text.rstrip(".") + " [1]."
    result = simple(question, reply, [item(5, text=text)])
    assert not any(e["event"] == "question_terms_missing" for e in result.audit)
    assert result.state.grounding.verdict == "answered"


def test_the_offline_answer_from_passages_sharing_one_word_with_the_question_is_not_answered(tmp_path, monkeypatch):
    # The offline answer quotes the passages sharing the most words with the question: a horse
    # that "can run" answered "What speed does the quasarite pump run at?" as `answered`.
    from .fakes import clean_env, cli

    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "animals.md").write_text("# Animals\n\nA horse can run at 70 km/h over short distances.\n\n"
                                   "The giraffe sleeps about 30 minutes per day.\n")
    (kb / "backup.md").write_text("# Backups\n\nNightly backups are kept for 30 days in the cold storage bucket.\n\n"
                                  "To restore a backup, run the restore script with the snapshot id.\n")
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert cli("index", "kb")[0] == 0
    import json

    code, out, _ = cli("ask", "--json", "What speed does the quasarite pump run at?")
    result = json.loads(out)
    assert code == 0 and result["grounding"]["verdict"] == "not_answered"
    assert result["body"].startswith(NOT_ADDRESSED)
    code, out, _ = cli("ask", "--json", "How do I restore a backup?")
    result = json.loads(out)
    assert result["grounding"]["verdict"] == "answered" and "run the restore script" in result["body"]


def test_sentences_parted_by_what_no_reader_sees_are_judged_one_by_one():
    """A zero-width space (or an escape sequence) after a sentence's full stop glued the next
    sentence to it: one sentence holding two files' claims, supported by neither, and a right
    answer became the no-evidence sentence."""
    backups = item(5, text="Backups are kept for 30 days in the archive bucket.")
    for sep in (" ", "\u200b ", "\x1b[0m\n"):
        reply = f"The server listens on port 8080 by default [1].{sep}Backups are kept for 30 days in the archive bucket [2]."
        result = simple("Which port does the server use and how long are backups kept?", reply, [PORTS, backups])
        g = result.state.grounding
        assert (g.sentences, g.supported, g.verdict) == (2, 2, "answered"), (sep, g)
        assert "\u200b" not in result.answer and "\x1b" not in result.answer


def test_a_number_the_question_writes_is_held_only_as_a_whole_number():
    """docs/grounding.md: `answered` needs the passages to hold every anchor the question writes.
    "95 volts" was held by "version 0.95.0" (and by 2.95): a number compared as a substring. It is
    held where it is written as a number of its own (or as "1,500", "three" for 1500 and 3)."""
    question = "Can the quasar controller firmware take 95 volts?"
    for text in ("The quasar controller added the turbo setting in version 0.95.0 of its firmware.",
                 "The quasar controller firmware costs 2.95 dollars.",
                 "The quasar controller firmware takes 195 volts."):
        assert not addresses(question, [text]), text
    for text in ("The quasar controller firmware takes 95 volts.", "The quasar controller firmware (95) takes volts.",
                 "The quasar controller firmware takes 95% of the volts."):
        assert addresses(question, [text]), text
    assert addresses("Does the quasar controller listen on port 8080?", ["The quasar controller listens on 0.0.0.0:8080."])
    assert addresses("Does the quasar controller take 1500 volts?", ["The quasar controller takes 1,500 volts."])
    # end to end, offline: the quote holds the words, not the number
    version = item(1, source="kb/notes.md",
                   text="The quasar controller added the turbo setting in version 0.95.0 of its firmware.")
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[version]]}), Settings()).ask(question)
    assert result.state.grounding.verdict == "not_answered" and result.answer.startswith(NOT_ADDRESSED)


def test_a_named_term_is_held_in_its_singular_or_plural_or_as_the_name_of_its_demonym():
    """"Starting in what year has Harvard topped the Academic Rankings of World Universities?"
    opened with "none of the documents found mentions Academic Rankings" above the quote saying
    "the Academic Ranking of World Universities (ARWU) since 2003"; "Israelis" was not held by
    "Israel". A named word is held in its other number and as the name of its demonym, written
    as a name (capitalised); what no document names stays missing."""
    from crag.grounding import missing

    harvard = "Harvard has consistently topped the Academic Ranking of World Universities (ARWU) since 2003."
    assert missing("Starting in what year has Harvard topped the Academic Rankings of World Universities?",
                   [harvard]) == []
    oil = "Japan issued a statement asserting that Israel should withdraw, advocating Palestinian self-determination."
    assert missing("When did Japan tell Israelis to withdraw from the Palestine?", [oil]) == []
    assert missing("Which Palestinians did Japan name?", ["The statement of Japan was about Palestine."]) == []
    assert missing("Which APIs does the Quasar Server offer?", ["The Quasar Servers offer one API."]) == []
    # not a name's other form: a lower-case word, a shorter root, another word
    assert missing("How do I install the agent on Windows?", ["The context window holds 8192 tokens."]) == ["Windows"]
    assert missing("Does the agent support Redis?", ["The red light blinks."]) == ["Redis"]
    assert missing("How do I deploy it with Terraform, Kotlin, Mangum, gRPC or HTTP/3?",
                   ["Deploy it with Docker; HTTP/2 and REST are supported."]) == ["Terraform", "Kotlin", "Mangum",
                                                                                   "gRPC", "HTTP/3"]
    # end to end, offline: the right quote, no refusal
    passage = item(1, source="kb/harvard.txt", text="In particular, " + harvard)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[passage]]}), Settings()).ask(
        "Starting in what year has Harvard topped the Academic Rankings of World Universities?")
    assert not result.answer.startswith("The knowledge base does not appear"), result.answer


def test_a_number_the_question_writes_is_held_by_a_number_it_opens():
    """docs/grounding.md: a number is held where a number is written from its start with it
    (leading zeros aside) and no digit follows it there. Read as a number of its own only, 3.11
    was not held by "Python 3.11.4" nor 9 by "09:00": right answers opened with the refusal."""
    for question, text in (
            ("Does the quasar controller need Python 3.11?", "The quasar controller needs Python 3.11.4 or later."),
            ("Was the quasar controller firmware version 0.95 released in March?",
             "The quasar controller firmware version 0.95.0 was released in March."),
            ("Is the drill rig motor rated for 95 volts?", "The drill rig motor is rated for 95.0 volts."),
            ("Does the harbour shop open at 9 on weekdays?", "The harbour shop opens at 09:00 on weekdays."),
            ("Does the harbour shop open at 09:00 on weekdays?", "The harbour shop opens at 9:00 on weekdays."),
            ("Did the quasar API version 2 add streaming?", "The quasar API added streaming in version 2.0."),
            ("Does the quasar controller listen on port 8080?", "The quasar controller listens on 0.0.0.0:8080."),
            ("Does the quasar controller take 1500 volts?", "The quasar controller takes 1,500 volts."),
            ("Does the quasar controller take 3 volts?", "The quasar controller takes three volts.")):
        assert addresses(question, [text]), (question, text)
    # a number inside another, or one that goes on in digits, is not held
    for question, text in (
            ("Can the quasar controller firmware take 95 volts?", "The quasar controller firmware version 0.95.0 takes volts."),
            ("Can the quasar controller firmware take 95 volts?", "The quasar controller firmware takes 1995 volts."),
            ("Can the quasar controller firmware take 95 volts?", "The quasar controller firmware takes 1,950 volts."),
            ("Does the quasar controller need Python 3.1?", "The quasar controller needs Python 3.11.4 or later."),
            ("Does the quasar controller take 1 volt?", "The quasar controller takes 1,500 volts.")):
        assert not addresses(question, [text]), (question, text)
    # end to end, offline: the quote that answers, no refusal
    python = item(1, source="kb/quasar.md", text="The quasar controller needs Python 3.11.4 or later.")
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[python]]}), Settings()).ask(
        "Does the quasar controller need Python 3.11?")
    assert result.state.grounding.verdict == "answered" and not result.answer.startswith(NOT_ADDRESSED), result.answer


def test_a_named_term_is_not_held_by_a_word_capitalised_only_as_a_sentence_opens():
    """docs/grounding.md: a named word is held in another form the documents write as a name.
    "Notes" was held by a sentence opening "Not every release" (its "es" stripped), "Teams" by
    one opening "Team leads approve", "Alexis" by "Alex owns" (read as a demonym): a word
    capitalised because it opens a sentence, a line or a list item is no name, a plural strips
    "es" only after s, x, z, ch or sh, and a demonym is read back to a name of five letters or more."""
    from crag.grounding import missing

    doc = ("# Release ownership\n\nAlex owns the release checklist for the billing service.\n\n"
           "Not every release of the billing service needs a checklist.\n\n"
           "Team leads approve every release of the billing service before it ships.\n\n- Note the date.")
    for question, term in (("Can the billing service release checklist be kept in Notes?", "Notes"),
                           ("Are billing service releases announced in Teams?", "Teams"),
                           ("Does Alexis own the billing service release checklist?", "Alexis")):
        assert missing(question, [doc]) == [term], question
    assert missing("Can the checklist be kept in Notes?", ["Keep the checklist in Not, the tracker."]) == ["Notes"]
    assert missing("Does Alexis own the checklist?", ["The checklist is owned by Alex."]) == ["Alexis"]
    # the same forms written as names where no sentence opens are held
    assert missing("Are releases announced in Teams?", ["Releases are announced in the Team channel."]) == []
    assert missing("Can the checklist be kept in Notes?", ["Not always: keep it in the Note app."]) == []
    assert missing("Which Classes and Boxes does the Quasar ship?", ["The Quasar ships a Class and a Box."]) == []
    assert missing("Which APIs does the Quasar offer?", ["API keys are per user.\n\nThe Quasar API is REST."]) == []
    assert missing("Which APIs does the Quasar offer?", ["API keys are per Quasar user."]) == []  # capitals: a name anywhere
    assert missing("When did Japan tell Israelis to withdraw?", ["Japan said that Israel should withdraw."]) == []
    assert missing("When did Japan tell Israelis to withdraw?", ["Israel should withdraw, said Japan."]) == ["Israelis"]
    # end to end, offline: the refusal names the term no document names
    passage = item(1, source="kb/release.md", text=doc)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[passage]]}), Settings()).ask(
        "Can the billing service release checklist be kept in Notes?")
    assert result.answer.startswith("The knowledge base does not appear") and "mentions Notes" in result.answer, \
        result.answer
