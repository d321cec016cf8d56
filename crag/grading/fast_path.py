"""The seeds' fast-path rules: evidence approved without a grading call (SPEC §2, step 2).

Checked in this order, first match wins: ``read_file`` (every call of the current round was
to a tool that ``reads_lines``), ``few_context`` (N <= ``KB_AGENT_AUTO_APPROVE_MAX_ITEMS``),
``high_vector_score`` (every item came from a tool with ``vector_scores`` and has a recorded
score at or above ``KB_AGENT_VECTOR_SCORE_THRESHOLD``). The rule names are the seeds' (they
name the built-in tools ``read_file`` and ``vector_search``); which tools a rule covers is a
field of the tool's record (``crag.toolspec.Tool``), never its name.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..state import EvidenceItem, ToolRun
from ..toolspec import Tool

__all__ = ["EPS", "FAST_PATH_RULES", "fast_path_rule", "recorded_vector_scores"]

FAST_PATH_RULES = ("read_file", "few_context", "high_vector_score")  # in the order they are tried
READ_FILE, FEW_CONTEXT, HIGH_VECTOR_SCORE = FAST_PATH_RULES
# Scores and means are compared with this much slack, so that 0.7 read from a reply or a
# setting is "at least 0.7" however the floating-point sum of the scores came out.
EPS = 1e-9
_EPS = EPS


def recorded_vector_scores(tool_history: Sequence[ToolRun], tools: Sequence[Tool]) -> dict[tuple, float]:
    """The score each item key got from a tool with ``vector_scores``, as recorded in ``tool_history``.

    When a chunk came back from several searches, its best score counts.
    """
    scored = {t.name for t in tools if t.vector_scores}
    scores: dict[tuple, float] = {}
    for run in tool_history:
        if run.call.tool not in scored:
            continue
        for item in run.items:
            if item.score is not None and item.score > scores.get(item.key, -1.0):
                scores[item.key] = item.score
    return scores


def fast_path_rule(
    context: Sequence[EvidenceItem],
    tool_history: Sequence[ToolRun],
    current_round: int,
    auto_approve_max_items: int,
    vector_score_threshold: float,
    tools: Sequence[Tool],
) -> str | None:
    """The name of the first fast-path rule that matches, or None. Assumes ``context`` is
    non-empty; ``tools`` are the records of the tools on offer."""
    reads_lines = {t.name for t in tools if t.reads_lines}
    vector_scored = {t.name for t in tools if t.vector_scores}
    round_tools = [run.call.tool for run in tool_history if run.round == current_round]
    if round_tools and all(tool in reads_lines for tool in round_tools):
        return READ_FILE
    if len(context) <= auto_approve_max_items:
        return FEW_CONTEXT
    if all(item.tool in vector_scored for item in context):
        recorded = recorded_vector_scores(tool_history, tools)
        if all(recorded.get(item.key, -1.0) >= vector_score_threshold - _EPS for item in context):
            return HIGH_VECTOR_SCORE
    return None
