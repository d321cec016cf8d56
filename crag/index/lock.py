"""The lock of the embedded store: one indexer at a time holds ``DIR/LOCK`` (``fcntl.flock``).

The holder removes the file when it lets go; readers never take it, they only ask whether an
indexer holds it (``being_built``). Only a regular file is ever opened for writing, and never
through a symbolic link: the index folder's layout is ``crag.index.layout``.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Callable

from ..errors import IndexStoreError

__all__ = ["DEFAULT_LOCK_TIMEOUT", "LOCK", "NOFOLLOW", "IndexLock", "being_built"]

LOCK = "LOCK"
DEFAULT_LOCK_TIMEOUT = 120.0
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class IndexLock:
    """An exclusive ``flock`` on ``DIR/LOCK``, waited for up to ``timeout`` seconds (``waiting``,
    when given, is called once when another indexer holds it, before the wait).

    The holder removes the file when it lets go (also when its update failed), so no LOCK
    is left behind by a run that ended; one killed outright leaves a file no one holds,
    which the next indexer takes over. A waiter that wins the lock on a file the previous
    holder has already removed starts again on the current file, so two indexers never
    hold locks on two different files.
    """

    def __init__(self, index_dir: str, timeout: float = DEFAULT_LOCK_TIMEOUT,
                 waiting: Callable[[], None] | None = None, taken: Callable[[], None] | None = None) -> None:
        self.index_dir = index_dir
        self.timeout = timeout
        self.waiting = waiting
        self.taken = taken  # called once the lock is held (the store tidies its folder)
        self._fd: int | None = None
        self._path = os.path.join(index_dir, LOCK)

    def _open(self) -> int:
        """The lock file, created if need be. Only a regular file is written: never through a
        symbolic link (it would truncate what the link names, a document perhaps), nor a named
        pipe or device (``O_NONBLOCK``: opening a pipe never waits)."""
        flags = os.O_RDWR | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._path, flags, 0o644)
        except OSError as exc:
            if os.path.islink(self._path):
                raise self._not_crags("a symbolic link") from exc
            raise IndexStoreError(
                f"cannot create the lock file {self._path} ({exc.strerror or exc}); the index is unchanged: "
                "check --index or KB_AGENT_INDEX_DIR",
                self.index_dir,
            ) from exc
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise self._not_crags("a named pipe" if stat.S_ISFIFO(mode) else "not a regular file")
        return fd

    def _not_crags(self, what: str) -> IndexStoreError:
        return IndexStoreError(
            f"the lock file {self._path} is {what}, which crag never makes; the index is unchanged: remove it "
            "and run the command again",
            self.index_dir,
        )

    def _is_current(self, fd: int) -> bool:
        """Whether ``fd`` is still the file at ``DIR/LOCK`` (not one its holder removed)."""
        try:
            on_disk = os.stat(self._path)
        except OSError:
            return False
        mine = os.fstat(fd)
        return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)

    def __enter__(self) -> IndexLock:
        deadline = time.monotonic() + self.timeout
        fd = self._open()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if self.waiting is not None:
                    self.waiting()
                    self.waiting = None  # once
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise IndexStoreError(
                        f"another crag index is running on {self.index_dir} (waited {self.timeout:g}s): "
                        "try again when it has finished",
                        self.index_dir,
                    ) from None
                time.sleep(0.05)
                continue
            if self._is_current(fd):
                break
            os.close(fd)  # the previous holder removed this file as it let go: take the current one
            fd = self._open()
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass
        self._fd = fd
        if self.taken is not None:
            self.taken()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            try:
                try:
                    os.unlink(self._path)  # while still held: a waiter notices and starts again
                except OSError:
                    pass
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


def being_built(index_dir: str) -> bool:
    """Whether an indexer holds ``DIR/LOCK`` now (a reader asks, creating nothing)."""
    try:  # a named pipe or a link put there is not waited on nor followed
        fd = os.open(os.path.join(index_dir, LOCK), os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing lets go of a lock this probe took
    return False
