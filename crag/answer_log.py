"""The answer log: every answer crag gave, in a SQLite file beside the index.

Each ``ask``, each ``chat`` turn and each MCP ``ask`` is one row of ``answers``: the
question, the full answer and its body, the model, the settings that shaped it (never a key,
token or password: ``logged_settings``), the time, with its citations and its usage by node
in tables of their own (one table per kind of record). Answers belong to a conversation
(``conversations``): ``ask`` opens one, ``ask -c`` and ``chat --continue`` carry on the
newest, a ``chat`` session is one. ``python -m crag log`` reads it back (``crag.cli.log``).

The file is ``log.sqlite`` in the index folder (``KB_AGENT_INDEX_DIR``, or the nearest
``.crag``) when that folder exists; before there is one, it is ``crag/log.sqlite`` in the
user's state folder (``$XDG_STATE_HOME``, else ``~/.local/state``), and with the PostgreSQL
store (which has no index folder) ``crag/postgresql/<digest of the URI>/log.sqlite`` there,
one log a database: writing the log never creates an index folder, which would hide a
parent's index (``log_folder``). ``KB_AGENT_LOG=off`` keeps nothing. Its schema is
numbered migrations, applied in order on first use and recorded in ``migrations``, as the
PostgreSQL store's are
(``crag.index.postgres_schema``): a later crag appends a migration and upgrades an older log
when it opens it. Everything is masked before it is written, with the secrets configured
when the answer is given (``Settings.secrets``: the settings' and the environment's), so the
file holds none once they are unset: the settings and the model (crag's own record) of every
configured secret and any URL's password, the question, answer and citations (the user's
text) of every secret-shaped one, as ``crag.safe_text`` defines it for what crag prints.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from attrs import frozen

from .answer_log_schema import MIGRATIONS, SCHEMA_VERSION, applied, migrate
from .errors import CragError
from .index.labels import logged_path, shown_logged_path

if TYPE_CHECKING:
    from .agent import Answer
    from .config import Settings

__all__ = ["LOG_FILE", "MIGRATIONS", "SCHEMA_VERSION", "AnswerLog", "LogEntry", "LogError", "log_folder", "logged_settings"]

LOG_FILE = "log.sqlite"


# Settings that are about where things are or who may read them, not about the answer.
_NOT_LOGGED = frozenset({"openai_api_key", "jira_api_token", "confluence_api_token", "jira_email",
                         "confluence_email", "index_dir", "embedding_path", "log"})


class LogError(CragError):
    """The answer log cannot be read or written (a damaged file, a read-only folder)."""


def logged_settings(settings: Settings, secrets: Sequence[str] = ()) -> dict[str, Any]:
    """The settings an answer is logged with: every one but keys, tokens, e-mail addresses and
    paths; in the others every configured secret (``Settings.secrets`` and ``secrets``, whatever
    its shape) and any URL's password is ``***``: the settings are crag's own record. Masked value
    by value, not in their JSON: a key that is a JSON word (``OPENAI_API_KEY=null``, ``true``)
    would leave no JSON (``"show_usage": ***``)."""
    from attrs import asdict

    from .safe_text import redact_message, valid_text

    secrets = (*settings.secrets(), *secrets)
    out: dict[str, Any] = {}
    for name, value in asdict(settings).items():
        if name in _NOT_LOGGED:
            continue
        out[name] = valid_text(redact_message(value, secrets)) if isinstance(value, str) else value
    return out


@frozen
class LogEntry:
    """One logged answer, as ``crag log --json`` prints it.

    A row whose cells do not hold what the schema says (a settings cell that is not JSON, a
    time no calendar has) is read all the same: those fields are None and named in
    ``damaged``."""

    id: int
    conversation: int | None
    source: str
    time: float | None
    question: str
    answer: str
    body: str
    model: str
    complexity: str | None
    grader_action: str | None
    iterations: int | None
    usage: dict[str, Any]
    citations: tuple[dict[str, Any], ...]
    settings: dict[str, Any] | None
    damaged: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON data; ``damaged`` is there only when something is."""
        out = {
            "id": self.id,
            "conversation": self.conversation,
            "source": self.source,
            "time": None if self.time is None else _utc(self.time).isoformat(timespec="seconds"),
            "question": self.question,
            "answer": self.answer,
            "body": self.body,
            "model": self.model,
            "complexity": self.complexity,
            "grader_action": self.grader_action,
            "iterations": self.iterations,
            "usage": self.usage,
            "citations": list(self.citations),
            "settings": self.settings,
        }
        if self.damaged:
            out["damaged"] = list(self.damaged)
        return out


def _utc(when: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(when, UTC)


def log_folder(settings: Settings) -> str:
    """Where the answer log of ``settings`` is kept: the index folder when it exists (or is
    something else by that name, which opening the log reports), else the user's state folder.
    The PostgreSQL store has no index folder (a ``.crag`` near it is another index's): each
    database gets a folder of its own in the state folder, named by a digest of its URI without
    the password, so one knowledge base's ``crag log`` and ``ask -c`` never show another's."""
    index_dir = settings.index_dir
    if not settings.store and os.path.lexists(index_dir):
        return index_dir
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    if not os.path.isabs(state):  # the XDG rule: a relative value is ignored
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    if settings.store:
        from .environment import store_credentials

        database = hashlib.sha256(store_credentials(settings.store)[1].encode("utf-8", "surrogatepass"))
        return os.path.join(state, "crag", "postgresql", database.hexdigest()[:16])
    return os.path.join(state, "crag")


def _link_trouble(link: str) -> str:
    """What a symbolic link standing where the log or its folder belongs leads to, for a message."""
    import errno
    import stat

    try:
        found = os.stat(link)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # `.crag -> .crag`
            return "a symbolic link that leads round in a loop"
        return "a symbolic link to nothing"
    if stat.S_ISDIR(found.st_mode):
        return "a symbolic link to a folder"
    if stat.S_ISREG(found.st_mode):
        return "a symbolic link to a file, not a folder"
    return f"a symbolic link to {os.path.realpath(link)}, {_kind(link)}"  # `log.sqlite -> /dev/full`


# What SQLite says when it cannot write a file it can read: its permissions, a read-only disk, a
# full one (or a file size limit, "disk I/O error").
_UNWRITABLE = ("readonly", "unable to open", "disk is full", "disk I/O error")


def _kind(path: str) -> str:
    """What stands where a file belongs, for a message: a folder, a named pipe, a socket, a device."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a folder?"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a folder?" if stat.S_ISDIR(mode) else "a device"


class AnswerLog:
    """The log file of one folder. Opened per command; every write is one transaction.

    ``create``: the folder is made when missing (the user's state folder; never an index
    folder)."""

    def __init__(self, folder: str, secrets: Sequence[str] = (), *, create: bool = False) -> None:
        self.path = os.path.join(folder, LOG_FILE)
        self.secrets = tuple(secrets)
        self.create = create
        self._db: sqlite3.Connection | None = None
        self._guessed = "estimated_calls"  # what node_usage holds of it: "0" in a log not migrated to schema 2

    @classmethod
    def for_settings(cls, settings: Settings) -> AnswerLog:
        folder = log_folder(settings)
        return cls(folder, settings.secrets(), create=folder != settings.index_dir)

    def exists(self) -> bool:
        """Whether there is a log to read (an empty file, left by an answer that could not be
        logged on a full disk, holds none: reading it would write crag's tables); ``LogError``
        when something else stands where the log or its folder belongs (a file named like the
        folder, a folder named like the log)."""
        folder = os.path.dirname(self.path) or "."
        if os.path.lexists(folder) and not os.path.isdir(folder):
            what = _link_trouble(folder) if os.path.islink(folder) else "not a folder"
            raise LogError(f"the answer log cannot be kept in {folder}: it is {what}")
        above = folder  # a file where a folder above it belongs (``XDG_STATE_HOME`` a file)
        while not os.path.lexists(above) and os.path.dirname(above) not in ("", above):
            above = os.path.dirname(above)
        if above != folder and os.path.lexists(above) and not os.path.isdir(above):
            what = _link_trouble(above) if os.path.islink(above) else "not a folder"
            raise LogError(f"the answer log cannot be kept in {folder}: {above} is {what}")
        if os.path.lexists(self.path) and not os.path.isfile(self.path):
            what = _link_trouble(self.path) if os.path.islink(self.path) else f"not a file ({_kind(self.path)})"
            raise LogError(f"the answer log {self.path} is {what}: move it away to start a new log")
        return os.path.isfile(self.path) and os.path.getsize(self.path) > 0

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                self.exists()  # what stands in the way is said as it is
                if self.create:
                    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                db = sqlite3.connect(self.path, timeout=10.0)
                db.execute("PRAGMA foreign_keys = ON")
                db.text_factory = _text  # a cell that is not UTF-8 (another tool wrote it) is read, not an error
                db.create_function("fold", 1, _fold, deterministic=True)  # LIKE folds ASCII letters only
                try:
                    migrate(db)
                except sqlite3.OperationalError as exc:
                    # An older crag's log this crag cannot write (another user's index, a read-only
                    # or full disk) is read as it is; an answer logged to it fails at its write, as it would.
                    if not any(w in str(exc) for w in _UNWRITABLE) or not applied(db):
                        raise
                    columns = {column[1] for column in db.execute("PRAGMA table_info(node_usage)")}
                    self._guessed = "estimated_calls" if "estimated_calls" in columns else "0"
            except (OSError, sqlite3.Error) as exc:
                raise LogError(f"the answer log {self.path} cannot be opened ({exc}); "
                               f"{_remedy(exc, ', or ')}KB_AGENT_LOG=off stops logging") from exc
            self._db = db
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> AnswerLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, answer: Answer, settings: Settings, *, conversation: int | None = None,
               source: str = "ask", when: float | None = None) -> tuple[int, int]:
        """Log one answer; returns its conversation's id and the answer's id. Without
        ``conversation`` a new conversation is opened."""
        from .safe_text import credentials_in, redact_credentials, redact_message, valid_text

        # A credential the question or the history holds is masked wherever the answer repeats it, bare.
        pasted = credentials_in("\n".join([answer.state.question, *(m.content for m in answer.state.history)]))

        def clean(text: str) -> str:  # the user's text and the documents': secret-shaped values, credentials
            return valid_text(redact_credentials(text, (*self.secrets, *pasted)))

        def own(text: str) -> str:  # crag's record: every configured secret
            return valid_text(redact_message(text, self.secrets))

        now = time.time() if when is None else when
        usage = answer.usage
        db = self._open()
        try:
            with db:
                if conversation is None:
                    conversation = db.execute("INSERT INTO conversations (started, source) VALUES (?, ?)",
                                              (now, source)).lastrowid
                else:  # its row deleted by hand (the sqlite3 shell does not cascade): made again, not an error
                    db.execute("INSERT OR IGNORE INTO conversations (id, started, source) VALUES (?, ?, ?)",
                               (conversation, now, source))
                answer_id = db.execute(
                    "INSERT INTO answers (conversation_id, time, question, answer, body, model, complexity, "
                    "grader_action, iterations, llm_calls, prompt_tokens, completion_tokens, latency_ms, settings) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (conversation, now, clean(answer.state.question), clean(answer.answer), clean(answer.body),
                     own(usage.model or ""), _word(answer.complexity), _word(answer.grader_action), answer.iterations,
                     usage.llm_calls,
                     usage.prompt_tokens, usage.completion_tokens, usage.latency_ms,
                     json.dumps(logged_settings(settings, self.secrets), sort_keys=True)),
                ).lastrowid
                db.executemany(
                    "INSERT INTO citations (answer_id, n, path, line, page, tool) VALUES (?, ?, ?, ?, ?, ?)",
                    [(answer_id, c.n, clean(logged_path(c.path, c.line)), c.line, c.page, c.tool)
                     for c in answer.citations],
                )
                db.executemany(
                    "INSERT INTO node_usage (answer_id, node, calls, prompt_tokens, completion_tokens, "
                    "cached_tokens, latency_ms, estimated_calls) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(answer_id, node, u.calls, u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.latency_ms,
                      u.estimated_calls) for node, u in usage.by_node.items()],
                )
        except sqlite3.Error as exc:
            raise LogError(f"the answer log {self.path} cannot be written ({exc}); "
                           f"{_remedy(exc, ', or ')}KB_AGENT_LOG=off stops logging") from exc
        return int(conversation), int(answer_id)

    def last_conversation(self, limit: int | None = None) -> tuple[int | None, list[dict[str, str]]]:
        """The newest conversation's id and its turns as ``{"role", "content"}`` messages (none when
        nothing is logged); with ``limit``, only the newest whole turns of at most that many
        characters in all (no more can fit the model's window), read newest first."""
        try:
            return self._last_conversation(limit)
        except sqlite3.Error as exc:
            raise LogError(f"the answer log {self.path} cannot be read ({exc}){_remedy(exc, '', '; ')}") from exc

    def _last_conversation(self, limit: int | None) -> tuple[int | None, list[dict[str, str]]]:
        if not self.exists():
            return None, []
        db = self._open()
        row = db.execute("SELECT conversation_id, question, answer FROM answers ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None, []
        if not isinstance(row[0], int):  # damaged (``crag log`` says so): that answer alone, in a new conversation
            return None, [{"role": "user", "content": _text(row[1])}, {"role": "assistant", "content": _text(row[2])}]
        turns: list[dict[str, str]] = []
        size = 0
        for question, answer in db.execute(
            "SELECT question, answer FROM answers WHERE conversation_id = ? ORDER BY id DESC", (row[0],)
        ):
            # A cell another tool wrote (a number, bytes) is text as ``crag log`` shows it, not a history error.
            question, answer = _text(question), _text(answer)
            size += len(question) + len(answer)
            if limit is not None and size > limit:
                break
            turns += [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
        return int(row[0]), turns[::-1]

    def entries(self, query: str = "", limit: int | None = 10, ids: Sequence[int] = ()) -> list[LogEntry]:
        """Logged answers, newest first: all, those whose question or answer holds every word
        of ``query`` (case-insensitive), or those with the given ids."""
        return list(self.iter_entries(query, limit, ids))

    def iter_entries(self, query: str = "", limit: int | None = 10, ids: Sequence[int] = ()) -> Iterator[LogEntry]:
        """``entries`` one at a time, read from the file as they are asked for: the memory it
        takes does not grow with the number of entries (``crag log --json`` of the whole log)."""
        last = None  # the id of the entry read last: a damaged page part way is said after it
        try:
            for entry in self._entries(query, limit, ids):
                last = entry.id
                yield entry
        except sqlite3.Error as exc:
            past = f" past answer {last}" if last is not None else ""
            raise LogError(f"the answer log {self.path} cannot be read{past} ({exc}){_remedy(exc, '', '; ')}") from exc

    def _entries(self, query: str, limit: int | None, ids: Sequence[int]) -> Iterator[LogEntry]:
        from .safe_text import valid_text

        if not self.exists():
            return
        wanted = [i for i in ids if 0 <= i <= SQL_INT_MAX]  # larger numbers are no row's id
        if ids and not wanted:
            return
        ids = wanted
        db = self._open()
        where, params = [], []
        for word in query.split():
            # the answer's body: its usage block and source list hold "plan", "tokens", "docs" in every answer
            where.append("(fold(CAST(question AS BLOB)) LIKE ? ESCAPE '\\' OR fold(CAST(body AS BLOB)) LIKE ? ESCAPE '\\')")
            pattern = "%" + _caseless(valid_text(word)).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            params += [pattern, pattern]
        if ids:
            where.append(f"answers.id IN ({', '.join('?' * len(ids))})")
            params += list(ids)
        where.append("answers.id <= ?")  # the batch goes on below the last id read
        sql = ("SELECT answers.id, conversation_id, source, time, question, answer, body, model, complexity, "
               "grader_action, iterations, llm_calls, prompt_tokens, completion_tokens, latency_ms, settings "
               "FROM answers LEFT JOIN conversations ON conversations.id = conversation_id WHERE "
               + " AND ".join(where) + " ORDER BY answers.id DESC LIMIT ?")
        left, below = SQL_INT_MAX if limit is None else min(max(int(limit), 0), SQL_INT_MAX), SQL_INT_MAX
        while left > 0:
            # One statement a batch, read whole before it is handed out: a reader whose output waits
            # (``crag log --json | less``) holds no lock that would keep an ``ask`` from logging.
            size = min(READ_BATCH, left)
            batch: list[LogEntry] = []
            try:
                for row in db.execute(sql, [*params, below, size]):
                    batch.append(self._entry(db, row))
            except sqlite3.Error:
                yield from batch  # the entries before a damaged page, then the error
                raise
            yield from batch
            if len(batch) < size or batch[-1].id <= -SQL_INT_MAX:
                return
            below, left = batch[-1].id - 1, left - size

    def _entry(self, db: sqlite3.Connection, row: tuple[Any, ...]) -> LogEntry:
        (answer_id, conversation, source, when, question, answer, body, model, complexity, action, iterations,
         calls, prompt, completion, latency, settings) = row
        damaged: list[str] = []

        def cell(name: str, value: Any, read: Any) -> Any:
            got = read(value)
            if got is _DAMAGED:
                damaged.append(name)
                return None
            return got

        by_node = {}
        for node, c, p, k, cached, ms, guessed in db.execute(
                "SELECT node, calls, prompt_tokens, completion_tokens, cached_tokens, latency_ms, "
                f"{self._guessed} FROM node_usage WHERE answer_id = ? ORDER BY rowid", (answer_id,)):
            guessed = cell("usage", guessed, _int)
            by_node[_text(node)] = {
                "calls": cell("usage", c, _int), "prompt_tokens": cell("usage", p, _int),
                "completion_tokens": cell("usage", k, _int), "cached_tokens": cell("usage", cached, _int),
                **({"estimated_calls": guessed} if guessed else {}), "latency_ms": cell("usage", ms, _ms)}
        estimated = sum(n.get("estimated_calls", 0) for n in by_node.values())  # as ask --json: only when not 0
        citations = []
        for n, path, line, page, tool in db.execute(
                "SELECT n, path, line, page, tool FROM citations WHERE answer_id = ? ORDER BY n", (answer_id,)):
            page = cell("citations", page, _optional_int)
            citations.append({"n": cell("citations", n, _int), "path": shown_logged_path(_text(path)),
                              "line": cell("citations", line, _optional_int),
                              **({"page": page} if page is not None else {}), "tool": _text(tool)})
        prompt, completion = cell("usage", prompt, _int), cell("usage", completion, _int)
        usage = {"llm_calls": cell("usage", calls, _int), "prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": None if prompt is None or completion is None else prompt + completion,
                 **({"estimated_calls": estimated} if estimated else {}),
                 "latency_ms": cell("usage", latency, _ms), "by_node": by_node}
        entry = LogEntry(
            answer_id, cell("conversation", conversation, _optional_int), _text(source), cell("time", when, _time),
            _text(question), _text(answer), _text(body), _text(model), _optional_text(complexity),
            _optional_text(action), cell("iterations", iterations, _int), usage, tuple(citations),
            cell("settings", settings, _settings))
        return attrs.evolve(entry, damaged=tuple(f for f in _CELLS if f in damaged)) if damaged else entry


# -- reading a cell: what the schema says it holds, or _DAMAGED --------------------------------
# SQLite keeps whatever a cell was given; a row written by something else than crag (or a
# damaged file) is read cell by cell, so one bad cell is named, not a traceback.

_DAMAGED = object()
_CELLS = ("conversation", "time", "iterations", "usage", "citations", "settings")  # the order they are named in
SQL_INT_MAX = 2**63 - 1  # SQLite's largest integer
READ_BATCH = 100  # entries read by one statement of ``AnswerLog.iter_entries``


def _remedy(exc: BaseException, after: str, before: str = "") -> str:
    """What to do about ``exc`` from SQLite, between ``before`` and ``after`` ("" when it is not
    the file's fault: a folder that cannot be written is said as it is)."""
    text = str(exc)
    if not isinstance(exc, sqlite3.DatabaseError):
        return ""
    if "locked" in text or "busy" in text:
        return f"{before}another crag is writing it: try again{after}"
    if "newer crag" in text:
        return f"{before}upgrade crag{after}"
    if "disk is full" in text:
        return f"{before}free some disk space{after}"
    if any(w in text for w in ("not a database", "malformed", "corrupt", "no such table", "no such column",
                               "already exists", "another program's")):
        return f"{before}move it away to start a new log{after}"  # damaged, or not crag's tables
    return ""


def _fold(value: Any) -> str:
    """A cell's bytes as text, case-folded, for a log search (SQL ``fold``): "Über" and "über"
    alike. Given as bytes, so a cell that is not UTF-8 is searched, not an error."""
    return _caseless(_text(value))


def _caseless(text: str) -> str:
    """``text`` as a log search compares it: case-folded, and an accented letter written as one
    character or as a letter and its accent (as text pasted from a PDF or a Mac file name holds
    it) alike, so "café" finds "café" however either was typed."""
    if text.isascii():
        return text.lower()
    import unicodedata

    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", text).casefold())


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _int(value: Any) -> Any:
    return value if isinstance(value, int) else _DAMAGED


def _optional_int(value: Any) -> Any:
    return None if value is None else _int(value)


def _ms(value: Any) -> Any:
    import math

    if isinstance(value, int | float) and math.isfinite(value):
        return round(value, 1)
    return _DAMAGED


def _time(value: Any) -> Any:
    if not isinstance(value, int | float):
        return _DAMAGED
    try:
        _utc(value)
    except (OverflowError, ValueError, OSError):
        return _DAMAGED
    return float(value)


def _settings(value: Any) -> Any:
    try:
        settings = json.loads(value)
    except (TypeError, ValueError, RecursionError):
        return _DAMAGED
    return settings if isinstance(settings, dict) else _DAMAGED


def _word(mode: Any) -> str | None:
    """An enum of the answer (``Complexity``, ``GraderAction``) as the word ``--json`` prints."""
    return None if mode is None else str(getattr(mode, "value", mode))
