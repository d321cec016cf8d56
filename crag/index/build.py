"""Updating an index: the one driver of every store's updates.

``update_store(store, roots, embedder)`` brings any ``Store`` up to date with ``roots``;
``update_index(index_dir, ...)`` does it for the embedded store in ``index_dir``. Under the
store's writer lock (a second indexer waits up to ``lock_timeout`` seconds, then fails with
a message naming the store), it

1. reads the published state (a damaged one is rebuilt from scratch when allowed);
2. walks the roots, and compares each file's size and change stamp (the later of its mtime and
   ctime, ``crag.index.discover.stamp``) with the recorded ones: equal
   means unchanged and the file is not read; otherwise it is read and hashed (sha256), and
   only new or changed content is chunked and embedded (``crag.index.reading``);
3. sends the edits to one ``StoreUpdate`` (changed and deleted files removed, new versions
   added) and commits it: readers see the previous state or the new one, never a mix.

When the configured embedder (or the chunking) differs from the index's, everything is
re-embedded and the report says why. ``quick_check`` answers "is the index current for
these roots?" from ``stat`` alone, without the lock, for ``ensure_indexed``.
``remove_roots`` drops roots and the files only they held.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from attrs import field, frozen

from ..errors import IndexFormatError, IndexStoreError, IndexUnavailableError, KnowledgeBaseError, LLMError
from ..ports import BINARY_MARK, DocumentVersion, FileRecord, Store, StoreState
from .chunker import DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS
from .discover import (
    UNLISTED,
    Discovery,
    can_read,
    discover,
    excluded_reason,
    held_root,
    is_gone,
    is_within,
    missing_root,
    normalize_root,
    relative_label,
    unreachable,
)
from .documents import chunker_id, embedder_mismatch
from .ignore import check_excludes
from .layout import DEFAULT_LOCK_TIMEOUT, IndexLock
from .reach import refused_root
from .reading import prepare_all

if TYPE_CHECKING:
    import numpy as np

    from ..ports import Embedder

__all__ = ["DEFAULT_LOCK_TIMEOUT", "IndexLock", "IndexReport", "Progress", "quick_check", "remove_roots", "update_index",
           "update_store"]

BINARY_FILE = "binary file"  # the warning naming a file left out as binary data

# progress(files_done, files_total, path): called as files are indexed.
Progress = Callable[[int, int, str], None]


@frozen
class IndexReport:
    """What one ``update_index`` / ``ensure_indexed`` did. ``index_dir`` names the store."""

    index_dir: str
    roots: tuple[str, ...]
    embedder: str
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    unchanged: int = 0
    chunks_total: int = 0
    chunks_embedded: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    reembedded_all: bool = False
    reason: str = ""
    wrote: bool = False
    generation: str = ""
    warnings: tuple[tuple[str, str], ...] = field(factory=tuple)
    skipped_types: tuple[str, ...] = ()  # suffixes of the files left out for their type
    kept_unread: int = 0  # of those, files indexed earlier whose reader is not installed now: kept
    dropped_roots: tuple[str, ...] = ()  # recorded roots gone from disk, dropped by this update

    @property
    def files_total(self) -> int:
        return len(self.added) + len(self.changed) + self.unchanged

    @property
    def changed_anything(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.reembedded_all)


@frozen
class _Base:
    """The published state an update builds on, and whether everything must be re-embedded."""

    state: StoreState | None  # what is published (None: nothing, or unreadable)
    full: bool = False  # re-embed everything: another embedder or chunking, or unreadable
    reason: str = ""
    salvaged_roots: tuple[str, ...] = ()  # the roots an unreadable index still names

    @property
    def recorded_roots(self) -> tuple[str, ...]:
        return self.state.roots if self.state else self.salvaged_roots

    @property
    def files(self) -> Mapping[str, FileRecord]:
        return self.state.files if self.state else MappingProxyType({})


@frozen
class _Plan:
    """What an update will do, decided from the base and the file system before any write."""

    store: Store
    embedder: Embedder
    chunking: tuple[int, int]
    base: _Base
    walk_roots: tuple[str, ...]
    new_roots: tuple[str, ...]
    dropped_roots: tuple[str, ...]
    discovery: Discovery
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]  # by size and mtime: not read
    to_read: tuple
    started: float
    binary: tuple[str, ...] = ()  # recorded as binary and unchanged by size and mtime: not read
    kept_unread: int = 0  # indexed files that no installed reader reads now: kept as they were

    @property
    def warnings(self) -> list[tuple[str, str]]:
        """Discovery's warnings, and each file left out as binary (named on every run)."""
        return [*self.discovery.warnings, *((p, BINARY_FILE) for p in self.binary)]

    def reported(self, removed: Sequence[str]) -> tuple[str, ...]:
        """``removed`` without the files that were never in the index (recorded as binary)."""
        files = self.base.files
        return tuple(sorted(p for p in removed if not (p in files and files[p].binary)))

    @property
    def recorded(self) -> Mapping[str, FileRecord]:
        """The versions the update keeps when unchanged (none when re-embedding everything)."""
        return MappingProxyType({}) if self.base.full else self.base.files

    @property
    def builds_on(self) -> StoreState | None:
        return None if self.base.full else self.base.state

    @property
    def roots_changed(self) -> bool:
        return self.base.state is None or set(self.new_roots) != set(self.base.recorded_roots)


def update_index(
    index_dir: str,
    roots: Sequence[str | os.PathLike[str]],
    embedder: Embedder,
    **options: object,
) -> IndexReport:
    """``update_store`` on the embedded store in ``index_dir``."""
    from .embedded import EmbeddedStore

    return update_store(EmbeddedStore(index_dir), roots, embedder, **options)  # type: ignore[arg-type]


def update_store(
    store: Store,
    roots: Sequence[str | os.PathLike[str]],
    embedder: Embedder,
    *,
    progress: Progress | None = None,
    waiting: Callable[[], None] | None = None,
    allow_reembed: bool = True,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    patterns: Sequence[str] = (),
) -> IndexReport:
    """Index ``roots`` into ``store`` incrementally (see the module docstring).

    With ``allow_reembed`` False (``ask``/``search --kb``), an index built with another
    embedder raises ``EmbedderMismatchError`` instead of being rebuilt. ``patterns`` are
    ``--exclude`` globs for this run: files they match are left out (and leave the index).
    ``waiting`` is called once when another indexer holds the store's lock (``writer_lock``).
    """
    started = time.perf_counter()
    check_excludes(patterns, roots)  # before anything is written
    root_list = [normalize_root(r) for r in roots]
    given = dict(zip(root_list, roots))  # a link is named as typed, not by where it leads
    gone = [r for r in root_list if is_gone(r) or unreachable(r)]
    if gone:
        # A recorded root that is gone from disk is dropped (as by any update); any other is an error.
        recorded = _recorded_roots(store)
        for r in gone:
            if r not in recorded or not is_gone(r):
                raise KnowledgeBaseError(missing_root(r, given[r]), r)
        root_list = [r for r in root_list if r not in gone]
    for r in root_list:  # a file named as a root that may not be read (as a folder that may not be entered), a pipe
        if (why := refused_root(r, given[r])) is not None:
            raise KnowledgeBaseError(why, r)
    chunking = (max_tokens, min_tokens)
    with store.writer_lock(lock_timeout, waiting):
        base = _load_base(store, embedder, chunker_id(*chunking), allow_reembed)
        plan = _plan(store, embedder, chunking, base, root_list, started, patterns)
        if plan.builds_on is not None and _dim_changed(plan.builds_on, embedder, _writes(plan)):
            # The same model name now gives vectors of another length (another model under that
            # name, another server): its vectors cannot join the index's, as another embedder's cannot.
            built = f"{plan.builds_on.embedder} ({plan.builds_on.dim} dimensions)"
            configured = f"{embedder.name} (now {embedder.dim} dimensions)"
            if not allow_reembed:
                raise embedder_mismatch(built, configured, plan.builds_on.roots, store.location)
            base = _Base(base.state, True, f"the index was built with {built}, the configured embedder is {configured}")
            plan = _plan(store, embedder, chunking, base, root_list, started, patterns)
        return _apply(plan, progress)


def _dim_changed(state: StoreState, embedder: Embedder, writes: bool) -> bool:
    """Whether the embedder's vectors are no longer as long as the index's. Checked even when
    no file changed, since a search then fails telling to re-index; but an update with nothing
    to write does not fail because the dimension cannot be learnt now (an embeddings server
    that is down): it is compared again when vectors are next written."""
    if writes:
        return state.dim != embedder.dim
    try:
        return state.dim != embedder.dim
    except LLMError:
        return False


def _recorded_roots(store: Store) -> tuple[str, ...]:
    try:
        state = store.state(files=False)
    except IndexStoreError:
        return ()
    return state.roots if state is not None else ()


# The advice that ends an index error's message (": run `...` to rebuild it", ": check --index ...").
_ADVICE = re.compile(r": (?:run `|check --index ).*\Z", re.DOTALL)


def _load_base(store: Store, embedder: Embedder, chunker: str, allow_reembed: bool) -> _Base:
    """The published state to build on, and whether it must be rebuilt (and why)."""
    try:
        state = store.state(files=True, check=True)
    except (IndexFormatError, IndexUnavailableError):
        raise  # a newer crag's index is not ours to rebuild, nor one that could not be read just now
    except IndexStoreError as exc:
        if not allow_reembed:
            raise
        why = _ADVICE.sub("", str(exc))  # what is wrong, without what to do (this run rebuilds it)
        return _Base(None, True, f"the previous index could not be read ({why})", _salvaged_roots(store))
    if state is None:
        return _Base(None)
    if state.embedder != embedder.name:
        if not allow_reembed:
            raise embedder_mismatch(state.embedder, embedder.name, state.roots, store.location)
        why = f"the index was built with {state.embedder}, the configured embedder is {embedder.name}"
        return _Base(state, True, why)
    if state.chunker != chunker:
        return _Base(state, True, "the chunking settings changed")
    return _Base(state)


def _salvaged_roots(store: Store) -> tuple[str, ...]:
    """The roots a damaged index, or one of an older format, still names when they can be
    read: the rebuild walks them all, so a rebuild started with one path keeps every root."""
    return tuple(r for r in store.roots(salvage=True) if isinstance(r, str) and os.path.isabs(r))


def _plan(
    store: Store, embedder: Embedder, chunking: tuple[int, int], base: _Base, roots: list[str], started: float,
    patterns: Sequence[str] = (),
) -> _Plan:
    # Which roots to walk: the ones asked for, plus every recorded root when rebuilding. A
    # recorded root gone from disk is dropped, with its files, by any update.
    walk_roots = list(dict.fromkeys(roots))
    dropped_roots: list[str] = []
    kept: list[tuple[str, str]] = []  # recorded roots that cannot be reached now: kept as they are
    for r in base.recorded_roots:
        if r in walk_roots:
            continue
        if is_gone(r):  # a link to nothing is gone too, as `roots` says
            dropped_roots.append(r)
        elif unreachable(r):
            fate = "leave the index (everything is re-embedded)" if base.full else "stay in the index as they were"
            kept.append((r, f"cannot be reached ({unreachable(r)}); its files {fate}"))
        elif base.full or _inside(r, roots):
            # a root inside one walked holds files the outer one may leave out (its ignore
            # files, a file named as a root): walked too, they are not taken for deleted
            walk_roots.append(r)
    exclude = [store.location] if os.path.isabs(store.location) else []
    discovery = discover(walk_roots, exclude=exclude, patterns=patterns)
    if kept:
        discovery = Discovery(discovery.files, (*kept, *discovery.warnings), discovery.skipped_paths)
    found = {f.path for f in discovery.files}
    # A document indexed earlier whose reader's extra is missing now (another environment, an
    # extra uninstalled) is still there: it keeps its chunks, as an unreachable root keeps its files.
    unread = set() if base.full else {p for p in discovery.unread if p in base.files and not base.files[p].binary}
    found |= unread
    new_roots = sorted(set(base.recorded_roots) - set(dropped_roots) | set(roots))
    if base.full:
        removed = sorted(p for p in base.files if p not in found)
    else:
        looked = [*walk_roots, *dropped_roots]
        # an unreachable root or unlisted folder inside a walked root: its files, not seen, stay
        unseen = [*(r for r, _ in kept), *(path for path, why in discovery.warnings if why.startswith(UNLISTED))]
        removed = sorted(p for p in base.files if p not in found and any(is_within(p, r) for r in looked)
                         and not any(is_within(p, r) for r in unseen))
    # Classify by stat first: a file with the same size and mtime is not read at all (unless it
    # can no longer be read: `chmod` changes neither, and reading it then takes it out).
    recorded = {} if base.full else base.files
    unchanged, to_read, binary = [], [], []
    for f in discovery.files:
        prev = recorded.get(f.path)
        if prev is not None and prev.size == f.size and prev.mtime_ns == f.mtime_ns and can_read(f.path):
            (binary if prev.binary else unchanged).append(f.path)
        else:
            to_read.append(f)
    return _Plan(
        store, embedder, chunking, base, tuple(walk_roots), tuple(new_roots), tuple(dropped_roots), discovery,
        tuple(removed), tuple(unchanged), tuple(to_read), started, tuple(binary), len(unread),
    )


def generation_name(version: str) -> str:
    """The generation a store's version names (the embedded store's adds its database's identity)."""
    return version.partition(":")[0]


def _inside(root: str, roots: Sequence[str]) -> bool:
    """Whether ``root`` lies below one of ``roots`` (being one of them does not count)."""
    return any(root != r and is_within(root, r) for r in roots)


def _unchanged_report(plan: _Plan, unchanged: int, bytes_read: int = 0, warnings: Sequence[tuple[str, str]] = ()) -> IndexReport:
    state = plan.base.state
    return IndexReport(
        plan.store.location, plan.walk_roots, plan.embedder.name, unchanged=unchanged,
        chunks_total=state.chunks if state else 0, bytes_read=bytes_read,
        seconds=time.perf_counter() - plan.started, generation=generation_name(state.version) if state else "",
        warnings=tuple(warnings) or tuple(plan.warnings), skipped_types=plan.discovery.skipped_types,
        kept_unread=plan.kept_unread,
    )


def _writes(plan: _Plan) -> bool:
    """Whether carrying out ``plan`` opens a store update (else nothing changed)."""
    return bool(plan.to_read or plan.removed or plan.roots_changed or plan.base.full)


def _apply(plan: _Plan, progress: Progress | None) -> IndexReport:
    """Carry out ``plan`` in one store update (writer lock held)."""
    if not _writes(plan):
        return _unchanged_report(plan, len(plan.unchanged))
    recorded = plan.recorded
    update = plan.store.begin(plan.builds_on, plan.embedder, chunker_id(*plan.chunking))
    try:
        warnings = plan.warnings
        added: list[str] = []
        changed: list[str] = []
        removed = list(plan.removed)
        unchanged = len(plan.unchanged)
        touched = 0
        bytes_read = 0
        if plan.builds_on is not None:
            for path in removed:
                update.remove_file(path)
        total = len(plan.to_read)
        for n, item in enumerate(prepare_all(plan.to_read, recorded, plan.chunking), 1):
            f = item.file
            if progress is not None:
                progress(n, total, f.path)
            prev = recorded.get(f.path)
            if item.error is not None:
                warnings.append((f.path, item.error))
                if prev is not None:  # it cannot be read any more: it leaves the index
                    update.remove_file(f.path)
                    removed.append(f.path)
                continue
            bytes_read += item.size
            if item.binary:
                warnings.append((f.path, BINARY_FILE))
            if prev is not None and prev.sha256 == (BINARY_MARK + item.sha if item.binary else item.sha):
                # the same content (a binary file is named again, and is no file of the index)
                update.touch_file(f.path, f.size, f.mtime_ns)
                unchanged += not item.binary
                touched += 1
                continue
            if prev is not None:
                update.remove_file(f.path)
            if item.binary:
                # Recorded with no chunks, so that an unchanged binary file is not read again.
                if prev is not None and not prev.binary:
                    removed.append(f.path)
                update.add_file(DocumentVersion(f.path, f.root, f.size, f.mtime_ns, BINARY_MARK + item.sha))
                continue
            before = prev or plan.base.files.get(f.path)
            if before is not None and not before.binary:
                changed.append(f.path)
            else:
                added.append(f.path)
            update.add_file(DocumentVersion(f.path, f.root, f.size, f.mtime_ns, item.sha, tuple(item.chunks), item.text))
        update.set_roots(plan.new_roots)
        if not (added or changed or removed or touched or plan.roots_changed or plan.base.full):
            update.abort()
            return _unchanged_report(plan, unchanged, bytes_read, warnings)
        n_chunks = update.commit()
    except BaseException:
        update.abort()
        raise
    return IndexReport(
        plan.store.location,
        plan.walk_roots,
        plan.embedder.name,
        added=tuple(added),
        changed=tuple(changed),
        removed=plan.reported(removed),
        unchanged=unchanged,
        chunks_total=n_chunks,
        chunks_embedded=update.embedded,
        bytes_read=bytes_read,
        seconds=time.perf_counter() - plan.started,
        reembedded_all=plan.base.full,
        reason=plan.base.reason,
        wrote=True,
        skipped_types=plan.discovery.skipped_types,
        kept_unread=plan.kept_unread,
        generation=update.version,
        warnings=tuple(warnings),
        dropped_roots=plan.dropped_roots,
    )


@frozen
class _RecordedEmbedder:
    """The embedder of an update that only removes: the state's own name and dimension."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise IndexStoreError("internal error: an update that only removes files embedded text", "")


def remove_roots(
    store: Store,
    roots: Sequence[str | os.PathLike[str]],
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    waiting: Callable[[], None] | None = None,
) -> IndexReport:
    """Drop ``roots`` from the index, with every file no remaining root holds.

    A root the index does not hold raises ``KnowledgeBaseError`` naming the roots it does.
    ``waiting`` is called once when another indexer holds the store's lock.
    """
    started = time.perf_counter()
    drop = [normalize_root(r) for r in roots]
    if store.version() is None and store.state(files=False) is None:  # before the lock, which makes the folder
        store.roots()  # the store's own "no index", which says "yet" while the first crag index builds it
    with store.writer_lock(lock_timeout, waiting):
        # Checked as an update's base is: a generation built on damaged files would carry the
        # damage on under fresh checksums, and nothing would find it again.
        state = store.state(files=True, check=True)
        if state is None:
            raise IndexStoreError(f"no index in {store.location}: run `python -m crag index PATH` first", store.location)
        drop = [held_root(r, state.roots) for r in drop]  # or as `crag roots` shows it
        unknown = [r for r in drop if r not in state.roots]
        if unknown:
            held = ", ".join(relative_label(r) for r in state.roots) or "none"  # as `crag roots` lists them
            raise KnowledgeBaseError(
                f"{relative_label(unknown[0], typed=True)} is not a root of the index (its roots: {held})", unknown[0]
            )
        keep = [r for r in state.roots if r not in drop]
        gone = sorted(p for p in state.files if not _still_held(p, keep, drop))
        left = tuple(p for p in gone if not state.files[p].binary)  # a binary file was never in it
        update = store.begin(state, _RecordedEmbedder(state.embedder, state.dim), state.chunker)
        try:
            for path in gone:
                update.remove_file(path)
            update.set_roots(keep)
            n_chunks = update.commit()
        except BaseException:
            update.abort()
            raise
    return IndexReport(
        store.location, tuple(drop), state.embedder, removed=left, chunks_total=n_chunks,
        seconds=time.perf_counter() - started, reason="removed root(s): " + ", ".join(drop), wrote=True,
        generation=update.version,
    )


def _still_held(path: str, keep: Sequence[str], drop: Sequence[str]) -> bool:
    """Whether a root of ``keep`` holds the indexed file ``path`` once ``drop`` is removed: one
    a dropped root held stays only where a kept root would index it (not where the kept
    root's .gitignore leaves it out, say)."""
    if not any(is_within(path, r) for r in drop):
        return any(is_within(path, r) for r in keep)
    return any(is_within(path, r) and excluded_reason(path, r) is None for r in keep)


def quick_check(
    store: Store, roots: Sequence[str | os.PathLike[str]], embedder: Embedder, chunking: tuple[int, int]
) -> tuple[int, int, str, tuple[str, ...], tuple[tuple[str, str], ...]] | None:
    """(files, chunks, version, the suffixes of the files left out for their type, the files skipped
    with why, as an update names them) when the index is current for ``roots`` by size and mtime alone.

    Reads no file contents and takes no lock. None when there is no index or something
    changed. Raises ``EmbedderMismatchError`` when the index was built with another
    embedder, ``IndexStoreError`` when it is damaged, ``KnowledgeBaseError`` for a
    missing root.
    """
    root_list = [normalize_root(r) for r in roots]
    exclude = [store.location] if os.path.isabs(store.location) else []
    discovery = discover(roots, exclude=exclude)  # as given: a link to nothing is named as typed
    state = store.state(files=True)
    if state is None:
        return None
    # a root inside one of them holds files they may leave out: they are current when it is
    inner = [r for r in state.roots if _inside(r, root_list) and not is_gone(r) and not unreachable(r)]
    if inner:
        discovery = discover([*root_list, *inner], exclude=exclude)
    if state.embedder != embedder.name:
        raise embedder_mismatch(state.embedder, embedder.name, state.roots, store.location)
    if state.chunker != chunker_id(*chunking):
        return None
    if not set(root_list) <= set(state.roots):
        return None
    for f in discovery.files:
        prev = state.files.get(f.path)
        if prev is None or (prev.size, prev.mtime_ns) != (f.size, f.mtime_ns) or not can_read(f.path):
            return None
    under = sum(1 for p in state.files if any(is_within(p, r) for r in (*root_list, *inner)))
    if under != len(discovery.files):
        return None
    files = sum(not state.files[f.path].binary for f in discovery.files)
    skipped = (*discovery.warnings, *((f.path, BINARY_FILE) for f in discovery.files if state.files[f.path].binary))
    return files, state.chunks, generation_name(state.version), discovery.skipped_types, skipped

