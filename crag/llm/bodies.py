"""Every body an OpenAI-compatible server sends crag is checked before any library parses it.

The openai SDK decodes what a server sends with the standard library: a reply whose
``content`` holds bytes that are not UTF-8 was a ``UnicodeDecodeError`` traceback, JSON
nested 2,000 deep a ``RecursionError``, and a body of any size was read whole. The HTTP
client crag gives the SDK (``http_client``) checks each response's body on its way in:

* a JSON body is read up to ``MAX_BODY_BYTES``, then must be UTF-8 and nest at most
  ``MAX_DEPTH`` arrays and objects deep;
* an event stream (``text/event-stream``) is passed on line by line, each line checked the
  same way once it is whole (at most ``MAX_LINE_BYTES``, the stream ``MAX_BODY_BYTES`` in all),
  so the SDK's decoder only ever sees checked lines, and each event once its blank line has
  come, none without data (a keep-alive comment, ``retry:`` alone), as the SSE specification
  dispatches none; ``saw_done`` tells whether it ended with
  ``data: [DONE]``, and ``whole_body`` gives the body of a server that answered a streaming
  request with a whole reply.

Inside ``watching_redirects`` the client also records each redirect a server answers with, so
that a failure of the redirected request says where it was sent (``hops_note``) even when it
has no response to tell it (a connection refused, a body that is no completion).

A 2xx body that breaks a limit raises ``BadReply`` (one line through the adapters' boundary,
never retried); an error body (4xx, 5xx) that does is dropped, so the status still tells what
happened. Bodies are asked for without compression (``Accept-Encoding: identity``), so the
bytes checked are the bytes parsed. The client also keeps ``crag.llm.deadline``'s total
deadline.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
from collections.abc import Iterator
from typing import Any

from attrs import frozen

from .deadline import deadline_http_client
from .retry import BadReply, one_line

__all__ = ["MAX_BODY_BYTES", "MAX_DEPTH", "MAX_LINE_BYTES", "OPENAI_API_URL", "Redirect", "base_url_hint", "check_json",
           "client_address", "credentials_hint", "hops_note", "http_client", "redirect_note", "saw_done", "server_label",
           "watching_redirects", "whole_body"]

# The server when no base URL is set, given to the SDK explicitly: given none, the SDK reads
# OPENAI_BASE_URL itself, and an exported but empty one (no URL, to crag) left it no server.
OPENAI_API_URL = "https://api.openai.com/v1"


def client_address(base_url: str | None) -> tuple[str, dict[str, str], dict[str, str]]:
    """The SDK's ``base_url``, ``default_query`` and ``default_headers`` for a configured base
    URL: OpenAI's when none is set, and a query it carries (``?api-version=...``) sent with every
    request, since the SDK appends the path to the URL as written, after its query.

    Credentials in the URL (``http://user:password@host/v1``) go as the ``Authorization:
    Basic`` header the HTTP library would make of them, and the URL goes without them: that
    library logs every request's URL at INFO, so a service logging at INFO kept the password."""
    import base64
    from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

    if not base_url:
        return OPENAI_API_URL, {}, {}
    parts = urlsplit(base_url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    userinfo, at, host = parts.netloc.rpartition("@")
    headers = {}
    if at:
        user, _, password = userinfo.partition(":")
        pair = f"{unquote(user)}:{unquote(password)}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    return urlunsplit((parts.scheme, host, parts.path, "", "")), query, headers

def server_label(base_url: str | None) -> str:
    """The server as messages name it: the configured URL without its query (its password is
    for ``redact_message`` to mask), or OpenAI's."""
    from urllib.parse import urlsplit, urlunsplit

    if not base_url:
        return OPENAI_API_URL
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")).rstrip("/")


MAX_BODY_BYTES = 64 << 20  # an embeddings reply of 128 vectors of 3,072 floats is about 8 MiB
MAX_LINE_BYTES = 4 << 20  # one event of a stream: a delta of a few tokens
MAX_DEPTH = 64  # no reply of the chat or embeddings API nests more than a handful

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(body: bytes) -> int:
    """How deep arrays and objects nest in ``body`` (JSON text), found without parsing it."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= MAX_DEPTH:
        return (len(brackets) + 1) // 2
    import numpy as np

    steps = np.frombuffer(brackets, dtype=np.uint8)
    opening = (steps == ord("[")) | (steps == ord("{"))
    return int(np.cumsum(np.where(opening, 1, -1)).max())


def check_json(body: bytes, what: str = "a body") -> str:
    """``body`` as text when it is UTF-8 JSON text within the limits; else ``BadReply``."""
    if len(body) > MAX_BODY_BYTES:
        raise BadReply(f"sent {what} over {MAX_BODY_BYTES >> 20} MiB")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadReply(f"sent {what} that is not UTF-8 text", f"byte {exc.start} is 0x{body[exc.start]:02x}") from None
    if json_depth(body) > MAX_DEPTH:
        raise BadReply(f"sent {what} nested more than {MAX_DEPTH} levels deep")
    return text


def redirect_note(exc: BaseException, variable: str) -> str:
    """What to add to a failure whose request the server redirected (the HTTP library follows
    redirects, and a 301 or 302 resends a POST as a GET, which an API refuses): where it went,
    and the setting (``variable``) to change; "" when it was not redirected."""
    response = getattr(exc, "response", None)
    history = getattr(response, "history", None) or ()
    if not history:
        return ""
    try:
        to = _where(response.request.url)
    except (AttributeError, RuntimeError, ValueError):
        to = ""
    return hops_note([Redirect(history[0].status_code, to)], variable)


@frozen
class Redirect:
    """One redirect a server answered a request with: its status, and where the request went
    (scheme, host, port and path: no credentials, no query; "" when unknown)."""

    status: int
    to: str


_REDIRECTS: contextvars.ContextVar[list[Redirect] | None] = contextvars.ContextVar("crag_redirects", default=None)


@contextlib.contextmanager
def watching_redirects(hops: list[Redirect]) -> Iterator[None]:
    """Inside the block, every redirect a response to this module's client asks for is added to
    ``hops``: a failure that is no status (the redirected request could not connect, or its
    answer was no completion) has no response to tell it."""
    token = _REDIRECTS.set(hops)
    try:
        yield
    finally:
        _REDIRECTS.reset(token)


def hops_note(hops: list[Redirect], variable: str) -> str:
    """What to add to a failure after ``hops`` (see ``redirect_note``); "" for none."""
    if not hops:
        return ""
    to = f" to {hops[-1].to}" if hops[-1].to else ""
    return (f"; the server redirected the request ({hops[0].status}){to}: set {variable} to the "
            "address the API answers at (a 301 or 302 redirect resends a request as a GET)")


def _where(url: Any) -> str:
    """``url`` without credentials or query."""
    from urllib.parse import urlsplit

    parts = urlsplit(str(url))
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"


def _watch_redirect(response: Any) -> None:
    """Record the redirect ``response`` asks for, inside ``watching_redirects``."""
    hops = _REDIRECTS.get()
    if hops is None or not response.has_redirect_location:
        return
    try:
        to = _where(response.request.url.join(response.headers["location"]))
    except (AttributeError, KeyError, RuntimeError, ValueError):
        to = ""
    hops.append(Redirect(response.status_code, to))


def credentials_hint(base_url: str | None, variable: str = "OPENAI_BASE_URL") -> str:
    """The setting to check when a server refuses crag's credentials: ``OPENAI_API_KEY``, or the
    user and password written in the base URL, which are sent in its stead (``client_address``)."""
    from urllib.parse import urlsplit

    if base_url and urlsplit(base_url).netloc.rpartition("@")[1]:
        what = "user and password" if urlsplit(base_url).password is not None else "user name"
        return f"the {what} in {variable} (sent instead of OPENAI_API_KEY)"
    return "OPENAI_API_KEY"


def base_url_hint(base_url: str) -> str:
    """What looks wrong in a base URL that got a 404, if anything: no ``/v1``, or the endpoint
    itself (the SDK adds ``/chat/completions``)."""
    from urllib.parse import urlsplit

    path = urlsplit(base_url).path.rstrip("/")
    if path.endswith("/chat/completions"):
        return " (it should stop before /chat/completions, which crag adds)"
    if not any(part.startswith("v1") for part in path.split("/")):
        return " (OpenAI-compatible servers usually serve the API under /v1)"
    return ""


class _Checked:
    """A response's byte stream, checked as the module docstring says."""

    def __init__(self, inner: Any, events: bool, error: bool) -> None:
        self._inner = inner
        self._events = events
        self._error = error
        self.done = False  # an event stream's "data: [DONE]" went by
        self._block: list[bytes] = []  # the lines of the event being read, until its blank line
        self.body: bytes | None = None  # a 2xx body that is not an event stream, once read and checked

    def __iter__(self) -> Iterator[bytes]:
        return self._lines() if self._events else self._whole()

    def _whole(self) -> Iterator[bytes]:
        parts: list[bytes] = []
        size = 0
        for chunk in self._inner:
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                if self._error:
                    return
                raise BadReply(f"sent a body over {MAX_BODY_BYTES >> 20} MiB")
            parts.append(chunk)
        body = b"".join(parts)
        try:
            check_json(body)
        except BadReply:
            if self._error:
                return  # the status says what went wrong; a body no one can read adds nothing
            raise
        if not self._error:
            self.body = body
        yield body

    def _lines(self) -> Iterator[bytes]:
        pending = b""
        size = 0
        for chunk in self._inner:
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise BadReply(f"sent an event stream over {MAX_BODY_BYTES >> 20} MiB")
            pending += chunk
            if b"\n" not in chunk:
                if len(pending) > MAX_LINE_BYTES:
                    raise BadReply(f"sent an event over {MAX_LINE_BYTES >> 20} MiB")
                continue
            *lines, pending = pending.split(b"\n")
            passed: list[bytes] = []
            for line in lines:
                _check_line(line)
                self.done = self.done or line.rstrip(b"\r") == b"data: [DONE]"
                passed.extend(self._event_lines(line))
            if passed:
                yield b"\n".join(passed) + b"\n"
        if pending:
            _check_line(pending)
            self.done = self.done or pending.rstrip(b"\r") == b"data: [DONE]"
        if pending or self._block:  # an event the stream ended before its blank line, as it came
            yield b"".join(line + b"\n" for line in self._block) + pending
            self._block = []

    def _event_lines(self, line: bytes) -> list[bytes]:
        """The lines to pass on once ``line`` is read: an event's lines when ``line`` is the blank
        line that ends it, and nothing for an event with no ``data`` field (a keep-alive comment,
        ``id:`` or ``retry:`` alone), which the SSE specification dispatches to no one: the SDK's
        decoder, once it has seen an ``id``, took every such blank line for an event with empty
        data, and failed the answer on it as JSON that is not valid."""
        if line.rstrip(b"\r"):
            if not line.startswith(b":"):  # a comment is read by no one
                self._block.append(line)
            return []
        block, self._block = self._block, []
        if not any(field.split(b":", 1)[0].rstrip(b"\r") == b"data" for field in block):
            return []
        return [*block, line]

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


def saw_done(response: Any) -> bool:
    """Whether the event stream of ``response`` (read through this module's client) sent ``[DONE]``."""
    return bool(getattr(getattr(response, "stream", None), "done", False))


def whole_body(response: Any) -> bytes | None:
    """The checked body of a 2xx ``response`` that was not an event stream (read through this
    module's client), once read; None for any other."""
    return getattr(getattr(response, "stream", None), "body", None)


def _check_line(line: bytes) -> None:
    if len(line) > MAX_LINE_BYTES:
        raise BadReply(f"sent an event over {MAX_LINE_BYTES >> 20} MiB")
    check_json(line, "an event")


def _response_hook(base: type) -> Any:
    """The client's response hook: the body is checked as it is read (see the module docstring).
    ``base`` is the HTTP library's ``SyncByteStream``, which a response's stream must be."""
    checked = type("CheckedStream", (_Checked, base), {})
    decoded = type("DecodedStream", (_Decoded, base), {})

    def hook(response: Any) -> None:
        _watch_redirect(response)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            # Compressed although crag asked for identity: check the bytes once decoded, when
            # the HTTP library lets its decoder be reached; else leave them to it.
            decoder = getattr(response, "_get_content_decoder", None)
            if decoder is None:
                return
            response.stream = decoded(response.stream, decoder(), encoding, response.status_code >= 400)
            del response.headers["content-encoding"]
            # The library keeps the decoder it made; left there, it would decode the decoded
            # bytes again. Without it, the library makes one from the headers: identity.
            vars(response).pop("_decoder", None)
        events = "text/event-stream" in response.headers.get("content-type", "")
        response.stream = checked(response.stream, events, response.status_code >= 400)

    return hook


class _Decoded:
    """A compressed byte stream, decoded (so that what is checked is what will be parsed).
    Bytes its ``Content-Encoding`` cannot decode are a 2xx ``BadReply``, never a dropped
    connection to ask again; an error body that cannot be decoded is dropped."""

    def __init__(self, inner: Any, decoder: Any, encoding: str, error: bool) -> None:
        self._inner = inner
        self._decoder = decoder
        self._encoding = encoding
        self._error = error

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            yield from self._decode(chunk)
        yield from self._decode(None)

    def _decode(self, chunk: bytes | None) -> Iterator[bytes]:
        try:
            decoded = self._decoder.flush() if chunk is None else self._decoder.decode(chunk)
            pieces = list(_pieces(decoded))
        except Exception as exc:  # the library's DecodingError (zlib, brotli, zstd): the bytes are bad
            if self._error:
                return
            raise BadReply(f"sent a body marked Content-Encoding: {self._encoding} that cannot be decoded",
                           one_line(exc, 80)) from exc
        yield from pieces

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


def _pieces(decoded: Any) -> Iterator[bytes]:
    """What a decoder gave: bytes (httpx) or an iterator of bounded pieces (httpx2)."""
    if isinstance(decoded, (bytes, bytearray)):
        if decoded:
            yield bytes(decoded)
    else:
        yield from decoded


def http_client(openai_module: Any, **kwargs: Any) -> Any:
    """The HTTP client for ``openai.OpenAI(http_client=...)``: bodies checked, requests held to
    ``crag.llm.deadline``'s total deadline."""
    client = deadline_http_client(openai_module, **kwargs)
    library = next(
        sys.modules[cls.__module__.split(".")[0]] for cls in type(client).__mro__
        if cls.__module__.split(".")[0] in ("httpx2", "httpx")
    )
    client.headers["Accept-Encoding"] = "identity"
    client.event_hooks["response"].append(_response_hook(library.SyncByteStream))
    return client
