"""One update of the PostgreSQL store: one transaction, committed at the end (see ``crag.index.postgres``)."""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import IndexStoreError
from ..ports import StoreState
from ..text import WORD
from . import postgres_schema as schema
from .documents import embed_text, title_words
from .postgres_schema import SCHEMA, SCHEMA_VERSION, postings_of
from .postgres_vectors import drop_others, settle, vector_kind
from .vectors import quantize

if TYPE_CHECKING:
    from ..ports import DocumentVersion, Embedder
    from .postgres import PostgresStore

__all__ = ["PostgresUpdate", "word_count"]

_EMBED_BATCH = 256
_FILE_TEXT_LIMIT = 400_000  # characters of a file's text in its full-text vector (tsvector max 1 MB)


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

