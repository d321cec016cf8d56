"""``mcp`` and ``graph``: crag served to MCP clients, and its transition table drawn."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from ..errors import UsageError
from .ask import agent_for
from .common import check_readable, settings


def cmd_mcp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..mcp_server import check_descriptions, missing_extra, serve

    settings()
    if sys.stdin is None:  # `crag mcp <&-`: no client can send a request
        raise UsageError("standard input is closed: crag mcp serves one MCP client over its standard input and "
                         "output; let the client start it")
    check_readable(sys.stdin)
    problem = missing_extra()
    if problem is not None:
        raise UsageError(problem)
    check_descriptions()
    with agent_for(args, err) as agent:
        from ..index import make_embedder

        make_embedder(agent.settings)  # a setting it refuses stops the server here, as it stops ``chat``
        serve(agent)
    return 0


def cmd_graph(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..graph import mermaid

    out.write(mermaid())
    return 0
