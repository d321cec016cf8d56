"""``mcp`` and ``graph``: crag served to MCP clients, and its transition table drawn."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TextIO

from ..errors import CragError, UsageError
from .ask import agent_for
from .common import OVERRIDES, check_readable, settings


def cmd_mcp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..mcp_server import check_descriptions, for_a_shell, missing_extra, serve

    config = settings()
    if sys.stdin is None:  # `crag mcp <&-`: no client can send a request
        raise UsageError("standard input is closed: crag mcp serves one MCP client over its standard input and "
                         "output; let the client start it")
    check_readable(sys.stdin)
    problem = missing_extra()
    if problem is not None:
        raise UsageError(problem)
    check_descriptions()
    try:
        agent = agent_for(args, err)
    except CragError as exc:  # the --kb indexing failed: its advice aimed at this server's index, as a tool error's
        exc.args = (for_a_shell(str(exc), config, bool(OVERRIDES.get("model"))), *exc.args[1:])
        raise
    with agent:
        from ..index import make_embedder

        make_embedder(agent.settings)  # a setting it refuses stops the server here, as it stops ``chat``
        if agent.settings.store:  # so does a store it cannot open: no psycopg, a URI libpq refuses (none connects)
            from ..index import open_store

            open_store(agent.settings)
        previous = {signal.SIGINT: _end_on_ctrl_c(err), signal.SIGTERM: _end_on_sigterm()}
        try:
            serve(agent, model_option=bool(OVERRIDES.get("model")))
        finally:
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)
    return 0


def _end_on_sigterm():
    """While the server serves, SIGTERM (how a client stops its server) ends it at once, calls
    in flight with it, as the signal's default does (exit status 143 as a shell reports it).
    Until then it is handled as in every command: the ``--kb`` indexing stops as ``crag index``
    stops, with ``crag: terminated``, nothing published and the index lock let go. Returns the
    handler it replaces (None when none can be set: not the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):
        return None


def _end_on_ctrl_c(err: TextIO):
    """While the server serves, Ctrl-C (SIGINT) ends it at once, as SIGTERM does, with
    ``crag: interrupted`` and exit status 130: raised as ``KeyboardInterrupt``, it waited for
    the thread reading stdin, which cannot be stopped, until the client wrote a line or closed
    stdin. Calls in flight end with the process, as they do on SIGTERM. Returns the handler it
    replaces (None when none can be set: not the main thread). The ``--kb`` indexing before the
    server starts is not affected: Ctrl-C there stops it as it stops ``crag index``."""
    import os
    import threading

    from .common import isatty
    from .live import dumb_terminal

    if threading.current_thread() is not threading.main_thread():
        return None
    # at the start of a clean line of a terminal, where the terminal wrote ``^C``
    line = ("\r\033[K" if isatty(err) and not dumb_terminal() else "") + "crag: interrupted"

    def interrupted(signum: int, frame: object) -> None:
        try:
            print(line, file=err, flush=True)
        except (OSError, ValueError):  # stderr closed or full: the exit status still says it
            pass
        os._exit(130)

    try:
        return signal.signal(signal.SIGINT, interrupted)
    except (ValueError, OSError):
        return None


def cmd_graph(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..graph import mermaid

    out.write(mermaid())
    return 0
