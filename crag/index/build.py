"""Writing the index: incremental updates under a lock, published as atomic generations.

``update_index(index_dir, roots, embedder)`` brings the index up to date with ``roots``
(see ``crag.index.store`` for the layout and the theory of operation). Under an exclusive
``flock`` on ``DIR/LOCK`` (a second indexer waits up to ``lock_timeout`` seconds, then fails
with "another crag index is running on DIR"), it

1. opens the published generation (a damaged one is rebuilt from scratch when allowed);
2. walks the roots, and compares each file's size and mtime with the recorded ones: equal
   means unchanged and the file is not read; otherwise it is read and hashed (sha256), and
   only new or changed content is chunked and embedded (reading and chunking run in worker
   threads, in order);
3. builds the next generation from a copy of the previous database and vectors (rows of
   changed and deleted files removed, new chunks added), fsyncs it, then publishes it by
   replacing ``CURRENT`` atomically, and removes older generations.

When the configured embedder (or the chunking) differs from the index's, everything is
re-embedded and the report says why. ``quick_check`` answers "is the index current for
these roots?" from ``stat`` alone, without the lock, for ``ensure_indexed``.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from ..errors import EmbedderMismatchError, IndexStoreError, KnowledgeBaseError
from .chunker import DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS, Chunk, chunk_lines, token_counter
from .discover import (
    DiscoveredFile,
    decode_text,
    discover,
    is_binary,
    is_within,
    normalize_root,
    read_bytes,
    split_lines,
)
from .store import (
    _GEN,
    _REINDEX,
    _SCHEMA,
    CURRENT,
    DATABASE,
    LOCK,
    SCHEMA_VERSION,
    VECTORS,
    _chunker_id,
    _Generation,
    _open_generation,
    _read_current,
    _read_vectors,
    _reindex_hint,
    _title_words,
    embed_text,
)

if TYPE_CHECKING:
    from ..ports import Embedder

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "IndexLock",
    "IndexReport",
    "Progress",
    "quick_check",
    "update_index",
]

DEFAULT_LOCK_TIMEOUT = 120.0
_EMBED_BATCH = 256
_EMBED_SLICE = 128
# Rows are written in multi-row INSERTs, at most this many rows (or bytes of text) per job
# of the database thread (at least _MIN_ROWS_PER_JOB when it is idle), and at most this
# many jobs queued ahead of it.
_ROWS_PER_JOB = 512
_MIN_ROWS_PER_JOB = 128
_BYTES_PER_JOB = 8 << 20
_ROWS_PER_INSERT = 128
_MAX_QUEUED_JOBS = 4
# Embedded vectors are added to FAISS in blocks of up to this many bytes.
_ADD_BYTES = 16 << 20
# Files are read and chunked by worker threads in batches of about this many bytes.
_BATCH_BYTES = 256 << 10
_BATCH_FILES = 64
_INSERTS = {
    "files": "INSERT INTO files (id, path, root, size, mtime_ns, sha256, chunks)",
    "files_fts": "INSERT INTO files_fts (rowid, title, body)",
    "chunks": "INSERT INTO chunks (id, file_id, start_line, end_line, heading, tokens, text)",
    "fts": "INSERT INTO fts (rowid, title, heading, body)",
}

# progress(files_done, files_total, path): called as files are indexed.
Progress = Callable[[int, int, str], None]


@frozen
class IndexReport:
    """What one ``update_index`` / ``ensure_indexed`` did."""

    index_dir: str
    roots: tuple[str, ...]
    embedder: str
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    unchanged: int = 0
    chunks_total: int = 0
    chunks_embedded: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    reembedded_all: bool = False
    reason: str = ""
    wrote: bool = False
    generation: str = ""
    warnings: tuple[tuple[str, str], ...] = field(factory=tuple)

    @property
    def files_total(self) -> int:
        return len(self.added) + len(self.changed) + self.unchanged

    @property
    def changed_anything(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.reembedded_all)


# ---------------------------------------------------------------------------------------
# The lock


class IndexLock:
    """An exclusive ``flock`` on ``DIR/LOCK``, waited for up to ``timeout`` seconds."""

    def __init__(self, index_dir: str, timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        self.index_dir = index_dir
        self.timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> IndexLock:
        path = os.path.join(self.index_dir, LOCK)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise IndexStoreError(
                f"cannot create the lock file {path} ({exc.strerror or exc}): check KB_AGENT_INDEX_DIR",
                self.index_dir,
            ) from exc
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise IndexStoreError(
                        f"another crag index is running on {self.index_dir} (waited {self.timeout:g}s): "
                        "try again when it has finished",
                        self.index_dir,
                    ) from None
                time.sleep(0.05)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


# ---------------------------------------------------------------------------------------
# Publishing generations


def _fsync_dir(path: str) -> None:
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


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(index_dir: str, gen: str) -> None:
    tmp = os.path.join(index_dir, f"{CURRENT}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(gen + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(index_dir, CURRENT))
    _fsync_dir(index_dir)


def _cleanup(index_dir: str, keep: str | None) -> None:
    """Remove generations other than ``keep`` and stray temporary files (lock held)."""
    try:
        names = os.listdir(index_dir)
    except OSError:
        return
    for name in names:
        path = os.path.join(index_dir, name)
        if _GEN.match(name) and name != keep:
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(f"{CURRENT}.tmp-"):
            try:
                os.unlink(path)
            except OSError:
                pass


def _next_generation(index_dir: str) -> str:
    highest = 0
    for name in os.listdir(index_dir):
        m = _GEN.match(name)
        if m:
            highest = max(highest, int(m.group(1)))
    return f"gen-{highest + 1:06d}"


# ---------------------------------------------------------------------------------------
# Writing


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Builder:
    """Builds one new generation directory (lock held); ``commit`` publishes it.

    The calling thread embeds chunks and edits the FAISS index; every SQLite statement
    runs, in order, on one database thread. Rows are queued and written in large
    multi-row ``INSERT`` statements: SQLite releases the GIL while a statement runs (FTS5
    tokenizing the text is most of the database work), so the writes overlap the
    embedding instead of handing the GIL back and forth once per row.
    """

    def __init__(
        self,
        index_dir: str,
        embedder: Embedder,
        base: _Generation | None,
        chunking: tuple[int, int],
    ) -> None:
        import faiss

        self.index_dir = index_dir
        self.embedder = embedder
        self.chunking = chunking
        self.gen = _next_generation(index_dir)
        self.gen_dir = os.path.join(index_dir, self.gen)
        os.makedirs(self.gen_dir)
        self.db_path = os.path.join(self.gen_dir, DATABASE)
        self.vectors_path = os.path.join(self.gen_dir, VECTORS)
        self.vectors_changed = False
        self._db: Any = None
        self.conn = None
        if base is not None:
            shutil.copyfile(base.db_path, self.db_path)
            self.conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            self._pragmas()
            self.base_vectors_path: str | None = base.vectors_path
            self._index: Any = None
            self.next_id = int(base.meta.get("next_chunk_id", "1"))
            self.next_file_id = int(self.conn.execute("SELECT coalesce(max(id), 0) + 1 FROM files").fetchone()[0])
        else:
            self.conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            self._pragmas()
            self.conn.executescript(_SCHEMA)
            self.base_vectors_path = None
            self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(embedder.dim))
            self.vectors_changed = True
            self.next_id = 1
            self.next_file_id = 1
        self.conn.execute("BEGIN")
        limit = getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", None)
        self._max_vars = self.conn.getlimit(limit) if limit is not None and hasattr(self.conn, "getlimit") else 999
        self._pending_ids: list[int] = []
        self._pending_texts: list[str] = []
        # Enough texts per embed call to keep a remote embedder's parallel requests busy.
        self._batch = max(_EMBED_BATCH, getattr(embedder, "batch_size", 0) * getattr(embedder, "max_parallel", 1))
        self.embedded = 0
        self._staged: list[tuple[Any, Any]] = []  # (vectors, ids) embedded, not yet in FAISS
        self._staged_bytes = 0
        self._rows: dict[str, list[tuple[Any, ...]]] = {name: [] for name in _INSERTS}
        self._queued_bytes = 0
        self._jobs: deque[Future[Any]] = deque()
        from concurrent.futures import ThreadPoolExecutor

        self._db = ThreadPoolExecutor(1, thread_name_prefix="crag-index-db")

    def _pragmas(self) -> None:
        # The file is invisible to readers until published and fsynced before that, so the
        # journal buys nothing here.
        self.conn.execute("PRAGMA journal_mode=OFF")
        self.conn.execute("PRAGMA synchronous=OFF")

    def _vectors(self) -> Any:
        if self._index is None:
            import faiss

            self._index = faiss.read_index(self.base_vectors_path)
        return self._index

    # -- the database thread -----------------------------------------------------------

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on the database thread, after everything submitted before."""
        while self._jobs and self._jobs[0].done():
            self._jobs.popleft().result()  # raises what a finished job raised
        while len(self._jobs) >= _MAX_QUEUED_JOBS:  # do not run far ahead of the writes
            self._jobs.popleft().result()
        fut = self._db.submit(fn, *args)
        self._jobs.append(fut)
        return fut

    def _wait(self) -> None:
        while self._jobs:
            self._jobs.popleft().result()

    def _insert_rows(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        """(database thread) Multi-row INSERTs of the queued rows, table by table.

        Rows go in statements of ``_ROWS_PER_INSERT`` rows (so that SQLite compiles each
        statement once, and the sqlite3 module caches it) plus one for the remainder.
        """
        for name, table_rows in rows.items():
            if not table_rows:
                continue
            width = len(table_rows[0])
            per = max(1, min(_ROWS_PER_INSERT, self._max_vars // width))
            for i in range(0, len(table_rows), per):
                part = table_rows[i : i + per]
                self.conn.execute(_insert_sql(name, width, len(part)), [v for row in part for v in row])

    def _send_rows(self, everything: bool = True) -> None:
        """Queue the rows for the database thread (only whole statements' worth unless ``everything``)."""
        rows = self._rows
        if not everything:
            whole = len(rows["chunks"]) // _ROWS_PER_INSERT * _ROWS_PER_INSERT
            if not whole:
                return
            self._rows = {name: [] for name in _INSERTS}
            self._rows["chunks"], rows["chunks"] = rows["chunks"][whole:], rows["chunks"][:whole]
            self._rows["fts"], rows["fts"] = rows["fts"][whole:], rows["fts"][:whole]
            self._queued_bytes = 0
            self._submit(self._insert_rows, rows)
        elif any(rows.values()):
            self._rows = {name: [] for name in _INSERTS}
            self._queued_bytes = 0
            self._submit(self._insert_rows, rows)

    # -- edits -------------------------------------------------------------------------

    def remove_file(self, file_id: int) -> None:
        import numpy as np

        self._send_rows()

        def remove() -> list[int]:
            ids = [r[0] for r in self.conn.execute("SELECT id FROM chunks WHERE file_id = ?", (file_id,))]
            if ids:
                self.conn.executemany("DELETE FROM fts WHERE rowid = ?", [(i,) for i in ids])
                self.conn.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
            self.conn.execute("DELETE FROM files_fts WHERE rowid = ?", (file_id,))
            self.conn.execute("DELETE FROM files WHERE id = ?", (file_id,))
            return ids

        ids = self._submit(remove).result()
        if ids:
            self._vectors().remove_ids(np.asarray(ids, dtype=np.int64))
            self.vectors_changed = True

    def touch_file(self, file_id: int, size: int, mtime_ns: int) -> None:
        self._send_rows()
        self._submit(
            self.conn.execute, "UPDATE files SET size = ?, mtime_ns = ? WHERE id = ?", (size, mtime_ns, file_id)
        )

    def add_file(self, f: DiscoveredFile, sha: str, chunks: Sequence[Chunk], text: str = "") -> None:
        file_id = self.next_file_id
        self.next_file_id += 1
        rows = self._rows
        rows["files"].append((file_id, f.path, f.root, f.size, f.mtime_ns, sha, len(chunks)))
        title = _title_words(f.path, f.root)
        if chunks:
            rows["files_fts"].append((file_id, title, text))
        chunk_rows, fts_rows = rows["chunks"], rows["fts"]
        cid = self.next_id
        for c in chunks:
            chunk_rows.append((cid, file_id, c.start_line, c.end_line, c.heading, c.tokens, c.text))
            fts_rows.append((cid, title, c.heading, c.text))
            self._pending_ids.append(cid)
            self._pending_texts.append(embed_text(title, c.heading, c.text))
            cid += 1
        self.next_id = cid
        self._queued_bytes += 2 * len(text) + 200
        if (
            len(chunk_rows) >= _ROWS_PER_JOB
            or self._queued_bytes >= _BYTES_PER_JOB
            or (len(chunk_rows) >= _MIN_ROWS_PER_JOB and not (self._jobs and not self._jobs[-1].done()))
        ):
            self._send_rows(everything=False)  # a full job, or some rows for an idle database thread
        if len(self._pending_ids) >= self._batch:
            self.flush()

    def flush(self) -> None:
        import numpy as np

        if not self._pending_ids:
            return
        self._send_rows(everything=False)  # the database thread writes them while this thread embeds
        ids, texts = self._pending_ids, self._pending_texts
        self._pending_ids, self._pending_texts = [], []
        step = max(_EMBED_SLICE, self._batch // 2)
        for at in range(0, len(ids), step):
            part = texts[at : at + step]
            vectors = self.embedder.embed(part)
            if vectors.shape != (len(part), self.embedder.dim):
                raise IndexStoreError(
                    f"the embedder {self.embedder.name} returned vectors of shape {vectors.shape}, "
                    f"expected ({len(part)}, {self.embedder.dim})",
                    self.index_dir,
                )
            # Vectors go into FAISS in large blocks: each add grows (copies) its storage.
            self._staged.append((np.asarray(vectors, dtype=np.float32), np.asarray(ids[at : at + step], dtype=np.int64)))
            self._staged_bytes += vectors.nbytes
            self.embedded += len(part)
        self.vectors_changed = True
        if self._staged_bytes >= _ADD_BYTES:
            self._add_staged()

    def _add_staged(self) -> None:
        import numpy as np

        if not self._staged:
            return
        if len(self._staged) == 1:
            vectors, ids = self._staged[0]
        else:
            vectors = np.concatenate([v for v, _ in self._staged])
            ids = np.concatenate([i for _, i in self._staged])
        self._staged, self._staged_bytes = [], 0
        self._vectors().add_with_ids(np.ascontiguousarray(vectors), ids)

    def set_roots(self, roots: Iterable[str]) -> None:
        self._send_rows()
        paths = [(r,) for r in sorted(set(roots))]

        def write() -> None:
            self.conn.execute("DELETE FROM roots")
            self.conn.executemany("INSERT INTO roots (path) VALUES (?)", paths)

        self._submit(write)

    def commit(self) -> int:
        """Write the vectors and the metadata, fsync both, publish. Returns the chunk count."""
        import faiss

        self.flush()
        self._send_rows()
        self._add_staged()
        # The vectors are written while the database thread finishes its inserts; both files
        # are fsynced before CURRENT names the generation.
        if self.vectors_changed:
            faiss.write_index(self._vectors(), self.vectors_path)
        else:
            try:
                os.link(self.base_vectors_path, self.vectors_path)
            except OSError:
                shutil.copyfile(self.base_vectors_path, self.vectors_path)
        n_vectors = self._vectors().ntotal if self.vectors_changed else None
        vectors_bytes = os.path.getsize(self.vectors_path)

        def finish() -> int:
            n_chunks = self.conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
            if n_vectors is not None and n_vectors != n_chunks:
                raise IndexStoreError(
                    f"internal error: {n_vectors} vectors for {n_chunks} chunks; the previous index is kept",
                    self.index_dir,
                )
            meta = {
                "schema": str(SCHEMA_VERSION),
                "embedder": self.embedder.name,
                "dim": str(self.embedder.dim),
                "chunker": _chunker_id(*self.chunking),
                "chunks": str(n_chunks),
                "next_chunk_id": str(self.next_id),
                "vectors_bytes": str(vectors_bytes),
                "generation": self.gen,
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            self.conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", list(meta.items()))
            self.conn.execute("COMMIT")
            self.conn.execute("PRAGMA optimize")
            self.conn.close()
            _fsync_file(self.db_path)
            return int(n_chunks)

        done = self._submit(finish)
        _fsync_file(self.vectors_path)  # while the database thread commits and fsyncs
        n_chunks = done.result()
        self._wait()
        self._db.shutdown()
        _fsync_dir(self.gen_dir)
        _fsync_dir(self.index_dir)
        _publish(self.index_dir, self.gen)
        return n_chunks

    def abort(self) -> None:
        if self._db is not None:
            for fut in self._jobs:
                fut.cancel()
            self._jobs.clear()
            self._db.shutdown(wait=True)
        if self.conn is not None:
            try:
                self.conn.close()
            except sqlite3.Error:
                pass
        shutil.rmtree(self.gen_dir, ignore_errors=True)


@functools.lru_cache(maxsize=64)
def _insert_sql(table: str, width: int, rows: int) -> str:
    """``INSERT INTO table (...) VALUES (?, ...), ...`` for ``rows`` rows of ``width`` values."""
    one = "(" + ",".join("?" * width) + ")"
    return f"{_INSERTS[table]} VALUES " + ",".join([one] * rows)


@frozen
class _Prepared:
    """One file read, hashed and (when new or changed) chunked, or why it could not be read."""

    file: DiscoveredFile
    size: int = 0
    sha: str = ""
    binary: bool = False
    text: str = ""
    chunks: Sequence[Chunk] = ()
    error: str | None = None


def _ordered_map(fn: Callable[[Any], Any], items: Sequence[Any], workers: int = 2, window: int = 16) -> Iterable[Any]:
    """``map(fn, items)`` in order, computed by ``workers`` threads at most ``window`` items ahead."""
    if len(items) <= 1:
        yield from map(fn, items)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="crag-index") as pool:
        pending: deque[Any] = deque()
        it = iter(items)
        try:
            for item in it:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()


def _batches(files: Sequence[DiscoveredFile]) -> list[list[DiscoveredFile]]:
    """Consecutive files in batches of about ``_BATCH_BYTES`` (``_BATCH_FILES`` files at most)."""
    batches: list[list[DiscoveredFile]] = []
    batch: list[DiscoveredFile] = []
    size = 0
    for f in files:
        if batch and (size + f.size > _BATCH_BYTES or len(batch) >= _BATCH_FILES):
            batches.append(batch)
            batch, size = [], 0
        batch.append(f)
        size += f.size
    if batch:
        batches.append(batch)
    return batches


@frozen
class _OldFile:
    id: int
    size: int
    mtime_ns: int
    sha256: str
    chunks: int


def _old_files(conn: sqlite3.Connection) -> dict[str, _OldFile]:
    return {
        p: _OldFile(i, s, m, h, c)
        for i, p, s, m, h, c in conn.execute("SELECT id, path, size, mtime_ns, sha256, chunks FROM files")
    }


def update_index(
    index_dir: str,
    roots: Sequence[str | os.PathLike[str]],
    embedder: Embedder,
    *,
    progress: Progress | None = None,
    allow_reembed: bool = True,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    min_tokens: int = DEFAULT_MIN_TOKENS,
) -> IndexReport:
    """Index ``roots`` into ``index_dir`` incrementally (see the module docstring).

    With ``allow_reembed`` False (``ask``/``search --kb``), an index built with another
    embedder raises ``EmbedderMismatchError`` instead of being rebuilt.
    """
    started = time.perf_counter()
    index_dir = os.path.abspath(index_dir)
    root_list = [normalize_root(r) for r in roots]
    for r in root_list:
        if not os.path.exists(r):
            raise KnowledgeBaseError(f"knowledge-base path {r} does not exist", r)
    try:
        os.makedirs(index_dir, exist_ok=True)
    except OSError as exc:
        raise IndexStoreError(
            f"cannot create the index folder {index_dir} ({exc.strerror or exc}): check KB_AGENT_INDEX_DIR", index_dir
        ) from exc
    chunking = (max_tokens, min_tokens)
    with IndexLock(index_dir, lock_timeout):
        base, recorded, old_all, full, reason = _load_base(index_dir, embedder, chunking, allow_reembed)
        try:
            report = _update_locked(
                index_dir,
                root_list,
                recorded,
                None if full else base,
                {} if full else old_all,
                embedder,
                progress,
                chunking,
                started,
                full,
                reason,
                old_all if full else {},
            )
        finally:
            if base is not None:
                base.conn.close()
        if report.wrote:
            _cleanup(index_dir, report.generation)
        return report


def _load_base(
    index_dir: str, embedder: Embedder, chunking: tuple[int, int], allow_reembed: bool
) -> tuple[_Generation | None, list[str], dict[str, _OldFile], bool, str]:
    """The published generation to build on: (base, recorded roots, its files, full rebuild?, why)."""
    if not _current_exists(index_dir):
        _cleanup(index_dir, None)  # leftovers of an indexer killed before its first publish
        return None, [], {}, False, ""
    try:
        base = _open_generation(index_dir)
        try:
            _read_vectors(base, mmap=True)
            recorded = [r for (r,) in base.conn.execute("SELECT path FROM roots")]
            old_all = _old_files(base.conn)
        except BaseException:
            base.conn.close()
            raise
    except (IndexStoreError, sqlite3.Error) as exc:
        if not allow_reembed:
            if isinstance(exc, IndexStoreError):
                raise
            raise IndexStoreError(
                f"the index database in {index_dir} is damaged ({exc}): {_reindex_hint(index_dir)}", index_dir
            ) from exc
        return None, [], {}, True, f"the previous index could not be read ({_first_clause(str(exc))})"
    built_with = base.meta.get("embedder", "unknown")
    if built_with != embedder.name:
        if not allow_reembed:
            base.conn.close()
            raise EmbedderMismatchError(
                f"index was built with {built_with}, configured embedder is {embedder.name}: {_REINDEX}", index_dir
            )
        why = f"the index was built with {built_with}, the configured embedder is {embedder.name}"
        return base, recorded, old_all, True, why
    if base.meta.get("chunker") != _chunker_id(*chunking):
        return base, recorded, old_all, True, "the chunking settings changed"
    return base, recorded, old_all, False, ""


def _current_exists(index_dir: str) -> bool:
    return os.path.exists(os.path.join(index_dir, CURRENT))


def _first_clause(text: str) -> str:
    return text.split(":")[0]


def _update_locked(
    index_dir: str,
    roots: list[str],
    recorded: list[str],
    base: _Generation | None,
    old: dict[str, _OldFile],
    embedder: Embedder,
    progress: Progress | None,
    chunking: tuple[int, int],
    started: float,
    full: bool,
    reason: str,
    old_all: dict[str, _OldFile],
) -> IndexReport:
    # Which roots to walk: the ones asked for, plus every recorded root when rebuilding.
    walk_roots = list(dict.fromkeys(roots))
    dropped_roots: list[str] = []
    if full:
        for r in recorded:
            if r in walk_roots:
                continue
            if os.path.exists(r):
                walk_roots.append(r)
            else:
                dropped_roots.append(r)
    discovery = discover(walk_roots, exclude=[index_dir])
    found = {f.path: f for f in discovery.files}
    new_roots = sorted(set(recorded) - set(dropped_roots) | set(roots))

    if full:
        removed = sorted(p for p in old_all if p not in found)
    else:
        removed = sorted(p for p, _ in old.items() if p not in found and any(is_within(p, r) for r in walk_roots))

    # Classify by stat first: a file with the same size and mtime is not read at all.
    unchanged_stat = []
    to_read = []
    for f in discovery.files:
        prev = old.get(f.path)
        if prev is not None and prev.size == f.size and prev.mtime_ns == f.mtime_ns:
            unchanged_stat.append(f)
        else:
            to_read.append(f)
    roots_changed = base is None or set(new_roots) != set(recorded)
    if not to_read and not removed and not roots_changed and not full:
        return IndexReport(
            index_dir, tuple(walk_roots), embedder.name, unchanged=len(unchanged_stat),
            chunks_total=int(base.meta.get("chunks", "0")) if base else 0,
            seconds=time.perf_counter() - started, generation=base.name if base else "",
            warnings=discovery.warnings,
        )

    builder = _Builder(index_dir, embedder, base, chunking)
    try:
        warnings = list(discovery.warnings)
        added: list[str] = []
        changed: list[str] = []
        unchanged = len(unchanged_stat)
        touched = 0
        bytes_read = 0
        for path in removed:
            if base is not None:
                builder.remove_file(old[path].id)
        count = token_counter()

        def prepare(batch: Sequence[DiscoveredFile]) -> list[_Prepared]:
            """Read, hash and chunk some files (in a worker thread: tiktoken releases the GIL)."""
            done: list[_Prepared | None] = []
            todo: list[tuple[int, DiscoveredFile, bytes, str, str, list[str]]] = []
            for f in batch:
                try:
                    data = read_bytes(f.path)
                except (OSError, ValueError) as exc:
                    done.append(_Prepared(f, error=f"cannot read ({getattr(exc, 'strerror', None) or exc})"))
                    continue
                sha = _sha256(data)
                prev = old.get(f.path)
                binary = is_binary(data)
                if binary or (prev is not None and prev.sha256 == sha):
                    done.append(_Prepared(f, size=len(data), sha=sha, binary=binary))
                    continue
                text = decode_text(data)
                todo.append((len(done), f, data, sha, text, split_lines(text)))
                done.append(None)
            # One tiktoken pass over the batch gives every line's token count.
            line_tokens = count.line_counts_many([t[5] for t in todo], [t[4] for t in todo])
            for (i, f, data, sha, text, lines), tokens in zip(todo, line_tokens):
                suffix = os.path.splitext(f.path)[1]
                chunks = chunk_lines(lines, suffix, chunking[0], chunking[1], count, line_tokens=tokens)
                done[i] = _Prepared(f, size=len(data), sha=sha, text=text, chunks=chunks)
            return done  # type: ignore[return-value]

        total = len(to_read)
        prepared = (item for batch in _ordered_map(prepare, _batches(to_read)) for item in batch)
        for n, item in enumerate(prepared, 1):
            f = item.file
            if progress is not None:
                progress(n, total, f.path)
            prev = old.get(f.path)
            if item.error is not None:
                warnings.append((f.path, item.error))
                if prev is not None:  # it cannot be read any more: it leaves the index
                    builder.remove_file(prev.id)
                    removed.append(f.path)
                continue
            bytes_read += item.size
            if item.binary:
                warnings.append((f.path, "binary file"))
            if prev is not None and prev.sha256 == item.sha:
                builder.touch_file(prev.id, f.size, f.mtime_ns)
                unchanged += 1
                touched += 1
                continue
            if prev is not None:
                builder.remove_file(prev.id)
            if item.binary:
                # Recorded with no chunks, so that an unchanged binary file is not read again.
                if prev is not None and prev.chunks:
                    removed.append(f.path)
                builder.add_file(f, item.sha, [])
                continue
            if prev is not None or f.path in old_all:
                changed.append(f.path)
            else:
                added.append(f.path)
            builder.add_file(f, item.sha, item.chunks, item.text)
        builder.set_roots(new_roots)
        if not (added or changed or removed or touched or roots_changed or full):
            builder.abort()
            return IndexReport(
                index_dir, tuple(walk_roots), embedder.name, unchanged=unchanged,
                chunks_total=int(base.meta.get("chunks", "0")) if base else 0, bytes_read=bytes_read,
                seconds=time.perf_counter() - started, generation=base.name if base else "", warnings=tuple(warnings),
            )
        n_chunks = builder.commit()
    except BaseException:
        builder.abort()
        raise
    if dropped_roots:
        note = "dropped folder(s) that no longer exist: " + ", ".join(dropped_roots)
        reason = f"{reason}; {note}" if reason else note
    return IndexReport(
        index_dir,
        tuple(walk_roots),
        embedder.name,
        added=tuple(added),
        changed=tuple(changed),
        removed=tuple(sorted(removed)),
        unchanged=unchanged,
        chunks_total=n_chunks,
        chunks_embedded=builder.embedded,
        bytes_read=bytes_read,
        seconds=time.perf_counter() - started,
        reembedded_all=full,
        reason=reason,
        wrote=True,
        generation=builder.gen,
        warnings=tuple(warnings),
    )


def quick_check(
    index_dir: str, roots: Sequence[str | os.PathLike[str]], embedder: Embedder, chunking: tuple[int, int]
) -> tuple[int, int, str] | None:
    """(files, chunks, generation) when the index is current for ``roots`` by size and mtime alone.

    Reads no file contents and takes no lock. None when there is no index or something
    changed. Raises ``EmbedderMismatchError`` when the index was built with another
    embedder, ``IndexStoreError`` when it is damaged, ``KnowledgeBaseError`` for a
    missing root.
    """
    index_dir = os.path.abspath(index_dir)
    root_list = [normalize_root(r) for r in roots]
    discovery = discover(root_list, exclude=[index_dir])
    if _read_current(index_dir) is None:
        return None
    gen = _open_generation(index_dir)
    try:
        built_with = gen.meta.get("embedder", "unknown")
        if built_with != embedder.name:
            raise EmbedderMismatchError(
                f"index was built with {built_with}, configured embedder is {embedder.name}: {_REINDEX}", index_dir
            )
        if gen.meta.get("chunker") != _chunker_id(*chunking):
            return None
        recorded = {r for (r,) in gen.conn.execute("SELECT path FROM roots")}
        if not set(root_list) <= recorded:
            return None
        stats = {p: (s, m) for p, s, m in gen.conn.execute("SELECT path, size, mtime_ns FROM files")}
        for f in discovery.files:
            if stats.get(f.path) != (f.size, f.mtime_ns):
                return None
        under = sum(1 for p in stats if any(is_within(p, r) for r in root_list))
        if under != len(discovery.files):
            return None
        return len(discovery.files), int(gen.meta.get("chunks", "0")), gen.name
    except sqlite3.Error as exc:
        raise IndexStoreError(
            f"the index database in {index_dir} is damaged ({exc}): {_reindex_hint(index_dir)}", index_dir
        ) from exc
    finally:
        gen.conn.close()
