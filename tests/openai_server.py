"""A loopback OpenAI-compatible server for tests: scripted replies per node, every request recorded.

    with FakeOpenAIServer() as srv:
        srv.script("plan", '{"tool_calls": []}', Status(503, retry_after=1), "done")
        settings = Settings(llm="openai", openai_base_url=srv.base_url)
        ...
        assert srv.calls("plan") == 2 and srv.requests[0].headers["x-crag-node"] == "analyze_and_route"

It is a real HTTP/1.1 server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, port 0) driven by
the real ``openai`` client, so the adapter's headers, retries, timeouts and streaming are
tested end to end. Replies are queued per node, keyed by the ``X-Crag-Node`` header; a node
whose queue is empty gets its default (``srv.default(node, reply)``, or ``"*"`` for every
node), and without one a 400 naming the node, which is not retried, so a test that
scripted too few replies fails at once.

A reply is a function of the request body returning one of the replies below (for replies
that depend on the prompt, like one grade per item), or
text (a normal ``chat.completion`` with a ``usage`` object), ``Text`` to choose
the token counts or leave ``usage`` out, or an action: ``Status`` (an error status with an
optional ``Retry-After`` and body), ``Delay`` (answer late, to trip a client timeout),
``Trickle`` (the whole response one byte at a time, to hold a request open), ``Garbage`` (a body that is not a completion), ``EmptyChoices``, ``NullContent``, ``Raw``
(any JSON body), ``Drop`` (close the connection, optionally mid-stream). A request with
``"stream": true`` is answered as server-sent events, ending with a usage chunk when
``stream_options.include_usage`` asks for it; ``reject_stream_options`` and
``reject_stream`` make the server refuse those like older local servers do.

What real servers do with request parameters: ``srv.params(node)`` lists each chat request's
``max_tokens``, ``temperature`` and ``response_format``; ``reject_json_schema`` (or
``reject_response_format``) answers such a request with a 400 like an older server;
``Text(..., finish_reason="length")`` is a reply cut by ``max_tokens``; ``Text(..., interval=0.1)``
is streamed a word every 0.1 s, as a slow model writes; ``Text(...,
logprobs=[...])`` sends token probabilities when the request asks for them; ``Text(...,
cached_tokens=N)`` reports ``usage.prompt_tokens_details.cached_tokens``; and
``reject_params = {"max_tokens", "temperature", "logprobs"}`` refuses those as OpenAI's reasoning models do
(a 400 naming the parameter; a ``temperature`` of 1 is accepted); and
``context_window = N`` refuses (400, as llama.cpp and vLLM do) a request whose prompt,
counted with tiktoken, plus its ``max_tokens`` exceeds N, worded as ``context_error`` says
(``"llama.cpp"``, with ``n_ctx``; ``"vllm"``; ``"bare"``, no size); ``prompt_sizes`` records the
prompt tokens of every chat request it counted.
``POST /v1/embeddings`` returns deterministic unit vectors (queue key ``"embeddings"``).
Stopping the server closes every open connection and joins its threads.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "Delay",
    "Drop",
    "EmptyChoices",
    "Events",
    "FakeOpenAIServer",
    "Garbage",
    "NoUsage",
    "NullContent",
    "Raw",
    "RecordedRequest",
    "Status",
    "Text",
    "Trickle",
    "grades",
    "item_count",
]


@dataclass(frozen=True)
class Text:
    """A normal completion. Token counts default to word counts; ``usage=False`` omits them."""

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage: bool = True
    finish_reason: str = "stop"
    cached_tokens: int | None = None
    # (token, logprob, [(alternative, logprob), ...]) per reply token, sent when the request
    # asks for logprobs (as llama.cpp, vLLM and OpenAI do); None: never sent
    logprobs: list[tuple[str, float, list[tuple[str, float]]]] | None = None
    interval: float = 0.0  # streamed: the seconds before each piece (a model writing slowly)


def NoUsage(text: str) -> Text:
    """A completion without a ``usage`` object."""
    return Text(text, usage=False)


@dataclass(frozen=True)
class Status:
    """An HTTP error status. ``body`` defaults to an OpenAI-style error object."""

    code: int
    body: Any = None
    retry_after: str | float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` (cut short when the server stops), then answer ``then``."""

    seconds: float
    then: Any = "late reply"


@dataclass(frozen=True)
class Trickle:
    """Send the whole response (status line, headers and body) one byte every ``interval`` seconds."""

    interval: float = 0.2
    then: Any = "a reply sent one byte at a time"


@dataclass(frozen=True)
class Garbage:
    """A body that is not a chat completion (in a stream: one event with this data)."""

    body: bytes | str = b"<html><body>502 Bad Gateway (not JSON)</body></html>"
    content_type: str = "application/json"
    status: int = 200


@dataclass(frozen=True)
class EmptyChoices:
    """A completion with ``"choices": []``."""


@dataclass(frozen=True)
class NullContent:
    """A completion whose message content is null (optionally with a refusal)."""

    refusal: str | None = None


@dataclass(frozen=True)
class Raw:
    """Any JSON body, sent as is."""

    body: Any
    status: int = 200


@dataclass(frozen=True)
class Drop:
    """Close the connection without an answer; when streaming, after ``after`` pieces of ``text``."""

    after: int = 0
    text: str = "this answer is cut off mid-stream"


@dataclass(frozen=True)
class Events:
    """A 200 event stream whose body is exactly ``data`` (bytes as they are), ended cleanly; with
    ``cut``, never ended: after ``data`` the connection is closed (``"drop"``) or held open until
    the client gives up (``"hang"``)."""

    data: bytes
    cut: str | None = None


Reply = str | Text | Status | Delay | Trickle | Garbage | EmptyChoices | NullContent | Raw | Drop | Events


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it; header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    node: str | None
    query: str = ""  # the query string of the URL, without "?"
    client_port: int = 0  # the client's end of the connection it came on


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # socketserver's 5 drops connections beyond it, which retry after 1, 3, 7 ... s
    owner: FakeOpenAIServer

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), name="fake-openai-conn",
            daemon=True,
        )
        self.owner._track(request, thread)
        thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-answer is expected in these tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 30  # an idle keep-alive connection is closed after this

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.server.owner._handle(self)

    def do_GET(self) -> None:
        self.server.owner._handle(self)


class FakeOpenAIServer:
    """An OpenAI-compatible HTTP server on 127.0.0.1 with scripted replies; a context manager."""

    def __init__(
        self,
        replies: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        model: str = "fake-model",
        embedding_dim: int = 64,
    ) -> None:
        self.model = model
        self.embedding_dim = embedding_dim
        self.reject_stream_options = False
        self.reject_stream = False
        self.reject_json_schema = False
        self.reject_response_format = False
        self.reject_params: set[str] = set()
        self.context_window: int | None = None
        self.context_error = "llama.cpp"  # how a request beyond the window is refused: or "vllm", "bare"
        self.prompt_sizes: list[tuple[str, int, int]] = []  # (node, prompt tokens, max_tokens)
        self._queues: dict[str, deque[Any]] = {}
        self._defaults: dict[str, Any] = dict(defaults or {})
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0
        for node, queued in (replies or {}).items():
            self.script(node, *(queued if isinstance(queued, (list, tuple, deque)) else [queued]))

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        if self._httpd is not None:
            return self
        self._stop.clear()
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        self._stop.set()
        httpd.shutdown()
        with self._lock:
            connections = list(self._connections.items())
        for sock, _ in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _, thread in connections:
            thread.join(timeout=2.0)
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What ``OPENAI_BASE_URL`` should be: ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    # -- scripting and inspection ---------------------------------------------------------

    def script(self, node: str, *replies: Any) -> FakeOpenAIServer:
        """Queue ``replies`` for ``node`` (the ``X-Crag-Node`` value, or ``"embeddings"``)."""
        with self._lock:
            self._queues.setdefault(node, deque()).extend(replies)
        return self

    def default(self, node: str, reply: Any) -> FakeOpenAIServer:
        """The reply for ``node`` once its queue is empty; ``"*"`` applies to every node."""
        with self._lock:
            self._defaults[node] = reply
        return self

    def pending(self, node: str | None = None) -> int:
        """Replies still queued (for ``node``, or in all)."""
        with self._lock:
            if node is not None:
                return len(self._queues.get(node, ()))
            return sum(len(q) for q in self._queues.values())

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def calls(self, node: str | None = None) -> int:
        """Chat-completion requests received (for ``node``, or all of them)."""
        return sum(
            1
            for r in self.requests
            if r.path.endswith("/chat/completions") and (node is None or r.node == node)
        )

    def params(self, node: str | None = None) -> list[dict[str, Any]]:
        """``max_tokens`` (or ``max_completion_tokens``), ``temperature`` and ``response_format`` of
        each chat request (None when absent)."""
        return [
            {key: (r.body or {}).get(key)
             for key in ("max_tokens", "max_completion_tokens", "temperature", "response_format", "logprobs",
                         "top_logprobs")}
            for r in self.requests
            if r.path.endswith("/chat/completions") and (node is None or r.node == node)
            and isinstance(r.body, dict)
        ]

    def _overflow(self, prompt: int, budget: int) -> dict[str, Any]:
        """The error body of a request beyond the window, as ``context_error`` says servers word it."""
        window = self.context_window
        if self.context_error == "vllm":
            return {"message": f"This model's maximum context length is {window} tokens. However, you requested "
                               f"{prompt + budget} tokens ({prompt} in the messages, {budget} in the completion). "
                               "Please reduce the length of the messages or completion.",
                    "type": "BadRequestError", "param": None, "code": 400}
        if self.context_error == "bare":
            return {"message": "the prompt is too long for this model: too many tokens", "type": "invalid_request_error"}
        return {"code": 400, "message": f"request ({prompt + budget} tokens) exceeds the available context size "
                                        f"({window} tokens), try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": prompt + budget, "n_ctx": window}

    def nodes(self) -> list[str | None]:
        """The ``X-Crag-Node`` header of every chat-completion request, in order."""
        return [r.node for r in self.requests if r.path.endswith("/chat/completions")]

    # -- serving ---------------------------------------------------------------------------

    def _track(self, sock: socket.socket, thread: threading.Thread) -> None:
        with self._lock:
            self._connections = {s: t for s, t in self._connections.items() if t.is_alive()}
            self._connections[sock] = thread

    def _next_reply(self, node: str) -> Any:
        with self._lock:
            queue = self._queues.get(node)
            if queue:
                return queue.popleft()
            if node in self._defaults:
                return self._defaults[node]
            if "*" in self._defaults:
                return self._defaults["*"]
        return Status(
            400,
            {"error": {"message": f"FakeOpenAIServer has no reply scripted for node {node!r}",
                       "type": "invalid_request_error"}},
        )

    def _handle(self, h: _Handler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length > 0 else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in h.headers.items()}
        node = headers.get("x-crag-node")
        path, _, query = h.path.partition("?")
        with self._lock:
            self._requests.append(RecordedRequest(h.command, path, headers, body, node, query,
                                                 h.client_address[1]))
        try:
            if h.command == "GET" and path.rstrip("/").endswith("/models"):
                self._send_json(h, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
            elif h.command == "POST" and path.endswith("/chat/completions"):
                self._chat(h, body if isinstance(body, dict) else {}, node or "")
            elif h.command == "POST" and path.endswith("/embeddings"):
                self._embeddings(h, body if isinstance(body, dict) else {}, node or "embeddings")
            else:
                self._send_json(h, 404, {"error": {"message": f"no route {h.command} {path}"}})
        except (TimeoutError, BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            h.close_connection = True

    def _chat(self, h: _Handler, body: dict[str, Any], node: str) -> None:
        streaming = body.get("stream") is True
        if streaming and self.reject_stream:
            return self._send_json(h, 400, {"error": {"message": "streaming is not supported"}})
        if streaming and self.reject_stream_options and "stream_options" in body:
            return self._send_json(h, 400, {"error": {"message": "Unrecognized request argument: stream_options"}})
        response_format = body.get("response_format")
        if isinstance(response_format, dict) and (
            self.reject_response_format or (self.reject_json_schema and response_format.get("type") == "json_schema")
        ):
            return self._send_json(h, 400, {"error": {
                "message": f"response_format type {response_format.get('type')!r} is not supported",
                "type": "invalid_request_error"}})
        if "max_tokens" in self.reject_params and "max_tokens" in body:
            return self._send_json(h, 400, {"error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                           "Use 'max_completion_tokens' instead.",
                "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}})
        if "temperature" in self.reject_params and body.get("temperature", 1) != 1:
            return self._send_json(h, 400, {"error": {
                "message": f"Unsupported value: 'temperature' does not support {body['temperature']} with this "
                           "model. Only the default (1) value is supported.",
                "type": "invalid_request_error", "param": "temperature", "code": "unsupported_value"}})
        if "logprobs" in self.reject_params and "logprobs" in body:
            return self._send_json(h, 400, {"error": {
                "message": "logprobs is not supported by this server", "type": "invalid_request_error"}})
        if self.context_window is not None:
            prompt = _prompt_tokens(body)
            budget = body.get("max_tokens") or body.get("max_completion_tokens") or 0
            with self._lock:
                self.prompt_sizes.append((node, prompt, int(budget)))
            if prompt + int(budget) > self.context_window:
                return self._send_json(h, 400, {"error": self._overflow(prompt, int(budget))})
        reply = self._next_reply(node)
        if callable(reply) and not isinstance(reply, type):
            reply = reply(body)  # a reply computed from the request
        while isinstance(reply, Delay):
            if self._stop.wait(reply.seconds):
                h.close_connection = True
                return None
            reply = reply.then
        if isinstance(reply, Trickle):
            return self._trickle(h, reply, self._completion(body, Text(reply.then) if isinstance(reply.then, str) else reply.then))
        if isinstance(reply, str):
            reply = Text(reply)
        if isinstance(reply, Status):
            return self._send_status(h, reply)
        if isinstance(reply, Raw):
            return self._send_json(h, reply.status, reply.body)
        if isinstance(reply, Drop):
            if streaming and reply.after > 0:
                return self._stream(h, body, Text(reply.text), drop_after=reply.after)
            return self._drop(h)
        if isinstance(reply, Events):
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            _write_chunk(h, reply.data)
            if reply.cut == "drop":
                return self._drop(h)
            if reply.cut == "hang":
                h.wfile.flush()
                self._stop.wait(30)
                h.close_connection = True
                return None
            _write_chunk(h, b"")
            h.wfile.flush()
            return None
        if isinstance(reply, Garbage):
            if streaming:
                return self._stream_garbage(h, reply)
            data = reply.body.encode() if isinstance(reply.body, str) else reply.body
            return self._send(h, reply.status, data, reply.content_type)
        if streaming:
            return self._stream(h, body, reply)
        return self._send_json(h, 200, self._completion(body, reply))

    def _usage(self, body: dict[str, Any], reply: Text) -> dict[str, Any]:
        messages = body.get("messages") or []
        prompt = reply.prompt_tokens
        if prompt is None:
            prompt = sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
        completion = reply.completion_tokens
        if completion is None:
            completion = len(reply.text.split())
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}
        if reply.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
        return usage

    def _envelope(self, body: dict[str, Any], kind: str) -> dict[str, Any]:
        with self._lock:
            self._counter += 1
            n = self._counter
        return {
            "id": f"chatcmpl-fake-{n}",
            "object": kind,
            "created": int(time.time()),
            "model": str(body.get("model") or self.model),
        }

    def _completion(self, body: dict[str, Any], reply: Any) -> dict[str, Any]:
        out = self._envelope(body, "chat.completion")
        if isinstance(reply, EmptyChoices):
            out["choices"] = []
        elif isinstance(reply, NullContent):
            out["choices"] = [{"index": 0, "finish_reason": "stop", "logprobs": None,
                               "message": {"role": "assistant", "content": None, "refusal": reply.refusal}}]
        else:
            logprobs = None
            if reply.logprobs is not None and body.get("logprobs"):
                k = int(body.get("top_logprobs") or 0)
                logprobs = {"content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode()),
                     "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())} for a, alp in top[:k]]}
                    for t, lp, top in reply.logprobs]}
            out["choices"] = [{"index": 0, "finish_reason": reply.finish_reason, "logprobs": logprobs,
                               "message": {"role": "assistant", "content": reply.text}}]
            if reply.usage:
                out["usage"] = self._usage(body, reply)
        return out

    def _stream(self, h: _Handler, body: dict[str, Any], reply: Any, drop_after: int | None = None) -> None:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        text = reply.text if isinstance(reply, Text) else ""
        pieces = _pieces(text)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def event(data: Any) -> None:
            payload = data if isinstance(data, str) else json.dumps(data)
            _write_chunk(h, f"data: {payload}\n\n".encode())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            out = self._envelope(body, "chat.completion.chunk")
            out["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
            return out

        if not isinstance(reply, EmptyChoices):
            event(chunk({"role": "assistant", "content": ""}))
        for i, piece in enumerate(pieces):
            if drop_after is not None and i >= drop_after:
                return self._drop(h)
            if isinstance(reply, Text) and reply.interval and self._stop.wait(reply.interval):
                return self._drop(h)
            content: str | None = None if isinstance(reply, NullContent) else piece
            event(chunk({"content": content}))
        if not isinstance(reply, EmptyChoices):
            event(chunk({}, reply.finish_reason if isinstance(reply, Text) else "stop"))
        if include_usage and isinstance(reply, Text) and reply.usage:
            last = self._envelope(body, "chat.completion.chunk")
            last["choices"] = []
            last["usage"] = self._usage(body, reply)
            event(last)
        event("[DONE]")
        _write_chunk(h, b"")
        h.wfile.flush()
        return None

    def _stream_garbage(self, h: _Handler, reply: Garbage) -> None:
        data = reply.body.decode("utf-8", "replace") if isinstance(reply.body, bytes) else reply.body
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        _write_chunk(h, f"data: {' '.join(data.split())}\n\n".encode())
        _write_chunk(h, b"data: [DONE]\n\n")
        _write_chunk(h, b"")
        h.wfile.flush()

    def _embeddings(self, h: _Handler, body: dict[str, Any], node: str) -> None:
        with self._lock:
            scripted = bool(self._queues.get(node)) or node in self._defaults
        trickle = None
        if scripted:
            reply = self._next_reply(node)
            while isinstance(reply, Delay):
                if self._stop.wait(reply.seconds):
                    h.close_connection = True
                    return
                reply = reply.then
            if isinstance(reply, Trickle):  # the vectors below, one byte at a time
                trickle = reply
            if isinstance(reply, Status):
                return self._send_status(h, reply)
            if isinstance(reply, Drop):
                return self._drop(h)
            if isinstance(reply, Garbage):
                data = reply.body.encode() if isinstance(reply.body, str) else reply.body
                return self._send(h, reply.status, data, reply.content_type)
            if isinstance(reply, Raw):
                return self._send_json(h, reply.status, reply.body)
        raw_input = body.get("input", "")
        texts = [raw_input] if isinstance(raw_input, (str, int)) else list(raw_input or [])
        if texts and all(isinstance(t, int) for t in texts):
            texts = [texts]  # one input given as token ids
        dim = body.get("dimensions") or self.embedding_dim
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        tokens = 0
        for i, text in enumerate(texts):
            key = text if isinstance(text, str) else json.dumps(text)
            tokens += max(1, len(key.split()))
            vector = embedding(key, int(dim))
            value: Any = (
                base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
                if as_base64
                else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": value})
        payload = {"object": "list", "data": data, "model": str(body.get("model") or self.model),
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        if trickle is not None:
            return self._trickle(h, trickle, payload)
        self._send_json(h, 200, payload)

    # -- low-level writes -----------------------------------------------------------------

    def _send(self, h: _Handler, status: int, data: bytes, content_type: str,
              headers: Mapping[str, str] | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    def _send_json(self, h: _Handler, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send(h, status, json.dumps(payload).encode(), "application/json", headers)

    def _send_status(self, h: _Handler, reply: Status) -> None:
        headers = dict(reply.headers)
        if reply.retry_after is not None:
            headers["Retry-After"] = str(reply.retry_after)
        body = reply.body
        if body is None:
            body = {"error": {"message": f"fake error {reply.code}", "type": "server_error", "code": None}}
        if isinstance(body, (bytes, str)):
            data = body.encode() if isinstance(body, str) else body
            return self._send(h, reply.code, data, "text/plain", headers)
        return self._send_json(h, reply.code, body, headers)

    def _trickle(self, h: _Handler, reply: Trickle, payload: Any) -> None:
        body = json.dumps(payload).encode()
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        h.close_connection = True
        for byte in head + body:
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            if self._stop.wait(reply.interval):
                return

    def _drop(self, h: _Handler) -> None:
        h.close_connection = True
        try:
            h.wfile.flush()
        except OSError:
            pass
        try:
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def item_count(body: dict[str, Any]) -> int:
    """How many evidence items (``[K] source`` header lines) the request's prompt holds."""
    import re

    text = "\n".join(str(m.get("content", "")) for m in body.get("messages") or [] if isinstance(m, dict))
    return len(re.findall(r"^\[\d+\] \S", text, re.M))


def grades(*first: float, rest: float = 0.5) -> Any:
    """A grading reply: ``first`` for the first items, ``rest`` for each item after them."""

    def reply(body: dict[str, Any]) -> str:
        n = item_count(body)
        return json.dumps([*first[:n], *([rest] * max(0, n - len(first)))])

    return reply


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A chat request's prompt tokens as a server would count them: tiktoken, plus the chat
    framing (4 per message and 3 for the reply)."""
    from crag.llm.tokens import count_tokens

    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    return sum(count_tokens(str(m.get("content", "")), "cl100k_base") + 4 for m in messages) + 3


def _write_chunk(h: _Handler, data: bytes) -> None:
    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def _pieces(text: str) -> list[str]:
    """The deltas a stream sends: words with their trailing space."""
    pieces: list[str] = []
    current = ""
    for ch in text:
        current += ch
        if ch.isspace():
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces


def embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for ``text`` (the same text always gets the same vector)."""
    values: list[float] = []
    counter = 0
    while len(values) < dim:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        values.extend((b - 127.5) / 127.5 for b in digest)
        counter += 1
    values = values[:dim]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]
