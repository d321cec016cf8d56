"""The PostgreSQL store: pgvector and full-text search in one database (a ``Store``).

``KB_AGENT_STORE=postgresql://...`` selects it; psycopg 3 comes with the optional extra
``crag-kb[postgres]``. See docs/postgresql.md for when to use it and how to set a server up.

Tables live in the schema ``crag`` and are created on first use (``MIGRATIONS``, recorded in
``crag.migrations``, so that a later crag can upgrade them)::

    meta     key -> value: embedder, dim, chunker, chunks, version, next ids
    roots    the knowledge-base roots
    files    one row per file version: path, size, mtime, sha256; ``tsv`` over its title
             words (weight A) and whole text (D) for the file ranking
    chunks   lines, heading, title, text, ``embedding vector``; ``tsv`` generated from
             title (A), heading (B) and text (D) for the chunk ranking

Theory of operation. An indexer holds a session advisory lock (``pg_try_advisory_lock``,
polled until ``lock_timeout``) for the whole update, so indexers serialise; every edit of
one update runs in ONE transaction, committed at the end: a killed indexer's connection
drops, PostgreSQL rolls the transaction back and frees the lock, and the previous state
stays. A search runs in one REPEATABLE READ read-only transaction, so the rankings it fuses
come from one committed state; readers never wait for an indexer (no DDL in an update,
except building the vector index at its commit, which readers do not wait for, and
dropping the one it replaces after it, concurrently).

Vector search: ``crag.index.postgres_vectors`` (the index), ``postgres_search`` (searching).
"""

from __future__ import annotations

import logging
import re
import struct
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import IndexStoreError
from ..ports import FileRecord, StoreState
from ..text import WORD
from . import postgres_schema as schema
from .documents import embed_text, embedder_mismatch, title_words
from .fusion import SearchWeights
from .postgres_schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION, postings_of, vector_literal
from .postgres_search import PostgresRetriever
from .postgres_vectors import drop_others, settle, vector_kind
from .vectors import quantize

if TYPE_CHECKING:
    from ..ports import DocumentVersion, Embedder, Retriever

__all__ = ["PostgresStore", "PostgresUpdate", "redact", "vector_kind", "vector_literal", "word_count"]

# The advisory lock every crag indexer of a database takes: "crag" in ASCII.
LOCK_KEY = 0x63726167
_EMBED_BATCH = 256
_FILE_TEXT_LIMIT = 400_000  # characters of a file's text in its full-text vector (tsvector max 1 MB)


_ENABLE_VECTOR = "CREATE EXTENSION vector;"


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise IndexStoreError(
            "KB_AGENT_STORE names a PostgreSQL server, which needs psycopg: pip install 'crag-kb[postgres]'", ""
        ) from None
    # psycopg logs what it ignores while a failed connection is torn down ("error ignored
    # terminating <psycopg.Pipeline [BAD]>: the connection is lost"), and with no logging set
    # up Python prints that on stderr beside crag's own line about the same failure.
    logging.getLogger("psycopg").addHandler(_QUIET)
    return psycopg


_QUIET = logging.NullHandler()


def redact(uri: str) -> str:
    """``uri`` without its password, for messages."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "postgresql://..."
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _pg_version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


class PostgresStore:
    """The index in a PostgreSQL database (see the module docstring)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.location = redact(uri)
        self.reindex_hint = f"run `python -m crag index PATH` (with KB_AGENT_STORE={self.location}) to rebuild it"
        self.psycopg = _psycopg()

    def __repr__(self) -> str:
        return f"PostgresStore({self.location!r})"

    # -- connections and the schema ------------------------------------------------------

    def connect(self, autocommit: bool = False) -> Any:
        psycopg = self.psycopg
        try:
            # No server-side prepared statements, so that PgBouncer's transaction pooling works.
            return psycopg.connect(self.uri, autocommit=autocommit, connect_timeout=10, prepare_threshold=None)
        except psycopg.Error as exc:
            raise IndexStoreError(
                f"cannot reach the PostgreSQL server {self.location}: {_first_line(exc)}", self.location
            ) from exc

    def error(self, exc: BaseException) -> IndexStoreError:
        return IndexStoreError(f"the PostgreSQL server {self.location} failed: {_first_line(exc)}", self.location)

    @contextmanager
    def session(self, autocommit: bool = True) -> Iterator[Any]:
        conn = self.connect(autocommit)
        try:
            yield conn
        except self.psycopg.Error as exc:
            raise self.error(exc) from exc
        finally:
            conn.close()

    def _schema_version(self, conn: Any) -> int | None:
        """The applied migration, or None when crag's tables do not exist."""
        row = conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.migrations",)).fetchone()
        if row[0] is None:
            return None
        return conn.execute(f"SELECT max(version) FROM {SCHEMA}.migrations").fetchone()[0]

    def _check_schema(self, conn: Any) -> bool:
        """True when the schema is current, False when absent; IndexStoreError when older or newer."""
        version = self._schema_version(conn)
        if not version:
            return False
        if version > SCHEMA_VERSION:
            raise IndexStoreError(
                f"the index in {self.location} has format {version}, this crag reads format {SCHEMA_VERSION}: "
                "upgrade crag",
                self.location,
            )
        if version < SCHEMA_VERSION:
            raise IndexStoreError(
                f"the index in {self.location} has format {version}, this crag reads format {SCHEMA_VERSION}: "
                "run `python -m crag index PATH` to upgrade it",
                self.location,
            )
        return True

    def migrate(self, conn: Any) -> None:
        """Create or upgrade crag's schema (``conn`` in autocommit; the writer lock held)."""
        version = self._schema_version(conn)
        if version is not None and version >= SCHEMA_VERSION:
            self._check_schema(conn)
            return
        ext = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        if ext is None:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except self.psycopg.Error as exc:
                raise IndexStoreError(
                    f"the PostgreSQL server {self.location} lacks the vector extension (pgvector) and crag may not "
                    f"enable it ({_first_line(exc)}): as a superuser, run `{_ENABLE_VECTOR}` in that database",
                    self.location,
                ) from exc
        with conn.transaction():
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {SCHEMA}.migrations (version integer PRIMARY KEY, "
                "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = conn.execute(f"SELECT coalesce(max(version), 0) FROM {SCHEMA}.migrations").fetchone()[0]
            for number, description, sql in MIGRATIONS:
                if number <= done:
                    continue
                conn.execute(sql)
                conn.execute(
                    f"INSERT INTO {SCHEMA}.migrations (version, description) VALUES (%s, %s)", (number, description)
                )

    def pgvector_version(self, conn: Any) -> tuple[int, ...]:
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        return _pg_version_tuple(row[0]) if row else ()

    # -- reading ---------------------------------------------------------------------------

    def meta(self, conn: Any) -> dict[str, str]:
        return dict(conn.execute(f"SELECT key, value FROM {SCHEMA}.meta").fetchall())

    def version(self) -> str | None:
        try:
            with self.session() as conn:
                if not self._check_schema(conn):
                    return None
                row = conn.execute(f"SELECT value FROM {SCHEMA}.meta WHERE key = 'version'").fetchone()
                return row[0] if row else None
        except IndexStoreError:
            return None

    def state(self, files: bool = True, check: bool = False) -> StoreState | None:
        with self.session(autocommit=False) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            return self._state(conn, files)

    def _state(self, conn: Any, files: bool) -> StoreState | None:
        if not self._check_schema(conn):
            return None
        meta = self.meta(conn)
        if "version" not in meta:
            return None
        roots = tuple(r for (r,) in conn.execute(f"SELECT path FROM {SCHEMA}.roots ORDER BY path"))
        records = {}
        if files:
            records = {
                p: FileRecord(p, s, m, h, c)
                for p, s, m, h, c in conn.execute(f"SELECT path, size, mtime_ns, sha256, chunks FROM {SCHEMA}.files")
            }
        return StoreState(
            meta["version"],
            meta.get("embedder", "unknown"),
            int(meta.get("dim", "0")),
            meta.get("chunker", ""),
            int(meta.get("chunks", "0")),
            roots,
            MappingProxyType(records),
        )

    def roots(self) -> tuple[str, ...]:
        state = self.state(files=False)
        if state is None:
            raise IndexStoreError(f"no index in {self.location}: run `python -m crag index PATH` first", self.location)
        return state.roots

    def open_retriever(self, embedder: Embedder, weights: SearchWeights | None = None) -> Retriever:
        state = self.state(files=False)
        if state is None:
            raise IndexStoreError(f"no index in {self.location}: run `python -m crag index PATH` first", self.location)
        if state.embedder != embedder.name:
            raise embedder_mismatch(state.embedder, embedder.name, state.roots, self.location)
        return PostgresRetriever(self, state, embedder, weights or SearchWeights())

    # -- writing ---------------------------------------------------------------------------

    @contextmanager
    def writer_lock(self, timeout: float) -> Iterator[object]:
        """The database's crag advisory lock, polled for up to ``timeout`` seconds."""
        conn = self.connect(autocommit=True)
        try:
            deadline = time.monotonic() + timeout
            while not conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0]:
                if time.monotonic() >= deadline:
                    raise IndexStoreError(
                        f"another crag index is running on {self.location} (waited {timeout:g}s): "
                        "try again when it has finished",
                        self.location,
                    )
                time.sleep(0.05)
            self.migrate(conn)
            yield conn
        except self.psycopg.Error as exc:
            raise self.error(exc) from exc
        finally:
            conn.close()  # ends the session: the advisory lock goes with it

    def begin(self, base: StoreState | None, embedder: Embedder, chunker: str) -> PostgresUpdate:
        return PostgresUpdate(self, base, embedder, chunker)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------
# One update: one transaction


def word_count(*texts: str) -> int:
    """A text's length for BM25: all its words, as SQLite's FTS5 counts them in the embedded store."""
    return sum(len(WORD.findall(t)) for t in texts)


def _copy_header() -> bytes:
    return b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)


def _text_field(value: str) -> bytes:
    data = value.encode("utf-8")
    return struct.pack("!i", len(data)) + data


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
            meta = store.meta(self.conn)
            previous = int(meta.get("version", "0"))
            self.version = str(previous + 1)
            self.previous_vectors = meta.get("vectors", "")
            # Changes of document frequencies (which table's, lexeme, +/- rows), applied to
            # ``terms`` and ``file_terms`` at the commit.
            self.conn.execute(
                "CREATE TEMPORARY TABLE crag_df (tab text NOT NULL, lexeme text NOT NULL, n integer NOT NULL) "
                "ON COMMIT DROP"
            )
            # A first build (no previous state: nobody searches yet) writes the postings without
            # their indexes and creates them at the commit, in one sort instead of an insert a row.
            self.first_build = "version" not in meta
            if self.first_build:
                self.conn.execute(f"DROP INDEX IF EXISTS {SCHEMA}.postings_lexeme, {SCHEMA}.file_postings_lexeme")
            if base is None:
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
            raise store.error(exc) from exc
        except BaseException:
            self.conn.close()
            raise
        self._docs: list[tuple[int, DocumentVersion]] = []
        self._pending = 0
        self._batch = max(_EMBED_BATCH, getattr(embedder, "batch_size", 0) * getattr(embedder, "max_parallel", 1))

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            return self.conn.execute(sql, params)
        except self.psycopg.Error as exc:
            raise self.store.error(exc) from exc

    def _postings(self, table: str, where: str, params: Sequence[Any], remove: bool = False) -> None:
        """Add (or remove) the postings of the rows of ``table`` (chunks or files) ``where`` says,
        and record the changes of their lexemes' document frequencies."""
        postings, key = ("postings", "chunk_id") if table == "chunks" else ("file_postings", "file_id")
        if remove:
            sql = (f"WITH gone AS ({postings_of(table)} WHERE {where}), d AS (DELETE FROM {SCHEMA}.{postings} p "
                   f"USING gone WHERE p.lexeme = gone.lexeme AND p.{key} = gone.id RETURNING p.lexeme) "
                   "INSERT INTO crag_df SELECT %s, lexeme, -count(*) FROM d GROUP BY lexeme")
        else:
            sql = (f"WITH p AS (INSERT INTO {SCHEMA}.{postings} {postings_of(table)} WHERE {where} RETURNING lexeme) "
                   "INSERT INTO crag_df SELECT %s, lexeme, count(*) FROM p GROUP BY lexeme")
        self._execute(sql, [*params, table])

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
            self.flush()

    def flush(self) -> None:
        """Embed the queued files' chunks and write the files and chunks (one COPY)."""
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
        try:
            with self.conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {SCHEMA}.files (id, path, root, size, mtime_ns, sha256, chunks, dl, tsv) VALUES "
                    "(%s, %s, %s, %s, %s, %s, %s, %s, setweight(to_tsvector('english', %s), 'A') "
                    "|| setweight(to_tsvector('english', %s), 'D'))",
                    [
                        (file_id, d.path, d.root, d.size, d.mtime_ns, d.sha256, len(d.chunks),
                         word_count(titles[file_id], d.text[:_FILE_TEXT_LIMIT] if d.chunks else ""),
                         titles[file_id], d.text[:_FILE_TEXT_LIMIT] if d.chunks else "")
                        for file_id, d in docs
                    ],
                )
                first = self.next_chunk_id
                if texts:
                    self._copy_chunks(cur, docs, titles, np.asarray(vectors, dtype=">f4"))
        except self.psycopg.Error as exc:
            raise self.store.error(exc) from exc
        self._postings("files", "c.id = ANY(%s)", ([file_id for file_id, _ in docs],))
        if texts:
            self._postings("chunks", "c.id >= %s AND c.id < %s", (first, self.next_chunk_id))

    def _copy_chunks(self, cur: Any, docs: Sequence[tuple[int, DocumentVersion]], titles: dict[int, str], vectors: Any) -> None:
        """Write the chunks with one binary COPY (the vectors in pgvector's binary format)."""
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
        sql = (
            f"COPY {SCHEMA}.chunks (id, file_id, start_line, end_line, heading, tokens, dl, title, text, embedding) "
            "FROM STDIN (FORMAT BINARY)"
        )
        with cur.copy(sql) as copy:
            copy.write(b"".join(parts))

    def commit(self) -> int:
        self.flush()
        try:
            for table, terms in (("chunks", "terms"), ("files", "file_terms")):
                self.conn.execute(
                    f"INSERT INTO {SCHEMA}.{terms} SELECT lexeme, sum(n) FROM crag_df WHERE tab = %s GROUP BY lexeme "
                    f"ON CONFLICT (lexeme) DO UPDATE SET df = {terms}.df + excluded.df",
                    (table,),
                )
                self.conn.execute(f"DELETE FROM {SCHEMA}.{terms} WHERE df <= 0")
            n_chunks, avgdl = self.conn.execute(f"SELECT count(*), coalesce(avg(dl), 1) FROM {SCHEMA}.chunks").fetchone()
            n_files, file_avgdl = self.conn.execute(
                f"SELECT count(*), coalesce(avg(dl), 1) FROM {SCHEMA}.files WHERE chunks > 0"
            ).fetchone()
            dim = self.embedder.dim
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
            if self.first_build:
                for sql in schema.POSTINGS_INDEXES:
                    self.conn.execute(sql)
            self.conn.commit()
        except self.psycopg.Error as exc:
            self.abort()
            raise self.store.error(exc) from exc
        finally:
            self.conn.close()
        self._drop_other_vector_indexes(vectors, dim)
        self._vacuum()
        return int(n_chunks)

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
        try:
            self.conn.rollback()
        except Exception:
            pass
        self.conn.close()

