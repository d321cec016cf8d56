"""``tool_exec``: run the planned calls and add what they found to ``context``.

Each call becomes one ``tool_history`` entry (with the round number, the items, or the
error). A failed call is audited (``tool_error``) and never becomes evidence. New items are
added to the survivors of earlier rounds, de-duplicated by source and line span; an item an
earlier grading removed is not added again (audit ``evidence_skipped``, with the score it
got): it would only be graded and dropped once more. The round is complete: ``iteration``
goes up by one, and the scores of the previous round are cleared because the next grading
decides over the whole context again.

A search repeated one page deeper keeps only what its earlier runs did not return, and a
tool with a ``match_cap`` (``grep_search``: 2) keeps at most that many times
``KB_AGENT_TOP_K`` matches, best files first (``grep_truncated`` when there were more); see
``crag.searches``. Audit events a tool
reports about its call (a ``glob`` dropped because it matched no file) are logged. When the
first round only reads files the question names and one of those reads finds nothing, the question's
own search runs after them (``ToolRequest.fallback``; audited ``question_searched``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attrs import evolve

from .. import grading, searches
from ..ports import Step, ToolOutcome, ToolRequest
from ..state import AgentState, AuditEvent, ToolCall, ToolRun
from ..toolspec import question_search

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "tool_exec"
ASKS_MODEL = False  # runs tools, never the model: not in the usage block


def prepare(state: AgentState, cfg: NodeConfig) -> Step:
    return Step(ToolRequest(state.tool_calls, fallback=_fallback(state, cfg)))


def _fallback(state: AgentState, cfg: NodeConfig) -> tuple[ToolCall, ...]:
    """The question's own search, when the first round only reads files the question names
    (``searches.with_question_search``): run if one of those reads finds nothing (lines the planner
    chose past a file's end), since the user pointed at a source and was not answered from it."""
    records = {t.name: t for t in cfg.tools}
    if state.iteration or not state.tool_calls or not all(
        c.tool in records and records[c.tool].path_arg for c in state.tool_calls
    ):
        return ()
    question = searches.searched_question(state.question, state.history)
    own = question_search(cfg.tools, question.strip() or question, cfg.top_k)
    return () if own is None else (own,)


def apply(state: AgentState, step: Step, reply: Sequence[ToolOutcome] | None, cfg: NodeConfig) -> AgentState:
    round_no = state.iteration + 1
    records = {t.name: t for t in cfg.tools}
    outcomes = tuple(reply or ())
    events: list[AuditEvent] = []
    runs = []
    for o in outcomes:
        if o.call in step.request.fallback and o.call not in state.tool_calls:  # a read found nothing
            query = o.call.args.get(records[o.call.tool].query_arg or "", "") if o.call.tool in records else ""
            events.append(AuditEvent("question_searched", {"query": str(query).strip(), "top_k": cfg.top_k}))
        events.extend(o.audit)
        if o.error is not None:
            events.append(AuditEvent("tool_error", {"tool": o.call.tool, "args": dict(o.call.args), "error": o.error}))
            runs.append(ToolRun(round_no, o.call, (), o.error))
            continue
        tool = records.get(o.call.tool)
        items = searches.unseen(o.call, o.items, state.tool_history, tool)
        if tool is not None and tool.match_cap:
            items, left_out = searches.cap_matches(items, tool.match_cap * cfg.top_k)
            left_out += o.more  # found by the tool past a cap of its own, never returned
            if left_out:
                events.append(
                    AuditEvent(
                        "grep_truncated",
                        {"pattern": o.call.args.get(tool.query_arg or ""), "matches": len(items) + left_out,
                         "kept": len(items)},
                    )
                )
        runs.append(ToolRun(round_no, o.call, items))
    seen = {item.key for item in state.context}
    dropped = grading.skipped([item for run in runs for item in run.items], state.removed)
    added = []
    for run in runs:
        for item in run.items:
            if item.key in seen:
                continue
            seen.add(item.key)
            if item.key in dropped:
                events.append(
                    AuditEvent(
                        "evidence_skipped",
                        {"source": item.label, "tool": item.tool, "score": dropped[item.key].score},
                    )
                )
            else:
                added.append(item)
    return evolve(
        state,
        iteration=round_no,
        tool_history=state.tool_history + tuple(runs),
        context=state.context + tuple(added),
        evidence_scores=(),
        graded_by=None,
        tool_calls=(),
        audit=(*state.audit, *events) if events else state.audit,
    )
