"""AgentState invariants and the cattrs round trip."""

from __future__ import annotations

import json

import pytest
from attrs import evolve
from hypothesis import given

from crag.state import (
    AgentState,
    AuditEvent,
    Completion,
    Complexity,
    GraderAction,
    RoutingPlan,
    ToolCall,
    ToolRun,
    Usage,
    converter,
    output_converter,
)

from .strategies import evidence_items


def test_scores_must_match_context_and_stay_in_range():
    from .fakes import item

    state = AgentState("q", context=(item(1), item(2)))
    with pytest.raises(ValueError):
        evolve(state, evidence_scores=(0.5,))
    with pytest.raises(ValueError):
        evolve(state, evidence_scores=(0.5, 1.5))
    with pytest.raises(ValueError):
        evolve(state, iteration=-1)
    assert evolve(state, evidence_scores=(0.5, 1.0)).evidence_scores == (0.5, 1.0)


@given(evidence_items())
def test_state_round_trips_through_the_converter(items):
    usage = Usage("m").add("plan", Completion("x", "m", 3, 4, 1.5))
    state = AgentState(
        "q",
        routing_plan=RoutingPlan(Complexity.SIMPLE, ("vector_search",)),
        context=tuple(items),
        evidence_scores=tuple(0.5 for _ in items),
        grader_action=GraderAction.REFINE,
        iteration=2,
        tool_history=(ToolRun(1, ToolCall("vector_search", {"query": "q", "top_k": 3}), tuple(items)),),
        audit=(AuditEvent("fast_path_hit", {"rule_name": "few_context"}),),
        usage=usage,
        trace=("analyze_and_route",),
    )
    data = json.loads(json.dumps(converter.unstructure(state)))
    assert converter.structure(data, AgentState) == state


def test_usage_counts_billable_calls_only():
    usage = Usage().add("plan", Completion("x", "offline", 0, 0, 2.0, billable=False))
    assert usage.llm_calls == 0 and usage.latency_ms == 2.0 and usage.model == "offline"
    usage = usage.add("plan", Completion("x", "gpt", 10, 5, 1.0))
    assert (usage.llm_calls, usage.total_tokens) == (1, 15)
    assert output_converter.unstructure(usage)["by_node"]["plan"] == {
        "calls": 1, "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "latency_ms": 3.0}


def test_recording_a_step_is_evolve_of_trace_usage_and_audit_and_keeps_every_other_field():
    from attrs import fields

    from crag.state import Citation, Grade, GroundingReport, Message

    from .fakes import item

    values = {  # every field away from its default, so a field the fast path forgot shows
        "question": "q", "history": (Message("user", "hi"),),
        "routing_plan": RoutingPlan(Complexity.COMPLEX, ("grep_search",)),
        "tool_calls": (ToolCall("grep_search", {"pattern": "x"}),), "context": (item(1),), "evidence_scores": (0.5,),
        "grader_action": GraderAction.REFINE, "iteration": 2, "tool_history": (ToolRun(1, ToolCall("read_file"), ()),),
        "audit": (AuditEvent("a", {}),), "usage": Usage("m"), "trace": ("plan",), "answer": "A.",
        "citations": (Citation(1, "a.md", 1, "grep_search"),), "grounding": GroundingReport(sentences=1),
        "removed": (Grade("b.md", 1, 2, 0.1),), "grades": (Grade("c.md", 1, 2, 0.9),), "context_window": 2048,
        "graded_by": "grader",
    }
    defaults = AgentState("q")
    assert set(values) == {f.name for f in fields(AgentState)}
    assert all(values[n] != getattr(defaults, n) for n in values if n != "question")
    state = AgentState(**values)
    usage = Usage("m").add("plan", Completion("x", "m", 3, 4, 1.5))
    audit = (*state.audit, AuditEvent("b", {}))
    assert state.recorded("tool_exec", usage, audit) == evolve(state, trace=("plan", "tool_exec"), usage=usage,
                                                                audit=audit)
