"""The embedded index checks itself: checksums written when a generation is published,
verified when it is opened, and the database's shape and counts checked against its meta.

A published generation is never modified, so any change to its files is damage: a dropped
FTS table, garbage written into the database or into the FAISS file (even at the same
size), deleted chunk rows. ``write_checksums`` records the size and CRC-32 of each file in
``CHECKSUMS`` next to them before ``CURRENT`` names the generation; ``verify`` recomputes
them (a sequential read of both files, the cost of opening an index) and also checks what
a generation written before checksums existed can still be checked by: the tables are
all there, the numbers in ``meta`` are numbers, the chunk rows, the file records and
the meta agree, and the rows hold text and line numbers of the right types. A generation
whose meta says it was written with ``CHECKSUMS`` (every one since) and has none lost it:
that is damage too. Every failure is an ``IndexStoreError`` saying what is damaged and how to
rebuild; ``crag index`` rebuilds a damaged index from its documents instead of building on it.

``read_current_name`` reads the ``CURRENT`` pointer defensively (a folder, bytes that are
not text, a huge file are damage, not a traceback). ``open_regular`` opens an index file
for reading without waiting: a named pipe or a device put where a file of the index
belongs would block ``open`` (or a read) for ever; it is damage too.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
import zlib
from collections.abc import Mapping, Sequence

from ..errors import IndexStoreError

__all__ = [
    "CHECKED_FILES",
    "CHECKSUMS",
    "INT_META",
    "TABLES",
    "check_regular",
    "int_meta",
    "not_a_folder",
    "open_regular",
    "read_current_name",
    "verify",
    "write_checksums",
]

CHECKSUMS = "CHECKSUMS"
CHECKED_FILES = ("chunks.sqlite", "vectors.faiss")  # what CHECKSUMS holds: layout.DATABASE, layout.VECTORS
TABLES = frozenset({"meta", "roots", "files", "chunks", "fts", "files_fts"})
INT_META = ("chunks", "dim")  # meta values that must be whole numbers
OPTIONAL_INT_META = ("next_chunk_id", "vectors_bytes")  # ... when present
_BLOCK = 1 << 20
_MAX_LINE = 1 << 40  # a line number past any file crag reads
# Rows a reader would turn into a traceback or a wrong citation: text that is not text, line
# numbers that are not whole numbers in 1.._MAX_LINE (start before end).
_BAD_ROWS = f"""
SELECT (SELECT count(*) FROM chunks WHERE typeof(text) != 'text' OR typeof(heading) != 'text'
            OR typeof(start_line) != 'integer' OR typeof(end_line) != 'integer'
            OR start_line < 1 OR end_line < start_line OR end_line > {_MAX_LINE})
     + (SELECT count(*) FROM files WHERE typeof(path) != 'text' OR typeof(root) != 'text')
"""
_MAX_CURRENT_BYTES = 256


def _digest(path: str) -> dict[str, int]:
    with open(path, "rb") as f:
        return _digest_fd(f.fileno())


def _digest_fd(fd: int) -> dict[str, int]:
    """Size and CRC-32 of an open file, read with ``pread`` (its offset is left alone)."""
    crc = 0
    size = 0
    while block := os.pread(fd, _BLOCK, size):
        crc = zlib.crc32(block, crc)
        size += len(block)
    return {"size": size, "crc32": crc}


def write_checksums(gen_dir: str, names: Sequence[str]) -> None:
    """Record the size and CRC-32 of ``names`` (files in ``gen_dir``) in ``CHECKSUMS``, fsynced."""
    record = {name: _digest(os.path.join(gen_dir, name)) for name in names}
    path = os.path.join(gen_dir, CHECKSUMS)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _damaged(index_dir: str, what: str, hint: str) -> IndexStoreError:
    return IndexStoreError(f"the index in {index_dir} is damaged ({what}): {hint}", index_dir)


def open_regular(path: str, index_dir: str, hint: str) -> int:
    """A read-only descriptor of the regular file at ``path`` (a file of the index folder).

    Opened with ``O_NONBLOCK``, so that a named pipe there does not wait for a writer; anything
    but a regular file (a pipe, a device, a socket, which ``open`` refuses with ENXIO) is
    damage. A folder raises ``IsADirectoryError``, as ``open`` does; other failures are the
    ``OSError`` of ``os.open``.
    """
    name = os.path.relpath(path, index_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a device without its driver): never opened at all
            raise _damaged(index_dir, f"{name} is not a regular file", hint) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    raise _damaged(index_dir, f"{name} is not a regular file", hint)


def check_regular(path: str) -> None:
    """An ``OSError`` unless ``path`` is a regular file, found without opening it (for a
    library that opens it by name and would wait on a named pipe)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", path)


def read_current_name(path: str, index_dir: str, hint: str) -> str | None:
    """The text of the ``CURRENT`` file at ``path``; None when absent; damage is an IndexStoreError."""
    try:
        fd = open_regular(path, index_dir, hint)
        try:
            raw = os.read(fd, _MAX_CURRENT_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise _damaged(index_dir, "CURRENT is a folder", hint) from None
    except NotADirectoryError:
        raise not_a_folder(index_dir) from None
    except OSError as exc:  # the folder cannot be reached (a name too long, no permission): no index can fix it
        raise IndexStoreError(f"cannot read {path} ({exc.strerror or exc}): check --index or KB_AGENT_INDEX_DIR", index_dir) from exc
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise _damaged(index_dir, "CURRENT does not name a generation", hint) from None
    if len(raw) > _MAX_CURRENT_BYTES:
        raise _damaged(index_dir, "CURRENT does not name a generation", hint)
    return text.strip()


def not_a_folder(index_dir: str) -> IndexStoreError:
    """The error for an index folder that is a file, or lies below one: it names the file."""
    path = index_dir
    while not os.path.lexists(path) and os.path.dirname(path) not in ("", path):
        path = os.path.dirname(path)
    return IndexStoreError(
        f"{path} is a file, not an index folder: point --index or KB_AGENT_INDEX_DIR at a folder", index_dir
    )


def int_meta(meta: Mapping[str, str], key: str, index_dir: str, hint: str, default: int | None = None) -> int:
    """``meta[key]`` as a whole number; anything else is damage."""
    raw = meta.get(key)
    if raw is None and default is not None:
        return default
    try:
        return int(str(raw))
    except ValueError:
        raise _damaged(index_dir, f"meta {key} is not a number", hint) from None


def verify(
    gen_dir: str, conn: sqlite3.Connection, meta: Mapping[str, str], index_dir: str, hint: str,
    held: Mapping[str, int] | None = None,
) -> None:
    """Check one generation (see the module docstring); raises ``IndexStoreError`` on damage.

    ``held`` maps file names of the generation to descriptors its reader holds open: those
    files are read through them (the generation may have been deleted since it was opened).
    """
    held = held or {}

    def digest(name: str) -> dict[str, int]:
        return _digest_fd(held[name]) if name in held else _digest(os.path.join(gen_dir, name))

    try:
        if CHECKSUMS in held:
            recorded = json.loads(os.pread(held[CHECKSUMS], _BLOCK, 0).decode("utf-8"))
        else:
            with open(os.path.join(gen_dir, CHECKSUMS), encoding="utf-8") as f:
                recorded = json.load(f)
    except FileNotFoundError:
        if meta.get("checksums"):  # the generation was written with one: it was deleted
            raise _damaged(index_dir, f"its checksum file {CHECKSUMS} is missing", hint) from None
        recorded = None  # written before checksums existed: the checks below still apply
    except (OSError, ValueError, RecursionError) as exc:
        raise _damaged(index_dir, "its checksum file cannot be read", hint) from exc
    if recorded is not None:
        if not isinstance(recorded, dict):
            raise _damaged(index_dir, "its checksum file cannot be read", hint)
        if sorted(recorded) != sorted(CHECKED_FILES):  # only the generation's own files are read
            raise _damaged(index_dir, f"its checksum file does not list {' and '.join(CHECKED_FILES)}", hint)
        for name, expected in sorted(recorded.items()):
            try:
                actual = digest(str(name))
            except OSError as exc:
                raise _damaged(index_dir, f"{name} cannot be read: {exc.strerror or exc}", hint) from exc
            if actual != expected:
                raise _damaged(index_dir, f"{name} does not match its checksum", hint)
    for key in INT_META:
        int_meta(meta, key, index_dir, hint)
    for key in OPTIONAL_INT_META:
        if key in meta:
            int_meta(meta, key, index_dir, hint)
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = sorted(TABLES - tables)
        if missing:
            raise _damaged(index_dir, f"table {', '.join(missing)} is missing", hint)
        chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        listed = conn.execute("SELECT coalesce(sum(chunks), 0) FROM files").fetchone()[0]
        if recorded is None:  # no checksum vouches for the rows: check what readers rely on
            bad = conn.execute(_BAD_ROWS).fetchone()[0]
            if bad:
                raise _damaged(index_dir, f"{bad} rows hold values of the wrong type or out of range", hint)
    except sqlite3.Error as exc:
        raise _damaged(index_dir, str(exc), hint) from exc
    expected_chunks = int_meta(meta, "chunks", index_dir, hint)
    if not chunks == listed == expected_chunks:
        raise _damaged(
            index_dir, f"{chunks} chunk rows, {listed} listed by its files, {expected_chunks} recorded", hint
        )
