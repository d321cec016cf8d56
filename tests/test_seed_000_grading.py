"""Seed 000 (evidence grading): one test per scenario, named after it."""

from __future__ import annotations

from crag import Agent, Settings
from crag.answer import NO_EVIDENCE
from crag.llm.scripted import ScriptedChatModel

from .fakes import FakeToolbox, item, route, scores, search_plan


def run(replies, results, **settings):
    model = ScriptedChatModel(replies)
    question = "What is the retry policy for uploads?"
    toolbox = FakeToolbox(results, question=question)
    agent = Agent(model, toolbox, Settings(**settings))
    return agent.ask(question), model, toolbox


def three_items(offset: int = 0):
    return [item(offset + 1, score=0.5), item(offset + 2, score=0.4), item(offset + 3, score=0.6)]


def test_batch_relevance_grading():
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": [scores(0.9, 0.8, 0.75)],
            "synthesize": ["Uploads retry three times [1]."],
        },
        {"vector_search": [three_items()]},
    )
    grade_requests = [r for r in model.requests if r.node == "grade_evidence"]
    assert len(grade_requests) == 1  # one batched call for all N items
    assert len(grade_requests[0].task.items) == 3
    prompt = "\n".join(m["content"] for m in grade_requests[0].messages)
    assert all(f"[{k}]" in prompt for k in (1, 2, 3))
    assert result.state.evidence_scores == (0.9, 0.8, 0.75)


def test_grading_with_parse_failure_fallback():
    result, _, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": ["I think they are all fairly relevant!"],
            "synthesize": ["Uploads retry [1]."],
        },
        {"vector_search": [three_items()]},
        max_iterations=1,
    )
    assert result.state.evidence_scores == (0.5, 0.5, 0.5)
    events = [e for e in result.audit if e["event"] == "grader_parse_failure"]
    assert len(events) == 1 and events[0]["level"] == "warning"


def test_low_score_evidence_removed():
    items = three_items()
    result, _, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": [scores(0.9, 0.1, 0.8)],
            "synthesize": ["Answer [1] [2]."],
        },
        {"vector_search": [items]},
    )
    assert result.state.context == (items[0], items[2])
    assert result.state.evidence_scores == (0.9, 0.8)
    removed = [e for e in result.audit if e["event"] == "evidence_removed"]
    assert removed == [
        {"event": "evidence_removed", "source": items[1].label, "tool": "vector_search", "score": 0.1}
    ]
    assert items[1].source not in result.answer


def test_all_evidence_below_threshold():
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex"), route("complex")],
            "plan": [search_plan(), search_plan("uploads retry")],
            "grade_evidence": [scores(0.1, 0.2, 0.29), scores(0.0, 0.1, 0.2)],
        },
        {"vector_search": [three_items(), three_items(3)]},
        max_iterations=2,
    )
    # First round: every item below 0.3 -> RE_RETRIEVE back to analyze_and_route, not synthesis.
    assert result.trace[:5] == ("analyze_and_route", "plan", "tool_exec", "grade_evidence", "analyze_and_route")
    assert result.state.context == ()
    assert result.answer.startswith(NO_EVIDENCE)
    assert model.calls("synthesize") == 0


def test_high_quality_evidence_triggers_generate():
    result, _, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": [scores(0.9, 0.6, 0.7)],
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [three_items()]},
    )
    assert result.state.grader_action.value == "GENERATE"
    assert result.trace == ("analyze_and_route", "plan", "tool_exec", "grade_evidence", "synthesize")


def test_mixed_quality_evidence_triggers_refine():
    first = three_items()
    second = [item(7, score=0.5), item(8, score=0.5), item(9, score=0.5)]
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan(), search_plan("upload retry backoff")],
            "grade_evidence": [scores(0.5, 0.6, 0.2), scores(0.8, 0.9, 0.9, 0.8, 0.1)],
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [first, second]},
    )
    assert result.trace[3:6] == ("grade_evidence", "plan", "tool_exec")
    # The second grading saw the two survivors (score >= 0.3) plus the three new items.
    second_grade = [r for r in model.requests if r.node == "grade_evidence"][1]
    assert second_grade.task.items == (first[0], first[1], *second)
    # The REFINE round's plan was asked with the evidence retained so far.
    assert [r for r in model.requests if r.node == "plan"][1].task.evidence == (first[0], first[1])
    assert result.state.grader_action.value == "GENERATE"
    assert result.state.context == (first[0], first[1], second[0], second[1])


def test_poor_evidence_triggers_re_retrieve():
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex"), route("complex", ["vector_search", "grep_search"])],
            "plan": [search_plan(), search_plan("upload retries")],
            "grade_evidence": [scores(0.1, 0.0, 0.2), scores(0.9, 0.9, 0.9)],
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [three_items(), three_items(3)]},
    )
    grade_index = result.trace.index("grade_evidence")
    assert result.trace[grade_index + 1] == "analyze_and_route"
    assert model.calls("analyze_and_route") == 2
    assert result.state.grader_action.value == "GENERATE"


def test_max_iterations_reached_regardless_of_score():
    result, model, toolbox = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan(), search_plan("b")],
            "grade_evidence": [scores(0.5, 0.4, 0.35), scores(0.4, 0.45, 0.5, 0.3, 0.35, 0.31)],
            "synthesize": ["Weak answer [1]."],
        },
        {"vector_search": [three_items(), three_items(3)]},
        max_iterations=2,
    )
    assert result.iterations == 2
    assert len(toolbox.calls) == 2
    assert result.trace[-2:] == ("grade_evidence", "synthesize")
    assert result.state.grader_action.value == "REFINE"  # the cap, not the grader, ended the loop
    assert len(result.state.context) == 6  # whatever evidence is available, even low-scored
    assert "weak" in result.answer.lower()
    assert model.calls("synthesize") == 1
