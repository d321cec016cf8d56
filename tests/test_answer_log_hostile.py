"""The answer log against what a demanding user does to it: placeholder keys, credentials
pasted into questions and echoed back, readers left open in a pager, ``--history -``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes import clean_env, cli

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


@pytest.mark.parametrize("key", ["null", "true", "false", "8192"])
def test_a_placeholder_key_spelled_like_json_leaves_the_logged_settings_readable(
        project: Path, monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    """A local server's key may be any word (``OPENAI_API_KEY=null``): masked in the settings'
    JSON text, it turned ``"show_usage": true`` into ``"show_usage": ***`` and every answer
    was listed ``[damaged: settings]``."""
    monkeypatch.setenv("OPENAI_API_KEY", key)
    assert cli("ask", "Which port does the server listen on?")[0] == 0
    code, out, err = cli("log")
    assert code == 0 and "damaged" not in out, out + err
    entry = json.loads(cli("log", "--json")[1])[0]
    assert "damaged" not in entry and entry["settings"]["show_usage"] is True
    assert entry["settings"]["context_tokens"] == 8192 and entry["settings"]["embedder"] == "hash"


def test_a_reader_left_waiting_on_its_output_never_holds_up_an_answer_being_logged(project: Path) -> None:
    """``crag log --json | less`` stops reading at the pager's first page; its read of the log
    held SQLite's lock meanwhile, so every ``ask`` waited ten seconds and then lost its entry
    ("database is locked"). Entries are read in batches, the lock let go between them."""
    import sqlite3

    from crag.answer_log import AnswerLog

    for n in range(3):
        assert cli("ask", f"Which port does the server listen on, try {n}?")[0] == 0
    with AnswerLog(str(project / ".crag")) as log:
        reading = log.iter_entries(limit=None)
        assert next(reading).question.endswith("try 2?")  # a reader part way, its output blocked
        writer = sqlite3.connect(project / ".crag" / "log.sqlite", timeout=0)  # no waiting: locked is an error
        with writer:
            writer.execute("INSERT INTO conversations (started, source) VALUES (0, 'ask')")
        writer.close()
        assert [e.question[-6:] for e in reading] == ["try 1?", "try 0?"]  # the rest, as before


PASTED = {  # what a user pastes into a question, and the value that must not reach the log file
    "JIRA_API_TOKEN=ATATT3xFfGF0T1234abcdEFGH": "ATATT3xFfGF0T1234abcdEFGH",
    "OPENAI_API_KEY=sk-proj-Pasted0123456789abc": "sk-proj-Pasted0123456789abc",
    "aws_access_key_id = AKIAIOSFODNN7EXAMPLE": "AKIAIOSFODNN7EXAMPLE",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    '"client_secret": "8Q~abc123DEF456ghi"': "8Q~abc123DEF456ghi",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx1y2z3Q\nZmFrZWtleWJvZHkxMjM0\n-----END RSA PRIVATE KEY-----":
        "MIIEowIBAAKCAQEAx1y2z3Q",
    # tokens pasted bare, named by their shape alone, and a password said in words
    "ghp_Unconf0123456789abcdefABCDEFxyz": "ghp_Unconf0123456789abcdefABCDEFxyz",
    "hf_Unconf0123456789abcdefABCDEFxyz0": "hf_Unconf0123456789abcdefABCDEFxyz0",
    "sk-proj-Unconf0123456789abcdefXYZ0123": "sk-proj-Unconf0123456789abcdefXYZ0123",
    "xoxb-123456789012-abcdefABCDEF": "xoxb-123456789012-abcdefABCDEF",
    "glpat-Unconf0123456789abcdEF": "glpat-Unconf0123456789abcdEF",
    "glptt-Unconf0123456789abcdEFgh": "glptt-Unconf0123456789abcdEFgh",  # GitLab's other tokens: trigger,
    "gldt-Unconf0123456789abcdEFgh": "gldt-Unconf0123456789abcdEFgh",  # deploy,
    "glrt-Unconf0123456789abcdEFgh": "glrt-Unconf0123456789abcdEFgh",  # runner
    "npm_Unconf0123456789abcdefABCDEFxyz01234": "npm_Unconf0123456789abcdefABCDEFxyz01234",
    "sk_live_Unconf0123456789abcdefAB": "sk_live_Unconf0123456789abcdefAB",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U":
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "my password is Xy7unconfigured99,": "Xy7unconfigured99",
}


@pytest.mark.parametrize("pasted", list(PASTED))
def test_a_credential_pasted_into_a_question_is_not_kept_in_the_log(project: Path, pasted: str) -> None:
    """docs/cli.md: nothing secret is logged. A token after its variable's name
    (``JIRA_API_TOKEN=``: the name's underscore hid the word ``TOKEN``), an AWS key and a
    private key block were written to ``log.sqlite`` as pasted."""
    question = f"Which port does the server listen on? I set {pasted} and the key word stays."
    assert cli("ask", question)[0] == 0
    raw = (project / ".crag" / "log.sqlite").read_bytes()
    assert PASTED[pasted].encode() not in raw
    entry = json.loads(cli("log", "--json")[1])[0]
    assert "***" in entry["question"] and entry["question"].endswith("and the key word stays.")


@pytest.mark.parametrize("words", ["glpat-style-personal-access-token-names", "gldt-deploy-token-naming-rules",
                                   "hf_hub_download_repository_to_local_dir", "xoxb-slack-bot-token-scopes"])
def test_words_that_open_like_a_token_are_kept_in_the_log_as_written(project: Path, words: str) -> None:
    """A token's prefix opening hyphenated words or an identifier (``glpat-style-...``, a
    function ``hf_hub_download_...``) was logged as ``***``, in the answer quoting the document
    and in the question: a real token holds digits or capital letters, words do not."""
    (project / "docs" / "tokens.md").write_text(f"# Tokens\n\nThe runbook calls them {words} everywhere.\n")
    assert cli("index", "docs")[0] == 0
    code, out, err = cli("ask", f"What does the runbook call {words}?")
    assert code == 0 and f"calls them {words} everywhere" in out, out + err
    entry = json.loads(cli("log", "--json")[1])[0]
    assert entry["question"] == f"What does the runbook call {words}?"
    assert f"calls them {words} everywhere" in entry["answer"], entry["answer"]


def test_a_credential_the_answer_repeats_bare_is_not_kept_in_the_log(project: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A bearer token or a URL's password in the question was masked there, but an answer that
    repeats it without its ``Bearer`` (a model echoing it, the refusal naming the question's
    words) kept it in the log."""
    from tests.openai_server import FakeOpenAIServer

    token, password, placed = "abcDEF1234567890xyz", "pass1234word", "ghp_History0123456789abcdefABCDEF01"
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        srv.default("analyze_and_route", json.dumps({"complexity": "chitchat", "suggested_tools": []}))
        srv.default("synthesize", f"Your token {token[:3]}{token[3:]} and {password} and {placed} look fine.")
        history = project / "history.json"
        history.write_text(json.dumps([{"role": "user", "content": f"my GITHUB_TOKEN={placed}"},
                                       {"role": "assistant", "content": "Noted."}]))
        question = f"Does Authorization: Bearer {token} work against https://ada:{password}@wiki.example.com?"
        code, out, err = cli("ask", "--history", str(history), question)
    assert code == 0 and token in out, err  # what ask prints is the user's, as written
    raw = (project / ".crag" / "log.sqlite").read_bytes()
    for secret in (token, password, placed):
        assert secret.encode() not in raw, secret
    entry = json.loads(cli("log", "--json")[1])[0]
    assert entry["answer"].startswith("Your token *** and *** and *** look fine.")


def test_a_server_error_echoing_credentials_shows_none_of_them(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error body is a place where a credential can only be one (docs/safety.md): one that
    echoed the caller's environment (``JIRA_API_TOKEN=...``), an AWS key id or a private key
    printed them on the error line."""
    from tests.openai_server import FakeOpenAIServer, Status

    echoed = ("denied: JIRA_API_TOKEN=ATATT3xFfGF0T1234abcdEFGH AKIAIOSFODNN7EXAMPLE "
              "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\n-----END PRIVATE KEY-----")
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        srv.default("*", Status(401, body=json.dumps({"error": {"message": echoed}})))
        code, _, err = cli("ask", "Which port does the server listen on?")
    assert code == 1 and err.startswith("crag: error: ") and err.count("\n") == 1, err
    for secret in ("ATATT3xFfGF0T1234abcdEFGH", "AKIAIOSFODNN7EXAMPLE", "MIIEvQIBADANBgkqhkiG9w0B"):
        assert secret not in err, err
    assert "denied: JIRA_API_TOKEN=***" in err


def test_history_dash_reads_the_turns_from_standard_input(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ask -`` reads the question from standard input; ``--history -`` said "--history file -
    does not exist". It reads the turns from there; both from standard input is a usage error."""
    from tests.openai_server import FakeOpenAIServer

    turns = json.dumps([{"role": "user", "content": "my name is Ada"}, {"role": "assistant", "content": "Hello Ada."}])
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        srv.default("analyze_and_route", json.dumps({"complexity": "chitchat", "suggested_tools": []}))
        srv.default("synthesize", "You are Ada.")
        code, out, err = cli("ask", "--history", "-", "what is my name?", stdin=turns)
        assert code == 0 and "You are Ada." in out, err
        sent = json.dumps([r for r in srv.requests if r.node == "synthesize"][-1].body["messages"])
        assert "my name is Ada" in sent and "Hello Ada." in sent
    code, _, err = cli("ask", "--history", "-", "-", stdin=turns)
    assert code == 2 and err.startswith("crag: error: ") and err.count("\n") == 1 and "standard input" in err
    code, _, err = cli("ask", "--history", "-", "what is my name?", stdin="not json")
    assert code == 2 and "--history (standard input) is not JSON" in err, err


def _conversation(folder: Path, turns: int) -> None:
    """A log whose one conversation has ``turns`` answers of 2 KB each."""
    import sqlite3

    from crag.answer_log import AnswerLog

    with AnswerLog(str(folder)) as log:
        log._open()
    db = sqlite3.connect(folder / "log.sqlite")
    db.execute("INSERT INTO conversations (id, started, source) VALUES (1, 0, 'chat')")
    answer = "The server listens on port 8080. " * 60
    db.executemany(
        "INSERT INTO answers (conversation_id, time, question, answer, body, model, iterations, llm_calls, "
        "prompt_tokens, completion_tokens, latency_ms, settings) VALUES (1, ?, ?, ?, ?, 'offline', 1, 0, 0, 0, 1.0, '{}')",
        [(1_700_000_000 + i, f"question {i}", answer, answer) for i in range(turns)])
    db.commit()
    db.close()


def test_continuing_a_long_conversation_reads_only_the_turns_that_can_be_used(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``ask -c`` after a chat of 200,000 turns took 850 MB: every turn was read, then all but
    the newest that fit the model's window were left out. Turns are read newest first and no
    further than the most a history can use."""
    import io
    import tracemalloc

    from crag.cli.log import last_conversation
    from crag.config import Settings

    clean_env(monkeypatch)
    peaks = []
    for turns in (300, 3000):
        folder = tmp_path / str(turns)
        folder.mkdir()
        _conversation(folder, turns)
        config = Settings(index_dir=str(folder), context_tokens=1024)  # 131,072 characters of history at most
        tracemalloc.start()
        conversation, history = last_conversation(config, io.StringIO())
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert conversation == 1 and history[-1]["content"].startswith("The server listens")
        assert history[-2]["content"] == f"question {turns - 1}" and history[0]["role"] == "user"
        assert 131_072 - 4_000 < sum(len(m["content"]) for m in history) <= 131_072  # the newest whole turns that fit
    assert peaks[1] < 2 * peaks[0], peaks


def test_a_history_file_that_is_not_utf8_says_so_in_words(project: Path) -> None:
    """A Latin-1 history file was "cannot be read: 'utf-8' codec can't decode byte 0xe9 in
    position 30: invalid continuation byte"; it is said as the question read from standard
    input is: not UTF-8 text, and what to do."""
    history = project / "latin1.json"
    history.write_bytes('[{"role": "user", "content": "café"}]'.encode("latin-1"))
    code, _, err = cli("ask", "--history", str(history), "Which port?")
    assert code == 2 and err.count("\n") == 1, err
    assert "is not UTF-8 text (byte 0xe9 at offset 33): save it as UTF-8" in err and "codec" not in err


@pytest.mark.parametrize("var", ["AWS_SECRET_ACCESS_KEY", "DJANGO_SECRET_KEY", "DEPLOY_PRIVATE_KEY", "DB_PASSWD"])
def test_a_secret_key_in_the_environment_is_a_secret_of_everything_crag_shows_and_logs(
        project: Path, monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    """``AWS_SECRET_ACCESS_KEY`` and its kind are secrets as ``*_TOKEN`` is: a document holding
    the value printed it in ``search`` and the answer log kept it."""
    value = "wJalrXUtnFEMI0K7MDENGbPxRfiCYEXAMPLEKEY"
    (project / "docs" / "ops.md").write_text(f"# Ops\n\nThe deploy job signs uploads with {value} today.\n")
    assert cli("index", "docs")[0] == 0
    monkeypatch.setenv(var, value)
    code, out, err = cli("search", "deploy job signs uploads")
    assert code == 0 and "signs uploads with *** today" in out and value not in out, out + err
    assert cli("ask", f"Which deploy job signs uploads with {value}?")[0] == 0
    assert value.encode() not in (project / ".crag" / "log.sqlite").read_bytes()


def test_another_programs_database_where_the_log_belongs_says_to_move_it_away(project: Path) -> None:
    """A ``log.sqlite`` of someone else's (its own ``answers`` table) was "cannot be opened
    (table answers already exists); KB_AGENT_LOG=off stops logging": nothing said what to do
    to keep a log. It is said as for a damaged log."""
    import sqlite3

    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("CREATE TABLE answers (x)")
    db.execute("INSERT INTO answers VALUES (1)")
    db.commit()
    db.close()
    code, _, err = cli("log")
    assert code == 1 and err.count("\n") == 1 and "move it away to start a new log" in err, err
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 0 and "8080" in out and "crag: note: " in err and "move it away to start a new log" in err


@pytest.mark.parametrize("version", ["'20240101_init'", "NULL", "1.5", "x'01'"])
def test_a_migrations_table_of_another_program_says_to_move_the_log_away(project: Path, version: str) -> None:
    """A ``log.sqlite`` whose ``migrations`` table is another program's (a version named
    ``20240101_init``, or empty, or a fraction) was a traceback comparing it with crag's
    numbers, from ``crag log`` and after every answer, with exit status 1."""
    import sqlite3

    db = sqlite3.connect(project / ".crag" / "log.sqlite")
    db.execute("CREATE TABLE migrations (version, description TEXT, applied REAL)")
    db.execute(f"INSERT INTO migrations VALUES ({version}, 'init', 0)")
    db.commit()
    db.close()
    code, out, err = cli("log")
    assert code == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("crag: error: ") and "another program's" in err and "move it away to start a new log" in err
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 0 and "8080" in out and "crag: note: " in err and "move it away to start a new log" in err, err
    code, out, err = cli("ask", "-c", "And backups?")
    assert code == 1 and err.count("\n") == 1 and "move it away to start a new log" in err, err


def test_the_note_of_no_earlier_conversation_names_its_log_without_escape_sequences(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ask -c`` with no logged conversation names the log it looked in; a state folder whose
    name holds an escape sequence (``XDG_STATE_HOME``, before there is an index) reached the
    terminal raw, as ``crag log`` never lets it."""
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "st\x1b[31mRED"))
    code, _, err = cli("ask", "-c", "hello")
    assert code == 0 and "no earlier conversation in" in err, err
    assert "\x1b" not in err and "log.sqlite" in err
