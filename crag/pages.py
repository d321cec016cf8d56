"""Pages of a paged document (PDF) in crag's line numbers, and how a citation names them.

A PDF is read as text one page after another (``crag.index.readers``), each page starting
at line ``(page - 1) * PAGE_LINES + 1`` of the text crag indexes, the rest of its
``PAGE_LINES`` lines left blank. Every tool, chunk and marker works on that one numbering,
so nothing else needs to know about pages; a citation turns a line back into the page and the
line on it that a reader of the PDF finds (``guide.pdf:p3:L12``). Pure functions.
"""

from __future__ import annotations

__all__ = ["PAGED_SUFFIXES", "PAGE_LINES", "is_paged", "line_ref", "page_line", "span_ref"]

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
    first, last = line_ref(source, start), line_ref(source, end)
    page, _, _ = first.rpartition("L")
    return f"{first}-{last[len(page):]}" if last.startswith(page + "L") else f"{first}-{last}"
