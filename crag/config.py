"""Settings: one record, read from the process environment, then from ``.env`` (the environment wins).

Each setting is declared once, as a field of ``Settings`` made by ``setting(variable,
kind, default)``: its environment variable, the ``Kind`` that reads it from text and holds
its range or choices, and ``node=True`` when the nodes read it (``crag.nodes.NodeConfig``
exposes exactly those). The kind is the field's attrs converter too, so a value given in
code is checked like one from the environment: ``Settings(max_iterations=0)`` raises the
``ConfigError`` that ``KB_AGENT_MAX_ITERATIONS=0`` does. ``Settings.from_env`` is the one
loader: it reads each field's variable from the environment and ``.env``; the CLI turns a
``ConfigError`` into one line and exit status 2. Adding a setting is one ``setting(...)``
field below (plus its line in ``.env.example``, which a test checks).
"""

from __future__ import annotations

import enum
import functools
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from attrs import field, fields, frozen

from .environment import (  # re-exported
    DOTENV_MAX_BYTES,
    INDEX_FOLDER,
    SECRET_VARIABLES,
    find_index_dir,
    find_secrets,
    read_dotenv,
    secret_values,
    shown_url,
    store_credentials,
    store_uri_ambiguous,
    unexpanded_variable,
    url_credentials_ambiguous,
)
from .errors import ConfigError, UnknownSettingError, UsageError
from .modes import (  # re-exported
    MAX_TOP_K,
    EmbedderKind,
    GraderStyle,
    GradingPolicyName,
    GroundingMode,
    LLMBackend,
    StructuredOutput,
)
from .setting_warnings import setting_warnings

__all__ = ["DOTENV_MAX_BYTES", "INDEX_FOLDER", "MAX_SECONDS", "SECRET_VARIABLES", "SETTINGS_TABLE", "EmbedderKind",
           "GroundingMode", "LLMBackend", "Settings", "StructuredOutput", "config_warnings", "find_index_dir",
           "find_secrets", "read_dotenv", "secret_values"]

MAX_SECONDS = 86400.0  # the longest duration a setting may hold: one day
MAX_ROUNDS = 100  # the most retrieval rounds a question may be given (each costs up to 3 LLM calls)
MAX_WINDOW = 10_000_000  # tokens: the largest context window a model offers (Llama 4 Scout's)
MAX_RETRIES = 10  # the most retries of one LLM request (each waits up to 8 s, or Retry-After)
# Variables crag reads besides the settings (the MCP server's tool descriptions).
OTHER_VARIABLES = ("KB_AGENT_MCP_ASK_DESCRIPTION", "KB_AGENT_MCP_SEARCH_DESCRIPTION", "KB_AGENT_MCP_READ_FILE_DESCRIPTION")


# -- kinds: how a setting is read from text, and what it accepts -----------------------------
# A kind is called as ``kind(variable, text)`` and returns the value or raises ConfigError
# naming the variable and what it accepts. It is also each field's converter (``setting``),
# over the text of a value given in code, so both paths check the same range.

Kind = Callable[[str, str], Any]

# Numbers in ASCII digits, as a shell writes them: int() and float() also take "1_000" and "５".
_INTEGER, _DECIMAL = re.compile(r"[+-]?[0-9]+"), re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


@frozen
class Integer:
    lo: int
    hi: int | None = None  # a count that bounds a loop has a ceiling: 10**9 rounds never end

    def __call__(self, var: str, raw: str) -> int:
        accepts = f"an integer >= {self.lo}" if self.hi is None else f"an integer from {self.lo} to {self.hi}"
        digits = raw.strip().lstrip("+").lstrip("0")
        if self.hi is None and _INTEGER.fullmatch(raw.strip()) and (len(digits) > 19 or int(digits or "0") > 10**18):
            raise ConfigError(var, raw, f"an integer from {self.lo} to 10^18")  # "an integer >= 0" was true of it
        try:  # int() refuses more than 4,300 digits
            value = int(raw) if _INTEGER.fullmatch(raw.strip()) else None
        except ValueError:
            value = None
        if value is None or value < self.lo or (self.hi is not None and value > self.hi):
            raise ConfigError(var, raw, accepts)
        return value


@frozen
class Number:
    lo: float
    hi: float
    accepts: str

    def __call__(self, var: str, raw: str) -> float:
        value = float(raw) if _DECIMAL.fullmatch(raw.strip()) else math.nan
        if not math.isfinite(value) or not self.lo <= value <= self.hi:
            raise ConfigError(var, raw, self.accepts)
        return value


def fraction() -> Number:
    return Number(0.0, 1.0, "a number between 0 and 1")


def seconds(lo: float, hi: float = MAX_SECONDS) -> Number:
    """A duration: a finite number of seconds in [lo, hi] (``inf`` and ``1e309`` are refused)."""
    return Number(lo, hi, f"a number of seconds between {lo:g} and {hi:g}")


@frozen
class Choice:
    """One of an enum's values, case-insensitive; the value is the enum member."""

    options: type[enum.StrEnum]

    def __call__(self, var: str, raw: str) -> Any:
        value = raw.strip().lower()
        try:
            return self.options(value)
        except ValueError:
            raise ConfigError(var, raw, "one of " + ", ".join(self.options)) from None


def _secret(var: str, raw: str) -> str:
    """A key or token sent in an HTTP header: printable ASCII, and never shown in a message."""
    value = raw.strip()
    for ch in value:
        if not " " < ch <= "~":
            what = ("a control character" if ch.isascii() and ch != " " else "a space" if ch.isspace()
                    else "bytes that are not UTF-8" if _not_utf8(ch) else "a non-ASCII character" if ch.isprintable()
                    else "an invisible character")
            raise ConfigError(
                var, None, f"printable ASCII without spaces (it contains {what}; HTTP headers carry nothing else)",
                secret=True,
            )
    return value


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


def _backend(var: str, raw: str) -> LLMBackend:
    value = raw.strip().lower()
    if value in tuple(LLMBackend):
        return LLMBackend(value)
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


def _folder(var: str, raw: str) -> str:
    """A folder name; ``~`` is the home folder, as a shell would read it (no shell reads ``.env``).
    ``$HOME`` or ``${HOME}`` in it is refused rather than made a folder of that name (one on disk is used)."""
    value = _nonempty(var, raw)
    if unexpanded_variable(value):
        raise ConfigError(var, raw, "a folder's path, in which $VARIABLES are not expanded (write ~ for your home folder)")
    return os.path.expanduser(value) if value.startswith("~") else value


def _not_utf8(text: str) -> bool:
    """Whether ``text`` holds bytes that were not UTF-8 (kept by Python as lone surrogates)."""
    return any("\ud800" <= ch <= "\udfff" for ch in text)


def _sent_text(var: str, raw: str) -> str:
    """Text that is sent to a server (an e-mail in a header): also valid UTF-8."""
    value = _text(var, raw)
    if _not_utf8(value):
        raise ConfigError(var, raw, "UTF-8 text (it holds bytes that are not UTF-8, and it is sent to a server)")
    return value


def _sent_name(var: str, raw: str) -> str:
    """A model's name: non-empty, sent to the server, so valid UTF-8."""
    return _nonempty(var, _sent_text(var, raw))


def _url(var: str, raw: str) -> str | None:
    value = raw.strip().rstrip("/")
    if not value:
        return None
    if not value.startswith(("http://", "https://")) or not value.isascii() or not value.isprintable() or " " in value:
        raise ConfigError(var, shown_url(raw), "an http:// or https:// URL (printable ASCII, no spaces)")
    if url_credentials_ambiguous(value):  # "http://bob:pa/ss@host": a URL parser takes "pa" for the port
        raise ConfigError(var, shown_url(raw), "an http:// or https:// URL with each @ / ? and # in its user "
                          "name or password percent-encoded (@ as %40, / as %2F, ? as %3F, # as %23)")
    try:  # a host and a port that an HTTP client can connect to: "http://[::1:8080" is not one
        parts = urlsplit(value)
        if not parts.hostname or parts.port == 0:  # reading a bad port raises ValueError
            raise ValueError("no host or port")
    except ValueError:
        raise ConfigError(var, shown_url(raw), "an http:// or https:// URL with a host and a port from 1 to 65535 "
                          "(http://127.0.0.1:8080/v1, http://[::1]:8080/v1)") from None
    try:  # what the resolver will do with it: an empty label ("a..b") or one over 63 characters fails there
        parts.hostname.encode("idna")
    except UnicodeError:
        raise ConfigError(var, shown_url(raw), "an http:// or https:// URL whose host name has no empty label "
                          "and none over 63 characters") from None
    return value


def _service_url(var: str, raw: str) -> str | None:
    """A Jira or Confluence base URL: the REST path is appended to it, and its tool sends no URL password."""
    value = _url(var, raw)
    if value and "@" in value.split("/")[2]:  # the user name or password: JIRA_EMAIL, JIRA_API_TOKEN
        raise ConfigError(var, shown_url(raw), f"an http:// or https:// URL without a user name or password, which "
                          f"go in {var.removesuffix('BASE_URL')}EMAIL and {var.removesuffix('BASE_URL')}API_TOKEN")
    if value and ("?" in value or "#" in value):
        raise ConfigError(var, shown_url(raw), "an http:// or https:// URL without a ? query or # fragment, as "
                          "crag appends the REST API's path to it")
    return value


def _store(var: str, raw: str) -> str:
    value = raw.strip()
    if value and (not value.startswith(("postgresql://", "postgres://")) or _not_utf8(value)
                  or any(ch < " " for ch in value)):
        raise ConfigError(var, shown_url(store_credentials(value)[1]), "empty (the embedded index in "
                          "KB_AGENT_INDEX_DIR) or a postgresql:// URI (UTF-8 text without control characters)")
    if value and store_uri_ambiguous(value):
        raise ConfigError(var, store_credentials(value)[1], "a postgresql:// URI with each @ and / in its user "
                          "name or password percent-encoded (@ as %40, / as %2F, and : # ? "
                          "as %3A %23 %3F)")
    return value


# Kinds whose empty text is a value (no URL, key or e-mail); for the others empty means the default.
READS_EMPTY = (_text, _sent_text, _url, _service_url, _secret)


def _as_text(value: Any) -> str:
    """A value given in code as the text a user would set, for its kind to read and check."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return ""
    return os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)  # not "b'sk-...'"


class _Adapting:
    """The default of a setting that adapts to others the user set (SPEC §3): resolved by
    ``Settings.__attrs_post_init__``, never seen outside it."""

    def __repr__(self) -> str:
        return "ADAPTING"


ADAPTING: Any = _Adapting()
# The defaults ADAPTING stands for, before they adapt.
CONTEXT_TOKENS, MAX_ANSWER_TOKENS, DROP_THRESHOLD, GENERATE_THRESHOLD = 8192, 1024, 0.3, 0.7


@frozen
class _Convert:
    """A field's converter: the field's kind over the text of the value (a string as is)."""

    variable: str
    kind: Kind

    def __call__(self, value: Any) -> Any:
        if value is ADAPTING:
            return value
        try:
            converted = self.kind(self.variable, value if isinstance(value, str) else _as_text(value))
        except ConfigError as exc:  # a bool refused is named as written (True), not as its text ("on")
            if not isinstance(value, bool) or exc.value is None:
                raise
            raise ConfigError(exc.variable, value, exc.accepts) from None
        # model=True is no model named "on"; a switch, or a choice with an "off" (grounding=False), reads a bool
        if isinstance(value, bool) and self.kind is not _switch and not isinstance(self.kind, Choice):
            raise ConfigError(self.variable, value, "a value of its own kind: only on/off settings take True or False")
        return converted


def setting(variable: str, kind: Kind, default: Any, *, node: bool = False) -> Any:
    """A ``Settings`` field: read from ``variable`` by ``kind``, which also checks values given in code.

    ``node=True``: the nodes read it (``NodeConfig`` exposes it).
    """
    return field(default=default, converter=_Convert(variable, kind),
                 metadata={"variable": variable, "kind": kind, "node": node})


@frozen(kw_only=True)
class Settings:
    """All of crag's configuration, one field per setting in the order of ``.env.example``.

    Field defaults are the documented defaults (README, Configuration). Each is given by its
    name; a name that is no setting is an ``UnknownSettingError`` (``_by_name_only``).
    """

    max_iterations: int = setting("KB_AGENT_MAX_ITERATIONS", Integer(1, MAX_ROUNDS), 3, node=True)
    auto_approve_max_items: int = setting("KB_AGENT_AUTO_APPROVE_MAX_ITEMS", Integer(0), 2, node=True)
    vector_score_threshold: float = setting("KB_AGENT_VECTOR_SCORE_THRESHOLD", fraction(), 0.8, node=True)
    # Adapting defaults: 0.3 and 0.7, moved to a threshold the user set alone (__attrs_post_init__).
    drop_threshold: float = setting("KB_AGENT_DROP_THRESHOLD", fraction(), ADAPTING, node=True)
    generate_threshold: float = setting("KB_AGENT_GENERATE_THRESHOLD", fraction(), ADAPTING, node=True)
    grade_memory: bool = setting("KB_AGENT_GRADE_MEMORY", _switch, False, node=True)
    grader: GraderStyle = setting("KB_AGENT_GRADER", Choice(GraderStyle), GraderStyle.BATCH, node=True)
    grading_policy: GradingPolicyName = setting("KB_AGENT_GRADING_POLICY", Choice(GradingPolicyName), GradingPolicyName.DEFAULT, node=True)
    top_k: int = setting("KB_AGENT_TOP_K", Integer(1, MAX_TOP_K), 5, node=True)
    index_dir: str = setting("KB_AGENT_INDEX_DIR", _folder, ".crag")
    # Adapting default: openai when a key or a server is set, else offline (__attrs_post_init__).
    llm: LLMBackend = setting("KB_AGENT_LLM", _backend, ADAPTING)
    model: str = setting("KB_AGENT_MODEL", _sent_name, "gpt-4o-mini")
    llm_timeout: float = setting("KB_AGENT_LLM_TIMEOUT", seconds(0.001), 60.0)
    llm_max_retries: int = setting("KB_AGENT_LLM_MAX_RETRIES", Integer(0, MAX_RETRIES), 3)
    embedder: EmbedderKind = setting("KB_AGENT_EMBEDDER", Choice(EmbedderKind), EmbedderKind.HASH)
    embedding_model: str = setting("KB_AGENT_EMBEDDING_MODEL", _sent_name, "text-embedding-3-small")
    openai_api_key: str = setting("OPENAI_API_KEY", _secret, "")
    openai_base_url: str | None = setting("OPENAI_BASE_URL", _url, None)
    jira_base_url: str | None = setting("JIRA_BASE_URL", _service_url, None)
    jira_email: str = setting("JIRA_EMAIL", _sent_text, "")
    jira_api_token: str = setting("JIRA_API_TOKEN", _secret, "")
    confluence_base_url: str | None = setting("CONFLUENCE_BASE_URL", _service_url, None)
    confluence_email: str = setting("CONFLUENCE_EMAIL", _sent_text, "")
    confluence_api_token: str = setting("CONFLUENCE_API_TOKEN", _secret, "")
    web_fetch: bool = setting("KB_AGENT_WEB_FETCH", _switch, False)
    embedding_base_url: str | None = setting("KB_AGENT_EMBEDDING_BASE_URL", _url, None)
    temperature: float = setting("KB_AGENT_TEMPERATURE", Number(0.0, 2.0, "a number between 0 and 2"), 0.2, node=True)
    # Adapting default: 1024, or half of a smaller KB_AGENT_CONTEXT_TOKENS (__attrs_post_init__).
    max_answer_tokens: int = setting("KB_AGENT_MAX_ANSWER_TOKENS", Integer(16, MAX_WINDOW // 2), ADAPTING, node=True)
    # Adapting default: 8192, or twice a larger KB_AGENT_MAX_ANSWER_TOKENS (__attrs_post_init__).
    context_tokens: int = setting("KB_AGENT_CONTEXT_TOKENS", Integer(1024, MAX_WINDOW), ADAPTING, node=True)
    structured_output: StructuredOutput = setting(
        "KB_AGENT_STRUCTURED_OUTPUT", Choice(StructuredOutput), StructuredOutput.AUTO)
    grounding: GroundingMode = setting("KB_AGENT_GROUNDING", Choice(GroundingMode), GroundingMode.NOTE, node=True)
    store: str = setting("KB_AGENT_STORE", _store, "")
    embedding_path: str = setting("KB_AGENT_EMBEDDING_PATH", _text, "")
    log: bool = setting("KB_AGENT_LOG", _switch, True)
    show_usage: bool = setting("KB_AGENT_SHOW_USAGE", _switch, True)

    def __attrs_post_init__(self) -> None:
        # A default adapts to the values the user set (SPEC §3): only those can conflict, so
        # Settings(context_tokens=1024) has an answer budget of 512, Settings(max_answer_tokens=6000)
        # a context window of 12000, and
        # Settings(drop_threshold=0.8) a generate threshold of 0.8.
        adapted: dict[str, Any] = {}
        if self.llm is ADAPTING:  # as in the environment, a key or a server given in code
            adapted["llm"] = LLMBackend.OPENAI if self.openai_api_key or self.openai_base_url else LLMBackend.OFFLINE
        if self.context_tokens is ADAPTING:  # a set answer budget over half of 8192 has room made for it
            answer = self.max_answer_tokens
            object.__setattr__(self, "context_tokens", CONTEXT_TOKENS if answer is ADAPTING
                               else min(MAX_WINDOW, max(CONTEXT_TOKENS, 2 * answer)))
        if self.max_answer_tokens is ADAPTING:
            adapted["max_answer_tokens"] = min(MAX_ANSWER_TOKENS, self.context_tokens // 2)
        drop, generate = self.drop_threshold, self.generate_threshold
        if drop is ADAPTING:
            adapted["drop_threshold"] = DROP_THRESHOLD if generate is ADAPTING else min(DROP_THRESHOLD, generate)
        if generate is ADAPTING:
            adapted["generate_threshold"] = GENERATE_THRESHOLD if drop is ADAPTING else max(GENERATE_THRESHOLD, drop)
        for name, value in adapted.items():
            object.__setattr__(self, name, value)
        # Rules across settings; each field's own range is checked by its converter.
        if self.embedder == EmbedderKind.LOCAL and not self.embedding_path.strip():
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

        ``overrides`` use field names (``max_iterations=2``); a string value is read like
        the environment variable (bytes as the text they hold), any other value is checked the same way. A bad value's
        error says where it came from (the environment, ``.env`` or an argument). Without
        ``KB_AGENT_INDEX_DIR`` or an ``index_dir`` override, the index is the nearest ``.crag``
        (``find_index_dir``).
        """
        _check_sources(environ, dotenv)
        # A mapping given in code may hold numbers or booleans: read as their text, None as unset.
        env = {k: v if isinstance(v, str) else _as_text(v)
               for k, v in (os.environ if environ is None else environ).items() if v is not None}
        file_values = read_dotenv(dotenv) if dotenv else {}
        merged = {**file_values, **env}
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}  # variable -> where the user set it, for errors across settings
        for f in fields(cls):
            var, kind = f.metadata["variable"], f.metadata["kind"]
            raw = merged.get(var)  # a setting given as an argument wins, as the environment wins over .env
            if raw is not None and f.name not in overrides and (raw.strip() or kind in READS_EMPTY):
                origin = "set in the environment" if var in env else f"set in {os.fspath(dotenv)}"
                values[f.name] = _with_origin(kind, var, raw, origin)
                origins[var] = origin
        if "index_dir" not in values and "index_dir" not in overrides:
            values["index_dir"] = find_index_dir()
        for name in overrides:  # a name that is no setting is said first (its value never: it may be a key)
            if name not in FIELD_NAMES:
                raise unknown_setting(name)
        for name, value in overrides.items():
            convert = getattr(fields(cls), name).converter
            values[name] = _with_origin(lambda _var, raw, c=convert: c(raw), name, value, "given as an argument")
            origins[getattr(fields(cls), name).metadata["variable"]] = "given as an argument"
        # Settings not given keep their adapting defaults: KB_AGENT_LLM unset is openai when
        # OPENAI_API_KEY or OPENAI_BASE_URL is set (in the environment, .env or an argument),
        # KB_AGENT_DROP_THRESHOLD=0.8 alone raises the GENERATE threshold to 0.8, a small
        # KB_AGENT_CONTEXT_TOKENS lowers the answer budget (Settings.__attrs_post_init__).
        try:
            return cls(**values)
        except ConfigError as exc:  # a rule across settings: say where the blamed value was set
            if exc.variable not in origins:
                raise
            raise ConfigError(exc.variable, exc.value, f"{exc.accepts} ({origins[exc.variable]})",
                              secret=exc.value is None) from None

    def secrets(self) -> tuple[str, ...]:
        """The keys, tokens and URL passwords of these settings (every URL's, the store's too)
        and those configured in the environment and ``.env`` (``secret_values``), for
        ``crag.safe_text``: what ``find_secrets`` finds in both."""
        own = {f.metadata["variable"]: _as_text(getattr(self, f.name)) for f in fields(Settings)}
        return tuple(dict.fromkeys((*find_secrets(own), *secret_values())))

    def __repr__(self) -> str:
        """The settings with their keys and tokens as ``***`` and every other secret (a URL's
        password) masked: a repr gets printed, logged and shown by failing tests."""
        from .safe_text import REDACTED, redact_message

        shown = ", ".join(
            f"{f.name}={(REDACTED if getattr(self, f.name) else '') if f.metadata['kind'] is _secret else getattr(self, f.name)!r}"
            for f in fields(Settings))
        return f"Settings({redact_message(shown, self.secrets())})"

    def variable(self, name: str) -> str:
        """The environment variable behind a field, for messages."""
        return getattr(fields(Settings), name).metadata["variable"]


# field name -> (environment variable, kind), read from the fields: for messages, docs and tests.
SETTINGS_TABLE: dict[str, tuple[str, Kind]] = {
    f.name: (f.metadata["variable"], f.metadata["kind"]) for f in fields(Settings)
}
FIELD_NAMES = tuple(sorted(SETTINGS_TABLE))


def unknown_setting(name: str) -> UnknownSettingError:
    """The error for ``name`` given in code where a setting's name belongs."""
    return UnknownSettingError(str(name), FIELD_NAMES, {var: f for f, (var, _) in SETTINGS_TABLE.items()})


def _by_name_only(init: Callable[..., None]) -> Callable[..., None]:
    """attrs' ``Settings.__init__`` with crag's errors for what it would raise TypeError for:
    a value given by position, a name that is no setting (``Settings(foo=1)``, ``evolve``)."""

    @functools.wraps(init)
    def __init__(self: Settings, *args: Any, **values: Any) -> None:
        if args:
            raise UsageError("Settings takes each setting by its name (Settings(top_k=8)), not by position")
        for name in values:
            if name not in SETTINGS_TABLE:
                raise unknown_setting(name)
        init(self, **values)

    return __init__


Settings.__init__ = _by_name_only(Settings.__init__)  # type: ignore[method-assign]


def _check_sources(environ: Any, dotenv: Any) -> None:
    """``UsageError`` for an ``environ`` or ``dotenv`` of ``from_env`` that cannot be read as one."""
    if environ is not None and not isinstance(environ, Mapping):
        raise UsageError(f"environ must be a mapping of variable names to values, not {type(environ).__name__}")
    names = [name for name in environ if not isinstance(name, str)] if environ is not None else []
    if names:  # os.environ's are; b"KB_AGENT_MODEL" would be passed over without a word
        raise UsageError(f"environ's variable names must be text (str), not {type(names[0]).__name__}")
    if dotenv is not None and (isinstance(dotenv, bool) or not isinstance(dotenv, (str, bytes, os.PathLike))):
        raise UsageError(f"dotenv must be the path of a .env file or None (no .env), not {type(dotenv).__name__}")


def _with_origin(kind: Callable[[str, Any], Any], var: str, raw: Any, origin: str) -> Any:
    """``kind(var, raw)``, its error saying where the value came from."""
    try:
        return kind(var, raw)
    except ConfigError as exc:
        raise ConfigError(exc.variable, exc.value, f"{exc.accepts} ({origin})", secret=exc.value is None) from None


def config_warnings(environ: Mapping[str, str] | None = None, dotenv: str | os.PathLike[str] | None = ".env") -> list[str]:
    """What looks like a mistake in the configuration but does not stop crag: ``.env`` lines
    that are not assignments, and ``KB_AGENT_*`` names crag does not know, with the closest
    known name (``crag.setting_warnings``; at most ``WARNINGS_SHOWN`` of each kind listed)."""
    return setting_warnings([var for var, _ in SETTINGS_TABLE.values()] + list(OTHER_VARIABLES), environ, dotenv)
