"""The text of a PDF page as a person reads it, beyond what pypdf extracts: the values filled
into its form fields (``form_values``), words a typesetter broke at a line's end read whole
(``joined_hyphens``), typographic ligatures as the letters a person types (``LIGATURES``);
and the file's bytes as pypdf reads them, within the reader's time (``TimedBytes``). The reader
(``crag.index.readers``) opens the PDF and owns the limits.
"""

from __future__ import annotations

import io
import re
import time

__all__ = ["LIGATURES", "OutOfTime", "TimedBytes", "form_values", "joined_hyphens"]


class OutOfTime(BaseException):
    """A PDF's time is up, raised from inside pypdf: not an ``Exception``, which pypdf catches and
    goes on from while it repairs a damaged file."""


class TimedBytes(io.BytesIO):
    """A PDF's bytes as pypdf reads them, raising ``OutOfTime`` past ``deadline`` (a
    ``time.monotonic`` value): pypdf parses every object of a PDF whose cross-reference table is
    damaged before it reads a page (minutes for a large file), while the reader checks its time
    at a page's operators, after that."""

    def __init__(self, data: bytes, deadline: float) -> None:
        super().__init__(data)
        self.deadline, self.reads = deadline, 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        if not self.reads % 1024 and time.monotonic() > self.deadline:
            raise OutOfTime
        return super().read(size)


def form_values(page: object, text: str) -> list[str]:
    """The lines of the values filled into the form fields of ``page``, top to bottom and left to
    right (a value the page's text already shows, a flattened form's, is not read twice). A
    damaged annotation costs its own values, never the page's text nor another field's."""
    found: list[tuple[float, float, str]] = []
    try:
        annotations = list(page.get("/Annots") or [])  # type: ignore[attr-defined]
    except Exception:  # pypdf's objects of a damaged file raise anything (a broken reference, say)
        return []
    for ref in annotations:
        try:
            found += [place for place in _widget_values(ref.get_object()) if place[2] not in text]
        except Exception:  # a Rect of names, a value that is a broken reference
            continue
    return [v for _, _, v in sorted(found)]


def _widget_values(widget: object) -> list[tuple[float, float, str]]:
    """The text values of one form widget, each with its place (from the top, from the left)."""
    from pypdf.generic import TextStringObject

    if not hasattr(widget, "get") or widget.get("/Subtype") != "/Widget":
        return []
    field, value = widget, None
    for _ in range(8):  # a widget's value may be on its parent field (a field with several widgets)
        value = field.get("/V")
        if value is not None or "/Parent" not in field:
            break
        field = field["/Parent"].get_object()
    values = value if isinstance(value, list) else [value]  # a list box's choices
    shown = [" ".join(str(v).split()) for v in values if isinstance(v, TextStringObject) and str(v).strip()]
    rect = [float(x) for x in widget.get("/Rect") or [0, 0, 0, 0]][:4]
    return [(-max(rect[1], rect[3]), min(rect[0], rect[2]), v) for v in shown]


# A word a typesetter broke at a line's end ("infor-" / "mation"): letters before the hyphen and a
# lower-case letter after it.
_BROKEN = re.compile(r"(?<![\w-])([^\W\d_]{2,})-$")
_REST = re.compile(r"([^\W\d_](?:[\w'’-]*[\w'’])?)([,.;:!?)\]]*)\s*(.*)")


def joined_hyphens(lines: list[str]) -> list[str]:
    """A page's lines with each word broken at a line's end written whole on the first line (the
    rest of the next line stays where it is, so every line keeps its number): what a person reads
    and searches for. A compound broken at its own hyphen ("well-" / "known") loses that hyphen,
    as in other PDF readers that join broken words."""
    for i in range(len(lines) - 1):
        broken = _BROKEN.search(lines[i])
        nxt = lines[i + 1].lstrip()
        rest = _REST.fullmatch(nxt) if broken and nxt[:1].islower() else None
        if rest and rest.group(1) not in ("and", "or", "to"):  # "pre-" / "and post-war": a suspended hyphen
            lines[i] = lines[i][: broken.start()] + broken.group(1) + rest.group(1) + rest.group(2)
            lines[i + 1] = rest.group(3)
    return lines


# A PDF's typographic ligatures (U+FB00-FB06) as the letters a person types, soft hyphens dropped.
LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                           "\ufb05": "st", "\ufb06": "st", "\xad": None})
