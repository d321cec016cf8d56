"""The answer log (``crag.answer_log``, ``crag log``): every ask, chat turn and MCP ask kept in
``log.sqlite`` beside the index, found again by ``crag log``, carried on by ``ask -c`` and
``chat --continue``, and nothing kept with ``KB_AGENT_LOG=off`` or holding a secret."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from crag.answer_log import MIGRATIONS, SCHEMA_VERSION, AnswerLog
from crag.cli import main
from tests.fakes import clean_env, cli
from tests.openai_server import FakeOpenAIServer, NoUsage

SETUP = "# Setup\n\nThe server listens on port 8080 by default.\n\n## Backups\n\nA backup is kept for thirty days.\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "setup.md").write_text(SETUP, encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert cli("index", "docs")[0] == 0
    return tmp_path


def test_ask_is_logged_and_crag_log_lists_searches_and_shows_it_newest_first(project: Path) -> None:
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    assert cli("ask", "How long is a backup kept?")[0] == 0
    assert (project / ".crag" / "log.sqlite").is_file()  # beside the index

    code, out, _ = cli("log")
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("#")]
    assert "How long is a backup kept?" in lines[0] and "Which port" in lines[1]  # newest first

    code, out, _ = cli("log", "port")
    assert code == 0 and "Which port" in out and "backup is kept" not in out

    code, out, _ = cli("log", "--json")
    entries = json.loads(out)
    assert [e["question"] for e in entries] == ["How long is a backup kept?", "Which port does the server listen on?"]
    first = entries[1]
    assert "8080" in first["answer"] and "LLM Usage Stats" in first["answer"] and "LLM Usage Stats" not in first["body"]
    assert first["citations"][0]["path"] == "docs/setup.md" and first["citations"][0]["line"] == 3
    assert first["model"] == "offline" and set(first["usage"]["by_node"]) >= {"analyze_and_route", "synthesize"}
    assert first["settings"]["max_iterations"] == 3 and first["time"].endswith("+00:00")

    code, out, _ = cli("log", "--show", str(first["id"]))
    assert code == 0 and "you> Which port does the server listen on?" in out and "[1] docs/setup.md:L3" in out
    assert cli("log", "--show", "999")[0] == 2
    code, out, _ = cli("log", "--show", "LAST")  # as typed in capitals, it is still the newest answer
    assert code == 0 and "you> How long is a backup kept?" in out


def test_ask_continue_carries_on_the_last_conversation(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        srv.default("analyze_and_route", json.dumps({"complexity": "chitchat", "suggested_tools": []}))
        srv.default("synthesize", "Hello there.")
        assert cli("ask", "hello, my name is Ada")[0] == 0
        assert cli("ask", "-c", "what is my name?")[0] == 0
        last = [r for r in srv.requests if r.node == "synthesize"][-1]
        sent = json.dumps(last.body["messages"])
        assert "my name is Ada" in sent and "Hello there." in sent  # the earlier turn went along
        assert cli("ask", "a new question")[0] == 0  # without -c: a new conversation
        sent = json.dumps([r for r in srv.requests if r.node == "synthesize"][-1].body["messages"])
        assert "Ada" not in sent
    entries = json.loads(cli("log", "--json")[1])
    assert entries[1]["conversation"] == entries[2]["conversation"] != entries[0]["conversation"]


def test_ask_continue_says_so_when_not_even_the_newest_turn_fits(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the newest turns that fit the model's window are carried on; when not even the newest
    one fits (a long question pasted, a smaller KB_AGENT_CONTEXT_TOKENS since), ``ask -c`` sent
    the question with no earlier turn at all and said nothing, as if it carried the conversation on."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    monkeypatch.setenv("KB_AGENT_CONTEXT_TOKENS", "1024")  # 131,072 characters of history at most
    for argv in (("ask", "-c", "How long is a backup kept?"), ("chat", "--continue")):
        db = sqlite3.connect(project / ".crag" / "log.sqlite")
        db.execute("UPDATE answers SET answer = answer || ? WHERE id = (SELECT max(id) FROM answers)", ("z" * 140_000,))
        db.commit()
        db.close()
        code, _, err = cli(*argv, stdin="How long is a backup kept?\n")
        assert code == 0 and ("crag: note: the last conversation's newest turn is longer than "
                              "KB_AGENT_CONTEXT_TOKENS=1024 can fit; carrying it on without its earlier turns\n") in err, err
        assert "earlier question(s)" not in err
    entries = json.loads(cli("log", "--json")[1])
    assert len({e["conversation"] for e in entries}) == 1


def test_chat_turns_are_logged_and_chat_continue_picks_up_the_conversation(project: Path) -> None:
    code, _, _ = cli("chat", stdin="Which port does the server listen on?\n\n")
    assert code == 0
    code, out, err = cli("chat", "--continue", stdin="How long is a backup kept?\n\n")
    assert code == 0 and "1 earlier question" in err and "earlier question" not in out  # a note: stderr
    entries = json.loads(cli("log", "--json")[1])
    assert [e["source"] for e in entries] == ["chat", "chat"]
    assert entries[0]["conversation"] == entries[1]["conversation"]


def test_chat_on_a_pipe_prints_the_answers_alone(project: Path) -> None:
    """SPEC §4: on a pipe, chat prints only the result: no banner, prompt or lead on stdout,
    and nothing but error lines on stderr when a script sends the questions."""
    code, out, err = cli("chat", stdin="Which port does the server listen on?\nHow long is a backup kept?\n\n")
    assert code == 0 and err == ""
    assert "you> " not in out and "crag> " not in out and "crag chat" not in out
    first, second = out.split("\n\n---\n")[:2]
    assert first.startswith("Composed offline") and out.count("LLM Usage Stats") == 2
    assert "\n\nComposed offline" in second  # a blank line between the two answers


def test_a_log_that_cannot_be_written_is_one_note_a_chat_session(project: Path) -> None:
    """Every answer is printed; the note that the log cannot be written came after each answer
    of the session, the same line again and again."""
    (project / ".crag" / "log.sqlite").mkdir()  # what stands where the log belongs (root too cannot write it)
    code, out, err = cli("chat", stdin="Which port does the server listen on?\nHow long is a backup kept?\nwhy?\n")
    assert code == 0 and out.count("LLM Usage Stats") == 3 and "8080" in out and "thirty days" in out
    assert err.startswith("crag: note: the answer log ") and "is not a file" in err and err.count("\n") == 1, err
    code, out, err = cli("ask", "Which port does the server listen on?")  # each ask says it
    assert code == 0 and "8080" in out and err.startswith("crag: note: the answer log ") and err.count("\n") == 1


class _Unwritable(io.StringIO):
    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def write(self, text: str) -> int:
        raise self.error


@pytest.mark.parametrize(("error", "status"), [(BrokenPipeError(32, "Broken pipe"), 141),
                                               (OSError(28, "No space left on device"), 1)])
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_an_answer_whose_output_cannot_be_written_is_still_logged(project: Path, error: OSError, status: int,
                                                                  json_flag: list[str]) -> None:
    """``crag ask ... | head -1`` whose reader went before the answer was written, or ``> /dev/full``:
    the answer was made (and its tokens paid for), yet ``crag log`` and ``ask -c`` never saw it."""
    err = io.StringIO()
    assert main(["ask", "Which port does the server listen on?", *json_flag], _Unwritable(error), err) == status
    entries = json.loads(cli("log", "--json")[1])
    assert [e["question"] for e in entries] == ["Which port does the server listen on?"]
    assert "8080" in entries[0]["body"]


@pytest.mark.parametrize(("error", "status"), [(BrokenPipeError(32, "Broken pipe"), 141),
                                               (OSError(28, "No space left on device"), 1)])
def test_a_chat_answer_whose_output_cannot_be_written_is_still_logged(project: Path, error: OSError,
                                                                      status: int) -> None:
    """``crag chat | head -1`` or ``crag chat > /dev/full``: the answer was made and paid for, as
    ``ask``'s above, yet it was lost to ``crag log`` and to ``chat --continue``."""
    err = io.StringIO()
    stdin = io.StringIO("Which port does the server listen on?\n\n")
    assert main(["chat"], _Unwritable(error), err, stdin) == status
    entries = json.loads(cli("log", "--json")[1])
    assert [(e["question"], e["source"]) for e in entries] == [("Which port does the server listen on?", "chat")]
    assert "8080" in entries[0]["body"]


@pytest.mark.parametrize("ending", ["exit", "QUIT", " /quit ", ":q"])
def test_a_line_saying_exit_ends_chat_and_is_never_asked(project: Path, ending: str) -> None:
    code, out, _ = cli("chat", stdin=f"Which port does the server listen on?\n{ending}\nHow long is a backup kept?\n")
    assert code == 0 and out.count("LLM Usage Stats") == 1
    assert [e["question"] for e in json.loads(cli("log", "--json")[1])] == ["Which port does the server listen on?"]


def test_log_off_keeps_nothing(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_AGENT_LOG", "off")
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    assert not (project / ".crag" / "log.sqlite").exists()
    code, out, _ = cli("log")
    assert code == 0 and "no logged answers" in out and "KB_AGENT_LOG=off" in out
    # -c said only that there was nothing to continue, not what to do about it
    line = ("crag: error: KB_AGENT_LOG=off keeps no conversation to continue: leave -c/--continue out, "
            "or set KB_AGENT_LOG=on\n")
    assert cli("ask", "-c", "Which port does the server listen on?") == (2, "", line)
    assert cli("chat", "--continue", stdin="Which port does the server listen on?\n") == (2, "", line)
    assert not (project / ".crag" / "log.sqlite").exists()


def test_log_off_says_so_when_it_lists_answers_logged_before(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md: "`off` keeps nothing and `crag log` says so". With answers logged while it
    was on, ``crag log`` listed them and said nothing, so the answer just given seemed lost."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    monkeypatch.setenv("KB_AGENT_LOG", "off")
    assert cli("ask", "How long is a backup kept?")[0] == 0
    for argv in (("log",), ("log", "--json"), ("log", "--show", "last")):
        code, out, err = cli(*argv)
        assert code == 0 and "Which port" in out and "backup" not in out, argv
        assert "KB_AGENT_LOG=off" in err and "not logged" in err, (argv, err)
    assert json.loads(cli("log", "--json")[1])[0]["question"] == "Which port does the server listen on?"


def test_the_log_holds_no_secret(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-log-Secret-0123456789"
    (project / "docs" / "keys.md").write_text(f"# Keys\n\nThe deploy key is {key} for the deploy job.\n")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://user:Hunter2Pw@127.0.0.1:9/v1")
    assert cli("ask", "--kb", "docs", f"What is the deploy key {key}?")[0] == 0
    raw = (project / ".crag" / "log.sqlite").read_bytes()
    assert key.encode() not in raw and b"Hunter2Pw" not in raw
    entry = json.loads(cli("log", "--json")[1])[0]
    assert "openai_api_key" not in entry["settings"] and "***" in entry["question"]


def test_migrations_are_numbered_and_recorded(tmp_path: Path) -> None:
    assert [m[0] for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1)) and len(MIGRATIONS) == SCHEMA_VERSION
    with AnswerLog(str(tmp_path)) as log:
        assert log.entries() == []
        log.last_conversation()
    assert not (tmp_path / "log.sqlite").exists()  # reading an absent log creates nothing
    with AnswerLog(str(tmp_path)) as log:
        log._open()
    db = sqlite3.connect(tmp_path / "log.sqlite")
    assert [v for (v,) in db.execute("SELECT version FROM migrations")] == list(range(1, SCHEMA_VERSION + 1))
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"conversations", "answers", "citations", "node_usage", "migrations"} <= tables
    db.execute("INSERT INTO migrations VALUES (99, 'from the future', 0)")
    db.commit()
    db.close()
    with AnswerLog(str(tmp_path)) as log, pytest.raises(Exception, match="newer crag"):
        log._open()


def test_a_log_from_a_newer_crag_says_to_upgrade_and_costs_no_answer(project: Path) -> None:
    """A log a newer crag migrated further was refused with "KB_AGENT_LOG=off stops logging"
    alone, which does nothing for ``crag log``: the line says to upgrade crag, as a newer
    index's does. The answer is given all the same and the log is left as it was."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("INSERT INTO migrations VALUES (?, 'from the future', 0)", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    line = (f"the answer log .crag/log.sqlite cannot be opened (it was written by a newer crag (schema "
            f"{SCHEMA_VERSION + 1}, this crag knows {SCHEMA_VERSION})); upgrade crag, or KB_AGENT_LOG=off stops logging\n")
    assert cli("log") == (1, "", f"crag: error: {line}")
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 0 and "8080" in out and err == f"crag: note: {line}"
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    assert db.execute("SELECT count(*) FROM answers").fetchone() == (1,)
    db.close()


def test_the_log_says_which_token_counts_crag_estimated_as_ask_json_does(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply without usage is counted by crag, and ``ask --json`` says so (``estimated_calls``);
    ``crag log --json`` gave the same figures as if the server had reported them."""
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        srv.default("analyze_and_route", json.dumps({"complexity": "chitchat", "suggested_tools": []}))
        srv.default("synthesize", NoUsage("Hello there."))
        code, out, _ = cli("ask", "--json", "hello")
    asked = json.loads(out)["usage"]
    logged = json.loads(cli("log", "--json")[1])[0]["usage"]
    assert code == 0 and asked["estimated_calls"] == logged["estimated_calls"] == 1
    assert asked["by_node"]["synthesize"]["estimated_calls"] == logged["by_node"]["synthesize"]["estimated_calls"] == 1
    assert "estimated_calls" not in asked["by_node"]["analyze_and_route"]
    assert "estimated_calls" not in logged["by_node"]["analyze_and_route"]


def test_the_log_list_and_show_say_the_tokens_crag_estimated_as_the_usage_block_does(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``crag log`` and ``--show`` gave an answer's counted tokens as if the server had reported them."""
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        srv.default("analyze_and_route", json.dumps({"complexity": "chitchat", "suggested_tools": []}))
        srv.default("synthesize", NoUsage("Hello there."))
        assert cli("ask", "hello")[0] == 0
        srv.default("synthesize", "Hello again.")
        assert cli("ask", "hello again")[0] == 0
    estimated, reported = json.loads(cli("log", "--json")[1])[::-1]
    listed = [line for line in cli("log")[1].splitlines() if "cited" in line]
    assert listed[0].endswith(f"(0 cited, {reported['usage']['total_tokens']:,} tokens)")
    assert listed[1].endswith(f"(0 cited, {estimated['usage']['total_tokens']:,} tokens, estimated for 1 of 2 calls)")
    shown_estimated = cli("log", "--show", str(estimated["id"]))[1].splitlines()[1]
    assert f"2 LLM calls, {estimated['usage']['total_tokens']:,} tokens (estimated for 1 of 2 calls), " in shown_estimated
    assert f"2 LLM calls, {reported['usage']['total_tokens']:,} tokens, " in cli("log", "--show", "last")[1]


def test_a_log_of_the_first_schema_is_migrated_and_its_answers_read(tmp_path: Path) -> None:
    from crag.answer_log_schema import statements

    db = sqlite3.connect(tmp_path / "log.sqlite")
    db.execute("CREATE TABLE migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied REAL NOT NULL)")
    for statement in statements(MIGRATIONS[0][2]):
        db.execute(statement)
    db.execute("INSERT INTO migrations VALUES (1, 'first', 0)")
    db.execute("INSERT INTO conversations VALUES (1, 0, 'ask')")
    db.execute("INSERT INTO answers VALUES (1, 1, 0, 'q', 'a', 'a', 'm', 'simple', NULL, 1, 2, 30, 4, 5.0, '{}')")
    db.execute("INSERT INTO node_usage VALUES (1, 'synthesize', 2, 30, 4, 0, 5.0)")
    db.commit()
    db.close()
    with AnswerLog(str(tmp_path)) as log:
        (entry,) = log.entries()
    assert entry.usage["by_node"] == {"synthesize": {"calls": 2, "prompt_tokens": 30, "completion_tokens": 4,
                                                     "cached_tokens": 0, "latency_ms": 5.0}}
    assert "estimated_calls" not in entry.usage and not entry.damaged
    db = sqlite3.connect(tmp_path / "log.sqlite")
    assert [v for (v,) in db.execute("SELECT version FROM migrations")] == list(range(1, SCHEMA_VERSION + 1))
    db.close()


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="root writes every file")
def _logged_by_an_older_crag(project: Path) -> Path:
    """One question asked, and the log it went to turned into an older crag's (schema 1)."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    log = project / ".crag" / "log.sqlite"
    db = sqlite3.connect(log)
    db.execute("DELETE FROM migrations WHERE version > 1")
    db.execute("ALTER TABLE node_usage DROP COLUMN estimated_calls")
    db.commit()
    db.close()
    return log


def test_an_older_crags_log_that_cannot_be_written_is_read_as_it_is(project: Path) -> None:
    """An older crag's log (schema 1) in a folder this user may not write (a teammate's index)
    could not be migrated, so ``crag log`` failed with "attempt to write a readonly database"
    (exit 1) and ``ask -c`` too, with nothing to write. It is read as it is; only logging the
    new answer fails, as a note."""
    import subprocess
    import sys

    log = _logged_by_an_older_crag(project)
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps",
              "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    if prefix and subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("root writes every file, and may not give that up here")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def crag(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, sys.executable, "-m", "crag", *argv], capture_output=True, text=True,
                              env=env, timeout=120)

    log.chmod(0o444)
    log.parent.chmod(0o555)
    try:
        listed, asked = crag("log", "--json"), crag("ask", "-c", "How long is a backup kept?")
    finally:
        log.parent.chmod(0o755)
        log.chmod(0o644)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert entry["question"] == "Which port does the server listen on?" and "estimated_calls" not in entry["usage"]
    assert asked.returncode == 0 and "thirty days" in asked.stdout
    assert "cannot be written" in asked.stderr and "cannot be opened" not in asked.stderr, asked.stderr


def test_an_older_crags_log_on_a_full_disk_is_read_as_it_is(project: Path) -> None:
    """An older crag's log (schema 1) that a full disk (here a file size limit) keeps from being
    migrated could not be read at all, as a read-only one could not: ``crag log`` failed with
    "disk I/O error" (exit 1), ``ask -c`` too. It is read as it is; logging fails as a note."""
    import resource
    import subprocess
    import sys

    _logged_by_an_older_crag(project)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def crag(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "crag", *argv], capture_output=True, text=True, env=env,
                              timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)))

    listed, asked = crag("log", "--json"), crag("ask", "-c", "How long is a backup kept?")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert json.loads(listed.stdout)[0]["question"] == "Which port does the server listen on?"
    assert asked.returncode == 0 and "thirty days" in asked.stdout
    assert "cannot be written" in asked.stderr and "cannot be opened" not in asked.stderr, asked.stderr


def _open_log_at(folder: str, barrier, results) -> None:  # a process of its own, as a second crag is
    barrier.wait()
    try:
        with AnswerLog(folder) as log:
            log._open()
        results.put("opened")
    except Exception as exc:  # the test shows what went wrong
        results.put(repr(exc))


def test_processes_opening_a_new_log_at_once_all_open_it(tmp_path: Path) -> None:
    """Two crag processes answering at once on an index with no log yet (two MCP servers, a
    script running asks in parallel) both migrate the new file: the second must find the
    tables the first made, not fail with "table conversations already exists" and lose its answer."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    for trial in range(6):
        folder = tmp_path / f"log{trial}"
        folder.mkdir()
        barrier, results = context.Barrier(4), context.Queue()
        workers = [context.Process(target=_open_log_at, args=(str(folder), barrier, results)) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert [results.get(timeout=5) for _ in workers] == ["opened"] * 4
        db = sqlite3.connect(folder / "log.sqlite")
        assert [v for (v,) in db.execute("SELECT version FROM migrations")] == list(range(1, SCHEMA_VERSION + 1))
        db.close()


def test_a_damaged_log_is_one_line_and_never_costs_an_answer(project: Path) -> None:
    (project / ".crag" / "log.sqlite").write_bytes(b"this is not a database" * 100)
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 0 and "8080" in out
    assert err.startswith("crag: note: the answer log ") and err.count("\n") == 1
    code, _, err = cli("log")
    assert code == 1 and err.startswith("crag: error: the answer log ") and err.count("\n") == 1



def test_a_damaged_log_says_what_to_do_about_it(project: Path) -> None:
    """SPEC §4: an error line says what went wrong and what to do. ``crag log`` of a damaged
    file said only "KB_AGENT_LOG=off stops logging" (no help to read it), and of a file
    missing its tables nothing at all."""
    log = project / ".crag" / "log.sqlite"
    log.write_bytes(b"this is not a database" * 100)
    code, _, err = cli("log")
    assert code == 1 and "file is not a database" in err and "move it away to start a new log" in err, err
    log.unlink()
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    db = sqlite3.connect(log)
    db.execute("DROP TABLE citations")
    db.commit()
    db.close()
    for argv in (("log",), ("log", "--json"), ("log", "--show", "last")):
        code, out, err = cli(*argv)
        assert code == 1 and "no such table" in err and "move it away to start a new log" in err, (argv, err)
    code, out, err = cli("ask", "Which port does the server listen on?")  # an answer all the same
    assert code == 0 and "8080" in out and err.startswith("crag: note: ") and "KB_AGENT_LOG=off" in err, err

# -- secrets: one finder for output, the log and --json ------------------------------------

GITHUB_TOKEN = "ghp_Log0123456789abcdefABCDEF0123456789"
OPENAI_KEY = "sk-proj-LogKey0123456789abcdef"


def test_no_configured_secret_reaches_the_log_file_or_a_later_crag_log(project: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.setenv("GITHUB_TOKEN", GITHUB_TOKEN)  # no crag setting, but a token all the same
    monkeypatch.setenv("KB_AGENT_EMBEDDING_BASE_URL", "http://emb:embpw@127.0.0.1:9/v1")  # short: masked anyway
    code, out, err = cli("ask", f"Which port does the server listen on, with {GITHUB_TOKEN} and {OPENAI_KEY}?")
    assert code == 0, err
    raw = (project / ".crag" / "log.sqlite").read_bytes()
    for secret in (GITHUB_TOKEN, OPENAI_KEY, "embpw"):
        assert secret.encode() not in raw, secret
    for var in ("OPENAI_API_KEY", "GITHUB_TOKEN", "KB_AGENT_EMBEDDING_BASE_URL"):
        monkeypatch.delenv(var)  # a later `crag log` knows no secret: the file must hold none
    code, out, _ = cli("log", "--json")
    entry = json.loads(out)[0]
    assert code == 0 and entry["question"].count("***") == 2 and "8080" in entry["answer"]
    assert entry["settings"]["embedding_base_url"] == "http://emb:***@127.0.0.1:9/v1"
    assert GITHUB_TOKEN not in out and OPENAI_KEY not in out and "embpw" not in out


def test_a_store_password_is_a_secret_of_the_settings_the_log_and_every_label() -> None:
    from crag.answer_log import logged_settings
    from crag.cli.common import index_label
    from crag.config import Settings

    settings = Settings(store="postgresql://u:pgsecret@db/x", embedding_base_url="http://e:embpw@h/v1")
    assert {"pgsecret", "embpw"} <= set(settings.secrets())
    assert index_label(settings) == "postgresql://u:***@db/x"
    logged = json.dumps(logged_settings(settings))
    assert "pgsecret" not in logged and "embpw" not in logged and "postgresql://u:***@db/x" in logged


def test_no_path_is_among_the_logged_settings() -> None:
    """docs/cli.md: "Keys, tokens, e-mail addresses and paths are not among the logged
    settings." The local embedder's model folder (``KB_AGENT_EMBEDDING_PATH``, a path in the
    user's home) was logged with every answer."""
    from crag.answer_log import logged_settings
    from crag.config import Settings

    logged = logged_settings(Settings(index_dir="/home/alice/.crag", embedding_path="/home/alice/models/minilm"))
    assert "/home/alice" not in json.dumps(logged)
    assert {"index_dir", "embedding_path"}.isdisjoint(logged) and logged["embedder"] == "hash"


def test_a_placeholder_key_leaves_the_words_of_documents_alone(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "docs" / "ollama.md").write_text(
        "# Local models\n\nStart ollama with `ollama serve` on the workstation.\n"
        "Of the old scripts none are employed any more.\n", encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    for key, words in (("ollama", "Start ollama with `ollama serve`"), ("none", "none are employed")):
        monkeypatch.setenv("OPENAI_API_KEY", key)  # what a local server is given: a word, not a secret
        code, out, err = cli("search", "start ollama serve workstation old scripts employed")
        assert code == 0 and words in out, out + err
        code, out, err = cli("search", "--json", "start ollama serve workstation old scripts employed")
        assert code == 0 and any(words in hit["text"] for hit in json.loads(out))
    code, out, err = cli("ask", "How do I start ollama?")
    assert code == 0 and "`ollama serve`" in out
    assert "`ollama serve`" in json.loads(cli("log", "--json")[1])[0]["answer"]


# -- crag log: arguments and damaged rows ----------------------------------------------------


@pytest.mark.parametrize("argv", [("--show", "²"), ("--show", "1" * 23), ("--show", "-1"), ("caf\udce9",),
                                  ("-n", "0"), ("-n", "x")])
def test_a_bad_log_argument_is_a_usage_error(project: Path, argv: tuple[str, ...]) -> None:
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    code, out, err = cli("log", *argv)
    assert code == 2 and out == "" and err.startswith("crag: error: ") and err.count("\n") == 1, err


def test_a_huge_limit_lists_everything(project: Path) -> None:
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    code, out, err = cli("log", "-n", "9" * 20)
    assert code == 0 and "Which port" in out, err
    code, out, err = cli("log", "-n", "9" * 20, "--json")
    assert code == 0 and len(json.loads(out)) == 1


def test_damaged_rows_are_shown_as_damaged(project: Path) -> None:
    for question in ("Which port does the server listen on?", "How long is a backup kept?", "Where are backups?"):
        assert cli("ask", question)[0] == 0
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("UPDATE answers SET settings = 'not json {' WHERE id = 1")
    db.execute("UPDATE answers SET time = 1e20, prompt_tokens = 'many' WHERE id = 2")
    db.execute("UPDATE citations SET line = 'x' WHERE answer_id = 3")
    db.commit()
    db.close()
    code, out, err = cli("log")
    assert code == 0 and err == "" and out.count("[damaged:") == 3, out + err
    assert "[damaged: time, usage]" in out and "[damaged: settings]" in out and "[damaged: citations]" in out
    code, out, err = cli("log", "--json")
    entries = {e["id"]: e for e in json.loads(out)}
    assert code == 0 and entries[1]["settings"] is None and entries[1]["damaged"] == ["settings"]
    assert entries[2]["time"] is None and entries[2]["usage"]["total_tokens"] is None
    assert "damaged" not in entries[3] or entries[3]["damaged"] == ["citations"]
    for answer_id in ("1", "2", "3"):
        code, out, err = cli("log", "--show", answer_id)
        assert code == 0 and "damaged: " in out and "you> " in out, out + err



def test_a_text_cell_that_is_not_utf8_is_shown_not_an_error(project: Path) -> None:
    """A question or a citation holding bytes that are not UTF-8 (written by another tool)
    failed every listing: "cannot be read (Could not decode to UTF-8 column 'question' ...)"."""
    for question in ("Which port does the server listen on?", "How long is a backup kept?"):
        assert cli("ask", question)[0] == 0
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("UPDATE answers SET question = CAST(X'576869636820ff20706f72743f' AS TEXT) WHERE id = 1")  # Which \xff port?
    db.execute("UPDATE citations SET path = CAST(X'646f63732fff2e6d64' AS TEXT) WHERE answer_id = 1")  # docs/\xff.md
    db.commit()
    db.close()
    for argv in (("log",), ("log", "--show", "1"), ("log", "port")):
        code, out, err = cli(*argv)
        assert code == 0 and err == "" and "Which \ufffd port?" in out, (argv, out, err)
    code, out, err = cli("log", "--json")
    entries = {e["id"]: e for e in json.loads(out)}
    assert entries[1]["question"] == "Which \ufffd port?" and entries[1]["citations"][0]["path"] == "docs/\ufffd.md"
    code, out, err = cli("log", "backup")
    assert code == 0 and "backup is kept" in out, err
    code, out, err = cli("ask", "-c", "and the port?")
    assert code == 0, err


def test_a_logged_turn_whose_cell_is_not_text_is_carried_on_not_a_history_error(project: Path) -> None:
    """A question or answer cell holding a number or bytes (another tool wrote it): ``crag log``
    shows it, but ``ask -c`` failed with "history message 1 must be an object with string
    fields" (exit 2), and ``chat --continue`` failed every question of its session with it."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("UPDATE answers SET question = 12345, answer = X'506f7274ff2038303830' WHERE id = 1")  # Port\xff 8080
    db.commit()
    db.close()
    code, out, err = cli("ask", "-c", "How long is a backup kept?")
    assert code == 0 and "thirty days" in out and err == "", err
    code, out, err = cli("chat", "--continue", stdin="And the port?\nHow long is a backup kept?\n")
    assert code == 0 and out.count("LLM Usage Stats") == 2 and "crag: error" not in err, err
    assert "2 earlier question(s)" in err


def test_a_newest_answer_whose_conversation_is_damaged_is_carried_on_alone(project: Path) -> None:
    """``ask -c`` when the newest answer's conversation cell is not a number (``crag log`` marks
    it ``[damaged: conversation]``) ended in a ValueError traceback. That answer is carried on,
    in a conversation of its own."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("UPDATE answers SET conversation_id = 'abc' WHERE id = 1")
    db.commit()
    db.close()
    code, out, err = cli("ask", "-c", "why?")
    assert code == 0 and "8080" in out and err == "", err  # "why?" read with the question it follows
    code, out, err = cli("chat", "--continue", stdin="How long is a backup kept?\n")
    assert code == 0 and "thirty days" in out and "1 earlier question(s)" in err and "crag: error" not in err, err
    entries = json.loads(cli("log", "--json")[1])
    assert [e["conversation"] for e in entries[:2]] == [entries[1]["conversation"]] * 2 and entries[2]["damaged"]


def test_a_conversation_deleted_by_hand_is_carried_on_and_logged(project: Path) -> None:
    """The conversation's row deleted in the sqlite3 shell (which does not cascade to its
    answers): every ``ask -c`` and ``chat --continue`` turn failed to be logged, "FOREIGN KEY
    constraint failed", for good. The conversation is made again and the answer kept."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("DELETE FROM conversations")
    db.commit()
    db.close()
    code, out, err = cli("ask", "-c", "How long is a backup kept?")
    assert code == 0 and "thirty days" in out and err == "", err
    code, out, err = cli("chat", "--continue", stdin="why?\n")
    assert code == 0 and "2 earlier question(s)" in err and "crag: note: the answer log" not in err, err
    entries = json.loads(cli("log", "--json")[1])
    assert len(entries) == 3 and {e["conversation"] for e in entries} == {1} and entries[0]["source"] == "ask"


# -- crag log: bounded memory -----------------------------------------------------------------


class _Sink(io.TextIOBase):
    """A stdout that keeps nothing but the count of what it was given."""

    def __init__(self) -> None:
        self.chars = 0

    def write(self, text: str) -> int:
        self.chars += len(text)
        return len(text)


def _fill(path: Path, n: int) -> None:
    with AnswerLog(str(path)) as log:
        db = log._open()
    db = sqlite3.connect(path / "log.sqlite")
    db.execute("INSERT INTO conversations (id, started, source) VALUES (1, 0, 'ask')")
    answer = "The server listens on port 8080. " * 60  # 2 KB an answer
    db.executemany(
        "INSERT INTO answers (conversation_id, time, question, answer, body, model, iterations, llm_calls, "
        "prompt_tokens, completion_tokens, latency_ms, settings) VALUES (1, ?, ?, ?, ?, 'offline', 1, 0, 0, 0, 1.0, '{}')",
        [(1_700_000_000 + i, f"question {i}", answer, answer) for i in range(n)])
    db.commit()
    db.close()


@pytest.mark.parametrize("argv", [("log", "--json"), ("log", "-n", "100000")])
def test_crag_log_streams_memory_does_not_grow_with_the_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                argv: tuple[str, ...]) -> None:
    import tracemalloc

    clean_env(monkeypatch)
    peaks, written = [], []
    for n in (300, 3000):
        folder = tmp_path / str(n)
        folder.mkdir()
        _fill(folder, n)
        monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(folder))
        sink = _Sink()
        tracemalloc.start()
        code = main([*argv], sink, io.StringIO())
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert code == 0
        written.append(sink.chars)
    assert written[1] > 9 * written[0]  # ten times the entries were all written...
    assert peaks[1] < 2 * peaks[0], peaks  # ...in about the same memory


def test_a_log_that_is_no_file_is_one_error_line_not_an_empty_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".crag").write_text("not a folder")
    code, out, err = cli("log")
    assert code == 1 and out == "" and err.count("\n") == 1 and "is not a folder" in err, out + err
    (tmp_path / ".crag").unlink()
    (tmp_path / ".crag" / "log.sqlite").mkdir(parents=True)
    code, out, err = cli("log", "--json")
    assert code == 1 and out == "" and err.startswith("crag: error: the answer log ") and "not a file" in err


def test_a_log_that_links_to_a_device_or_a_pipe_is_named_so(project: Path) -> None:
    """``log.sqlite -> /dev/full`` (a disk that is always full) was "a symbolic link to a file,
    not a folder": neither is what stands there. The line names where the link leads and what
    that is."""
    log, pipe = project / ".crag" / "log.sqlite", project / "pipe"
    os.mkfifo(pipe)
    for target, what in (("/dev/null", "a device"), (str(pipe), "a named pipe")):
        os.symlink(target, log)
        line = f"the answer log .crag/log.sqlite is a symbolic link to {target}, {what}: move it away to start a new log\n"
        assert cli("log") == (1, "", f"crag: error: {line}")
        code, out, err = cli("ask", "Which port does the server listen on?")
        assert code == 0 and "8080" in out and err == f"crag: note: {line}"
        log.unlink()


def test_crag_log_names_the_log_it_read_when_it_lies_outside_the_working_folder(
        project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``crag log`` in a subfolder read ``../.crag/log.sqlite`` (or the state folder's log)
    without a word, where the other commands say which index they used."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    code, _, err = cli("log")
    assert code == 0 and err == ""  # in the working folder: nothing to say
    monkeypatch.chdir(project / "docs")
    for argv in (("log",), ("log", "port"), ("log", "--json"), ("log", "--show", "last"), ("log", "-n", "1")):
        code, _, err = cli(*argv)
        assert code == 0 and err == f"crag: log {project / '.crag' / 'log.sqlite'}\n", (argv, err)
    code, out, err = cli("log", "nowhere")  # the line saying there is no such answer names the log
    assert code == 0 and err == "" and str(project / ".crag" / "log.sqlite") in out
    away = tmp_path_factory.mktemp("away")  # no index: the log of the user's state folder
    (away / "work").mkdir()
    monkeypatch.setenv("HOME", str(away))
    monkeypatch.setenv("XDG_STATE_HOME", str(away / "state"))
    monkeypatch.chdir(away / "work")
    code, out, err = cli("log")
    assert code == 0 and err == "" and str(away / "state" / "crag" / "log.sqlite") in out  # no log yet: named there
    assert cli("ask", "hello")[0] == 0
    code, _, err = cli("log")
    assert code == 0 and err == f"crag: log {away / 'state' / 'crag' / 'log.sqlite'}\n"


def test_crag_log_names_cited_files_relative_to_the_folder_it_runs_in(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log kept a citation's path as the question's folder named it (``docs/setup.md``), so
    ``crag log --json`` in a subfolder or a sibling named a file that is not there; SPEC §4: paths
    in ``--json`` are relative to the working directory when under it, absolute otherwise."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    (project / "sibling").mkdir()
    for folder, shown in ((project, "docs/setup.md"), (project / "docs", "setup.md"),
                          (project / "sibling", str(project / "docs" / "setup.md"))):
        monkeypatch.chdir(folder)
        code, out, _ = cli("--index", str(project / ".crag"), "log", "--json")
        assert code == 0 and json.loads(out)[0]["citations"][0]["path"] == shown, (folder, out)
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("UPDATE citations SET path = 'docs/setup.md'")  # as an older crag logged it
    db.commit()
    db.close()
    code, out, _ = cli("--index", str(project / ".crag"), "log", "--json")
    assert code == 0 and json.loads(out)[0]["citations"][0]["path"] == "docs/setup.md"  # its folder is not known


def test_a_file_where_the_state_folder_belongs_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no index folder the log is ``$XDG_STATE_HOME/crag/log.sqlite``; a file standing
    where a folder above it belongs (``XDG_STATE_HOME``, or ``~/.local/state``, is a file)
    made ``crag log`` say "no logged answers" while every answer's note said the log cannot
    be opened. The note says what ``crag log`` says, not the system's "[Errno 20] Not a
    directory"."""
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    (tmp_path / "state").write_text("a file, not a folder")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code, out, err = cli("ask", "hello")  # a greeting needs no index
    assert code == 0 and out.startswith("Hello")
    line = f"the answer log cannot be kept in {tmp_path / 'state' / 'crag'}: {tmp_path / 'state'} is not a folder\n"
    assert err == f"crag: note: {line}"
    code, out, err = cli("log")
    assert code == 1 and out == "" and err == f"crag: error: {line}"
    # XDG_STATE_HOME a symbolic link: "not a folder" said nothing of where it leads, as for .crag
    (tmp_path / "state").unlink()
    for target, what in (("nowhere", "a symbolic link to nothing"), ("state", "a symbolic link that leads round in "
                         "a loop"), ("notes.txt", "a symbolic link to a file, not a folder")):
        (tmp_path / "notes.txt").write_text("a file\n")
        os.symlink(target, tmp_path / "state")
        line = f"the answer log cannot be kept in {tmp_path / 'state' / 'crag'}: {tmp_path / 'state'} is {what}\n"
        assert cli("log") == (1, "", f"crag: error: {line}")
        code, out, err = cli("ask", "hello")
        assert code == 0 and err == f"crag: note: {line}" and not (tmp_path / "nowhere").exists()
        (tmp_path / "state").unlink()


def test_an_empty_log_file_is_read_as_no_answers_without_writing_to_it(project: Path) -> None:
    """An answer that could not be logged on a full disk leaves ``log.sqlite`` empty; reading it
    made crag's tables first, so ``crag log`` and ``ask -c`` failed with "database or disk is
    full" (exit 1) where there is nothing to read. They read no answers and write nothing."""
    log = project / ".crag" / "log.sqlite"
    log.write_bytes(b"")
    code, out, err = cli("log")
    assert code == 0 and out == "no logged answers in .crag/log.sqlite\n" and err == ""
    code, out, _ = cli("log", "--json")
    assert code == 0 and out == "[]\n"
    code, _, err = cli("ask", "-c", "Which port does the server listen on?")
    assert code == 0 and "no earlier conversation in .crag/log.sqlite" in err
    assert json.loads(cli("log", "--json")[1])[0]["question"] == "Which port does the server listen on?"
    log.write_bytes(b"")
    assert cli("log", "-n", "1")[0] == 0 and cli("log", "--show", "last")[0] == 2 and log.stat().st_size == 0


def test_a_new_log_that_a_full_disk_refuses_is_left_empty_and_the_note_says_why(project: Path) -> None:
    """The first write of a new log fails part way on a full disk (here a file that may not grow
    past 8 KiB), and SQLite rolls it back itself: crag's own ROLLBACK then failed with "cannot
    rollback - no transaction is active" in place of the disk's error, and the file kept the
    ``migrations`` table alone, so ``crag log`` and ``ask -c`` had to write to it (and failed
    again, exit 1). The note names the disk's error; the file is left empty and read as no answers."""
    import resource
    import subprocess
    import sys

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "crag", "ask", "Which port does the server listen on?"],
                          env=env, capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert proc.returncode == 0 and "8080" in proc.stdout
    assert "cannot be opened (disk I/O error)" in proc.stderr and "rollback" not in proc.stderr
    assert (project / ".crag" / "log.sqlite").stat().st_size == 0
    assert cli("log") == (0, "no logged answers in .crag/log.sqlite\n", "")
    code, _, err = cli("ask", "-c", "Which port does the server listen on?")
    assert code == 0 and "no earlier conversation" in err


def test_a_full_disk_is_said_with_what_to_do() -> None:
    from crag.answer_log import _remedy

    assert _remedy(sqlite3.OperationalError("database or disk is full"), ", or ") == "free some disk space, or "


def test_crag_log_strips_control_sequences_from_what_it_shows(project: Path) -> None:
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("UPDATE answers SET question = ?, model = ?", ("port\x1b]0;pwned\x07 \x1b[2J?", "m\x1b[31m"))
    db.commit()
    db.close()
    for argv in (("log",), ("log", "--show", "last")):
        code, out, _ = cli(*argv)
        assert code == 0 and "\x1b" not in out and "\x07" not in out and "port" in out
    code, out, _ = cli("log", "--json")
    assert "\x1b" not in out and json.loads(out)[0]["question"].startswith("port\x1b]0;pwned")


def test_a_password_with_symbols_in_a_question_is_not_kept_in_the_log(project: Path) -> None:
    """A password after "password" or "secret" was masked only up to its first character
    outside a token's (``&``, ``!``, ``@``, ``#``, ``$``): "Tr0ub4dor&3" was kept as "***&3",
    and "P@ssw0rd!2024" or "DB_PASSWORD=s3cr3t!pass#word" were kept whole. Words stay words."""
    question = ("Why is my password P@ssw0rd!2024 refused, when password: Tr0ub4dor&3 worked, DB_PASSWORD=s3cr3t!pass#word "
                "is set and the secret is $uper$ecret99? Is the password reset policy to blame?")
    code, _, err = cli("ask", question)
    assert code == 0, err
    raw = (project / ".crag" / "log.sqlite").read_bytes()
    for secret in (b"P@ssw0rd", b"0rd!2024", b"Tr0ub4dor", b"dor&3", b"s3cr3t", b"pass#word", b"uper$ecret99"):
        assert secret not in raw, secret
    entry = json.loads(cli("log", "--json")[1])[0]
    assert entry["question"] == ("Why is my password *** refused, when password: *** worked, DB_PASSWORD=*** "
                                 "is set and the secret is ***? Is the password reset policy to blame?")


def test_a_password_with_symbols_in_quotes_is_not_kept_in_the_log(project: Path) -> None:
    """A password written as code or quoted after "password" ("my password `P@ssw0rd!2024`")
    was logged as it was: the rule for a password with symbols began its value after the
    spaces only, and the quote stopped it."""
    question = "Why is my password `P@ssw0rd!2024` refused, when the password is 'Tr0ub4dor&3' at home?"
    code, _, err = cli("ask", question)
    assert code == 0, err
    raw = (project / ".crag" / "log.sqlite").read_bytes()
    assert b"P@ssw0rd" not in raw and b"Tr0ub4dor" not in raw
    entry = json.loads(cli("log", "--json")[1])[0]
    assert entry["question"] == "Why is my password `***` refused, when the password is '***' at home?"
    # punctuation at its end is the password's own before the closing quote: ")!" was left shown
    code, _, err = cli("ask", 'Why is my password `P@ss(w0rd)!` refused, and the secret "Tr0ub4dor&3."?')
    assert code == 0, err
    entry = json.loads(cli("log", "--json")[1])[0]
    assert entry["question"] == 'Why is my password `***` refused, and the secret "***"?'
    # so is a password whose one symbol is that punctuation: "`Summer2024!`" was kept whole
    code, _, err = cli("ask", 'Why is my password `Summer2024!` refused, and the password "Welcome1!"?')
    assert code == 0, err
    entry = json.loads(cli("log", "--json")[1])[0]
    assert entry["question"] == 'Why is my password `***` refused, and the password "***"?'


def test_urls_paths_e_mails_and_code_after_password_are_kept_in_the_log(project: Path) -> None:
    """The rule that masks a password with symbols whole took any value holding one: a URL, a
    citation, an e-mail address, a call or a placeholder after "secret is" or "Password:" was
    kept as ``***`` (the citation's ``docs/auth.md:L40`` lost, ``hash_v2(pw, salt)`` kept as
    ``***, salt)``). They are no passwords, and are kept as written."""
    question = ("Is the secret https://vault.example.com/v1/secret/data/app?x=1&y=2 or Password: docs/auth.md:L40 "
                "or C:\\Users\\me\\pw2.txt, and the secret is admin2@example.com. Is password = hash_v2(pw, salt), "
                "secret: ${DB_PASS2} or secret: <your-secret-2>, and the secret is #general-2 on Slack?")
    code, _, err = cli("ask", question)
    assert code == 0, err
    assert json.loads(cli("log", "--json")[1])[0]["question"] == question


def test_credentials_written_in_a_question_are_not_kept_in_the_log(project: Path) -> None:
    question = ("Why does postgresql://admin:Hunter2Pass9@db/app refuse Authorization: Bearer abcDEF1234567890xyz "
                "and api_key=tok_0a1b2c3d4e when the token expires?")
    code, _, err = cli("ask", question)
    assert code == 0, err
    raw = (project / ".crag" / "log.sqlite").read_bytes()
    for secret in (b"Hunter2Pass9", b"abcDEF1234567890xyz", b"tok_0a1b2c3d4e"):
        assert secret not in raw, secret
    entry = json.loads(cli("log", "--json")[1])[0]
    assert entry["question"] == ("Why does postgresql://admin:***@db/app refuse Authorization: Bearer *** "
                                 "and api_key=*** when the token expires?")


@pytest.mark.parametrize("extra", [["deploy"], ["-n", "5"]])
def test_show_with_a_query_or_a_count_is_a_usage_error(project: Path, extra: list[str]) -> None:
    # `crag log --show 1 deploy` printed answer 1 and ignored the query without a word.
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    code, out, err = cli("log", "--show", "1", *extra)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--show prints one answer" in err


def test_a_log_search_ignores_case_beyond_ascii(project: Path) -> None:
    """``crag log über`` finds "Über welchen Port ...": SQLite's LIKE folds ASCII letters only,
    so a word with an umlaut, a Greek or a Cyrillic letter was found in one case alone."""
    assert cli("ask", "Über welchen Port läuft der Server?")[0] == 0
    for word in ("über", "ÜBER", "LÄUFT", "läuft", "PORT"):
        code, out, _ = cli("log", word)
        assert code == 0 and "Über welchen Port" in out, word
    code, out, _ = cli("log", "über", "backup")  # every word, still
    assert code == 0 and "Über welchen Port" not in out


def test_a_log_search_finds_an_accented_letter_however_it_was_typed(project: Path) -> None:
    """"é" is one character as a keyboard types it and "e" with a combining accent as text
    pasted from a PDF or a Mac's file name holds it: ``crag log café`` did not find a question
    written the other way, though both print alike."""
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert cli("ask", f"Where is the {decomposed} server?")[0] == 0
    assert cli("ask", f"Which port does the {composed.upper()} use?")[0] == 0
    for word in (composed, decomposed, decomposed.upper()):
        code, out, _ = cli("log", word)
        assert code == 0 and "server?" in out and "use?" in out, word
    code, out, _ = cli("log", "cafe")  # an accent is still a letter of its own
    assert code == 0 and "no logged answers matching" in out


def test_a_search_that_finds_nothing_names_the_query_as_it_was_typed(project: Path) -> None:
    """``crag log 'C:\\temp\\build'`` said "no logged answers matching 'C:\\\\temp\\\\build'": the
    query was shown as Python writes a string, each backslash doubled, not as it was typed."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    code, out, err = cli("log", "C:\\temp\\build", "O'Brien")
    assert (code, out, err) == (0, "no logged answers matching 'C:\\temp\\build O'Brien' in .crag/log.sqlite\n", "")


def test_a_log_search_reads_the_answers_text_not_its_usage_block_or_source_list(project: Path) -> None:
    """``crag log latency`` (or plan, tokens, the cited folder's name) listed every answer: each
    one's usage block and source list hold those words."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    for word in ("latency", "synthesize", "tokens", "docs"):
        code, out, _ = cli("log", word)
        assert code == 0 and "Which port" not in out, word
    code, out, _ = cli("log", "8080")  # the answer's own text is found
    assert code == 0 and "Which port" in out


def test_show_last_of_an_empty_log_says_the_log_is_empty(project: Path) -> None:
    """It said "no answer last in .crag/log.sqlite", as if "last" were an answer's number."""
    code, out, err = cli("log", "--show", "last")
    assert code == 2 and out == "" and err.startswith("crag: error: no logged answers in ") and "answer last" not in err
    code, out, err = cli("log", "--show", "7")
    assert code == 2 and err.startswith("crag: error: no answer 7 in "), err


def test_show_of_a_missing_answer_is_the_same_error_with_json(project: Path) -> None:
    """``crag log --show 7`` is a usage error naming answer 7; with ``--json`` it printed ``[]``
    and exit status 0, as if answer 7 were there and empty."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    for argv in (("--show", "7"), ("--show", "7", "--json")):
        code, out, err = cli("log", *argv)
        assert code == 2 and out == "" and err.startswith("crag: error: no answer 7 in "), (argv, out, err)
    code, out, _ = cli("log", "--show", "1", "--json")
    assert code == 0 and [e["id"] for e in json.loads(out)] == [1]


def test_a_query_of_many_words_is_searched_or_refused_in_one_line(project: Path) -> None:
    """``crag log`` with thousands of words failed as a damaged log would ("Expression tree is
    too large"); a word given twice counts once, and more distinct words than a search can
    take is a usage error, never advice to move the log away."""
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    code, out, err = cli("log", *["port"] * 5000)
    assert code == 0 and "Which port" in out, err
    code, out, err = cli("log", *[f"w{i}" for i in range(5000)])
    assert code == 2 and out == "" and err.startswith("crag: error: QUERY has 5,000 different words") and "move it" not in err
    assert err.count("\n") == 1


def test_the_postgresql_store_logs_in_the_state_folder_not_in_a_nearby_index_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KB_AGENT_INDEX_DIR is not used while KB_AGENT_STORE is set (docs/postgresql.md), so an
    embedded index folder that happens to be near (or named) never receives the database's answers:
    they go to the state folder, as docs/cli.md says, and ``crag log`` reads them there."""
    from crag.answer_log import log_folder
    from crag.config import Settings

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / ".crag").mkdir()
    settings = Settings.from_env(environ={"KB_AGENT_STORE": "postgresql://u@db/kb",
                                          "KB_AGENT_INDEX_DIR": str(tmp_path / ".crag")}, dotenv=None)
    assert Path(log_folder(settings)).parent == tmp_path / "state" / "crag" / "postgresql"
    embedded = Settings.from_env(environ={"KB_AGENT_INDEX_DIR": str(tmp_path / ".crag")}, dotenv=None)
    assert log_folder(embedded) == str(tmp_path / ".crag")


def test_a_log_damaged_part_way_keeps_the_json_read_before_it_valid(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of an old answer overwritten (a disk error, a crash of another tool): ``crag log
    --json`` printed the newer entries as an array with no end, which no JSON reader takes. The
    entries read stay a JSON array, the one error line says where reading stopped, exit 1."""
    clean_env(monkeypatch)
    _fill(tmp_path, 300)
    log = tmp_path / "log.sqlite"
    data = bytearray(log.read_bytes())
    page = data.index(b"question 10") // 4096 * 4096  # an old answer's page of the table, zeroed
    data[page : page + 4096] = bytes(4096)
    log.write_bytes(bytes(data))
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path))
    code, out, err = cli("log", "--json")
    entries = json.loads(out)
    assert code == 1 and len(entries) > 100 and entries[0]["question"] == "question 299", err
    last = entries[-1]["id"]
    assert err == (f"crag: error: the answer log {log} cannot be read past answer {last} (database disk image is "
                   "malformed); move it away to start a new log\n")
    code, out, err = cli("log", "-n", "1000")
    assert code == 1 and out.count("\n#") + out.startswith("#") == len(entries) and f"past answer {last} " in err


def test_each_postgresql_database_keeps_its_own_answer_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the embedded store every index folder holds its own log, so ``crag log`` and ``ask -c``
    see that knowledge base's answers only. With the PostgreSQL store all databases (one knowledge
    base each) and every answer given before an index existed shared one log: ``crag log`` on one
    database listed another's answers, and ``ask -c`` carried on a conversation about another
    knowledge base. Each database now has a log of its own in the state folder (chitchat needs no
    index, so no server is reached here)."""
    from crag.answer_log import log_folder
    from crag.config import Settings

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    first, second = "postgresql://crag:hunter2@127.0.0.1:1/kb_one", "postgresql://crag@127.0.0.1:1/kb_two"
    assert cli("ask", "hello")[0] == 0  # the embedded store, before there is an index
    monkeypatch.setenv("KB_AGENT_STORE", first)
    assert cli("ask", "good morning")[0] == 0
    monkeypatch.setenv("KB_AGENT_STORE", second)
    code, out, _ = cli("log")
    assert code == 0 and "good morning" not in out and "hello" not in out
    code, _, err = cli("ask", "-c", "thanks")
    assert code == 0 and "no earlier conversation" in err
    monkeypatch.setenv("KB_AGENT_STORE", first)
    code, out, _ = cli("log", "--json")
    assert [e["question"] for e in json.loads(out)] == ["good morning"]

    def folder(uri: str) -> str:
        return log_folder(Settings.from_env(environ={"KB_AGENT_STORE": uri}, dotenv=None))

    assert folder(first) == folder("postgresql://crag:other@127.0.0.1:1/kb_one")  # the password is not the database
    assert folder(first) == folder("postgresql://crag@127.0.0.1:1/kb_one?password=hunter2")
    assert folder(first) != folder(second) and "hunter2" not in folder(first)
