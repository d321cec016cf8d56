"""A tool written in the user's own program is planned, checked, run, graded and cited like
the built-in ones: with the scripted model, the offline backend and the loopback server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from crag import Agent, EvidenceItem, Param, QuestionArg, ScriptedChatModel, Tool, ToolError, UsageError
from crag.tools import BUILTIN_TOOLS, Toolbox

from .fakes import plan, route, scores
from .openai_server import FakeOpenAIServer

TICKETS = {"4711": "Ticket #4711: uploads over 2 GB time out behind the corporate proxy; fixed in 1.4."}
RAN: list[dict] = []


def lookup(args: dict, box) -> list[EvidenceItem]:
    """The user's tool: a ticket from their own tracker (a dict here)."""
    RAN.append(dict(args))
    number = args["ticket"]
    if number not in TICKETS:
        raise ToolError("ticket_lookup", f"no ticket #{number}")
    return [EvidenceItem(tool="ticket_lookup", source=f"tickets/{number}", text=TICKETS[number],
                         url=f"https://tracker.example/{number}")]


TICKET_TOOL = Tool(
    name="ticket_lookup",
    description="read a ticket of our tracker",
    run=lookup,
    params=(Param("ticket", required=True, max_length=10, hint='"4711"'),),
    question_arg=QuestionArg("ticket", lambda q: re.findall(r"#(\d{3,6})\b", q), "a ticket number like #4711"),
)
QUESTION = "Why do large uploads fail, see ticket #4711?"


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "uploads.md").write_text("# Uploads\n\nUploads are retried three times on failure.\n")
    monkeypatch.chdir(tmp_path)
    RAN.clear()
    return {"KB_AGENT_INDEX_DIR": str(tmp_path / "index"), "KB_AGENT_LLM": "offline"}


def test_a_scripted_run_plans_checks_runs_grades_and_cites_your_tool(kb) -> None:
    model = ScriptedChatModel({
        "analyze_and_route": [route("complex", ("vector_search", "ticket_lookup"))],
        "plan": [plan(("ticket_lookup", {"ticket": "4711"}), ("ticket_lookup", {"ticket": "9999"}),
                      ("ticket_lookup", {"ticket": "4711", "junk": 1}))],
        "grade_evidence": [scores(0.9, 0.8)],  # the ticket, and the search for the question itself
        "synthesize": ["Large uploads time out behind the proxy; fixed in 1.4 [1]."],
    })
    with Agent.from_env(kb=["docs"], chat_model=model, tools=[TICKET_TOOL], environ=kb, dotenv=None,
                        auto_approve_max_items=0) as agent:
        result = agent.ask(QUESTION)
    analyze, planning, grading, _ = model.requests
    assert "- ticket_lookup: read a ticket of our tracker. args: {\"ticket\": \"4711\"}" in analyze.messages[0]["content"]
    assert "ticket_lookup only when the question contains a ticket number like #4711" in analyze.messages[0]["content"]
    assert "ticket_lookup" in planning.messages[0]["content"]
    assert RAN == [{"ticket": "4711"}]  # the repeat without its junk argument dropped, 9999 refused
    reasons = [e.fields["reason"] for e in result.state.audit if e.event == "plan_call_rejected"]
    assert reasons == ["ticket_lookup: ticket '9999' is not in the question"]
    assert "tickets/4711" in grading.messages[1]["content"]
    assert result.trace == ("analyze_and_route", "plan", "tool_exec", "grade_evidence", "synthesize")
    assert [(c.path, c.tool) for c in result.citations] == [("tickets/4711", "ticket_lookup")]
    assert json.loads(json.dumps(result.to_dict()))["citations"][0]["tool"] == "ticket_lookup"


def test_the_offline_backend_finds_your_tools_argument_in_the_question(kb) -> None:
    with Agent.from_env(kb=["docs"], tools=[TICKET_TOOL], environ=kb, dotenv=None) as agent:
        result = agent.ask(QUESTION)
        assert "ticket_lookup" in result.state.routing_plan.suggested_tools
        assert RAN == [{"ticket": "4711"}]
        assert "tickets/4711" in [c.path for c in result.citations]
        RAN.clear()
        agent.ask("Why do large uploads fail?")  # no ticket number: never called
        assert RAN == []


def test_your_tool_through_a_real_openai_compatible_server(kb) -> None:
    with FakeOpenAIServer() as srv:
        srv.script("analyze_and_route", route("simple", ("ticket_lookup",)))
        srv.script("plan", plan(("ticket_lookup", {"ticket": "4711"})))
        srv.script("synthesize", "It times out behind the proxy [1].")
        env = {**kb, "KB_AGENT_LLM": "openai", "OPENAI_BASE_URL": srv.base_url, "OPENAI_API_KEY": "k"}
        with Agent.from_env(kb=["docs"], tools=[TICKET_TOOL], environ=env, dotenv=None) as agent:
            result = agent.ask(QUESTION)
        plan_prompt = srv.requests[1].body["messages"][0]["content"]
    assert "ticket_lookup" in plan_prompt and RAN == [{"ticket": "4711"}]
    assert result.citations[0].path == "tickets/4711" and result.usage.llm_calls == 3


def test_a_toolbox_checks_direct_calls_of_your_tool_and_contains_its_failures(tmp_path: Path) -> None:
    from crag import Settings
    from crag.state import ToolCall

    def broken(args, box):
        raise KeyError("boom")

    def wrong(args, box):
        return ["not evidence"]

    box = Toolbox(Settings(index_dir=str(tmp_path)), tools=[
        TICKET_TOOL, Tool("broken_tool", "fails", broken), Tool("wrong_tool", "returns junk", wrong)])
    assert box.available()[-3:] == ("ticket_lookup", "broken_tool", "wrong_tool")
    RAN.clear()
    assert box.run(ToolCall("ticket_lookup", {"ticket": 4711}))[0].source == "tickets/4711"
    with pytest.raises(ToolError, match="unknown argument"):
        box.run(ToolCall("ticket_lookup", {"ticket": "4711", "junk": 1}))
    with pytest.raises(ToolError, match="no ticket #1234"):
        box.run(ToolCall("ticket_lookup", {"ticket": "1234"}))
    with pytest.raises(ToolError, match="failed: KeyError"):
        box.run(ToolCall("broken_tool", {}))
    with pytest.raises(ToolError, match=r"not crag\.EvidenceItem"):
        box.run(ToolCall("wrong_tool", {}))
    with pytest.raises(UsageError, match="already a tool named vector_search"):
        Toolbox(Settings(index_dir=str(tmp_path)), tools=[BUILTIN_TOOLS[0]])


def test_tools_and_toolbox_do_not_mix(kb) -> None:
    from .fakes import FakeToolbox

    with pytest.raises(UsageError, match="not both"):
        Agent.from_env(toolbox=FakeToolbox(), tools=[TICKET_TOOL], environ=kb, dotenv=None)
    with pytest.raises(UsageError, match=r"^pass kb= or toolbox=, not both"):  # not a root left unsearched, unsaid
        Agent.from_env(["docs"], toolbox=FakeToolbox(), environ=kb, dotenv=None)


def test_docs_list_the_registry_as_it_is() -> None:
    from crag.tools import describe

    page = (Path(__file__).resolve().parents[1] / "docs" / "tools.md").read_text()
    assert page.endswith(describe()), "docs/tools.md is stale: regenerate it from crag.tools.describe()"
    assert all(f"`{t.name}`" in page for t in BUILTIN_TOOLS)


def test_the_readme_shows_the_planner_line_of_its_tool_as_the_planner_sees_it() -> None:
    """The README's ticket_lookup line stopped at its arguments; the planner is also told that
    the ticket number must be written in the question."""
    from crag.toolspec import planner_line

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    shown = re.search(r"The planner sees `([^`]*)`", readme)
    assert shown is not None and shown.group(1) == planner_line(TICKET_TOOL)


def test_a_tool_gets_a_context_never_the_toolbox(tmp_path: Path) -> None:
    from crag import Settings, ToolContext, ToolResult
    from crag.state import ToolCall

    seen = []

    def probe(args, context):
        seen.append(context)
        return ToolResult()

    box = Toolbox(Settings(index_dir=str(tmp_path / "ix")), roots=[tmp_path], cwd=tmp_path,
                  tools=[Tool("probe", "looks at what it is given", probe)], http_timeout=7.0)
    assert box.run(ToolCall("probe", {})) == ToolResult()
    (context,) = seen
    assert isinstance(context, ToolContext) and context is not box
    assert not any(hasattr(context, name) for name in ("run", "tools", "close", "store"))
    assert context.file_roots() == (str(tmp_path),) and context.label(str(tmp_path / "a.md")) == "a.md"
    assert context.http.timeout == 7.0 and context.cwd == str(tmp_path)


def test_a_tool_record_that_cannot_work_is_a_usage_error_when_it_is_made() -> None:
    """``Tool("Bad Name", ...)`` and a parameter of an unknown type were bare ValueErrors, which
    no ``except crag.CragError`` catches, and ``Tool(..., run=3)`` or a description that is no text
    were accepted, to fail only when a question ran the tool."""
    with pytest.raises(UsageError, match=r"^a tool name is lower-case letters"):
        Tool("Bad Name", "x", lookup)
    with pytest.raises(UsageError, match=r"^tool ticket_lookup: run must be callable"):
        Tool("ticket_lookup", "read a ticket", 3)
    with pytest.raises(UsageError, match=r"^tool ticket_lookup: the description must be text"):
        Tool("ticket_lookup", None, lookup)
    with pytest.raises(UsageError, match=r"^type must be one of string, integer, boolean"):
        Param("ticket", type="number")
    with pytest.raises(UsageError, match=r"declares an argument twice"):
        Tool("ticket_lookup", "read a ticket", lookup, params=(Param("a"), Param("a")))
