"""``crag chat`` as a demanding user drives it (docs/cli.md, "chat"): what a probe of the
session found, each test typing what a user typed, through the real command line and the
offline backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crag.cli.chat import HELP_TEXT
from tests.fakes import clean_env, cli

DOC = "# Backups\n\nBackups are kept for 30 days on the storage bucket.\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with docs indexed into its own ./.crag; the working directory is the project."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "backup.md").write_text(DOC, encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("index", "docs")
    assert code == 0, err
    return tmp_path


def logged_questions() -> list[str]:
    code, out, err = cli("log", "--json", "-n", "100")
    assert code == 0, err
    return [entry["question"] for entry in json.loads(out)]


@pytest.mark.parametrize("blank", ["   ", "\t", " \t \r"])
def test_a_line_of_only_spaces_is_an_empty_question_not_the_end_of_the_session(project: Path, blank: str) -> None:
    """docs/cli.md: a question of only spaces is empty, and "in chat such a line gets that line
    and the session goes on; an empty line still ends it". A stray space before Enter ended the
    session without a word, and the questions after it were never read."""
    code, out, err = cli("chat", stdin=f"how long are backups kept\n{blank}\nwhere are backups stored\n")
    assert code == 0
    assert err == "crag: error: the question is empty\n"
    assert out.count("LLM Usage Stats") == 2
    assert logged_questions() == ["where are backups stored", "how long are backups kept"]


def test_an_empty_line_still_ends_the_session(project: Path) -> None:
    for empty in ("\n", "\r\n"):
        code, out, err = cli("chat", stdin=f"how long are backups kept\n{empty}where are backups stored\n")
        assert (code, err, out.count("LLM Usage Stats")) == (0, "", 1)


def test_a_slash_word_is_a_command_never_a_question(project: Path) -> None:
    """"/help" was sent to the model as a question (three calls, an answer about the knowledge
    base); a chat user types it, and "/clear", to find out what the session takes."""
    code, out, err = cli("chat", stdin="/help\n/clear\nhow long are backups kept\n")
    assert code == 0
    assert err == "".join((HELP_TEXT, "crag: error: chat has no command /clear; /help says what it takes\n", HELP_TEXT))
    assert out.count("LLM Usage Stats") == 1
    assert logged_questions() == ["how long are backups kept"]


def test_typed_questions_are_edited_with_readline_when_the_answers_are_redirected(project: Path) -> None:
    """``crag chat > answers.md`` (or ``| tee``): the questions are typed at a terminal, so the
    arrow keys edit the line and Up recalls the last question (docs/cli.md, "chat"). With
    standard output redirected the line was read raw: Up typed ``^[[A`` into the question, which
    was then refused as empty."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items()}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), TERM="xterm")
    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "crag", "chat"], cwd=project, env=env, stdin=child_fd,
                            stdout=subprocess.PIPE, stderr=child_fd, close_fds=True)
    os.close(child_fd)
    seen = b""

    def read_until(count: int) -> None:  # until the terminal shows the ``you>`` prompt ``count`` times
        nonlocal seen
        deadline = time.monotonic() + 60  # a generous bound that only catches a hang
        while seen.count(b"you> ") < count and time.monotonic() < deadline:
            if select.select([main_fd], [], [], 0.2)[0]:
                try:
                    seen += os.read(main_fd, 65536)
                except OSError:
                    return

    try:
        read_until(1)
        os.write(main_fd, b"how long are backups kepr\x7ft\r")  # Backspace mends a typo
        read_until(2)
        os.write(main_fd, b"\x1b[A\r")  # Up, Enter: the same question again
        read_until(3)
        os.write(main_fd, b"\x04")  # Ctrl-D
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
    assert proc.returncode == 0, seen
    assert b"question is empty" not in seen and b"Traceback" not in seen
    assert out.decode().count("LLM Usage Stats") == 2 and "30 days" in out.decode()
    assert logged_questions() == ["how long are backups kept", "how long are backups kept"]


def test_crag_s_own_grounding_marks_in_earlier_answers_are_not_sent_to_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier answer goes with the next question as history. Its ``[unsupported]`` tags and
    crag's ``_Note: ... not supported ..._`` line went too, and a model that imitates what it
    sees wrote them into its next answer, where the copied tag marked a supported sentence and
    the copied note was judged as one more unsupported sentence. They are crag's marks, as the
    usage block is (SPEC §7: stripped from the history before any prompt)."""
    from tests.fakes import cli as run
    from tests.openai_server import FakeOpenAIServer, grades
    from tests.test_cli_ask import SETUP, plan, route, write

    write(tmp_path / "docs" / "setup.md", SETUP)
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert run("index", "docs")[0] == 0
    with FakeOpenAIServer() as srv:
        for name, value in (("KB_AGENT_LLM", "openai"), ("OPENAI_BASE_URL", srv.base_url),
                            ("OPENAI_API_KEY", "test-key"), ("KB_AGENT_MODEL", "test-model")):
            monkeypatch.setenv(name, value)
        srv.default("analyze_and_route", route("complex", "grep_search"))
        srv.default("plan", plan(("grep_search", {"pattern": "port"})))
        srv.default("grade_evidence", grades(rest=0.9))
        srv.script("synthesize", "The server listens on port 8080 by default [1]. It also speaks gopher [1].",
                   "Set `SERVICE_PORT` to change the port the server listens on [1].")
        code, out, err = run("chat", stdin="What port does the server listen on?\nHow do I change it?\n")
        assert code == 0 and err == "", err
        assert out.count("[unsupported]") == 2  # the first answer: its gopher sentence and the note
        later = [r for r in srv.requests if r.node in ("analyze_and_route", "plan", "synthesize")][3:]
        assert later and all("What port does the server listen on?" in json.dumps(r.body) for r in later)
        for request in later:
            sent = json.dumps(request.body["messages"])
            assert "The server listens on port 8080 by default" in sent
            assert "unsupported" not in sent and "_Note:" not in sent


def test_chat_continue_on_a_pipe_says_so_as_a_note_of_crag(project: Path) -> None:
    """On a pipe the "carrying on" line goes to stderr, where every other line crag writes
    there opens with ``crag: note:``; it was a bare "(carrying on ...)"."""
    assert cli("ask", "how long are backups kept")[0] == 0
    code, out, err = cli("chat", "--continue", stdin="where are they stored\n")
    assert code == 0
    assert err == "crag: note: carrying on the last conversation: 1 earlier question(s)\n"
    assert "carrying on" not in out


def test_search_help_says_the_search_looks_only_inside_the_kb() -> None:
    """``search`` runs no tools: its ``--kb`` help said "the tools look only inside"."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "crag", "search", "--help"], capture_output=True, text=True,
                          timeout=120, check=False)
    code, out = done.returncode, done.stdout
    assert code == 0
    assert "the search looks only inside" in " ".join(out.split()) and "the tools" not in out


PASTED = "\x1b[1mhow long\x1b[0m are backups \x1b]8;;https://example.com/x\x07kept\x1b]8;;\x07?"


def test_a_pasted_question_is_asked_as_the_terminal_shows_it(project: Path) -> None:
    """Text pasted from a terminal holds escape sequences the screen never shows (bold, a
    hyperlink's hidden address). They went to the model and the search as part of the question,
    and the hidden address drew the note that the question names a URL web_fetch would fetch
    (with web_fetch on, it was a URL the planner could fetch): the question asked is now the one
    shown, in chat as in ask."""
    code, out, err = cli("chat", stdin=PASTED + "\n")
    assert (code, err) == (0, "") and "30 days" in out
    code, out, err = cli("ask", PASTED)
    assert (code, err) == (0, "") and "30 days" in out
    code, out, err = cli("ask", "-", stdin=PASTED)
    assert (code, err) == (0, "") and "30 days" in out
    assert logged_questions() == ["how long are backups kept?"] * 3


SCOTLAND = "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"


def test_a_question_with_a_flag_of_tag_characters_is_asked_whole(project: Path) -> None:
    """Scotland's, England's and Wales's flags are a black flag with tag characters after it.
    Leaving out what a terminal does not show took those tags as control characters: the
    question was asked and logged with a plain black flag in place of Scotland's."""
    question = f"How long are backups kept in {SCOTLAND} Scotland?"
    assert cli("chat", stdin=question + "\n")[0] == 0
    assert cli("ask", question)[0] == 0
    assert cli("ask", "-", stdin=question)[0] == 0
    assert logged_questions() == [question] * 3
