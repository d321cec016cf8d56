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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve

from .. import budget, grading, prompts, schemas
from ..ports import GradeTask, LLMRequest
from ..state import AgentState, AuditEvent, Completion, EvidenceItem, Grade, GraderAction

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "grade_evidence"


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
    (indices into ``todo``)."""
    task = GradeTask(question=state.question, items=tuple(state.context[i] for i in todo))
    limit = schemas.grade_max_tokens(len(task.items))
    return budget.fit(task, limit, cfg.context_tokens, prompts.render, cfg.count_tokens, min_items=1)


def prepare(state: AgentState, cfg: NodeConfig) -> LLMRequest | None:
    if not state.context or _rule(state, cfg) is not None:
        return None
    todo = _to_grade(state.context, state, cfg)
    if not todo:
        return None
    fitted = _fit(state, cfg, todo)
    n = len(fitted.task.items)
    return LLMRequest(
        NAME,
        fitted.task,
        fitted.messages,
        max_tokens=schemas.grade_max_tokens(n),
        temperature=0.0,
        reply_schema=schemas.grade_schema(n),
    )


def apply(state: AgentState, reply: Completion | None, cfg: NodeConfig) -> AgentState:
    context = state.context
    if not context:
        return evolve(state, evidence_scores=(), grader_action=GraderAction.RE_RETRIEVE)
    rule = _rule(state, cfg)
    if rule is not None:
        return evolve(
            state,
            evidence_scores=(1.0,) * len(context),
            grader_action=GraderAction.GENERATE,
            audit=state.log("fast_path_hit", rule_name=rule, items=len(context)),
        )
    audit = state.audit
    todo = _to_grade(context, state, cfg)
    if todo:
        dropped = {todo[j] for j in _fit(state, cfg, todo).dropped}
        if dropped:  # left out of the grading prompt: they cannot be graded, so they leave context
            context = tuple(item for i, item in enumerate(context) if i not in dropped)
            audit = (*audit, AuditEvent("evidence_trimmed", {"node": NAME, "count": len(dropped)}))
            todo = _to_grade(context, state, cfg)
    if not context:
        return evolve(state, context=(), evidence_scores=(), grader_action=GraderAction.RE_RETRIEVE, audit=audit)
    graded: tuple[Grade, ...] = ()
    if not todo:
        new_scores: tuple[float, ...] = ()
    else:
        parsed = prompts.parse_scores(reply.text, len(todo)) if reply is not None else None
        if parsed is None:
            new_scores = (grading.PARSE_FAILURE_SCORE,) * len(todo)
            audit = (
                *audit,
                AuditEvent(
                    "grader_parse_failure",
                    {"level": "warning", "items": len(todo), "default_score": grading.PARSE_FAILURE_SCORE},
                ),
            )
        else:
            new_scores = parsed
            graded = tuple(Grade.of(context[i], s) for i, s in zip(todo, parsed))
    reused = len(context) - len(todo)
    if reused:
        audit = (*audit, AuditEvent("grades_reused", {"items": reused, "graded": len(todo)}))
    scores = grading.merge_scores(context, state.grades, todo, new_scores)
    decision = grading.decide(scores, cfg.drop_threshold, cfg.generate_threshold)
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
    )
