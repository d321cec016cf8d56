"""Retrieval the planner cannot make worse: the question always searched, repeats paged,
grep capped and ranked, a glob that matches nothing dropped, hash hits sharing a word."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from attrs import evolve
from hypothesis import given, settings
from hypothesis import strategies as st

from crag import Agent, searches
from crag.config import Settings
from crag.index import ensure_indexed
from crag.llm import ScriptedChatModel
from crag.nodes import NodeConfig, plan
from crag.ports import ToolResult
from crag.state import AgentState, Completion, Complexity, EvidenceItem, RoutingPlan, ToolCall, ToolRun
from crag.tools import Toolbox, builtin

from .fakes import FakeToolbox, item

QUESTION = "How do uploads retry?"
ROUTE = '{"complexity": "complex", "suggested_tools": ["vector_search", "grep_search", "read_file"]}'
CFG = NodeConfig(Settings(top_k=5), tools=builtin("vector_search", "grep_search", "read_file"))


def plan_reply(*calls: tuple[str, dict]) -> str:
    return json.dumps({"tool_calls": [{"tool": t, "args": a} for t, a in calls]})


def planned(reply: str, question: str = QUESTION, history=(), iteration: int = 0) -> AgentState:
    state = AgentState(
        question=question,
        routing_plan=RoutingPlan(Complexity.COMPLEX, ("vector_search", "grep_search", "read_file")),
        tool_history=tuple(history),
        iteration=iteration,
    )
    return plan.apply(state, plan.prepare(state, CFG), Completion(reply, "m"), CFG)


def test_the_first_round_searches_the_question_besides_the_plan():
    state = planned(plan_reply(("grep_search", {"pattern": "clauda.py"})))
    assert state.tool_calls[0].tool == "grep_search"
    assert state.tool_calls[1] == ToolCall("vector_search", {"query": QUESTION, "top_k": 5})
    assert any(e.event == "question_searched" for e in state.audit)


def test_the_planners_own_question_search_runs_once_with_at_least_top_k():
    state = planned(plan_reply(("vector_search", {"query": "  how do UPLOADS retry? ", "top_k": 2})))
    assert state.tool_calls == (ToolCall("vector_search", {"query": "how do UPLOADS retry?", "top_k": 5}),)


def test_a_small_top_k_is_raised_and_a_large_one_kept():
    state = planned(plan_reply(("vector_search", {"query": "clau3.5 sonnet", "top_k": 1}),
                               ("vector_search", {"query": "retry limit", "top_k": 12})))
    assert [c.args["top_k"] for c in state.tool_calls] == [5, 12, 5]


def test_reading_only_files_the_question_names_runs_only_those_reads():
    question = "What does docs/setup.md say about ports?"
    state = planned(plan_reply(("read_file", {"path": "docs/setup.md"})), question=question)
    assert state.tool_calls == (ToolCall("read_file", {"path": "docs/setup.md"}),)
    other = planned(plan_reply(("read_file", {"path": "docs/other.md"})), question=question)
    assert other.tool_calls[-1] == ToolCall("vector_search", {"query": question, "top_k": 5})


@pytest.mark.parametrize(("named", "read"), [("docs/setup.md", "kb/docs/setup.md"), ("kb/docs/setup.md", "docs/setup.md"),
                                             ("setup.md", "/srv/kb/docs/setup.md"), ("docs/setup.md", "docs//setup.md"),
                                             ("docs/setup.md", "./docs/./setup.md"), ("./docs/setup.md", "docs/setup.md/")])
def test_a_read_of_the_named_file_by_another_path_to_it_runs_alone(named, read):
    # The question named docs/setup.md and the planner read it as kb/docs/setup.md (the path
    # crag's own citations show): the question was searched too, and seed 001's read_file rule
    # never fired, while the same read spelt as the question spelt it ran alone.
    state = planned(plan_reply(("read_file", {"path": read})), question=f"What does {named} say about ports?")
    assert state.tool_calls == (ToolCall("read_file", {"path": read}),)
    other = planned(plan_reply(("read_file", {"path": "kb/docs/my-setup.md"})), question=f"What does {named} say?")
    assert [c.tool for c in other.tool_calls] == ["read_file", "vector_search"]


def test_later_rounds_add_no_question_search():
    state = planned(plan_reply(("grep_search", {"pattern": "retry"})), iteration=1)
    assert [c.tool for c in state.tool_calls] == ["grep_search"]


def test_a_repeated_search_goes_one_page_deeper():
    first = ToolRun(1, ToolCall("vector_search", {"query": QUESTION, "top_k": 5}), tuple(item(k) for k in range(5)))
    state = planned(plan_reply(("vector_search", {"query": QUESTION.upper(), "top_k": 5})), history=[first], iteration=1)
    assert state.tool_calls == (ToolCall("vector_search", {"query": QUESTION.upper(), "top_k": 10}),)
    assert [e.fields["action"] for e in state.audit if e.event == "call_repeated"] == ["next page"]


def test_a_repeated_read_is_dropped_and_the_question_searched_deeper():
    read = ToolRun(1, ToolCall("read_file", {"path": "a.md"}), (item(1, tool="read_file"),))
    asked = ToolRun(1, ToolCall("vector_search", {"query": QUESTION, "top_k": 5}), ())
    state = planned(plan_reply(("read_file", {"path": "a.md"})), history=[read, asked], iteration=1)
    assert state.tool_calls == (ToolCall("vector_search", {"query": QUESTION, "top_k": 10}),)


def test_a_question_search_paged_to_its_last_hit_is_not_searched_again_and_planning_ends():
    # KB_AGENT_MAX_ITERATIONS=11 reached this: every page of the question's search was read,
    # the planner repeated itself, and the fallback search recursed until RecursionError.
    asked = ToolRun(1, ToolCall("vector_search", {"query": QUESTION, "top_k": 50}), ())
    read = ToolRun(1, ToolCall("read_file", {"path": "a.md"}), (item(1, tool="read_file"),))
    for reply in (plan_reply(("read_file", {"path": "a.md"})), plan_reply(("vector_search", {"query": QUESTION}))):
        state = planned(reply, history=[asked, read], iteration=10)
        assert state.tool_calls == ()
        assert [e.fields["action"] for e in state.audit if e.event == "call_repeated"][-1] == "dropped"


def test_a_top_k_of_fifty_and_a_planner_repeating_the_question_search_refine_to_the_cap():
    # With KB_AGENT_TOP_K=50 the first round read the search's last page; the second
    # round's plan ended in RecursionError.
    page = [item(k) for k in range(1, 6)]
    toolbox = FakeToolbox({"vector_search": [page, page, page]})
    same = plan_reply(("vector_search", {"query": QUESTION}))
    model = ScriptedChatModel({
        "analyze_and_route": [ROUTE],
        "plan": [same, same, same],
        "grade_evidence": ["[0.5, 0.6, 0.5, 0.6, 0.5]"] * 3,  # REFINE
        "synthesize": ["Uploads retry [1]."],
    })
    result = Agent(model, toolbox, Settings(top_k=50, auto_approve_max_items=0, grading_policy="seed")).ask(QUESTION)
    assert result.iterations == 3
    assert [c.args["top_k"] for c in toolbox.calls] == [50]


def test_a_refine_round_of_the_same_plan_brings_only_new_evidence():
    page1 = [item(k) for k in range(1, 6)]
    page2 = [*page1, *(item(k) for k in range(6, 11))]
    toolbox = FakeToolbox({"vector_search": [page1, page2]})
    same = plan_reply(("vector_search", {"query": QUESTION}))
    model = ScriptedChatModel({
        "analyze_and_route": [ROUTE],
        "plan": [same, same],
        "grade_evidence": ["[0.5, 0.6, 0.5, 0.6, 0.5]", json.dumps([0.5, 0.6] * 5)],  # REFINE
        "synthesize": ["Uploads retry [1]."],
    })
    settings = Settings(max_iterations=2)
    result = Agent(model, toolbox, settings).ask(QUESTION)
    assert [c.args["top_k"] for c in toolbox.calls] == [5, 10]
    second = next(r for r in result.state.tool_history if r.round == 2)
    assert [i.source for i in second.items] == [f"docs/page{k}.md" for k in range(6, 11)]
    assert len(model.requests[-2].task.items) == 10  # the second grading saw 5 new items


def grep_items(files: dict[str, int]) -> list[EvidenceItem]:
    out = []
    for source, n in files.items():
        out.extend(EvidenceItem("grep_search", source, f"match {k}", 10 * k + 1, 10 * k + 5, anchor_line=10 * k + 3)
                   for k in range(n))
    return out


def test_grep_keeps_twice_top_k_matches_best_files_first_and_audits_the_rest():
    toolbox = FakeToolbox({"grep_search": [grep_items({"a.md": 3, "b.md": 12, "c.md": 6})]})
    model = ScriptedChatModel({
        "analyze_and_route": ['{"complexity": "simple", "suggested_tools": ["grep_search"]}'],
        "plan": [plan_reply(("grep_search", {"pattern": "retry"}))],
        "synthesize": ["ok [1]."],
    })
    result = Agent(model, toolbox, Settings(top_k=4)).ask(QUESTION)
    grep_run = next(r for r in result.state.tool_history if r.call.tool == "grep_search")
    assert len(grep_run.items) == 8
    assert [i.source for i in grep_run.items] == ["b.md"] * 8
    truncated = [e for e in result.state.audit if e.event == "grep_truncated"]
    assert truncated and truncated[0].fields["matches"] == 21 and truncated[0].fields["kept"] == 8


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def kb_env(tmp_path: Path):
    kb = tmp_path / "kb"
    write(kb / "setup.md", "# Setup\n\nThe client retries failed uploads three times.\n\n## Ports\n\nPort 8080.\n")
    write(kb / "notes.txt", "Uploads go to the bucket named media.\n")
    settings = Settings(index_dir=str(tmp_path / ".crag"))
    ensure_indexed(settings, [kb])
    return kb, settings


def test_grep_truncated_counts_the_matches_past_the_tools_own_cap(tmp_path, monkeypatch):
    # A word on 700 lines was audited as {"matches": 500, "kept": 10}: grep_search stops at
    # MAX_MATCHES, and the audit counted only what it returned, not how many there were.
    kb, settings = kb_env(tmp_path)
    write(kb / "log.txt", "uploads retried\n" * 700)
    monkeypatch.chdir(tmp_path)
    model = ScriptedChatModel({"analyze_and_route": ['{"complexity": "simple", "suggested_tools": ["grep_search"]}'],
                               "plan": [plan_reply(("grep_search", {"pattern": "retried"}))],
                               "synthesize": ["Uploads are retried [1]."]})
    box = Toolbox(settings, roots=[kb], cwd=tmp_path)
    try:
        result = Agent(model, box, settings).ask("How are uploads retried?")
    finally:
        box.close()
    truncated = [e.fields for e in result.state.audit if e.event == "grep_truncated"]
    assert truncated == [{"pattern": "retried", "matches": 700, "kept": 10}]


def test_a_glob_matching_no_file_is_dropped_and_audited(tmp_path):
    kb, settings = kb_env(tmp_path)
    box = Toolbox(settings, roots=[kb], cwd=tmp_path)
    try:
        result = box.run(ToolCall("grep_search", {"pattern": "uploads", "glob": "clauda.py"}))
        kept = box.run(ToolCall("grep_search", {"pattern": "uploads", "glob": "*.txt"}))
    finally:
        box.close()
    assert isinstance(result, ToolResult)
    assert {i.source for i in result.items} == {"kb/setup.md", "kb/notes.txt"}
    assert [e.event for e in result.audit] == ["glob_dropped"]
    assert result.audit[0].fields["glob"] == "clauda.py"
    assert {i.source for i in kept.items} == {"kb/notes.txt"} and not kept.audit


def test_a_question_the_documents_never_mention_gets_the_no_evidence_answer(tmp_path, monkeypatch):
    kb, settings = kb_env(tmp_path)
    monkeypatch.chdir(tmp_path)
    model = ScriptedChatModel({"analyze_and_route": ['{"complexity": "simple", "suggested_tools": ["vector_search"]}'],
                               "plan": [plan_reply(("vector_search", {"query": "swallow airspeed"}))]})
    box = Toolbox(settings, roots=[kb], cwd=tmp_path)
    try:
        result = Agent(model, box, settings).ask("What is the airspeed velocity of a swallow?")
        hits = box.run(ToolCall("vector_search", {"query": "uploads retry", "top_k": 5}))
    finally:
        box.close()
    assert result.answer.startswith("I couldn't find relevant information in the knowledge base")
    assert model.calls("synthesize") == 0
    assert hits and all("upload" in h.text.lower() or "retr" in h.text.lower() for h in hits)


@pytest.mark.parametrize("lines", [{"start_line": 40, "end_line": 60}, {"start_line": 3, "end_line": 3}])
def test_reads_of_the_named_file_that_find_nothing_give_way_to_the_question_search(tmp_path, monkeypatch, lines):
    """The user pointed at a file and the planner read lines past its end: that found nothing,
    and the question, never searched, got the no-evidence answer. The question's own search
    runs when the pointed reads find nothing, and only then."""
    kb, settings = kb_env(tmp_path)
    monkeypatch.chdir(tmp_path)
    model = ScriptedChatModel({"analyze_and_route": ['{"complexity": "simple", "suggested_tools": ["read_file"]}'],
                               "plan": [plan_reply(("read_file", {"path": "kb/setup.md", **lines}))],
                               "synthesize": ["The client retries failed uploads three times [1]."]})
    box = Toolbox(settings, roots=[kb], cwd=tmp_path)
    try:
        result = Agent(model, box, settings).ask("How often are uploads retried? see kb/setup.md")
    finally:
        box.close()
    events = [e.event for e in result.state.audit]
    assert result.answer.startswith("The client retries failed uploads three times [1].")
    assert result.citations[0].path == "kb/setup.md"
    if lines["start_line"] == 40:
        assert events[:2] == ["tool_error", "question_searched"]
        assert [run.call.tool for run in result.state.tool_history] == ["read_file", "vector_search"]
    else:  # the read found the lines: only the read ran (SPEC: the user pointed at the source)
        assert "question_searched" not in events and len(result.state.tool_history) == 1


def test_one_read_of_two_named_files_finding_nothing_gives_way_to_the_question_search(tmp_path, monkeypatch):
    kb, settings = kb_env(tmp_path)
    monkeypatch.chdir(tmp_path)
    reads = plan_reply(("read_file", {"path": "kb/notes.txt"}), ("read_file", {"path": "kb/setup.md", "start_line": 50}))
    model = ScriptedChatModel({"analyze_and_route": ['{"complexity": "simple", "suggested_tools": ["read_file"]}'],
                               "plan": [reads], "synthesize": ["The client retries failed uploads three times [1]."]})
    box = Toolbox(settings, roots=[kb], cwd=tmp_path)
    try:
        result = Agent(model, box, settings).ask("Where do uploads go (kb/notes.txt) and how often are they retried "
                                                 "(kb/setup.md)?")
    finally:
        box.close()
    assert [run.call.tool for run in result.state.tool_history] == ["read_file", "read_file", "vector_search"]
    assert [c.path for c in result.citations] == ["kb/setup.md"]


# --------------------------------------------------------------------------------------
# Property: whatever the planner replies, the first round searches the question
# --------------------------------------------------------------------------------------

tool_entry = st.fixed_dictionaries({
    "tool": st.sampled_from(["vector_search", "grep_search", "read_file", "jira_fetch", "bogus", ""]),
    "args": st.dictionaries(st.sampled_from(["query", "top_k", "pattern", "glob", "path"]),
                            st.one_of(st.text(max_size=20), st.integers(-3, 80), st.none()), max_size=3),
})
plan_text = st.one_of(
    st.lists(tool_entry, max_size=6).map(lambda calls: json.dumps({"tool_calls": calls})),
    st.text(max_size=60),
    st.sampled_from(["", "grep_search and read_file", "[]", '{"tool_calls": []}']),
)


@settings(max_examples=150, deadline=None)
@given(reply=plan_text, question=st.text(min_size=1, max_size=60).filter(lambda q: q.strip()))
def test_the_first_round_always_contains_the_questions_own_search(reply, question):
    state = planned(reply, question=question)
    calls = state.tool_calls
    assert len(calls) >= 1
    own = [c for c in calls if c.tool == "vector_search" and " ".join(c.args["query"].split()).casefold()
           == " ".join(question.split()).casefold()]
    only_named_reads = all(c.tool == "read_file" for c in calls)
    assert len(own) == 1 or only_named_reads
    if own:
        assert own[0].args["top_k"] >= CFG.top_k
    assert all(c.args.get("top_k", CFG.top_k) >= CFG.top_k for c in calls if c.tool == "vector_search")


# --------------------------------------------------------------------------------------
# A question longer than a search query may be is searched by its beginning
# --------------------------------------------------------------------------------------

LONG_QUESTION = "How do uploads retry? " + "Please explain it in detail and be precise. " * 100  # 4,422 characters


def test_a_question_longer_than_a_query_may_be_is_searched_by_its_beginning():
    """The question is always searched (SPEC §5), also one of more than the 4,000 characters a
    ``vector_search`` query may hold (a question may be up to 1,048,576): it was a tool error."""
    state = planned(plan_reply(("grep_search", {"pattern": "uploads"})), question=LONG_QUESTION)
    own = [c for c in state.tool_calls if c.tool == "vector_search"]
    assert len(own) == 1 and LONG_QUESTION.startswith(own[0].args["query"])
    assert 2000 < len(own[0].args["query"]) <= 4000 and not own[0].args["query"].endswith(" ")
    again = planned(plan_reply(("vector_search", {"query": own[0].args["query"]})), question=LONG_QUESTION)
    assert [c.tool for c in again.tool_calls] == ["vector_search"]  # the planner's own is that search: run once


def test_a_long_question_is_answered_from_its_search_without_a_tool_error(tmp_path, monkeypatch):
    kb, settings = kb_env(tmp_path)
    monkeypatch.chdir(tmp_path)
    model = ScriptedChatModel({"analyze_and_route": ['{"complexity": "simple", "suggested_tools": ["vector_search"]}'],
                               "plan": [plan_reply(("vector_search", {"query": "bucket"}))],
                               "synthesize": ["The client retries failed uploads three times [1]."]})
    box = Toolbox(settings, roots=[kb], cwd=tmp_path)
    try:
        agent = Agent(model, box, settings)
        result = agent.ask(LONG_QUESTION)
        hits = agent.search(LONG_QUESTION)
    finally:
        box.close()
    assert not [e for e in result.state.audit if e.event == "tool_error"], result.state.audit
    assert "retries failed uploads three times" in result.answer and "kb/setup.md:L3" in result.answer
    assert hits and hits[0].source == "kb/setup.md"


# --------------------------------------------------------------------------------------
# The answer's evidence: windows of one file that share lines are one item
# --------------------------------------------------------------------------------------

def window(source: str, first: int, last: int, score: float | None = None, anchor: int | None = None) -> EvidenceItem:
    text = "\n".join(f"{source} line {n}" for n in range(first, last + 1))
    return EvidenceItem("grep_search", source, text, first, last, score, anchor)


def test_windows_that_share_lines_are_joined_in_the_place_of_the_first():
    items = [window("a.txt", 97, 101, anchor=99), window("a.txt", 99, 103), window("a.txt", 108, 112),
             window("b.txt", 1, 3), window("a.txt", 100, 109, score=0.4), window("a.txt", 112, 112)]
    out, members = searches.joined(items, 6000)
    assert [(o.source, o.start_line, o.end_line) for o in out] == [("a.txt", 97, 112), ("b.txt", 1, 3)]
    assert members == ((0, 1, 2, 4, 5), (3,))
    assert out[0].text.split("\n") == [f"a.txt line {n}" for n in range(97, 113)]
    assert (out[0].anchor_line, out[0].score, out[0].tool) == (99, 0.4, "grep_search")


def test_windows_that_only_touch_differ_or_would_be_too_long_stay_apart():
    touching = [window("a.txt", 1, 5), window("a.txt", 6, 9)]
    assert searches.joined(touching, 6000)[1] == ((0,), (1,))
    edited = [window("a.txt", 1, 5), evolve(window("a.txt", 4, 8), text="other\n" * 4 + "a.txt line 8")]
    assert searches.joined(edited, 6000)[1] == ((0,), (1,))
    assert searches.joined([window("a.txt", 1, 5), window("a.txt", 4, 8)], 60)[1] == ((0,), (1,))
    assert searches.joined([window("a.txt", 1, 5), window("b.txt", 4, 8)], 6000)[1] == ((0,), (1,))
    unlined = EvidenceItem("web", "a.txt", "a.txt line 2", 1, 5)  # its text is not its span's lines
    assert searches.joined([window("a.txt", 1, 5), unlined], 6000)[1] == ((0,), (1,))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a.txt", "b.txt"]), st.integers(1, 40), st.integers(0, 6)), max_size=9))
def test_joined_items_keep_every_line_once_and_every_item_in_one_place(spans):
    items = [window(src, first, first + size) for src, first, size in spans]
    out, members = searches.joined(items, 6000)
    assert sorted(k for m in members for k in m) == list(range(len(items)))
    for o, m in zip(out, members):
        lines = o.text.split("\n")
        assert lines == [f"{o.source} line {n}" for n in range(o.start_line, o.end_line + 1)]
        assert all(items[k].source == o.source and o.start_line <= items[k].start_line
                   and items[k].end_line <= o.end_line for k in m)
    by_source: dict[str, list[tuple[int, int]]] = {}
    for o in out:
        by_source.setdefault(o.source, []).append((o.start_line, o.end_line))
    for spans_of in by_source.values():  # no two items left sharing a line
        spans_of.sort()
        assert all(a[1] < b[0] for a, b in itertools.pairwise(spans_of))


def test_the_answer_prompt_shows_lines_two_windows_share_once_and_cites_the_line(tmp_path, monkeypatch):
    kb = tmp_path / "kb"
    lines = [f"Filler sentence number {n} says nothing of use." for n in range(1, 41)]
    lines[9] = "Failed uploads retry three times."
    lines[11] = "Each upload retry waits two seconds first."
    write(kb / "notes.txt", "\n".join(lines) + "\n")
    settings = Settings(index_dir=str(tmp_path / ".crag"))
    ensure_indexed(settings, [kb])
    monkeypatch.chdir(tmp_path)
    model = ScriptedChatModel({
        "analyze_and_route": ['{"complexity": "simple", "suggested_tools": ["grep_search"]}'],
        "plan": [plan_reply(("grep_search", {"pattern": "retry"}))],
        "synthesize": ["Failed uploads retry three times [1]."],
    })
    box = Toolbox(settings, roots=[kb], cwd=tmp_path)
    try:
        result = Agent(model, box, settings).ask("How many times do failed uploads retry?")
    finally:
        box.close()
    prompt = next(r for r in model.requests if r.node == "synthesize").messages[-1]["content"]
    assert prompt.count("Failed uploads retry three times.") == 1
    assert prompt.count("Each upload retry waits two seconds first.") == 1
    assert result.citations[0].path.endswith("notes.txt") and result.citations[0].line == 10
