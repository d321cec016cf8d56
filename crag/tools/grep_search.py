"""``grep_search(pattern, glob=None, regex=False)``: matching lines in the knowledge base.

The pattern is a literal, case-insensitive string unless ``regex`` is true (then a Python
regular expression, also case-insensitive; an invalid one is a ``ToolError``). The files
searched are those discovery would index under the roots, read from disk (so results are
current even before re-indexing), optionally filtered by ``glob`` (matched against the
path relative to its root and against the file name); a ``glob`` that matches no file of
the knowledge base (a planner's guess) is dropped, the search runs without it, and the
result's audit says so (``glob_dropped``). Each match is one evidence item: the
matching line as ``anchor_line`` and a window of up to ``CONTEXT`` lines either side as
start/end/text (in a PDF, lines of the match's page only). At most ``MAX_MATCHES``
matches are returned, with how many more there were (``ToolResult.more``, so that
``grep_truncated`` counts them all; ``tool_exec`` keeps the best 2 x ``KB_AGENT_TOP_K`` of
them and pages through the rest), every file the index takes is searched (up to
``MAX_FILE_BYTES``, as ``read_file`` reads it), and lines longer than ``MAX_LINE_CHARS`` are
only searched in their first part. A regular expression runs with a time limit
(``crag.tools.regex_guard``): one that backtracks catastrophically is a ``ToolError``, not
a hang.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from typing import Any

from ..errors import KnowledgeBaseError, ToolError
from ..index.discover import MAX_FILE_BYTES, discover, reachable, read_bytes, split_lines, text_of
from ..pages import PAGE_LINES, is_paged
from ..prompts.find import find_identifiers
from ..state import AuditEvent, EvidenceItem
from ..toolspec import ArgumentError, Paging, Param, Searches, Tool, ToolContext, ToolResult
from .regex_guard import RegexRefused, matching_lines

NAME = "grep_search"
MAX_MATCHES = 500
CONTEXT = 2
MAX_LINE_CHARS = 4000


def run(args: Mapping[str, Any], context: ToolContext) -> ToolResult:
    pattern, glob, use_regex = args["pattern"], args.get("glob"), args.get("regex", False)
    try:
        rx = re.compile(pattern if use_regex else re.escape(pattern), re.IGNORECASE)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ToolError(NAME, f"invalid regular expression {pattern!r}: {exc}") from exc
    roots = context.file_roots()
    try:
        found = discover([r for r in roots if reachable(r)], exclude=[context.index_dir], max_bytes=MAX_FILE_BYTES)
    except KnowledgeBaseError as exc:
        raise ToolError(NAME, str(exc)) from exc
    texts: list[tuple[str, list[str]]] = []
    audit: tuple[AuditEvent, ...] = ()
    if glob and not any(_glob_match(f.path, f.root, glob) for f in found.files):
        audit = (AuditEvent("glob_dropped", {"glob": glob, "reason": "matches no file in the knowledge base"}),)
        glob = None
    for f in found.files:
        if glob and not _glob_match(f.path, f.root, glob):
            continue
        try:
            data = read_bytes(f.path, MAX_FILE_BYTES)
            text = text_of(f.path, data)
        except (OSError, ValueError):  # unreadable, binary (BinaryFileError) or a document its reader refused
            continue
        if not use_regex and not rx.search(text):
            continue
        texts.append((f.path, split_lines(text)))
    if use_regex:
        try:
            hits = matching_lines(pattern, [lines for _, lines in texts], max_chars=MAX_LINE_CHARS)
        except RegexRefused as exc:
            raise ToolError(NAME, f"{exc} over {len(texts)} file(s); use a simpler pattern (no nested repetition)") from exc
    else:
        hits = [[i for i, line in enumerate(lines) if rx.search(line[:MAX_LINE_CHARS])] for _, lines in texts]
    items: list[EvidenceItem] = []
    for (path, lines), matched in zip(texts, hits):
        paged = is_paged(path)
        for i in matched:
            if len(items) >= MAX_MATCHES:
                return ToolResult(tuple(items), audit, more=sum(map(len, hits)) - MAX_MATCHES)
            lo, hi = _window(lines, i, paged)
            items.append(
                EvidenceItem(
                    tool=NAME,
                    source=context.label(path),
                    text="\n".join(lines[lo : hi + 1]),
                    start_line=lo + 1,
                    end_line=hi + 1,
                    anchor_line=i + 1,
                )
            )
    return ToolResult(tuple(items), audit)


def _window(lines: list[str], i: int, paged: bool) -> tuple[int, int]:
    """Up to ``CONTEXT`` lines either side of line ``i`` (0-based); in a paged document only
    lines of ``i``'s page, without the blank lines that pad the page out."""
    lo, hi = max(0, i - CONTEXT), min(len(lines) - 1, i + CONTEXT)
    if paged:
        top = i - i % PAGE_LINES
        lo, hi = max(lo, top), min(hi, top + PAGE_LINES - 1)
        while lo < i and not lines[lo].strip():
            lo += 1
        while hi > i and not lines[hi].strip():
            hi -= 1
    return lo, hi


def _glob_match(path: str, root: str, glob: str) -> bool:
    rel = os.path.relpath(path, root) if path != root else os.path.basename(path)
    rel = rel.replace(os.sep, "/")
    pattern = glob.replace("\\", "/")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    if fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(os.path.basename(path), pattern):
        return True
    # "docs/**/*.md" also matches "docs/a.md"
    return "**/" in pattern and fnmatch.fnmatch(rel, pattern.replace("**/", ""))


def _check(args: dict[str, Any]) -> None:
    if args.get("regex"):
        try:
            re.compile(args["pattern"])
        except (re.error, RecursionError, OverflowError) as exc:
            raise ArgumentError(NAME, f"invalid regular expression {args['pattern']!r} ({exc})") from None


def _from_question(question: str) -> dict[str, Any] | None:
    identifiers = find_identifiers(question)
    return {"pattern": identifiers[0]} if identifiers else None


def _same_search(args: Mapping[str, Any]) -> tuple[str, str, bool]:
    """The same pattern (a literal one in any case), glob and mode."""
    regex = bool(args.get("regex", False))
    pattern = str(args.get("pattern", ""))
    return (pattern if regex else pattern.casefold(), str(args.get("glob") or ""), regex)


TOOL = Tool(
    name=NAME,
    description="exact text search, case-insensitive",
    run=run,
    params=(
        Param("pattern", required=True, max_length=500),
        Param("glob", max_length=200, hint='str (optional, e.g. "*.md")'),
        Param("regex", "boolean", default=False, hint="bool (optional, default false)"),
    ),
    check=_check,
    from_question=_from_question,
    advice="grep_search wants a literal identifier, setting name, flag or phrase, not a sentence",
    searches=Searches.TERMS,
    query_arg="pattern",
    paging=Paging.AGAIN,
    same_search=_same_search,
    match_cap=2,
)
