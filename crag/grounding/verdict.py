"""The answer's verdict (SPEC §7): what an answer makes of its grounding report.

One function, ``judge``, used by ``synthesize`` (the verdict in the answer and ``--json``'s
``grounding.verdict``), the driver and the stream (``may_rewrite``: whether the verdict can
still replace the answer's opening, so a stream holds the answer back until it is whole;
asked of ``judge`` itself with the worst report a reply could get, never predicted apart).

In order, first match wins:

=================  =====================================================  ===============
rule               when                                                   verdict
=================  =====================================================  ===============
``not_judged``     no sentence of the answer was judged                   None
``term_missing``   the question names a term no evidence item holds       ``not_answered``
``addressed``      a sentence is supported, the passages the supported    ``answered``
                   sentences rest on address the question
                   (``crag.grounding.addresses``), the supported
                   sentences say something the question does not
                   (``crag.grounding.says_nothing_new``), and either at
                   least half the judged sentences are supported or
                   those passages hold two thirds of the question's words
                   (``crag.grounding.holds_focus``, their documents'
                   names counting)
``graded``         an informative grade approved the evidence             ``unsupported``
``ungraded``       otherwise (the simple path, a fast path, a grade that  ``not_answered``
                   carried no information)
=================  =====================================================  ===============

So a refusal opens an answer only when its evidence does not hold the answer: a right answer
with some unsupported sentences (its supported ones holding the question's focus) is ``answered`` (its unsupported sentences marked, or removed in
``strict``), and an answer whose supported sentences rest on a passage about something else is
not.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from ..state import GroundingReport

__all__ = ["Verdict", "judge", "may_rewrite"]


class Verdict(enum.StrEnum):
    ANSWERED = "answered"
    UNSUPPORTED = "unsupported"  # a grader approved the evidence, yet most sentences are unsupported
    NOT_ANSWERED = "not_answered"  # the answer opens by saying the knowledge base does not appear to answer


def judge(report: GroundingReport, graded: bool, absent: Sequence[str] = (), addressed: bool = True,
          held: bool = False) -> Verdict | None:
    """The verdict on an answer whose grounding gave ``report`` (see the module's table).
    ``graded``: an informative grade approved the evidence; ``absent``: the terms the question
    names that no evidence item holds (``crag.grounding.missing``); ``addressed``: the passages
    the supported sentences rest on address the question (``crag.grounding.addresses``) and
    those sentences do not only repeat it (``crag.grounding.says_nothing_new``);
    ``held``: they hold the question's focus (``crag.grounding.holds_focus``)."""
    if not report.sentences:
        return None
    if absent:
        return Verdict.NOT_ANSWERED
    if report.supported and addressed and (2 * report.supported >= report.sentences or held):
        return Verdict.ANSWERED
    return Verdict.UNSUPPORTED if graded else Verdict.NOT_ANSWERED


def may_rewrite(graded: bool, absent: Sequence[str] = ()) -> bool:
    """Whether some reply could get the verdict ``not_answered`` (which replaces its opening):
    ``judge`` asked with the worst report, one judged sentence and none supported."""
    return judge(GroundingReport(sentences=1, supported=0), graded, absent) is Verdict.NOT_ANSWERED
