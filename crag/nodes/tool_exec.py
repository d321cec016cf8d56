"""``tool_exec``: run the planned calls and add what they found to ``context``.

Each call becomes one ``tool_history`` entry (with the round number, the items, or the
error). A failed call is audited (``tool_error``) and never becomes evidence. New items are
added to the survivors of earlier rounds, de-duplicated by source and line span. The round
is complete: ``iteration`` goes up by one, and the grades of the previous round are cleared
because the next grading scores the whole context again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attrs import evolve

from ..ports import ToolOutcome, ToolRequest
from ..state import AgentState, AuditEvent, ToolRun

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "tool_exec"


def prepare(state: AgentState, cfg: NodeConfig) -> ToolRequest:
    return ToolRequest(state.tool_calls)


def apply(state: AgentState, reply: Sequence[ToolOutcome] | None, cfg: NodeConfig) -> AgentState:
    round_no = state.iteration + 1
    outcomes = tuple(reply or ())
    runs = tuple(ToolRun(round_no, o.call, tuple(o.items), o.error) for o in outcomes)
    seen = {item.key for item in state.context}
    added = []
    for outcome in outcomes:
        if outcome.error is not None:
            continue
        for item in outcome.items:
            if item.key not in seen:
                seen.add(item.key)
                added.append(item)
    errors = tuple(
        AuditEvent("tool_error", {"tool": o.call.tool, "args": dict(o.call.args), "error": o.error})
        for o in outcomes
        if o.error is not None
    )
    return evolve(
        state,
        iteration=round_no,
        tool_history=state.tool_history + runs,
        context=state.context + tuple(added),
        evidence_scores=(),
        tool_calls=(),
        audit=state.audit + errors if errors else state.audit,
    )
