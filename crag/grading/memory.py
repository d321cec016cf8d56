"""The two memories that span the rounds of one question (SPEC §2).

Items the filter removed are remembered (``AgentState.removed``) and ``tool_exec`` does not
add them again (``skipped``). Every grade a grader gave is remembered (``AgentState.grades``);
with grade memory on, only the items without one are sent to the grader (``unremembered``) and
the decision is made over all items, the earlier ones with their remembered scores
(``merge_scores``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..state import EvidenceItem, Grade

__all__ = ["merge_scores", "remember", "remembered_from_logprobs", "skipped", "unremembered"]


def remember(grades: Sequence[Grade], new: Sequence[Grade]) -> tuple[Grade, ...]:
    """``grades`` with ``new`` added; a new grade of an item replaces its earlier one."""
    fresh = {g.key for g in new}
    return tuple(g for g in grades if g.key not in fresh) + tuple(new)


def skipped(items: Sequence[EvidenceItem], removed: Sequence[Grade]) -> dict[tuple, Grade]:
    """The items of ``items`` that an earlier grading removed, by key, with that grade."""
    by_key = {g.key: g for g in removed}
    return {item.key: by_key[item.key] for item in items if item.key in by_key}


def unremembered(context: Sequence[EvidenceItem], grades: Sequence[Grade]) -> tuple[int, ...]:
    """Indices of the ``context`` items that have no remembered grade."""
    known = {g.key for g in grades}
    return tuple(i for i, item in enumerate(context) if item.key not in known)


def remembered_from_logprobs(context: Sequence[EvidenceItem], grades: Sequence[Grade]) -> bool:
    """Whether every ``context`` item has a remembered grade read through token probabilities
    (so none, for no item)."""
    read = {g.key for g in grades if g.from_logprobs}
    return all(item.key in read for item in context)


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
