"""``python -m crag mcp``: crag as a Model Context Protocol server over stdio.

Built on the official ``mcp`` SDK (the optional extra ``crag-kb[mcp]``), it serves three tools
to an MCP client (Claude Desktop, Cursor, Claude Code, any agent that speaks MCP):

    ask(question, history=None)                  the answer text; structured content is the
                                                 object ``ask --json`` prints (citations,
                                                 usage, grounding, trace, ...)
    search(query, top_k=None)                    ``{"hits": [...]}``, the hits of ``search --json``
    read_file(path, start_line=None, end_line=None, page=None)
                                                 lines of a file inside the knowledge-base roots
                                                 (of one page of a PDF)

A place in a PDF is a ``page`` and lines on that page, in every tool's input and output
(``crag.pages.location``), as ``ask`` cites it.

Each tool publishes the JSON Schema of its structured content (``outputSchema``), and is
annotated read-only (it changes no file and no index; ``ask`` adds its answer to the answer
log, as the command line does), open-world only when a remote tool (web, Jira, Confluence)
is configured. Only tools are advertised: the server has no resources or prompts, so it
does not claim those capabilities. A tool's description (what tells an agent when to use
it) can be replaced through the environment or ``.env``: ``KB_AGENT_MCP_ASK_DESCRIPTION``,
``KB_AGENT_MCP_SEARCH_DESCRIPTION``, ``KB_AGENT_MCP_READ_FILE_DESCRIPTION`` (as
mcp-server-qdrant lets its users describe their collection).

The agent, and with it the index, is built once when the server starts (``--kb`` roots are
indexed first, as for ``ask``) and serves every call; an indexer that publishes a newer
index is picked up by the next search. Calls run side by side, each in a worker thread of its
own; a call the client cancels (``notifications/cancelled``) or abandons by closing stdin
stops waiting for its servers within a fraction of a second, and never holds the others. A
line that is not a JSON-RPC message gets a JSON-RPC error reply. A call that fails (a path
outside the roots, an unreachable LLM, a bad argument) is an MCP tool error whose text is
crag's one-line message; the server keeps running. Nothing but the protocol is written to
stdout; notes go to stderr. Every configured secret is redacted from what the tools return,
as the command line redacts what it prints, so a model or a document that echoes a key does
not hand it to the client; an error message also has anything shaped like a credential
masked, while documents and answers are never rewritten by a pattern. See ``docs/mcp.md``.
"""

# No ``from __future__ import annotations``: the SDK reads the tools' annotations at run time.
import os
import threading
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from . import __version__
from .config import secret_values
from .errors import ConfigError, CragError
from .llm.deadline import cancellable
from .mcp_wire import log_to_stderr, serve_stdio
from .pages import location
from .safe_text import for_terminal, redact, redact_message, short_value
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


_THREADS = 40  # calls of one tool (asks, searches or reads) running at once; more wait their turn

# Request handlers of capabilities crag does not offer: the SDK registers them on every server.
_UNOFFERED = ("prompts/list", "prompts/get", "resources/list", "resources/templates/list", "resources/read",
              "resources/subscribe", "resources/unsubscribe")


def description_variable(tool: str) -> str:
    """The environment variable that replaces a tool's description: ``KB_AGENT_MCP_ASK_DESCRIPTION``..."""
    return f"KB_AGENT_MCP_{tool.upper()}_DESCRIPTION"


def descriptions(tools: Any, environ: Any = None, dotenv: str | None = ".env") -> dict[str, str]:
    """The descriptions of ``tools`` (names) set by ``description_variable`` (environment first, then ``.env``).

    A description is sent to the client as JSON text: one holding bytes that are not UTF-8
    (possible in the environment) is a ``ConfigError`` naming its variable."""
    import os

    from .config import read_dotenv

    env = os.environ if environ is None else environ
    try:
        file_values = read_dotenv(dotenv) if dotenv else {}
    except CragError:
        file_values = {}
    out = {}
    for tool in tools:
        var = description_variable(tool)
        text = (env.get(var) or file_values.get(var) or "").strip()
        if any("\ud800" <= ch <= "\udfff" for ch in text):  # bytes that were not UTF-8
            raise ConfigError(var, text, "UTF-8 text (it holds bytes that are not UTF-8, and MCP sends it as JSON)")
        if text:
            out[tool] = text
    return out


def check_descriptions(environ: Any = None, dotenv: str | None = ".env") -> None:
    """``descriptions`` of every tool crag serves, for their errors only: run before the index
    is opened, so a description that cannot be sent is the command's one error line."""
    from .config import OTHER_VARIABLES

    tools = (v.removeprefix("KB_AGENT_MCP_").removesuffix("_DESCRIPTION").lower() for v in OTHER_VARIABLES)
    descriptions(tools, environ, dotenv)


def for_a_shell(message: str, settings: Any, model_option: bool = False) -> str:
    """``message`` with the commands it suggests aimed at this server's index: the server reads
    the index its client's configuration names, which a shell the user types the command in does
    not have (``crag index PATH`` there builds ``./.crag``). A model the server was given with
    ``-m/--model`` (``model_option``) is named as that option, not as ``KB_AGENT_MODEL``."""
    import re
    import shlex

    if model_option:
        message = message.replace("check KB_AGENT_MODEL (", "check -m/--model (")
    if settings.store:  # PostgreSQL: a shell without the client's KB_AGENT_STORE would build ./.crag
        return re.sub(r"(`python -m crag [^`]*`)(?! \(with KB_AGENT_STORE)",
                      lambda m: f"{m.group(1)} (with KB_AGENT_STORE set as this server has it)", message)
    where = shlex.quote(os.path.abspath(settings.index_dir))
    message = re.sub(r"`python -m crag (?!--index )", lambda _: f"`python -m crag --index {where} ", message)
    return re.sub(r"(`[^`]* --index [^`]*`) \(with KB_AGENT_INDEX_DIR=[^)]*\)", r"\1", message)


def _output_types() -> tuple[Any, Any, Any]:
    """The structured content of ask, search and read_file, as TypedDicts the SDK turns into
    ``outputSchema`` (and checks each result against)."""
    from typing import NotRequired

    from typing_extensions import TypedDict

    class Citation(TypedDict):
        n: int
        path: str
        line: int | None
        tool: str
        end_line: int | None
        page: NotRequired[int]

    class AskResult(TypedDict):
        question: str
        answer: str
        body: str
        complexity: str | None
        grader_action: str | None
        iterations: int
        trace: list[str]
        evidence_scores: list[float]
        citations: list[Citation]
        usage: dict[str, Any]
        audit: list[dict[str, Any]]
        grounding: dict[str, Any] | None
        judgements: list[dict[str, Any]]  # one verdict per judged sentence (docs/grounding.md)

    class Hit(TypedDict):
        path: str
        page: NotRequired[int]  # a PDF's: start_line and end_line are lines of this page
        start_line: int | None
        end_line: int | None
        end_page: NotRequired[int]  # when the lines run onto a later page, end_line's
        score: float | None
        text: str

    class SearchResult(TypedDict):
        hits: list[Hit]

    class FileLines(TypedDict):
        path: str
        page: NotRequired[int]
        start_line: int | None
        end_line: int | None
        text: str

    return AskResult, SearchResult, FileLines


def _turn_type() -> Any:
    """An earlier turn of ``ask``'s ``history``, as its input schema publishes it: ``role`` and
    ``content`` are required; other fields (an OpenAI message's ``name``, ``tool_calls``) are
    ignored, as ``crag ask --history`` ignores them."""
    from typing import Literal

    from typing_extensions import TypedDict

    class Turn(TypedDict):
        role: Literal["user", "assistant"]
        content: str

    return Turn


def build_server(agent: "Agent", *, model_option: bool = False) -> "MCPServer":
    """An ``MCPServer`` whose three tools use ``agent`` (its model, toolbox and index);
    ``model_option``: the model was given with ``-m/--model`` (``for_a_shell``)."""
    import inspect
    from typing import Annotated

    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError as MCPToolError
    from mcp.server.mcpserver.exceptions import UnexpectedToolError
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import BeforeValidator
    from pydantic_core import PydanticCustomError

    from .cli.index_text import hit_records, missing_roots_note, search_text

    def whole_number(value: Any) -> Any:
        """JSON ``true`` is no count: pydantic (and Python) would take it for 1. A number with no
        fraction is one however it is written: ``1e30`` is as many as ``10**30`` (pydantic
        refuses a float that large as an unparsable string)."""
        if isinstance(value, bool):
            raise PydanticCustomError("int_type", "Input should be a valid integer, not {value}",
                                      {"value": "true" if value else "false"})
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    Count = Annotated[int | None, BeforeValidator(whole_number)]
    Turn = _turn_type()

    class Server(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            """Every failing call's text is one line naming the tool once: ``search: top_k: ...``,
            ``read_file: no file x.md in the knowledge base``, not the SDK's ``Error executing
            tool read_file: read_file: ...``. A crash stays the SDK's (its text stays here).
            A tool crag does not serve is named with those it does, and an argument the tool does
            not take (``topK`` for ``top_k``) is refused by name, not ignored: the agent would get
            an answer to a call it did not make."""
            tool = self._tool_manager.get_tool(name)
            if tool is None:
                served = [t.name for t in self._tool_manager.list_tools()]
                raise MCPToolError(redact_message(f"unknown tool '{short_value(name, 40)}': this server's tools are "
                                                  f"{', '.join(served)}", secret_values()))
            known = tool.parameters.get("properties", {})
            unknown = [f"'{short_value(key, 40)}'" for key in arguments if key not in known]
            if unknown:
                named = ", ".join(unknown[:5]) + (", ..." if len(unknown) > 5 else "")
                raise MCPToolError(redact_message(f"{name}: unknown argument{'s' if len(unknown) > 1 else ''} {named} "
                                                  f"({name} takes {', '.join(known)})", secret_values()))
            try:
                return await super().call_tool(name, arguments, context)
            except UnexpectedToolError:
                raise
            except MCPToolError as exc:
                cause = exc.__cause__
                errors = getattr(cause, "errors", None)
                if cause is not None and callable(errors):  # arguments the schema refuses, not pydantic's report
                    what = "; ".join(
                        f"{'.'.join(str(p) for p in e.get('loc', ())) or 'arguments'}: {e.get('msg', 'invalid')}"
                        for e in errors()
                    )
                else:
                    prefix = f"Error executing tool {name}: "
                    if not str(exc).startswith(prefix):  # the SDK's own ("Unknown tool: x")
                        raise
                    what = str(exc).removeprefix(prefix)
                what = what.removeprefix(f"{name}: ")
                raise MCPToolError(" ".join(f"{name}: {what}".split())) from cause

    server = Server("crag", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    # Worker threads: asks (which wait on the model), searches (which wait on the embeddings
    # server when it embeds) and reads each have their own, so calls of one tool in flight,
    # however many, never hold another tool's.
    threads = {kind: anyio.CapacityLimiter(_THREADS) for kind in ("ask", "search", "read")}

    async def guarded(fn: Any, *args: Any, kind: str) -> Any:
        """``fn(*args)`` in a worker thread of its own, which a cancelled call really stops.

        Calls run side by side (the agent, its toolbox and index are shared safely), so a
        slow ``ask`` never holds a ``read_file``. When the client cancels the call (or goes
        away), the await is given up at once and the thread is told: its next wait for a
        server (``crag.llm.deadline``) raises instead, so it ends within a fraction of a second.
        """
        cancel = threading.Event()

        def work() -> Any:
            with cancellable(cancel):
                return fn(*args)

        try:
            return await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=threads[kind])
        except anyio.get_cancelled_exc_class():
            cancel.set()
            raise
        except CragError as exc:  # one line, with every configured secret redacted, and what it had cost
            said = for_a_shell(str(exc) + exc.cost_note(), agent.settings, model_option)
            raise MCPToolError(" ".join(redact_message(said, secret_values()).split())) from exc

    def result(text: str, structured: dict[str, Any]) -> CallToolResult:
        secrets = secret_values()
        return CallToolResult(
            content=[TextContent(type="text", text=redact(text, secrets))],
            structured_content=_redacted(structured, secrets),
        )

    ask_result, search_result, file_lines = _output_types()

    async def ask(question: str, history: list[Turn] | None = None) -> Annotated[CallToolResult, ask_result]:
        """Answer a question from the knowledge base, citing file:line for what it says.

        `history` is an optional list of earlier turns, {"role": "user" | "assistant", "content": "..."}.
        The text is the answer with its footer and usage block; the structured content also has
        `citations`, `usage`, `grounding`, `complexity`, `trace` and `audit`.
        """
        def answered() -> Any:  # answered and logged in one thread: a second one for the log queued behind asks
            answer = agent.ask(question, history or [])
            _log(agent, answer)
            return answer

        answer = await guarded(answered, kind="ask")
        return result(answer.answer, answer.to_dict())

    async def search(query: str, top_k: Count = None) -> Annotated[CallToolResult, search_result]:
        """Retrieval only: the knowledge-base passages that best match `query`, best first.

        Each hit has `path`, `start_line`, `end_line`, `score` (cosine-like, 0 to 1) and `text`;
        a PDF's hit also has `page`, and its lines are counted on that page.
        `top_k` is how many hits (default: crag's KB_AGENT_TOP_K; at most 50).
        """
        def searched() -> tuple[Any, tuple[str, ...]]:  # the search of ``crag search``, and its note
            return agent.search(query, top_k), agent.toolbox.missing_roots()

        items, missing = await guarded(searched, kind="search")
        hits = hit_records(items)
        note = missing_roots_note(missing, shared=bool(agent.settings.store))  # stderr for ``crag search``
        if note:  # its commands, typed in a shell, must reach this server's index
            note = for_a_shell(note, agent.settings, model_option)
        # the list ``crag search`` prints, shown to a person as it shows it: a document's escape
        # sequences and bidirectional overrides are left out (the hits keep the text as it is)
        return result(for_terminal(search_text(hits)) + (f"{note}\n" if note else ""), {"hits": hits})

    async def read_file(
        path: str, start_line: Count = None, end_line: Count = None, page: Count = None
    ) -> Annotated[CallToolResult, file_lines]:
        """Read lines of a file inside the knowledge-base roots (a path as `ask` and `search` cite it).

        `start_line` and `end_line` are 1-based and inclusive; at most 200 lines are returned.
        In a PDF they are lines of `page` (default 1), as `ask` and `search` give them.
        """
        reader = next((t for t in agent.toolbox.tools() if t.path_arg is not None), None)
        if reader is None:
            raise MCPToolError("this server's toolbox has no tool that reads files")
        args: dict[str, Any] = {reader.path_arg: path}
        if start_line is not None:
            args["start_line"] = start_line
        if end_line is not None:
            args["end_line"] = end_line
        if page is not None:
            args["page"] = page
        (item,) = await guarded(agent.toolbox.run, ToolCall(reader.name, args), kind="read")
        structured = {"path": item.source, **location(item.source, item.start_line, item.end_line), "text": item.text}
        return result(item.text, structured)

    settings = agent.settings
    remote = bool(settings.web_fetch or settings.jira_base_url or settings.confluence_base_url)
    titles = {ask: "Ask the knowledge base", search: "Search the knowledge base", read_file: "Read a file"}
    described = descriptions(fn.__name__ for fn in titles)
    for fn, title in titles.items():
        hints = ToolAnnotations(title=title, read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                                open_world_hint=remote and fn is ask)
        server.add_tool(fn, title=title, description=described.get(fn.__name__) or inspect.cleandoc(fn.__doc__ or ""),
                        annotations=hints, structured_output=True)
        server._tool_manager.get_tool(fn.__name__).parameters["additionalProperties"] = False  # refused: call_tool
    handlers = getattr(getattr(server, "_lowlevel_server", None), "_request_handlers", None)
    if isinstance(handlers, dict):  # no empty resources or prompts capability in the handshake
        for method in _UNOFFERED:
            handlers.pop(method, None)
    return server


def _log(agent: "Agent", answer: Any) -> None:
    """Add an MCP ``ask`` to the answer log (``KB_AGENT_LOG``); a log that cannot be written
    costs the client nothing but a note on stderr."""
    import sys

    if not agent.settings.log:
        return
    from .answer_log import AnswerLog, LogError

    try:
        with AnswerLog.for_settings(agent.settings) as log:
            log.record(answer, agent.settings, source="mcp")
    except LogError as exc:
        if sys.stderr is not None:  # `2>&-`: print would write to stdout, the protocol's stream
            print(f"crag: note: {redact_message(str(exc), secret_values())}", file=sys.stderr)


def _redacted(value: Any, secrets: tuple[str, ...]) -> Any:
    """``value`` (JSON-like) with every string in it redacted."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {k: _redacted(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v, secrets) for v in value]
    return value


def serve(agent: "Agent", *, model_option: bool = False) -> None:
    """Serve ``agent`` over stdio until the client closes the connection (calls still running
    are cancelled then, so the server ends at once). A client that stops reading (it closed
    its end of standard output, or died) is a ``BrokenPipeError``, as for every command whose
    reader goes away, not the transport's exception group and its traceback."""
    log_to_stderr()
    _end_when_unread()
    try:
        anyio.run(serve_stdio, build_server(agent, model_option=model_option))
    except BaseExceptionGroup as group:
        pipe, rest = group.split(BrokenPipeError)
        if pipe is None or rest is not None:
            raise
        raise BrokenPipeError(str(pipe.exceptions[0])) from None


def _end_when_unread(fd: int = 1) -> None:
    """End the process (exit status 141, nothing on stderr) as soon as the client closes its end
    of standard output, a pipe. The transport's writer fails only at the next reply, and even
    then the server went on until the client wrote again: the thread reading stdin cannot be
    stopped while it waits. A pipe's writing end reports an error (``POLLERR``) once no reader
    is left; stdout that is a file or a terminal never does, and is not watched differently."""
    import select

    try:
        watched = os.dup(fd)  # the SDK moves the protocol's descriptor when it claims stdout
    except OSError:
        return
    poller = select.poll()
    poller.register(watched, select.POLLERR | select.POLLHUP)

    def watch() -> None:
        while True:
            try:
                events = poller.poll()
            except InterruptedError:  # pragma: no cover - retried by Python (PEP 475)
                continue
            if any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events):
                os._exit(141)

    threading.Thread(target=watch, name="crag-mcp-stdout-watch", daemon=True).start()


def missing_extra() -> str | None:
    """The one-line fix when the ``mcp`` SDK is not installed, else None."""
    from importlib.util import find_spec

    if find_spec("mcp") is None or find_spec("mcp_types") is None:
        return "the MCP server needs the optional extra: pip install 'crag-kb[mcp]' (make install includes it)"
    return None
