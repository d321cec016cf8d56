"""Agent.stream and Agent.astream: grounded chunks that join to exactly the answer ask returns."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crag import Agent, AnswerStream, ScriptedChatModel, Settings
from crag.answer import NO_EVIDENCE, NOT_ADDRESSED, ONLY_RESTATED, STATS_HEADING
from crag.errors import LLMError, UsageError
from crag.events import AnswerDelta, AnswerStarted
from crag.llm.openai_chat import OpenAIChatModel
from crag.stream import AnswerText

from .fakes import FakeToolbox, route, scores, search_plan
from .openai_server import FakeOpenAIServer, grades
from .test_grounding import BACKUP, SETUP

# Sentences grounding supports, does not support, judges clause by clause; markers right and
# wrong; code, a table row, lists, scaffolding; whitespace of every kind.
PIECES = ["The server listens on port 8080 by default.", " ", "\n", "\n\n", "[1]", "[2]", "[1, 2]", "[7]",
          "A backup is kept for thirty days.", "It was released on October 22, 2024.", "Here is what I found:",
          "- ", "1. ", "\n```\nx = [1]\n```\n", "Set `SERVICE_PORT` to change the port.", "| a | b |\n", "e.g. ",
          "The client retries failed uploads three times before it gives up",
          ", and every copy is encrypted with a key the security team holds",
          ", and nightly backups are written to the object store at 02:00 UTC", "**bold** ", "# Heading\n"]
# What rewrites text already written once more arrives: think tags (a lone "</think>" drops
# what precedes it until a cited sentence), fences and code spans, repeated sentences as
# list items, usage blocks the model writes, references copied from the evidence headers,
# unicode; and sentences grounding does not support, whose verdict may reopen the answer.
REWRITES = ["<think>", "</think>", "<think>Which page [2]?</think>", "<thinking>", "</reasoning>", "<THINK>", "```",
            "`", "~~~", "\n```python\n", "1. The server listens on port 8080 by default.", "\n- A backup is kept",
            "\n---\n", STATS_HEADING, "\nLLM Usage Stats:\n", "- **Model:** x\n", "API calls: 99, tokens: 12\n",
            "Total tokens: 5", "docs/setup.md:L22", "> ", "1.",
            "It is blue.", "The moon is made of cheese.", "Überall grün — ja. ", "日本語の文です。", "🚀 ", "\u00f0\u0178",
            "| port | 8080 |\n|---|---|\n", "\t", "\r\n", "?", "[", "]", "[1].", "[^1]", "[^", "[Source 2]", "A backup is kept for thirty days [2].",
            # a source list the model writes itself, which only crag's footer replaces
            "\n\nSources:\n", "[1] docs/setup.md:L22\n", "- [2]: https://example.com/x", "[2] docs/other.md:L5"]


class Chunked(ScriptedChatModel):
    """A scripted model that streams its answer in the pieces ``cuts`` makes."""

    def __init__(self, replies, cuts=()) -> None:
        super().__init__(replies)
        self.cuts = cuts

    def complete(self, request, on_delta=None):
        reply = super().complete(request)
        if on_delta is not None:
            last = 0
            for cut in [*sorted(set(self.cuts)), len(reply.text)]:
                if reply.text[last:cut]:
                    on_delta(reply.text[last:cut])
                last = max(last, cut)
        return reply


def agent_for(reply: str, mode: str = "note", cuts=(), graded: bool = False) -> Agent:
    """The simple path (no grade: the verdict may rewrite the answer's opening), or with
    ``graded`` the corrective path, where the grader approved the evidence."""
    replies = {"analyze_and_route": [route("complex" if graded else "simple", ["vector_search"])],
               "plan": [search_plan("port")], "grade_evidence": [scores(0.9, 0.9)], "synthesize": [reply, reply]}  # an empty one is asked again
    settings = Settings(grounding=mode, auto_approve_max_items=0)
    return Agent(Chunked(replies, cuts), FakeToolbox({"vector_search": [[SETUP, BACKUP]]}), settings)


def without_latency(text: str) -> str:
    return re.sub(r"\d[\d,]* ms", "N ms", text)


@settings(suppress_health_check=[HealthCheck.too_slow])  # 100 examples; HYPOTHESIS_PROFILE=thorough: 2,000
@given(st.lists(st.sampled_from(PIECES + REWRITES), min_size=1, max_size=14), st.sampled_from(["note", "strict", "off"]),
       st.booleans(), st.data())
def test_property_the_chunks_join_to_exactly_the_answer_ask_returns(pieces, mode, graded, data):
    reply = "".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=10))
    stream = agent_for(reply, mode, cuts, graded).stream("Which port does the server listen on?")
    chunks = list(stream)
    assert "".join(chunks) == stream.result.answer and not stream.restarted
    asked = agent_for(reply, mode, graded=graded).ask("Which port does the server listen on?")
    assert without_latency(stream.result.answer) == without_latency(asked.answer)
    assert stream.result.state.grounding == asked.state.grounding


# -- against a real OpenAI-compatible server on loopback, the answer streamed word by word --

@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer() as srv:
        yield srv


def served(srv: FakeOpenAIServer, reply: str, mode: str, path: str) -> Agent:
    srv.default("analyze_and_route", route(path, ["vector_search"]))
    srv.default("plan", search_plan("port"))
    srv.default("grade_evidence", grades(rest=0.9))
    srv.default("synthesize", reply)
    settings = Settings(llm="openai", openai_base_url=srv.base_url, grounding=mode, auto_approve_max_items=0)
    return Agent(OpenAIChatModel(settings), FakeToolbox({"vector_search": [[SETUP, BACKUP]]}), settings)


# The second question names a term no evidence item holds: the verdict is not_answered whatever the grade.
QUESTIONS = ["Which port does the server listen on?", "Which port does the gRPC server listen on?"]


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(PIECES + REWRITES), max_size=16), st.sampled_from(["note", "strict", "off"]),
       st.sampled_from(["simple", "complex", "chitchat"]), st.sampled_from(QUESTIONS))
def test_property_over_http_the_chunks_join_to_exactly_the_answer_ask_returns(server, pieces, mode, path, question):
    # The default profile draws 100 replies; HYPOTHESIS_PROFILE=thorough draws 2,000.
    reply = "".join(pieces)
    stream = served(server, reply, mode, path).stream(question)
    chunks = list(stream)
    assert "".join(chunks) == stream.result.answer and not stream.restarted
    asked = served(server, reply, mode, path).ask(question)
    assert without_latency("".join(chunks)) == without_latency(asked.answer)
    assert stream.result.state.grounding == asked.state.grounding


def test_a_grounded_answer_streams_sentence_by_sentence_and_ends_with_footer_and_usage():
    reply = "The server listens on port 8080 by default [2]. A backup is kept for thirty days. It is blue."
    cuts = range(0, len(reply), 5)
    stream = agent_for(reply, cuts=cuts, graded=True).stream("Which port?")
    chunks = list(stream)
    assert len(chunks) >= 2  # the first sentence arrived while the model wrote
    assert chunks[0].startswith("The server listens on port 8080 by default [1].")  # grounded, renumbered
    assert "[1] docs/setup.md:L22" in chunks[-1] and "LLM Usage Stats" in chunks[-1]
    assert "".join(chunks) == stream.result.answer
    assert "It is blue [unsupported]." in stream.result.answer


def test_a_source_list_the_model_writes_is_left_out_of_the_streamed_answer():
    # Small models end their reply with a source list of their own; it was grounded as
    # sentences ("Sources:", " docs/other.md:L5 [unsupported]") after crag's footer took its
    # place. Now it goes before grounding, and the stream never shows a line of it.
    reply = ("The server listens on port 8080 by default [1].\n\n[2] A backup is kept for thirty days.\n\n"
             "Sources:\n[1] docs/setup.md:L22\n[2] docs/other.md:L5\n")
    for cuts in (range(0, len(reply), 3), range(len(reply))):
        stream = agent_for(reply, cuts=cuts, graded=True).stream("Which port does the server listen on?")
        chunks = list(stream)
        answer = stream.result.answer
        assert len(chunks) >= 2 and "".join(chunks) == answer and not stream.restarted
        assert chunks[0].startswith("The server listens on port 8080 by default [1].")  # while the model wrote
        # A line of prose that opens with a marker stays; the footer is crag's own.
        assert answer.startswith("The server listens on port 8080 by default [1].\n\n"
                                 "[2] A backup is kept for thirty days.\n\n"
                                 "[1] docs/setup.md:L22\n[2] docs/backup.md:L4\n\n---\n")
        assert stream.result.state.grounding.unsupported == ()


def test_an_answer_that_is_not_streamed_is_one_chunk():
    agent = Agent(ScriptedChatModel({"analyze_and_route": [route("simple", ["vector_search"])],
                                     "plan": [search_plan("port")]}), FakeToolbox({}), Settings(max_iterations=1))
    stream = agent.stream("Which port?")
    (chunk,) = list(stream)
    assert chunk == stream.result.answer and chunk.startswith(NO_EVIDENCE)


def test_astream_yields_the_same_chunks_in_an_event_loop():
    reply = "The server listens on port 8080 by default. A backup is kept for thirty days."

    async def run():
        stream = agent_for(reply, cuts=range(0, len(reply), 7)).astream("Which port?")
        return [chunk async for chunk in stream], stream

    chunks, stream = asyncio.run(run())
    again = list(agent_for(reply, cuts=range(0, len(reply), 7)).stream("Which port?"))
    assert "".join(chunks) == stream.result.answer and len(chunks) == len(again)


def test_events_reach_on_event_on_the_iterating_thread_in_order_with_the_chunks():
    seen: list[object] = []
    threads = set()

    def on_event(event):
        seen.append(event)
        threads.add(threading.get_ident())

    stream = agent_for("The server listens on port 8080 by default.").stream("Which port?", on_event=on_event)
    for chunk in stream:
        seen.append(chunk)
    assert threads == {threading.get_ident()}
    names = [(type(e).__name__, getattr(e, "node", "")) for e in seen if not isinstance(e, str)]
    assert names[0] == ("NodeStarted", "analyze_and_route") and names[-1] == ("NodeFinished", "synthesize")
    assert isinstance(seen[-1], str) and "LLM Usage Stats" in seen[-1]  # the last chunk comes after the last event
    assert any(isinstance(e, AnswerStarted) for e in seen)


def test_a_failed_run_raises_from_the_iteration_and_the_stream_has_no_result():
    model = ScriptedChatModel({"analyze_and_route": [route("simple", ["vector_search"])], "plan": [search_plan()],
                               "synthesize": [LLMError("server down", node="synthesize")]})
    stream = Agent(model, FakeToolbox({"vector_search": [[SETUP]]}), Settings()).stream("Which port?")
    with pytest.raises(LLMError, match="server down"):
        list(stream)
    with pytest.raises(UsageError, match="not finished"):
        _ = stream.result


def test_a_stream_is_checked_at_once_and_iterated_once():
    agent = agent_for("The server listens on port 8080 by default.")
    with pytest.raises(UsageError, match="empty"):
        agent.stream("  ")
    stream = agent.stream("Which port?")
    assert isinstance(stream, AnswerStream)
    list(stream)
    with pytest.raises(UsageError, match="once"):
        list(stream)


def test_a_stream_closed_early_stops_its_run_at_the_next_event():
    gate, done = threading.Event(), threading.Event()
    raised: list[str] = []

    def ask(on_event):
        try:
            on_event(AnswerStarted(()))
            on_event(AnswerDelta("The first sentence of a long answer is here [1]. "))
            gate.wait(10)  # the reader closes the stream meanwhile
            on_event(AnswerDelta("More text that nobody reads. "))
        except BaseException as exc:
            raised.append(type(exc).__name__)
            raise
        finally:
            done.set()

    chunks = iter(AnswerStream(ask, "off"))
    assert next(chunks).startswith("The first sentence")
    chunks.close()
    gate.set()
    assert done.wait(10) and raised == ["_Closed"]


def test_a_lone_closing_think_tag_drops_what_came_before_it_so_nothing_before_it_was_shown():
    text = AnswerText("off", every=0)
    text.event(AnswerStarted(()))
    shown = text.event(AnswerDelta("Thinking aloud. More text follows here. "))
    shown += text.event(AnswerDelta("</think>The answer."))
    assert shown == "" and text.finish("The answer.") == "The answer." and not text.restarted


def test_an_escape_string_still_open_is_held_back_until_it_closes():
    """A reply writing a window title or a hyperlink ("\x1b]0;Title. More\x07"), cut inside it:
    until its terminator came the payload read as a sentence and was shown ("0;Title
    [unsupported]."), then the terminator removed it, and the answer was printed again."""
    opened = "The server listens on port 8080 by default [1]. "
    for escape in ("\x1b]0;Title. More\x07", "\x1b]8;;http://x.example/a. b\x07link\x1b]8;;\x07", "\x1bP q. r\x1b\\",
                   "\x9d0;T. x\x9c"):
        reply = opened + escape + " A backup is kept for thirty days [2]. It was released on October 22, 2024."
        for cut in range(len(opened), len(opened) + len(escape) + 1):
            stream = agent_for(reply, "note", [cut], graded=True).stream("Which port does the server listen on?")
            chunks = list(stream)
            assert "".join(chunks) == stream.result.answer and not stream.restarted, (escape, cut)


def test_after_a_cited_sentence_a_lone_closing_think_tag_is_removed_alone():
    text = AnswerText("off", every=0)
    text.event(AnswerStarted((SETUP, BACKUP)))
    shown = text.event(AnswerDelta("It listens on 8080 [1]. And then "))
    shown += text.event(AnswerDelta("</think>more."))
    assert shown.startswith("It listens on 8080 [1].")
    asked = agent_for("It listens on 8080 [1]. And then </think>more.", "off").ask("Which port?")
    assert asked.answer.startswith("It listens on 8080 [1]. And then more.")


def test_an_answer_on_the_simple_path_is_held_back_until_its_verdict_is_known():
    reply = "It is blue [1]. It is red. The server listens on port 8080 by default."
    for mode in ("note", "strict"):
        stream = agent_for(reply, mode, cuts=range(0, len(reply), 4)).stream("What colour is the logo?")
        chunks = list(stream)
        assert len(chunks) == 1 and chunks[0] == stream.result.answer
        assert chunks[0].startswith(NOT_ADDRESSED) and stream.result.state.grounding.verdict == "not_answered"
    chunks = list(agent_for(reply, "note", cuts=range(0, len(reply), 4), graded=True).stream("What colour is the logo?"))
    assert len(chunks) > 1 and chunks[0].startswith("It is blue [unsupported].")  # a grader approved: no verdict rewrite
    stream = agent_for(reply, "note", cuts=range(0, len(reply), 4), graded=True).stream("Which gRPC port?")
    chunks = list(stream)  # a term no item holds: not_answered whatever the grade
    assert len(chunks) == 1 and stream.result.state.grounding.verdict == "not_answered"


def test_an_answer_on_the_simple_path_streams_once_a_supported_sentence_answers_the_question():
    """The verdict is known to be ``answered`` as soon as a supported sentence addresses the
    question (more sentences only add support): the stream shows it then, not at the end."""
    reply = ("The server listens on port 8080 by default [1]. It was chosen long ago by the founders. "
             "Teams rarely change it. Firewalls expect it.")
    stream = agent_for(reply, "note", cuts=range(0, len(reply), 4)).stream("Which port does the server listen on?")
    chunks = list(stream)
    assert len(chunks) > 2 and chunks[0].startswith("The server listens on port 8080 by default [1].")
    assert "".join(chunks) == stream.result.answer and stream.result.state.grounding.verdict == "answered"


def test_an_answer_that_only_repeats_the_question_is_held_back_and_said_so():
    question = "Which port does the server listen on by default?"
    reply = "The server listens on a port by default [1]."
    stream = agent_for(reply, "note", cuts=range(0, len(reply), 4)).stream(question)
    chunks = list(stream)
    assert len(chunks) == 1 and chunks[0].startswith(ONLY_RESTATED)
    assert stream.result.state.grounding.verdict == "not_answered"
    reply += " It listens on 8080 [1]. Teams rarely change it. Firewalls expect it."
    stream = agent_for(reply, "note", cuts=range(0, len(reply), 4)).stream(question)
    chunks = list(stream)  # shown once a supported sentence says what the question does not
    assert len(chunks) > 1 and "".join(chunks) == stream.result.answer
    assert stream.result.state.grounding.verdict == "answered"
