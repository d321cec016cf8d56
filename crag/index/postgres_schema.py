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

from ..text import DIACRITICS

__all__ = [
    "COLUMNS", "MIGRATIONS", "POSTINGS_INDEXES", "SCHEMA", "SCHEMA_VERSION", "bulk_postings", "fold", "postings_of",
    "vector_literal", "words",
]

SCHEMA = "crag"


# translate() looks each character up in its list, in order, until found: ASCII first, the
# most frequent first, each to itself, so that a text's plain characters are found in a few
# steps (then the letters with diacritics, then the marks, which map to nothing and are
# dropped). And a text without any of them (most) is returned as it is after one regular
# expression's scan.
_PLAIN = " etaoinsrhldcumfpgwybvkxjqzETAOINSRHLDCUMFPGWYBVKXJQZ\n0123456789.,-_:;()/\"[]`*#=<>{}!?@&%+|~$^\t\r"
_FOLDED = "".join(chars for target, chars in DIACRITICS.items() if target)
_DROPPED = DIACRITICS[""]
_FROM = _PLAIN + _FOLDED + _DROPPED
_TO = _PLAIN + "".join(target * len(chars) for target, chars in DIACRITICS.items() if target)


def fold(sql: str) -> str:
    """SQL: the text ``sql`` with its diacritics folded as FTS5 folds them (``DIACRITICS``)."""
    return f"{SCHEMA}.fold_diacritics({sql})"


def words(sql: str) -> str:
    """SQL: the text ``sql`` folded, its ASCII punctuation turned into spaces: the words FTS5 sees."""
    return f"{SCHEMA}.fts_text({sql})"


def _folded_tsvector(column: str, weight: str) -> str:
    """How format 6 parsed a column (PostgreSQL kept ``HTTP/3`` or a path as one word)."""
    return f"setweight(to_tsvector('english', {fold(column)}), '{weight}')"


def _tsvector(column: str, weight: str) -> str:
    return f"setweight(to_tsvector('english', {words(column)}), '{weight}')"


# IMMUTABLE (it is a generated column's), and plain SQL: nothing to install, no extension to
# create. Not STRICT (a NULL gives NULL all the same): PostgreSQL inlines a SQL function's
# body into the expression that calls it only when the body is as strict as the function, and
# a CASE is not; called instead of inlined, it made parsing text into tsvectors a third dearer.
# The ASCII of ``_PLAIN`` holds no quote or backslash, so the literals need no escapes.
_FOLD_FUNCTION = f"""
        CREATE OR REPLACE FUNCTION {SCHEMA}.fold_diacritics(text) RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $fold$SELECT CASE WHEN $1 ~ '[{_FOLDED}{_DROPPED}]' THEN translate($1, '{_FROM}', '{_TO}') ELSE $1 END$fold$;
"""

# FTS5 (``unicode61``) ends a word at every ASCII punctuation mark; PostgreSQL's parser keeps
# ``HTTP/3``, ``v1.2.3``, ``docs/setup.md``, ``api.example.com`` and e-mail addresses as one
# word each, which no query word (``documents.query_terms``: letters and digits) can match. So
# the texts PostgreSQL parses have their punctuation turned into spaces first, as FTS5 sees them.
_PUNCTUATION = "!\"#$%&''()*+,-./:;<=>?@[\\]^_`{|}~"
_WORDS_FUNCTION = f"""
        CREATE OR REPLACE FUNCTION {SCHEMA}.fts_text(text) RETURNS text
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $words$SELECT translate({SCHEMA}.fold_diacritics($1), '{_PUNCTUATION}', '{" " * 32}')$words$;
"""


# The rewrite of a table builds its indexes again, the vector index too (pgvector's k-means),
# which fails when ``maintenance_work_mem`` is below what it needs ("memory required is 133
# MB", at 512 cells): raised for the migration's transaction as ``postgres_vectors.build_ivf``
# raises it (the same estimate, ``_build_memory_mb``, from ``meta.vectors``, ``meta.dim`` and
# the number of chunks); never lowered.
_REBUILD_MEMORY = f"""
        SELECT set_config('maintenance_work_mem', need || 'MB', true) FROM (
            SELECT (1.1 * (s.samples * (d.dim * 4 + 16) + s.samples * v.lists * 4 + v.lists * v.lists * 4
                           + 4 * v.lists * (d.dim * 4 + 16)) / 1048576)::bigint + 64 AS need
            FROM (SELECT split_part(value, ':', 2)::bigint AS lists FROM {SCHEMA}.meta
                  WHERE key = 'vectors' AND value ~ '^ivf:[0-9]+$') AS v,
                 (SELECT value::bigint AS dim FROM {SCHEMA}.meta WHERE key = 'dim') AS d,
                 LATERAL (SELECT least(count(*), v.lists * 50) AS samples FROM {SCHEMA}.chunks) AS s
        ) AS m WHERE need > (SELECT setting::bigint * (CASE unit WHEN '8kB' THEN 8 WHEN 'kB' THEN 1
                                    WHEN 'MB' THEN 1024 ELSE 1 END) / 1024
                             FROM pg_settings WHERE name = 'maintenance_work_mem');"""


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


# What crag's tables must hold for a search or an update to work, each column with its type
# (``PostgresStore._damage``): a table, a column or a function missing (dropped by hand, or
# with the vector extension), or a column's type changed, is damage, which ``crag index``
# mends by creating the schema again and indexing from the documents.
_KEYED = {"lexeme": "text", "df": "integer"}
_POSTED = {"dl": "integer", "a": "smallint", "b": "smallint", "d": "smallint"}
COLUMNS: dict[str, dict[str, str]] = {
    "migrations": {"version": "integer"},
    "meta": {"key": "text", "value": "text"},
    "roots": {"path": "text"},
    "files": {"id": "bigint", "path": "text", "root": "text", "size": "bigint", "mtime_ns": "bigint",
              "sha256": "text", "chunks": "integer", "dl": "integer", "tsv": "tsvector"},
    "chunks": {"id": "bigint", "file_id": "bigint", "start_line": "integer", "end_line": "integer",
               "heading": "text", "tokens": "integer", "dl": "integer", "title": "text", "text": "text",
               "embedding": "vector", "tsv": "tsvector"},
    "postings": {"lexeme": "text", "chunk_id": "bigint", **_POSTED},
    "file_postings": {"lexeme": "text", "file_id": "bigint", **_POSTED},
    "terms": _KEYED,
    "file_terms": _KEYED,
}

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
    (
        6,
        "words folded as the embedded store folds them: café is cafe",
        # The chunks' tsv is generated again from the folded texts (PostgreSQL rewrites the
        # table: it cannot change a generated column's expression in place before 17), and
        # the postings of the chunks whose texts have a diacritic FTS5 folds, and of their
        # files, are written again, with the document frequencies they change (as an update
        # does: ``crag_df``); the others' are the same. The texts are stored as written.
        _FOLD_FUNCTION
        + f"""
        CREATE TEMPORARY TABLE crag_refold ON COMMIT DROP AS SELECT id, file_id FROM {SCHEMA}.chunks
            WHERE {fold("title")} <> title OR {fold("heading")} <> heading OR {fold("text")} <> text;
        CREATE TEMPORARY TABLE crag_refold_df (tab text NOT NULL, lexeme text NOT NULL, n integer NOT NULL)
            ON COMMIT DROP;
        WITH gone AS (SELECT u.lexeme, c.id FROM {SCHEMA}.chunks c, unnest(c.tsv) AS u
                      WHERE c.id IN (SELECT id FROM crag_refold)),
             d AS (DELETE FROM {SCHEMA}.postings p USING gone
                   WHERE p.lexeme = gone.lexeme AND p.chunk_id = gone.id RETURNING p.lexeme)
        INSERT INTO crag_refold_df SELECT 'terms', lexeme, -count(*) FROM d GROUP BY lexeme;
        WITH gone AS (SELECT u.lexeme, c.file_id AS id FROM {SCHEMA}.chunks c, unnest(c.tsv) AS u
                      WHERE c.file_id IN (SELECT file_id FROM crag_refold)
                      UNION SELECT u.lexeme, f.id FROM {SCHEMA}.files f, unnest(f.tsv) AS u
                      WHERE f.id IN (SELECT file_id FROM crag_refold)),
             d AS (DELETE FROM {SCHEMA}.file_postings p USING gone
                   WHERE p.lexeme = gone.lexeme AND p.file_id = gone.id RETURNING p.lexeme)
        INSERT INTO crag_refold_df SELECT 'file_terms', lexeme, -count(*) FROM d GROUP BY lexeme;
        {_REBUILD_MEMORY}
        ALTER TABLE {SCHEMA}.chunks DROP COLUMN tsv;
        ALTER TABLE {SCHEMA}.chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
            {_folded_tsvector("title", "A")} || {_folded_tsvector("heading", "B")} || {_folded_tsvector("text", "D")}
        ) STORED;
        UPDATE {SCHEMA}.files f SET tsv = {_folded_tsvector("k.title", "A")}
            FROM (SELECT DISTINCT ON (file_id) file_id, title FROM {SCHEMA}.chunks
                  WHERE file_id IN (SELECT file_id FROM crag_refold)) AS k
            WHERE f.id = k.file_id;
        WITH p AS (INSERT INTO {SCHEMA}.postings {postings_of("chunks", "c.id IN (SELECT id FROM crag_refold)")}
                   RETURNING lexeme)
        INSERT INTO crag_refold_df SELECT 'terms', lexeme, count(*) FROM p GROUP BY lexeme;
        WITH p AS (INSERT INTO {SCHEMA}.file_postings
                   {postings_of("files", "c.id IN (SELECT file_id FROM crag_refold)")} RETURNING lexeme)
        INSERT INTO crag_refold_df SELECT 'file_terms', lexeme, count(*) FROM p GROUP BY lexeme;
        INSERT INTO {SCHEMA}.terms SELECT lexeme, sum(n) FROM crag_refold_df WHERE tab = 'terms' GROUP BY lexeme
            ON CONFLICT (lexeme) DO UPDATE SET df = terms.df + excluded.df;
        INSERT INTO {SCHEMA}.file_terms SELECT lexeme, sum(n) FROM crag_refold_df WHERE tab = 'file_terms'
            GROUP BY lexeme ON CONFLICT (lexeme) DO UPDATE SET df = file_terms.df + excluded.df;
        DELETE FROM {SCHEMA}.terms WHERE df <= 0;
        DELETE FROM {SCHEMA}.file_terms WHERE df <= 0;
        """,
    ),
    (
        7,
        "paths, hosts, versions and e-mail addresses split into words as the embedded store splits them",
        # Every chunk's tsv is generated again (nearly every text holds punctuation), and the
        # postings and document frequencies are derived again from it; the postings of a file
        # without chunks (its title, from its own tsv) stay until the file changes, as before.
        _WORDS_FUNCTION
        + f"""
        {_REBUILD_MEMORY}
        ALTER TABLE {SCHEMA}.chunks DROP COLUMN tsv;
        ALTER TABLE {SCHEMA}.chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
            {_tsvector("title", "A")} || {_tsvector("heading", "B")} || {_tsvector("text", "D")}
        ) STORED;
        UPDATE {SCHEMA}.files f SET tsv = {_tsvector("k.title", "A")}
            FROM (SELECT DISTINCT ON (file_id) file_id, title FROM {SCHEMA}.chunks) AS k WHERE f.id = k.file_id;
        TRUNCATE {SCHEMA}.postings, {SCHEMA}.terms, {SCHEMA}.file_terms;
        DELETE FROM {SCHEMA}.file_postings WHERE file_id IN (SELECT file_id FROM {SCHEMA}.chunks);
        INSERT INTO {SCHEMA}.postings {postings_of("chunks")};
        INSERT INTO {SCHEMA}.file_postings {postings_of("files")};
        INSERT INTO {SCHEMA}.terms SELECT lexeme, count(*) FROM {SCHEMA}.postings GROUP BY lexeme;
        INSERT INTO {SCHEMA}.file_terms SELECT lexeme, count(*) FROM {SCHEMA}.file_postings GROUP BY lexeme;
        ANALYZE {SCHEMA}.postings, {SCHEMA}.file_postings, {SCHEMA}.terms, {SCHEMA}.file_terms;
        """,
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]
