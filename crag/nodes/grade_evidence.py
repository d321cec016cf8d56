"""``grade_evidence``: score the accumulated context and decide what happens next.

The rules themselves live in ``crag.grading``; this node wires them to the state and the
audit log: ``fast_path_hit`` (with ``rule_name``), ``grader_parse_failure`` (a warning),
and one ``evidence_removed`` per item dropped, with its source and score. Afterwards
``evidence_scores[i]`` is the score of ``context[i]``.

By default every grading sends the whole context: the survivors of earlier rounds first, in
the order and rendering they had before, then this round's new items, so a server with
prefix caching reuses the survivors' part of the prompt. With grade memory on
(``KB_AGENT_GRADE_MEMORY=on``) only the items without a remembered grade are sent (no call
when there are none, audit ``grades_reused``), and the decision is made over all items.
Grades from a parse failure's default are not remembered: those items are sent again.

How the grade is asked for and read is ``KB_AGENT_GRADER`` (``crag.grading.GRADERS``): the
default ``batch`` asks in one request for a yes/no line per item and reads each item's score
from the reply's token probabilities where the server returns them (``crag.prompts.grades``);
``pointwise`` asks one request per item; ``scores`` asks for N numbers as JSON.

``prepare`` decides everything but the grades (``Grading``: the fast-path rule, the items
the prompt has no room for, the items sent); ``apply`` reads the reply and records what
``crag.grading.verdict`` decides from it under ``KB_AGENT_GRADING_POLICY`` (a reply of numbers:
the seeds' rule; the policy's rules apply only to grades read through token probabilities).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve, frozen

from .. import budget, grading, prompts, schemas, searches
from ..ports import GradeTask, LLMRequest, LLMRequests, Step
from ..state import AgentState, Completion, EvidenceItem, Grade

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "grade_evidence"
ASKS_MODEL = True  # listed in the usage block whenever it runs, with 0 calls when it asked none
TOP_LOGPROBS = 5  # alternatives per reply token asked for by the label styles


@frozen
class Grading:
    """What ``prepare`` decided, for ``apply``: the fast-path ``rule`` that approves the
    context without a grade (None: it is graded); else the ``context`` left once the items the
    grading prompt had no room for are out (``trimmed`` of them), and ``todo``, the indices
    into it of the items sent to the grader (none: every grade is remembered)."""

    rule: str | None = None
    context: tuple[EvidenceItem, ...] = ()
    trimmed: int = 0
    todo: tuple[int, ...] = ()


def _rule(state: AgentState, cfg: NodeConfig) -> str | None:
    return grading.fast_path_rule(
        state.context,
        state.tool_history,
        state.iteration,
        cfg.auto_approve_max_items,
        cfg.vector_score_threshold,
        cfg.tools,
    )


def _to_grade(context: tuple[EvidenceItem, ...], state: AgentState, cfg: NodeConfig) -> tuple[int, ...]:
    """Indices of the context items this grading sends to the grader."""
    if cfg.grade_memory:
        return grading.unremembered(context, state.grades)
    return tuple(range(len(context)))


def _fit(state: AgentState, cfg: NodeConfig, todo: tuple[int, ...]) -> budget.Fitted:
    """The grading prompt within the context budget; items left out of it are ``dropped``
    (indices into ``todo``). A pointwise grader fits each item alone and leaves none out."""
    items = tuple(state.context[i] for i in todo)
    if cfg.grader == "pointwise":
        return budget.Fitted(GradeTask(state.question, items, cfg.grader), (), 0)
    task = GradeTask(question=state.question, items=items, style=cfg.grader)

    def rank() -> list[int]:  # asked only when items must be left out: each call's best hits first
        return searches.retrieval_rank(items, state.tool_history)

    # the reply budget is that of the items the prompt keeps: those left out need no grade
    return budget.fit(task, schemas.grade_max_tokens, cfg.context_tokens, prompts.render, cfg.count_tokens, rank,
                      min_items=1)


def _request(task: GradeTask, messages: tuple[dict[str, str], ...]) -> LLMRequest:
    n = len(task.items)
    scores = task.style == "scores"
    return LLMRequest(
        NAME,
        task,
        messages,
        max_tokens=schemas.grade_max_tokens(n),
        temperature=0.0,
        reply_schema=schemas.grade_schema(n) if scores else None,  # constrained decoding flattens the probabilities
        logprobs=0 if scores else TOP_LOGPROBS,
    )


def prepare(state: AgentState, cfg: NodeConfig) -> Step:
    """The grading request (one, or one per item for ``pointwise``) with its ``Grading`` plan;
    no request when a fast-path rule approves the context or nothing needs a grade."""
    context = state.context
    if not context:
        return Step(None, Grading())
    rule = _rule(state, cfg)
    if rule is not None:
        return Step(None, Grading(rule=rule, context=context))
    todo = _to_grade(context, state, cfg)
    if not todo:
        return Step(None, Grading(context=context))
    fitted = _fit(state, cfg, todo)
    dropped = {todo[j] for j in fitted.dropped}
    if dropped:  # left out of the grading prompt: they cannot be graded, so they leave context
        context = tuple(item for i, item in enumerate(context) if i not in dropped)
        todo = _to_grade(context, state, cfg)
    plan = Grading(context=context, trimmed=len(dropped), todo=todo)
    if cfg.grader == "pointwise":
        requests = []
        for item in fitted.task.items:
            one = budget.fit(GradeTask(state.question, (item,), "pointwise"), schemas.grade_max_tokens(1),
                             cfg.context_tokens, prompts.render, cfg.count_tokens, min_items=1)
            requests.append(_request(one.task, one.messages))
        return Step(LLMRequests(tuple(requests)), plan)
    return Step(_request(fitted.task, fitted.messages), plan)


def read_reply(reply: Completion | tuple[Completion, ...] | None, n: int, style: str = "batch") -> prompts.Reading | None:
    """The scores of a grading reply (``crag.prompts.read_replies``)."""
    return prompts.read_replies(reply, n)


def apply(state: AgentState, step: Step, reply: Completion | tuple[Completion, ...] | None,
          cfg: NodeConfig) -> AgentState:
    """The state with ``crag.grading.verdict``'s outcome applied: it decides, this only records."""
    plan: Grading = step.plan or Grading()
    case = grading.GradeCase(
        items=plan.context,
        drop_threshold=cfg.drop_threshold,
        generate_threshold=cfg.generate_threshold,
        fast_path=plan.rule,
        trimmed=plan.trimmed,
        todo=plan.todo,
        reading=prompts.read_replies(reply, len(plan.todo)),
        remembered=state.grades,
        facts=grading.retrieval_facts(state.tool_history, state.question, cfg.tools, state.iteration),
        batch=cfg.grader == "batch",
    )
    verdict = grading.verdict(case, grading.POLICIES[cfg.grading_policy])
    context = plan.context
    return evolve(
        state,
        context=tuple(context[i] for i in verdict.kept),
        evidence_scores=tuple(verdict.scores[i] for i in verdict.kept),
        grader_action=verdict.action,
        audit=state.audit + verdict.events,
        removed=state.removed + tuple(Grade.of(context[i], verdict.scores[i]) for i in verdict.removed),
        grades=grading.remember(state.grades, verdict.graded),
        graded_by=verdict.graded_by,
    )
