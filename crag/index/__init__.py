"""The knowledge-base index: discovery, chunking, embedders and the stores.

The public entry points, for the CLI, the agent and library users:

* ``open_store(settings) -> Store``: where the index lives (the ``Store`` port of
  ``crag.ports``): the embedded FAISS + SQLite folder ``KB_AGENT_INDEX_DIR``, or the
  PostgreSQL database ``KB_AGENT_STORE`` names.
* ``ensure_indexed(settings, roots, progress=None) -> IndexReport``: index ``roots`` into
  ``settings.index_dir`` when they are new or changed (cheap when nothing changed: a
  size + mtime check, no lock, no reads). It never re-embeds a whole index: an index built
  with another embedder raises ``EmbedderMismatchError`` telling the user to re-index.
* ``index_roots(settings, roots, progress=None) -> IndexReport``: what ``python -m crag
  index`` does: incremental update, re-embedding everything when the embedder changed.
* ``drop_roots(settings, roots) -> IndexReport``: remove roots and the files only they hold.
* ``open_index(settings) -> Retriever``: the published index opened for search with the
  configured embedder; ``reader.search(query, top_k, roots=None, mode="hybrid")`` returns
  ``Hit`` records best first, each with the chunk's cosine similarity in [0, 1] as
  ``score``.

``progress``, when given, is called as ``progress(files_done, files_total, path)``.

Importing this package is cheap: numpy, faiss and tiktoken are loaded on first use.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import CragWarning

if TYPE_CHECKING:
    from ..config import Settings
    from ..ports import Embedder, Retriever, Store
    from .build import IndexReport, Progress
    from .fusion import SearchWeights
    from .store import Hit, IndexReader

__all__ = [
    "Hit",
    "IndexReader",
    "IndexReport",
    "SearchWeights",
    "SkippedFileWarning",
    "drop_roots",
    "ensure_indexed",
    "index_roots",
    "make_embedder",
    "open_index",
    "open_store",
]


def open_store(settings: Settings) -> Store:
    """The store ``KB_AGENT_STORE`` names: PostgreSQL for a ``postgresql://`` URI, else the
    embedded one in ``KB_AGENT_INDEX_DIR``."""
    if settings.store:
        from .postgres import PostgresStore

        return PostgresStore(settings.store)
    from .embedded import EmbeddedStore

    return EmbeddedStore(settings.index_dir)


def make_embedder(settings: Settings) -> Embedder:
    """The embedder ``KB_AGENT_EMBEDDER`` names (``hash``, ``openai`` or ``local``)."""
    from .embedders import make_embedder as make

    return make(settings)


def ensure_indexed(
    settings: Settings,
    roots: Sequence[str | os.PathLike[str]],
    progress: Progress | None = None,
    *,
    embedder: Embedder | None = None,
    lock_timeout: float | None = None,
    waiting: Callable[[], None] | None = None,
) -> IndexReport:
    """Index ``roots`` when they are new or changed since the last run; cheap otherwise.
    ``waiting`` is called once when another indexer is at work on the index."""
    from .build import DEFAULT_LOCK_TIMEOUT, IndexReport, quick_check, update_store
    from .chunker import DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS

    with _closed_after(settings, embedder) as (store, embedder):
        current = quick_check(store, roots, embedder, (DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS))
        if current is not None:
            files, chunks, generation, skipped_types, skipped = current
            from .discover import normalize_root

            return IndexReport(
                store.location,
                tuple(normalize_root(r) for r in roots),
                embedder.name,
                unchanged=files,
                chunks_total=chunks,
                generation=generation,
                skipped_types=skipped_types,
                warnings=skipped,
            )
        return update_store(
            store,
            roots,
            embedder,
            progress=progress,
            waiting=waiting,
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
    patterns: Sequence[str] = (),
    waiting: Callable[[], None] | None = None,
) -> IndexReport:
    """Build or update the index of ``roots`` (``python -m crag index``); ``patterns`` are its
    ``--exclude`` globs; ``waiting`` is called once when another indexer is at work on it."""
    from .build import DEFAULT_LOCK_TIMEOUT, update_store

    with _closed_after(settings, embedder) as (store, embedder):
        return update_store(
            store,
            roots,
            embedder,
            progress=progress,
            waiting=waiting,
            allow_reembed=True,
            lock_timeout=DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout,
            patterns=patterns,
        )


def drop_roots(
    settings: Settings,
    roots: Sequence[str | os.PathLike[str]],
    *,
    lock_timeout: float | None = None,
    waiting: Callable[[], None] | None = None,
) -> IndexReport:
    """Remove ``roots`` from the index, and every file no remaining root holds; ``waiting`` is
    called once when another indexer is at work on the index."""
    from .build import DEFAULT_LOCK_TIMEOUT, remove_roots

    store = open_store(settings)
    try:
        return remove_roots(
            store, roots, lock_timeout=DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout,
            waiting=waiting,
        )
    finally:
        store.close()


SKIPPED_NAMED = 10  # skipped files named one by one; ``crag index`` names every one


class SkippedFileWarning(CragWarning):
    """A file of the roots ``Agent.from_env(kb=...)`` indexed that crag could not read (binary,
    damaged, encrypted, a scan) or that an extra not installed would read."""


def warn_skipped(report: IndexReport) -> None:
    """The files the indexing of ``report`` skipped, as ``SkippedFileWarning``s at the caller of
    ``Agent.from_env``: what ``--kb`` says on stderr, since an answer cannot say why it never
    cites them."""
    import warnings

    from .labels import relative_label
    from .readers import extras_line

    said = [f"skipped {relative_label(path)}: {why}" for path, why in report.warnings[:SKIPPED_NAMED]]
    if len(report.warnings) > SKIPPED_NAMED:
        said.append(f"skipped {len(report.warnings) - SKIPPED_NAMED} more file(s): `crag index` names every one")
    if line := extras_line(report.skipped_types):
        said.append(line)
    for message in said:
        warnings.warn(SkippedFileWarning(message), stacklevel=3)


@contextlib.contextmanager
def _closed_after(settings: Settings, embedder: Embedder | None) -> Iterator[tuple[Store, Embedder]]:
    """The store, and ``embedder`` or the configured one, for one indexing run: the store and
    an embedder made here are closed when it ends (an ``openai`` embedder's connections, a
    PostgreSQL store's), so an ``Agent.from_env`` or a ``crag index`` leaves nothing open."""
    store = open_store(settings)
    made = None
    try:
        if embedder is None:
            embedder = made = make_embedder(settings)
        yield store, embedder
    finally:
        close = getattr(made, "close", None)
        if close is not None:
            close()
        store.close()


def open_index(
    settings: Settings, embedder: Embedder | None = None, weights: SearchWeights | None = None
) -> Retriever:
    """The published index opened for search with the configured embedder."""
    return open_store(settings).open_retriever(embedder or make_embedder(settings), weights)


def __getattr__(name: str) -> Any:
    if name in ("Hit", "IndexReader"):
        from . import store

        return getattr(store, name)
    if name == "SearchWeights":
        from .fusion import SearchWeights

        return SearchWeights
    if name == "IndexReport":
        from .build import IndexReport

        return IndexReport
    raise AttributeError(f"module 'crag.index' has no attribute {name!r}")
