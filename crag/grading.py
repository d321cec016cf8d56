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

A grade must carry information (``uninformative``): a reply that gives every one of several
items the same score, or the same label without being sure of each, or whose token
probabilities show every item was a coin toss, says nothing about the items. It never
removes evidence or forces another round by itself: the items stay, each at
``UNGRADED_SCORE``, and the action comes from what crag does know (``ungraded_action``: the
question's own search found them, or retrieval scored them at least at the drop threshold →
``GENERATE``; otherwise ``REFINE``).

The same holds item by item for a grade read from token probabilities (``decide`` with
``unsure``): an item whose probability lies between the drop and the generate thresholds is
one the grader could not decide. It is kept (it is not below the drop threshold) and it
does not count in the mean that chooses the action; when no kept item was decided, the
action is ``ungraded_action``'s. Measured on a small model, such items were relevant and
irrelevant alike (docs/real-models.md, "Grading a real model").

``GRADERS`` are the styles of ``KB_AGENT_GRADER``: how the grade is asked for and read.

Two memories span the rounds of one question. Items the filter removed are remembered
(``AgentState.removed``) and ``tool_exec`` does not add them again (``skipped``). Every grade
a grader gave is remembered (``AgentState.grades``); with grade memory on, only the items
without one are sent to the grader (``ungraded``) and the decision is made over all items,
the earlier ones with their remembered scores (``merge_scores``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from attrs import frozen

from . import searches
from .state import EvidenceItem, Grade, GraderAction, ToolRun
from .toolspec import Tool, question_search

__all__ = [
    "FAST_PATH_RULES",
    "GRADERS",
    "PARSE_FAILURE_SCORE",
    "UNGRADED_SCORE",
    "UNINFORMATIVE_MIN_ITEMS",
    "Decision",
    "decide",
    "fast_path_rule",
    "first_label_spared",
    "mean",
    "merge_scores",
    "recorded_vector_scores",
    "remember",
    "skipped",
    "undecided",
    "ungraded",
    "ungraded_action",
    "uninformative",
]

FAST_PATH_RULES = ("read_file", "few_context", "high_vector_score")  # in the order they are tried
READ_FILE, FEW_CONTEXT, HIGH_VECTOR_SCORE = FAST_PATH_RULES
PARSE_FAILURE_SCORE = 0.5

# KB_AGENT_GRADER: style -> what it is (docs/real-models.md, "Grading a real model").
GRADERS = {
    "batch": "one request for all N items; one yes/no line per item, read from token probabilities",
    "pointwise": "one request per item; one yes/no, read from token probabilities",
    "scores": "one request for all N items; N numbers as JSON (structured output)",
}
# "Several" items: with three or fewer, one score for all is a plausible verdict (and the
# seed scenarios grade three items alike); the degenerate replies measured on small models
# gave one value to 5, 10 and 15 items.
UNINFORMATIVE_MIN_ITEMS = 4
UNGRADED_SCORE = PARSE_FAILURE_SCORE  # what an item the grader did not inform about is worth
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


def decide(scores: Sequence[float], drop_threshold: float, generate_threshold: float,
           unsure: GraderAction | None = None, spared: Collection[int] = ()) -> Decision:
    """Filter by ``drop_threshold`` and choose GENERATE / REFINE / RE_RETRIEVE by the mean.

    ``unsure`` (for scores read from token probabilities): the action when no kept item was
    decided; the mean is then over the kept items at or above ``generate_threshold`` alone,
    the others being ones the grader could not decide (see the module doc). ``spared``:
    indices kept whatever their score (``first_label_spared``)."""
    kept = tuple(i for i, s in enumerate(scores) if s >= drop_threshold - _EPS or i in spared)
    removed = tuple(i for i, s in enumerate(scores) if s < drop_threshold - _EPS and i not in spared)
    if not kept:
        return Decision(kept, removed, GraderAction.RE_RETRIEVE, 0.0)
    counted = kept
    if unsure is not None:
        counted = tuple(i for i in kept if scores[i] >= generate_threshold - _EPS)
        if not counted:
            return Decision(kept, removed, unsure, mean([scores[i] for i in kept]))
    avg = mean([scores[i] for i in counted])
    action = GraderAction.GENERATE if avg >= generate_threshold - _EPS else GraderAction.REFINE
    return Decision(kept, removed, action, avg)


def first_label_spared(scores: Sequence[float], sure: float) -> bool:
    """Whether the first item of a batch grading read from token probabilities is kept even
    below the drop threshold: it is, unless the grader was sure of its ``no`` (P(yes) at most
    1 - ``sure``).

    A small model writes ``no`` as its first label whatever the first passage says: on
    Qwen2.5-Coder-1.5B, P(yes) of the first item was 0.14-0.28 on each of six documentation
    questions (the question's best retrieval hit, the gold page's in five), and in five of the
    six the same passage moved to the end of the list read ``yes`` (docs/real-models.md). The first
    item is the question's own best hit, and a removal is never undone (``skipped``)."""
    return len(scores) > 1 and scores[0] > 1.0 - sure + _EPS


def undecided(scores: Sequence[float], drop_threshold: float, generate_threshold: float) -> int:
    """How many of ``scores`` lie between the two thresholds (kept, but not decided)."""
    return sum(drop_threshold - _EPS <= s < generate_threshold - _EPS for s in scores)


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


# --------------------------------------------------------------------------------------
# A grade that carries no information
# --------------------------------------------------------------------------------------


def uninformative(scores: Sequence[float], tosses: int = 0, labels: Sequence[str] = (), sure: int = 0) -> str | None:
    """Why a grade carries no information, or None when it does: ``same_score`` (every one of
    at least ``UNINFORMATIVE_MIN_ITEMS`` items given one score, to two decimals),
    ``same_label`` (every one of that many given one label, ``labels``, when the token
    probabilities show the model was not sure of every one of them: ``sure`` counts the sure
    ones; a small model copies its first label down the list) or ``coin_toss`` (the token
    probabilities of every item near even)."""
    if not scores:
        return None
    if tosses >= len(scores):
        return "coin_toss"
    if len(scores) >= UNINFORMATIVE_MIN_ITEMS and len({round(s, 2) for s in scores}) == 1:
        return "same_score"
    if len(labels) >= UNINFORMATIVE_MIN_ITEMS and len(set(labels)) == 1 and sure < len(labels):
        return "same_label"
    return None


def ungraded_action(
    context: Sequence[EvidenceItem],
    tool_history: Sequence[ToolRun],
    question: str,
    drop_threshold: float,
    tools: Sequence[Tool] = (),
) -> GraderAction:
    """The action when the grade carried no information, from what crag knows: ``GENERATE``
    when some item came from the search of the question itself (``tools``' question search),
    or retrieval scored it at least ``drop_threshold``, or it is a literal match with no
    retrieval score (a grep match, lines read); ``REFINE`` otherwise."""
    own: set[tuple] = set()
    call = question_search(tools, question, 1)
    if call is not None:
        carries = [name for name, value in call.args.items() if value == question]  # the argument holding it
        for run in tool_history:
            if run.call.tool == call.tool and any(
                    searches.same_query(run.call.args.get(name, ""), question) for name in carries):
                own.update(item.key for item in run.items)
    recorded = recorded_vector_scores(tool_history)
    for item in context:
        scored = recorded.get(item.key)
        if item.key in own or scored is None or scored >= drop_threshold - _EPS:
            return GraderAction.GENERATE
    return GraderAction.REFINE
