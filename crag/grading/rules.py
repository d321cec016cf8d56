"""The grading decision: one ordered table of rules, one function, a verdict that names its rule.

``verdict(case, policy)`` takes what one ``grade_evidence`` step knows (``GradeCase``: the
items, the fast-path rule ``prepare`` found, how many items the prompt had no room for, the
reading of the grader's reply, the grades remembered from earlier rounds, retrieval's facts,
the thresholds) and returns a ``GradeVerdict``: the action, the items kept and removed, one
score per item, the audit events, and the ``GradeRule`` that decided. ``RULES`` is tried in
order; the first row that applies decides:

====================  ======  ===============================================  ============
rule                  seeds'  applies when                                     action
====================  ======  ===============================================  ============
``no_context``        yes     no item to grade                                 RE_RETRIEVE
``fast_path``         yes     a fast-path rule matched (``rule_name`` says)    GENERATE
``all_trimmed``       yes     the grading prompt had room for no item          RE_RETRIEVE
``uninformative``     policy  a probability reading carries no information     retrieval's
``none_left``         yes     every item scored below the drop threshold       RE_RETRIEVE
``term_missing``      policy  a probability reading, the first round, and the  REFINE
                              question names a term no kept item holds
``undecided``         policy  no kept probability grade reached the generate   retrieval's
                              threshold (or, leaving the undecided ones out    (GENERATE
                              of the mean, the decided ones' mean changed the  when some
                              seeds' action)                                   are decided)
``mean_high``         yes     mean of the kept scores >= the generate threshold  GENERATE
``mean_low``          yes     otherwise                                        REFINE
====================  ======  ===============================================  ============

Before the table, the scores are read: a reply that is not exactly N numbers or N labels is
the seeds' parse failure (every item 0.5, audit ``grader_parse_failure``); labels whose token
probabilities do not line up with the reply's text are read from the text (audit
``logprobs_unaligned``); a number list is
always numbers, decided by the seeds' rows; the policy's rows (and its ``first_label``
spare, which keeps a batch's first item read below the drop threshold, as ungraded: 0.5, so
that no item below it stays in context; with a drop threshold above 0.5 nothing is spared)
apply only to grades read through token probabilities (``Reading.from_logprobs``, and with grade
memory every remembered grade deciding too: ``Grade.from_logprobs``).
"Retrieval's" action: ``GENERATE``
when an item came from the question's own search, or retrieval scored it at least the drop
threshold, or it is a literal match with no retrieval score; else ``REFINE``; and ``REFINE``
in the first round when the question names a term no item holds (with ``named_terms``).
The ``term_missing`` row asks it of the items the grades keep: an answer from them would say
that none mentions the term (``crag.nodes.synthesize``), so the round searches again first.

With the ``seed`` policy every policy row is off and the decision is exactly the seeds' rule.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Mapping, Sequence

from attrs import field, frozen

from ..grounding.asked import absent
from ..prompts.grades import Reading
from ..state import AuditEvent, EvidenceItem, Grade, GradedBy, GraderAction
from .fast_path import EPS
from .memory import merge_scores, remembered_from_logprobs
from .policy import GradingPolicy

__all__ = [
    "PARSE_FAILURE_SCORE",
    "RULES",
    "UNGRADED_SCORE",
    "Decision",
    "Facts",
    "GradeCase",
    "GradeRule",
    "GradeVerdict",
    "GradedBy",
    "Rule",
    "decide",
    "mean",
    "ungraded_score",
    "uninformative",
    "verdict",
]

PARSE_FAILURE_SCORE = 0.5
UNGRADED_SCORE = PARSE_FAILURE_SCORE  # what an item the grader did not inform about is worth


def ungraded_score(drop_threshold: float) -> float:
    """The score of the items an uninformative reading keeps without a grade: ``UNGRADED_SCORE``,
    or the drop threshold when that is higher, so that no item in context scores below it (seed
    000). It decides nothing: the ``uninformative`` row's action comes from retrieval."""
    return max(UNGRADED_SCORE, drop_threshold)


class GradeRule(enum.StrEnum):
    """The row of ``RULES`` that decided a grading (``GradeVerdict.rule``)."""

    NO_CONTEXT = "no_context"
    FAST_PATH = "fast_path"
    ALL_TRIMMED = "all_trimmed"
    UNINFORMATIVE = "uninformative"
    NONE_LEFT = "none_left"
    TERM_MISSING = "term_missing"
    UNDECIDED = "undecided"
    MEAN_HIGH = "mean_high"
    MEAN_LOW = "mean_low"


def mean(scores: Sequence[float]) -> float:
    return math.fsum(scores) / len(scores) if scores else 0.0


# --------------------------------------------------------------------------------------
# The seeds' arithmetic
# --------------------------------------------------------------------------------------


@frozen
class Decision:
    """Which items stay (indices into the graded list) and what to do next."""

    kept: tuple[int, ...]
    removed: tuple[int, ...]
    action: GraderAction
    mean: float


def decide(scores: Sequence[float], drop_threshold: float, generate_threshold: float,
           unsure: GraderAction | None = None, spared: Collection[int] = ()) -> Decision:
    """The seeds' rule: filter by ``drop_threshold``, then GENERATE / REFINE / RE_RETRIEVE by the mean.

    ``unsure`` (the ``undecided`` policy row): the action when no kept item reached
    ``generate_threshold``; the mean is then over the kept items at or above it alone.
    ``spared``: indices kept whatever their score (the ``first_label`` policy)."""
    kept = tuple(i for i, s in enumerate(scores) if s >= drop_threshold - EPS or i in spared)
    removed = tuple(i for i, s in enumerate(scores) if s < drop_threshold - EPS and i not in spared)
    if not kept:
        return Decision(kept, removed, GraderAction.RE_RETRIEVE, 0.0)
    counted = kept
    if unsure is not None:
        counted = tuple(i for i in kept if scores[i] >= generate_threshold - EPS)
        if not counted:
            return Decision(kept, removed, unsure, mean([scores[i] for i in kept]))
    avg = mean([scores[i] for i in counted])
    action = GraderAction.GENERATE if avg >= generate_threshold - EPS else GraderAction.REFINE
    return Decision(kept, removed, action, avg)


# --------------------------------------------------------------------------------------
# What a probability reading can show
# --------------------------------------------------------------------------------------


def uninformative(scores: Sequence[float], tosses: int = 0, labels: Sequence[str] = (), sure: int = 0,
                  min_items: int = 4) -> str | None:
    """Why a grade read through token probabilities carries no information, or None:
    ``coin_toss`` (every item's P(yes) near even: ``tosses`` of them), ``same_score`` (every one
    of at least ``min_items`` items given one probability, to two decimals, not a sure one for
    each: a model sure that no item answers has said so) or ``same_label``
    (every one of that many given one label, ``labels``, without the model being sure of each:
    ``sure`` counts the sure ones; a small model copies its first label down the list; a
    pointwise reading has no list and so no ``labels``: ``crag.prompts.read_replies``).

    Only a probability reading can show this: a reply of numbers is the seeds' protocol and
    says what it says (the verdict never asks this of one)."""
    if not scores:
        return None
    if tosses >= len(scores):
        return "coin_toss"
    if len(scores) >= min_items and len({round(s, 2) for s in scores}) == 1 and sure < len(scores):
        return "same_score"
    if len(labels) >= min_items and len(set(labels)) == 1 and sure < len(labels):
        return "same_label"
    return None


def _tosses(scores: Sequence[float], margin: float) -> int:
    return sum(abs(s - 0.5) < margin for s in scores)


def _sure(scores: Sequence[float], sure: float) -> int:
    return sum(max(s, 1.0 - s) >= sure - EPS for s in scores)


# --------------------------------------------------------------------------------------
# The case, the verdict, the table
# --------------------------------------------------------------------------------------


@frozen
class Facts:
    """What retrieval knows about the items, for the policy rows' action: ``own`` the keys of
    items the question's own search returned; ``recorded`` the vector score recorded for an
    item's key (none: a literal match, a grep hit or lines read); ``named`` the terms the
    question names (``crag.grounding.named``); ``first_round`` whether this is the first
    round's grading (no search has been refined yet)."""

    own: frozenset[tuple] = frozenset()
    recorded: Mapping[tuple, float] = field(factory=dict)
    named: tuple[str, ...] = ()
    first_round: bool = True

    def search_again(self, items: Sequence[EvidenceItem]) -> tuple[str, ...]:
        """The named terms none of ``items`` holds, in the first round (later: none): what
        sends the round back to search under ``named_terms``."""
        if not (self.named and self.first_round):
            return ()
        return tuple(absent(self.named, [item.text for item in items]))

    def action(self, items: Sequence[EvidenceItem], drop_threshold: float,
               named_terms: bool = False) -> GraderAction:
        if named_terms and self.search_again(items):
            return GraderAction.REFINE
        for item in items:
            scored = self.recorded.get(item.key)
            if item.key in self.own or scored is None or scored >= drop_threshold - EPS:
                return GraderAction.GENERATE
        return GraderAction.REFINE


@frozen
class GradeCase:
    """What one grading step knows (see the module doc).

    ``items``: the context left once the items the prompt had no room for (``trimmed`` of
    them) are out. ``todo``: indices into ``items`` of the items sent to the grader; the others
    keep their ``remembered`` grade. ``reading``: the reply read into scores for ``todo``, None
    for a parse failure (or when nothing was sent). ``fast_path``: the fast-path rule that
    approved the context without a call. ``batch``: the grade came from one batched request
    (the ``first_label`` spare applies to nothing else)."""

    items: tuple[EvidenceItem, ...] = ()
    drop_threshold: float = 0.3
    generate_threshold: float = 0.7
    fast_path: str | None = None
    trimmed: int = 0
    todo: tuple[int, ...] = ()
    reading: Reading | None = None
    remembered: tuple[Grade, ...] = ()
    facts: Facts = field(factory=Facts)
    batch: bool = True


@frozen
class GradeVerdict:
    """The outcome of a grading: ``scores`` one per ``GradeCase.items`` entry (before the
    filter); ``kept`` / ``removed`` indices into them; ``events`` the audit events in order;
    ``graded`` the new grades to remember; ``rule`` the row that decided."""

    rule: GradeRule
    action: GraderAction
    graded_by: GradedBy | None
    kept: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    scores: tuple[float, ...] = ()
    events: tuple[AuditEvent, ...] = ()
    graded: tuple[Grade, ...] = ()


@frozen
class Rule:
    """One row of ``RULES``: its name, whether it is the seeds' or a policy's (``policy``: the
    ``GradingPolicy`` field that switches it), when it applies, and the action it takes."""

    rule: GradeRule
    policy: str | None
    applies: Callable[[_Facts], bool]
    action: Callable[[_Facts], GraderAction]


class _Facts:
    """Everything the rows look at, computed once from a case and a policy."""

    def __init__(self, case: GradeCase, policy: GradingPolicy) -> None:
        self.case = case
        self.policy = policy
        self.parse_failure = self.probabilities = self.new_from_logprobs = self.undecided = False
        self.why: str | None = None
        self.scores: tuple[float, ...] = ()
        self.spared: tuple[int, ...] = ()
        self.read = 0.0  # the spared item's score as read
        self.missing: tuple[str, ...] = ()
        self.decision = Decision((), (), GraderAction.RE_RETRIEVE, 0.0)
        self.seeds_action = GraderAction.RE_RETRIEVE
        if case.fast_path is None and case.items:
            self._grade(case, policy)

    def _grade(self, case: GradeCase, policy: GradingPolicy) -> None:
        reading = case.reading
        self.parse_failure = bool(case.todo) and reading is None
        if self.parse_failure or not case.todo:
            new: tuple[float, ...] = (PARSE_FAILURE_SCORE,) * len(case.todo)
        else:
            new = reading.scores
        read = self.new_from_logprobs = reading is not None and reading.from_logprobs and bool(case.todo)
        # with grade memory the remembered grades count as they were read: the policy's rules
        # apply when every grade deciding was read through token probabilities
        others = [item for i, item in enumerate(case.items) if i not in case.todo]
        self.probabilities = (read or not case.todo) and remembered_from_logprobs(others, case.remembered)
        if read and policy.uninformative:
            self.why = uninformative(new, _tosses(new, policy.toss_margin), reading.labels,
                                     _sure(new, policy.sure), policy.min_items)
        self.scores = merge_scores(case.items, case.remembered, case.todo, new)
        first = case.todo[0] if case.todo else None
        if (self.probabilities and policy.first_label and case.batch and first is not None
                and self.scores[first] < case.drop_threshold - EPS and len(new) > 1
                and new[0] > 1.0 - policy.sure + EPS and case.drop_threshold <= UNGRADED_SCORE + EPS):
            self.spared = (first,)
            self.read = self.scores[first]  # what the reading said, for the audit
            # kept, it is ungraded: no item scoring below the drop threshold stays in context (seed 000),
            # which is why there is no spare when the drop threshold is above the ungraded score
            self.scores = (*self.scores[:first], UNGRADED_SCORE, *self.scores[first + 1:])
        self.undecided = self.probabilities and policy.undecided
        unsure = case.facts.action(case.items, case.drop_threshold, policy.named_terms) if self.undecided else None
        self.decision = decide(self.scores, case.drop_threshold, case.generate_threshold, unsure, self.spared)
        self.seeds_action = decide(self.scores, case.drop_threshold, case.generate_threshold, None,
                                   self.spared).action  # what the seeds' mean of every kept score says
        if self.probabilities and policy.named_terms:  # what the kept items leave unmentioned
            self.missing = case.facts.search_again([case.items[i] for i in self.decision.kept])


def _undecided_decides(f: _Facts) -> bool:
    """No kept grade was decided, or leaving the undecided ones out of the mean changed the
    seeds' action: the decision is the ``undecided`` row's, not the seeds' mean's."""
    d, case = f.decision, f.case
    if not (f.undecided and d.kept):
        return False
    return d.action is not f.seeds_action or not any(f.scores[i] >= case.generate_threshold - EPS for i in d.kept)


def _mean_high(f: _Facts) -> bool:
    return f.decision.action is GraderAction.GENERATE


RULES: tuple[Rule, ...] = (
    Rule(GradeRule.NO_CONTEXT, None, lambda f: not f.case.items and not f.case.trimmed,
         lambda f: GraderAction.RE_RETRIEVE),
    Rule(GradeRule.FAST_PATH, None, lambda f: f.case.fast_path is not None, lambda f: GraderAction.GENERATE),
    Rule(GradeRule.ALL_TRIMMED, None, lambda f: not f.case.items, lambda f: GraderAction.RE_RETRIEVE),
    Rule(GradeRule.UNINFORMATIVE, "uninformative", lambda f: f.why is not None,
         lambda f: f.case.facts.action(f.case.items, f.case.drop_threshold, f.policy.named_terms)),
    Rule(GradeRule.NONE_LEFT, None, lambda f: not f.decision.kept, lambda f: GraderAction.RE_RETRIEVE),
    Rule(GradeRule.TERM_MISSING, "named_terms", lambda f: f.probabilities and bool(f.missing),
         lambda f: GraderAction.REFINE),
    Rule(GradeRule.UNDECIDED, "undecided", _undecided_decides, lambda f: f.decision.action),
    Rule(GradeRule.MEAN_HIGH, None, _mean_high, lambda f: GraderAction.GENERATE),
    Rule(GradeRule.MEAN_LOW, None, lambda f: True, lambda f: GraderAction.REFINE),
)


def _event(name: str, **data: object) -> AuditEvent:
    return AuditEvent(name, data)


def verdict(case: GradeCase, policy: GradingPolicy) -> GradeVerdict:
    """The grading's outcome: the first row of ``RULES`` that applies decides (module doc)."""
    f = _Facts(case, policy)
    row = next(r for r in RULES if (r.policy is None or getattr(policy, r.policy)) and r.applies(f))
    action = row.action(f)
    items = case.items
    n = len(items)
    events: list[AuditEvent] = []
    if case.trimmed:
        events.append(_event("evidence_trimmed", node="grade_evidence", count=case.trimmed))
    decided = _event("grade_decided", rule=row.rule.value, action=action.value)
    if row.rule is GradeRule.NO_CONTEXT:
        return GradeVerdict(row.rule, action, None, events=(decided,))
    if row.rule is GradeRule.FAST_PATH:
        return GradeVerdict(row.rule, action, GradedBy.FAST_PATH, tuple(range(n)), (), (1.0,) * n,
                            (_event("fast_path_hit", rule_name=case.fast_path, items=n), decided))
    if row.rule is GradeRule.ALL_TRIMMED:
        return GradeVerdict(row.rule, action, None, events=(*events, decided))
    if case.reading is not None and case.reading.unaligned:  # read from the text instead: say so
        events.append(_event("logprobs_unaligned", level="warning", node="grade_evidence", items=len(case.todo)))
    missing = f.missing if row.rule is not GradeRule.UNINFORMATIVE else (
        case.facts.search_again(case.items) if f.probabilities and policy.named_terms else ())
    if missing:
        events.append(_event("question_terms_missing", node="grade_evidence", terms=list(missing)))
    if row.rule is GradeRule.UNINFORMATIVE:
        reading = case.reading
        events.append(_event("grader_uninformative", level="warning", items=len(case.todo), reason=f.why,
                             scores=list(reading.scores) if reading else [], from_logprobs=True))
        events.append(decided)
        # the items sent are ungraded; those graded in an earlier round keep their score (grade memory)
        kept_as = ungraded_score(case.drop_threshold)
        ungraded = merge_scores(items, case.remembered, case.todo, (kept_as,) * len(case.todo))
        return GradeVerdict(row.rule, action, GradedBy.UNGRADED, tuple(range(n)), (), ungraded, tuple(events))
    if f.parse_failure:
        events.append(_event("grader_parse_failure", level="warning", items=len(case.todo),
                             default_score=PARSE_FAILURE_SCORE))
    reused = n - len(case.todo)
    if reused:
        events.append(_event("grades_reused", items=reused, graded=len(case.todo)))
    if f.undecided:
        count = sum(case.drop_threshold - EPS <= s < case.generate_threshold - EPS for s in f.scores)
        if count:
            events.append(_event("grades_undecided", items=count))
    for i in f.spared:
        events.append(_event("first_label_spared", source=items[i].label, score=f.read, kept_as=f.scores[i]))
    d = f.decision
    events.append(decided)
    events.extend(_event("evidence_removed", source=items[i].label, tool=items[i].tool, score=f.scores[i])
                  for i in d.removed)
    graded = () if f.parse_failure else tuple(Grade.of(items[i], f.scores[i], f.new_from_logprobs) for i in case.todo)
    graded_by = GradedBy.PARSE_FAILURE if f.parse_failure else GradedBy.GRADER
    return GradeVerdict(row.rule, action, graded_by, d.kept, d.removed, tuple(float(s) for s in f.scores),
                        tuple(events), graded)
