"""An SDK client that can be closed while other threads send requests through it.

``close`` puts a fresh client (which holds no connection until it sends a request) in the
closed one's place at once; the old one is closed when the last request using it ends, not
under it. So an ``Agent`` closed while other threads ask lets those questions finish, and
an agent asked again after ``close`` simply uses the fresh client (docs/architecture.md).

A process forked from one that holds a client (a server's workers started after the agent
was made) does not share the parent's connections: two processes writing on one keep-alive
connection read each other's replies. ``fork_safe`` registers an object whose
``_forked()`` drops what it holds in the child, before the child runs anything else.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LeasedClient", "fork_safe"]

_HOLDERS: weakref.WeakSet[Any] = weakref.WeakSet()


def fork_safe(holder: Any) -> None:
    """Call ``holder._forked()`` in every process forked from this one while it lives."""
    _HOLDERS.add(holder)


def _in_child() -> None:
    for holder in list(_HOLDERS):
        holder._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)


class LeasedClient:
    """``make()`` builds a client with a ``close()``; ``use()`` lends the current one."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._client = make()
        self._users: dict[int, int] = {}  # id(client) -> requests using it
        self._retired: dict[int, Any] = {}  # closed by ``close`` while in use: closed by its last user
        fork_safe(self)

    def _forked(self) -> None:
        """In a forked child: the parent's client and its connections are left to the parent
        (not closed: closing them here could end the parent's requests)."""
        self._lock = threading.Lock()
        self._client = self._make()
        self._users, self._retired = {}, {}

    @contextmanager
    def use(self) -> Iterator[Any]:
        with self._lock:
            client = self._client
            self._users[id(client)] = self._users.get(id(client), 0) + 1
        try:
            yield client
        finally:
            with self._lock:
                left = self._users[id(client)] - 1
                if left:
                    self._users[id(client)] = left
                else:
                    del self._users[id(client)]
                retired = self._retired.pop(id(client), None) if not left else None
            if retired is not None:
                retired.close()

    def close(self) -> None:
        fresh = self._make()
        with self._lock:
            closed, self._client = self._client, fresh
            if self._users.get(id(closed)):
                self._retired[id(closed)] = closed
                return
        closed.close()
