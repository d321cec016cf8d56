"""The embedded store's vectors: one FAISS index whose kind follows the knowledge base's size.

Every vector is stored as 8-bit codes: FAISS's uniform scalar quantizer over
[-``RANGE``, ``RANGE``] (``QUANTIZER``, fixed, so nothing is trained and every index of
every store codes a vector alike), one byte a dimension, a quarter of float32. A search
compares the unquantised query with the stored vectors, so the cosine it reports is the
query's inner product with the decoded vector; ``quantize`` gives those decoded vectors,
and the PostgreSQL store writes them, so that both stores report the same scores. On the
shared questions the codes rank as float32 did (``docs/retrieval.md``).

The index has one of two kinds, by the number of chunks (``kind_for``):

* ``exact``: ``IndexIDMap2(IndexScalarQuantizer)``, brute force over every code, while the
  knowledge base holds at most ``EXACT_MAX`` chunks (at 1,008 dimensions a query then costs
  at most about 10 ms on one core, ``benchmarks/store_scale.py``);
* ``ivf``: ``IndexIVFScalarQuantizer`` over the same codes (not residuals), its vectors in
  ``cells(n)`` k-means cells trained on a sample, ``nprobe(nlist)`` cells searched per
  query; a hash table maps chunk ids to codes, for ``reconstruct`` and ``remove_ids``.
  Its recall against exact search is measured by ``benchmarks/store_scale.py``.

Theory of operation. Readers never wait: the indexer edits its own copy of the published
index (adds and removes), and at commit ``fit`` returns the index to publish: the same one
while its kind still suits the new size, else one rebuilt from the same codes (exact →
ivf above ``EXACT_MAX``; ivf → exact below half of it; ivf with new cells when the
knowledge base has grown ``RETRAIN_GROWTH`` times since its cells were trained). Readers go
on searching the previous generation meanwhile (``crag.index.layout``).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "EXACT_MAX",
    "RANGE",
    "cells",
    "describe",
    "empty",
    "fit",
    "kind_for",
    "nprobe",
    "quantize",
    "search_params",
    "single_threaded",
]

RANGE = 0.5  # codes cover [-RANGE, RANGE]; larger components (short texts only) are clipped
EXACT_MAX = 50_000
RETRAIN_GROWTH = 4
_MIN_CELLS = 64
_MAX_CELLS = 4096
_TRAIN_PER_CELL = 40  # k-means sample: this many vectors a cell (FAISS asks for 39)
_TRAIN_ITERATIONS = 10
_BLOCK = 32_768  # vectors decoded at a time when an index is rebuilt
_SEED = 1234


def _faiss() -> Any:
    import faiss

    return faiss


def _quantizer_type() -> int:
    return _faiss().ScalarQuantizer.QT_8bit_uniform


def _set_range(sq: Any) -> None:
    import numpy as np

    _faiss().copy_array_to_vector(np.array([-RANGE, 2 * RANGE], dtype=np.float32), sq.trained)


def quantize(vectors: Any) -> Any:
    """The vectors as the store holds them: coded and decoded (float32, same shape)."""
    import numpy as np

    faiss = _faiss()
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.size == 0:
        return x
    sq = faiss.ScalarQuantizer(x.shape[1], _quantizer_type())
    _set_range(sq)
    return sq.decode(sq.compute_codes(x))


def cells(n: int) -> int:
    """The number of IVF cells for ``n`` vectors: the power of two nearest ``2 * sqrt(n)``, bounded.

    Measured on the million chunks of ``benchmarks/store_scale.py`` (one thread, the exact top
    50 of 100 questions): 1,024 cells and 32 probes found 0.51 of it in 1.5 ms, 2,048 cells
    and 64 probes 0.63 in 1.6 ms (4,096 and 64: 0.63 in 1.3 ms, for 30 s more k-means and
    assignment when the index is built)."""
    if n <= 0:
        return _MIN_CELLS
    return max(_MIN_CELLS, min(_MAX_CELLS, 2 ** round(math.log2(2 * math.sqrt(n)))))


def nprobe(nlist: int) -> int:
    """Cells searched per query: a thirty-second of them, at least 32 (all, when fewer)."""
    return min(nlist, max(32, nlist // 32))


def kind_for(n: int, current: str | None = None) -> str:
    """``exact`` or ``ivf`` for ``n`` chunks; an ``ivf`` index stays one down to half of ``EXACT_MAX``."""
    if n > EXACT_MAX:
        return "ivf"
    if current == "ivf" and n > EXACT_MAX // 2:
        return "ivf"
    return "exact"


def empty(dim: int) -> Any:
    """An empty exact index of ``dim``-dimensional codes."""
    faiss = _faiss()
    sq = faiss.IndexScalarQuantizer(dim, _quantizer_type(), faiss.METRIC_INNER_PRODUCT)
    _set_range(sq.sq)
    sq.is_trained = True
    return faiss.IndexIDMap2(sq)


def kind(index: Any) -> str:
    """``exact``, ``ivf``, or ``other`` (an index written by an older crag: float32 vectors)."""
    faiss = _faiss()
    if isinstance(index, faiss.IndexIVFScalarQuantizer):
        return "ivf"
    if isinstance(index, faiss.IndexIDMap2):
        inner = faiss.downcast_index(index.index)
        if isinstance(inner, faiss.IndexScalarQuantizer) and inner.sq.qtype == _quantizer_type():
            return "exact"
    return "other"


def describe(index: Any) -> str:
    """The index as the meta table records it: ``exact`` or ``ivf:<cells>``."""
    k = kind(index)
    return f"ivf:{index.nlist}" if k == "ivf" else k


def _contents(index: Any) -> Any:
    """(ids, vectors) blocks of everything ``index`` holds, decoded."""
    import numpy as np

    faiss = _faiss()
    if kind(index) == "ivf":
        invlists = index.invlists
        id_parts: list[Any] = []
        code_parts: list[Any] = []
        held = 0
        for lst in range(index.nlist + 1):
            size = invlists.list_size(lst) if lst < index.nlist else 0
            if size:
                id_parts.append(faiss.rev_swig_ptr(invlists.get_ids(lst), size).copy())
                code_parts.append(faiss.rev_swig_ptr(invlists.get_codes(lst), size * index.code_size).copy())
                held += size
            if held and (held >= _BLOCK or lst == index.nlist):  # cells gathered into blocks
                codes = np.concatenate(code_parts).reshape(held, index.code_size)
                yield np.concatenate(id_parts).astype(np.int64), index.sq.decode(codes)
                id_parts, code_parts, held = [], [], 0
        return
    ids = faiss.vector_to_array(index.id_map).astype(np.int64)
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    for at in range(0, ids.size, _BLOCK):
        n = min(_BLOCK, ids.size - at)
        yield ids[at : at + n], inner.reconstruct_n(at, n)


def _sample(index: Any, n: int) -> Any:
    """About ``n`` of the index's vectors, decoded, spread over all of them."""
    import numpy as np

    total = index.ntotal
    step = max(1, total // max(1, n))
    # Copies: a view would keep its whole decoded block alive, every block of the index.
    parts = [vectors[::step].copy() for _, vectors in _contents(index)] if step > 1 else [v for _, v in _contents(index)]
    sample = np.concatenate(parts) if parts else np.zeros((0, index.d), dtype=np.float32)
    return np.ascontiguousarray(sample[:n] if sample.shape[0] > n else sample)


def _ivf(index: Any, n: int) -> Any:
    """A new ivf index holding what ``index`` holds, its cells trained for ``n`` vectors."""
    import numpy as np

    faiss = _faiss()
    d = index.d
    nlist = cells(n)
    sample = _sample(index, nlist * _TRAIN_PER_CELL)
    nlist = max(1, min(nlist, sample.shape[0] // 4))
    kmeans = faiss.Kmeans(
        d, nlist, niter=_TRAIN_ITERATIONS, spherical=True, seed=_SEED, verbose=False, min_points_per_centroid=4
    )
    kmeans.train(sample)
    coarse = faiss.IndexFlatIP(d)
    coarse.add(np.ascontiguousarray(kmeans.centroids, dtype=np.float32))
    ivf = faiss.IndexIVFScalarQuantizer(coarse, d, nlist, _quantizer_type(), faiss.METRIC_INNER_PRODUCT, False)
    ivf.own_fields = True
    coarse.this.disown()
    _set_range(ivf.sq)
    ivf.is_trained = True
    ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
    ivf.nprobe = nprobe(nlist)
    for ids, vectors in _contents(index):
        ivf.add_with_ids(np.ascontiguousarray(vectors), ids)  # decoded codes code back to themselves
    return ivf


def _exact(index: Any) -> Any:
    """A new exact index holding what ``index`` holds."""
    import numpy as np

    out = empty(index.d)
    for ids, vectors in _contents(index):
        out.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), ids)
    return out


def fit(index: Any) -> Any:
    """The index to publish for what ``index`` now holds (see the module docstring)."""
    n = int(index.ntotal)
    have = kind(index)
    want = kind_for(n, have)
    if want == "exact":
        return index if have == "exact" else _exact(index)
    if have == "ivf" and cells(n) < RETRAIN_GROWTH * index.nlist and n >= index.nlist * 4:
        return index
    return _ivf(index, n)


def single_threaded() -> None:
    """FAISS searches from the calling thread use one OpenMP thread (the setting is per thread)."""
    _faiss().omp_set_num_threads(1)


def search_params(index: Any, allowed: Any = None) -> Any:
    """FAISS search parameters for ``index``: its cells to probe, and the ids ``allowed`` (or None)."""
    faiss = _faiss()
    sel = faiss.IDSelectorBatch(allowed) if allowed is not None else None
    if kind(index) == "ivf":
        probe = nprobe(index.nlist)
        if allowed is not None and allowed.size:
            # A restricted search looks into proportionally more cells to find as many candidates.
            probe = min(index.nlist, probe * max(1, math.ceil(index.ntotal / allowed.size)))
        return faiss.SearchParametersIVF(nprobe=probe, sel=sel) if sel is not None else faiss.SearchParametersIVF(nprobe=probe)
    return faiss.SearchParameters(sel=sel) if sel is not None else None
