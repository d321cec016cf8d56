"""The embedded store on disk: generations of FAISS + SQLite files, published atomically.

Layout of ``KB_AGENT_INDEX_DIR``::

    CURRENT              one line, "gen-000007": the generation readers use
    LOCK                 held (fcntl.flock) by the one indexer allowed at a time; removed
                         by its holder when it lets go
    gen-000007/
        vectors.faiss    unit vectors as 8-bit codes, inner product = cosine, searched
                         exactly or through IVF cells by the knowledge base's size
                         (``crag.index.vectors``);
                         FAISS ids are the chunk ids of the database
        CHECKSUMS        size and CRC-32 of both files, checked when the generation is
                         opened for search or built on (``crag.index.integrity``)
        chunks.sqlite    meta, roots, files, chunks; ``fts`` (FTS5, porter) over chunks
                         and ``files_fts`` over whole files, for BM25

Theory of operation. A generation is written once and never modified. An update (under
the lock) builds the next generation in a new directory: the previous database is copied
and edited (rows of changed and deleted files removed, new chunks added), the previous
FAISS index is loaded, edited the same way and written next to it (or hard-linked when the
vectors did not change), both files are fsynced, and only then is ``CURRENT`` replaced
atomically (``publish``: write a temporary file, fsync, ``os.replace``, fsync the
directory). Older generations are deleted afterwards (``cleanup``). A kill at any moment
therefore leaves ``CURRENT`` naming a complete generation in which FAISS and SQLite agree;
an unfinished generation directory, or the previous one of an indexer killed before its
``cleanup``, is garbage that the next indexer removes once it holds the lock (``tidy``). A finished
generation's database names it in its meta, written just before ``CURRENT`` is: a ``CURRENT``
lost or damaged beside one is damage, not "no index", and a rebuild walks the roots of the
newest one (``published_generations``, ``salvage_roots``). Readers take
no lock: they open the generation ``CURRENT`` names (retrying if an indexer deleted it in
between) and hold its files open from then on, so the checksums, the FAISS file and the
database they read are the ones of that generation even after an indexer has published a
newer one and deleted this one: POSIX keeps the files of a deleted generation readable for
as long as they are open (a ``Generation`` reads them through its own descriptors).

This module holds the layout and the generation files (the lock is ``crag.index.lock``); ``embedded_write``
writes a generation, ``store`` reads one, ``embedded`` is the ``Store`` port over them.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
import time
import weakref
from typing import Any

from attrs import frozen

from ..errors import IndexFormatError, IndexStoreError
from . import integrity
from .lock import DEFAULT_LOCK_TIMEOUT, LOCK, NOFOLLOW, IndexLock, being_built

__all__ = [
    "CURRENT",
    "DATABASE",
    "DEFAULT_LOCK_TIMEOUT",
    "GENERATION",
    "LOCK",
    "SCHEMA",
    "SCHEMA_VERSION",
    "VECTORS",
    "Generation",
    "IndexLock",
    "being_built",
    "check_link",
    "cleanup",
    "connect_ro",
    "current_exists",
    "current_generation",
    "current_version",
    "fsync_dir",
    "fsync_file",
    "generation_version",
    "next_generation",
    "open_generation",
    "publish",
    "published_generations",
    "read_current",
    "read_vectors",
    "reindex_hint",
    "salvage_roots",
    "tidy",
    "version_of",
]

SCHEMA_VERSION = 2
CURRENT = "CURRENT"
VECTORS = "vectors.faiss"
DATABASE = "chunks.sqlite"
GENERATION = re.compile(r"^gen-(\d{6,})$")

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE roots (path TEXT PRIMARY KEY);
CREATE TABLE files (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    root TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    chunks INTEGER NOT NULL
);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    heading TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX chunks_file ON chunks(file_id);
CREATE VIRTUAL TABLE fts USING fts5(title, heading, body, tokenize='porter unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE files_fts USING fts5(title, body, tokenize='porter unicode61 remove_diacritics 2');
"""


def reindex_hint(index_dir: str) -> str:
    return f"run `python -m crag index PATH` (with KB_AGENT_INDEX_DIR={index_dir}) to rebuild it"


# ---------------------------------------------------------------------------------------
# Reading CURRENT and opening a generation


def check_link(index_dir: str) -> None:
    """An ``IndexStoreError`` when ``index_dir`` is a symbolic link to nothing: crag neither
    reads it as "no index yet" nor creates its target (a drive that is not mounted, say); or
    when its name is not UTF-8 (faiss takes file names as UTF-8 text, and failed with a
    ``TypeError`` on one)."""
    if any("\ud800" <= ch <= "\udfff" for ch in index_dir):  # bytes that were not UTF-8
        from ..safe_text import display_name

        raise IndexStoreError(
            f"the index folder {display_name(index_dir)} cannot be used: its name is not valid UTF-8: "
            "choose another folder with --index DIR or KB_AGENT_INDEX_DIR",
            index_dir,
        )
    if os.path.islink(index_dir) and not os.path.exists(index_dir):
        try:
            os.stat(index_dir)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise IndexStoreError(
                    f"the index folder {index_dir} is a symbolic link that leads round in a loop: "
                    "point it at a folder, or remove the link",
                    index_dir,
                ) from None
        try:
            target = os.readlink(index_dir)
        except OSError:
            target = "?"
        raise IndexStoreError(
            f"the index folder {index_dir} is a symbolic link to {target}, which does not exist: "
            "create that folder (or mount its drive), or remove the link",
            index_dir,
        )


def read_current(index_dir: str) -> str | None:
    """The generation ``CURRENT`` names; None when there is none; IndexStoreError when unreadable
    or damaged (a folder, bytes that are not a generation name, missing beside a published
    generation), or when ``index_dir`` is a symbolic link to nothing (``check_link``)."""
    check_link(index_dir)
    name = integrity.read_current_name(os.path.join(index_dir, CURRENT), index_dir, reindex_hint(index_dir))
    if name is None:
        if published_generations(index_dir):  # the pointer was lost, not the index
            raise IndexStoreError(
                f"the index in {index_dir} is damaged (CURRENT is missing): {reindex_hint(index_dir)}", index_dir
            )
        return None
    if not GENERATION.match(name):
        raise IndexStoreError(f"the index in {index_dir} is damaged (bad CURRENT file): {reindex_hint(index_dir)}", index_dir)
    return name


def current_generation(index_dir: str) -> str | None:
    """The generation ``CURRENT`` names, or None (cheap: one small file read)."""
    try:
        return read_current(index_dir)
    except IndexStoreError:
        return None


def version_of(name: str, st: os.stat_result | None) -> str:
    """A published generation's version: its name and its database file's identity, so that a
    generation of the same name in an index folder deleted and built again (``gen-000001``
    once more) is not taken for the one a reader holds."""
    return name if st is None else f"{name}:{st.st_ino}:{st.st_mtime_ns}"


def current_version(index_dir: str) -> str | None:
    """``version_of`` the generation ``CURRENT`` names, or None (cheap: a small read, a stat)."""
    name = current_generation(index_dir)
    if name is None:
        return None
    try:
        st = os.stat(os.path.join(index_dir, name, DATABASE))
    except OSError:
        st = None
    return version_of(name, st)


def generation_version(gen: Generation) -> str:
    """``version_of`` a generation opened for reading, from the database file it holds open."""
    fd = gen.held.get(DATABASE)
    try:
        st = os.fstat(fd) if fd is not None else os.stat(gen.db_path)
    except OSError:
        st = None
    return version_of(gen.name, st)


def current_exists(index_dir: str) -> bool:
    return os.path.exists(os.path.join(index_dir, CURRENT))


def connect_ro(path: str) -> sqlite3.Connection:
    from urllib.parse import quote

    uri = "file:" + quote(path, safe="/") + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True, check_same_thread=False)


@frozen
class Generation:
    """A published generation opened for reading: its paths, meta and connection, and its
    files held open (``held``: name -> descriptor), so that a generation an indexer deletes
    while it is read stays readable. ``close`` lets go of all of it."""

    index_dir: str
    name: str
    db_path: str
    vectors_path: str
    conn: sqlite3.Connection
    meta: dict[str, str]
    held: dict[str, int]

    def readable(self, name: str) -> str:
        """A path that opens the generation's file ``name`` as it was opened, deleted or not."""
        fd = self.held.get(name)
        if fd is not None and os.path.isdir("/proc/self/fd"):
            return f"/proc/self/fd/{fd}"
        return os.path.join(self.index_dir, self.name, name)

    def close(self) -> None:
        _close_all(self.held, self.conn)


def _close_all(held: dict[str, int], conn: sqlite3.Connection | None = None) -> None:
    if conn is not None:
        conn.close()
    for fd in held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    held.clear()


def _hold(index_dir: str, gen_dir: str) -> dict[str, int] | None:
    """Descriptors of a generation's files (CHECKSUMS only when it has one); None when the
    generation is gone (an indexer removed it after publishing a newer one)."""
    held: dict[str, int] = {}
    try:
        for name in (integrity.CHECKSUMS, VECTORS, DATABASE):
            try:
                held[name] = integrity.open_regular(os.path.join(gen_dir, name), index_dir, reindex_hint(index_dir))
            except FileNotFoundError:
                if name != integrity.CHECKSUMS:
                    _close_all(held)
                    return None
    except (OSError, IndexStoreError):
        _close_all(held)
        raise
    return held


def open_generation(index_dir: str, verify: bool = False) -> Generation:
    """The generation ``CURRENT`` names, its database open read-only; errors → IndexStoreError.

    With ``verify`` the generation checks itself first (``crag.index.integrity``: checksums,
    tables, counts), so damage is found on open rather than as wrong results.
    """
    last_missing = None
    for _ in range(5):
        try:
            name = read_current(index_dir)
        except IndexStoreError:
            if current_exists(index_dir) or not being_built(index_dir):
                raise
            name = None  # the first crag index of the folder, about to publish its generation
        if name is None:
            # ./.crag is where the search for an index ends when no folder above holds one
            # (crag.config.find_index_dir); the store hands the folder over absolute.
            here = os.path.abspath(index_dir) == os.path.abspath(".crag")
            if being_built(index_dir):
                raise IndexStoreError(f"no index in {index_dir} yet: a crag index is building it now; "
                                      "try again when it has finished", index_dir)
            where = ".crag (nor a .crag in any parent folder)" if here else index_dir
            raise IndexStoreError(f"no index in {where}: run `python -m crag index PATH` first", index_dir)
        gen_dir = os.path.join(index_dir, name)
        db_path = os.path.join(gen_dir, DATABASE)
        vectors_path = os.path.join(gen_dir, VECTORS)
        try:
            held = _hold(index_dir, gen_dir)
        except OSError as exc:
            what = _unreadable(gen_dir, exc)
            raise IndexStoreError(f"cannot read {what} ({exc.strerror or exc}): {reindex_hint(index_dir)}", index_dir) from exc
        if held is None:
            # An indexer published a newer generation and removed this one: read CURRENT again.
            last_missing = name
            time.sleep(0.05)
            continue
        try:
            conn = connect_ro(db_path)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error as exc:
            _close_all(held)
            if not os.path.exists(db_path):
                last_missing = name
                continue
            raise IndexStoreError(
                f"the index database in {gen_dir} is damaged ({exc}): {reindex_hint(index_dir)}", index_dir
            ) from exc
        gen = Generation(index_dir, name, db_path, vectors_path, conn, meta, held)
        # A reader a re-index replaced is left to the garbage collector (another thread may still use
        # it): its files are let go of with it, the connection too (a cycle: only a full collection frees it).
        weakref.finalize(gen, _close_all, held, conn)
        try:
            schema = meta.get("schema", "unknown")
            if schema.isdigit() and len(schema) < 10 and int(schema) > SCHEMA_VERSION:
                raise IndexFormatError(
                    f"the index in {index_dir} was written by a newer crag (format {schema}; this crag reads "
                    f"format {SCHEMA_VERSION}): upgrade crag, or index into another folder with --index DIR",
                    index_dir,
                )
            if schema != str(SCHEMA_VERSION):
                raise IndexStoreError(
                    f"the index in {index_dir} has format {meta.get('schema', 'unknown')}, this crag reads "
                    f"format {SCHEMA_VERSION}: {reindex_hint(index_dir)}",
                    index_dir,
                )
            if verify:
                integrity.verify(gen_dir, conn, meta, index_dir, reindex_hint(index_dir), held)
        except BaseException:
            gen.close()
            raise
        return gen
    raise IndexStoreError(
        f"the index in {index_dir} is damaged ({_missing(index_dir, str(last_missing))}): {reindex_hint(index_dir)}",
        index_dir,
    )


def salvage_roots(index_dir: str) -> tuple[str, ...]:
    """The roots a damaged index, or one of an older format, still records, read without the
    checks of ``open_generation`` (its format, its checksums): what its rebuild walks. They are
    read from the generation ``CURRENT`` names, or, when ``CURRENT`` is missing, unreadable or
    names a generation whose database cannot be read, from the newest published generation
    on disk. () when none can be read."""
    try:
        name = read_current(index_dir)
    except IndexStoreError:
        name = None
    for gen in dict.fromkeys([*([name] if name else []), *published_generations(index_dir)]):
        roots = _roots_of(os.path.join(index_dir, gen, DATABASE))
        if roots is not None:
            return roots
    return ()


def published_generations(index_dir: str) -> list[str]:
    """The generation folders in ``index_dir`` that were complete when written, newest first:
    their database's meta names them (written last, just before ``CURRENT`` names them),
    where an unfinished one holds its base's name or none."""
    try:
        names = [n for n in os.listdir(index_dir) if GENERATION.match(n)]
    except OSError:
        return []
    names.sort(key=lambda n: int(n[len("gen-"):]), reverse=True)
    return [n for n in names if _meta_generation(os.path.join(index_dir, n, DATABASE)) == n]


def _rows(db_path: str, sql: str) -> list[tuple] | None:
    """The rows ``sql`` reads from a generation's database, opened read-only; None when it
    cannot be read (nor waited for: a named pipe there is damage)."""
    try:
        integrity.check_regular(db_path)
        conn = connect_ro(db_path)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    except (sqlite3.Error, OSError):
        return None


def _meta_generation(db_path: str) -> str | None:
    rows = _rows(db_path, "SELECT value FROM meta WHERE key = 'generation'")
    return rows[0][0] if rows else None


def _roots_of(db_path: str) -> tuple[str, ...] | None:
    """The roots a generation's database records; None when they cannot be read."""
    rows = _rows(db_path, "SELECT path FROM roots")
    if rows is None:
        return None
    return tuple(r for (r,) in rows if isinstance(r, str) and os.path.isabs(r))


def _unreadable(gen_dir: str, exc: OSError) -> str:
    """What ``exc`` could not open: the generation's file when its folder can be searched (the
    file's own permissions), else the folder."""
    try:
        os.stat(exc.filename)
    except (OSError, TypeError, ValueError):
        return gen_dir
    return os.fspath(exc.filename)


def _missing(index_dir: str, name: str) -> str:
    """What is missing of generation ``name``: the folder, or the files it should hold."""
    gen_dir = os.path.join(index_dir, name)
    gone = [f for f in (VECTORS, DATABASE) if not os.path.exists(os.path.join(gen_dir, f))]
    if not os.path.isdir(gen_dir) or not gone:
        return f"generation {name} is missing"
    return f"{', '.join(f'{name}/{f}' for f in gone)} {'is' if len(gone) == 1 else 'are'} missing"


def read_vectors(gen: Generation, mmap: bool) -> Any:
    """The generation's FAISS index, checked against the counts its database records."""
    import faiss

    expected = gen.meta.get("vectors_bytes")
    try:
        size = os.fstat(gen.held[VECTORS]).st_size if VECTORS in gen.held else os.path.getsize(gen.vectors_path)
    except OSError as exc:
        raise IndexStoreError(f"cannot read {gen.vectors_path} ({exc.strerror or exc}): {reindex_hint(gen.index_dir)}", gen.index_dir) from exc
    if expected is not None and str(size) != expected:
        raise IndexStoreError(
            f"the vector file {gen.vectors_path} is damaged ({size} bytes, expected {expected}): "
            f"{reindex_hint(gen.index_dir)}",
            gen.index_dir,
        )
    flags = 0
    if mmap:
        flags = getattr(faiss, "IO_FLAG_MMAP_IFC", None) or getattr(faiss, "IO_FLAG_MMAP", 0)
    try:
        index = faiss.read_index(gen.readable(VECTORS), flags)
    except RuntimeError as exc:
        raise IndexStoreError(
            f"the vector file {gen.vectors_path} is damaged: {reindex_hint(gen.index_dir)}", gen.index_dir
        ) from exc
    hint = reindex_hint(gen.index_dir)
    n_chunks = integrity.int_meta(gen.meta, "chunks", gen.index_dir, hint, default=-1)
    if index.ntotal != n_chunks or index.d != integrity.int_meta(gen.meta, "dim", gen.index_dir, hint, default=-1):
        raise IndexStoreError(
            f"the index in {gen.index_dir} is damaged ({index.ntotal} vectors for {n_chunks} chunks): "
            f"{reindex_hint(gen.index_dir)}",
            gen.index_dir,
        )
    return index


# ---------------------------------------------------------------------------------------
# Publishing generations


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(index_dir: str, gen: str) -> None:
    """Make ``gen`` the generation readers open: replace ``CURRENT`` atomically."""
    tmp = os.path.join(index_dir, f"{CURRENT}.tmp-{os.getpid()}")
    try:  # a file by that name, or a link put there, is replaced: never written through
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(gen + "\n")
        f.flush()
        os.fsync(f.fileno())
    current = os.path.join(index_dir, CURRENT)
    if os.path.isdir(current) and not os.path.islink(current):  # damage: a folder where the pointer belongs
        shutil.rmtree(current)
    os.replace(tmp, current)
    fsync_dir(index_dir)


def cleanup(index_dir: str, keep: str | None) -> None:
    """Remove generations other than ``keep`` and stray temporary files (lock held)."""
    try:
        names = os.listdir(index_dir)
    except OSError:
        return
    for name in names:
        path = os.path.join(index_dir, name)
        stray = GENERATION.match(name) is not None and name != keep
        if stray and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif stray or name.startswith(f"{CURRENT}.tmp-"):  # not a folder: rmtree would open a named pipe and wait
            try:
                os.unlink(path)
            except OSError:
                pass


def tidy(index_dir: str) -> None:
    """Remove what an indexer killed outright left behind (lock held): its unfinished
    generation, or, killed between publishing and ``cleanup``, the previous one; so they go
    with the next run even when it finds nothing to change. Only when ``CURRENT`` names a
    generation that is there: a damaged index is left as it is for the update to rebuild."""
    current = current_generation(index_dir)
    if current is not None and os.path.isdir(os.path.join(index_dir, current)):
        cleanup(index_dir, current)


def next_generation(index_dir: str) -> str:
    highest = 0
    for name in os.listdir(index_dir):
        m = GENERATION.match(name)
        if m:
            highest = max(highest, int(m.group(1)))
    return f"gen-{highest + 1:06d}"
