"""The seeds' fast-path rules: evidence approved without a grading call (SPEC §2, step 2).

Checked in this order, first match wins: ``read_file`` (every call of the current round read
a file), ``few_context`` (N <= ``KB_AGENT_AUTO_APPROVE_MAX_ITEMS``), ``high_vector_score``
(every item came from vector_search with a recorded score at or above
``KB_AGENT_VECTOR_SCORE_THRESHOLD``). The rule names are the seeds'.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..state import EvidenceItem, ToolRun

__all__ = ["EPS", "FAST_PATH_RULES", "fast_path_rule", "recorded_vector_scores"]

FAST_PATH_RULES = ("read_file", "few_context", "high_vector_score")  # in the order they are tried
READ_FILE, FEW_CONTEXT, HIGH_VECTOR_SCORE = FAST_PATH_RULES
# Scores and means are compared with this much slack, so that 0.7 read from a reply or a
# setting is "at least 0.7" however the floating-point sum of the scores came out.
EPS = 1e-9
_EPS = EPS


def recorded_vector_scores(tool_history: Sequence[ToolRun]) -> dict[tuple, float]:
    """The score vector_search returned for each item key, as recorded in ``tool_history``.

    When a chunk came back from several searches, its best score counts.
    """
    scores: dict[tuple, float] = {}
    for run in tool_history:
        if run.call.tool != "vector_search":
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
) -> str | None:
    """The name of the first fast-path rule that matches, or None. Assumes ``context`` is non-empty."""
    round_tools = [run.call.tool for run in tool_history if run.round == current_round]
    if round_tools and all(tool == "read_file" for tool in round_tools):
        return READ_FILE
    if len(context) <= auto_approve_max_items:
        return FEW_CONTEXT
    if all(item.tool == "vector_search" for item in context):
        recorded = recorded_vector_scores(tool_history)
        if all(recorded.get(item.key, -1.0) >= vector_score_threshold - _EPS for item in context):
            return HIGH_VECTOR_SCORE
    return None
