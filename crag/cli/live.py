"""``ask`` and ``chat`` on a terminal: which step is running, the answer as the model writes
it, then the grounded answer. Used only when standard output is a terminal (and, for ``ask``,
``--json`` is not given): piped, redirected or as JSON, ``ask`` prints the result alone and
``chat`` its answers alone, as they always have.

The run goes through ``Agent.stream`` (``answer_live``), and two things show while it works:

- **The status region, on stderr.** The running step (``… plan``; after ``TICK_AFTER``
  seconds with the seconds it has run, ``… synthesize (12 s)``, redrawn by a ticker thread
  while the server sends nothing) and, while ``synthesize``
  runs, the last lines the model has written so far (its raw reply, before grounding, made
  terminal-safe and redacted), each line clipped to the terminal's width so the region's
  height is known and can be erased exactly. It is erased when the grounded answer starts
  and when the run ends or is interrupted. While a step waits to retry a request (a
  ``RetryWaiting`` event: 429, 5xx, a timeout), its line says why and counts the wait down
  (``… plan: LLM server answered 429 rate limited; retry 1 of 3 in 27 s``), then says the
  retry was sent (``waiting_text``).
- **The grounded answer, on stdout,** a sentence at a time as ``Agent.stream`` lets it show
  (``crag.stream`` says when), completed by the finished answer's rest. When the stream held
  the whole answer back (the simple path, a reply with no citation), nothing was shown on
  stdout, and the finished answer is printed whole: by ``ask`` exactly as it prints it on a
  terminal without progress (Markdown rendered when ``rich`` is installed), by ``chat`` as
  plain text after its ``crag>`` prompt (``LiveAnswer``'s ``lead`` and ``render``).

With ``TERM=dumb`` (or no ``TERM``) no cursor control is written: each step is one plain
line on stderr (``crag: plan…``), each retry wait one line when it starts, and there is no
preview of the raw reply; the grounded answer still streams on stdout, which only ever
appends. When stderr is not a terminal the
status is not shown at all. A terminal too narrow for a useful preview (under 20 columns)
gets the step line alone. Under a locale whose encoding cannot write every character (the C
locale), each line is measured as it is written, its characters as backslash escapes
(``as_written``), so that it still fits its row and is erased whole.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
import unicodedata
from typing import TextIO

from ..safe_text import ShownStream, for_terminal, open_escape, redacted_prefix
from .common import dumb_terminal, isatty, secrets, shown, terminal_size, writes_any_text

PREVIEW_LINES = 8  # at most this many lines of the raw reply under the step name
MIN_COLUMNS = 20  # narrower than this, the step line alone
REDRAW_EVERY = 0.05  # seconds between redraws of the preview (deltas can come much faster)
TICK_AFTER = 3.0  # a step running this long shows its seconds on its line...
TICK_EVERY = 1.0  # ...redrawn this often, events or not (a server reading a long prompt sends none)


def wants_progress(out: TextIO, as_json: bool = False) -> bool:
    """Whether ``ask`` or ``chat`` shows its progress: on a terminal, and not with ``--json``."""
    return not as_json and isatty(out)


def width(ch: str) -> int:
    """The columns ``ch`` takes on a terminal: 0 for combining marks, 2 for wide characters;
    a soft hyphen 1, as terminals draw it (counted 0, a clipped line wrapped and the erase
    left a row of the status behind). The emoji selector U+FE0F 1: it makes the symbol before
    it ("⚠️") an emoji two columns wide on the terminals that honour it; over-counted after
    one already wide, a row is only clipped shorter."""
    if ch in ("\u00ad", "\ufe0f"):
        return 1
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def clip(line: str, columns: int, end: bool = False) -> str:
    """The start of ``line`` that fits in ``columns``; with ``end``, its end (the words the
    model wrote last)."""
    taken, used = [], 0
    for ch in reversed(line) if end else line:
        used += width(ch)
        if used > columns:
            break
        taken.append(ch)
    return "".join(reversed(taken) if end else taken)


def fitted(line: str, stream: TextIO | None = None) -> str:
    """``line`` clipped to the width of the terminal ``stream`` writes to, so that ``\\r``
    rewrites it in place (a line that wraps leaves its first rows behind)."""
    columns = terminal_size(stream)[0] - 1  # never the last column: some terminals wrap there
    return clip(as_written(line, stream), max(columns, 1))


def as_written(text: str, stream: TextIO | None) -> str:
    """``text`` as ``stream`` puts it on the screen, to be measured and clipped as such. Under
    an ASCII locale Python writes a character it cannot encode as a backslash escape
    (``\\u5bbd``, six columns where two were counted): a row measured before that wraps, and
    erasing it leaves rows behind. crag's own ``…`` becomes ``...`` there."""
    if stream is None or writes_any_text(stream):
        return text
    try:
        return text.replace("…", "...").encode(stream.encoding, "backslashreplace").decode(stream.encoding)
    except (UnicodeError, LookupError):  # an encoding that cannot take its own escapes back
        return text.encode("ascii", "backslashreplace").decode("ascii")


def settled(text: str) -> str:
    """``text`` without a string escape sequence still arriving at its end (``open_escape``):
    the preview showed its payload ("0;my window title") as text until its terminator came."""
    cut = open_escape(text)
    return text if cut == -1 else text[:cut]


def waiting_text(wait) -> str:
    """A ``RetryWaiting`` event in words, for a status line: why a request waits, which
    retry comes and, while the wait counts down, in how many seconds."""
    server = "embeddings server" if wait.server == "embeddings" else "LLM server"
    if wait.status is None:
        why = {"timed out": "did not answer in time", "connection failed": "could not be reached"}.get(
            wait.reason, shown(wait.reason))
    else:
        why = f"answered {shown(wait.reason)}"
    which = f"retry {wait.retry} of {wait.retries}"
    if wait.left > 0:
        return f"{server} {why}; {which} in {math.ceil(wait.left - 1e-6)} s"
    return f"{server} {why}; {which} sent"


class LiveAnswer:
    """The screen of one answer on a terminal: ``event`` takes the run's events (the status
    region), ``chunk`` the grounded chunks, ``finish`` the ``Answer``; ``abort`` erases the
    status region after Ctrl-C or an error.

    ``lead`` is written on stdout just before the answer (``chat``'s ``crag>`` prompt); with
    ``render`` off, an answer printed whole is its plain text (``chat``), not ``ask``'s
    rendering."""

    def __init__(self, out: TextIO, err: TextIO, show_usage: bool = True, dumb: bool | None = None,
                 lead: str = "", render: bool = True) -> None:
        self.out = out
        self.err = err
        self.show_usage = show_usage
        self.lead = lead
        self.render = render
        self.status = isatty(err)  # the status region goes to stderr only when it is a terminal
        self.dumb = dumb_terminal() if dumb is None else dumb
        self.node = ""
        self.waiting = ""  # why the step waits and for how long (a retry wait), else ""
        self.reply = ""  # the raw reply being written (the preview)
        self.rows = 0  # rows the status region takes on screen (cursor at the end of its last)
        self.drawn_at = 0.0
        self.node_at = 0.0  # when the running step started
        self.screen: ShownStream | None = None  # the grounded answer on stdout, once it streams
        self.lock = threading.RLock()  # the ticker's redraws and the run's events take turns
        self.stopped = threading.Event()  # the ticker ends: the answer is shown, or the run stopped
        self.ticker: threading.Thread | None = None

    # -- the status region ------------------------------------------------------------------

    def event(self, event: object) -> None:
        with self.lock:
            self._event(event)

    def _event(self, event: object) -> None:
        from ..events import AnswerDelta, AnswerStarted, NodeStarted, RetryWaiting  # here: the CLI loads without attrs

        if self.screen is not None or not self.status:
            return
        if isinstance(event, RetryWaiting):
            self.waiting = waiting_text(event)
            if not self.dumb:
                self._draw()
            elif event.left == event.seconds:  # appended lines only: one when the wait starts
                self.err.write(as_written(f"crag: {shown(event.node)}: {self.waiting}\n", self.err))
                self.err.flush()
        elif isinstance(event, NodeStarted):
            self.node, self.reply, self.waiting = event.node, "", ""
            self.node_at = time.monotonic()
            if self.dumb:
                self.err.write(as_written(f"crag: {shown(event.node)}…\n", self.err))
                self.err.flush()
            else:
                self._draw()
                if self.ticker is None:
                    self.ticker = threading.Thread(target=self._tick, name="crag-status", daemon=True)
                    self.ticker.start()
        elif isinstance(event, AnswerStarted):  # again after a refit: the reply starts over
            self.reply = ""
        elif isinstance(event, AnswerDelta) and not self.dumb:
            self.reply += event.text
            self.waiting = ""  # the retry answered
            now = time.monotonic()
            if now - self.drawn_at >= REDRAW_EVERY:
                self._draw()

    def _tick(self) -> None:
        """Redraw the step line every ``TICK_EVERY`` s while it shows, so that a step waiting long
        for its server (no event for a minute) counts its seconds rather than stand still as a
        hang would. A retry's wait counts down on its own."""
        while not self.stopped.wait(TICK_EVERY):
            with self.lock:
                showing = self.rows and self.screen is None and not self.waiting and not self.stopped.is_set()
                if showing and time.monotonic() - self.node_at >= TICK_AFTER:
                    self._draw()

    def _draw(self) -> None:
        columns, lines = terminal_size(self.err)
        columns -= 1  # never write into the last column: some terminals wrap there at once
        running = time.monotonic() - self.node_at
        step = f"  … {shown(self.node)}" + (f": {self.waiting}" if self.waiting else
                                             f" ({int(running)} s)" if running >= TICK_AFTER else "")
        region = [clip(as_written(step, self.err), columns)]
        if self.reply and columns + 1 >= MIN_COLUMNS:
            # what can be shown of a reply still arriving: never the first characters of a secret
            preview = redacted_prefix(for_terminal(settled(self.reply)), secrets(), whole_words=False)
            written = [line for line in as_written(preview, self.err).splitlines() if line.strip()]
            room = max(0, min(PREVIEW_LINES, lines - 3))  # rows scrolled off the screen cannot be erased
            for line in written[-room:] if room else []:
                region.append("    " + clip(line.strip().replace("\t", " "), columns - 4, end=True))
        self._erase()
        self.rows = len(region)  # before the write: a Ctrl-C right after it still erases the region
        self.err.write("\n".join(region))
        self.err.flush()
        self.drawn_at = time.monotonic()

    def _erase(self) -> None:
        if self.rows and not self.dumb:
            up = f"\033[{self.rows - 1}A" if self.rows > 1 else ""
            self.err.write(f"\r{up}\033[J")
            self.err.flush()
        self.rows = 0

    # -- the grounded answer ----------------------------------------------------------------

    def chunk(self, text: str) -> None:
        """A grounded chunk shown before the run finished: printed at once on stdout."""
        with self.lock:
            self._chunk(text)

    def _chunk(self, text: str) -> None:
        if self.screen is None:
            self._erase()
            self.screen = ShownStream(secrets(), whole_words=False)  # final chunks: their last word too
            self.out.write(self.lead)
        self.out.write(self.screen.feed(text))
        self.out.flush()

    def finish(self, answer) -> None:
        """The finished ``Answer``: the rest of the streamed text, or the whole answer when
        nothing streamed."""
        from .render import print_answer

        self.stopped.set()
        with self.lock:
            self._erase()
        final = shown(answer.answer if self.show_usage else answer.without_usage)
        if self.screen is not None:
            self.out.write(self.screen.rest(final) + "\n")
        elif self.render:
            self.out.write(self.lead)
            print_answer(self.out, answer, show_usage=self.show_usage)
        else:
            self.out.write(self.lead + final + "\n")
        self.out.flush()

    def abort(self) -> None:
        """The run stopped (Ctrl-C, an error): the status region goes, a streamed line ends."""
        self.stopped.set()
        with self.lock:
            self._erase()
            if self.screen is not None:
                self.out.write("\n")
                self.out.flush()


def answer_live(agent, question: str, history, screen: LiveAnswer):
    """``agent.ask`` with its progress on ``screen``; the ``Answer``. An error or Ctrl-C erases
    the status, stops the run at its next step and is raised again for the command to handle."""
    echo = echo_off(sys.stdin) if screen.status and not screen.dumb else None
    try:
        stream = agent.stream(question, history=history, on_event=screen.event)
        chunks = iter(stream)
        try:
            for chunk in chunks:
                if finished(stream):  # this chunk is the answer's rest, which ``finish`` prints
                    break
                screen.chunk(chunk)
        except BaseException:
            chunks.close()
            screen.abort()
            raise
        screen.finish(stream.result)
    finally:
        if echo is not None:
            echo()
    return stream.result


def echo_off(keyboard: TextIO):
    """Stop the terminal echoing what is typed at ``keyboard`` while the status region is drawn,
    and return what turns it back on (None when there is nothing to do). A line typed ahead
    (the next question of ``chat``, a shell command after ``ask``) was echoed into the region,
    its Enter moved the cursor a row down, and the region's erase then left its first row (the
    step line) on the screen. The typed text stays in the terminal's buffer, not lost: the next
    prompt (``readline``, the shell) reads and shows it."""
    try:
        import termios
    except ImportError:  # not on this platform: the typing shows, as before
        return None
    try:
        fd = keyboard.fileno()
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():  # in the background: tcsetattr stops crag
            return None
        kept = termios.tcgetattr(fd)
        if not kept[3] & termios.ECHO:
            return None
        quiet = list(kept)
        quiet[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, quiet)  # not TCSAFLUSH: what was typed is kept
    except (AttributeError, ValueError, OSError, termios.error):  # no file descriptor, no terminal
        return None

    def restore() -> None:
        with contextlib.suppress(OSError, termios.error):
            if os.tcgetpgrp(fd) == os.getpgrp():  # sent to the background since (Ctrl-Z, bg): the shell's now
                termios.tcsetattr(fd, termios.TCSANOW, kept)

    return restore


def finished(stream) -> bool:
    """Whether the stream's run has finished (its ``result`` is there)."""
    from ..errors import UsageError

    try:
        stream.result  # noqa: B018  (raises until the run has finished)
    except UsageError:
        return False
    return True
