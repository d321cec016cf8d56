"""Grading rules as properties (SPEC §2): filter, decision, rule order, thresholds."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from crag import grading
from crag.config import Settings
from crag.nodes import NodeConfig, grade_evidence
from crag.state import AgentState, Completion, Complexity, EvidenceItem, GraderAction, RoutingPlan, ToolCall, ToolRun
from crag.tools import BUILTIN_TOOLS
from crag.toolspec import Tool, ToolResult

from .strategies import evidence_items, grader_reply, scores, threshold


@given(scores, threshold, threshold)
def test_filter_and_action_agree_with_the_spec(values, drop, generate):
    assume(drop <= generate)
    d = grading.decide(values, drop, generate)
    assert sorted(d.kept + d.removed) == list(range(len(values)))
    assert all(values[i] >= drop - 1e-9 for i in d.kept)
    assert all(values[i] < drop for i in d.removed)
    kept = [values[i] for i in d.kept]
    if not kept:
        assert d.action is GraderAction.RE_RETRIEVE
    elif sum(kept) / len(kept) >= generate + 1e-6:
        assert d.action is GraderAction.GENERATE
    elif sum(kept) / len(kept) < generate - 1e-6:
        assert d.action is GraderAction.REFINE


@given(scores)
def test_mean_of_survivors_is_never_below_the_drop_threshold(values):
    d = grading.decide(values, 0.3, 0.7)
    if d.kept:
        assert d.mean >= 0.3 - 1e-9


def _state(items, round_tools):
    history = tuple(
        ToolRun(1, ToolCall(tool), tuple(i for i in items if i.tool == tool)) for tool in round_tools
    )
    return AgentState("q", context=tuple(items), tool_history=history, iteration=1,
                      routing_plan=RoutingPlan(Complexity.COMPLEX, ()))


@given(evidence_items(min_size=1), st.integers(0, 10), threshold)
def test_rule_order_is_read_file_then_few_context_then_high_vector_score(items, max_items, vthr):
    tools = sorted({i.tool for i in items})
    rule = grading.fast_path_rule(items, _state(items, tools).tool_history, 1, max_items, vthr, BUILTIN_TOOLS)
    if tools == ["read_file"]:
        assert rule == "read_file"
    elif len(items) <= max_items:
        assert rule == "few_context"
    elif all(i.tool == "vector_search" and i.score >= vthr - grading._EPS for i in items):  # its float tolerance
        assert rule == "high_vector_score"
    else:
        assert rule is None


def test_high_vector_score_reads_the_scores_recorded_in_tool_history():
    items = [EvidenceItem("vector_search", f"d{k}.md", "t", 1, 2, score=0.9) for k in range(3)]
    # The items claim 0.9 but tool_history recorded lower scores for them: no fast path.
    recorded = tuple(EvidenceItem("vector_search", f"d{k}.md", "t", 1, 2, score=0.5) for k in range(3))
    history = (ToolRun(1, ToolCall("vector_search"), recorded),)
    assert grading.fast_path_rule(items, history, 1, 2, 0.8, BUILTIN_TOOLS) is None
    history = (ToolRun(1, ToolCall("vector_search"), tuple(items)),)
    assert grading.fast_path_rule(items, history, 1, 2, 0.8, BUILTIN_TOOLS) == "high_vector_score"


def test_the_fast_path_rules_follow_the_tool_records_not_the_tool_names():
    """``read_file`` covers every tool that ``reads_lines``, ``high_vector_score`` every tool with
    ``vector_scores`` (a tool of your own too); a tool named like a built-in one but without the
    capability is graded. The rule names stay the seeds'."""
    def tool(name: str, **capabilities: bool) -> Tool:
        return Tool(name, "a tool", lambda args, context: ToolResult(), **capabilities)

    own = (tool("open_page", reads_lines=True), tool("semantic", vector_scores=True),
           tool("read_file"), tool("vector_search"))
    items = [EvidenceItem("semantic", f"d{k}.md", "t", 1, 2, score=0.9) for k in range(3)]
    read = (ToolRun(1, ToolCall("open_page"), tuple(items)),)
    assert grading.fast_path_rule(items, read, 1, 2, 0.8, own) == "read_file"
    searched = (ToolRun(1, ToolCall("semantic"), tuple(items)),)
    assert grading.fast_path_rule(items, searched, 1, 2, 0.8, own) == "high_vector_score"
    named = [EvidenceItem("vector_search", f"d{k}.md", "t", 1, 2, score=0.9) for k in range(3)]
    history = (ToolRun(1, ToolCall("read_file"), ()), ToolRun(1, ToolCall("vector_search"), tuple(named)))
    assert grading.fast_path_rule(named, history, 1, 2, 0.8, own) is None
    assert grading.retrieval_facts(history, "q", own).recorded == {}
    assert grading.retrieval_facts(searched, "q", own).recorded == {i.key: 0.9 for i in items}


@given(evidence_items(min_size=3, max_size=8, tool=st.just("grep_search")), grader_reply)
def test_any_grader_reply_yields_exactly_n_scores_in_range(items, reply):
    state = _state(items, ["grep_search"])
    cfg = NodeConfig(Settings(auto_approve_max_items=2))
    step = grade_evidence.prepare(state, cfg)
    assert step.request is not None
    new = grade_evidence.apply(state, step, Completion(reply, "m"), cfg)
    assert len(new.evidence_scores) == len(new.context) <= len(items)
    assert all(0.0 <= s <= 1.0 for s in new.evidence_scores)
    removed = [e for e in new.audit if e.event == "evidence_removed"]
    assert len(removed) + len(new.context) == len(items)
    assert new.grader_action in set(GraderAction)


@given(st.integers(0, 20), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_thresholds_read_from_the_environment_are_honoured(max_items, vthr, drop, gen):
    assume(drop <= gen)
    env = {
        "KB_AGENT_AUTO_APPROVE_MAX_ITEMS": str(max_items),
        "KB_AGENT_VECTOR_SCORE_THRESHOLD": repr(vthr),
        "KB_AGENT_DROP_THRESHOLD": repr(drop),
        "KB_AGENT_GENERATE_THRESHOLD": repr(gen),
    }
    s = Settings.from_env(environ=env, dotenv=None)
    cfg = NodeConfig.from_settings(s, ("vector_search",))
    assert (cfg.auto_approve_max_items, cfg.vector_score_threshold, cfg.drop_threshold, cfg.generate_threshold) == (
        max_items, vthr, drop, gen)


def test_a_grading_that_makes_no_request_still_names_its_rule():
    """SPEC §2: the verdict names the rule that decided, and the audit says it for every
    grading (``grade_decided``), also when no item was left to grade or the prompt had room
    for none."""
    from crag.grading.rules import GradeCase, verdict

    for case, rule in ((GradeCase(), "no_context"), (GradeCase(trimmed=3), "all_trimmed")):
        outcome = verdict(case, grading.POLICIES["default"])
        events = [(e.event, dict(e.fields)) for e in outcome.events]
        assert outcome.rule == rule and outcome.action is GraderAction.RE_RETRIEVE
        assert events[-1] == ("grade_decided", {"rule": rule, "action": "RE_RETRIEVE"})
