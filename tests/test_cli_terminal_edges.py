"""The terminal's edges for ``ask``, ``chat`` and ``index`` progress (``crag.cli.live``): a
terminal whose encoding cannot write every character, and the end of a session's input.

A status line is erased by moving the cursor up over the rows it took, so every row must fit
the terminal's width as it is written, not as it was measured before the stream encoded it.
"""

from __future__ import annotations

import io

import pytest

from crag.events import AnswerDelta, AnswerStarted, NodeStarted


class AsciiTerminal(io.StringIO):
    """A terminal under the C locale: Python's stderr writes what ASCII cannot as ``\\uXXXX``."""

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "ascii"

    def isatty(self) -> bool:
        return True


def rows_written(err: str) -> list[str]:
    """The rows of the status region drawn last (after the last erase)."""
    return err.rsplit("\033[J", 1)[1].split("\n")


def test_the_preview_fits_the_width_on_an_ascii_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the C locale ``宽`` is written as ``\\u5bbd``: six columns where two were counted, so
    a 26-column preview row took 76 columns, wrapped over three rows, and the erase (one row up)
    left two behind on the screen."""
    from tests.test_cli_ask_terminal import live_screen

    screen, err = live_screen(monkeypatch, 30, terminal=AsciiTerminal)
    screen.event(AnswerStarted(()))
    screen.event(AnswerDelta("宽宽宽宽宽宽宽宽宽宽宽宽宽宽宽宽 café — the end"))
    rows = rows_written(err.getvalue())
    assert len(rows) == 2 and all(row.isascii() and len(row) <= 29 for row in rows), rows
    assert rows[0] == "  ... synthesize"  # crag's own marker in ASCII, not "\u2026"
    assert rows[1].endswith("caf\\xe9 \\u2014 the end")  # the last words, as the terminal shows them


def test_step_and_indexing_lines_fit_the_width_on_an_ascii_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fitted`` (``chat``'s step line, ``index`` and ``--kb`` progress): ``\\r\\033[K`` erases one
    row, so a file name of escapes that wrapped left its first rows behind."""
    from crag.cli import live

    monkeypatch.setenv("COLUMNS", "30")
    line = live.fitted("crag: indexing 3/9: 日本語のファイル名.md", AsciiTerminal())
    assert line.isascii() and len(line) <= 29 and line.startswith("crag: indexing 3/9: \\u65e5"), line
    assert live.fitted("  … analyze_and_route", AsciiTerminal()) == "  ... analyze_and_route"


def test_a_dumb_ascii_terminal_gets_plain_step_lines() -> None:
    from crag.cli import live

    err = AsciiTerminal()
    screen = live.LiveAnswer(AsciiTerminal(), err, dumb=True)
    screen.event(NodeStarted("plan"))
    assert err.getvalue() == "crag: plan...\n"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_step_that_waits_long_shows_its_time_without_any_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """A local model reading a long prompt sends nothing for a minute: ``  … synthesize`` stood
    still all that time, as a hang would. The step line now counts the seconds it has run."""
    import time

    from crag.cli import live

    monkeypatch.setattr(live, "TICK_EVERY", 0.01)
    monkeypatch.setattr(live, "TICK_AFTER", 0.0)
    err = Terminal()
    screen = live.LiveAnswer(Terminal(), err, dumb=False)
    screen.event(NodeStarted("synthesize"))
    deadline = time.monotonic() + 30  # only catches a redraw that never comes
    while "\033[J" not in err.getvalue():  # drawn again, with no event since NodeStarted
        assert time.monotonic() < deadline, err.getvalue()
        time.sleep(0.01)
    with screen.lock:  # a whole redraw
        assert rows_written(err.getvalue())[0].startswith("  … synthesize ("), err.getvalue()
    screen.abort()
    erased = err.getvalue()
    assert erased.endswith("\r\033[J")
    time.sleep(0.1)  # many ticks' time: nothing is drawn after the region was erased
    assert err.getvalue() == erased


def test_kb_indexing_progress_uses_no_cursor_control(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ask --kb`` on a terminal: its indexing line was erased with ``\\033[K``, which a dumb
    terminal (``TERM=dumb``: no cursor control, docs/cli.md) prints as garbage. It is redrawn as
    ``crag index``'s is, with a carriage return and spaces, and erased whole at the end."""
    from crag.cli.ask import IndexNotes

    monkeypatch.setenv("COLUMNS", "60")
    err = Terminal()
    notes = IndexNotes(err)
    notes(1, 3, "notes/first.md")
    notes(2, 3, "notes/b.md")
    notes.clear()
    shown = err.getvalue()
    assert "\033" not in shown and shown.endswith("\r"), repr(shown)
    assert "crag: indexing 1/3: first.md" in shown and "crag: indexing 2/3: b.md    " in shown  # the longer line covered
    assert shown.rsplit("\r", 2)[1].strip() == ""  # the line erased with spaces


def test_kb_indexing_progress_is_not_shown_off_a_terminal() -> None:
    from crag.cli.ask import IndexNotes

    err = io.StringIO()
    notes = IndexNotes(err)
    notes(1, 3, "notes/first.md")
    notes.clear()
    assert err.getvalue() == "" and not notes.tty


def test_a_soft_hyphen_takes_the_column_terminals_draw_it_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted 0 columns where xterm and VTE draw it 1, a preview row of soft hyphens clipped
    to the width wrapped, and the erase left the step line above the answer."""
    from crag.cli.live import width
    from tests.test_cli_ask_terminal import live_screen

    assert width("\u00ad") == 1
    screen, err = live_screen(monkeypatch, 30)
    screen.event(AnswerStarted(()))
    screen.event(AnswerDelta("co\u00adop\u00ader\u00ada\u00adtion " * 6))
    assert all(sum(width(ch) for ch in row) <= 29 for row in rows_written(err.getvalue()))


def test_an_emoji_with_its_presentation_selector_takes_two_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """"⚠️" (U+26A0 and the emoji selector U+FE0F) was counted one column where terminals that
    honour the selector draw it two: a preview row of them wrapped, and the erase left a row
    of the status behind."""
    from tests.test_cli_ask_terminal import live_screen

    screen, err = live_screen(monkeypatch, 30)
    screen.event(AnswerStarted(()))
    screen.event(AnswerDelta("\u26a0\ufe0f " * 20))
    for row in rows_written(err.getvalue())[1:]:
        drawn = sum(2 if ch == "\u26a0" else 0 if ch == "\ufe0f" else 1 for ch in row)
        assert drawn <= 29, row


def test_an_escape_sequence_still_arriving_is_not_previewed_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window title or a hyperlink written by the model showed its payload ("0;my-title",
    "8;;http://...") in the preview until its terminator arrived: only its opener was removed."""
    from tests.test_cli_ask_terminal import live_screen

    screen, err = live_screen(monkeypatch, 80)
    screen.event(AnswerStarted(()))
    for piece in ("Background tasks run after the response ", "\x1b]0;my-window-", "title-here"):
        screen.event(AnswerDelta(piece))
        assert "window" not in rows_written(err.getvalue())[-1]
    screen.event(AnswerDelta("\x07 is sent [1]. See \x1b]8;;http://example.invalid/p"))
    assert rows_written(err.getvalue())[-1].endswith("is sent [1]. See")
    screen.event(AnswerDelta("\x1b"))  # the first half of its terminator, ESC \\
    assert "example" not in err.getvalue() and "my-window" not in err.getvalue()


def test_an_answer_on_an_ascii_terminal_is_the_plain_text() -> None:
    """rich's bullets and rules under the C locale were written as ``\\u2022`` (six columns it
    counted as one), so its own wrapping broke lines mid-word; the plain text needs no escape."""
    pytest.importorskip("rich")
    from crag.cli.render import print_answer

    class Shown:
        answer = "- The server listens on port 8080 [1].\n\n[1] docs/setup.md:L3"
        without_usage = answer
        citations = ()

    out = AsciiTerminal()
    print_answer(out, Shown())
    assert out.getvalue() == Shown.answer + "\n"


def test_an_answer_on_a_dumb_terminal_fits_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich takes every ``TERM=dumb`` terminal (Emacs' shell) for 80 columns and pads each line
    to them: on a narrower one every line wrapped into a blank row and the rule broke in two."""
    pytest.importorskip("rich")
    from crag.answer import STATS_HEADING
    from crag.cli.render import print_answer

    class Utf8Terminal(io.StringIO):
        encoding = "utf-8"

        def isatty(self) -> bool:
            return True

    class Shown:
        answer = ("The server listens on port 8080 by default [1].\n\n[1] docs/setup.md:L3\n\n---\n"
                  f"{STATS_HEADING}\n- **Model:** m\n- **API calls:** 3")
        without_usage = answer
        citations = ()

    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setenv("COLUMNS", "50")
    out = Utf8Terminal()
    print_answer(out, Shown())
    rows = out.getvalue().splitlines()
    assert "API calls: 3" in out.getvalue() and max(len(row) for row in rows) <= 50, rows
