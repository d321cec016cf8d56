"""The embedded store: FAISS + SQLite generations in ``KB_AGENT_INDEX_DIR`` (a ``Store``).

The default: nothing to run. ``crag.index.layout`` describes the folder and how an update
is published atomically; ``embedded_write`` writes a generation and ``store`` searches one.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import AbstractContextManager
from types import MappingProxyType

from ..errors import IndexStoreError
from ..ports import Embedder, FileRecord, StoreState
from . import layout
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
        try:
            os.makedirs(self.index_dir, exist_ok=True)
        except OSError as exc:
            raise IndexStoreError(
                f"cannot create the index folder {self.index_dir} ({exc.strerror or exc}): check KB_AGENT_INDEX_DIR",
                self.index_dir,
            ) from exc

    # -- reading ---------------------------------------------------------------------------

    def version(self) -> str | None:
        return layout.current_generation(self.index_dir)

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
                gen.name,
                meta.get("embedder", "unknown"),
                int(meta.get("dim", "0")),
                meta.get("chunker", ""),
                int(meta.get("chunks", "0")),
                roots,
                MappingProxyType(records),
            )
        except sqlite3.Error as exc:
            raise IndexStoreError(
                f"the index database in {self.index_dir} is damaged ({exc}): {self.reindex_hint}", self.index_dir
            ) from exc
        finally:
            gen.close()

    def roots(self) -> tuple[str, ...]:
        return indexed_roots(self.index_dir)

    def open_retriever(self, embedder: Embedder, weights: SearchWeights | None = None) -> IndexReader:
        return open_index(self.index_dir, embedder, weights)

    # -- writing ---------------------------------------------------------------------------

    def writer_lock(self, timeout: float) -> AbstractContextManager[object]:
        self._make_dir()
        return layout.IndexLock(self.index_dir, timeout)

    def begin(self, base: StoreState | None, embedder: Embedder, chunker: str) -> EmbeddedUpdate:
        """A new generation on top of ``base`` (which must be the published one), or from empty."""
        self._make_dir()
        if base is None:
            if not layout.current_exists(self.index_dir):
                layout.cleanup(self.index_dir, None)  # leftovers of an indexer killed before its first publish
            return EmbeddedUpdate(self.index_dir, embedder, None, chunker)
        gen = layout.open_generation(self.index_dir)
        try:
            if gen.name != base.version:
                raise IndexStoreError(
                    f"the index in {self.index_dir} changed during the update: try again", self.index_dir
                )
            return EmbeddedUpdate(self.index_dir, embedder, gen, chunker)
        finally:
            gen.close()

    def close(self) -> None:
        pass
