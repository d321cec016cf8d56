"""The answer log's schema: numbered migrations, applied in order on first use and recorded in
``migrations`` (``crag.answer_log`` keeps the log; this module only knows its tables). A later
crag appends a migration; one written is never changed."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "applied", "migrate"]

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "conversations, answers, their citations and their usage by node",
        """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            started REAL NOT NULL,          -- Unix time
            source TEXT NOT NULL            -- ask, chat or mcp
        );
        CREATE TABLE answers (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            time REAL NOT NULL,             -- Unix time the answer was finished
            question TEXT NOT NULL,
            answer TEXT NOT NULL,           -- in full: footer and usage block included
            body TEXT NOT NULL,             -- without footer and usage block
            model TEXT NOT NULL,
            complexity TEXT,
            grader_action TEXT,
            iterations INTEGER NOT NULL,
            llm_calls INTEGER NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            latency_ms REAL NOT NULL,
            settings TEXT NOT NULL          -- JSON: the settings that shaped the answer
        );
        CREATE INDEX answers_conversation ON answers (conversation_id);
        CREATE TABLE citations (
            answer_id INTEGER NOT NULL REFERENCES answers (id) ON DELETE CASCADE,
            n INTEGER NOT NULL,
            path TEXT NOT NULL,
            line INTEGER,
            page INTEGER,
            tool TEXT NOT NULL,
            PRIMARY KEY (answer_id, n)
        );
        CREATE TABLE node_usage (
            answer_id INTEGER NOT NULL REFERENCES answers (id) ON DELETE CASCADE,
            node TEXT NOT NULL,
            calls INTEGER NOT NULL,
            prompt_tokens INTEGER NOT NULL,
            completion_tokens INTEGER NOT NULL,
            cached_tokens INTEGER NOT NULL,
            latency_ms REAL NOT NULL,
            PRIMARY KEY (answer_id, node)
        );
        """,
    ),
    (
        2,
        "the calls of each node whose tokens crag counted itself (the server reported no usable counts)",
        """
        ALTER TABLE node_usage ADD COLUMN estimated_calls INTEGER NOT NULL DEFAULT 0;
        """,
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]


def migrate(db: sqlite3.Connection) -> None:
    """Apply the migrations this file has not had yet, in one transaction that holds the write
    lock from the moment it reads what was applied: another crag opening the same new log
    waits, then finds the tables made (it failed with "table conversations already exists").
    ``migrations`` is made in that transaction too, so a new log that cannot be written (a full
    disk) is left empty, as it was, not holding that table alone."""
    done = applied(db)
    if done and max(done) > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"it was written by a newer crag (schema {max(done)}, this crag knows {SCHEMA_VERSION})")
    if done >= {version for version, _, _ in MIGRATIONS}:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                   "applied REAL NOT NULL)")
        done = applied(db)
        for version, description, sql in MIGRATIONS:
            if version in done:
                continue
            for statement in statements(sql):
                db.execute(statement)
            db.execute("INSERT INTO migrations VALUES (?, ?, ?)", (version, description, time.time()))
        db.execute("COMMIT")
    except BaseException:
        # After a disk error SQLite has rolled back itself: a second ROLLBACK would fail with
        # "no transaction is active" in place of the error that says what went wrong.
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


def applied(db: sqlite3.Connection) -> set[int]:
    """The migrations the log has had (none when it has no ``migrations`` table: reading
    that writes nothing, so an empty file stays empty). A version that is no whole number
    (another program's ``migrations``, a row edited by hand) is an error saying so: compared
    with crag's numbers it was a traceback."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'").fetchone() is None:
        return set()
    done = {v for (v,) in db.execute("SELECT version FROM migrations")}
    if any(not isinstance(version, int) for version in done):
        raise sqlite3.DatabaseError("its migrations table is another program's: a version is not a whole number")
    return done


def statements(sql: str) -> Iterator[str]:
    """The statements of a migration's script, one at a time (``executescript`` would commit
    the transaction that holds the lock)."""
    statement = ""
    for line in sql.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement
            statement = ""
    if statement.strip():
        yield statement
