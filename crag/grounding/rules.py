"""When an evidence item supports a piece of an answer: the rules, as a table of records.

Theory of operation. For each judged piece and each evidence item, the rules of ``RULES``
that judge the piece's kind are tried in order and the first that holds wins for that
item: its ``Support`` names the rule, the passage it found and how much of the piece's
wording that passage covers. The piece's verdict names the first rule, in table order,
that holds for any item (``first_rule``); a piece no rule holds for is unsupported
(``NO_RULE``). Every rule except ``code_lines`` needs all of the piece's anchors in the
item, read in the passage found too.

A rule for prose is one call of ``score``, the one window loop: it slides a window of one
to ``WINDOW`` consecutive passages (or takes the item as one text) over the item, keeps
windows that hold every anchor and, when the rule reads ``polarity``, negate exactly when
the piece does, and returns the narrowest best-covered window reaching ``min_coverage``.
The rules differ only in their fields:

========================  ===========  ========  ====================================================
rule                      pieces       unit      needs
========================  ===========  ========  ====================================================
``code_lines``            code blocks  lines     ``COVERAGE`` of the block's lines, whitespace aside
``table``                 tables       whole     ``COVERAGE`` of the words in the whole item
``table_anchored``        tables       whole     anchors, ``ANCHORED_MIN_WORDS`` words, ``ITEM_COVERAGE``
``passage``               prose        passages  ``COVERAGE`` in a tight window, same polarity
``anchored``              prose        passages  anchors, ``ANCHORED_MIN_WORDS`` words,
                                                 ``ANCHORED_COVERAGE`` in a tight window, ``ITEM_COVERAGE``
                                                 in the item, same polarity
========================  ===========  ========  ====================================================
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence

from attrs import frozen

from ..sentences import FENCE
from ..text import in_vocabulary
from .claims import PREFIX, Claims, claims, has_anchor, strip_markers
from .evidence import ItemEvidence, Passage, negated_for, vocabulary

__all__ = [
    "ANCHORED_COVERAGE",
    "ANCHORED_MIN_WORDS",
    "COVERAGE",
    "ITEM_COVERAGE",
    "NO_RULE",
    "RULES",
    "WINDOW",
    "Rule",
    "Support",
    "code_lines",
    "coverage",
    "first_rule",
    "nearest",
    "quoted_table",
    "score",
    "score_lines",
    "supports",
    "written",
]

COVERAGE = 0.6  # share of a piece's content words its supporting passage must hold
ANCHORED_COVERAGE = 0.3  # the same for a passage holding all of a piece's anchors (code, names, numbers)
ITEM_COVERAGE = 0.5  # share of them the whole item must hold for the anchored rules
ANCHORED_MIN_WORDS = 4  # fewest content words of a piece the anchored rules judge
WINDOW = 3  # most consecutive item passages one answer sentence may draw on
NO_RULE = "none"  # the rule named by an unsupported verdict: no rule held


@frozen
class Rule:
    """One way an item supports a piece.

    ``kinds``: the piece kinds it judges. ``unit``: what of the item is read, ``passages``
    (a window of one to ``WINDOW`` consecutive passages), ``whole`` (the item as one text,
    cited at its passage sharing the most words with the piece: a table's row) or ``lines``
    (a code block's lines). ``min_coverage``: the least share of the piece's content words
    (of its lines, for ``lines``) the unit must hold. ``needs_anchors`` and ``min_words``:
    what the piece must have for the rule to be tried. ``item_coverage``: the least share
    the whole item must hold as well. ``polarity``: whether the window must negate exactly
    when the piece does. ``tight``: a window of several passages never spans a heading and
    each of its ends holds a content word of the piece. ``settle_at``: a window covering
    this much ends the search; until then a wider window is tried, and must do strictly
    better (``None``: ``min_coverage``, the narrowest window that holds)."""

    name: str
    kinds: tuple[str, ...]
    unit: str
    min_coverage: float
    needs_anchors: bool = False
    min_words: int = 0
    item_coverage: float | None = None
    polarity: bool = True
    tight: bool = False
    settle_at: float | None = None

    def tried(self, kind: str, c: Claims | None) -> bool:
        """Whether this rule judges a piece of ``kind`` claiming ``c``."""
        if kind not in self.kinds:
            return False
        if c is None:
            return True
        return (c.anchors or not self.needs_anchors) and len(c.words) >= self.min_words


_PROSE = ("sentence", "item")
# First match wins, for each item; a piece's verdict names the first rule any item meets.
RULES: tuple[Rule, ...] = (
    Rule("code_lines", ("code",), "lines", COVERAGE),
    Rule("table", ("table",), "whole", COVERAGE, polarity=False),
    Rule("table_anchored", ("table",), "whole", ANCHORED_COVERAGE, needs_anchors=True,
         min_words=ANCHORED_MIN_WORDS, item_coverage=ITEM_COVERAGE, polarity=False),
    Rule("passage", _PROSE, "passages", COVERAGE, tight=True, settle_at=1.0),
    Rule("anchored", _PROSE, "passages", ANCHORED_COVERAGE, needs_anchors=True, min_words=ANCHORED_MIN_WORDS,
         item_coverage=ITEM_COVERAGE, tight=True),
)
_ORDER = {rule.name: n for n, rule in enumerate(RULES)}


@frozen
class Support:
    """Where item ``index`` supports a piece: the passage's offsets in the item's text, the
    share of the piece it covers and the rule that found it."""

    index: int
    coverage: float
    start: int
    end: int
    rule: str = "passage"


def coverage(wanted: frozenset[str], vocabulary: set[str] | frozenset[str]) -> float:
    """The share of ``wanted`` (stemmed content words) that ``vocabulary`` holds; 1.0 for none."""
    if not wanted:
        return 1.0
    return sum(1 for x in wanted if in_vocabulary(x, vocabulary)) / len(wanted)


def _held(p: Passage, c: Claims) -> int:
    """How many of ``c``'s content words passage ``p`` holds."""
    return sum(1 for x in c.words if in_vocabulary(x, p.vocabulary))


_ONE_FACT = ("table", "item")  # passages that each state one fact: table rows, list items


def _merges_facts(window: Sequence[Passage], c: Claims) -> bool:
    """Whether ``window`` joins two or more rows or list items that name things (numbers,
    names, code) and one of them names what the claim does not: each row states one fact,
    and a sentence drawing on several of them must state each one's names ("The Pro plan
    offers 5 GB" is not read from "- Basic plan: 5 GB" and "- Pro plan: 50 GB"; a
    sentence may still read a few cells of one row, below a header row that names nothing)."""
    rows = [p for p in window if p.kind in _ONE_FACT and any(kind != "url" for kind, _ in _anchors_of(p.text))]
    return len(rows) > 1 and any(_other_fact(p, c) for p in rows)


def _other_fact(p: Passage, c: Claims) -> bool:
    """Whether ``p`` is a table row or list item that names something (a number, name or code;
    a link's address aside) the claim does not."""
    if p.kind not in _ONE_FACT:
        return False
    stated = " ; ".join(a for _, a in c.anchors)
    return any(kind != "url" and not has_anchor(kind, a, stated, stated) for kind, a in _anchors_of(p.text))


def _about_another_row(window: Sequence[Passage], every: Sequence[Passage], c: Claims) -> bool:
    """Whether a row (or list item) of ``window`` is read for a claim about another row of
    the item: the claim names what only the other row's key (its first cell, or the words
    before a list item's colon) says, and nothing only this row's key says ("The Pro plan
    offers 5 GB" is not read from "- Basic plan: 5 GB" beside "- Pro plan: 50 GB")."""
    rows = [p for p in window if _named_row(p)]
    if not rows:
        return False
    others = [q for q in every if _named_row(q) and q not in window]
    for r in rows:
        mine = _key(r)
        for q in others:
            theirs = _key(q)
            if (any(in_vocabulary(x, theirs - mine) for x in c.words)
                    and not any(in_vocabulary(x, mine - theirs) for x in c.words)):
                return True
    return False


def _named_row(p: Passage) -> bool:
    return p.kind in _ONE_FACT and bool(_key(p)) and any(kind != "url" for kind, _ in _anchors_of(p.text))


@functools.lru_cache(maxsize=4096)
def _key_of(kind: str, text: str) -> frozenset[str]:
    if kind == "table":
        cells = [cell for cell in text.strip().strip("|").split("|") if cell.strip()]
        return frozenset(vocabulary(cells[0])) if len(cells) > 1 else frozenset()
    head, colon, _ = text.partition(":")
    return frozenset(vocabulary(head)) if colon and len(head.split()) <= 6 else frozenset()


def _key(p: Passage) -> frozenset[str]:
    """The words naming what a row or list item is about: its first cell, or its words before a colon."""
    return _key_of(p.kind, p.text)


@functools.lru_cache(maxsize=4096)
def _anchors_of(text: str) -> tuple[tuple[str, str], ...]:
    return claims(text).anchors


def _holds_some(p: Passage, c: Claims) -> bool:
    return any(in_vocabulary(x, p.vocabulary) for x in c.words)


def score(c: Claims, ev: ItemEvidence, rule: Rule, index: int = 0) -> Support | None:
    """The best window of ``ev`` that meets ``rule`` for claims ``c``, or None: the one
    window loop every prose and table rule runs (see the module's docstring)."""
    units = ev.passages if rule.unit == "passages" else (ev.whole,)
    if rule.item_coverage is not None and units and (
            coverage(c.words, ev.topic.union(*(p.vocabulary for p in units))) < rule.item_coverage):
        return None
    settle_at = rule.min_coverage if rule.settle_at is None else rule.settle_at
    # Negation is read where the claim is: in the passage of the item holding most of its
    # words. A window whose own passages agree with the claim does not outweigh a passage
    # that holds more of the claim and says the opposite ("do not live in captivity").
    contrary = max((_held(p, c) for p in ev.passages if negated_for(p, c) != c.negated),
                   default=0) if rule.polarity else 0
    best: Support | None = None
    for width in range(1, WINDOW + 1):
        for i in range(len(units) - width + 1):
            window = units[i : i + width]
            if width > 1 and rule.tight and (any(p.kind == "heading" for p in window) or not (
                    _holds_some(window[0], c) and _holds_some(window[-1], c))):
                continue  # a heading is a title, not a claim; each end of a window holds part of the claim
            if (width > 1 and _merges_facts(window, c)) or _about_another_row(window, ev.passages, c):
                continue
            text = ev.text[window[0].start : window[-1].end]
            flat = " ".join(text.split())
            if not all(has_anchor(kind, a, text, flat) for kind, a in c.anchors):
                continue
            if rule.polarity:
                # Negation is read where the claim is: in the passage holding most of its words.
                core = max(window, key=lambda p: _held(p, c))
                if negated_for(core, c) != c.negated or _held(core, c) < contrary:
                    continue
            covered = coverage(c.words, ev.topic.union(*(p.vocabulary for p in window)))
            if covered >= rule.min_coverage and (best is None or covered > best.coverage):
                best = Support(index, covered, window[0].start, window[-1].end, rule.name)
        if best is not None and best.coverage >= settle_at:
            break
    if best is not None and rule.unit == "passages":
        best = _tightened(best, ev.text, c, ev.topic)
    if best is not None and rule.unit == "whole":  # cited at the row that holds the most of the claim
        held = [len(p.vocabulary & c.words) for p in ev.passages]
        if any(held):  # the first of the best: a row in a long table, not the first sharing a word
            row = ev.passages[held.index(max(held))]
            best = Support(index, best.coverage, row.start, row.end, rule.name)
    return best


def _foreign(line: str, c: Claims) -> bool:
    """Whether ``line`` says something of its own that is none of ``c``: content words of its
    own, none of them ``c``'s, and none of ``c``'s anchors."""
    own = claims(line).words
    if not own or any(in_vocabulary(x, own) for x in c.words):
        return False
    flat = " ".join(line.split())
    return not any(has_anchor(kind, a, line, flat) for kind, a in c.anchors)


def _holds_all(text: str, c: Claims, covered: float, topic: frozenset[str] = frozenset()) -> bool:
    """Whether ``text`` (with ``topic``, its document's words) covers as much of ``c`` as
    ``covered`` and holds all its anchors."""
    flat = " ".join(text.split())
    return (coverage(c.words, topic | vocabulary(text)) >= covered
            and all(has_anchor(k, a, text, flat) for k, a in c.anchors))


def _tightened(s: Support, text: str, c: Claims, topic: frozenset[str] = frozenset()) -> Support:
    """``s`` without the lines at either end of its passage that hold none of the claim: lines
    with no full stop (a PDF page, a plain-text note, a list of settings) read as one passage,
    and a citation opens at the line that holds the sentence, not at the passage's first line
    (nor at a title line above it whose words the lines below hold too)."""
    lines: list[tuple[int, int]] = []
    pos = s.start
    for line in text[s.start : s.end].split("\n"):
        lines.append((pos, pos + len(line)))
        pos += len(line) + 1
    lo, hi = 0, len(lines) - 1
    while lo < hi and _foreign(text[slice(*lines[lo])], c):
        lo += 1
    while lo < hi and text[lines[lo + 1][0] : lines[lo + 1][1]].lstrip()[:1].isupper() and _holds_all(
            text[lines[lo + 1][0] : lines[hi][1]], c, s.coverage, topic):
        lo += 1  # a title line above a sentence ("Wombat notes"): the lines below hold all of it
    while hi > lo and _foreign(text[slice(*lines[hi])], c):
        hi -= 1
    if (lo, hi) == (0, len(lines) - 1):
        return s
    return Support(s.index, s.coverage, lines[lo][0], lines[hi][1], s.rule)


def code_lines(code: str) -> list[str]:
    """The lines of a fenced code block, fences left out, whitespace made single spaces; in a
    blockquote ("> ```sh"), without the quote's markers, which no line of a document has."""
    lines = code.split("\n")
    opening = FENCE.match(lines[0])
    depth = lines[0][: opening.start(1)].count(">") if opening else 0
    if depth:
        quote = re.compile(rf"[ \t]*(?:>[ \t]?){{1,{depth}}}")
        lines = [line[m.end() :] if (m := quote.match(line)) else line for line in lines]
    lines = lines[1:]
    if lines and FENCE.match(lines[-1]):
        lines = lines[:-1]
    return [" ".join(line.split()) for line in lines if line.strip()]


def score_lines(wanted: Sequence[str], ev: ItemEvidence, rule: Rule, index: int = 0) -> Support | None:
    """An item holding ``rule.min_coverage`` of a code block's lines (``wanted``) supports
    it; cited where the block sits in the item (``_placed``), or from the fence just above."""
    if not wanted:
        return None
    found = [[k for k, f in enumerate(ev.flat_lines) if w in f] for w in wanted]
    covered = sum(1 for places in found if places) / len(wanted)
    if covered < rule.min_coverage:
        return None
    first, last = _placed(found)
    if first and FENCE.match(ev.lines[first - 1]):
        first -= 1  # the block starts at its fence
    offsets = [0]
    for line in ev.lines:
        offsets.append(offsets[-1] + len(line) + 1)
    return Support(index, covered, offsets[first], offsets[last] + len(ev.lines[last]), rule.name)


_GAP = 3  # most lines from one line of a quoted block to the next in the item (blank lines, a line left out)


def _placed(found: Sequence[Sequence[int]]) -> tuple[int, int]:
    """The first and last item line of where a block whose lines are found at ``found`` (for
    each of its lines, the item lines holding it, in order; one at least) sits: the run of
    item lines holding most of its lines in order, each at most ``_GAP`` lines after the one
    before, a line the item holds in fewer places weighing more; the first of equals. Several
    blocks of one page often share a line (```` ```sh ````, ``set -e``, ``metadata: {}``): the
    block is where the lines after it follow too, not at the first line holding its first."""
    best: tuple[float, int, int] | None = None  # weight, first line, last line
    for j, places in enumerate(found):
        for start in places:
            weight, last = 1 / len(places), start
            for later in found[j + 1 :]:
                at = bisect.bisect_right(later, last)
                if at < len(later) and later[at] <= last + _GAP:
                    weight, last = weight + 1 / len(later), later[at]
            if best is None or weight > best[0] or (weight == best[0] and start < best[1]):
                best = (weight, start, last)
    return (best[1], best[2]) if best is not None else (0, 0)


def supports(kind: str, text: str, c: Claims | None, evidence: Sequence[ItemEvidence]) -> list[Support]:
    """For each item that supports a piece of ``kind`` (``text``, claiming ``c``; None for
    code), the support found by the first rule that holds, in evidence order."""
    rules = [rule for rule in RULES if rule.tried(kind, c)]
    wanted = code_lines(text) if kind == "code" else ()
    rows = _table_rows(text) if kind == "table" else ()
    out = []
    for k, ev in enumerate(evidence):
        if c is not None and not ev.holds_anchors(c):
            continue
        if not all(_one_passage_holds(row, ev) for row in rows):
            continue
        for rule in rules:
            s = score_lines(wanted, ev, rule, k) if rule.unit == "lines" else score(c, ev, rule, k)
            if s is not None:
                out.append(_where_written(s, text, ev.text) if kind in _PROSE else s)
                break
    return out


_COPIED_MIN = 20  # characters (spaces aside) a piece needs to be found word for word
_SHORT_WORDS = 3  # words a shorter piece needs to be found word for word (``written``'s ``short``)
_WORDS = re.compile(r"[^\W_]+")


def _compact(text: str) -> tuple[str, list[int]]:
    """``text`` without whitespace, and the offset in ``text`` of each character kept."""
    at = [i for i, ch in enumerate(text) if not ch.isspace()]
    return "".join(text[i] for i in at), at


def written(piece: str, text: str, short: bool = False) -> tuple[int, int] | None:
    """Where ``text`` (an item's) writes ``piece`` (an answer's, its markers and list or
    quote prefix aside) word for word, spaces aside: (start, end) offsets, or None. With
    ``short``, a shorter piece of ``_SHORT_WORDS`` words or more is found too, where it stands
    as words of its own (no letter or digit right before or after it): a lead-in the offline
    answer quotes ("Use as follows:") has no word to find it by; "Example:" or "Use it:" written
    somewhere in an item is no quote of it."""
    bare = PREFIX.sub("", strip_markers(piece), count=1)
    wanted, _ = _compact(bare)
    copied = len(wanted) >= _COPIED_MIN
    if not copied and (not short or len(_WORDS.findall(bare)) < _SHORT_WORDS):
        return None
    flat, at = _compact(text)
    i = flat.find(wanted)
    while i >= 0:
        start, end = at[i], at[i + len(wanted) - 1] + 1
        if copied or not (_word_char(text[start - 1 : start]) or _word_char(text[end : end + 1])):
            return start, end
        i = flat.find(wanted, i + 1)
    return None


def _word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _where_written(s: Support, piece: str, text: str) -> Support:
    """``s`` moved to where the item writes ``piece`` word for word, when it does: a copied
    sentence is cited where it is written, not at the first passage holding its words (a
    heading above it, another sentence on the same subject)."""
    span = written(piece, text)
    return s if span is None else Support(s.index, s.coverage, span[0], span[1], s.rule)


def _table_line(line: str) -> str:
    return " ".join(PREFIX.sub("", line).split())  # as the offline answer quotes it: no list or quote prefix


def quoted_table(s: Support, table: str, text: str) -> Support:
    """``s`` moved to where ``text`` (an item's) writes ``table``, a table the offline answer
    quoted from it: from its header line (the quote's first) to the last row quoted, the first
    place whose header is followed, in that table, by each quoted row in order; ``s`` when none is.
    The quote is cited at the line it starts with, not at the row sharing most of its words."""
    wanted = [_table_line(line) for line in table.split("\n")]
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    for first, line in enumerate(lines):
        if _table_line(line) != wanted[0]:
            continue
        at, last = 1, first
        for k in range(first + 1, len(lines)):
            row = _table_line(lines[k])
            if not row.startswith("|") or at == len(wanted):
                break
            if row == wanted[at]:
                at, last = at + 1, k
        if at == len(wanted):
            return Support(s.index, s.coverage, starts[first], starts[last] + len(lines[last]), s.rule)
    return s


def nearest(piece: str, ev: ItemEvidence, index: int = 0) -> Support | None:
    """Where item ``ev`` says most of what a piece that is not judged names (a lead-in, "Run
    the deploy like this [1]:"): the passage holding most of its content words, the first of
    equals, or None when none holds one. Its marker is the model's, and it opens at that
    passage ("The trundlewick deploy is special:"), not at the chunk's first line."""
    c = claims(piece)
    held = [_held(p, c) for p in ev.passages]
    if not any(held):
        return None
    p = ev.passages[held.index(max(held))]
    return Support(index, max(held) / len(c.words), p.start, p.end, "nearest")


def _table_rows(table: str) -> list[Claims]:
    """The claims of each row of a table that names something (a number, name or code)."""
    out = []
    for line in table.split("\n"):
        row = claims(line)
        if any(kind != "url" for kind, _ in row.anchors):
            out.append(row)
    return out


def _one_passage_holds(row: Claims, ev: ItemEvidence) -> bool:
    """Whether one passage of ``ev`` (a row of its table, a sentence) holds every anchor of a
    table row and ``COVERAGE`` of its words: a row states one fact, and its cells are not read from two rows of the evidence
    ("| Free user or org | 500GB |" is not held by a "Free user or org" row saying 100GB
    and another row saying 500GB)."""
    anchors = [(kind, a) for kind, a in row.anchors if kind != "url"]
    return any(coverage(row.words, p.vocabulary) >= COVERAGE
               and all(has_anchor(kind, a, p.text, " ".join(p.text.split())) for kind, a in anchors)
               for p in ev.passages)


def first_rule(found: Sequence[Support]) -> str:
    """The rule a piece's verdict names: the first in ``RULES`` that holds for any item."""
    return min((s.rule for s in found), key=_ORDER.__getitem__, default=NO_RULE)
