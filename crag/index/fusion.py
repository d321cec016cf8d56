"""Reciprocal-rank fusion: a pure function of rankings, shared by every store.

A search gathers three rankings from a store (chunks by cosine, chunks by full-text rank,
files by full-text rank over whole files) and ``fuse`` merges them: the chunk at 1-based
position r of a chunk ranking gains ``weight / (k + r)``, and every candidate chunk of the
r-th best file gains ``file / (k + r)``. Only positions count, never the stores' own
scores, so two stores that rank alike fuse alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from attrs import frozen

__all__ = ["Fused", "SearchWeights", "fuse", "scores_in_rank_order"]


@frozen
class SearchWeights:
    """How the rankings are fused: weighted reciprocal-rank fusion with constant ``k``.

    Three rankings: chunks by cosine (``vector``), chunks by BM25 over path words, heading
    path and text (``lexical``), and files by BM25 over path words and whole text
    (``file``: every candidate chunk of the r-th best file gains ``file / (k + r)``).
    ``bm25_*`` weigh the title, heading and body columns of the full-text ranking.
    Defaults measured by ``benchmarks/retrieval.py``.
    """

    vector: float = 1.0
    lexical: float = 1.0
    file: float = 1.0
    k: float = 60.0
    candidates: int = 50
    file_candidates: int = 20
    bm25_title: float = 4.0
    bm25_heading: float = 4.0
    bm25_body: float = 1.0


@frozen
class Fused:
    """One candidate chunk: its fused value and its 1-based positions in the chunk rankings."""

    chunk_id: int
    value: float
    vector_rank: int | None
    lexical_rank: int | None


def fuse(
    vector: Sequence[int],
    lexical: Sequence[int],
    weights: SearchWeights,
    file_ranking: Sequence[int] = (),
    file_of: Mapping[int, int] | None = None,
) -> list[Fused]:
    """Every chunk of ``vector`` and ``lexical`` (chunk ids, best first), best fused first.

    ``file_ranking`` (file ids, best first) adds to the chunks ``file_of`` maps to those
    files. Ties go to the smaller chunk id.
    """
    value: dict[int, float] = {}
    v_pos: dict[int, int] = {}
    l_pos: dict[int, int] = {}
    for pos, cid in enumerate(vector, 1):
        v_pos.setdefault(cid, pos)
        value[cid] = value.get(cid, 0.0) + weights.vector / (weights.k + pos)
    for pos, cid in enumerate(lexical, 1):
        l_pos.setdefault(cid, pos)
        value[cid] = value.get(cid, 0.0) + weights.lexical / (weights.k + pos)
    if file_ranking and file_of and weights.file:
        file_pos = {fid: pos for pos, fid in enumerate(file_ranking, 1)}
        for cid in value:
            r = file_pos.get(file_of.get(cid, -1))
            if r is not None:
                value[cid] += weights.file / (weights.k + r)
    order = sorted(value, key=lambda c: (-value[c], c))
    return [Fused(c, value[c], v_pos.get(c), l_pos.get(c)) for c in order]


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
