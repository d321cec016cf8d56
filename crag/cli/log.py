"""``log``: the answers crag gave, newest first; and the logging ``ask``, ``chat`` and
``mcp`` do (``crag.answer_log``).

``crag log`` lists the last answers (``-n``), ``crag log QUERY`` those whose question or
answer holds every word of the query, ``crag log --show ID`` one answer in full (``last``
for the newest); ``--json`` prints a JSON array of whole entries instead. Entries are
printed as they are read from the log, so neither form holds the whole log in memory; a
damaged row is printed with what is damaged named, never a traceback. A log read from
outside the working folder is named on stderr, as the other commands name their index.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from ..errors import UsageError
from ..safe_text import short_value
from .common import not_utf8, settings, shown, shown_json, shown_message, suggested


def answer_log(config):
    """The answer log of ``config``'s index, or None when ``KB_AGENT_LOG=off``."""
    if not config.log:
        return None
    from ..answer_log import AnswerLog

    return AnswerLog.for_settings(config)


def record(config, answer, err: TextIO, conversation: int | None = None, source: str = "ask",
           said: set[str] | None = None) -> int | None:
    """Log one answer (when logging is on); a log that cannot be written is a note on stderr,
    never a lost answer. Returns the conversation's id. ``said`` holds the notes written
    already (a ``chat`` session's): the same note is not written again after every answer."""
    from ..answer_log import LogError

    log = answer_log(config)
    if log is None:
        return conversation
    try:
        with log:
            conversation, _ = log.record(answer, config, conversation=conversation, source=source)
    except LogError as exc:
        note = shown_message(f"crag: note: {exc}")
        if said is None or note not in said:
            err.write(note + "\n")
        if said is not None:
            said.add(note)
    return conversation


def last_conversation(config, err: TextIO) -> tuple[int | None, list[dict[str, str]]]:
    """The newest logged conversation, for ``ask -c`` and ``chat --continue``."""
    log = answer_log(config)
    if log is None:
        raise UsageError("KB_AGENT_LOG=off keeps no conversation to continue: leave -c/--continue out, or set KB_AGENT_LOG=on")
    from ..history import input_limit

    with log:
        found = log.last_conversation(input_limit(config))
    if found[0] is None and not found[1]:
        err.write(shown_message(f"crag: note: no earlier conversation in {log.path}; starting a new one") + "\n")
    elif not found[1]:  # its newest turn alone cannot fit: the question would go without a word of it
        err.write(f"crag: note: the last conversation's newest turn is longer than KB_AGENT_CONTEXT_TOKENS="
                  f"{config.context_tokens} can fit; carrying it on without its earlier turns\n")
    return found


def _when(ts: float | None) -> str:
    from datetime import datetime

    if ts is None:
        return "????-??-?? ??:??"
    try:
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, ValueError, OSError):
        return "????-??-?? ??:??"


def _one_line(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _estimated(usage: dict) -> str:
    """"estimated for 2 of 3 calls" when crag counted the tokens of some of an entry's calls (the
    usage block and the error line say so too), else ""."""
    estimated = usage.get("estimated_calls")
    return f"estimated for {estimated:,} of {_count(usage['llm_calls'])} calls" if isinstance(estimated, int) else ""


def _show_arg(value: str) -> int | None:
    """``--show``'s answer number, None for ``last``; anything else is a usage error."""
    if value.strip().lower() == "last":  # LAST and Last too
        return None
    if value.isascii() and value.isdigit():
        return int(value)
    raise UsageError(f"--show takes an answer's number (see `python -m crag log`) or 'last', got '{short_value(value)}'")


MAX_WORDS = 100  # of a log search


def _check_store(uri: str) -> None:
    """``KB_AGENT_STORE`` read as the PostgreSQL store reads it (when psycopg is installed:
    without it the log, a local file, is still read)."""
    try:
        import psycopg
    except ImportError:
        return
    from ..index.postgres import check_uri

    check_uri(uri, psycopg)


def cmd_log(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..answer_log import AnswerLog

    config = settings()
    if config.store:  # a URI every other command refuses is refused here too, though the log is a file
        _check_store(config.store)
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"-n must be at least 1, got {args.limit}")
    distinct: dict[str, str] = {}  # "port PORT": one word, as first given
    for word in " ".join(args.words).split():
        distinct.setdefault(word.casefold(), word)
    words = list(distinct.values())
    if len(words) > MAX_WORDS:  # SQLite's expression tree is at most 1000 deep
        raise UsageError(f"QUERY has {len(words):,} different words; crag log searches with at most {MAX_WORDS}")
    query = " ".join(words)
    if not_utf8(query):
        raise UsageError(f"QUERY '{short_value(query)}' holds bytes that are not UTF-8; no logged text can match it")
    show = _show_arg(args.show) if args.show is not None else None
    if args.show is not None and (query or args.limit is not None):
        raise UsageError("--show prints one answer: give it without QUERY and -n")
    if not config.log:  # the answers listed were kept earlier; say that new ones are not
        err.write("crag: note: KB_AGENT_LOG=off: new answers are not logged\n")
    log = AnswerLog.for_settings(config)
    with log:
        if args.show is not None:
            entries = log.iter_entries(limit=1) if show is None else log.iter_entries(ids=[show], limit=None)
        else:
            entries = log.iter_entries(query, limit=args.limit or (None if args.json else 10))
        if args.show is not None:
            entry = next(iter(entries), None)
            if entry is None and show is None:  # ``last`` of a log with no answer
                raise UsageError(f"no logged answers in {log.path}")
            if entry is None:
                raise UsageError(f"no answer {args.show} in {log.path} (`python -m crag log` lists them)")
            if args.json:
                _write_json([entry], out)
            else:
                out.write(shown(_full(entry)) + "\n")
            return _log_note(log.path, err)
        if args.json:
            _write_json(entries, out)
            return _log_note(log.path, err)
        if not _write_list(entries, out):
            what = f"matching '{short_value(query)}' " if query else ""  # as typed: no doubled backslash
            off = " (KB_AGENT_LOG=off: nothing is logged)" if not config.log else ""
            out.write(shown(f"no logged answers {what}in {log.path}{off}") + "\n")
            return 0
    out.write(f"\n`{suggested()} log --show ID` prints one answer in full\n")
    return _log_note(log.path, err)


def _log_note(path: str, err: TextIO) -> int:
    """Say on stderr which answer log was read when it lies outside the working folder (beside
    an index found in a parent or named by ``--index`` or ``KB_AGENT_INDEX_DIR``, or in the
    user's state folder), as ``index_note`` names the index; not when there is no log file
    (the output's own line names it then). The exit status, 0."""
    import os

    from ..index.discover import relative_label
    from ..index.labels import is_within

    if is_within(os.path.abspath(path), os.path.abspath(os.getcwd())) or not os.path.isfile(path):
        return 0  # under the working folder, "/" included
    err.write(shown_message(f"crag: log {relative_label(path)}") + "\n")
    return 0


def _write_json(entries, out: TextIO) -> None:
    """The JSON array of ``entries``, written one entry at a time: the same text as
    ``json.dumps(list, indent=2)``, without the list. A log that cannot be read past some
    entry (a damaged page) ends the array after the entries read, then fails."""
    from ..answer_log import LogError

    first = True
    try:
        for entry in entries:
            text = shown_json(entry.to_dict(), out, indent=2)  # no raw newline inside: JSON escapes it
            out.write(("[\n" if first else ",\n") + "\n".join("  " + line for line in text.split("\n")))
            first = False
    except LogError:  # a damaged page part way: the entries read before it stay a JSON array (exit 1)
        if not first:
            out.write("\n]\n")
        raise
    out.write("[]\n" if first else "\n]\n")


def _write_list(entries, out: TextIO) -> int:
    """Two lines per entry, as each is read; the number written."""
    from ..answer import OFFLINE_PREFACE

    count = 0
    for e in entries:
        gist = e.body.replace(OFFLINE_PREFACE, "").lstrip(" \n-*")  # the offline answer's preface says nothing
        damaged = f"  [damaged: {', '.join(e.damaged)}]" if e.damaged else ""
        out.write(shown(f"#{e.id}  {_when(e.time)}  {e.model}  {_one_line(e.question, 70)}{damaged}") + "\n")
        guess = _estimated(e.usage)
        out.write(shown(f"      {_one_line(gist, 90)}  ({len(e.citations)} cited, "
                        f"{_count(e.usage['total_tokens'])} tokens{', ' + guess if guess else ''})") + "\n")
        count += 1
    return count


def _full(e) -> str:
    latency, guess = e.usage["latency_ms"], _estimated(e.usage)
    lines = [
        f"#{e.id}  {_when(e.time)}  {e.source}, conversation {e.conversation if e.conversation is not None else '?'}",
        f"model: {e.model}; {_count(e.usage['llm_calls'])} LLM calls, {_count(e.usage['total_tokens'])} tokens"
        f"{f' ({guess})' if guess else ''}, "
        f"{f'{latency:,.0f}' if latency is not None else '?'} ms; {e.complexity or 'unrouted'}, "
        f"{_count(e.iterations)} retrieval round(s)",
        *([f"damaged: {', '.join(e.damaged)} (the log's row does not hold what crag wrote)"] if e.damaged else []),
        "",
        f"you> {e.question}",
        "",
        e.answer,
    ]
    return "\n".join(lines)
