"""Writing a generation's vectors in bounded memory: codes spilled to disk, the index streamed out.

An update never holds the knowledge base's vectors in memory. ``Spill`` quantizes each
batch of new vectors to the store's 8-bit codes (``crag.index.vectors.quantize``'s codes)
and appends them, with their chunk ids, to two files in the new generation's folder.
``write_vectors`` then writes the index to publish (its kind chosen by
``crag.index.vectors.kind_for``) from the published index (``Base``, minus the removed
chunks) followed by the spilled codes, read back in blocks of ``BLOCK`` vectors:

* ``exact`` (at most ``EXACT_MAX`` chunks, so at most a few tens of MB): built in memory
  and written by FAISS, as before;
* ``ivf``: the cells are the published index's while they still suit (``vectors.fit``'s
  rule), else k-means over a sample of ``vectors.cells(n) * 40`` vectors, taken as
  ``vectors.fit`` takes it (so that an index built from empty is the one ``fit`` would
  build); each vector is assigned to its nearest cell block by block, and the FAISS file
  is written by position: FAISS serialises an empty index of the same cells (the header,
  the cells, the scalar quantizer), and the direct map, the cell sizes and each cell's
  codes and ids are written after it with ``os.pwrite``, in FAISS's own layout
  (``IndexIVFScalarQuantizer`` with a hash-table direct map, ``ArrayInvertedLists``), which
  a test reads back with FAISS and compares with the index FAISS builds itself.

A published ``ivf`` index is read through FAISS's memory map (for its cells and where each
cell's codes are) and its codes with ``os.pread``, a cell at a time: the pages read are
the kernel's cache, not the indexer's memory. What grows with the knowledge base is 4 bytes
a vector (its cell, kept between the two passes) and, for an update on a published ``ivf``
index, the hash table FAISS reads with it (as a search process does).

Within a cell, vectors are in the order FAISS would hold them: the published ones first
(removed ones left out, the others keeping their order), then the new ones as they were
added. (FAISS itself fills a removed vector's place with its cell's last one; the two
orders hold the same vectors, and differ only for vectors of exactly equal scores.)
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any

from ..errors import IndexStoreError
from . import vectors

__all__ = ["BLOCK", "Base", "Spill", "write_vectors"]

# Vectors read, decoded and assigned to cells at a time (``vectors._BLOCK``, so that the
# cells are assigned in the same batches as ``vectors.fit``'s).
BLOCK = vectors._BLOCK
_CODES = "vectors.codes.tmp"
_IDS = "vectors.ids.tmp"
_CELLS = "vectors.cells.tmp"
_DECODE = 4096  # vectors decoded at a time into an exact index


def _sq(dim: int) -> Any:
    faiss = vectors._faiss()
    sq = faiss.ScalarQuantizer(dim, vectors._quantizer_type())
    vectors._set_range(sq)
    return sq


class Spill:
    """New vectors as 8-bit codes and chunk ids, appended to files in ``folder``; with
    ``cells`` (the published index's cells), each vector's nearest cell too, found from the
    vector itself (as FAISS's ``add`` finds it), for when the index keeps its cells."""

    def __init__(self, folder: str, dim: int, cells: Any = None) -> None:
        self.dim = dim
        self.n = 0
        self._sq = _sq(dim)
        self._cells = cells
        names = (_CODES, _IDS, _CELLS) if cells is not None else (_CODES, _IDS)
        self._paths = tuple(os.path.join(folder, name) for name in names)
        self._files: list[Any] = [open(p, "wb") for p in self._paths]  # noqa: SIM115 (closed by finish)

    @property
    def has_cells(self) -> bool:
        return self._cells is not None

    def add(self, x: Any, ids: Any) -> None:
        import numpy as np

        x = np.ascontiguousarray(x, dtype=np.float32)
        codes = self._sq.compute_codes(x)
        self._files[0].write(codes.tobytes())
        self._files[1].write(np.ascontiguousarray(ids, dtype=np.int64).tobytes())
        if self._cells is not None and len(ids):
            self._files[2].write(self._cells.search(x, 1)[1][:, 0].astype(np.int64).tobytes())
        self.n += len(ids)

    def finish(self) -> None:
        """Close the spill files, each of them even when one fails (a full disk fails the
        flush of the first); the first failure is raised after."""
        failure: OSError | None = None
        for f in self._files:
            try:
                f.close()
            except OSError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def blocks(self) -> Iterator[tuple[Any, Any, Any]]:
        """(ids, codes, cells or None) of the spilled vectors, ``BLOCK`` at a time (read, not mapped)."""
        import numpy as np

        size = BLOCK
        self.finish()
        files = [open(p, "rb") for p in self._paths]  # noqa: SIM115 (closed below)
        try:
            for at in range(0, self.n, size):
                k = min(size, self.n - at)
                codes = np.fromfile(files[0], dtype=np.uint8, count=k * self.dim).reshape(k, self.dim)
                ids = np.fromfile(files[1], dtype=np.int64, count=k)
                cells = np.fromfile(files[2], dtype=np.int64, count=k) if len(files) > 2 else None
                yield ids, codes, cells
        finally:
            for f in files:
                f.close()

    def remove(self) -> None:
        self.finish()
        for p in self._paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


class Base:
    """The published index an update builds on: read in memory when ``exact`` (small) or
    written by an older crag, else through FAISS's memory map, its codes read a cell at a time."""

    def __init__(self, path: str) -> None:
        faiss = vectors._faiss()
        self.path = path
        index = faiss.read_index(path, faiss.IO_FLAG_MMAP)
        self.kind = vectors.kind(index)
        if self.kind != "ivf":
            index = faiss.read_index(path)  # exact: at most EXACT_MAX vectors
        self.index = index
        self.d = index.d

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def remove(self, ids: Any) -> None:
        """(exact only) Remove ``ids`` now; an ``ivf`` base leaves them out when it is read."""
        self.index.remove_ids(ids)

    def blocks(self, removed: Any) -> Iterator[tuple[Any, Any, Any]]:
        """(ids, codes, cells) of the vectors held, ``removed`` left out; cells is None unless ``ivf``."""
        import numpy as np

        faiss = vectors._faiss()
        index = self.index
        if self.kind != "ivf":
            for ids, x in vectors._contents(index):
                keep = ~np.isin(ids, removed)
                yield ids[keep], _sq(self.d).compute_codes(np.ascontiguousarray(x[keep])), None
            return
        lists = faiss.downcast_InvertedLists(index.invlists)
        cs = index.code_size
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for lst in range(index.nlist):
                one = lists.lists.at(lst)
                size = int(one.size)
                if not size:
                    continue
                codes = np.frombuffer(os.pread(fd, size * cs, one.offset), dtype=np.uint8).reshape(size, cs)
                ids = np.frombuffer(os.pread(fd, size * 8, one.offset + size * cs), dtype=np.int64)
                if removed.size:
                    keep = ~np.isin(ids, removed)
                    codes, ids = codes[keep], ids[keep]
                if ids.size:
                    yield ids, codes, np.full(ids.size, lst, dtype=np.int64)
        finally:
            os.close(fd)


def _stream(base: Base | None, removed: Any, spill: Spill) -> Iterator[tuple[Any, Any, Any]]:
    """(ids, codes, cells or None) of every vector to publish, in blocks of at most ``BLOCK``,
    block boundaries at multiples of ``BLOCK`` of the order (as ``vectors._contents`` has them)."""
    import numpy as np

    def raw() -> Iterator[tuple[Any, Any, Any]]:
        if base is not None:
            yield from base.blocks(removed)
        for ids, codes, cells in spill.blocks():
            if removed.size:
                keep = ~np.isin(ids, removed)
                ids, codes, cells = ids[keep], codes[keep], None if cells is None else cells[keep]
            yield ids, codes, cells

    parts: list[tuple[Any, Any, Any]] = []
    held = 0
    for ids, codes, cells in raw():
        at = 0
        while at < ids.size:
            k = min(BLOCK - held, ids.size - at)
            parts.append((ids[at : at + k], codes[at : at + k], None if cells is None else cells[at : at + k]))
            held += k
            at += k
            if held == BLOCK:
                yield _joined(parts)
                parts, held = [], 0
    if held:
        yield _joined(parts)


def _joined(parts: list[tuple[Any, Any, Any]]) -> tuple[Any, Any, Any]:
    """One block of parts; its cells None when no part knows them, else -1 where a part does not."""
    import numpy as np

    if len(parts) == 1:
        return parts[0]
    cells = None
    if any(p[2] is not None for p in parts):
        cells = np.concatenate([p[2] if p[2] is not None else np.full(p[0].size, -1, dtype=np.int64) for p in parts])
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), cells


def _count(base: Base | None, removed: Any, spill: Spill) -> int:
    """How many vectors the new index holds (a pass over the ids only)."""
    import numpy as np

    n = 0
    if base is not None and base.kind != "ivf":
        n += base.ntotal  # removals applied already
    elif base is not None:
        faiss = vectors._faiss()
        lists = faiss.downcast_InvertedLists(base.index.invlists)
        n += base.ntotal
        if removed.size:
            fd = os.open(base.path, os.O_RDONLY)
            try:
                cs = base.index.code_size
                for lst in range(base.index.nlist):
                    one = lists.lists.at(lst)
                    if one.size:
                        ids = np.frombuffer(os.pread(fd, int(one.size) * 8, one.offset + int(one.size) * cs), dtype=np.int64)
                        n -= int(np.isin(ids, removed).sum())
            finally:
                os.close(fd)
    if removed.size and spill.n:
        for ids, _, _ in spill.blocks():
            n += int(ids.size - np.isin(ids, removed).sum())
    else:
        n += spill.n
    return n


def write_vectors(path: str, dim: int, base: Base | None, removed: Any, spill: Spill) -> tuple[str, int]:
    """Write the index of ``base`` (without ``removed``) and ``spill`` to ``path``: (its description, its size)."""
    import numpy as np

    removed = np.unique(np.asarray(removed, dtype=np.int64))
    n = _count(base, removed, spill)
    have = base.kind if base is not None else None
    want = vectors.kind_for(n, have)
    if want == "exact":
        out = vectors.empty(dim)
        sq = _sq(dim)
        for ids, codes, _ in _stream(base, removed, spill):
            for at in range(0, ids.size, _DECODE):  # decoded a few MB at a time
                out.add_with_ids(sq.decode(np.ascontiguousarray(codes[at : at + _DECODE])), ids[at : at + _DECODE])
        vectors._faiss().write_index(out, path)
        return "exact", int(out.ntotal)
    if have == "ivf" and vectors.cells(n) < vectors.RETRAIN_GROWTH * base.index.nlist and n >= base.index.nlist * 4:
        quantizer = vectors._faiss().clone_index(base.index.quantizer)
        known = True  # the published vectors keep their cells
    else:
        quantizer = _train(base, removed, spill, n, dim)
        known = False
    _write_ivf(path, dim, quantizer, n, base, removed, spill, known)
    return f"ivf:{quantizer.ntotal}", n


def _train(base: Base | None, removed: Any, spill: Spill, n: int, dim: int) -> Any:
    """New cells: k-means over about ``cells(n) * 40`` vectors spread over all of them (``vectors._ivf``'s sample)."""
    import numpy as np

    faiss = vectors._faiss()
    nlist = vectors.cells(n)
    want = nlist * vectors._TRAIN_PER_CELL
    step = max(1, n // max(1, want))
    # Gathered as codes (a quarter of the floats), decoded once.
    parts = [codes[::step].copy() for _, codes, _ in _stream(base, removed, spill)]
    codes = np.concatenate(parts)[:want] if parts else np.zeros((0, dim), dtype=np.uint8)
    del parts
    sample = _sq(dim).decode(np.ascontiguousarray(codes)) if codes.size else np.zeros((0, dim), dtype=np.float32)
    del codes
    nlist = max(1, min(nlist, sample.shape[0] // 4))
    kmeans = faiss.Kmeans(
        dim, nlist, niter=vectors._TRAIN_ITERATIONS, spherical=True, seed=vectors._SEED, verbose=False,
        min_points_per_centroid=4,
    )
    kmeans.train(sample)
    del sample
    coarse = faiss.IndexFlatIP(dim)
    coarse.add(np.ascontiguousarray(kmeans.centroids, dtype=np.float32))
    return coarse


def _template(dim: int, quantizer: Any) -> tuple[bytes, bytes, bytes]:
    """FAISS's own bytes of an empty ivf index of these cells, cut where the vectors go:
    (header and cells up to the direct map, scalar quantizer up to the inverted lists, "ilar" header)."""
    import numpy as np

    faiss = vectors._faiss()
    nlist = int(quantizer.ntotal)
    coarse = faiss.clone_index(quantizer)
    ivf = faiss.IndexIVFScalarQuantizer(coarse, dim, nlist, vectors._quantizer_type(), faiss.METRIC_INNER_PRODUCT, False)
    ivf.own_fields = True
    coarse.this.disown()
    vectors._set_range(ivf.sq)
    ivf.is_trained = True
    ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
    ivf.nprobe = vectors.nprobe(nlist)
    data = faiss.serialize_index(ivf).tobytes()
    q = faiss.serialize_index(quantizer).tobytes()
    at = data.find(q, 4)
    dm = at + len(q)
    empty_map = bytes([faiss.DirectMap.Hashtable]) + struct.pack("<QQ", 0, 0)
    lists = data.rfind(b"ilar")
    tail = b"ilar" + struct.pack("<QQ", nlist, ivf.code_size) + b"sprs" + struct.pack("<Q", 0)
    if (
        at < 0
        or data[dm : dm + len(empty_map)] != empty_map
        or data[lists:] != tail
        or data[4:16] != struct.pack("<iq", dim, 0)
        or np.dtype(np.int64).itemsize != 8
    ):
        raise IndexStoreError("internal error: this FAISS writes ivf indexes in a layout crag does not know", "")
    return data[:dm], data[dm + len(empty_map) : lists], data[lists : lists + 4 + 16]


def _write_ivf(
    path: str, dim: int, quantizer: Any, n: int, base: Base | None, removed: Any, spill: Spill, known: bool
) -> None:
    import numpy as np

    nlist = int(quantizer.ntotal)
    sq = _sq(dim)
    cs = sq.code_size
    # Pass 1: each vector's cell (known for the published ones when their cells are kept).
    cells_parts: list[Any] = []
    for _ids, codes, cells in _stream(base, removed, spill):
        cells_parts.append(_assign(quantizer, sq, codes, cells if known else None))
    del codes, cells  # the last block, which the next pass would otherwise hold with its own
    cells_all = np.concatenate(cells_parts) if cells_parts else np.zeros(0, dtype=np.int32)
    del cells_parts
    if cells_all.size != n:
        raise IndexStoreError(f"internal error: {cells_all.size} vectors to write, {n} counted", path)
    sizes = np.bincount(cells_all, minlength=nlist).astype(np.int64)
    head, middle, lists_head = _template(dim, quantizer)
    head = head[:8] + struct.pack("<q", n) + head[16:]
    direct_map = bytes([vectors._faiss().DirectMap.Hashtable]) + struct.pack("<QQ", 0, n)
    nonempty = int((sizes > 0).sum())
    if nonempty > nlist // 2:
        size_table = b"full" + struct.pack("<Q", nlist) + sizes.astype("<u8").tobytes()
    else:
        pairs = np.stack([np.flatnonzero(sizes), sizes[sizes > 0]], axis=1).astype("<u8")
        size_table = b"sprs" + struct.pack("<Q", pairs.size) + pairs.tobytes()
    map_at = len(head) + len(direct_map)
    data_at = map_at + 16 * n + len(middle) + len(lists_head) + len(size_table)
    cell_at = data_at + np.concatenate([[0], np.cumsum(sizes * (cs + 8))[:-1]]).astype(np.int64)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, head + direct_map, 0)
        os.pwrite(fd, middle + lists_head + size_table, map_at + 16 * n)
        # Pass 2: codes and ids in their cells, and the direct map (id -> cell << 32 | place).
        filled = np.zeros(nlist, dtype=np.int64)
        done = 0
        for ids, codes, _ in _stream(base, removed, spill):
            cells = cells_all[done : done + ids.size].astype(np.int64)
            order = np.argsort(cells, kind="stable")
            sorted_cells = cells[order]
            starts = np.flatnonzero(np.r_[True, sorted_cells[1:] != sorted_cells[:-1]])
            ends = np.r_[starts[1:], sorted_cells.size]
            places = np.empty(ids.size, dtype=np.int64)
            for s, e in zip(starts.tolist(), ends.tolist()):
                c = int(sorted_cells[s])
                rows = order[s:e]
                first = int(filled[c])
                places[rows] = first + np.arange(e - s)
                at = int(cell_at[c])
                os.pwrite(fd, np.ascontiguousarray(codes[rows]).tobytes(), at + first * cs)
                os.pwrite(fd, np.ascontiguousarray(ids[rows]).tobytes(), at + int(sizes[c]) * cs + first * 8)
                filled[c] += e - s
            entries = np.stack([ids, (cells << 32) | places], axis=1).astype("<i8")
            os.pwrite(fd, entries.tobytes(), map_at + 16 * done)
            done += ids.size
        end = data_at + int((sizes * (cs + 8)).sum())
        os.ftruncate(fd, end)
    finally:
        os.close(fd)


def _assign(quantizer: Any, sq: Any, codes: Any, cells: Any) -> Any:
    """The cell of each vector: the one given (not -1), else its nearest centroid."""
    import numpy as np

    out = np.full(codes.shape[0], -1, dtype=np.int32) if cells is None else cells.astype(np.int32)
    todo = out < 0
    if todo.all():
        _, nearest = quantizer.search(sq.decode(np.ascontiguousarray(codes)), 1)
        return nearest[:, 0].astype(np.int32)
    if todo.any():
        _, nearest = quantizer.search(sq.decode(np.ascontiguousarray(codes[todo])), 1)
        out[todo] = nearest[:, 0]
    return out
