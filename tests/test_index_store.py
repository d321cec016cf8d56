"""The index store: incremental updates, embedder records, damage, search and the embedders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crag.config import Settings
from crag.errors import EmbedderMismatchError, IndexStoreError
from crag.index import ensure_indexed, index_roots, open_index
from crag.index.build import IndexLock
from crag.index.embedders import HashEmbedder, make_embedder
from crag.index.store import fts_query

ROOT = Path(__file__).resolve().parents[1]


class CountingEmbedder:
    """The hash embedder, recording every text it is asked to embed."""

    def __init__(self, dim: int = 1024) -> None:
        self.inner = HashEmbedder(dim)
        self.name = self.inner.name
        self.dim = self.inner.dim
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts.extend(texts)
        return self.inner.embed(texts)

    def take(self) -> list[str]:
        taken, self.texts = self.texts, []
        return taken


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def make_kb(root: Path) -> Path:
    write(root / "retries.md", "# Retries\n\nThe client retries a failed upload three times with backoff.\n")
    write(root / "deploy.md", "# Deploy\n\nDeploy the service with docker compose on port 8080.\n")
    write(root / "guide" / "auth.md", "# Auth\n\nTokens expire after ninety days and must be rotated.\n")
    return root


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    return make_kb(tmp_path / "kb")


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return Settings(index_dir=str(tmp_path / "index"))


def paths_of(hits) -> list[str]:
    return [os.path.basename(h.path) for h in hits]


def bump_mtime(path: Path) -> None:
    st_ = path.stat()
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 2_000_000_000))


# -- incremental updates -----------------------------------------------------------------


def test_unchanged_files_are_not_re_embedded(kb: Path, cfg: Settings) -> None:
    emb = CountingEmbedder()
    first = index_roots(cfg, [kb], embedder=emb)
    assert len(first.added) == 3 and first.wrote
    assert len(emb.take()) == first.chunks_total == 3
    again = index_roots(cfg, [kb], embedder=emb)
    assert emb.take() == [] and not again.wrote and again.unchanged == 3
    bump_mtime(kb / "deploy.md")  # touched, same bytes: hashed, not re-embedded
    touched = index_roots(cfg, [kb], embedder=emb)
    assert emb.take() == [] and touched.unchanged == 3 and not touched.changed


def test_a_changed_file_replaces_its_chunks(kb: Path, cfg: Settings) -> None:
    emb = CountingEmbedder()
    index_roots(cfg, [kb], embedder=emb)
    emb.take()
    write(kb / "deploy.md", "# Deploy\n\nDeploy the service with kubernetes helm charts.\n")
    bump_mtime(kb / "deploy.md")
    report = index_roots(cfg, [kb], embedder=emb)
    assert [os.path.basename(p) for p in report.changed] == ["deploy.md"]
    assert len(emb.take()) == 1 and report.chunks_total == 3
    with open_index(cfg, emb) as reader:
        hits = reader.search("kubernetes helm", 3)
        assert paths_of(hits)[0] == "deploy.md" and "helm" in hits[0].text
        assert not any("docker compose" in h.text for h in reader.search("docker compose port", 5))
        assert reader.n_chunks == 3


def test_a_deleted_file_leaves_and_a_renamed_file_moves(kb: Path, cfg: Settings) -> None:
    emb = CountingEmbedder()
    index_roots(cfg, [kb], embedder=emb)
    (kb / "retries.md").unlink()
    (kb / "guide" / "auth.md").rename(kb / "guide" / "tokens.md")
    report = index_roots(cfg, [kb], embedder=emb)
    assert sorted(os.path.basename(p) for p in report.removed) == ["auth.md", "retries.md"]
    assert [os.path.basename(p) for p in report.added] == ["tokens.md"]
    with open_index(cfg, emb) as reader:
        assert reader.n_chunks == 2
        assert "retries.md" not in paths_of(reader.search("retries failed upload backoff", 5))
        assert paths_of(reader.search("tokens expire rotated", 1)) == ["tokens.md"]


def test_changing_many_files_removes_their_old_vectors_in_one_pass(
    tmp_path: Path, cfg: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each changed file's old vectors were removed from the published FAISS index one file at
    a time, each removal a pass over the whole index: changing every file of 6,000 (30,000
    chunks) took three times as long as building the index from nothing, and the cost grew
    with the square of the knowledge base. The old vectors now go in one pass."""
    import crag.index.vectors_write as vectors_write

    kb = tmp_path / "kb"
    for i in range(40):
        write(kb / f"note{i}.md", f"# Note {i}\n\nThe walrus count of site {i} is {i * 7}.\n")
    index_roots(cfg, [kb])
    passes: list[int] = []
    real_remove = vectors_write.Base.remove

    def remove(self, ids):
        passes.append(len(ids))
        return real_remove(self, ids)

    monkeypatch.setattr(vectors_write.Base, "remove", remove)
    for i in range(0, 40, 2):
        write(kb / f"note{i}.md", f"# Note {i}\n\nThe narwhal count of site {i} is {i * 9}.\n")
    (kb / "note1.md").unlink()
    report = index_roots(cfg, [kb])
    assert len(report.changed) == 20 and len(report.removed) == 1
    assert passes == [21]
    with open_index(cfg) as reader:
        assert reader.n_chunks == 39
        assert paths_of(reader.search("narwhal count site 4", 1)) == ["note4.md"]
        assert "walrus count of site 4 " not in " ".join(h.text for h in reader.search("walrus count site 4", 39))
        assert paths_of(reader.search("walrus count site 3", 1)) == ["note3.md"]


def test_files_outside_the_roots_being_indexed_stay(tmp_path: Path, cfg: Settings) -> None:
    a = make_kb(tmp_path / "a")
    b = write(tmp_path / "b" / "other.md", "# Other\n\nAn unrelated note about gardening tomatoes.\n").parent
    emb = CountingEmbedder()
    index_roots(cfg, [a, b], embedder=emb)
    (b / "other.md").unlink()
    report = index_roots(cfg, [a], embedder=emb)
    assert report.removed == () and not report.wrote
    with open_index(cfg, emb) as reader:
        assert set(reader.roots) == {str(a), str(b)}
        assert paths_of(reader.search("gardening tomatoes", 1)) == ["other.md"]
        only_a = reader.search("gardening tomatoes", 5, roots=[str(a)])
        assert only_a and all(h.path.startswith(str(a) + os.sep) for h in only_a)


def test_ensure_indexed_is_cheap_when_nothing_changed_and_indexes_new_roots(kb: Path, cfg: Settings, tmp_path: Path) -> None:
    emb = CountingEmbedder()
    first = ensure_indexed(cfg, [kb], embedder=emb)
    assert len(first.added) == 3
    emb.take()
    with IndexLock(os.path.abspath(cfg.index_dir)):  # up to date: no lock needed, no reads
        again = ensure_indexed(cfg, [kb], embedder=emb, lock_timeout=0.1)
    assert not again.wrote and again.unchanged == 3 and emb.take() == []
    other = write(tmp_path / "more" / "x.md", "# X\n\nextra\n").parent
    grown = ensure_indexed(cfg, [other], embedder=emb)
    assert len(grown.added) == 1


# -- embedder records and damage ---------------------------------------------------------


def test_another_embedder_is_a_clear_error_for_search_and_a_full_re_embed_for_index(kb: Path, cfg: Settings) -> None:
    index_roots(cfg, [kb], embedder=HashEmbedder(2048))
    with pytest.raises(EmbedderMismatchError) as err:
        open_index(cfg)
    assert str(err.value) == (
        f"index was built with hash:v1:2048, configured embedder is {make_embedder(cfg).name}: "
        f"run `python -m crag index {kb}` to re-index"
    )
    with pytest.raises(EmbedderMismatchError):
        ensure_indexed(cfg, [kb])
    emb = CountingEmbedder()
    report = index_roots(cfg, [kb], embedder=emb)
    assert report.reembedded_all and "hash:v1:2048" in report.reason
    assert len(emb.take()) == 3 and len(report.changed) == 3
    with open_index(cfg, emb) as reader:
        assert reader.dim == 1024 and paths_of(reader.search("docker compose", 1)) == ["deploy.md"]


def current_gen(cfg: Settings) -> Path:
    d = Path(cfg.index_dir)
    return d / (d / "CURRENT").read_text().strip()


def test_missing_index(cfg: Settings) -> None:
    with pytest.raises(IndexStoreError, match=r"no index in .*: run `python -m crag index PATH` first"):
        open_index(cfg)


@pytest.mark.parametrize("damage", ["garbage", "truncate"])
def test_a_damaged_vector_file_is_reported_and_re_indexing_repairs_it(kb: Path, cfg: Settings, damage: str) -> None:
    index_roots(cfg, [kb])
    vectors = current_gen(cfg) / "vectors.faiss"
    data = vectors.read_bytes()
    vectors.unlink()  # the file may be a hard link shared with an older generation
    vectors.write_bytes(b"not a faiss index" * 10 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(IndexStoreError, match=r"damaged.*python -m crag index PATH"):
        open_index(cfg)
    report = index_roots(cfg, [kb])
    assert report.reembedded_all and "could not be read" in report.reason
    with open_index(cfg) as reader:
        assert paths_of(reader.search("tokens expire", 1)) == ["auth.md"]


def test_why_a_damaged_index_is_rebuilt_is_said_whole(kb: Path, tmp_path: Path) -> None:
    """The reason was cut at its first colon: an index in ``/srv/kb:2024/index`` was "the
    index in /srv/kb", and SQLite's "no such table: meta" lost its table and the brackets."""
    cfg = Settings(index_dir=str(tmp_path / "kb:2024" / "index"))
    index_roots(cfg, [kb])
    db = current_gen(cfg) / "chunks.sqlite"
    db.unlink()
    db.write_bytes(b"")
    report = index_roots(cfg, [kb])
    assert report.reembedded_all and report.reason == (
        f"the previous index could not be read (the index database in {db.parent} is damaged "
        "(no such table: meta))"
    )


def test_why_an_unreadable_index_is_rebuilt_keeps_no_advice(kb: Path, cfg: Settings) -> None:
    """The advice that follows a reason (": check --index or KB_AGENT_INDEX_DIR") was kept
    inside the brackets of "the previous index could not be read (...)"."""
    index_roots(cfg, [kb])
    current = Path(cfg.index_dir) / "CURRENT"
    current.unlink()
    current.symlink_to("CURRENT")  # a loop: it cannot be read, even by root
    report = index_roots(cfg, [kb])
    assert report.reembedded_all and report.reason == (
        f"the previous index could not be read (cannot read {current} (Too many levels of symbolic links))"
    )
    with open_index(cfg) as reader:
        assert paths_of(reader.search("tokens expire", 1)) == ["auth.md"]


def test_a_damaged_database_is_reported(kb: Path, cfg: Settings) -> None:
    index_roots(cfg, [kb])
    db = current_gen(cfg) / "chunks.sqlite"
    db.write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(IndexStoreError, match="damaged"):
        open_index(cfg)
    with pytest.raises(IndexStoreError, match="damaged"):
        ensure_indexed(cfg, [kb])


# -- the lock ----------------------------------------------------------------------------


def test_a_second_indexer_fails_clearly_when_the_first_holds_the_lock(kb: Path, cfg: Settings) -> None:
    index_roots(cfg, [kb])
    write(kb / "new.md", "# New\n\nfresh\n")
    with IndexLock(os.path.abspath(cfg.index_dir)):
        started = time.monotonic()
        with pytest.raises(IndexStoreError, match=r"another crag index is running on .*index"):
            index_roots(cfg, [kb], lock_timeout=0.3)
        assert time.monotonic() - started >= 0.3
    with open_index(cfg) as reader:  # untouched
        assert reader.n_chunks == 3


def test_a_second_indexer_waits_for_the_first(kb: Path, cfg: Settings) -> None:
    index_roots(cfg, [kb])
    write(kb / "new.md", "# New\n\nfresh paint on the fence\n")
    lock = IndexLock(os.path.abspath(cfg.index_dir))
    lock.__enter__()
    threading.Timer(0.3, lock.__exit__, args=(None, None, None)).start()
    report = index_roots(cfg, [kb], lock_timeout=10)
    assert [os.path.basename(p) for p in report.added] == ["new.md"]


INDEXER = """
import sys
from crag.config import Settings
from crag.index import index_roots
report = index_roots(Settings(index_dir=sys.argv[1]), [sys.argv[2]], lock_timeout=60)
print(len(report.added) + len(report.changed))
"""


def test_two_indexer_processes_at_once_never_corrupt_the_index(tmp_path: Path, cfg: Settings) -> None:
    a = tmp_path / "a"
    b = tmp_path / "b"
    for i in range(60):
        write(a / f"a{i}.md", f"# Alpha {i}\n\nalpha content number {i}\n")
        write(b / f"b{i}.md", f"# Beta {i}\n\nbeta content number {i}\n")
    procs = [
        subprocess.Popen([sys.executable, "-c", INDEXER, cfg.index_dir, str(root)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for root in (a, b)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(int(o[0].strip()) for o in outs) == [60, 60]
    with open_index(cfg) as reader:
        assert reader.n_chunks == 120 and set(reader.roots) == {str(a), str(b)}
        assert paths_of(reader.search("beta content number 7", 1)) == ["b7.md"]
    assert sorted(p.name for p in Path(cfg.index_dir).iterdir() if p.name.startswith("gen-")) == [current_gen(cfg).name]


# -- search ------------------------------------------------------------------------------


def test_scores_are_cosines_in_unit_interval_and_order_is_best_first(kb: Path, cfg: Settings) -> None:
    index_roots(cfg, [kb])
    with open_index(cfg) as reader:
        hits = reader.search("How many times does the client retry a failed upload?", 3)
        assert paths_of(hits)[0] == "retries.md"
        assert all(0.0 <= h.score <= 1.0 for h in hits)
        assert hits[0].score > 0.3
        assert [h.fused for h in hits] == sorted((h.fused for h in hits), reverse=True)
        qv = reader.embed_query("docker compose")
        assert abs(float(np.linalg.norm(qv)) - 1.0) < 1e-5
        assert reader.search("   ", 3) == [] and reader.search("x", 0) == []


@pytest.fixture(scope="module")
def small_reader(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("fts")
    settings_ = Settings(index_dir=str(base / "index"))
    index_roots(settings_, [make_kb(base / "kb")])
    reader = open_index(settings_)
    yield reader
    reader.close()


@settings(max_examples=200, deadline=None)
@given(query=st.text(max_size=120))
def test_any_user_text_is_a_safe_fts_query(small_reader, query: str) -> None:
    expr = fts_query(query)
    if expr is not None:
        for term in expr.split(" OR "):
            assert term.startswith('"') and term.endswith('"') and '"' not in term[1:-1]
    small_reader.lexical_ranking(query, 5)
    small_reader.file_ranking(query, 5)
    small_reader.search(query, 3)


def test_fts_operators_in_queries_are_plain_words(small_reader) -> None:
    for q in ['docker AND NOT compose', 'title:deploy', '"unbalanced', 'NEAR(a b)', "* ^ - + ( )", "port 8080*"]:
        small_reader.lexical_ranking(q, 3)
    assert fts_query("AND OR NOT") is None  # stop words: nothing left to match
    assert fts_query('title:deploy "x" NEAR(port*)') == '"title" OR "deploy" OR "x" OR "near" OR "port"'


# -- the hash embedder -------------------------------------------------------------------


def test_hash_embedder_is_deterministic_across_processes_and_unit_length() -> None:
    texts = ["Rotate the API tokens every ninety days.", "Deploying with docker compose", ""]
    here = HashEmbedder().embed(texts)
    code = (
        "import json, sys; from crag.index.embedders import HashEmbedder; "
        "print(json.dumps(HashEmbedder().embed(json.loads(sys.argv[1])).tolist()))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(texts)], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    there = np.asarray(json.loads(out.stdout), dtype=np.float32)
    assert np.array_equal(here, there)
    assert here.dtype == np.float32 and here.shape == (3, HashEmbedder().dim)
    assert np.allclose(np.linalg.norm(here[:2], axis=1), 1.0, atol=1e-5)
    assert not here[2].any()  # nothing to hash: the zero vector (cosine 0 with everything)


def test_hash_embedder_similarity_follows_shared_words() -> None:
    emb = HashEmbedder()
    a, b, c = emb.embed(["tokens expire and must be rotated", "rotating expired tokens", "docker compose port mapping"])
    assert float(a @ b) > 0.3 > float(a @ c)
    for dim in (8, 1 << 25):
        with pytest.raises(ValueError):
            HashEmbedder(dim)


def test_an_index_in_another_format_is_refused_then_rebuilt(kb: Path, cfg: Settings) -> None:
    import sqlite3

    index_roots(cfg, [kb])
    conn = sqlite3.connect(current_gen(cfg) / "chunks.sqlite")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    with pytest.raises(IndexStoreError, match=r"has format 1, this crag reads format 2: run `python -m crag index PATH`"):
        open_index(cfg)
    report = index_roots(cfg, [kb])
    assert report.reembedded_all and len(report.added) == 3
    with open_index(cfg) as reader:
        assert reader.n_chunks == 3


def test_a_word_without_its_accents_finds_it_as_full_text_search_does(kb: Path, cfg: Settings) -> None:
    """FTS5 folds ``crème`` to ``creme``; the hash embedder's filter of hits sharing no word
    with the query (``search.sharing_a_word``) dropped what it had found."""
    write(kb / "dessert.md", "# Dessert\n\nThe kitchen serves crème brûlée in Zürich.\n")
    index_roots(cfg, [kb])
    with open_index(cfg) as reader:
        for query in ("creme brulee", "zurich", "Crème", "ZÜRICH"):
            for mode in ("lexical", "hybrid"):
                assert paths_of(reader.search(query, 1, mode=mode)) == ["dessert.md"], (query, mode)
        assert "crème brûlée in Zürich" in reader.search("creme", 1)[0].text  # as written


def test_a_query_of_one_character_words_finds_the_text_that_holds_it(kb: Path, cfg: Settings) -> None:
    """``1.2.3`` is three one-character words, none of them a keyword: the hash embedder's
    filter of hits sharing no keyword with the query dropped the release note that full-text
    search had found, and the search printed nothing."""
    write(kb / "release.md", "# Releases\n\nRelease v1.2.3 fixed the login bug.\n")
    write(kb / "steps.md", "# Steps\n\nStep 2 of 3 comes after step 1.\n")
    index_roots(cfg, [kb])
    with open_index(cfg) as reader:
        for query in ("1.2.3", "“1.2.3”?"):
            for mode in ("lexical", "hybrid"):
                assert paths_of(reader.search(query, 2, mode=mode)) == ["release.md"], (query, mode)
        assert reader.search("the and of", 2) == []  # stop words only: no word to share


def test_a_query_of_stop_words_and_filler_shares_no_word_with_any_text(kb: Path, cfg: Settings) -> None:
    """"what do I need" has no keyword and one word that is no stop word ("need", question
    filler): its stop words were matched as written anywhere ("i" in "is", "one" in
    "exponential"), so every text was a hit and the offline answer quoted them as answers. A
    one-letter word is matched as a word: "C" is in "C and Rust", not in "colors"."""
    write(kb / "retries.md", "# Retries\n\nUploads are retried three times with exponential backoff.\n")
    write(kb / "colors.md", "# Colors\n\nThe sky is blue.\n")
    write(kb / "langs.md", "# Languages\n\nThe agent is written in C and Rust.\n")
    index_roots(cfg, [kb])
    with open_index(cfg) as reader:
        for query in ("what do I need", "how does it work", "which one", "tell me more", "is there one"):
            for mode in ("vector", "hybrid"):
                assert reader.search(query, 3, mode=mode) == [], (query, mode)
        assert paths_of(reader.search("C", 3)) == ["langs.md"]


def test_a_word_ending_in_ies_finds_the_same_word_ending_in_ied(tmp_path: Path, cfg: Settings) -> None:
    """"retries" was stemmed "retry" and "retried" "retri": the hash embedder's filter of hits
    sharing no word with the query dropped the only text that answers "How many retries?",
    which full-text search had found."""
    kb = tmp_path / "net"
    write(kb / "net.md", "Failed requests are retried three times.\n")
    write(kb / "colors.md", "# Colors\n\nThe sky is blue.\n")
    index_roots(cfg, [kb])
    with open_index(cfg) as reader:
        for query in ("How many retries?", "retries", "copies retried"):
            for mode in ("lexical", "hybrid"):
                assert paths_of(reader.search(query, 2, mode=mode)) == ["net.md"], (query, mode)
