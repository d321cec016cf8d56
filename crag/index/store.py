"""Searching the embedded index: FAISS vectors + SQLite metadata and FTS5 (a ``Retriever``).

``open_index(index_dir, embedder)`` opens the generation ``CURRENT`` names (see
``crag.index.layout`` for the layout and the theory of operation) and checks that it was
built with ``embedder``: another embedder raises ``EmbedderMismatchError``.

``IndexReader`` gives the three rankings of the ``Retriever`` port: FAISS cosine over the
chunks (restricted to roots with an id selector), FTS5 BM25 over chunks (title words,
heading path, text) and BM25 over whole files; ``search`` fuses them with
``crag.index.search.hybrid_search``, the same code every store uses, and each hit reports
its cosine similarity to the query clipped to [0, 1] as ``score`` (with the hash embedder,
relevant chunks typically score 0.2 to 0.7, so the ``high_vector_score`` rule rarely
fires; with a neural embedder it means what it says).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import IndexStoreError
from ..ports import ChunkRow, Hit
from . import lexical, vectors
from .documents import dim_mismatch, embedder_mismatch, fts_match, fts_phrase, fts_query, query_terms
from .fusion import SearchWeights
from .layout import (
    VECTORS,
    Generation,
    current_generation,
    generation_version,
    open_generation,
    read_vectors,
    reindex_hint,
)
from .search import hybrid_search

if TYPE_CHECKING:
    import numpy as np

    from ..ports import Embedder

__all__ = [
    "Hit",
    "IndexReader",
    "SearchWeights",
    "current_generation",
    "fts_query",
    "indexed_roots",
    "open_index",
]


_DF_CACHE = 100_000  # document frequencies a reader remembers


def indexed_roots(index_dir: str) -> tuple[str, ...]:
    """The roots the published index holds (IndexStoreError when there is none)."""
    index_dir = os.path.abspath(index_dir)
    gen = open_generation(index_dir)
    try:
        return tuple(r for (r,) in gen.conn.execute("SELECT path FROM roots ORDER BY path"))
    except sqlite3.Error as exc:
        raise IndexStoreError(
            f"the index database in {index_dir} is damaged ({exc}): {reindex_hint(index_dir)}", index_dir
        ) from exc
    finally:
        gen.close()


class IndexReader:
    """A published generation opened for search. Thread-safe; ``close`` when done.

    ``search(query, top_k, roots=None, mode="hybrid")`` returns ``Hit`` records best first.
    ``mode`` is ``"hybrid"`` (what ``vector_search`` uses), ``"vector"`` or ``"lexical"``.
    ``roots`` restricts hits to files under those paths (None: every root of the index).
    """

    def __init__(self, gen: Generation, embedder: Embedder, weights: SearchWeights | None = None) -> None:
        self._gen = gen
        self.index_dir = gen.index_dir
        self.generation = gen.name
        self.version = generation_version(gen)
        self.embedder = embedder
        self.weights = weights or SearchWeights()
        meta = gen.meta
        self.embedder_name = meta["embedder"]
        self.dim = int(meta["dim"])
        self.n_chunks = int(meta["chunks"])
        self._conn = gen.conn
        self._lock = threading.Lock()
        try:
            self.roots = tuple(r for (r,) in self._conn.execute("SELECT path FROM roots ORDER BY path"))
        except sqlite3.Error as exc:
            raise self._damaged(exc) from exc
        self._vectors = read_vectors(gen, mmap=True)
        self._vectors_size = self._vectors_file_size()
        self._allowed_cache: dict[tuple[str, ...], Any] = {}
        self._df_cache: dict[tuple[str, str, int], int] = {}

    def _damaged(self, exc: Exception) -> IndexStoreError:
        return IndexStoreError(
            f"the index database in {os.path.dirname(self._gen.db_path)} is damaged ({exc}): "
            f"{reindex_hint(self.index_dir)}",
            self.index_dir,
        )

    def _vectors_file_size(self) -> int | None:
        fd = self._gen.held.get(VECTORS)
        try:
            return os.fstat(fd).st_size if fd is not None else os.path.getsize(self._gen.vectors_path)
        except OSError:  # closed meanwhile, or gone: the checks below say so
            return None

    def _mapped(self) -> Any:
        """The vector index, mapped from its file, if that file is still the one mapped. crag
        never rewrites a published generation, but a file overwritten in place (``cp`` of an
        older index over it) and cut short would end the process with SIGBUS at the next read
        of the mapping: that is damage, said as such, and a re-index publishes a fresh file."""
        index = self._vectors
        if index is None:
            raise IndexStoreError(f"the index in {self.index_dir} was closed", self.index_dir)
        # A close by another thread meanwhile also loses the file's size (its descriptor is gone): not damage.
        if self._vectors_file_size() != self._vectors_size and self._vectors is not None:
            raise IndexStoreError(
                f"the vector file {self._gen.vectors_path} was changed on disk while it was open, "
                f"so it is damaged: {reindex_hint(self.index_dir)}",
                self.index_dir,
            )
        return index

    def close(self) -> None:
        with self._lock:
            self._vectors = None  # first: a search that finds it gone says "closed", not "damaged"
            self._gen.close()

    def __enter__(self) -> IndexReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.OperationalError as exc:
                if "fts5" in str(exc).lower() or "syntax" in str(exc).lower():
                    raise
                raise self._damaged(exc) from exc
            except sqlite3.DatabaseError as exc:
                if self._vectors is None:  # closed by another thread meanwhile: not damage
                    raise IndexStoreError(f"the index in {self.index_dir} was closed", self.index_dir) from exc
                raise self._damaged(exc) from exc

    # -- the rankings --------------------------------------------------------------------

    def _root_clause(self, roots: Sequence[str] | None) -> tuple[str, list[Any]]:
        if roots is None:
            return "", []
        if not roots:
            return " AND 0", []
        parts, params = [], []
        for r in roots:
            prefix = r if r.endswith(os.sep) else r + os.sep
            parts.append("(f.path = ? OR substr(f.path, 1, ?) = ?)")
            params += [r, len(prefix), prefix]
        return " AND (" + " OR ".join(parts) + ")", params

    def _allowed_ids(self, roots: Sequence[str]) -> Any:
        import numpy as np

        key = tuple(sorted(roots))
        cached = self._allowed_cache.get(key)
        if cached is None:
            clause, params = self._root_clause(roots)
            rows = self._query(f"SELECT c.id FROM chunks c JOIN files f ON f.id = c.file_id WHERE 1{clause}", params)
            cached = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            self._allowed_cache[key] = cached
        return cached

    def embed_query(self, query: str) -> np.ndarray:
        vec = self.embedder.embed([query])
        if vec.shape != (1, self.dim):
            raise dim_mismatch(self.embedder.name, vec.shape[-1], self.dim, self.roots, self.index_dir)
        return vec

    def vector_ranking(
        self, query_vec: np.ndarray, k: int, roots: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        """(chunk id, cosine) pairs, best first: exact or approximate as the index's kind
        (``crag.index.vectors``)."""
        import numpy as np

        index = self._mapped()
        if index.ntotal == 0 or k <= 0:
            return []
        allowed = None
        if roots is not None:
            allowed = self._allowed_ids(roots)
            if allowed.size == 0:
                return []
            if allowed.size >= index.ntotal:
                allowed = None
            else:
                k = min(k, int(allowed.size))
        k = min(k, int(index.ntotal))
        q = np.ascontiguousarray(query_vec, dtype=np.float32).reshape(1, -1)
        # One query, one thread: FAISS would spread it over OpenMP threads that spin while they
        # wait, which on a busy machine (or under concurrent searches) costs more than it saves:
        # 24 ms instead of 10 at 15k chunks under load. The setting is this thread's own.
        vectors.single_threaded()
        params = vectors.search_params(index, allowed)
        scores, ids = index.search(q, k, params=params) if params is not None else index.search(q, k)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def lexical_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(chunk id, bm25) pairs, best first (bm25: lower is better, as FTS5 reports it)."""
        w = self.weights
        join = " JOIN chunks c ON c.id = fts.rowid JOIN files f ON f.id = c.file_id"
        return self._bm25("fts", join, (w.bm25_title, w.bm25_heading, w.bm25_body), query, k, roots)

    def file_ranking(
        self, query: str, k: int, roots: Sequence[str] | None = None, files: Sequence[int] | None = None
    ) -> list[tuple[int, float]]:
        """(file id, bm25) pairs, best first, over whole files (only ``files``, when given)."""
        w = self.weights
        join = " JOIN files f ON f.id = files_fts.rowid"
        return self._bm25("files_fts", join, (w.bm25_title, w.bm25_body), query, k, roots, files)

    def _df(self, table: str, match: str, cap: int) -> int:
        """How many rows of ``table`` match ``match``, counted up to ``cap`` (cached: a generation never changes)."""
        key = (table, match, cap)
        df = self._df_cache.get(key)
        if df is None:
            rows = self._query(
                f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {table} MATCH ? LIMIT ?)", [match, cap]
            )
            df = int(rows[0][0])
            if len(self._df_cache) > _DF_CACHE:
                self._df_cache.clear()
            self._df_cache[key] = df
        return df

    def _bm25(
        self,
        table: str,
        join: str,
        weights: tuple[float, ...],
        query: str,
        k: int,
        roots: Sequence[str] | None,
        rowids: Sequence[int] | None = None,
    ) -> list[tuple[int, float]]:
        """(rowid, bm25) of the best ``k`` rows of an FTS5 ``table`` (of ``rowids`` only, when
        given): the rows the terms ``crag.index.lexical.plan`` selects, scored by BM25 over every
        term; ``join`` reaches ``files f`` and is used only when ``roots`` restricts the search."""
        terms = query_terms(query, lexical.QUERY_WORDS)
        if not terms or k <= 0 or (rowids is not None and not rowids):
            return []
        budget = lexical.CHUNK_BUDGET if table == "fts" else lexical.FILE_BUDGET
        try:
            chosen = lexical.plan([(t, self._df(table, fts_phrase(t), budget + 1)) for t in terms], budget)
            if not chosen.terms or (rowids is not None and chosen.mode == lexical.ALL):
                return []  # nothing matches, or frequent words only: no ranking of the candidates' files
            match = fts_match(chosen.terms, chosen.mode)
            clause, params = self._root_clause(roots)
            window = ""
            if rowids is not None:
                # ``+rowid``: a plain ``rowid IN`` makes SQLite run the FTS5 query once per id, and
                # FTS5 reads every term's row count (its IDF) again each time (35 ms instead of
                # 1 for 100 files); the range lets FTS5 skip the rows outside it.
                window = f" AND {table}.rowid BETWEEN ? AND ? AND +{table}.rowid IN ({','.join('?' * len(rowids))})"
                params = [min(rowids), max(rowids), *rowids, *params]
            elif chosen.mode == lexical.ALL and (clause or self._df(table, match, budget + 1) > budget):
                # Frequent words only: when more rows (of the roots) hold them all than the budget,
                # the first ones indexed (the count of the whole index is cached).
                last = self._query(
                    f"SELECT {table}.rowid FROM {table}{join if clause else ''} WHERE {table} MATCH ?{clause} "
                    f"ORDER BY {table}.rowid LIMIT 1 OFFSET ?",
                    [match, *params, budget - 1],
                )
                if last:
                    window, params = f" AND {table}.rowid <= ?", [int(last[0][0]), *params]
            marks = ", ".join("?" * len(weights))
            sql = (
                f"SELECT {table}.rowid, bm25({table}, {marks}) AS s FROM {table}{join if clause else ''} "
                f"WHERE {table} MATCH ?{window}{clause} ORDER BY s, {table}.rowid LIMIT ?"
            )
            rows = self._query(sql, [*weights, match, *params, k])
            if chosen.scored_only:
                # The selected rows holding a frequent term too, scored by every term (FTS5 scores each
                # phrase of an expression once, and reads each frequent term's row count, its IDF, but
                # ranks none of its other rows). A row that holds none scores as it does by the selecting
                # terms alone; one that holds some but is not among these ``k`` scores below all of them
                # by every term, and lower still by the selecting ones, so it cannot stay in the best ``k``.
                others = fts_match(chosen.scored_only, lexical.ANY)
                full = self._query(sql, [*weights, f"({match}) AND ({others})", *params, k])
                best = dict(rows)
                best.update(full)
                rows = sorted(best.items(), key=lambda r: (r[1], r[0]))[:k]
        except sqlite3.OperationalError:
            return []  # fts_match cannot produce a syntax error; never let one reach the user
        return [(int(i), float(s)) for i, s in rows]

    # -- what the fusion needs -------------------------------------------------------------

    def chunk_files(self, chunk_ids: Sequence[int]) -> dict[int, int]:
        ids = list(chunk_ids)
        if not ids:
            return {}
        rows = self._query(f"SELECT id, file_id FROM chunks WHERE id IN ({','.join('?' * len(ids))})", ids)
        return {int(c): int(f) for c, f in rows}

    def cosines(self, query_vec: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]:
        import numpy as np

        ids = list(chunk_ids)
        if not ids:
            return {}
        index = self._mapped()
        vecs = np.vstack([index.reconstruct(int(i)) for i in ids])
        sims = vecs @ query_vec.reshape(-1)
        return {i: float(s) for i, s in zip(ids, sims)}

    def chunk_rows(self, chunk_ids: Sequence[int]) -> dict[int, ChunkRow]:
        ids = list(chunk_ids)
        if not ids:
            return {}
        rows = self._query(
            "SELECT c.id, c.file_id, f.path, c.start_line, c.end_line, c.heading, c.text FROM chunks c "
            f"JOIN files f ON f.id = c.file_id WHERE c.id IN ({','.join('?' * len(ids))})",
            ids,
        )
        return {r[0]: ChunkRow(*r) for r in rows}

    def search(
        self,
        query: str,
        top_k: int = 5,
        roots: Sequence[str] | None = None,
        mode: str = "hybrid",
    ) -> list[Hit]:
        """The ``top_k`` best chunks for ``query`` (see the class docstring)."""
        return hybrid_search(
            self, self.weights, query, top_k, roots, mode, location=self.index_dir, reindex_hint=reindex_hint(self.index_dir)
        )


def open_index(
    index_dir: str,
    embedder: Embedder,
    weights: SearchWeights | None = None,
) -> IndexReader:
    """The published index in ``index_dir`` opened for search with ``embedder``.

    Raises ``IndexStoreError`` when there is no index or it is damaged, and
    ``EmbedderMismatchError`` when it was built with another embedder.
    """
    index_dir = os.path.abspath(index_dir)
    gen = open_generation(index_dir, verify=True)
    built_with = gen.meta.get("embedder", "unknown")
    if built_with != embedder.name:
        try:
            roots = [r for (r,) in gen.conn.execute("SELECT path FROM roots ORDER BY path")]
        except sqlite3.Error:
            roots = []
        finally:
            gen.close()
        raise embedder_mismatch(built_with, embedder.name, roots, index_dir)
    try:
        return IndexReader(gen, embedder, weights)
    except BaseException:
        gen.close()
        raise
