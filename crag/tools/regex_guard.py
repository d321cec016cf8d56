"""Regular expressions from a plan, run with a time limit.

Python's ``re`` backtracks: a pattern such as ``^(\\w+\\s?)*$`` takes exponential time on an
ordinary 120-character line, and a running match can be neither interrupted nor timed out
from inside the process (it holds the interpreter lock). A pattern a model wrote is
untrusted input, so ``matching_lines`` runs it in a separate Python process over the lines
to search and kills that process when it exceeds ``TIME_LIMIT`` seconds, plus
``SECONDS_PER_MB`` for each megabyte of text it is sent (sending and searching the lines of a
large knowledge base takes time whatever the pattern: 45 MB took 3.5 to 5 s on a 2-core
machine, so a plain ``filler text`` was refused as if it backtracked); the caller gets a
``RegexRefused`` and reports it as a tool error. Literal (escaped) patterns never need this:
they match in linear time and stay in process. The process also ends itself (``SIGALRM``, on
POSIX) a second after that limit: the process that started it can be gone without killing it
(``crag mcp`` stopped by SIGTERM, as a client stops its server), and a match left running
would hold a CPU for as long as it backtracks, which may be forever. A call cancelled meanwhile
(``crag.llm.deadline``: an MCP client's cancellation, or its closing the connection) kills
the process within ``CANCEL_CHECK`` seconds and raises ``Cancelled``, as a wait for a server does.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from ..llm.deadline import CANCEL_CHECK, check_cancelled

__all__ = ["SECONDS_PER_MB", "TIME_LIMIT", "RegexRefused", "matching_lines"]

TIME_LIMIT = 5.0  # seconds for one call's matching, process start included
SECONDS_PER_MB = 0.25  # more seconds per megabyte of lines sent to the matching process

_WORKER = """
import json, re, signal, sys
if hasattr(signal, "alarm"):  # its default action ends the process, even inside a match
    signal.alarm(int(sys.argv[1]))
request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
rx = re.compile(request["pattern"], re.IGNORECASE)
n = request["max_chars"]
found = [[i for i, line in enumerate(doc) if rx.search(line[:n])] for doc in request["documents"]]
sys.stdout.write(json.dumps(found))
"""


class RegexRefused(Exception):
    """The pattern did not finish within the time limit (or could not be run at all)."""


def matching_lines(
    pattern: str,
    documents: Sequence[Sequence[str]],
    *,
    max_chars: int,
    time_limit: float | None = None,
) -> list[list[int]]:
    """Per document, the 0-based indexes of the lines whose first ``max_chars`` characters
    match ``pattern`` (case-insensitive). Raises ``RegexRefused`` past ``time_limit``
    (default ``TIME_LIMIT`` plus ``SECONDS_PER_MB`` per megabyte of ``documents``);
    ``pattern`` must already compile (``re.error`` is the caller's to report)."""
    if not documents:
        return []
    request = json.dumps({"pattern": pattern, "max_chars": max_chars, "documents": documents}).encode("utf-8")
    limit = TIME_LIMIT + SECONDS_PER_MB * len(request) / 1e6 if time_limit is None else time_limit
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _WORKER, str(math.ceil(limit) + 1)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = _communicate(proc, request, limit)
    except subprocess.TimeoutExpired:
        raise RegexRefused(f"the regular expression took longer than {round(limit, 1):g} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if hasattr(signal, "SIGALRM") and proc.returncode == -signal.SIGALRM:  # it ended itself first (a busy machine)
        raise RegexRefused(f"the regular expression took longer than {round(limit, 1):g} s")
    if proc.returncode != 0:
        last = (err.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        raise RegexRefused(f"the regular expression could not be run ({last[:200]})")
    found = json.loads(out)
    return [[int(i) for i in lines] for lines in found]


def _communicate(proc: subprocess.Popen, request: bytes, limit: float) -> tuple[bytes, bytes]:
    """``proc.communicate(request, timeout=limit)``, waiting in slices of ``CANCEL_CHECK``
    seconds so that a cancelled call stops waiting (``Cancelled``); a retried ``communicate``
    goes on sending the request where it stopped."""
    end = time.monotonic() + limit
    given: bytes | None = request
    while True:
        try:
            return proc.communicate(given, timeout=max(0.0, min(CANCEL_CHECK, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= end:
                raise
        given = None
        check_cancelled()
