"""The core is pure: no I/O library, and no crag module that does I/O, in state, graph,
grading, prompts, answer, text, toolspec, schemas, searches, ports, grounding or nodes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CRAG = Path(__file__).resolve().parents[1] / "crag"
IO_LIBRARIES = {"openai", "faiss", "httpx", "httpx2", "sqlite3", "time", "socket", "urllib", "requests",
                "subprocess", "os", "pathlib", "shutil", "tiktoken", "numpy", "threading", "asyncio"}
# crag's own modules that touch the environment, the disk, the network or the clock, or run
# the loop around the core: the core may name them only for type checkers.
IO_MODULES = {"config", "environment", "llm", "tools", "index", "cli", "mcp_server", "mcp_wire", "driver", "agent", "answer_log", "answer_log_schema", "__main__"}
CORE = ["state.py", "graph.py", "answer.py", "ports.py", "text.py", "toolspec.py", "schemas.py", "events.py",
        "searches.py", "sentences.py", "pages.py", "modes.py", *[f"{package}/{p.name}" for package in ("nodes", "prompts", "grounding", "grading")
                         for p in sorted((CRAG / package).glob("*.py"))]]


def _runtime_tree(path: Path, source: str | None = None) -> ast.Module:
    tree = ast.parse(path.read_text() if source is None else source)
    for block in ast.walk(tree):  # imports only for type checkers do not run
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
            block.body = []
    return tree


def imported_modules(path: Path) -> set[str]:
    """Top-level names of the libraries ``path`` imports at run time (absolute imports)."""
    names = set()
    for node in ast.walk(_runtime_tree(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def crag_modules(path: Path, source: str | None = None) -> set[str]:
    """The crag modules ``path`` imports at run time, as dotted names under ``crag``,
    relative imports (``from ..config import Settings``, ``from .. import llm``) resolved."""
    package = list(path.relative_to(CRAG.parent).with_suffix("").parts[:-1])  # ["crag", "nodes"]
    found = set()
    for node in ast.walk(_runtime_tree(path, source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "crag")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
                if base.split(".")[0] != "crag":
                    continue
            else:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            if node.module is None:
                found.update(f"{base}.{a.name}" for a in node.names)
            else:
                found.add(base)
    return found


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_io_library(module):
    path = CRAG / module
    assert path.exists(), module
    assert not imported_modules(path) & IO_LIBRARIES


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_io_module_of_crag(module):
    imported = crag_modules(CRAG / module)
    assert not {m for m in imported if m.split(".")[1:2] and m.split(".")[1] in IO_MODULES}


def test_the_check_sees_relative_imports():
    source = "from ..config import Settings\nfrom .. import llm\nfrom . import plan\nimport crag.tools.http\n"
    found = crag_modules(CRAG / "nodes" / "probe.py", source)
    assert found == {"crag.config", "crag.llm", "crag.nodes.plan", "crag.tools.http"}
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..config import Settings\n"
    assert crag_modules(CRAG / "nodes" / "probe.py", guarded) == set()


def test_importing_crag_loads_no_heavy_library():
    import subprocess
    import sys

    code = "import sys, crag, crag.cli; print(sorted(m for m in ('openai','faiss','numpy','tiktoken') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


BUILTIN_TOOL_NAMES = ("vector_search", "grep_search", "read_file", "jira_fetch", "confluence_fetch", "web_fetch")


def _tool_names_written(source: str) -> list[int]:
    """The lines of ``source`` where a built-in tool's name is a string constant, except as a
    fast-path rule's name in the ``FAST_PATH_RULES`` table (an audit value the seed names)."""
    tree = ast.parse(source)
    rule_names = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "FAST_PATH_RULES" for t in node.targets)
                  for c in ast.walk(node.value)}
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and node.value in BUILTIN_TOOL_NAMES and id(node) not in rule_names]


def test_no_built_in_tool_name_is_written_outside_crag_tools():
    """What the core knows about a tool is a field of its record (docs/architecture.md): a
    built-in tool's name never appears as a string outside crag/tools/. The one string that
    reads like one is the fast-path rule ``read_file``, a name in the seed's rule table."""
    places = [(str(p.relative_to(CRAG)), n) for p in sorted(CRAG.rglob("*.py"))
              if "tools" not in p.relative_to(CRAG).parts[:1] for n in _tool_names_written(p.read_text())]
    assert places == []


def test_the_tool_name_check_sees_a_name_outside_the_rule_table():
    source = 'FAST_PATH_RULES = ("read_file", "few_context")\nif tool == "read_file":\n    pass\n'
    assert _tool_names_written(source) == [2]


STORE_MODULES = ("postgres", "postgres_search", "postgres_schema", "store", "search", "fusion", "lexical", "vectors",
                 "embedded", "embedded_write", "layout", "integrity", "embedders", "hash_embedder")


def test_the_store_modules_import_no_cycle():
    """The stores' modules import one another in one direction (the PostgreSQL search module
    reads the schema module, and the store imports the search module, never the reverse)."""
    graph = {}
    for path in sorted((CRAG / "index").glob("*.py")):
        graph[f"crag.index.{path.stem}"] = {m for m in crag_modules(path) if m.startswith("crag.index.")}
    assert "crag.index.postgres" not in graph["crag.index.postgres_search"]

    def in_a_cycle(start: str) -> bool:
        todo, seen = list(graph.get(start, ())), set()
        while todo:
            m = todo.pop()
            if m == start:
                return True
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return False

    assert not [m for m in STORE_MODULES if in_a_cycle(f"crag.index.{m}")]


# -- the import graph of crag/: layers, no arrow upward, no cycle --------------------------------
#
# Each layer may import its own layer and those below it, never one above, with imports for
# type checkers counted too (a type is a dependency). Listed bottom up; a module's layer is
# that of its first dotted part below crag (``crag.index.store`` is in ``index``).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("text and settings", frozenset({"errors", "safe_text", "text", "sentences", "pages", "modes", "environment",
                                     "setting_warnings", "config"})),
    ("records and ports", frozenset({"state", "events", "toolspec", "ports"})),
    ("the pure core", frozenset({"graph", "grading", "schemas", "budget", "answer", "grounding", "prompts",
                                 "searches", "nodes"})),
    ("the LLM adapters", frozenset({"llm"})),
    ("the knowledge-base index", frozenset({"index"})),
    ("the tools", frozenset({"tools"})),
    ("the loop", frozenset({"driver"})),
    ("the library", frozenset({"agent", "history", "stream", "answer_log", "answer_log_schema"})),
    ("the interfaces", frozenset({"cli", "mcp_server", "mcp_wire", "__main__", "__init__"})),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(CRAG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(CRAG.rglob("*.py"))}


def _layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return next(n for n, (_, names) in enumerate(LAYERS) if part in names)


def imports_of(module: str, *, type_checking: bool) -> set[str]:
    """The crag modules ``module`` imports (anywhere in it, functions included), as module
    names; with ``type_checking``, also those imported for type checkers only."""
    path = MODULES[module]
    source = path.read_text()
    if type_checking:
        source = source.replace("if TYPE_CHECKING:", "if True:")
    found = set()
    for name in crag_modules(path, source):
        while name not in MODULES and "." in name:  # ``from .x import Name``: the module x
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module:
            found.add(name)
    return found


def test_every_module_of_crag_has_a_layer():
    assert [m for m in MODULES if not any(m.split(".")[1:2] == [p] or m == "crag" for _, ps in LAYERS for p in ps)] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_its_own(module):
    upward = {m: LAYERS[_layer(m)][0] for m in imports_of(module, type_checking=True) if _layer(m) > _layer(module)}
    assert upward == {}, f"{module} ({LAYERS[_layer(module)][0]}) imports {upward}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> the modules it imports), each as a path."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(graph[module]):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_the_import_graph_of_crag_has_no_cycle():
    assert cycles({m: imports_of(m, type_checking=False) for m in MODULES}) == []


def test_no_two_benchmarks_import_each_other():
    bench = CRAG.parent / "benchmarks"
    names = {p.stem for p in bench.glob("*.py")}
    graph = {}
    for path in sorted(bench.glob("*.py")):
        found = set()
        for node in ast.walk(_runtime_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
                found.update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
                found.add(node.module.split(".")[1])
        graph[path.stem] = found - {path.stem}
    assert cycles(graph) == []


def test_the_checks_see_an_upward_import_and_a_cycle():
    assert "crag.nodes" in imports_of("crag.driver", type_checking=False)
    assert "crag.config" in imports_of("crag.nodes", type_checking=True)  # for type checkers only
    assert "crag.config" not in imports_of("crag.nodes", type_checking=False)
    assert _layer("crag.index.store") > _layer("crag.ports") and _layer("crag") == len(LAYERS) - 1
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_of_crag_is_over_550_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 550}
    assert long == {}


@pytest.mark.parametrize("module", sorted(set(MODULES) - {"crag.__main__"}))  # that one runs the CLI
def test_every_name_a_module_exports_exists(module):
    """``__all__`` names only what the module defines: ``from crag.x import *`` never fails."""
    import importlib

    loaded = importlib.import_module(module)
    assert [name for name in getattr(loaded, "__all__", ()) if not hasattr(loaded, name)] == []
