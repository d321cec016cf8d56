"""``read_file(path, start_line=None, end_line=None, page=None)``: lines of one knowledge-base file.

The path is relative to a root (or to the working directory) or absolute, and must lead to
a file inside the roots (``crag.tools.paths``): ``..``, outside absolute paths, links out
of a root, hidden files and binary files are refused with a ``ToolError``. At most
``MAX_LINES`` lines and ``MAX_CHARS`` characters are returned: from ``start_line`` (default 1)
to ``end_line`` (default: as many as allowed), ending at the last whole line within the
characters (a first line longer than that alone is cut there, and says so; ``end_line`` says where a read ended). Lines are numbered as everywhere in crag
(``crag.index.discover.split_lines``). In a PDF they are lines of ``page`` (default 1), as
``ask`` and ``search`` cite them (``p2:L5`` is ``page=2, start_line=5``), and never run past
that page; ``page`` is refused for a file without pages. A path as an answer's footer cites
it (``setup.md:L40-L58``, ``guide.pdf:p2:L1``) reads that place of the file. The evidence item keeps crag's own
line numbers (``crag.pages``), which citations turn back into the page.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import ToolError
from ..index.discover import MAX_FILE_BYTES, BinaryFileError, read_bytes, split_lines, text_of
from ..pages import PAGE_LINES, is_paged, lines_of
from ..prompts.find import find_paths
from ..safe_text import display_name
from ..state import EvidenceItem
from ..toolspec import ArgumentError, Param, Tool, ToolContext, ToolResult
from .paths import resolve_in_roots

NAME = "read_file"
MAX_LINES = 200
MAX_CHARS = 100_000  # of one read: 200 lines of a minified file could be megabytes


# The place a citation adds to a path ("docs/setup.md:L40-L58", "guide.pdf:p2:L1"), as grep
# writes it ("setup.md:40") or as a web page of the repository links it ("setup.md#L40-L58").
# Lines and pages count from 1: "setup.md:L0" is no place (it read the file from line 1, as if
# cited so).
_N = r"0*[1-9]\d*"
_CITED_AT = re.compile(rf":(?:p(?P<page>{_N})(?::|\Z))?(?:(?P<L>L?)(?P<start>{_N})(?:-(?P=L)(?P<end>{_N}))?)?\Z"
                       rf"|#L(?P<hash_start>{_N})(?:-L(?P<hash_end>{_N}))?\Z")


def _cited(args: Mapping[str, Any], context: ToolContext) -> tuple[str, Mapping[str, Any]]:
    """The file a path names and the arguments to read it with: a path copied from an answer's
    footer (``setup.md:L40-L58``) that names no file as written is its file at that place,
    unless the arguments give lines or a page of their own. The arguments' ``path`` is then the
    file's (``setup.md``), as messages name it: a place has no lines and no pages."""
    try:
        return resolve_in_roots(NAME, args["path"], context.file_roots(), context.cwd,
                                excluded=[context.index_dir]), args
    except ToolError as first:
        cited = _CITED_AT.search(args["path"])
        if cited is None or not any(cited.group("page", "start", "hash_start")):
            raise
        try:
            real = resolve_in_roots(NAME, args["path"][: cited.start()], context.file_roots(), context.cwd,
                                    excluded=[context.index_dir])
        except ToolError:
            raise first from None
    args = {**args, "path": args["path"][: cited.start()]}
    if any(args.get(k) is not None for k in ("start_line", "end_line", "page")):
        return real, args
    place = {"page": cited["page"], "start_line": cited["start"] or cited["hash_start"],
             "end_line": cited["end"] or cited["hash_end"]}
    return real, {**args, **{k: int(v) for k, v in place.items() if v is not None}}


def run(args: Mapping[str, Any], context: ToolContext) -> ToolResult:
    real, args = _cited(args, context)
    start, end, page = args.get("start_line"), args.get("end_line"), args.get("page")
    requested = display_name(args["path"])  # as messages show it
    if page is not None and not is_paged(real):
        raise ToolError(NAME, f"{requested} has no pages: give start_line and end_line alone")
    try:
        data = read_bytes(real, MAX_FILE_BYTES)
    except (OSError, ValueError) as exc:
        raise ToolError(NAME, f"cannot read {requested} ({getattr(exc, 'strerror', None) or exc})") from exc
    try:
        text = text_of(real, data)
    except BinaryFileError:
        raise ToolError(NAME, f"{requested} is a binary file") from None
    except ValueError as exc:
        raise ToolError(NAME, f"cannot read {requested} ({exc})") from exc
    lines = split_lines(text)
    if not any(line.strip() for line in lines):  # blank lines are no evidence either
        raise ToolError(NAME, f"{requested} is empty")
    if is_paged(real):
        first, last, lines = _on_page(requested, lines, page or 1, start or 1, end)
    else:
        first = start or 1
        if first > len(lines):
            raise ToolError(NAME, f"{requested} has {len(lines)} lines; start_line {first} is past the end")
        last = end if end is not None else first + MAX_LINES - 1
        if last < first:
            raise ToolError(NAME, f"end_line {last} is before start_line {first}")
    last = min(last, len(lines), first + MAX_LINES - 1)
    if not any(line.strip() for line in lines[first - 1 : last]):
        where = f"line {first}" if last == first else f"lines {first}-{last}"
        raise ToolError(NAME, f"{where} of {requested} hold{'s' * (last == first)} no text")
    while last > first and not lines[last - 1].strip():  # a PDF page's unused lines (crag.pages)
        last -= 1
    last = _last_within(lines, first, last)
    return ToolResult((
        EvidenceItem(
            tool=NAME,
            source=context.label(real),
            text=_within(lines[first - 1 : last]),
            start_line=first,
            end_line=last,
        ),
    ))


def _within(lines: list[str]) -> str:
    """The lines joined: a first line over ``MAX_CHARS`` alone is its start, said to be cut on
    the same line (a line of its own would read as the file's next line)."""
    text = "\n".join(lines)
    if len(text) <= MAX_CHARS:
        return text
    return f"{text[:MAX_CHARS]} [... line {len(lines[0]):,} characters long, cut at {MAX_CHARS:,}]"


def _last_within(lines: list[str], first: int, last: int) -> int:
    """The last of lines ``first``-``last`` (1-based) whose whole text, joined, is at most
    ``MAX_CHARS`` characters (the first line at least): one minified line can hold megabytes."""
    size = -1  # the first line has no line break before it
    for n in range(first, last + 1):
        size += len(lines[n - 1]) + 1
        if size > MAX_CHARS and n > first:
            return n - 1
    return last


def _on_page(requested: str, lines: list[str], page: int, start: int, end: int | None) -> tuple[int, int, list[str]]:
    """Lines ``start``-``end`` of ``page`` in crag's numbering, and the file's lines up to that
    page's end (so a read never runs onto the next page)."""
    pages = (len(lines) + PAGE_LINES - 1) // PAGE_LINES
    if page > pages:
        raise ToolError(NAME, f"{requested} has {pages} page{'s' * (pages != 1)}; page {page} is past the end")
    top = (page - 1) * PAGE_LINES
    on_page = lines[top : top + PAGE_LINES]
    count = len(on_page)
    while count and not on_page[count - 1].strip():
        count -= 1
    if start > count:
        held = f"{count} line{'s' * (count != 1)}" if count else "no text"
        raise ToolError(NAME, f"page {page} of {requested} has {held}; start_line {start} is past its end")
    if end is not None and end < start:
        raise ToolError(NAME, f"end_line {end} is before start_line {start}")
    first, last = lines_of(page, start, min(end, count) if end is not None else start + MAX_LINES - 1)
    return first, min(last, top + count), lines[: top + count]


def _check(args: dict[str, Any]) -> None:
    start, end = args.get("start_line"), args.get("end_line")
    if start is not None and end is not None and end < start:
        raise ArgumentError(NAME, f"end_line {end} is before start_line {start}")


def _from_question(question: str) -> dict[str, Any] | None:
    paths = find_paths(question)
    return {"path": paths[0]} if paths else None


TOOL = Tool(
    name=NAME,
    description="read lines of a knowledge-base file (of a PDF: lines of one page, as cited p2:L5)",
    run=run,
    params=(
        Param("path", required=True, max_length=4096),
        Param("start_line", "integer", minimum=1, maximum=10**9, hint="int"),
        Param("end_line", "integer", minimum=1, maximum=10**9, hint="int"),
        Param("page", "integer", minimum=1, maximum=10**6, hint="int (a PDF's page, optional)"),
    ),
    check=_check,
    from_question=_from_question,
    path_arg="path",
    reads_lines=True,
)
