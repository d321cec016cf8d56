"""crag's errors: one class per kind of failure a user can meet.

    CragError                      base; ``str(err)`` is one line a user can act on
    ├── ConfigError                a setting is malformed (names the variable)   exit 2
    │   └── UnknownSettingError    a name given in code is no setting (its value never shown)
    ├── UsageError                 bad command-line or library arguments          exit 2
    ├── KnowledgeBaseError         a knowledge-base path is missing or unreadable exit 1
    ├── IndexStoreError            the index is missing, damaged, locked, or was
    │   │                          built with another embedder                    exit 1
    │   ├── EmbedderMismatchError  the index's embedder is not the configured one
    │   ├── IndexFormatError       the index was written by a newer crag
    │   └── IndexUnavailableError  its database could not be read just now: not damage
    ├── LLMError                   the LLM server failed after retries            exit 1
    │   └── LLMTimeoutError        ... by not answering in time
    └── ToolError                  one tool call failed; recorded, never evidence

    CragWarning (a UserWarning)    something crag works around that a user should know
                                   (a skipped ignore line); the CLI prints each once
                                   as ``crag: warning: <message>``

Third-party exceptions (openai, faiss, sqlite3, OSError) are translated into these at the
one boundary that calls the library, and chained with ``raise ... from exc`` so the cause
stays in the traceback of a bug report. The CLI maps each class to its exit status and
prints ``crag: error: <message>``; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Any


class CragError(Exception):
    """Base of every error crag raises on purpose."""

    exit_status = 1

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its class, message and attributes, made again without ``__init__`` (whose
        parameters are not the message for every class): an error raised in a worker process
        (``ProcessPoolExecutor``, ``multiprocessing``) reaches the parent as itself."""
        import copyreg

        return copyreg.__newobj__, (type(self), *self.args), self.__dict__

    def cost_note(self) -> str:
        """What the question had cost when this failed (the ``spent`` usage the driver gives
        an error leaving a step after calls were paid for), to end its one line with: "; before it, this question made 3
        LLM calls (1,234 tokens)", or "" when it had made none. Tokens crag counted itself are said
        to be estimates, as the usage block says: "(1,234 tokens, estimated for 1 of 3 calls)"."""
        spent = getattr(self, "spent", None)
        calls = getattr(spent, "llm_calls", 0)
        if not calls:
            return ""
        estimated = getattr(spent, "estimated_calls", 0)
        guess = f", estimated for {estimated} of {calls} calls" if estimated else ""
        return (f"; before it, this question made {calls} LLM call{'' if calls == 1 else 's'} "
                f"({spent.total_tokens:,} tokens{guess})")


class ConfigError(CragError):
    """A setting (environment variable or ``.env`` entry) has a value crag cannot use.

    The message shows the value escaped and shortened, never raw; a secret's (``secret=True``)
    is not shown at all.
    """

    exit_status = 2

    def __init__(self, variable: str, value: object, accepts: str, *, secret: bool = False) -> None:
        from .safe_text import short_value

        self.variable = variable
        self.value = None if secret else value
        self.accepts = accepts
        if variable == ".env":  # the settings file itself: its path
            shown = f"the settings file {short_value(value)}"
        else:
            shown = f"{variable} (value not shown)" if secret else f"{variable}={short_value(value)}"
        super().__init__(f"{shown} is not valid: expected {accepts}")


class UnknownSettingError(ConfigError):
    """A name given in code (``Settings(...)``, ``from_env`` keywords) that is no setting.

    Its value is never shown: a key given under a mistyped name (``openai_key="sk-..."``) is
    still a key. The message names the closest setting and lists the known ones."""

    def __init__(self, name: str, known: tuple[str, ...], variables: dict[str, str] | None = None) -> None:
        import difflib

        from .safe_text import short_value

        self.variable, self.value, self.accepts = name, None, "a setting name: " + ", ".join(known)
        # The variable's name where the field's is meant (KB_AGENT_TOP_K for top_k) is a typo too.
        close = [variables[name.upper()]] if variables and name.upper() in variables else (
            difflib.get_close_matches(name, known, n=1, cutoff=0.6) if len(name) <= 100 else [])
        hint = f"; did you mean {close[0]}?" if close else ""
        CragError.__init__(self, f"{short_value(name, 100)} is not a crag setting{hint} (the settings: {', '.join(known)})")


class UsageError(CragError):
    """The command line or a library call was given arguments that make no sense.

    ``spent``, as ``LLMError.spent``: for a question found too long for the context window
    only at a later step, the usage of the calls it had already made (None otherwise)."""

    exit_status = 2
    spent: Any = None


class KnowledgeBaseError(CragError):
    """A knowledge-base root or file cannot be read."""

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(message)


class IndexStoreError(CragError):
    """The index in ``KB_AGENT_INDEX_DIR`` is missing, damaged or busy."""

    def __init__(self, message: str, index_dir: str | None = None) -> None:
        self.index_dir = index_dir
        super().__init__(message)


class EmbedderMismatchError(IndexStoreError):
    """The index was built with another embedder than the configured one."""


class IndexFormatError(IndexStoreError):
    """The index was written by a newer crag, in a format this one cannot read: never rebuilt."""


class IndexUnavailableError(IndexStoreError):
    """The index's database could not be read just now (not reached, a statement stopped, a right
    refused): not damage, so ``crag index`` stops instead of rebuilding it."""


class LLMError(CragError):
    """The LLM backend could not produce a reply (after its retries).

    ``spent`` is the question's usage (``crag.state.Usage``) before the call that failed: the
    calls already made and paid for, which no answer's usage block will show (None outside a
    question). ``latency_ms`` is how long the failed call took (a refused request that crag
    sends again fitted to a smaller window counts in that node's latency). ``billed`` is the
    failed call itself when the server finished it and counts it (a refusal, tool calls instead
    of an answer: a ``crag.state.Completion`` with its usage), which ``spent`` then includes."""

    def __init__(self, message: str, node: str | None = None, status: int | None = None) -> None:
        self.node = node
        self.status = status
        self.billed: Any = None
        self.spent: Any = None
        self.latency_ms = 0.0  # how long the failed call took, retries included
        super().__init__(message)


class LLMContextError(LLMError):
    """The server refused a request as longer than its context window; ``window`` is that
    window in tokens when the server said."""

    def __init__(self, message: str, node: str | None = None, status: int | None = None,
                 window: int | None = None) -> None:
        self.window = window
        super().__init__(message, node=node, status=status)


class LLMTimeoutError(LLMError):
    """The LLM server did not answer within ``KB_AGENT_LLM_TIMEOUT`` (after retries)."""


class ToolError(CragError):
    """One tool call failed. The driver records it in ``tool_history``; it never becomes evidence."""

    def __init__(self, tool: str, message: str) -> None:
        self.tool = tool
        super().__init__(f"{tool}: {message}")


class CragWarning(UserWarning):
    """Something crag works around but a user should know, said through ``warnings.warn``."""


__all__ = [
    "ConfigError",
    "CragError",
    "CragWarning",
    "EmbedderMismatchError",
    "IndexFormatError",
    "IndexStoreError",
    "IndexUnavailableError",
    "KnowledgeBaseError",
    "LLMContextError",
    "LLMError",
    "LLMTimeoutError",
    "ToolError",
    "UnknownSettingError",
    "UsageError",
]
