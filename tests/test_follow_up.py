"""Follow-up questions: earlier turns reach routing and planning, not only the answer."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from crag import Agent
from crag.cli import main
from tests.fakes import clean_env
from tests.openai_server import FakeOpenAIServer, grades

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


@pytest.mark.parametrize(("question", "searched"), [
    ("why?", "How do I install the service? why?"),
    ("and?", "How do I install the service? and?"),
    ("more", "How do I install the service? more"),
    ("tell me more", "How do I install the service? tell me more"),
    ("go on", "How do I install the service? go on"),
    ("say more", "How do I install the service? say more"),
    ("what about the second one?", "How do I install the service? what about the second one?"),
    ("and the last one?", "How do I install the service? and the last one?"),
    ("and on Windows?", "and on Windows?"),  # a word of its own: searched as it is
    ("What is the second step?", "What is the second step?"),
    ("Which port?", "Which port?"),
])
def test_a_follow_up_with_no_word_of_its_own_is_searched_with_the_question_it_follows(question, searched) -> None:
    from crag.searches import searched_question
    from crag.state import Message

    turns = [Message(m["role"], m["content"]) for m in HISTORY]
    assert searched_question(question, turns) == searched
    # a chain of such follow-ups goes back to the last question that names something
    chained = [*turns, Message("user", "and?"), Message("assistant", "Also with pip [1].")]
    assert searched_question(question, chained) == searched
    # so does one after small talk, which names nothing either
    for thanks in ("thanks", "great, thanks!", "Thank you very much!", "hello there", "cool", "thanks, that helped a lot!",
                   "thanks mate", "good morning", "谢谢", "merci", "danke", "hola", "bonjour", "Excellent, thank you!",
                   "Alright, thanks", "appreciate it", "much appreciated", "Appreciated!", "wonderful", "helpful, thanks",
                   "k thanks"):
        after_thanks = [*turns, Message("user", thanks), Message("assistant", "You're welcome!")]
        assert searched_question(question, after_thanks) == searched, thanks
    assert searched_question(question, []) == question


def chat_lines(lines: str, env: dict[str, str], cwd: Path):
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}, **env,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "crag", "chat"], cwd=cwd, env=env, input=lines,
                          capture_output=True, text=True, timeout=120)


def test_chat_answers_why_and_more_from_the_question_they_follow(kb: Path, tmp_path: Path) -> None:
    """"why?" and "more" searched for nothing of their own and got the no-evidence answer;
    a second one ("and?" then "why?") followed "and?", which names nothing either."""
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "index"), "KB_AGENT_LLM": "offline"}
    run = chat_lines("How do I install the service on Windows?\nand?\nwhy?\nmore\ntell me more\n", env, tmp_path)
    assert run.returncode == 0, run.stderr
    assert "I couldn't find relevant information" not in run.stdout
    assert "does not appear to answer" not in run.stdout
    assert run.stdout.count("[1] docs/install.md:L") == 5, run.stdout


def test_with_a_model_whose_plan_adds_nothing_why_is_still_answered(kb: Path, tmp_path: Path) -> None:
    """The question's own search (SPEC §5) is what finds evidence when the planner adds nothing:
    for "why?" it is the previous question with "why?", so the answer has its sources."""
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", json.dumps({"complexity": "simple", "suggested_tools": ["vector_search"]}))
        srv.default("plan", json.dumps({"tool_calls": []}))
        srv.default("synthesize", "On Windows, run the installer example-setup.exe instead [1].")
        env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "index"), "KB_AGENT_LLM": "openai",
               "OPENAI_BASE_URL": srv.base_url, "OPENAI_API_KEY": "k", "KB_AGENT_LLM_TIMEOUT": "5"}
        run = chat_lines("How do I install the service on Windows?\nwhy?\nmore\n", env, tmp_path)
        assert run.returncode == 0, run.stderr
        assert run.stdout.count("[1] docs/install.md:L4") == 3, run.stdout
        assert "I couldn't find relevant information" not in run.stdout
        assert srv.nodes().count("synthesize") == 3


def test_a_plan_with_no_valid_call_searches_a_follow_up_with_the_question_it_follows(
    kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's fall-back search (nothing valid planned) is the question's own search: for
    "why?" the question it follows with "why?", as in round 1's search of the question. It
    searched "why?" alone, which finds nothing, so every later round's fall-back (one page
    deeper) found nothing too."""
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "5")
        monkeypatch.setenv("KB_AGENT_MAX_ITERATIONS", "2")
        monkeypatch.setenv("KB_AGENT_AUTO_APPROVE_MAX_ITEMS", "0")  # grade the two items: REFINE
        srv.default("analyze_and_route", json.dumps({"complexity": "complex", "suggested_tools": ["vector_search"]}))
        srv.default("plan", json.dumps({"tool_calls": []}))
        srv.default("grade_evidence", grades(rest=0.5))
        srv.default("synthesize", "With pip install example-service [1].")
        with Agent.from_env() as agent:
            result = agent.ask("why?", history=HISTORY)
    runs = result.state.tool_history
    assert [run.round for run in runs] == [1, 2]
    assert {run.call.args["query"] for run in runs} == {"How do I install the service? why?"}
    assert [a.fields["reason"] for a in result.state.audit if a.event == "plan_call_rejected"] == [
        "no valid tool call in the plan; searching for the question with vector_search"] * 2
