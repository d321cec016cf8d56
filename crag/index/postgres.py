"""The PostgreSQL store: pgvector and full-text search in one database (a ``Store``).

``KB_AGENT_STORE=postgresql://...`` selects it; psycopg 3 comes with the optional extra
``crag-kb[postgres]``. See docs/postgresql.md for when to use it and how to set a server up.

Tables live in the schema ``crag`` and are created on first use (``MIGRATIONS``, recorded in
``crag.migrations``, so that a later crag can upgrade them)::

    meta     key -> value: embedder, dim, chunker, chunks, version, next ids
    roots    the knowledge-base roots
    files    one row per file version: path, size, mtime, sha256; ``tsv`` of its title
             words (weight A; its postings for the file ranking are its chunks', summed)
    chunks   lines, heading, title, text, ``embedding vector``; ``tsv`` generated from
             title (A), heading (B) and text (D), accents folded as FTS5 folds them
             (``crag.fold_diacritics``), for the chunk ranking

Theory of operation. An indexer holds a session advisory lock (``pg_try_advisory_lock``,
polled until ``lock_timeout``) for the whole update, so indexers serialise; every edit of
one update runs in ONE transaction, committed at the end: a killed indexer's connection
drops, PostgreSQL rolls the transaction back and frees the lock, and the previous state
stays. A first build, which nobody can search before it publishes its version, is a bulk
load written by parallel connections, a transaction a batch (``crag.index.postgres_update``);
until its last transaction publishes the version readers see no index, as before it began. A search runs in one REPEATABLE READ read-only transaction, so the rankings it fuses
come from one committed state; readers never wait for an indexer (no DDL in an update,
except building the vector index at its commit, which readers do not wait for, and
dropping the one it replaces after it, concurrently), but for the rebuild of a damaged
index, which drops and creates crag's tables again in its own transaction (``mend``).

Vector search: ``crag.index.postgres_vectors`` (the index), ``postgres_search`` (searching).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..environment import store_credentials
from ..errors import ConfigError, IndexFormatError, IndexStoreError, IndexUnavailableError
from ..ports import FileRecord, StoreState
from .documents import embedder_mismatch
from .fusion import SearchWeights
from .postgres_connections import (
    LOCK_HELD,
    PerThread,
    bad_value,
    identifier,
    open_connection,
    options_timeout,
    refused_reading,
    sessions_timeout,
)
from .postgres_schema import COLUMNS, MIGRATIONS, SCHEMA, SCHEMA_VERSION, vector_literal
from .postgres_search import PostgresRetriever
from .postgres_update import PostgresUpdate, word_count
from .postgres_vectors import vector_kind

if TYPE_CHECKING:
    from ..ports import Embedder, Retriever

__all__ = ["PostgresStore", "PostgresUpdate", "check_uri", "redact", "vector_kind", "vector_literal", "word_count"]

# The advisory lock every crag indexer of a database takes: "crag" in ASCII.
LOCK_KEY = 0x63726167
# The longest a reader's statement may run (``statement_timeout``, unless the URI or the role
# sets one): a search takes milliseconds, so only a lock another session holds on crag's tables
# (an administrator's VACUUM FULL, an upgrade of the index) or an overloaded server reaches it;
# without it a search waited as long as the lock was held, with nothing on the screen.
READ_TIMEOUT_MS = 120_000


_ENABLE_VECTOR = "CREATE EXTENSION vector;"
_FUNCTIONS = (f"{SCHEMA}.fold_diacritics", f"{SCHEMA}.fts_text")
_FULL_TEXT = ("postings", "terms", "file_postings", "file_terms")  # derived from the chunks: never empty beside them
# meta values readers turn into numbers (the first ones always present in a published state)
_INT_META = ("version", "chunks", "dim", "next_chunk_id", "next_file_id", "text_files")
_FLOAT_META = ("avgdl_chunks", "avgdl_files")
_REQUIRED_META = ("version", "chunks", "dim")
_VERSION = (
    f"SELECT (SELECT max(version) FROM {SCHEMA}.migrations), (SELECT value FROM {SCHEMA}.meta WHERE key = 'version')"
)


def check_uri(uri: str, psycopg: Any) -> None:
    """A URI libpq cannot read (a misspelt parameter, a bad %-escape, an unclosed ``[``), or
    whose sslmode or port it would refuse, is a setting's error, exit status 2, not a server
    that cannot be reached."""
    location = redact(uri)
    try:
        unusable = bad_value(psycopg.conninfo.conninfo_to_dict(uri))
    except psycopg.Error as exc:
        reason = _first_line(exc)
        password = store_credentials(uri)[0]
        if password:
            reason = reason.replace(password, "***")
        raise ConfigError("KB_AGENT_STORE", location, f"a postgresql:// URI that libpq reads ({reason})") from None
    except UnicodeDecodeError:  # libpq decoded ``%FF``; psycopg reads values as UTF-8 (the password too: not shown)
        raise ConfigError(
            "KB_AGENT_STORE", location, "a postgresql:// URI that libpq reads (a %-escape that is not UTF-8 text)"
        ) from None
    if unusable:  # as libpq would say it when connecting (``refused_settings``), said without connecting
        raise ConfigError("KB_AGENT_STORE", location, f"a postgresql:// URI whose settings libpq accepts ({unusable})")


def _psycopg(location: str) -> Any:
    """psycopg, or the setting's error naming the extra (``location`` is the URI without its
    password): a missing extra is exit status 2, as for the MCP server's and the local embedder's."""
    try:
        import psycopg
    except ImportError:
        raise ConfigError(
            "KB_AGENT_STORE",
            location,
            "a store this installation can open: a PostgreSQL one needs psycopg, pip install 'crag-kb[postgres]'",
        ) from None
    # psycopg logs what it ignores while a failed connection is torn down ("error ignored
    # terminating <psycopg.Pipeline [BAD]>: the connection is lost"), and with no logging set
    # up Python prints that on stderr beside crag's own line about the same failure.
    logging.getLogger("psycopg").addHandler(_QUIET)
    return psycopg


_QUIET = logging.NullHandler()


def redact(uri: str) -> str:
    """``uri`` without its password, for messages: the one after the user name and a
    ``password`` query parameter, read as libpq reads them (``store_credentials``)."""
    return store_credentials(uri)[1]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _pg_version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


class PostgresStore:
    """The index in a PostgreSQL database (see the module docstring)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.location = redact(uri)
        self.reindex_hint = f"run `python -m crag index PATH` (with KB_AGENT_STORE={self.location}) to rebuild it"
        self.psycopg = _psycopg(self.location)
        self._check_uri()
        self._users_timeout: str | None = None  # a statement_timeout the URI, PGOPTIONS or the role set
        self._version_conns = PerThread(lambda: self.reading(self.connect(autocommit=True)))

    def __repr__(self) -> str:
        return f"PostgresStore({self.location!r})"

    def _check_uri(self) -> None:
        check_uri(self.uri, self.psycopg)

    # -- connections and the schema ------------------------------------------------------

    def connect(self, autocommit: bool = False) -> Any:
        return open_connection(self.psycopg, self.uri, self.location, autocommit)

    def reading(self, conn: Any) -> Any:
        """``conn`` with ``READ_TIMEOUT_MS`` as its ``statement_timeout``, unless it has one already
        (the user's, remembered for the message of a search it stops: ``error``)."""
        own = conn.execute(
            "SELECT current_setting('statement_timeout') WHERE current_setting('statement_timeout') <> '0'"
        ).fetchone()
        if own is None:
            conn.execute("SELECT set_config('statement_timeout', %s, false)", (str(READ_TIMEOUT_MS),))
        self._users_timeout = own[0] if own else None
        return conn

    def error(self, exc: BaseException, *, writing: bool = False) -> IndexStoreError:
        """``exc`` as one line; ``writing``: it came from an update, so a refused right is the
        role's (a reader's role, docs/postgresql.md, may only read)."""
        reason = _first_line(exc)
        errors = self.psycopg.errors
        if isinstance(exc, errors.QueryCanceled) and not writing:
            # not recorded: stopped before ``reading`` ran (or on a session it never runs on, as ``state``'s)
            users = (self._users_timeout or options_timeout(self.psycopg.conninfo.conninfo_to_dict(self.uri))
                     or sessions_timeout(self.connect, (IndexStoreError, ConfigError, self.psycopg.Error)))
            within = (f"{users} (its statement_timeout, set by KB_AGENT_STORE's options, PGOPTIONS or the role; "
                      if users else f"{READ_TIMEOUT_MS / 1000:g} s (")
            return IndexUnavailableError(
                f"the PostgreSQL server {self.location} did not answer a read of the index within {within}"
                "another session may hold a lock on crag's tables, as an upgrade of the index does, or the server "
                "is overloaded): try again later",
                self.location,
            )
        if isinstance(exc, errors.UndefinedObject) and 'type "vector"' in reason:  # pgvector off the search_path
            return IndexUnavailableError(
                f"the PostgreSQL server {self.location} failed: {reason}: the schema of the vector extension "
                "(pgvector, usually public) is not on this session's search_path; put it there, e.g. "
                "`options=-c%20search_path%3Dpublic` in the query of KB_AGENT_STORE, or check PGOPTIONS and "
                "the role's search_path",
                self.location,
            )
        if isinstance(exc, (errors.UndefinedTable, errors.UndefinedColumn, errors.UndefinedFunction)):
            return self._damaged(reason)  # a table, column or crag's function dropped since it was checked
        if writing and isinstance(exc, errors.QueryCanceled) and "statement timeout" in reason:
            reason += (": a statement_timeout (KB_AGENT_STORE's options, PGOPTIONS or the role's) stopped the update, "
                       "and the index is as it was; run `python -m crag index` without one, e.g. "
                       "`options=-c%20statement_timeout%3D0` in the query of KB_AGENT_STORE")
        elif writing and isinstance(exc, errors.InsufficientPrivilege):
            reason += ": this role may only read; update the index with a role that may write (docs/postgresql.md)"
        elif isinstance(exc, errors.InsufficientPrivilege):  # not even a reader's rights on crag's schema
            reason += refused_reading(self.connect, SCHEMA, (IndexStoreError, ConfigError, self.psycopg.Error))
        return IndexUnavailableError(f"the PostgreSQL server {self.location} failed: {reason}", self.location)

    @contextmanager
    def session(self, autocommit: bool = True) -> Iterator[Any]:
        conn = self.connect(autocommit)
        try:
            yield conn
        except self.psycopg.Error as exc:
            raise self.error(exc) from exc
        finally:
            conn.close()

    def _schema_version(self, conn: Any) -> int | None:
        """The applied migration, or None when crag's tables do not exist."""
        row = conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.migrations",)).fetchone()
        if row[0] is None:
            return None
        return conn.execute(f"SELECT max(version) FROM {SCHEMA}.migrations").fetchone()[0]

    def _damaged(self, what: str) -> IndexStoreError:
        return IndexStoreError(f"the index in {self.location} is damaged ({what}): {self.reindex_hint}", self.location)

    def _damage(self, conn: Any) -> str | None:
        """What is missing from crag's tables, columns and function (``COLUMNS``), or of another
        type, or None: none is (or none of them is there: no index)."""
        rows = conn.execute(
            "SELECT c.relname, a.attname, a.atttypid::regtype::text FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND c.relname = ANY(%s)",
            (SCHEMA, list(COLUMNS)),
        ).fetchall()
        if not rows:
            return None
        found: dict[str, dict[str, str]] = {}
        for table, column, kind in rows:
            found.setdefault(table, {})[column] = kind
        missing = [t for t in COLUMNS if t not in found]
        if missing:
            return f"table {', '.join(f'{SCHEMA}.{t}' for t in missing)} is missing"
        for table, columns in COLUMNS.items():
            gone = [c for c in columns if c not in found[table]]
            if gone:
                return f"column {', '.join(f'{SCHEMA}.{table}.{c}' for c in gone)} is missing"
            for column, kind in columns.items():  # a type changed by hand (the vector type's schema aside)
                if found[table][column].rpartition(".")[2] != kind:
                    return f"column {SCHEMA}.{table}.{column} is of type {found[table][column]}, not {kind}"
        for function in _FUNCTIONS:
            if conn.execute("SELECT to_regprocedure(%s)", (f"{function}(text)",)).fetchone()[0] is None:
                return f"function {function} is missing"
        if conn.execute(f"SELECT NOT EXISTS (SELECT FROM {SCHEMA}.migrations)").fetchone()[0]:
            return f"table {SCHEMA}.migrations is empty"  # emptied by hand: the tables are there
        return None

    @staticmethod
    def _meta_damage(meta: dict[str, str]) -> str | None:
        """The first meta value of a published state that is missing or not a number, or None."""
        for key in (*_INT_META, *_FLOAT_META):
            if key not in meta and key not in _REQUIRED_META:
                continue
            try:
                value = int(meta[key]) if key in _INT_META else float(meta[key])
            except (KeyError, ValueError):
                return f"meta {key} is not a number"
            if not math.isfinite(value) or value < 0:
                return f"meta {key} is not a number"
        return None

    def _check_schema(self, conn: Any) -> bool:
        """True when the schema is current, False when absent; IndexStoreError when older, newer
        or damaged (``_damage``)."""
        version = self._schema_version(conn)
        if not version:
            what = self._damage(conn)  # crag's tables without the record of its migrations
            if what is not None:
                raise self._damaged(what)
            return False
        if version > SCHEMA_VERSION:
            raise IndexFormatError(
                f"the index in {self.location} has format {version}, this crag reads format {SCHEMA_VERSION}: "
                "upgrade crag",
                self.location,
            )
        if version < SCHEMA_VERSION:
            raise IndexStoreError(
                f"the index in {self.location} has format {version}, this crag reads format {SCHEMA_VERSION}: "
                "run `python -m crag index PATH` to upgrade it",
                self.location,
            )
        what = self._damage(conn)
        if what is not None:
            raise self._damaged(what)
        return True

    def migrate(self, conn: Any) -> None:
        """Create or upgrade crag's schema (``conn`` in autocommit; the writer lock held)."""
        version = self._schema_version(conn)
        if version is not None and version > SCHEMA_VERSION:
            self._check_schema(conn)  # a newer crag's: refused
        if version == SCHEMA_VERSION or (version is None and self._damage(conn) is not None):
            return  # current, or damaged: the update finds the damage and creates the schema again (``begin``)
        ext = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        if ext is None:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except self.psycopg.Error as exc:
                raise IndexStoreError(
                    f"the PostgreSQL server {self.location} lacks the vector extension (pgvector) and crag may not "
                    f"enable it ({_first_line(exc)}): as a superuser, run `{_ENABLE_VECTOR}` in that database",
                    self.location,
                ) from exc
        schema, found = conn.execute(
            "SELECT n.nspname, to_regtype('vector') FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = 'vector'"
        ).fetchone()
        if found is None:  # an administrator put pgvector in a schema of its own
            raise IndexStoreError(
                f"the PostgreSQL server {self.location} has the vector extension (pgvector) in schema {schema}, "
                f"which is not on the role's search_path: add `options=-c%20search_path%3Dpublic,{schema}` to "
                f"the query of KB_AGENT_STORE, or run `ALTER ROLE ... SET search_path = public, {schema};`",
                self.location,
            )
        database, role = conn.execute("SELECT current_database(), current_user").fetchone()  # for a refusal
        with conn.transaction():
            try:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            except self.psycopg.errors.InsufficientPrivilege as exc:
                if version is not None:  # the schema is there: it is the upgrade this role may not make
                    raise self._refused_upgrade(version, role, exc) from exc
                raise IndexStoreError(
                    f"the PostgreSQL server {self.location} failed: {_first_line(exc)}: crag creates its schema "
                    f"\"{SCHEMA}\" on first use; as the database's owner, run `GRANT CONNECT, CREATE ON DATABASE "
                    f"{identifier(database)} TO {identifier(role)};` (docs/postgresql.md)",
                    self.location,
                ) from exc
            try:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.migrations (version integer PRIMARY KEY, "
                    "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                done = conn.execute(f"SELECT coalesce(max(version), 0) FROM {SCHEMA}.migrations").fetchone()[0]
                for number, description, sql in MIGRATIONS:
                    if number <= done:
                        continue
                    conn.execute(sql)
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.migrations (version, description) VALUES (%s, %s)", (number, description)
                    )
            except self.psycopg.errors.InsufficientPrivilege as exc:
                if version is None:
                    raise
                raise self._refused_upgrade(version, role, exc) from exc

    def _refused_upgrade(self, version: int, role: str, exc: BaseException) -> IndexStoreError:
        """An older format that ``role`` may not upgrade (it does not own crag's schema and
        tables): which role may, the schema's owner, read on a fresh connection (the migrating
        one is in a failed transaction)."""
        try:
            with self.session() as other:
                row = other.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s",
                                    (SCHEMA,)).fetchone()
        except IndexStoreError:
            row = None
        owner = f"as {row[0]}, the role that owns schema {SCHEMA}" if row else f"as the role that owns schema {SCHEMA}"
        return IndexStoreError(
            f"the index in {self.location} has format {version}, this crag reads format {SCHEMA_VERSION}, and role "
            f"{role} may not upgrade it ({_first_line(exc)}): run `python -m crag index PATH` once {owner} "
            "(docs/postgresql.md)",
            self.location,
        )

    def pgvector_version(self, conn: Any) -> tuple[int, ...]:
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        return _pg_version_tuple(row[0]) if row else ()

    # -- reading ---------------------------------------------------------------------------

    def meta(self, conn: Any) -> dict[str, str]:
        return dict(conn.execute(f"SELECT key, value FROM {SCHEMA}.meta").fetchall())

    def version(self) -> str | None:
        """Which state is published (None: no index, or one this crag does not read). An agent
        asks before every search, so this is one statement on a connection kept for it (a new
        connection cost more than the rest of a search); a broken one is replaced once."""
        for _ in range(2):
            conn = None
            try:
                conn = self._version_conns.get()
                migrations, version = conn.execute(_VERSION).fetchone()
            except IndexStoreError:
                return None
            except self.psycopg.errors.UndefinedTable:
                return None
            except self.psycopg.Error:
                if conn is not None:
                    conn.close()
                continue
            return version if migrations == SCHEMA_VERSION else None
        return None

    def state(self, files: bool = True, check: bool = False) -> StoreState | None:
        """The published state (None: no index); damage is an ``IndexStoreError``. ``check`` (an
        update's): the chunk rows are counted too, against their files' and meta's counts."""
        errors = self.psycopg.errors
        with self.session(autocommit=False) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            # First, before the snapshot: a rebuild of a damaged index (``mend``) holds crag's tables until it
            # commits, and a snapshot taken before that saw the tables it made empty (none, or not this role's: below)
            with suppress(errors.UndefinedTable, errors.InvalidSchemaName, errors.InsufficientPrivilege), conn.transaction():
                conn.execute(f"LOCK TABLE {SCHEMA}.meta IN ACCESS SHARE MODE")
            return self._state(conn, files, check)

    def _state(self, conn: Any, files: bool, check: bool = False) -> StoreState | None:
        if not self._check_schema(conn):
            return None
        meta = self.meta(conn)
        if "version" not in meta:
            return None
        what = self._meta_damage(meta)
        if what is None and check:
            rows, listed = conn.execute(
                f"SELECT (SELECT count(*) FROM {SCHEMA}.chunks), (SELECT coalesce(sum(chunks), 0) FROM {SCHEMA}.files)"
            ).fetchone()
            if not rows == listed == int(meta["chunks"]):
                what = f"{rows} chunk rows, {listed} listed by its files, {meta['chunks']} recorded"
        if what is None:  # the full-text tables emptied by hand (TRUNCATE) while chunks have words
            found = conn.execute(
                "SELECT " + ", ".join(f"EXISTS (SELECT FROM {SCHEMA}.{t})" for t in _FULL_TEXT)
                + f", EXISTS (SELECT FROM {SCHEMA}.chunks WHERE length(tsv) > 0)"
            ).fetchone()
            if found[-1]:
                what = next((f"table {SCHEMA}.{t} is empty" for t, there in zip(_FULL_TEXT, found) if not there), None)
        if what is not None:
            raise self._damaged(what)
        roots = tuple(r for (r,) in conn.execute(f"SELECT path FROM {SCHEMA}.roots ORDER BY path"))
        records = {}
        if files:
            records = {
                p: FileRecord(p, s, m, h, c)
                for p, s, m, h, c in conn.execute(f"SELECT path, size, mtime_ns, sha256, chunks FROM {SCHEMA}.files")
            }
        return StoreState(
            meta["version"],
            meta.get("embedder", "unknown"),
            int(meta.get("dim", "0")),
            meta.get("chunker", ""),
            int(meta.get("chunks", "0")),
            roots,
            MappingProxyType(records),
        )

    def roots(self, salvage: bool = False) -> tuple[str, ...]:
        if salvage:  # the roots table alone: the damage that sends a rebuild here may be anywhere else
            try:
                with self.connect(autocommit=True) as conn:
                    return tuple(r for (r,) in conn.execute(f"SELECT path FROM {SCHEMA}.roots ORDER BY path"))
            except (IndexStoreError, self.psycopg.Error):
                return ()
        state = self.state(files=False)
        if state is None:
            raise self._no_index()
        return state.roots

    def building(self) -> bool:
        try:
            with self.connect(autocommit=True) as conn:
                return bool(conn.execute(LOCK_HELD, (LOCK_KEY,)).fetchone()[0])
        except (IndexStoreError, self.psycopg.Error):
            return False

    def _no_index(self) -> IndexStoreError:
        """"No index" as the embedded store says it: "yet" while an indexer holds the lock."""
        if self.building():
            return IndexStoreError(f"no index in {self.location} yet: a crag index is building it now; "
                                   "try again when it has finished", self.location)
        return IndexStoreError(f"no index in {self.location}: run `python -m crag index PATH` first", self.location)

    def open_retriever(self, embedder: Embedder, weights: SearchWeights | None = None) -> Retriever:
        state = self.state(files=False)
        if state is None:
            raise self._no_index()
        if state.embedder != embedder.name:
            raise embedder_mismatch(state.embedder, embedder.name, state.roots, self.location)
        return PostgresRetriever(self, state, embedder, weights or SearchWeights())

    # -- writing ---------------------------------------------------------------------------

    @contextmanager
    def writer_lock(self, timeout: float, waiting: Callable[[], None] | None = None) -> Iterator[object]:
        """The database's crag advisory lock, polled for up to ``timeout`` seconds (``waiting``
        called once when another indexer holds it)."""
        conn = self.connect(autocommit=True)
        try:
            deadline = time.monotonic() + timeout
            while not conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0]:
                if waiting is not None:
                    waiting()
                    waiting = None  # once
                if time.monotonic() >= deadline:
                    raise IndexStoreError(
                        f"another crag index is running on {self.location} (waited {timeout:g}s): "
                        "try again when it has finished",
                        self.location,
                    )
                time.sleep(0.05)
            self.migrate(conn)
            yield conn
        except self.psycopg.Error as exc:
            raise self.error(exc) from exc
        finally:
            conn.close()  # ends the session: the advisory lock goes with it

    def begin(self, base: StoreState | None, embedder: Embedder, chunker: str) -> PostgresUpdate:
        return PostgresUpdate(self, base, embedder, chunker)

    def mend(self, conn: Any) -> bool:
        """Before an update from nothing (the writer lock held; ``conn``, the update's, in its
        transaction): a damaged schema (``_damage``, or meta values that are not numbers) is
        dropped, crag's objects alone, and created again, uncommitted: a rebuild that fails
        leaves the damaged index as it was, roots and all. True when it was damaged."""
        damaged = self._damage(conn) is not None
        if not damaged and self._schema_version(conn) == SCHEMA_VERSION:
            meta = self.meta(conn)
            damaged = "version" in meta and self._meta_damage(meta) is not None
        if damaged:
            conn.execute(f"DROP TABLE IF EXISTS {', '.join(f'{SCHEMA}.{t}' for t in COLUMNS)} CASCADE")
            for function in _FUNCTIONS:
                conn.execute(f"DROP FUNCTION IF EXISTS {function}(text) CASCADE")
            self.migrate(conn)
        return damaged

    def close(self) -> None:
        self._version_conns.close()
