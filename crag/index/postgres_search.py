"""Searching a PostgreSQL store: pgvector and full-text rankings (a ``Retriever``).

See ``crag.index.postgres`` for the tables. Vector search uses the HNSW index on cosine
distance when there is one and no roots restrict the search (``hnsw.ef_search`` raised to
twice the candidates asked for, at least 100), and is exact otherwise; scores are inner products of
unit vectors, the cosine similarity the embedded store reports. Full-text ranking is BM25,
computed in SQL as SQLite's FTS5 computes it in the embedded store, over the rows
``crag.index.lexical`` bounds: the query's words (``documents.query_terms``) as PostgreSQL
lexemes, counted through the GIN index up to the budget, each weighted by its inverse
document frequency; the candidates that hold the most (by IDF) are kept without reading
their ``tsvector``, and a lexeme's frequency in each of those counts its positions in the ``tsvector`` with the title,
heading and body weights of ``SearchWeights`` (A, B and D), read back from ``ts_rank`` of
that lexeme alone (``_tf``) rather than by unnesting the row's every lexeme; the row's
length is its word count (``dl``) against the average recorded at the last update. A
search runs in one REPEATABLE READ read-only transaction, so everything it fuses comes
from one committed state. This module reads ``crag.index.postgres_schema``; the store
(``crag.index.postgres``) imports it, not the reverse.
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
from . import lexical
from .documents import REINDEX, query_terms
from .fusion import SearchWeights
from .postgres_schema import SCHEMA, hnsw_kind, vector_literal
from .search import hybrid_search

if TYPE_CHECKING:
    import numpy as np

    from ..ports import Embedder
    from .postgres import PostgresStore  # the type only: postgres imports this module, not the reverse

__all__ = ["PostgresRetriever"]

# BM25's constants, as SQLite's FTS5 uses them in the embedded store.
_K1 = 1.2
_B = 0.75
# Candidates kept for BM25 by the IDFs of the words they hold (at least four times the rows asked for).
_PRE_RANKED = 200


def _tf(weights: str) -> str:
    """SQL: how many positions of the lexeme ``q.tq`` in ``c.tsv`` carry a weight ``weights`` (D, C,
    B, A) gives 1, read back from ts_rank.

    For a query of one lexeme, ts_rank (normalisation 0) is ``sum(w_j / j**2) / (pi**2 / 6)`` over
    the lexeme's positions j = 1, 2, ... in order, when the first weighs most; a chunk's
    positions run title (A), heading (B), text (D), so with A, A and B, or every weight at 1,
    it is ``sum(1 / j**2, j <= n) / (pi**2 / 6)`` for the n positions of those columns, and
    ``1 / (pi**2 / 6 - that sum)`` is n + 1/2 within 0.03 (exact tf below 256 positions, the
    most a tsvector keeps). A C function per row instead of unnesting every lexeme of the row.
    """
    r = f"ts_rank('{weights}', c.tsv, q.tq, 0)::float8"
    return f"(CASE WHEN {r} < 1e-9 THEN 0 ELSE round(1.0 / greatest({_ZETA2} * (1.0 - {r}), 1e-9) - 0.5) END)"


_ZETA2 = 1.64493406685  # pi ** 2 / 6, as ts_rank divides by it
_TF_A = _tf("{0,0,0,1}")
_TF_AB = _tf("{0,0,1,1}")
_TF_ALL = _tf("{1,1,1,1}")


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
            meta = store.meta(conn)
        self.n_files = int(meta.get("text_files", "0"))
        self.avgdl_chunks = float(meta.get("avgdl_chunks", "1")) or 1.0
        self.avgdl_files = float(meta.get("avgdl_files", "1")) or 1.0

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

    def _terms(self, query: str, table: str, cap: int) -> list[tuple[str, int]]:
        """The query's words as PostgreSQL lexemes, each with the number of rows of ``table``
        holding it, counted up to ``cap`` (``crag.index.lexical``)."""
        words = query_terms(query)
        if not words:
            return []
        rows = self._query(
            f"SELECT l.lexeme, (SELECT count(*) FROM (SELECT 1 FROM {SCHEMA}.{table} t "
            "WHERE t.tsv @@ quote_literal(l.lexeme)::tsquery LIMIT %s) AS m) "
            "FROM (SELECT lexeme, min(n) AS n FROM unnest(%s::text[]) WITH ORDINALITY AS w(word, n), "
            "unnest(to_tsvector('english', w.word)) GROUP BY lexeme) AS l ORDER BY l.n",
            (cap, words),
        )
        return [(str(lexeme), int(df)) for lexeme, df in rows]

    def _ranked(
        self, table: str, query: str, k: int, roots: Sequence[str] | None, ids: Sequence[int] | None = None
    ) -> list[tuple[int, float]]:
        """(id, BM25) of the best ``k`` rows of ``table`` (of ``ids`` only, when given; see the module docstring)."""
        if k <= 0 or (ids is not None and not ids):
            return []
        budget = lexical.CHUNK_BUDGET if table == "chunks" else lexical.FILE_BUDGET
        with self.snapshot():
            self._conn().execute("SET LOCAL enable_seqscan = off")  # counts and candidates through the GIN index
            dfs = self._terms(query, table, budget + 1)
            chosen = lexical.plan(dfs, budget)
            if not chosen.terms or (ids is not None and chosen.mode == lexical.ALL):
                return []  # nothing matches, or frequent words only: no ranking of the candidates' files
            joiner = " & " if chosen.mode == lexical.ALL else " | "
            match = joiner.join("'" + lexeme.replace("'", "''") + "'" for lexeme in chosen.terms)
            df = dict(dfs)
            if chosen.mode == lexical.ALL:
                # Frequent words only: their document frequencies, for the IDF, counted in full.
                for lexeme in chosen.terms:
                    df[lexeme] = int(self._query(
                        f"SELECT count(*) FROM {SCHEMA}.{table} t WHERE t.tsv @@ quote_literal(%s)::tsquery", (lexeme,)
                    )[0][0])
            total = self.n_chunks if table == "chunks" else self.n_files
            idfs = [math.log(1.0 + (total - df[t] + 0.5) / (df[t] + 0.5)) for t in chosen.terms]
            clause, params = self._root_clause(roots)
            if table == "chunks":
                source = f"{SCHEMA}.chunks t" + (f" JOIN {SCHEMA}.files f ON f.id = t.file_id" if clause else "")
                avgdl = self.avgdl_chunks
            else:
                source = f"{SCHEMA}.files t"
                clause = clause.replace("f.path", "t.path")
                avgdl = self.avgdl_files
            if ids is not None:
                clause, params = clause + " AND t.id = ANY(%s)", [*params, list(ids)]
            # At most `budget` rows are candidates: more hold every word only of a query of frequent
            # words, and then the first ones indexed are taken (as in the embedded store). The
            # candidates are found through the GIN index without reading their tsvectors: each
            # scores the IDFs of the words it holds (shorter rows first among equals), the best
            # _PRE_RANKED are kept, and BM25 ranks those, each lexeme's weighted frequency read back
            # from ts_rank (_tf).
            if chosen.mode == lexical.ALL:
                hits = (f"SELECT t.id, t.dl, 0.0::float8 AS idf FROM {source} WHERE t.tsv @@ %s::tsquery{clause} "
                        f"{'ORDER BY t.id ' if ids is None else ''}LIMIT %s")
                hit_params: list[Any] = [match, *params, budget]
            else:
                hits = (f"SELECT h.id, h.dl, q.idf FROM q CROSS JOIN LATERAL (SELECT t.id, t.dl FROM {source} "
                        f"WHERE t.tsv @@ q.tq{clause} LIMIT %s) AS h")
                hit_params = [*params, budget]
            w = self.weights
            rows = self._query(
                f"WITH q AS (SELECT q.lexeme, quote_literal(q.lexeme)::tsquery AS tq, q.idf "
                "FROM unnest(%s::text[], %s::float8[]) AS q(lexeme, idf)), "
                f"hits AS ({hits}), "
                "pre AS (SELECT id, min(dl) AS dl, sum(idf) AS p FROM hits GROUP BY id ORDER BY p DESC, dl, id LIMIT %s), "
                # A copy of each kept tsvector: decompressed once, not once per ts_rank call.
                f"best AS MATERIALIZED (SELECT pre.id, pre.dl, t.tsv || ''::tsvector AS tsv FROM pre "
                f"JOIN {SCHEMA}.{table} t ON t.id = pre.id), "
                f"tf AS (SELECT c.id, c.dl, q.idf, {_TF_A} AS a, {_TF_AB} AS ab, {_TF_ALL} AS al FROM best c, q), "
                "f AS (SELECT id, dl, idf, %s * a + %s * (ab - a) + %s * (al - ab) AS f FROM tf WHERE al > 0) "
                "SELECT id, sum(idf * f * (%s + 1) / (f + %s * (1 - %s + %s * dl / %s))) AS s FROM f "
                "GROUP BY id ORDER BY s DESC, id LIMIT %s",
                [list(chosen.terms), idfs, *hit_params, max(_PRE_RANKED, 4 * k),
                 w.bm25_title, w.bm25_heading, w.bm25_body, _K1, _K1, _B, _B, avgdl, k],
            )
        return [(int(i), float(s)) for i, s in rows]

    def lexical_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(chunk id, rank) pairs, best first: title, heading and text weighted as ``SearchWeights`` says."""
        return self._ranked("chunks", query, k, roots)

    def file_ranking(
        self, query: str, k: int, roots: Sequence[str] | None = None, files: Sequence[int] | None = None
    ) -> list[tuple[int, float]]:
        """(file id, rank) pairs, best first, over whole files (only ``files``, when given)."""
        return self._ranked("files", query, k, roots, files)

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
