"""The text rewrite: markers moved to the passages that support a piece, and nothing else.

Pure string work, given the verdicts. ``Sources`` is the list the rewritten markers ``[j]``
index: evidence items narrowed to their supporting passage (``narrow``), one entry per
place the footer would print. ``Sources.remap`` points a piece's markers at it, ``cite``
writes a supported sentence's markers (the model's, or the best item's, then up to
``CORROBORATING`` other files), ``place`` and ``place_block`` put a marker or tag where it
goes, ``source_references`` turns a copied evidence header into its marker, and
``Assembly`` joins the pieces, giving a piece strict mode removed one of the spaces around
it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from attrs import evolve

from ..answer import MARKER, code_split, marker_numbers, plain_markers, rewrite_markers
from ..safe_text import display_name
from ..sentences import SENTENCE_ENDS
from ..state import EvidenceItem
from .claims import strip_markers
from .evidence import Evidence
from .rules import COVERAGE, Support, nearest, written

__all__ = [
    "CORROBORATING",
    "Assembly",
    "Sources",
    "after_last_marker",
    "narrow",
    "place",
    "place_block",
    "replace_markers",
    "source_references",
]

CORROBORATING = 2  # most files cited beside the one a sentence's marker names
CORROBORATION = 0.8  # share of a sentence's content words a file beside the cited ones must hold


def narrow(item: EvidenceItem, s: Support | None) -> EvidenceItem:
    """The item cut to its supporting passage, lines counted in its file."""
    if s is None or item.start_line is None:
        return item
    first = item.start_line + item.text.count("\n", 0, s.start)
    last = item.start_line + item.text.count("\n", 0, max(s.start, s.end - 1))
    return evolve(item, text=item.text[s.start : s.end], start_line=first, end_line=last, anchor_line=None)


def _file(item: EvidenceItem) -> str:
    return item.url or item.source


_ENDS = SENTENCE_ENDS + "。！？"


# A sentence that points at its source before saying what is there: "See [2] for the rollback
# command.", "Also see [1][3] for ...", "See [1], [3] and [4] for ...", "According to [2], the ...",
# "According to [2], `widget rollback` is ...", a list item's or a quote's ("- See [2] for ...").
# Its marker stays after the "see", in the place of the whole run ("See [2] and for ..." was left
# of "See [3] and [4] for ...", "According to, the ... [2]." of "According to [2], the ...", and
# "- for the ... [2]." of "- See [9] for the ...").
_POINTED = r"\[[^\]\n]*\d[^\]\n]*\]"
_POINTER = re.compile(r"([ \t]*(?:>[ \t]?)*(?:(?:[-*+]|\d{1,9}[.)])[ \t]+)?"
                      r"(?:(?:(?:also,?|please|you[ \t]+can(?:[ \t]+also)?)[ \t]+)?see(?:[ \t]+also)?"
                      r"|according[ \t]+to|as[ \t]+(?:noted|stated|described|explained|shown|mentioned)[ \t]+in))[ \t]*"
                      + _POINTED + r"(?:(?:[ \t]*[,;&][ \t]*(?:(?:and|or)[ \t]+)?|[ \t]+(?:and|or)[ \t]+|[ \t]*)"
                      + _POINTED + r")*(?=[ \t]*,?[ \t]*[^\W\d_]|[ \t]*,[ \t]*[\d`\"'“‘(*_])", re.I)


def replace_markers(text: str, tag: str) -> str:
    """``text`` with its markers replaced by ``tag``: right after the "see" of a sentence that
    opens by pointing at its source ("See [2] for ...", "According to [2], ..."), where the
    marker's "see" would otherwise go with it ("for the rollback command [2]."), else where
    ``place`` puts it."""
    pointer = _POINTER.match(text)
    if pointer is not None:
        rest = strip_markers(text[pointer.end() :]).lstrip()
        return pointer.group(1) + " " + tag + ("" if rest.startswith(",") else " ") + rest
    return place(strip_markers(text), tag)


def place(text: str, tag: str) -> str:
    """``tag`` added where a marker goes: before the final punctuation, or at the end."""
    body = text.rstrip()
    trail = text[len(body) :]
    if body and body[-1] in _ENDS + ":;":
        cut = len(body) - 1
        while cut > 0 and body[cut - 1] in _ENDS:
            cut -= 1
        return body[:cut].rstrip() + " " + tag + body[cut:] + trail
    return body + " " + tag + trail


def place_block(text: str, kind: str, tag: str) -> str:
    """``tag`` on the line after a code block, or after a blank line below a table."""
    return text + ("\n\n" if kind == "table" else "\n") + tag.strip()


def after_last_marker(text: str, marks: str) -> str:
    """``marks`` inserted right after the last marker of ``text`` outside code."""
    if not marks:
        return text
    pieces = code_split(text)
    for i in reversed(range(0, len(pieces), 2)):
        found = list(MARKER.finditer(pieces[i]))
        if found:
            end = found[-1].end()
            pieces[i] = pieces[i][:end] + marks + pieces[i][end:]
            return "".join(pieces)
    return text


class Sources:
    """The sources list of one grounded answer and the markers that index it."""

    def __init__(self, items: Sequence[EvidenceItem], corroborate: bool = True,
                 evidence: Evidence | None = None) -> None:
        self.items = items
        self.corroborate = corroborate  # off for quotes (the offline answer): cited where written
        self.evidence = evidence  # the items as grounding reads them: where a piece not judged is
        self.sources: list[EvidenceItem] = []
        self.index: dict[tuple, int] = {}

    def source(self, item: EvidenceItem) -> int:
        """The 1-based index of ``item`` in the sources list. Items the footer would print
        alike (one file and cited line, or one URL with no line) are one source: when two
        passages open at one line, the source spans the longer one."""
        key = (item.source, item.url, item.cite_line)
        if key not in self.index:
            self.sources.append(item)
            self.index[key] = len(self.sources)
        else:
            k = self.index[key] - 1
            held = self.sources[k]
            if item.cite_line is not None and (item.end_line or 0) > (held.end_line or 0):
                self.sources[k] = item
        return self.index[key]

    def marker(self, s: Support) -> str:
        """``[j]`` for the passage ``s`` names: its item narrowed to it, as a source."""
        return f"[{self.source(narrow(self.items[s.index], s))}]"

    def remap(self, text: str, supported: dict[int, Support] | None = None, near: bool = False) -> str:
        """Markers pointed at the sources list: all of them for a piece that is not judged (at
        the place an item writes it word for word, if it does, else, with ``near``, at the
        passage holding most of its words: ``nearest``); for a supported piece, those whose
        item supports it, at the supporting passage."""

        def place_of(k: int) -> Support | None:
            if supported is not None:
                return supported[k]
            span = written(text, self.items[k].text, short=True)  # a copied piece: where it is written
            if span is not None:
                return Support(k, 1.0, span[0], span[1], "copied")
            return nearest(text, self.evidence[k], k) if near and self.evidence is not None else None

        def replace(numbers: list[int]) -> str:
            marks = [
                f"[{self.source(narrow(self.items[k - 1], place_of(k - 1)))}]"
                for k in numbers
                if 1 <= k <= len(self.items) and (supported is None or k - 1 in supported)
            ]
            return "".join(dict.fromkeys(marks))

        return rewrite_markers(text, replace)

    def cited(self, text: str) -> list[int]:
        """The 0-based items the markers of ``text`` name, outside code, in order."""
        out: list[int] = []
        pieces = code_split(text)
        for i in range(0, len(pieces), 2):
            for m in MARKER.finditer(pieces[i]):
                out.extend(k - 1 for k in marker_numbers(m.group(1)) if 1 <= k <= len(self.items))
        return out

    def cite(self, text: str, found: Sequence[Support], about: Sequence[int] | None = None) -> str:
        """Supported prose with its markers: the model's markers whose items support it stay
        where they are, or, when none does, the best supporting item's marker goes before the
        final punctuation; other files that hold it as well follow (``corroborating``), of
        those ``about`` what the question asks when given."""
        by_item = {s.index: s for s in found}
        kept = [k for k in self.cited(text) if k in by_item]
        if kept:
            return after_last_marker(self.remap(text, by_item), self.corroborating(found, kept, about))
        best = max(found, key=lambda s: s.coverage)
        return replace_markers(text, self.marker(best) + self.corroborating(found, [best.index], about))

    def corroborating(self, found: Sequence[Support], cited: Sequence[int], about: Sequence[int] | None = None) -> str:
        """Markers for up to ``CORROBORATING`` more files that hold a prose sentence fully
        (``COVERAGE``, every anchor), best first, then in evidence order: a small model picks
        one of several pages that state a fact, often not the one the question is about. A
        file corroborates only when it holds the sentence about as fully as the items cited
        (``CORROBORATION``, or as fully as they do when they hold less): "The narwhal lives in
        the north" holds two of the three words of "The walrus lives in the north", which
        walrus.md holds all of, and is not cited beside it; a page that holds eight of a
        sentence's nine words ("official" aside) is. With ``about``, only those items may."""
        if not self.corroborate:
            return ""
        seen = {_file(self.items[k]) for k in cited}
        floor = max(COVERAGE, min(CORROBORATION, max(s.coverage for s in found if s.index in cited)))
        marks: list[str] = []
        for s in sorted(found, key=lambda s: (-s.coverage, s.index)):
            if len(marks) == CORROBORATING:
                break
            f = _file(self.items[s.index])
            if s.coverage >= floor and f not in seen and (about is None or s.index in about):
                seen.add(f)
                marks.append(self.marker(s))
        return "".join(marks)


_REFERENCE = re.compile(r"(?<![\w/.-])\[?([^\s`\[\]()<>]+?):L(\d+)(?:-L(\d+))?\]?(?![\w-])")


# What comes before a reference written as a citation, "(", "(see ", "(source: ", "see ", "cf. ",
# and what comes after it: the clause or the parenthesis ends there.
_OPENS_CITATION = re.compile(r"(?:\(\s*(?:(?:see(?:\s+also)?|cf\.?|sources?|refs?|references?)\s*:?\s*)?"
                             r"|\b(?:see(?:\s+also)?|cf\.?)\s*:?\s*)\Z", re.I)
_CLOSES_CITATION = re.compile(r"\s*(?:[.,;:!?)]|\Z)")


# "[Source 1]", "(source 1)", "[Evidence #2]": a marker written with a word, as models write them
# and "[^1]", a Markdown footnote's marker
_WORDED = re.compile(r"(?:\[|\()(?:source|evidence|item|ref|reference|\^)\s*#?\s*(\d{1,4})(?:\](?![(\[])|\))",
                     re.IGNORECASE)
# "【2】", "【4:0†source】": how models used to a file-search tool cite; never prose, so one naming
# no item is a marker that points at no evidence, and goes.
_LENTICULAR = re.compile(r"[ \t]?\u3010(\d{1,4})(?:[:\u2020][^\u3011\n]{0,80})?\u3011")
# "The server listens on port 8080 (1).": a marker written in parentheses, after a space at the
# end of a sentence or line (or before a comma), before any bracketed marker of the reply (one
# that cites with "[1]" means its later "exit status (2)." as written; decided by what comes
# before, so a streamed answer never takes it back). Left as written, "(1)" was a number no
# evidence holds, and a right answer became the no-evidence sentence.
_PAREN = re.compile(r"(?<=[\w)\]\"'\u2019\u201d%])([ \t])\((\d{1,4})\)(?=[.!?;:,][ \t]*(?:$|\s)|[ \t]*$)", re.M)
# "[1](docs/setup.md)": a Markdown link whose text is an item's number, as models that cite with
# links write; its target is no claim (a page's anchor, "[2](#step-2)", is a link). Left as
# written, its "1" was a number no evidence holds, and a right answer became the no-evidence sentence.
_LINKED = re.compile(r"\[\s*(\d{1,4})\s*\]\((?!#)[^()\s]*\)")


def source_references(text: str, items: Sequence[EvidenceItem]) -> str:
    """``text`` with each evidence header the model copied as a reference
    (``docs/setup.md:L40-L58``, bare, bracketed or as inline code) turned into the marker of
    the item it names (Qwen2.5-Coder-1.5B once wrote every step that way), and each marker
    written with a word (``[Source 1]``, ``(source 1)``), as a footnote's (``[^1]``), in lenticular
    brackets (``【1】``, ``【1†source】``), in superscript digits (``[¹]``) or in brackets of its
    own (``[[1]]``: ``plain_markers``) into ``[1]``. A path with a
    line that no item holds, written as a citation (``_cites``), is a marker that points at no
    evidence (one past the last item), which renumbering removes; elsewhere in prose it is left
    as written, and so is a path without a line, which prose uses for files it talks about, and
    a worded marker naming no item."""
    text = _cited_files(_worded_markers(plain_markers(text), len(items)), items)
    spans: dict[str, list[tuple[int, int, int]]] = {}
    for k, item in enumerate(items, start=1):
        if item.start_line is not None:  # as the prompt's header shows it: in display form
            spans.setdefault(display_name(item.source), []).append((k, item.start_line, item.end_line or item.start_line))
    if ":L" not in text:
        return text

    def marker(match: re.Match[str]) -> str | None:
        found = spans.get(match.group(1))
        digits = match.group(2).lstrip("0")  # a line of ten digits or more is no item's: int() refuses 4300
        line = int(digits or 0) if len(digits) < 10 else 0
        k = next((k for k, a, b in found or () if a <= line <= b), None)
        return None if k is None else f"[{k}]"

    def replace(match: re.Match[str]) -> str:
        return marker(match) or (f"[{len(items) + 1}]" if _cites(match) else match.group(0))

    pieces = code_split(text)
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            pieces[i] = _REFERENCE.sub(replace, piece)
        elif piece.startswith("`") and not piece.startswith("```"):  # a code span holding only a reference
            inner = _REFERENCE.fullmatch(piece.strip("`").strip())
            mark = marker(inner) if inner else None
            pieces[i] = mark or piece
    return "".join(pieces)


def _cited_files(text: str, items: Sequence[EvidenceItem]) -> str:
    """``text`` with each path of an item's file written with no line as a citation
    (``(see docs/setup.md)``, ``[docs/setup.md]``, ``(source: `docs/setup.md`)``: ``_cites``) as
    the marker of the first item of that file, which grounding moves to the item that supports
    the sentence. Left as written, the path was an identifier no passage holds, and a right
    answer citing so was refused. In prose ("as docs/setup.md says") it stays, and so do a
    Markdown link's text or target (``[the guide](docs/setup.md)``), which a marker broke, and
    a path in parentheses inside the clause (``_aside``), which names the file it talks about."""
    first: dict[str, int] = {}
    for k, item in enumerate(items, start=1):
        first.setdefault(display_name(item.source), k)
    named = sorted((name for name in first if name in text), key=len, reverse=True)
    if not named:
        return text
    path = re.compile(r"(?<![\w/.:-])\[?(" + "|".join(map(re.escape, named)) + r")\]?(?![\w/:-]|\.\w)")
    pieces = code_split(text)
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            pieces[i] = path.sub(lambda m: f"[{first[m.group(1)]}]" if _cites(m) and not (_linked(m) or _aside(m))
                                 else m.group(0), piece)
        elif piece.startswith("`") and not piece.startswith("```") and piece.strip("`").strip() in first:
            before, after = "".join(pieces[:i]), "".join(pieces[i + 1 :])  # a code span holding only the path
            if _OPENS_CITATION.search(before) and _CLOSES_CITATION.match(after):
                pieces[i] = f"[{first[piece.strip('`').strip()]}]"
    return "".join(pieces)


# A path alone in parentheses that do not end the clause: "the config (config/app.yaml) sets it",
# "... (config/app.yaml) [1].", the file the sentence talks about, which a marker took from it.
_BARE_OPEN = re.compile(r"\(\s*\Z")
_ENDS_CLAUSE = re.compile(r"\s*\)\s*(?:[.,;:!?](?!\S)|\Z)")


def _aside(match: re.Match[str]) -> bool:
    """Whether ``match`` is a path alone in parentheses that do not end the clause (``_BARE_OPEN``)."""
    return bool(_BARE_OPEN.search(match.string, 0, match.start())) and not _ENDS_CLAUSE.match(match.string, match.end())


def _linked(match: re.Match[str]) -> bool:
    """Whether ``match`` is a Markdown link's text (``[docs/setup.md](...)``) or its target
    (``[...](docs/setup.md)``)."""
    text, start, end = match.string, match.start(), match.end()
    return text.endswith("](", 0, start) or (match.group(0).endswith("]") and text.startswith("(", end))


def _cites(match: re.Match[str]) -> bool:
    """Whether a reference no item holds is written as a citation (``[docs/a.md:L3]``,
    ``(see docs/a.md:L3)``, ``, see docs/a.md:L3``): a marker that points at no evidence, which
    renumbering removes with its brackets. In prose otherwise, it is left as written."""
    written, before, after = match.group(0), match.string[: match.start()], match.string[match.end() :]
    if written.startswith("[") and written.endswith("]"):
        return True
    return bool(_OPENS_CITATION.search(before) and _CLOSES_CITATION.match(after))


def _worded_markers(text: str, n: int) -> str:
    """``[Source K]`` and the like, and ``(K)`` ending a sentence before any bracketed marker
    (``_PAREN``), outside code, as ``[K]`` when 1 <= K <= ``n``."""
    if "\u3010" in text:
        pieces = code_split(text)
        for i in range(0, len(pieces), 2):
            pieces[i] = _LENTICULAR.sub(lambda m: f" [{m.group(1)}]", pieces[i])
        text = "".join(pieces)
    if not n or not (_WORDED.search(text) or _PAREN.search(text) or _LINKED.search(text)):
        return text

    def replace(match: re.Match[str]) -> str:
        k = int(match.group(1))
        return f"[{k}]" if 1 <= k <= n else match.group(0)

    def parenthesised(match: re.Match[str]) -> str:
        return f"{match.group(1)}[{match.group(2)}]" if 1 <= int(match.group(2)) <= n else match.group(0)

    pieces = code_split(text)
    cited = False  # a bracketed marker before: the reply cites so, and means "(2)" as written
    for i in range(0, len(pieces), 2):
        piece = _WORDED.sub(replace, _LINKED.sub(replace, pieces[i]))
        out, at = [], 0
        for m in _PAREN.finditer(piece):
            cited = cited or MARKER.search(piece, at, m.start()) is not None
            out += [piece[at : m.start()], m.group(0) if cited else parenthesised(m)]
            at = m.end()
        pieces[i] = "".join(out) + piece[at:]
        cited = cited or MARKER.search(piece, at) is not None
    return "".join(pieces)


_LIST_MARKER = re.compile(r"([ \t]*)(?:(\d{1,9})([.)])|[-*+])(?=[ \t])")


class Numbering:
    """An ordered list's numbers kept in order when strict mode removes some of its items:
    "1. a", "2. b", "3. c" with the second removed becomes "1. a", "2. c". Each list is
    known by its indentation; a line that is no item, not indented, ends every list, and an
    item ends the lists indented deeper than itself."""

    def __init__(self) -> None:
        self.next: dict[int, int] = {}  # indentation: the number its list's next kept item gets

    def item(self, piece: str, text: str, at_line_start: bool, kept: bool) -> str:
        """``text`` (the rewritten ``piece``) with its number made the list's next one."""
        if not at_line_start:
            return text
        m = _LIST_MARKER.match(piece)
        if m is None:
            if piece[:1] not in (" ", "\t"):
                self.next.clear()
            return text
        indent = len(m.group(1).expandtabs(4))
        self.next = {k: v for k, v in self.next.items() if k <= indent}
        if m.group(2) is None:  # a bullet ends an ordered list at its indentation
            self.next.pop(indent, None)
            return text
        number = self.next.setdefault(indent, int(m.group(2)))
        written = _LIST_MARKER.match(text)
        if not kept or written is None or written.group(2) is None:
            return text
        self.next[indent] = number + 1
        return f"{written.group(1)}{number}{written.group(3)}{text[written.end():]}"


class Assembly:
    """The rewritten pieces of an answer joined in order. A piece strict mode removed
    (``drop``) takes one of the spaces around it: of the space before and the one after,
    the one with more line breaks stays, so no blank line is doubled and no paragraph
    break is lost."""

    def __init__(self) -> None:
        self.out: list[tuple[str, str]] = []  # (kind, text); a removed piece is ("gone", "")

    def space(self, text: str) -> None:
        out = self.out
        kept = [k for k, (kind, _) in enumerate(out) if kind != "gone"]
        if out and out[-1][0] == "gone" and (not kept or out[kept[-1]][0] == "space"):
            if kept and text.count("\n") > out[kept[-1]][1].count("\n"):
                out[kept[-1]] = ("space", text)
            return
        out.append(("space", text))

    def text(self, text: str) -> None:
        self.out.append(("text", text))

    def drop(self) -> None:
        self.out.append(("gone", ""))

    def body(self) -> str:
        return "".join(text for _, text in self.out)
