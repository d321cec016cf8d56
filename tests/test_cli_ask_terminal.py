"""``python -m crag ask`` on a terminal: the running step, the answer as it is written, then
the grounded answer; on a pipe or with ``--json``, the result alone (``crag.cli.live``).

The terminal is a real pseudo-terminal (``pty``) holding the child's stdout and stderr; the
LLM is ``tests.openai_server.FakeOpenAIServer`` on 127.0.0.1, streaming the answer as
server-sent events.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crag.answer import STATS_HEADING
from crag.events import AnswerDelta, AnswerStarted, NodeFinished, NodeStarted
from tests.openai_server import Delay, FakeOpenAIServer, Status, Text, grades
from tests.test_cli_ask import SETUP, cli, plan, route, write

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "How often does the client retry an upload, and what happens when it gives up?"
REPLY = "The client retries failed uploads three times before it gives up [1]."


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from tests.fakes import clean_env

    write(tmp_path / "docs" / "setup.md", SETUP)
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert cli("index", "docs")[0] == 0
    return tmp_path


@pytest.fixture
def llm(kb: Path):
    """The loopback server, scripted for a complex question (every step runs once)."""
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", route("complex", "grep_search"))
        srv.default("plan", plan(("grep_search", {"pattern": "retries failed uploads"})))
        srv.default("grade_evidence", grades(rest=0.9))
        srv.default("synthesize", REPLY)
        yield srv


def child_env(kb: Path, srv: FakeOpenAIServer, term: str = "xterm") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update(PYTHONPATH=str(ROOT), KB_AGENT_LLM="openai", OPENAI_BASE_URL=srv.base_url, OPENAI_API_KEY="k",
               KB_AGENT_MODEL="test-model", KB_AGENT_LLM_TIMEOUT="30", KB_AGENT_INDEX_DIR=str(kb / "index"),
               TERM=term, COLUMNS="100", LINES="30")
    return env


class Terminal:
    """A child process whose stdout and stderr are a pseudo-terminal; ``seen`` is what it showed."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], typed: str | None = None) -> None:
        """``typed``: standard input (a pipe holding it, then its end), for ``chat``."""
        import pty

        self.main_fd, child_fd = pty.openpty()
        stdin = subprocess.DEVNULL if typed is None else subprocess.PIPE
        self.proc = subprocess.Popen([sys.executable, "-m", "crag", *argv], cwd=cwd, env=env,
                                     stdin=stdin, stdout=child_fd, stderr=child_fd, close_fds=True)
        os.close(child_fd)
        if typed is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(typed.encode())
            self.proc.stdin.close()
        self.seen = b""

    def read_until(self, marker: bytes, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout  # a generous bound that only catches a hang
        while marker not in self.seen:
            assert time.monotonic() < deadline, self.seen.decode(errors="replace")
            ready, _, _ = select.select([self.main_fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(self.main_fd, 65536)
                except OSError:  # the child closed the terminal
                    return
                if not data:
                    return
                self.seen += data

    def finish(self, timeout: float = 60.0) -> int:
        try:
            self.read_until(b"\0never\0", timeout)  # read to the end (the child closes the terminal)
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self.main_fd)

    @property
    def text(self) -> str:
        return self.seen.decode(errors="replace")


def test_ask_on_a_terminal_shows_each_step_then_the_grounded_answer(llm: FakeOpenAIServer, kb: Path) -> None:
    term = Terminal(["ask", QUESTION], kb, child_env(kb, llm))
    assert term.finish() == 0, term.text
    shown = term.text
    steps = [shown.find(f"… {node}") for node in ("analyze_and_route", "plan", "tool_exec", "grade_evidence",
                                                  "synthesize")]
    assert -1 not in steps and steps == sorted(steps), shown
    answer = shown.index("The client retries failed uploads three times before it gives up [1].")
    assert answer > steps[-1] and "[1] docs/setup.md:L" in shown[answer:] and "LLM Usage Stats" in shown[answer:]
    assert "\033[J" in shown[:answer]  # the status region was erased before the answer
    assert all(r.body.get("stream") for r in llm.requests if r.node == "synthesize")


def test_ask_on_a_dumb_terminal_writes_plain_step_lines(llm: FakeOpenAIServer, kb: Path) -> None:
    term = Terminal(["ask", QUESTION], kb, child_env(kb, llm, term="dumb"))
    assert term.finish() == 0, term.text
    shown = term.text
    assert "\033" not in shown
    lines = shown.replace("\r\n", "\n").splitlines()
    assert lines[:5] == ["crag: analyze_and_route…", "crag: plan…", "crag: tool_exec…", "crag: grade_evidence…",
                         "crag: synthesize…"]
    assert "The client retries failed uploads three times before it gives up [1]." in shown


def test_ask_piped_or_json_prints_only_the_result(llm: FakeOpenAIServer, kb: Path) -> None:
    """Off a terminal nothing of the progress is written, and the answer is the one a
    non-streaming run gives (stdout byte for byte)."""
    env = child_env(kb, llm)
    piped = subprocess.run([sys.executable, "-m", "crag", "ask", "--no-usage", QUESTION], cwd=kb, env=env,
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""
    assert piped.stdout.startswith(REPLY) and "…" not in piped.stdout and "\033" not in piped.stdout
    assert not any(r.body.get("stream") for r in llm.requests)  # as before: the answer is not streamed
    as_json = Terminal(["ask", "--json", QUESTION], kb, env)
    assert as_json.finish() == 0
    assert "…" not in as_json.text and "\033" not in as_json.text
    assert json.loads(as_json.text)["body"].startswith(REPLY)


def interrupted_while_answering(llm: FakeOpenAIServer, kb: Path, args: list[str],
                               typed: str | None = None, sig: int = signal.SIGINT) -> tuple[int, str]:
    """Run ``crag ARGS`` on a terminal, send Ctrl-C (or ``sig``) once ``synthesize`` shows (its
    reply held for 20 s); the exit status and what the terminal showed."""
    llm.script("synthesize", Delay(20, REPLY))
    term = Terminal(args, kb, child_env(kb, llm), typed=typed)
    try:
        term.read_until(b"synthesize")
        term.proc.send_signal(sig)
    finally:
        code = term.finish()
    return code, term.text


def test_ctrl_c_with_json_on_a_terminal_says_interrupted_on_a_clean_line(llm: FakeOpenAIServer, kb: Path) -> None:
    """With ``--json`` nothing of crag's is on the terminal to erase, and the ``^C`` it echoed
    ran into the line: ``^Ccrag: interrupted``. The line now starts by clearing its row."""
    llm.script("synthesize", Delay(20, REPLY))
    term = Terminal(["ask", "--json", QUESTION], kb, child_env(kb, llm))
    try:
        deadline = time.monotonic() + 60
        while not any(r.node == "synthesize" for r in llm.requests):
            assert time.monotonic() < deadline and term.proc.poll() is None
            time.sleep(0.1)
        term.proc.send_signal(signal.SIGINT)
    finally:
        code = term.finish()
    assert code == 130 and "\r\033[Kcrag: interrupted" in term.text, term.text


def test_ctrl_c_on_a_dumb_terminal_says_interrupted_at_the_start_of_a_line(llm: FakeOpenAIServer, kb: Path) -> None:
    """A dumb terminal's step lines are whole lines, but the ``^C`` the terminal echoes is not
    one: ``^Ccrag: interrupted`` ran the two together. A carriage return, which every terminal
    takes, starts the line over it."""
    llm.script("synthesize", Delay(20, REPLY))
    term = Terminal(["ask", QUESTION], kb, child_env(kb, llm, term="dumb"))
    try:
        term.read_until("crag: synthesize…\r\n".encode())
        term.proc.send_signal(signal.SIGINT)
    finally:
        code = term.finish()
    assert code == 130 and term.text.endswith("…\r\n\rcrag: interrupted\r\n"), term.text
    assert "\033" not in term.text


def test_ctrl_c_on_a_terminal_erases_the_status_and_exits_130(llm: FakeOpenAIServer, kb: Path) -> None:
    code, shown = interrupted_while_answering(llm, kb, ["ask", QUESTION])
    assert code == 130 and "crag: interrupted" in shown and "Traceback" not in shown
    assert shown.rindex("\033[J") < shown.index("crag: interrupted")  # the step line was erased first
    assert REPLY not in shown


def test_a_failed_run_on_a_terminal_erases_the_status_before_its_error_line(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.default("synthesize", Status(400, body={"error": {"message": "the model is not loaded"}}))
    term = Terminal(["ask", QUESTION], kb, child_env(kb, llm))
    code = term.finish()
    shown = term.text
    assert code == 1 and "Traceback" not in shown
    error = shown.index("crag: error: ")
    assert "… synthesize" in shown[:error] and shown[:error].endswith("\r\033[J")
    assert shown[error:].count("\n") == 1


def test_chat_on_a_terminal_shows_the_reply_as_written_then_the_grounded_answer(llm: FakeOpenAIServer,
                                                                                 kb: Path) -> None:
    """On the simple path the stream holds the grounded answer until the reply is finished;
    meanwhile the status region shows the raw reply's words as the model writes them."""
    llm.default("analyze_and_route", route("simple", "grep_search"))
    llm.default("synthesize", Text(REPLY, interval=0.1))
    term = Terminal(["chat"], kb, child_env(kb, llm), typed=QUESTION + "\n")
    assert term.finish() == 0, term.text
    shown = term.text
    answer = shown.index("crag> " + REPLY)
    steps = [shown.find(f"… {node}") for node in ("analyze_and_route", "plan", "tool_exec", "synthesize")]
    assert -1 not in steps and steps == sorted(steps) and steps[-1] < answer, shown
    preview = shown.find("\n    The client retries")  # a row of the region under "… synthesize"
    assert steps[-1] < preview < answer, shown
    assert shown[:answer].endswith("\033[J\r\n")  # the region erased, then the answer
    assert "[1] docs/setup.md:L" in shown[answer:] and shown.count(STATS_HEADING) == 1
    assert shown.rstrip().endswith("you>")  # the next prompt, then the end of input ends the session


def test_chat_on_a_dumb_terminal_writes_plain_step_lines(llm: FakeOpenAIServer, kb: Path) -> None:
    term = Terminal(["chat"], kb, child_env(kb, llm, term="dumb"), typed=QUESTION + "\n")
    assert term.finish() == 0, term.text
    shown = term.text
    assert "\033" not in shown
    lines = shown.replace("\r\n", "\n").splitlines()
    steps = [line.removeprefix("you> ") for line in lines if "crag: " in line]  # nothing typed ends the prompt's line
    assert steps == ["crag: analyze_and_route…", "crag: plan…", "crag: tool_exec…", "crag: grade_evidence…",
                     "crag: synthesize…"]
    assert "crag> " + REPLY in lines


def test_ctrl_c_in_chat_on_a_terminal_erases_the_status_and_the_session_goes_on(llm: FakeOpenAIServer,
                                                                                 kb: Path) -> None:
    code, shown = interrupted_while_answering(llm, kb, ["chat"], typed=QUESTION + "\n")
    assert code == 0 and "Traceback" not in shown  # the end of input ends the session after the message
    cancelled = shown.index("crag: answer cancelled (Ctrl-C)")
    assert shown.rindex("\033[J", 0, cancelled) > shown.rindex("… synthesize", 0, cancelled)
    assert REPLY not in shown and shown.rstrip().endswith("you>")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def live_screen(monkeypatch: pytest.MonkeyPatch, columns: int, node: str = "synthesize",
                terminal: type | None = None):
    """A ``LiveAnswer`` on a fake terminal of ``columns`` by 12, redrawing at every delta,
    ``node`` running; (the screen, its stderr)."""
    from crag.cli import live

    terminal = terminal or FakeTerminal
    monkeypatch.setattr(live, "REDRAW_EVERY", 0.0)
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("LINES", "12")
    err = terminal()
    screen = live.LiveAnswer(terminal(), err, dumb=False)
    screen.event(NodeStarted(node))
    return screen, err


def test_the_preview_shows_the_reply_as_written_clipped_to_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    from crag.cli import live

    screen, err = live_screen(monkeypatch, 30)
    out = screen.out
    screen.event(AnswerStarted(()))
    screen.event(AnswerDelta("The client retries failed uploads three times\n\nbefore it "))
    screen.event(AnswerDelta("gives up. \x1b[31mRed\x1b[0m 宽宽宽宽宽宽宽宽宽宽宽宽宽宽宽宽"))
    last = err.getvalue().rsplit("\033[J", 1)[1]
    rows = last.split("\n")
    assert rows[0] == "  … synthesize" and len(rows) == 3
    assert all(sum(live.width(ch) for ch in row) <= 29 for row in rows)
    assert "\x1b[31m" not in last and rows[-1].endswith("宽宽")
    assert "before it gives up" in rows[-1] or "宽" in rows[-1]
    screen.event(NodeFinished("synthesize"))
    screen.chunk("The client retries failed uploads [1].")
    assert err.getvalue().endswith("\r\033[2A\033[J")  # the three rows erased before the answer
    assert out.getvalue().startswith("The client retries failed uploads")


def test_the_preview_never_shows_the_beginning_of_a_configured_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply quoting the configured key, streamed a few characters at a time, drew
    "sk-probe-SECRETKEY1234567890a" (29 of its 33 characters) before the whole key was there
    to be masked; scrollback and recordings kept it."""
    from crag.cli import common

    key = "sk-probe-SECRETKEY1234567890abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    common.forget_secrets()  # a run's secrets are found once: this one's environment
    screen, err = live_screen(monkeypatch, 80)
    screen.event(AnswerStarted(()))
    reply = f"The key is {key} as configured."
    for at in range(0, len(reply), 5):
        screen.event(AnswerDelta(reply[at : at + 5]))
    drawn = err.getvalue()
    assert "SECRETKEY" not in drawn and "sk-probe" not in drawn, drawn
    assert "The key is *** as configured." in drawn, drawn
    assert "The key is sk" not in drawn


def test_the_preview_is_not_drawn_on_a_narrow_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    screen, err = live_screen(monkeypatch, 12, "grade_evidence")
    screen.event(AnswerDelta("some words"))
    assert "\n" not in err.getvalue() and err.getvalue().endswith("\r\033[J  … grade_e")


def test_chat_writes_its_prompt_before_the_answer_streamed_or_whole() -> None:
    from crag.cli import live
    from crag.cli.chat import ANSWER_LEAD

    class Finished:
        answer = without_usage = "The client retries failed uploads [1].\n\n[1] docs/setup.md:L12"

    out = FakeTerminal()
    screen = live.LiveAnswer(out, FakeTerminal(), dumb=False, lead=ANSWER_LEAD, render=False)
    screen.chunk("The client retries ")
    screen.chunk("failed uploads [1].")
    screen.finish(Finished())
    assert out.getvalue() == ANSWER_LEAD + Finished.answer + "\n"
    whole = FakeTerminal()
    live.LiveAnswer(whole, FakeTerminal(), dumb=False, lead=ANSWER_LEAD, render=False).finish(Finished())
    assert whole.getvalue() == out.getvalue()  # plain text after the prompt, not rendered


def test_a_grounded_sentence_shows_with_its_citation_marker_at_once() -> None:
    """A chunk of ``Agent.stream`` is final: its last word ("[1].") showed only once the next
    sentence was, seconds later with a slow model, and Ctrl-C between the two left the sentence
    on screen without its marker."""
    from crag.cli import _Progress, live
    from crag.events import AnswerStarted

    sentence = "Backups are kept for 30 days [1]."
    screen = live.LiveAnswer(FakeTerminal(), FakeTerminal(), dumb=False)
    screen.chunk(sentence)
    assert screen.out.getvalue() == sentence
    screen.abort()  # Ctrl-C here: the line ends, the marker on it
    assert screen.out.getvalue() == sentence + "\n"
    out = FakeTerminal()
    progress = _Progress(FakeTerminal(), out)  # chat with its answers on a (dumb) terminal
    progress(AnswerStarted(()))
    progress.chunk(sentence)
    assert out.getvalue() == sentence


def test_chat_with_its_answers_redirected_keeps_the_step_shown_while_the_model_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``crag chat > answers.md`` typed at a terminal: each answer goes to the file whole, so the
    step's name on stderr is all the terminal shows while the model writes. It was erased as the
    reply began, leaving a blank line for the minute a local model takes (and Ctrl-C's ``^C``
    glued to ``crag: answer cancelled``); after a retry's wait it comes back once the reply does."""
    from crag.cli import _Progress
    from crag.events import RetryWaiting

    monkeypatch.setenv("TERM", "xterm")
    err, out = FakeTerminal(), io.StringIO()
    progress = _Progress(err, out)
    progress(NodeStarted("synthesize"))
    progress(AnswerStarted(()))
    progress(AnswerDelta("Backups are kept "))
    assert err.getvalue().endswith("  … synthesize"), repr(err.getvalue())
    progress(RetryWaiting("synthesize", "LLM", "503 service unavailable", 1.0, 0.0, 1, 3, 503))
    progress(AnswerDelta("Backups are kept "))
    assert err.getvalue().endswith("\r\033[K  … synthesize"), repr(err.getvalue())
    progress.chunk("Backups are kept for 30 days.")
    progress(NodeFinished("synthesize"))
    progress.finish()
    shown = err.getvalue()  # erased before the answer's lead
    assert shown.endswith("  … synthesize\r\033[K\ncrag> ") and out.getvalue() == "Backups are kept for 30 days.\n"


def chat_with_a_terminal_stderr(kb: Path, srv: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
                                term: str = "xterm", columns: int = 100) -> str:
    """``chat`` with its questions and answers on pipes and only stderr a terminal: what stderr showed."""
    from crag.cli import main

    for name, value in child_env(kb, srv, term).items():
        if name.startswith(("KB_AGENT_", "OPENAI_", "TERM")):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", str(columns))
    err = FakeTerminal()
    assert main(["chat"], io.StringIO(), err, io.StringIO(QUESTION + "\n")) == 0
    return err.getvalue()


def test_chat_erases_the_step_on_a_terminal_stderr_before_an_error_line(llm: FakeOpenAIServer, kb: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A question that fails while its step shows: the error line starts a line of its own, not
    glued to ``  … analyze_and_route``."""
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    llm.script("analyze_and_route", Status(500))
    shown = chat_with_a_terminal_stderr(kb, llm, monkeypatch)
    assert "\r\033[Kcrag: error: " in shown, shown


def test_chat_on_a_dumb_terminal_stderr_writes_plain_step_lines(llm: FakeOpenAIServer, kb: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """TERM=dumb takes no cursor control (docs/cli.md): one plain line per step, as ``ask`` writes."""
    shown = chat_with_a_terminal_stderr(kb, llm, monkeypatch, term="dumb")
    assert "\033" not in shown and shown.splitlines()[:2] == ["crag: analyze_and_route…", "crag: plan…"], shown


def test_chat_step_on_a_narrow_terminal_stderr_fits_its_line(llm: FakeOpenAIServer, kb: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Under 21 columns ``  … analyze_and_route`` wrapped, and ``\\r`` erased only its last row."""
    shown = chat_with_a_terminal_stderr(kb, llm, monkeypatch, columns=12)
    assert "  … analyze_and_route" not in shown and "  … analyze" in shown, shown


@pytest.mark.parametrize("args", [["ask", QUESTION], ["chat"]])
def test_sigterm_while_answering_erases_the_status_says_so_and_logs_nothing(llm: FakeOpenAIServer, kb: Path,
                                                                            args: list[str]) -> None:
    """``kill PID`` (SIGTERM) stops ``ask`` and ends ``chat`` as Ctrl-C stops ``ask``: the step and
    the preview erased, one line, status 143 (128 + 15, as a shell reports it), nothing logged.
    It left ``  … synthesize`` on the terminal, with the shell's prompt glued to it."""
    from tests.test_cli_ask import cli

    logged = len(json.loads(cli("log", "--json")[1]))
    typed = QUESTION + "\n" if args == ["chat"] else None
    code, shown = interrupted_while_answering(llm, kb, args, typed=typed, sig=signal.SIGTERM)
    assert code == 143 and "Traceback" not in shown, shown
    assert shown.endswith("crag: terminated\r\n") and shown.rindex("\033[J") < shown.index("crag: terminated")
    assert REPLY not in shown and len(json.loads(cli("log", "--json")[1])) == logged


def test_the_preview_is_drawn_from_20_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """"Under 20 columns" the step line alone (docs/cli.md): a 20-column terminal had no preview
    either, as the last column (never written) was counted out first."""
    screen, err = live_screen(monkeypatch, 20)
    screen.event(AnswerDelta("some words"))
    rows = err.getvalue().rsplit("\033[J", 1)[1].split("\n")
    assert rows == ["  … synthesize", "    some words"]


def test_sigterm_at_the_chat_prompt_ends_the_prompt_line_first(llm: FakeOpenAIServer, kb: Path) -> None:
    """Someone typing at ``you> `` (standard input a terminal too) and the session killed: the
    line ``crag: terminated`` was glued to the prompt, as Ctrl-C's end of the session is not."""
    import pty

    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "crag", "chat"], cwd=kb, env=child_env(kb, llm),
                            stdin=child_fd, stdout=child_fd, stderr=child_fd, close_fds=True)
    os.close(child_fd)
    term = Terminal.__new__(Terminal)
    term.main_fd, term.proc, term.seen = main_fd, proc, b""
    try:
        term.read_until(b"you> ")
        time.sleep(0.5)  # readline waiting for a key: a signal just before its select() would wait for one
        proc.send_signal(signal.SIGTERM)
    finally:
        code = term.finish()
    assert code == 143 and term.text.endswith("you> \r\ncrag: terminated\r\n"), term.text


def test_a_step_line_fits_the_width_of_the_terminal_it_is_written_on(llm: FakeOpenAIServer, kb: Path) -> None:
    """``chat`` piped (stdout a pipe) with stderr a 15-column terminal and no ``COLUMNS``: the
    width was read from standard output, a pipe, so the step line was clipped to 80 columns and
    wrapped on screen."""
    import fcntl
    import pty
    import struct
    import termios

    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 15, 0, 0))
    env = {k: v for k, v in child_env(kb, llm).items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-m", "crag", "chat"], cwd=kb, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=child_fd, close_fds=True)
    os.close(child_fd)
    term = Terminal.__new__(Terminal)
    term.main_fd, term.proc, term.seen = main_fd, proc, b""
    proc.stdin.write((QUESTION + "\n").encode())
    proc.stdin.close()
    code = term.finish()
    proc.stdout.close()
    assert code == 0 and "  … analyze_and_route" not in term.text and "  … analyze_a" in term.text, term.text


@pytest.mark.parametrize("typed", [None, "", QUESTION + "\n"])
def test_chat_ending_at_the_end_of_piped_input_ends_its_prompt_line(llm: FakeOpenAIServer, kb: Path,
                                                                    typed: str | None) -> None:
    """``chat < /dev/null`` (or a pipe that ends) on a terminal: the session ended after ``you> ``
    with no newline, and the shell's next prompt was glued to it (Ctrl-D at a terminal ends it)."""
    term = Terminal(["chat"], kb, child_env(kb, llm), typed=typed)
    assert term.finish() == 0, term.text
    assert term.text.endswith("you> \r\n") and "Traceback" not in term.text, term.text


def test_chat_on_a_terminal_shows_each_piped_question_after_its_prompt(llm: FakeOpenAIServer, kb: Path) -> None:
    """``chat < questions.txt`` watched on a terminal: the prompt was left empty and the step line,
    drawn on its row, erased it, so no answer said which question it answered."""
    term = Terminal(["chat"], kb, child_env(kb, llm), typed=f"{QUESTION}\nWhat port \x1b[2Jdoes it use?\n")
    assert term.finish() == 0, term.text
    first = term.text.index(f"you> {QUESTION}\r\n")
    second = term.text.index("you> What port does it use?\r\n")  # shown as typed, made terminal-safe
    assert first < term.text.index("… analyze_and_route") < term.text.index("crag> ") < second, term.text



@pytest.mark.parametrize("redirected", [False, True])
def test_a_line_typed_while_chat_answers_is_not_echoed_into_the_status(llm: FakeOpenAIServer, kb: Path,
                                                                       redirected: bool) -> None:
    """The next question typed (Enter included) while the model writes: the terminal echoed it
    into the status region, its newline moved the cursor a row down, and the erase left the
    step line ``  … synthesize`` above the answer (with the answers redirected, ``chat >
    answers.md``, the step line with the typed text after it). The terminal's echo is off while
    the status shows; the typed line waits in its buffer and is asked at the next prompt, shown
    there."""
    import fcntl
    import pty
    import termios

    llm.default("synthesize", Text(REPLY, interval=0.15))
    main_fd, child_fd = pty.openpty()

    def keyboard() -> None:  # the terminal is the child's own, as a shell's job has it
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    answers = (kb / "answers.md").open("wb") if redirected else child_fd
    proc = subprocess.Popen([sys.executable, "-m", "crag", "chat", "--no-usage"], cwd=kb, env=child_env(kb, llm),
                            stdin=child_fd, stdout=answers, stderr=child_fd, close_fds=True,
                            start_new_session=True, preexec_fn=keyboard)
    os.close(child_fd)
    if redirected:
        answers.close()
    term = Terminal.__new__(Terminal)
    term.main_fd, term.proc, term.seen = main_fd, proc, b""
    try:
        term.read_until(b"you> ")
        os.write(main_fd, f"{QUESTION}\r".encode())
        term.read_until(b"  \xe2\x80\xa6 synthesize")
        time.sleep(1)  # the model writing
        os.write(main_fd, b"What port does it use?\r")  # typed ahead, while the model writes
        term.read_until(b"you> What port does it use?")
        deadline = time.monotonic() + 60  # a generous bound that only catches a hang
        while term.text.count("you> ") < 3 and time.monotonic() < deadline:  # the second answer is done
            if select.select([main_fd], [], [], 0.2)[0]:
                term.seen += os.read(main_fd, 65536)
        os.write(main_fd, b"\x04")
        assert proc.wait(timeout=60) == 0, term.text
        assert termios.tcgetattr(main_fd)[3] & termios.ECHO  # on again at the end
    finally:
        term.finish()
    assert term.text.count("What port does it use?") == 1, term.text  # at its prompt only
    assert llm.calls("synthesize") == 2
