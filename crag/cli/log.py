"""``log``: the answers crag gave, newest first; and the logging ``ask``, ``chat`` and
``mcp`` do (``crag.answer_log``).

``crag log`` lists the last answers (``-n``), ``crag log QUERY`` those whose question or
answer holds every word of the query, ``crag log --show ID`` one answer in full (``last``
for the newest); ``--json`` prints a JSON array of whole entries instead.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from ..errors import UsageError
from .common import prog, settings, shown, shown_json


def answer_log(config):
    """The answer log of ``config``'s index, or None when ``KB_AGENT_LOG=off``."""
    if not config.log:
        return None
    from ..answer_log import AnswerLog

    return AnswerLog.for_settings(config)


def record(config, answer, err: TextIO, conversation: int | None = None, source: str = "ask") -> int | None:
    """Log one answer (when logging is on); a log that cannot be written is a note on stderr,
    never a lost answer. Returns the conversation's id."""
    from ..answer_log import LogError

    log = answer_log(config)
    if log is None:
        return conversation
    try:
        with log:
            conversation, _ = log.record(answer, config, conversation=conversation, source=source)
    except LogError as exc:
        err.write(shown(f"crag: note: {exc}") + "\n")
    return conversation


def last_conversation(config, err: TextIO) -> tuple[int | None, list[dict[str, str]]]:
    """The newest logged conversation, for ``ask -c`` and ``chat --continue``."""
    log = answer_log(config)
    if log is None:
        raise UsageError("KB_AGENT_LOG=off keeps no conversation to continue")
    with log:
        found = log.last_conversation()
    if found[0] is None:
        err.write(f"crag: note: no earlier conversation in {log.path}; starting a new one\n")
    return found


def _when(ts: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _one_line(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def cmd_log(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..answer_log import AnswerLog

    config = settings()
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"-n must be at least 1, got {args.limit}")
    log = AnswerLog.for_settings(config)
    query = " ".join(args.words)
    with log:
        if args.show is not None:
            if args.show == "last":
                entries = log.entries(limit=1)
            elif args.show.isdigit():
                entries = log.entries(ids=[int(args.show)], limit=None)
            else:
                raise UsageError(f"--show takes an answer's number (see `{prog()} log`) or 'last', got {args.show!r}")
            if not entries:
                raise UsageError(f"no answer {args.show} in {log.path} (`{prog()} log` lists them)")
        else:
            entries = log.entries(query, limit=args.limit or (None if args.json else 10))
    if args.json:
        out.write(shown_json([e.to_dict() for e in entries], indent=2) + "\n")
        return 0
    if args.show is not None:
        out.write(shown(_full(entries[0])) + "\n")
        return 0
    if not entries:
        what = f"matching {query!r} " if query else ""
        off = " (KB_AGENT_LOG=off: nothing is logged)" if not config.log else ""
        out.write(shown(f"no logged answers {what}in {log.path}{off}") + "\n")
        return 0
    from ..answer import OFFLINE_PREFACE

    for e in entries:
        tokens = e.usage["total_tokens"]
        gist = e.body.replace(OFFLINE_PREFACE, "").lstrip(" \n-*")  # the offline answer's preface says nothing
        out.write(shown(f"#{e.id}  {_when(e.time)}  {e.model}  {_one_line(e.question, 70)}") + "\n")
        out.write(shown(f"      {_one_line(gist, 90)}  ({len(e.citations)} cited, {tokens:,} tokens)") + "\n")
    out.write(f"\n`{prog()} log --show ID` prints one answer in full\n")
    return 0


def _full(e) -> str:
    lines = [
        f"#{e.id}  {_when(e.time)}  {e.source}, conversation {e.conversation}",
        f"model: {e.model}; {e.usage['llm_calls']} LLM calls, {e.usage['total_tokens']:,} tokens, "
        f"{e.usage['latency_ms']:,.0f} ms; {e.complexity or 'unrouted'}, {e.iterations} retrieval round(s)",
        "",
        f"you> {e.question}",
        "",
        e.answer,
    ]
    return "\n".join(lines)
