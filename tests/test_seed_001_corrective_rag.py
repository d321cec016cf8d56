"""Seed 001 (corrective-rag with rule-based pre-filtering): one test per scenario."""

from __future__ import annotations

from crag import Agent, Settings
from crag.llm.scripted import ScriptedChatModel

from .fakes import FakeToolbox, item, plan, route, scores, search_plan


def run(replies, results, settings=None, tools=("vector_search", "grep_search", "read_file"),
        question="Where is the upload retry policy configured?"):
    model = ScriptedChatModel(replies)
    toolbox = FakeToolbox(results, question=question)
    agent = Agent(model, toolbox, settings or Settings())
    return agent.ask(question), model, toolbox


def fast_path_events(result):
    return [e for e in result.audit if e["event"] == "fast_path_hit"]


def test_rule_read_file_results_auto_approve():
    reads = [item(1, tool="read_file", score=None), item(2, tool="read_file", score=None), item(3, tool="read_file", score=None)]
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex", ["read_file"])],
            "plan": [plan(("read_file", {"path": "docs/page1.md"}), ("read_file", {"path": "docs/page2.md"}))],
            "synthesize": ["It is in the config [1]."],
        },
        {"read_file": [reads[:2], reads[2:]]},
        # The user points at the files: only the reads run (no search for the question besides).
        question="Where is the upload retry policy configured? See docs/page1.md and docs/page2.md",
    )
    assert model.calls("grade_evidence") == 0
    assert result.state.grader_action.value == "GENERATE"
    assert result.state.evidence_scores == (1.0, 1.0, 1.0)
    assert fast_path_events(result)[0]["rule_name"] == "read_file"


def test_rule_few_context_items_auto_approve():
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [[item(1, score=0.1), item(2, score=0.2)]]},
    )
    assert model.calls("grade_evidence") == 0
    assert result.state.grader_action.value == "GENERATE"
    assert result.state.evidence_scores == (1.0, 1.0)
    assert fast_path_events(result) == [{"event": "fast_path_hit", "rule_name": "few_context", "items": 2}]


def test_rule_high_vector_score_auto_approve():
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [[item(1, score=0.95), item(2, score=0.8), item(3, score=0.81)]]},
    )
    assert model.calls("grade_evidence") == 0
    assert result.state.evidence_scores == (1.0, 1.0, 1.0)
    assert fast_path_events(result)[0]["rule_name"] == "high_vector_score"


def test_no_rule_matched_fall_through_to_llm_grading():
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": [scores(0.9, 0.8, 0.7)],
            "synthesize": ["Answer [1]."],
        },
        # One item below 0.8 breaks high_vector_score; 3 items > 2 breaks few_context.
        {"vector_search": [[item(1, score=0.95), item(2, score=0.79), item(3, score=0.9)]]},
    )
    assert model.calls("grade_evidence") == 1
    assert fast_path_events(result) == []
    assert result.state.evidence_scores == (0.9, 0.8, 0.7)


def test_batch_relevance_grading():
    items = [item(k, score=0.5) for k in range(1, 5)]
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": [scores(1.0, 0.9, 0.8, 0.7)],
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [items]},
    )
    assert model.calls("grade_evidence") == 1
    assert model.requests[-2].task.items == tuple(items)
    assert result.state.evidence_scores == (1.0, 0.9, 0.8, 0.7)


def test_grading_with_parse_failure_fallback():
    result, _, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": ["[0.9, 0.8]"],  # two scores for three items
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [[item(k, score=0.5) for k in (1, 2, 3)]]},
        Settings(max_iterations=1),
    )
    assert result.state.evidence_scores == (0.5, 0.5, 0.5)
    assert any(e["event"] == "grader_parse_failure" for e in result.audit)


def test_low_score_evidence_removed():
    items = [item(k, score=0.5) for k in (1, 2, 3)]
    result, _, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": [scores(0.29, 0.9, 0.9)],
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [items]},
    )
    assert items[0] not in result.state.context
    assert [e["source"] for e in result.audit if e["event"] == "evidence_removed"] == [items[0].label]


def test_all_evidence_below_threshold():
    result, model, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": [scores(0.1, 0.1, 0.1)],
        },
        {"vector_search": [[item(k, score=0.5) for k in (1, 2, 3)]]},
        Settings(max_iterations=1),
    )
    assert result.state.grader_action.value == "RE_RETRIEVE"
    assert model.calls("synthesize") == 0  # no synthesis over no evidence


def test_high_quality_evidence_triggers_generate():
    result, _, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan()],
            "grade_evidence": [scores(0.7, 0.7, 0.7)],
            "synthesize": ["Answer [1]."],
        },
        {"vector_search": [[item(k, score=0.5) for k in (1, 2, 3)]]},
    )
    assert result.state.grader_action.value == "GENERATE"  # mean exactly 0.7 is enough
    assert result.trace[-2:] == ("grade_evidence", "synthesize")


def test_mixed_quality_evidence_triggers_refine():
    result, _, _ = run(
        {
            "analyze_and_route": [route("complex")],
            "plan": [search_plan(), search_plan("retry config")],
            "grade_evidence": [scores(0.3, 0.69, 0.1), scores(0.5, 0.5)],
            "synthesize": ["A [1]."],
        },
        {"vector_search": [[item(k, score=0.5) for k in (1, 2, 3)]]},
        Settings(max_iterations=2, auto_approve_max_items=0),
    )
    grade_at = result.trace.index("grade_evidence")
    assert result.trace[grade_at + 1] == "plan"
    assert result.state.context[:2] == (item(1, score=0.5), item(2, score=0.5))


def test_poor_evidence_triggers_re_retrieve():
    result, _, _ = run(
        {
            "analyze_and_route": [route("complex"), route("complex")],
            "plan": [search_plan(), search_plan()],
            "grade_evidence": [scores(0.0, 0.0, 0.0)],
        },
        {"vector_search": [[item(k, score=0.5) for k in (1, 2, 3)]]},
        Settings(max_iterations=2),
    )
    assert result.trace[3:5] == ("grade_evidence", "analyze_and_route")


def test_max_iterations_reached_regardless_of_score():
    settings = Settings(max_iterations=3, auto_approve_max_items=0)
    result, _, toolbox = run(
        {
            "analyze_and_route": [route("complex")] * 3,
            "plan": [search_plan()] * 3,
            "grade_evidence": [scores(0.0)] * 3,
        },
        {"vector_search": [[item(k, score=0.5)] for k in (1, 2, 3)]},
        settings,
    )
    assert len(toolbox.calls) == 3
    assert result.iterations == 3
    assert result.trace[-1] == "synthesize"


def test_vector_score_threshold_from_environment(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("KB_AGENT_VECTOR_SCORE_THRESHOLD=0.6\n")
    settings = Settings.from_env(environ={}, dotenv=env_file)
    assert settings.vector_score_threshold == 0.6
    assert Settings.from_env(environ={}, dotenv=tmp_path / "missing.env").vector_score_threshold == 0.8
    result, model, _ = run(
        {"analyze_and_route": [route("complex")], "plan": [search_plan()], "synthesize": ["A [1]."]},
        {"vector_search": [[item(k, score=0.65) for k in (1, 2, 3)]]},
        settings,
    )
    assert model.calls("grade_evidence") == 0
    assert fast_path_events(result)[0]["rule_name"] == "high_vector_score"


def test_auto_approve_max_items_from_environment(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("KB_AGENT_AUTO_APPROVE_MAX_ITEMS=4\n")
    settings = Settings.from_env(environ={}, dotenv=env_file)
    assert settings.auto_approve_max_items == 4
    assert Settings.from_env(environ={}, dotenv=tmp_path / "missing.env").auto_approve_max_items == 2
    result, model, _ = run(
        {"analyze_and_route": [route("complex")], "plan": [search_plan()], "synthesize": ["A [1]."]},
        {"vector_search": [[item(k, score=0.1) for k in (1, 2, 3, 4)]]},
        settings,
    )
    assert model.calls("grade_evidence") == 0
    assert fast_path_events(result)[0]["rule_name"] == "few_context"
