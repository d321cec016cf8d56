"""The answer log (``crag.answer_log``, ``crag log``): every ask, chat turn and MCP ask kept in
``log.sqlite`` beside the index, found again by ``crag log``, carried on by ``ask -c`` and
``chat --continue``, and nothing kept with ``KB_AGENT_LOG=off`` or holding a secret."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest

from crag.answer_log import MIGRATIONS, SCHEMA_VERSION, AnswerLog
from crag.cli import main
from tests.fakes import clean_env
from tests.openai_server import FakeOpenAIServer

SETUP = "# Setup\n\nThe server listens on port 8080 by default.\n\n## Backups\n\nA backup is kept for thirty days.\n"


def cli(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err, io.StringIO(stdin) if stdin is not None else None)
    return code, out.getvalue(), err.getvalue()


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


def test_chat_turns_are_logged_and_chat_continue_picks_up_the_conversation(project: Path) -> None:
    code, _, _ = cli("chat", stdin="Which port does the server listen on?\n\n")
    assert code == 0
    code, out, _ = cli("chat", "--continue", stdin="How long is a backup kept?\n\n")
    assert code == 0 and "1 earlier question" in out
    entries = json.loads(cli("log", "--json")[1])
    assert [e["source"] for e in entries] == ["chat", "chat"]
    assert entries[0]["conversation"] == entries[1]["conversation"]


def test_log_off_keeps_nothing(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_AGENT_LOG", "off")
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    assert not (project / ".crag" / "log.sqlite").exists()
    code, out, _ = cli("log")
    assert code == 0 and "no logged answers" in out and "KB_AGENT_LOG=off" in out


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
    assert [v for (v,) in db.execute("SELECT version FROM migrations")] == [1]
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"conversations", "answers", "citations", "node_usage", "migrations"} <= tables
    db.execute("INSERT INTO migrations VALUES (99, 'from the future', 0)")
    db.commit()
    db.close()
    with AnswerLog(str(tmp_path)) as log, pytest.raises(Exception, match="newer crag"):
        log._open()


def test_a_damaged_log_is_one_line_and_never_costs_an_answer(project: Path) -> None:
    (project / ".crag" / "log.sqlite").write_bytes(b"this is not a database" * 100)
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 0 and "8080" in out
    assert err.startswith("crag: note: the answer log ") and err.count("\n") == 1
    code, _, err = cli("log")
    assert code == 1 and err.startswith("crag: error: the answer log ") and err.count("\n") == 1
