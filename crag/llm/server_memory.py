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
differently show why.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["PROCESS", "ServerMemory", "adapted"]

Key = tuple[str, str]  # (server URL, model)


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
