"""Cutting a file into chunks on its Markdown structure, within a tiktoken budget.

A file is first parsed into blocks: headings (ATX ``#`` and setext underlines; for
reStructuredText, underlined titles; for Python, top-level ``def``/``class`` lines),
fenced code blocks (kept whole, blank lines and all), YAML front matter, and paragraphs
(runs of non-blank lines). Blocks are then packed greedily into chunks of at most
``max_tokens`` tokens (counted with tiktoken, ``crag.llm.tokens``; the file is encoded
once and a range of lines is sized by the tokens that start in it, see ``TokenCounter``;
a chunk close to the budget is counted again on its own, so none exceeds it):

* a heading starts a new chunk once the current one holds at least ``min_tokens``, so
  sections stay apart but a run of tiny sections is not scattered into tiny chunks;
* a heading is never the last thing in a chunk: it moves on with the text it introduces;
* a code fence is never cut unless it (with the headings moving on with it) exceeds the
  budget; an oversized block is cut at line boundaries, and a single line longer than the
  budget (a minified file, a PDF page of more than ``PAGE_LINES`` lines) is cut into
  pieces within it, at spaces where it has them.

Every chunk is a contiguous range of whole lines: ``text`` is exactly
``"\\n".join(lines[start_line - 1 : end_line])`` of ``discover.split_lines`` (tested on
real corpora), so a citation ``path:Lstart`` opens where the text begins; the one exception
is a line over the budget, whose pieces are chunks of that one line (``start_line ==
end_line``) that join back into it in order. No chunk exceeds the budget. ``heading`` is
the chunk's heading path (``"Deployment > Docker > Build"``) at its first line; the indexer
prepends it to the text that is embedded and lexically indexed, never to ``text``.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import NamedTuple

from ..pages import PAGE_LINES, PAGED_SUFFIXES
from ..ports import Chunk  # the record is the store port's; chunking makes it
from .discover import split_lines
from .token_count import TokenCounter, token_counter  # re-exported: the chunker counts with them

__all__ = [
    "CHUNKER_VERSION",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MIN_TOKENS",
    "Chunk",
    "TokenCounter",
    "chunk_lines",
    "chunk_text",
    "token_counter",
]

CHUNKER_VERSION = 5  # 3: PDF pages are chunked apart; HTML is indexed as its text. 4: a long line is cut.
# 5: a heading before a block over the budget goes with the block's first lines, never alone
# Chosen by benchmarks/retrieval.py (see benchmarks/results/retrieval.md).
DEFAULT_MAX_TOKENS = 400
DEFAULT_MIN_TOKENS = 120

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdx", ".mdown", ".mkd", ".txt", ".text", ""})
RST_SUFFIXES = frozenset({".rst"})
PYTHON_SUFFIXES = frozenset({".py", ".pyi"})

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_ATX_CLOSE = re.compile(r"[ \t]+#+[ \t]*$")
_ANCHOR = re.compile(r"\s*\{[^{}]*\}\s*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE_START = frozenset("`~")
_SETEXT_START = frozenset("=-")
_MD_MARKS = frozenset("`~#=-")  # a line starting with anything else (but a space) is text
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+:.])\1{2,}[ \t]*$")
_PY_TOP = re.compile(r"^(?:async[ \t]+def|def|class)[ \t]+\w")


class _Block(NamedTuple):
    start: int  # 0-based line index, inclusive
    end: int  # inclusive
    level: int = 0  # heading level, 0 for other blocks
    title: str = ""
    fence: bool = False


# _new_block(_Block, (start, end, level, title, fence)): a _Block without the Python-level
# __new__ of a NamedTuple (the Markdown parser makes one per paragraph).
_new_block = tuple.__new__


# A heading's title in the heading path is cut to this many characters (at a space when
# there is one): every chunk of its section carries the path (stored, embedded, searched),
# so a heading line of megabytes made each piece cut from it megabytes more.
TITLE_CHARS = 200


def _short_title(title: str) -> str:
    if len(title) <= TITLE_CHARS:
        return title
    cut = title[: TITLE_CHARS + 1]
    return (cut.rsplit(None, 1)[0] if " " in cut.strip() else cut[:TITLE_CHARS]).rstrip()


def _clean_title(raw: str) -> str:
    title = _ATX_CLOSE.sub("", raw.strip())
    title = _ANCHOR.sub("", title)
    return title.strip().strip("#").strip().replace("`", "")


def _parse_markdown(lines: Sequence[str]) -> list[_Block]:
    blocks: list[_Block] = []
    append = blocks.append
    n = len(lines)
    i = 0
    if n and lines[0].strip() == "---":  # YAML front matter
        for j in range(1, min(n, 200)):
            if lines[j].strip() in ("---", "..."):
                append(_new_block(_Block, (0, j, 0, "", False)))
                i = j + 1
                break
    para_start = -1
    fence_match = _FENCE.match
    while i < n:
        line = lines[i]
        if line:
            first = line[0]
            if first not in _MD_MARKS and not first.isspace():
                # The common case, a line of text: it opens or continues a paragraph.
                if para_start < 0:
                    para_start = i
                i += 1
                continue
        if not line or not line.strip():
            if para_start >= 0:
                append(_new_block(_Block, (para_start, i - 1, 0, "", False)))
                para_start = -1
            i += 1
            continue
        first = line.lstrip(" ")[:1]
        m = fence_match(line) if first in _FENCE_START else None
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            if para_start >= 0:
                append(_new_block(_Block, (para_start, i - 1, 0, "", False)))
                para_start = -1
            marker = m.group(1)
            j = i + 1
            while j < n:
                head = lines[j][:4]
                if "`" in head or "~" in head:
                    c = fence_match(lines[j])
                    if c and c.group(1)[0] == marker[0] and len(c.group(1)) >= len(marker) and not c.group(2).strip():
                        break
                j += 1
            end = min(j, n - 1)
            append(_new_block(_Block, (i, end, 0, "", True)))
            i = end + 1
            continue
        m = _ATX.match(line) if first == "#" else None
        if m:
            if para_start >= 0:
                append(_new_block(_Block, (para_start, i - 1, 0, "", False)))
                para_start = -1
            append(_new_block(_Block, (i, i, len(m.group(1)), _clean_title(m.group(2) or ""), False)))
            i += 1
            continue
        if para_start >= 0 and first in _SETEXT_START and _SETEXT.match(line):
            level = 1 if line.strip()[0] == "=" else 2
            title = " ".join(lines[k].strip() for k in range(para_start, i))
            append(_new_block(_Block, (para_start, i, level, _clean_title(title), False)))
            para_start = -1
            i += 1
            continue
        if para_start < 0:
            para_start = i
        i += 1
    if para_start >= 0:
        append(_new_block(_Block, (para_start, n - 1, 0, "", False)))
    return blocks


def _parse_rst(lines: Sequence[str]) -> list[_Block]:
    blocks: list[_Block] = []
    styles: dict[tuple[str, bool], int] = {}
    n = len(lines)
    i = 0
    para_start = -1
    while i < n:
        line = lines[i]
        if not line.strip():
            if para_start >= 0:
                blocks.append(_new_block(_Block, (para_start, i - 1, 0, "", False)))
                para_start = -1
            i += 1
            continue
        # overline + title + underline
        if (
            _RST_UNDERLINE.match(line)
            and para_start < 0
            and i + 2 < n
            and lines[i + 1].strip()
            and lines[i + 2].rstrip() == line.rstrip()
        ):
            level = styles.setdefault((line.strip()[0], True), len(styles) + 1)
            blocks.append(_Block(i, i + 2, min(level, 6), lines[i + 1].strip()))
            i += 3
            continue
        if (
            para_start >= 0
            and para_start == i - 1
            and _RST_UNDERLINE.match(line)
            and len(line.rstrip()) >= len(lines[i - 1].rstrip())
        ):
            level = styles.setdefault((line.strip()[0], False), len(styles) + 1)
            blocks.append(_Block(i - 1, i, min(level, 6), lines[i - 1].strip()))
            para_start = -1
            i += 1
            continue
        if para_start < 0:
            para_start = i
        i += 1
    if para_start >= 0:
        blocks.append(_new_block(_Block, (para_start, n - 1, 0, "", False)))
    return blocks


def _parse_plain(lines: Sequence[str], python: bool) -> list[_Block]:
    blocks: list[_Block] = []
    start = -1
    for i, line in enumerate(lines):
        if python and _PY_TOP.match(line):
            if start >= 0:
                blocks.append(_Block(start, i - 1))
            blocks.append(_Block(i, i, 1, line.strip().rstrip(":")))
            start = -1
            continue
        if not line.strip():
            if start >= 0:
                blocks.append(_Block(start, i - 1))
                start = -1
        elif start < 0:
            start = i
    if start >= 0:
        blocks.append(_Block(start, len(lines) - 1))
    return blocks


def _parse_pages(lines: Sequence[str]) -> list[_Block]:
    """A PDF's text (``crag.pages``): paragraphs, each page opening with a heading block
    ``page N`` at its first line of text, so no chunk spans two pages."""
    blocks: list[_Block] = []
    for top in range(0, len(lines), PAGE_LINES):
        page = _parse_plain(lines[top : top + PAGE_LINES], python=False)
        if not page:
            continue
        first = page[0]
        blocks.append(_Block(top + first.start, top + first.start, 1, f"page {top // PAGE_LINES + 1}"))
        if first.end > first.start:
            blocks.append(_Block(top + first.start + 1, top + first.end))
        blocks += [_Block(top + b.start, top + b.end) for b in page[1:]]
    return blocks


def _parse(lines: Sequence[str], suffix: str) -> list[_Block]:
    if suffix in PAGED_SUFFIXES:
        return _parse_pages(lines)
    if suffix in RST_SUFFIXES:
        return _parse_rst(lines)
    if suffix in MARKDOWN_SUFFIXES:
        return _parse_markdown(lines)
    return _parse_plain(lines, python=suffix in PYTHON_SUFFIXES)


def chunk_lines(
    lines: Sequence[str],
    suffix: str = ".md",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    count: Callable[[Sequence[str]], list[int]] | None = None,
    line_tokens: Sequence[int] | None = None,
) -> list[Chunk]:
    """Chunks of ``lines`` (see the module docstring). ``suffix`` picks the parser.

    ``count`` counts the tokens of texts (``token_counter()`` by default). Ranges of lines
    are sized from per-line counts: ``line_tokens`` when given (``count.line_counts(lines)``
    computed ahead, for many files at once), else ``count.line_counts(lines)`` when ``count``
    has it (a ``TokenCounter`` does), else each line counted on its own.
    """
    if not lines:
        return []
    count = count or token_counter()
    blocks = _parse(lines, suffix.lower())
    if suffix.lower() in PAGED_SUFFIXES:
        min_tokens = 0  # every page starts a chunk
    if not blocks:
        return []
    if line_tokens is None:
        line_counts = getattr(count, "line_counts", None)
        line_tokens = line_counts(lines) if line_counts is not None else [c + 1 for c in count(lines)]
    elif len(line_tokens) != len(lines):
        raise ValueError(f"{len(line_tokens)} line counts for {len(lines)} lines")
    prefix = [0, *accumulate(line_tokens)]  # tokens of lines [s, e] = prefix[e + 1] - prefix[s]

    chunks: list[Chunk] = []
    stack: list[tuple[int, str]] = []  # (level, title) of the enclosing headings
    heading_at: list[str] = []  # the heading path at each block
    cur: list[int] = []  # indexes into blocks
    cur_heading = ""

    def emit(start: int, end: int, heading: str) -> None:
        for s, e, t in _verified(lines, start, end, prefix, max_tokens, count):
            if s == e and t > max_tokens:
                for piece, tokens in _cut_line(lines[s], t, max_tokens, count):
                    chunks.append(Chunk(s + 1, e + 1, piece, heading, tokens))
            else:
                chunks.append(Chunk(s + 1, e + 1, "\n".join(lines[s : e + 1]), heading, t))

    def flush(keep_trailing_headings: bool) -> None:
        nonlocal cur, cur_heading, cur_start
        carry: list[int] = []
        if keep_trailing_headings:  # all of them when the chunk is only headings: none stands alone
            while cur and blocks[cur[-1]].level:
                carry.insert(0, cur.pop())
        if cur:
            emit(cur_start, blocks[cur[-1]].end, cur_heading)
        cur = carry
        if carry:
            cur_heading = heading_at[carry[0]]
            cur_start = blocks[carry[0]].start

    path = ""
    cur_start = 0  # first line of the current chunk, when `cur` is not empty
    for k, block in enumerate(blocks):
        start, end, level = block.start, block.end, block.level
        if level:
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, _short_title(block.title)))
            path = " > ".join(t for _, t in stack if t)
            if cur and prefix[blocks[cur[-1]].end + 1] - prefix[cur_start] >= min_tokens:
                flush(keep_trailing_headings=False)
        heading_at.append(path)
        if cur:
            if prefix[end + 1] - prefix[cur_start] <= max_tokens:
                cur.append(k)  # the block fits in the current chunk
                continue
            flush(keep_trailing_headings=True)
        first = cur_start if cur else start
        if prefix[end + 1] - prefix[first] > max_tokens:
            # The block is too big, alone or with the headings carried over to it: cut it
            # at line boundaries, the carried headings staying with its first lines.
            first_heading = cur_heading if cur else path
            for n, (p_start, p_end) in enumerate(_split_range(lines, prefix, first, start + 1, end, max_tokens)):
                emit(p_start, p_end, path if n else first_heading)
            cur = []
            continue
        if not cur:
            cur_heading = path
            cur_start = start
        cur.append(k)
    if cur:
        flush(keep_trailing_headings=False)
    return chunks


# A chunk whose in-file count comes this close to the budget is counted again on its own
# (and so is one starting with "/", which tiktoken may join to the newline before it).
_EXACT_MARGIN = 4


def _verified(
    lines: Sequence[str],
    start: int,
    end: int,
    prefix: Sequence[int],
    max_tokens: int,
    count: Callable[[Sequence[str]], list[int]],
) -> list[tuple[int, int, int]]:
    """``[(start, end, tokens)]`` within the budget by an exact count of the joined lines.

    Packing uses in-file counts (``prefix``), which can differ from the count of the chunk's
    text on its own by a token or two at its edges; when a range comes within
    ``_EXACT_MARGIN`` of the budget its text is counted exactly, and a range still over the
    budget is cut where half its tokens are behind, until it fits (a single line always
    stands alone).
    """
    estimate = prefix[end + 1] - prefix[start]
    if start == end or (estimate <= max_tokens - _EXACT_MARGIN and lines[start][:1] != "/"):
        return [(start, end, estimate)]
    exact = count(["\n".join(lines[start : end + 1])])[0]
    if exact <= max_tokens:
        return [(start, end, exact)]
    mid = bisect_left(prefix, prefix[start] + estimate / 2, start + 1, end) - 1
    out = []
    for s, e in ((start, mid), (mid + 1, end)):
        while s <= e and not lines[s].strip():
            s += 1
        while e >= s and not lines[e].strip():
            e -= 1
        if s <= e:
            out += _verified(lines, s, e, prefix, max_tokens, count)
    return out


def _cut_line(
    line: str, estimate: int, max_tokens: int, count: Callable[[Sequence[str]], list[int]]
) -> list[tuple[str, int]]:
    """``[(piece, tokens)]``: one line over the budget in pieces within it, which join back
    into the line. A piece is sized from the line's characters per token and ends after a
    space when one lies in its second half; one still over the budget is halved. Each
    character is counted about once."""
    pieces: list[tuple[str, int]] = []
    per_token = len(line) / max(estimate, 1)
    i, n = 0, len(line)
    while i < n:
        size = max(1, int(max_tokens * per_token * 0.9))
        while True:
            j = min(n, i + size)
            if j < n:
                space = line.rfind(" ", i + size // 2, j)
                if space > i:
                    j = space + 1  # the space stays with the piece before it
            tokens = count([line[i:j]])[0]
            if tokens <= max_tokens or j - i <= 1:
                break
            size = max(1, (j - i) // 2)
        pieces.append((line[i:j], tokens))
        i = j
    return pieces


def _split_range(
    lines: Sequence[str], prefix: Sequence[int], start: int, first_cut: int, end: int, max_tokens: int
) -> list[tuple[int, int]]:
    """Line ranges (0-based, inclusive) of at most ``max_tokens`` each; one long line stays whole.

    No range ends before line ``first_cut - 1`` (so carried headings keep a line of text).
    """
    pieces: list[tuple[int, int]] = []
    p_start = start
    for i in range(max(first_cut, start + 1), end + 1):
        if prefix[i + 1] - prefix[p_start] > max_tokens:
            pieces.append((p_start, i - 1))
            p_start = i
    pieces.append((p_start, end))
    # Pieces made only of blank lines add nothing; keep the others.
    return [p for p in pieces if any(lines[j].strip() for j in range(p[0], p[1] + 1))]


def chunk_text(
    text: str,
    suffix: str = ".md",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    count: Callable[[Sequence[str]], list[int]] | None = None,
) -> list[Chunk]:
    """Chunks of normalised ``text`` (see ``discover.decode_text``)."""
    return chunk_lines(split_lines(text), suffix, max_tokens, min_tokens, count)
