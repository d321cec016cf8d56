"""Readers against repeated index runs: no search may fail because an indexer finished.

An indexer process runs ``crag index`` ``runs`` times over a folder, editing one file before
each run (so every run publishes a new generation and removes the previous one), while
``readers`` threads of this process search the index through ``crag search``'s own code
(``crag.cli.index_text.search``, which opens the generation ``CURRENT`` names, verifies it
and reads its vectors) until the indexer is done. Every failure is kept with its message.

By hand (the figures in issue 26's note): ``python -m tests.reader_stress --runs 20 --files 1500``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from attrs import frozen

ROOT = Path(__file__).resolve().parents[1]

INDEXER = r"""
import sys
from pathlib import Path
from crag.config import Settings
from crag.index import index_roots

index_dir, root, runs = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
for run in range(runs):
    page = root / f"doc{run % 7:04d}.md"
    page.write_text(page.read_text() + f"\nEdited in run {run}: the backup window moves.\n")
    index_roots(Settings(index_dir=index_dir), [str(root)])
    print(run, flush=True)
"""


@frozen
class StressResult:
    runs: int
    searches: int
    failures: tuple[str, ...]
    seconds: float


def fill(root: Path, files: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"doc{i:04d}.md").write_text(
            f"# Page {i}\n\nThe backup window of service {i} opens at {i % 24:02d}:00 UTC.\n"
            + f"Service {i} keeps its logs for {i % 90} days. " * 5 + "\n",
            encoding="utf-8",
        )


def stress(work: Path, runs: int, files: int, readers: int = 2) -> StressResult:
    """Index ``files`` pages once, then ``runs`` index runs against ``readers`` searching threads."""
    from crag.cli.index_text import search
    from crag.config import Settings
    from crag.errors import CragError
    from crag.index import index_roots

    root, index_dir = work / "kb", str(work / "index")
    fill(root, files)
    settings = Settings(index_dir=index_dir)
    index_roots(settings, [str(root)])
    indexer = subprocess.Popen(
        [sys.executable, "-c", INDEXER, index_dir, str(root), str(runs)],
        cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    failures: list[str] = []
    searches = 0
    lock = threading.Lock()

    def read(n: int) -> None:
        nonlocal searches
        while indexer.poll() is None:
            try:
                hits, _ = search(settings, f"backup window of service {n}", 5, [])
                assert hits, "no hits"
            except (CragError, AssertionError) as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
            with lock:
                searches += 1

    started = time.monotonic()
    threads = [threading.Thread(target=read, args=(n,)) for n in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _, err = indexer.communicate()
    if indexer.returncode != 0:
        raise RuntimeError(f"the indexer failed: {err}")
    return StressResult(runs, searches, tuple(failures), time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--files", type=int, default=1500)
    parser.add_argument("--readers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = stress(Path(tmp), args.runs, args.files, args.readers)
    print(f"{result.runs} index runs over {args.files} files, {result.searches} searches by {args.readers} readers "
          f"in {result.seconds:.1f}s: {len(result.failures)} failures")
    for failure in dict.fromkeys(result.failures):
        print("  " + failure)
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
