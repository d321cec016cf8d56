"""The context budget: no request exceeds KB_AGENT_CONTEXT_TOKENS, whatever the evidence,
history and question sizes; what gives way, and in which order."""

from __future__ import annotations

import json
import re
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crag import Agent
from crag.budget import excerpt, fit, prompt_tokens
from crag.config import Settings
from crag.errors import UsageError
from crag.llm import OpenAIChatModel, ScriptedChatModel
from crag.llm.tokens import count_tokens
from crag.ports import GradeTask, SynthesizeTask
from crag.prompts import render
from crag.state import EvidenceItem, Message

from .fakes import FakeToolbox
from .openai_server import FakeOpenAIServer, Text, grades

QUESTION = "How do uploads retry after a failure?"
ROUTE = json.dumps({"complexity": "complex", "suggested_tools": ["vector_search", "grep_search"]})
PLAN = json.dumps({"tool_calls": [{"tool": "grep_search", "args": {"pattern": "retry"}}]})
WORDS = ["upload", "retry", "failure", "backoff", "queue", "the", "server", "token", "日本語", "ñandú", "x" * 30]


def cl100k(text: str) -> int:
    return count_tokens(text, "cl100k_base")


def big_item(n: int, lines: int, words_per_line: int, tool: str = "vector_search") -> EvidenceItem:
    body = "\n".join(" ".join(WORDS[(n + i + j) % len(WORDS)] for j in range(words_per_line)) for i in range(lines))
    return EvidenceItem(tool, f"docs/big{n}.md", body, 100 * n + 1, 100 * n + lines, 0.5)


def test_an_item_cut_to_an_excerpt_keeps_its_real_line_numbers():
    text = "\n".join(["filler line"] * 30 + ["uploads retry three times after a failure"] + ["more filler"] * 30)
    item = EvidenceItem("vector_search", "docs/a.md", text, 101, 161, 0.9)
    cut = excerpt(item, ["upload", "retry", "failure"], 5)
    assert cut.text.split("\n")[2] == "uploads retry three times after a failure"
    assert (cut.start_line, cut.end_line) == (129, 133)  # line 131 of the file is the match
    assert cut.label == "docs/a.md:L129-L133"


def test_history_goes_first_then_item_text_then_the_last_items():
    items = tuple(big_item(n, 60, 12) for n in range(12))
    task = SynthesizeTask(QUESTION, (), items)  # a grading prompt quotes excerpts already
    full = prompt_tokens(render(task), cl100k)
    fitted = fit(task, 112, 4096, render, cl100k)
    assert full > 4096 and fitted.cut
    assert fitted.prompt_tokens + 112 <= int(4096 * 0.9)
    assert all(len(i.text.split("\n")) <= 40 for i in fitted.task.items)
    small = fit(GradeTask(QUESTION, items[:2]), 32, 4096, render, cl100k)
    assert not small.dropped


def test_two_windows_cut_to_the_same_lines_are_shown_once():
    """Two grep windows of one file (lines 1-40 and 3-60) cut to the same excerpt were shown
    twice, the same lines under two numbers, in room other evidence needed."""
    text = "\n".join(["filler line"] * 10 + ["uploads retry three times after a failure"] + ["more filler"] * 50)
    lines = text.split("\n")
    first = EvidenceItem("grep_search", "docs/a.md", "\n".join(lines[:40]), 1, 40, None, anchor_line=11)
    second = EvidenceItem("grep_search", "docs/a.md", "\n".join(lines[2:]), 3, 61, None, anchor_line=30)
    other = big_item(3, 30, 40)
    fitted = fit(SynthesizeTask(QUESTION, (), (first, second, other)), 256, 2048, render, cl100k)
    assert fitted.cut and fitted.dropped == (1,)
    assert [i.source for i in fitted.task.items] == ["docs/a.md", "docs/big3.md"]
    assert len({i.key for i in fitted.task.items}) == 2


def test_a_grep_for_a_common_word_does_not_crowd_the_questions_own_search_out_of_the_answer():
    """Ungraded evidence (the simple path) was left out in context order: a planned grep's ten
    windows came first, and every hit of the question's own search (run after the planned
    calls) was left out of the answer's prompt."""
    flood = [big_item(n, 30, 60, tool="grep_search") for n in range(10)]
    hits = [EvidenceItem("vector_search", f"docs/hit{n}.md", f"Uploads retry after a failure, hit {n}.", 1, 1, 0.4)
            for n in range(5)]
    toolbox = FakeToolbox({"grep_search": [flood]}, question=QUESTION, question_results=hits)
    model = ScriptedChatModel({
        "analyze_and_route": json.dumps({"complexity": "simple", "suggested_tools": ["vector_search", "grep_search"]}),
        "plan": PLAN, "synthesize": "Uploads retry after a failure [1]."})
    result = Agent(model, toolbox, Settings(context_tokens=2048, max_answer_tokens=256)).ask(QUESTION)
    shown = [i.source for i in model.requests[-1].task.items]
    assert "docs/hit0.md" in shown and "docs/big0.md" in shown
    assert len(shown) < 15 and any(e.event == "evidence_trimmed" for e in result.state.audit)


def test_a_question_that_cannot_fit_is_a_usage_error():
    with pytest.raises(UsageError, match="KB_AGENT_CONTEXT_TOKENS"):
        fit(GradeTask("why " * 5000, ()), 32, 2048, render, cl100k)


def test_a_question_that_leaves_no_room_for_one_item_is_a_usage_error_where_items_are_needed():
    items = (big_item(1, 2, 100),)
    question = "why " * 1650  # fits alone, not with the item cut to its shortest excerpt (250 characters)
    assert not fit(SynthesizeTask(question, (), items), 32, 2048, render, cl100k).task.items  # by default: left out
    with pytest.raises(UsageError, match="no room for its evidence"):
        fit(SynthesizeTask(question, (), items), 32, 2048, render, cl100k, min_items=1)
    assert fit(SynthesizeTask(question, (), ()), 32, 2048, render, cl100k, min_items=1).task.items == ()
    assert fit(SynthesizeTask(QUESTION, (), items), 32, 2048, render, cl100k, min_items=1).task.items == items


def test_an_item_too_long_to_fit_alone_is_cut_to_fit_and_the_question_is_not_refused():
    """A grep hit on a file of one long line cannot be cut to fewer lines: ranked first, it was
    the one item tried, and the question was refused though the other items fit. It is cut to
    the characters around its match instead (its real line kept), and shown as ranked."""
    huge = EvidenceItem("grep_search", "docs/one-line.txt", "uploads retry " * 2000, 1, 1, 0.9)
    small = (big_item(1, 3, 10), big_item(2, 3, 10))
    task = SynthesizeTask(QUESTION, (), (huge, *small))
    fitted = fit(task, 512, 1024, render, cl100k, min_items=1)
    shown = fitted.task.items
    assert shown[0].source == "docs/one-line.txt" and shown[0].label == "docs/one-line.txt:L1"
    assert shown[0].text in huge.text and len(shown[0].text) <= 2000 and fitted.cut
    assert fitted.prompt_tokens + 512 <= int(1024 * 0.9)


def test_evidence_written_as_one_long_line_is_cut_to_its_match_not_left_out():
    """A paragraph written as one line (a chunk of 400 tokens on line 7) could not be cut by
    lines: in a small window the answer's prompt left out the one item that answers, or, when
    it was the only one, the question was refused as leaving no room for its evidence. Its line
    is cut to the characters around the question's words, with its real line number."""
    filler = " ".join(f"step{i} of the pipeline runs" for i in range(120))
    line = f"{filler} so uploads retry after a failure with a backoff of 30 seconds. {filler}"
    item = EvidenceItem("vector_search", "docs/one-line.md", line, 7, 7, 0.9)
    heading = EvidenceItem("vector_search", "docs/one-line.md", "# Uploads", 1, 1, 0.8)
    for items in ((item,), (heading, item)):
        fitted = fit(SynthesizeTask(QUESTION, (), items), 512, 1024, render, cl100k, min_items=1)
        shown = {i.source + str(i.start_line): i for i in fitted.task.items}
        cut = shown["docs/one-line.md7"]
        assert "uploads retry after a failure with a backoff of 30 seconds" in cut.text and cut.text in line
        assert (cut.start_line, cut.end_line, cut.label) == (7, 7, "docs/one-line.md:L7") and fitted.cut
        assert fitted.prompt_tokens + 512 <= int(1024 * 0.9)


def run_agent(items, history, question, context_tokens, answer_tokens=256):
    toolbox = FakeToolbox({"grep_search": [items]}, question=question, question_results=items[:5])
    model = ScriptedChatModel(default={
        "analyze_and_route": ROUTE,
        "plan": PLAN,
        "grade_evidence": "[0.9]",  # a parse failure when N != 1: every item 0.5
        "synthesize": "Uploads retry [1].",
    })
    s = Settings(context_tokens=context_tokens, max_answer_tokens=answer_tokens, max_iterations=2,
                 auto_approve_max_items=0)
    result = Agent(model, toolbox, s).ask(question, history=history)
    return result, model


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.tuples(st.integers(1, 120), st.integers(1, 40)), min_size=0, max_size=20),
    turns=st.lists(st.integers(0, 3000), max_size=8),
    question_words=st.integers(1, 300),
    context_tokens=st.sampled_from([2048, 4096, 8192]),
)
def test_no_request_ever_exceeds_the_context_budget(sizes, turns, question_words, context_tokens):
    items = [big_item(n, lines, per_line, tool="grep_search") for n, (lines, per_line) in enumerate(sizes)]
    history = [Message("user" if k % 2 == 0 else "assistant", "retry " * n) for k, n in enumerate(turns)]
    question = " ".join(WORDS[k % len(WORDS)] for k in range(question_words)) + "?"
    try:
        result, model = run_agent(items, history, question, context_tokens)
    except UsageError:  # beyond the question limit: only a question that takes a big share of the window
        assert cl100k(question) > context_tokens // 5
        return
    assert model.requests
    for request in model.requests:
        used = prompt_tokens(request.messages, cl100k) + request.max_tokens
        assert used <= context_tokens, (request.node, used)
        assert question.strip() in "".join(m["content"] for m in request.messages).replace("> ", "")
    sent = {i.source for r in model.requests if r.node == "synthesize" for i in r.task.items}
    assert {c.path for c in result.citations} <= sent  # an item left out of the answer is not cited


def test_items_left_out_of_grading_leave_context_and_are_audited():
    # a grading prompt quotes a 600-character excerpt of each item: ten do not fit in 2,048 tokens
    items = [big_item(n, 30, 150, tool="grep_search") for n in range(10)]
    result, model = run_agent(items, [], QUESTION, 2048)
    graded = next(r for r in model.requests if r.node == "grade_evidence")
    trimmed = [e for e in result.state.audit if e.event == "evidence_trimmed" and e.fields["node"] == "grade_evidence"]
    assert 0 < len(graded.task.items) < 10
    assert trimmed and trimmed[0].fields["count"] == 10 - len(graded.task.items)
    assert len(result.state.context) <= len(graded.task.items)


def test_a_real_server_with_that_window_never_refuses_a_request():
    items = [big_item(n, 80, 16, tool="grep_search") for n in range(15)]
    with FakeOpenAIServer() as srv:
        srv.context_window = 4096
        srv.default("analyze_and_route", ROUTE)
        srv.default("plan", PLAN)
        srv.default("grade_evidence", grades(rest=0.8))
        srv.default("synthesize", "Uploads retry [1].")
        s = Settings(llm="openai", openai_base_url=srv.base_url, model="test-model", context_tokens=4096,
                     max_answer_tokens=512)
        toolbox = FakeToolbox({"grep_search": [items]}, question=QUESTION, question_results=items[:5])
        history = [Message("user", "retry " * 3000), Message("assistant", "ok")]
        result = Agent(OpenAIChatModel(s), toolbox, s).ask(QUESTION, history=history)
        assert result.answer.startswith("Uploads retry [1]")
        assert srv.prompt_sizes and all(p + m <= 4096 for _, p, m in srv.prompt_sizes)
        assert max(p for _, p, _ in srv.prompt_sizes) > 2000  # the window was used, not wasted


def window_run(srv: FakeOpenAIServer, window: int, style: str, context_tokens: int = 8192, agent=None,
               answer_tokens: int = 1024):
    """A complex question with long evidence against a server whose window is smaller than crag was told."""
    items = [big_item(n, 80, 16, tool="grep_search") for n in range(15)]
    srv.context_window = window
    srv.context_error = style
    srv.default("analyze_and_route", ROUTE)
    srv.default("plan", PLAN)
    srv.default("grade_evidence", grades(rest=0.8))
    srv.default("synthesize", "Uploads retry [1].")
    s = Settings(llm="openai", openai_base_url=srv.base_url, model="test-model", context_tokens=context_tokens,
                 max_answer_tokens=answer_tokens, llm_max_retries=0)
    toolbox = FakeToolbox({"grep_search": [items]}, question=QUESTION, question_results=items[:5])
    agent = agent or Agent(OpenAIChatModel(s), toolbox, s)
    return agent, agent.ask(QUESTION)


@pytest.mark.parametrize("style", ["llama.cpp", "vllm"])
def test_a_server_with_a_smaller_window_than_configured_gets_requests_fitted_to_it(style):
    with FakeOpenAIServer() as srv:
        agent, result = window_run(srv, 3000, style)
        assert result.answer.startswith("Uploads retry [1]")
        refits = [e.fields for e in result.state.audit if e.event == "context_refit"]
        # the first request over the server's window is refused once and refitted (the grading
        # prompt quotes excerpts and may fit; the answer's prompt quotes whole items)
        assert len(refits) == 1 and refits[0]["context_tokens"] == 3000 and refits[0]["server_window"] == 3000
        accepted = [(n, p, m) for n, p, m in srv.prompt_sizes if p + m <= 3000]
        assert len(accepted) == len(srv.prompt_sizes) - 1  # one refusal, then every request fits
        sent = srv.params("grade_evidence")
        assert all(p["logprobs"] is True for p in sent)  # too long is not a refusal of logprobs
        assert result.state.context_window == 3000  # the window is the run's, in its state
        assert agent.driver.cfg.context_tokens == 8192  # the config other runs share never changes
        refused = len(srv.prompt_sizes)
        again = agent.ask(QUESTION)  # the agent's later questions start from the window it learnt
        assert all(p + m <= 3000 for _, p, m in srv.prompt_sizes[refused:])
        assert again.state.context_window == 3000 and agent.driver.cfg.context_tokens == 8192


def test_a_question_too_long_for_the_window_the_server_taught_names_that_window_not_a_setting():
    """After a server's refusals taught the agent a window of 3,000 tokens (KB_AGENT_CONTEXT_TOKENS
    is 8192), a question too long for it was refused as too long for "KB_AGENT_CONTEXT_TOKENS=3000",
    a setting the user never made, and told to raise the setting, which changes nothing."""
    with FakeOpenAIServer() as srv:
        agent, _ = window_run(srv, 3000, "llama.cpp")
        with pytest.raises(UsageError) as caught:
            agent.ask(QUESTION + " Tell me how uploads retry after a failure." * 250)
    message = str(caught.value)
    assert "the window of 3,000 tokens the server's refusals left (KB_AGENT_CONTEXT_TOKENS=8192)" in message, message
    assert "KB_AGENT_CONTEXT_TOKENS=3000" not in message and "raise KB_AGENT_CONTEXT_TOKENS" not in message
    assert "give the model a larger window on the server" in message


def test_an_answer_cut_short_at_the_budget_the_servers_window_left_names_that_window_not_a_setting():
    """A server with a window of 2,000 tokens: the answer's budget is half of it, 1,000 tokens,
    below KB_AGENT_MAX_ANSWER_TOKENS (1024). An answer cut short there said it was cut at its
    budget "(KB_AGENT_MAX_ANSWER_TOKENS)", the setting to raise, which changes nothing."""
    with FakeOpenAIServer() as srv:
        agent, _ = window_run(srv, 2000, "llama.cpp")
        srv.default("synthesize", Text("Uploads retry [1]. And then", finish_reason="length"))
        result = agent.ask(QUESTION)
    assert srv.params("synthesize")[-1]["max_tokens"] == 1000
    assert ("_Note: the answer was cut short at its budget of 1000 tokens, half of the model's context "
            "window on the server (2000 tokens)._") in result.answer, result.answer
    assert "KB_AGENT_MAX_ANSWER_TOKENS" not in result.answer


def test_a_server_that_does_not_say_its_window_gets_smaller_requests_until_one_fits():
    with FakeOpenAIServer() as srv:
        _, result = window_run(srv, 2600, "bare", context_tokens=4096)
        assert result.answer.startswith("Uploads retry [1]")
        refits = [e.fields for e in result.state.audit if e.event == "context_refit"]
        assert len(refits) == 1 and refits[0]["node"] == "synthesize" and refits[0]["server_window"] is None
        # four fifths of the window used: the setting's, or less when the refused request needed less
        assert refits[0]["context_tokens"] <= 4096 * 4 // 5
        (_, last_prompt, last_budget), refused = srv.prompt_sizes[-1], srv.prompt_sizes[-2]
        assert refused[1] + refused[2] > 2600 >= last_prompt + last_budget


def test_a_silent_server_far_below_the_setting_gets_smaller_requests_not_the_same_one_again():
    """KB_AGENT_CONTEXT_TOKENS=8192 against a server whose window is 2600 and that does not say
    so: four fifths of 8192 is still far above the refused request, so fitting to it sent the
    very same request again (and again), and the question failed although 2600 fits it."""
    with FakeOpenAIServer() as srv:
        _, result = window_run(srv, 2600, "bare", context_tokens=8192)
        assert result.answer.startswith("Uploads retry [1]")
        sent = [p + m for node, p, m in srv.prompt_sizes if node == "synthesize"]
        assert all(later < before for before, later in pairwise(sent))  # every refit is a smaller request
        assert sent[-1] <= 2600
        refits = [e.fields for e in result.state.audit if e.event == "context_refit"]
        assert 1 <= len(refits) <= 3 and all(r["server_window"] is None for r in refits)


def test_a_window_too_small_for_any_request_is_one_clear_error():
    from crag.errors import LLMContextError

    with FakeOpenAIServer() as srv:
        with pytest.raises(LLMContextError) as caught:
            window_run(srv, 300, "llama.cpp", context_tokens=2048)
        # the first request is refused and not sent again: a window the server names this small is final
        assert [node for node, _, _ in srv.prompt_sizes] == ["analyze_and_route"]
    message = str(caught.value)
    assert "does not fit the model's context window of 300 tokens" in message
    assert "KB_AGENT_CONTEXT_TOKENS" in message and "\n" not in message


def test_a_server_counting_the_prompt_longer_than_crag_at_its_own_window_is_told_apart(monkeypatch):
    """A server whose tokenizer counts crag's prompts twice as long (code, CJK text), with the
    window crag was told: refused again at that window, the line said to set
    KB_AGENT_CONTEXT_TOKENS to the server's window, which it already was. It says what helps."""
    from crag.errors import LLMContextError

    from . import openai_server

    counted = openai_server._prompt_tokens
    monkeypatch.setattr(openai_server, "_prompt_tokens", lambda body: 2 * counted(body))
    with FakeOpenAIServer() as srv, pytest.raises(LLMContextError) as caught:
        window_run(srv, 1024, "llama.cpp", context_tokens=1024, answer_tokens=512)
    message = str(caught.value)
    assert re.search(r"context window of 1024 tokens; crag counts the request as \d+ tokens and the server "
                     r"counts it longer", message), message
    assert "larger window on the server" in message and "to the window the server gives" not in message
    assert "lower than" not in message  # 1,024 is the least window crag fits to: no smaller setting helps


def test_the_fake_server_refuses_a_request_beyond_its_window():
    with FakeOpenAIServer() as srv:
        srv.context_window = 1024
        srv.default("*", "ok")
        s = Settings(llm="openai", openai_base_url=srv.base_url, model="test-model", llm_max_retries=0,
                     structured_output="off")
        from crag.errors import LLMError
        from crag.ports import LLMRequest

        with pytest.raises(LLMError, match="400"):
            OpenAIChatModel(s).complete(LLMRequest("synthesize", GradeTask("q", ()),
                                                   ({"role": "user", "content": "word " * 900},), max_tokens=200))


def test_the_cli_says_when_a_question_cannot_fit(tmp_path, monkeypatch):
    import io

    from crag.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "a.md").write_text("# A\n\nUploads retry.\n")
    for key in ("KB_AGENT_LLM", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "idx"))
    monkeypatch.setenv("KB_AGENT_CONTEXT_TOKENS", "1024")
    monkeypatch.setenv("KB_AGENT_MAX_ANSWER_TOKENS", "256")
    out, err = io.StringIO(), io.StringIO()
    with FakeOpenAIServer() as srv:  # a model's window (the offline backend sends no prompt: it fits any)
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        code = main(["ask", "--kb", "kb", "why " * 3000], out, err)
        assert srv.nodes() == []  # refused before any call
    assert code == 2
    last = err.getvalue().splitlines()[-1]  # after the indexing note
    assert last.startswith("crag: error: the question does not fit") and "KB_AGENT_CONTEXT_TOKENS" in last
    assert "Traceback" not in err.getvalue()


def tiny_window_ask(tmp_path, monkeypatch, text: str, question: str, window: int = 1024) -> tuple[int, str, str, list]:
    """``crag ask question`` with KB_AGENT_CONTEXT_TOKENS=1024 (or ``window``) over one file holding
    ``text``: the exit status, stdout, the last line of stderr and the nodes the server was asked for."""
    import io

    from crag.cli import main

    from .fakes import clean_env, plan, route

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "a.md").write_text(text)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "idx"))
    assert main(["index", "kb"], io.StringIO(), io.StringIO()) == 0
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", route("complex"))
        srv.default("plan", plan(("vector_search", {"query": "upload retry"})))
        srv.default("grade_evidence", grades(rest=0.9))
        srv.default("synthesize", "Uploads retry [1].")
        for key, value in {"OPENAI_BASE_URL": srv.base_url, "OPENAI_API_KEY": "k", "KB_AGENT_MODEL": "test-model",
                           "KB_AGENT_CONTEXT_TOKENS": str(window)}.items():
            monkeypatch.setenv(key, value)
        out, err = io.StringIO(), io.StringIO()
        code = main(["ask", question], out, err)
        nodes = srv.nodes()
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), (err.getvalue().splitlines() or [""])[-1], nodes


def test_a_planning_prompt_grown_by_earlier_rounds_drops_their_oldest_calls_not_the_question():
    """Each round adds its calls to the planning prompt's "Earlier calls:" list, which nothing
    could shorten: at round 3 of a 1,024-token window a seven-word question was refused with
    "ask a shorter question" (exit 2) after the calls it had paid for."""
    from crag.ports import PlanTask
    from crag.state import Complexity, RoutingPlan, ToolCall, ToolRun
    from crag.tools import builtin

    attempts = tuple(ToolRun(r, ToolCall("vector_search", {"query": f"path parameters declaration variant {r}.{k}", "top_k": 5}))
                     for r in range(1, 7) for k in range(8))
    task = PlanTask(QUESTION, RoutingPlan(Complexity.COMPLEX, ("vector_search",)), (), attempts,
                    builtin("vector_search"), 5)
    assert prompt_tokens(render(task), cl100k) + 256 > int(1024 * 0.9)
    fitted = fit(task, 256, 1024, render, cl100k)
    assert fitted.prompt_tokens + 256 <= int(1024 * 0.9)
    kept = fitted.task.previous_attempts
    assert kept and kept == attempts[-len(kept):]  # the newest kept, the oldest gone
    assert fit(PlanTask(QUESTION, task.routing_plan, (), attempts[:2], task.tools, 5), 256, 1024, render,
               cl100k).task.previous_attempts == attempts[:2]


def test_a_question_too_long_for_the_planning_prompt_is_refused_before_any_call(tmp_path, monkeypatch):
    """A question that fit routing's prompt but not planning's was refused at plan, after the
    routing call the user paid for: it is refused before that call, as one too long for routing is."""
    question = QUESTION + " Please explain how the upload retry works after a failure in detail." * 17
    code, out, line, nodes = tiny_window_ask(tmp_path, monkeypatch, "# Uploads\n\nUploads retry three times.\n",
                                             question)
    assert code == 2 and out == "" and nodes == []
    assert line.startswith("crag: error: the question does not fit the model's context window")
    assert "KB_AGENT_CONTEXT_TOKENS=1024" in line and "before it" not in line


def test_a_question_too_long_for_the_answers_prompt_is_refused_before_any_call(tmp_path, monkeypatch):
    """A question that fit planning (512 for the reply) but not the answer (KB_AGENT_MAX_ANSWER_TOKENS,
    1,024 in a 2,048-token window) was refused at synthesize, after routing, planning and grading
    calls the user paid for: it is refused before any, and the line names the answer's budget."""
    question = QUESTION + " Please explain how the upload retry works after a failure in detail." * 60
    code, out, line, nodes = tiny_window_ask(tmp_path, monkeypatch, "# Uploads\n\nUploads retry three times.\n",
                                             question, window=2048)
    assert code == 2 and out == "" and nodes == [], (line, nodes)
    assert line.startswith("crag: error: the question does not fit the model's context window")
    assert "KB_AGENT_CONTEXT_TOKENS=2048" in line and "KB_AGENT_MAX_ANSWER_TOKENS (1024)" in line, line


def test_a_question_whose_evidence_leaves_the_answer_no_room_says_what_it_had_already_spent(tmp_path, monkeypatch):
    """Evidence too long for the answer's prompt (one line of Chinese that, even cut to its
    shortest excerpt of 250 characters, leaves a longer question no room) is found only at
    synthesize, after calls the user paid for: the one line says what they cost, as the line of
    a server that fails mid-question does."""
    text = "# Uploads\n\nupload retry " + "上传失败后重试" * 60 + "\n"
    question = QUESTION + " Please explain the upload retry in detail." * 8
    code, out, line, nodes = tiny_window_ask(tmp_path, monkeypatch, text, question)
    assert code == 2 and out == "" and len(nodes) >= 2 and nodes[-1] != "synthesize", (line, nodes)
    assert line.startswith("crag: error: the question leaves no room for its evidence")
    assert re.search(rf"; before it, this question made {len(nodes)} LLM calls \([\d,]+ tokens\)$", line), line


def test_a_paragraph_written_as_one_line_is_answered_in_the_smallest_window(tmp_path, monkeypatch):
    """``crag ask`` at KB_AGENT_CONTEXT_TOKENS=1024 over a file whose paragraph is one line: it
    was refused after three paid calls (`the question leaves no room for its evidence`); the
    answer's prompt now quotes the line cut to the characters around the question's words."""
    text = "# Uploads\n\n" + " ".join(f"upload retry step{i} waits" for i in range(60)) + "\n"
    code, out, line, nodes = tiny_window_ask(tmp_path, monkeypatch, text, QUESTION)
    assert code == 0 and nodes[-1] == "synthesize" and "Uploads retry" in out, (line, nodes)


@pytest.mark.parametrize("turns", [3, 12, 5_000])
def test_a_long_history_is_trimmed_with_few_renders_to_the_same_turns(turns):
    """A chat of thousands of turns (or ``ask --history`` of them) with evidence that does not
    fit: the oldest turns are dropped as before, the newest kept, but not by rendering and
    counting the prompt once per dropped turn (10,000 turns took half a minute per request)."""
    history = tuple(Message("user" if i % 2 == 0 else "assistant", f"turn {i} about uploads " * 40)
                    for i in range(turns))
    task = SynthesizeTask(QUESTION, history, tuple(big_item(n, 60, 12) for n in range(6)))
    counted = []

    def count(text: str) -> int:
        counted.append(text)
        return cl100k(text)

    fitted = fit(task, 256, 4096, render, count)
    limit = int(4096 * 0.9) - 256

    def fits(kept: int) -> bool:  # the prompt with the newest ``kept`` turns fits the window
        return prompt_tokens(render(SynthesizeTask(QUESTION, history[turns - kept:], task.items)), cl100k) <= limit

    kept = len(fitted.task.history)
    assert fitted.task.history == history[turns - kept:] and fitted.history_dropped == turns - kept
    assert kept == 0 or fits(kept)
    assert kept == turns or not fits(kept + 1)  # no more turns were dropped than had to be
    assert len(counted) <= 2 * (20 + len(task.items) * 4)  # renders grow with log(turns), not turns


def test_the_time_of_a_request_refused_as_too_long_counts_in_its_nodes_latency():
    """The usage block's latency is the wall-clock time of each call, retries and fallbacks
    included; a request the server refused as too long and crag sent again fitted was left out."""
    from crag.errors import LLMContextError
    from crag.ports import LLMRequest

    class RefusesTheFirstAnswer(ScriptedChatModel):
        refused = False

        def complete(self, request, on_delta=None):
            if request.node == "synthesize" and not self.refused:
                self.refused = True
                err = LLMContextError("too long", node="synthesize", status=400, window=2048)
                err.latency_ms = 250.0
                raise err
            return super().complete(request)

    model = RefusesTheFirstAnswer({"analyze_and_route": [ROUTE], "plan": [PLAN], "grade_evidence": [json.dumps([0.9] * 5)],
                                   "synthesize": ["Uploads retry [1]."]})
    items = [big_item(n, 3, 6, tool="grep_search") for n in range(5)]
    s = Settings(auto_approve_max_items=0)
    result = Agent(model, FakeToolbox({"grep_search": [items]}, question=QUESTION, question_results=items), s).ask(QUESTION)
    assert any(e.event == "context_refit" for e in result.state.audit)
    assert result.state.usage.by_node["synthesize"].latency_ms >= 250.0

    with FakeOpenAIServer() as srv:  # the adapter says how long a refused request took
        srv.context_window = 1024
        srv.default("*", "ok")
        settings_ = Settings(llm="openai", openai_base_url=srv.base_url, model="test-model", llm_max_retries=0,
                             structured_output="off")
        with pytest.raises(LLMContextError) as caught:
            OpenAIChatModel(settings_).complete(LLMRequest("synthesize", GradeTask("q", ()),
                                                           ({"role": "user", "content": "word " * 900},), max_tokens=200))
        assert caught.value.latency_ms > 0


def test_a_question_that_finds_no_index_after_routing_says_what_routing_cost(tmp_path, monkeypatch):
    """With no index a question is routed (a greeting is answered without one), then fails as
    planning starts: the error line did not say that the routing call had been paid for, as a
    server failing mid-question says its calls."""
    import io

    from crag.cli import main

    from .fakes import clean_env, route

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "none"))
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", route("complex"))
        for key, value in {"OPENAI_BASE_URL": srv.base_url, "OPENAI_API_KEY": "k"}.items():
            monkeypatch.setenv(key, value)
        out, err = io.StringIO(), io.StringIO()
        code = main(["ask", QUESTION], out, err)
        nodes = srv.nodes()
    line = err.getvalue().splitlines()[-1]
    assert code == 1 and out.getvalue() == "" and nodes == ["analyze_and_route"]
    assert line.startswith("crag: error: no index in ")
    assert re.search(r"; before it, this question made 1 LLM call \([\d,]+ tokens\)$", line), line


def test_the_offline_backend_answers_a_question_longer_than_any_window(tmp_path, monkeypatch):
    """It sends no prompt anywhere, yet a question of ~8,000 tokens was refused as not fitting
    "the model's context window", with advice to match the server's."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "backup.md").write_text("# Backup\n\nBackup retention is thirty days in the vault bucket.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with Agent.from_env([docs], environ={"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline"},
                        dotenv=None) as agent:
        result = agent.ask("backup retention " * 4000)
        assert result.citations and result.citations[0].path == "docs/backup.md"
        assert agent.settings.context_tokens == 8192  # the setting itself is the user's



def test_items_left_out_of_grading_take_their_reply_budget_with_them():
    """Grading's reply budget is 16 + 8 per item: it was reserved for every item found even when
    most were left out, so a 1,024-token window with KB_AGENT_TOP_K=50 (a hundred hits) had no
    room left for one item and every question was refused."""
    items = [EvidenceItem("grep_search", f"docs/step{n}.md", f"uploads retry step {n} after a failure", 3, 3, 0.5)
             for n in range(100)]
    toolbox = FakeToolbox({"grep_search": [items]}, question=QUESTION)
    model = ScriptedChatModel(default={"analyze_and_route": ROUTE, "plan": PLAN, "grade_evidence": "[0.9]",
                                       "synthesize": "Uploads retry [1]."})
    s = Settings(context_tokens=1024, top_k=50, max_iterations=1, auto_approve_max_items=0)
    result = Agent(model, toolbox, s).ask(QUESTION)
    graded = next(r for r in model.requests if r.node == "grade_evidence")
    kept = len(graded.task.items)
    assert kept >= 20 and graded.max_tokens == 16 + 8 * kept
    assert prompt_tokens(graded.messages, cl100k) + graded.max_tokens <= int(1024 * 0.9)
    assert result.answer
