"""The documentation names crag's code as it is: a reader who opens `crag/prompts.py` or looks
for a module in docs/architecture.md's layout finds it there.

docs/benchmarks.md is left out of the path check: it records past runs, and names the code
as it was when a figure was measured. It and docs/postgresql.md are left out of the dotted
names too, where `crag.meta`, `crag.chunks` ... are PostgreSQL tables of the schema `crag`.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / ".env.example", *sorted((ROOT / "docs").glob("*.md"))]


def named_paths(text: str) -> list[str]:
    """Paths in backticks, but for patterns a run fills in (`answers-NAME.md`)."""
    found = re.findall(r"`((?:crag|tests|benchmarks)/[A-Za-z0-9_./-]*[A-Za-z0-9_/])`", text)
    return [path for path in found if "NAME" not in path]


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_file_the_docs_name_exists() -> None:
    missing = [f"{doc.name}: {path}" for doc in DOCS if doc.name != "benchmarks.md"
               for path in named_paths(doc.read_text(encoding="utf-8")) if not (ROOT / path).exists()]
    assert missing == []


def test_every_module_and_name_the_docs_spell_with_dots_can_be_imported() -> None:
    wrong = [f"{doc.name}: {name}" for doc in DOCS if doc.name not in {"benchmarks.md", "postgresql.md"}
             for name in sorted(set(re.findall(r"`(crag(?:\.[A-Za-z_]\w*)+)`", doc.read_text(encoding="utf-8"))))
             if not resolves(name)]
    assert wrong == []


def test_the_layout_in_architecture_md_lists_every_module_of_crag_and_no_other() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed = set(re.findall(r"^  ([a-z_]+(?:\.py|/))", block, re.M))
    present = {p.name + ("/" if p.is_dir() else "") for p in (ROOT / "crag").iterdir()
               if (p.suffix == ".py" or (p / "__init__.py").is_file()) and p.name != "__main__.py"}
    assert listed == present


def test_the_readme_names_every_field_ask_json_prints(tmp_path, monkeypatch) -> None:
    """The README's list of `ask --json`'s fields left out `question`, `judgements` and a
    citation's `end_line`, which every answer carries."""
    from crag import Agent

    monkeypatch.chdir(tmp_path)
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "setup.md").write_text("# Setup\n\nThe server listens on port 8080.\n")
    with Agent.from_env(kb="kb", llm="offline", index_dir="idx", log="off", dotenv=None, environ={}) as agent:
        printed = agent.ask("Which port does the server listen on?").to_dict()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`([a-z_]+)`", readme.split("`--json` prints one object with", 1)[1].split("Only the JSON", 1)[0]))
    assert printed["citations"]
    assert {*printed, "index", *printed["citations"][0]} - listed == set()
