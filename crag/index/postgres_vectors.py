"""The PostgreSQL store's vector index: which one, how many cells, built and replaced.

The index is IVFFlat (pgvector's k-means cells) on cosine distance, an expression index on
``embedding::vector(d)`` (pgvector indexes at most 2,000 dimensions as ``vector``, and up
to 4,000 as ``halfvec`` from 0.7). Each update's commit decides from the number of chunks
(``wanted_lists``), builds a missing index in its own transaction (``build_ivf``; readers
do not wait for it) and records what searches use in ``meta.vectors``: ``ivf:<cells>`` or
``exact``. After the commit the index it replaced (fewer cells, or an older crag's HNSW)
is dropped concurrently. ``crag.index.postgres_search`` reads ``meta.vectors``.
"""

from __future__ import annotations

import math
from typing import Any

from .postgres_schema import SCHEMA

__all__ = [
    "IVF_MIN_CHUNKS",
    "SCAN",
    "build_ivf",
    "drop_others",
    "hnsw_index",
    "ivf_index",
    "ivf_lists",
    "lists_for",
    "probes",
    "settle",
    "vector_index_names",
    "vector_kind",
    "wanted_lists",
]

# Most dimensions pgvector indexes as vector (and, from 0.7, as halfvec).
VECTOR_DIMS = 2000
HALFVEC_DIMS = 4000

# The vector index: IVFFlat (pgvector's k-means cells), by the number of chunks.
#
# Below IVF_MIN_CHUNKS a search compares every vector (exact). Above, the index has
# ``lists_for(n)`` cells, the power of two nearest 4 * sqrt(n) (FAISS's guidance: 4 to 16
# * sqrt(n)), at most MAX_LISTS, and a search reads ``probes(lists, n)`` of them: as many as
# hold about SCAN vectors, at least 16. pgvector compares 1.3 to 2 us a vector of 1,024
# dimensions; at 29k chunks (512 cells) 16 probes found 0.55 of the exact top 50, 72 0.77
# and 144 (8,200 vectors, 10.6 ms) 0.88, the hybrid top 5 0.958, 0.979 and 0.993 of exact.
# Measured on the million chunks of benchmarks/store_scale.py
# (docs/postgresql.md): 4,096 cells and 32 probes read about 8,600 vectors a search, 18 ms,
# and find 0.84 of the exact top 50 (hybrid top 5: 0.981 of its exact-vector result, as the
# embedded store); 2,048 cells and 16 probes read as many for 0.74 (hybrid 0.944); cells on
# inner product (``vector_ip_ops``) found 0.66, 1,024 cells needed 32 probes and 54 ms for
# 0.76, and HNSW (m 16) found 0.32 at ef_search 200 and 0.51 at 800: its graph does not cross
# between clusters of near-identical chunks. The k-means of a build holds a sample of 50 rows
# a cell and a bound per sample and cell in ``maintenance_work_mem`` (about 4.1 GB at 4,096
# cells of 1,024 dimensions, 1.2 GB at 2,048), which ``build_ivf`` raises for its own
# transaction; the build took 398 s at a million chunks (2,048 cells: 153 s). Those figures
# are at 1,024 dimensions, one vector a page; at crag's 1,008 two fit, and the same 34 cells
# take 13.8 ms instead of 21.3 warm (crag.index.hash_embedder).
#
# pgvector 0.7 and later index ``halfvec``: two bytes a dimension, so that four vectors of
# 1,008 dimensions fit a page where two ``vector``s do (half the index, and of what a search
# reads); the stored vectors (8-bit codes) lose nothing to it that matters to ranking.
IVF_MIN_CHUNKS = 5_000
MAX_LISTS = 4096
SCAN = 8192
_MIN_LISTS = 16
_SAMPLE_PER_LIST = 50


def vector_kind(pgvector: tuple[int, ...], dim: int) -> str | None:
    """The type a vector index of ``dim`` dimensions uses (halfvec from pgvector 0.7, else vector),
    or None: exact search."""
    if dim <= HALFVEC_DIMS and pgvector >= (0, 7):
        return "halfvec"
    if dim <= VECTOR_DIMS:
        return "vector"
    return None


def lists_for(n: int) -> int:
    """The number of IVFFlat cells for ``n`` chunks (see above)."""
    ideal = 4 * math.sqrt(max(1, n))
    return max(_MIN_LISTS, min(MAX_LISTS, 2 ** round(math.log2(ideal))))


def probes(lists: int, n: int) -> int:
    """Cells a search reads, of ``lists`` holding ``n`` chunks: about ``SCAN`` vectors' worth, at
    least 16 (all, when fewer)."""
    return min(lists, max(16, math.ceil(SCAN * lists / max(1, n))))


def wanted_lists(n: int, current: int | None) -> int | None:
    """The cells the index should have for ``n`` chunks (None: no index, exact search). An index
    of ``current`` cells is kept while the ideal number (4 * sqrt(n), bounded) stays within a
    factor of two of it, so that a knowledge base near a boundary is not rebuilt by every update."""
    if n < IVF_MIN_CHUNKS:
        return None
    ideal = max(_MIN_LISTS, min(MAX_LISTS, 4 * math.sqrt(n)))
    if current is not None and current / 2 < ideal < current * 2:
        return current
    return lists_for(n)


def ivf_index(kind: str, dim: int, lists: int) -> str:
    """The name of the IVFFlat index of ``dim``-dimensional embeddings as ``kind`` in ``lists`` cells."""
    return f"chunks_embedding_ivf_{kind}_{dim}_{lists}"


def hnsw_index(kind: str, dim: int) -> str:
    """The name of the HNSW index an older crag made (searched until the next update replaces it)."""
    return f"chunks_embedding_hnsw_{kind}_{dim}"


def vector_index_names(conn: Any) -> list[str]:
    """The vector indexes on the chunks (IVFFlat or an older crag's HNSW)."""
    rows = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'chunks' "
        "AND indexname LIKE 'chunks\\_embedding\\_%%' ORDER BY indexname",
        (SCHEMA,),
    ).fetchall()
    return [name for (name,) in rows]


def _build_memory_mb(n: int, lists: int, dim: int) -> int:
    """``maintenance_work_mem`` pgvector's k-means asks for (samples, their bounds, centers), with room."""
    samples = min(n, lists * _SAMPLE_PER_LIST)
    size = samples * (dim * 4 + 16) + samples * lists * 4 + lists * lists * 4 + 4 * lists * (dim * 4 + 16)
    return int(size * 1.1 / 2**20) + 64


def build_ivf(conn: Any, kind: str, dim: int, n: int, lists: int) -> str:
    """Create the IVFFlat index of ``lists`` cells (in ``conn``'s transaction) and return its name."""
    need = _build_memory_mb(n, lists, dim)
    have = conn.execute(
        "SELECT setting::bigint * (CASE unit WHEN '8kB' THEN 8 WHEN 'kB' THEN 1 WHEN 'MB' THEN 1024 ELSE 1 END) / 1024 "
        "FROM pg_settings WHERE name = 'maintenance_work_mem'"
    ).fetchone()[0]
    if need > int(have):
        conn.execute(f"SET LOCAL maintenance_work_mem = '{need}MB'")
    name = ivf_index(kind, dim, lists)
    conn.execute(
        f"CREATE INDEX IF NOT EXISTS {name} ON {SCHEMA}.chunks USING ivfflat "
        f"((embedding::{kind}({dim})) {kind}_cosine_ops) WITH (lists = {lists}) WHERE vector_dims(embedding) = {dim}"
    )
    return name


def ivf_lists(vectors: str | None) -> int | None:
    """The cells of a ``meta.vectors`` value (``ivf:<cells>``), or None."""
    kind, _, lists = (vectors or "").partition(":")
    return int(lists) if kind == "ivf" and lists.isdigit() else None


def settle(conn: Any, pgvector: tuple[int, ...], dim: int, n: int, previous: str, errors: Any) -> tuple[str, str]:
    """Build the index ``n`` chunks call for when it is missing, in ``conn``'s transaction; return
    what searches use (``meta.vectors``) and why a build failed (``meta.vectors_error``, else "").

    A build the server refuses (``errors``: memory, permissions) is undone alone, in a savepoint:
    the update commits, searching with the index it had, else exactly."""
    kind = vector_kind(pgvector, dim)
    current = ivf_lists(previous)
    lists = wanted_lists(n, current) if kind is not None else None
    if kind is None or lists is None:
        return "exact", ""
    try:
        with conn.transaction():
            build_ivf(conn, kind, dim, n, lists)
    except errors as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        kept = current is not None and bool(_built(vector_index_names(conn), dim, current))
        return (f"ivf:{current}" if kept else "exact"), reason
    return f"ivf:{lists}", ""


def drop_others(conn: Any, kind: str | None, dim: int, vectors: str) -> None:
    """Drop the vector indexes other than the one ``vectors`` names (a previous cell count, an older
    crag's HNSW), without blocking searches: DROP INDEX CONCURRENTLY, in autocommit."""
    lists = ivf_lists(vectors)
    names = vector_index_names(conn)
    built = _built(names, dim, lists) if lists is not None else []
    # The index of today's type; else the one of another type searches still use (a build of
    # today's type the server refused after a pgvector upgrade).
    today = [name for name in built if kind is not None and name == ivf_index(kind, dim, lists or 0)]
    keep = (today or built or [None])[0]
    for name in names:
        if name != keep:
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{name}")


def _built(names: list[str], dim: int, lists: int) -> list[str]:
    """The IVFFlat indexes of ``lists`` cells among ``names``, of either type."""
    return [ivf_index(k, dim, lists) for k in ("halfvec", "vector") if ivf_index(k, dim, lists) in names]
