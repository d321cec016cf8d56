"""``chat``: a multi-turn session in the terminal, the answer streamed as it is written.

When standard output is a terminal, each answer shows as ``ask``'s does (``crag.cli.live``):
the running step and the last lines of the model's raw reply on stderr, then the grounded
answer after the ``crag>`` prompt. Otherwise ``Progress`` streams the grounded answer alone
(and, when only stderr is a terminal, names the running node there): on a pipe standard
output holds the answers and nothing else (SPEC §4), one after another with a blank line
between them. The banner, the ``you>`` prompts and the ``crag>`` leads then go to stderr when
someone is typing at a terminal, and nowhere when a script feeds the session (its stderr
holds only the error lines).
``line_reader`` reads a question, with line editing and history when it is typed at a terminal
(also when the answers are redirected: ``standard_output_on``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from collections.abc import Iterator
from typing import TextIO

from ..errors import CragError, UsageError
from ..safe_text import ShownStream, for_terminal, valid_text
from .ask import agent_for, fetch_failed_notes, gone_roots_note
from .common import (
    Terminated,
    check_readable,
    error_line,
    isatty,
    not_utf8,
    secrets,
    settings,
    shown,
    undecodable_bytes_kept,
    unreadable_input,
)
from .live import (
    LiveAnswer,
    answer_live,
    as_written,
    dumb_terminal,
    echo_off,
    fitted,
    waiting_text,
    wants_progress,
)

ANSWER_LEAD = "\ncrag> "  # what a terminal shows before each answer


class Progress:
    """``chat`` when standard output is not a terminal: prints the answer's chunks
    (``Agent.stream``: grounded in the library) terminal-safe and redacted, and shows which node
    is running when stderr is a terminal. On a pipe or in a file each answer is printed whole
    once it is final: an answer whose stream breaks off leaves no fragment there for a script to
    take for an answer; a (dumb) terminal gets the chunks as they come."""

    def __init__(self, err: TextIO, out: TextIO, show_usage: bool = True) -> None:
        self.err = err
        self.out = out
        self.hold = not isatty(out)  # a pipe or a file: answers whole, never a fragment
        self.answers = 0  # printed so far: a blank line goes between two on standard output
        self.started = False  # this answer has text on standard output
        self.tty = hasattr(err, "isatty") and err.isatty()
        self.dumb = dumb_terminal()  # TERM=dumb: a plain line per step, no cursor control
        self.status = False  # a step's name is on stderr's last line, to be erased
        self.step = ""  # the running step's name
        self.waited = False  # a retry's wait shows in place of the step's name
        self.leads = self.tty  # the ``crag>`` lead on stderr: off when a script sends the questions
        self.show_usage = show_usage  # off: the usage block (in the last chunk) is not printed
        self.screen: ShownStream | None = None  # the answer on screen, once it streams
        self.text = ""  # the chunks so far
        self.fed = 0  # how much of ``text`` went to the screen

    def __call__(self, event: object) -> None:
        from ..events import AnswerDelta, AnswerStarted, NodeFinished, NodeStarted, RetryWaiting

        streaming = self.screen is not None  # the status line is gone once the answer streams
        if isinstance(event, NodeStarted) and self.tty and not streaming:
            self.step, self.waited = event.node, False
            self._status(event.node)
        elif isinstance(event, RetryWaiting) and self.tty and not self.started:
            if not self.dumb or event.left == event.seconds:  # a dumb terminal: one line when it starts
                self._status(f"{event.node}: {waiting_text(event)}", ending="")
                self.waited = not self.dumb
        elif self.hold and isinstance(event, (AnswerStarted, AnswerDelta)):
            # The answer is not on the screen (it goes to a file or a pipe whole): its step stays
            # there while the model writes, back in place of a retry's wait once the reply comes.
            if self.waited and isinstance(event, AnswerDelta):
                self.waited = False
                self._status(self.step)
        elif isinstance(event, AnswerDelta) or (isinstance(event, NodeFinished) and not streaming):
            self.clear_status()  # the step is over, or its retry's wait (the answer streams on stdout)
        elif isinstance(event, AnswerStarted) and not streaming:  # again: a refit request, nothing shown yet
            self.clear_status()
            self.screen = ShownStream(secrets(), whole_words=False)  # final chunks: their last word too
            self._lead()

    def _status(self, text: str, ending: str = "…") -> None:
        """``text`` (a step's name, a retry's wait) on stderr's status line; a dumb terminal's
        line ends with ``ending``."""
        if self.dumb:
            self.err.write(as_written(f"crag: {for_terminal(text)}{ending}\n", self.err))
        else:  # clipped to the width: a line that wraps leaves its first row behind
            self.clear_status()
            self.err.write(fitted(f"  … {for_terminal(text)}", self.err))
            self.status = True
        self.err.flush()

    def clear_status(self) -> None:
        """Erase the running step's name, if it is on the screen."""
        if self.status:
            self.err.write("\r\033[K")
            self.err.flush()
            self.status = False

    def chunk(self, text: str) -> None:
        """One chunk of the stream, shown at once when the answer streams (else at the end:
        the no-evidence sentence, a backend that does not stream)."""
        self.text += text
        if self.screen is not None:
            visible = self._visible(self.text)
            self._print(self.screen.feed(visible[self.fed :]))
            self.fed = max(self.fed, len(visible))
            self.out.flush()

    def _visible(self, text: str) -> str:
        """``text`` as printed: without its usage block when that is hidden (``--no-usage``)."""
        if self.show_usage:
            return text
        from ..answer import STATS_HEADING

        cut = text.rfind("\n\n---\n" + STATS_HEADING)
        return text[:cut] if cut != -1 else text

    def finish(self) -> None:
        """Print the rest of the answer (all of it when nothing streamed)."""
        final = shown(self._visible(self.text))
        if self.screen is None:
            self._lead()
            self._print(final + "\n")
        else:  # the stream showed the redacted answer's beginning
            self._print(self.screen.rest(final) + "\n")
        self.out.flush()
        self.reset()

    def _lead(self) -> None:
        """Before an answer: the ``crag>`` lead on stderr when it is a terminal someone types at
        (standard output holds only the answers)."""
        if self.leads:
            self.err.write(ANSWER_LEAD)
            self.err.flush()

    def _print(self, text: str) -> None:
        """``text`` of this answer on standard output, after a blank line when it is its first
        and an answer came before (an answer that failed before any text adds none)."""
        if text and not self.started:
            if self.answers:
                self.out.write("\n")
            self.answers += 1
            self.started = True
        self.out.write(text)

    def reset(self) -> None:
        """Ready for the next question (also after one that failed)."""
        self.screen = None
        self.text = ""
        self.fed = 0
        self.started = False


def streamed(agent, question: str, history, progress: Progress):
    """The ``Answer`` to ``question``, its chunks printed by ``progress`` as they come (its rest
    by ``progress.finish``, once the answer is logged should that printing fail). An error or
    Ctrl-C stops the run at its next step and is raised again for the session to handle."""
    echo = echo_off(sys.stdin) if progress.tty and not progress.dumb else None  # a typed line kept off the step's
    try:
        stream = agent.stream(question, history=history, on_event=progress)
        chunks = iter(stream)
        try:
            for chunk in chunks:
                progress.chunk(chunk)
        except BaseException:
            chunks.close()
            progress.clear_status()  # before the error line or the note of Ctrl-C
            if progress.started:  # the line of an answer cut short ends
                progress.out.write("\n")
            progress.reset()
            raise
    finally:
        if echo is not None:
            echo()
    return stream.result


def line_reader(stdin: TextIO, out: TextIO, limit: int):
    """Reads one line after a prompt (at most ``limit`` characters of a line that is not typed);
    on a terminal through ``input()`` with ``readline``.

    With the standard library's ``readline`` (absent on some platforms), the arrow keys edit
    the line and Up/Down walk through the session's earlier questions. Returns "" at the end.
    """
    interactive = stdin is sys.stdin and isatty(stdin) and isatty(out) and (out is sys.stdout or out is sys.stderr)
    if interactive:
        try:
            import readline  # noqa: F401  (importing it is what gives input() line editing)
        except ImportError:
            pass

        def read(prompt: str) -> str:
            lead, newline, last = prompt.rpartition("\n")
            out.write(lead + newline)  # readline redraws only the prompt's last line
            out.flush()
            try:
                with standard_output_on(out):
                    return input(last)
            except EOFError:
                out.write("\n")
                return ""

        return read

    def read_stream(prompt: str) -> str:
        out.write(prompt)
        out.flush()
        line = stdin.readline(limit + 1)
        if len(line) > limit:  # read past it, a piece at a time, so the next line is the next question
            size = len(line)
            while not line.endswith("\n"):
                if size > ENDLESS * limit:  # /dev/zero, a stream that is no text: the session ends
                    raise UsageError(f"a line of standard input goes on past {ENDLESS * limit:,} characters, "
                                     f"more than can fit KB_AGENT_CONTEXT_TOKENS ({limit:,} characters at most)")
                line = stdin.readline(limit + 1)
                size += len(line.removesuffix("\n"))
                if not line:
                    break
            raise LineTooLong(f"that line is {size:,} characters, more than can fit "
                              f"KB_AGENT_CONTEXT_TOKENS ({limit:,} characters at most): shorten it")
        if isatty(out) and not isatty(stdin):  # piped questions watched on a terminal: each after its prompt
            out.write(shown(valid_text(line.rstrip("\r\n"))) + "\n")  # at the end of input, the prompt's line ends
            out.flush()
        return line

    return read_stream


@contextlib.contextmanager
def standard_output_on(terminal: TextIO) -> Iterator[None]:
    """Standard output on ``terminal`` (stderr) for one ``input()``, when it is redirected
    (``crag chat > answers.md``, ``| tee``): Python edits a line with ``readline`` only when
    standard output is a terminal, and ``readline`` draws the prompt and the line there."""
    if terminal is sys.stdout:
        yield
        return
    sys.stdout.flush()
    kept = os.dup(1)
    os.dup2(terminal.fileno(), 1)
    try:
        yield
    finally:
        os.dup2(kept, 1)
        os.close(kept)


ENDLESS = 16  # a piped line this many times the question limit is no question but a stream


class LineTooLong(UsageError):
    """A piped line that cannot be a question: refused on its own, the session goes on."""


# A line that ends the session as an empty line does, as a user of a shell or a REPL types it;
# never sent to the model as a question.
ENDINGS = frozenset({"exit", "quit", "/exit", "/quit", "exit()", "quit()", ":q", "bye"})
HELP = frozenset({"/help", "/?"})
# A line of one slash word ("/clear", "/history") is a command a chat user tried, never a question.
_COMMAND = re.compile(r"/[A-Za-z][\w-]*")
HELP_TEXT = ("Type a question about your knowledge base; earlier questions of the session go with it. "
             "An empty line, exit, /exit or Ctrl-D ends the session; Ctrl-C stops an answer; /help shows this.\n")


def cmd_chat(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..history import parse_history
    from .log import last_conversation, record

    config = settings()
    check_readable(args.stdin)
    history: list[dict[str, str]] = []
    conversation = None
    if args.continue_:
        conversation, history = last_conversation(config, err)
    progress = Progress(err, out)
    live = wants_progress(out)  # on a terminal: the step and the raw reply while the model works
    # The banner and prompts: on a pipe stdout holds only the answers (SPEC §4), so they go to a
    # terminal's stderr when someone types the questions, and nowhere when a script sends them.
    talk = out if isatty(out) else err if isatty(args.stdin) and isatty(err) else io.StringIO()
    progress.leads = talk is err
    later: list = []
    said: set[str] = set()  # notes written so far (an unwritable log, roots gone from disk): each once a session
    with agent_for(args, err, later) as agent:
        open_index(agent)
        for say in later:  # which index: once it opened, so a missing or damaged one is one error line
            say()
        progress.show_usage = agent.settings.show_usage and not args.no_usage
        talk.write("crag chat: ask about your knowledge base; an empty line, exit or Ctrl-D ends the session, "
                   "Ctrl-C stops an answer.\n")
        if history:
            said_how = f"carrying on the last conversation: {len(history) // 2} earlier question(s)"
            if isatty(out):  # part of the session on a terminal, as the greeting is
                out.write(f"({said_how})\n")
            else:  # on a pipe, stderr holds it as crag's other notes
                err.write(f"crag: note: {said_how}\n")
        undecodable_bytes_kept(args.stdin)
        from ..history import input_limit

        read_line = line_reader(args.stdin, talk, input_limit(config))
        while True:
            try:
                line = read_line("\nyou> ")
            except KeyboardInterrupt:  # at the prompt: the session ends, as an interrupted program
                talk.write("\n")
                talk.flush()
                return 130
            except Terminated:  # killed at the prompt: the line that says so starts a line of its own
                talk.write("\n")
                talk.flush()
                raise
            except UnicodeDecodeError:
                line = "\udcff"
            except LineTooLong as exc:  # that question is refused; the next line is the next one
                print(error_line(exc), file=err)
                continue
            except OSError as exc:  # a terminal gone, say: the session cannot go on
                raise unreadable_input(exc) from exc
            line = line.removeprefix("\ufeff")  # a byte order mark (a file of questions an editor saved)
            # Only an empty line ends the session: a line of spaces is an empty question, refused
            # by the agent with its one line (docs/cli.md, "Questions and queries").
            if not line.rstrip("\r\n") or line.strip().lower() in ENDINGS:
                break
            word = line.strip()
            if word.lower() in HELP or _COMMAND.fullmatch(word):
                if word.lower() not in HELP:
                    print(f"crag: error: chat has no command {for_terminal(word)}; /help says what it takes",
                          file=err)
                said_to = talk if talk in (out, err) else err  # piped questions: the help is a note
                said_to.write(HELP_TEXT)
                said_to.flush()
                continue
            if not_utf8(line):
                print("crag: error: that line is not UTF-8 text; type it again", file=err)
                continue
            question = for_terminal(line).strip()  # as the terminal showed it: no escape sequence (docs/cli.md)
            result = None
            try:
                if live:
                    screen = LiveAnswer(out, err, progress.show_usage, lead=ANSWER_LEAD, render=False)
                    result = answer_live(agent, question, parse_history(history), screen)
                else:
                    result = streamed(agent, question, parse_history(history), progress)
                    progress.finish()
            except OSError:  # the reader gone or the disk full: an answer given is logged all the same, as ask's
                if result is not None:
                    record(agent.settings, result, err, conversation, "chat", said)
                raise
            except CragError as exc:  # one question failed (too long, server down): the session goes on
                print(error_line(exc), file=err)
                continue
            except KeyboardInterrupt:  # Ctrl-C while answering: that answer stops, the session goes on
                if live:  # after the ^C the terminal shows (``streamed`` ends a piped answer's line)
                    out.write("\n")
                print("crag: answer cancelled (Ctrl-C); ask again, or Ctrl-D to end", file=err)
                continue
            fetch_failed_notes(result, agent, err)
            gone = gone_roots_note(result, agent)
            if gone and gone not in said:
                err.write(gone + "\n")
                said.add(gone)
            conversation = record(agent.settings, result, err, conversation, "chat", said)
            history.append({"role": "user", "content": question})
            history.append({"role": "assistant", "content": result.answer})
    return 0


def open_index(agent) -> None:
    """A missing, damaged or mismatched index fails the session at its start (status 1), as
    ``ask`` would, rather than every question of it."""
    retriever = getattr(agent.toolbox, "retriever", None)
    if retriever is not None and any(t.searches_question for t in agent.toolbox.tools()):
        retriever()
