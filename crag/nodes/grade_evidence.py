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
``pointwise`` asks one request per item; ``scores`` asks for N numbers as JSON. A grade that
carries no information (``crag.grading.uninformative``) is audited ``grader_uninformative``:
nothing is removed, every item is scored ``UNGRADED_SCORE``, and the action comes from what
retrieval found (``grading.ungraded_action``); ``graded_by`` says so, and the answer says its
evidence was not graded.

``prepare`` decides everything but the grades (``Grading``: the fast-path rule, the items
the prompt has no room for, the items sent) and ``apply`` reads that plan with the reply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve, frozen

from .. import budget, grading, prompts, schemas
from ..ports import GradeTask, LLMRequest, LLMRequests, Step
from ..state import AgentState, AuditEvent, Completion, EvidenceItem, Grade, GraderAction

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "grade_evidence"
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
    )


def _to_grade(context: tuple[EvidenceItem, ...], state: AgentState, cfg: NodeConfig) -> tuple[int, ...]:
    """Indices of the context items this grading sends to the grader."""
    if cfg.grade_memory:
        return grading.ungraded(context, state.grades)
    return tuple(range(len(context)))


def _fit(state: AgentState, cfg: NodeConfig, todo: tuple[int, ...]) -> budget.Fitted:
    """The grading prompt within the context budget; items left out of it are ``dropped``
    (indices into ``todo``). A pointwise grader fits each item alone and leaves none out."""
    items = tuple(state.context[i] for i in todo)
    if cfg.grader == "pointwise":
        return budget.Fitted(GradeTask(state.question, items, cfg.grader), (), 0)
    task = GradeTask(question=state.question, items=items, style=cfg.grader)
    limit = schemas.grade_max_tokens(len(task.items))
    return budget.fit(task, limit, cfg.context_tokens, prompts.render, cfg.count_tokens, min_items=1)


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
        return Step()
    rule = _rule(state, cfg)
    if rule is not None:
        return Step(None, Grading(rule=rule))
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


def read_reply(reply: Completion | tuple[Completion, ...] | None, n: int, style: str) -> prompts.Reading | None:
    """The scores of a grading reply (one completion, or one per item for ``pointwise``)."""
    if reply is None:
        return None
    if isinstance(reply, tuple):
        readings = [prompts.read_grades(r.text, 1, r.logprobs) for r in reply]
        if len(readings) != n or any(r is None for r in readings):
            return None
        return prompts.Reading(
            tuple(r.scores[0] for r in readings if r is not None),
            from_logprobs=all(r is not None and r.from_logprobs for r in readings),
            tosses=sum(r.tosses for r in readings if r is not None),
        )
    return prompts.read_grades(reply.text, n, reply.logprobs)


def _informed(reply: Completion | tuple[Completion, ...] | None) -> bool:
    """Whether the grade came from a model that may fail to inform (an LLM); the offline
    backend's grade is computed from the question's keywords and says what it says."""
    replies = reply if isinstance(reply, tuple) else (reply,)
    return not all(r is not None and not r.billable for r in replies)


def apply(state: AgentState, step: Step, reply: Completion | tuple[Completion, ...] | None,
          cfg: NodeConfig) -> AgentState:
    plan: Grading | None = step.plan
    if plan is None:  # no context to grade
        return evolve(state, evidence_scores=(), grader_action=GraderAction.RE_RETRIEVE)
    if plan.rule is not None:
        return evolve(
            state,
            evidence_scores=(1.0,) * len(state.context),
            grader_action=GraderAction.GENERATE,
            audit=state.log("fast_path_hit", rule_name=plan.rule, items=len(state.context)),
            graded_by="fast_path",
        )
    audit = state.audit
    context, todo = plan.context, plan.todo
    if plan.trimmed:
        audit = (*audit, AuditEvent("evidence_trimmed", {"node": NAME, "count": plan.trimmed}))
    if not context:
        return evolve(state, context=(), evidence_scores=(), grader_action=GraderAction.RE_RETRIEVE, audit=audit)
    graded: tuple[Grade, ...] = ()
    graded_by = "grader"
    reading = None
    if not todo:
        new_scores: tuple[float, ...] = ()
    else:
        reading = read_reply(reply, len(todo), cfg.grader)
        why = (grading.uninformative(reading.scores, reading.tosses, reading.labels, reading.sure)
               if reading is not None else None)
        if reading is None:
            graded_by = "parse_failure"
            new_scores = (grading.PARSE_FAILURE_SCORE,) * len(todo)
            audit = (
                *audit,
                AuditEvent(
                    "grader_parse_failure",
                    {"level": "warning", "items": len(todo), "default_score": grading.PARSE_FAILURE_SCORE},
                ),
            )
        elif why is not None and _informed(reply):
            # no information: nothing is removed and no round is forced by this grade
            event = AuditEvent("grader_uninformative", {
                "level": "warning", "items": len(todo), "reason": why, "scores": list(reading.scores),
                "from_logprobs": reading.from_logprobs})
            keep = context
            action = grading.ungraded_action(keep, state.tool_history, state.question, cfg.drop_threshold, cfg.tools)
            return evolve(
                state,
                context=keep,
                evidence_scores=(grading.UNGRADED_SCORE,) * len(keep),
                grader_action=action,
                audit=(*audit, event),
                graded_by="ungraded",
            )
        else:
            new_scores = reading.scores
            graded = tuple(Grade.of(context[i], s) for i, s in zip(todo, reading.scores))
    reused = len(context) - len(todo)
    if reused:
        audit = (*audit, AuditEvent("grades_reused", {"items": reused, "graded": len(todo)}))
    scores = grading.merge_scores(context, state.grades, todo, new_scores)
    unsure = None  # probabilities: items between the thresholds are undecided (crag.grading)
    spared: tuple[int, ...] = ()
    if graded_by == "grader" and todo and reading is not None and reading.from_logprobs:
        unsure = grading.ungraded_action(context, state.tool_history, state.question, cfg.drop_threshold, cfg.tools)
        count = grading.undecided(scores, cfg.drop_threshold, cfg.generate_threshold)
        if count:
            audit = (*audit, AuditEvent("grades_undecided", {"items": count}))
        first = todo[0]
        if (cfg.grader == "batch" and scores[first] < cfg.drop_threshold
                and grading.first_label_spared(reading.scores, prompts.SURE)):
            spared = (first,)
            audit = (*audit, AuditEvent("first_label_spared", {"source": context[first].label,
                                                               "score": scores[first]}))
    decision = grading.decide(scores, cfg.drop_threshold, cfg.generate_threshold, unsure, spared)
    removed = tuple(
        AuditEvent(
            "evidence_removed",
            {"source": context[i].label, "tool": context[i].tool, "score": scores[i]},
        )
        for i in decision.removed
    )
    return evolve(
        state,
        context=tuple(context[i] for i in decision.kept),
        evidence_scores=tuple(float(scores[i]) for i in decision.kept),
        grader_action=decision.action,
        audit=audit + removed,
        removed=state.removed + tuple(Grade.of(context[i], scores[i]) for i in decision.removed),
        grades=grading.remember(state.grades, graded),
        graded_by=graded_by,
    )
