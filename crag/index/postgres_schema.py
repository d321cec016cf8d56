"""The PostgreSQL store's schema: numbered migrations, applied in order on first use.

Each migration runs once, in a transaction, and is recorded in ``crag.migrations``; a
later crag appends migrations here and upgrades an older database when it first writes.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA", "SCHEMA_VERSION"]

SCHEMA = "crag"

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
)
SCHEMA_VERSION = MIGRATIONS[-1][0]
