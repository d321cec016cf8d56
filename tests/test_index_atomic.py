"""Atomic generations: an indexer killed at any moment leaves the previous index usable."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crag.config import Settings
from crag.index import index_roots, open_index

ROOT = Path(__file__).resolve().parents[1]
N_FILES = 150

# Runs one index update; announces "HALF" after half the files and, in "publish" mode,
# "PUBLISH" right before the new generation is published (then dawdles so it can be killed).
INDEXER = r"""
import sys, time
import crag.index.layout as layout
from crag.config import Settings
from crag.index import index_roots

mode, index_dir, root = sys.argv[1:4]

def progress(done, total, path):
    if mode == "half" and done == total // 2:
        print("HALF", flush=True)
        time.sleep(30)

if mode == "publish":
    real_publish = layout.publish
    def slow_publish(index_dir, gen):
        print("PUBLISH", flush=True)
        print(gen, flush=True)
        time.sleep(30)
        real_publish(index_dir, gen)
    layout.publish = slow_publish

print("START", flush=True)
index_roots(Settings(index_dir=index_dir), [root], progress=progress)
print("DONE", flush=True)
"""


def fill(root: Path, marker: str) -> None:
    for i in range(N_FILES):
        path = root / f"doc{i:03d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Document {i}\n\nThis page is {marker} edition {i}.\n\n" + f"filler {marker} text. " * 40 + "\n")
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000 * (marker == "newer")))


def state_of(cfg: Settings) -> str:
    """'older' or 'newer' when the whole index agrees on one edition; fails otherwise."""
    with open_index(cfg) as reader:
        assert reader.n_chunks >= N_FILES
        editions = set()
        for i in (0, 37, N_FILES - 1):
            hits = reader.search(f"Document {i} edition {i}", 3)
            assert hits, "the index answers no search"
            editions |= {"older" if "older edition" in h.text else "newer" for h in hits if f"Document {i}" in h.text}
        rows = reader._query("SELECT text FROM chunks")
        all_editions = {("older" if "older" in t else "newer") for (t,) in rows}
        assert len(all_editions) == 1, "old and new content are mixed in one generation"
        assert editions <= all_editions
        return all_editions.pop()


def start(mode: str, cfg: Settings, root: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", INDEXER, mode, cfg.index_dir, str(root)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for(proc: subprocess.Popen, word: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"indexer ended before {word}: {proc.stderr.read()}")
        if line.strip() == word:
            return
    raise AssertionError(f"indexer never said {word}")


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    proc.stderr.close()


@pytest.fixture
def setup(tmp_path: Path):
    root = tmp_path / "kb"
    cfg = Settings(index_dir=str(tmp_path / "index"))
    fill(root, "older")
    index_roots(cfg, [root])
    assert state_of(cfg) == "older"
    fill(root, "newer")
    return cfg, root


@pytest.mark.parametrize("moment", ["half", "publish"])
def test_killed_mid_index_the_old_index_still_answers_with_the_old_content(setup, moment: str) -> None:
    cfg, root = setup
    proc = start(moment, cfg, root)
    wait_for(proc, "HALF" if moment == "half" else "PUBLISH")
    pending = proc.stdout.readline().strip() if moment == "publish" else None
    kill(proc)
    assert state_of(cfg) == "older"
    if pending:
        # What was about to be published was already complete and consistent on disk.
        copy = Path(cfg.index_dir + "-copy")
        shutil.copytree(cfg.index_dir, copy)
        (copy / "CURRENT").write_text(pending + "\n")
        assert state_of(Settings(index_dir=str(copy))) == "newer"
    gens = sorted(p.name for p in Path(cfg.index_dir).iterdir() if p.name.startswith("gen-"))
    assert len(gens) == 2, "the unfinished generation is left behind as garbage"
    report = index_roots(cfg, [root])  # the next indexer takes over and tidies up
    assert len(report.changed) == N_FILES
    assert state_of(cfg) == "newer"
    assert len([p for p in Path(cfg.index_dir).iterdir() if p.name.startswith("gen-")]) == 1


def test_killed_at_random_moments_the_index_is_always_whole(setup) -> None:
    cfg, root = setup
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    seen = set()
    for _ in range(4):
        proc = start("random", cfg, root)
        wait_for(proc, "START")
        time.sleep(rng.uniform(0.0, 0.6))
        kill(proc)
        seen.add(state_of(cfg))
        if "newer" in seen:
            fill(root, "older" if rng.random() < 0.5 else "newer")
    assert seen <= {"older", "newer"}


def test_readers_never_fail_while_index_runs_publish_and_remove_generations(tmp_path: Path) -> None:
    # A search opened gen-000004, the indexer published gen-000005 and removed gen-000004, and
    # the search was told "cannot read .../gen-000004/vectors.faiss: run crag index to rebuild it".
    from tests.reader_stress import stress

    result = stress(tmp_path, runs=6, files=600)
    assert result.searches >= 20 and result.failures == (), result.failures


def test_a_generation_deleted_after_it_was_opened_is_still_read_whole(tmp_path: Path) -> None:
    from crag.index import layout
    from crag.index.hash_embedder import HashEmbedder

    root = tmp_path / "kb"
    fill(root, "older")
    cfg = Settings(index_dir=str(tmp_path / "index"))
    index_roots(cfg, [str(root)])
    gen = layout.open_generation(cfg.index_dir)
    shutil.rmtree(os.path.join(cfg.index_dir, gen.name))  # what an indexer's clean-up does
    layout.integrity.verify(os.path.join(cfg.index_dir, gen.name), gen.conn, gen.meta, cfg.index_dir, "", gen.held)
    from crag.index.store import IndexReader

    with IndexReader(gen, HashEmbedder()) as reader:
        assert reader.search("older edition 7", 3)


def test_an_index_report_names_its_generation_alike_written_or_unchanged(tmp_path, monkeypatch) -> None:
    """The report of an update named the generation it wrote (``gen-000001``); the report of a
    run that found nothing to change named the store's version, which for the embedded store
    also holds its database file's identity (``gen-000001:2327262:17961...``)."""
    from crag.config import Settings
    from crag.index import ensure_indexed

    (tmp_path / "A").mkdir()
    (tmp_path / "A" / "a.md").write_text("# A\n\nThe aurora system handles alerts.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    settings = Settings(index_dir=str(tmp_path / "idx"), llm="offline")
    written = ensure_indexed(settings, ["A"]).generation
    assert written == "gen-000001" and ensure_indexed(settings, ["A"]).generation == written


def test_an_interrupt_stops_the_reading_before_the_next_file_and_lets_the_lock_go(setup, monkeypatch) -> None:
    """Ctrl-C (or SIGTERM, raised as an exception alike) while files are read: the worker
    threads each finish the file they are reading and stop, rather than their whole batch of up
    to 64 files (with PDFs of seconds each, the run went on for minutes); nothing is published
    and the next run takes the lock at once."""
    import threading

    from crag.index import reading

    cfg, root = setup
    real_read = reading.read_bytes
    reads: list[str] = []
    main = threading.main_thread().ident

    def slow_read(path: str) -> bytes:
        reads.append(path)
        if len(reads) == 3:
            signal.pthread_kill(main, signal.SIGINT)
        time.sleep(0.1)  # 64 files a batch: 6.4 s for a batch read to its end
        return real_read(path)

    monkeypatch.setattr(reading, "read_bytes", slow_read)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            index_roots(cfg, [root])
            time.sleep(10)  # the signal is on its way
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 3
    assert len(reads) <= 8, f"{len(reads)} files read after the interrupt"
    assert state_of(cfg) == "older"
    monkeypatch.setattr(reading, "read_bytes", real_read)
    assert len(index_roots(cfg, [root], lock_timeout=0).changed) == N_FILES
    assert state_of(cfg) == "newer"
