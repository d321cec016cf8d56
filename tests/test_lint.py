"""``make lint`` is part of the suite: ruff (from the dev extra) finds nothing in crag, tests, benchmarks."""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(find_spec("ruff") is None, reason="ruff comes with the dev extra (make install)")
def test_ruff_finds_nothing() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "crag", "tests", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"ruff findings (run `make lint`, or `.venv/bin/ruff check --fix`):\n{run.stdout}{run.stderr}"
