"""The knowledge-base index: discovery, chunking, embedders and the FAISS + SQLite store.

The public entry points, for the CLI, the agent and library users:

* ``ensure_indexed(settings, roots, progress=None) -> IndexReport``: index ``roots`` into
  ``settings.index_dir`` when they are new or changed (cheap when nothing changed: a
  size + mtime check, no lock, no reads). It never re-embeds a whole index: an index built
  with another embedder raises ``EmbedderMismatchError`` telling the user to re-index.
* ``index_roots(settings, roots, progress=None) -> IndexReport``: what ``python -m crag
  index`` does: incremental update, re-embedding everything when the embedder changed.
* ``open_index(settings) -> IndexReader``: the published index opened for search with the
  configured embedder; ``reader.search(query, top_k, roots=None, mode="hybrid")`` returns
  ``Hit`` records best first, each with the chunk's cosine similarity in [0, 1] as
  ``score``.

``progress``, when given, is called as ``progress(files_done, files_total, path)``.

Importing this package is cheap: numpy, faiss and tiktoken are loaded on first use.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Settings
    from ..ports import Embedder
    from .build import IndexReport, Progress
    from .store import Hit, IndexReader, SearchWeights

__all__ = [
    "Hit",
    "IndexReader",
    "IndexReport",
    "SearchWeights",
    "ensure_indexed",
    "index_roots",
    "make_embedder",
    "open_index",
]


def make_embedder(settings: Settings) -> Embedder:
    """The embedder ``KB_AGENT_EMBEDDER`` names (``hash`` or ``openai``)."""
    from .embedders import make_embedder as make

    return make(settings)


def ensure_indexed(
    settings: Settings,
    roots: Sequence[str | os.PathLike[str]],
    progress: Progress | None = None,
    *,
    embedder: Embedder | None = None,
    lock_timeout: float | None = None,
) -> IndexReport:
    """Index ``roots`` when they are new or changed since the last run; cheap otherwise."""
    from .build import DEFAULT_LOCK_TIMEOUT, IndexReport, quick_check, update_index
    from .chunker import DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS

    embedder = embedder or make_embedder(settings)
    index_dir = os.path.abspath(settings.index_dir)
    current = quick_check(index_dir, roots, embedder, (DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS))
    if current is not None:
        files, chunks, generation = current
        from .discover import normalize_root

        return IndexReport(
            index_dir,
            tuple(normalize_root(r) for r in roots),
            embedder.name,
            unchanged=files,
            chunks_total=chunks,
            generation=generation,
        )
    return update_index(
        index_dir,
        roots,
        embedder,
        progress=progress,
        allow_reembed=False,
        lock_timeout=DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout,
    )


def index_roots(
    settings: Settings,
    roots: Sequence[str | os.PathLike[str]],
    progress: Progress | None = None,
    *,
    embedder: Embedder | None = None,
    lock_timeout: float | None = None,
) -> IndexReport:
    """Build or update the index of ``roots`` (``python -m crag index``)."""
    from .build import DEFAULT_LOCK_TIMEOUT, update_index

    return update_index(
        os.path.abspath(settings.index_dir),
        roots,
        embedder or make_embedder(settings),
        progress=progress,
        allow_reembed=True,
        lock_timeout=DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout,
    )


def open_index(
    settings: Settings, embedder: Embedder | None = None, weights: SearchWeights | None = None
) -> IndexReader:
    """The index in ``settings.index_dir`` opened for search with the configured embedder."""
    from .store import open_index as open_store

    return open_store(settings.index_dir, embedder or make_embedder(settings), weights)


def __getattr__(name: str) -> Any:
    if name in ("Hit", "IndexReader", "SearchWeights"):
        from . import store

        return getattr(store, name)
    if name == "IndexReport":
        from .build import IndexReport

        return IndexReport
    raise AttributeError(f"module 'crag.index' has no attribute {name!r}")
