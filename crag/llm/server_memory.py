"""What crag learnt about a chat server, kept in a record its owner can see and pass on.

A server that refused structured output of one kind, or a request parameter (``temperature``,
``max_tokens`` under its old name), or that ignored ``logprobs``, is not asked the same way
again: the next request is adapted. That memory changes what later requests send (whether
grades can be read through token probabilities, among others), so it is a record, not a
module-level dict: ``OpenAIChatModel(memory=...)`` takes the one to use. By default it is
``PROCESS``, shared by the process's chat models (SPEC §5: what worked is remembered for the rest
of the process); an embedding service that wants Agents independent passes each its own. Every
request the memory changes says so (``Completion.adapted``, audited ``request_adapted`` with the
node and what was left out or sent another way), so two identical questions that behave
differently show why. Which parameter a refused request named is ``refused_param``'s to say.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from .logprobs import LOGPROBS, refuses_logprobs
from .retry import context_overflow, server_message

__all__ = ["ADAPTABLE", "PROCESS", "ServerMemory", "adapted", "refused_param"]

Key = tuple[str, str]  # (server URL, model)

# Request parameters a model may refuse, and what is sent instead: the reply budget under
# its newer name, or no temperature (the model's default).
ADAPTABLE = ("max_tokens", "temperature")


class ServerMemory:
    """Per (server, model): the structured-output format that worked, and the parameters refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._formats: dict[Key, str] = {}
        self._refused: dict[Key, frozenset[str]] = {}

    def format(self, key: Key, default: str) -> str:
        with self._lock:
            return self._formats.get(key, default)

    def remember_format(self, key: Key, fmt: str) -> None:
        with self._lock:
            self._formats[key] = fmt

    def refused(self, key: Key) -> frozenset[str]:
        with self._lock:
            return self._refused.get(key, frozenset())

    def remember_refused(self, key: Key, param: str) -> None:
        with self._lock:
            self._refused[key] = self._refused.get(key, frozenset()) | {param}

    def as_dict(self) -> dict[str, dict[str, object]]:
        """What is remembered, by ``server model``, for display."""
        with self._lock:
            keys = sorted(set(self._formats) | set(self._refused))
            return {f"{s} {m}": {"format": self._formats.get((s, m)), "refused": sorted(self._refused.get((s, m), ()))}
                    for s, m in keys}


PROCESS = ServerMemory()  # the default: what the process's chat models learnt, for the rest of it


def adapted(request: Any, refused: frozenset[str], remembered_format: str, fmt: str, first_format: str) -> tuple[str, ...]:
    """How the memory a request started with (``refused``, ``remembered_format``) changed it:
    the parameters left out or sent another way, and the format used instead of ``first_format``."""
    notes = [name for name, wanted in (("temperature", request.temperature is not None),
                                       ("max_tokens", request.max_tokens is not None),
                                       ("logprobs", bool(request.logprobs))) if wanted and name in refused]
    if request.reply_schema is not None and remembered_format != first_format and fmt == remembered_format:
        notes.append(f"response_format={fmt}")
    return tuple(notes)


def refused_param(exc: Any, params: Mapping[str, Any]) -> str | None:
    """The parameter of ``params`` that the refusal ``exc`` (a 400 or 422 ``APIStatusError``)
    names and crag can send another way, if any: "Unsupported parameter: 'name'" or
    "Unsupported value: 'name' ..." (OpenAI's codes ``unsupported_parameter`` and
    ``unsupported_value`` with ``param``), or ``logprobs`` (``refuses_logprobs``). A value that is
    merely too large (a budget beyond the window) is not a refusal of the parameter. The server's
    own words are read as well as the SDK's message, which is "Error code: 422" alone for a body
    without ``error`` (FastAPI's ``{"detail": [{"loc": ["body", "logprobs"], ...}]}``)."""
    named = getattr(exc, "param", None)
    code = getattr(exc, "code", None)
    text = f"{getattr(exc, 'message', '') or exc} {server_message(exc)}"
    if refuses_logprobs(params, named, text) and context_overflow(exc, server_message(exc)) is None:
        return LOGPROBS
    for param in ADAPTABLE:
        if param not in params:
            continue
        if (named == param and code in ("unsupported_parameter", "unsupported_value")) or (
                f"nsupported parameter: '{param}'" in text or f"nsupported value: '{param}'" in text):
            return param
    return None
