"""The distribution has a name of its own on the package index (``crag`` there is another
project): ``crag-kb``. The import name and the command stay ``crag``, and every message and
document that tells a user to install an extra names ``crag-kb``."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def test_the_distribution_is_crag_kb_and_the_command_and_package_stay_crag() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "crag-kb"
    assert project["scripts"] == {"crag": "crag.cli:main"}
    extras = project["optional-dependencies"]
    assert {"mcp", "postgres", "local", "pdf", "docx", "color"} <= set(extras)
    self_refs = [d for d in extras["dev"] if d.startswith("crag")]
    assert self_refs and all(d.startswith("crag-kb[") for d in self_refs)
    # The tests of every optional feature run in CI: the dev extra pulls each extra in.
    assert {"mcp", "postgres", "pdf", "docx", "color"} <= set(self_refs[0][len("crag-kb["):-1].split(","))


def test_every_install_line_names_the_distribution() -> None:
    wrong = re.compile(r"\bcrag\[")
    files = [ROOT / "README.md", ROOT / ".env.example", *(ROOT / "docs").glob("*.md"), *(ROOT / "crag").rglob("*.py")]
    found = [f"{p.relative_to(ROOT)}:{n}" for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if wrong.search(line)]
    assert found == [], found


def test_the_missing_extra_messages_name_crag_kb(monkeypatch) -> None:
    import importlib.util

    from crag.index.readers import skipped_line
    from crag.mcp_server import missing_extra

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert missing_extra().endswith("pip install 'crag-kb[mcp]' (make install includes it)")
    assert skipped_line([".pdf", ".docx"]).endswith("(to include them: pip install 'crag-kb[docx,pdf]')")


def test_the_package_ships_its_type_hints_as_pep_561_says() -> None:
    """crag is an embedded library with type hints on its whole public API, but shipped no
    ``py.typed``: a type checker in a program importing crag treated every name as ``Any``."""
    assert (ROOT / "crag" / "py.typed").is_file()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["crag"]


def _sdist_files(monkeypatch) -> set[str]:
    """The files ``MANIFEST.in`` adds to the source distribution, as setuptools reads it."""
    from setuptools.command.egg_info import FileList

    monkeypatch.chdir(ROOT)
    files = FileList()
    for line in (ROOT / "MANIFEST.in").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            files.process_template_line(line)
    return set(files.files)


def test_the_source_distribution_holds_what_make_test_needs(monkeypatch) -> None:
    """The sdist held 86 of the 94 files of tests/ (setuptools' default takes ``test_*.py`` only)
    and no benchmarks: `pytest` in an unpacked sdist failed to collect 62 test files (no
    conftest.py, no fakes, no benchmarks package). It holds the whole test suite, the benchmarks'
    code, question sets and the results the docs cite (a test checks every file the docs name),
    the docs, ``.env.example`` and the Makefile."""
    shipped = _sdist_files(monkeypatch)
    needed = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("*.py")}
    needed |= {str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.*")
               if "__pycache__" not in p.parts and p.suffix != ".tmp"}
    needed |= {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    needed |= {".env.example", "Makefile", ".ci/run"}
    assert needed - shipped == set()
    assert not any("__pycache__" in f or f.endswith((".pyc", ".tmp")) for f in shipped)


def test_the_pdf_extra_asks_for_a_pypdf_that_imports_quietly() -> None:
    """pypdf 4.0 to 4.3.0 import ARC4 where cryptography 43 and later warn that it moved: with
    the ``mcp`` extra beside ``pdf`` (it brings cryptography), every `crag index` of a folder with a
    PDF printed two lines of a third party's deprecation warning. 4.3.1 imports it quietly."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pdf,) = extras["pdf"]
    floor = re.fullmatch(r"pypdf>=([\d.]+)", pdf)
    assert floor is not None and tuple(int(p) for p in floor.group(1).split(".")) >= (4, 3, 1)


def test_the_tiktoken_floor_counts_a_long_run_of_blanks_in_linear_time() -> None:
    """crag counts a text holding a run of blanks in pieces of 65,536 (crag.llm.tokens), which
    tiktoken 0.13 and later encode in linear time; before 0.13, which the floor allowed (0.7),
    each piece took about a second and a file padded with a million blanks held `crag index`
    for minutes (its test ran past ten). The floor is the first version measured linear."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (tiktoken,) = [d for d in deps if d.startswith("tiktoken")]
    floor = re.fullmatch(r"tiktoken>=([\d.]+)", tiktoken)
    assert floor is not None and tuple(int(p) for p in floor.group(1).split(".")) >= (0, 13)


def test_the_openai_floor_is_an_sdk_crag_runs_on() -> None:
    """``openai>=1.40`` let pip keep an SDK crag cannot run on: before 1.45 ``create()`` has no
    ``max_completion_tokens`` (a reasoning model's answer was a TypeError traceback), and before
    1.55.3 the SDK hands httpx 0.28, which pip installs beside it, a ``proxies`` argument it no
    longer takes. 1.55.3 is the first release crag's wire tests pass on."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (openai,) = [d for d in deps if d.startswith("openai")]
    floor = re.fullmatch(r"openai>=([\d.]+)", openai)
    assert floor is not None and tuple(int(p) for p in floor.group(1).split(".")) >= (1, 55, 3)


def test_the_top_level_holds_what_the_design_card_names_and_the_project_files_beside_it() -> None:
    """The design card fixes the repository's top level (pyproject.toml, Makefile, .env.example,
    crag/, tests/, benchmarks/); beside them stand the docs, the README, the licence, the sdist's
    manifest and the CI entry point. A scratch script committed there (``errs.sh``) reached
    every clone."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout
    top = {line.split("/", 1)[0] for line in listed.splitlines() if line}
    assert top <= {"pyproject.toml", "Makefile", ".env.example", "crag", "tests", "benchmarks", "docs", "README.md",
                   "LICENSE", "MANIFEST.in", ".ci", ".gitignore"}, sorted(top)


def test_the_faiss_floor_declares_what_faiss_imports() -> None:
    """faiss-cpu 1.8.0, which ``faiss-cpu>=1.8`` let pip keep, imports ``packaging`` without
    declaring it: in an environment without packaging, the first `crag index` was a traceback
    (ModuleNotFoundError). 1.8.0.post1 declares it."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (faiss,) = [d for d in deps if d.startswith("faiss-cpu")]
    floor = re.fullmatch(r"faiss-cpu>=([\w.]+)", faiss)
    assert floor is not None and Version(floor.group(1)) >= Version("1.8.0.post1")
