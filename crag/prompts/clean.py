"""Stats blocks and thinking: what is cut from replies and history before anyone reads them.

``strip_stats_blocks`` removes crag's own usage block (and its mojibake forms) from text;
``strip_own_marks`` removes the marks grounding adds to an answer (``[unsupported]`` tags and
crag's ``_Note: ..._`` lines) from an earlier answer sent as history, where a model would copy them;
``strip_think`` removes ``<think>`` blocks; ``clean_answer`` does both to an answer, and
removes the source list a model wrote at its end (``crag.answer.without_source_list``).
``without_echo`` removes the answer prompt's last instruction where a model wrote it back
before its answer ('The direct answer to "Who bought the factory?" is AvtoZAZ'), and the
question where a model asked it again before answering ("Who bought the factory? AvtoZAZ").
"""

from __future__ import annotations

import re
from typing import Any

from ..answer import renumber, without_source_list
from ..safe_text import for_terminal
from ..sentences import FENCE, closes
from ..text import words

__all__ = ["clean_answer", "strip_own_marks", "strip_stats_blocks", "strip_think", "without_echo"]

# 📊, and the same bytes read as cp1252 (ðŸ“Š) or latin-1.
_STATS_EMOJI = "(?:\U0001F4CA|\u00f0\u0178\u201c\u0160|\u00f0\x9f\x93\x8a)"
_STATS_INLINE = re.compile(_STATS_EMOJI + r"[ \t]*(?:\*\*|__)?[ \t]*LLM[ \t]+Usage[ \t]+Stats", re.I)
_STATS_BARE = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*|__)?[ \t]*LLM[ \t]+Usage[ \t]+Stats[ \t]*:?[ \t]*(?:\*\*|__)?[ \t]*:?[ \t]*$",
    re.I,
)
# The heading and its figures on one line, the first right after it: "LLM Usage Stats: 3 API calls, 1,234 tokens".
_STATS_ONE_LINE = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*|__)?[ \t]*LLM[ \t]+Usage[ \t]+Stats[ \t]*(?:\*\*|__)?[ \t]*:"
    r"[ \t]*(?:\*\*|__)?[ \t]*\d[\d,]*[ \t]*(?:(?:api|llm)[ \t]+)?(?:calls?|tokens?)\b",
    re.I,
)
_FIGURES_PARTS = re.compile(r"[,;/|()]|\band\b", re.I)  # "3 calls, 500 tokens (1.2 s) | model x"
_RULE = re.compile(r"^[ \t]*(?:-{3,}|\*{3,}|_{3,})[ \t]*$")
_RULE_TAIL = re.compile(r"[ \t]*(?:-{3,}|\*{3,}|_{3,})[ \t]*$")
_OWN_TAG = re.compile(r"[ \t]?\[unsupported\]")  # crag.grounding.claims.UNSUPPORTED_TAG
_OWN_NOTE = re.compile(r"^_Note: .*_[ \t]*$\n?", re.M)  # the notes crag adds to an answer's body
_LIST_LINE = re.compile(r"^[ \t]*(?:[-*+\u2022]|\d{1,3}[.)])[ \t]+\S|^[ \t]*\|")
_CONTINUATION = re.compile(r"^[ \t]{2,}\S")
# A figure of a usage block written as a plain line: "API calls: 3", "**Total tokens:** 1,234".
_STAT_LINE = re.compile(
    r"^[ \t]*(?:\*\*|__)?[ \t]*(?:[\w-]+[ \t]+){0,3}?(?:model|calls?|tokens?|latency|time|cost|usage)"
    r"(?:[ \t]+[\w-]+){0,2}[ \t]*(?:\*\*|__)?[ \t]*:",
    re.I,
)


_FENCE = re.compile(r"^[ \t]*(?:`{3,}|~{3,})[\w+.-]*[ \t]*$")  # a code fence's line: "```", "```text"
_QUOTE = re.compile(r"^[ \t]*(?:>[ \t]?)+")  # a blockquote's markers: "> ", ">> "
_MARKUP_ONLY = re.compile(r"^[\s>#*_]*$")  # what may open a heading's line: "## ", "**", "> "


def _unquoted(line: str) -> str:
    return _QUOTE.sub("", line)


def _block_line(line: str) -> bool:
    """Whether ``line``, after a usage block's heading, is part of that block (in a blockquote
    too: "> - API calls: 2")."""
    line = _unquoted(line)
    return bool(_LIST_LINE.match(line) or _CONTINUATION.match(line) or _STAT_LINE.match(line))


def _figures_line(line: str) -> bool:
    """Whether ``line`` is a usage heading with its figures and nothing else ("LLM Usage Stats:
    3 calls, 500 tokens (1.2 s)"), not a sentence that opens with a figure ("LLM Usage Stats:
    3 calls is what a simple question costs"): each part after the heading holds a number and
    at most four words, or names the model."""
    if not _STATS_ONE_LINE.match(line):
        return False
    parts = (part.strip(" \t.*_:") for part in _FIGURES_PARTS.split(line.split(":", 1)[1]))
    return all(re.match(r"model\b", part, re.I) or (re.search(r"\d", part) and len(part.split()) <= 4)
               for part in parts if part)


def strip_stats_blocks(text: str) -> str:
    """``text`` without any ``📊 **LLM Usage Stats:**`` block and the Markdown list after it
    (or the figures a model wrote there as plain lines, ``API calls: 3``).

    A ``---`` rule right before the heading goes too, and a code fence that held the block
    alone; so do the mojibake ``ðŸ“Š`` form, a bare ``**LLM Usage Stats:**`` heading line, and
    one that holds its figures (``LLM Usage Stats: 3 calls, 500 tokens.``).
    Text without such a block is returned as is (with one, its line ends are ``\n``).
    """
    if not isinstance(text, str):
        return ""
    lines = re.split(r"\r\n?|\n", text)  # a history written on Windows ends its lines with "\r\n"
    out: list[str] = []
    changed = False
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _STATS_INLINE.search(line)
        start = match.start() if match else (0 if _STATS_BARE.match(line) or _figures_line(line) else None)
        if start is None:
            out.append(line)
            i += 1
            continue
        changed = True
        before = _RULE_TAIL.sub("", line[:start]).rstrip()
        if not _MARKUP_ONLY.match(before):  # "## 📊 ...", "**📊 ...", "> 📊 ..." open with markup alone
            out.append(before)
        else:
            blanks = 0
            while out and not _unquoted(out[-1]).strip():
                out.pop()
                blanks += 1
            if out and _RULE.match(_unquoted(out[-1])):
                out.pop()
                while out and out[-1].strip() and not _unquoted(out[-1]).strip():  # a quote's empty ">" line
                    out.pop()
            elif blanks:
                out.append("")
        i += 1
        after_blanks = i
        while after_blanks < len(lines) and not _unquoted(lines[after_blanks]).strip():
            after_blanks += 1
        if after_blanks < len(lines) and _block_line(lines[after_blanks]):  # the block's list after a blank line
            i = after_blanks
        while i < len(lines) and (_block_line(lines[i]) or (  # and a quote's ">" line within it
                lines[i].strip() and not _unquoted(lines[i]).strip() and i + 1 < len(lines)
                and _block_line(lines[i + 1]))):
            i += 1
        i = _drop_fence_around(out, lines, i)
    if not changed:
        return text
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def _drop_fence_around(out: list[str], lines: list[str], i: int) -> int:
    """Where a usage block just cut from ``out`` stood alone in a code fence (the opening fence
    last in ``out``, the closing one next in ``lines`` from ``i``, blank lines aside), both
    fences go too, not an empty fence left behind. The index of the next line to read."""
    opened = len(out)
    while opened and not out[opened - 1].strip():
        opened -= 1
    closing = i
    while closing < len(lines) and not lines[closing].strip():
        closing += 1
    inside = sum(1 for kept in out[:opened] if _FENCE.match(kept)) % 2  # an opening fence, not a closing one
    if inside and _FENCE.match(out[opened - 1]) and closing < len(lines) and _FENCE.match(lines[closing]):
        del out[opened - 1 :]
        return closing + 1
    return i


_THINK_BLOCK = re.compile(r"<(think|thinking|reasoning)\b[^>]*>.*?</\1\s*>", re.S | re.I)
_THINK_CLOSE = re.compile(r"</(?:think|thinking|reasoning)\s*>", re.I)
_THINK_OPEN = re.compile(r"<(?:think|thinking|reasoning)\b[^>]*>", re.I)


# A sentence that ends with a citation marker ("... port 8080 [1]." or "[1]" at the end of a
# line): the answer has begun, and reasoning does not come after it.
_CITED = re.compile(r"\[\s*\d+(?:\s*[-\u2013,;]\s*\d+)*\s*\](?=[.!?\u3002]|[ \t]*\n)")


def strip_think(text: str, *, answer: bool = False) -> str:
    """Remove ``<think>...</think>`` blocks; a lone closing tag drops what precedes it, a
    lone opening tag (a reply cut off while thinking) drops what follows it.

    With ``answer`` (an answer, not JSON): a lone closing tag drops what precedes it only
    while the answer has not begun, that is before the first sentence that ends with a
    citation marker; one that comes later is removed alone. So text after a cited sentence
    is final as soon as it is written, and a streamed answer never has to be taken back."""
    text = _THINK_BLOCK.sub("", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if answer and closes:
        begun = _CITED.search(text)
        limit = begun.start() if begun else len(text)
        ends = [m.end() for m in closes if m.start() < limit]
        text = _THINK_CLOSE.sub("", text[ends[-1] if ends else 0 :])
    elif closes:
        text = text[closes[-1].end() :]
    opened = _THINK_OPEN.search(text)
    if opened:
        text = text[: opened.start()]
    return text


def strip_own_marks(text: str) -> str:
    """An earlier answer without the marks crag's grounding added to it: the ``[unsupported]``
    tags and crag's own ``_Note: ..._`` lines (unsupported sentences, weak evidence, a cut
    answer). They tell the user about the answer; sent back as history, a model copies them
    into its next answer, where grounding would take them for the model's words."""
    text = re.sub(r"\r\n?", "\n", text)  # a history written on Windows: its note lines end in "\r\n"
    return re.sub(r"\n{3,}", "\n\n", _OWN_NOTE.sub("", _OWN_TAG.sub("", text)))


def clean_answer(text: Any) -> str:
    """The model's answer without thinking, and without a usage block or a trailing source
    list it wrote itself (crag writes the footer; a list left in would be judged as sentences)."""
    if not isinstance(text, str):
        return ""
    # What no reader sees (escape sequences, a zero-width space, other control characters) is
    # no part of the answer: left in, "... [1].\u200b Backups ..." was one sentence to grounding.
    text = for_terminal(text)
    text = without_source_list(strip_stats_blocks(strip_think(text, answer=True)))
    # Runs of blank lines collapse to one always (not only where a block was cut out), so an
    # answer streamed piece by piece reads the same as the finished one.
    return _fences_closed(re.sub(r"\n{3,}", "\n\n", text).strip())


def _fences_closed(text: str) -> str:
    """``text`` with the code block it leaves open (a reply cut by its budget mid-code) closed,
    as its opening fence was written ("> ```sh" closes with "> ```"), or without its opening
    fence when nothing follows it. Left open, it held crag's marker for the block, its notes,
    footer and usage block: a Markdown reader showed them as code, and the block's marker was
    read as code, not cited."""
    lines = text.split("\n")
    at, mark, closing = None, "", ""
    for i, line in enumerate(lines):
        if at is None:
            if fence := FENCE.match(line):
                at, mark, closing = i, fence.group(1), line[: fence.end(1)]
        elif closes(line, mark):
            at = None
    if at is None:
        return text
    if not "".join(lines[at + 1 :]).strip():
        return "\n".join(lines[:at]).rstrip()
    return text + "\n" + closing


# The answer prompt ends "Start with the direct answer to: QUESTION" (crag.prompts.render); a
# small model unsure of its evidence sometimes opens 'The direct answer to "QUESTION" is ...'.
_ECHO = re.compile(
    r"\A[ \t]*(?:\*\*)?(?:the[ \t]+)?direct[ \t]+answer[ \t]+to(?:[ \t]+the[ \t]+question)?[ \t]*:?[ \t]*"
    r"(?:\"(?P<dq>[^\"\n]+)\"|“(?P<cq>[^”\n]+)”|(?P<bare>[^\n]+?\?))[ \t]*(?:\*\*)?[ \t]*"
    r"(?:(?:is|are|would[ \t]+be)\b[ \t]*:?|:)?\s*(?:that[ \t]+)?",
    re.I,
)


# ... or opens by asking the question again: "To what type of organisms is oxygen toxic [1]? ..."
_ASKED_FIRST = re.compile(r"\A[ \t]*(?:\*\*)?(?P<bare>[^\n?]+\?)(?:\*\*)?\s*(?:\[\d+\]\s*)*")


def without_echo(text: str, question: str) -> str:
    """``text`` without the instruction it opens by writing back ('The direct answer to
    "QUESTION" is X' reads 'X'), or the question it opens by asking again ("QUESTION? X"
    reads "X"), when what it quotes is ``question`` (word for word, markers aside) and
    something other than markers follows; otherwise unchanged."""
    match = _ECHO.match(text) or _ASKED_FIRST.match(text)
    if not match:
        return text
    groups = match.groupdict()
    quoted = words(renumber(groups.get("dq") or groups.get("cq") or groups.get("bare") or "", 0)[0])
    rest = text[match.end():]
    if not quoted or quoted != words(question) or not any(ch.isalnum() for ch in renumber(rest, 0)[0]):
        return text  # 'The direct answer to "QUESTION" is [1].' says nothing but the question: left to grounding
    return rest[:1].upper() + rest[1:]
