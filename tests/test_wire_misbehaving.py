"""What a user sees when the LLM server misbehaves in ways the other wire tests do not cover:
an answer stopped by its budget or by the server's content filter, usage the server did not
report, calls already paid for when a later one fails.

The real CLI (``crag.cli.main``) against ``tests.openai_server.FakeOpenAIServer`` on 127.0.0.1,
over a small indexed knowledge base (the fixtures of ``tests.test_cli_ask``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fakes import clean_env, cli
from tests.openai_server import Events, FakeOpenAIServer, Raw, Status, Text
from tests.test_cli_ask import SETUP, plan, route, write

REPLY = "Set `SERVICE_PORT` to change the port the server listens on [1]."
QUESTION = "Which variable changes the port?"


@pytest.fixture
def llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The loopback server, with crag's settings pointing at it, over an indexed ``docs/setup.md``."""
    write(tmp_path / "docs" / "setup.md", SETUP)
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert cli("index", "docs")[0] == 0
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("KB_AGENT_MODEL", "test-model")
        monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "5")
        yield srv


def simple(srv: FakeOpenAIServer) -> None:
    srv.default("analyze_and_route", route("simple", "grep_search"))
    srv.default("plan", plan(("grep_search", {"pattern": "SERVICE_PORT"})))


def chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def test_an_answer_stopped_by_its_budget_says_so(llm: FakeOpenAIServer) -> None:
    simple(llm)
    llm.script("synthesize", Text("Set `SERVICE_PORT` to change", finish_reason="length"))
    code, out, err = cli("ask", QUESTION, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert "cut short" in result["body"] and "KB_AGENT_MAX_ANSWER_TOKENS" in result["body"]
    assert "1024 tokens" in result["body"]


def test_an_answer_stopped_by_a_content_filter_says_so_whole_or_streamed(llm: FakeOpenAIServer) -> None:
    simple(llm)
    llm.script("synthesize", Text("Set `SERVICE_PORT` to change", finish_reason="content_filter"))
    code, out, err = cli("ask", QUESTION, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert "content filter" in result["body"]
    assert {"event": "reply_filtered", "node": "synthesize"} in result["audit"]

    llm.script("synthesize", Events(chunk("Set `SERVICE_PORT` ") + chunk("to change") + chunk(None, "content_filter")
                                    + b"data: [DONE]\n\n"))
    code, out, err = cli("chat", stdin=f"{QUESTION}\n")
    assert code == 0, err
    assert "content filter" in out
    assert [r.body.get("stream") for r in llm.requests if r.node == "synthesize"][-1] is True  # read as a stream


def test_a_whole_answer_carries_no_such_note(llm: FakeOpenAIServer) -> None:
    simple(llm)
    llm.script("synthesize", REPLY)
    result = json.loads(cli("ask", QUESTION, "--json")[1])
    assert "cut short" not in result["answer"] and "content filter" not in result["answer"]


def test_usage_the_server_did_not_report_is_said_to_be_estimated(llm: FakeOpenAIServer) -> None:
    llm.default("analyze_and_route", Text(route("simple", "grep_search"), usage=False))
    llm.default("plan", plan(("grep_search", {"pattern": "SERVICE_PORT"})))
    llm.script("synthesize", Text(REPLY, usage=False))
    code, out, err = cli("ask", QUESTION, "--json")
    assert code == 0, err
    result = json.loads(out)
    usage = result["usage"]
    assert usage["estimated_calls"] == 2
    assert usage["by_node"]["synthesize"]["estimated_calls"] == 1
    assert "estimated_calls" not in usage["by_node"]["plan"]  # the server reported its usage
    lines = result["answer"].splitlines()
    assert any(line.startswith("- **Tokens:**") and "estimated for 2 of 3 calls" in line for line in lines)
    assert any(line.startswith("  - `synthesize`:") and "(estimated)" in line for line in lines)
    assert not any(line.startswith("  - `plan`:") and "estimated" in line for line in lines)


def test_usage_the_server_reported_is_not_said_to_be_estimated(llm: FakeOpenAIServer) -> None:
    simple(llm)
    llm.script("synthesize", REPLY)
    result = json.loads(cli("ask", QUESTION, "--json")[1])
    assert "estimated_calls" not in result["usage"] and "estimated" not in result["answer"]


def test_usage_written_as_whole_numbers_with_a_decimal_point_is_the_servers_count(llm: FakeOpenAIServer) -> None:
    """A gateway that writes ``"prompt_tokens": 120.0`` reported 120 tokens: the usage block
    shows them, not crag's own estimate said to be one "because the server reported none"."""
    def reply(text: str) -> Raw:
        return Raw({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 120.0, "completion_tokens": 7.0}})  # no total_tokens

    llm.default("analyze_and_route", reply(route("simple", "grep_search")))
    llm.default("plan", reply(plan(("grep_search", {"pattern": "SERVICE_PORT"}))))
    llm.script("synthesize", reply(REPLY))
    code, out, err = cli("ask", QUESTION, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["usage"]["prompt_tokens"] == 360 and result["usage"]["completion_tokens"] == 21
    assert "estimated_calls" not in result["usage"] and "estimated" not in result["answer"]
    assert "- **Tokens:** 360 prompt / 21 completion / 381 total" in result["answer"]


def test_calls_paid_for_before_a_failure_are_counted_in_its_line(llm: FakeOpenAIServer,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from crag import Agent, LLMError

    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    simple(llm)
    llm.default("synthesize", Status(503))
    code, out, err = cli("ask", QUESTION)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("crag: error: ") and "answered 503 for node synthesize" in err
    assert re.search(r"this question made 2 LLM calls \([\d,]+ tokens\)", err)  # analyze_and_route and plan

    with Agent.from_env() as agent, pytest.raises(LLMError) as caught:
        agent.ask(QUESTION)
    assert caught.value.spent is not None and caught.value.spent.llm_calls == 2
    assert set(caught.value.spent.by_node) == {"analyze_and_route", "plan"}


def test_a_failure_on_the_first_call_says_nothing_was_spent(llm: FakeOpenAIServer,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    llm.default("analyze_and_route", Status(401))
    code, _, err = cli("ask", QUESTION)
    assert code == 1 and "answered 401" in err and "LLM call" not in err


def tool_call_reply(*calls: tuple[str, str]) -> Raw:
    """A completion holding native tool calls (name, raw arguments) and no content."""
    return Raw({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{
        "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"t{i}", "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(calls)]}}]})


def test_a_plan_sent_as_native_tool_calls_is_read_as_the_plan(llm: FakeOpenAIServer) -> None:
    llm.default("analyze_and_route", route("simple", "grep_search"))
    llm.script("plan", tool_call_reply(("grep_search", '{"pattern": "SERVICE_PORT"}')))
    llm.script("synthesize", REPLY)
    code, out, err = cli("ask", QUESTION, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert {"n": 1, "path": "docs/setup.md", "line": 8, "end_line": 8, "tool": "grep_search"} in result["citations"]


def test_native_tool_calls_with_malformed_arguments_fall_back_to_searching_the_question(
        llm: FakeOpenAIServer) -> None:
    llm.default("analyze_and_route", route("simple", "grep_search"))
    llm.script("plan", tool_call_reply(("grep_search", '{"pattern": "SERVICE_'), ("rm_rf", "[]")))
    llm.script("synthesize", REPLY)
    code, out, err = cli("ask", QUESTION, "--json")
    assert code == 0, err
    result = json.loads(out)
    rejected = [e["reason"] for e in result["audit"] if e["event"] == "plan_call_rejected"]
    assert rejected and "vector_search" in rejected[-1]  # nothing valid: the question is searched
    assert result["trace"] == ["analyze_and_route", "plan", "tool_exec", "synthesize"]


def test_an_answer_sent_as_tool_calls_is_one_clear_line(llm: FakeOpenAIServer) -> None:
    simple(llm)
    llm.default("synthesize", tool_call_reply(("grep_search", '{"pattern": "x"}')))
    code, out, err = cli("ask", QUESTION)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "tool calls instead of an answer for node synthesize" in err


def test_a_redirect_loop_is_said_as_one_and_not_retried(llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "2")
    llm.default("analyze_and_route", Status(307, body="", headers={"Location": "/v1/chat/completions"}))
    code, _, err = cli("ask", QUESTION)
    assert code == 1 and err.count("\n") == 1
    assert "redirected the request too many times for node analyze_and_route" in err and "OPENAI_BASE_URL" in err
    assert "closed the connection" not in err and "retr" not in err
    assert llm.calls("analyze_and_route") == 21  # the first request and the HTTP library's 20 redirects, once


def test_a_stream_too_slow_to_finish_in_time_is_one_line_saying_so(llm: FakeOpenAIServer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    simple(llm)
    llm.default("synthesize", Text(REPLY * 20, interval=0.4))  # a word every 0.4 s: far beyond 1 s in all
    monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "1")
    code, out, err = cli("chat", stdin=f"{QUESTION}\n")
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("crag: error: ")]
    assert len(lines) == 1 and "did not finish its answer within 1 s for node synthesize" in lines[0]
    assert "Traceback" not in err and "Usage Stats" not in out  # a fragment is not an answer


def test_a_request_redirected_as_a_get_says_where_it_went(llm: FakeOpenAIServer) -> None:
    """A base URL that answers 301 (http to https, a moved path): the HTTP library follows it
    and resends the POST as a GET, which the API refuses; the error named only that refusal
    ("answered 405"), not the redirect that caused it."""
    llm.default("analyze_and_route", Status(301, body="", headers={"Location": "/v2/chat/completions?key=s3cret"}))
    code, _, err = cli("ask", QUESTION)
    assert code == 1 and err.count("\n") == 1
    assert "the server redirected the request (301) to http://127.0.0.1:" in err
    assert "/v2/chat/completions: set OPENAI_BASE_URL" in err and "s3cret" not in err
