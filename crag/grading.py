"""The grading rules of ``grade_evidence``, as pure functions over data.

In this order (docs/wire-contract.md, "grade_evidence"):

1. no context items → ``RE_RETRIEVE`` (no LLM call);
2. fast-path rules, first match wins, no LLM call, every item scored 1.0, ``GENERATE``:
   ``read_file`` (every call of the current round was read_file), ``few_context``
   (N <= auto_approve_max_items), ``high_vector_score`` (every item came from vector_search
   with a recorded score >= the threshold);
3. otherwise one batched LLM call scores all N items; a reply that is not exactly N numbers
   in [0, 1] gives every item 0.5 (``grader_parse_failure``);
4. items below the drop threshold are removed; none left → ``RE_RETRIEVE``; mean of the
   rest >= the generate threshold → ``GENERATE``; otherwise ``REFINE``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from attrs import frozen

from .state import EvidenceItem, GraderAction, ToolRun

__all__ = [
    "FAST_PATH_RULES",
    "PARSE_FAILURE_SCORE",
    "Decision",
    "decide",
    "fast_path_rule",
    "mean",
    "recorded_vector_scores",
]

FAST_PATH_RULES = ("read_file", "few_context", "high_vector_score")  # in the order they are tried
READ_FILE, FEW_CONTEXT, HIGH_VECTOR_SCORE = FAST_PATH_RULES
PARSE_FAILURE_SCORE = 0.5
# Scores and means are compared with this much slack, so that 0.7 read from a reply or a
# setting is "at least 0.7" however the floating-point sum of the scores came out.
_EPS = 1e-9


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


def mean(scores: Sequence[float]) -> float:
    return math.fsum(scores) / len(scores) if scores else 0.0


@frozen
class Decision:
    """Which items stay (indices into the graded list) and what to do next."""

    kept: tuple[int, ...]
    removed: tuple[int, ...]
    action: GraderAction
    mean: float


def decide(scores: Sequence[float], drop_threshold: float, generate_threshold: float) -> Decision:
    """Filter by ``drop_threshold`` and choose GENERATE / REFINE / RE_RETRIEVE by the mean."""
    kept = tuple(i for i, s in enumerate(scores) if s >= drop_threshold - _EPS)
    removed = tuple(i for i, s in enumerate(scores) if s < drop_threshold - _EPS)
    if not kept:
        return Decision(kept, removed, GraderAction.RE_RETRIEVE, 0.0)
    avg = mean([scores[i] for i in kept])
    action = GraderAction.GENERATE if avg >= generate_threshold - _EPS else GraderAction.REFINE
    return Decision(kept, removed, action, avg)
