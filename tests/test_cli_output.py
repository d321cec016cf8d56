"""Output for scripts and people: ``ask --json``'s ``body`` (the answer without footer and usage
block), the usage block hidden on request, Markdown rendered with colour on a terminal (plain
when piped), and Ctrl-C in ``chat``: it cancels an answer and keeps the session, and at the
prompt it ends the session with status 130."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from crag.answer import STATS_HEADING
from crag.cli import main
from tests.fakes import clean_env

DOC = "# Deploy\n\nRun docker compose up to deploy the server.\n\nThe image is built from the Dockerfile.\n"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def cli(*argv: str, out: io.StringIO | None = None, stdin: io.StringIO | None = None) -> tuple[int, str, str]:
    out = out if out is not None else io.StringIO()
    err = io.StringIO()
    code = main(list(argv), out, err, stdin)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "deploy.md").write_text(DOC, encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    assert cli("index", "docs")[0] == 0
    return tmp_path


def test_json_body_holds_the_answer_without_footer_or_usage_block(kb: Path) -> None:
    code, out, _ = cli("ask", "How do I deploy the server?", "--json")
    data = json.loads(out)
    assert code == 0 and "docker compose up" in data["body"]
    assert STATS_HEADING not in data["body"] and "[1] docs/deploy.md:L3" not in data["body"]
    assert data["answer"].startswith(data["body"] + "\n\n[1] docs/deploy.md:L3\n\n---\n" + STATS_HEADING)
    code, out, _ = cli("ask", "hello", "--json")  # chitchat: no footer
    data = json.loads(out)
    assert data["answer"].startswith(data["body"] + "\n\n---\n") and STATS_HEADING not in data["body"]


def test_the_usage_block_is_hidden_on_request_and_kept_by_default(kb: Path, monkeypatch) -> None:
    _, out, _ = cli("ask", "How do I deploy the server?")
    assert STATS_HEADING in out and "[1] docs/deploy.md:L3" in out
    _, out, _ = cli("ask", "How do I deploy the server?", "--no-usage")
    assert STATS_HEADING not in out and out.rstrip().endswith("[1] docs/deploy.md:L3")
    monkeypatch.setenv("KB_AGENT_SHOW_USAGE", "off")
    _, out, _ = cli("ask", "How do I deploy the server?")
    assert STATS_HEADING not in out and "docker compose up" in out
    _, out, _ = cli("ask", "How do I deploy the server?", "--json")
    assert STATS_HEADING in json.loads(out)["answer"]  # --json's answer is always whole
    _, out, _ = cli("chat", stdin=io.StringIO("How do I deploy the server?\n\n"))
    assert STATS_HEADING not in out and "docker compose up" in out


def test_markdown_is_rendered_with_colour_on_a_terminal_and_plain_when_piped(kb: Path, monkeypatch) -> None:
    pytest.importorskip("rich", reason="the color extra (make install has it)")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    _, shown, _ = cli("ask", "How do I deploy the server?", out=Terminal())
    assert "\033[" in shown and "docker compose up" in shown and "docs/deploy.md:L3" in shown
    assert "**LLM Usage Stats:**" not in shown and "LLM Usage Stats" in shown  # rendered, not raw Markdown
    _, piped, _ = cli("ask", "How do I deploy the server?")
    assert "\033[" not in piped and f"---\n{STATS_HEADING}" in piped


def test_rendered_markdown_keeps_a_placeholder_in_angle_brackets_and_shows_a_links_address(monkeypatch) -> None:
    """On a terminal "Set <PORT> to change the port" read "Set  to change the port": the
    Markdown renderer dropped ``<PORT>`` as HTML. A link showed its text alone (its address
    only inside an escape most terminals do not show); piped, both are as the model wrote them."""
    import re

    pytest.importorskip("rich", reason="the color extra (make install has it)")
    from crag.cli.render import _rich

    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")
    body = ("Set <PORT> to change the port [1]. Keep `<b>` in code, see [the deploy guide](https://wiki.example.com/deploy).\n\n"
            "```html\n<div>kept</div>\n```")
    out = Terminal()
    _rich(out, body, "[1] docs/deploy.md:L3", "")
    plain = re.sub(r"\033\[[0-9;]*m|\033\]8;[^\033]*\033\\\\", "", out.getvalue())
    assert "Set <PORT> to change the port [1]." in plain, plain
    assert "<b>" in plain and "\\<" not in plain and "<div>kept</div>" in plain, plain
    assert "https://wiki.example.com/deploy" in plain, plain


def test_a_rendered_footer_keeps_each_source_on_one_line_on_a_narrow_terminal(kb: Path, monkeypatch) -> None:
    """On a 16-column terminal rich broke ``[1] docs/deploy.md:L3`` after ``[1]``, and a long path
    inside itself: a source a person copies to open is one line, which the terminal wraps."""
    import re

    pytest.importorskip("rich", reason="the color extra (make install has it)")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "16")
    _, shown, _ = cli("ask", "How do I deploy the server?", "--no-usage", out=Terminal())
    plain = re.sub(r"\033\[[0-9;]*m", "", shown)
    assert "\n[1] docs/deploy.md:L3\n" in plain, plain


def test_ctrl_c_in_chat_cancels_the_answer_and_keeps_the_session(kb: Path, monkeypatch) -> None:
    from crag.agent import Agent

    real_ask = Agent.ask
    calls = []

    def ask(self, question, *args, **kwargs):
        calls.append(question)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_ask(self, question, *args, **kwargs)

    monkeypatch.setattr(Agent, "ask", ask)
    code, out, err = cli("chat", stdin=io.StringIO("first question about deploy\nHow do I deploy the server?\n\n"))
    assert code == 0 and calls == ["first question about deploy", "How do I deploy the server?"]
    assert "answer cancelled" in err and "docker compose up" in out
    # piped, standard output holds the answers alone: no blank line for the cancelled one
    assert out.startswith("Composed offline"), out


def test_ctrl_c_at_the_chat_prompt_exits_with_status_130(kb: Path) -> None:
    class Interrupting(io.StringIO):
        def readline(self, *args: object) -> str:
            raise KeyboardInterrupt

    code, _, _ = cli("chat", stdin=Interrupting())
    assert code == 130



CAFE = "# Café\n\nLe café est servi à 8h00 dans la salle Ünïcødé, «très bon».\n"


def ascii_locale(kb: Path, *argv: str, stdin: bytes = b"") -> tuple[int, bytes, str]:
    """``python -m crag`` whose locale encodes only ASCII (the C locale with neither UTF-8 mode
    nor locale coercion, as where no UTF-8 locale is installed): status, stdout, stderr."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING"))}
    env.update(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", KB_AGENT_LLM="offline",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-m", "crag", *argv], cwd=kb, env=env, input=stdin,
                          capture_output=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr.decode("ascii", "replace")


def test_an_ascii_locale_gets_answers_and_json_about_non_ascii_text_without_a_traceback(kb: Path) -> None:
    """Non-ASCII questions and documents under a locale that encodes only ASCII: the answer is
    written with escapes instead of failing with UnicodeEncodeError, the JSON is ASCII that
    parses to the real text, and the question (argument or standard input) is read as UTF-8."""
    (kb / "docs" / "cafe.md").write_text(CAFE, encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    question = "À quelle heure le café est-il servi ?"
    code, out, err = ascii_locale(kb, "ask", question)
    assert code == 0 and "Traceback" not in err, err
    assert "8h00" in out.decode("ascii")
    code, out, err = ascii_locale(kb, "ask", "--json", question)
    assert code == 0 and "Traceback" not in err, err
    data = json.loads(out.decode("ascii"))
    assert data["question"] == question and "Le café est servi à 8h00" in data["answer"]
    code, out, err = ascii_locale(kb, "ask", "--json", "-", stdin=question.encode("utf-8"))
    assert code == 0 and json.loads(out.decode("ascii"))["question"] == question, err
    for argv in (["log"], ["log", "--json"], ["search", "café"], ["search", "--json", "café"]):
        code, out, err = ascii_locale(kb, *argv)
        assert code == 0 and "Traceback" not in err and out, (argv, err)
    assert json.loads(ascii_locale(kb, "search", "--json", "café")[1])[0]["path"] == "docs/cafe.md"
