"""The answer a user reads: inline ``[K]`` markers, the citation footer, the usage block.

Pure text functions. ``renumber`` rewrites the model's markers so they run 1, 2, ... in
order of first use (``[1, 2]``, ``[1][2]`` and ``[1-3]`` are all understood, and so are ``[¹]``
and ``[[1]]``: ``plain_markers``; markers that point at no evidence are dropped; code spans and
fenced blocks are left alone, and so are the offline answer's quoted tables: ``code_split``).
``compose`` puts body, note, footer and the one usage block together, in that order; the
footer lists the items the body cites, nothing else (``crag.grounding`` decides beforehand
which items those are and narrows each to the passage that supports the sentence).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from .pages import location
from .safe_text import open_escape
from .state import Citation, EvidenceItem, Usage

__all__ = [
    "EMPTY_REPLY",
    "FIXED_SENTENCES",
    "MARKER",
    "NO_EVIDENCE",
    "NO_QUOTABLE",
    "OFFLINE_PREFACE",
    "STATS_HEADING",
    "StreamRenderer",
    "answer_parts",
    "code_split",
    "compose",
    "footer_lines",
    "marker_numbers",
    "plain_markers",
    "quotes_only",
    "renumber",
    "rewrite_markers",
    "stats_block",
    "without_source_list",
]

NO_EVIDENCE = "I couldn't find relevant information in the knowledge base to answer this question."
STATS_HEADING = "📊 **LLM Usage Stats:**"
OFFLINE_PREFACE = "Composed offline from the knowledge base (no LLM was used); the most relevant passages:"


def quotes_only(body: str) -> bool:
    """Whether ``body`` is the offline answer: quotes of the evidence, each copied from one line
    (grounding cites each where it was copied; the verdict asks more of what they share with the
    question, docs/grounding.md)."""
    return body.startswith(OFFLINE_PREFACE)
# The offline answer when evidence was found but none of it can be quoted (no sentence in it);
# its markers, before the full stop, point at the passages.
NO_QUOTABLE = "The passages found have no quotable text; see the sources listed below."
EMPTY_REPLY = "The model returned no answer text."
# The opening of an answer the evidence does not hold (SPEC §7, ``grounding.verdict``).
NOT_ANSWERED = (
    "The knowledge base does not appear to answer this question: most of the answer written from "
    "the documents found is not supported by them, so only what they support is kept below."
)
# The opening of an answer whose supported sentences rest on passages about something else
# (SPEC §7: "supported" means the cited evidence addresses the question).
NOT_ADDRESSED = (
    "The knowledge base does not appear to answer this question: the passages the answer rests "
    "on are about something else, so only what they support is kept below."
)
# The opening of an answer whose supported sentences only repeat the question: nothing in them
# answers it (crag.grounding.says_nothing_new).
ONLY_RESTATED = (
    "The knowledge base does not appear to answer this question: what the documents found support "
    "of the answer only repeats the question, so only that is kept below."
)
# The opening of an answer whose question names what no evidence found mentions ({terms}:
# those names, joined by "or").
NOT_MENTIONED = (
    "The knowledge base does not appear to answer this question: none of the documents found "
    "mentions {terms}, so only what they support is kept below."
)
# crag's own sentences: grounding never judges them.
FIXED_SENTENCES = frozenset({NO_EVIDENCE, OFFLINE_PREFACE, NO_QUOTABLE, EMPTY_REPLY, NOT_ANSWERED, NOT_ADDRESSED,
                             ONLY_RESTATED})

# A fenced block or an inline code span: left untouched by renumbering. A fence of four or five
# marks ends only at as many: a README's ````console block that shows an answer holds a ```sh
# block and the answer's footer, whose "[2] README.md:L116" is no marker.
_FENCED = "|".join(rf"{m}{{{n},}}.*?(?:{m}{{{n}}}|\Z)" for m in ("`", "~") for n in (5, 4, 3))
_CODE = re.compile(rf"({_FENCED}|`[^`\n]*`)", re.S)
# ... and in the offline answer, a table: a quote of the evidence, each row as written, its
# marker on the line below it (crag.llm.offline). A bracket in a row ("in [0, 1]", "see [2]")
# is the document's text: read as a marker, it was removed, or made a citation of an item.
_CODE_OR_QUOTED_TABLE = re.compile(rf"({_FENCED}|(?m:^\|[^\n]*(?:\n\|[^\n]*)*)|`[^`\n]*`)", re.S)
_REFUSAL = "The knowledge base does not appear to answer this question:"  # how each opening above starts
# [1], [1, 2], [1,2;3], [1-3]; not a Markdown link "[1](...)" nor a footnote "[^1]".
_ONE_MARKER = r"\[(\s*\d+(?:\s*[-–]\s*\d+)?(?:\s*[,;]\s*\d+(?:\s*[-–]\s*\d+)?)*\s*)\](?!\()"
_MARKER = re.compile(r"[ \t]?" + _ONE_MARKER)
MARKER = _MARKER
# Markers a model lists as prose ("[1], [2], and [3]", "[1]; [4]", "[1] or [2]") or side by side
# ("[1][1]", "[1] [2]"): rewritten as one, so dropping some of them leaves no stray commas or
# "or" behind ("See [1] or." was left of "See [1] or [9].") and one item is never cited twice in a row.
_MARKER_RUN = re.compile(
    r"[ \t]?" + _ONE_MARKER + r"(?:(?:[ \t]*[,;&][ \t]*(?:(?:and|or)[ \t]+)?|[ \t]+(?:and|or)[ \t]+|[ \t]*)"
    + _ONE_MARKER + r")*"
)
# Where a run was dropped: the comma before it goes too when punctuation follows
# ("as the evidence says, [4], it ..." -> "as the evidence says, it ..."), and the space
# before it when one follows ("For details, see [9] and the FAQ." left "details,  and").
_GONE = "\ue000"
_AFTER_CODE = "\ue001"  # what stands before a piece that follows a code span, for ^ not to match there
_AFTER_GONE = re.compile(r"[ \t]*,?[ \t]*" + _GONE + r"(?=[ \t]*[,.;:!?)])|[ \t]+" + _GONE + r"(?=[ \t])")
# What only introduced a dropped run goes with it: its parentheses ("(see [9])", "([7])",
# "(source: [9])") and a "see" or "cf." before it; at a sentence's start, the words that led up
# to the "see" too, when the sentence ends there ("Also see [9].", "For more details, see [9].": no
# "For more details." left); one that goes on keeps them ("For details, see [9] and the FAQ.").
_LEAD = r"(?:(?:also[ \t]+)?see(?:[ \t]+also)?|cf\.?|sources?|refs?|references?)"
_PAREN_GONE = re.compile(r"[ \t]*\([ \t]*(?:" + _LEAD + r"[ \t]*:?[ \t]*)?" + _GONE + r"[ \t]*\)", re.I)
_SEE_GONE = re.compile(r"(?:(?<=[.!?][ \t])|(?m:^)(?:[ \t]*(?:[-*+]|\d{1,3}[.)])[ \t]+)?)(?:for[ \t]+(?:(?:more|further"
                       r"|full)[ \t]+)?(?:details?|information|info)[ \t]*,?[ \t]*)?(?:(?:you[ \t]+can|please)[ \t]+)?"
                       r"(?:also,?[ \t]+)?see(?:[ \t]+also)?[ \t]*:?[ \t]*" + _GONE + r"(?=[ \t]*(?:[.!?]+(?:\s|$)|\n|$))"
                       + r"|\b(?:see(?:[ \t]+also)?|cf\.?|(?:sources?|refs?|references?)(?=[ \t]*:))[ \t]*:?[ \t]*" + _GONE, re.I)
# A sentence that was only that ("See [2].") goes whole, its full stop too; so does a line, or
# a list item, that was ("- See [2].").
_SENTENCE_GONE = re.compile(r"(?<=[.!?])[ \t]*" + _GONE + r"[ \t]*[.!?]*(?=\s|$)|^[ \t]*(?:(?:[-*+]|\d{1,3}[.)])[ \t]+)?"
                            + _GONE + r"[ \t]*[.!?]*[ \t]*(?:\n|$)", re.M)


# "[¹]", "[¹,²]": markers in superscript digits.
_SUPERSCRIPT_MARKER = re.compile(r"\[([⁰¹²³⁴⁵⁶⁷⁸⁹]+(?:[ \t]*[,;][ \t]*[⁰¹²³⁴⁵⁶⁷⁸⁹]+)*)\](?!\()")
_SUPERSCRIPT_DIGITS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")
# Markers in brackets of their own: "[[1]]" (a wiki's link), "[[1], [2]]", or brackets a model
# doubled ("[1]]]"). The run starts at the first of its brackets and takes all that follow it,
# so each "[" of a long row of them is tried once.
_BRACKETED = re.compile(
    r"(?<!\[)(?P<open>\[*)(?P<run>" + _ONE_MARKER + r"(?:[ \t]*[,;&]?[ \t]*" + _ONE_MARKER + r")*)(?P<close>\]*)(?![(\]])"
)

_PAIRED_WITHIN = 200  # how far on its line a bracket is looked for that pairs with one of them


def _bracketed(match: re.Match[str]) -> str:
    """The markers of a ``_BRACKETED`` match without the brackets around them: a pair of them,
    and one more on a side when nothing on its line pairs with it ("[see [1]]" keeps its "]")."""
    opened, closed, text = len(match.group("open")), len(match.group("close")), match.string
    if not opened and not closed:
        return match.group(0)
    pairs = min(opened, closed)
    start, end = max(0, match.start() - _PAIRED_WITHIN), match.end() + _PAIRED_WITHIN
    before = text[start : match.start()].rsplit("\n", 1)[-1]
    after = text[match.end() : end].split("\n", 1)[0]
    kept_open = min(opened - pairs, max(0, after.count("]") - after.count("[")))
    kept_close = min(closed - pairs, max(0, before.count("[") - before.count("]")))
    return "[" * kept_open + match.group("run") + "]" * kept_close


def plain_markers(text: str) -> str:
    """``text`` with markers written oddly outside code as ``[K]``: in superscript digits
    (``[¹]``), or in brackets of their own (``[[1]]``, ``[1]]]``; ``_BRACKETED``)."""
    if "[" not in text or ("[[" not in text and "]]" not in text and not _SUPERSCRIPT_MARKER.search(text)):
        return text
    pieces = code_split(text)
    for i in range(0, len(pieces), 2):  # even pieces are outside code
        if "[" in pieces[i]:
            piece = _SUPERSCRIPT_MARKER.sub(lambda m: f"[{m.group(1).translate(_SUPERSCRIPT_DIGITS)}]", pieces[i])
            pieces[i] = _BRACKETED.sub(_bracketed, piece)
    return "".join(pieces)


def rewrite_markers(text: str, replace: Callable[[list[int]], str]) -> str:
    """``text`` with each run of markers outside code replaced by ``replace(numbers)``, the
    numbers the run names in order (``""`` drops the run and the separators around it);
    markers written oddly are read as ``plain_markers`` reads them."""
    text = plain_markers(text)

    def run(match: re.Match[str]) -> str:
        lead = match.group(0)[0] if match.group(0)[0] in " \t" else ""
        numbers = [k for m in _MARKER.finditer(match.group(0)) for k in _numbers(m.group(1))]
        marks = replace(numbers)
        return lead + marks if marks else _GONE

    pieces = code_split(text)
    for i in range(0, len(pieces), 2):  # even pieces are outside code
        if "[" in pieces[i]:
            # after a code span a piece does not start a line: "`StaticFiles` [1]." keeps its full stop
            held = ("" if i == 0 else _AFTER_CODE) + pieces[i].replace(_GONE, "").replace(_AFTER_CODE, "")
            gone = _MARKER_RUN.sub(run, held)
            if _GONE in gone:
                gone = _SENTENCE_GONE.sub("", _SEE_GONE.sub(_GONE, _PAREN_GONE.sub(_GONE, gone)))
            pieces[i] = _AFTER_GONE.sub("", gone).replace(_GONE, "").replace(_AFTER_CODE, "")
    return "".join(pieces)


def code_split(text: str) -> list[str]:
    """``text`` cut so that odd pieces are fenced blocks or code spans, even pieces the rest; in
    the offline answer (``quoted``), its tables are odd pieces too: quotes, with no marker in them."""
    return (_CODE_OR_QUOTED_TABLE if quoted(text) else _CODE).split(text)


def quoted(text: str) -> bool:
    """Whether ``text`` is the offline answer, or the opening of a refusal above it."""
    return quotes_only(text) or (text.startswith(_REFUSAL) and text.split("\n\n", 2)[1:2] == [OFFLINE_PREFACE])


def _numbers(group: str) -> list[int]:
    """``"1, 2-4"`` -> ``[1, 2, 3, 4]``; a reversed or huge range counts its two ends only."""
    out: list[int] = []
    for part in re.split(r"[,;]", group):
        # a number of ten digits or more names no item: 0 (int() refuses one of 4300 digits)
        bounds = [int(n) if len(n.strip().lstrip("0")) < 10 else 0 for n in re.split(r"[-–]", part)]
        if len(bounds) == 2:
            a, b = bounds
            out.extend(range(a, b + 1) if 0 < b - a <= 50 else (a, b))
        else:
            out.append(bounds[0])
    return out


marker_numbers = _numbers


def renumber(text: str, n_items: int) -> tuple[str, list[int]]:
    """Markers renumbered by first use; returns the text and the 0-based items cited, in order."""
    order: list[int] = []
    new_number: dict[int, int] = {}

    def replace(numbers: list[int]) -> str:
        marks = []
        for k in numbers:
            if not 1 <= k <= n_items:
                continue
            if k not in new_number:
                new_number[k] = len(order) + 1
                order.append(k - 1)
            mark = f"[{new_number[k]}]"
            if mark not in marks:
                marks.append(mark)
        return "".join(marks)

    return rewrite_markers(text, replace), order


# A line a model wrote as a source list entry: "[1] docs/setup.md:L4", "- [2]: https://...",
# "[^1]: docs/setup.md:L4" (a Markdown footnote).
# The one word after the marker must look like a path or URL (a dot or slash inside it), so a
# sentence such as "[1] Done." is not taken for one.
_SOURCE_LINE = re.compile(
    r"^[ \t]*(?:[-*][ \t]+)?\[\s*\^?\d+\s*\]:?[ \t]+\S*?[/.]\w\S*(?:[ \t]*\([^)\n]*\))?[ \t]*$\n?", re.M
)
# Under such a heading, a list of paths or URLs alone ("1. docs/setup.md", "- docs/faq.md:L5").
_LISTED_SOURCE = re.compile(r"[ \t]*(?:[-*+]|\d{1,3}[.)])[ \t]+\S*?[/.]\w\S*(?:[ \t]*\([^)\n]*\))?[ \t]*")
# Its heading, when nothing follows it once those lines are gone, or only markers and paths on
# its own line ("**Sources:** [1], [2]", "References: docs/setup.md:L4, docs/faq.md").
_HEADING_WORDS = ("sources", "references", "citations")
_SOURCES_HEADING = re.compile(
    r"(?:^|\n)[ \t]*(?:#+[ \t]*)?\**(?:" + "|".join(f"{w[:-1]}s?" for w in _HEADING_WORDS) + r")\**:?\**"
    r"(?:[ \t]*(?:[,;]|and)?[ \t]*(?:\[\s*\d+\s*\]|`?[^\s,;`\[\]]*?[/.]\w[^\s,;`]*`?))*[ \t]*\s*\Z", re.I
)


def without_citations(text: str) -> str:
    """``text`` with no citation at all, for an answer that has no evidence (chitchat): its
    markers removed, and a source list the model wrote (lines opening with ``[K]``) left out."""
    pieces = _CODE.split(text)
    for i in range(0, len(pieces), 2):  # even pieces are outside code
        pieces[i] = _SOURCE_LINE.sub("", pieces[i])
    text, _ = renumber("".join(pieces), 0)
    return _SOURCES_HEADING.sub("", text.rstrip()).strip()


def without_source_list(text: str) -> str:
    """``text`` without the source list a model wrote at its end (the lines ``without_citations``
    leaves out, with blank lines between them) and a heading that only introduces it: crag
    writes the footer itself (SPEC §7). Such lines followed by more of the answer, and lines in
    code, stay."""
    pieces = _CODE.split(text)  # the last piece is outside code
    lines = pieces[-1].split("\n")
    end = listed = len(lines)
    while end and (not lines[end - 1].strip() or _SOURCE_LINE.fullmatch(lines[end - 1])):
        end -= 1
    while listed and (not lines[listed - 1].strip() or _SOURCE_LINE.fullmatch(lines[listed - 1])
                      or _LISTED_SOURCE.fullmatch(lines[listed - 1])):
        listed -= 1
    if listed < end and _SOURCES_HEADING.search("\n".join(lines[:listed])):  # paths listed under a heading
        end = listed
    pieces[-1] = "\n".join(lines[:end])
    cut = _SOURCES_HEADING.sub("", "".join(pieces).rstrip()).rstrip()
    return text if cut == text.rstrip() else cut


def footer_lines(items: Sequence[EvidenceItem], order: Sequence[int]) -> tuple[list[str], tuple[Citation, ...]]:
    """``[K] path:L42`` (``[K] guide.pdf:p3:L12`` in a PDF, ``[K] path`` with no line) for each
    cited item, K = 1.."""
    citations: list[Citation] = []
    for n, index in enumerate(order, start=1):
        item = items[index]
        line = item.cite_line
        end = item.end_line if line is not None and item.anchor_line is None else line
        place = location(item.source, line, end)  # a PDF's page and lines on it
        page, line = place.get("page"), place["start_line"]
        end = place["end_line"] if "end_page" not in place else None
        citations.append(Citation(n=n, path=item.source, line=line, tool=item.tool, end_line=end, page=page))
    return [f"[{c.n}] {c.ref}" for c in citations], tuple(citations)


def answer_parts(answer: str, citations: Sequence[Citation]) -> tuple[str, str, str]:
    """A composed answer cut into its body (notes included), its footer and its usage block
    (each part without the blank lines between them; an empty string for a part it lacks)."""
    block = "---\n" + STATS_HEADING
    cut = answer.rfind("\n\n" + block)
    if answer.startswith(block):
        text, usage = "", answer
    elif cut != -1:
        text, usage = answer[:cut], answer[cut + 2 :]
    else:
        text, usage = answer, ""
    footer = "\n".join(f"[{c.n}] {c.ref}" for c in citations)
    if footer and text.endswith("\n\n" + footer):
        return text[: -len(footer) - 2], footer, usage
    return text, "", usage


def _tokens(u_prompt: int, u_completion: int, cached: int = 0) -> str:
    """Token counts; the cached part of the prompt is named only when the server reported one."""
    prompt = f"{u_prompt:,} prompt ({cached:,} cached)" if cached else f"{u_prompt:,} prompt"
    return f"{prompt} / {u_completion:,} completion / {u_prompt + u_completion:,} total"


def stats_block(usage: Usage) -> str:
    """The usage block that ends every answer: ``---``, the heading, then a Markdown list."""
    lines = [
        "---",
        STATS_HEADING,
        f"- **Model:** {usage.model or 'unknown'}",
        f"- **API calls:** {usage.llm_calls}",
        f"- **Tokens:** {_tokens(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)}"
        + (f" (estimated for {usage.estimated_calls} of {usage.llm_calls} calls: the server reported no usable counts)"
           if usage.estimated_calls else ""),
        f"- **Latency:** {usage.latency_ms:,.0f} ms",
    ]
    if usage.by_node:
        lines.append("- **By node:**")
        for node, u in usage.by_node.items():
            calls = f"{u.calls} call" + ("" if u.calls == 1 else "s")
            lines.append(
                f"  - `{node}`: {calls}, {_tokens(u.prompt_tokens, u.completion_tokens, u.cached_tokens)} tokens"
                f"{' (estimated)' if u.estimated_calls else ''}, {u.latency_ms:,.0f} ms"
            )
    return "\n".join(lines)


def compose(
    body: str,
    items: Sequence[EvidenceItem],
    usage: Usage,
    note: str | None = None,
    cite: bool = True,
) -> tuple[str, tuple[Citation, ...]]:
    """The full answer text and its citations.

    With ``cite`` and evidence, markers are renumbered and a footer lists the cited items
    (none when the body cites none).
    """
    citations: tuple[Citation, ...] = ()
    parts = []
    if cite and items:
        body, order = renumber(body, len(items))
        lines, citations = footer_lines(items, order)
        parts.append(body.strip())
        if note:
            parts.append(note)
        if lines:
            parts.append("\n".join(lines))
    else:
        parts.append(body.strip())
        if note:
            parts.append(note)
    parts.append(stats_block(usage))
    return "\n\n".join(p for p in parts if p), citations


# Ways a reply may go on from any point: a word or sentence going on, a line turning into a
# heading, list item, quote, table, rule, fence, usage block or source list, a code span
# closing, a marker, a think tag. What the text so far becomes under each of them is what
# the stream may show.
CONTINUATIONS = (
    "", " ", "x", "X", "1", ".", ". X", ":", ",", ")", "*", "_", "\n", "\nx", "\nX", "\n\n", "\n\nX", "`", "```",
    "\n```\n", "~~~", "\n~~~\n", "|", "\n| x |", "#", "\n# X", "-", "- X", "\n- X", "1. X", "\n1. X", "\n---\n",
    "\n***", "\n===", "> X", "\n> X", "[", "[1]", " [1].", "</think>", "</thinking>", "</reasoning>", "<think>",
    STATS_HEADING,
    "\n\n---\n" + STATS_HEADING + "\n- x", "\nLLM Usage Stats:",
    "\n[1] x.md", "[1] x.md", " x.md", "/x",  # a source list the model writes (its heading goes with it)
    ", [1]", "; [1]", " & [1]", " and [1]", "and [1]", "nd [1]", "d [1]",  # a run of markers growing
    " [0]", " [0],", " [0];", ", [0]",  # a marker naming no item, dropped with the separators around it
    " and [0]", "nd [0]", "d [0]",  # ... and a run of them, with the words that join it
    "]", " x]",  # a bracket that pairs with one before a marker ("[[1]" stays "[[1]" when one closes)
)


_ANY = 10**9  # as many sources as a marker may name


def _common(texts: Sequence[str]) -> str:
    """The longest text every one of ``texts`` starts with."""
    low, high = min(texts), max(texts)  # the first and last in order differ first
    n = 0
    while n < min(len(low), len(high)) and low[n] == high[n]:
        n += 1
    return low[:n]


class StreamRenderer:
    """Shows an answer while it streams, exactly as ``compose`` will print it.

    ``feed`` takes the model's text as it arrives and returns what can be shown now: the
    cleaned, renumbered prefix of the answer that no later text can change, minus what was
    already shown. What might still change is held back: an unclosed ``[`` (a marker in the
    making), an unclosed ``<think>``, an escape string not yet closed, a line that might open a usage block, and whatever
    the answer would print differently if the reply went on in one of the ways
    ``CONTINUATIONS`` lists (a sentence still growing, a line that could become a heading
    or a fence, a code span that could close, a lone ``</think>`` before the answer has
    begun). ``rest(final)`` returns what the final answer adds (note, footer, usage block)
    after what has been shown.

    With ``ground`` (``crag.grounding.render_prefix`` over the evidence), each render
    grounds the final pieces so far instead of just renumbering, so the stream shows the
    grounded answer, a sentence at a time (``crag.stream`` builds it so from driver events;
    a terminal shows its output through ``crag.safe_text.ShownStream``).

    Each render cleans and renumbers the whole text so far, so ``feed`` renders only once
    the text has grown by ``every`` characters (more for a long answer, at most 256): a
    streamed answer then costs a few dozen renders, not one per token.
    """

    _RULE_LINE = re.compile(r"[ \t]*(?:-{3,}|\*{3,}|_{3,})[ \t]*")
    _RULE_TAIL = re.compile(r"[ \t]*[-*_]+[ \t]*$")

    def __init__(self, n_items: int, clean, unthink=None, every: int = 32, ground=None) -> None:
        self.n_items = n_items
        self.ground = ground  # text -> (grounded text, number of sources its markers index)
        self.every = every
        self._rendered_at = 0
        self.clean = clean  # the full clean-up compose's caller applies (think, usage blocks)
        self.unthink = unthink or (lambda text: text)  # only the <think> removal
        self.raw = ""
        self.shown = ""

    @staticmethod
    def _may_open_block(partial: str) -> bool:
        """Whether an unfinished line could still become (part of) a usage block heading or rule."""
        if "\U0001F4CA" in partial or "\u00f0" in partial:
            return True
        bare = partial.lstrip(" \t")
        if not bare or bare[0] in "-*_#":
            return True
        words = " ".join(bare.strip("*_# \t").lower().split())
        return "llm usage stats".startswith(words) or words.startswith("llm usage stats")

    # A line opening with a marker and at most one word: it may still become a source list entry.
    _SOURCE_START = re.compile(r"[ \t]*\[\s*\d+\s*\]:?(?:[ \t]+\S*)?")

    @classmethod
    def _may_open_source_list(cls, partial: str) -> bool:
        """Whether an unfinished line could still become a line of a source list the model
        writes, or its heading (``without_source_list`` removes both from the answer's end)."""
        if cls._SOURCE_START.fullmatch(partial):
            return True
        words = partial.strip("*_#: \t").lower()
        return bool(words) and any(heading.startswith(words) for heading in _HEADING_WORDS)

    _THINK_OPEN = re.compile(r"<(think|thinking|reasoning)\b[^>]*>", re.I)
    _TAG_NAMES = ("think", "thinking", "reasoning")

    @classmethod
    def _tag_cut(cls, raw: str) -> int:
        """Where a marker or a think tag still in the making, or a think block not yet
        closed, starts (or the end)."""
        cut = len(raw)
        bracket = raw.rfind("[", max(0, cut - 40))
        if bracket != -1 and "]" not in raw[bracket:]:
            cut = bracket
            while cut and raw[cut - 1] == "[":  # "[[9]" goes whole with a marker naming no item
                cut -= 1
        escape = open_escape(raw)  # its payload would read as text until the terminator removes it
        if escape != -1:
            cut = min(cut, escape)
        for opened in cls._THINK_OPEN.finditer(raw):
            if not re.search(rf"</{opened.group(1)}\s*>", raw[opened.end() :], re.I):
                cut = min(cut, opened.start())
                break
        lt = raw.rfind("<", 0, cut)
        if lt != -1 and ">" not in raw[lt:cut]:
            name = re.match(r"</?([A-Za-z]*)", raw[lt:cut])
            word = name.group(1).lower() if name else ""
            rest = raw[lt + (name.end() if name else 1) : cut]
            if any(tag.startswith(word) for tag in cls._TAG_NAMES) and (not rest or word in cls._TAG_NAMES):
                cut = lt  # "<", "</thi", "<think attr=..."
        return cut

    def _line_cut(self, text: str) -> int:
        """Where lines that might still turn into a usage block, or a source list the model
        writes, start (or the end)."""
        cut = len(text)
        line_start = text.rfind("\n", 0, cut) + 1
        partial = text[line_start:cut]
        if self._may_open_block(partial) or self._may_open_source_list(partial):
            cut = line_start
        else:  # dashes ending a line may be the rule of a usage block written on the same line
            tail = self._RULE_TAIL.search(text, line_start, cut)
            if tail is not None:
                cut = tail.start()
        # Complete blank lines and rules just before the cut may precede a heading still to come.
        while cut > 0 and text[cut - 1] == "\n":
            prev = text.rfind("\n", 0, cut - 1) + 1
            line = text[prev : cut - 1]
            if line.strip() and not self._RULE_LINE.fullmatch(line):
                break
            cut = prev
        return cut

    def feed(self, delta: str) -> str:
        self.raw += delta
        if len(self.raw) - self._rendered_at < min(256, max(self.every, len(self.raw) // 32)):
            return ""
        self._rendered_at = len(self.raw)
        cut = self._tag_cut(self.raw)
        head = self.unthink(self.raw[:cut])
        text = self.clean(head[: self._line_cut(head)])
        # The answer, had the reply gone on so: right after the text (a think block still
        # open may close, and the answer goes on where it began) or after what is held back.
        ends = {self.raw[:cut], self.raw}
        others = [self.clean(end + more) for end in ends for more in CONTINUATIONS]
        if self.ground is not None:
            grounded, n_sources = self.ground(text, others)
            # A marker grounding left as written (in what it reads as code) is kept only if
            # it points at a source: up to it, the text is the same however many come later.
            text = _common([renumber(grounded, n)[0].strip() for n in (n_sources, _ANY)])
        elif self.n_items:  # as compose does
            text = _common([renumber(t, self.n_items)[0].strip() for t in (text, *others)])
        else:
            text = _common([t.strip() for t in (text, *others)])
        if not text.startswith(self.shown):
            return ""
        if not any(ch.isalnum() for ch in renumber(text, 0)[0]):
            return ""  # markers alone so far: a reply that stays so is answered with a sentence of crag's
        new, self.shown = text[len(self.shown) :], text
        return new

    def rest(self, final: str) -> str:
        if final.startswith(self.shown):
            return final[len(self.shown) :]
        return ("\n\n" if self.shown else "") + final
