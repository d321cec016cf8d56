"""Pages of a paged document (PDF) in crag's line numbers, and how a citation names them.

A PDF is read as text one page after another (``crag.index.readers``), each page starting
at line ``(page - 1) * PAGE_LINES + 1`` of the text crag indexes, the rest of its
``PAGE_LINES`` lines left blank. Every tool, chunk and marker works on that one numbering,
so nothing else needs to know about pages; a citation turns a line back into the page and the
line on it that a reader of the PDF finds (``guide.pdf:p3:L12``). Pure functions.

Everything crag shows (``ask``'s citations, ``search --json``, the MCP tools, ``read_file``'s
arguments) states a place in a paged document as a page and lines on that page, through one
pair of functions: ``location`` (crag's lines -> what is shown) and ``lines_of`` (a page and
lines on it -> crag's lines). The internal numbering never leaves crag.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PAGED_SUFFIXES", "PAGE_LINES", "is_paged", "line_ref", "lines_of", "location", "location_ref", "page_line",
           "span_ref"]

PAGE_LINES = 1000  # lines set aside for each page; a page with more has its last ones joined
PAGED_SUFFIXES = (".pdf",)


def is_paged(source: str) -> bool:
    """Whether ``source`` is a paged document, whose lines are counted page by page."""
    return source.lower().endswith(PAGED_SUFFIXES)


def page_line(line: int) -> tuple[int, int]:
    """Crag's 1-based line of a paged document -> (page, line on that page), both 1-based."""
    page, offset = divmod(line - 1, PAGE_LINES)
    return page + 1, offset + 1


def line_ref(source: str, line: int) -> str:
    """How a citation names a line of ``source``: ``L42``, or ``p3:L12`` in a PDF."""
    if is_paged(source):
        page, on_page = page_line(line)
        return f"p{page}:L{on_page}"
    return f"L{line}"


def span_ref(source: str, start: int, end: int) -> str:
    """A range of lines as a person finds it: ``L3-L9``, ``p2:L1-L7``, or ``p2:L40-p3:L5``
    across a page break."""
    return location_ref(location(source, start, end))


def location(source: str, start: int | None, end: int | None) -> dict[str, Any]:
    """Lines ``start``-``end`` of ``source`` (crag's numbering) as every output states them:
    ``{"start_line", "end_line"}``, and for a paged document ``{"page", "start_line", "end_line"}``
    with lines counted on that page, plus ``"end_page"`` when the range runs onto a later page
    (``end_line`` is then a line of ``end_page``)."""
    if start is None or not is_paged(source):
        return {"start_line": start, "end_line": end}
    page, first = page_line(start)
    if end is None:
        return {"page": page, "start_line": first, "end_line": None}
    end_page, last = page_line(end)
    out: dict[str, Any] = {"page": page, "start_line": first, "end_line": last}
    if end_page != page:
        out["end_page"] = end_page
    return out


def location_ref(place: dict[str, Any]) -> str:
    """A ``location`` as a citation names it: ``L3-L9``, ``p2:L1-L7``, ``p2:L40-p3:L5``."""
    page, start, end = place.get("page"), place["start_line"], place.get("end_line")
    on = f"p{page}:" if page is not None else ""
    if end is None:
        return f"{on}L{start}"
    if "end_page" in place:
        return f"{on}L{start}-p{place['end_page']}:L{end}"
    return f"{on}L{start}-L{end}"


def lines_of(page: int, start: int, end: int | None = None) -> tuple[int, int | None]:
    """Lines ``start``-``end`` of page ``page`` (all 1-based) in crag's numbering."""
    top = (page - 1) * PAGE_LINES
    return top + start, (top + end if end is not None else None)
