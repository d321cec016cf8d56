"""The transition table and the iteration cap (SPEC §1)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crag import Agent, Settings
from crag.cli import main
from crag.graph import END, START, TRANSITIONS, GraphError, Node, Outcome, mermaid, next_node
from crag.llm.scripted import ScriptedChatModel
from crag.state import AgentState, Complexity, GraderAction, RoutingPlan

from .fakes import FakeToolbox, item, route, search_plan
from .strategies import grader_reply


def test_table_is_exactly_the_spec():
    expected = {
        (Node.START, Outcome.DONE): Node.ANALYZE_AND_ROUTE,
        (Node.ANALYZE_AND_ROUTE, Outcome.CHITCHAT): Node.SYNTHESIZE,
        (Node.ANALYZE_AND_ROUTE, Outcome.SIMPLE): Node.PLAN,
        (Node.ANALYZE_AND_ROUTE, Outcome.COMPLEX): Node.PLAN,
        (Node.PLAN, Outcome.DONE): Node.TOOL_EXEC,
        (Node.TOOL_EXEC, Outcome.SIMPLE): Node.SYNTHESIZE,
        (Node.TOOL_EXEC, Outcome.COMPLEX): Node.GRADE_EVIDENCE,
        (Node.GRADE_EVIDENCE, Outcome.GENERATE): Node.SYNTHESIZE,
        (Node.GRADE_EVIDENCE, Outcome.REFINE): Node.PLAN,
        (Node.GRADE_EVIDENCE, Outcome.RE_RETRIEVE): Node.ANALYZE_AND_ROUTE,
        (Node.GRADE_EVIDENCE, Outcome.CAP_REACHED): Node.SYNTHESIZE,
        (Node.SYNTHESIZE, Outcome.DONE): Node.END,
    }
    assert expected == TRANSITIONS


def test_every_node_is_reachable_and_reaches_the_end():
    edges: dict[Node, set[Node]] = {}
    for (src, _), dst in TRANSITIONS.items():
        edges.setdefault(src, set()).add(dst)
    reachable, frontier = {START}, [START]
    while frontier:
        for dst in edges.get(frontier.pop(), ()):
            if dst not in reachable:
                reachable.add(dst)
                frontier.append(dst)
    assert reachable == set(Node)
    for node in Node:
        if node is END:
            continue
        seen, frontier = {node}, [node]
        while frontier:
            for dst in edges.get(frontier.pop(), ()):
                if dst not in seen:
                    seen.add(dst)
                    frontier.append(dst)
        assert END in seen, node


def test_classification_unavailable_routes_like_complex():
    state = AgentState("q")
    assert next_node(Node.ANALYZE_AND_ROUTE, state, 3) is Node.PLAN


@given(st.integers(0, 6), st.integers(1, 5), st.sampled_from(list(GraderAction)))
def test_grade_routes_to_synthesize_at_the_cap_whatever_the_action(iteration, cap, action):
    state = AgentState("q", iteration=iteration, grader_action=action,
                       routing_plan=RoutingPlan(Complexity.COMPLEX, ()))
    nxt = next_node(Node.GRADE_EVIDENCE, state, cap)
    if iteration >= cap:
        assert nxt is Node.SYNTHESIZE
    else:
        assert nxt is {GraderAction.GENERATE: Node.SYNTHESIZE, GraderAction.REFINE: Node.PLAN,
                       GraderAction.RE_RETRIEVE: Node.ANALYZE_AND_ROUTE}[action]


def test_missing_entry_is_a_named_error():
    state = AgentState("q", routing_plan=RoutingPlan(Complexity.COMPLEX, ()))
    try:
        next_node(Node.GRADE_EVIDENCE, state, 3)  # no grader_action: not a legal state
    except GraphError as exc:
        assert "grade_evidence" in str(exc)
    else:
        raise AssertionError("expected GraphError")


routes = st.sampled_from(["chitchat", "simple", "complex"]).map(route) | st.text(max_size=30)
plans = st.sampled_from([search_plan(), "garbage", "[]", '{"tool_calls": [{"tool": "nope"}]}'])


@settings(max_examples=150, deadline=None)
@given(
    cap=st.integers(1, 4),
    routes=st.lists(routes, min_size=1, max_size=12),
    plans=st.lists(plans, min_size=1, max_size=12),
    grades=st.lists(grader_reply, min_size=1, max_size=12),
    found=st.lists(st.integers(0, 5), min_size=1, max_size=12),
)
def test_any_replies_end_in_synthesize_within_the_cap(cap, routes, plans, grades, found):
    model = ScriptedChatModel(
        {"analyze_and_route": routes, "plan": plans, "grade_evidence": grades},
        default={"analyze_and_route": route("complex"), "plan": search_plan(),
                 "grade_evidence": "[0.5]", "synthesize": "Answer [1]."},
    )
    counter = iter(range(1000))
    results = [[item(next(counter)) for _ in range(n)] for n in found]
    toolbox = FakeToolbox({"vector_search": results})
    result = Agent(model, toolbox, Settings(max_iterations=cap)).ask("What is the retry policy?")
    assert result.trace[-1] == "synthesize"
    assert result.trace.count("tool_exec") == result.iterations <= cap
    assert result.trace.count("synthesize") == 1
    assert len(result.state.evidence_scores) in (0, len(result.state.context))
    assert result.answer.count("LLM Usage Stats") == 1


def test_graph_command_prints_mermaid(capsys):
    assert main(["graph"]) == 0
    out = capsys.readouterr().out
    assert out == mermaid()
    assert out.startswith("flowchart TD")
    for node in ("analyze_and_route", "plan", "tool_exec", "grade_evidence", "synthesize"):
        assert node in out
    assert out.count("-->") == len(TRANSITIONS)
