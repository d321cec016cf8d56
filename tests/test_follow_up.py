"""Follow-up questions: earlier turns reach routing and planning, not only the answer."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from crag import Agent
from crag.cli import main
from tests.fakes import clean_env
from tests.openai_server import FakeOpenAIServer

INSTALL = """# Install

Install the service with pip install example-service.
On Windows, run the installer example-setup.exe instead.
"""

PORTS = """# Ports

The server listens on port 8080 by default.
"""

HISTORY = [
    {"role": "user", "content": "How do I install the service?"},
    {"role": "assistant", "content": "With pip install example-service [1]."},
]


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    clean_env(monkeypatch)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "install.md").write_text(INSTALL)
    (tmp_path / "docs" / "ports.md").write_text(PORTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert main(["index", "docs"], io.StringIO(), io.StringIO()) == 0
    return tmp_path / "docs"


def test_offline_plan_searches_a_follow_up_with_the_earlier_question(kb: Path) -> None:
    with Agent.from_env() as agent:
        alone = agent.ask("and on Windows?")
        followed = agent.ask("and on Windows?", history=HISTORY)
    queries = [run.call.args["query"] for run in followed.state.tool_history if run.call.tool == "vector_search"]
    assert any("install" in q and "window" in q.lower() for q in queries), queries
    assert not any("install" in run.call.args.get("query", "") for run in alone.state.tool_history)
    assert "example-setup.exe" in followed.answer


def test_the_plan_prompt_carries_the_conversation(kb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = tmp_path / "history.json"
    history.write_text(json.dumps(HISTORY))
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "5")
        srv.script("analyze_and_route", json.dumps({"complexity": "simple", "suggested_tools": ["vector_search"]}))
        srv.script("plan", json.dumps({"tool_calls": [
            {"tool": "vector_search", "args": {"query": "install the service on Windows"}}]}))
        srv.script("synthesize", "Run example-setup.exe [1].")
        out, err = io.StringIO(), io.StringIO()
        assert main(["ask", "and on Windows?", "--history", str(history)], out, err) == 0, err.getvalue()
        for node in ("analyze_and_route", "plan"):
            body = json.dumps(next(r.body for r in srv.requests if r.node == node))
            assert "How do I install the service?" in body, node
            assert body.index("How do I install the service?") < body.index("and on Windows?"), node
