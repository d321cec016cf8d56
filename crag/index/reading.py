"""Reading files for an update: read, hash and chunk them in worker threads, in order.

``prepare_all(files, recorded, chunking)`` yields one ``Prepared`` per file, in the order
given: its size and sha256, and (when the content is new or changed and is text) its
decoded text and chunks; or why it could not be read. Files are read in batches of about
``_BATCH_BYTES`` by two worker threads (tiktoken and hashing release the GIL), at most a
window of batches, and of ``_WINDOW_BYTES`` of files, ahead of the caller. Once the caller
stops (Ctrl-C, SIGTERM, an error, the iterator closed), a batch being read stops before its
next file: the file being read is the last, bounded by its reader's own time limit.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from attrs import frozen

from ..ports import BINARY_MARK, FileRecord
from .chunker import Chunk, chunk_lines, token_counter
from .discover import BinaryFileError, DiscoveredFile, read_bytes, split_lines, text_of

__all__ = ["Prepared", "prepare_all", "sha256"]

# Files are read and chunked by worker threads in batches of about this many bytes.
_BATCH_BYTES = 256 << 10
_BATCH_FILES = 64
# Batches read ahead hold at most about this many bytes of files: a file over ``_BATCH_BYTES``
# is a batch of its own, and its text, lines and chunks take several times its size.
_WINDOW_BYTES = 16 * _BATCH_BYTES


@frozen
class Prepared:
    """One file read, hashed and (when new or changed) chunked, or why it could not be read."""

    file: DiscoveredFile
    size: int = 0
    sha: str = ""
    binary: bool = False
    text: str = ""
    chunks: Sequence[Chunk] = ()
    error: str | None = None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare_all(
    files: Sequence[DiscoveredFile], recorded: Mapping[str, FileRecord], chunking: tuple[int, int]
) -> Iterator[Prepared]:
    """Every file of ``files`` prepared, in order (see the module docstring)."""
    count = token_counter()
    stopped = threading.Event()  # the caller stopped: no worker starts another file

    def prepare(batch: Sequence[DiscoveredFile]) -> list[Prepared]:
        """Read, hash and chunk some files (in a worker thread: tiktoken releases the GIL)."""
        done: list[Prepared | None] = []
        todo: list[tuple[int, DiscoveredFile, bytes, str, str, list[str]]] = []
        for f in batch:
            if stopped.is_set():
                return []  # never taken: the caller is gone
            try:
                data = read_bytes(f.path)
            except (OSError, ValueError) as exc:
                done.append(Prepared(f, error=f"cannot read ({getattr(exc, 'strerror', None) or exc})"))
                continue
            sha = sha256(data)
            prev = recorded.get(f.path)
            if prev is not None and prev.sha256 == sha:
                done.append(Prepared(f, size=len(data), sha=sha))
                continue
            if prev is not None and prev.sha256 == BINARY_MARK + sha:
                done.append(Prepared(f, size=len(data), sha=sha, binary=True))
                continue
            try:
                text = text_of(f.path, data)
            except BinaryFileError:
                done.append(Prepared(f, size=len(data), sha=sha, binary=True))
                continue
            except ValueError as exc:
                done.append(Prepared(f, error=str(exc)))
                continue
            except OSError as exc:  # gone or changed since it was read (a document's cache looks again)
                done.append(Prepared(f, error=f"cannot read ({exc.strerror or exc})"))
                continue
            todo.append((len(done), f, data, sha, text, split_lines(text)))
            done.append(None)
        # One tiktoken pass over the batch gives every line's token count.
        line_tokens = count.line_counts_many([t[5] for t in todo], [t[4] for t in todo])
        for (i, f, data, sha, text, lines), tokens in zip(todo, line_tokens):
            suffix = os.path.splitext(f.path)[1]
            chunks = chunk_lines(lines, suffix, chunking[0], chunking[1], count, line_tokens=tokens)
            done[i] = Prepared(f, size=len(data), sha=sha, text=text, chunks=chunks)
        return done  # type: ignore[return-value]

    batches = _batches(files)
    for batch in _ordered_map(prepare, batches, stopped, weights=[sum(f.size for f in b) for b in batches]):
        yield from batch


def _ordered_map(fn: Callable[[Any], Any], items: Sequence[Any], stopped: threading.Event, workers: int = 2,
                 window: int = 16, weights: Sequence[int] = (), max_weight: int = _WINDOW_BYTES) -> Iterable[Any]:
    """``map(fn, items)`` in order, computed by ``workers`` threads at most ``window`` items ahead
    and, given each item's ``weights``, at most ``max_weight`` of them (or ``workers`` items, so
    that each thread is busy); ``stopped`` is set when the caller stops taking them, before the
    threads are waited for."""
    if len(items) <= 1:
        yield from map(fn, items)
        return
    from concurrent.futures import ThreadPoolExecutor

    weight = list(weights) or [0] * len(items)
    with ThreadPoolExecutor(workers, thread_name_prefix="crag-index") as pool:
        pending: deque[Any] = deque()
        ahead = 0  # the weight of the pending items
        try:
            for item, w in zip(items, weight):
                while pending and (len(pending) >= window or (len(pending) >= workers and ahead + w > max_weight)):
                    ahead -= pending[0][1]
                    yield pending.popleft()[0].result()
                pending.append((pool.submit(fn, item), w))
                ahead += w
            while pending:
                yield pending.popleft()[0].result()
        finally:
            stopped.set()  # the running calls end at their next file: waited for below, not their batch
            for fut, _ in pending:
                fut.cancel()


def _batches(files: Sequence[DiscoveredFile]) -> list[list[DiscoveredFile]]:
    """Consecutive files in batches of about ``_BATCH_BYTES`` (``_BATCH_FILES`` files at most)."""
    batches: list[list[DiscoveredFile]] = []
    batch: list[DiscoveredFile] = []
    size = 0
    for f in files:
        if batch and (size + f.size > _BATCH_BYTES or len(batch) >= _BATCH_FILES):
            batches.append(batch)
            batch, size = [], 0
        batch.append(f)
        size += f.size
    if batch:
        batches.append(batch)
    return batches
