"""The evidence an answer is judged against, read once per answer.

``passages(text)`` cuts an evidence text into the passages a sentence may come from:
sentences of prose and of list items, table rows (a row written without a leading pipe, a
DOCX table's, too), code lines and headings, each with its offsets in the text, its
vocabulary (stemmed words) and its polarity (a table row's per cell too: a row states one
thing per cell). ``Evidence`` holds, for every item of an
answer, its passages, its text as one passage (``whole``: how a table is read), its flat
text and its lines, built on first use and kept for every later piece of the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property

from attrs import frozen

from ..safe_text import for_terminal
from ..sentences import sentences, split
from ..state import EvidenceItem
from ..text import in_vocabulary, stem, unspaced, words
from .claims import PREFIX, Claims, has_anchor, negated, negated_outside_code

__all__ = ["Evidence", "ItemEvidence", "Passage", "document_name", "negated_for", "org_file", "passages", "vocabulary"]

_ADMONITION = re.compile(r"\[![A-Za-z]+\][ \t]*(?:\n[ \t]*(?:>[ \t]?)*)?")
# A line that only pulls in other text when the site is built: an include ({* file.py hl[1] *},
# --8<-- "file") or a template tag ({% include x %}, {{ macro }}). Its words are a file's
# path, not something the document says.
_INCLUDE = re.compile(r"(?:\{\*[^{}\n]*\*\}|\{%[^{}\n]*%\}|\{\{[^{}\n]*\}\}|-{2}8<-{2}[^\n]*)\s*")


def vocabulary(text: str) -> set[str]:
    """The stemmed words of ``text``, numbers left out; Han and Kana as their character
    bigrams (``crag.text.unspaced``), as ``claims`` reads a sentence: escape sequences too, as a
    terminal shows them (a log's ``\\x1b[31mred`` is the word red)."""
    out: set[str] = set()
    for word in words(for_terminal(text)):
        if word.isascii():  # no Han nor Kana: the common case, read at once
            if not word.isdigit():
                out.add(stem(word))
            continue
        spaced, terms = unspaced(word)
        out.update(terms)
        out.update(stem(w) for w in spaced if not w.isdigit())
    return out


@frozen
class Passage:
    """A sentence (or a list item's sentence, table row, code line or heading: ``kind``) of
    an evidence text; a
    negated table row also holds each cell's vocabulary and polarity (``cells``), and a
    negated sentence of more than one clause each clause's."""

    start: int  # offset in the item's text
    end: int
    text: str
    vocabulary: frozenset[str]
    negated: bool
    kind: str = "sentence"
    cells: tuple[tuple[frozenset[str], bool], ...] = ()


def passages(text: str, org: bool = False) -> list[Passage]:
    """An evidence text cut into the passages a sentence may come from: sentences of prose
    and list items, table rows, code lines, headings; offsets into ``text``. ``org``: the
    text is an Org file's, whose markup lines are no prose (``_ORG_MARKUP``)."""
    out: list[Passage] = []

    def add(start: int, part: str, kind: str) -> None:
        lead = len(part) - len(part.lstrip())
        part = part.strip()
        if not part:
            return
        s = start + lead
        denies = negated_outside_code(part) if kind != "code" else negated(part)
        cells = () if not denies else _cells(part) if kind == "table" else _clauses(part) if kind in _PROSE else ()
        out.append(Passage(s, s + len(part), part, frozenset(vocabulary(part)), denies, kind, cells))

    apart = _lines_apart(text, org)

    def prose(start: int, part: str, kind: str) -> None:
        for at, sub, own in _cut(text, start, part, apart):
            if own != _MARKUP:
                add(at, sub, own or kind)

    for piece in split(text):
        if piece.kind in ("space", "rule"):
            continue
        if piece.kind in ("code", "table"):
            pos = piece.start
            for line in piece.text.split("\n"):
                add(pos, line, piece.kind)
                pos += len(line) + 1
        elif piece.kind == "item":
            prefix = PREFIX.match(piece.text)
            skip = prefix.end() if prefix else 0
            for sub in sentences(piece.text[skip:], piece.start + skip):
                if sub.kind == "sentence":
                    prose(sub.start, sub.text, "item")
        elif piece.kind == "sentence":
            prefix = PREFIX.match(piece.text)  # a blockquote's "> "
            skip = prefix.end() if prefix else 0
            if _INCLUDE.fullmatch(piece.text, skip):
                continue
            marker = _ADMONITION.match(piece.text, skip)  # "> [!NOTE]" opens the text, it is not part of it
            skip = marker.end() if marker else skip
            prose(piece.start + skip, piece.text[skip:], "sentence")
        else:
            add(piece.start, piece.text, piece.kind)
    return out


_CODE_SPAN = re.compile(r"`[^`\n]*`")


_CELL_WORDS = 6  # the most words of a cell of a row written without a leading pipe


def _cells_of(line: str) -> int:
    """How many cells ``line`` has as a table row written without a leading pipe (``a | b``,
    how a DOCX table's rows are read): pipes outside inline code part two or more cells,
    none of them blank (a trailing pipe aside); 0 when it is no such row."""
    cells = _CODE_SPAN.sub("", line).strip().removesuffix("|").split("|")
    # a cell is a few words: a longer one is prose around a pipe ("run cat frob.log | grep ERROR")
    return len(cells) if len(cells) > 1 and all(0 < len(cell.split()) <= _CELL_WORDS for cell in cells) else 0


_MARKUP = ""  # the kind of a line that is no passage at all
# Org markup (in an Org file): a block's delimiters (#+BEGIN_QUOTE, #+end_src) and a drawer's
# lines (:PROPERTIES:, :END:) are no passage; a keyword line (#+TITLE: ...) and a headline
# (* Heading, ** Sub) are headings. "#+" opens no Markdown heading, and "** Sub" no list item,
# so each ran into the sentence below it: "** Sub #+BEGIN_QUOTE The pellucid dynamo ...".
_ORG_MARKUP = (
    (re.compile(r"[ \t]*#\+(?:begin|end)_\S*(?:[ \t].*)?|[ \t]*:[\w-]+:(?:[ \t].*)?", re.I), _MARKUP),
    (re.compile(r"[ \t]*#\+\w+:.*|\*+[ \t]+\S.*"), "heading"),
)
# A container's fence (":::note", "::: warning Title", "::::{admonition}", ":::"), as Docusaurus,
# MyST, VuePress and Pandoc write admonitions: no passage. The text opens on the next line,
# and ran into the fence: ":::note The log is kept in ..." was cited at the fence, and the
# offline answer never quoted it (a sentence opening with ":::" is an admonition marker).
_CONTAINER_FENCE = re.compile(r"[ \t]*(?:>[ \t]?)*:{3,}(?:[ \t]*[\w{\[].*)?[ \t]*")


def _lines_apart(text: str, org: bool = False) -> dict[int, str]:
    """The lines of ``text`` that prose never runs into, by their offset, each with the kind of
    passage it is by itself (``_MARKUP``: none). Lines with no blank line between them are one
    paragraph to ``split``, and a sentence ran on through such lines:

    * table rows written without a leading pipe ("hobblex valve | brass | 2 cm", a DOCX table's
      row; a Markdown row under a paragraph): a fact of a row was cited at the paragraph above
      the table. A row stands apart when a row of as many cells is next to it: a prose line
      with pipes in it ("accepts the modes fast | slow | auto and", a shell pipeline wrapped
      over two lines) runs on as prose;
    * with ``org``, Org's markup lines (``_ORG_MARKUP``);
    * a container's fence (``:::note``, ``:::``: ``_CONTAINER_FENCE``)."""
    lines, pos = [], 0
    for line in text.split("\n"):
        lines.append((pos, line, _cells_of(line)))
        pos += len(line) + 1
    out: dict[int, str] = {}
    for k, (at, line, cells) in enumerate(lines):
        beside = (k and lines[k - 1][2] == cells) or (k + 1 < len(lines) and lines[k + 1][2] == cells)
        if cells and beside:
            out[at] = "table"
        kind = next((kind for pattern, kind in _ORG_MARKUP if pattern.fullmatch(line)), None) if org else None
        if kind is not None:
            out[at] = kind
        elif _CONTAINER_FENCE.fullmatch(line):
            out[at] = _MARKUP
    return out


def _cut(text: str, start: int, part: str, apart: dict[int, str]) -> list[tuple[int, str, str | None]]:
    """``part`` (prose at ``start`` in ``text``) cut at the lines that stand apart
    (``_lines_apart``): (offset, text, kind) for each such line's share of it, and (offset,
    text, None) for each run of prose between them."""
    if not apart:
        return [(start, part, None)]
    out: list[tuple[int, str, str | None]] = []
    run = None  # where the current run of prose starts, in part
    pos = 0
    for segment in part.split("\n"):
        kind = apart.get(text.rfind("\n", 0, start + pos) + 1)
        if kind is None:
            run = pos if run is None else run
        else:
            if run is not None:
                out.append((start + run, part[run : pos], None))
                run = None
            out.append((start + pos, segment, kind))
        pos += len(segment) + 1
    if run is not None:
        out.append((start + run, part[run:], None))
    return out


_PROSE = ("sentence", "item")
# Where a sentence's clauses part: a comma, semicolon or colon, or a contrasting word. Not
# ``claims.clauses``: that one keeps a short part with the clause before it, and "not the
# fuel" is exactly such a part.
# A clause ends at a comma, semicolon or colon, at a contrast ("but") or at a condition ("as
# long as", "unless", "if"): "physicians may dispense drugs as long as there is no patient
# exploitation" states that they may; its "no" is the condition's.
_CLAUSE = re.compile(
    r"[,;:](?=\s)|\s(?:but|whereas|although|though|as long as|so long as|provided that|providing that|unless|if)\s",
    re.I)


def _clauses(sentence: str) -> tuple[tuple[frozenset[str], bool], ...]:
    """A negating sentence's clauses, each with its vocabulary and polarity, when it has more
    than one ("Oxygen is the oxidant, not the fuel"); else none."""
    parts = [part for part in _CLAUSE.split(sentence) if part.strip()]
    if len(parts) < 2:
        return ()
    return tuple((frozenset(vocabulary(part)), negated_outside_code(part)) for part in parts)


def _cells(row: str) -> tuple[tuple[frozenset[str], bool], ...]:
    cells = [cell for cell in row.strip().strip("|").split("|") if cell.strip()]
    return tuple((frozenset(vocabulary(cell)), negated_outside_code(cell)) for cell in cells)


def negated_for(p: Passage, c: Claims) -> bool:
    """Whether ``p`` says the negation of what it shares with ``c``. A table row states one
    thing per cell, so only the cells holding the claim's words count: in
    ``| Q4_1 | [GH](...) | Legacy method (not used widely) |`` the name and its link are not
    denied by the third cell's "not". A sentence negates for a claim that does not when the
    clause holding most of the claim's words negates: "Oxygen is the oxidant, not the fuel"
    supports "Oxygen is the oxidant" and not "Oxygen is the fuel" (a tie counts as negating).
    A claim that negates is read against the whole sentence."""
    if not p.negated or not p.cells:
        return p.negated
    if p.kind == "table":
        return any(denies for words, denies in p.cells if any(in_vocabulary(x, words) for x in c.words))
    if c.negated:  # a claim that negates is read against the whole sentence, as before
        return True
    held = [sum(1 for x in c.words if in_vocabulary(x, words)) for words, _ in p.cells]
    most = max(held)
    return most == 0 or any(denies for (_, denies), n in zip(p.cells, held, strict=True) if n == most)


class ItemEvidence:
    """One evidence item as grounding reads it; each part is computed on first use.
    ``topic``: the question's words its document's name holds (see ``Evidence``)."""

    def __init__(self, text: str, topic: frozenset[str] = frozenset(), org: bool = False) -> None:
        self.text = text
        self.topic = topic
        self.org = org  # an Org file's text: its markup lines are no passages

    @cached_property
    def flat(self) -> str:
        """The text with its whitespace made single spaces."""
        return " ".join(self.text.split())

    @cached_property
    def passages(self) -> tuple[Passage, ...]:
        return tuple(passages(self.text, self.org))

    @cached_property
    def whole(self) -> Passage:
        """The text as one passage, with no polarity of its own: how a table is held."""
        return Passage(0, len(self.text), self.text, frozenset(vocabulary(self.text)), False, "whole")

    @cached_property
    def lines(self) -> tuple[str, ...]:
        return tuple(self.text.split("\n"))

    @cached_property
    def flat_lines(self) -> tuple[str, ...]:
        return tuple(" ".join(line.split()) for line in self.lines)

    def holds_anchors(self, c: Claims) -> bool:
        return all(has_anchor(kind, a, self.text, self.flat) for kind, a in c.anchors)


def org_file(item: EvidenceItem) -> bool:
    """Whether ``item`` is lines of an Org file (``.org``; a web page's address is no file name)."""
    return not item.url and item.start_line is not None and item.source.lower().endswith(".org")


_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")  # "crisis_of_2007%E2%80%9308": the escape of a dash


def document_name(item: EvidenceItem) -> str:
    """What an item's document is called: its file's name without the extension (its
    underscores, dashes and escapes as spaces) and its section's heading."""
    base = re.split(r"[/\\]", item.source.rstrip("/"))[-1]
    stem_, dot, _ = base.rpartition(".")
    return f"{_ESCAPE.sub(' ', stem_ if dot else base).replace('_', ' ')} {item.title}"


class Evidence:
    """The items of one answer, each read once (``ItemEvidence``), in evidence order.

    A passage is about its document's subject even where it does not name it ("It was
    founded in 1636" in Harvard_University.txt). So the words of the question (``asked``)
    that an item's document name holds (``document_name``) count as held by every passage of that
    item: an answer that repeats the question's subject ("Leonard Bernstein went to
    Harvard") is held by a passage of the Harvard article that lists "conductor Leonard
    Bernstein". Only the question's words: what the answer adds must be written."""

    def __init__(self, items: Sequence[EvidenceItem], asked: frozenset[str] = frozenset()) -> None:
        self.items = tuple(items)
        self.asked = asked
        self._read: dict[int, ItemEvidence] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int) -> ItemEvidence:
        if k not in self._read:
            topic = frozenset(w for w in vocabulary(document_name(self.items[k])) if self.asked and in_vocabulary(w, self.asked))
            self._read[k] = ItemEvidence(self.items[k].text, topic, org_file(self.items[k]))
        return self._read[k]
