"""A total deadline for an HTTP request made through the openai SDK.

The SDK's ``timeout`` bounds each network read, not the request: a server that trickles
one byte at a time within that limit can hold a request forever. This module bounds the
whole exchange (connecting, sending, the status line, the headers, the body or the event
stream) without a thread: every read and write of the connection is given a time limit no
longer than what is left until the deadline, and one past it fails as the HTTP library's
own read timeout, which the SDK reports as ``APITimeoutError`` like any other timeout.

    client = openai.OpenAI(..., http_client=deadline_http_client(openai))
    with request_deadline(60.0):
        client.chat.completions.create(...)   # at most 60 s in all, stream included

The deadline lives in a context variable, so it follows the thread (or task) that makes
the request, and pooled connections obey whichever request is using them.

A call can also be cancelled from outside (an MCP client's ``notifications/cancelled``):
inside ``cancellable(event)``, waiting for the server is done in slices of at most
``CANCEL_CHECK`` seconds, and once ``event`` is set the next slice (and any retry's wait,
``pause``) raises ``Cancelled`` instead of waiting on: the worker thread that runs the call
ends within a fraction of a second, not when the LLM timeout runs out.
The hook is the connection pool's network backend (``httpcore``'s documented extension
point), reached through the transport of the client built here.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["CANCEL_CHECK", "Cancelled", "cancellable", "check_cancelled", "deadline_http_client", "pause", "remaining",
           "request_deadline"]

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("crag_request_deadline", default=None)
_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("crag_cancel", default=None)
CANCEL_CHECK = 0.2  # seconds: how soon a cancelled call stops waiting for a server


class Cancelled(Exception):
    """The call this work belongs to was cancelled by its caller."""


@contextlib.contextmanager
def cancellable(event: threading.Event) -> Iterator[None]:
    """Requests and retry waits inside the block stop soon after ``event`` is set (``Cancelled``)."""
    token = _CANCEL.set(event)
    try:
        yield
    finally:
        _CANCEL.reset(token)


def check_cancelled() -> None:
    """``Cancelled`` when the call this work belongs to was cancelled (for waits of other kinds)."""
    event = _CANCEL.get()
    if event is not None and event.is_set():
        raise Cancelled("the call was cancelled")


def pause(seconds: float) -> None:
    """``time.sleep`` that a cancellation cuts short (``Cancelled``)."""
    event = _CANCEL.get()
    if event is None:
        time.sleep(seconds)
    elif event.wait(seconds):
        raise Cancelled("the call was cancelled")


@contextlib.contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Every request made inside the block ends within ``seconds`` of entering it."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds left until the current deadline (None without one; never negative)."""
    deadline = _DEADLINE.get()
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _limit(timeout: float | None) -> float | None:
    left = remaining()
    if left is None:
        return timeout
    return left if timeout is None else min(timeout, left)


class _Stream:
    """A network stream whose every operation ends by the deadline."""

    def __init__(self, inner: Any, core: Any) -> None:
        self._inner = inner
        self._core = core

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if _CANCEL.get() is None:
            limit = _limit(timeout)
            if limit is not None and limit <= 0:
                raise self._core.ReadTimeout("the request's deadline has passed")
            return self._inner.read(max_bytes, limit)
        # A cancellable call: wait in slices, looking at the cancellation between them (a read
        # that timed out consumed nothing, so it is simply made again).
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            check_cancelled()
            limit = _limit(None if end is None else max(0.0, end - time.monotonic()))
            if limit is not None and limit <= 0:
                raise self._core.ReadTimeout("the request's deadline has passed")
            step = CANCEL_CHECK if limit is None else min(limit, CANCEL_CHECK)
            try:
                return self._inner.read(max_bytes, step)
            except self._core.ReadTimeout:
                if limit is not None and limit <= CANCEL_CHECK:
                    raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        check_cancelled()
        limit = _limit(timeout)
        if limit is not None and limit <= 0:
            raise self._core.WriteTimeout("the request's deadline has passed")
        self._inner.write(buffer, limit)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _limit(timeout)), self._core)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend:
    """The pool's network backend, with every stream it opens held to the deadline."""

    def __init__(self, inner: Any, core: Any) -> None:
        self._inner = inner
        self._core = core

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> _Stream:
        check_cancelled()
        limit = _limit(timeout)
        if limit is not None and limit <= 0:
            raise self._core.ConnectTimeout("the request's deadline has passed")
        stream = self._inner.connect_tcp(host, port, timeout=limit, local_address=local_address,
                                         socket_options=socket_options)
        return _Stream(stream, self._core)

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> _Stream:
        stream = self._inner.connect_unix_socket(path, timeout=_limit(timeout), socket_options=socket_options)
        return _Stream(stream, self._core)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _core_module(client: Any) -> Any:
    """The core of the HTTP library the SDK's client is built on (``httpcore2`` or ``httpcore``)."""
    for cls in type(client).__mro__:
        top = cls.__module__.split(".")[0]
        if top in ("httpx2", "httpx"):
            return importlib.import_module(top.replace("httpx", "httpcore"))
    raise RuntimeError(f"the openai SDK's HTTP client {type(client).__name__} is not one crag knows")


def deadline_http_client(openai_module: Any, **kwargs: Any) -> Any:
    """An HTTP client for ``openai.OpenAI(http_client=...)`` that honours ``request_deadline``.

    The SDK's own defaults (connection limits, redirects) are kept.
    """
    client = openai_module.DefaultHttpxClient(**kwargs)
    core = _core_module(client)
    transports = [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is not None and not isinstance(backend, _Backend):
            pool._network_backend = _Backend(backend, core)
    return client
