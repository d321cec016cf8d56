"""Seeds 000, 001 and 002 give one answer on every surface and both stores.

The same question, with the same grading replies from a loopback OpenAI-compatible server,
through ``crag ask --json``, ``Agent.ask``, ``Agent.aask``, ``Agent.stream``,
``Agent.astream`` and the MCP server's ``ask`` (a real ``python -m crag mcp`` driven by the
``mcp`` SDK's client over stdio): the transitions, iteration count, scores, audit, citations,
usage (latency aside) and answer text are the same, and so are the requests the server saw.
On PostgreSQL (``tests/postgres_server.py``) the same holds, with the same decisions.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import re
import sys
from pathlib import Path

import anyio
import pytest

from crag import Agent
from crag.cli import main
from crag.llm import openai_chat
from tests.fakes import clean_env
from tests.openai_server import FakeOpenAIServer, Text, grades, item_count

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the upload retry policy?"
HISTORY = [{"role": "user", "content": "How often does service 2 retry?"},
           {"role": "assistant", "content": "It retries 2 times [1].\n\n[1] docs/service2.md:L3\n\n---\n"
                                            "📊 **LLM Usage Stats:**\n- **API calls:** 4"}]


def _route(complexity: str) -> str:
    return json.dumps({"complexity": complexity, "suggested_tools": [] if complexity == "chitchat" else ["vector_search"]})


def _coin_tosses(body: dict) -> Text:
    """One ``yes`` label per item, each read from token probabilities as a coin toss."""
    top = [(" yes", math.log(0.5)), (" no", math.log(0.5))]
    tokens = []
    for k in range(1, item_count(body) + 1):
        tokens += [(str(k), 0.0, []), (":", 0.0, []), (" yes", top[0][1], top), ("\n", 0.0, [])]
    return Text("".join(t for t, _, _ in tokens).rstrip("\n"), logprobs=tokens[:-1])


# name: (settings, router reply, grading reply, what the run must show)
SCENARIOS = {
    "refine_to_the_cap": ({}, _route("complex"), grades(rest=0.5), {
        "grader_action": "REFINE", "iterations": 3, "rules": ["mean_low"] * 3}),
    "all_removed": ({"KB_AGENT_GRADING_POLICY": "seed"}, _route("complex"), grades(rest=0.0), {
        "grader_action": "RE_RETRIEVE", "iterations": 3, "rules": ["none_left"] * 3}),
    "mixed_generate": ({}, _route("complex"), grades(0.9, 0.1, 0.7, 0.2, 0.7), {
        "grader_action": "GENERATE", "iterations": 1, "rules": ["mean_high"]}),
    "unparseable": ({"KB_AGENT_MAX_ITERATIONS": "1"}, _route("complex"), "all of them look fine", {
        "grader_action": "REFINE", "iterations": 1, "rules": ["mean_low"]}),
    "uninformative": ({}, _route("complex"), _coin_tosses, {
        "grader_action": "GENERATE", "iterations": 1, "rules": ["uninformative"]}),
    "few_context": ({"KB_AGENT_TOP_K": "2"}, _route("complex"), grades(rest=0.0), {
        "grader_action": "GENERATE", "iterations": 1, "rules": ["fast_path"]}),
    "simple": ({}, _route("simple"), grades(rest=0.0), {
        "grader_action": None, "iterations": 1, "rules": [], "llm_calls": 3}),
    "chitchat": ({}, _route("chitchat"), grades(rest=0.0), {
        "grader_action": None, "iterations": 0, "rules": [], "llm_calls": 2}),
}


@pytest.fixture
def workdir(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "docs"
    root.mkdir()
    for k in range(1, 31):
        (root / f"service{k}.md").write_text(
            f"# Service {k}\n\nService {k} keeps an upload retry policy of its own: it retries {k} times.\n",
            encoding="utf-8")
    (tmp_path / "history.json").write_text(json.dumps(HISTORY), encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    if request.param == "postgres":
        monkeypatch.setenv("KB_AGENT_STORE", request.getfixturevalue("pg_uri"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert main(["index", "docs"], io.StringIO(), io.StringIO()) == 0
    return tmp_path


def _cli(question: str, workdir: Path) -> dict:
    out, err = io.StringIO(), io.StringIO()
    assert main(["ask", question, "--json", "--history", "history.json"], out, err) == 0, err.getvalue()
    result = json.loads(out.getvalue())
    del result["index"]  # the command line says which index it used
    return result


def _ask(question: str, workdir: Path) -> dict:
    with Agent.from_env() as agent:
        return agent.ask(question, HISTORY).to_dict()


def _aask(question: str, workdir: Path) -> dict:
    async def run() -> dict:
        with Agent.from_env() as agent:
            return (await agent.aask(question, HISTORY)).to_dict()

    return asyncio.run(run())


def _stream(question: str, workdir: Path) -> dict:
    with Agent.from_env() as agent:
        stream = agent.stream(question, HISTORY)
        shown = "".join(stream)
        result = stream.result.to_dict()
    assert shown == result["answer"]
    return result


def _astream(question: str, workdir: Path) -> dict:
    async def run() -> dict:
        with Agent.from_env() as agent:
            stream = agent.astream(question, HISTORY)
            shown = "".join([chunk async for chunk in stream])
            result = stream.result.to_dict()
        assert shown == result["answer"]
        return result

    return asyncio.run(run())


def _mcp(question: str, workdir: Path) -> dict:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "crag", "mcp"],
                                   env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(workdir))
    results = []

    async def session() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            results.append(await client.call_tool("ask", {"question": question, "history": HISTORY}))

    anyio.run(session)
    result = results[0]
    text = "".join(block.text for block in result.content if getattr(block, "type", "") == "text")
    assert not result.is_error, text
    assert text == result.structured_content["answer"]
    return result.structured_content


SURFACES = {"cli": _cli, "ask": _ask, "aask": _aask, "stream": _stream, "astream": _astream, "mcp": _mcp}


def _timeless(result: dict) -> dict:
    """``result`` without its latencies (measured, so never equal twice)."""
    result = json.loads(json.dumps(result))
    for usage in (result["usage"], *result["usage"]["by_node"].values()):
        usage.pop("latency_ms", None)
    result["answer"] = re.sub(r"[\d,.]+ ?m?s\b", "<latency>", result["answer"])
    return result


# Every scenario on the embedded store; PostgreSQL (slower to set up) for one of each path.
CASES = [("embedded", name) for name in SCENARIOS] + [
    ("postgres", name) for name in ("refine_to_the_cap", "all_removed", "few_context", "simple", "chitchat")]


@pytest.mark.parametrize(("workdir", "name"), CASES, indirect=["workdir"])
def test_every_surface_gives_the_answer_the_command_line_gives(workdir, monkeypatch, name):
    settings, route, grade, expected = SCENARIOS[name]
    question = "hello there" if name == "chitchat" else QUESTION
    for key, value in {"KB_AGENT_TOP_K": "5", **settings}.items():
        monkeypatch.setenv(key, value)
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        srv.default("analyze_and_route", route)
        srv.default("plan", json.dumps({"tool_calls": [{"tool": "vector_search", "args": {"query": question}}]}))
        srv.default("grade_evidence", grade)
        srv.default("synthesize", "Hello! Ask me about your documents." if name == "chitchat"
                    else "Service 1 retries 1 times [1].\n\n---\n📊 **LLM Usage Stats:**\n- **API calls:** 99")
        results, requests = {}, {}
        for surface, run in SURFACES.items():
            openai_chat.PROCESS.__init__()  # what a server refused is remembered per process: each surface starts afresh
            seen = len(srv.requests)
            results[surface] = _timeless(run(question, workdir))
            requests[surface] = [(r.node, r.body.get("messages")) for r in srv.requests[seen:]]
    cli = results["cli"]
    assert cli["grader_action"] == expected["grader_action"] and cli["iterations"] == expected["iterations"]
    assert [e["rule"] for e in cli["audit"] if e["event"] == "grade_decided"] == expected["rules"]
    assert cli["usage"]["llm_calls"] == expected.get("llm_calls", cli["usage"]["llm_calls"])
    assert cli["answer"].count("LLM Usage Stats") == 1 and "API calls:** 99" not in cli["answer"]
    assert not any("LLM Usage Stats" in json.dumps(messages, ensure_ascii=False) for _, messages in requests["cli"])
    for surface in SURFACES:
        assert requests[surface] == requests["cli"], surface
        assert results[surface] == cli, surface
