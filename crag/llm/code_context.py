"""Whether an evidence text starts inside a fenced code block of its file.

A chunk cut from an oversized code block, or an item the context budget cut to the lines
around its best match (``crag.budget.excerpt``), can begin below the fence that opens its
code: read alone, those lines look like prose, and the offline answer would quote terminal
output as a sentence. So the offline answer asks here first. The file an item cites is read
(once per answer); when its lines at the item's place are exactly the item's text, the fences
above them say whether the text starts inside a block, and which line opened it. An item whose
source is not a readable text file holding that text (a URL, a Jira key, a PDF's extracted
text, a file changed since it was indexed) is read on its own, as before.
"""

from __future__ import annotations

import os

from ..sentences import FENCE, closes, open_fence
from ..state import EvidenceItem

__all__ = ["FileLines", "leading_code", "opening_fence"]

_MAX_BYTES = 8 * 1024 * 1024  # larger files are not read for this


class FileLines:
    """The lines of the files an answer cites, each file read at most once (None: unreadable)."""

    def __init__(self) -> None:
        self._read: dict[str, list[str] | None] = {}

    def __call__(self, source: str) -> list[str] | None:
        if source not in self._read:
            self._read[source] = _lines(source)
        return self._read[source]


def _lines(source: str) -> list[str] | None:
    try:
        if not os.path.isfile(source) or os.path.getsize(source) > _MAX_BYTES:
            return None
        with open(source, "rb") as f:
            data = f.read()
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None
    if b"\x00" in data[:8192]:
        return None
    text = data.decode("utf-8-sig", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    return text.split("\n")


def opening_fence(item: EvidenceItem, files: FileLines) -> str | None:
    """The fence line (``"```console"``) of the code block ``item``'s text starts inside of,
    in the file it cites; None when it starts outside one or the file cannot tell."""
    if item.start_line is None or item.start_line <= 1 or not item.text:
        return None
    lines = files(item.source)
    first = item.start_line - 1
    own = item.text.split("\n")
    if own[-1] == "" and len(own) > 1:  # a text ending in a newline
        own.pop()
    if lines is None or lines[first : first + len(own)] != own:
        return None
    return open_fence(lines[:first])


def leading_code(text: str, lead: str | None) -> tuple[str | None, int]:
    """The code ``text`` starts inside of, when ``lead`` (the block's fence line, above the
    text in its file) says it does: that block as far as the text holds it (``lead``, the lines
    up to the closing fence, and that fence, added when the text ends first; None when those
    lines are blank), and where the rest of the text begins."""
    fence = FENCE.match(lead) if lead is not None else None
    if lead is None or fence is None:
        return None, 0
    lines = text.split("\n")
    end = next((j for j, line in enumerate(lines) if closes(line, fence.group(1))), None)
    body = lines if end is None else lines[:end]
    close = lead[: fence.start(1)] + fence.group(1) if end is None else lines[end]
    rest = min(len(text), sum(len(line) + 1 for line in lines[: len(body) + 1]))
    if not any(line.strip() for line in body):
        return None, rest
    return "\n".join([lead.rstrip(), *body, close]), rest
