"""The command line: ``python -m crag index | search | ask | chat | graph``.

The only module that prints or exits. Every expected failure is a ``CragError``; it is
printed as one line, ``crag: error: <message>``, on stderr and mapped to its exit status
(1 at run time, 2 for bad usage or configuration). Anything else is a bug and keeps its
traceback. Heavy libraries (openai, faiss, numpy, tiktoken) are imported inside the
commands that need them, so ``--help`` and ``graph`` start fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from .errors import CragError, UsageError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


KB_HELP = "knowledge-base root (repeatable): indexed first when new or changed; the tools look only inside"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m crag",
        description="Corrective-RAG answers over your documents, with file:line citations "
        "and the cost of every answer.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("index", help="build or update the index of knowledge-base folders/files")
    p.add_argument("paths", nargs="+", metavar="PATH", help="folders or files to index")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("search", help="retrieval only: what vector_search returns")
    p.add_argument("query")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="hits to return (default KB_AGENT_TOP_K)")
    p.add_argument("--kb", action="append", default=[], metavar="PATH", help=KB_HELP)
    p.add_argument("--json", action="store_true", help="print a JSON array")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("ask", help="answer one question")
    p.add_argument("question", help="the question, quoted")
    p.add_argument("--kb", action="append", default=[], metavar="PATH", help=KB_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--history", metavar="FILE", help='JSON list of {"role", "content"} messages')
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("chat", help="multi-turn session in the terminal")
    p.add_argument("--kb", action="append", default=[], metavar="PATH", help=KB_HELP)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("graph", help="print the transition table as a Mermaid diagram")
    p.set_defaults(func=cmd_graph)
    return parser


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args, out, err) or 0)
    except CragError as exc:
        print(f"crag: error: {_one_line(str(exc))}", file=err)
        return exc.exit_status
    except KeyboardInterrupt:
        print("crag: interrupted", file=err)
        return 130


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _settings():
    from .config import Settings

    return Settings.from_env()


def cmd_graph(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .graph import mermaid

    out.write(mermaid())
    return 0


def cmd_index(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .index import index_roots
    from .index.commands import index_report_text, is_terminal, progress_printer

    settings = _settings()
    progress = progress_printer(err) if is_terminal(err) else None
    report = index_roots(settings, args.paths, progress=progress)
    out.write(index_report_text(report))
    return 0


def cmd_search(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import json

    from .index.commands import index_report_text, search, search_text

    settings = _settings()
    hits, report = search(settings, args.query, args.top_k, args.kb)
    if report is not None and report.changed_anything:
        err.write(index_report_text(report))
    if args.json:
        out.write(json.dumps(hits, ensure_ascii=False) + "\n")
    else:
        out.write(search_text(hits))
    return 0


def _read_history(path: str) -> list:
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--history file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--history file {path} cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"--history file {path} is not JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(data, list):
        raise UsageError(f'--history file {path} must hold a JSON list of {{"role", "content"}} messages')
    return data


def _agent(kb: list[str], err: TextIO):
    from .agent import Agent

    notes = _IndexNotes(err)
    return Agent.from_env(kb=kb or None, progress=notes)


class _IndexNotes:
    """Prints indexing progress for ``--kb`` on stderr (stdout stays clean for --json)."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.tty = hasattr(err, "isatty") and err.isatty()

    def __call__(self, *args: object, **kwargs: object) -> None:
        if not self.tty:
            return
        text = " ".join(str(a) for a in args)
        self.err.write(f"\r\033[Kcrag: indexing {text}")
        self.err.flush()


def cmd_ask(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import json

    from .agent import parse_history

    history = parse_history(_read_history(args.history)) if args.history else ()
    _settings()  # validate configuration before any work
    with _agent(args.kb, err) as agent:
        result = agent.ask(args.question, history=history)
    if args.json:
        out.write(json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n")
    else:
        out.write(result.answer + "\n")
    return 0


class _Progress:
    """Shows which node is running on a terminal, and streams the answer when the backend can."""

    def __init__(self, err: TextIO, out: TextIO) -> None:
        self.err = err
        self.out = out
        self.tty = hasattr(err, "isatty") and err.isatty()
        self.renderer = None

    def __call__(self, kind: str, payload: object) -> None:
        streaming = self.renderer is not None  # the status line is gone once the answer streams
        if kind == "node_start" and self.tty and not streaming:
            self.err.write(f"\r\033[K  … {payload}")
            self.err.flush()
        elif kind == "node_end" and self.tty and not streaming:
            self.err.write("\r\033[K")
            self.err.flush()
        elif kind == "stream_start":
            from .answer import StreamRenderer
            from .prompts import clean_answer, strip_think

            if self.tty:
                self.err.write("\r\033[K")
            self.renderer = StreamRenderer(int(payload), clean_answer, strip_think)  # type: ignore[call-overload]
            self.out.write("\ncrag> ")
        elif kind == "delta" and self.renderer is not None:
            self.out.write(self.renderer.feed(str(payload)))
            self.out.flush()

    def finish(self, answer: str) -> None:
        """Print the rest of the answer (all of it when nothing streamed)."""
        if self.renderer is None:
            self.out.write("\ncrag> " + answer + "\n")
        else:
            self.out.write(self.renderer.rest(answer) + "\n")
        self.renderer = None
        self.out.flush()


def cmd_chat(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .agent import parse_history
    from .errors import LLMError, ToolError

    _settings()
    history: list[dict[str, str]] = []
    progress = _Progress(err, out)
    with _agent(args.kb, err) as agent:
        out.write("crag chat: ask about your knowledge base; an empty line or Ctrl-D ends the session.\n")
        while True:
            try:
                out.write("\nyou> ")
                out.flush()
                line = sys.stdin.readline()
            except KeyboardInterrupt:
                out.write("\n")
                break
            if not line or not line.strip():
                break
            question = line.strip()
            try:
                result = agent.ask(question, history=parse_history(history), on_event=progress, stream=True)
            except (LLMError, ToolError) as exc:
                progress.renderer = None
                print(f"crag: error: {_one_line(str(exc))}", file=err)
                continue
            progress.finish(result.answer)
            history.append({"role": "user", "content": question})
            history.append({"role": "assistant", "content": result.answer})
    return 0
