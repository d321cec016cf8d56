"""Searching a PostgreSQL store: pgvector and full-text rankings (a ``Retriever``).

See ``crag.index.postgres`` for the tables. Vector search uses the HNSW index on cosine
distance when there is one and no roots restrict the search (``hnsw.ef_search`` raised to
twice the candidates asked for, at least 100), and is exact otherwise; scores are inner products of
unit vectors, the cosine similarity the embedded store reports. Full-text ranking: each of
the query's terms (``documents.query_terms``) that PostgreSQL keeps is weighted by its
inverse document frequency (as BM25 does) times ``ts_rank`` of the term with the title,
heading and body weights of ``SearchWeights``, normalised by the log of the length. A
search runs in one REPEATABLE READ read-only transaction, so everything it fuses comes
from one committed state.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import IndexStoreError
from ..ports import ChunkRow, Hit, StoreState
from .documents import REINDEX, query_terms
from .fusion import SearchWeights
from .postgres import hnsw_kind, vector_literal
from .postgres_schema import SCHEMA
from .search import hybrid_search

if TYPE_CHECKING:
    import numpy as np

    from ..ports import Embedder
    from .postgres import PostgresStore

__all__ = ["PostgresRetriever"]


class PostgresRetriever:
    """A published state of a PostgreSQL store opened for search (a ``Retriever``).

    Thread-safe: each thread has its own connection. ``search`` runs in one snapshot.
    """

    def __init__(self, store: PostgresStore, state: StoreState, embedder: Embedder, weights: SearchWeights) -> None:
        self.store = store
        self.version = state.version
        self.generation = state.version
        self.embedder = embedder
        self.embedder_name = state.embedder
        self.dim = state.dim
        self.n_chunks = state.chunks
        self.roots = state.roots
        self.index_dir = store.location
        self.weights = weights
        self.psycopg = store.psycopg
        self._local = threading.local()
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self.hnsw: str | None = None
        with store.session() as conn:
            self.hnsw = hnsw_kind(store.pgvector_version(conn), self.dim)
            self.n_files = int(conn.execute(f"SELECT count(*) FROM {SCHEMA}.files WHERE chunks > 0").fetchone()[0])

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self.store.connect(autocommit=True)
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                try:
                    conn.close()
                except Exception:
                    pass
            self._conns.clear()

    def __enter__(self) -> PostgresRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._conn().execute(sql, params).fetchall()
        except self.psycopg.Error as exc:
            raise self.store.error(exc) from exc

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every query inside sees one committed state (REPEATABLE READ, read only)."""
        conn = self._conn()
        if conn.info.transaction_status != self.psycopg.pq.TransactionStatus.IDLE:
            yield
            return
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield
        except self.psycopg.Error as exc:
            raise self.store.error(exc) from exc

    def _root_clause(self, roots: Sequence[str] | None) -> tuple[str, list[Any]]:
        if roots is None:
            return "", []
        if not roots:
            return " AND false", []
        parts, params = [], []
        for r in roots:
            prefix = r if r.endswith(os.sep) else r + os.sep
            parts.append("(f.path = %s OR starts_with(f.path, %s))")
            params += [r, prefix]
        return " AND (" + " OR ".join(parts) + ")", params

    def embed_query(self, query: str) -> np.ndarray:
        vec = self.embedder.embed([query])
        if vec.shape != (1, self.dim):
            raise IndexStoreError(
                f"the embedder {self.embedder.name} returned {vec.shape[-1]}-dimensional vectors, the index holds "
                f"{self.dim}: {REINDEX}",
                self.index_dir,
            )
        return vec

    def vector_ranking(self, query_vec: np.ndarray, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(chunk id, cosine) pairs, best first: HNSW when there is one and no roots restrict, else exact."""
        if k <= 0:
            return []
        q = vector_literal(query_vec.reshape(-1))
        d = self.dim
        if self.hnsw is not None and roots is None:
            kind = self.hnsw
            with self.snapshot():
                self._conn().execute(f"SET LOCAL hnsw.ef_search = {max(100, min(1000, 2 * k))}")
                rows = self._query(
                    f"SELECT id, -(embedding <#> %s::vector) FROM {SCHEMA}.chunks WHERE vector_dims(embedding) = {d} "
                    f"ORDER BY embedding::{kind}({d}) <=> %s::{kind}({d}) LIMIT %s",
                    (q, q, k),
                )
            return [(int(i), float(s)) for i, s in rows]
        clause, params = self._root_clause(roots)
        join = f" JOIN {SCHEMA}.files f ON f.id = c.file_id" if clause else ""
        rows = self._query(
            f"SELECT c.id, -(c.embedding <#> %s::vector) AS s FROM {SCHEMA}.chunks c{join} WHERE true{clause} "
            "ORDER BY s DESC, c.id LIMIT %s",
            [q, *params, k],
        )
        return [(int(i), float(s)) for i, s in rows]

    def _terms(self, query: str, table: str) -> tuple[list[str], list[float]]:
        """The query's terms that PostgreSQL keeps, each with its inverse document frequency."""
        words = query_terms(query)
        if not words:
            return [], []
        rows = self._query(
            f"SELECT DISTINCT ON (tq::text) w, (SELECT count(*) FROM {SCHEMA}.{table} t WHERE t.tsv @@ tq) "
            "FROM unnest(%s::text[]) AS w, plainto_tsquery('english', w) AS tq WHERE numnode(tq) > 0",
            (words,),
        )
        total = self.n_chunks if table == "chunks" else self.n_files
        terms, idfs = [], []
        for word, df in rows:
            if df:
                terms.append(word)
                idfs.append(math.log(1.0 + (total - df + 0.5) / (df + 0.5)))
        return terms, idfs

    def _ranked(self, table: str, query: str, k: int, roots: Sequence[str] | None) -> list[tuple[int, float]]:
        """(id, rank) of the best ``k`` rows of ``table``: the sum over the query's terms of
        idf x ``ts_rank`` (normalised by the log of the length)."""
        if k <= 0:
            return []
        with self.snapshot():
            terms, idfs = self._terms(query, table)
            if not terms:
                return []
            clause, params = self._root_clause(roots)
            if table == "chunks":
                source = f"{SCHEMA}.chunks t" + (f" JOIN {SCHEMA}.files f ON f.id = t.file_id" if clause else "")
            else:
                source = f"{SCHEMA}.files t"
                clause = clause.replace("f.path", "t.path")
            rows = self._query(
                "SELECT t.id, sum(u.idf * ts_rank(%s::float4[], t.tsv, plainto_tsquery('english', u.w), 1)) AS s "
                "FROM unnest(%s::text[], %s::float8[]) AS u(w, idf) "
                f"JOIN {source} ON t.tsv @@ plainto_tsquery('english', u.w) WHERE true{clause} "
                "GROUP BY t.id ORDER BY s DESC, t.id LIMIT %s",
                [self._rank_weights(), terms, idfs, *params, k],
            )
        return [(int(i), float(s)) for i, s in rows]

    def lexical_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(chunk id, rank) pairs, best first: title, heading and text weighted as ``SearchWeights`` says."""
        return self._ranked("chunks", query, k, roots)

    def file_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(file id, rank) pairs, best first, over whole files."""
        return self._ranked("files", query, k, roots)

    def _rank_weights(self) -> list[float]:
        """``ts_rank``'s {D, C, B, A} weights: body, unused, heading, title, scaled to at most 1."""
        w = self.weights
        top = max(w.bm25_title, w.bm25_heading, w.bm25_body) or 1.0
        return [w.bm25_body / top, 0.0, w.bm25_heading / top, w.bm25_title / top]

    def chunk_files(self, chunk_ids: Sequence[int]) -> dict[int, int]:
        ids = list(chunk_ids)
        if not ids:
            return {}
        rows = self._query(f"SELECT id, file_id FROM {SCHEMA}.chunks WHERE id = ANY(%s)", (ids,))
        return {int(c): int(f) for c, f in rows}

    def cosines(self, query_vec: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
        ids = list(chunk_ids)
        if not ids:
            return {}
        q = vector_literal(query_vec.reshape(-1))
        rows = self._query(f"SELECT id, -(embedding <#> %s::vector) FROM {SCHEMA}.chunks WHERE id = ANY(%s)", (q, ids))
        return {int(i): float(s) for i, s in rows}

    def chunk_rows(self, chunk_ids: Sequence[int]) -> dict[int, ChunkRow]:
        ids = list(chunk_ids)
        if not ids:
            return {}
        rows = self._query(
            f"SELECT c.id, c.file_id, f.path, c.start_line, c.end_line, c.heading, c.text FROM {SCHEMA}.chunks c "
            f"JOIN {SCHEMA}.files f ON f.id = c.file_id WHERE c.id = ANY(%s)",
            (ids,),
        )
        return {int(r[0]): ChunkRow(*r) for r in rows}

    def search(self, query: str, top_k: int = 5, roots: Sequence[str] | None = None, mode: str = "hybrid") -> list[Hit]:
        """The ``top_k`` best chunks for ``query``, from one snapshot (see ``hybrid_search``)."""
        with self.snapshot():
            return hybrid_search(
                self, self.weights, query, top_k, roots, mode,
                location=self.store.location, reindex_hint=self.store.reindex_hint,
            )
