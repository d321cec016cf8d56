"""Settings: read from the process environment, then from ``.env`` (the environment wins).

Every setting has a default. A value that is set is validated, and a bad one raises
``ConfigError`` naming the variable and what it accepts; the CLI turns that into one line
and exit status 2. ``Settings.from_env(**overrides)`` takes the same settings by field
name for library users (``Agent.from_env(max_iterations=2)``), validated the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attrs import fields, frozen

from .errors import ConfigError

__all__ = ["SETTINGS_TABLE", "Settings", "read_dotenv"]


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
        if value != value or value < lo or (hi is not None and value > hi):
            raise ConfigError(var, raw, what)
        return value

    return parse


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
    return raw.strip()


def _nonempty(var: str, raw: str) -> str:
    value = raw.strip()
    if not value:
        raise ConfigError(var, raw, "a non-empty name")
    return value


def _url(var: str, raw: str) -> str | None:
    value = raw.strip().rstrip("/")
    if not value:
        return None
    if not value.startswith(("http://", "https://")):
        raise ConfigError(var, raw, "an http:// or https:// URL")
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
    "top_k": ("KB_AGENT_TOP_K", _int(1)),
    "index_dir": ("KB_AGENT_INDEX_DIR", _nonempty),
    "llm": ("KB_AGENT_LLM", _backend),
    "model": ("KB_AGENT_MODEL", _nonempty),
    "llm_timeout": ("KB_AGENT_LLM_TIMEOUT", _float(0.001, None, "a number of seconds > 0")),
    "llm_max_retries": ("KB_AGENT_LLM_MAX_RETRIES", _int(0)),
    "embedder": ("KB_AGENT_EMBEDDER", _choice("hash", "openai")),
    "embedding_model": ("KB_AGENT_EMBEDDING_MODEL", _nonempty),
    "openai_api_key": ("OPENAI_API_KEY", _text),
    "openai_base_url": ("OPENAI_BASE_URL", _url),
    "jira_base_url": ("JIRA_BASE_URL", _url),
    "jira_email": ("JIRA_EMAIL", _text),
    "jira_api_token": ("JIRA_API_TOKEN", _text),
    "confluence_base_url": ("CONFLUENCE_BASE_URL", _url),
    "confluence_email": ("CONFLUENCE_EMAIL", _text),
    "confluence_api_token": ("CONFLUENCE_API_TOKEN", _text),
    "web_fetch": ("KB_AGENT_WEB_FETCH", _switch),
    "embedding_base_url": ("KB_AGENT_EMBEDDING_BASE_URL", _url),
}


@frozen
class Settings:
    """All of crag's configuration. Field defaults are SPEC §3's defaults."""

    max_iterations: int = 3
    auto_approve_max_items: int = 2
    vector_score_threshold: float = 0.8
    drop_threshold: float = 0.3
    generate_threshold: float = 0.7
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

    def __attrs_post_init__(self) -> None:
        if self.drop_threshold > self.generate_threshold:
            raise ConfigError(
                "KB_AGENT_DROP_THRESHOLD",
                self.drop_threshold,
                f"a number no greater than KB_AGENT_GENERATE_THRESHOLD ({self.generate_threshold})",
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
            if raw is not None and (raw.strip() or parse in (_text, _url)):
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

    def variable(self, name: str) -> str:
        """The environment variable behind a field, for messages."""
        return SETTINGS_TABLE[name][0]


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return ""
    return str(value)


def read_dotenv(path: str | os.PathLike[str]) -> dict[str, str]:
    """``KEY=VALUE`` lines of a ``.env`` file; a missing file is an empty mapping.

    Accepts ``export KEY=VALUE``, single or double quotes, blank lines and ``#`` comments.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(".env", str(path), f"a readable UTF-8 file ({exc})") from exc
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
        values[key] = value
    return values
