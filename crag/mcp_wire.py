"""The stdio wire of ``python -m crag mcp``: what the SDK's transport does not answer.

``serve_stdio`` serves an ``MCPServer`` as ``run_stdio_async`` does, except that what a
careless or hostile client writes still gets a reply under its ``id``, so the client is never
left waiting and the server never stops: a line that is not a JSON-RPC message (a JSON-RPC
error, ``-32700`` or ``-32600``), JSON nested deeper than the SDK's parser reads, a line
longer than the server will hold (read to its end, not kept), a string escaping half of a
surrogate pair (read with U+FFFD, as crag reads text elsewhere).
``Explained`` adds to the SDK's bare ``Invalid request parameters`` what is wrong: the
handshake is missing, or which field of the request's ``params`` the protocol refuses. See
``docs/mcp.md``.
"""

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

__all__ = ["Explained", "log_to_stderr", "serve_stdio"]


def log_to_stderr() -> None:
    """What the SDK logs (at ``WARNING`` and above) as crag writes to stderr: one line each,
    ``crag: warning: dropped 'notifications/cancelled': malformed params``, configured secrets
    and credential-shaped text masked. Set before the ``MCPServer`` is built: its own set-up
    (``logging.basicConfig`` with a rich handler: timestamps, source lines, wrapping at 80
    columns) then finds the root logger configured and leaves it. A bug's traceback is kept."""
    import logging
    import sys

    from .config import secret_values
    from .safe_text import redact_message

    class OneLine(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            line = " ".join(redact_message(record.getMessage(), secret_values()).split())
            text = f"crag: {record.levelname.lower()}: {line}"
            if record.exc_info:
                text += "\n" + self.formatException(record.exc_info)
            return text

    handler: logging.Handler = logging.StreamHandler(sys.stderr) if sys.stderr is not None else logging.NullHandler()
    handler.setFormatter(OneLine())
    root = logging.getLogger()
    root.handlers[:] = [handler]  # the ``crag mcp`` process's only logging: stdout is the protocol's
    root.setLevel(logging.WARNING)


async def serve_stdio(server: "MCPServer") -> None:
    """``MCPServer.run_stdio_async``, except that a line that is not a JSON-RPC message is
    answered with a JSON-RPC error (the SDK's transport hands it over as an exception, which
    its server would only log), so a client is never left waiting on it, and that no line is
    held longer than ``_MAX_LINE`` characters (``_BoundedLines``)."""
    from mcp.server.stdio import stdio_server

    lowlevel = server._lowlevel_server  # what run_stdio_async serves; the SDK is pinned below 3
    lowlevel.middleware.append(Explained())
    with _claimed_stdin() as stdin:
        async with stdio_server(stdin) as (read_stream, write_stream):
            await lowlevel.run(_ErrorsAnswered(read_stream, write_stream), write_stream,
                               lowlevel.create_initialization_options())


_MAX_LINE = 128 * 2**20  # characters of one message: twice the longest question crag reads (crag.agent)
_TOO_LONG = "\x00crag: too long\x00"  # begins what _BoundedLines gives for a longer line: no JSON
_HEAD = 4096  # characters of a line too long kept after _TOO_LONG, for its id


class _BoundedLines:
    """A text stream read a line at a time, none longer than ``_MAX_LINE`` characters: a longer
    line is read to its end and dropped, and stands as ``_TOO_LONG`` and its first characters
    (which the parser refuses, so ``_ErrorsAnswered`` answers it). The SDK's transport reads a
    line whole, however long: one with no end (a client writing ``/dev/zero``) took all the
    machine's memory until the kernel killed a process."""

    def __init__(self, text: Any) -> None:
        self._text = text

    def readline(self) -> str:
        line = self._text.readline(_MAX_LINE)
        if len(line) < _MAX_LINE or line.endswith("\n"):
            return line
        while True:  # the rest of the line, a mebibyte at a time
            rest = self._text.readline(2**20)
            if not rest or rest.endswith("\n"):
                return _TOO_LONG + " ".join(line[:_HEAD].splitlines()) + "\n"

    def close(self) -> None:  # the descriptor stays open: a worker thread may still read it
        pass


@contextmanager
def _claimed_stdin() -> Iterator[Any]:
    """Standard input as ``stdio_server`` reads it, through ``_BoundedLines``, and claimed as
    the SDK claims it: the protocol is read from a duplicate of fd 0, and fd 0 points at the
    null device meanwhile, so nothing else reads the client's messages. A byte order mark
    before the first message (what Windows tools write at the start of UTF-8) is no part of
    it, as JSON's RFC 8259 allows: it made the ``initialize`` a parse error with ``id`` null,
    and the client waited for its reply. None (the SDK's own reading) when the descriptors
    cannot be duplicated."""
    import io

    try:
        import fcntl  # POSIX: as the SDK, a duplicate above the standard descriptors

        wire = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except (ImportError, OSError):
        wire = None
    if wire is None:
        yield None
        return
    # never closed: a worker thread can still wait on it after the transport exits
    text = io.TextIOWrapper(os.fdopen(wire, "rb", closefd=False), encoding="utf-8-sig", errors="replace")
    try:
        yield anyio.wrap_file(_BoundedLines(text))
    finally:
        os.dup2(wire, 0)


_SHOWN_ERRORS = 3  # of a refused request's params: a union of message types can list dozens


class Explained:
    """SDK middleware for one connection: the reply ``Invalid request parameters`` (empty
    ``data``) says why.

    The SDK gives that one text for a request before ``initialize`` and for ``params`` the
    protocol refuses, so a client cannot tell a missing handshake from a misspelt field. The
    code stays ``-32602``; the message adds the reason, on one line (pydantic's field paths and
    reasons: what the client sent is not repeated). The handshake is followed here as the SDK
    follows it: open once ``initialize`` succeeded or ``notifications/initialized`` came."""

    def __init__(self) -> None:
        self.initialized = False

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import INVALID_PARAMS, ErrorData
        from pydantic import ValidationError

        method = getattr(ctx, "method", "")
        try:
            result = await call_next(ctx)
        except MCPError as exc:
            error = exc.error
            if self.initialized or (error.code, error.message, error.data) != (INVALID_PARAMS, _BARE, ""):
                raise
            raise MCPError.from_error_data(ErrorData(code=INVALID_PARAMS, data="", message=(
                f"{_BARE}: the session is not initialized: send initialize first, then notifications/initialized"))
            ) from exc
        except ValidationError as exc:
            details = exc.errors(include_url=False, include_input=False)
            reasons = [f"{'.'.join(str(p) for p in e.get('loc', ())) or 'params'}: {e.get('msg', 'invalid')}"
                       for e in details[:_SHOWN_ERRORS]]
            more = ", ..." if len(details) > _SHOWN_ERRORS else ""
            what = " ".join(f"{method}: {'; '.join(reasons)}{more}".split())
            raise MCPError.from_error_data(ErrorData(code=INVALID_PARAMS, message=f"{_BARE}: {what}", data="")) from exc
        if method in ("initialize", "notifications/initialized"):
            self.initialized = True
        return result


_BARE = "Invalid request parameters"  # what the SDK answers, with empty data, for both


class _ErrorsAnswered:
    """The transport's read stream, answering every line it could not read as a message with
    a JSON-RPC error (parse error, or invalid request for JSON that is no message; ``id`` null),
    and a request whose id is neither a string nor an integer with an invalid request error."""

    def __init__(self, inner: Any, write: Any) -> None:
        self._inner = inner
        self._write = write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        from mcp.shared.message import SessionMessage
        from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError

        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                if not _request_without_id(item):
                    return item
                # a request whose id is no string or integer ({"id": 1.5}, true, null): the
                # SDK reads it as a notification and drops it, so its client would wait forever
                await self._write.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(
                    code=INVALID_REQUEST, message="Invalid Request: a request's id must be a string or an integer"))))
                continue
            errors = getattr(item, "errors", None)
            details = errors() if callable(errors) else []
            kinds = {e.get("type") for e in details}
            inputs = [e.get("input") for e in details]  # the line, or the parts of its JSON each message type refused
            line = next((i for i in inputs if isinstance(i, dict)), inputs[0] if inputs else None)
            if isinstance(line, str | bytes) and not line.strip():  # a blank line is no message: nothing to answer
                continue
            repaired = _with_lone_surrogates_replaced(line) if "json_invalid" in kinds else None
            if repaired is not None:
                return SessionMessage(repaired)
            code, what = (PARSE_ERROR, "Parse error") if "json_invalid" in kinds else (INVALID_REQUEST, "Invalid Request")
            said = " ".join(str(e.get("msg", "")) for e in details)
            why = "not a JSON-RPC message"
            if isinstance(line, str) and line.startswith(_TOO_LONG):
                line = line.removeprefix(_TOO_LONG)
                why = f"the message is longer than {_MAX_LINE // 2**20} Mi characters"
            elif "recursion limit" in said:
                why = f"the message nests JSON more than {_DEPTH} levels deep"
            elif "number out of range" in said:
                why = "a number in the message is out of range"
            reply = JSONRPCError(jsonrpc="2.0", id=_request_id(line), error=ErrorData(code=code, message=f"{what}: {why}"))
            await self._write.send(SessionMessage(reply))

    def __aiter__(self) -> "_ErrorsAnswered":
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "_ErrorsAnswered":
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


def _request_without_id(item: Any) -> bool:
    """Whether ``item`` is a request read as a notification: a method MCP defines for requests
    (notifications are ``notifications/...``), with no id the SDK could read."""
    from mcp_types import JSONRPCNotification

    message = getattr(item, "message", None)
    return isinstance(message, JSONRPCNotification) and not message.method.startswith("notifications/")


def _with_lone_surrogates_replaced(line: Any) -> Any:
    """The message of ``line`` when it is JSON whose only fault is half of a surrogate pair
    escaped in a string (``"\\ud83d"``, what JavaScript's ``JSON.stringify`` writes for a
    string cut inside an emoji; the SDK's parser refuses it), with U+FFFD in its place, as
    crag reads text that is not UTF-8 elsewhere (``valid_text``); else None."""
    import json

    from mcp_types import jsonrpc_message_adapter

    from .safe_text import valid_text

    def valid(value: Any) -> Any:
        if isinstance(value, str):
            return valid_text(value)
        if isinstance(value, dict):
            return {valid(k): valid(v) for k, v in value.items()}
        if isinstance(value, list):
            return [valid(v) for v in value]
        return value

    if not isinstance(line, str | bytes):
        return None
    try:
        message = json.loads(line)
        if valid(message) == message:  # no lone surrogate: the fault is elsewhere
            return None
        return jsonrpc_message_adapter.validate_python(valid(message), by_name=False)
    except (ValueError, RecursionError):  # not JSON, no JSON-RPC message, or nested too deeply
        return None


_DEPTH = 200  # how deep the SDK's parser (pydantic's) reads JSON
_SPACE = re.compile(r"[ \t\n\r]*")


def _request_id(line: Any) -> int | str | None:
    """The ``id`` of the JSON object ``line`` (text, or what the SDK read of it) when it has one
    at its top level, found without
    parsing what is nested (a line the parser refused may nest thousands deep), so that the
    error reply reaches the call that waits for it; else None."""
    import json

    if isinstance(line, dict):  # JSON the SDK read, but no message
        line = json.dumps({"id": line.get("id")})
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if not isinstance(line, str) or not line.lstrip().startswith("{"):
        return None
    decoder = json.JSONDecoder()
    depth, at, end = 0, 0, len(line)
    while at < end:
        ch = line[at]
        if ch == '"':
            try:
                key, after = decoder.raw_decode(line, at)
            except ValueError:
                return None
            colon = _SPACE.match(line, after).end()  # no slices: a refused line may hold 1 MiB of keys
            if depth == 1 and key == "id" and line.startswith(":", colon):
                start = _SPACE.match(line, colon + 1).end()
                try:
                    value, _ = decoder.raw_decode(line, start)
                except (ValueError, RecursionError):
                    return None
                return value if isinstance(value, int | str) and not isinstance(value, bool) else None
            at = after
            continue
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        at += 1
    return None
