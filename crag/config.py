"""Settings: read from the process environment, then from ``.env`` (the environment wins).

Every setting has a default. A value that is set is validated, and a bad one raises
``ConfigError`` naming the variable and what it accepts; the CLI turns that into one line
and exit status 2. ``Settings.from_env(**overrides)`` takes the same settings by field
name for library users (``Agent.from_env(max_iterations=2)``), validated the same way.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any

from attrs import fields, frozen

from .errors import ConfigError

__all__ = ["DOTENV_MAX_BYTES", "MAX_SECONDS", "SECRET_VARIABLES", "SETTINGS_TABLE", "Settings", "read_dotenv",
           "secret_values"]

DOTENV_MAX_BYTES = 1024 * 1024  # a .env is a few lines; anything larger is not one
MAX_SECONDS = 86400.0  # the longest duration a setting may hold: one day
# Values never shown in a message, and redacted from everything crag prints.
SECRET_VARIABLES = frozenset({"OPENAI_API_KEY", "JIRA_API_TOKEN", "CONFLUENCE_API_TOKEN"})


def _int(lo: int) -> Callable[[str, str], int]:
    def parse(var: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(var, raw, f"an integer >= {lo}") from None
        if value < lo:
            raise ConfigError(var, raw, f"an integer >= {lo}")
        return value

    return parse


def _float(lo: float, hi: float | None, what: str) -> Callable[[str, str], float]:
    def parse(var: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(var, raw, what) from None
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            raise ConfigError(var, raw, what)
        return value

    return parse


def _seconds(lo: float, hi: float = MAX_SECONDS) -> Callable[[str, str], float]:
    """A duration: a finite number of seconds in [lo, hi] (``inf`` and ``1e309`` are refused)."""
    return _float(lo, hi, f"a number of seconds between {lo:g} and {hi:g}")


def _secret(var: str, raw: str) -> str:
    """A key or token sent in an HTTP header: printable ASCII, and never shown in a message."""
    value = raw.strip()
    for ch in value:
        if not " " < ch <= "~":
            what = "a control character" if ch.isascii() or not ch.isprintable() else "a non-ASCII character"
            if ch == " ":
                what = "a space"
            raise ConfigError(
                var, None, f"printable ASCII without spaces (it contains {what}; HTTP headers carry nothing else)",
                secret=True,
            )
    return value


def _choice(*options: str) -> Callable[[str, str], str]:
    def parse(var: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in options:
            raise ConfigError(var, raw, "one of " + ", ".join(options))
        return value

    return parse


# The words every on/off setting accepts, whatever its name.
SWITCH_ON = ("on", "true", "yes", "1")
SWITCH_OFF = ("off", "false", "no", "0")


def _switch(var: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in SWITCH_ON:
        return True
    if value in SWITCH_OFF or value == "":
        return False
    raise ConfigError(var, raw, "on or off (also true/false, yes/no, 1/0)")


# Local servers users name as a backend: each speaks the OpenAI API at its usual address.
LOCAL_SERVERS = {
    "ollama": "http://localhost:11434/v1",
    "vllm": "http://localhost:8000/v1",
    "llamacpp": "http://localhost:8080/v1",
    "llama.cpp": "http://localhost:8080/v1",
    "llama-cpp": "http://localhost:8080/v1",
    "lmstudio": "http://localhost:1234/v1",
    "lm-studio": "http://localhost:1234/v1",
}


def _backend(var: str, raw: str) -> str:
    value = raw.strip().lower()
    if value in ("openai", "offline"):
        return value
    server = LOCAL_SERVERS.get(value.replace(" ", ""))
    if server is not None:
        raise ConfigError(
            var,
            raw,
            f"openai or offline; {raw.strip()} speaks the OpenAI API: set KB_AGENT_LLM=openai and "
            f"OPENAI_BASE_URL={server} (its usual address; no key needed)",
        )
    raise ConfigError(var, raw, "openai or offline (a local server such as Ollama is `openai` with OPENAI_BASE_URL)")


def _text(var: str, raw: str) -> str:
    value = raw.strip()
    if any(ch < " " and ch != "\t" for ch in value):
        raise ConfigError(var, raw, "text without control characters")
    return value


def _nonempty(var: str, raw: str) -> str:
    value = _text(var, raw)
    if not value:
        raise ConfigError(var, raw, "a non-empty name")
    return value


def _url(var: str, raw: str) -> str | None:
    value = raw.strip().rstrip("/")
    if not value:
        return None
    if not value.startswith(("http://", "https://")) or not value.isascii() or not value.isprintable() or " " in value:
        raise ConfigError(var, _shown_url(raw), "an http:// or https:// URL (printable ASCII, no spaces)")
    return value


def _store(var: str, raw: str) -> str:
    value = raw.strip()
    if value and not value.startswith(("postgresql://", "postgres://")):
        raise ConfigError(var, raw, "empty (the embedded index in KB_AGENT_INDEX_DIR) or a postgresql:// URI")
    return value


# field name -> (environment variable, parser); the order is the order of .env.example.
SETTINGS_TABLE: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "max_iterations": ("KB_AGENT_MAX_ITERATIONS", _int(1)),
    "auto_approve_max_items": ("KB_AGENT_AUTO_APPROVE_MAX_ITEMS", _int(0)),
    "vector_score_threshold": (
        "KB_AGENT_VECTOR_SCORE_THRESHOLD",
        _float(0.0, 1.0, "a number between 0 and 1"),
    ),
    "drop_threshold": ("KB_AGENT_DROP_THRESHOLD", _float(0.0, 1.0, "a number between 0 and 1")),
    "generate_threshold": (
        "KB_AGENT_GENERATE_THRESHOLD",
        _float(0.0, 1.0, "a number between 0 and 1"),
    ),
    "grade_memory": ("KB_AGENT_GRADE_MEMORY", _switch),
    "top_k": ("KB_AGENT_TOP_K", _int(1)),
    "index_dir": ("KB_AGENT_INDEX_DIR", _nonempty),
    "llm": ("KB_AGENT_LLM", _backend),
    "model": ("KB_AGENT_MODEL", _nonempty),
    "llm_timeout": ("KB_AGENT_LLM_TIMEOUT", _seconds(0.001)),
    "llm_max_retries": ("KB_AGENT_LLM_MAX_RETRIES", _int(0)),
    "embedder": ("KB_AGENT_EMBEDDER", _choice("hash", "openai", "local")),
    "embedding_model": ("KB_AGENT_EMBEDDING_MODEL", _nonempty),
    "openai_api_key": ("OPENAI_API_KEY", _secret),
    "openai_base_url": ("OPENAI_BASE_URL", _url),
    "jira_base_url": ("JIRA_BASE_URL", _url),
    "jira_email": ("JIRA_EMAIL", _text),
    "jira_api_token": ("JIRA_API_TOKEN", _secret),
    "confluence_base_url": ("CONFLUENCE_BASE_URL", _url),
    "confluence_email": ("CONFLUENCE_EMAIL", _text),
    "confluence_api_token": ("CONFLUENCE_API_TOKEN", _secret),
    "web_fetch": ("KB_AGENT_WEB_FETCH", _switch),
    "embedding_base_url": ("KB_AGENT_EMBEDDING_BASE_URL", _url),
    "temperature": ("KB_AGENT_TEMPERATURE", _float(0.0, 2.0, "a number between 0 and 2")),
    "max_answer_tokens": ("KB_AGENT_MAX_ANSWER_TOKENS", _int(16)),
    "context_tokens": ("KB_AGENT_CONTEXT_TOKENS", _int(1024)),
    "structured_output": (
        "KB_AGENT_STRUCTURED_OUTPUT",
        _choice("auto", "json_schema", "json_object", "off"),
    ),
    "grounding": ("KB_AGENT_GROUNDING", _choice("note", "strict", "off")),
    "store": ("KB_AGENT_STORE", _store),
    "embedding_path": ("KB_AGENT_EMBEDDING_PATH", _text),
}


@frozen
class Settings:
    """All of crag's configuration. Field defaults are the documented defaults (README, Configuration)."""

    max_iterations: int = 3
    auto_approve_max_items: int = 2
    vector_score_threshold: float = 0.8
    drop_threshold: float = 0.3
    generate_threshold: float = 0.7
    grade_memory: bool = False
    top_k: int = 5
    index_dir: str = ".crag"
    llm: str = "offline"
    model: str = "gpt-4o-mini"
    llm_timeout: float = 60.0
    llm_max_retries: int = 3
    embedder: str = "hash"
    embedding_model: str = "text-embedding-3-small"
    openai_api_key: str = ""
    openai_base_url: str | None = None
    jira_base_url: str | None = None
    jira_email: str = ""
    jira_api_token: str = ""
    confluence_base_url: str | None = None
    confluence_email: str = ""
    confluence_api_token: str = ""
    web_fetch: bool = False
    embedding_base_url: str | None = None
    temperature: float = 0.2
    max_answer_tokens: int = 1024
    context_tokens: int = 8192
    structured_output: str = "auto"
    grounding: str = "note"
    store: str = ""
    embedding_path: str = ""

    def __attrs_post_init__(self) -> None:
        # Checked here as well as when parsed, so Settings(...) built in code holds too.
        for name in ("llm_timeout",):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= MAX_SECONDS or not math.isfinite(value):
                raise ConfigError(self.variable(name), value, f"a number of seconds between 0.001 and {MAX_SECONDS:g}")
        for name in ("openai_api_key", "jira_api_token", "confluence_api_token"):
            _secret(self.variable(name), getattr(self, name))
        if self.embedder == "local" and not self.embedding_path.strip():
            raise ConfigError(
                "KB_AGENT_EMBEDDING_PATH", self.embedding_path, "the folder of a sentence-transformers model (KB_AGENT_EMBEDDER=local)"
            )
        if self.drop_threshold > self.generate_threshold:
            raise ConfigError(
                "KB_AGENT_DROP_THRESHOLD",
                self.drop_threshold,
                f"a number no greater than KB_AGENT_GENERATE_THRESHOLD ({self.generate_threshold})",
            )
        if self.max_answer_tokens * 2 > self.context_tokens:
            raise ConfigError(
                "KB_AGENT_MAX_ANSWER_TOKENS",
                self.max_answer_tokens,
                f"at most half of KB_AGENT_CONTEXT_TOKENS ({self.context_tokens}), so the prompt has room",
            )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        dotenv: str | os.PathLike[str] | None = ".env",
        **overrides: Any,
    ) -> Settings:
        """Settings from ``environ`` (default ``os.environ``), then ``dotenv``, then overrides.

        ``overrides`` use field names (``max_iterations=2``); a string value is parsed like
        the environment variable, any other value is checked the same way.
        """
        env = dict(os.environ if environ is None else environ)
        file_values = read_dotenv(dotenv) if dotenv else {}
        merged = {**file_values, **env}
        values: dict[str, Any] = {}
        for name, (var, parse) in SETTINGS_TABLE.items():
            raw = merged.get(var)
            if raw is not None and (raw.strip() or parse in (_text, _url, _secret)):
                values[name] = parse(var, raw)
        if "llm" not in values:
            has_remote = bool(merged.get("OPENAI_API_KEY", "").strip()) or bool(
                merged.get("OPENAI_BASE_URL", "").strip()
            )
            values["llm"] = "openai" if has_remote else "offline"
        known = {f.name for f in fields(cls)}
        for name, value in overrides.items():
            if name not in known:
                raise ConfigError(name, value, "a setting name: " + ", ".join(sorted(known)))
            var, parse = SETTINGS_TABLE[name]
            values[name] = parse(var, value if isinstance(value, str) else _as_text(value))
        return cls(**values)

    def secrets(self) -> tuple[str, ...]:
        """The keys, tokens and URL passwords in these settings, for ``crag.safe_text.redact``."""
        from urllib.parse import urlsplit

        found = [self.openai_api_key, self.jira_api_token, self.confluence_api_token]
        for url in (self.openai_base_url, self.jira_base_url, self.confluence_base_url):
            try:
                found.append((urlsplit(url).password or "") if url else "")
            except ValueError:
                pass
        return tuple(s for s in found if s)

    def variable(self, name: str) -> str:
        """The environment variable behind a field, for messages."""
        return SETTINGS_TABLE[name][0]


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return ""
    return str(value)


def _shown_url(raw: str) -> str:
    from .safe_text import redact_message

    return redact_message(raw)


def _read_small_regular_file(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes; None when absent.

    Opened without blocking and checked after opening, so a FIFO, a device (``/dev/zero``)
    or a folder behind the name is refused instead of read forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(".env", os.fspath(path), f"a readable file ({exc.strerror or exc})") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(".env", os.fspath(path), "a regular file (not a folder, device or pipe)")
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


def read_dotenv(path: str | os.PathLike[str]) -> dict[str, str]:
    """``KEY=VALUE`` lines of a ``.env`` file; a missing file is an empty mapping.

    Accepts ``export KEY=VALUE``, single or double quotes, blank lines, ``#`` comments and a
    UTF-8 byte-order mark. Only a regular file of at most ``DOTENV_MAX_BYTES`` is read; a
    NUL character in a value is refused (no environment variable can hold one).
    """
    data = _read_small_regular_file(path, DOTENV_MAX_BYTES)
    if data is None:
        return {}
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(".env", os.fspath(path), f"a UTF-8 file (byte {exc.start} is not UTF-8)") from exc
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        if "\x00" in value or "\x00" in key:
            raise ConfigError(key, value, "a value without NUL characters", secret=key in SECRET_VARIABLES)
        values[key] = value
    return values


def secret_values(environ: Mapping[str, str] | None = None, dotenv: str | os.PathLike[str] | None = ".env") -> tuple[str, ...]:
    """The secrets configured for crag (keys, tokens, passwords in URLs), for redaction.

    Never raises: a ``.env`` that cannot be read contributes nothing.
    """
    from urllib.parse import urlsplit

    env = dict(os.environ if environ is None else environ)
    try:
        file_values = read_dotenv(dotenv) if dotenv else {}
    except Exception:
        file_values = {}
    found: list[str] = []
    for source in (env, file_values):
        for var, value in source.items():
            if not isinstance(value, str) or not value.strip():
                continue
            if var in SECRET_VARIABLES or var.endswith(("_API_KEY", "_TOKEN", "_PASSWORD", "_SECRET")):
                found.append(value)
            elif var.endswith("_URL") or var == "KB_AGENT_STORE":
                try:
                    password = urlsplit(value.strip()).password
                except ValueError:
                    password = None
                if password:
                    found.append(password)
    return tuple(dict.fromkeys(found))
