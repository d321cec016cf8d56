"""crag.index.fusion: the pure function every store's hybrid search fuses its rankings with."""

from __future__ import annotations

import attrs
from hypothesis import example, given
from hypothesis import strategies as st

from crag.index.fusion import SearchWeights, fuse, normalise

W = SearchWeights()

# A ranking: distinct chunk ids with strictly decreasing scores (best first), 0.1 apart or more.
rankings = st.lists(st.integers(0, 60), unique=True, max_size=25).flatmap(
    lambda ids: st.lists(st.integers(1, 1000), min_size=len(ids), max_size=len(ids), unique=True).map(
        lambda scores: [(c, s / 10) for c, s in zip(ids, sorted(scores, reverse=True))]
    )
)


def ids(fused):
    return [f.chunk_id for f in fused]


def test_normalise_puts_the_first_at_one_and_the_last_at_zero_whatever_the_direction():
    assert normalise([(7, 30.0), (8, 20.0), (9, 10.0)]) == {7: 1.0, 8: 0.5, 9: 0.0}
    # FTS5's BM25 is lower-better: the same order gives the same values.
    assert normalise([(7, -12.0), (8, -8.0), (9, -4.0)]) == {7: 1.0, 8: 0.5, 9: 0.0}
    assert normalise([(1, 0.3)]) == {1: 1.0}
    assert normalise([(1, 0.3), (2, 0.3)]) == {1: 1.0, 2: 1.0}
    assert normalise([]) == {}


@given(rankings, rankings, st.sampled_from([0.5, 1.0, 3.0, 40.0]), st.sampled_from([-5.0, 0.0, 2.0]))
@example(vec=list(zip(range(25), [s / 10 for s in sorted([1, 6, 21, 19, 18, 17, 16, 13, 14, 11, 5, 15, 4, 12, 45, 2, 3, 9, 8,
                                                            7, 10, 22, 20, 23, 24], reverse=True)])),
         lex=[(0, 4.5), (1, 0.6), (2, 0.3), (12, 0.2), (4, 0.1)], scale=0.5, shift=-5.0)  # once found: last-bit ties
def test_scale_and_direction_of_a_stores_scores_do_not_change_the_order(vec, lex, scale, shift):
    """Two stores that rank alike fuse alike (PostgreSQL's ts_rank vs SQLite's BM25)."""
    plain = fuse(vec, lex, W)
    rescaled = fuse(vec, [(c, -scale * s + shift) for c, s in lex], W)
    assert ids(rescaled) == ids(plain)


@given(rankings, rankings)
def test_every_candidate_once_and_values_never_increase(vec, lex):
    out = fuse(vec, lex, W, file_of={c: c % 4 for c, _ in vec + lex})
    assert sorted(ids(out)) == sorted({c for c, _ in vec} | {c for c, _ in lex})
    values = [f.value for f in out]
    assert values == sorted(values, reverse=True)


@given(rankings)
def test_one_ranking_alone_keeps_its_order(lex):
    alone = attrs.evolve(W, vector=1.0, lexical=1.0, file=0.0, same_file=1.0)
    assert ids(fuse([], lex, alone)) == [c for c, _ in lex]
    assert ids(fuse(lex, [], alone)) == [c for c, _ in lex]


def test_positions_in_the_chunk_rankings_are_reported():
    out = {f.chunk_id: f for f in fuse([(1, 0.9), (2, 0.5)], [(2, -9.0), (3, -1.0)], W)}
    assert (out[1].vector_rank, out[1].lexical_rank) == (1, None)
    assert (out[2].vector_rank, out[2].lexical_rank) == (2, 1)
    assert (out[3].vector_rank, out[3].lexical_rank) == (None, 2)


def test_the_text_ranking_outweighs_the_hash_vectors_by_default():
    # Chunk 1 is the vectors' best and the text ranking's last; chunk 2 the reverse.
    vec = [(1, 0.6), (3, 0.5), (2, 0.2)]
    lex = [(2, -10.0), (3, -6.0), (1, -2.0)]
    assert ids(fuse(vec, lex, W))[0] == 2


def test_chunks_of_a_well_ranked_file_gain():
    lex = [(1, -10.0), (2, -9.9), (3, -5.0)]
    files = [(20, -30.0), (10, -1.0)]
    file_of = {1: 10, 2: 20, 3: 10}
    assert ids(fuse([], lex, attrs.evolve(W, same_file=1.0), files, file_of))[:2] == [2, 1]
    assert ids(fuse([], lex, attrs.evolve(W, file=0.0, same_file=1.0), files, file_of))[:2] == [1, 2]


def test_one_file_cannot_fill_the_top_with_near_duplicates():
    # Four chunks of file 10 score a little above the best chunk of file 20.
    lex = [(1, -10.0), (2, -9.8), (3, -9.6), (4, -9.4), (5, -9.2), (6, -1.0)]
    file_of = {1: 10, 2: 10, 3: 10, 4: 10, 5: 20, 6: 30}
    spread = ids(fuse([], lex, W, file_of=file_of))
    assert spread[0] == 1 and spread.index(5) < 3
    assert ids(fuse([], lex, attrs.evolve(W, same_file=1.0), file_of=file_of)) == [1, 2, 3, 4, 5, 6]
    # A chunk the map does not know stands alone.
    assert ids(fuse([], lex, W, file_of={}))[:5] == [1, 2, 3, 4, 5]


def test_ties_go_to_the_smaller_chunk_id():
    assert ids(fuse([], [(9, 1.0), (4, 1.0)], W)) == [4, 9]
