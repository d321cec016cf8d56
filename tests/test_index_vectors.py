"""The embedded store's vector index follows the knowledge base's size (crag.index.vectors),
and full-text rankings follow crag.index.lexical's plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from crag.config import Settings
from crag.index import index_roots, lexical, open_index, vectors
from crag.index.embedders import HashEmbedder


def unit(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_codes_are_what_both_stores_hold() -> None:
    x = unit(50)
    q = vectors.quantize(x)
    assert q.shape == x.shape and np.abs(q - x).max() < 0.5 / 127 + 1e-6
    assert np.array_equal(vectors.quantize(q), q)  # decoded codes code back to themselves
    index = vectors.empty(64)
    index.add_with_ids(x, np.arange(50, dtype=np.int64) + 1)
    scores, ids = index.search(x[:1], 3)
    assert ids[0][0] == 1 and abs(scores[0][0] - float(q[0] @ x[0])) < 1e-5


def test_the_kind_follows_the_size_and_keeps_ids_and_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vectors, "EXACT_MAX", 400)
    x = unit(1000)
    ids = np.arange(1000, dtype=np.int64) * 3 + 7
    index = vectors.empty(64)
    index.add_with_ids(x[:300], ids[:300])
    assert vectors.fit(index) is index and vectors.describe(index) == "exact"
    index.add_with_ids(x[300:], ids[300:])
    ivf = vectors.fit(index)
    assert vectors.kind(ivf) == "ivf" and ivf.ntotal == 1000 and vectors.describe(ivf) == f"ivf:{ivf.nlist}"
    assert np.allclose(ivf.reconstruct(int(ids[5])), vectors.quantize(x[5:6])[0])
    exact_ids = index.search(x[:20], 10)[1]
    approx_ids = ivf.search(x[:20], 10, params=vectors.search_params(ivf))[1]
    assert np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx_ids, exact_ids)]) > 0.5
    # Restricted to a few ids, a search still finds them.
    allowed = ids[:5]
    found = ivf.search(x[:1], 5, params=vectors.search_params(ivf, allowed))[1][0]
    assert set(found) == set(allowed)
    assert vectors.fit(ivf) is ivf  # still suits
    ivf.remove_ids(ids[150:])
    back = vectors.fit(ivf)  # 150 chunks: below half of EXACT_MAX again
    assert vectors.kind(back) == "exact" and back.ntotal == 150
    assert np.allclose(back.reconstruct(int(ids[7])), vectors.quantize(x[7:8])[0])


def test_an_index_that_grows_gets_new_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vectors, "EXACT_MAX", 100)
    monkeypatch.setattr(vectors, "_MIN_CELLS", 4)
    index = vectors.empty(64)
    index.add_with_ids(unit(200), np.arange(200, dtype=np.int64))
    small = vectors.fit(index)
    small.add_with_ids(unit(20000, seed=1), np.arange(200, 20200, dtype=np.int64))
    grown = vectors.fit(small)
    assert grown is not small and grown.nlist >= vectors.RETRAIN_GROWTH * small.nlist and grown.ntotal == 20200


def test_an_index_past_the_threshold_is_searched_through_its_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vectors, "EXACT_MAX", 20)
    monkeypatch.setattr(vectors, "_MIN_CELLS", 2)
    kb = tmp_path / "kb"
    kb.mkdir()
    for n in range(40):
        (kb / f"note{n}.md").write_text(f"# Note {n}\n\nThe colour of box {n} is shade{n}.\n", encoding="utf-8")
    cfg = Settings(index_dir=str(tmp_path / "index"))
    index_roots(cfg, [kb])
    with open_index(cfg) as reader:
        assert vectors.kind(reader._vectors) == "ivf"
        assert reader.search("colour of box 17 shade17", 1)[0].path.endswith("note17.md")
        assert reader.search("shade3", 1, roots=[str(kb / "note3.md")])[0].path.endswith("note3.md")
    for n in range(30):
        (kb / f"note{n}.md").unlink()
    index_roots(cfg, [kb])
    with open_index(cfg, HashEmbedder()) as reader:
        assert vectors.kind(reader._vectors) == "exact" and reader.n_chunks == 10


def test_the_lexical_plan_takes_rare_terms_within_the_budget() -> None:
    assert lexical.plan([("warsaw", 10), ("city", 500), ("history", 90)], 100) == lexical.LexicalPlan(
        ("warsaw", "history"), lexical.ANY, ("city",))
    assert lexical.plan([("a", 10), ("b", 20)], 100).terms == ("a", "b")  # small: every term
    assert lexical.plan([("city", 500), ("world", 300), ("gone", 0)], 100) == lexical.LexicalPlan(
        ("city", "world"), lexical.ALL)
    assert lexical.plan([("gone", 0)], 100).terms == ()


def test_frequent_words_are_ranked_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    for n in range(30):
        extra = " zebra" if n == 21 else ""
        (kb / f"doc{n}.md").write_text(f"# Doc {n}\n\nThe system stores records{extra}.\n", encoding="utf-8")
    cfg = Settings(index_dir=str(tmp_path / "index"))
    index_roots(cfg, [kb])
    monkeypatch.setattr(lexical, "CHUNK_BUDGET", 5)
    with open_index(cfg) as reader:
        # "system" is in every chunk, "zebra" in one: the ranking is the rare word's.
        assert [reader.chunk_rows([c])[c].path for c, _ in reader.lexical_ranking("system zebra", 10)] == [
            str(kb / "doc21.md")]
        # Frequent words only: rows holding all of them, at most the budget of them.
        ranked = reader.lexical_ranking("system records", 10)
        assert 0 < len(ranked) <= 5


def test_frequent_words_still_score_the_rows_a_rare_word_selects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the budget a frequent word selects no rows of its own, but it is not dropped: the
    rows the rare word selects are ranked by BM25 over every word, with the same scores as
    an unbounded ranking gives them, in chunk and file rankings alike."""
    kb = tmp_path / "kb"
    kb.mkdir()
    for n in range(30):
        text = "The system stores records." if n % 4 == 1 else "The system stores data."
        if n == 5:
            text = "A zebra."  # the shortest row holding the rare word: first by the rare word alone
        if n == 7:
            text = "The zebra stores many records."
        (kb / f"doc{n:02d}.md").write_text(f"# Doc {n}\n\n{text}\n", encoding="utf-8")
    cfg = Settings(index_dir=str(tmp_path / "index"))
    index_roots(cfg, [kb])
    with open_index(cfg) as reader:
        unbounded = reader.lexical_ranking("zebra records", 10)
        files = sorted(reader.chunk_files([c for c, _ in unbounded]).values())
        unbounded_files = reader.file_ranking("zebra records", 10, files=files)
    monkeypatch.setattr(lexical, "CHUNK_BUDGET", 5)
    monkeypatch.setattr(lexical, "FILE_BUDGET", 5)
    with open_index(cfg) as reader:
        ranked = reader.lexical_ranking("zebra records", 10)
        assert [reader.chunk_rows([c])[c].path for c, _ in ranked] == [str(kb / "doc07.md"), str(kb / "doc05.md")]
        assert ranked == [p for p in unbounded if p[0] in dict(ranked)]
        zebra_files = sorted(reader.chunk_files([c for c, _ in ranked]).values())
        assert reader.file_ranking("zebra records", 10, files=files) == [p for p in unbounded_files if p[0] in zebra_files]
        assert reader.file_ranking("zebra records", 10, files=files)[0][0] == reader.chunk_files([ranked[0][0]])[ranked[0][0]]
