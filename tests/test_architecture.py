"""The core is pure: no I/O library in state, graph, grading, prompts, answer, text or nodes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CRAG = Path(__file__).resolve().parents[1] / "crag"
IO_LIBRARIES = {"openai", "faiss", "httpx", "httpx2", "sqlite3", "time", "socket", "urllib", "requests",
                "subprocess", "os", "pathlib", "shutil", "tiktoken", "numpy", "threading", "asyncio"}
CORE = ["state.py", "graph.py", "grading.py", "answer.py", "ports.py", "text.py", *[
    f"{package}/{p.name}" for package in ("nodes", "prompts") for p in sorted((CRAG / package).glob("*.py"))]]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    for block in ast.walk(tree):  # imports only for type checkers do not run
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
            block.body = []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_io_library(module):
    path = CRAG / module
    assert path.exists(), module
    assert not imported_modules(path) & IO_LIBRARIES


def test_importing_crag_loads_no_heavy_library():
    import subprocess
    import sys

    code = "import sys, crag, crag.cli; print(sorted(m for m in ('openai','faiss','numpy','tiktoken') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
