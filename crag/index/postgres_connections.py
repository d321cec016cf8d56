"""One PostgreSQL connection per thread, closed when its thread ends (``PerThread``).

The PostgreSQL store's readers keep a connection per thread: psycopg connections are not
shared between threads, and opening one costs more than a search. A long-running server
(``crag mcp``) runs each call in a worker thread, and worker threads come and go; a
connection held for a thread that has ended would stay open on the database for the life
of the process. So a thread's connection lives in its thread-local storage alone: when the
thread ends, the storage goes and a finalizer closes the connection. ``close`` closes those
of the threads still running; ``connections`` lists them (a benchmark reads their backends'
CPU time).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["LOCK_HELD", "PerThread", "connect_failure"]

_LOGIN_REFUSED = re.compile(r"password authentication failed|authentication failed for user|no password supplied"
                            r"|role \"[^\"]*\" does not exist|no pg_hba\.conf entry", re.I)
_NO_DATABASE = re.compile(r"database \"([^\"]*)\" does not exist", re.I)


def connect_failure(said: str, location: str) -> str:
    """The message of a connection the server at ``location`` refused, or that never reached
    it (``said``: the first line of psycopg's error)."""
    if _LOGIN_REFUSED.search(said):  # the server was reached, and said no to the user or password
        return (f"the PostgreSQL server {location} refused the login: {said}: check the user and "
                "password KB_AGENT_STORE gives (or PGPASSWORD, ~/.pgpass)")
    missing = _NO_DATABASE.search(said)
    if missing:  # reached too: the database named is not on it
        import shlex

        return (f"the PostgreSQL server {location} has no database {missing.group(1)!r}: create it "
                f"(createdb {shlex.quote(missing.group(1))}) or name one it has in KB_AGENT_STORE")
    return f"cannot reach the PostgreSQL server {location}: {said}"


class _Held:
    """A thread's connection; closing it is the holder's finalizer."""

    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        weakref.finalize(self, conn.close)


class PerThread:
    """The calling thread's connection from ``open`` (a new one when it has none, or it was closed)."""

    def __init__(self, open: Callable[[], Any]) -> None:
        self._open = open
        self._local = threading.local()
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        self._lock = threading.Lock()

    def get(self) -> Any:
        held = getattr(self._local, "held", None)
        if held is None or held.conn.closed:
            held = _Held(self._open())
            self._local.held = held
            with self._lock:
                self._held.add(held)
        return held.conn

    def current(self) -> Any:
        """The calling thread's connection, or None (opens nothing)."""
        held = getattr(self._local, "held", None)
        return None if held is None else held.conn

    def connections(self) -> list[Any]:
        """The open connections of the threads still running (each thread's own, at most one)."""
        with self._lock:
            held = list(self._held)
        return [h.conn for h in held if not h.conn.closed]

    def close(self) -> None:
        with self._lock:
            held = list(self._held)
        for h in held:
            try:
                h.conn.close()
            except Exception:
                pass


# Whether an indexer holds crag's advisory lock in this database (a bigint key shows in pg_locks
# as classid 0, objid the key, objsubid 1).
LOCK_HELD = ("SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
             " WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()"
             " AND l.classid = 0 AND l.objid = %s AND l.objsubid = 1)")
