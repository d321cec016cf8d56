"""What every command of the command line shares: the parser class, the program's name,
settings, and the two ways text leaves crag (``shown`` for a terminal, ``shown_json`` for
JSON), both with every configured secret redacted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

from ..errors import CragError, UsageError
from ..safe_text import ascii_json, for_terminal, json_text, redact, redact_message
from ..text import one_line

KB_HELP = "knowledge-base root (repeatable): indexed first when new or changed; the tools look only inside"
TOP_K_HELP = "hits per vector_search (default KB_AGENT_TOP_K)"


class Terminated(BaseException):
    """SIGTERM (``kill PID``, a service stopping): raised in the main thread, so the run stops
    as after Ctrl-C (the status erased, the index lock let go, nothing logged) and says so."""


class Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)

    def _print_message(self, message: str, file: TextIO | None = None) -> None:
        """The help, written as any output is: argparse drops a write that fails (a full disk),
        which left ``crag --help > /dev/full`` silent with exit status 0."""
        if message:
            (file or sys.stdout).write(message)


def path_arg(value: str) -> str:
    """A path on the command line: an empty one would silently mean the working directory."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path names no file or folder (it is not taken for the working directory)")
    if "\x00" in value:
        raise argparse.ArgumentTypeError("a path cannot contain a NUL character")
    return value


def int_arg(value: str) -> int:
    """An integer on the command line, in ASCII digits as a setting's (int() also reads "1_0" and "５")."""
    if re.fullmatch(r"[+-]?[0-9]+", value.strip()):
        try:
            return int(value)
        except ValueError:  # more than 4,300 digits
            pass
    raise argparse.ArgumentTypeError(f"invalid int value: {value!r}")


def prog() -> str:
    """``crag`` when run through the installed command, else ``python -m crag``."""
    return "crag" if os.path.basename(sys.argv[0] or "") == "crag" else "python -m crag"


def own_name(message: str) -> str:
    """A message of crag's (an error, a note, a report) with the commands it suggests spelled
    the way this program was run: ``crag index`` to a user who typed ``crag``, and with this
    run's ``--index DIR`` (``suggested``); a model this run's ``-m/--model`` gave is named as
    that option, not as ``KB_AGENT_MODEL``. Never applied to an answer or a document's text."""
    if OVERRIDES.get("model"):  # the server knows no such model: the option named it, not the setting
        message = message.replace("check KB_AGENT_MODEL (", "check -m/--model (")
    name = suggested()
    if name == "python -m crag":
        return message
    message = re.sub(r"`python -m crag(?! --index )", lambda _: f"`{name}", message)  # once: suggested() may have run
    if OVERRIDES.get("index_dir"):  # the command names the index: "(with KB_AGENT_INDEX_DIR=DIR)" would say it twice
        message = re.sub(r"(`[^`]* --index [^`]*`) \(with KB_AGENT_INDEX_DIR=[^)]*\)", r"\1", message)
    return message


# -m/--model and --index DIR of this run, as Settings overrides (set by ``main``).
OVERRIDES: dict[str, str] = {}


def suggested() -> str:
    """How a command crag suggests starts: the program as it was run, and ``--index DIR`` when
    this run was given one (without it, the suggested command would use another index), unless
    KB_AGENT_STORE names a database: the run did not use DIR, nor would the command."""
    import shlex

    index = OVERRIDES.get("index_dir")
    return f"{prog()} --index {shlex.quote(index)}" if index and not _database_store() else prog()


def _database_store() -> bool:
    """Whether this run's settings keep the index in a database (KB_AGENT_STORE)."""
    try:
        return bool(settings().store)
    except CragError:  # settings that are not valid: their own error says so
        return False


# The secrets of this run, found when first asked for and kept until ``main`` ends (it
# forgets them at its start and its end): a command printing 100,000 lines looks for them once.
_RUN_SECRETS: list[tuple[str, ...]] = []


def secrets() -> tuple[str, ...]:
    """The configured secrets (``crag.environment.secret_values``), found once per run."""
    from ..config import secret_values

    if not _RUN_SECRETS:
        _RUN_SECRETS.append(secret_values())
    return _RUN_SECRETS[0]


def forget_secrets() -> None:
    """Look for the secrets again when next asked: a new run, with its own environment."""
    _RUN_SECRETS.clear()


def error_line(exc: BaseException) -> str:
    """``crag: error: <message>``: one line, secrets redacted, nothing a terminal would obey. A
    question that failed after LLM calls it paid for says what they cost (``LLMError.spent``)."""
    message = str(exc) + (exc.cost_note() if isinstance(exc, CragError) else "")
    return "crag: error: " + one_line(redact_message(for_terminal(own_name(message)), secrets()))


def shown(text: str) -> str:
    """Text for the terminal: no escape sequence or control character, secrets redacted (after
    the removal, so a control character inside a key cannot hide it from redaction). For text
    that holds documents or answers: a configured value is masked when it is secret-shaped
    (``crag.safe_text.secret_shaped``)."""
    return redact(for_terminal(text), secrets())


def shown_message(text: str) -> str:
    """One of crag's own messages for the terminal (a note, an error): as ``shown``, with every
    configured secret masked whatever its shape, and any URL's password."""
    return redact_message(for_terminal(text), secrets())


def shown_json(value: object, out: TextIO | None = None, **kwargs: object) -> str:
    """JSON for stdout: control characters escaped, secrets redacted (also as JSON spells them);
    for an ``out`` whose encoding cannot write every character, all of it ASCII."""
    import json

    found = secrets()
    text = redact(json_text(value, **kwargs), (*found, *(json.dumps(s)[1:-1] for s in found)))
    return text if out is None or writes_any_text(out) else ascii_json(text)


def writes_any_text(stream: TextIO) -> bool:
    """Whether ``stream``'s encoding writes every character (UTF-8 does; an ASCII or Latin-1
    locale's does not)."""
    encoding = getattr(stream, "encoding", None)
    if not isinstance(encoding, str):
        return True  # a StringIO: text, not bytes
    try:
        "\u00e9\u2026\U0001f4ca".encode(encoding)
    except (UnicodeError, LookupError):
        return False
    return True


def never_fails_to_encode(stream: TextIO) -> None:
    """A standard output whose encoding cannot write every character (an ASCII locale) writes
    what it cannot as backslash escapes, as Python's standard error does, rather than failing
    with ``UnicodeEncodeError`` in the middle of an answer."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None and not writes_any_text(stream):
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError, TypeError):
            pass


def utf8_arguments(argv: list[str]) -> list[str]:
    """The words of a question or query as UTF-8 text whatever the locale: under an ASCII locale
    Python keeps the bytes of ``café`` as lone surrogates; a word whose bytes are not UTF-8
    keeps them. Never for paths, which the operating system takes back as the bytes they were."""
    decoded = []
    for word in argv:
        if not_utf8(word):
            try:
                word = os.fsencode(word).decode("utf-8")
            except (UnicodeError, ValueError):
                pass
        decoded.append(word)
    return decoded


def settings(**overrides: object):
    """The settings of this run: environment, ``.env``, then the command line's options."""
    from ..config import Settings

    return Settings.from_env(**{k: v for k, v in {**OVERRIDES, **overrides}.items() if v is not None})


def index_label(config) -> str:
    """The index a command uses, as messages show it: a folder relative to the working
    directory, or a PostgreSQL store's URI without its password."""
    from ..index.discover import relative_label

    return redact_message(config.store, config.secrets()) if config.store else relative_label(config.index_dir)


def waiting_note(config, err: TextIO):
    """What a command that indexes calls when another crag index holds the index: one line
    saying so, not silence (it may wait up to two minutes)."""
    from ..index.postgres import redact
    from ..safe_text import display_name

    where = redact(config.store) if config.store else display_name(config.index_dir)  # as "indexed ... into" says

    def waiting() -> None:
        err.write(f"crag: another crag index is at work on {where}; waiting for it to finish\n")
        err.flush()

    return waiting


@contextlib.contextmanager
def waits_shown(line) -> Iterator[None]:
    """Inside the block, the embeddings server's retry waits show on ``line`` (its ``waiting``
    takes each ``RetryWaiting``; None, off a terminal: nothing shows), which is cleared at the
    end, so a wait's line is not left behind."""
    if line is None:
        yield
        return
    from ..llm.retry import reporting_waits

    try:
        with reporting_waits(line.waiting):
            yield
    finally:
        line.clear()


def index_note(config, err: TextIO) -> None:
    """Say on stderr which index a command uses when it lies outside the working directory (found
    in a parent folder, or named by ``--index`` or ``KB_AGENT_INDEX_DIR``); ``roots`` always
    names it, and ``ask --json`` has it as ``index``. Not for a folder with no index yet: the
    command's own line names it then (``indexed ... into DIR``, or the error ``no index in DIR``)."""
    from ..index.labels import is_within
    from ..index.layout import current_exists

    if config.store or is_within(os.path.abspath(config.index_dir), os.path.abspath(os.getcwd())):
        return  # under the working folder, "/" included
    if not current_exists(config.index_dir):
        return
    err.write(shown_message(f"crag: index {index_label(config)}") + "\n")


def require_index_libraries() -> None:
    """Fail before touching the index (no lock taken) when the index's libraries are missing."""
    from importlib.util import find_spec

    for name in ("numpy", "faiss", "tiktoken"):
        if find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def dumb_terminal(environ: dict[str, str] | None = None) -> bool:
    """A terminal that takes no cursor control (``TERM=dumb``, or no ``TERM`` outside Windows)."""
    term = (os.environ if environ is None else environ).get("TERM", "")
    return term == "dumb" or (not term and os.name != "nt")


def terminal_size(stream: TextIO | None = None) -> tuple[int, int]:
    """Columns and lines of the terminal ``stream`` writes to: ``COLUMNS`` and ``LINES`` when
    set, else that terminal's own size (standard output may be a pipe while the status goes to
    a terminal on stderr), else standard output's, else 80 x 24."""
    size = shutil.get_terminal_size((80, 24))
    if stream is None or os.environ.get("COLUMNS"):
        return size.columns, size.lines
    try:
        own = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError):
        return size.columns, size.lines
    return own.columns or size.columns, own.lines or size.lines


def isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def undecodable_bytes_kept(stream: TextIO) -> None:
    """Read standard input as UTF-8 whatever the locale, and bytes that are not UTF-8 as lone
    surrogates (``not_utf8`` finds them) instead of failing the read: Python reads standard
    input strictly, in the locale's encoding (ASCII under the C locale)."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(encoding="utf-8", errors="surrogateescape")
        except (ValueError, OSError, TypeError):
            try:  # something was read already: the encoding stays
                reconfigure(errors="surrogateescape")
            except (ValueError, OSError, TypeError):
                pass


def unreadable_input(exc: OSError) -> UsageError:
    """The one line for a standard input that fails to be read (open for writing only, a
    terminal gone), instead of a traceback."""
    return UsageError(f"standard input cannot be read ({exc.strerror or exc}): run crag with its input coming from "
                      "somewhere (a terminal, a file, a pipe, or /dev/null)")


def check_readable(stream: TextIO) -> None:
    """Fail at once, with ``unreadable_input``'s line, when standard input is open for writing
    only (``crag chat 0>/dev/null``), before a session or a server starts on it."""
    try:
        import fcntl

        flags = fcntl.fcntl(stream.fileno(), fcntl.F_GETFL)
    except (ImportError, OSError, ValueError, AttributeError):  # no such check here, or not a file
        return
    if flags & os.O_ACCMODE == os.O_WRONLY:
        import errno

        raise unreadable_input(OSError(errno.EBADF, "it is open for writing only"))


def not_utf8(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


def usage_hint(exc: UsageError, argv: Sequence[str], parser: argparse.ArgumentParser) -> UsageError:
    """A usage error, with how to give a path that starts with ``-`` when a word of ``argv``
    taken for an option names a file or folder (``crag index -notes.md``); and ``crag index``
    without a path, as the notes on a root gone from disk ("dropped by the next `crag index`")
    may lead one to type it, with what to name and where the index's roots are listed."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    for word in words:
        if word.startswith("-") and word != "-" and "=" not in word and "\x00" not in word and os.path.lexists(word):
            from ..safe_text import display_name

            name = display_name(word)
            return UsageError(f"{exc} ({name} is taken for an option: write the path as ./{name})")
    if str(exc) != "the following arguments are required: PATH":
        return exc
    try:  # this run's --index, which the suggested commands carry (``suggested``)
        OVERRIDES["index_dir"] = parser.parse_known_args([*argv, "."])[0].index
    except (UsageError, SystemExit):
        pass
    return UsageError(f"{exc} (name the folders or files of your documents, as in `{suggested()} index docs`; "
                      f"`{suggested()} roots` lists those the index holds)")
