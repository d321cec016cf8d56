"""Cutting a file into chunks on its Markdown structure, within a tiktoken budget.

A file is first parsed into blocks: headings (ATX ``#`` and setext underlines; for
reStructuredText, underlined titles; for Python, top-level ``def``/``class`` lines),
fenced code blocks (kept whole, blank lines and all), YAML front matter, and paragraphs
(runs of non-blank lines). Blocks are then packed greedily into chunks of at most
``max_tokens`` tokens (counted with tiktoken, ``crag.llm.tokens``):

* a heading starts a new chunk once the current one holds at least ``min_tokens``, so
  sections stay apart but a run of tiny sections is not scattered into tiny chunks;
* a heading is never the last thing in a chunk: it moves on with the text it introduces;
* a code fence is never cut unless it alone exceeds the budget; an oversized block is cut
  at line boundaries, and a single line longer than the budget becomes one chunk by itself.

Every chunk is a contiguous range of whole lines: ``text`` is exactly
``"\\n".join(lines[start_line - 1 : end_line])`` of ``discover.split_lines`` (tested on
real corpora), so a citation ``path:Lstart`` opens where the text begins. ``heading`` is
the chunk's heading path (``"Deployment > Docker > Build"``) at its first line; the indexer
prepends it to the text that is embedded and lexically indexed, never to ``text``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from attrs import frozen

from .discover import split_lines

__all__ = [
    "CHUNKER_VERSION",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MIN_TOKENS",
    "Chunk",
    "chunk_lines",
    "chunk_text",
    "token_counter",
]

CHUNKER_VERSION = 1
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
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+:.])\1{2,}[ \t]*$")
_PY_TOP = re.compile(r"^(?:async[ \t]+def|def|class)[ \t]+\w")


@frozen
class Chunk:
    """A contiguous range of lines of one file (1-based, inclusive) and its heading path."""

    start_line: int
    end_line: int
    text: str
    heading: str
    tokens: int


@frozen
class _Block:
    start: int  # 0-based line index, inclusive
    end: int  # inclusive
    level: int = 0  # heading level, 0 for other blocks
    title: str = ""
    fence: bool = False


def token_counter(encoding: str | None = None) -> Callable[[Sequence[str]], list[int]]:
    """A function counting the tokens of many texts at once with tiktoken (no network)."""
    from ..llm.tokens import DEFAULT_ENCODING, get_encoding

    enc = get_encoding(encoding or DEFAULT_ENCODING)

    encode = enc.encode_ordinary

    def count(texts: Sequence[str]) -> list[int]:
        return [len(encode(t)) for t in texts]

    return count


def _clean_title(raw: str) -> str:
    title = _ATX_CLOSE.sub("", raw.strip())
    title = _ANCHOR.sub("", title)
    return title.strip().strip("#").strip().replace("`", "")


def _parse_markdown(lines: Sequence[str]) -> list[_Block]:
    blocks: list[_Block] = []
    n = len(lines)
    i = 0
    if n and lines[0].strip() == "---":  # YAML front matter
        for j in range(1, min(n, 200)):
            if lines[j].strip() in ("---", "..."):
                blocks.append(_Block(0, j))
                i = j + 1
                break
    para_start = -1

    def close_para(end: int) -> None:
        nonlocal para_start
        if para_start >= 0:
            blocks.append(_Block(para_start, end))
            para_start = -1

    while i < n:
        line = lines[i]
        if not line.strip():
            close_para(i - 1)
            i += 1
            continue
        first = line.lstrip(" ")[:1]
        m = _FENCE.match(line) if first in _FENCE_START else None
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            close_para(i - 1)
            marker = m.group(1)
            j = i + 1
            while j < n:
                c = _FENCE.match(lines[j])
                if c and c.group(1)[0] == marker[0] and len(c.group(1)) >= len(marker) and not c.group(2).strip():
                    break
                j += 1
            end = min(j, n - 1)
            blocks.append(_Block(i, end, fence=True))
            i = end + 1
            continue
        m = _ATX.match(line) if first == "#" else None
        if m:
            close_para(i - 1)
            blocks.append(_Block(i, i, len(m.group(1)), _clean_title(m.group(2) or "")))
            i += 1
            continue
        if para_start >= 0 and first in _SETEXT_START and _SETEXT.match(line):
            level = 1 if line.strip()[0] == "=" else 2
            title = " ".join(lines[k].strip() for k in range(para_start, i))
            blocks.append(_Block(para_start, i, level, _clean_title(title)))
            para_start = -1
            i += 1
            continue
        if para_start < 0:
            para_start = i
        i += 1
    close_para(n - 1)
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
                blocks.append(_Block(para_start, i - 1))
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
        blocks.append(_Block(para_start, n - 1))
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


def _parse(lines: Sequence[str], suffix: str) -> list[_Block]:
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
) -> list[Chunk]:
    """Chunks of ``lines`` (see the module docstring). ``suffix`` picks the parser."""
    if not lines:
        return []
    count = count or token_counter()
    blocks = _parse(lines, suffix.lower())
    if not blocks:
        return []
    texts = ["\n".join(lines[b.start : b.end + 1]) for b in blocks]
    sizes = count(texts)

    chunks: list[Chunk] = []
    stack: list[tuple[int, str]] = []  # (level, title) of the enclosing headings
    cur: list[int] = []  # indexes into blocks
    cur_tokens = 0
    cur_heading = ""

    def heading_path() -> str:
        return " > ".join(t for _, t in stack if t)

    def emit(start: int, end: int, tokens: int, heading: str) -> None:
        for s, e, t in _verified(lines, start, end, tokens, max_tokens, count):
            chunks.append(Chunk(s + 1, e + 1, "\n".join(lines[s : e + 1]), heading, t))

    def flush(keep_trailing_headings: bool) -> None:
        nonlocal cur, cur_tokens, cur_heading
        if not cur:
            return
        carry: list[int] = []
        if keep_trailing_headings:
            while len(cur) > 1 and blocks[cur[-1]].level:
                carry.insert(0, cur.pop())
        tokens = sum(sizes[k] for k in cur) + len(cur) - 1
        emit(blocks[cur[0]].start, blocks[cur[-1]].end, tokens, cur_heading)
        cur = carry
        cur_tokens = sum(sizes[k] for k in carry) + max(0, len(carry) - 1)
        if carry:
            cur_heading = _path_at(carry[0])

    heading_at: dict[int, str] = {}

    def _path_at(k: int) -> str:
        return heading_at.get(k, "")

    for k, block in enumerate(blocks):
        if block.level:
            while stack and stack[-1][0] >= block.level:
                stack.pop()
            stack.append((block.level, block.title))
            if cur and cur_tokens >= min_tokens:
                flush(keep_trailing_headings=False)
        heading_at[k] = heading_path()
        size = sizes[k]
        if cur and cur_tokens + 1 + size > max_tokens:
            flush(keep_trailing_headings=True)
        if size > max_tokens:
            # The block alone is too big: emit what is pending (headings included), then
            # cut this block at line boundaries.
            pending_start = blocks[cur[0]].start if cur else None
            cur_head = cur_heading if cur else heading_at[k]
            used = cur_tokens + 1 if cur else 0
            pieces = _split_block(lines, block.start, block.end, max_tokens, count, used)
            first = True
            for p_start, p_end, p_tokens in pieces:
                start = pending_start if first and pending_start is not None else p_start
                emit(start, p_end, p_tokens + (used if first else 0), cur_head if first else heading_at[k])
                first = False
            cur, cur_tokens = [], 0
            continue
        if not cur:
            cur_heading = heading_at[k]
            cur_tokens = size
        else:
            cur_tokens += 1 + size
        cur.append(k)
    flush(keep_trailing_headings=False)
    return chunks


def _verified(
    lines: Sequence[str],
    start: int,
    end: int,
    estimate: int,
    max_tokens: int,
    count: Callable[[Sequence[str]], list[int]],
) -> list[tuple[int, int, int]]:
    """``[(start, end, tokens)]`` within the budget by an exact count of the joined lines.

    Packing adds up per-block counts, and BPE merges across line breaks make the joined
    text almost always cheaper than that sum; when the sum is close enough to the budget
    for the difference to matter, the joined text is counted, and a range still over the
    budget is halved until it fits (a single line always stands alone).
    """
    n = end - start + 1
    if n == 1 or estimate + 2 * n + 2 <= max_tokens:
        return [(start, end, estimate)]
    exact = count(["\n".join(lines[start : end + 1])])[0]
    if exact <= max_tokens:
        return [(start, end, exact)]
    mid = (start + end) // 2
    out = []
    for s, e in ((start, mid), (mid + 1, end)):
        while s <= e and not lines[s].strip():
            s += 1
        while e >= s and not lines[e].strip():
            e -= 1
        if s <= e:
            out += _verified(lines, s, e, max_tokens + 2 * (e - s + 1) + 3, max_tokens, count)
    return out


def _split_block(
    lines: Sequence[str],
    start: int,
    end: int,
    max_tokens: int,
    count: Callable[[Sequence[str]], list[int]],
    used: int = 0,
) -> list[tuple[int, int, int]]:
    """Line ranges (0-based, inclusive) of at most ``max_tokens`` each; one long line stays whole.

    ``used`` tokens of the first piece's budget are already taken (headings it carries).
    """
    sizes = count(list(lines[start : end + 1]))
    pieces: list[tuple[int, int, int]] = []
    p_start, p_tokens, budget = start, 0, max_tokens - used
    for offset, size in enumerate(sizes):
        i = start + offset
        if i > p_start and p_tokens + 1 + size > budget:
            pieces.append((p_start, i - 1, p_tokens))
            p_start, p_tokens, budget = i, size, max_tokens
        else:
            p_tokens += size + (1 if i > p_start else 0)
    pieces.append((p_start, end, p_tokens))
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
