"""Writing one generation of the embedded store (a ``StoreUpdate``).

``EmbeddedUpdate`` builds the next generation directory (see ``crag.index.layout``) while
the writer lock is held: a copy of the published database edited in place, and the
published FAISS index edited the same way; ``commit`` writes and fsyncs both, publishes the
generation by replacing ``CURRENT`` and removes the older ones. The calling thread embeds
chunks and edits the FAISS index; every SQLite statement runs, in order, on one database
thread. Rows are queued and written in large multi-row ``INSERT`` statements: SQLite
releases the GIL while a statement runs (FTS5 tokenizing the text is most of the database
work), so the writes overlap the embedding instead of handing the GIL back and forth once
per row.
"""

from __future__ import annotations

import functools
import os
import shutil
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..errors import IndexStoreError
from . import integrity, layout
from .documents import embed_text, title_words
from .vectors_write import Base, Spill, write_vectors

if TYPE_CHECKING:
    from ..ports import DocumentVersion, Embedder

__all__ = ["EmbeddedUpdate"]

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
_INSERTS = {
    "files": "INSERT INTO files (id, path, root, size, mtime_ns, sha256, chunks)",
    "files_fts": "INSERT INTO files_fts (rowid, title, body)",
    "chunks": "INSERT INTO chunks (id, file_id, start_line, end_line, heading, tokens, text)",
    "fts": "INSERT INTO fts (rowid, title, heading, body)",
}


class EmbeddedUpdate:
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
        base: layout.Generation | None,
        chunker: str,
    ) -> None:
        self.index_dir = index_dir
        self.embedder = embedder
        self.chunker = chunker
        self.gen = layout.next_generation(index_dir)
        self.version = self.gen
        self.gen_dir = os.path.join(index_dir, self.gen)
        os.makedirs(self.gen_dir)
        self.db_path = os.path.join(self.gen_dir, layout.DATABASE)
        self.vectors_path = os.path.join(self.gen_dir, layout.VECTORS)
        self.vectors_changed = False
        self._db: Any = None
        self.conn = None
        try:
            self._start(base)
        except BaseException:
            self.abort()  # a disk that refused the copy: the new generation's folder goes
            raise

    def _start(self, base: layout.Generation | None) -> None:
        embedder = self.embedder
        if base is not None:
            shutil.copyfile(base.db_path, self.db_path)
            self.conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            self._pragmas()
            self.base_vectors_path: str | None = base.vectors_path
            self.next_id = int(base.meta.get("next_chunk_id", "1"))
            self.vectors_kind = base.meta.get("vectors", "exact")
            self.next_file_id = int(self.conn.execute("SELECT coalesce(max(id), 0) + 1 FROM files").fetchone()[0])
        else:
            self.conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
            self._pragmas()
            self.conn.executescript(layout.SCHEMA)
            self.base_vectors_path = None
            self.vectors_changed = True
            self.vectors_kind = "exact"
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
        # New vectors go to disk as they are embedded; removed chunk ids are kept until commit.
        self._base: Base | None = None
        self._removed: list[Any] = []  # chunk ids of removed files, appended by the database thread
        self._last_removal: Future[None] | None = None
        # Over a published ivf index, each new vector's cell is found as it is embedded.
        cells = self._vectors().index.quantizer if self.vectors_kind.startswith("ivf") else None
        self._spill = Spill(self.gen_dir, embedder.dim, cells)
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

    def _vectors(self) -> Base:
        """The published vectors (read when first needed: an update that adds only does not)."""
        if self._base is None:
            self._base = Base(self.base_vectors_path)
        return self._base

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

    def remove_file(self, path: str) -> None:
        """Remove the recorded version of ``path`` (its row, its chunks and their vectors)."""
        import numpy as np

        self._send_rows()

        def remove() -> None:
            row = self.conn.execute("SELECT id FROM files WHERE path = ?", (path,)).fetchone()
            if row is None:
                return
            file_id = row[0]
            ids = [r[0] for r in self.conn.execute("SELECT id FROM chunks WHERE file_id = ?", (file_id,))]
            if ids:
                self.conn.executemany("DELETE FROM fts WHERE rowid = ?", [(i,) for i in ids])
                self.conn.execute("DELETE FROM chunks WHERE file_id = ?", (file_id,))
                # Read by commit once the database thread is done; the vectors go then, in one
                # pass (removing them file by file cost a pass over the whole index per file).
                self._removed.append(np.asarray(ids, dtype=np.int64))
            self.conn.execute("DELETE FROM files_fts WHERE rowid = ?", (file_id,))
            self.conn.execute("DELETE FROM files WHERE id = ?", (file_id,))

        # The database thread runs it in order, while this thread goes on embedding.
        self._last_removal = self._submit(remove)

    def touch_file(self, path: str, size: int, mtime_ns: int) -> None:
        self._send_rows()
        self._submit(self.conn.execute, "UPDATE files SET size = ?, mtime_ns = ? WHERE path = ?", (size, mtime_ns, path))

    def add_file(self, doc: DocumentVersion) -> None:
        """Write a document version: its file row, its chunks (embedded in batches) and their text."""
        file_id = self.next_file_id
        self.next_file_id += 1
        rows = self._rows
        chunks, text = doc.chunks, doc.text
        rows["files"].append((file_id, doc.path, doc.root, doc.size, doc.mtime_ns, doc.sha256, len(chunks)))
        title = title_words(doc.path, doc.root)
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
            # Coded and written to disk now: the update holds no more than a batch of vectors.
            self._spill.add(vectors, np.asarray(ids[at : at + step], dtype=np.int64))
            self.embedded += len(part)
        self.vectors_changed = True

    def set_roots(self, roots: Iterable[str]) -> None:
        """Replace the recorded roots."""
        self._send_rows()
        paths = [(r,) for r in sorted(set(roots))]

        def write() -> None:
            self.conn.execute("DELETE FROM roots")
            self.conn.executemany("INSERT INTO roots (path) VALUES (?)", paths)

        self._submit(write)

    def commit(self) -> int:
        """Write the vectors and the metadata, fsync both, publish. Returns the chunk count."""
        import numpy as np

        self.flush()
        self._send_rows()
        if self._last_removal is not None:
            self._last_removal.result()  # then every removal is in self._removed (jobs run in order)
        if self._removed:
            self.vectors_changed = True
        # The vectors are written while the database thread finishes its inserts; both files
        # are fsynced before CURRENT names the generation. The index's kind follows the
        # knowledge base's new size (crag.index.vectors), rebuilt here when it no longer suits;
        # it is written from the published index and the spilled codes a block at a time
        # (crag.index.vectors_write).
        n_vectors = None
        if self.vectors_changed:
            base = self._vectors() if self.base_vectors_path is not None else None
            removed = np.concatenate(self._removed) if self._removed else np.zeros(0, dtype=np.int64)
            if base is not None and base.kind != "ivf" and removed.size:
                base.remove(removed)  # exact: at most EXACT_MAX vectors, removed in one pass
            self.vectors_kind, n_vectors = write_vectors(self.vectors_path, self.embedder.dim, base, removed, self._spill)
            self._spill.remove()
            self._base = None  # its memory map and id table go before the database is committed
        else:
            self._spill.remove()
            try:
                os.link(self.base_vectors_path, self.vectors_path)
            except OSError:
                shutil.copyfile(self.base_vectors_path, self.vectors_path)
        vectors_bytes = os.path.getsize(self.vectors_path)

        def finish() -> int:
            n_chunks = self.conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
            if n_vectors is not None and n_vectors != n_chunks:
                raise IndexStoreError(
                    f"internal error: {n_vectors} vectors for {n_chunks} chunks; the previous index is kept",
                    self.index_dir,
                )
            meta = {
                "schema": str(layout.SCHEMA_VERSION),
                "embedder": self.embedder.name,
                "dim": str(self.embedder.dim),
                "chunker": self.chunker,
                "chunks": str(n_chunks),
                "next_chunk_id": str(self.next_id),
                "vectors_bytes": str(vectors_bytes),
                "vectors": self.vectors_kind,
                "checksums": integrity.CHECKSUMS,  # so a generation that lost it is damaged, not old
                "generation": self.gen,
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            self.conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", list(meta.items()))
            self.conn.execute("COMMIT")
            self.conn.execute("PRAGMA optimize")
            self.conn.close()
            layout.fsync_file(self.db_path)
            return int(n_chunks)

        done = self._submit(finish)
        layout.fsync_file(self.vectors_path)  # while the database thread commits and fsyncs
        n_chunks = done.result()
        self._wait()
        self._db.shutdown()
        integrity.write_checksums(self.gen_dir, integrity.CHECKED_FILES)
        layout.fsync_dir(self.gen_dir)
        layout.fsync_dir(self.index_dir)
        layout.publish(self.index_dir, self.gen)
        layout.cleanup(self.index_dir, self.gen)
        return n_chunks

    def abort(self) -> None:
        if self._db is not None:
            for fut in self._jobs:
                fut.cancel()
            self._jobs.clear()
            self._db.shutdown(wait=True)
        spill = getattr(self, "_spill", None)
        if spill is not None:
            try:
                spill.finish()
            except OSError:  # a full disk fails the flush again: the generation goes below all the same,
                pass  # and the error that stopped the update is the one the user is told
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
