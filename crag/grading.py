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

Two memories span the rounds of one question. Items the filter removed are remembered
(``AgentState.removed``) and ``tool_exec`` does not add them again (``skipped``). Every grade
a grader gave is remembered (``AgentState.grades``); with grade memory on, only the items
without one are sent to the grader (``ungraded``) and the decision is made over all items,
the earlier ones with their remembered scores (``merge_scores``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from attrs import frozen

from .state import EvidenceItem, Grade, GraderAction, ToolRun

__all__ = [
    "FAST_PATH_RULES",
    "PARSE_FAILURE_SCORE",
    "Decision",
    "decide",
    "fast_path_rule",
    "mean",
    "merge_scores",
    "recorded_vector_scores",
    "remember",
    "skipped",
    "ungraded",
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


# --------------------------------------------------------------------------------------
# The memories across rounds
# --------------------------------------------------------------------------------------


def remember(grades: Sequence[Grade], new: Sequence[Grade]) -> tuple[Grade, ...]:
    """``grades`` with ``new`` added; a new grade of an item replaces its earlier one."""
    fresh = {g.key for g in new}
    return tuple(g for g in grades if g.key not in fresh) + tuple(new)


def skipped(items: Sequence[EvidenceItem], removed: Sequence[Grade]) -> dict[tuple, Grade]:
    """The items of ``items`` that an earlier grading removed, by key, with that grade."""
    by_key = {g.key: g for g in removed}
    return {item.key: by_key[item.key] for item in items if item.key in by_key}


def ungraded(context: Sequence[EvidenceItem], grades: Sequence[Grade]) -> tuple[int, ...]:
    """Indices of the ``context`` items that have no remembered grade."""
    known = {g.key for g in grades}
    return tuple(i for i, item in enumerate(context) if item.key not in known)


def merge_scores(
    context: Sequence[EvidenceItem],
    grades: Sequence[Grade],
    new: Sequence[int],
    new_scores: Sequence[float],
) -> tuple[float, ...]:
    """One score per ``context`` item: ``new_scores`` for the indices ``new`` (in order),
    the remembered grade for every other item."""
    if len(new) != len(new_scores):
        raise ValueError(f"{len(new_scores)} scores for {len(new)} new items")
    fresh = dict(zip(new, new_scores))
    known = {g.key: g.score for g in grades}
    return tuple(float(fresh[i]) if i in fresh else known[item.key] for i, item in enumerate(context))
