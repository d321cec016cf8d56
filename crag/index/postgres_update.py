"""One update of the PostgreSQL store: one transaction, committed at the end (see ``crag.index.postgres``).

A first build (no published version: readers see no index until its commit) is a bulk load:
its leftovers are cleared up front (TRUNCATE, committed), the postings' indexes dropped, and
full batches are written by ``BULK_WRITERS`` connections of their own, in parallel, each batch
one transaction (``_BulkWriters``); the update's own transaction then derives the document
frequencies from the postings, builds the postings' and the vector index once, and publishes
the version. A killed bulk load leaves committed rows no reader sees (no version), which the
next first build clears. An update of a published index stays one transaction throughout, and so
does the rebuild of a damaged one, with the drop of its tables (``PostgresStore.mend``).
"""

from __future__ import annotations

import ipaddress
import os
import queue
import struct
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import IndexStoreError
from ..ports import StoreState
from ..text import WORD
from . import postgres_schema as schema
from .documents import embed_text, title_words
from .postgres_schema import SCHEMA, SCHEMA_VERSION, postings_of, words
from .postgres_vectors import drop_others, settle, vector_index_names, vector_kind
from .vectors import quantize

if TYPE_CHECKING:
    from ..ports import DocumentVersion, Embedder
    from .postgres import PostgresStore

__all__ = ["BULK_BATCH", "BULK_WRITERS", "MAX_BULK_WRITERS", "PostgresUpdate", "bulk_writers", "word_count"]

_EMBED_BATCH = 256
# A first build's batches: chunks a batch, and the connections writing them side by side (the
# server parses each chunk's text into its tsvector and postings: its work, not crag's).
BULK_BATCH = 2048
BULK_WRITERS = 2
MAX_BULK_WRITERS = 6  # a server on this machine: one a core but the one crag index keeps busy, at most this
# maintenance_work_mem for building the postings' indexes once (raised for the transaction
# only, never lowered): their sort runs in memory up to it, in parallel workers
# (max_parallel_maintenance_workers) when the server allows.
_BULK_INDEX_MEMORY_MB = 512


# ---------------------------------------------------------------------------------------
# One update: one transaction


# Bytes that may be part of a word (``WORD``): ASCII letters and digits, and every byte of a
# non-ASCII character. Any other ASCII character ends a word.
_WORD_BYTES = bytes(b if (48 <= b <= 57 or 65 <= b <= 90 or 97 <= b <= 122 or b >= 128) else 32 for b in range(256))


def word_count(*texts: str) -> int:
    """A text's length for BM25: all its words (``WORD.findall``), as SQLite's FTS5 counts them in
    the embedded store. Counted on bytes: ASCII punctuation and spaces always end a word, so the
    words are the runs of other bytes, except that a run holding non-ASCII bytes goes through the
    regex (it may hold letters, or symbols that end words): half the regex's time, or less."""
    n = 0
    for text in texts:
        runs = text.encode("utf-8", "surrogatepass").translate(_WORD_BYTES).split()
        n += len(runs)
        if not text.isascii():
            n += sum(len(WORD.findall(r.decode("utf-8", "surrogatepass"))) - 1 for r in runs if not r.isascii())
    return n


def _copy_header() -> bytes:
    return b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)


def _text_field(value: str) -> bytes:
    data = value.encode("utf-8")
    return struct.pack("!i", len(data)) + data


def bulk_writers(host: str, cores: int | None) -> int:
    """How many connections write a first build's batches, for a server at ``host`` (as the
    connection reports it: a name, an address, or a Unix socket's directory) on a machine of
    ``cores``. A server elsewhere gets ``BULK_WRITERS``: crag cannot see its cores. A server on
    this machine (a Unix socket or a loopback address) gets one writer a core but one, which
    ``crag index`` itself keeps busy, from ``BULK_WRITERS`` to ``MAX_BULK_WRITERS``: each writer
    is one server process parsing text (docs/postgresql.md, "Loading a large knowledge base")."""
    if not cores or not _local(host):
        return BULK_WRITERS
    return max(BULK_WRITERS, min(MAX_BULK_WRITERS, cores - 1))


def _local(host: str) -> bool:
    if not host or host.startswith("/") or host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _cores() -> int | None:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


class _BulkWriters:
    """Connections writing a first build's batches side by side, each batch in its own transaction,
    committed (readers see none of it before the update publishes its version); how many:
    ``bulk_writers``, unless ``n`` says."""

    def __init__(self, store: PostgresStore, n: int | None = None) -> None:
        self.store = store
        self.errors: list[BaseException] = []
        self.conns = []
        try:
            while n is None or len(self.conns) < n:
                conn = store.connect(autocommit=False)
                if n is None:
                    n = bulk_writers(conn.info.host or "", _cores())
                self.conns.append(conn)
                # The update's own commit flushes the write-ahead log; a crash before it leaves
                # rows no reader sees, which the next first build clears.
                conn.execute("SET synchronous_commit = off")
                conn.commit()
        except BaseException:
            self.close()
            raise
        self.jobs: queue.Queue[Any] = queue.Queue(maxsize=n)
        self.threads = [threading.Thread(target=self._run, args=(c,), name="crag-pg-writer", daemon=True)
                        for c in self.conns]
        for t in self.threads:
            t.start()

    def _run(self, conn: Any) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if self.errors:  # another batch failed: the rest are dropped, the update fails
                continue
            try:
                job(conn)
                conn.commit()
            except BaseException as exc:
                self.errors.append(exc)

    def submit(self, job: Any) -> None:
        self._raise()
        self.jobs.put(job)

    def _raise(self) -> None:
        if self.errors:
            exc = self.errors[0]
            if isinstance(exc, self.store.psycopg.Error):
                raise self.store.error(exc, writing=True) from exc
            raise exc

    def finish(self) -> None:
        """Wait for every batch; raise the first failure."""
        self._stop()
        self._raise()

    def _stop(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join()
        self.threads = []
        self.close()

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.close()
            except Exception:
                pass
        self.conns = []


class PostgresUpdate:
    """The edits of one update, in one transaction (see the module docstring)."""

    def __init__(self, store: PostgresStore, base: StoreState | None, embedder: Embedder, chunker: str) -> None:
        self.store = store
        self.embedder = embedder
        self.chunker = chunker
        self.embedded = 0
        self.psycopg = store.psycopg
        self.conn = store.connect(autocommit=False)
        try:
            # A damaged schema is created again in this transaction (``mend``), so the rebuild is
            # one transaction with the drop: no bulk load, whose batches commit as they go.
            mended = base is None and store.mend(self.conn)
            meta = store.meta(self.conn)
            previous = int(meta.get("version", "0"))
            self.version = str(previous + 1)
            self.previous_vectors = meta.get("vectors", "")
            # A first build (no previous state: nobody searches yet) writes the postings without
            # their indexes and creates them at the commit, in one sort instead of an insert a row.
            self.first_build = "version" not in meta
            # ... and is a bulk load (the module docstring): what a killed one left goes first.
            self.bulk = self.first_build and base is None and not mended
            if self.bulk:
                self.conn.execute(f"DROP INDEX IF EXISTS {SCHEMA}.postings_lexeme, {SCHEMA}.file_postings_lexeme")
                for name in vector_index_names(self.conn):  # built once, at the commit
                    self.conn.execute(f"DROP INDEX {SCHEMA}.{name}")
                self.conn.execute(f"TRUNCATE {SCHEMA}.postings, {SCHEMA}.file_postings, {SCHEMA}.terms, "
                                  f"{SCHEMA}.file_terms, {SCHEMA}.chunks, {SCHEMA}.files, {SCHEMA}.roots")
                self.conn.commit()
            elif self.first_build:
                self.conn.execute(f"DROP INDEX IF EXISTS {SCHEMA}.postings_lexeme, {SCHEMA}.file_postings_lexeme")
            # Changes of document frequencies (which table's, lexeme, +/- rows), applied to
            # ``terms`` and ``file_terms`` at the commit (a bulk load counts its postings instead).
            self.conn.execute(
                "CREATE TEMPORARY TABLE crag_df (tab text NOT NULL, lexeme text NOT NULL, n integer NOT NULL) "
                "ON COMMIT DROP"
            )
            if self.bulk:
                self.next_chunk_id = 1
                self.next_file_id = 1
            elif base is None:
                # From empty: readers keep the previous rows until the commit.
                for table in ("postings", "file_postings", "terms", "file_terms"):
                    self.conn.execute(f"DELETE FROM {SCHEMA}.{table}")
                self.conn.execute(f"DELETE FROM {SCHEMA}.chunks")
                self.conn.execute(f"DELETE FROM {SCHEMA}.files")
                self.conn.execute(f"DELETE FROM {SCHEMA}.roots")
                self.next_chunk_id = 1
                self.next_file_id = 1
            else:
                if meta.get("version") != base.version:
                    raise IndexStoreError(f"the index in {store.location} changed during the update: try again", store.location)
                self.next_chunk_id = int(meta.get("next_chunk_id", "1"))
                self.next_file_id = int(meta.get("next_file_id", "1"))
        except self.psycopg.Error as exc:
            self.conn.close()
            raise store.error(exc, writing=True) from exc
        except BaseException:
            self.conn.close()
            raise
        self._docs: list[tuple[int, DocumentVersion]] = []
        self._pending = 0
        self._batch = max(_EMBED_BATCH, getattr(embedder, "batch_size", 0) * getattr(embedder, "max_parallel", 1))
        if self.bulk:
            self._batch = BULK_BATCH
        self._writers: _BulkWriters | None = None

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            return self.conn.execute(sql, params)
        except self.psycopg.Error as exc:
            raise self.store.error(exc, writing=True) from exc

    def _postings(self, table: str, where: str, params: Sequence[Any], remove: bool = False) -> None:
        """Add (or remove) the postings of the rows of ``table`` (chunks or files) ``where`` says,
        and record the changes of their lexemes' document frequencies (a bulk load writes its
        postings with ``schema.bulk_postings`` and counts them at the commit)."""
        postings, key = ("postings", "chunk_id") if table == "chunks" else ("file_postings", "file_id")
        if remove:
            gone = f"SELECT lexeme, id FROM ({postings_of(table, where)}) AS g"
            if table == "files":  # and what an older crag derived from the file's own tsv (its whole text)
                gone += f" UNION SELECT u.lexeme, c.id FROM {SCHEMA}.files c, unnest(c.tsv) AS u WHERE {where}"
                params = [*params, *params]
            sql = (f"WITH gone AS MATERIALIZED ({gone}), d AS (DELETE FROM {SCHEMA}.{postings} p "
                   f"USING gone WHERE p.lexeme = gone.lexeme AND p.{key} = gone.id RETURNING p.lexeme) "
                   "INSERT INTO crag_df SELECT %s, lexeme, -count(*) FROM d GROUP BY lexeme")
        else:
            sql = (f"WITH p AS (INSERT INTO {SCHEMA}.{postings} {postings_of(table, where)} RETURNING lexeme) "
                   "INSERT INTO crag_df SELECT %s, lexeme, count(*) FROM p GROUP BY lexeme")
        if not remove:
            self._execute(sql, [*params, table])
            return
        # A removed row's postings are found by (lexeme, id) in the b-tree, a few probes a row.
        # The planner, which knows only the average rows of a lexeme, would rather read each
        # lexeme's rows once, cached by lexeme (Memoize), or all of them (a merge or hash join):
        # every row of the frequent words, for each file removed, seconds a file on a large index.
        plans = ("enable_hashjoin", "enable_mergejoin")
        if self.conn.info.server_version >= 140000:  # PostgreSQL 13 has no Memoize
            plans += ("enable_memoize",)
        for plan in plans:
            self._execute(f"SET LOCAL {plan} = off")
        self._execute(sql, [*params, table])
        for plan in plans:
            self._execute(f"RESET {plan}")

    def remove_file(self, path: str) -> None:
        self._postings("chunks", f"c.file_id = (SELECT id FROM {SCHEMA}.files WHERE path = %s)", (path,), remove=True)
        self._postings("files", "c.path = %s", (path,), remove=True)
        self._execute(f"DELETE FROM {SCHEMA}.files WHERE path = %s", (path,))  # chunks go with it (cascade)

    def touch_file(self, path: str, size: int, mtime_ns: int) -> None:
        self._execute(f"UPDATE {SCHEMA}.files SET size = %s, mtime_ns = %s WHERE path = %s", (size, mtime_ns, path))

    def set_roots(self, roots: Sequence[str]) -> None:
        self.flush()
        self._execute(f"DELETE FROM {SCHEMA}.roots")
        for root in sorted(set(roots)):
            self._execute(f"INSERT INTO {SCHEMA}.roots (path) VALUES (%s)", (root,))

    def add_file(self, doc: DocumentVersion) -> None:
        file_id = self.next_file_id
        self.next_file_id += 1
        self._docs.append((file_id, doc))
        self._pending += len(doc.chunks)
        if self._pending >= self._batch:
            self.flush(full=True)

    def flush(self, full: bool = False) -> None:
        """Embed the queued files' chunks and write the files and chunks (one COPY); a bulk load's
        ``full`` batch goes to its writers, the rest into the update's transaction."""
        import numpy as np

        docs, self._docs, self._pending = self._docs, [], 0
        if not docs:
            return
        titles = {file_id: title_words(doc.path, doc.root) for file_id, doc in docs}
        texts = [embed_text(titles[file_id], c.heading, c.text) for file_id, doc in docs for c in doc.chunks]
        vectors = np.zeros((0, self.embedder.dim), dtype=np.float32)
        if texts:
            vectors = self.embedder.embed(texts)
            if vectors.shape == (len(texts), self.embedder.dim):
                vectors = quantize(vectors)  # as the embedded store holds them: both report the same cosines
            if vectors.shape != (len(texts), self.embedder.dim):
                raise IndexStoreError(
                    f"the embedder {self.embedder.name} returned vectors of shape {vectors.shape}, "
                    f"expected ({len(texts)}, {self.embedder.dim})",
                    self.store.location,
                )
            self.embedded += len(texts)
        file_rows = [
            (file_id, d.path, d.root, d.size, d.mtime_ns, d.sha256, len(d.chunks),
             word_count(titles[file_id], d.text if d.chunks else ""), titles[file_id])
            for file_id, d in docs
        ]
        first = self.next_chunk_id
        chunks = self._chunks_copy(docs, titles, np.asarray(vectors, dtype=">f4")) if texts else b""
        batch = (file_rows, chunks, [file_id for file_id, _ in docs], first, self.next_chunk_id)
        if self.bulk and (full or self._writers is not None):
            if self._writers is None:
                self._writers = _BulkWriters(self.store)
            self._writers.submit(lambda conn: self._write(conn, *batch))
            return
        try:
            self._write(self.conn, *batch)
        except self.psycopg.Error as exc:
            raise self.store.error(exc, writing=True) from exc

    def _write(self, conn: Any, file_rows: list[tuple[Any, ...]], chunks: bytes, file_ids: list[int],
               first: int, end: int) -> None:
        """Write a batch on ``conn``: its files, its chunks (``chunks``: a binary COPY's data, ids
        ``first`` to ``end``) and their postings."""
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {SCHEMA}.files (id, path, root, size, mtime_ns, sha256, chunks, dl, tsv) VALUES "
                f"(%s, %s, %s, %s, %s, %s, %s, %s, setweight(to_tsvector('english', {words('%s')}), 'A'))",
                file_rows,
            )
            if chunks:
                sql = (
                    f"COPY {SCHEMA}.chunks (id, file_id, start_line, end_line, heading, tokens, dl, title, text, "
                    "embedding) FROM STDIN (FORMAT BINARY)"
                )
                with cur.copy(sql) as copy:
                    copy.write(chunks)
        if chunks and self.bulk:  # both from one pass over the chunks' tsvectors
            conn.execute(schema.bulk_postings("c.id >= %s AND c.id < %s"), (first, end))
        elif chunks:  # a file's postings are its chunks' (``postings_of``)
            self._postings("chunks", "c.id >= %s AND c.id < %s", (first, end))
            self._postings("files", "c.id = ANY(%s)", (file_ids,))

    def _chunks_copy(self, docs: Sequence[tuple[int, DocumentVersion]], titles: dict[int, str], vectors: Any) -> bytes:
        """The chunks as a binary COPY's data (the vectors in pgvector's binary format); their ids
        from ``next_chunk_id`` on."""
        dim = vectors.shape[1]
        vec_head = struct.pack("!iHH", 4 + 4 * dim, dim, 0)
        row_head = struct.pack("!h", 10)
        parts = [_copy_header()]
        n = 0
        for file_id, doc in docs:
            title = _text_field(titles[file_id])
            for c in doc.chunks:
                parts += [
                    row_head,
                    struct.pack("!iqiqiiii", 8, self.next_chunk_id, 8, file_id, 4, c.start_line, 4, c.end_line),
                    _text_field(c.heading),
                    struct.pack("!iiii", 4, c.tokens, 4, word_count(titles[file_id], c.heading, c.text)),
                    title,
                    _text_field(c.text),
                ]
                parts += [vec_head, vectors[n].tobytes()]
                self.next_chunk_id += 1
                n += 1
        parts.append(struct.pack("!h", -1))
        return b"".join(parts)

    def commit(self) -> int:
        self.flush()
        dim = self.embedder.dim
        vectors_apart: list[Any] = []
        apart = None
        try:
            writers, self._writers = self._writers, None
            if writers is not None:
                writers.finish()
            n_chunks, avgdl = self.conn.execute(f"SELECT count(*), coalesce(avg(dl), 1) FROM {SCHEMA}.chunks").fetchone()
            if writers is not None:
                # Every row is committed: the vector index is built beside the postings' indexes.
                apart = threading.Thread(target=self._vectors_apart, args=(int(n_chunks), vectors_apart),
                                         name="crag-pg-vectors", daemon=True)
                apart.start()
            if self.first_build:  # the postings' indexes, in one sort each
                self._raise_memory(_BULK_INDEX_MEMORY_MB)
                for sql in schema.POSTINGS_INDEXES:
                    self.conn.execute(sql)
            for table, terms in (("chunks", "terms"), ("files", "file_terms")):
                if self.bulk:
                    postings = "postings" if table == "chunks" else "file_postings"
                    self.conn.execute(f"INSERT INTO {SCHEMA}.{terms} SELECT lexeme, count(*) FROM {SCHEMA}.{postings} "
                                      "GROUP BY lexeme")
                    continue
                self.conn.execute(
                    f"INSERT INTO {SCHEMA}.{terms} SELECT lexeme, sum(n) FROM crag_df WHERE tab = %s GROUP BY lexeme "
                    f"ON CONFLICT (lexeme) DO UPDATE SET df = {terms}.df + excluded.df",
                    (table,),
                )
                self.conn.execute(f"DELETE FROM {SCHEMA}.{terms} WHERE df <= 0")
            n_files, file_avgdl = self.conn.execute(
                f"SELECT count(*), coalesce(avg(dl), 1) FROM {SCHEMA}.files WHERE chunks > 0"
            ).fetchone()
            if apart is not None:
                apart.join()
                if isinstance(vectors_apart[0], BaseException):
                    raise vectors_apart[0]
                vectors, vectors_error = vectors_apart[0]
            else:
                vectors, vectors_error = settle(self.conn, self.store.pgvector_version(self.conn), dim, int(n_chunks),
                                                self.previous_vectors, self.psycopg.Error)
            meta = {
                "schema": str(SCHEMA_VERSION),
                "embedder": self.embedder.name,
                "dim": str(dim),
                "chunker": self.chunker,
                "chunks": str(n_chunks),
                "next_chunk_id": str(self.next_chunk_id),
                "next_file_id": str(self.next_file_id),
                "text_files": str(n_files),
                "avgdl_chunks": repr(float(avgdl)),
                "avgdl_files": repr(float(file_avgdl)),
                "vectors": vectors,
                "vectors_error": vectors_error,
                "version": self.version,
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            with self.conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {SCHEMA}.meta (key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    list(meta.items()),
                )
            self.conn.commit()
        except self.psycopg.Error as exc:
            self.abort()
            raise self.store.error(exc, writing=True) from exc
        finally:
            self.conn.close()
        self._drop_other_vector_indexes(vectors, dim)
        self._vacuum()
        return int(n_chunks)

    def _vectors_apart(self, n: int, out: list[Any]) -> None:
        """``settle`` on a connection of its own (a bulk load, whose rows are committed), its result
        or failure in ``out``. A build committed by a load killed before its own commit goes with
        that load's rows when the next first build starts."""
        try:
            conn = self.store.connect(autocommit=False)
            try:
                out.append(settle(conn, self.store.pgvector_version(conn), self.embedder.dim, n,
                                  self.previous_vectors, self.psycopg.Error))
                conn.commit()
            finally:
                conn.close()
        except BaseException as exc:
            out.append(exc)

    def _raise_memory(self, mb: int) -> None:
        """``maintenance_work_mem`` at least ``mb`` for the rest of the transaction."""
        have = self.conn.execute(
            "SELECT setting::bigint * (CASE unit WHEN '8kB' THEN 8 WHEN 'kB' THEN 1 WHEN 'MB' THEN 1024 ELSE 1 END) "
            "/ 1024 FROM pg_settings WHERE name = 'maintenance_work_mem'"
        ).fetchone()[0]
        if int(have) < mb:
            self.conn.execute(f"SET LOCAL maintenance_work_mem = '{mb}MB'")

    def _drop_other_vector_indexes(self, vectors: str, dim: int) -> None:
        """Drop the vector indexes searches no longer use; best effort, as ``_vacuum``."""
        try:
            with self.store.session() as conn:
                drop_others(conn, vector_kind(self.store.pgvector_version(conn), dim), dim, vectors)
        except IndexStoreError:
            pass

    def _vacuum(self) -> None:
        """Mark the new postings visible to every reader, so that searches read them by index-only
        scans without visiting the table (autovacuum would, later); best effort: a role that may
        not vacuum leaves it to autovacuum."""
        try:
            with self.store.session() as conn:
                conn.execute(f"VACUUM (ANALYZE) {SCHEMA}.postings, {SCHEMA}.file_postings, {SCHEMA}.terms, "
                             f"{SCHEMA}.file_terms")
        except IndexStoreError:
            pass

    def abort(self) -> None:
        if self._writers is not None:
            writers, self._writers = self._writers, None
            writers.errors.append(RuntimeError("aborted"))  # the batches not yet written are dropped
            writers._stop()
        try:
            self.conn.rollback()
            if self.bulk:  # the batches the writers committed: no reader sees them, nothing should keep them
                self.conn.execute(f"TRUNCATE {SCHEMA}.postings, {SCHEMA}.file_postings, {SCHEMA}.chunks, "
                                  f"{SCHEMA}.files")
                self.conn.commit()
        except Exception:
            pass
        self.conn.close()

