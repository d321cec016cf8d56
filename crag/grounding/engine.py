"""The engine: each piece of an answer judged by the rules, then rewritten.

``ground`` splits the body into pieces, decides for each whether it is judged, asks the
rules (``crag.grounding.rules``) which items support it, falls back to judging a prose
sentence clause by clause in ``note`` mode, and hands the verdicts to the rewrite
(``crag.grounding.rewrite``). Every verdict is a ``Judgement`` that names the rule that
decided it; the report carries them.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from ..answer import FIXED_SENTENCES, NO_EVIDENCE, quotes_only
from ..modes import GroundingMode
from ..sentences import Piece, split
from ..state import EvidenceItem, GroundingReport, Judgement
from ..text import in_vocabulary
from .asked import writes_any
from .claims import UNSUPPORTED_TAG, Claims, claims, clauses, has_anchor, lead_in, restates, strip_markers
from .evidence import Evidence
from .rewrite import Assembly, Numbering, Sources, place_block, replace_markers, source_references
from .rules import NO_RULE, Support, first_rule, quoted_table, supports

__all__ = ["BY_CLAUSE", "MODES", "Grounded", "ground", "note_line", "render_prefix"]

MODES = tuple(mode.value for mode in GroundingMode)  # KB_AGENT_GROUNDING: note, strict, off
BY_CLAUSE = "clauses"  # the rule named by a sentence judged clause by clause


@frozen
class Grounded:
    """A grounded body: markers ``[j]`` index ``sources`` (1-based), the report, and whether
    a piece was supported."""

    body: str
    sources: tuple[EvidenceItem, ...]
    report: GroundingReport


def _bare(text: str) -> str:
    return " ".join(strip_markers(text).split())


class _Grounder:
    """One answer's judging: the evidence read once, the sources its markers index."""

    def __init__(self, items: Sequence[EvidenceItem], mode: str, question: str = "",
                 unheld: Sequence[str] = (), quotes: bool = False) -> None:
        self.mode = mode
        asked = claims(question) if question else None
        self.asked = asked.words if asked else frozenset()
        self.given = frozenset(asked.anchors) if asked else frozenset()
        self.unheld = tuple(unheld)
        self.evidence = Evidence(items, self.asked)
        # the question's anchors no item writes: where one does, the sentence's use of it is checked
        # ("Service 7 retries 3 times" for a question naming services 3 and 7 is no restatement)
        written = [self.evidence[k] for k in range(len(self.evidence))]
        self.spared = frozenset(a for a in self.given
                                if not any(has_anchor(a[0], a[1], ev.text, ev.flat) for ev in written))
        self.quotes = quotes  # the offline answer: its tables are quoted as written
        self.sources = Sources(items, corroborate=not quotes, evidence=self.evidence)

    def supports(self, kind: str, text: str, c: Claims | None) -> list[Support]:
        """Items that support a piece claiming ``c``. An anchor the question itself names (the
        year, month or name the sentence repeats from it) is the question's, not a claim of
        the answer: the evidence need not write it the same way ("by the 1700s" for "the early
        18th century"). Whether the passages cited are about what the question names is
        asked of them as a whole (``addresses``)."""
        if self.unheld and writes_any(text, self.unheld):
            return []  # it names what no evidence item holds: no item supports it
        return supports(kind, text, self.beyond(c, self.spared), [self.evidence[k] for k in range(len(self.evidence))])

    def beyond(self, c: Claims | None, named: frozenset | None = None) -> Claims | None:
        """``c`` without the anchors the question names itself (``named``: those of them to leave
        out; all by default)."""
        named = self.given if named is None else named
        if c is None or not named:
            return c
        return Claims(c.words, tuple(a for a in c.anchors if a not in named), c.negated)

    def piece(self, piece: Piece) -> tuple[str, Judgement | None]:
        """The rewritten piece and its verdict (None: not judged)."""
        bare = _bare(piece.text)
        if bare == NO_EVIDENCE:  # the model's refusal in crag's words cites nothing, as crag's own does
            return strip_markers(piece.text), None
        if bare in FIXED_SENTENCES:  # crag's own ("... see the sources listed below"): the items as found
            return self.sources.remap(piece.text), None
        if not piece.judgeable:
            return self.sources.remap(piece.text, near=True), None
        c = None if piece.kind == "code" else claims(piece.text)
        if c is not None and (c.empty or lead_in(self.beyond(c), bare, self.asked)):
            # a lead-in's marker ("Run the deploy like this [1]:") opens where its item says most of it
            return self.sources.remap(piece.text, near=True), None
        found = self.supports(piece.kind, piece.text, c)
        # a quoted table's brackets ("in [0, 1]") are the document's: its marker is below it
        verbatim = piece.kind == "code" or (piece.kind == "table" and self.quotes)
        stripped = piece.text if verbatim else strip_markers(piece.text)
        if not found and piece.kind in ("sentence", "item"):
            judged = self.by_clause(piece)
            # strict keeps a sentence judged by clause only whole: every clause supported
            if judged is not None and (self.mode == "note" or judged[1].supported):
                return judged
        if not found:
            verdict = Judgement(bare, False, NO_RULE)
            if self.mode == "strict":
                return "", verdict
            if piece.kind in ("code", "table"):
                return place_block(stripped, piece.kind, UNSUPPORTED_TAG), verdict
            return replace_markers(piece.text, UNSUPPORTED_TAG), verdict
        verdict = Judgement(bare, True, first_rule(found))
        if piece.kind in ("code", "table"):
            best = max(found, key=lambda s: s.coverage)
            if piece.kind == "table" and self.quotes:  # a quote: cited at the line it starts with
                best = quoted_table(best, piece.text, self.sources.items[best.index].text)
            return place_block(stripped, piece.kind, self.sources.marker(best)), verdict
        return self.sources.cite(piece.text, found, self.about(c, found)), verdict

    def about(self, c: Claims | None, found: Sequence[Support]) -> list[int] | None:
        """The supporting items that hold every word the sentence shares with the question (or
        its document's name does): only those corroborate it. "The drumwick archive keeps 12
        years of records" for a question about the drumwick archive is held but for one word by
        bellwhap.md, whose archive keeps as many; that word is what the question asks about.
        None: the sentence shares no word with the question."""
        focus = (c.words & self.asked) if c is not None else frozenset()
        if not focus:
            return None
        out = []
        for s in found:
            ev = self.evidence[s.index]
            if all(w in ev.topic or in_vocabulary(w, ev.whole.vocabulary) for w in focus):
                out.append(s.index)
        return out

    def by_clause(self, piece: Piece) -> tuple[str, Judgement] | None:
        """A prose sentence no item holds as a whole, judged clause by clause, or None when
        it has one clause or none of its clauses is supported. A small model joins steps
        from two pages, or a supported step and one of its own, in one long sentence; each
        clause then gets its marker or its tag. A clause that only restates the question
        ("To read a cookie in an endpoint,") is not judged. The verdict stays the
        sentence's, supported when every judged clause is, and names ``BY_CLAUSE``; the
        clauses' own verdicts go with it."""
        parts = clauses(piece.text)
        if len(parts) < 2:
            return None
        judged: list[tuple[str, list[Support] | None]] = []  # None: not judged
        for part in parts:
            c = claims(part)
            judged.append((part, None if c.empty or restates(self.beyond(c), self.asked) else self.supports(piece.kind, part, c)))
        if not any(found for _, found in judged):
            return None
        text = ""
        verdicts = []
        for part, found in judged:
            if found is None:
                text += self.sources.remap(part, near=True)
                continue
            body = part.rstrip()
            sep = body[-1:] if body[-1:] in (",", ";") else ""  # the clause's own comma follows its marker
            body = body[: len(body) - len(sep)]
            trail = sep + part[len(part.rstrip()) :]
            if found:
                text += self.sources.cite(body, found) + trail
            else:
                text += replace_markers(body, UNSUPPORTED_TAG) + trail
            verdicts.append(Judgement(_bare(part), bool(found), first_rule(found)))
        supported = all(v.supported for v in verdicts)
        return text, Judgement(_bare(piece.text), supported, BY_CLAUSE, tuple(verdicts))


def ground(body: str, items: Sequence[EvidenceItem], mode: str = "note", question: str = "",
           unheld: Sequence[str] = ()) -> Grounded:
    """The body with markers pointing at the passages that support each piece (see the
    package's docstring); ``question``, when given, lets a lead-in that only restates it go
    unjudged, and the anchors it names need not be found again (``_Grounder.supports``),
    except the terms of ``unheld``: those it names that no evidence item holds
    (``crag.grounding.missing``)."""
    if mode not in MODES:
        raise ValueError(f"unknown grounding mode {mode!r}")
    body = _references(body, items)
    # the offline answer quotes its items: each quote cites the line it was copied from (SPEC §7),
    # not also other files that hold its words as a model's sentence would
    g = _Grounder(items, mode, question, unheld, quotes=quotes_only(body))
    out = Assembly()
    numbering = Numbering() if mode == "strict" else None  # a removed item's list is numbered again
    judgements: list[Judgement] = []
    after_block = False  # the last piece was a judged code block or table
    for piece in split(body):
        if piece.kind == "space":
            out.space(piece.text)
            continue
        if mode == "off":
            out.text(g.sources.remap(piece.text))
            continue
        if after_block and not strip_markers(piece.text).strip():
            out.drop()  # the model's markers for the block above: grounding placed its own
            continue
        text, verdict = g.piece(piece)
        after_block = verdict is not None and piece.kind in ("code", "table")
        if verdict is not None:
            judgements.append(verdict)
        removed = verdict is not None and not verdict.supported and mode == "strict"
        if numbering is not None:
            text = numbering.item(piece.text, text, piece.start == 0 or body[piece.start - 1] == "\n", not removed)
        if removed:
            out.drop()
        else:
            out.text(text)
    report = GroundingReport(
        sentences=len(judgements),
        supported=sum(1 for j in judgements if j.supported),
        unsupported=tuple(j.sentence for j in judgements if not j.supported),
        judgements=tuple(judgements),
    )
    return Grounded(out.body(), tuple(g.sources.sources), report)


def _references(body: str, items: Sequence[EvidenceItem]) -> str:
    """``source_references`` of a model's answer. The offline answer is left as it is: its
    quotes are a document's text, verbatim (SPEC §7), and a "docs/a.md:L3" or a footnote's
    "[^1]" a document holds is no reference the answer makes."""
    return body if quotes_only(body) else source_references(body, items)


def note_line(report: GroundingReport, mode: str) -> str | None:
    """The last line of a ``note``-mode body: how many sentences the evidence does not support."""
    n = len(report.unsupported)
    if mode != "note" or not n:
        return None
    what = "1 sentence" if n == 1 else f"{n} sentences"
    verb = "is" if n == 1 else "are"
    return f"_Note: {what} of this answer {verb} not supported by the evidence found (marked {UNSUPPORTED_TAG})._"


def render_prefix(
    text: str, items: Sequence[EvidenceItem], mode: str, question: str = "", others: Sequence[str] = ()
) -> tuple[str, int]:
    """The grounded form of the pieces of a partial answer that are final, and how many
    sources its markers index. Used to stream an answer as ``ground`` will print it.

    ``others`` are the answers the reply could still become (crag.answer.StreamRenderer:
    the reply so far ending in a few ways); a piece is final when every one of them cuts
    the text before it into the same pieces, so it can no longer grow, join the next piece
    or change kind. Without ``others`` the last piece, which may still grow, is left out.
    Each piece is judged on its own text, so grounding the final pieces gives a prefix of
    grounding the whole answer."""
    done = ground_prefix(text, items, mode, question, others)
    if done is None or (mode == "strict" and not done.report.supported):
        return "", 0  # strict: it may still become the no-evidence sentence
    return done.body, len(done.sources)


def ground_prefix(
    text: str, items: Sequence[EvidenceItem], mode: str, question: str = "", others: Sequence[str] = (),
    unheld: Sequence[str] = (),
) -> Grounded | None:
    """``ground`` of the final pieces of a partial answer (see ``render_prefix``); None when
    no piece is final yet."""
    text = _references(text, items)
    pieces = split(text)
    while pieces and pieces[-1].kind == "space":
        pieces.pop()
    if not pieces:
        return None
    cut = pieces[-1].start if not others else len(text)
    for other in dict.fromkeys(others):  # each distinct one once
        cut = min(cut, _same_pieces(pieces, split(_references(other, items)), cut))
        if not cut:
            return None
    while cut and (again := _same_pieces(pieces, split(text[:cut]), cut)) < cut:
        cut = again  # the text cut there splits as the whole text does
    return ground(text[:cut], items, mode, question, unheld)


def _same_pieces(pieces: Sequence[Piece], other: Sequence[Piece], limit: int) -> int:
    """Where the last piece (not a space) two splits share from the start ends, at most
    ``limit``, a piece end of ``pieces`` itself."""
    end = 0
    for mine, theirs in zip(pieces, other):
        stop = mine.start + len(mine.text)
        if mine != theirs or stop > limit:
            break
        if mine.kind != "space":
            end = stop
    return end
