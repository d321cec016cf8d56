"""Retrieval the planner cannot make worse: what runs besides, and instead of, planned calls.

Theory of operation. The planner (an LLM, sometimes a small one) decides what to look for;
these pure rules make sure its choices can only add to what a plain search for the question
finds (see ``docs/real-models.md``):

* ``with_question_search``: the first round always runs ``vector_search`` with the user's
  question and ``top_k`` = ``KB_AGENT_TOP_K``, once, besides the planned calls (after them,
  so the planner's targeted finds keep the first numbers). The
  one exception: when every planned call reads a file whose path the question itself names,
  the user pointed at the source and only those reads run.
* ``deepen_repeats``: a planned call identical to one already run for this question (same
  tool and query, pattern or path; ``top_k`` aside) would only bring the same evidence
  again. A ``vector_search`` or ``grep_search`` becomes the same search one page deeper:
  ``vector_search`` asks for ``top_k`` more hits and ``grep_search`` keeps its arguments,
  and ``tool_exec`` keeps only what earlier runs of that search did not return
  (``unseen``). Any other repeated call is dropped. Audited as ``call_repeated``.
* ``cap_matches``: a ``grep_search`` keeps at most 2 x ``KB_AGENT_TOP_K`` matches, the
  files with the most matches first (in their order of discovery on ties), lines in file
  order within a file; when there were more, ``grep_truncated`` says how many.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .state import AuditEvent, EvidenceItem, ToolCall, ToolRun
from .toolspec import MAX_TOP_K  # the most hits one vector_search returns

__all__ = [
    "MAX_TOP_K",
    "cap_matches",
    "deepen_repeats",
    "same_query",
    "signature",
    "unseen",
    "with_question_search",
]

PAGED_TOOLS = ("vector_search", "grep_search")


def same_query(a: str, b: str) -> bool:
    """Two queries are the same search when they differ only in case and spacing."""
    return " ".join(str(a).split()).casefold() == " ".join(str(b).split()).casefold()


def signature(call: ToolCall) -> tuple[Any, ...]:
    """What makes two calls the same search (``top_k`` aside)."""
    args = call.args
    if call.tool == "vector_search":
        return (call.tool, " ".join(str(args.get("query", "")).split()).casefold())
    if call.tool == "grep_search":
        regex = bool(args.get("regex", False))
        pattern = str(args.get("pattern", ""))
        return (call.tool, pattern if regex else pattern.casefold(), str(args.get("glob") or ""), regex)
    return (call.tool, tuple(sorted((str(k), repr(v)) for k, v in args.items())))


def question_search(question: str, top_k: int) -> ToolCall:
    return ToolCall("vector_search", {"query": question.strip() or question, "top_k": top_k})


def with_question_search(
    calls: Sequence[ToolCall], question: str, top_k: int, named_paths: Sequence[str]
) -> tuple[tuple[ToolCall, ...], tuple[AuditEvent, ...]]:
    """The first round's calls: the question's own search first, then the planned ones."""
    calls = tuple(calls)
    named = {p.lstrip("./") for p in named_paths}
    if calls and named and all(
        c.tool == "read_file" and str(c.args.get("path", "")).lstrip("./") in named for c in calls
    ):
        return calls, ()
    own = [c for c in calls if c.tool == "vector_search" and same_query(c.args.get("query", ""), question)]
    if own:  # the planner asked for it too: run it once, with at least top_k hits
        first = own[0]
        k = max(int(first.args.get("top_k", top_k)), top_k)
        kept = tuple(c for c in calls if c is first or c not in own)
        return tuple(ToolCall("vector_search", {**c.args, "top_k": k}) if c is first else c for c in kept), ()
    event = AuditEvent("question_searched", {"query": question.strip(), "top_k": top_k})
    return (*calls, question_search(question, top_k)), (event,)


def deepen_repeats(
    calls: Sequence[ToolCall], history: Sequence[ToolRun], top_k: int, question: str
) -> tuple[tuple[ToolCall, ...], tuple[AuditEvent, ...]]:
    """Calls identical to earlier ones made one page deeper (or dropped); see the module doc."""
    earlier: dict[tuple[Any, ...], int] = {}
    for run in history:
        if run.error is None:
            key = signature(run.call)
            k = int(run.call.args.get("top_k", top_k) or top_k) if run.call.tool == "vector_search" else 0
            earlier[key] = max(earlier.get(key, 0), k)
    out: list[ToolCall] = []
    audit: list[AuditEvent] = []
    seen: set[tuple[Any, ...]] = set()
    for call in calls:
        key = signature(call)
        if key in seen:
            continue
        seen.add(key)
        if key not in earlier:
            out.append(call)
            continue
        if call.tool == "vector_search" and earlier[key] < MAX_TOP_K:
            deeper = min(MAX_TOP_K, earlier[key] + max(int(call.args.get("top_k", top_k)), top_k))
            out.append(ToolCall(call.tool, {**call.args, "top_k": deeper}))
            audit.append(AuditEvent("call_repeated", {"tool": call.tool, "action": "next page", "top_k": deeper}))
        elif call.tool == "grep_search":
            out.append(call)
            audit.append(AuditEvent("call_repeated", {"tool": call.tool, "action": "next page"}))
        else:
            audit.append(AuditEvent("call_repeated", {"tool": call.tool, "action": "dropped"}))
    if not out:
        fallback = question_search(question, top_k)
        if signature(fallback) in earlier:
            return deepen_repeats((fallback,), history, top_k, question)[0], tuple(audit)
        out.append(fallback)
    return tuple(out), tuple(audit)


def unseen(call: ToolCall, items: Sequence[EvidenceItem], history: Sequence[ToolRun]) -> tuple[EvidenceItem, ...]:
    """``items`` without those an earlier run of the same search already returned."""
    if call.tool not in PAGED_TOOLS:
        return tuple(items)
    key = signature(call)
    returned = {i.key for run in history if signature(run.call) == key for i in run.items}
    if not returned:
        return tuple(items)
    return tuple(i for i in items if i.key not in returned)


def cap_matches(items: Sequence[EvidenceItem], cap: int) -> tuple[tuple[EvidenceItem, ...], int]:
    """At most ``cap`` grep matches, best files first, and how many were left out."""
    items = tuple(items)
    if len(items) <= cap:
        return items, 0
    counts: dict[str, int] = {}
    for item in items:
        counts[item.source] = counts.get(item.source, 0) + 1
    order = {source: n for n, source in enumerate(counts)}
    ranked = sorted(items, key=lambda i: (-counts[i.source], order[i.source]))
    return tuple(ranked[:cap]), len(items) - cap
