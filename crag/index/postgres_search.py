"""Searching a PostgreSQL store: pgvector and full-text rankings (a ``Retriever``).

See ``crag.index.postgres`` for the tables. Vector search uses the HNSW index on cosine
distance when there is one and no roots restrict the search (``hnsw.ef_search`` raised to
twice the candidates asked for, at least 100), and is exact otherwise; scores are inner products of
unit vectors, the cosine similarity the embedded store reports. Full-text ranking is BM25,
computed in SQL as SQLite's FTS5 computes it in the embedded store: the query's words
(``documents.query_terms``) as PostgreSQL lexemes, each weighted by its inverse document
frequency; a lexeme's frequency in a row counts its positions in the ``tsvector`` with the
title, heading and body weights of ``SearchWeights`` (A, B and D); the row's length is its
word count (``dl``) against the average recorded at the last update. A
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
# Candidates PostgreSQL's ts_rank keeps for BM25 (at least four times the rows asked for).
_PRE_RANKED = 200


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

    def _ranked(self, table: str, query: str, k: int, roots: Sequence[str] | None) -> list[tuple[int, float]]:
        """(id, BM25) of the best ``k`` rows of ``table`` (see the module docstring)."""
        if k <= 0:
            return []
        budget = lexical.CHUNK_BUDGET if table == "chunks" else lexical.FILE_BUDGET
        with self.snapshot():
            self._conn().execute("SET LOCAL enable_seqscan = off")  # counts and candidates through the GIN index
            dfs = self._terms(query, table, budget + 1)
            chosen = lexical.plan(dfs, budget)
            if not chosen.terms:
                return []
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
            # At most `budget` rows are candidates: more hold every word only of a query of frequent
            # words, and then the first ones indexed are taken (as in the embedded store). PostgreSQL's
            # ts_rank (in C) keeps the best few of them; BM25 ranks those.
            w = self.weights
            top = w.bm25_title or 1.0
            pre_weights = [w.bm25_body / top, 0.0, w.bm25_heading / top, w.bm25_title / top]  # D, C, B, A
            order = " ORDER BY t.id" if chosen.mode == lexical.ALL else ""
            # tf: a lexeme's positions, each counted with its column's weight (A title, B heading, D body).
            rows = self._query(
                f"WITH q AS (SELECT * FROM unnest(%s::text[], %s::float8[]) AS q(lexeme, idf)), "
                f"cand AS (SELECT t.id, t.tsv, t.dl FROM {source} WHERE t.tsv @@ %s::tsquery{clause}{order} LIMIT %s), "
                "best AS (SELECT * FROM cand ORDER BY ts_rank(%s::float4[], tsv, %s::tsquery, 0) DESC, id LIMIT %s) "
                "SELECT c.id, sum(q.idf * m.f * (%s + 1) / (m.f + %s * (1 - %s + %s * c.dl / %s))) AS s FROM best c "
                "CROSS JOIN LATERAL (SELECT u.lexeme, (SELECT sum(CASE x WHEN 'A' THEN %s WHEN 'B' THEN %s "
                "WHEN 'C' THEN 0 ELSE %s END) FROM unnest(u.weights) AS x) AS f "
                "FROM unnest(c.tsv) AS u WHERE u.lexeme = ANY(%s::text[])) AS m "
                "JOIN q ON q.lexeme = m.lexeme GROUP BY c.id ORDER BY s DESC, c.id LIMIT %s",
                [list(chosen.terms), idfs, match, *params, budget, pre_weights, match, max(_PRE_RANKED, 4 * k),
                 _K1, _K1, _B, _B, avgdl, w.bm25_title, w.bm25_heading, w.bm25_body, list(chosen.terms), k],
            )
        return [(int(i), float(s)) for i, s in rows]

    def lexical_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(chunk id, rank) pairs, best first: title, heading and text weighted as ``SearchWeights`` says."""
        return self._ranked("chunks", query, k, roots)

    def file_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(file id, rank) pairs, best first, over whole files."""
        return self._ranked("files", query, k, roots)

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
