"""Grading: a reply read into scores, a policy, one table of rules, a verdict naming its rule.

``grade_evidence`` (SPEC §2) grades in three stages, each pure:

1. **Reading** (``crag.prompts.grades.read_grades``): the grader's reply → one score per item,
   and what the reading knows (whether the scores came from token probabilities, the labels
   written). It decides nothing. A number list is read as numbers; labels through their
   probabilities where the server returns them.
2. **Policy** (``crag.grading.policy``): the rules and thresholds beyond the seeds', as one
   frozen record chosen by ``KB_AGENT_GRADING_POLICY``; ``seed`` switches them all off.
3. **Decision** (``crag.grading.rules``): ``verdict(case, policy)`` tries ``RULES`` in order and
   returns a ``GradeVerdict`` (action, kept, removed, scores, audit events) naming the
   ``GradeRule`` that decided. The node applies it and branches on nothing itself.

The fast-path rules (``crag.grading.fast_path``) are found by the node's ``prepare``, since
they spare the call; the memories across rounds are in ``crag.grading.memory``.

``GRADERS`` are the styles of ``KB_AGENT_GRADER`` (``crag.modes.GraderStyle``): how the grade is
asked for and read.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import grounding, searches
from ..modes import GraderStyle
from ..state import EvidenceItem, ToolRun
from ..toolspec import Tool, question_search
from .fast_path import EPS, FAST_PATH_RULES, fast_path_rule, recorded_vector_scores
from .memory import merge_scores, remember, skipped, unremembered
from .policy import DEFAULT, POLICIES, SEED, GradingPolicy, PolicyName
from .rules import (
    PARSE_FAILURE_SCORE,
    RULES,
    UNGRADED_SCORE,
    Decision,
    Facts,
    GradeCase,
    GradedBy,
    GradeRule,
    GradeVerdict,
    Rule,
    decide,
    mean,
    uninformative,
    verdict,
)

__all__ = [
    "DEFAULT",
    "EPS",
    "FAST_PATH_RULES",
    "GRADERS",
    "PARSE_FAILURE_SCORE",
    "POLICIES",
    "RULES",
    "SEED",
    "UNGRADED_SCORE",
    "Decision",
    "Facts",
    "GradeCase",
    "GradeRule",
    "GradeVerdict",
    "GradedBy",
    "GradingPolicy",
    "PolicyName",
    "Rule",
    "decide",
    "fast_path_rule",
    "mean",
    "merge_scores",
    "recorded_vector_scores",
    "remember",
    "retrieval_action",
    "retrieval_facts",
    "skipped",
    "uninformative",
    "unremembered",
    "verdict",
]

_EPS = EPS

# KB_AGENT_GRADER: style -> what it is (docs/real-models.md, "Grading a real model").
GRADERS = {style.value: style.description for style in GraderStyle}


def retrieval_facts(tool_history: Sequence[ToolRun], question: str, tools: Sequence[Tool],
                    rounds: int = 1) -> Facts:
    """What retrieval knows (``Facts``): the items the search of the question itself returned
    (``tools``' question search, with the argument that holds the question), the vector
    score recorded for each item (by a tool with ``vector_scores``), the terms the question
    names (``crag.grounding.named``; not the paths of files retrieved), and whether this is the first round (``rounds``
    completed)."""
    own: set[tuple] = set()
    call = question_search(tools, question, 1)
    if call is not None:
        carries = [name for name, value in call.args.items() if value == question]  # the argument holding it
        for run in tool_history:
            if run.call.tool == call.tool and any(
                    searches.same_query(run.call.args.get(name, ""), question) for name in carries):
                own.update(item.key for item in run.items)
    sources = [item.source for run in tool_history for item in run.items]
    named = tuple(grounding.named(grounding.unpointed(question, sources)))  # a path pointed at is no term
    return Facts(frozenset(own), recorded_vector_scores(tool_history, tools), named, rounds <= 1)


def retrieval_action(context: Sequence[EvidenceItem], tool_history: Sequence[ToolRun], question: str,
                     drop_threshold: float, tools: Sequence[Tool]):
    """The action of the policy rows (``uninformative``, ``undecided``), from what retrieval knows."""
    return retrieval_facts(tool_history, question, tools).action(context, drop_threshold)
