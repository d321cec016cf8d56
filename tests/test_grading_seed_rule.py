"""The seeds' rule is the decision for every numeric grading reply (seeds 000 and 001; SPEC §2).

For any reply of N numbers (N from 1 to 20, any values, all-equal ones included), at any
iteration and cap, ``grade_evidence`` followed by the graph does exactly what the seeds say:
items below 0.3 are removed (one ``evidence_removed`` each), none left → RE_RETRIEVE, mean of
the rest ≥ 0.7 → GENERATE, otherwise REFINE, the cap routes to synthesize with what is left;
a reply that is not N numbers gives every item 0.5 (``grader_parse_failure``). With the
``seed`` policy the same holds for labels read through token probabilities. Each rule beyond
the seeds' has its own test in tests/test_grader_styles.py; the node itself decides nothing
(the last test here).
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import textwrap

from hypothesis import given
from hypothesis import strategies as st

from crag import grading
from crag.config import Settings
from crag.graph import Node, next_node
from crag.nodes import NodeConfig, grade_evidence
from crag.state import AgentState, Completion, Complexity, GraderAction, RoutingPlan, TokenLogprob, ToolCall, ToolRun

from .fakes import item

DROP, GENERATE = 0.3, 0.7
grade = st.one_of(st.sampled_from([0.0, 0.1, 0.29, 0.3, 0.5, 0.69, 0.7, 0.9, 1.0]),
                  st.floats(0, 1, allow_nan=False).map(lambda x: round(x, 3)))


@st.composite
def replies(draw):
    """N grades: independent ones, or one value for all (the uniform replies seeds 000 and 001 name)."""
    n = draw(st.integers(1, 20))
    if draw(st.booleans()):
        return [draw(grade)] * n
    return draw(st.lists(grade, min_size=n, max_size=n))


def _state(n: int, iteration: int, retrieval_score: float = 0.2) -> AgentState:
    items = tuple(item(k, score=retrieval_score) for k in range(1, n + 1))
    return AgentState("What is the retry policy for uploads?", context=items, iteration=iteration,
                      tool_history=(ToolRun(iteration, ToolCall("vector_search", {"query": "retry policy"}), items),),
                      routing_plan=RoutingPlan(Complexity.COMPLEX, ("vector_search",)))


def _cfg(policy: str = "default", cap: int = 3) -> NodeConfig:
    return NodeConfig(Settings(auto_approve_max_items=0, vector_score_threshold=1.0, max_iterations=cap,
                               grading_policy=policy))


def _grade(state: AgentState, cfg: NodeConfig, reply: Completion) -> AgentState:
    step = grade_evidence.prepare(state, cfg)
    assert step.request is not None  # no fast path: one batched call
    return grade_evidence.apply(state, step, reply, cfg)


def _expect(state: AgentState, new: AgentState, values: list[float], cap: int, parse_failure: bool = False) -> None:
    """``new`` is what the seeds' rule makes of ``values`` for ``state``'s items."""
    kept = [i for i, s in enumerate(values) if s >= DROP]
    removed = [i for i, s in enumerate(values) if s < DROP]
    if not kept:
        action = GraderAction.RE_RETRIEVE
    elif math.fsum(values[i] for i in kept) / len(kept) >= GENERATE - 1e-9:
        action = GraderAction.GENERATE
    else:
        action = GraderAction.REFINE
    assert new.grader_action is action
    assert new.context == tuple(state.context[i] for i in kept)
    assert new.evidence_scores == tuple(values[i] for i in kept)
    events = [e for e in new.audit if e.event == "evidence_removed"]
    assert [e.fields["source"] for e in events] == [state.context[i].label for i in removed]
    assert [e.fields["score"] for e in events] == [values[i] for i in removed]
    failures = [e for e in new.audit if e.event == "grader_parse_failure"]
    assert len(failures) == int(parse_failure)
    assert not [e for e in new.audit if e.event in ("grader_uninformative", "grades_undecided", "first_label_spared")]
    decided = [e for e in new.audit if e.event == "grade_decided"]
    assert len(decided) == 1 and decided[0].fields["action"] == action.value
    where = next_node(Node.GRADE_EVIDENCE, new, cap)
    if state.iteration >= cap:
        assert where is Node.SYNTHESIZE
    else:
        assert where is {GraderAction.GENERATE: Node.SYNTHESIZE, GraderAction.REFINE: Node.PLAN,
                         GraderAction.RE_RETRIEVE: Node.ANALYZE_AND_ROUTE}[action]


@given(replies(), st.integers(1, 5), st.integers(1, 5), st.sampled_from(["default", "seed"]),
       st.sampled_from(["array", "object", "fenced"]))
def test_every_numeric_reply_is_decided_by_the_seeds_rule(values, iteration, cap, policy, shape):
    state = _state(len(values), iteration)
    text = {"array": json.dumps(values), "object": json.dumps({"scores": values}),
            "fenced": f"```json\n{json.dumps(values)}\n```"}[shape]
    new = _grade(state, _cfg(policy, cap), Completion(text, "m", prompt_tokens=10, completion_tokens=5))
    _expect(state, new, values, cap)


@given(st.integers(1, 20), st.integers(1, 5), st.integers(1, 5),
       st.sampled_from(["I think they are relevant", "[0.5]", "[1.5, 0.2]", ""]))
def test_a_reply_that_is_not_n_numbers_gives_every_item_half(n, iteration, cap, text):
    state = _state(n, iteration)
    if text == "[0.5]" and n == 1:
        text = "[0.5, 0.5]"
    new = _grade(state, _cfg("default", cap), Completion(text, "m"))
    _expect(state, new, [0.5] * n, cap, parse_failure=True)


def label_reply(p_yes: list[float]) -> Completion:
    """``1: yes`` / ``2: no`` ... whose label token at item k has P(yes) = p_yes[k]."""
    tokens = []
    for k, p in enumerate(p_yes, 1):
        if k > 1:
            tokens.append(TokenLogprob("\n", 0.0))
        top = tuple(sorted(((" yes", math.log(max(p, 1e-9))), (" no", math.log(max(1 - p, 1e-9)))), key=lambda t: -t[1]))
        tokens += [TokenLogprob(str(k), 0.0), TokenLogprob(":", 0.0), TokenLogprob(top[0][0], top[0][1], top)]
    return Completion("".join(t.token for t in tokens), "m", prompt_tokens=10, completion_tokens=len(tokens),
                      logprobs=tuple(tokens))


probability = st.one_of(st.sampled_from([0.02, 0.2, 0.45, 0.5, 0.55, 0.8, 0.98]), st.floats(0.001, 0.999))


@given(st.integers(1, 20).flatmap(lambda n: st.one_of(st.lists(probability, min_size=n, max_size=n),
                                                      probability.map(lambda p: [p] * n))),
       st.integers(1, 5), st.integers(1, 5))
def test_the_seed_policy_decides_label_grades_by_the_seeds_rule(p_yes, iteration, cap):
    state = _state(len(p_yes), iteration)
    reply = label_reply(p_yes)
    reading = grading_reading(reply, len(p_yes))
    assert reading.from_logprobs
    new = _grade(state, _cfg("seed", cap), reply)
    _expect(state, new, list(reading.scores), cap)


def grading_reading(reply: Completion, n: int):
    from crag.prompts import read_grades

    return read_grades(reply.text, n, reply.logprobs)


def test_labels_without_probabilities_are_the_seeds_zeros_and_ones():
    """``no`` x5 from a server that returns no token probabilities: all below 0.3 → RE_RETRIEVE."""
    state = _state(5, 1)
    new = _grade(state, _cfg("default"), Completion("1: no\n2: no\n3: no\n4: no\n5: no", "m"))
    _expect(state, new, [0.0] * 5, 3)


def test_the_node_applies_the_verdict_and_decides_nothing_itself():
    """``grade_evidence.apply`` has no branch of its own: every decision is ``grading.verdict``'s."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(grade_evidence.apply)))
    branches = [n for n in ast.walk(tree) if isinstance(n, ast.If | ast.IfExp | ast.Match | ast.While | ast.For)]
    assert branches == []
    assert "grading.verdict(" in inspect.getsource(grade_evidence.apply)


def test_the_grading_table_names_every_rule_once_and_marks_the_policys():
    rules = [row.rule for row in grading.RULES]
    assert rules == list(grading.GradeRule)
    assert {row.rule for row in grading.RULES if row.policy} == {grading.GradeRule.UNINFORMATIVE,
                                                                  grading.GradeRule.UNDECIDED,
                                                                  grading.GradeRule.TERM_MISSING}
    assert all(not getattr(grading.SEED, row.policy) for row in grading.RULES if row.policy)


def test_one_policy_per_grading_policy_setting():
    from crag.config import GradingPolicyName

    assert set(grading.POLICIES) == set(GradingPolicyName)
    assert all(grading.POLICIES[name].name == name for name in GradingPolicyName)


SEEDS_ROWS = {grading.GradeRule.NONE_LEFT, grading.GradeRule.MEAN_HIGH, grading.GradeRule.MEAN_LOW}


@given(st.integers(2, 12).flatmap(lambda n: st.lists(probability, min_size=n, max_size=n)), st.integers(1, 3))
def test_a_verdict_names_a_seeds_row_only_when_the_seeds_arithmetic_decided(p_yes, iteration):
    """SPEC §2: the verdict names the rule that decided. Under the default policy, leaving
    undecided grades out of the mean can turn the seeds' REFINE into GENERATE: that is the
    ``undecided`` row's doing, never ``mean_high``'s."""
    state = _state(len(p_yes), iteration)
    new = _grade(state, _cfg("default", 5), label_reply(p_yes))
    rule, action = next((e.fields["rule"], e.fields["action"]) for e in new.audit if e.event == "grade_decided")
    if rule in SEEDS_ROWS:
        kept = iter(new.evidence_scores)
        removed = iter(e.fields["score"] for e in new.audit if e.event == "evidence_removed")
        removed_keys = {e.fields["source"] for e in new.audit if e.event == "evidence_removed"}
        scores = [next(removed) if it.label in removed_keys else next(kept) for it in state.context]
        assert action == grading.decide(scores, DROP, GENERATE).action.value


def test_undecided_grades_left_out_of_the_mean_are_named_as_the_undecided_rule():
    state = _state(5, 1)
    for policy, expected in (("default", ("undecided", "GENERATE")), ("seed", ("mean_low", "REFINE"))):
        new = _grade(state, _cfg(policy), label_reply([0.9, 0.6, 0.5, 0.45, 0.1]))
        decided = [(e.fields["rule"], e.fields["action"]) for e in new.audit if e.event == "grade_decided"]
        assert decided == [expected]
