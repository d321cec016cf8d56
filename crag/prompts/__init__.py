"""Prompt builders and reply parsers: the LLM wire contract (see docs/architecture.md), no I/O.

Theory of operation. Every LLM call is rendered (``render``) from a structured task
(``AnalyzeTask``, ``PlanTask``, ``GradeTask``, ``SynthesizeTask``) into two chat messages,
a system prompt that states the contract and a user prompt that carries the data, quoted.
Replies come back as text and are read leniently (``lenient_json``: ``<think>`` blocks,
code fences, prose around the JSON, trailing commas) and validated strictly:

* ``parse_route``  -> a ``RoutingPlan``, or None when the classification is unusable;
* ``parse_plan``   -> validated ``ToolCall``s plus the reasons for every refusal;
* ``parse_scores`` -> exactly N finite numbers in [0, 1], or None;
* ``read_grades``  -> N scores from a grading reply's labels (with their token
  probabilities) or numbers, or None;
* ``clean_answer`` -> the answer text without thinking, and without a usage block or a trailing
  source list of its own.

No parser raises on any input: a reply is data from the network, and a bad one has a
documented fallback in the node that asked for it. The modules, one concern each:

    clean.py         stats blocks and <think> stripping
    render.py        tasks to chat messages, quoting
    lenient_json.py  JSON values in a reply, most likely first
    route.py         analyze_and_route replies
    plan.py          plan replies: entries, arguments, refusals
    scores.py        grade_evidence replies: JSON numbers
    grades.py        grade_evidence replies: labels and token probabilities
    find.py          what a question names: Jira keys, URLs, page ids, paths, identifiers
"""

from __future__ import annotations

from .clean import clean_answer, strip_stats_blocks, strip_think, without_echo
from .find import (
    NOT_JIRA_PROJECTS,
    find_confluence_page_ids,
    find_identifiers,
    find_jira_keys,
    find_paths,
    find_urls,
)
from .grades import SURE, Reading, read_grades, read_replies
from .lenient_json import extract_json, iter_json_values
from .plan import MAX_CALLS, MAX_TOP_K, parse_plan
from .render import ITEM_CHARS, quote, render
from .route import parse_route
from .scores import parse_scores

__all__ = [
    "ITEM_CHARS",
    "MAX_CALLS",
    "MAX_TOP_K",
    "NOT_JIRA_PROJECTS",
    "SURE",
    "Reading",
    "clean_answer",
    "extract_json",
    "find_confluence_page_ids",
    "find_identifiers",
    "find_jira_keys",
    "find_paths",
    "find_urls",
    "iter_json_values",
    "parse_plan",
    "parse_route",
    "parse_scores",
    "quote",
    "read_grades",
    "read_replies",
    "render",
    "strip_stats_blocks",
    "strip_think",
    "without_echo",
]
