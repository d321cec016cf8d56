"""Cutting an answer into pieces: prose sentences, list items, code blocks, tables, headings.

Pure text handling for grounding (``crag.grounding``): ``split(text)`` returns pieces whose
concatenation is the text, so a rewrite can change one piece and keep the rest byte for byte.
Code blocks and tables are kept whole; a paragraph is cut into sentences, and so is a list
item (its first sentence, with the bullet, is the ``item`` piece).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from attrs import frozen

__all__ = ["FENCE", "SENTENCE_ENDS", "Piece", "closes", "open_fence", "sentences", "split"]

FENCE = re.compile(r"^[ \t]*(?:>[ \t]?)*(`{3,}|~{3,})")
_LIST_START = re.compile(r"^[ \t]*(?:>[ \t]?)*(?:[-*+]|\d{1,3}[.)])[ \t]+\S")
_BULLET = re.compile(r"[ \t]*(?:>[ \t]?)*(?:[-*+]|\d{1,3}[.)])[ \t]+")
_INTERRUPT = re.compile(r"^[ \t]*(?:>[ \t]?)*(?:[-*+]|1[.)])[ \t]+\S")
_HEADING = re.compile(r"^[ \t]{0,3}#{1,6}(?:[ \t]|$)")
_RULE = re.compile(r"^[ \t]*(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,}|=+)[ \t]*$")
_TABLE = re.compile(r"^[ \t]*\|")
# A container's fence (":::note", "::: warning Title", ":::"), as Docusaurus, MyST and Pandoc
# write admonitions: a line of its own, as a rule is (a marker placed at the end of the
# sentence above it went into the closing fence, ":: [2]:").
_CONTAINER_FENCE = re.compile(r"^[ \t]*(?:>[ \t]?)*:{3,}(?:[ \t]*[\w{\[].*)?[ \t]*$")
# A sentence ends at . ! ? and the sentence ends of other spaced scripts (Arabic's ؟, Urdu's ۔,
# the Devanagari danda । and ॥, Armenian ։, Ethiopic ።, Myanmar ။; closing quotes, brackets,
# emphasis, the backtick of inline code and citation markers stay with it) before whitespace
# and the start of another sentence (a capital, a digit, or any character from U+00C0 up,
# an emoji opening it too: "🚀 The rocket ..."), also on the next line of a blockquote ("> ");
# and at 。！？ (written without a space after them) wherever they stand.
SENTENCE_ENDS = ".!?\u061f\u06d4\u0964\u0965\u0589\u1362\u104b"
_SENTENCE_END = re.compile(
    rf"[{SENTENCE_ENDS}]+" r"[\"'”’)\]*_`]*(?:[ \t]*\[\s*\d[\d\s,;\-–]*\])*"
    r"(?=\s+(?:(?<=\n)(?:>[ \t]?)+)?(?!\[\s*\d)[\[(\"'“‘`*_]*[A-Z0-9\u00c0-\U0010ffff])"
    r"|[。！？]+(?:[ \t]*\[\s*\d[\d\s,;\-–]*\])*"
)
_CODE_SPAN = re.compile(r"`[^`]*`")  # within a paragraph (no blank line), line breaks included
# A letter alone before a full stop is an initial ("J. Smith", "U.S."), not a unit after a number or
# a degree sign ("heats to 80 °C.", "runs at 12 V.", the space a no-break one as typesetting writes
# it: "12\u202fV.") nor a file's extension ("edit main.c."), which end their sentences.
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|cf|approx|fig|no|mr|mrs|dr|st)|(?<![°\d][ \u00a0\u202f])(?<!°)"
                           r"(?<!\w\w\.)\b[A-Za-z])\.$", re.I)


@frozen
class Piece:
    """One piece of an answer. ``kind``: sentence, item (list item), code, table, heading,
    rule or space. ``start`` is its offset in the text it was split from."""

    kind: str
    text: str
    start: int = 0

    @property
    def judgeable(self) -> bool:
        return self.kind in ("sentence", "item", "code", "table")


def _block_end(lines: list[str], i: int, starts_new) -> int:
    j = i + 1
    while j < len(lines) and lines[j].strip() and not starts_new(lines[j]):
        j += 1
    return j


_NUMBER = re.compile(r"[ \t]*(?:>[ \t]?)*(\d{1,3})[.)][ \t]")


def _next_item(line: str):
    """Whether a line ends the list item ``line`` starts: the next item, or a fence, heading,
    rule or table. After item N, a line numbered other than N or N + 1 is the item's text
    wrapped onto a line that starts with a number ("3. ... holds" / "10. The ...": a chunk
    that opens mid-paragraph)."""
    opened = _NUMBER.match(line)

    def starts_new(ln: str) -> bool:
        if _special(ln):
            return True
        if not _LIST_START.match(ln):
            return False
        number = _NUMBER.match(ln)
        if opened and number:
            return int(number.group(1)) - int(opened.group(1)) in (0, 1)
        return True

    return starts_new


def _special(line: str) -> bool:
    return bool(FENCE.match(line) or _HEADING.match(line) or _RULE.match(line) or _TABLE.match(line)
                or _CONTAINER_FENCE.match(line))


def closes(line: str, mark: str) -> bool:
    """Whether ``line`` closes a block opened by the fence ``mark`` (the same character, at
    least as many, nothing after it)."""
    m = FENCE.match(line)
    return bool(m and m.group(1)[0] == mark[0] and len(m.group(1)) >= len(mark)
                and not line.strip().lstrip(">").strip().lstrip(mark[0]).strip())


def open_fence(lines: Iterable[str]) -> str | None:
    """The opening line of the code block still open after ``lines`` (None: none is)."""
    opening, mark = None, ""
    for line in lines:
        if opening is None:
            if fence := FENCE.match(line):
                opening, mark = line, fence.group(1)
        elif closes(line, mark):
            opening = None
    return opening


def sentences(text: str, offset: int) -> list[Piece]:
    """A paragraph cut into sentence pieces and the whitespace between them."""
    # Inline code may run over a line break, as in Markdown ("... ask \"Which port does\nthe
    # server listen on?\"`"): pairing backticks line by line would pair the wrong ones.
    code_spans = [(m.start(), m.end()) for m in _CODE_SPAN.finditer(text)]
    pieces: list[Piece] = []
    pos = 0
    for match in _SENTENCE_END.finditer(text):
        end = match.end()
        if any(a < match.start() < b and match.end() < b for a, b in code_spans):
            continue  # inside code; a span that ends the sentence ("... one line: `Done.`") ends it
        if _ABBREVIATION.search(text[max(0, match.start() - 8) : match.start() + 1]):
            continue
        gap = len(text) - len(text[end:].lstrip())
        if pos < end:
            pieces.append(Piece("sentence", text[pos:end], offset + pos))
        if end < gap:
            pieces.append(Piece("space", text[end:gap], offset + end))
        pos = gap
    if pos < len(text):
        pieces.append(Piece("sentence", text[pos:], offset + pos))
    return pieces


def split(text: str) -> list[Piece]:
    """``text`` cut into pieces; ``"".join(p.text for p in split(text)) == text``."""
    lines = text.splitlines(keepends=True)
    blocks: list[tuple[str, int, int]] = []  # kind, first line, end line (exclusive)
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            mark = fence.group(1)
            j = i + 1
            while j < len(lines) and not closes(lines[j], mark):
                j += 1
            blocks.append(("code", i, min(j + 1, len(lines))))
            i = min(j + 1, len(lines))
        elif not line.strip():
            blocks.append(("space", i, i + 1))
            i += 1
        elif _TABLE.match(line):
            j = i + 1
            while j < len(lines) and _TABLE.match(lines[j]):
                j += 1
            blocks.append(("table", i, j))
            i = j
        elif _HEADING.match(line):
            blocks.append(("heading", i, i + 1))
            i += 1
        elif _RULE.match(line) or _CONTAINER_FENCE.match(line):
            blocks.append(("rule", i, i + 1))
            i += 1
        elif _LIST_START.match(line):
            j = _block_end(lines, i, _next_item(line))
            blocks.append(("item", i, j))
            i = j
        else:  # only a bullet or "1." starts a list inside a paragraph ("31. The" wraps)
            j = _block_end(lines, i, lambda ln: bool(_INTERRUPT.match(ln) or _special(ln)))
            blocks.append(("paragraph", i, j))
            i = j
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    pieces: list[Piece] = []
    for kind, a, b in blocks:
        block = "".join(lines[a:b])
        body = block.rstrip("\r\n") if kind != "space" else block
        tail = block[len(body) :]
        if kind == "paragraph":
            pieces.extend(sentences(body, offsets[a]))
        elif kind == "item":  # each sentence of a list item is a claim of its own; the first keeps the bullet
            bullet = _BULLET.match(body)
            skip = bullet.end() if bullet else 0
            cut = sentences(body[skip:], offsets[a] + skip)
            if cut and cut[0].kind == "sentence":
                pieces.extend([Piece("item", body[:skip] + cut[0].text, offsets[a]), *cut[1:]])
            else:
                pieces.append(Piece(kind, body, offsets[a]))
        else:
            pieces.append(Piece(kind, body, offsets[a]))
        if tail:
            pieces.append(Piece("space", tail, offsets[a] + len(body)))
    merged: list[Piece] = []
    for piece in pieces:  # one space piece between two others
        if merged and piece.kind == "space" and merged[-1].kind == "space":
            merged[-1] = Piece("space", merged[-1].text + piece.text, merged[-1].start)
        else:
            merged.append(piece)
    return merged
