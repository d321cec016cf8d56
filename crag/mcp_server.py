"""``python -m crag mcp``: crag as a Model Context Protocol server over stdio.

Built on the official ``mcp`` SDK (the optional extra ``crag[mcp]``), it serves three tools
to an MCP client (Claude Desktop, Cursor, Claude Code, any agent that speaks MCP):

    ask(question, history=None)                  the answer text; structured content is the
                                                 object ``ask --json`` prints (citations,
                                                 usage, grounding, trace, ...)
    search(query, top_k=None)                    ``{"hits": [...]}``, the hits of ``search --json``
    read_file(path, start_line=None, end_line=None)
                                                 lines of a file inside the knowledge-base roots

The agent, and with it the index, is built once when the server starts (``--kb`` roots are
indexed first, as for ``ask``) and serves every call; an indexer that publishes a newer
index is picked up by the next search. Calls run one at a time. A call that fails (a path
outside the roots, an unreachable LLM, a bad argument) is an MCP tool error whose text is
crag's one-line message; the server keeps running. Nothing but the protocol is written to
stdout; notes go to stderr. Every configured secret (and anything shaped like a credential)
is redacted from what the tools return, as the command line redacts what it prints, so a
model or a document that echoes a key does not hand it to the client. See ``docs/mcp.md``.
"""

# No ``from __future__ import annotations``: the SDK reads the tools' annotations at run time.
import threading
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import secret_values
from .errors import CragError
from .safe_text import redact, redact_message
from .state import ToolCall

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from .agent import Agent

__all__ = ["build_server", "serve"]

INSTRUCTIONS = (
    "crag answers questions over a knowledge base of documents with file:line citations. "
    "Use `ask` for an answer with citations, `search` to see which passages match a query, "
    "and `read_file` to read a cited file around a line."
)


def build_server(agent: "Agent") -> "MCPServer":
    """An ``MCPServer`` whose three tools use ``agent`` (its model, toolbox and index)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError as MCPToolError
    from mcp_types import CallToolResult, TextContent

    from .index.commands import hit_records, search_text

    class Server(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except MCPToolError as exc:  # arguments the schema refuses: one line, not pydantic's report
                cause = exc.__cause__
                errors = getattr(cause, "errors", None)
                if cause is None or errors is None or not callable(errors):
                    raise
                what = "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', ())) or 'arguments'}: {e.get('msg', 'invalid')}"
                    for e in errors()
                )
                raise MCPToolError(" ".join(f"Error executing tool {name}: {what}".split())) from cause

    server = Server("crag", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    lock = threading.Lock()  # one call at a time: the SDK runs each in a worker thread

    def guarded(fn: Any, *args: Any) -> Any:
        with lock:
            try:
                return fn(*args)
            except CragError as exc:  # one line, with every configured secret redacted
                raise MCPToolError(" ".join(redact_message(str(exc), secret_values()).split())) from exc

    def result(text: str, structured: dict[str, Any]) -> CallToolResult:
        secrets = secret_values()
        return CallToolResult(
            content=[TextContent(type="text", text=redact(text, secrets))],
            structured_content=_redacted(structured, secrets),
        )

    def ask(question: str, history: list[dict[str, str]] | None = None) -> CallToolResult:
        """Answer a question from the knowledge base, citing file:line for what it says.

        `history` is an optional list of earlier turns, {"role": "user" | "assistant", "content": "..."}.
        The text is the answer with its footer and usage block; the structured content also has
        `citations`, `usage`, `grounding`, `complexity`, `trace` and `audit`.
        """
        answer = guarded(agent.ask, question, history or [])
        return result(answer.answer, answer.to_dict())

    def search(query: str, top_k: int | None = None) -> CallToolResult:
        """Retrieval only: the knowledge-base passages that best match `query`, best first.

        Each hit has `path`, `start_line`, `end_line`, `score` (cosine-like, 0 to 1) and `text`.
        `top_k` is how many hits (default: crag's KB_AGENT_TOP_K).
        """
        args: dict[str, Any] = {"query": query}
        if top_k is not None:
            args["top_k"] = top_k
        hits = hit_records(guarded(agent.toolbox.run, ToolCall("vector_search", args)))
        return result(search_text(hits), {"hits": hits})

    def read_file(path: str, start_line: int | None = None, end_line: int | None = None) -> CallToolResult:
        """Read lines of a file inside the knowledge-base roots (a path as `ask` and `search` cite it).

        `start_line` and `end_line` are 1-based and inclusive; at most 200 lines are returned.
        """
        args: dict[str, Any] = {"path": path}
        if start_line is not None:
            args["start_line"] = start_line
        if end_line is not None:
            args["end_line"] = end_line
        (item,) = guarded(agent.toolbox.run, ToolCall("read_file", args))
        structured = {"path": item.source, "start_line": item.start_line, "end_line": item.end_line, "text": item.text}
        return result(item.text, structured)

    for fn in (ask, search, read_file):
        server.add_tool(fn, structured_output=False)
    return server


def _redacted(value: Any, secrets: tuple[str, ...]) -> Any:
    """``value`` (JSON-like) with every string in it redacted."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {k: _redacted(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v, secrets) for v in value]
    return value


def serve(agent: "Agent") -> None:
    """Serve ``agent`` over stdio until the client closes the connection."""
    build_server(agent).run("stdio")


def missing_extra() -> str | None:
    """The one-line fix when the ``mcp`` SDK is not installed, else None."""
    from importlib.util import find_spec

    if find_spec("mcp") is None or find_spec("mcp_types") is None:
        return "the MCP server needs the optional extra: pip install 'crag[mcp]' (make install includes it)"
    return None
