"""The environment crag runs in: ``.env`` files, read once, the secrets configured there
and in the process environment, found by one finder, and the index folder nearest the
working directory (``find_index_dir``).

``read_dotenv`` parses a ``.env`` (``KEY=VALUE`` lines) and keeps it while the file stays
the same, so a command that prints a thousand lines, each redacted of every configured
secret, parses it once. ``find_secrets`` is the one secret finder: ``crag.config.Settings``
(``Settings.secrets``), the command line's output, the answer log and the MCP server all
mask what it finds. What masking means for a document and for crag's own messages is
``crag.safe_text``'s; docs/safety.md, "Secrets", says it for users.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from .errors import ConfigError

__all__ = ["DOTENV_MAX_BYTES", "INDEX_FOLDER", "SECRET_SUFFIXES", "SECRET_VARIABLES", "find_index_dir", "find_secrets",
           "read_dotenv", "secret_values"]

DOTENV_MAX_BYTES = 1024 * 1024  # a .env is a few lines; anything larger is not one
# Values never shown in a message, and redacted from everything crag prints; so is the value
# of any variable named with one of SECRET_SUFFIXES.
SECRET_VARIABLES = frozenset({"OPENAI_API_KEY", "JIRA_API_TOKEN", "CONFLUENCE_API_TOKEN"})
SECRET_SUFFIXES = ("_API_KEY", "_TOKEN", "_PASSWORD", "_PASSWD", "_SECRET", "_SECRET_KEY", "_ACCESS_KEY", "_PRIVATE_KEY")
INDEX_FOLDER = ".crag"  # the index folder found the way git finds .git


def _read_small_regular_file(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes; None when absent
    or a folder (``python -m venv .env`` names a virtualenv so; ``config_warnings`` says it).

    Opened without blocking and checked after opening, so a FIFO or a device (``/dev/zero``)
    behind the name is refused instead of read forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(".env", os.fspath(path), f"a readable file ({exc.strerror or exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            return None
        if not stat.S_ISREG(mode):
            raise ConfigError(".env", os.fspath(path), "a regular file (not a device or pipe)")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            try:
                chunk = os.read(fd, min(65536, limit + 1 - size))
            except OSError as exc:
                raise ConfigError(".env", os.fspath(path), f"a readable file ({exc.strerror or exc})") from exc
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ConfigError(".env", os.fspath(path), f"a file of at most {limit // 1024} KiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


@frozen
class _DotenvRead:
    """A ``.env`` as parsed: its assignments, its lines that are not assignments (number, and
    the name the line starts with, for a hint; never shown), and the secrets among its values."""

    values: dict[str, str]
    bad_lines: tuple[tuple[int, str], ...]
    secrets: tuple[str, ...]


# A .env changed within the same tick of the file system's clock may keep its size and its
# modification time: one modified this recently is parsed again at every read (git treats
# such a file as "racily clean" the same way).
_RACY_NS = 2_000_000_000
_DOTENV_READS: dict[tuple[Any, ...], _DotenvRead] = {}
_DOTENV_READS_KEPT = 8  # the .env files of different folders one process may read


def _read_dotenv_cached(path: str | os.PathLike[str]) -> _DotenvRead:
    """``path`` parsed; from memory while its identity, size and times are the ones it had
    when it was parsed (every printed line asks for the secrets: a large ``.env`` must not be
    parsed again for each)."""
    import time

    key = None
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except (OSError, ValueError):
        pass
    if key is not None and key in _DOTENV_READS:
        _DOTENV_READS[key] = _DOTENV_READS.pop(key)  # the most recently read is kept longest
        return _DOTENV_READS[key]
    bad: list[tuple[int, str]] = []
    values = _parse_dotenv(path, bad)
    read = _DotenvRead(values, tuple(bad), find_secrets(values))
    if key is not None and time.time_ns() - max(key[4], key[5]) > _RACY_NS:
        while len(_DOTENV_READS) >= _DOTENV_READS_KEPT:
            del _DOTENV_READS[next(iter(_DOTENV_READS))]  # the least recently read
        _DOTENV_READS[key] = read
    return read


def read_dotenv(path: str | os.PathLike[str], bad_lines: list[tuple[int, str]] | None = None) -> dict[str, str]:
    """``KEY=VALUE`` lines of a ``.env`` file; a missing file is an empty mapping.

    Accepts ``export KEY=VALUE``, single or double quotes (``_dotenv_value``), blank lines, ``#``
    comments (also after a value, quoted or not) and a UTF-8 byte-order mark (or UTF-16 with its mark; without it, the
    error says so). Only a regular file of at most
    ``DOTENV_MAX_BYTES`` is read; a NUL character in a value is refused (no environment
    variable can hold one). Lines that are not assignments (a name with a space in it, ``set
    NAME=value``, included) go to ``bad_lines`` when given, each as its number and the name it
    starts with, or the last word of the spaced name ("" for none). An unchanged file is parsed once per process.
    """
    read = _read_dotenv_cached(path)
    if bad_lines is not None:
        bad_lines.extend(read.bad_lines)
    return dict(read.values)


def _parse_dotenv(path: str | os.PathLike[str], bad_lines: list[tuple[int, str]]) -> dict[str, str]:
    data = _read_small_regular_file(path, DOTENV_MAX_BYTES)
    if data is None:
        return {}
    marked = data.startswith((b"\xff\xfe", b"\xfe\xff"))
    if _utf32(data):  # read as UTF-8 or UTF-16, each of its NULs is in a name or a value
        raise ConfigError(".env", os.fspath(path), "UTF-8 text (it reads as UTF-32: save it as UTF-8, or as "
                          "UTF-16 with its byte order mark)")
    if not marked and _utf16_unmarked(data):
        raise ConfigError(".env", os.fspath(path), "UTF-8 text (it reads as UTF-16 without a byte order mark: "
                          "save it as UTF-8, or as UTF-16 with its mark)")
    try:  # UTF-16 with its byte-order mark is what PowerShell's ">" writes
        text = data.decode("utf-16") if marked else data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(".env", os.fspath(path), f"a UTF-8 file (byte {exc.start} is not UTF-8)") from exc
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if re.match(r"export\s", line):
            line = line[len("export") :].lstrip()
        key, sep, value = line.partition("=")
        # "NAME= # note": a # after a space starts a comment, here too, so the value is empty
        value = "" if re.match(r"[ \t]+#", value) else _dotenv_value(value.strip())
        if not sep or not key.strip() or value is None:
            name = re.match(r"[A-Za-z_]\w*", line)
            bad_lines.append((number, name[0] if name else ""))
            continue
        key = key.strip()
        if re.search(r"\s", key):  # "set KB_AGENT_TOP_K=3": no variable's name holds a space (kept, to be masked)
            name = re.match(r"[A-Za-z_]\w*", key.split()[-1])
            bad_lines.append((number, name[0] if name else ""))
        if "\x00" in value or "\x00" in key:
            raise ConfigError(key, value, f"a value without NUL characters (set in {os.fspath(path)})",
                              secret=_secret_variable(key) or _url_variable(key))
        values[key] = value
    return values


def _utf32(data: bytes) -> bool:
    """Whether ``data`` looks like UTF-32 text, with its byte order mark or without: NULs in
    three of every four bytes (the high bytes of ASCII characters), at least half of each."""
    if b"\x00" not in data:
        return False
    counts = sorted(data[i::4].count(0) for i in range(4))
    return counts[1] * 2 >= len(data) // 4 and counts[0] * 4 < counts[1]


def _utf16_unmarked(data: bytes) -> bool:
    """Whether ``data`` looks like UTF-16 text written without its byte order mark: NULs in
    every other byte (the high bytes of ASCII characters), at least half of one side's bytes."""
    if b"\x00" not in data:
        return False
    even, odd = data[0::2].count(0), data[1::2].count(0)
    return max(even, odd) * 2 >= len(data) // 2 and min(even, odd) * 4 < max(even, odd)


# A value in double quotes, where a backslash escapes " and \ (as in a shell), or in single
# quotes, taken as written; either may be followed by a comment. Unquoted, it ends at a # after
# a space or a tab.
_DOUBLE_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"\s*(?:#.*)?')
_SINGLE_QUOTED = re.compile(r"'([^']*)'\s*(?:#.*)?")


def _dotenv_value(text: str) -> str | None:
    """The value a ``.env`` line's text after ``=`` stands for; None for a quote left open or
    followed by more than a comment (the line is then not an assignment)."""
    if text[:1] == '"':
        match = _DOUBLE_QUOTED.fullmatch(text)
        return re.sub(r'\\(["\\])', r"\1", match[1]) if match else None
    if text[:1] == "'":
        match = _SINGLE_QUOTED.fullmatch(text)
        return match[1] if match else None
    return re.split(r"\s#", text, maxsplit=1)[0].rstrip()


# -- secrets: the one finder ------------------------------------------------------------
# Output, error lines, the answer log and --json all mask what ``find_secrets`` finds: in the
# settings (``crag.config.Settings.secrets``) and in the environment and ``.env``
# (``secret_values``).

def _secret_variable(var: str) -> bool:
    """Whether the whole value of ``var`` is a secret (a key, token, password)."""
    return var in SECRET_VARIABLES or var.endswith(SECRET_SUFFIXES)


# The e-mail and token crag sends to Jira and Confluence as one Basic credential (crag.tools.atlassian).
_BASIC_PAIRS = (("JIRA_EMAIL", "JIRA_API_TOKEN"), ("CONFLUENCE_EMAIL", "CONFLUENCE_API_TOKEN"))


def _basic_values(user: str, password: str) -> list[str]:
    """The value of the ``Basic`` header ``user:password`` is sent as, and the forms a server
    echoing it in a URL gives it: %-escaped and in base64's URL-safe alphabet."""
    import base64
    from urllib.parse import quote

    try:
        value = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    except UnicodeError:  # bytes that are not UTF-8: the settings refuse them, nothing is sent
        return []
    return [value, quote(value, safe=""), value.replace("+", "-").replace("/", "_")]


def _url_variable(var: str) -> bool:
    """Whether ``var`` holds a URL whose password is a secret."""
    return var.endswith("_URL") or var == "KB_AGENT_STORE"


_PASSWORD_PARAMETER = re.compile(r"(?i)(?:^|\?)\s*password\s*=")


def store_credentials(uri: str) -> tuple[str | None, str]:
    """A PostgreSQL URI as libpq splits off its credentials: (the password or None, the URI
    without the password). libpq takes ``user[:password]`` up to the first ``@``
    before any ``/``, so a password may hold ``#`` or ``?``, which a URL parser reads as the end
    of the host; a ``password=`` query parameter counts too, and is left out as well."""
    scheme, sep, rest = uri.partition("://")
    if sep and store_uri_ambiguous(uri):  # hide all a user could have meant as user and password
        cut = rest.rfind("@")
        user, colon, password = rest[:cut].partition(":")
        given, shown = store_credentials(f"{scheme}{sep}{rest[cut + 1 :]}")  # no "@" left in it
        return (password if colon else user) or given, f"{scheme}{sep}***@{shown.partition(sep)[2]}"
    password, user = None, ""
    at, slash = rest.find("@"), rest.find("/")
    if sep and at != -1 and (slash == -1 or at < slash):
        user, colon, password = rest[:at].partition(":")
        password = password if colon else None
        user, rest = (f"{user}@" if user else ""), rest[at + 1 :]
    location, question, query = rest.partition("?")
    kept = []
    for part in query.split("&") if question else ():
        given = _PASSWORD_PARAMETER.search(part)  # also one behind a stray "?", which libpq refuses
        if given:
            password = password or part[given.end() :]
        else:
            kept.append(part)
    shown = f"{scheme}{sep}{user}{location}" + ("?" + "&".join(kept) if kept else "")
    return password or None, shown


def store_uri_ambiguous(uri: str) -> bool:
    """Whether a PostgreSQL URI has an ``@`` that is not the one ending its credentials: a
    second one, or one after a ``/``. libpq reads the password only up to the first ``@`` or
    ``/``, so such a URI is nearly always a password holding an unencoded ``@`` or ``/``, whose
    rest libpq would take for the host or the database (and name in its errors). Encoded as
    ``%40`` it means the same to libpq everywhere in the URI."""
    rest = uri.partition("://")[2]
    at, slash = rest.find("@"), rest.find("/")
    return rest.count("@") > 1 or (at != -1 and slash != -1 and slash < at)


_HOST_AFTER_AT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::[0-9]*)?(?:[/?#].*)?")


def url_credentials_ambiguous(url: str) -> bool:
    """Whether an http(s) URL reads as ``user:password@host`` with a password holding an
    unencoded ``/``, ``?``, ``#`` or ``@``, which a URL parser splits at that character (taking
    "bob:12" of "http://bob:12/pw@host" for a host and its port): its last ``@`` comes after one
    of them, what precedes it starts with a user name (no ``.``) and a ``:``, and a host follows
    it. An ``@`` in a path or a query ("http://127.0.0.1:8080/v1/@team", "...?tenant=a@b",
    "https://host/proxy/user@example.com") is not one."""
    rest = url.partition("://")[2]
    at = rest.rfind("@")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
    if at == -1 or (at < cut and rest.count("@") == 1):  # none, or a plain user:password@host
        return False
    user, colon, _ = rest[:at].partition(":")
    if not colon or any(c in user for c in "./?#@") or user.lower() == "localhost" or rest[at - 1] == "/":
        return False  # a host ("127.0.0.1:8080/v1/@team"), or a path segment that starts with @
    return bool(_HOST_AFTER_AT.fullmatch(rest[at + 1 :]))


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


def shown_url(raw: str) -> str:
    """A URL setting's value as the error refusing it shows it: credentials masked
    (``redact_message``), and all before the last ``@`` hidden where no URL parser finds them:
    a password holding an unencoded ``@`` or ``/``, or a value with no ``scheme://``, a space or
    a character that is not printable ASCII (``bob:Hunter2Pw@host/v1``, ``http://bob:a b@host``)."""
    from .safe_text import REDACTED, redact_message

    value = raw.strip()
    scheme = _SCHEME.match(value)
    if store_uri_ambiguous(raw) and (not raw.startswith(("http://", "https://")) or url_credentials_ambiguous(raw)):
        raw = store_credentials(raw)[1]
    elif "@" in value and (not scheme or " " in value or not (value.isascii() and value.isprintable())):
        raw = f"{scheme.group() if scheme else ''}{REDACTED}@{value.rpartition('@')[2]}"
    return redact_message(raw)

# A URL's user name written without a password and at least this long is a token written
# where a user goes (``https://TOKEN@host``), a secret as a password is; a short one is a name.
_TOKEN_AS_USER = 8
# The URLs crag itself sends a user name to, as Basic authentication (another tool's URL in the
# environment, ``DATABASE_URL=postgresql://postgres@localhost/app``, names a user, not a token).
_SENT_AS_BASIC = frozenset({"OPENAI_BASE_URL", "KB_AGENT_EMBEDDING_BASE_URL"})


def _username(url: str) -> str:
    """The user name written in ``url`` (``""`` for none, or for a URL that does not parse)."""
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).username or ""
    except ValueError:
        return ""


def find_secrets(values: Mapping[str, object]) -> tuple[str, ...]:
    """The secrets among ``values`` (variable name -> value): the whole value of
    ``OPENAI_API_KEY``, the Jira and Confluence tokens and any variable named with one of
    ``SECRET_SUFFIXES`` (``*_TOKEN``, ``AWS_SECRET_ACCESS_KEY``); the password of any ``*_URL`` and of ``KB_AGENT_STORE``
    (a URL's also decoded and as base64 of ``user:password``, the ``Basic`` header it is sent as),
    or the user name of ``_TOKEN_AS_USER`` characters or more written without a password in a URL crag
    sends it from (``_SENT_AS_BASIC``);
    the ``Basic`` value of ``JIRA_EMAIL:JIRA_API_TOKEN`` and of Confluence's pair (``_basic_values``)."""
    import base64
    from urllib.parse import unquote, urlsplit

    found: list[str] = []
    for var, value in values.items():
        if not isinstance(value, str) or not value.strip():
            continue
        if _secret_variable(var):
            found.append(value)
        elif _url_variable(var):
            if var == "KB_AGENT_STORE" or url_credentials_ambiguous(value.strip()):
                password = store_credentials(value.strip())[0]
            else:
                try:
                    parts = urlsplit(value.strip())
                    password = parts.password
                except ValueError:
                    password = None
                if password:  # also as sent: decoded, and as the Basic header's value
                    pair = f"{unquote(parts.username or '')}:{unquote(password)}"
                    found += [unquote(password), base64.b64encode(pair.encode()).decode("ascii")]
                elif (var in _SENT_AS_BASIC and password is None
                      and len(user := _username(value.strip())) >= _TOKEN_AS_USER):  # https://TOKEN@host
                    found += [user, unquote(user), base64.b64encode(f"{unquote(user)}:".encode()).decode("ascii")]
            if password:
                found.append(password)
    for user_var, token_var in _BASIC_PAIRS:
        user, token = values.get(user_var), values.get(token_var)
        if isinstance(user, str) and isinstance(token, str) and user.strip() and token.strip():
            found += _basic_values(user.strip(), token.strip())
    return tuple(dict.fromkeys(found))


def secret_values(environ: Mapping[str, str] | None = None, dotenv: str | os.PathLike[str] | None = ".env") -> tuple[str, ...]:
    """The secrets configured for crag in ``environ`` (default ``os.environ``) and ``dotenv``,
    as ``find_secrets`` finds them, for redaction.

    Never raises: a ``.env`` that cannot be read contributes nothing. An unchanged ``.env`` is
    parsed once, however often this is asked.
    """
    env = os.environ if environ is None else environ
    try:
        read = _read_dotenv_cached(dotenv) if dotenv else None
    except Exception:
        read = None
    file_secrets, file_values = (read.secrets, read.values) if read else ((), {})
    # an e-mail in one and its token in the other still make one Basic credential (the environment wins)
    pairs = {var: env.get(var, file_values.get(var)) for pair in _BASIC_PAIRS for var in pair}
    return tuple(dict.fromkeys((*find_secrets(env), *file_secrets, *find_secrets(pairs))))


def find_index_dir(cwd: str | None = None) -> str:
    """The nearest ``.crag`` in ``cwd`` or a parent that holds an index (``CURRENT``), as git
    finds ``.git``: ``.crag`` when in ``cwd``, else its absolute path. With none, the nearest
    ``.crag`` folder, else ``.crag`` (``index`` creates it). A link to nothing stops the search
    (commands name it). So ``~/.crag`` serves every folder below home that has no index."""
    start = os.path.abspath(cwd or os.getcwd())
    folder, found = start, None
    while True:
        candidate = os.path.join(folder, INDEX_FOLDER)
        if os.path.lexists(os.path.join(candidate, "CURRENT")):  # crag.index.layout.CURRENT
            found = folder
            break
        if found is None and (os.path.isdir(candidate) or os.path.islink(candidate)):
            found = folder
            if not os.path.isdir(candidate):
                break  # a link to nothing: commands name it rather than use another index
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return INDEX_FOLDER if found is None or found == start else os.path.join(found, INDEX_FOLDER)


_VARIABLE = re.compile(r"\$(\{\w+\}|[A-Za-z_]\w*)")


def unexpanded_variable(path: str) -> bool:
    """Whether ``path`` holds a ``$VARIABLE`` (``$HOME/idx``, ``${HOME}/idx``) that nothing
    expanded (``.env``, a systemd ``Environment=``), rather than naming a folder called so: one
    the environment sets, or a path up to the last name holding one that is not on disk
    (``--index 'my$dir'`` is that folder; a ``$HOME`` folder an older crag made is not used)."""
    found = list(_VARIABLE.finditer(path))
    if not found:
        return False
    if any(match.group(1).strip("{}") in os.environ for match in found):
        return True
    end = path.find("/", found[-1].end())
    return not os.path.lexists(os.path.expanduser(path if end < 0 else path[:end]))
