"""The index on disk and searching it: FAISS vectors + SQLite metadata and FTS5.

Layout of ``KB_AGENT_INDEX_DIR``::

    CURRENT              one line, "gen-000007": the generation readers use
    LOCK                 held (fcntl.flock) by the one indexer allowed at a time
    gen-000007/
        vectors.faiss    IndexIDMap2(IndexFlatIP): unit vectors, inner product = cosine;
                         FAISS ids are the chunk ids of the database
        chunks.sqlite    meta, roots, files, chunks; ``fts`` (FTS5, porter) over chunks
                         and ``files_fts`` over whole files, for BM25

Theory of operation. A generation is written once and never modified. An update (under
the lock) builds the next generation in a new directory: the previous database is copied
and edited (rows of changed and deleted files removed, new chunks added), the previous
FAISS index is loaded, edited the same way and written next to it (or hard-linked when the
vectors did not change), both files are fsynced, and only then is ``CURRENT`` replaced
atomically (write a temporary file, fsync, ``os.replace``, fsync the directory). Older
generations are deleted afterwards. A kill at any moment therefore leaves ``CURRENT``
naming a complete generation in which FAISS and SQLite agree; an unfinished generation
directory is garbage that the next indexer removes. Readers take no lock: they open the
generation ``CURRENT`` names (retrying if an indexer deleted it in between), map the FAISS
file into memory and open the database read-only as immutable; POSIX keeps the files of a
deleted generation readable for as long as they are open. Writing lives in
``crag.index.build``.

Files are identified by absolute path and sha256 of their bytes; a file whose size and
mtime are unchanged is not even read. The embedder's name and dimension, and the chunking
parameters, are recorded in ``meta``: searching with another embedder raises
``EmbedderMismatchError``; indexing with another embedder (or other chunking) re-embeds
everything and says so.

Search is hybrid: the FAISS cosine ranking of chunks, the FTS5 BM25 ranking of chunks and
the BM25 ranking of whole files are fused with weighted reciprocal-rank fusion
(``SearchWeights``), and each hit reports its cosine similarity to the query, clipped to
[0, 1], as ``score``: the value the ``high_vector_score`` rule compares with its threshold,
whatever the fusion did to the order (with the hash embedder, relevant chunks typically
score 0.2 to 0.7, so that rule rarely fires; with a neural embedder it means what it says).
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

from ..errors import EmbedderMismatchError, IndexStoreError
from ..text import STOPWORDS
from .chunker import CHUNKER_VERSION

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

SCHEMA_VERSION = 2
CURRENT = "CURRENT"
LOCK = "LOCK"
VECTORS = "vectors.faiss"
DATABASE = "chunks.sqlite"
_GEN = re.compile(r"^gen-(\d{6,})$")

_REINDEX = "run `python -m crag index PATH` to re-index"


def _reindex_hint(index_dir: str) -> str:
    return f"run `python -m crag index PATH` (with KB_AGENT_INDEX_DIR={index_dir}) to rebuild it"


@frozen
class SearchWeights:
    """How the rankings are fused: weighted reciprocal-rank fusion with constant ``k``.

    Three rankings: chunks by cosine (``vector``), chunks by BM25 over path words, heading
    path and text (``lexical``), and files by BM25 over path words and whole text
    (``file``: every candidate chunk of the r-th best file gains ``file / (k + r)``).
    Defaults measured by ``benchmarks/retrieval.py``.
    """

    vector: float = 1.0
    lexical: float = 1.0
    file: float = 1.0
    k: float = 60.0
    candidates: int = 50
    file_candidates: int = 20
    bm25_title: float = 4.0
    bm25_heading: float = 4.0
    bm25_body: float = 1.0


@frozen
class Hit:
    """One chunk found by a search, best first.

    ``score`` is the chunk's cosine similarity to the query clipped to [0, 1]; ``fused``
    is the reciprocal-rank-fusion value the order comes from.
    """

    chunk_id: int
    path: str
    start_line: int
    end_line: int
    heading: str
    text: str
    score: float
    fused: float = 0.0
    vector_rank: int | None = None
    lexical_rank: int | None = None


def fts_query(text: str, max_terms: int = 32) -> str | None:
    """An FTS5 MATCH expression for arbitrary user text: quoted terms joined by OR.

    Terms are runs of letters and digits (so no quote, operator or column filter can reach
    FTS5), stop words are dropped, and each term is double-quoted. None when nothing is left.
    """
    terms: list[str] = []
    seen = set()
    for word in re.findall(r"[^\W_]+", text.lower()):
        if word in STOPWORDS or word in seen:
            continue
        seen.add(word)
        terms.append('"' + word.replace('"', '""') + '"')
        if len(terms) >= max_terms:
            break
    return " OR ".join(terms) if terms else None


def _title_words(path: str, root: str) -> str:
    if path == root:
        rel = os.path.basename(path)
    elif path.startswith(root) and path[len(root) : len(root) + 1] == os.sep and root != os.sep:
        rel = path[len(root) + 1 :]  # what relpath gives for a normalised path under root, cheaply
    else:
        rel = os.path.relpath(path, root)
    stem = os.path.splitext(rel)[0]
    return " ".join(w for w in _TITLE_SPLIT.split(stem) if w)


_TITLE_SPLIT = re.compile(r"[\\/_\-. ]+")


def embed_text(title: str, heading: str, text: str) -> str:
    """What is embedded and lexically indexed for a chunk: where it is, then what it says."""
    return f"{title}\n{heading}\n{text}"


# ---------------------------------------------------------------------------------------
# Generations


def _read_current(index_dir: str) -> str | None:
    try:
        with open(os.path.join(index_dir, CURRENT), encoding="utf-8") as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IndexStoreError(
            f"cannot read {os.path.join(index_dir, CURRENT)} ({exc.strerror or exc}): {_reindex_hint(index_dir)}",
            index_dir,
        ) from exc
    if not _GEN.match(name):
        raise IndexStoreError(f"the index in {index_dir} is damaged (bad CURRENT file): {_reindex_hint(index_dir)}", index_dir)
    return name


def current_generation(index_dir: str) -> str | None:
    """The generation ``CURRENT`` names, or None (cheap: one small file read)."""
    try:
        return _read_current(index_dir)
    except IndexStoreError:
        return None


def indexed_roots(index_dir: str) -> tuple[str, ...]:
    """The roots the published index holds (IndexStoreError when there is none)."""
    index_dir = os.path.abspath(index_dir)
    gen = _open_generation(index_dir)
    try:
        return tuple(r for (r,) in gen.conn.execute("SELECT path FROM roots ORDER BY path"))
    except sqlite3.Error as exc:
        raise IndexStoreError(
            f"the index database in {index_dir} is damaged ({exc}): {_reindex_hint(index_dir)}", index_dir
        ) from exc
    finally:
        gen.conn.close()


# ---------------------------------------------------------------------------------------
# The database


_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE roots (path TEXT PRIMARY KEY);
CREATE TABLE files (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    root TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    chunks INTEGER NOT NULL
);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    heading TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX chunks_file ON chunks(file_id);
CREATE VIRTUAL TABLE fts USING fts5(title, heading, body, tokenize='porter unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE files_fts USING fts5(title, body, tokenize='porter unicode61 remove_diacritics 2');
"""


def _connect_ro(path: str) -> sqlite3.Connection:
    uri = "file:" + _uri_path(path) + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True, check_same_thread=False)


def _uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="/")


def _meta(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def _chunker_id(max_tokens: int, min_tokens: int) -> str:
    return f"v{CHUNKER_VERSION}:{max_tokens}:{min_tokens}"


@frozen
class _Generation:
    """A published generation opened for reading: its paths, meta and connection."""

    index_dir: str
    name: str
    db_path: str
    vectors_path: str
    conn: sqlite3.Connection
    meta: dict[str, str]


def _open_generation(index_dir: str) -> _Generation:
    """The generation ``CURRENT`` names, its database open read-only; errors → IndexStoreError."""
    last_missing = None
    for _ in range(5):
        name = _read_current(index_dir)
        if name is None:
            raise IndexStoreError(f"no index in {index_dir}: run `python -m crag index PATH` first", index_dir)
        gen_dir = os.path.join(index_dir, name)
        db_path = os.path.join(gen_dir, DATABASE)
        vectors_path = os.path.join(gen_dir, VECTORS)
        if not os.path.exists(db_path) or not os.path.exists(vectors_path):
            # An indexer may have published a newer generation and removed this one.
            last_missing = name
            time.sleep(0.05)
            continue
        try:
            conn = _connect_ro(db_path)
            meta = _meta(conn)
        except sqlite3.Error as exc:
            if not os.path.exists(db_path):
                last_missing = name
                continue
            raise IndexStoreError(
                f"the index database in {gen_dir} is damaged ({exc}): {_reindex_hint(index_dir)}", index_dir
            ) from exc
        if meta.get("schema") != str(SCHEMA_VERSION):
            conn.close()
            raise IndexStoreError(
                f"the index in {index_dir} has format {meta.get('schema', 'unknown')}, this crag reads "
                f"format {SCHEMA_VERSION}: {_reindex_hint(index_dir)}",
                index_dir,
            )
        return _Generation(index_dir, name, db_path, vectors_path, conn, meta)
    raise IndexStoreError(
        f"the index in {index_dir} is damaged (generation {last_missing} is missing): {_reindex_hint(index_dir)}",
        index_dir,
    )


def _read_vectors(gen: _Generation, mmap: bool) -> Any:
    import faiss

    expected = gen.meta.get("vectors_bytes")
    try:
        size = os.path.getsize(gen.vectors_path)
    except OSError as exc:
        raise IndexStoreError(f"cannot read {gen.vectors_path} ({exc.strerror or exc}): {_reindex_hint(gen.index_dir)}", gen.index_dir) from exc
    if expected is not None and str(size) != expected:
        raise IndexStoreError(
            f"the vector file {gen.vectors_path} is damaged ({size} bytes, expected {expected}): "
            f"{_reindex_hint(gen.index_dir)}",
            gen.index_dir,
        )
    flags = 0
    if mmap:
        flags = getattr(faiss, "IO_FLAG_MMAP_IFC", None) or getattr(faiss, "IO_FLAG_MMAP", 0)
    try:
        index = faiss.read_index(gen.vectors_path, flags)
    except RuntimeError as exc:
        raise IndexStoreError(
            f"the vector file {gen.vectors_path} is damaged: {_reindex_hint(gen.index_dir)}", gen.index_dir
        ) from exc
    n_chunks = int(gen.meta.get("chunks", "-1"))
    if index.ntotal != n_chunks or index.d != int(gen.meta.get("dim", "-1")):
        raise IndexStoreError(
            f"the index in {gen.index_dir} is damaged ({index.ntotal} vectors for {n_chunks} chunks): "
            f"{_reindex_hint(gen.index_dir)}",
            gen.index_dir,
        )
    return index


# ---------------------------------------------------------------------------------------
# Reading and searching


class IndexReader:
    """A published generation opened for search. Thread-safe; ``close`` when done.

    ``search(query, top_k, roots=None, mode="hybrid")`` returns ``Hit`` records best first.
    ``mode`` is ``"hybrid"`` (what ``vector_search`` uses), ``"vector"`` or ``"lexical"``.
    ``roots`` restricts hits to files under those paths (None: every root of the index).
    """

    def __init__(self, gen: _Generation, embedder: Embedder, weights: SearchWeights | None = None) -> None:
        self._gen = gen
        self.index_dir = gen.index_dir
        self.generation = gen.name
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
        self._vectors = _read_vectors(gen, mmap=True)
        self._allowed_cache: dict[tuple[str, ...], Any] = {}

    def _damaged(self, exc: Exception) -> IndexStoreError:
        return IndexStoreError(
            f"the index database in {os.path.dirname(self._gen.db_path)} is damaged ({exc}): "
            f"{_reindex_hint(self.index_dir)}",
            self.index_dir,
        )

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._vectors = None

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
                raise self._damaged(exc) from exc

    # -- search ------------------------------------------------------------------------

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
            raise IndexStoreError(
                f"the embedder {self.embedder.name} returned {vec.shape[-1]}-dimensional vectors, the index holds "
                f"{self.dim}: {_REINDEX}",
                self.index_dir,
            )
        return vec

    def vector_ranking(
        self, query_vec: np.ndarray, k: int, roots: Sequence[str] | None = None
    ) -> list[tuple[int, float]]:
        """(chunk id, cosine) pairs, best first."""
        import faiss
        import numpy as np

        index = self._vectors
        if index is None:
            raise IndexStoreError(f"the index in {self.index_dir} was closed", self.index_dir)
        if index.ntotal == 0 or k <= 0:
            return []
        params = None
        if roots is not None:
            allowed = self._allowed_ids(roots)
            if allowed.size == 0:
                return []
            if allowed.size < index.ntotal:
                params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(allowed))
            k = min(k, int(allowed.size))
        k = min(k, int(index.ntotal))
        q = np.ascontiguousarray(query_vec, dtype=np.float32).reshape(1, -1)
        scores, ids = index.search(q, k, params=params) if params is not None else index.search(q, k)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def lexical_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(chunk id, bm25) pairs, best first (bm25: lower is better, as FTS5 reports it)."""
        w = self.weights
        join = " JOIN chunks c ON c.id = fts.rowid JOIN files f ON f.id = c.file_id"
        return self._bm25("fts", join, (w.bm25_title, w.bm25_heading, w.bm25_body), query, k, roots)

    def file_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]:
        """(file id, bm25) pairs, best first, over whole files."""
        w = self.weights
        join = " JOIN files f ON f.id = files_fts.rowid"
        return self._bm25("files_fts", join, (w.bm25_title, w.bm25_body), query, k, roots)

    def _bm25(
        self, table: str, join: str, weights: tuple[float, ...], query: str, k: int, roots: Sequence[str] | None
    ) -> list[tuple[int, float]]:
        """(rowid, bm25) of the best ``k`` rows of an FTS5 ``table``; ``join`` reaches ``files f``
        and is used only when ``roots`` restricts the search."""
        match = fts_query(query)
        if match is None or k <= 0:
            return []
        clause, params = self._root_clause(roots)
        marks = ", ".join("?" * len(weights))
        sql = (
            f"SELECT {table}.rowid, bm25({table}, {marks}) AS s FROM {table}{join if clause else ''} "
            f"WHERE {table} MATCH ?{clause} ORDER BY s LIMIT ?"
        )
        try:
            rows = self._query(sql, [*weights, match, *params, k])
        except sqlite3.OperationalError:
            return []  # fts_query cannot produce a syntax error; never let one reach the user
        return [(int(i), float(s)) for i, s in rows]

    def _cosines(self, query_vec: np.ndarray, ids: Iterable[int]) -> dict[int, float]:
        import numpy as np

        ids = list(ids)
        if not ids:
            return {}
        vecs = np.vstack([self._vectors.reconstruct(int(i)) for i in ids])
        sims = vecs @ query_vec.reshape(-1)
        return {i: float(s) for i, s in zip(ids, sims)}

    def search(
        self,
        query: str,
        top_k: int = 5,
        roots: Sequence[str] | None = None,
        mode: str = "hybrid",
    ) -> list[Hit]:
        """The ``top_k`` best chunks for ``query`` (see the class docstring)."""
        if mode not in ("hybrid", "vector", "lexical"):
            raise ValueError(f"unknown search mode {mode!r}")
        if top_k <= 0 or not query.strip():
            return []
        w = self.weights
        pool = max(w.candidates, top_k)
        qvec = self.embed_query(query)
        vec_rank = self.vector_ranking(qvec, pool, roots) if mode != "lexical" else []
        lex_rank = self.lexical_ranking(query, pool, roots) if mode != "vector" else []
        fused: dict[int, float] = {}
        v_pos: dict[int, int] = {}
        l_pos: dict[int, int] = {}
        for pos, (cid, _) in enumerate(vec_rank):
            v_pos[cid] = pos + 1
            fused[cid] = fused.get(cid, 0.0) + w.vector / (w.k + pos + 1)
        for pos, (cid, _) in enumerate(lex_rank):
            l_pos[cid] = pos + 1
            fused[cid] = fused.get(cid, 0.0) + w.lexical / (w.k + pos + 1)
        if not fused:
            return []
        if mode == "hybrid" and w.file:
            file_rank = {fid: pos + 1 for pos, (fid, _) in enumerate(self.file_ranking(query, w.file_candidates, roots))}
            if file_rank:
                ids = list(fused)
                rows = self._query(f"SELECT id, file_id FROM chunks WHERE id IN ({','.join('?' * len(ids))})", ids)
                for cid, fid in rows:
                    r = file_rank.get(fid)
                    if r is not None:
                        fused[cid] += w.file / (w.k + r)
        best = sorted(fused, key=lambda c: (-fused[c], c))[:top_k]
        cos = dict(vec_rank)
        missing = [c for c in best if c not in cos]
        cos.update(self._cosines(qvec, missing))
        rows = self._query(
            "SELECT c.id, f.path, c.start_line, c.end_line, c.heading, c.text FROM chunks c "
            f"JOIN files f ON f.id = c.file_id WHERE c.id IN ({','.join('?' * len(best))})",
            best,
        )
        by_id = {r[0]: r for r in rows}
        hits = []
        for cid in best:
            row = by_id.get(cid)
            if row is None:
                raise IndexStoreError(
                    f"the index in {self.index_dir} is damaged (chunk {cid} has no metadata): {_reindex_hint(self.index_dir)}",
                    self.index_dir,
                )
            score = min(1.0, max(0.0, cos.get(cid, 0.0)))
            hits.append(
                Hit(cid, row[1], row[2], row[3], row[4], row[5], round(score, 6), fused[cid], v_pos.get(cid), l_pos.get(cid))
            )
        return hits


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
    gen = _open_generation(index_dir)
    built_with = gen.meta.get("embedder", "unknown")
    if built_with != embedder.name:
        gen.conn.close()
        raise EmbedderMismatchError(
            f"index was built with {built_with}, configured embedder is {embedder.name}: {_REINDEX}", index_dir
        )
    try:
        return IndexReader(gen, embedder, weights)
    except BaseException:
        gen.conn.close()
        raise

