"""The embedded store: FAISS + SQLite generations in ``KB_AGENT_INDEX_DIR`` (a ``Store``).

The default: nothing to run. ``crag.index.layout`` describes the folder and how an update
is published atomically; ``embedded_write`` writes a generation and ``store`` searches one.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any

from ..errors import IndexStoreError
from ..ports import Embedder, FileRecord, StoreState
from . import integrity, layout
from .embedded_write import EmbeddedUpdate
from .fusion import SearchWeights
from .store import IndexReader, indexed_roots, open_index

__all__ = ["EmbeddedStore"]


class EmbeddedStore:
    """The index in one folder (see the module docstring)."""

    def __init__(self, index_dir: str | os.PathLike[str]) -> None:
        self.index_dir = os.path.abspath(index_dir)
        self.location = self.index_dir
        self.reindex_hint = layout.reindex_hint(self.index_dir)

    def __repr__(self) -> str:
        return f"EmbeddedStore({self.index_dir!r})"

    def _make_dir(self) -> None:
        layout.check_link(self.index_dir)
        try:
            os.makedirs(self.index_dir, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise integrity.not_a_folder(self.index_dir) from exc
        except OSError as exc:
            raise IndexStoreError(
                f"cannot create the index folder {self.index_dir} ({exc.strerror or exc}): check --index or KB_AGENT_INDEX_DIR",
                self.index_dir,
            ) from exc

    # -- reading ---------------------------------------------------------------------------

    def version(self) -> str | None:
        return layout.current_version(self.index_dir)

    def state(self, files: bool = True, check: bool = False) -> StoreState | None:
        """The published generation; None when there is none. ``check`` verifies its vectors."""
        if layout.read_current(self.index_dir) is None:
            return None
        gen = layout.open_generation(self.index_dir, verify=check)
        try:
            if check:
                layout.read_vectors(gen, mmap=True)
            roots = tuple(r for (r,) in gen.conn.execute("SELECT path FROM roots ORDER BY path"))
            records = {}
            if files:
                records = {
                    p: FileRecord(p, s, m, h, c)
                    for p, s, m, h, c in gen.conn.execute("SELECT path, size, mtime_ns, sha256, chunks FROM files")
                }
            meta = gen.meta
            return StoreState(
                layout.generation_version(gen),
                meta.get("embedder", "unknown"),
                integrity.int_meta(meta, "dim", self.index_dir, self.reindex_hint, 0),
                meta.get("chunker", ""),
                integrity.int_meta(meta, "chunks", self.index_dir, self.reindex_hint, 0),
                roots,
                MappingProxyType(records),
            )
        except sqlite3.Error as exc:
            raise IndexStoreError(
                f"the index database in {self.index_dir} is damaged ({exc}): {self.reindex_hint}", self.index_dir
            ) from exc
        finally:
            gen.close()

    def roots(self, salvage: bool = False) -> tuple[str, ...]:
        if salvage:
            return layout.salvage_roots(self.index_dir)
        return indexed_roots(self.index_dir)

    def building(self) -> bool:
        return layout.being_built(self.index_dir)

    def open_retriever(self, embedder: Embedder, weights: SearchWeights | None = None) -> IndexReader:
        return open_index(self.index_dir, embedder, weights)

    # -- writing ---------------------------------------------------------------------------

    def writer_lock(self, timeout: float, waiting: Callable[[], None] | None = None) -> AbstractContextManager[object]:
        self._make_dir()
        # Once held: what an indexer killed outright left behind goes (layout.tidy).
        return layout.IndexLock(self.index_dir, timeout, waiting, taken=lambda: layout.tidy(self.index_dir))

    def begin(self, base: StoreState | None, embedder: Embedder, chunker: str) -> EmbeddedUpdate:
        """A new generation on top of ``base`` (which must be the published one), or from empty."""
        self._make_dir()
        if base is None:
            if not layout.current_exists(self.index_dir) and not layout.published_generations(self.index_dir):
                layout.cleanup(self.index_dir, None)  # leftovers of an indexer killed before its first publish
            return _WriteErrors.around(lambda: EmbeddedUpdate(self.index_dir, embedder, None, chunker), self, False)
        gen = layout.open_generation(self.index_dir)
        try:
            if layout.generation_version(gen) != base.version:
                raise IndexStoreError(
                    f"the index in {self.index_dir} changed during the update: try again", self.index_dir
                )
            return _WriteErrors.around(lambda: EmbeddedUpdate(self.index_dir, embedder, gen, chunker), self, True)
        finally:
            gen.close()

    def close(self) -> None:
        pass


# What a full, read-only or forbidden disk looks like from the libraries that write a generation.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG})
_SQLITE_WRITE = re.compile(r"disk is full|readonly database|disk I/O error|unable to open database file", re.I)
_FAISS_WRITE = re.compile(r"error in (\S+?):.*\((" + "|".join(re.escape(os.strerror(e)) for e in sorted(_WRITE_ERRNOS)) + r")\)")


class _WriteErrors:
    """An ``EmbeddedUpdate`` whose disk errors (full, over quota, read-only, not allowed) are one
    ``IndexStoreError`` naming the path and saying that the published index is unchanged: the
    update writes only its own new generation, which ``abort`` removes."""

    def __init__(self, update: EmbeddedUpdate, store: EmbeddedStore, had_index: bool) -> None:
        self._update = update
        self._store = store
        self._had_index = had_index

    @classmethod
    def around(cls, make: Any, store: EmbeddedStore, had_index: bool) -> Any:
        try:
            return cls(make(), store, had_index)
        except (OSError, sqlite3.Error, RuntimeError) as exc:
            raise cls.translated(exc, store.index_dir, store.index_dir, had_index) from exc

    @staticmethod
    def translated(exc: BaseException, where: str, index_dir: str, had_index: bool) -> BaseException:
        """The one-line error for a disk that refused a write, else ``exc`` itself."""
        path, reason = where, None
        if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
            path, reason = exc.filename2 or exc.filename or where, exc.strerror  # a copy names its source first
        elif isinstance(exc, sqlite3.Error) and _SQLITE_WRITE.search(str(exc)):
            path, reason = os.path.join(where, layout.DATABASE), str(exc)
        elif isinstance(exc, RuntimeError) and (m := _FAISS_WRITE.search(str(exc))):
            path, reason = m.group(1), m.group(2)
        if reason is None:
            return exc
        kept = "the previous index is unchanged" if had_index else "nothing was indexed"
        return IndexStoreError(
            f"cannot write the index: {os.fspath(path)}: {reason}; {kept} (free some space, or point "
            f"--index or KB_AGENT_INDEX_DIR at a writable folder)",
            index_dir,
        )

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._update, name)
        if not callable(value) or name == "abort":
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except (OSError, sqlite3.Error, RuntimeError) as exc:
                error = self.translated(exc, self._update.gen_dir, self._store.index_dir, self._had_index)
                if error is exc:
                    raise
                raise error from exc

        return call
