"""The holes a probe of crag found: hostile names, damaged indexes, slow servers, leaked secrets.

Each test reproduces one finding through the real command line (``crag.cli.main``, the real
index, the real openai client against the loopback server) and checks what a user sees now:
one clear line or a clean result, the right exit status, no traceback, no secret, no
control sequence. The property test at the end draws file names, ``.env`` contents and
server replies from hostile alphabets.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crag.cli import main
from crag.config import Settings
from crag.errors import ConfigError, ToolError
from crag.state import ToolCall
from crag.tools import Toolbox
from crag.tools.http import FetchError, http_get
from tests.auth_words import AUTH_WORD, auth_word_document, auth_word_lines
from tests.fakes import clean_env
from tests.openai_server import Events, FakeOpenAIServer, Garbage, Status, Text, Trickle
from tests.strategies import hostile_dotenv, hostile_file_name, hostile_reply

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
SETUP = "# Setup\n\nInstall the service with pip.\nThe server listens on port 8080 by default.\n"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crag: error: "), err
    assert not CONTROL.search(lines[0])
    return lines[0]


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "setup.md").write_text(SETUP, encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert cli("index", "docs")[0] == 0
    return root


@pytest.fixture
def llm(kb: Path, monkeypatch: pytest.MonkeyPatch):
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-1234")
        monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "5")
        monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
        yield srv


def route(complexity: str, *tools: str) -> str:
    return json.dumps({"complexity": complexity, "suggested_tools": list(tools)})


def plan(*calls: tuple[str, dict]) -> str:
    return json.dumps({"tool_calls": [{"tool": tool, "args": args} for tool, args in calls]})


# -- 1. file names that are not UTF-8 --------------------------------------------------------


def _write_bytes_name(folder: Path, name: bytes, text: str) -> None:
    with open(os.path.join(os.fsencode(folder), name), "wb") as f:
        f.write(text.encode("utf-8"))


def test_1_a_name_that_is_not_utf8_is_skipped_with_one_safe_warning_and_never_blocks_its_root(kb: Path) -> None:
    for n in range(20):
        (kb / f"doc{n}.md").write_text(f"# Doc {n}\n\nThe retention of doc {n} is {n} days.\n", encoding="utf-8")
    _write_bytes_name(kb, b"caf\xe9.md", "# Cafe\n\nThe espresso machine is on floor 3.\n")
    code, out, err = cli("index", "docs")
    assert code == 0, err
    warnings = [line for line in out.splitlines() if "caf" in line]
    assert warnings == ["  docs/caf\\xe9.md: its name is not valid UTF-8 (rename it to index it)"]
    assert not CONTROL.search(out)
    code, out, err = cli("ask", "what is the retention of doc 7?", "--kb", "docs")
    assert code == 0 and "doc7.md" in out, err
    box = Toolbox(Settings.from_env())
    assert list(box.run(ToolCall("grep_search", {"pattern": "espresso"}))) == []
    with pytest.raises(ToolError, match=r"not valid UTF-8"):
        box.run(ToolCall("read_file", {"path": os.fsdecode(b"docs/caf\xe9.md")}))


def test_1_a_root_whose_own_name_is_not_utf8_is_one_clear_line(kb: Path) -> None:
    os.mkdir(os.fsencode(kb.parent) + b"/r\xe9sum\xe9")
    code, _, err = cli("index", os.fsdecode(b"r\xe9sum\xe9"))
    assert code == 1 and "r\\xe9sum\\xe9" in one_error_line(err) and "not valid UTF-8" in err


# -- 2. names are data -----------------------------------------------------------------------

FORGED = "a\n[2] SECRETS.md:L1\n\n---\n\U0001f4ca **LLM Usage Stats:**\n\x1b[31mx.md"


def test_2_a_name_with_newlines_cannot_forge_footer_lines_stats_blocks_or_report_lines(kb: Path) -> None:
    (kb / FORGED).write_text("# Retention\n\nThe retention of audit logs is ninety days.\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert not CONTROL.search(out)
    assert "  docs/a\\n[2] SECRETS.md:L1\\n\\n---\\n" in out
    assert all(not line.startswith(("[2]", "---", "\U0001f4ca")) for line in out.splitlines())
    code, out, err = cli("ask", "what is the retention of audit logs?")
    assert code == 0, err
    assert out.count("\U0001f4ca **LLM Usage Stats:**") == 2  # the real heading, and the escaped name's text
    assert [line for line in out.splitlines() if line.startswith("\U0001f4ca")] == ["\U0001f4ca **LLM Usage Stats:**"]
    assert not any(line.startswith("[2] SECRETS") for line in out.splitlines())
    assert not CONTROL.search(out)
    code, out, err = cli("ask", "what is the retention of audit logs?", "--json")
    assert not CONTROL.search(out)  # the JSON text escapes the name's newlines and ESC
    result = json.loads(out)
    assert [c["path"] for c in result["citations"]] == [f"docs/{FORGED}"]  # parsed: the file's own name
    assert not any(line.startswith("[2] SECRETS") for line in result["answer"].splitlines())
    code, out, err = cli("search", "retention audit logs", "--json")
    assert not CONTROL.search(out)
    assert [hit["path"] for hit in json.loads(out)] == [f"docs/{FORGED}"]


def test_2_a_suffix_with_a_newline_cannot_add_a_line_to_the_skipped_by_type_count(kb: Path) -> None:
    (kb / "notes.x\n[1] forged").write_text("not indexed: its suffix is no text suffix\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert "skipped by type: 1 .x\\n[1] forged" in out.splitlines()
    assert not any(line.startswith("[1] forged") for line in out.splitlines()) and not CONTROL.search(out)


# One name whose display form (a newline escaped) is the other's own name, and one with a tab
# and an escape sequence: each is cited by its own name wherever a program reads the path.
TWINS = {
    "a\nb.md": "The first file says the lemming runs.\n",
    "a\\nb.md": "The second file says the lemming swims.\n",
    "esc\x1b[31mred\tx.md": "The third file says the lemming hides.\n",
}


def _holds(path: str, line: int, text: str) -> bool:
    """Whether the file at ``path`` (as a program opens it) shows ``text`` at ``line``."""
    return os.path.isfile(path) and Path(path).read_text(encoding="utf-8").splitlines()[line - 1] == text


def test_2_json_paths_are_the_files_own_names_and_tell_apart_names_shown_alike(kb: Path) -> None:
    """``search --json``, ``ask --json`` and ``crag log --json`` gave every path in its display
    form: the newline file was cited as ``a\\nb.md``, the name of the other file, and the
    ESC file as ``esc\\x1b[31mred\\tx.md``, a name no file has (docs/safety.md, Names are
    data). The text a person reads keeps the escaped form."""
    for name, text in TWINS.items():
        (kb / name).write_text(text, encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    real = {f"docs/{name}" for name in TWINS}

    code, out, err = cli("search", "lemming", "--json")
    assert code == 0 and not CONTROL.search(out), err
    hits = json.loads(out)
    assert {h["path"] for h in hits} == real
    assert all(_holds(h["path"], h["start_line"], h["text"]) for h in hits)

    code, out, err = cli("ask", "what does the lemming do?", "--json")
    assert code == 0 and not CONTROL.search(out), err
    result = json.loads(out)
    cited = result["citations"]
    assert {c["path"] for c in cited} == real
    texts = {f"docs/{name}": text.strip() for name, text in TWINS.items()}
    assert all(_holds(c["path"], c["line"], texts[c["path"]]) for c in cited)
    for event in result["audit"]:  # an audited source is a path as a program opens it too
        source = event.get("source")
        if source is not None and source.startswith("docs/"):
            assert os.path.isfile(source.rsplit(":L", 1)[0]), event
    # the answer is text to read: its footer names each file in display form, a line each
    footer = [line for line in result["answer"].splitlines() if re.match(r"\[\d\] ", line)]
    assert sorted(line.split(" ", 1)[1] for line in footer) == sorted(
        ["docs/a\\nb.md:L1", "docs/a\\nb.md:L1", "docs/esc\\x1b[31mred\\tx.md:L1"])

    code, out, err = cli("log", "--json")
    assert code == 0 and not CONTROL.search(out), err
    assert {c["path"] for c in json.loads(out)[-1]["citations"]} == real

    for argv in (("search", "lemming"), ("ask", "what does the lemming do?")):
        code, out, err = cli(*argv)
        assert code == 0 and not CONTROL.search(out), err
        assert "docs/esc\\x1b[31mred\\tx.md:L1" in out and "docs/a\\nb.md:L1" in out
        assert "\t" not in out and not any(line.startswith("b.md") for line in out.splitlines())


@pytest.mark.parametrize("argv", [("index", "{name}"), ("ask", "which port?", "--history", "{name}")])
def test_2_a_missing_path_with_control_characters_is_named_escaped(kb: Path, argv: tuple[str, ...]) -> None:
    """``crag index`` of a missing path, and a missing ``--history`` file, named the path raw:
    the terminal filter turned ``no<ESC>[31m<LF>such`` into "no such", a name that is not the
    one given; every other path crag shows is escaped (docs/safety.md, Names are data)."""
    code, out, err = cli(*(a.format(name="no\x1b[31m\nsuch") for a in argv))
    line = one_error_line(err)
    assert code in (1, 2) and not out and "no\\x1b[31m\\nsuch" in line, line


# -- 3 and 4. a damaged index is one line, and `index` repairs it ---------------------------


def _generation(kb: Path) -> Path:
    index = Path(os.environ["KB_AGENT_INDEX_DIR"])
    return index / (index / "CURRENT").read_text().strip()


def _sql(db: Path, statement: str) -> None:
    conn = sqlite3.connect(db)
    try:
        conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _without_checksums(kb: Path, statement: str) -> None:
    """``statement`` run on a generation made to look written before checksums existed."""
    _sql(_generation(kb) / "chunks.sqlite", statement)
    _sql(_generation(kb) / "chunks.sqlite", "DELETE FROM meta WHERE key = 'checksums'")
    (_generation(kb) / "CHECKSUMS").unlink()


def _break_current_bytes(kb: Path) -> None:
    (Path(os.environ["KB_AGENT_INDEX_DIR"]) / "CURRENT").write_bytes(b"\xff\xfe\x00gen")


def _break_current_folder(kb: Path) -> None:
    current = Path(os.environ["KB_AGENT_INDEX_DIR"]) / "CURRENT"
    current.unlink()
    current.mkdir()


DAMAGE = {
    "CURRENT holds bytes that are not text": _break_current_bytes,
    "CURRENT is a folder": _break_current_folder,
    "meta.chunks is not a number": lambda kb: _sql(_generation(kb) / "chunks.sqlite",
                                                   "UPDATE meta SET value = 'lots' WHERE key = 'chunks'"),
    "the FTS table is dropped": lambda kb: _sql(_generation(kb) / "chunks.sqlite", "DROP TABLE fts"),
    "garbage in the database": lambda kb: _overwrite(_generation(kb) / "chunks.sqlite", 8192, os.urandom(65536)),
    "garbage in the FAISS file, same size": lambda kb: _overwrite(
        _generation(kb) / "vectors.faiss", (_generation(kb) / "vectors.faiss").stat().st_size // 2, b"\xa5\x5a" * 32),
    "chunk rows deleted": lambda kb: _sql(_generation(kb) / "chunks.sqlite", "DELETE FROM chunks WHERE id % 2 = 0"),
    # CHECKSUMS nested past Python's recursion limit was a RecursionError traceback; one that
    # lists no file (or other files) checked nothing, or read whatever it named.
    "CHECKSUMS nested too deeply": lambda kb: (_generation(kb) / "CHECKSUMS").write_bytes(b"[" * 100_000),
    "CHECKSUMS lists no file": lambda kb: (_generation(kb) / "CHECKSUMS").write_bytes(b"{}"),
    "CHECKSUMS lists another file": lambda kb: (_generation(kb) / "CHECKSUMS").write_text(
        json.dumps({"../CURRENT": {"size": 11, "crc32": 0}}), encoding="utf-8"),
    # With no CHECKSUMS (as before checksums existed), chunk text stored as bytes was a TypeError
    # traceback in ask and search --json, and a line number past SQLite's integers one in the log.
    "no CHECKSUMS, chunk text as bytes": lambda kb: _without_checksums(kb, "UPDATE chunks SET text = x'00ff'"),
    "no CHECKSUMS, line numbers out of range": lambda kb: _without_checksums(
        kb, "UPDATE chunks SET start_line = 9223372036854775807, end_line = 9223372036854775807"),
    "no CHECKSUMS, file paths as bytes": lambda kb: _without_checksums(kb, "UPDATE files SET path = CAST(path AS BLOB)"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_3_4_a_damaged_index_is_one_line_everywhere_and_index_rebuilds_it(kb: Path, damage: str) -> None:
    for n in range(6):
        (kb / f"doc{n}.md").write_text(f"# Doc {n}\n\nThe retention of doc {n} is {n} days.\n", encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    DAMAGE[damage](kb)
    for argv in (("search", "retention"), ("ask", "what is the retention of doc 3?")):
        code, out, err = cli(*argv)
        line = one_error_line(err)
        assert code == 1 and out == "" and "damaged" in line and "crag index" in line, (argv, err)
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert "rebuilt" in out or "re-embedded everything" in out, out
    code, out, err = cli("search", "retention of doc 3", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["path"] == "docs/doc3.md"
    assert cli("index", "docs")[1].count("unchanged") == 1  # and the repaired index is healthy again


def test_3_4_an_index_dir_that_is_a_file_is_one_line_naming_the_setting(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (kb.parent / "a-file").write_text("not an index\n", encoding="utf-8")
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(kb.parent / "a-file"))
    for argv in (("search", "port"), ("ask", "which port?"), ("roots",), ("index", "docs")):
        code, out, err = cli(*argv)
        line = one_error_line(err)
        assert code == 1 and not out and "KB_AGENT_INDEX_DIR" in line, argv
        assert "rebuild" not in line and "re-index" not in line, line  # indexing cannot fix it


def test_3_4_an_index_dir_name_too_long_is_one_line_naming_the_setting(kb: Path, monkeypatch) -> None:
    """A folder name past the file system's limit was "cannot read .../CURRENT (File name too
    long): run `python -m crag index PATH` (with KB_AGENT_INDEX_DIR=...) to rebuild it": advice
    that cannot work, and the 5,000-character name twice in one line."""
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", "x" * 5000)
    for argv in (("search", "port"), ("ask", "which port?"), ("roots",), ("index", "docs")):
        code, out, err = cli(*argv)
        line = one_error_line(err)
        assert code == 1 and not out and "KB_AGENT_INDEX_DIR" in line and "File name too long" in line, argv
        assert "rebuild" not in line and line.count("x" * 5000) <= 1, line


@pytest.mark.parametrize("gone", ["vectors.faiss", "chunks.sqlite"])
def test_3_4_a_file_missing_from_the_generation_is_named_not_the_generation(kb: Path, gone: str) -> None:
    """With only its FAISS file deleted, the index was said to be damaged because "generation
    gen-000001 is missing", though that folder is there: the line names what is missing."""
    (_generation(kb) / gone).unlink()
    code, out, err = cli("search", "port")
    assert out == ""
    line = one_error_line(err)
    assert code == 1 and f"{_generation(kb).name}/{gone} is missing" in line and "generation gen" not in line, line
    assert cli("index", "docs")[0] == 0 and cli("search", "port")[0] == 0


def test_3_4_a_checksum_file_naming_an_endless_file_is_damage_not_a_read_forever(kb: Path) -> None:
    """CHECKSUMS that named /dev/zero beside the generation's files made every search read
    it forever: only the generation's own files are checked."""
    checksums = _generation(kb) / "CHECKSUMS"
    checksums.write_text(json.dumps({**json.loads(checksums.read_text()), "/dev/zero": {"size": 0, "crc32": 0}}))
    done: list[tuple[int, str, str]] = []
    worker = threading.Thread(target=lambda: done.append(cli("search", "port")), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "search still reading after 30s"
    code, out, err = done[0]
    assert code == 1 and not out and "damaged" in one_error_line(err)


# -- 5. a catastrophic regular expression from a plan ----------------------------------------


def test_5_a_catastrophic_planned_regex_is_a_tool_error_not_a_hang(llm: FakeOpenAIServer, kb: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("crag.tools.regex_guard.TIME_LIMIT", 1.0)
    (kb / "words.md").write_text(("word " * 24).strip() + "!\n", encoding="utf-8")  # 120 characters
    llm.script("analyze_and_route", route("simple", "grep_search"))
    llm.script("plan", plan(("grep_search", {"pattern": r"^(\w+\s?)*$", "regex": True})))
    llm.default("synthesize", "The server listens on port 8080 [1].")
    code, out, err = cli("ask", "which port does the server listen on?", "--json")
    assert code == 0, err
    result = json.loads(out)
    errors = [e for e in result["audit"] if e["event"] == "tool_error"]
    assert errors and "longer than 1 s" in json.dumps(errors)


def test_5_a_plain_regex_over_many_lines_gets_the_time_their_size_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit was the same 5 s however much text the matching process was sent: over 45 MB
    of lines a plain ``filler text`` took 3.5 to 5 s and was refused as if it backtracked."""
    from crag.tools.regex_guard import matching_lines

    monkeypatch.setattr("crag.tools.regex_guard.TIME_LIMIT", 0.05)  # less than sending 8 MB takes
    documents = [[f"row {i} filler text" for i in range(400_000)], ["a widget9 here"]]
    found = matching_lines(r"widget\d|row 7 ", documents, max_chars=4000)
    assert found == [[7], [0]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads a process's state in /proc")
def test_5_a_regex_process_ends_itself_when_the_process_that_started_it_is_gone(tmp_path: Path) -> None:
    """``crag mcp`` stopped by SIGTERM (as a client stops its server) mid-match left the
    matching process running at 100% CPU for as long as the pattern backtracked: forever."""
    import time

    script = (
        "import os, subprocess, sys, threading\n"
        "from crag.tools import regex_guard\n"
        "real = subprocess.Popen\n"
        "def started(*a, **k):\n"
        "    proc = real(*a, **k)\n"
        "    print(proc.pid, flush=True)\n"
        "    threading.Timer(0.5, os._exit, (0,)).start()\n"
        "    return proc\n"
        "subprocess.Popen = started\n"
        "regex_guard.matching_lines(r'^(\\w+\\s?)*$', [['word ' * 24 + '!']], max_chars=4000, time_limit=1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    parent = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    pid = int(parent.stdout.split()[0])

    def running() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state not in ("Z", "X")

    deadline = time.monotonic() + 20  # its limit is 1 s (2 s for the process itself): loose for a busy machine
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = running()
    if alive:
        os.kill(pid, 9)
    assert not alive, "the matching process outlived the process that started it"


def test_5_a_cancelled_call_stops_its_regex_at_once() -> None:
    """A client that cancelled an ask, or closed ``crag mcp``'s stdin, mid-match waited for the
    whole time limit: the server could not exit until the match was killed."""
    import time

    from crag.llm.deadline import Cancelled, cancellable
    from crag.tools import regex_guard

    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    begun = time.monotonic()
    with pytest.MonkeyPatch.context() as mp, cancellable(cancel), pytest.raises(Cancelled):
        mp.setattr(regex_guard.subprocess, "Popen", popen)
        regex_guard.matching_lines(r"^(\w+\s?)*$", [["word " * 24 + "!"]], max_chars=4000, time_limit=60)
    assert time.monotonic() - begun < 20  # 0.5 s and a slice of 0.2 s: loose for a busy machine
    assert started and started[0].poll() is not None


def test_5_a_regex_that_finishes_still_finds_its_lines(kb: Path) -> None:
    box = Toolbox(Settings.from_env())
    items = box.run(ToolCall("grep_search", {"pattern": r"port \d+", "regex": True}))
    assert [(i.source, i.anchor_line) for i in items] == [("docs/setup.md", 4)]


# -- 6. durations have a finite range --------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "1e309", "-inf", "nan", "0", "86401"])
def test_6_an_infinite_or_out_of_range_timeout_is_refused(kb: Path, monkeypatch: pytest.MonkeyPatch,
                                                          value: str) -> None:
    monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", value)
    code, out, err = cli("ask", "hi")
    assert code == 2 and out == ""
    assert "KB_AGENT_LLM_TIMEOUT" in one_error_line(err) and "between 0.001 and 86400" in err


def test_6_settings_built_in_code_are_checked_too() -> None:
    with pytest.raises(ConfigError, match="KB_AGENT_LLM_TIMEOUT"):
        Settings(llm_timeout=float("inf"))


# -- 7. keys and tokens HTTP cannot carry ----------------------------------------------------


@pytest.mark.parametrize("var", ["OPENAI_API_KEY", "JIRA_API_TOKEN", "CONFLUENCE_API_TOKEN"])
def test_7_a_non_ascii_key_or_token_is_one_line_that_does_not_show_it(kb: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       var: str) -> None:
    monkeypatch.setenv(var, "sk-caf\u00e9-secret-value")
    monkeypatch.setenv("JIRA_BASE_URL", "http://127.0.0.1:9")
    code, _out, err = cli("ask", "what is PROJ-1?")
    line = one_error_line(err)
    assert code == 2 and var in line and "non-ASCII" in line
    assert "secret-value" not in err


def test_7_a_header_http_cannot_carry_is_a_fetch_error_naming_no_value() -> None:
    for token in ("t\u20acken-secret", "token\r\nX-Injected: 1"):
        with pytest.raises(FetchError) as caught:
            http_get("http://127.0.0.1:9/", auth_headers={"Authorization": f"Bearer {token}"}, timeout=2)
        assert "Authorization" in str(caught.value) and "secret" not in str(caught.value)


# -- 8. a total deadline per request ---------------------------------------------------------


def test_8_a_server_trickling_bytes_cannot_hold_a_request_past_its_timeout(llm: FakeOpenAIServer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "1")
    llm.script("analyze_and_route", Trickle(0.05))  # ~15 s for the whole reply, each byte well within 1 s
    code, _out, err = cli("ask", "which port does the server listen on?")
    line = one_error_line(err)
    assert code == 1 and "did not answer within 1 s" in line


def _trickle_server() -> tuple[socket.socket, threading.Event]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000:
                if stop.wait(0.05):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    return server, stop


def test_8_http_tools_have_a_total_deadline_too() -> None:
    server, stop = _trickle_server()
    try:
        port = server.getsockname()[1]
        with pytest.raises(FetchError, match="timed out after 1s"):
            http_get(f"http://127.0.0.1:{port}/", timeout=1.0)
    finally:
        stop.set()
        server.close()


def _raw_server(answer: bytes) -> socket.socket:
    """A server that answers one request with ``answer`` as it is, then closes the connection."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"HTTP/1.1 abc crag: error: a line of the server's\r\n\r\n", "answered with something that is not HTTP"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n", "the body it sent was cut short or malformed"),
    ],
)
def test_8_a_server_that_does_not_speak_http_is_one_line_saying_so(answer: bytes, said: str) -> None:
    """A bad status line was repeated into the tool error with its CR LF (a blank line after the
    note, and text the server chose); a broken chunked body said only 'IncompleteRead(0 bytes read)'."""
    server = _raw_server(answer)
    try:
        url = f"http://127.0.0.1:{server.getsockname()[1]}/"
        with pytest.raises(FetchError) as caught:
            http_get(url, timeout=5)
        assert str(caught.value) == f"cannot fetch {url}: {said}"
    finally:
        server.close()


def test_8_a_name_whose_resolution_never_answers_is_held_to_the_deadline_too() -> None:
    """The deadline began after the host name was resolved: a DNS server that did not answer
    held a fetch for as long as the resolver's own retries (30 s and more), whatever the limit."""
    started, answer = threading.Event(), threading.Event()

    def silent_dns(host: str, port: int) -> list[str]:
        started.set()
        answer.wait(10)
        return ["127.0.0.1"]

    begun = time.monotonic()
    try:
        with pytest.raises(FetchError, match=r"^timed out after 0\.5s fetching http://intranet\.example/$"):
            http_get("http://intranet.example/", timeout=0.5, resolver=silent_dns)
        assert started.is_set() and time.monotonic() - begun < 3
    finally:
        answer.set()


# -- 9. secrets never reach the screen or the audit log -------------------------------------


def test_9_a_key_with_a_newline_is_refused_without_showing_it(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-abc\nsecretpart")
    code, _, err = cli("ask", "hi")
    assert code == 2 and "secretpart" not in err and "sk-abc" not in err
    one_error_line(err)


def test_9_a_server_echoing_the_key_is_redacted(llm: FakeOpenAIServer) -> None:
    llm.script("analyze_and_route", Status(401, {"error": {"message": "Incorrect API key provided: sk-test-key-1234"}}))
    code, _, err = cli("ask", "which port?")
    line = one_error_line(err)
    assert code == 1 and "sk-test-key-1234" not in err and "***" in line and "OPENAI_API_KEY" in line


def test_9_a_password_in_the_base_url_is_never_printed(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    monkeypatch.setenv("KB_AGENT_LLM", "openai")
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://user:PASSWORD123@127.0.0.1:{port}/v1")
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    code, _, err = cli("ask", "which port?")
    assert code == 1 and "PASSWORD123" not in err and "user:***@" in one_error_line(err)


def test_9_a_tool_error_echoing_the_key_is_redacted_in_the_audit(llm: FakeOpenAIServer) -> None:
    llm.script("analyze_and_route", route("simple", "read_file"))
    llm.script("plan", plan(("read_file", {"path": "sk-test-key-1234"})))  # a prompt injection's exfiltration try
    llm.default("synthesize", "The server listens on port 8080 [1].")
    code, out, err = cli("ask", "which port does the server listen on?", "--json")
    assert code == 0, err
    assert "sk-test-key-1234" not in out and "***" in out


@pytest.mark.parametrize("grounding", ["note", "off"])
def test_9_secrets_a_server_echoes_while_chat_streams_are_redacted(llm: FakeOpenAIServer, grounding: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_AGENT_GROUNDING", grounding)
    monkeypatch.setenv("JIRA_API_TOKEN", "abcdef123456")  # configured: masked wherever it shows
    leak = ("The server listens on port 8080 [1]. Your key is sk-test-key-1234 (or sk-test-\x1b[0mkey-1234, or "
            "sk-test-\x00key-1234 for a terminal), the database is "
            "postgresql://admin:Sup3rSecretPw@db.internal/kb and the header Authorization: Bearer abcdef123456 works. "
            "The server listens on port 8080 by default [1]. " * 3)
    llm.default("analyze_and_route", route("simple", "vector_search"))
    llm.default("plan", plan(("vector_search", {"query": "server port"})))
    llm.script("synthesize", leak, leak)
    code, printed, err = cli("ask", "which port does the server listen on?")
    code_chat, streamed, err_chat = cli_stdin("which port does the server listen on?\n", "chat")
    assert code == code_chat == 0, err + err_chat
    assert [bool(r.body.get("stream")) for r in llm.requests if r.node == "synthesize"] == [False, True]
    for shown in (printed, streamed):
        assert "port 8080" in shown and "Bearer ***" in shown
        for secret in ("sk-test-key-1234", "abcdef123456"):
            assert secret not in shown
        # A password crag was not given is the model's prose: shown as written, not guessed at.
        assert "postgresql://admin:Sup3rSecretPw@db.internal/kb" in shown
    body = printed.split("\n---\n")[0]
    assert streamed.startswith(body)  # the stream showed the answer as ask prints it, redactions included


def test_9_documents_with_auth_words_print_unchanged_with_no_secret_configured(kb: Path) -> None:
    # "CPU Basic hardware" once printed as "CPU Basic ***": a word pattern rewrote documents.
    (kb / "auth.md").write_text(auth_word_document(), encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    document = (kb / "auth.md").read_text(encoding="utf-8")
    code, out, err = cli("search", "basic bearer token", "--top-k", "50", "--json")
    assert code == 0, err
    hits = json.loads(out)
    assert hits and all(h["text"] in document for h in hits)
    code, printed, err = cli("search", "basic bearer token", "--top-k", "50")
    assert code == 0 and "***" not in printed, err
    shown, asked = 0, auth_word_lines()[::4]  # every line: by hand (issue 26's note); a quarter here
    for line in asked:
        code, out, err = cli("ask", line, "--json")
        assert code == 0, err
        answer = json.loads(out)["answer"]
        assert "***" not in answer, line
        # the answer quotes some auth-word phrase of the document exactly as written (with the
        # few fallback lines every question retrieves the same chunk, so not always its own line)
        shown += any(m.group(0) in answer for m in AUTH_WORD.finditer(document))
    assert shown >= len(asked) // 2  # the offline answer quotes most of them


# -- 10. no control sequence reaches the terminal --------------------------------------------


HOSTILE_DOC = "# Ports\n\nThe server \x1b[31mlistens\x1b[0m on port 8080\x1b]0;pwned\x07 by default.\n"


def test_10_escape_sequences_from_documents_never_reach_the_terminal(kb: Path) -> None:
    (kb / "ports.md").write_text(HOSTILE_DOC, encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    for argv in (("ask", "which port does the server listen on?"), ("search", "server listens port")):
        code, out, err = cli(*argv)
        assert code == 0, err
        assert "listens" in out and not CONTROL.search(out + err), argv
    code, out, _ = cli("search", "server listens port", "--json")
    assert not CONTROL.search(out)
    assert any("\x1b[31m" in hit["text"] for hit in json.loads(out))  # data stays data, escaped


def test_10_escape_sequences_and_nul_from_the_model_never_reach_the_terminal(llm: FakeOpenAIServer) -> None:
    llm.script("analyze_and_route", route("chitchat"))
    llm.script("synthesize", "Hello\x00 \x1b]0;owned\x07there \x1b[2J\x9b31mfriend.")
    code, out, err = cli("ask", "hi")
    assert code == 0, err
    assert "Hello there friend." in out and not CONTROL.search(out)


# -- 11. .env edge cases, empty paths, read_file's reach -------------------------------------


def test_11_a_bom_does_not_hide_the_first_key(kb: Path) -> None:
    Path(".env").write_bytes(b"\xef\xbb\xbfKB_AGENT_MAX_ITERATIONS=zero\n")
    code, _, err = cli("ask", "hi")
    assert code == 2 and "KB_AGENT_MAX_ITERATIONS=zero" in one_error_line(err)


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_11_a_dotenv_that_is_not_a_regular_file_is_refused_without_reading_it(kb: Path, kind: str) -> None:
    if kind == "device":
        os.symlink("/dev/zero", ".env")
    else:
        os.mkfifo(".env")
    code, _, err = cli("ask", "hi")
    assert code == 2 and "regular file" in one_error_line(err)


def test_11_a_virtualenv_named_env_is_no_settings_file(kb: Path) -> None:
    """``python -m venv .env`` is a common name for a project's virtualenv: crag refused to run
    in such a project (exit status 2, ".env is not a regular file"). A folder holds no settings:
    it is passed over, silently for a virtualenv, with one warning line for any other folder."""
    os.mkdir(".env")
    Path(".env", "pyvenv.cfg").write_text("home = /usr/bin\n", encoding="utf-8")
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 0 and "8080" in out and err == ""
    os.remove(Path(".env", "pyvenv.cfg"))
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 0 and "8080" in out
    assert err == "crag: warning: .env is a folder, not a settings file; no settings are read from it\n"


def test_11_a_dotenv_link_to_nothing_is_one_warning_line(kb: Path, tmp_path: Path) -> None:
    """A ``.env`` linked to a file that is not there (a dotfiles checkout missing) was passed
    over without a word, while one linked round in a loop is an error: its settings are not
    read, and that is said."""
    os.symlink(tmp_path / "dotfiles" / "crag.env", ".env")
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 0 and "8080" in out
    assert err == (f"crag: warning: .env is a symbolic link to {tmp_path / 'dotfiles' / 'crag.env'}, which does "
                   "not exist; no settings are read from it\n")
    os.remove(".env")
    os.symlink(".env", ".env")  # round in a loop: still an error, not this warning
    code, _, err = cli("ask", "hi")
    assert code == 2 and "is a symbolic link to" not in err and "expected a readable file" in one_error_line(err)


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_11_a_dotenv_in_utf16_without_its_mark_is_named_so(kb: Path, codec: str) -> None:
    """Read as UTF-8, such a file was "KB_AGENT_TOP_K=\\x007\\x00 is not valid: expected a value
    without NUL characters": its encoding was never named."""
    Path(".env").write_bytes("KB_AGENT_TOP_K=7\r\nKB_AGENT_LLM=offline\r\n".encode(codec))
    code, out, err = cli("search", "port")
    assert (code, out) == (2, "")
    assert err == ("crag: error: the settings file .env is not valid: expected UTF-8 text (it reads as UTF-16 "
                   "without a byte order mark: save it as UTF-8, or as UTF-16 with its mark)\n")


@pytest.mark.parametrize("codec", ["utf-32-le", "utf-32-be", "utf-32"])
def test_11_a_dotenv_in_utf32_is_named_so(kb: Path, codec: str) -> None:
    """With its mark or without, UTF-32 read as UTF-8 or UTF-16 was "KB_AGENT_TOP_K=\\x00\\x00\\x007..."."""
    Path(".env").write_bytes("KB_AGENT_TOP_K=7\nKB_AGENT_LLM=offline\n".encode(codec))
    code, out, err = cli("search", "port")
    assert (code, out) == (2, "")
    assert err == ("crag: error: the settings file .env is not valid: expected UTF-8 text (it reads as UTF-32: "
                   "save it as UTF-8, or as UTF-16 with its byte order mark)\n")


def test_11_a_dotenv_in_utf16_is_read_and_one_that_is_not_text_is_named(kb: Path) -> None:
    Path(".env").write_bytes("KB_AGENT_MAX_ITERATIONS=zero\r\n".encode("utf-16"))  # PowerShell's ">"
    code, _, err = cli("ask", "hi")
    assert code == 2 and "KB_AGENT_MAX_ITERATIONS=zero" in one_error_line(err)
    Path(".env").write_bytes(b"KB_AGENT_TOP_K=5\n\xff bad\n")
    code, _, err = cli("ask", "hi")
    assert code == 2 and one_error_line(err).startswith("crag: error: the settings file .env is not valid: expected")


def test_11_a_huge_dotenv_is_refused(kb: Path) -> None:
    Path(".env").write_text("# padding\n" * 200_000, encoding="utf-8")
    code, _, err = cli("ask", "hi")
    assert code == 2 and "at most 1024 KiB" in one_error_line(err)


def test_11_nul_and_long_invalid_values_are_not_echoed_raw(kb: Path) -> None:
    Path(".env").write_bytes(b"KB_AGENT_MODEL=gpt\x00\x1b[31mx\n")
    code, _, err = cli("ask", "hi")
    assert code == 2 and "\x00" not in err and "KB_AGENT_MODEL=gpt\\x00\\x1b[31mx" in one_error_line(err)
    Path(".env").write_text("KB_AGENT_TOP_K=" + "9x" * 5000 + "\n", encoding="utf-8")
    code, _, err = cli("ask", "hi")
    assert code == 2 and len(one_error_line(err)) < 200


@pytest.mark.parametrize("argv", [("index", ""), ("index", "  "), ("search", "port", "--kb", ""), ("ask", "hi", "--kb", "")])
def test_11_an_empty_path_is_refused_not_taken_as_the_working_directory(kb: Path, argv: tuple[str, ...]) -> None:
    code, _out, err = cli(*argv)
    assert code == 2 and "empty path" in one_error_line(err)


def test_11_an_empty_index_folder_is_not_called_a_knowledge_base_path(kb: Path) -> None:
    """``--index ''`` was refused as "an empty path is not a knowledge-base path": the index
    folder is not a knowledge-base path, and the line sent the user looking in the wrong place."""
    for argv in (("--index", "", "ask", "hi"), ("search", "port", "--index", "  ")):
        line = one_error_line(cli(*argv)[2])
        assert "argument --index: an empty path" in line and "knowledge-base" not in line, line


def test_11_read_file_serves_only_what_discovery_would_index(kb: Path) -> None:
    (kb / "server.key").write_text("-----BEGIN PRIVATE KEY-----\n", encoding="utf-8")
    (kb / "credentials").write_text("aws_secret_access_key=abc\n", encoding="utf-8")
    (kb / "node_modules").mkdir()
    (kb / "node_modules" / "x.md").write_text("vendored\n", encoding="utf-8")
    box = Toolbox(Settings.from_env())
    assert box.run(ToolCall("read_file", {"path": "docs/setup.md"}))[0].text.startswith("# Setup")
    for path in ("docs/server.key", "docs/credentials", "docs/node_modules/x.md", "server.key"):
        with pytest.raises(ToolError, match="not part of the knowledge base"):
            box.run(ToolCall("read_file", {"path": path}))


# -- 12. questions that are empty after cleaning, only punctuation, huge ------------------------

NO_EVIDENCE = "I couldn't find relevant information in the knowledge base to answer this question."


def cli_stdin(text: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err, io.StringIO(text))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("question", ["?!...", "--- ***", "the of and is", "\x00http://x.io\x00"])
def test_12_a_question_of_punctuation_or_stop_words_is_a_clean_answer(kb: Path, question: str) -> None:
    for argv, stdin in ((("ask", "-"), question), (("ask", question), ""), (("ask", "-", "--json"), question)):
        code, out, err = cli_stdin(stdin, *argv)
        assert code == 0, err
        # a URL names a page web_fetch (off) would fetch: the one note says so (docs/cli.md)
        said = "crag: note: the question names an http(s) URL, but web_fetch is off (set KB_AGENT_WEB_FETCH=on)\n"
        assert err == (said if "http" in question else "") and not CONTROL.search(out)
        text = json.loads(out)["answer"] if "--json" in argv else out
        assert text.startswith(NO_EVIDENCE) and "LLM Usage Stats" in text


@pytest.mark.parametrize("question", ["", " ", "\n\t \n", "\x85\x1c", "\x00", "\x00\x00\n", "\x01\x02\x03",
                                      "\x1b[31m", "\u200b", "\x00 \x7f"])
def test_12_a_blank_question_is_one_line_and_status_2(kb: Path, question: str) -> None:
    """Control characters, escape sequences and zero-width spaces alone are blank too: nothing to
    ask (they were answered with the no-evidence sentence, costing a real backend two calls)."""
    for argv, stdin in ((("ask", "-"), question), (("ask", question), "")):
        code, out, err = cli_stdin(stdin, *argv)
        assert code == 2 and not out
        assert "empty" in one_error_line(err)


def test_12_a_10k_character_question_is_answered(kb: Path) -> None:
    for question in ("which port does the server listen on " * 270, "x" * 10_000):
        code, out, err = cli_stdin(question, "ask", "-", "--json")
        assert code == 0, err
        result = json.loads(out)
        assert not [e for e in result["audit"] if e["event"] == "plan_call_rejected"]
    assert "docs/setup.md" in result["answer"] or result["answer"].startswith(NO_EVIDENCE)


def _answers_from_setup(srv: FakeOpenAIServer) -> None:
    """A model that routes simple, plans no call beyond the question's search and answers from setup.md
    (the offline backend sends no prompt, so it fits any window: the limits are a model's)."""
    srv.default("analyze_and_route", route("simple", "vector_search"))
    srv.default("plan", json.dumps({"tool_calls": []}))
    srv.default("synthesize", "The server listens on port 8080 by default [1].")


def test_12_a_question_at_the_context_limit_is_status_2_with_one_line(llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _answers_from_setup(llm)
    monkeypatch.setenv("KB_AGENT_CONTEXT_TOKENS", "2048")
    code, _, err = cli_stdin("which port does the server listen on " * 300, "ask", "-")
    assert code == 2 and "KB_AGENT_CONTEXT_TOKENS" in one_error_line(err)
    code, out, err = cli_stdin("which port does the server listen on " * 100, "ask", "-")  # no room for evidence
    assert code == 2 and "no room for its evidence" in one_error_line(err) and not out
    code, out, err = cli_stdin("which port does the server listen on " * 50, "ask", "-")  # fits: answered
    assert code == 0, err
    assert "docs/setup.md:L4" in out and "unsupported" not in out


def test_12_a_question_too_long_for_chat_is_one_line_and_the_session_goes_on(llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    _answers_from_setup(llm)
    monkeypatch.setenv("KB_AGENT_CONTEXT_TOKENS", "2048")
    lines = ["which port " * 1000, "\x00\x01", "which port does the server listen on?", ""]
    code, out, err = cli_stdin("\n".join(lines), "chat")
    assert code == 0, err
    too_long, blank = err.splitlines()  # a line of control characters alone is refused as empty, and the session goes on
    assert "KB_AGENT_CONTEXT_TOKENS" in one_error_line(too_long) and blank == "crag: error: the question is empty"
    assert out.count("LLM Usage Stats") == 1 and "docs/setup.md:L4" in out and "crag> " not in out


def test_12_chat_without_a_usable_index_fails_at_its_start_like_ask(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (("ask", "which port?"), ("chat",)):  # a damaged index
        DAMAGE["garbage in the FAISS file, same size"](kb)
        code, out, err = cli_stdin("which port?\n", *argv)
        assert code == 1 and not out
        assert "damaged" in one_error_line(err)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(kb.parent / "no-index"))
    for argv in (("ask", "which port?"), ("chat",)):
        code, out, err = cli_stdin("which port?\n", *argv)
        assert code == 1 and not out
        assert "no index" in one_error_line(err)


def _strict_stdin(data: bytes) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="strict")  # as under most locales


def test_12_standard_input_that_is_not_utf8_is_one_line_not_a_traceback(kb: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["ask", "-"], out, err, _strict_stdin(b"which port \xff\xfe does it use?")) == 2
    assert "not UTF-8" in one_error_line(err.getvalue()) and not out.getvalue()
    out, err = io.StringIO(), io.StringIO()  # chat: that line is refused, the next one answered
    assert main(["chat"], out, err, _strict_stdin(b"caf\xe9 port?\nwhich port does the server listen on?\n")) == 0
    assert "not UTF-8" in one_error_line(err.getvalue())
    assert out.getvalue().count("LLM Usage Stats") == 1 and "docs/setup.md:L4" in out.getvalue()


def test_12_bytes_that_are_not_utf8_in_a_history_or_a_plan_still_reach_the_server(llm: FakeOpenAIServer,
                                                                                  tmp_path: Path) -> None:
    # Python keeps such bytes as lone surrogates, which UTF-8 cannot encode: a history file's
    # "\udce9" escape and a planner's query reach the server as U+FFFD. A question given as such
    # bytes on the command line is a usage error, as on standard input: nothing is asked.
    llm.default("analyze_and_route", route("simple", "vector_search"))
    llm.default("plan", plan(("vector_search", {"query": "server port \udcff"})))
    llm.default("synthesize", "The server listens on port 8080 [1].")
    history = tmp_path / "history.json"
    history.write_text(json.dumps([{"role": "user", "content": "caf\udce9?"}]), encoding="utf-8")
    for argv in (("ask", "which port \udcff does it use?"), ("ask", "\udcff\udcfe", "--history", str(history), "--json")):
        code, out, err = cli(*argv)
        assert (code, out) == (2, "") and "the question is not UTF-8 text" in one_error_line(err), err
    assert not llm.requests
    code, out, err = cli("ask", "which port does it use?", "--history", str(history), "--json")
    assert code == 0, err
    assert "port 8080" in out and not CONTROL.search(out)
    sent = json.dumps([r.body for r in llm.requests])
    assert "\\ufffd" in sent and "\\udc" not in sent


def test_12_a_history_file_nested_too_deeply_is_one_line(kb: Path, tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000, encoding="utf-8")
    code, out, err = cli("ask", "which port?", "--history", str(deep))
    assert code == 2 and not out and "--history" in one_error_line(err)


@pytest.mark.parametrize("argv", [("ask", "-"), ("ask", "--history", "/dev/zero", "which port?"), ("chat",)])
def test_12_endless_input_is_refused_before_tokenizing_within_memory(kb: Path, argv: tuple[str, ...]) -> None:
    # `ask - < /dev/zero` reached 6.1 GB in 10 s, `ask --history /dev/zero` 7.5 GB in 20 s.
    import resource

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with open("/dev/zero", "rb") as zero:
        run = subprocess.run([sys.executable, "-m", "crag", *argv], stdin=zero, capture_output=True, text=True,
                             env=env, timeout=60)
    assert run.returncode == 2 and "more than" in one_error_line(run.stderr.split("you> ")[-1]), run.stderr
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 1024 * 1024  # KiB: under 1 GB


def test_12_a_question_longer_than_any_window_is_refused_before_tokenizing(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A 300 MB question took over 60 s and 14.7 GB before a refusal: tokenizing what can never fit.
    from crag import Agent
    from crag.errors import UsageError

    monkeypatch.setenv("KB_AGENT_CONTEXT_TOKENS", "1024")  # at most 128 x 1024 characters
    code, _, err = cli_stdin("which port? " * 20000, "ask", "-")
    assert code == 2 and "is over 131,072 characters" in one_error_line(err)
    with Agent.from_env() as agent:
        with pytest.raises(UsageError, match=r"the question is 300,000,000 characters, more than can fit "
                                             r"KB_AGENT_CONTEXT_TOKENS=1024 \(131,072 characters at most\)"):
            agent.ask("a" * 300_000_000)
        # Turns older than what could ever fit are left out before counting, as the budget would.
        old = [{"role": "user", "content": "x " * 200_000}, {"role": "assistant", "content": "ok"}]
        answer = agent.ask("which port does the server listen on?", history=[*old, {"role": "user", "content": "hi"}])
        assert "8080" in answer.answer


@pytest.mark.parametrize("argv", [("search", "server port", "--json"), ("ask", "which port?"), ("roots",)])
def test_12_a_reader_that_stops_reading_is_no_traceback(kb: Path, argv: tuple[str, ...]) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "crag", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)
    proc.stdout.close()  # as `| head -0` does, before crag writes anything
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


@pytest.mark.parametrize(("argv", "code", "said"), [
    (("ask", "-"), 2, "crag: error: the question read from standard input is empty\n"),
    (("chat",), 0, ""),
    (("mcp",), 2, "crag: error: standard input is closed: "),
])
def test_12_a_closed_standard_input_reads_as_empty_not_a_traceback(kb: Path, argv: tuple[str, ...], code: int,
                                                                   said: str) -> None:
    """``crag ask - <&-``, ``crag chat <&-`` and ``crag mcp <&-`` (started by a service with no
    input) were AttributeError tracebacks: Python has no sys.stdin when descriptor 0 is closed."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run(["sh", "-c", 'exec "$0" -m crag "$@" <&-', sys.executable, *argv],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == code and run.stderr.startswith(said) and run.stderr.count("\n") <= 1, run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


@pytest.mark.parametrize("argv", [("ask", "-"), ("chat",), ("mcp",)])
def test_12_a_standard_input_open_for_writing_only_is_one_line(kb: Path, argv: tuple[str, ...]) -> None:
    """``crag chat 0>/dev/null`` (descriptor 0 open, but not for reading) was an OSError
    traceback (EBADF) from ``ask -``, ``chat`` and, inside the MCP SDK, ``mcp``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run(["sh", "-c", 'exec "$0" -m crag "$@" 0>/dev/null', sys.executable, *argv],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and run.stdout == "", run.stderr
    assert run.stderr.startswith("crag: error: standard input cannot be read") and run.stderr.count("\n") == 1, \
        run.stderr


@pytest.mark.parametrize(("setting", "code"), [("KB_AGENT_TOP_KK=3", 0), ("KB_AGENT_INDEX_DIR=nowhere", 1),
                                               ("KB_AGENT_TOP_K=0", 2)])
def test_12_a_closed_standard_error_keeps_the_status_and_stdout_clean(kb: Path, setting: str, code: int) -> None:
    """With ``2>&-`` a warning was an AttributeError (status 1, no result) and an error line
    went to standard output, into the JSON a script reads."""
    name, _, value = setting.partition("=")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), name: value}
    run = subprocess.run(["sh", "-c", 'exec "$0" -m crag search port --json 2>&-', sys.executable],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == code, run.stdout
    if code == 0:
        assert json.loads(run.stdout)[0]["path"] == "docs/setup.md"
    else:
        assert run.stdout == ""


# -- 13. bodies crag cannot decode, streams cut mid-answer --------------------------------------


def completion_body(content: bytes) -> bytes:
    """A chat completion whose message content is ``content`` (bytes as they are)."""
    head = json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "CONTENT"}}]})
    return head.encode().replace(b"CONTENT", content)


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def delta(text: str | None = None, finish: str | None = None) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}]}


ANSWER_EVENTS = [delta("The server listens "), delta("on port 8080 [1]."), delta(finish="stop")]


@pytest.mark.parametrize(("body", "said"), [
    (completion_body(b"port \xff\xfe 8080"), "sent a body that is not UTF-8 text"),
    (b"[" * 2000 + b"]" * 2000, "sent a body nested more than 64 levels deep"),
    (completion_body(b'port 8080"' + b', "x": ' + b"[" * 2000 + b"]" * 2000 + b', "y": "'),
     "sent a body nested more than 64 levels deep"),
])
def test_13_a_200_reply_crag_cannot_decode_is_one_line_in_ask_and_chat(llm: FakeOpenAIServer, body: bytes,
                                                                      said: str) -> None:
    # UnicodeDecodeError and RecursionError tracebacks from the openai SDK; chat died.
    llm.default("analyze_and_route", route("simple", "vector_search"))
    llm.default("plan", plan(("vector_search", {"query": "server port"})))
    llm.script("synthesize", Garbage(body))
    code, _, err = cli("ask", "which port does the server listen on?")
    assert code == 1 and said in one_error_line(err) and "for node synthesize" in err
    events = sse(delta("The server "), body[: len(body) // 2] if body.startswith(b"[") else body, b"[DONE]")
    llm.script("synthesize", Events(events), "The server listens on port 8080 [1].")
    code, out, err = cli_stdin("which port does the server listen on?\nwhich port again?\n", "chat")
    assert code == 0 and ("not UTF-8 text" in err or "levels deep" in err), err
    assert out.count("port 8080") >= 1  # the session went on to the next question


@pytest.mark.parametrize("cut", range(1, len(ANSWER_EVENTS) + 1))  # (no event at all: a server ignoring stream=True)
def test_13_a_stream_cut_before_its_finish_is_said_not_passed_off_as_an_answer(llm: FakeOpenAIServer, cut: int) -> None:
    # A server that sent part of the answer and closed without finish_reason or [DONE]: chat
    # printed the fragment and the usage block as if it were the answer, and exited 0.
    llm.default("analyze_and_route", route("simple", "vector_search"))
    llm.default("plan", plan(("vector_search", {"query": "server port"})))
    events = ANSWER_EVENTS[:cut] if cut < len(ANSWER_EVENTS) else [*ANSWER_EVENTS, b"[DONE]"]
    llm.script("synthesize", Events(sse(*events)))
    code, out, err = cli_stdin("which port does the server listen on?\n", "chat")
    assert code == 0
    if cut == len(ANSWER_EVENTS):
        assert "port 8080" in out and "LLM Usage Stats" in out and err == ""
    else:
        assert "LLM Usage Stats" not in out
        line = err.strip().splitlines()[-1]
        assert line.startswith("crag: error: ") and "ended the answer's stream before it was finished for node " \
            "synthesize (no finish_reason and no [DONE])" in line, err


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=12), at=st.integers(0, 400), depth=st.integers(0, 300), cut=st.integers(0, 2000),
       stream=st.booleans())
def test_13_any_server_body_bytes_depth_or_cut_point_is_an_answer_or_one_line(
    llm: FakeOpenAIServer, junk: bytes, at: int, depth: int, cut: int, stream: bool
) -> None:
    llm.default("analyze_and_route", route("simple", "vector_search"))
    llm.default("plan", plan(("vector_search", {"query": "server port"})))
    nested = b"[" * depth + b"]" * depth
    if stream:
        body = sse(delta("The server listens "), delta("on port 8080 [1]."), delta(finish="stop"), b"[DONE]")
        body = body[: at % (len(body) + 1)] + junk + nested + body[at % (len(body) + 1):]
        llm.script("synthesize", Events(body[: max(cut, 1)]))
        code, out, err = cli_stdin("which port does the server listen on?\n", "chat")
        assert code == 0 and "Traceback" not in err
        assert not err or err.strip().splitlines()[-1].startswith("crag: error: LLM server ")
    else:
        body = completion_body(b"The server listens on port 8080 [1].")
        body = body[: at % (len(body) + 1)] + junk + nested + body[at % (len(body) + 1):]
        llm.script("synthesize", Garbage(body[: max(cut, 1)] if cut < len(body) else body))
        code, out, err = cli("ask", "which port does the server listen on?")
        assert code in (0, 1)
        if code:
            assert "LLM server " in one_error_line(err)
        else:
            assert "LLM Usage Stats" in out


@pytest.mark.parametrize("opening", ["```sh", "~~~"])
def test_13_an_answer_cut_inside_a_code_block_has_the_block_closed_and_cited(llm: FakeOpenAIServer, kb: Path,
                                                                             opening: str) -> None:
    # A reply stopped by its budget mid-code left the block open: crag's marker for the block
    # went inside it, read as code and never cited, and a Markdown reader showed the notes,
    # footer and usage block as code.
    (kb / "run.md").write_text("# Run\n\nStart the server:\n\n```sh\nservice start --port 8080\n"
                               "service status\n```\n", encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    llm.script("analyze_and_route", route("simple", "vector_search"))
    llm.script("plan", plan())
    code_lines = "service start --port 8080\nservice status"
    llm.script("synthesize", Text(f"Start the server [1]:\n\n{opening}\n{code_lines}", finish_reason="length"))
    code, out, err = cli("ask", "--json", "How do I start the server?")
    assert code == 0, err
    result = json.loads(out)
    closing = opening[:3]
    assert f"{opening}\n{code_lines}\n{closing}\n" in result["body"]
    marker = result["body"].split(f"{code_lines}\n{closing}", 1)[1].split()[0]
    assert re.fullmatch(r"\[\d\]", marker) and int(marker[1]) <= len(result["citations"]), result["body"]
    assert {(c["path"], c["line"]) for c in result["citations"]} >= {("docs/run.md", 5)}
    assert result["grounding"]["unsupported"] == []

    llm.script("analyze_and_route", route("simple", "vector_search"))
    llm.script("plan", plan())
    llm.script("synthesize", Text(f"Start the server [1].\n\n{opening}", finish_reason="length"))
    code, out, err = cli("ask", "--json", "How do I start the server?")
    assert code == 0 and opening not in json.loads(out)["answer"], out  # an empty block opened last goes


# -- the property: hostile names, .env files and server replies ------------------------------

SECRET = "sk-prop-Secret-0123456789"


@contextlib.contextmanager
def _sandbox(env: dict[str, str]):
    """A fresh working directory and crag environment for one drawn example."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for key in list(os.environ):
                if key.startswith(("KB_AGENT_", "OPENAI_", "JIRA_", "CONFLUENCE_")):
                    del os.environ[key]
            os.environ.update(env, KB_AGENT_INDEX_DIR=os.path.join(tmp, "index"))
            os.chdir(tmp)
            yield Path(tmp)
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)


def _check_run(code: int, out: str, err: str) -> None:
    assert code in (0, 1, 2)
    if code:
        one_error_line(err)
    assert SECRET not in out + err
    assert not CONTROL.search(out + err)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(hostile_file_name, min_size=1, max_size=3, unique=True), dotenv=hostile_dotenv(),
       reply=hostile_reply, doc=hostile_reply)
def test_hostile_names_dotenv_and_replies_never_traceback_leak_or_lose_the_index(
    names: list[bytes], dotenv: bytes, reply: str, doc: str
) -> None:
    with FakeOpenAIServer() as srv, _sandbox({"KB_AGENT_LLM": "offline"}) as tmp:
        docs = tmp / "docs"
        docs.mkdir()
        (docs / "setup.md").write_text(SETUP, encoding="utf-8")
        assert cli("index", "docs")[0] == 0
        for name in names:
            _write_bytes_name(docs, name, f"# Note\n\nThe server listens {doc} on port 8080.\n")
        _check_run(*cli("index", "docs"))
        Path(".env").write_bytes(dotenv.replace(b"OPENAI_API_KEY=", b"OPENAI_API_KEY=" + SECRET.encode() + b"x", 1))
        os.environ.update(KB_AGENT_LLM="openai", OPENAI_BASE_URL=srv.base_url, OPENAI_API_KEY=SECRET,
                          KB_AGENT_LLM_MAX_RETRIES="0", KB_AGENT_LLM_TIMEOUT="5")
        srv.default("analyze_and_route", route("simple", "vector_search"))
        srv.default("plan", plan(("vector_search", {"query": "server port"})))
        srv.default("synthesize", reply + " The server listens on port 8080 [1]. " + SECRET)
        for argv in (("ask", "which port does the server listen on?"), ("ask", "server port", "--json"),
                     ("search", "server port"), ("search", "server port", "--json")):
            code, out, err = cli(*argv)
            _check_run(code, out, err)
            if "--json" in argv and code == 0:
                json.loads(out)
        os.remove(".env")
        os.environ["KB_AGENT_LLM"] = "offline"
        code, out, err = cli("search", "server listens port", "--json")  # the index is still there and usable
        assert code == 0, err
        assert "docs/setup.md" in [hit["path"] for hit in json.loads(out)]
