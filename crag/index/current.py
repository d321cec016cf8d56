"""Where an indexed chunk's text is in its file now, for a file edited since it was indexed.

``ask`` and ``search`` without ``--kb`` search the index as it stands, and a user edits
files between two ``crag index`` runs. A chunk's ``start_line`` then points at whatever the
file holds there now, and an answer would cite a line that does not show the cited text.
So a search hit is checked against its file before it becomes evidence:

- the file's lines at the chunk's place are the chunk's text: the hit stands as it is;
- otherwise the chunk's non-blank lines are looked for in the file (in order, blank lines
  aside: ``difflib``'s matching blocks); when at least half of them are found close together,
  the hit becomes the file's lines from the first found to the last, text and numbers both,
  so the evidence is what the file says now (a paragraph inserted in the section is read
  with it; a changed number is read as changed);
- when fewer are found, the file no longer holds the chunk's text: it is not evidence.

A file the knowledge base now leaves out (``left_out``: an ignore file written since names
it) is no evidence, whatever it holds.

A file that cannot be read here (gone, a store shared with another machine, too large) is
not judged: the hit stands as the index holds it; so is a PDF or DOCX, whose text is costly
to extract, and a file reached through a symbolic link that leads out of the roots (one that
replaced it since it was indexed): ``crag index`` never follows one out of a root. A link inside
the roots is read as the indexer read it, which indexes a file under the link's path when the
link leads where nothing else does (into a hidden folder). ``current_lines`` reads a file as the
indexer does (``crag.index.discover``), so the numbering is crag's everywhere.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence

from .discover import MAX_FILE_BYTES, is_within, read_bytes, split_lines, text_of
from .ignore import Ignores
from .readers import reader_for

__all__ = ["Place", "current_lines", "left_out", "place_now"]

Place = tuple[int, int, str]  # start line, end line (1-based, inclusive), text


def current_lines(path: str, roots: Sequence[str]) -> list[str] | None:
    """The lines of ``path`` as the indexer reads them, or None when it cannot be read here, is
    a PDF or DOCX (their text takes seconds to extract, on every ``ask``, and such a file is
    seldom edited in place), or is reached through a symbolic link leading out of ``roots``
    (real paths, as the index records them)."""
    reader = reader_for(os.path.basename(path))
    if reader is not None and reader.extra:
        return None
    real = os.path.realpath(path)
    if real != os.path.abspath(path) and not any(is_within(real, root) for root in roots):
        return None  # a link out of the roots, which crag index never follows
    try:
        return split_lines(text_of(path, read_bytes(path, MAX_FILE_BYTES)))
    except (OSError, ValueError):
        return None


def left_out(path: str, roots: Sequence[str]) -> bool:
    """Whether the knowledge base leaves ``path`` out now (an ignore file written since it was
    indexed names it), in every root that holds it: ``read_file`` and ``grep_search`` refuse such
    a file, and its indexed text, a secret perhaps, is no evidence either until ``crag index``
    drops it."""
    holding = [root for root in roots if is_within(path, root)]
    return bool(holding) and all(_ignored(path, root) for root in holding)


def _ignored(path: str, root: str) -> bool:
    """Whether the ignore files (or a folder they leave out on the way) leave ``path`` out of
    ``root``, as the walk would; only those: a PDF whose reader is missing now stays evidence."""
    if path == root:
        return False  # a file named as a root is indexed whatever ignore files say
    ignores = Ignores(root)
    folder = root
    for part in os.path.relpath(path, root).split(os.sep)[:-1]:
        folder = os.path.join(folder, part)
        if ignores.ignored(folder, is_dir=True):
            return True
    return ignores.ignored(path, is_dir=False)


def place_now(text: str, start: int, end: int, lines: list[str]) -> Place | None:
    """Where the chunk ``text``, indexed at lines ``start``-``end``, is in ``lines`` now (see
    the module docstring): its place unchanged, a new place with the text found there, or
    None when ``lines`` no longer hold it."""
    chunk = text.split("\n")
    if lines[start - 1 : end] == chunk:
        return start, end, text
    if start == end and len(chunk) == 1:  # a piece of a line too long for one chunk
        return _piece(text, start, lines)
    return _region(chunk, lines)


def _piece(text: str, line: int, lines: list[str]) -> Place | None:
    if 0 < line <= len(lines) and text in lines[line - 1]:
        return line, line, text
    found = [i for i, held in enumerate(lines, 1) if text in held]
    if not found:
        return None
    nearest = min(found, key=lambda i: abs(i - line))
    return nearest, nearest, text


def _region(chunk: list[str], lines: list[str]) -> Place | None:
    wanted = sum(1 for line in chunk if line.strip())
    if not wanted:
        return None
    matcher = difflib.SequenceMatcher(lambda line: not line.strip(), chunk, lines, autojunk=False)
    blocks = [b for b in matcher.get_matching_blocks() if b.size]
    if not blocks:
        return None
    # The found lines close together around the longest run: a stray match of a common line
    # ("```", "---") far away is not a place of this chunk.
    best = max(blocks, key=lambda b: sum(1 for line in chunk[b.a : b.a + b.size] if line.strip()))
    slack = 2 * len(chunk)
    first, last = best.b, best.b + best.size
    for b in sorted(blocks, key=lambda b: abs(b.b - best.b)):
        if b.b + b.size >= first - slack and b.b <= last + slack:
            first, last = min(first, b.b), max(last, b.b + b.size)
    found = sum(
        1
        for b in blocks
        if first <= b.b and b.b + b.size <= last
        for line in chunk[b.a : b.a + b.size]
        if line.strip()
    )
    if 2 * found < wanted:
        return None
    while not lines[first].strip():  # a found run may open or close on a blank line
        first += 1
    while not lines[last - 1].strip():
        last -= 1
    return first + 1, last, "\n".join(lines[first:last])
