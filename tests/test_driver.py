"""The driver: the state after every step is the whole truth, so a run can be inspected, or
resumed, between any two steps."""

from __future__ import annotations

import attrs
import pytest

from crag import Settings
from crag.driver import Driver
from crag.graph import END, START, TRANSITIONS, Outcome
from crag.llm import OfflineChatModel
from crag.nodes import NodeConfig
from crag.state import AgentState, EvidenceItem, Usage
from crag.tools import builtin
from crag.toolspec import ToolResult

QUESTION = "How many times are failed uploads retried, and how do I change it?"
ITEMS = (
    EvidenceItem("vector_search", "docs/setup.md", "The client retries failed uploads three times.", 3, 3, score=0.4),
    EvidenceItem("vector_search", "docs/setup.md", "Set UPLOAD_RETRIES to change how often uploads are retried.", 9, 9,
                 score=0.35),
    EvidenceItem("vector_search", "docs/deploy.md", "Run the container with docker compose up.", 1, 1, score=0.3),
)


class SameToolbox:
    """Every call finds the same items: a run is the same however it is cut into steps."""

    def tools(self):
        return builtin("vector_search", "grep_search", "read_file")

    def run(self, call):
        return ToolResult(ITEMS)


def driver() -> Driver:
    toolbox = SameToolbox()
    return Driver(OfflineChatModel(), toolbox, NodeConfig(Settings(auto_approve_max_items=0), toolbox.tools()))


def start() -> AgentState:
    return AgentState(QUESTION, usage=Usage(model="offline"))


def without_latency(state: AgentState) -> AgentState:
    usage = attrs.evolve(state.usage, by_node={k: attrs.evolve(v, latency_ms=0.0) for k, v in state.usage.by_node.items()})
    answer = "\n".join(line for line in (state.answer or "").splitlines() if " ms" not in line)
    return attrs.evolve(state, usage=usage, answer=answer)


def steps() -> list[tuple[AgentState, object]]:
    """Every state of one run with the node that comes next."""
    d, state, node = driver(), start(), TRANSITIONS[START, Outcome.DONE]
    out = []
    while node is not END:
        state, node = d.step(state, node)
        out.append((state, node))
    return out


def test_the_state_after_every_step_holds_its_trace_and_usage():
    run = steps()
    assert len(run) >= 5 and run[-1][1] is END
    for n, (state, _) in enumerate(run, 1):
        assert len(state.trace) == n  # the node just run is in the trace, not only at the end
        assert set(state.usage.by_node) <= set(state.trace)
    final = run[-1][0]
    assert final.trace[-1] == "synthesize" and "LLM Usage Stats" in (final.answer or "")


@pytest.mark.parametrize("cut", range(1, 5))
def test_a_run_resumed_between_any_two_steps_ends_as_the_straight_run(cut):
    run = steps()
    middle, node = run[cut - 1]
    resumed = driver().resume(middle, node)  # another driver, from the state alone
    assert without_latency(resumed) == without_latency(run[-1][0])


def test_apply_reads_the_step_and_never_renders_or_counts_again():
    """What prepare fitted (the grading prompt, the answer's prompt) travels to apply in the
    step: apply counts no token, and trusts the plan it is handed."""
    from crag.nodes import grade_evidence, synthesize
    from crag.state import Completion

    counted: list[str] = []
    cfg = NodeConfig(Settings(auto_approve_max_items=0), builtin("vector_search"),
                     count_tokens=lambda text: counted.append(text) or len(text) // 3)
    state = AgentState(QUESTION, context=ITEMS, iteration=1)
    step = grade_evidence.prepare(state, cfg)
    assert counted and step.request is not None and step.plan.todo == (0, 1, 2)
    counted.clear()
    graded = grade_evidence.apply(state, step, Completion("[0.9, 0.8, 0.1]", "m"), cfg)
    assert counted == [] and graded.evidence_scores == (0.9, 0.8)
    answer_step = synthesize.prepare(graded, cfg)
    counted.clear()
    shown_one = attrs.evolve(answer_step, plan=attrs.evolve(answer_step.plan, task=attrs.evolve(
        answer_step.plan.task, items=graded.context[:1])))  # as if the prompt had room for one item
    done = synthesize.apply(graded, shown_one, Completion("Failed uploads are retried three times [1].", "m"), cfg)
    assert counted == [] and [c.path for c in done.citations] == ["docs/setup.md"]


def test_a_failure_among_several_requests_of_one_step_carries_the_calls_before_it():
    """A pointwise grader asks once per item; when the second request fails, the error says
    what the question had spent: the calls before it, the first grading request among them."""
    from crag.errors import LLMError
    from crag.graph import Node
    from crag.state import Completion, Complexity, RoutingPlan

    class FailsSecondGrade:
        model = "offline"

        def __init__(self) -> None:
            self.inner, self.grades = OfflineChatModel(), 0

        def complete(self, request, on_delta=None):
            if request.node == "grade_evidence":
                self.grades += 1
                if self.grades == 2:
                    raise LLMError("the server went away")
                return Completion(text="yes", model="m", prompt_tokens=40, completion_tokens=1)
            return self.inner.complete(request, on_delta)

    toolbox = SameToolbox()
    d = Driver(FailsSecondGrade(), toolbox, NodeConfig(Settings(auto_approve_max_items=0, grader="pointwise"),
                                                      toolbox.tools()))
    state = attrs.evolve(start(), routing_plan=RoutingPlan(Complexity.COMPLEX, ()), context=ITEMS)
    with pytest.raises(LLMError) as caught:
        d.step(state, Node.GRADE_EVIDENCE)
    assert caught.value.spent is not None
    assert caught.value.spent.by_node["grade_evidence"].calls == 1
    assert caught.value.spent.by_node["grade_evidence"].prompt_tokens == 40
