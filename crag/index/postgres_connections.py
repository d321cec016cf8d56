"""One PostgreSQL connection per thread, closed when its thread ends (``PerThread``).

The PostgreSQL store's readers keep a connection per thread: psycopg connections are not
shared between threads, and opening one costs more than a search. A long-running server
(``crag mcp``) runs each call in a worker thread, and worker threads come and go; a
connection held for a thread that has ended would stay open on the database for the life
of the process. So a thread's connection lives in its thread-local storage alone: when the
thread ends, the storage goes and a finalizer closes the connection. ``close`` closes those
of the threads still running; ``connections`` lists them (a benchmark reads their backends'
CPU time). A process forked from one holding connections leaves them to its parent and opens
its own (``_forked``): two processes on one connection read each other's results.

``open_connection`` opens each (the store's ``connect``), into a UTF8 database only
(``utf8_database``), and says what a connection that failed says: a server not reached, a
login, database or connection refused (``connect_failure``; of several hosts, the one whose
server refused: ``failure_said``), a setting libpq or the server refused
(``refused_settings``, and ``bad_value`` without connecting).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError, CragError, IndexStoreError, IndexUnavailableError
from ..llm.lease import fork_safe

__all__ = ["LOCK_HELD", "PerThread", "bad_value", "connect_failure", "failure_said", "identifier", "open_connection",
           "options_timeout", "refused_reading", "refused_settings", "utf8_database"]

_LOGIN_REFUSED = re.compile(r"password authentication failed|authentication failed for user|no password supplied"
                            r"|role \"[^\"]*\" does not exist|no pg_hba\.conf entry", re.I)
_NO_DATABASE = re.compile(r"database \"([^\"]*)\" does not exist", re.I)
_NO_CONNECT = re.compile(r"permission denied for database \"([^\"]*)\"", re.I)
# psycopg's error after trying each host of the URI: the last host's failure on its first line,
# then every host's, each on a line "- host: '...', port: '...', hostaddr: '...': <its error>" (each
# value as Python's repr: hostaddr None for a Unix socket)
_EACH_HOST = re.compile(r"""^- host: .*?, hostaddr: (?:None|'[^']*'|"[^"]*"): (.*)$""", re.M)


def identifier(name: str) -> str:
    """``name`` as SQL would need it written: quoted unless a plain lower-case identifier."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else '"' + name.replace('"', '""') + '"'


def failure_said(error: str) -> str:
    """The line of psycopg's ``error`` (a connection that failed) to report: its first line; when
    the URI named several hosts, the first failure of a server that was reached and refused (a
    password, a database, options: what the user must fix), rather than the last host's, which
    is on the first line (a host that is down, "Connection refused")."""
    lines = error.strip().splitlines()
    first = lines[0] if lines else ""
    refused = [said for said in _EACH_HOST.findall(error) if _refused(said)]
    return refused[0] if refused and not _refused(first) else first


def _refused(said: str) -> bool:
    """Whether a server was reached and refused the connection (or libpq had no password to give it)."""
    return "FATAL:" in said or bool(_LOGIN_REFUSED.search(said))


def _role(params: Mapping[str, Any]) -> str:
    """The role libpq logs in as: the URI's user, else PGUSER's, else the operating system's user."""
    user = params.get("user") or os.environ.get("PGUSER")
    if not user:
        import getpass

        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid
            user = "ROLE"
    return str(user)


def connect_failure(said: str, location: str, params: Mapping[str, Any] | None = None) -> str:
    """The message of a connection the server at ``location`` refused, or that never reached
    it (``said``: the line of psycopg's error, ``failure_said``; ``params``: the URI's, as libpq
    reads them)."""
    if _LOGIN_REFUSED.search(said):  # the server was reached, and said no to the user or password
        return (f"the PostgreSQL server {location} refused the login: {said}: check the user and "
                "password KB_AGENT_STORE gives (or PGPASSWORD, ~/.pgpass)")
    missing = _NO_DATABASE.search(said)
    if missing:  # reached too: the database named is not on it
        import shlex

        return (f"the PostgreSQL server {location} has no database {missing.group(1)!r}: create it "
                f"(createdb {shlex.quote(missing.group(1))}) or name one it has in KB_AGENT_STORE")
    denied = _NO_CONNECT.search(said)
    if denied:  # reached: the role may not connect to that database
        grant = f"GRANT CONNECT ON DATABASE {identifier(denied.group(1))} TO {identifier(_role(params or {}))};"
        return (f"the PostgreSQL server {location} refused the connection: {said}: as the database's owner, run "
                f"`{grant}` (docs/postgresql.md)")
    return f"cannot reach the PostgreSQL server {location}: {said}"


def refused_reading(connect: Callable[[], Any], schema: str, errors: tuple[type[BaseException], ...]) -> str:
    """What to add to a right refused to a session that reads crag's schema (a role no one
    granted it, docs/postgresql.md): the grants that let it search, for the schema's owner to
    run. The role and the owner are read on a connection of their own (``connect``; the refused
    one may be in a failed transaction), best effort: ``errors`` leave them unnamed."""
    role, owner = None, None
    try:
        with connect() as conn:
            role, owner = conn.execute(
                "SELECT current_user, (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s)", (schema,)
            ).fetchone()
    except errors:
        pass
    who = identifier(role) if role else "ROLE"
    as_owner = f"as {owner}, the role that owns schema {schema}" if owner else f"as the role that owns schema {schema}"
    return (f": role {who if role else 'of KB_AGENT_STORE'} may not read crag's index; {as_owner}, run `GRANT USAGE ON SCHEMA "
            f"{schema} TO {who}; GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {who};` for it to search, or "
            "update the index as that role (docs/postgresql.md)")


# libpq refusing a value before it connects, and the parameter it names (psycopg's wording:
# "connection is bad: invalid sslmode value: ...", "... invalid port number: ...").
_BAD_VALUE = re.compile(r'invalid "?(?P<name>\w+)"? value: "|invalid integer value "[^"]*" for connection option '
                        r'"(?P<option>\w+)"|invalid (?P<port>port) number|could not match \d+ (?P<ports>port) numbers'
                        r'|could not match \d+ host names to \d+ (?P<hostaddr>hostaddr) values'
                        r'|weak (?P<sslmode>sslmode) "|could not parse network address (?P<address>)')
# A server that was reached and refused the session's options (``options=-c ...``, PGOPTIONS).
_OPTIONS_REFUSED = re.compile(r"FATAL:\s+(?P<why>(?:unrecognized configuration parameter|invalid value for parameter"
                              r"|parameter \"[^\"]*\" cannot be changed|permission denied to set parameter"
                              r"|invalid command-line argument for server process).*)")
_FAILED_AT = re.compile(r'^(?:connection is bad: )?(?:connection to server (?:at|on) .*? failed: )?')
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_SPACE = " \t\n\v\f\r"  # C's isspace, which libpq skips around a number


def bad_value(params: Mapping[str, Any]) -> str | None:
    """libpq's words for a value of the URI's (``params``, as libpq reads them) it would refuse
    before connecting, found without connecting: an sslmode it does not know, a port that is
    not one (a list of ports, one a host, is left to libpq); None when neither is."""
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in _SSLMODES:
        return f'invalid sslmode value: "{sslmode}"'
    port = str(params.get("port") or "")
    if port and "," not in port:
        value = port.lstrip(_SPACE)
        if not re.fullmatch(f"[+-]?[0-9]+[{_SPACE}]*", value) or not -(2**31) <= int(value) < 2**31:
            return f'invalid integer value "{value}" for connection option "port"'
        if not 1 <= int(value) <= 65535:
            return f'invalid port number: "{port}"'
    return None


def refused_settings(said: str, params: Mapping[str, Any], location: str) -> CragError | None:
    """The error of a setting libpq refused before connecting (a value it cannot read, as
    ``sslmode=bogus`` or port ``abc``), or of options the server refused (an unrecognized
    configuration parameter): KB_AGENT_STORE's, or the ``PG...`` variable's that set it when the
    URI does not (``params``: the URI's, as libpq reads them); None for any other failure."""
    bad = _BAD_VALUE.search(said)
    refused = None if bad else _OPTIONS_REFUSED.search(said)
    if bad:
        name = "hostaddr" if bad["address"] is not None else next(v for v in bad.groupdict().values() if v)
        reason = _FAILED_AT.sub("", said)
        accepts = f"settings libpq accepts ({reason})"
    elif refused:
        name, reason = "options", refused["why"].strip()
        accepts = f"options the server accepts (it refused them: {reason})"
    else:
        return None
    password = str(params.get("password") or "")
    if password:
        accepts = accepts.replace(password, "***")
    variable = "PG" + name.replace("_", "").upper()
    if name not in params and os.environ.get(variable):  # libpq took it from the environment
        return ConfigError(variable, os.environ[variable], accepts.replace("settings", "a value", 1))
    if name not in params and refused:  # the role's settings: not a setting of crag's
        return IndexStoreError(f"the PostgreSQL server {location} refused the session's options: {reason}", location)
    return ConfigError("KB_AGENT_STORE", location, f"a postgresql:// URI whose {accepts}")


def open_connection(psycopg: Any, uri: str, location: str, autocommit: bool) -> Any:
    """A new connection to the database of ``uri`` (``location``: the URI without its password),
    or the error of one that failed, as one line (``connect_failure``, ``refused_settings``)."""
    try:
        # No server-side prepared statements, so that PgBouncer's transaction pooling works.
        # UTF-8 whatever the URI's client_encoding or PGCLIENTENCODING say (documents hold any text),
        # into a database that keeps UTF-8 (``utf8_database``).
        return utf8_database(psycopg.connect(uri, autocommit=autocommit, connect_timeout=10, prepare_threshold=None,
                                             client_encoding="UTF8"), location)
    except psycopg.Error as exc:
        said, params = failure_said(str(exc)) or type(exc).__name__, psycopg.conninfo.conninfo_to_dict(uri)
        refused = refused_settings(said, params, location)
        raise refused or IndexUnavailableError(connect_failure(said, location, params), location) from exc
    except UnicodeError as exc:  # the resolver's IDNA codec: an empty label, or one over 63 characters
        raise IndexStoreError(
            f"cannot reach the PostgreSQL server {location}: its host name is not one a resolver "
            "takes (an empty label, as in \"a..b\", or a label over 63 characters): check KB_AGENT_STORE",
            location,
        ) from exc


def utf8_database(conn: Any, location: str) -> Any:
    """``conn``, when its database keeps text in UTF-8 (the encoding the server reports as the
    session starts: no statement); else closed, and an error saying so. crag's text is any text,
    and ``crag.fold_diacritics`` folds accents character by character: in a SQL_ASCII database
    ``translate()`` works on bytes and mangles them, a LATIN1 one cannot store most characters."""
    encoding = conn.info.parameter_status("server_encoding")
    if encoding is None or encoding.upper() == "UTF8":  # a server that does not report it: not refused
        return conn
    database = conn.info.dbname
    conn.close()
    raise IndexStoreError(
        f"the PostgreSQL database {location} has encoding {encoding}, and crag needs UTF8 (documents hold any "
        f"text, and accents are folded in UTF-8): create a UTF8 database, `CREATE DATABASE "
        f"{identifier(database + '_utf8')} ENCODING 'UTF8' TEMPLATE template0;`, run `CREATE EXTENSION vector;` "
        "in it, and name it in KB_AGENT_STORE (docs/postgresql.md)",
        location,
    )


def options_timeout(params: Mapping[str, Any]) -> str | None:
    """The statement_timeout the session's options set (``-c statement_timeout=1``: the URI's
    ``options``, from ``params``, or else PGOPTIONS), as the server shows it (``1ms``), or None."""
    found = re.findall(r"statement[_-]timeout=(\S+)", str(params.get("options") or os.environ.get("PGOPTIONS", "")))
    if not found or re.fullmatch(r"0+[a-z]*", found[-1]):  # the last one set wins; 0 is none
        return None
    return found[-1] + "ms" if found[-1].isdigit() else found[-1]


def sessions_timeout(connect: Callable[[], Any], errors: tuple[type[BaseException], ...]) -> str | None:
    """The statement_timeout a new session starts with (the role's, or the options'), as the
    server shows it (``1ms``), or None: none, or it could not be read (``errors``)."""
    try:
        with connect() as conn:
            value = conn.execute("SELECT current_setting('statement_timeout')").fetchone()[0]
    except errors:
        return None
    return None if value == "0" else value


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
        fork_safe(self)

    def _forked(self) -> None:
        """In a forked child: each inherited connection's socket now leads to the null device,
        so closing it here (as dropping it does) tells the server nothing and the parent keeps
        its session; every thread of the child opens a connection of its own."""
        for held in list(self._held):
            try:
                fd = held.conn.pgconn.socket
            except Exception:  # closed, or no socket: nothing of the parent's to keep
                continue
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
        self._local = threading.local()
        self._held = weakref.WeakSet()
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
