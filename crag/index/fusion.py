"""Hybrid fusion: a pure function of rankings, shared by every store.

A search gathers three rankings from a store, each best first with the store's own
scores: chunks by cosine similarity (``vector``), chunks by full-text rank (``lexical``)
and whole files by full-text rank (``file``). ``fuse`` merges them in two steps:

1. Each ranking's scores are rescaled to [0, 1] within the ranking, its best candidate at
   1 and its last at 0 (``normalise``), so the fusion needs neither the stores' scales nor
   the direction of their scores (FTS5's BM25 is lower-better, a cosine higher-better),
   and two stores that rank alike fuse alike. A chunk's value is the weighted sum of its
   rescaled scores: ``vector x cosine + lexical x text rank + file x rank of its file``
   (0 from a ranking that did not return it).
2. The order is picked greedily: a chunk's value counts ``same_file`` times less for each
   chunk of the same file already placed above it, so that one long document cannot fill
   every place of a short list with near-duplicates of one answer.

Why scores and not reciprocal ranks, and why these weights: ``docs/retrieval.md`` gives
the measurements (``benchmarks/retrieval.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from attrs import frozen

from ..ports import SearchWeights  # the record is the store port's; fusion reads it

__all__ = ["Fused", "SearchWeights", "fuse", "normalise", "scores_in_rank_order"]


@frozen
class Fused:
    """One candidate chunk: its fused value and its 1-based positions in the chunk rankings."""

    chunk_id: int
    value: float
    vector_rank: int | None
    lexical_rank: int | None


def normalise(ranking: Sequence[tuple[int, float]]) -> dict[int, float]:
    """``{id: score rescaled to [0, 1]}`` for a ranking given best first: the first at 1, the
    last at 0 (all at 1 when the scores are equal). Repeated ids keep their first score.
    Rounded to nine places: the same ranking scaled or shifted by a store (PostgreSQL's
    ts_rank, SQLite's BM25) differs only in the last bits, which would otherwise break ties."""
    if not ranking:
        return {}
    best, last = ranking[0][1], ranking[-1][1]
    span = best - last
    out: dict[int, float] = {}
    for i, s in ranking:
        if i not in out:
            out[i] = round(min(1.0, max(0.0, (s - last) / span)), 9) if span else 1.0
    return out


def fuse(
    vector: Sequence[tuple[int, float]],
    lexical: Sequence[tuple[int, float]],
    weights: SearchWeights,
    file_ranking: Sequence[tuple[int, float]] = (),
    file_of: Mapping[int, int] | None = None,
) -> list[Fused]:
    """Every chunk of ``vector`` and ``lexical`` ((chunk id, score) pairs, best first), best first.

    ``file_ranking`` ((file id, score) pairs, best first) adds to the chunks ``file_of``
    maps to those files; ``file_of`` also tells which chunks share a file for ``same_file``
    (a chunk it does not map stands alone). Ties go to the smaller chunk id.
    """
    vec = normalise(vector)
    lex = normalise(lexical)
    files = normalise(file_ranking) if weights.file else {}
    file_of = file_of or {}
    v_pos = {c: p for p, (c, _) in reversed(list(enumerate(vector, 1)))}
    l_pos = {c: p for p, (c, _) in reversed(list(enumerate(lexical, 1)))}
    value: dict[int, float] = {}
    for cid in (*vec, *lex):
        if cid not in value:
            value[cid] = (
                weights.vector * vec.get(cid, 0.0)
                + weights.lexical * lex.get(cid, 0.0)
                + weights.file * files.get(file_of.get(cid, -1), 0.0)
            )
    # Greedy order: pop the best; if chunks of its file were placed since its value was
    # computed, push it back with the value shrunk for them (values only ever shrink).
    heap = [(-v, c, 0) for c, v in value.items()]
    heapq.heapify(heap)
    placed: dict[object, int] = {}
    out: list[Fused] = []
    decay = weights.same_file
    while heap:
        neg, cid, seen = heapq.heappop(heap)
        group: object = file_of.get(cid, ("chunk", cid))
        n = placed.get(group, 0)
        if n != seen and decay != 1.0:
            heapq.heappush(heap, (-value[cid] * decay**n, cid, n))
            continue
        placed[group] = n + 1
        out.append(Fused(cid, -neg, v_pos.get(cid), l_pos.get(cid)))
    return out


def scores_in_rank_order(cosines: Sequence[float]) -> list[float]:
    """The scores of hits in fused order: each hit's cosine, capped by the score above it.

    Fusion may rank a chunk above one that is more similar to the query; a list of hits whose
    scores went up and down would read as a ranking error. Each reported score is the lowest
    cosine similarity at or above its rank, so scores never increase down the list, never
    exceed the hit's own cosine (a ``high_vector_score`` fast path never fires on a score
    the vectors do not support), and a list already in cosine order is unchanged.
    """
    out: list[float] = []
    for cos in cosines:
        out.append(cos if not out else min(cos, out[-1]))
    return out
