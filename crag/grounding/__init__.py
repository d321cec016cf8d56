"""Grounding: which evidence item, and which line of it, supports each sentence of an answer.

Pure and mechanical: no LLM call, no I/O. ``ground(body, items, mode)`` runs after the
model has written its answer and before the footer is made. Theory of operation, one
module per concern:

1. ``split`` (``crag.sentences``) cuts the body into pieces whose concatenation is the
   body: prose sentences (a list item's too, its first sentence keeping the bullet), code
   blocks and tables (kept whole), headings and rules, and the whitespace between them.
2. ``claims`` reads what a piece says: content words (Han and Kana: character bigrams), anchors (numbers, dates, versions,
   identifiers, inline code, URLs: the kinds are the table ``ANCHOR_KINDS``) and polarity.
   A piece is *judged* when it has content of its own; headings, rules, crag's own fixed
   sentences and a lead-in that only restates the question are not.
3. ``evidence`` reads each item once per answer: its passages (sentences, table rows, code
   lines, headings) with their vocabulary and polarity (per cell, for a table row).
4. ``rules`` says which items support a piece: the rules are rows of ``RULES`` (``Rule``:
   name, the pieces it judges, its unit, its least coverage, whether it needs anchors, ...),
   first match wins, and all prose and table rules run the one window loop ``score``. A
   prose sentence no item supports is judged again clause by clause in ``note`` mode.
5. ``rewrite`` moves the markers: a marker on a judged piece stays only if its item
   supports the piece; a supported piece the model left unmarked gets the best supporting
   item; a supported prose sentence also cites up to ``CORROBORATING`` other files that
   hold it; an unsupported piece loses its markers and, in ``note`` mode, is tagged
   ``[unsupported]`` (``strict`` removes it). Pieces that are not judged keep their markers
   as written.
6. ``engine`` runs the steps and writes the report: every verdict is a ``Judgement`` naming
   the rule that decided it.

The result's ``sources`` are narrowed copies of the evidence items (``start_line`` and
``end_line`` are the supporting passage's lines), and the body's markers ``[j]`` index
them, so ``answer.compose`` renumbers them and writes a footer of supporting items only.

Each piece is judged on its own text, so grounding a prefix of an answer made of whole
pieces gives a prefix of grounding the whole answer: the streamed output can show grounded
sentences while the model is still writing (``render_prefix``).
"""

from __future__ import annotations

from ..sentences import Piece, split
from .asked import (
    FOCUS_SHARE,
    HELD_SHARE,
    QUOTES_FOCUS_SHARE,
    addresses,
    cited,
    holds_focus,
    missing,
    named,
    negation_held,
    opposed,
    says_nothing_new,
    unpointed,
    writes_any,
)
from .claims import ANCHOR_KINDS, SCAFFOLDING, UNSUPPORTED_TAG, Claims, claims, clauses
from .engine import BY_CLAUSE, MODES, Grounded, ground, note_line, render_prefix
from .evidence import Passage, org_file, passages
from .rewrite import CORROBORATING, source_references
from .rules import (
    ANCHORED_COVERAGE,
    COVERAGE,
    NO_RULE,
    RULES,
    Rule,
    Support,
)

__all__ = [
    "ANCHORED_COVERAGE",
    "ANCHOR_KINDS",
    "BY_CLAUSE",
    "CORROBORATING",
    "COVERAGE",
    "FOCUS_SHARE",
    "HELD_SHARE",
    "MODES",
    "NO_RULE",
    "QUOTES_FOCUS_SHARE",
    "RULES",
    "SCAFFOLDING",
    "UNSUPPORTED_TAG",
    "Claims",
    "Grounded",
    "Passage",
    "Piece",
    "Rule",
    "Support",
    "addresses",
    "cited",
    "claims",
    "clauses",
    "ground",
    "holds_focus",
    "missing",
    "named",
    "negation_held",
    "note_line",
    "opposed",
    "org_file",
    "passages",
    "render_prefix",
    "rule_names",
    "says_nothing_new",
    "source_references",
    "split",
    "unpointed",
    "writes_any",
]


def rule_names() -> tuple[str, ...]:
    """Every name a verdict may give, in table order: the rules, ``clauses``, ``none``."""
    return (*(rule.name for rule in RULES), BY_CLAUSE, NO_RULE)
