"""The two memories of grade_evidence across rounds (docs/architecture.md, "Grading").

1. An item the filter removed is not added again when a later round retrieves it
   (audit ``evidence_skipped``).
2. ``KB_AGENT_GRADE_MEMORY=on``: only items not graded before go to the grader (one batch,
   none when nothing is new); the decision is made over all items with their scores.
   ``off`` (the default) grades the whole context every round, survivors first in the same
   order and rendering, so the earlier prompt is a prefix of the new one up to the new items.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from crag import Agent, Settings
from crag.config import ConfigError
from crag.llm.scripted import ScriptedChatModel
from crag.nodes import NodeConfig, grade_evidence, tool_exec
from crag.ports import ToolOutcome
from crag.state import AgentState, Completion, Complexity, GraderAction, RoutingPlan, ToolCall

from .fakes import FakeToolbox, item, route, scores, search_plan
from .test_grader_styles import label_reply

QUESTION = "How do uploads retry and what limits apply?"


def run(grades, results, **kw):
    model = ScriptedChatModel(
        {
            "analyze_and_route": [route("complex")] * 3,
            # a different search each round (a repeated one would page past what it returned)
            "plan": [search_plan(QUESTION), search_plan("upload retry limits"), search_plan("retry backoff")],
            "grade_evidence": list(grades),
        },
        default={"synthesize": "Uploads retry [1]."},
    )
    agent = Agent(model, FakeToolbox({"vector_search": results}), Settings(**kw))
    return agent.ask(QUESTION), model


def grade_requests(model):
    return [r for r in model.requests if r.node == "grade_evidence"]


def events(result, name):
    return [e for e in result.audit if e["event"] == name]


# -- memory 1: removed items stay out ----------------------------------------------------


@pytest.mark.parametrize("memory", [False, True])
def test_an_item_removed_in_one_round_is_not_added_again_when_retrieved_again(memory):
    a, b, c, d, e = (item(n) for n in range(1, 6))
    result, model = run(
        [scores(0.6, 0.1, 0.5), scores(0.6, 0.5, 0.5) if not memory else scores(0.5)],
        [[a, b, c], [b, d, a], [e]],
        max_iterations=2,
        grade_memory=memory,
    )
    second = grade_requests(model)[1].task.items
    assert b not in second  # removed with 0.1 in round 1, retrieved again in round 2
    skipped = events(result, "evidence_skipped")
    assert [(s["source"], s["score"]) for s in skipped] == [(b.label, 0.1)]
    assert b not in result.state.context
    assert [e["source"] for e in events(result, "evidence_removed")] == [b.label]


# -- memory 2: KB_AGENT_GRADE_MEMORY -----------------------------------------------------


def test_memory_on_grades_only_new_items_and_decides_over_all_with_their_scores():
    a, b, c, d, e = (item(n) for n in range(1, 6))
    result, model = run(
        [scores(0.6, 0.5, 0.1), scores(0.95, 0.9)],
        [[a, b, c], [d, e]],
        grade_memory=True,
    )
    first, second = grade_requests(model)
    assert first.task.items == (a, b, c)
    assert second.task.items == (d, e)  # a and b keep 0.6 and 0.5; c was removed
    assert result.state.context == (a, b, d, e)
    assert result.state.evidence_scores == (0.6, 0.5, 0.95, 0.9)
    assert result.state.grader_action is GraderAction.GENERATE  # mean 0.7375 over all four
    assert events(result, "grades_reused") == [{"event": "grades_reused", "items": 2, "graded": 2}]


def test_memory_on_makes_no_grading_call_when_nothing_is_new():
    a, b, c = (item(n) for n in range(1, 4))
    result, model = run([scores(0.6, 0.5, 0.4)], [[a, b, c], [a, c]], max_iterations=2, grade_memory=True)
    assert len(grade_requests(model)) == 1
    assert result.state.trace.count("grade_evidence") == 2
    assert result.state.evidence_scores == (0.6, 0.5, 0.4)
    assert result.state.grader_action is GraderAction.REFINE


def test_memory_off_grades_the_whole_context_survivors_first_in_the_same_rendering():
    a, b, c, d = (item(n) for n in range(1, 5))
    result, model = run([scores(0.6, 0.1, 0.5), scores(0.9, 0.8, 0.9)], [[a, b, c], [d]])
    first, second = grade_requests(model)
    assert second.task.items == (a, c, d)
    assert second.messages[0] == first.messages[0]
    # The survivors a and c were [1] and [3]; now [1] and [2]: the shared prefix ends at a.
    head = first.messages[1]["content"].split("\n\n[2] ")[0]
    assert second.messages[1]["content"].startswith(head + "\n\n[2] " + c.label)
    assert result.state.evidence_scores == (0.9, 0.8, 0.9)


def test_memory_on_sends_parse_failure_items_again():
    a, b, c, d = (item(n) for n in range(1, 5))
    result, model = run(["no idea", scores(0.9, 0.8, 0.9, 0.7)], [[a, b, c], [d]], grade_memory=True)
    assert grade_requests(model)[1].task.items == (a, b, c, d)
    assert len(events(result, "grader_parse_failure")) == 1


def test_memory_on_keeps_remembered_scores_when_the_new_items_grade_carries_no_information():
    """The new items' coin-toss reading leaves them ungraded (0.5); the items graded in an
    earlier round keep their scores, index for index with the context."""
    a, b, c, d, e, f, g = (item(n) for n in range(1, 8))
    result, model = run([scores(0.6, 0.4, 0.1), label_reply(0.45, 0.55, 0.5, 0.52)], [[a, b, c], [d, e, f, g]],
                        max_iterations=2, grade_memory=True)
    assert grade_requests(model)[1].task.items == (d, e, f, g)
    assert [x["reason"] for x in events(result, "grader_uninformative")] == ["coin_toss"]
    assert result.state.context == (a, b, d, e, f, g)
    assert result.state.evidence_scores == (0.6, 0.4, 0.5, 0.5, 0.5, 0.5)


@pytest.mark.parametrize("memory", [False, True])
def test_remembered_probability_grades_are_decided_by_the_policy_when_nothing_is_new(memory):
    """Grades read through token probabilities stay such grades when remembered: a round with
    nothing new to grade (no call, grade memory on) decides them under the grading policy, as
    grading them again does (memory off), not by the seeds' mean alone."""
    a, b, c = (item(n, score=0.1) for n in range(1, 4))
    model = ScriptedChatModel(
        {
            "analyze_and_route": [route("complex")] * 2,
            "plan": [search_plan("retry backoff"), search_plan("upload limits")],
            "grade_evidence": [label_reply(0.65, 0.62, 0.1), label_reply(0.65, 0.62)],
        },
        default={"synthesize": "Uploads retry [1]."},
    )
    # the second search scores a at 0.5: retrieval's action is GENERATE for the undecided grades
    toolbox = FakeToolbox({"vector_search": [[a, b, c], [item(1, score=0.5)]]}, question=QUESTION)
    settings = Settings(max_iterations=2, grade_memory=memory, auto_approve_max_items=0)
    result = Agent(model, toolbox, settings).ask(QUESTION)
    assert len(grade_requests(model)) == (1 if memory else 2)
    decided = [(e["rule"], e["action"]) for e in events(result, "grade_decided")]
    assert decided == [("undecided", "REFINE"), ("undecided", "GENERATE")]
    assert result.state.evidence_scores == pytest.approx((0.65, 0.62), abs=1e-3)


def test_remembered_number_grades_keep_the_seeds_rule_when_new_items_are_read_from_probabilities():
    """A reply of numbers is decided by the seeds' rule: remembered, its grades still are, so
    a later round whose new items are read through token probabilities does not leave them
    out of the mean as undecided (0.5, 0.5, 0.5 with 0.95 and 0.9: mean 0.67, REFINE)."""
    a, b, c, d, e = (item(n) for n in range(1, 6))
    result, model = run([scores(0.5, 0.5, 0.5), label_reply(0.95, 0.9)], [[a, b, c], [d, e]],
                        max_iterations=2, grade_memory=True)
    assert grade_requests(model)[1].task.items == (d, e)
    assert result.state.evidence_scores == pytest.approx((0.5, 0.5, 0.5, 0.95, 0.9), abs=1e-3)
    decided = [(x["rule"], x["action"]) for x in events(result, "grade_decided")]
    assert decided == [("mean_low", "REFINE"), ("mean_low", "REFINE")]
    assert not events(result, "grades_undecided")
    # each grade remembers how it was read, whatever decided the round it was read in
    assert [g.from_logprobs for g in result.state.grades] == [False, False, False, True, True]


@pytest.mark.parametrize("raw, value", [("on", True), ("off", False), ("ON", True), ("", False)])
def test_grade_memory_setting(raw, value):
    assert Settings.from_env({"KB_AGENT_GRADE_MEMORY": raw}, dotenv=None).grade_memory is value


def test_a_bad_grade_memory_setting_names_the_variable():
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"KB_AGENT_GRADE_MEMORY": "sometimes"}, dotenv=None)
    assert "KB_AGENT_GRADE_MEMORY" in str(err.value) and "on or off" in str(err.value)


def test_grade_memory_is_off_by_default():
    assert Settings().grade_memory is False and NodeConfig(Settings()).grade_memory is False


# -- properties over whole runs of the two nodes -------------------------------------------

POOL = tuple(item(n) for n in range(1, 13))


@settings(max_examples=60, deadline=None)
@given(
    rounds=st.lists(st.lists(st.sampled_from(POOL), max_size=6), min_size=1, max_size=4),
    grades=st.dictionaries(st.sampled_from([i.key for i in POOL]), st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0])),
    memory=st.booleans(),
)
# four new items given one number after a remembered grade: numbers are graded, not uninformative
@example(rounds=[[POOL[0]], list(POOL[1:5])], grades={POOL[0].key: 0.8}, memory=True)
def test_rounds_of_tool_exec_and_grade_evidence_keep_both_memories(rounds, grades, memory):
    """Any retrieval sequence: a removed item never comes back; with memory on no item is
    sent twice (the replies are numbers, so every grade is remembered); with it off every
    grading sends the whole context, survivors first."""
    cfg = NodeConfig(Settings(auto_approve_max_items=0, vector_score_threshold=1.0, grade_memory=memory))
    state = AgentState(QUESTION, routing_plan=RoutingPlan(Complexity.COMPLEX, ("vector_search",)))
    sent: list = []
    for found in rounds:
        before = state.context
        state = tool_exec.apply(state, tool_exec.prepare(state, cfg), (ToolOutcome(ToolCall("vector_search"),
                                                                                   tuple(found)),), cfg)
        assert not {i.key for i in state.context} & {g.key for g in state.removed}
        step = grade_evidence.prepare(state, cfg)
        request = step.request
        if request is not None:
            items = request.task.items
            if not memory:
                assert items == state.context and items[: len(before)] == before
            given = [grades.get(i.key, 0.5) for i in items]
            # a reply of numbers is the seeds' protocol: always graded, never uninformative
            reply = Completion(scores(*given), "scripted")
            sent.extend(i.key for i in items)
        else:
            reply = None
            assert not state.context or memory
        state = grade_evidence.apply(state, step, reply, cfg)
        assert len(state.evidence_scores) == len(state.context)
        for it, s in zip(state.context, state.evidence_scores):
            assert s == grades.get(it.key, 0.5) and s >= 0.3
    if memory:
        assert len(sent) == len(set(sent))
