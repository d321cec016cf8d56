"""The store contract: every store behind the ``Store`` port behaves the same.

Each test runs once per store (the ``store_settings`` fixture): incremental updates, roots,
the embedder record, atomic updates, the writer lock, and search results identical to the
embedded store's (same hits, same order, same scores).
"""

from __future__ import annotations

import functools
import threading
import time
import unicodedata
from pathlib import Path

import pytest

from crag.config import Settings
from crag.errors import EmbedderMismatchError, IndexStoreError, KnowledgeBaseError
from crag.index import drop_roots, ensure_indexed, index_roots, open_index, open_store
from crag.index.embedders import HashEmbedder
from crag.ports import Retriever, Store

STORES = ["embedded", "postgresql"]


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


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    write(root / "retries.md", "# Retries\n\nThe client retries a failed upload three times with backoff.\n")
    write(root / "deploy.md", "# Deploy\n\nDeploy the service with docker compose on port 8080.\n")
    write(root / "guide" / "auth.md", "# Auth\n\nTokens expire after ninety days and must be rotated.\n")
    write(root / "guide" / "tokens.md", "# Token rotation\n\nRotate tokens with `crag auth rotate`; old tokens stop working.\n")
    return root


@pytest.fixture(params=STORES)
def cfg(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "postgresql":
        return Settings(index_dir=str(tmp_path / "index"), store=request.getfixturevalue("pg_uri"))
    return Settings(index_dir=str(tmp_path / "index"))


def same_hits(got, want, exact: bool) -> bool:
    """The same chunks; ``exact``: also in the same order with the same scores (to float32
    rounding), chunks of equal score in any order."""
    if not exact:
        if want and want[0].lexical_rank is None and want[0].score == 0:
            return len(got) == len(want)  # nothing in scope matches: any chunk is as good
        return {(h.path, h.start_line) for h in got} == {(h.path, h.start_line) for h in want}

    def key(hits):
        return sorted((-round(h.score, 5), h.path, h.start_line, h.end_line) for h in hits)

    return len(got) == len(want) and key(got) == key(want) and all(abs(g.score - w.score) <= 2e-6 for g, w in zip(got, want))


def paths(report_paths) -> list[str]:
    return sorted(Path(p).name for p in report_paths)


def test_it_implements_the_ports(kb: Path, cfg: Settings) -> None:
    store = open_store(cfg)
    assert isinstance(store, Store)
    assert store.state() is None and store.version() is None
    index_roots(cfg, [kb])
    state = store.state()
    assert state is not None and state.version == store.version()
    assert state.embedder == HashEmbedder().name and state.dim == HashEmbedder().dim
    assert sorted(Path(p).name for p in state.files) == ["auth.md", "deploy.md", "retries.md", "tokens.md"]
    with open_index(cfg) as reader:
        assert isinstance(reader, Retriever)
        assert reader.n_chunks == state.chunks == 4


def test_updates_are_incremental(kb: Path, cfg: Settings) -> None:
    emb = CountingEmbedder()
    first = index_roots(cfg, [kb], embedder=emb)
    assert paths(first.added) == ["auth.md", "deploy.md", "retries.md", "tokens.md"]
    assert len(emb.take()) == 4
    again = index_roots(cfg, [kb], embedder=emb)
    assert again.unchanged == 4 and not again.changed_anything and emb.take() == []
    write(kb / "deploy.md", "# Deploy\n\nDeploy the service with helm on port 9090.\n")
    (kb / "retries.md").unlink()
    write(kb / "new.md", "# New\n\nA page about caching layers.\n")
    third = index_roots(cfg, [kb], embedder=emb)
    assert paths(third.changed) == ["deploy.md"] and paths(third.removed) == ["retries.md"]
    assert paths(third.added) == ["new.md"] and third.unchanged == 2
    assert len(emb.take()) == 2  # only the changed and the new file
    with open_index(cfg, emb) as reader:
        texts = " ".join(h.text for h in reader.search("deploy helm docker port retries backoff", 10))
        assert "helm" in texts and "docker" not in texts and "backoff" not in texts
        assert reader.n_chunks == 4
    assert ensure_indexed(cfg, [kb], embedder=emb).wrote is False


def test_a_file_made_unreadable_leaves_the_index_though_its_size_and_mtime_stay(
    kb: Path, cfg: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chmod 000` changes neither size nor mtime: the update took such a file for unchanged
    and kept its chunks (`ask --kb` too), while one edited and then locked left the index."""
    import os
    import stat

    import crag.index.build as build
    import crag.index.reading as reading

    def locked(path: str) -> bool:
        return not os.stat(path).st_mode & stat.S_IRUSR

    # what an unprivileged user meets (root reads a file whatever its mode)
    real_read = reading.read_bytes

    def read_bytes(path, *args, **kwargs):
        if locked(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(build, "can_read", lambda path: os.access(path, os.R_OK) and not locked(path), raising=False)
    monkeypatch.setattr(reading, "read_bytes", read_bytes)
    index_roots(cfg, [kb])
    secret = kb / "deploy.md"
    secret.chmod(0)
    try:
        report = index_roots(cfg, [kb])
        assert paths(report.removed) == ["deploy.md"] and report.unchanged == 3
        assert (str(secret), "cannot read (Permission denied)") in report.warnings
        with open_index(cfg) as reader:
            assert not any(h.path == str(secret) for h in reader.search("deploy docker compose port 8080", 10))
        secret.chmod(0o644)
        assert paths(ensure_indexed(cfg, [kb]).added) == ["deploy.md"]
        secret.chmod(0)
        assert paths(ensure_indexed(cfg, [kb]).removed) == ["deploy.md"]
    finally:
        secret.chmod(0o644)


def test_updating_a_root_keeps_the_files_a_root_inside_it_holds(kb: Path, cfg: Settings) -> None:
    """A root inside another holds files the outer one leaves out (its .gitignore, or a file
    named as a root of its own): `index kb` removed them as if deleted, `index kb/guide` put
    them back, and `ask --kb kb` removed them again."""
    write(kb / ".gitignore", "guide/\nretries.md\n")
    index_roots(cfg, [kb, kb / "guide", kb / "retries.md"])
    held = ["auth.md", "deploy.md", "retries.md", "tokens.md"]
    assert sorted(Path(p).name for p in open_store(cfg).state().files) == held
    report = index_roots(cfg, [kb])
    assert report.removed == () and report.unchanged == 4
    assert ensure_indexed(cfg, [kb]).wrote is False
    assert sorted(Path(p).name for p in open_store(cfg).state().files) == held
    (kb / "guide" / "auth.md").unlink()  # a file deleted under the inner root still leaves
    assert paths(index_roots(cfg, [kb]).removed) == ["auth.md"]
    assert sorted(Path(p).name for p in open_store(cfg).state().files) == ["deploy.md", "retries.md", "tokens.md"]


def test_removing_an_inner_root_takes_out_the_files_the_outer_one_leaves_out(kb: Path, cfg: Settings) -> None:
    """`roots --remove kb/guide` kept guide's files because they lie under kb, though kb's
    .gitignore leaves them out: search still found them ("0 files left the index") until
    the next `index kb` removed them."""
    write(kb / ".gitignore", "guide/auth.md\nretries.md\n")
    index_roots(cfg, [kb, kb / "guide", kb / "retries.md"])
    report = drop_roots(cfg, [kb / "guide", kb / "retries.md"])
    assert paths(report.removed) == ["auth.md", "retries.md"]
    assert sorted(Path(p).name for p in open_store(cfg).state().files) == ["deploy.md", "tokens.md"]
    assert index_roots(cfg, [kb]).changed_anything is False  # nothing left for the next update to find


def test_roots_are_listed_and_removed(kb: Path, tmp_path: Path, cfg: Settings) -> None:
    other = tmp_path / "other"
    write(other / "faq.md", "# FAQ\n\nThe office is closed on Mondays.\n")
    index_roots(cfg, [kb / "guide"])
    index_roots(cfg, [kb, other])
    store = open_store(cfg)
    assert store.roots() == tuple(sorted([str(kb), str(kb / "guide"), str(other)]))
    report = drop_roots(cfg, [kb])
    assert report.removed == tuple(sorted([str(kb / "deploy.md"), str(kb / "retries.md")]))  # guide/ stays
    assert store.roots() == tuple(sorted([str(kb / "guide"), str(other)]))
    with open_index(cfg) as reader:
        assert {Path(h.path).name for h in reader.search("deploy tokens office", 10)} == {"auth.md", "tokens.md", "faq.md"}
    with pytest.raises(KnowledgeBaseError, match="is not a root"):
        drop_roots(cfg, [kb])


def test_the_embedder_is_recorded_and_checked(kb: Path, cfg: Settings) -> None:
    index_roots(cfg, [kb])
    other = HashEmbedder(2048)
    with pytest.raises(EmbedderMismatchError, match="re-index"):
        open_index(cfg, other)
    with pytest.raises(EmbedderMismatchError):
        ensure_indexed(cfg, [kb], embedder=other)
    report = index_roots(cfg, [kb], embedder=other)
    assert report.reembedded_all and "built with hash:v1:1008" in report.reason
    state = open_store(cfg).state(files=False)
    assert state is not None and (state.embedder, state.dim) == (other.name, 2048)
    with open_index(cfg, other) as reader:
        assert reader.search("expire after ninety days", 1)[0].path.endswith("auth.md")


def test_an_embedder_whose_vectors_changed_length_names_the_roots_to_re_index(
    kb: Path, cfg: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same embedder name giving vectors of another length (another model pulled under
    that tag) is another embedder: the search error named `index PATH` where the error for an
    embedder of another name names the index's roots."""

    class Resized:
        name = HashEmbedder().name
        dim = 512

        def embed(self, texts):
            return HashEmbedder(512).embed(texts)

    monkeypatch.chdir(kb.parent)
    index_roots(cfg, [kb])
    with open_index(cfg, Resized()) as reader, pytest.raises(EmbedderMismatchError) as err:
        reader.search("tokens expire", 3)
    assert str(err.value) == (
        f"the embedder {HashEmbedder().name} returned 512-dimensional vectors, the index holds "
        f"{HashEmbedder().dim}: run `python -m crag index kb` to re-index"
    )


def test_a_failed_update_leaves_the_previous_state(kb: Path, cfg: Settings) -> None:
    index_roots(cfg, [kb])
    before = open_store(cfg).state()
    write(kb / "deploy.md", "# Deploy\n\nDeploy with kubernetes.\n")
    write(kb / "late.md", "# Late\n\nA page that never arrives.\n")

    def boom(done: int, total: int, path: str) -> None:
        if done == total:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        index_roots(cfg, [kb], progress=boom)
    store = open_store(cfg)
    assert store.state() == before
    with open_index(cfg) as reader:
        assert "docker" in reader.search("deploy", 1)[0].text
    assert paths(index_roots(cfg, [kb]).added) == ["late.md"]


def test_a_second_indexer_waits_for_the_lock_then_fails_clearly(kb: Path, cfg: Settings) -> None:
    index_roots(cfg, [kb])
    store = open_store(cfg)
    write(kb / "more.md", "# More\n\nAnother page.\n")
    waits: list[str] = []
    with store.writer_lock(5), pytest.raises(IndexStoreError, match="another crag index is running"):
        index_roots(cfg, [kb], lock_timeout=0.3, waiting=lambda: waits.append("told"))
    assert waits == ["told"]  # once, however long it polls
    results: list[object] = []
    lock = store.writer_lock(5)
    lock.__enter__()
    worker = threading.Thread(target=lambda: results.append(
        index_roots(cfg, [kb], lock_timeout=30, waiting=lambda: waits.append("again"))))
    worker.start()
    time.sleep(0.5)
    assert not results and waits == ["told", "again"]  # still waiting, and said so
    lock.__exit__(None, None, None)
    worker.join(30)
    assert paths(results[0].added) == ["more.md"]


def test_search_matches_the_embedded_store(kb: Path, tmp_path: Path, cfg: Settings) -> None:
    """Vector search gives the same hits and scores; full-text ranking finds the same chunks.

    The embedded store ranks text with SQLite's BM25 and PostgreSQL with its own ranking,
    so only the vector ranking is compared position by position; the rest is compared as
    sets of the top hits and, on the shared corpora, by benchmarks/retrieval.py.
    """
    reference = Settings(index_dir=str(tmp_path / "reference"))
    index_roots(reference, [kb])
    index_roots(cfg, [kb])
    embedded = not cfg.store
    queries = ["how many times does the client retry", "rotate tokens", "docker port", "ninety days", "the", "zzz qqq"]
    with open_index(reference) as want, open_index(cfg) as got:
        for query in queries:
            for mode in ("vector", "hybrid", "lexical"):
                for roots in (None, [str(kb / "guide")]):
                    k = 4 if mode == "vector" else 1
                    expect, found = want.search(query, k, roots, mode), got.search(query, k, roots, mode)
                    assert same_hits(found, expect, exact=embedded or mode == "vector"), (query, mode, roots, found, expect)
        hits = got.search("rotate tokens", 4)
        assert hits and all(0.0 <= h.score <= 1.0 for h in hits)
        assert [h.fused for h in hits] == sorted((h.fused for h in hits), reverse=True)


def test_a_text_file_with_nul_bytes_after_its_first_8_kib_is_indexed_the_same_by_every_store(
    kb: Path, cfg: Settings
) -> None:
    # A log padded with NUL after a crash: PostgreSQL refused it ("text fields cannot contain
    # NUL (0x00) bytes") and the whole index run failed, while the embedded store indexed it.
    head = "".join(f"line {i}: the upload worker restarted cleanly.\n" for i in range(200))
    assert len(head) > 8192
    (kb / "worker.log.txt").write_bytes(head.encode() + b"\x00" * 4096 + b"after the padding: shutdown complete\n")
    (kb / "image.txt").write_bytes(b"GIF89a\x00\x01" + b"pixels " * 100)  # NUL in its first 8 KiB: binary
    report = index_roots(cfg, [kb])
    assert paths(report.added) == ["auth.md", "deploy.md", "retries.md", "tokens.md", "worker.log.txt"]
    with open_index(cfg) as reader:
        hits = reader.search("after the padding shutdown complete", 3)
        assert hits and Path(hits[0].path).name == "worker.log.txt"
        assert "\x00" not in hits[0].text and "after the padding: shutdown complete" in hits[0].text
        assert hits[0].end_line == 201  # line numbers as the file has them
        assert all(Path(h.path).name != "image.txt" for h in reader.search("pixels", 10))


def test_accents_are_folded_alike_by_every_store(kb: Path, tmp_path: Path, cfg: Settings) -> None:
    """``cafe`` finds ``café`` and ``Zürich`` finds ``Zurich`` in both stores: PostgreSQL folds
    the diacritics FTS5 folds (``remove_diacritics 2``), in texts and in queries, and no other
    (``ø`` stays ``ø``); the chunks keep their text as written."""
    write(kb / "cafe.md", "# Café culture\n\nThe CAFÉ on the corner serves crème brûlée.\n")
    write(kb / "zurich.md", "# Offices\n\nThe office in Zurich opens at nine.\n")
    write(kb / "resume.md", "# Hiring\n\nSend your re\u0301sume\u0301 to the hiring team.\n")  # combining accents
    write(kb / "viet.md", "# Việt Nam\n\nThe Hà Nội office answers in Vietnamese.\n")
    write(kb / "lunch.md", "# Lunch\n\nOpen sandwiches: smørrebrød, every Friday.\n")
    reference = Settings(index_dir=str(tmp_path / "reference"))
    index_roots(reference, [kb])
    index_roots(cfg, [kb])
    found = {
        "cafe": "cafe.md", "café": "cafe.md", "Cafe": "cafe.md", "creme brulee": "cafe.md", "CRÈME": "cafe.md",
        "Zürich": "zurich.md", "ZURICH": "zurich.md", "résumé": "resume.md", "resume": "resume.md",
        "viet nam": "viet.md", "ha noi": "viet.md", "hà nội": "viet.md", "Vi\u1ec7t": "viet.md",
        "smørrebrød": "lunch.md",
    }
    with open_index(reference) as want, open_index(cfg) as got:
        for query, name in found.items():
            expect, hits = want.search(query, 2, mode="lexical"), got.search(query, 2, mode="lexical")
            assert [Path(h.path).name for h in hits][:1] == [name], (query, hits)
            assert same_hits(hits, expect, exact=not cfg.store), (query, hits, expect)
        for query in ("smorrebrod", "cafes zurich"):
            expect, hits = want.search(query, 3, mode="lexical"), got.search(query, 3, mode="lexical")
            assert same_hits(hits, expect, exact=not cfg.store), (query, hits, expect)
        assert not [h for h in got.search("smorrebrod", 3, mode="lexical") if h.lexical_rank is not None]
        text = got.search("creme", 1, mode="lexical")[0].text
        assert "The CAFÉ on the corner serves crème brûlée." in text  # as written
        assert "re\u0301sume\u0301" in got.search("resume", 1, mode="hybrid")[0].text


def test_a_query_written_decomposed_finds_the_words_of_every_script_in_every_store(kb: Path, cfg: Settings) -> None:
    """A query in NFD (a file name copied on macOS: ``가`` as two jamo, ``ή`` as ``η`` and an
    accent) found nothing of a document written composed, in Korean, Japanese, Greek or
    Russian: its words were not the document's. Its composed words are searched too, and its
    words as written still find a document written decomposed."""
    nfd = functools.partial(unicodedata.normalize, "NFD")
    write(kb / "ko.md", "# 데이터베이스\n\n서울 사무실은 오전 9시에 문을 엽니다.\n")
    write(kb / "ja.md", "# 設定ガイド\n\n東京オフィスの設定です。\n")
    write(kb / "el.md", "# Γραφείο\n\nΤο γραφείο της Αθήνας ανοίγει στις εννέα.\n")
    write(kb / "ru.md", "# Офис\n\nМосковский офис открывается в девять утра.\n")
    write(kb / "ko_nfd.md", nfd("# 백업\n\n부산 백업 서버는 매일 실행됩니다.\n"))
    index_roots(cfg, [kb])
    found = {"데이터베이스": "ko.md", "設定ガイド": "ja.md", "Αθήνας": "el.md", "Московский": "ru.md", "백업": "ko_nfd.md"}
    with open_index(cfg) as reader:
        for word, name in found.items():
            for mode in ("lexical", "hybrid"):
                hits = reader.search(nfd(word), 2, mode=mode)
                assert nfd(word) != word and [Path(h.path).name for h in hits][:1] == [name], (word, mode, hits)


def test_a_query_written_decomposed_is_embedded_as_the_same_query_composed(kb: Path, cfg: Settings) -> None:
    """A query in NFD found its Korean passage by full text, but its vector was that of other
    words (jamo): every hit scored 0 and the vectors ranked nothing, where the same query
    composed scored and ranked its hits."""
    write(kb / "ko.md", "# 서버 설정\n\n서버 설정은 매일 갱신됩니다.\n")
    write(kb / "ko_notes.md", "# 회의록\n\n오늘 회의에서 점심 메뉴와 휴가 일정을 논의했습니다.\n")
    index_roots(cfg, [kb])
    query = "서버 설정 갱신"
    with open_index(cfg) as reader:
        for mode in ("vector", "hybrid"):
            composed = [(h.path, round(h.score, 6)) for h in reader.search(query, 3, mode=mode)]
            decomposed = [(h.path, round(h.score, 6)) for h in reader.search(unicodedata.normalize("NFD", query), 3, mode=mode)]
            assert decomposed == composed and composed[0][1] > 0, (mode, decomposed, composed)


def test_a_word_of_a_document_is_found_at_the_end_of_a_long_query(kb: Path, cfg: Settings) -> None:
    """A pasted page of text: the one word a document holds counts wherever it stands. The
    full-text ranking used to keep the first 32 words of a query, so a word past them was
    never looked for and a 10,000-word query found nothing."""
    index_roots(cfg, [kb])
    noise = " ".join(f"zq{i}x" for i in range(10_000))  # words no document holds
    with open_index(cfg) as reader:
        for query in (f"{noise} ninety", f"tokens {noise} ninety"):
            for mode in ("lexical", "hybrid"):
                hits = reader.search(query, 2, mode=mode)
                assert hits and Path(hits[0].path).name == "auth.md", (mode, hits)


def test_paths_hosts_and_versions_are_split_into_words_alike_by_every_store(
    kb: Path, tmp_path: Path, cfg: Settings
) -> None:
    """FTS5 splits ``crag/index/store.py`` into its words; PostgreSQL's parser kept it (and
    ``HTTP/3``, ``api.example.com``, ``v1.2.3``, ``ops@example.com``) as one word, so on
    PostgreSQL full-text search found no part of them, and ``store`` did not find the page."""
    write(kb / "notes.md", "# Notes\n\nThe handler in crag/index/store.py speaks HTTP/3 to api.example.com; "
                           "release v1.2.3 pins it. Mail ops@example.com or call 3.14.\n")
    reference = Settings(index_dir=str(tmp_path / "reference"))
    index_roots(reference, [kb])
    index_roots(cfg, [kb])
    with open_index(reference) as want, open_index(cfg) as got:
        for query in ("store", "store.py", "crag/index/store.py", "http", "HTTP/3", "example", "api.example.com",
                      "v1.2.3", "ops", "14", "handler"):
            expect, hits = want.search(query, 2, mode="lexical"), got.search(query, 2, mode="lexical")
            assert [Path(h.path).name for h in hits][:1] == ["notes.md"], (query, hits)
            assert same_hits(hits, expect, exact=not cfg.store), (query, hits, expect)
