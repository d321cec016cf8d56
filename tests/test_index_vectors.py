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
        cells = reader._vectors.nlist
    # A changed note in an update that keeps the cells: its old vector goes, its new one is found.
    (kb / "note5.md").write_text("# Note 5\n\nThe colour of box 5 is now vermilion.\n", encoding="utf-8")
    index_roots(cfg, [kb])
    with open_index(cfg) as reader:
        assert vectors.kind(reader._vectors) == "ivf" and reader._vectors.nlist == cells
        assert reader._vectors.ntotal == reader.n_chunks == 40
        assert reader.search("vermilion box 5", 1)[0].path.endswith("note5.md")
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


# -- the vectors of an update are written in bounded memory (crag.index.vectors_write) ---------


def _lists(index: object) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each cell's ids and codes, in the order the index holds them."""
    import faiss

    out = []
    for lst in range(index.nlist):
        size = index.invlists.list_size(lst)
        ids = faiss.rev_swig_ptr(index.invlists.get_ids(lst), size).copy() if size else np.zeros(0, np.int64)
        codes = faiss.rev_swig_ptr(index.invlists.get_codes(lst), size * index.code_size).copy() if size else b""
        out.append((ids, np.asarray(codes, dtype=np.uint8).reshape(size, index.code_size)))
    return out


def _written(tmp_path: Path, base_index: object | None, removed: list[int], x: np.ndarray, ids: np.ndarray) -> tuple[str, object]:
    import faiss

    from crag.index import vectors_write

    folder = tmp_path / f"gen{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    base = None
    if base_index is not None:
        faiss.write_index(base_index, str(folder / "base.faiss"))
        base = vectors_write.Base(str(folder / "base.faiss"))
        if base.kind != "ivf" and removed:
            base.remove(np.asarray(removed, dtype=np.int64))
    spill = vectors_write.Spill(str(folder), x.shape[1], base.index.quantizer if base and base.kind == "ivf" else None)
    for at in range(0, len(ids), 97):  # in batches, as an update embeds them
        spill.add(x[at : at + 97], ids[at : at + 97])
    kind, n = vectors_write.write_vectors(str(folder / "out.faiss"), x.shape[1], base, np.asarray(removed, np.int64), spill)
    spill.remove()
    out = faiss.read_index(str(folder / "out.faiss"))
    assert n == out.ntotal and vectors.describe(out) == kind
    return kind, out


def test_an_index_written_in_blocks_is_the_one_faiss_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crag.index import vectors_write

    monkeypatch.setattr(vectors, "EXACT_MAX", 400)
    monkeypatch.setattr(vectors, "_MIN_CELLS", 8)
    monkeypatch.setattr(vectors, "_BLOCK", 256)
    monkeypatch.setattr(vectors_write, "BLOCK", 256)
    x = unit(3000)
    ids = np.arange(3000, dtype=np.int64) * 3 + 7
    # From empty: the same cells, and every cell holds the same ids and codes in the same order.
    expected = vectors.empty(64)
    expected.add_with_ids(x, ids)
    expected = vectors.fit(expected)
    kind, got = _written(tmp_path, None, [], x, ids)
    assert kind == vectors.describe(expected) and kind.startswith("ivf:")
    assert np.array_equal(faiss_centroids(got), faiss_centroids(expected))
    for (gi, gc), (ei, ec) in zip(_lists(got), _lists(expected)):
        assert np.array_equal(gi, ei) and np.array_equal(gc, ec)
    assert np.array_equal(got.reconstruct(int(ids[5])), expected.reconstruct(int(ids[5])))
    q = x[:30]
    assert np.array_equal(got.search(q, 10)[1], expected.search(q, 10)[1])
    assert got.nprobe == expected.nprobe

    # An update on it: some removed, some added, the cells kept: the same vectors in each cell.
    more = unit(400, seed=3)
    more_ids = np.arange(400, dtype=np.int64) + 100_000
    removed = [int(i) for i in ids[::7]]
    expected.remove_ids(np.asarray(removed, dtype=np.int64))
    expected.add_with_ids(more, more_ids)
    assert vectors.fit(expected) is expected
    kind2, got2 = _written(tmp_path, got, removed, more, more_ids)
    assert kind2 == kind and got2.ntotal == expected.ntotal
    for (gi, gc), (ei, ec) in zip(_lists(got2), _lists(expected)):
        assert sorted(gi.tolist()) == sorted(ei.tolist())
        assert np.array_equal(gc[np.argsort(gi)], ec[np.argsort(ei)])
    assert np.array_equal(got2.reconstruct(100_017), expected.reconstruct(100_017))
    with pytest.raises(RuntimeError):
        got2.reconstruct(int(ids[7]))  # removed

    # Most of it removed: exact again, in the order FAISS keeps.
    keep = ids[:150]
    _, small = _written(tmp_path, got2, [int(i) for i in ids[150:]] + more_ids.tolist(), np.zeros((0, 64), np.float32), np.zeros(0, np.int64))
    assert vectors.kind(small) == "exact" and small.ntotal == 150 - len(range(0, 150, 7))
    assert set(__import__("faiss").vector_to_array(small.id_map).tolist()) == set(keep.tolist()) - set(removed)


def test_an_exact_index_updated_in_blocks_is_the_one_faiss_builds(tmp_path: Path) -> None:
    import faiss

    x = unit(300)
    ids = np.arange(300, dtype=np.int64) + 1
    base = vectors.empty(64)
    base.add_with_ids(x[:200], ids[:200])
    expected = faiss.clone_index(base)
    expected.remove_ids(ids[10:20])
    expected.add_with_ids(x[200:], ids[200:])
    kind, got = _written(tmp_path, base, ids[10:20].tolist(), x[200:], ids[200:])
    assert kind == "exact"
    assert np.array_equal(faiss.vector_to_array(got.id_map), faiss.vector_to_array(expected.id_map))
    assert np.array_equal(got.search(x[:20], 10)[1], expected.search(x[:20], 10)[1])


def test_a_grown_index_written_in_blocks_gets_new_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vectors, "EXACT_MAX", 100)
    monkeypatch.setattr(vectors, "_MIN_CELLS", 4)
    _, small = _written(tmp_path, None, [], unit(200), np.arange(200, dtype=np.int64))
    x = unit(20000, seed=1)
    _, grown = _written(tmp_path, small, [3, 4], x, np.arange(200, 20200, dtype=np.int64))
    assert grown.nlist >= vectors.RETRAIN_GROWTH * small.nlist and grown.ntotal == 20198
    assert np.array_equal(grown.reconstruct(5000), vectors.quantize(x[4800:4801])[0])
    found = grown.search(x[:50], 1, params=vectors.search_params(grown))[1][:, 0]
    assert np.mean(found == np.arange(200, 250)) > 0.9


def faiss_centroids(index: object) -> np.ndarray:
    import faiss

    return faiss.rev_swig_ptr(faiss.downcast_index(index.quantizer).get_xb(), index.nlist * index.d).copy()


_PEAK_CHILD = r"""
import random, resource, sys
from pathlib import Path
from crag.index import build, vectors
from crag.index.embedders import HashEmbedder
try:
    from crag.index import vectors_write
    vectors_write.BLOCK = 256
except ImportError:
    pass
vectors.EXACT_MAX, vectors._MIN_CELLS, vectors._MAX_CELLS, vectors._BLOCK = 200, 16, 16, 256
kb, files = Path(sys.argv[1]), int(sys.argv[2])
words = [f"w{i}" for i in range(300)]
rng = random.Random(0)
for f in range(files):
    sections = ["## Part %d\n\n%s\n" % (s, " ".join(rng.choices(words, k=40))) for s in range(20)]
    (kb / f"doc{f}.md").write_text("# Doc %d\n\n" % f + "\n".join(sections), encoding="utf-8")
report = build.update_index(str(kb / ".index"), [kb], HashEmbedder(8192), max_tokens=64, min_tokens=16)
print(report.chunks_total, vectors.kind_for(report.chunks_total), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _indexing_peak(tmp_path: Path, files: int) -> tuple[int, int]:
    """(chunks, peak RSS in KiB) of a child process indexing ``files`` files of 20 chunks."""
    import subprocess
    import sys

    kb = tmp_path / f"kb{files}"
    kb.mkdir()
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(kb), str(files)], cwd=root, capture_output=True,
                         text=True, timeout=600, check=True).stdout.split()
    assert out[1] == "ivf"
    return int(out[0]), int(out[2])


def test_indexing_memory_does_not_grow_with_the_knowledge_base(tmp_path: Path) -> None:
    """Four times the chunks (each an 8 KB code, 32 KB as floats) and the indexer's peak stays
    where it was: the vectors go to disk as they are embedded and come back a block at a time.
    (Holding them would take at least 3,000 * 8 KB = 24 MB more; the bound is a third of that.)"""
    small_chunks, small = _indexing_peak(tmp_path, 50)
    large_chunks, large = _indexing_peak(tmp_path, 200)
    assert large_chunks >= 4 * small_chunks - 10
    assert large - small < 8 * 1024, f"peak RSS {small} KiB for {small_chunks} chunks, {large} KiB for {large_chunks}"


def test_large_files_are_read_ahead_within_a_byte_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file over a batch's bytes is a batch of its own: sixteen batches read ahead were
    sixteen files of up to 8 MiB each, with their text, lines and chunks (24 such files took
    852 MB to index, against 632 MB since). The files read ahead of the one being indexed stay
    within the window's bytes, or one a worker thread."""
    import threading
    import time

    from crag.index import reading
    from crag.index.discover import DiscoveredFile

    size = 1 << 20
    files = []
    for n in range(20):
        path = tmp_path / f"log{n:02d}.md"
        path.write_text(("word " * 19 + "end\n") * (size // 100), encoding="utf-8")
        files.append(DiscoveredFile(str(path), str(tmp_path), path.stat().st_size, 0))
    real_read = reading.read_bytes
    reads: list[str] = []
    lock = threading.Lock()

    def counted(path: str) -> bytes:
        with lock:
            reads.append(path)
        return real_read(path)

    monkeypatch.setattr(reading, "read_bytes", counted)
    prepared = reading.prepare_all(files, {}, (400, 1))
    try:
        assert next(prepared).chunks
        time.sleep(1.0)  # the workers read ahead as far as they may
        # the one taken, the window's 4 MiB, and one more a worker may have started
        assert len(reads) <= 1 + 4 + 1, f"{len(reads)} files of 1 MiB read ahead of the first"
        assert [p.file for p in prepared] == files[1:]
    finally:
        prepared.close()

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
