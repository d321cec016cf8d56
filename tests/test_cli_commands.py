"""The command line as users of git, rg and llm expect it: version, help, question words, stdin,
suggestions, one-line errors for a broken install, settings that point at the right fix.

Everything runs through ``crag.cli.main`` or a real ``python -m crag`` process, over a small
knowledge base indexed for real (hash embedder, FAISS, SQLite) in a temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import crag
from crag.config import SETTINGS_TABLE, Settings
from tests.fakes import clean_env, cli
from tests.openai_server import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[1]

SETUP = """# Setup

Install the service with pip.

## Ports

The server listens on port 8080 by default.
Set `SERVICE_PORT` to change the port the server listens on.
"""

BACKUP = """# Backups

Nightly backups are written to the object store at 02:00 UTC.
A backup is kept for thirty days.
"""


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path/docs`` indexed into ``tmp_path/index``; the working directory is ``tmp_path``."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "setup.md").write_text(SETUP, encoding="utf-8")
    (docs / "backup.md").write_text(BACKUP, encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert cli("index", "docs")[0] == 0
    return docs


def run_crag(*argv: str, cwd: Path, env: dict[str, str] | None = None, code: str | None = None,
             stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """A real process: ``python -m crag ARGV`` (or ``python -c CODE``) with crag on the path."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    environ.update(PYTHONPATH=str(ROOT), KB_AGENT_LLM="offline", **(env or {}))
    command = [sys.executable, "-c", code, *argv] if code else [sys.executable, "-m", "crag", *argv]
    return subprocess.run(command, cwd=cwd, env=environ, input=stdin, capture_output=True, text=True, timeout=120)


# -- version, help, suggestions ----------------------------------------------------------


def test_version_prints_the_package_version() -> None:
    code, out, err = cli("--version")
    assert (code, out, err) == (0, f"crag {crag.__version__}\n", "")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{crag.__version__}"' in pyproject
    # The installed package's metadata comes from pyproject.toml; the docs show the same string.
    assert f"| `crag --version` | `crag {crag.__version__}` | 0 |" in (ROOT / "docs" / "cli.md").read_text()


@pytest.mark.parametrize("argv", [("--version", "search"), ("--version", "ask"), ("-m", "x", "--version", "index"),
                                  ("--vers", "roots"), ("--version", "ask", "port")])
def test_version_before_a_command_prints_the_version_whatever_follows(argv: tuple[str, ...]) -> None:
    """``crag --version search`` said "the following arguments are required: QUERY" (exit 2),
    while ``crag --version ask port`` printed the version: as ``git --version status``, crag's
    own ``--version`` is answered before the command's arguments are read."""
    assert cli(*argv) == (0, f"crag {crag.__version__}\n", "")


def test_bare_crag_prints_the_help_on_stdout_and_exits_0(tmp_path: Path) -> None:
    proc = run_crag(cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: python -m crag")
    for command in ("index", "search", "ask", "chat", "mcp", "graph"):
        assert f"    {command} " in proc.stdout


def test_output_that_cannot_be_written_is_one_line_not_a_traceback(kb: Path) -> None:
    # `crag search ... > /dev/full` (a full disk) and `crag ... >&-` (no standard output) ended
    # in a Python traceback; SPEC §4: every expected failure is one `crag: error:` line.
    env = {"KB_AGENT_INDEX_DIR": str(kb.parent / "index")}
    command = [sys.executable, "-m", "crag", "search", "port", "--top-k", "50"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    environ.update(PYTHONPATH=str(ROOT), KB_AGENT_LLM="offline", **env)
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            proc = subprocess.run(command, cwd=kb.parent, env=environ, stdout=full, stderr=subprocess.PIPE,
                                  text=True, timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("crag: error: cannot write the output (") and proc.stderr.count("\n") == 1
    closed = subprocess.run(command, cwd=kb.parent, env=environ, stderr=subprocess.PIPE, text=True, timeout=120,
                            preexec_fn=lambda: os.close(1))
    assert closed.returncode == 1 and closed.stderr.startswith("crag: error: standard output is closed"), closed.stderr
    assert closed.stderr.count("\n") == 1


@pytest.mark.parametrize(("typed", "meant"), [("ak", "ask"), ("serach", "search"), ("indx", "index"), ("chta", "chat")])
def test_a_mistyped_command_suggests_the_closest_one(typed: str, meant: str) -> None:
    code, out, err = cli(typed, "what port?")
    assert code == 2 and out == ""
    assert err.startswith(f"crag: error: {typed!r} is not a crag command; did you mean {meant!r}?")
    assert err.count("\n") == 1


@pytest.mark.parametrize("before", [("-m", "llama3.1"), ("--index", ".crag"), ("--model=x", "--index", "i"), ("-mx",),
                                    ("--version",)])
@pytest.mark.parametrize(("typed", "said"), [
    ("serach", "'serach' is not a crag command; did you mean 'search'? (commands: index, search, ask, chat, log, "
               "roots, mcp, graph)"),
    ("ASK", "'ASK' is not a crag command; did you mean 'ask'? (commands are lower case)"),
    ("help", "'help' is not a crag command: the help is python -m crag --help, or python -m crag COMMAND --help "
             "for one command"),
])
def test_a_mistyped_command_after_crags_own_options_is_answered_as_alone(before: tuple[str, ...], typed: str,
                                                                         said: str) -> None:
    """``crag -m llama3.1 serach port`` got argparse's "argument COMMAND: invalid choice: 'serach'
    (choose from ...)": the command word was looked for only in the first place."""
    code, out, err = cli(*before, typed, "port")
    assert (code, out, err) == (2, "", f"crag: error: {said}\n")


def test_a_word_far_from_every_command_lists_the_commands() -> None:
    code, _, err = cli("xyzzy")
    assert code == 2 and "did you mean" not in err and "(commands: index, search, ask" in err


# -- question words, options anywhere, stdin ------------------------------------------------


def test_ask_joins_unquoted_words_into_one_question(kb: Path) -> None:
    code, out, err = cli("ask", "which", "port", "does", "the", "server", "listen", "on", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["question"] == "which port does the server listen on"
    assert "8080" in result["answer"]


def test_options_between_question_words_are_options_not_words(kb: Path) -> None:
    code, out, err = cli("ask", "--top-k", "3", "hi", "--json")
    assert code == 0, err
    assert json.loads(out)["question"] == "hi"
    code, out, err = cli("ask", "how", "long", "--json", "is", "a", "backup", "kept")
    assert code == 0, err
    assert json.loads(out)["question"] == "how long is a backup kept"


def test_ask_top_k_limits_every_vector_search(kb: Path) -> None:
    from crag import Agent

    with Agent.from_env(top_k=1) as agent:
        state = agent.ask("which port does the server listen on").state
    searches = [run for run in state.tool_history if run.call.tool == "vector_search"]
    assert searches and all(len(run.items) <= 1 for run in searches)
    code, _, err = cli("ask", "--top-k", "0", "hi")
    assert code == 2 and err == "crag: error: --top-k must be from 1 to 50, got 0\n"


def test_ask_dash_reads_the_question_from_standard_input(kb: Path) -> None:
    code, out, err = cli("ask", "-", "--json", stdin="How long is a backup kept?\n")
    assert code == 0, err
    result = json.loads(out)
    assert result["question"] == "How long is a backup kept?" and "thirty days" in result["answer"]
    proc = run_crag("ask", "-", cwd=kb.parent, env={"KB_AGENT_INDEX_DIR": str(kb.parent / "index")},
                    stdin="which port does the server listen on")
    assert proc.returncode == 0, proc.stderr
    assert "8080" in proc.stdout


def test_ask_dash_with_empty_standard_input_is_a_usage_error(kb: Path) -> None:
    code, out, err = cli("ask", "-", stdin="  \n")
    assert (code, out) == (2, "") and err == "crag: error: the question read from standard input is empty\n"


def test_ask_dash_with_more_words_is_a_usage_error_not_a_question_starting_with_a_dash(kb: Path) -> None:
    """``crag ask - more`` asked "- more" (and logged it), where ``-`` alone reads standard input."""
    code, out, err = cli("ask", "-", "which", "port", stdin="How long is a backup kept?\n")
    assert (code, out) == (2, "") and err == (
        "crag: error: the question `-` is read from standard input and takes no other words: give `-` alone, "
        "or the question's words without it\n")
    code, out, err = cli("ask", "- which port", "--json")  # quoted, it is a question's words
    assert code == 0 and json.loads(out)["question"] == "- which port", err


def test_a_question_or_query_given_as_bytes_that_are_not_utf8_is_a_usage_error(kb: Path) -> None:
    """``crag ask $'caf\\xe9 port'`` asked "caf\ufffd port" (and logged it) with exit status 0,
    where the same bytes on standard input are a usage error: Python keeps such bytes as lone
    surrogates, and they were replaced. Now nothing is asked, searched or logged."""
    code, out, err = cli("ask", "caf\udce9", "port")  # as Python reads $'caf\xe9' port
    assert (code, out) == (2, "") and err == (
        "crag: error: the question is not UTF-8 text: type it in a UTF-8 terminal, or save it as UTF-8 and give "
        "it as python -m crag ask - < FILE\n"), err
    code, out, err = cli("search", "--json", "caf\udce9 port")
    assert (code, out) == (2, "") and err == "crag: error: the search query is not UTF-8 text: type it in a UTF-8 terminal\n"
    assert cli("log", "--json")[1] == "[]\n"  # nothing was asked
    proc = run_crag("ask", os.fsdecode(b"caf\xe9 port"), cwd=kb.parent,
                    env={"KB_AGENT_INDEX_DIR": str(kb.parent / "index"), "LC_ALL": "C.UTF-8"})
    assert proc.returncode == 2 and proc.stderr.startswith("crag: error: the question is not UTF-8 text"), proc.stderr


@pytest.mark.parametrize("question", ["which port does the server listen on", "How long is a backup kept?",
                                      "zebra quantum marmalade"])
def test_the_offline_usage_block_lists_every_node_that_may_ask_the_model(kb: Path, question: str) -> None:
    """The README's offline block lists each node with 0 calls; a grading decided by a fast path
    (few_context, high_vector_score) or an answer with no evidence to quote left its node out of
    ``usage.by_node`` and of the block, while the trace held it."""
    code, out, err = cli("ask", "--json", question)
    assert code == 0, err
    result = json.loads(out)
    asking = [n for n in dict.fromkeys(result["trace"]) if n != "tool_exec"]
    assert list(result["usage"]["by_node"]) == asking, (result["trace"], result["usage"]["by_node"])
    listed = [line.split("`")[1] for line in result["answer"].splitlines() if line.startswith("  - `")]
    assert listed == asking and "tool_exec" not in result["usage"]["by_node"]


def test_search_joins_words_and_unknown_options_are_one_line(kb: Path) -> None:
    code, out, err = cli("search", "nightly", "backups", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["path"] == "docs/backup.md"
    code, _, err = cli("search", "port", "--wat")
    assert code == 2 and err == "crag: error: unrecognized arguments: --wat (see python -m crag search --help)\n"


def test_a_path_that_starts_with_a_dash_is_shown_how_to_give_it(kb: Path) -> None:
    """`crag index -notes.md` said only "the following arguments are required: PATH", with
    the file right there: a name that starts with `-` reads as an option, and the line now
    says how to write it as a path."""
    (kb.parent / "-notes.md").write_text("# Notes\n\nThe pier opens at dawn.\n", encoding="utf-8")
    hint = " (-notes.md is taken for an option: write the path as ./-notes.md)"
    code, out, err = cli("index", "-notes.md")
    assert (code, out) == (2, "") and err == "crag: error: the following arguments are required: PATH" + hint + "\n"
    code, out, err = cli("index", "docs", "-notes.md")
    assert (code, out) == (2, "") and err == (
        "crag: error: unrecognized arguments: -notes.md (see python -m crag index --help)" + hint + "\n"
    )
    code, out, err = cli("--index", "index", "ask", "--kb", "-notes.md", "pier")
    assert (code, out) == (2, "") and err == "crag: error: argument --kb: expected one argument" + hint + "\n"
    code, out, err = cli("index", "./-notes.md")
    assert code == 0 and "-notes.md" in out
    code, _, err = cli("search", "port", "--wat")  # no such file: no hint
    assert err == "crag: error: unrecognized arguments: --wat (see python -m crag search --help)\n"


def test_index_without_a_path_says_what_to_name(kb: Path) -> None:
    """`crag index` alone, as "dropped by the next `crag index`" reads, said only "the following
    arguments are required: PATH": the line now says what to name, and where the index's roots
    are listed, with this run's --index."""
    code, out, err = cli("index")
    assert (code, out) == (2, "") and err == (
        "crag: error: the following arguments are required: PATH (name the folders or files of your documents, "
        "as in `python -m crag index docs`; `python -m crag roots` lists those the index holds)\n")
    code, out, err = cli("--index", "my idx", "index", "--exclude", "drafts")
    assert (code, out) == (2, "") and "`python -m crag --index 'my idx' roots` lists" in err, err
    assert not (kb.parent / "my idx").exists()


def test_a_question_given_to_chat_says_where_its_questions_go(kb: Path) -> None:
    """`crag chat how are backups kept` was only "unrecognized arguments: how are ...": chat
    takes no question on its command line, and the line now says where one goes."""
    code, out, err = cli("chat", "how", "long", "are", "backups", "kept")
    assert (code, out) == (2, "") and err == (
        "crag: error: unrecognized arguments: how long are backups kept (see python -m crag chat --help; chat reads "
        "its questions at its prompt, `python -m crag ask QUESTION` asks one)\n")
    code, _, err = cli("chat", "--wat")
    assert err == "crag: error: unrecognized arguments: --wat (see python -m crag chat --help)\n"


def test_options_of_a_command_without_the_command_are_one_line(kb: Path) -> None:
    code, out, err = cli("--json")
    assert (code, out) == (2, "") and err == "crag: error: unrecognized arguments: --json (see python -m crag --help)\n"
    code, out, err = cli("--kb", "docs")
    assert (code, out) == (2, "") and err.startswith("crag: error: argument COMMAND: invalid choice: 'docs'")


def test_ask_kb_says_on_stderr_what_it_indexed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "oncall.md").write_text("# On-call\n\nThe on-call rotation changes every Monday.\n")
    code, out, err = cli("ask", "When", "does", "the", "on-call", "rotation", "change?", "--kb", "notes", "--json")
    assert code == 0, err
    assert json.loads(out)["answer"]  # stdout holds only the JSON
    assert err.startswith("crag: indexed notes into index: 1 added, 0 changed, 0 removed, ")
    assert "roots --remove PATH" in err and err.count("\n") == 1
    code, _, err = cli("ask", "When does the rotation change?", "--kb", "notes")
    assert code == 0 and err == ""  # nothing new to index: nothing to say


# -- a broken install, configuration hints -----------------------------------------------


def test_a_missing_library_is_one_line_and_leaves_no_lock(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nSome text about ports.\n")
    hide_faiss = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'faiss' else real(name, *a)\n"
        "sys.modules['faiss'] = None  # import faiss raises ModuleNotFoundError\n"
        "from crag.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for argv in (["index", "docs"], ["ask", "what", "about", "ports?"], ["search", "ports"]):
        proc = run_crag(*argv, cwd=tmp_path, env={"KB_AGENT_INDEX_DIR": "idx"}, code=hide_faiss)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith("crag: error: the Python package 'faiss-cpu' is missing or broken in ")
        assert "run `make install`" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
        assert not (tmp_path / "idx" / "LOCK").exists()


# What the console script `crag` runs (pip writes it): the import is where start-up spends its time.
CONSOLE_SCRIPT = "import sys\nfrom crag.cli import main\nsys.exit(main())\n"


@pytest.mark.parametrize(("entry", "signame", "line", "status"), [
    ("-m", "SIGINT", "crag: interrupted", 130),
    ("console script", "SIGINT", "crag: interrupted", 130),
    ("-m", "SIGTERM", "crag: terminated", 143),
])
def test_a_signal_as_crag_starts_ends_it_with_its_line_not_a_traceback(
        kb: Path, entry: str, signame: str, line: str, status: int) -> None:
    """Ctrl-C at once, while Python loaded the command line (a tenth of a second on a busy
    machine), printed a KeyboardInterrupt traceback through the imports, exit status 1 or
    killed by the signal; SIGTERM then killed crag with no line. A moment later either is the
    documented line and status. Each run gets the signal once the loading has begun
    (``-X importtime`` says when argparse, its first import, is in), after a small delay."""
    import signal

    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    environ.update(PYTHONPATH=str(ROOT), KB_AGENT_LLM="offline", KB_AGENT_INDEX_DIR=str(kb.parent / "index"))
    start = ["-c", CONSOLE_SCRIPT] if entry == "console script" else ["-m", "crag"]
    for delay in (0, 0.002, 0.005, 0.01, 0.02, 0.04):
        proc = subprocess.Popen(
            [sys.executable, "-X", "importtime", *start, "ask", "which", "port?"], cwd=kb.parent, env=environ,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell starts it
        try:
            assert proc.stderr is not None
            seen = []
            while not (seen and seen[-1].split("|")[-1].strip() == "argparse"):
                seen.append(proc.stderr.readline())
                assert seen[-1], "".join(seen)  # the run ended without loading argparse
            time.sleep(delay)
            proc.send_signal(getattr(signal, signame))
            err = proc.communicate(timeout=60)[1]
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        assert "Traceback" not in err, f"{delay} s after argparse: {err[-1500:]}"
        said = [t for t in err.splitlines() if not t.startswith("import time:")]
        assert (proc.returncode, said[-1:]) == (status, [line]), f"{delay} s: {err[-1500:]}"


def test_ctrl_c_while_code_built_from_a_string_runs_still_ends_python_m_with_130(tmp_path: Path) -> None:
    """CPython marks a KeyboardInterrupt raised inside ``exec``'d or ``eval``'d text (attrs,
    namedtuple and dataclasses build classes so as crag loads them) as never handled, even once
    crag handled it, and ``python -m`` then ended killed by SIGINT (status -2, not 130): one run
    in about forty when Ctrl-C came as crag started on a busy machine."""
    (tmp_path / "wrap").mkdir()
    (tmp_path / "wrap" / "__main__.py").write_text(
        "import crag.cli as cli\n"
        "def graph(*args, **kwargs):\n"
        "    exec('raise KeyboardInterrupt')  # Ctrl-C as a class is built from text\n"
        "cli.cmd_graph = graph\n"
        "raise SystemExit(cli.main(['graph']))\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    environ.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]), KB_AGENT_LLM="offline")
    proc = subprocess.run([sys.executable, "-m", "wrap"], cwd=tmp_path, env=environ, capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (130, "crag: interrupted\n")


@pytest.mark.parametrize("hidden", ["cattrs", "attrs"])
def test_python_m_crag_without_attrs_or_cattrs_is_one_line_not_a_traceback(tmp_path: Path, hidden: str) -> None:
    """The system Python run in crag's folder (``python3 -m crag ...``) may lack attrs or cattrs:
    importing the command line needed them (``crag.cli.live`` loaded the event records), so
    every command, ``--version`` included, died with a traceback instead of the one line."""
    hide = (
        "import runpy, sys\n"
        f"sys.modules[{hidden!r}] = None  # import {hidden} raises ModuleNotFoundError\n"
        "sys.argv[0] = 'crag'\n"
        "runpy.run_module('crag', run_name='__main__', alter_sys=True)\n"
    )
    proc = run_crag("--version", cwd=tmp_path, code=hide)
    assert (proc.returncode, proc.stderr) == (0, "") and proc.stdout.startswith("crag "), proc.stderr
    proc = run_crag("ask", "what", "about", "ports?", cwd=tmp_path, code=hide)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"crag: error: the Python package {hidden!r} is missing or broken in ")
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_a_missing_library_inside_a_command_is_one_line_too() -> None:
    from crag.cli import _missing_dependency

    assert "'numpy'" in (_missing_dependency(ModuleNotFoundError("No module named 'numpy'", name="numpy")) or "")
    assert _missing_dependency(ModuleNotFoundError("No module named 'crag.nope'", name="crag.nope")) is None


@pytest.mark.parametrize(("backend", "address"), [
    ("ollama", "http://localhost:11434/v1"),
    ("vllm", "http://localhost:8000/v1"),
    ("llamacpp", "http://localhost:8080/v1"),
    ("lmstudio", "http://localhost:1234/v1"),
    ("Ollama", "http://localhost:11434/v1"),
])
def test_a_local_server_named_as_backend_points_at_openai_base_url(
    backend: str, address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_LLM", backend)
    code, out, err = cli("ask", "hi")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"crag: error: KB_AGENT_LLM={backend} is not valid: expected openai or offline;")
    assert f"KB_AGENT_LLM=openai and OPENAI_BASE_URL={address}" in err


def test_an_unknown_backend_still_names_openai_base_url() -> None:
    from crag.errors import ConfigError

    with pytest.raises(ConfigError, match="OPENAI_BASE_URL"):
        Settings.from_env({"KB_AGENT_LLM": "claude"}, dotenv=None)


BOOLEAN_SETTINGS = [name for name, (var, parse) in SETTINGS_TABLE.items()
                    if isinstance(getattr(Settings(), name), bool)]


@pytest.mark.parametrize("name", BOOLEAN_SETTINGS)
@pytest.mark.parametrize(("word", "value"), [
    ("on", True), ("ON", True), ("true", True), ("yes", True), ("1", True),
    ("off", False), ("false", False), ("No", False), ("0", False),
])
def test_every_on_off_setting_accepts_the_same_words(name: str, word: str, value: bool) -> None:
    var = SETTINGS_TABLE[name][0]
    assert getattr(Settings.from_env({var: word}, dotenv=None), name) is value


@pytest.mark.parametrize("name", BOOLEAN_SETTINGS)
def test_every_on_off_setting_refuses_other_words_naming_the_accepted_ones(name: str) -> None:
    from crag.errors import ConfigError

    var = SETTINGS_TABLE[name][0]
    with pytest.raises(ConfigError, match=r"on or off \(also true/false, yes/no, 1/0\)"):
        Settings.from_env({var: "maybe"}, dotenv=None)


def test_there_is_an_on_off_setting_to_check() -> None:
    assert "web_fetch" in BOOLEAN_SETTINGS


# -- the embedding server apart from the chat server ------------------------------------------


def _indexed_with_an_embeddings_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chat, embeddings) -> None:
    """``docs/setup.md`` indexed by ``embeddings``, the chat server ``chat``, as the environment says."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "setup.md").write_text(SETUP)
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_EMBEDDER", "openai")
    monkeypatch.setenv("KB_AGENT_LLM", "openai")
    monkeypatch.setenv("OPENAI_BASE_URL", chat.base_url)
    monkeypatch.setenv("KB_AGENT_EMBEDDING_BASE_URL", embeddings.base_url)
    monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "5")
    assert cli("index", "docs")[0] == 0


def test_embedding_base_url_sends_embeddings_to_their_own_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOpenAIServer() as chat, FakeOpenAIServer(embedding_dim=1536) as embeddings:
        _indexed_with_an_embeddings_server(tmp_path, monkeypatch, chat, embeddings)
        chat.script("analyze_and_route", json.dumps({"complexity": "simple", "suggested_tools": ["vector_search"]}))
        chat.script("plan", json.dumps({"tool_calls": [{"tool": "vector_search", "args": {"query": "port"}}]}))
        chat.script("synthesize", "It listens on 8080 [1].")
        code, out, err = cli("ask", "which port?")
        assert code == 0, err
        assert "8080" in out
        assert embeddings.requests and all(r.path.endswith("/embeddings") for r in embeddings.requests)
        assert chat.requests and not any(r.path.endswith("/embeddings") for r in chat.requests)


def test_an_embeddings_server_that_is_down_fails_the_question_in_one_line(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The question's search could not run: the answer said "couldn't find" with exit status 0,
    # as if the knowledge base had been searched (SPEC §4: a failure at run time is exit 1).
    with FakeOpenAIServer() as chat, FakeOpenAIServer(embedding_dim=1536) as embeddings:
        _indexed_with_an_embeddings_server(tmp_path, monkeypatch, chat, embeddings)
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("KB_AGENT_LLM", "offline")  # the embeddings server has stopped; no chat server is asked
    for command in (("ask", "which port?"), ("search", "which port?")):
        code, out, err = cli(*command)
        assert code == 1, (command, out, err)
        assert out == "" and err.count("\n") == 1 and "cannot reach the embeddings server" in err, (command, err)


# -- chat on a terminal ------------------------------------------------------------------------


def test_chat_on_a_terminal_has_line_editing_and_history(kb: Path) -> None:
    """Up arrow recalls the previous question (readline), instead of printing ``^[[A``."""
    pytest.importorskip("readline")
    import pty
    import select
    import time

    main_fd, child_fd = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update(PYTHONPATH=str(ROOT), KB_AGENT_LLM="offline", KB_AGENT_INDEX_DIR=str(kb.parent / "index"), TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "crag", "chat"], cwd=kb.parent, env=env,
                            stdin=child_fd, stdout=child_fd, stderr=child_fd, close_fds=True)
    os.close(child_fd)
    seen = b""

    def read_until(marker: bytes, count: int = 1, timeout: float = 60.0) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while seen.count(marker) < count:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            ready, _, _ = select.select([main_fd], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(main_fd, 65536)
                except OSError:
                    break

    try:
        read_until(b"you> ")
        os.write(main_fd, b"which port does the server listen on\r")
        read_until(b"LLM Usage Stats", 1)
        read_until(b"you> ", 2)
        os.write(main_fd, b"\x1b[A")  # Up: the previous question comes back, editable
        os.write(main_fd, b"\x7f\x7fon, by default?\r")  # edit its end
        read_until(b"LLM Usage Stats", 2)
        read_until(b"you> ", 3)
        os.write(main_fd, b"\x04")  # Ctrl-D ends the session
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
    text = seen.decode(errors="replace")
    assert "^[[A" not in text
    second = text.split("LLM Usage Stats", 1)[1]
    assert "on, by default?" in second and "8080" in second


# -- search: best first, paths as SPEC'd -------------------------------------------------------


def test_search_paths_are_relative_to_the_working_directory_or_absolute_outside_it(
    kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = cli("search", "nightly", "backups", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["path"] == "docs/backup.md"
    code, out, _ = cli("search", "nightly", "backups")
    assert out.startswith("1. docs/backup.md:L")
    elsewhere = kb.parent / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = cli("search", "nightly", "backups", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["path"] == str(kb / "backup.md")


def test_index_says_so_while_it_waits_for_another_crag_index(kb: Path, tmp_path: Path) -> None:
    import threading

    from crag.index.layout import IndexLock

    (kb / "more.md").write_text("# More\n\nAnother page.\n", encoding="utf-8")
    lock = IndexLock(str(tmp_path / "index"))
    lock.__enter__()
    threading.Timer(0.5, lock.__exit__, (None, None, None)).start()  # the other indexer finishes
    code, out, err = cli("index", "docs")
    assert code == 0 and "1 added" in out
    assert err.splitlines()[-1] == f"crag: another crag index is at work on {tmp_path / 'index'}; waiting for it to finish"


def test_roots_remove_says_so_while_it_waits_for_another_crag_index(kb: Path, tmp_path: Path) -> None:
    """``roots --remove`` waits for the index's lock as ``index`` does, but did it in silence
    (up to two minutes) where ``crag index`` says why."""
    import threading

    from crag.index.layout import IndexLock

    other = tmp_path / "other"
    other.mkdir()
    (other / "more.md").write_text("# More\n\nAnother page.\n", encoding="utf-8")
    assert cli("index", "other")[0] == 0
    lock = IndexLock(str(tmp_path / "index"))
    lock.__enter__()
    threading.Timer(0.5, lock.__exit__, (None, None, None)).start()  # the other indexer finishes
    code, out, err = cli("roots", "--remove", "other")
    assert code == 0 and out.startswith("removed other (1 file, 1 chunk)\n"), err
    assert err.splitlines() == [f"crag: another crag index is at work on {tmp_path / 'index'}; waiting for it to finish"]


def test_roots_remove_while_the_first_index_is_built_says_it_is_being_built(kb: Path, tmp_path: Path) -> None:
    """``roots --remove`` while the first ``crag index`` of the index runs said "no index: run
    `python -m crag index PATH` first", to a user who just did, as ``search`` did before it."""
    from crag.index.layout import IndexLock

    first = tmp_path / "first"
    first.mkdir()
    with IndexLock(str(first)):
        code, out, err = cli("--index", str(first), "roots", "--remove", "docs")
    assert (code, out) == (1, "")
    assert err == (f"crag: error: no index in {first} yet: a crag index is building it now; "
                   "try again when it has finished\n")
    code, _, err = cli("--index", str(first), "roots", "--remove", "docs")  # none built: none to wait for
    assert code == 1 and err.startswith(f"crag: error: no index in {first}: run ") and err.count("\n") == 1


def test_roots_while_the_first_index_is_built_says_it_is_being_built(kb: Path, tmp_path: Path) -> None:
    """``roots`` while the first ``crag index`` of the index runs said "no roots: `python -m crag
    index PATH` adds one", to a user who just ran it, where ``search`` and ``roots --remove``
    say the index is being built."""
    from crag.index.layout import IndexLock

    first = tmp_path / "first"
    first.mkdir()
    with IndexLock(str(first)):
        code, out, err = cli("--index", str(first), "roots")
    assert (code, out, err) == (0, "no roots in first yet: a crag index is building it now; try again when it "
                                   "has finished\n", "")
    code, out, _ = cli("--index", str(first), "roots")  # none being built: index one
    assert code == 0 and out.startswith("no roots in first: `python -m crag ") and out.endswith(" index PATH` adds one\n")


@pytest.mark.parametrize("command", [("ask", "Which page is another?"), ("search", "another", "page")])
def test_ask_and_search_with_kb_say_so_while_they_wait_for_another_crag_index(kb: Path, tmp_path: Path, command) -> None:
    """``--kb`` indexes first: while another crag index held the index, ``ask`` and ``search``
    waited in silence (up to two minutes) where ``crag index`` says why."""
    import threading

    from crag.index.layout import IndexLock

    (kb / "more.md").write_text("# More\n\nAnother page.\n", encoding="utf-8")
    lock = IndexLock(str(tmp_path / "index"))
    lock.__enter__()
    threading.Timer(0.5, lock.__exit__, (None, None, None)).start()  # the other indexer finishes
    code, _, err = cli(*command, "--kb", "docs")
    assert code == 0, err
    assert f"crag: another crag index is at work on {tmp_path / 'index'}; waiting for it to finish" in err.splitlines()


def test_a_question_of_one_word_that_starts_with_a_dash_says_how_to_ask_it(kb: Path) -> None:
    """``crag ask -port`` said "the following arguments are required: QUESTION", as if none had
    been given: the word is taken for an option, and ``--`` is how to ask it."""
    for command in ("ask", "search"):
        code, out, err = cli(command, "-port")
        assert (code, out) == (2, "") and err == (
            f"crag: error: unrecognized arguments: -port (see python -m crag {command} --help; words that start "
            f"with '-' go after '--': python -m crag {command} -- -port)\n")
    code, _, err = cli("ask")
    assert code == 2 and err == "crag: error: the following arguments are required: QUESTION\n"
    code, out, err = cli("search", "--json", "--", "-port")
    assert code == 0 and json.loads(out)[0]["path"] == "docs/setup.md", err
