"""Searching a PostgreSQL store: pgvector and full-text rankings (a ``Retriever``).

See ``crag.index.postgres`` for the tables. Vector search uses the IVFFlat index that
``meta.vectors`` names (``ivf:<cells>``; ``ivfflat.probes`` is ``postgres_vectors.probes``
of its cells and chunks; its cells are found by cosine distance) when no roots restrict the
search, an older crag's HNSW index until the next update replaces it, and is exact
otherwise; scores are inner products of the stored vectors with the query, the cosine
similarity the embedded store reports. Full-text ranking is BM25,
computed in SQL as SQLite's FTS5 computes it in the embedded store, over the rows
``crag.index.lexical`` bounds, from the postings tables (``postings`` for chunks,
``file_postings`` for files: one row per lexeme and row, with the row's length and the
lexeme's positions in its title, heading and text), never from a ``tsvector``: the query's
words (``documents.query_terms``) as PostgreSQL lexemes, each with its document frequency
read from ``terms`` / ``file_terms``; the rows of the words the plan keeps are read by an
index-only scan of (lexeme, id) and every one of them is scored, as FTS5 scores every row
it matches. The words the plan leaves to score only (``scored_only``: too frequent to select
rows) add their BM25 to the ``lexical.RESCORED`` best of those rows, read by an index lookup
of (lexeme, id) for each (the embedded store adds them to every selected row: the two agree
whenever fewer rows than that hold a selecting word). For a query of frequent words only
(``lexical.ALL``) the rows holding every word are found by merge-joining each word's first
``budget`` rows in id order: the embedded store's rows up to the id where the first word
reaches its budget (all of them, unless a word is cut short). A lexeme's frequency weighs
its title, heading and text positions with the weights of ``SearchWeights``; the row's
length is its word count (``dl``) against the average recorded at the last update. A
search runs in one REPEATABLE READ read-only transaction, so everything it fuses comes
from one committed state. This module reads ``crag.index.postgres_schema``; the store
(``crag.index.postgres``) imports it, not the reverse.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import IndexStoreError
from ..ports import ChunkRow, Hit, StoreState
from . import lexical
from .documents import dim_mismatch, query_terms
from .fusion import SearchWeights
from .postgres_connections import PerThread
from .postgres_schema import SCHEMA, fold
from .postgres_vectors import hnsw_index, ivf_index, ivf_lists, probes, vector_index_names, vector_kind
from .search import hybrid_search

if TYPE_CHECKING:
    import numpy as np

    from ..ports import Embedder
    from .postgres import PostgresStore  # the type only: postgres imports this module, not the reverse

__all__ = ["PostgresRetriever"]

# BM25's constants, as SQLite's FTS5 uses them in the embedded store.
_K1 = 1.2
_B = 0.75
# An older crag's HNSW index: its candidate list, at least twice the candidates a search asks for.
_EF_SEARCH = 200


def _idf(total: int, df: int) -> float:
    """A word's IDF as FTS5 computes it: log((N - n + 0.5) / (n + 0.5)), at least 1e-6 (so a
    word more than half the rows hold weighs next to nothing, as in the embedded store)."""
    return max(math.log((max(total - df, 0) + 0.5) / (df + 0.5)), 1e-6)


def _search_connection(store: PostgresStore, ivf_probes: int) -> Any:
    """A new connection for a searcher's thread, with the vector index's search settings."""
    conn = store.connect(autocommit=True)
    try:
        store.reading(conn)
        conn.execute(f"SET hnsw.ef_search = {_EF_SEARCH}")
        if ivf_probes:
            conn.execute(f"SET ivfflat.probes = {ivf_probes}")
    except store.psycopg.Error as exc:
        conn.close()
        raise store.error(exc) from exc
    return conn


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
        self._local = threading.local()  # the last query vector sent (``_vector_param``)
        with store.session() as conn:
            meta = store.meta(conn)
            self.vector_index, self.kind = self._index_of(
                meta.get("vectors"), vector_index_names(conn), vector_kind(store.pgvector_version(conn), self.dim)
            )
        self.lists = ivf_lists(self.vector_index)
        self.probes = probes(self.lists, self.n_chunks) if self.lists else 0
        self.n_files = int(meta.get("text_files", "0"))
        self.avgdl_chunks = float(meta.get("avgdl_chunks", "1")) or 1.0
        self.avgdl_files = float(meta.get("avgdl_files", "1")) or 1.0
        # Each thread's connection. Opened by a function that does not hold this searcher: a
        # searcher a re-index replaced then goes, with its connections, as soon as it is dropped
        # (a cycle through a bound method would keep them open until a full garbage collection).
        self._conns = PerThread(functools.partial(_search_connection, store, self.probes))

    def _index_of(self, vectors: str | None, indexes: list[str], kind: str | None) -> tuple[str, str | None]:
        """What vector searches use, and the type its index was built on (pgvector may have been
        upgraded since): ``ivf:<cells>`` (``meta.vectors``), ``hnsw`` (an older crag's index,
        whose store records no ``vectors``), or ``exact``."""
        if kind is None:
            return "exact", None
        lists = ivf_lists(vectors)
        for built in ("halfvec", "vector"):
            if lists is not None and ivf_index(built, self.dim, lists) in indexes:
                return f"ivf:{lists}", built
            if vectors is None and hnsw_index(built, self.dim) in indexes:
                return "hnsw", built
        return "exact", kind

    def _conn(self) -> Any:
        return self._conns.get()

    def close(self) -> None:
        self._conns.close()

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
            raise dim_mismatch(self.embedder.name, vec.shape[-1], self.dim, self.roots, self.index_dir)
        return vec

    def vector_ranking(self, query_vec: np.ndarray, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(chunk id, cosine) pairs, best first: by the vector index when no roots restrict, else exact."""
        if k <= 0:
            return []
        q = self._vector_param(query_vec)
        d = self.dim
        if self.lists and roots is None:
            # Cells enough to hold twice the candidates asked for, when that is more than usual.
            wanted = min(self.lists, math.ceil(2 * k * self.lists / max(1, self.n_chunks)))
            with self.snapshot():
                if wanted > self.probes:
                    self._conn().execute(f"SET LOCAL ivfflat.probes = {wanted}")
                # The index, always: with many probes the planner may cost a scan of every vector
                # lower, and at 29k chunks that took 163 ms where the index took 15.
                self._conn().execute("SET LOCAL enable_seqscan = off")
                rows = self._query(
                    f"SELECT id, -(embedding <#> %(q)b::real[]::vector) FROM {SCHEMA}.chunks "
                    f"WHERE vector_dims(embedding) = {d} "
                    f"ORDER BY embedding::{self.kind}({d}) <=> %(q)b::real[]::{self.kind}({d}) LIMIT %(k)s",
                    {"q": q, "k": k},
                )
                self._conn().execute("RESET enable_seqscan")
            # The cells are found by cosine distance; the ranking is by the score (inner product), as
            # an exact search ranks: stored vectors' norms differ a little (8-bit codes).
            return sorted(((int(i), float(s)) for i, s in rows), key=lambda p: -p[1])
        if self.vector_index == "hnsw" and roots is None:
            kind = self.kind
            with self.snapshot():
                ef_search = max(_EF_SEARCH, min(1000, 2 * k))
                if ef_search != _EF_SEARCH:  # the connection's own setting otherwise (``_conn``)
                    self._conn().execute(f"SET LOCAL hnsw.ef_search = {ef_search}")
                rows = self._query(
                    f"SELECT id, -(embedding <#> %(q)b::real[]::vector) FROM {SCHEMA}.chunks "
                    f"WHERE vector_dims(embedding) = {d} "
                    f"ORDER BY embedding::{kind}({d}) <=> %(q)b::real[]::{kind}({d}) LIMIT %(k)s",
                    {"q": q, "k": k},
                )
            return [(int(i), float(s)) for i, s in rows]
        clause, params = self._root_clause(roots)
        join = f" JOIN {SCHEMA}.files f ON f.id = c.file_id" if clause else ""
        rows = self._query(
            f"SELECT c.id, -(c.embedding <#> %b::real[]::vector) AS s FROM {SCHEMA}.chunks c{join} WHERE true{clause} "
            "ORDER BY s DESC, c.id LIMIT %s",
            [q, *params, k],
        )
        return [(int(i), float(s)) for i, s in rows]

    def _vector_param(self, query_vec: np.ndarray) -> list[float]:
        """The query vector as a list of floats, sent in binary as ``real[]`` (exact, and a third of
        the time of a text literal); kept for the next call with the same vector (a search sends it
        two or three times)."""
        data = query_vec.astype("float32").tobytes()
        last = getattr(self._local, "vector", None)
        if last is None or last[0] != data:
            last = (data, query_vec.astype("float32").reshape(-1).tolist())
            self._local.vector = last
        return last[1]

    def _terms(self, query: str, terms: str) -> list[tuple[str, int]]:
        """The query's words as PostgreSQL lexemes, each with the number of rows holding it (``terms``
        or ``file_terms``)."""
        words = query_terms(query, lexical.QUERY_WORDS)
        if not words:
            return []
        rows = self._query(
            "SELECT l.lexeme, coalesce(t.df, 0) FROM (SELECT lexeme, min(n) AS n FROM unnest(%s::text[]) "
            f"WITH ORDINALITY AS w(word, n), unnest(to_tsvector('english', {fold('w.word')})) GROUP BY lexeme) AS l "
            f"LEFT JOIN {SCHEMA}.{terms} t ON t.lexeme = l.lexeme ORDER BY l.n",
            (words,),
        )
        return [(str(lexeme), int(df)) for lexeme, df in rows]

    def _ranked(
        self, table: str, query: str, k: int, roots: Sequence[str] | None, ids: Sequence[int] | None = None
    ) -> list[tuple[int, float]]:
        """(id, BM25) of the best ``k`` rows of ``table`` (chunks or files; of ``ids`` only, when given),
        from the postings (see the module docstring)."""
        if k <= 0 or (ids is not None and not ids):
            return []
        w = self.weights
        if table == "chunks":
            budget, postings, terms, key, total, avgdl = (
                lexical.CHUNK_BUDGET, "postings", "terms", "chunk_id", self.n_chunks, self.avgdl_chunks)
            tf_params = [w.bm25_title, w.bm25_heading, w.bm25_body]
            join = f" JOIN {SCHEMA}.chunks c ON c.id = p.chunk_id JOIN {SCHEMA}.files f ON f.id = c.file_id"
        else:
            budget, postings, terms, key, total, avgdl = (
                lexical.FILE_BUDGET, "file_postings", "file_terms", "file_id", self.n_files, self.avgdl_files)
            tf_params = [w.bm25_title, 0.0, w.bm25_body]  # a file's postings have no heading positions
            join = f" JOIN {SCHEMA}.files f ON f.id = p.file_id"
        with self.snapshot():
            dfs = self._terms(query, terms)
            chosen = lexical.plan(dfs, budget)
            if not chosen.terms or (ids is not None and chosen.mode == lexical.ALL):
                return []  # nothing matches, or frequent words only: no ranking of the candidates' files
            df = dict(dfs)
            idfs = [_idf(total, df[t]) for t in chosen.terms]
            clause, params = self._root_clause(roots)
            source = f"{SCHEMA}.{postings} p" + (join if clause else "")
            if ids is not None:
                clause, params = clause + f" AND p.{key} = ANY(%s)", [*params, list(ids)]
            if chosen.mode == lexical.ALL:
                rows = self._holding_every_term(
                    key, source, clause, params, chosen.terms, df, idfs, tf_params, avgdl, budget, k)
            elif chosen.scored_only:
                rows = self._rescored(key, postings, source, clause, params, chosen, df, total, idfs, tf_params,
                                      avgdl, budget, k)
            else:
                # Each word's rows (at most the budget in all, by the plan) by an index-only scan.
                rows = self._query(
                    "WITH q AS (SELECT * FROM unnest(%s::text[], %s::float8[]) AS q(lexeme, idf)) "
                    f"SELECT p.{key}, sum(q.idf * p.f * %s / (p.f + %s * (1 - %s + %s * p.dl / %s))) AS s "
                    f"FROM q CROSS JOIN LATERAL (SELECT p.{key}, p.dl, (%s * p.a + %s * p.b + %s * p.d)::float8 AS f "
                    f"FROM {source} WHERE p.lexeme = q.lexeme{clause} LIMIT %s) AS p "
                    f"GROUP BY p.{key} ORDER BY s DESC, p.{key} LIMIT %s",
                    [list(chosen.terms), idfs, _K1 + 1, _K1, _B, _B, avgdl, *tf_params, *params, budget, k],
                )
        return [(int(i), float(s)) for i, s in rows]

    def _rescored(
        self, key: str, postings: str, source: str, clause: str, params: list[Any], chosen: lexical.LexicalPlan,
        df: dict[str, int], total: int, idfs: list[float], tf_params: list[float], avgdl: float, budget: int, k: int,
    ) -> list[tuple[Any, ...]]:
        """BM25 of every term over the rows the selecting terms hold (``chosen.scored_only``: the
        frequent terms): the ``lexical.RESCORED`` best of those rows by the selecting terms, each
        with what the frequent terms add (their postings of those rows, by index lookups)."""
        others = list(chosen.scored_only)
        other_idfs = [_idf(total, df[t]) for t in others]
        bm25 = "sum(%s * x.f * %s / (x.f + %s * (1 - %s + %s * x.dl / %s)))"
        bm25_params = [_K1 + 1, _K1, _B, _B, avgdl]
        f = "(%s * p.a + %s * p.b + %s * p.d)::float8 AS f"
        return self._query(
            "WITH q AS (SELECT * FROM unnest(%s::text[], %s::float8[]) AS q(lexeme, idf)), "
            f"partial AS (SELECT x.{key} AS id, {bm25.replace('%s', 'x.idf', 1)} AS s "
            f"FROM q CROSS JOIN LATERAL (SELECT q.idf, p.{key}, p.dl, {f} "
            f"FROM {source} WHERE p.lexeme = q.lexeme{clause} LIMIT %s) AS x "
            f"GROUP BY x.{key} ORDER BY s DESC, x.{key} LIMIT %s), "
            "o AS (SELECT * FROM unnest(%s::text[], %s::float8[]) AS o(lexeme, idf)), "
            f"more AS (SELECT x.{key} AS id, {bm25.replace('%s', 'x.idf', 1)} AS s "
            f"FROM o CROSS JOIN LATERAL (SELECT o.idf, p.{key}, p.dl, {f} FROM {SCHEMA}.{postings} p "
            f"WHERE p.lexeme = o.lexeme AND p.{key} = ANY(ARRAY(SELECT id FROM partial))) AS x GROUP BY x.{key}) "
            "SELECT partial.id, partial.s + coalesce(more.s, 0) AS s FROM partial LEFT JOIN more USING (id) "
            "ORDER BY s DESC, partial.id LIMIT %s",
            [list(chosen.terms), idfs, *bm25_params, *tf_params, *params, budget, lexical.RESCORED,
             others, other_idfs, *bm25_params, *tf_params, k],
        )

    def _holding_every_term(
        self, key: str, source: str, clause: str, params: list[Any], terms: Sequence[str], df: dict[str, int],
        idfs: list[float], tf_params: list[float], avgdl: float, budget: int, k: int,
    ) -> list[tuple[Any, ...]]:
        """BM25 of the rows holding every term (``lexical.ALL``): each term's rows up to the id of
        the rarest one's ``budget``-th, read in id order and merge-joined, rarest first.

        Grouping those rows by id instead (up to ``budget`` a term) took 40 to 60 ms for a
        question of ten frequent words at a million chunks, where the merge takes 3 to 4; the
        planner would hash them, so the merge is asked for, for this statement alone."""
        order = sorted(range(len(terms)), key=lambda i: df[terms[i]])  # stable: ties keep the query's order
        score, score_params, subs, sub_params = [], [], [], []
        for n, i in enumerate(order):
            score.append(f"%s * t{n}.f * %s / (t{n}.f + %s * (1 - %s + %s * t0.dl / %s))")
            score_params += [idfs[i], _K1 + 1, _K1, _B, _B, avgdl]
            subs.append(
                f"(SELECT p.{key}, p.dl, (%s * p.a + %s * p.b + %s * p.d)::float8 AS f FROM {source} "
                f"WHERE p.lexeme = %s{clause} AND p.{key} <= (SELECT c FROM cut) ORDER BY p.{key} LIMIT %s) AS t{n}"
            )
            sub_params += [*tf_params, terms[i], *params, budget]
        joined = subs[0] + "".join(f" JOIN {sub} USING ({key})" for sub in subs[1:])
        conn = self._conn()
        conn.execute("SET LOCAL enable_hashjoin = off; SET LOCAL enable_nestloop = off; SET LOCAL join_collapse_limit = 1")
        rows = self._query(
            f"WITH cut AS (SELECT coalesce((SELECT p.{key} FROM {source} WHERE p.lexeme = %s{clause} "
            f"ORDER BY p.{key} OFFSET %s LIMIT 1), 9223372036854775807) AS c) "
            f"SELECT {key}, {' + '.join(score)} AS s FROM {joined} ORDER BY s DESC, {key} LIMIT %s",
            [terms[order[0]], *params, budget - 1, *score_params, *sub_params, k],
        )
        conn.execute("RESET enable_hashjoin; RESET enable_nestloop; RESET join_collapse_limit")
        return rows

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
        q = self._vector_param(query_vec)
        rows = self._query(
            f"SELECT id, -(embedding <#> %b::real[]::vector) FROM {SCHEMA}.chunks WHERE id = ANY(%s)", (q, ids)
        )
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
        """The ``top_k`` best chunks for ``query``, from one snapshot (see ``hybrid_search``).
        A kept connection the server has dropped since (a restart, a pooler, a failover) is
        replaced and the search run again, once."""
        try:
            return self._search(query, top_k, roots, mode)
        except IndexStoreError:
            conn = self._conns.current()
            if conn is None or not conn.closed:
                raise
        return self._search(query, top_k, roots, mode)

    def _search(self, query: str, top_k: int, roots: Sequence[str] | None, mode: str) -> list[Hit]:
        with self.snapshot():
            return hybrid_search(
                self, self.weights, query, top_k, roots, mode,
                location=self.store.location, reindex_hint=self.store.reindex_hint,
            )
