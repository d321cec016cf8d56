"""Grounding: which evidence item, and which line of it, supports each sentence of an answer.

Pure and mechanical: no LLM call, no I/O. ``ground(body, items, mode)`` runs after the
model has written its answer and before the footer is made:

1. ``split`` cuts the body into pieces whose concatenation is the body: prose sentences
   (a list item's too, its first sentence keeping the bullet), code blocks and tables (kept
   whole), headings and rules, and the whitespace between them.
2. A piece is *judged* when it has content of its own: a content word that is not a stop
   word nor answer scaffolding ("Here is what I found:" is not judged), or a number,
   identifier or inline code. Headings, rules and crag's own fixed sentences are never
   judged, nor is a lead-in that only restates the question ("To render templates, follow
   these steps:": a colon at the end, no anchor, only the question's content words).
3. ``support(piece, item)`` says whether an evidence item holds the piece's substance, and
   where: the piece's numbers, dates, versions, identifiers, inline code and URLs must all
   appear in one passage of the item (up to three consecutive sentences), that passage must
   hold most of its content words (``COVERAGE``), and the two must agree on negation
   ("is not" against "is"); a paraphrase keeping all its anchors needs less of its wording
   (``_anchored``). A code block is supported by an item that holds most of its
   lines. The answer cites the line where that passage starts in the file.
4. Markers are rewritten: a marker on a judged piece stays only if its item supports the
   piece; a supported piece the model left unmarked gets the best supporting item; a
   supported prose sentence also cites up to ``CORROBORATING`` other files that hold it; an
   unsupported piece loses its markers and, in ``note`` mode, is tagged ``[unsupported]``
   (``strict`` removes it). In ``note`` mode, a prose sentence no item holds as a whole is
   judged again clause by clause (``clauses``): when a clause is supported, each clause gets
   its own marker or tag, and the sentence is supported when every judged clause is. Pieces
   that are not judged keep their markers as written.

The result's ``sources`` are narrowed copies of the evidence items (``start_line`` and
``end_line`` are the supporting passage's lines), and the body's markers ``[j]`` index
them, so ``answer.compose`` renumbers them and writes a footer of supporting items only.

Each piece is judged on its own text, so grounding a prefix of an answer made of whole
pieces gives a prefix of grounding the whole answer: the chat's streamed output can show
grounded sentences while the model is still writing (``render_prefix``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from attrs import evolve, frozen

from .answer import FIXED_SENTENCES, MARKER, code_split, marker_numbers
from .sentences import FENCE, Piece, sentences, split
from .state import EvidenceItem, GroundingReport
from .text import STOPWORDS, stem, words

__all__ = [
    "COVERAGE",
    "MODES",
    "UNSUPPORTED_TAG",
    "Grounded",
    "Piece",
    "Support",
    "ground",
    "note_line",
    "render_prefix",
    "split",
    "support",
]

MODES = ("note", "strict", "off")
UNSUPPORTED_TAG = "[unsupported]"
COVERAGE = 0.6  # share of a piece's content words its supporting passage must hold
ANCHORED_COVERAGE = 0.3  # the same for a passage holding all of a piece's anchors (code, names, numbers)
CORROBORATING = 2  # most files cited beside the one a sentence's marker names
_WINDOW = 3  # most consecutive item sentences one answer sentence may draw on
CLAUSE_WORDS = 3  # fewest content words and anchors of a clause judged on its own
_CLAUSE_BREAK = re.compile(r"[,;][ \t]+")

# Words that make a sentence about the answer rather than about the subject.
SCAFFOLDING = frozenset(
    """
    answer answers summary summarize summarized found find following follows here below above
    evidence source sources documentation docs doc document documents based according
    information info passage passages provided context question questions mention mentions
    mentioned say says said see sure certainly hope helps help note notes detail details
    relevant available let look looks steps step overview quick short brief like would
    welcome glad happy pleasure feel free ask asking hesitate reach assist assistance anything
    else thanks thank need re ve ll follow example examples
    """.split()
)  # and courtesy: "You're welcome!", "Feel free to ask if you have other questions."
_NEGATION = frozenset(
    "not no never cannot can't won't don't doesn't isn't aren't wasn't weren't shouldn't mustn't "
    "didn't couldn't wouldn't hasn't haven't hadn't without none neither nor".split()
)
# Month names are anchors of a date ("May" is left out: it is mostly a verb).
_NUMBER_WORDS = {
    w: str(n) for n, w in enumerate(
        "zero _ two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()) if w != "_"
} | {"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80",
     "ninety": "90", "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
     "twice": "2"}
_DIGIT_WORDS = {digits: word for word, digits in _NUMBER_WORDS.items() if word != "twice"}
_MONTHS = "january february march april june july august september october november december".split()

# -- what a piece claims ---------------------------------------------------------------------

_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_URL = re.compile(r"https?://[^\s<>()\[\]`\"']+")
_NUMBER = re.compile(r"(?<![\w])v?(\d+(?:[.,:/-]\d+)*)")
_IDENT = re.compile(
    r"(?<![\w./-])(?:--?[A-Za-z][\w-]*|[A-Za-z_][\w-]*(?:[./][\w-]+)+|[A-Za-z]*_[\w]*|"
    r"[a-z]+[A-Z][\w]*|[A-Z]+[a-z]+[A-Z][\w]*|[A-Z][A-Z0-9]*_[A-Z0-9_]+)(?![\w])"
)
_MONTH = re.compile(r"\b(" + "|".join(_MONTHS) + r")\b", re.I)
_NOT_IDENT = frozenset({"e.g", "i.e", "a.k.a", "vs", "etc"})
_ADMONITION = re.compile(r"\[![A-Za-z]+\][ \t]*(?:\n[ \t]*(?:>[ \t]?)*)?")
_PREFIX = re.compile(r"^[ \t]*(?:>[ \t]?)*(?:(?:[-*+]|\d{1,3}[.)])[ \t]+)?")  # "> ", "- ", "1. "; not "**bold**"


@frozen
class Claims:
    """What a piece says: content words (stemmed) and anchors that must appear verbatim."""

    words: frozenset[str]
    anchors: tuple[tuple[str, str], ...]  # (kind, text): code, url, number, ident, month
    negated: bool

    @property
    def empty(self) -> bool:
        return not self.words and not self.anchors


def _strip_markers(text: str) -> str:
    pieces = code_split(text)
    for i in range(0, len(pieces), 2):
        pieces[i] = MARKER.sub("", pieces[i]).replace(UNSUPPORTED_TAG, "")
    return "".join(pieces)


def _negated(text: str) -> bool:
    low = text.lower().replace("’", "'")
    tokens = re.findall(r"[a-z]+(?:'[a-z]+)?", low)
    return any(t in _NEGATION or t.endswith("n't") for t in tokens)


def claims(text: str) -> Claims:
    """The content words and anchors of a piece of answer text (markers ignored)."""
    bare = _PREFIX.sub("", _strip_markers(text), count=1)
    anchors: list[tuple[str, str]] = []
    for m in _INLINE_CODE.finditer(bare):
        code = " ".join(m.group(1).split())
        if code:
            anchors.append(("code", code))
    prose = _INLINE_CODE.sub(" ", bare)
    for m in _URL.finditer(prose):
        anchors.append(("url", m.group(0).rstrip(".,;:!?")))
    prose = _URL.sub(" ", prose)
    prose = re.sub(r"\]\([^)\s]*\)", "] ", prose)  # a Markdown link's target
    for m in _IDENT.finditer(prose):
        token = m.group(0)
        if token.lower() in _NOT_IDENT or ("/" in token and not token.startswith("/") and not any(
                ch in token for ch in "._")):
            continue  # "e.g", "read/write": prose, not an identifier
        anchors.append(("ident", token))
    for m in _NUMBER.finditer(prose):
        anchors.append(("number", m.group(1).rstrip(".,:/-")))
    for m in _MONTH.finditer(prose):
        anchors.append(("month", m.group(1).lower()))
    for w in words(prose):
        if w in _NUMBER_WORDS:
            anchors.append(("number", w))
    content = set()
    for w in words(prose):
        if w.isdigit() or w in STOPWORDS or w in SCAFFOLDING or w in _NEGATION or w in _NUMBER_WORDS:
            continue
        s = stem(w)
        if len(s) < 2 or s in STOPWORDS or s in SCAFFOLDING:
            continue
        content.add(s)
    return Claims(frozenset(content), tuple(dict.fromkeys(anchors)), _negated(prose))


def _has_anchor(kind: str, anchor: str, text: str, flat: str) -> bool:
    if kind == "code":
        return anchor in flat
    if kind == "url":
        return anchor in text
    if kind == "number":  # "3" and "three" are the same number
        if anchor.isalpha():
            forms = [anchor, _NUMBER_WORDS[anchor]]
        else:
            forms = [anchor] + ([_DIGIT_WORDS[anchor]] if anchor in _DIGIT_WORDS else [])
        return any(
            re.search((r"\b" + re.escape(f) + r"\b") if f.isalpha()
                      else (r"(?<!\d)(?<!\d[.,:])" + re.escape(f) + r"(?!\d|[.,:]\d)"), text, re.I)
            for f in forms
        )
    if kind == "month":
        return re.search(rf"\b(?:{anchor}|{anchor[:3]})\b", text, re.I) is not None
    return re.search(r"(?<![\w])" + re.escape(anchor) + r"(?![\w])", text, re.I) is not None


def _matches(word: str, vocabulary: set[str] | frozenset[str]) -> bool:
    if word in vocabulary:
        return True
    if len(word) < 4:
        return False
    return any(len(o) >= 4 and (o.startswith(word) or word.startswith(o)) for o in vocabulary)


# -- where an item says it -------------------------------------------------------------------


@frozen
class Passage:
    """A sentence (or a table row, code line or heading: ``kind``) of an evidence text."""

    start: int  # offset in the item's text
    end: int
    text: str
    vocabulary: frozenset[str]
    negated: bool
    kind: str = "sentence"


def passages(text: str) -> list[Passage]:
    """An evidence text cut into the passages a sentence may come from: sentences of prose
    and list items, table rows, code lines, headings; offsets into ``text``."""
    out: list[Passage] = []

    def add(start: int, part: str, kind: str) -> None:
        lead = len(part) - len(part.lstrip())
        part = part.strip()
        if not part:
            return
        s = start + lead
        out.append(Passage(s, s + len(part), part, frozenset(_vocabulary(part)), _negated(part), kind))

    for piece in split(text):
        if piece.kind in ("space", "rule"):
            continue
        if piece.kind in ("code", "table"):
            pos = piece.start
            for line in piece.text.split("\n"):
                add(pos, line, piece.kind)
                pos += len(line) + 1
        elif piece.kind == "item":
            prefix = _PREFIX.match(piece.text)
            skip = prefix.end() if prefix else 0
            for sub in sentences(piece.text[skip:], piece.start + skip):
                if sub.kind == "sentence":
                    add(sub.start, sub.text, "sentence")
        elif piece.kind == "sentence":
            prefix = _PREFIX.match(piece.text)  # a blockquote's "> "
            skip = prefix.end() if prefix else 0
            marker = _ADMONITION.match(piece.text, skip)  # "> [!NOTE]" opens the text, it is not part of it
            skip = marker.end() if marker else skip
            add(piece.start + skip, piece.text[skip:], "sentence")
        else:
            add(piece.start, piece.text, piece.kind)
    return out


def _vocabulary(text: str) -> set[str]:
    return {stem(w) for w in words(text) if not w.isdigit()}


def _negated_for(p: Passage, c: Claims) -> bool:
    """Whether ``p`` says the negation of what it shares with ``c``. A table row states one
    thing per cell, so only the cells holding the claim's words count: in
    ``| Q4_1 | [GH](...) | Legacy method (not used widely) |`` the name and its link are not
    denied by the third cell's "not"."""
    if p.kind != "table" or not p.negated:
        return p.negated
    cells = [cell for cell in p.text.strip().strip("|").split("|") if cell.strip()]
    shared = [cell for cell in cells if any(_matches(x, _vocabulary(cell)) for x in c.words)]
    return any(_negated(cell) for cell in shared)


@frozen
class Support:
    """Where item ``index`` supports a piece: the passage's offsets in the item's text."""

    index: int
    coverage: float
    start: int
    end: int


def support(c: Claims, item_text: str, index: int = 0, item_passages: Sequence[Passage] | None = None) -> Support | None:
    """The best passage of ``item_text`` that holds the claims, or None."""
    whole = " ".join(item_text.split())
    if not all(_has_anchor(kind, a, item_text, whole) for kind, a in c.anchors):
        return None
    found = item_passages if item_passages is not None else passages(item_text)
    best: Support | None = None
    for w in range(_WINDOW):  # one passage first: a wider window must do strictly better
        for i in range(len(found) - w):
            window = found[i : i + w + 1]
            if w and (any(p.kind == "heading" for p in window) or not all(
                    any(_matches(x, set(p.vocabulary)) for x in c.words) for p in (window[0], window[-1]))):
                continue  # a heading is a title, not a claim; each end of a window holds part of the claim
            text = item_text[window[0].start : window[-1].end]
            flat = " ".join(text.split())
            if not all(_has_anchor(kind, a, text, flat) for kind, a in c.anchors):
                continue
            # Negation is read where the claim is: in the passage holding most of its words.
            core = max(window, key=lambda p: sum(1 for x in c.words if _matches(x, set(p.vocabulary))))
            if _negated_for(core, c) != c.negated:
                continue
            vocabulary: set[str] = set().union(*(p.vocabulary for p in window))
            coverage = sum(1 for x in c.words if _matches(x, vocabulary)) / len(c.words) if c.words else 1.0
            if coverage >= COVERAGE and (best is None or coverage > best.coverage):
                best = Support(index, coverage, window[0].start, window[-1].end)
        if best is not None and best.coverage >= 1.0:
            break
    if best is None and c.anchors and len(c.words) >= 4:
        best = _anchored(c, item_text, index, found)
    return best


def _anchored(c: Claims, item_text: str, index: int, found: Sequence[Passage]) -> Support | None:
    """A paraphrase that keeps every anchor: a passage of the item (up to three sentences)
    holds all of the sentence's inline code, identifiers and numbers and a good part of its
    content words (``ANCHORED_COVERAGE``), and the item as a whole holds most of them. Small
    models restate a passage in words of their own around the exact names they copy; the
    anchors, read in that passage, keep an invented or changed number or name out."""
    whole: set[str] = set().union(*(p.vocabulary for p in found)) if found else set()
    if sum(1 for x in c.words if _matches(x, whole)) / len(c.words) < COVERAGE - 0.1:
        return None
    best: Support | None = None
    for w in range(_WINDOW):
        for i in range(len(found) - w):
            window = found[i : i + w + 1]
            text = item_text[window[0].start : window[-1].end]
            if not all(_has_anchor(kind, a, text, " ".join(text.split())) for kind, a in c.anchors):
                continue
            core = max(window, key=lambda p: sum(1 for x in c.words if _matches(x, set(p.vocabulary))))
            if _negated_for(core, c) != c.negated:
                continue
            vocabulary: set[str] = set().union(*(p.vocabulary for p in window))
            coverage = sum(1 for x in c.words if _matches(x, vocabulary)) / len(c.words)
            if coverage >= ANCHORED_COVERAGE and (best is None or coverage > best.coverage):
                best = Support(index, coverage, window[0].start, window[-1].end)
        if best is not None:
            break
    return best


def _code_lines(text: str) -> list[str]:
    lines = text.split("\n")[1:]
    if lines and FENCE.match(lines[-1]):
        lines = lines[:-1]
    return [" ".join(line.split()) for line in lines if line.strip()]


def code_support(code: str, item_text: str, index: int = 0) -> Support | None:
    """An item holding most lines of a code block supports it; cites the first such line."""
    wanted = _code_lines(code)
    if not wanted:
        return None
    item_lines = item_text.split("\n")
    flat = [" ".join(line.split()) for line in item_lines]
    offsets = [0]
    for line in item_lines:
        offsets.append(offsets[-1] + len(line) + 1)
    hits = []
    for w in wanted:
        at = next((k for k, f in enumerate(flat) if w and w in f), None)
        if at is not None:
            hits.append(at)
    coverage = len(hits) / len(wanted)
    if coverage < COVERAGE:
        return None
    first = min(hits)
    if first and FENCE.match(item_lines[first - 1]):
        hits.append(first - 1)  # the block starts at its fence
    return Support(index, coverage, offsets[min(hits)], offsets[max(hits)] + len(item_lines[max(hits)]))


# -- the rewrite -----------------------------------------------------------------------------


@frozen
class Grounded:
    """A grounded body: markers ``[j]`` index ``sources`` (1-based), the report, and whether
    a piece was supported."""

    body: str
    sources: tuple[EvidenceItem, ...]
    report: GroundingReport


def _narrow(item: EvidenceItem, s: Support | None) -> EvidenceItem:
    """The item cut to its supporting passage, lines counted in its file."""
    if s is None or item.start_line is None:
        return item
    first = item.start_line + item.text.count("\n", 0, s.start)
    last = item.start_line + item.text.count("\n", 0, max(s.start, s.end - 1))
    return evolve(item, text=item.text[s.start : s.end], start_line=first, end_line=last, anchor_line=None)


def _file(item: EvidenceItem) -> str:
    return item.url or item.source


def _after_last_marker(text: str, marks: str) -> str:
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


_REFERENCE = re.compile(r"(?<![\w/.-])\[?([^\s`\[\]()<>]+?):L(\d+)(?:-L(\d+))?\]?(?![\w-])")


def source_references(text: str, items: Sequence[EvidenceItem]) -> str:
    """``text`` with each evidence header the model copied as a reference
    (``docs/setup.md:L40-L58``, bare, bracketed or as inline code) turned into the marker of
    the item it names (Qwen2.5-Coder-1.5B once wrote every step that way). A path with a
    line that no item holds is left as written; so is a path without a line, which prose
    uses for files it talks about."""
    spans: dict[str, list[tuple[int, int, int]]] = {}
    for k, item in enumerate(items, start=1):
        if item.start_line is not None:
            spans.setdefault(item.source, []).append((k, item.start_line, item.end_line or item.start_line))
    if not spans or ":L" not in text:
        return text

    def marker(match: re.Match[str]) -> str | None:
        found = spans.get(match.group(1))
        line = int(match.group(2))
        k = next((k for k, a, b in found or () if a <= line <= b), None)
        return None if k is None else f"[{k}]"

    def replace(match: re.Match[str]) -> str:
        return marker(match) or match.group(0)

    pieces = code_split(text)
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            pieces[i] = _REFERENCE.sub(replace, piece)
        elif not piece.startswith(("```", "~~~")):  # a code span holding only a reference
            inner = _REFERENCE.fullmatch(piece.strip("`").strip())
            mark = marker(inner) if inner else None
            pieces[i] = mark or piece
    return "".join(pieces)


def _place(text: str, tag: str) -> str:
    """``tag`` added where a marker goes: before the final punctuation, or at the end."""
    body = text.rstrip()
    trail = text[len(body) :]
    if body and body[-1] in ".!?:;。":
        cut = len(body) - 1
        while cut > 0 and body[cut - 1] in ".!?":
            cut -= 1
        return body[:cut].rstrip() + " " + tag + body[cut:] + trail
    return body + " " + tag + trail


def _place_block(text: str, kind: str, tag: str) -> str:
    return text + ("\n\n" if kind == "table" else "\n") + tag.strip()


def _restates(c: Claims, asked: frozenset[str]) -> bool:
    """Text that only restates the question: no anchor, and every content word of it is one
    of the question's."""
    return bool(asked) and not c.anchors and all(_matches(w, asked) for w in c.words)


def _lead_in(c: Claims, text: str, asked: frozenset[str]) -> bool:
    """A lead-in that only restates the question ("To render Jinja2 templates from an
    endpoint, follow these steps:"): it ends with a colon. What it introduces is judged on
    its own."""
    return text.rstrip().endswith(":") and _restates(c, asked)


def _clause(text: str) -> bool:
    """Whether a part of a sentence says enough to be judged alone: a content word, and at
    least ``CLAUSE_WORDS`` content words, names, numbers and code spans in all."""
    c = claims(text)
    return bool(c.words) and len(c.words) + len(c.anchors) >= CLAUSE_WORDS


def clauses(text: str) -> list[str]:
    """``text`` cut after its commas and semicolons (outside code) into clauses that each
    say enough to be judged alone (``_clause``); a shorter part stays with the clause before
    it, so a list of names ("`Path`, `Query` and `Cookie`") or a short aside stays whole.
    The clauses concatenate to ``text``."""
    cuts = [0]
    pieces = code_split(text)
    pos = 0
    for i, part in enumerate(pieces):
        if i % 2 == 0:
            cuts.extend(pos + m.end() for m in _CLAUSE_BREAK.finditer(part))
        pos += len(part)
    parts = [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)], strict=True) if b > a]
    out: list[str] = []
    for part in parts:
        if out and not (_clause(out[-1]) and _clause(part)):
            out[-1] += part
        else:
            out.append(part)
    return out


class _Grounder:
    def __init__(self, items: Sequence[EvidenceItem], mode: str, question: str = "") -> None:
        self.items = items
        self.mode = mode
        self.asked = claims(question).words if question else frozenset()
        self.sources: list[EvidenceItem] = []
        self.index: dict[tuple, int] = {}
        self._passages: dict[int, list[Passage]] = {}

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

    def item_passages(self, k: int) -> list[Passage]:
        if k not in self._passages:
            self._passages[k] = passages(self.items[k].text)
        return self._passages[k]

    def supports(self, piece: Piece) -> tuple[Claims | None, list[Support]]:
        if piece.kind == "code":
            found = [code_support(piece.text, item.text, k) for k, item in enumerate(self.items)]
            return None, [s for s in found if s is not None]
        c = claims(piece.text)
        if c.empty:
            return c, []
        out = []
        for k, item in enumerate(self.items):
            if piece.kind == "table":  # a table is held by one item as a whole
                text = item.text
                s = support(c, text, k, [Passage(0, len(text), text, frozenset(_vocabulary(text)), c.negated)])
                if s is not None:
                    row = next((p for p in self.item_passages(k) if _vocabulary(p.text) & c.words), None)
                    s = Support(k, s.coverage, row.start, row.end) if row else s
            else:
                s = support(c, item.text, k, self.item_passages(k))
            if s is not None:
                out.append(s)
        return c, out

    def remap(self, text: str, supported: dict[int, Support] | None = None) -> str:
        """Markers pointed at the sources list: all of them for a piece that is not judged;
        for a supported piece, those whose item supports it, at the supporting passage."""

        def replace(match: re.Match[str]) -> str:
            lead = match.group(0)[0] if match.group(0)[0] in " \t" else ""
            marks = [
                f"[{self.source(self.items[k - 1] if supported is None else _narrow(self.items[k - 1], supported[k - 1]))}]"
                for k in marker_numbers(match.group(1))
                if 1 <= k <= len(self.items) and (supported is None or k - 1 in supported)
            ]
            return lead + "".join(dict.fromkeys(marks)) if marks else ""

        pieces = code_split(text)
        for i in range(0, len(pieces), 2):
            pieces[i] = MARKER.sub(replace, pieces[i])
        return "".join(pieces)

    def cited(self, text: str) -> list[int]:
        out: list[int] = []
        pieces = code_split(text)
        for i in range(0, len(pieces), 2):
            for m in MARKER.finditer(pieces[i]):
                out.extend(k - 1 for k in marker_numbers(m.group(1)) if 1 <= k <= len(self.items))
        return out

    def piece(self, piece: Piece) -> tuple[str, str | None]:
        """The rewritten piece and its verdict (None: not judged, "ok", "unsupported")."""
        bare_text = " ".join(_strip_markers(piece.text).split())
        if not piece.judgeable or bare_text in FIXED_SENTENCES:
            return self.remap(piece.text), None
        c, found = self.supports(piece)
        if c is not None and (c.empty or _lead_in(c, bare_text, self.asked)):
            return self.remap(piece.text), None
        stripped = piece.text if piece.kind == "code" else _strip_markers(piece.text)
        if not found and piece.kind in ("sentence", "item") and self.mode == "note":
            judged = self.by_clause(piece)
            if judged is not None:
                return judged
        if not found:
            if self.mode == "strict":
                return "", "unsupported"
            tag = UNSUPPORTED_TAG
            return (_place_block(stripped, piece.kind, tag) if piece.kind in ("code", "table")
                    else _place(stripped, tag)), "unsupported"
        if piece.kind in ("code", "table"):
            return _place_block(stripped, piece.kind, self.marker(max(found, key=lambda s: s.coverage))), "ok"
        return self.cite(piece.text, found), "ok"

    def cite(self, text: str, found: Sequence[Support]) -> str:
        """Supported prose with its markers: the model's markers whose items support it stay
        where they are, or, when none does, the best supporting item's marker goes before the
        final punctuation; other files that hold it as well follow (``corroborating``)."""
        by_item = {s.index: s for s in found}
        kept = [k for k in self.cited(text) if k in by_item]
        if kept:
            return _after_last_marker(self.remap(text, by_item), self.corroborating(found, kept))
        best = max(found, key=lambda s: s.coverage)
        return _place(_strip_markers(text), self.marker(best) + self.corroborating(found, [best.index]))

    def marker(self, s: Support) -> str:
        """``[j]`` for the passage ``s`` names: its item narrowed to it, as a source."""
        return f"[{self.source(_narrow(self.items[s.index], s))}]"

    def by_clause(self, piece: Piece) -> tuple[str, str] | None:
        """A prose sentence no item holds as a whole, judged clause by clause, or None when
        it has one clause or none of its clauses is supported. A small model joins steps
        from two pages, or a supported step and one of its own, in one long sentence; each
        clause then gets its marker or its tag. A clause that only restates the question
        ("To read a cookie in an endpoint,") is not judged. The verdict stays the
        sentence's: "ok" when every judged clause is supported, else "unsupported"."""
        parts = clauses(piece.text)
        if len(parts) < 2:
            return None
        judged: list[tuple[str, list[Support] | None]] = []  # None: not judged
        for part in parts:
            c, found = self.supports(Piece(piece.kind, part))
            judged.append((part, None if c is None or c.empty or _restates(c, self.asked) else found))
        if not any(found for _, found in judged):
            return None
        text = ""
        verdict = "ok"
        for part, found in judged:
            if found is None:
                text += self.remap(part)
                continue
            body = part.rstrip()
            sep = body[-1:] if body[-1:] in (",", ";") else ""  # the clause's own comma follows its marker
            body = body[: len(body) - len(sep)]
            trail = sep + part[len(part.rstrip()) :]
            if found:
                text += self.cite(body, found) + trail
            else:
                text += _place(_strip_markers(body), UNSUPPORTED_TAG) + trail
                verdict = "unsupported"
        return text, verdict

    def corroborating(self, found: Sequence[Support], cited: Sequence[int]) -> str:
        """Markers for up to ``CORROBORATING`` more files that hold a prose sentence fully
        (``COVERAGE``, every anchor), best first, then in evidence order: a small model picks
        one of several pages that state a fact, often not the one the question is about."""
        seen = {_file(self.items[k]) for k in cited}
        marks: list[str] = []
        for s in sorted(found, key=lambda s: (-s.coverage, s.index)):
            if len(marks) == CORROBORATING:
                break
            f = _file(self.items[s.index])
            if s.coverage >= COVERAGE and f not in seen:
                seen.add(f)
                marks.append(self.marker(s))
        return "".join(marks)


def ground(body: str, items: Sequence[EvidenceItem], mode: str = "note", question: str = "") -> Grounded:
    """The body with markers pointing at the passages that support each piece (see module doc);
    ``question``, when given, lets a lead-in that only restates it go unjudged."""
    if mode not in MODES:
        raise ValueError(f"unknown grounding mode {mode!r}")
    body = source_references(body, items)
    g = _Grounder(items, mode, question)
    out: list[tuple[str, str]] = []  # (kind, text); a piece strict mode removed is ("gone", "")
    judged = supported = 0
    unsupported: list[str] = []
    after_block = False  # the last piece was a judged code block or table
    for piece in split(body):
        if piece.kind == "space":
            kept = [k for k, (kind, _) in enumerate(out) if kind != "gone"]
            if out and out[-1][0] == "gone" and (not kept or out[kept[-1]][0] == "space"):
                # a removed piece takes one of the spaces around it: the one with more line breaks stays
                if kept and piece.text.count("\n") > out[kept[-1]][1].count("\n"):
                    out[kept[-1]] = ("space", piece.text)
                continue
            out.append(("space", piece.text))
            continue
        if mode == "off":
            out.append(("text", g.remap(piece.text)))
            continue
        if after_block and not _strip_markers(piece.text).strip():
            out.append(("gone", ""))  # the model's markers for the block above: grounding placed its own
            continue
        text, verdict = g.piece(piece)
        after_block = verdict is not None and piece.kind in ("code", "table")
        if verdict is not None:
            judged += 1
            if verdict == "ok":
                supported += 1
            else:
                unsupported.append(" ".join(_strip_markers(piece.text).split()))
        out.append(("gone", "") if verdict == "unsupported" and mode == "strict" else ("text", text))
    report = GroundingReport(sentences=judged, supported=supported, unsupported=tuple(unsupported))
    return Grounded("".join(text for _, text in out), tuple(g.sources), report)


def note_line(report: GroundingReport, mode: str) -> str | None:
    """The last line of a ``note``-mode body: how many sentences the evidence does not support."""
    n = len(report.unsupported)
    if mode != "note" or not n:
        return None
    what = "1 sentence" if n == 1 else f"{n} sentences"
    verb = "is" if n == 1 else "are"
    return f"_Note: {what} of this answer {verb} not supported by the evidence found (marked {UNSUPPORTED_TAG})._"


def render_prefix(text: str, items: Sequence[EvidenceItem], mode: str, question: str = "") -> tuple[str, int]:
    """The grounded form of the whole pieces of a partial answer, and how many sources its
    markers index: the last piece, which may still grow, is left out. Used to stream an
    answer as ``ground`` will print it."""
    pieces = split(text)
    while pieces and pieces[-1].kind == "space":
        pieces.pop()
    if not pieces:
        return "", 0
    done = ground(text[: pieces[-1].start], items, mode, question)
    if mode == "strict" and not done.report.supported:
        return "", 0  # it may still become the no-evidence sentence
    return done.body, len(done.sources)
