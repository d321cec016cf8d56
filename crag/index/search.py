"""Hybrid search over any store: the rankings a ``Retriever`` gives, fused by ``fuse``.

``hybrid_search`` is what ``Retriever.search`` does on every store: the cosine ranking
and the full-text ranking of chunks (``SearchWeights.candidates`` each), plus in
``hybrid`` mode the full-text ranking of the whole files those candidates come from, fused; each hit reports its cosine
similarity to the query clipped to [0, 1] as ``score`` (the value the
``high_vector_score`` rule compares with its threshold), capped by the score of the hit
above it so that scores follow the order (``scores_in_rank_order``); a score means the
same on either store.

Which hits a query may find is decided here too. An embedder whose vectors relate no words
that differ (the ``hash`` embedder: ``relates_words = False``; hashed vectors of unrelated
texts are never quite orthogonal) keeps only the hits that share a content word (stemmed,
not a stop word, its accents folded as full-text search folds them: ``fold_diacritics``) with
the query, in the chunk's text, heading or path as shown (relative to the working
directory): a question about something the documents never mention finds nothing (and
gets the no-evidence answer) rather than the least unrelated chunks. A learned embedder
relates words that differ, so its hits are kept as ranked.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Sequence

import attrs

from ..errors import IndexStoreError
from ..ports import Hit, Retriever
from ..text import QUESTION_FILLER, STOPWORDS, content_words, fold_diacritics, keywords
from .decoding import without_invisible
from .discover import relative_label
from .fusion import SearchWeights, fuse, scores_in_rank_order

__all__ = ["MODES", "hybrid_search"]

MODES = ("hybrid", "vector", "lexical")
_TIE = 1e-6  # cosines closer than this are equal (float32 sums in different orders)
_FILLER = STOPWORDS | QUESTION_FILLER  # a query's words that say nothing of what it is about
# What ends a query's piece without being part of it: ASCII punctuation and the common quotes.
_PUNCTUATION = string.punctuation + "\u00ab\u00bb\u2018\u2019\u201c\u201d"


def _with_lexical_candidates(
    retriever: Retriever, qvec: object, vec_rank: list[tuple[int, float]], lex_rank: list[tuple[int, float]], pool: int
) -> list[tuple[int, float]]:
    """The cosine ranking, with the full-text candidates' own cosines merged in, best ``pool``.

    Over an exact vector index this changes nothing (a candidate whose cosine beats the
    ranking's last is already in it); over an approximate one (IVF cells, HNSW) it puts back
    what the index missed among the chunks the fusion considers anyway, so that hybrid
    search stays close to its exact result (``benchmarks/store_scale.py`` measures it).
    """
    have = {c for c, _ in vec_rank}
    missing = [c for c, _ in lex_rank if c not in have]
    if not missing:
        return vec_rank
    extra = retriever.cosines(qvec, missing)  # type: ignore[arg-type]
    # Only a cosine clearly above the ranking's last goes in: the index and ``cosines`` may
    # sum a dot product in another order, and a tie must not change an exact ranking.
    floor = vec_rank[-1][1] + _TIE if len(vec_rank) >= pool else float("-inf")
    merged = vec_rank + [(c, extra[c]) for c in missing if c in extra and extra[c] > floor]
    merged.sort(key=lambda p: -p[1])  # stable: ties keep the index's order, then the candidates'
    return merged[:pool]


def hybrid_search(
    retriever: Retriever,
    weights: SearchWeights,
    query: str,
    top_k: int = 5,
    roots: Sequence[str] | None = None,
    mode: str = "hybrid",
    *,
    location: str = "",
    reindex_hint: str = "",
) -> list[Hit]:
    """The ``top_k`` best chunks for ``query``: ``mode`` is hybrid, vector or lexical."""
    if mode not in MODES:
        raise ValueError(f"unknown search mode {mode!r}")
    query = without_invisible(query)  # "wam\u200bbler" pasted is the word a document's text holds
    if top_k <= 0 or not query.strip():
        return []
    pool = max(weights.candidates, top_k)
    qvec = retriever.embed_query(unicodedata.normalize("NFC", query))  # a query written decomposed: its words' vector
    vec_rank = retriever.vector_ranking(qvec, pool, roots) if mode != "lexical" else []
    lex_rank = retriever.lexical_ranking(query, pool, roots) if mode != "vector" else []
    if mode == "hybrid" and vec_rank and lex_rank:
        vec_rank = _with_lexical_candidates(retriever, qvec, vec_rank, lex_rank, pool)
    if not vec_rank and not lex_rank:
        return []
    if mode != "hybrid":
        # One ranking alone keeps its own order (whatever the hybrid weights say).
        weights = attrs.evolve(weights, vector=1.0, lexical=1.0, file=0.0, same_file=1.0)
    file_rank: list[tuple[int, float]] = []
    file_of: dict[int, int] = {}
    if mode == "hybrid" and (weights.file or weights.same_file != 1.0):
        file_of = retriever.chunk_files(list(dict.fromkeys([c for c, _ in vec_rank] + [c for c, _ in lex_rank])))
        if weights.file and file_of:
            files = sorted(set(file_of.values()))
            file_rank = retriever.file_ranking(query, weights.file_candidates, roots, files=files)
    fused = fuse(vec_rank, lex_rank, weights, file_rank, file_of)[:top_k]
    best = [f.chunk_id for f in fused]
    cos = dict(vec_rank)
    missing = [c for c in best if c not in cos]
    if missing:
        cos.update(retriever.cosines(qvec, missing))
    rows = retriever.chunk_rows(best)
    scores = scores_in_rank_order([min(1.0, max(0.0, cos.get(f.chunk_id, 0.0))) for f in fused])
    hits = []
    for f, score in zip(fused, scores):
        row = rows.get(f.chunk_id)
        if row is None:
            raise IndexStoreError(
                f"the index in {location} is damaged (chunk {f.chunk_id} has no metadata): {reindex_hint}", location
            )
        hits.append(
            Hit(f.chunk_id, row.path, row.start_line, row.end_line, row.heading, row.text, round(score, 6),
                f.value, f.vector_rank, f.lexical_rank)
        )
    if not getattr(retriever.embedder, "relates_words", True):
        hits = sharing_a_word(hits, query)
    return hits


def sharing_a_word(hits: Sequence[Hit], query: str) -> list[Hit]:
    """The hits that share a content word with ``query`` (see the module docstring).

    A query whose content words are all of one character (``1.2.3``, ``C``) has no keyword
    to share: its hits are those holding one of its pieces as written (``v1.2.3`` holds
    ``1.2.3``, a word such as ``C`` as a word), case and accents aside. The query's stop
    words and filler are no such pieces: "what do I need" shares nothing with a text that
    has an "i" in it, and retrieves nothing. Both are read composed (NFC), so a word written
    decomposed (a file name copied on macOS) is the same word.
    """
    folded = fold_diacritics(unicodedata.normalize("NFC", query))
    words = set(keywords(folded))
    if not words and content_words(folded):
        pieces = {p for p in (w.strip(_PUNCTUATION) for w in folded.lower().split()) if p and p not in _FILLER}
        if not pieces:
            return []
        # a word as a word ("c" is not in "cat"), anything else as written ("1.2.3" in "v1.2.3")
        held = re.compile("|".join(rf"(?<!\w){re.escape(p)}(?!\w)" if p.isalpha() else re.escape(p)
                                   for p in sorted(pieces)))
        return [h for h in hits if held.search(_shown(h).lower())]
    return [h for h in hits if words & set(keywords(_shown(h)))]


def _shown(hit: Hit) -> str:
    """A hit's text as a user sees it, accents folded: its path, heading and text."""
    return fold_diacritics(unicodedata.normalize("NFC", f"{relative_label(hit.path)}\n{hit.heading}\n{hit.text}"))
