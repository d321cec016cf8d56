"""The PostgreSQL store's schema: numbered migrations, applied in order on first use.

Each migration runs once, in a transaction, and is recorded in ``crag.migrations``; a
later crag appends migrations here and upgrades an older database when it first writes.
The vector index is the one part made outside them, by each update's commit, from the
number of chunks and their dimension (``crag.index.postgres_vectors``).
Both ``crag.index.postgres`` (writing) and ``crag.index.postgres_search`` (reading) use
this module; neither imports the other's internals.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MIGRATIONS", "POSTINGS_INDEXES", "SCHEMA", "SCHEMA_VERSION", "bulk_postings", "postings_of", "vector_literal"]

SCHEMA = "crag"


def vector_literal(vec: Any) -> str:
    """A vector as pgvector's text input: exact for float32 values (nine significant digits)."""
    return "[" + ",".join(f"{x:.9g}" for x in vec.astype("float32").tolist()) + "]"


# The postings of the rows of ``table`` (chunks or files), aliased ``c``: one row per (lexeme,
# row), with the row's length and how many of the lexeme's positions are in its title (A),
# heading (B: chunks only) and text (D). A chunk's come from its ``tsv``. A file's come from
# its chunks' (its title's count, the sum of its chunks' text counts: the chunks are its
# lines, cut without overlap), so that its text is parsed once, by its chunks; a file
# without chunks has none.
_COUNT = "coalesce(cardinality(array_positions(u.weights, '{0}')), 0)"


def postings_of(table: str, where: str = "true") -> str:
    """SQL: the postings of the rows of ``table`` (``chunks`` or ``files``, aliased ``c``) ``where`` selects."""
    if table == "chunks":
        return _chunk_postings(where)
    return (
        f"SELECT u.lexeme, c.id, c.dl, max({_COUNT.format('A')})::smallint AS a, 0::smallint AS b, "
        f"least(sum({_COUNT.format('D')}), 32767)::smallint AS d "
        f"FROM {SCHEMA}.files c JOIN {SCHEMA}.chunks k ON k.file_id = c.id, unnest(k.tsv) AS u "
        f"WHERE {where} GROUP BY u.lexeme, c.id, c.dl"
    )


def _chunk_postings(where: str, file_id: bool = False) -> str:
    return (
        f"SELECT u.lexeme, c.id, {'c.file_id, ' if file_id else ''}c.dl, {_COUNT.format('A')} AS a, "
        f"{_COUNT.format('B')} AS b, {_COUNT.format('D')} AS d FROM {SCHEMA}.chunks c, unnest(c.tsv) AS u WHERE {where}"
    )


def bulk_postings(where: str) -> str:
    """SQL: insert the postings of the chunks ``where`` selects (aliased ``c``) and of their files,
    whose chunks they all are (a bulk load's batch), from one pass over the chunks' tsvectors."""
    return (
        f"WITH u AS MATERIALIZED ({_chunk_postings(where, file_id=True)}), "
        f"p AS (INSERT INTO {SCHEMA}.postings SELECT lexeme, id, dl, a, b, d FROM u) "
        f"INSERT INTO {SCHEMA}.file_postings SELECT u.lexeme, u.file_id, f.dl, max(u.a), 0, least(sum(u.d), 32767) "
        f"FROM u JOIN {SCHEMA}.files f ON f.id = u.file_id GROUP BY u.lexeme, u.file_id, f.dl"
    )


def _postings_of_tsvectors(table: str) -> str:
    """SQL: the postings of every row of ``table`` from its own ``tsv`` (how format 3 filled them:
    a file's ``tsv`` then held its whole text)."""
    return (
        f"SELECT u.lexeme, c.id, c.dl, {_COUNT.format('A')} AS a, {_COUNT.format('B')} AS b, "
        f"{_COUNT.format('D')} AS d FROM {SCHEMA}.{table} c, unnest(c.tsv) AS u"
    )


# The postings' indexes (a first build drops them and creates them once the rows are in).
POSTINGS_INDEXES = (
    f"CREATE INDEX postings_lexeme ON {SCHEMA}.postings (lexeme, chunk_id) INCLUDE (dl, a, b, d)",
    f"CREATE INDEX file_postings_lexeme ON {SCHEMA}.file_postings (lexeme, file_id) INCLUDE (dl, a, b, d)",
)

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
    (
        3,
        "postings and document frequencies of the lexemes of chunks and files, for full-text ranking "
        "without reading tsvectors",
        # A search ranks a lexeme's rows by an index-only scan of (lexeme, id) with the counts
        # BM25 needs, and reads document frequencies from ``terms`` / ``file_terms``; ts_rank
        # over each candidate's tsvector cost 10-20 us a chunk and more a file. Filled here from
        # what is already indexed (an older database is upgraded in place), then kept by every
        # update. The GIN indexes, which nothing searches any more, go. ANALYZE: without
        # statistics the planner deletes a file's postings by scanning them all.
        f"""
        CREATE TABLE {SCHEMA}.postings (
            lexeme text NOT NULL,
            chunk_id bigint NOT NULL,
            dl integer NOT NULL,
            a smallint NOT NULL,
            b smallint NOT NULL,
            d smallint NOT NULL
        );
        CREATE TABLE {SCHEMA}.file_postings (LIKE {SCHEMA}.postings);
        ALTER TABLE {SCHEMA}.file_postings RENAME chunk_id TO file_id;
        INSERT INTO {SCHEMA}.postings {_postings_of_tsvectors("chunks")};
        INSERT INTO {SCHEMA}.file_postings {_postings_of_tsvectors("files")};
        {";".join(POSTINGS_INDEXES)};
        CREATE TABLE {SCHEMA}.terms (lexeme text PRIMARY KEY, df integer NOT NULL);
        CREATE TABLE {SCHEMA}.file_terms (LIKE {SCHEMA}.terms INCLUDING INDEXES);
        INSERT INTO {SCHEMA}.terms SELECT lexeme, count(*) FROM {SCHEMA}.postings GROUP BY lexeme;
        INSERT INTO {SCHEMA}.file_terms SELECT lexeme, count(*) FROM {SCHEMA}.file_postings GROUP BY lexeme;
        DROP INDEX {SCHEMA}.chunks_tsv;
        DROP INDEX {SCHEMA}.files_tsv;
        ANALYZE {SCHEMA}.postings, {SCHEMA}.file_postings, {SCHEMA}.terms, {SCHEMA}.file_terms;
        """,
    ),
    (
        4,
        "vectors stored out of line without compression, and files' tsvector of their title alone",
        # A vector (4 bytes a dimension) does not compress: PostgreSQL tried, for every row
        # written, before storing it as it was. A file's postings now come from its chunks'
        # (``postings_of``), so its tsv holds its title; the rows an older crag wrote keep
        # theirs until their file changes.
        f"""
        ALTER TABLE {SCHEMA}.chunks ALTER COLUMN embedding SET STORAGE EXTERNAL;
        """,
    ),
    (
        5,
        "paths of any length: unique by their md5, looked up by a hash index",
        # A b-tree row holds at most 2,704 bytes, and a path of nested folders with long names
        # can be longer (Linux allows 4,096): its file failed the whole update.
        f"""
        ALTER TABLE {SCHEMA}.files DROP CONSTRAINT IF EXISTS files_path_key;
        CREATE UNIQUE INDEX IF NOT EXISTS files_path_md5 ON {SCHEMA}.files (md5(path));
        CREATE INDEX IF NOT EXISTS files_path ON {SCHEMA}.files USING hash (path);
        ALTER TABLE {SCHEMA}.roots DROP CONSTRAINT IF EXISTS roots_pkey;
        CREATE UNIQUE INDEX IF NOT EXISTS roots_path_md5 ON {SCHEMA}.roots (md5(path));
        """,
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]
