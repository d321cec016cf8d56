"""The PostgreSQL store's schema: numbered migrations, applied in order on first use.

Each migration runs once, in a transaction, and is recorded in ``crag.migrations``; a
later crag appends migrations here and upgrades an older database when it first writes.
The vector index is the one part made outside them (by dimension, once vectors of that
dimension exist): ``hnsw_kind`` says which type it indexes, ``hnsw_index`` names it.
Both ``crag.index.postgres`` (writing) and ``crag.index.postgres_search`` (reading) use
this module; neither imports the other's internals.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MIGRATIONS", "SCHEMA", "SCHEMA_VERSION", "hnsw_index", "hnsw_kind", "vector_literal"]

SCHEMA = "crag"
# Most dimensions pgvector's HNSW indexes on vector (and, from 0.7, on halfvec).
HNSW_VECTOR_DIMS = 2000
HNSW_HALFVEC_DIMS = 4000


def hnsw_kind(pgvector: tuple[int, ...], dim: int) -> str | None:
    """The type an HNSW index of ``dim`` dimensions uses (vector or halfvec), or None: exact search."""
    if dim <= HNSW_VECTOR_DIMS:
        return "vector"
    if dim <= HNSW_HALFVEC_DIMS and pgvector >= (0, 7):
        return "halfvec"
    return None


def hnsw_index(kind: str, dim: int) -> str:
    """The name of the HNSW index of ``dim``-dimensional embeddings as ``kind``."""
    return f"chunks_embedding_hnsw_{kind}_{dim}"


def vector_literal(vec: Any) -> str:
    """A vector as pgvector's text input: exact for float32 values (nine significant digits)."""
    return "[" + ",".join(f"{x:.9g}" for x in vec.astype("float32").tolist()) + "]"


MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "tables for meta, roots, files and chunks, full-text indexes",
        f"""
        CREATE TABLE {SCHEMA}.meta (key text PRIMARY KEY, value text NOT NULL);
        CREATE TABLE {SCHEMA}.roots (path text PRIMARY KEY);
        CREATE TABLE {SCHEMA}.files (
            id bigint PRIMARY KEY,
            path text NOT NULL UNIQUE,
            root text NOT NULL,
            size bigint NOT NULL,
            mtime_ns bigint NOT NULL,
            sha256 text NOT NULL,
            chunks integer NOT NULL,
            dl integer NOT NULL,
            tsv tsvector NOT NULL
        );
        CREATE INDEX files_tsv ON {SCHEMA}.files USING gin (tsv);
        CREATE TABLE {SCHEMA}.chunks (
            id bigint PRIMARY KEY,
            file_id bigint NOT NULL REFERENCES {SCHEMA}.files (id) ON DELETE CASCADE,
            start_line integer NOT NULL,
            end_line integer NOT NULL,
            heading text NOT NULL,
            tokens integer NOT NULL,
            dl integer NOT NULL,
            title text NOT NULL,
            text text NOT NULL,
            embedding vector NOT NULL,
            tsv tsvector GENERATED ALWAYS AS (
                setweight(to_tsvector('english', title), 'A')
                || setweight(to_tsvector('english', heading), 'B')
                || setweight(to_tsvector('english', text), 'D')
            ) STORED
        );
        CREATE INDEX chunks_file ON {SCHEMA}.chunks (file_id);
        CREATE INDEX chunks_tsv ON {SCHEMA}.chunks USING gin (tsv);
        """,
    ),
    (
        2,
        "full-text indexes without a pending list, so that searches stay fast while an index run writes",
        # With fastupdate, new rows' entries wait in a list every search of the index reads
        # in full (up to gin_pending_list_limit, 4 MB by default), and an index run fills it
        # again and again; without it they go into the index as they are written.
        f"""
        ALTER INDEX {SCHEMA}.chunks_tsv SET (fastupdate = off);
        ALTER INDEX {SCHEMA}.files_tsv SET (fastupdate = off);
        """,
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]
