"""``ask``: one question answered, as text or as one JSON object; and the agent that ``ask``,
``chat`` and ``mcp`` share (``--kb`` roots indexed first, said on stderr).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

from ..errors import UsageError
from ..modes import MAX_TOP_K
from ..safe_text import blank, display_name, for_terminal
from .common import (
    OVERRIDES,
    check_readable,
    index_label,
    index_note,
    isatty,
    not_utf8,
    own_name,
    require_index_libraries,
    settings,
    shown,
    shown_json,
    shown_message,
    suggested,
    undecodable_bytes_kept,
    unreadable_input,
    waiting_note,
    waits_shown,
)


def read_history(path: str, limit: int, stdin: TextIO | None = None) -> list:
    """The messages of a ``--history`` file of at most ``limit`` bytes (read no further);
    ``-`` is standard input, as for the question."""
    import json

    name = "--history (standard input)" if path == "-" else f"--history file {display_name(path)}"
    try:
        if path == "-":
            raw = _read_stdin(stdin, limit)
        else:
            with open(path, "rb") as f:
                raw = f.read(limit + 1)
        if len(raw) > limit:
            raise UsageError(f"{name} is over {limit:,} bytes, more than a conversation crag could use: keep its "
                             "latest turns")
        data = json.loads(raw)  # UTF-8, UTF-16 or UTF-32, with or without a byte order mark (RFC 8259 readers may)
    except FileNotFoundError:
        raise UsageError(f"{name} does not exist") from None
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start] if isinstance(exc.object, bytes) and exc.start < len(exc.object) else 0
        kind = "UTF-8" if exc.encoding.replace("_", "-").lower().startswith("utf-8") else exc.encoding.upper()
        raise UsageError(f"{name} is not {kind} text (byte 0x{byte:02x} at offset {exc.start}): save it as UTF-8") from exc
    except OSError as exc:
        raise UsageError(f"{name} cannot be read ({exc.strerror or exc})") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{name} is not JSON: {exc.msg} at line {exc.lineno}") from exc
    except RecursionError:
        raise UsageError(f"{name} nests JSON too deeply to be a list of messages") from None
    if not isinstance(data, list):
        raise UsageError(f'{name} must hold a JSON list of {{"role", "content"}} messages')
    return data


def _read_stdin(stdin: TextIO | None, limit: int) -> bytes | str:
    """At most ``limit + 1`` bytes of standard input (its text, when it has no bytes underneath)."""
    import sys

    stream = stdin if stdin is not None else sys.stdin
    check_readable(stream)
    buffer = getattr(stream, "buffer", None)
    try:
        return buffer.read(limit + 1) if buffer is not None else stream.read(limit + 1)
    except OSError as exc:
        raise unreadable_input(exc) from exc


def agent_for(args: argparse.Namespace, err: TextIO, later: list[Callable[[], None]] | None = None,
              progress: bool = True):
    """The agent of ``ask``/``chat``/``mcp``; ``--kb`` roots are indexed first, and that is said on stderr.

    With ``later``, the note naming the index (``index_note``) is added to it instead of
    written: the command says it once the index has served, so that a missing or damaged
    index is its one error line. ``progress``: whether the indexing line may be drawn on a
    terminal's stderr (``ask`` piped or with ``--json`` draws none of its progress)."""
    import warnings

    from ..agent import Agent
    from ..index import SkippedFileWarning

    top_k = getattr(args, "top_k", None)
    if top_k is not None and not 1 <= top_k <= MAX_TOP_K:
        raise UsageError(f"--top-k must be from 1 to {MAX_TOP_K}, got {top_k}")
    config = settings(top_k=top_k)
    require_index_libraries()
    notes = IndexNotes(err, progress)
    report = None
    if args.kb:  # first: an indexing that fails is its one error line, with no note before it
        from ..index import ensure_indexed

        with waits_shown(notes if notes.tty else None):
            report = ensure_indexed(config, args.kb, progress=notes, waiting=waiting_note(config, err))
    if report is not None:
        skipped_note(report, err)
        extras_note(report, err)
    if report is not None and report.changed_anything:
        err.write(shown(kb_note(report)) + "\n")  # names the index
    elif later is not None:
        later.append(lambda: index_note(config, err))
    else:
        index_note(config, err)
    overrides = {k: v for k, v in OVERRIDES.items() if v is not None}
    with warnings.catch_warnings():  # the skipped files are said above, once
        warnings.simplefilter("ignore", SkippedFileWarning)
        return Agent.from_env(kb=args.kb or None, progress=notes, top_k=config.top_k, **overrides)


def kb_note(report, cwd: str | None = None) -> str:
    """What ``--kb`` indexed, for stderr: the roots stay in the index until ``roots --remove``."""
    from ..index.discover import relative_label

    roots = ", ".join(relative_label(r, cwd) for r in report.roots)
    return (
        f"crag: indexed {roots} into {relative_label(report.index_dir, cwd)}: {len(report.added)} added, "
        f"{len(report.changed)} changed, {len(report.removed)} removed, {report.chunks_total} chunks in the index "
        f"(`{suggested()} roots` lists its roots, `{suggested()} roots --remove PATH` drops one)"
    )


_SKIPPED_NAMED = 10  # skipped files named on stderr by a ``--kb`` run; ``crag index`` names them all


def skipped_note(report, err: TextIO, cwd: str | None = None) -> None:
    """The files of the ``--kb`` roots that were skipped (unreadable, encrypted, a scan, binary...),
    each named with why on stderr, on every run as the ``index`` report names them: a folder of
    documents crag cannot read otherwise answers "couldn't find" with no word of why. At most
    ``_SKIPPED_NAMED`` are named, then how many more and the command that names every one."""
    import shlex

    from ..index.discover import relative_label

    skipped = report.warnings
    lines = [f"crag: skipped {relative_label(path, cwd)}: {why}" for path, why in skipped[:_SKIPPED_NAMED]]
    if len(skipped) > _SKIPPED_NAMED:
        roots = " ".join(shlex.quote(relative_label(r, cwd)) for r in report.roots)
        lines.append(f"crag: ... and {len(skipped) - _SKIPPED_NAMED} more skipped file(s): `{suggested()} index {roots}` "
                     "names every one")
    for line in lines:
        err.write(shown(line) + "\n")


def extras_note(report, err: TextIO) -> None:
    """The files of the ``--kb`` roots that an extra not installed would read, counted with how
    to install it (``readers.extras_line``), on every run: the answer cannot say why it missed them."""
    from ..index.readers import extras_line

    line = extras_line(report.skipped_types)
    if line:
        err.write(shown(f"crag: {line}") + "\n")


def fetch_failed_notes(result, agent, err: TextIO) -> None:
    """One note on stderr for each failure of a tool that fetches what the question names (an
    issue, a page, a URL: its ``question_arg``), as ``crag: note: TOOL: ERROR``: the answer
    alone says only that nothing was found, and the cause (credentials refused, no such issue,
    a server down) is the user's to fix. ``--json`` has them in its audit as well. A question
    naming what a built-in tool that is off would fetch gets one note saying how to turn it on
    (a URL while ``KB_AGENT_WEB_FETCH`` is off): the answer came from the documents alone."""
    from ..tools import BUILTIN_TOOLS  # here: the command line imports without attrs (crag.cli)

    fetching = {t.name for t in agent.toolbox.tools() if t.question_arg is not None}
    said: list[str] = []
    for event in result.state.audit:
        error = event.fields.get("error")
        if event.event == "tool_error" and event.fields.get("tool") in fetching and error and error not in said:
            said.append(error)
            err.write(shown_message(f"crag: note: {error}") + "\n")
    for tool in BUILTIN_TOOLS:  # the question names what a tool that is off would fetch: say how to turn it on
        qa = tool.question_arg
        if qa is not None and tool.name not in fetching and any(map(qa.fetchable or bool, qa.find(result.state.question))):
            err.write(f"crag: note: the question names {qa.what}, but {tool.name} is off ({tool.enable_hint})\n")


def gone_roots_note(result, agent) -> str | None:
    """The note for stderr naming the roots gone from disk (or out of reach) that an answer's
    search left out, as ``crag search`` writes it (``missing_roots_note``); None when every root
    is there, or when the answer searched nothing (chitchat): its "couldn't find" has no other
    word of why."""
    if "tool_exec" not in result.trace:
        return None
    from .index_text import missing_roots_note

    note = missing_roots_note(agent.toolbox.missing_roots(), shared=bool(agent.settings.store))
    return shown(own_name(note)) if note else None


class IndexNotes:
    """Prints indexing progress for ``--kb`` on stderr (stdout stays clean for --json): the line
    ``crag index`` draws (``ProgressLine``: a carriage return and spaces, no cursor control, so a
    dumb terminal shows it too), prefixed ``crag: ``; nothing when stderr is not a terminal
    or ``shown`` is false."""

    def __init__(self, err: TextIO, shown: bool = True) -> None:
        from .index_text import ProgressLine

        self.tty = shown and isatty(err)
        self.line = ProgressLine(err, prefix="crag: ") if self.tty else None

    def __call__(self, done: int, total: int, path: str) -> None:
        if self.line is not None:
            self.line(done, total, path)

    def waiting(self, event) -> None:
        """A retry wait of the embeddings server (a ``RetryWaiting``), on the same line."""
        if self.line is not None:
            self.line.waiting(event)

    def clear(self) -> None:
        if self.line is not None:
            self.line.clear()


def question_of(args: argparse.Namespace, limit: int) -> str:
    """The question's words joined, or standard input when the question is ``-`` (at most
    ``limit`` characters of it are read: ``ask - < /dev/zero`` is refused, not read forever);
    either is a usage error when its bytes are not UTF-8."""
    if args.words[:1] == ["-"] and len(args.words) > 1:  # `ask - extra`: stdin, or "- extra"?
        raise UsageError("the question `-` is read from standard input and takes no other words: give `-` "
                         "alone, or the question's words without it")
    if args.words == ["-"]:
        check_readable(args.stdin)
        undecodable_bytes_kept(args.stdin)
        try:
            text = args.stdin.read(limit + 1)
        except UnicodeDecodeError:
            text = "\udcff"
        except OSError as exc:
            raise unreadable_input(exc) from exc
        if len(text) > limit:
            raise UsageError(f"the question read from standard input is over {limit:,} characters, more than can "
                             "fit KB_AGENT_CONTEXT_TOKENS: shorten it")
        if not_utf8(text):
            raise UsageError("the question read from standard input is not UTF-8 text: save it as UTF-8")
        text = text.removeprefix("\ufeff")  # a byte order mark an editor wrote is no part of the question
        if blank(text):
            raise UsageError("the question read from standard input is empty")
        return for_terminal(text).strip()  # the question a terminal shows: no escape sequence (docs/cli.md)
    question = " ".join(args.words)
    if not_utf8(question):  # bytes Python kept as lone surrogates: asked, they became U+FFFD
        raise UsageError("the question is not UTF-8 text: type it in a UTF-8 terminal, or save it as UTF-8 and "
                         f"give it as {suggested()} ask - < FILE")
    return for_terminal(question)


def cmd_ask(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..history import input_limit, parse_history
    from .log import last_conversation, record
    from .render import print_answer

    if args.history and args.continue_:
        raise UsageError("--history and -c/--continue both give the earlier turns: use one")
    if args.history == "-" and args.words == ["-"]:
        raise UsageError("--history - and the question - cannot both be read from standard input: give one of "
                         "them as a file or as words")
    config = settings()  # validate configuration before any work
    limit = input_limit(config)
    history = parse_history(read_history(args.history, 4 * limit, args.stdin)) if args.history else ()
    question = question_of(args, limit)
    conversation = None
    if args.continue_:
        conversation, turns = last_conversation(config, err)
        history = parse_history(turns)
    from .live import LiveAnswer, answer_live, wants_progress

    live = wants_progress(out, args.json)
    later: list[Callable[[], None]] = []
    with agent_for(args, err, later, progress=live) as agent:
        show_usage = agent.settings.show_usage and not args.no_usage
        if live:  # Ctrl-C erases the status, stops the run at its next step and ends ``ask`` (status 130)
            result = answer_live(agent, question, history, LiveAnswer(out, err, show_usage))
        else:
            result = agent.ask(question, history=history)
        gone = gone_roots_note(result, agent)
    for say in later:  # which index answered: after the answer, so a failure is one line
        say()
    try:
        if args.json:
            out.write(shown_json({**result.to_dict(), "index": index_label(agent.settings)}, out, indent=2) + "\n")
        elif not live:
            print_answer(out, result, show_usage=show_usage)
        out.flush()  # the answer first: a log locked by another crag waits up to its timeout
    except OSError:  # the reader gone (`| head -1`) or the disk full: the answer given is still logged
        record(agent.settings, result, err, conversation, "ask")
        raise
    fetch_failed_notes(result, agent, err)
    trimmed = sum(e.fields.get("count", 0) for e in result.state.audit if e.event == "history_trimmed")
    if trimmed:  # earlier turns given, and not read: say so, as `ask -c` does
        window = result.state.context_window  # a server's smaller window: raising the setting changes nothing
        fit = (f"the model's context window on the server ({window:,} tokens)" if window is not None
               else f"KB_AGENT_CONTEXT_TOKENS={agent.settings.context_tokens}")
        err.write(f"crag: note: the answer was written without the {trimmed:,} oldest of the {len(history):,} "
                  f"history messages, which do not fit {fit}\n")
    if gone:
        err.write(gone + "\n")
    record(agent.settings, result, err, conversation, "ask")
    return 0
