"""The openai adapter: the ``ChatModel`` port over the official SDK's chat completions API.

It owns everything between a node's ``LLMRequest`` and the HTTP server: the
``X-Crag-Node`` header on every request, the timeout, retries, streaming, token usage and
latency, and the translation of the SDK's exceptions into crag's errors.

Retries are crag's own loop, not the SDK's (the client is built with ``max_retries=0``):
the SDK also retries 408 and 409 and cannot tell how many retries it took, while SPEC §3
fixes the set (429, 5xx, timeouts, dropped connections) and the count
(``KB_AGENT_LLM_MAX_RETRIES`` retries, so at most that many + 1 requests). The wait is
exponential backoff with jitter, or the server's ``Retry-After`` (seconds or an HTTP date)
when it sends one; a ``Retry-After`` longer than ``RETRY_AFTER_CAP`` is not waited for, the
error says what the server asked. Any other 4xx is final at once (401 and 403 point at
``OPENAI_API_KEY``). A stream that has already delivered text is not retried, so a reader
never sees an answer twice.

Streaming (``on_delta``) asks for ``stream_options.include_usage``; a server that refuses
that gets a plain stream, and one that refuses streaming (or answers it with no events) a
normal request whose text is passed to ``on_delta`` whole. What worked is remembered.

Every failure leaves through one boundary, ``_translate``, as a one-line ``LLMError`` (or
``LLMTimeoutError``) naming the server, the status and the node, chained to the SDK's
exception, with the API key and any URL password redacted (a server may echo them).
``KB_AGENT_LLM_TIMEOUT`` bounds each request as a whole, stream included
(``crag.llm.deadline``), not only each network read. ``openai`` is imported when the adapter is built, never by ``import crag``.
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..errors import ConfigError, LLMError, LLMTimeoutError
from ..ports import LLMRequest
from ..safe_text import redact
from ..state import Completion
from .deadline import deadline_http_client, request_deadline
from .tokens import count_tokens, encoding_for_model

if TYPE_CHECKING:
    pass

__all__ = ["NODE_HEADER", "RETRY_AFTER_CAP", "OpenAIChatModel", "parse_retry_after"]

NODE_HEADER = "X-Crag-Node"
RETRY_AFTER_CAP = 60.0  # seconds; a server asking for longer gets an error, not a wait
PLACEHOLDER_API_KEY = "not-needed"  # local servers (Ollama, vLLM, llama.cpp) ignore the key

# A streaming request refused with one of these is tried again in a simpler mode.
_STREAM_REFUSALS = frozenset({400, 415, 422, 501})
_STREAM_MODES = ("usage", "plain", "off")


class _BadReply(Exception):
    """The server answered 2xx with something that is not a usable chat completion."""

    def __init__(self, what: str, note: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.note = note


class _StreamRefused(Exception):
    """The server refused this streaming mode; the next simpler one is worth a try."""


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``Retry-After-Ms`` / ``Retry-After`` (seconds or an HTTP date).

    None when the header is absent or unreadable; never negative.
    """
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = lowered.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw.strip()) * scale
        except ValueError:
            if name == "retry-after-ms":
                continue
            try:
                when = email.utils.parsedate_to_datetime(raw.strip())
            except (TypeError, ValueError, IndexError, OverflowError):
                return None
            if when is None:
                return None
            if when.tzinfo is None:
                return None
            reference = time.time() if now is None else now
            return max(0.0, when.timestamp() - reference)
        if math.isnan(seconds):
            return None
        return max(0.0, seconds)
    return None


def _one_line(text: object, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class OpenAIChatModel:
    """``ChatModel`` for any OpenAI-compatible server, through the official ``openai`` SDK.

    ``backoff_base`` and ``backoff_max`` (seconds) shape the exponential backoff; ``sleep``
    and ``rng`` are there so tests can observe the waits.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        retry_after_cap: float = RETRY_AFTER_CAP,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.model = settings.model
        self.timeout = float(settings.llm_timeout)
        self.max_retries = int(settings.llm_max_retries)
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_cap = retry_after_cap
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._stream_mode = "usage"
        self._encoding = encoding_for_model(self.model)
        base_url = settings.openai_base_url or None
        api_key = settings.openai_api_key or (PLACEHOLDER_API_KEY if base_url else "")
        if not api_key:
            raise ConfigError(
                "OPENAI_API_KEY",
                "",
                "an API key when KB_AGENT_LLM=openai (or OPENAI_BASE_URL for a local server that needs none)",
            )
        import openai

        self._openai = openai
        try:
            self._client = openai.OpenAI(
                api_key=api_key, base_url=base_url, timeout=self.timeout, max_retries=0,
                http_client=deadline_http_client(openai, timeout=self.timeout),
            )
        except openai.OpenAIError as exc:
            raise LLMError(f"cannot set up the OpenAI client: {_one_line(exc)}") from exc
        self.server = redact(str(self._client.base_url).rstrip("/"), settings.secrets())
        self._secrets = (*settings.secrets(), api_key)

    def close(self) -> None:
        """Release the client's connections."""
        self._client.close()

    # -- the port ------------------------------------------------------------------------

    def complete(
        self, request: LLMRequest, on_delta: Callable[[str], None] | None = None
    ) -> Completion:
        """One chat completion for ``request``, with retries; raises ``LLMError``."""
        started = time.perf_counter()
        node = request.node
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in request.messages]
        delivered: list[str] = []
        mode = self._stream_mode if on_delta is not None else "off"
        retries = 0
        while True:
            try:
                with request_deadline(self.timeout):
                    if mode == "off":
                        text, usage = self._plain(messages, node)
                    else:
                        text, usage = self._stream(messages, node, mode, on_delta, delivered)
            except _StreamRefused:
                mode = _STREAM_MODES[_STREAM_MODES.index(mode) + 1]
                continue
            except Exception as exc:
                failure = self._classify(exc)
                if failure is None:
                    raise
                wait = self._wait(retries, failure) if not delivered else None
                if wait is None:
                    raise _redacted(self._translate(exc, failure, node, retries), self._secrets) from exc
                retries += 1
                self._sleep(wait)
                continue
            break
        if on_delta is not None:
            self._stream_mode = mode
            if mode == "off" and text:
                on_delta(text)
        prompt_tokens, completion_tokens = self._usage(usage, messages, text)
        latency_ms = (time.perf_counter() - started) * 1000.0
        return Completion(
            text=text,
            model=self.model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
        )

    # -- one request -----------------------------------------------------------------------

    def _plain(self, messages: list[dict[str, str]], node: str) -> tuple[str, Any]:
        reply = self._client.chat.completions.create(
            model=self.model, messages=messages, extra_headers={NODE_HEADER: node}
        )
        choices = getattr(reply, "choices", None)
        if isinstance(reply, (str, bytes)) or not hasattr(reply, "choices"):
            raise _BadReply("sent a reply that is not a chat completion", repr(_one_line(reply, 80)))
        if not isinstance(choices, list) or not choices:
            raise _BadReply("returned no choices")
        message = getattr(choices[0], "message", None)
        content = getattr(message, "content", None)
        if isinstance(content, list):  # content parts, as some servers send them
            content = "".join(
                str(part.get("text", "")) if isinstance(part, dict) else str(getattr(part, "text", ""))
                for part in content
            )
        if not isinstance(content, str):
            refusal = getattr(message, "refusal", None)
            finish = getattr(choices[0], "finish_reason", None)
            why = f"refusal: {_one_line(refusal, 120)}" if refusal else (f"finish_reason {finish}" if finish else "")
            raise _BadReply("returned no message content", why)
        return content, getattr(reply, "usage", None)

    def _stream(
        self,
        messages: list[dict[str, str]],
        node: str,
        mode: str,
        on_delta: Callable[[str], None] | None,
        delivered: list[str],
    ) -> tuple[str, Any]:
        extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if mode == "usage" else {}
        try:
            stream = self._client.chat.completions.create(
                model=self.model,
                messages=messages,
                stream=True,
                extra_headers={NODE_HEADER: node},
                **extra,
            )
        except self._openai.APIStatusError as exc:
            if exc.status_code in _STREAM_REFUSALS:
                raise _StreamRefused from exc
            raise
        usage = None
        chunks = 0
        with stream:
            for chunk in stream:
                chunks += 1
                if getattr(chunk, "usage", None) is not None:
                    usage = chunk.usage
                for choice in getattr(chunk, "choices", None) or ():
                    piece = getattr(getattr(choice, "delta", None), "content", None)
                    if isinstance(piece, str) and piece:
                        delivered.append(piece)
                        if on_delta is not None:
                            on_delta(piece)
        if chunks == 0:  # not an event stream: the server ignored stream=True
            raise _StreamRefused
        return "".join(delivered), usage

    # -- accounting ------------------------------------------------------------------------

    def _count(self, text: str) -> int:
        try:
            return count_tokens(text, self._encoding)
        except Exception:  # no tokenizer at all: a rough count beats none
            return max(1, len(text) // 4) if text else 0

    def _usage(self, usage: Any, messages: Sequence[Mapping[str, str]], text: str) -> tuple[int, int]:
        """Tokens from the reply's ``usage``, else counted (OpenAI's chat framing: 4 per
        message plus 3 for the reply)."""
        prompt = getattr(usage, "prompt_tokens", None) if usage is not None else None
        completion = getattr(usage, "completion_tokens", None) if usage is not None else None
        if not _is_count(prompt):
            prompt = sum(self._count(m["content"]) + 4 for m in messages) + 3
        if not _is_count(completion):
            completion = self._count(text)
        return prompt, completion

    # -- failures --------------------------------------------------------------------------

    def _classify(self, exc: BaseException) -> dict[str, Any] | None:
        """What kind of failure ``exc`` is, or None when it is not the server's doing."""
        oa = self._openai
        if isinstance(exc, oa.APITimeoutError):
            return {"kind": "timeout", "retry": True}
        if isinstance(exc, oa.APIConnectionError):
            return {"kind": "connection", "retry": True}
        if isinstance(exc, oa.APIStatusError):
            status = exc.status_code
            retry_after = parse_retry_after(getattr(exc.response, "headers", None))
            retry = status == 429 or status >= 500
            too_long = retry_after is not None and retry_after > self.retry_after_cap
            return {
                "kind": "status",
                "status": status,
                "retry": retry and not too_long,
                "retry_after": retry_after,
                "too_long": retry and too_long,
            }
        if isinstance(exc, _BadReply):
            return {"kind": "bad", "what": exc.what, "note": exc.note, "retry": False}
        if isinstance(exc, (oa.APIResponseValidationError, oa.APIError)):
            return {"kind": "bad", "what": "sent an unusable reply", "note": _one_line(exc, 120), "retry": False}
        if isinstance(exc, json.JSONDecodeError):
            return {"kind": "bad", "what": "sent a body that is not valid JSON", "note": _one_line(exc, 80),
                    "retry": False}
        transport = _transport_errors()
        if transport and isinstance(exc, transport):
            return {"kind": "connection", "retry": True}
        return None

    def _wait(self, retries: int, failure: Mapping[str, Any]) -> float | None:
        """Seconds to wait before the next try, or None when there is none."""
        if not failure.get("retry") or retries >= self.max_retries:
            return None
        retry_after = failure.get("retry_after")
        if retry_after is not None:
            return float(retry_after)
        ceiling = min(self.backoff_max, self.backoff_base * (2.0**retries))
        return ceiling / 2.0 + self._rng.uniform(0.0, ceiling / 2.0)

    def _translate(
        self, exc: BaseException, failure: Mapping[str, Any], node: str, retries: int
    ) -> LLMError:
        """The one place an SDK failure becomes a crag error: one line, server, status, node."""
        where = f"LLM server {self.server}"
        after = f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""
        kind = failure["kind"]
        if kind == "timeout":
            return LLMTimeoutError(
                f"{where} did not answer within {self.timeout:g} s for node {node}{after} "
                "(KB_AGENT_LLM_TIMEOUT)",
                node=node,
            )
        if kind == "connection":
            cause = exc.__cause__ or exc.__context__ or exc
            reason = _one_line(cause, 120) or type(cause).__name__
            if "Connect" in type(cause).__name__:
                return LLMError(
                    f"{where} could not be reached for node {node}{after} ({reason}); "
                    "check OPENAI_BASE_URL and that the server is running",
                    node=node,
                )
            return LLMError(f"{where} closed the connection for node {node}{after} ({reason})", node=node)
        if kind == "status":
            status = failure["status"]
            message = f"{where} answered {status} for node {node}{after}"
            detail = _server_message(exc)
            if status == 401:
                message += ": check OPENAI_API_KEY"
            elif status == 403:
                message += f": access denied; check OPENAI_API_KEY and its access to model {self.model}"
            elif status == 404:
                message += f": check KB_AGENT_MODEL ({self.model}) and OPENAI_BASE_URL"
            elif failure.get("too_long"):
                message += f": it asked to retry after {failure['retry_after']:.0f} s, longer than {self.retry_after_cap:g} s"
            if detail:
                message += f" ({detail})"
            return LLMError(message, node=node, status=status)
        note = f" ({failure['note']})" if failure.get("note") else ""
        return LLMError(f"{where} {failure['what']} for node {node}{note}", node=node)


def _redacted(error: LLMError, secrets: Sequence[str]) -> LLMError:
    """``error`` with every secret (and URL password) in its message replaced by ``***``."""
    message = redact(str(error), secrets)
    if message == str(error):
        return error
    return type(error)(message, node=error.node, status=error.status)


def _server_message(exc: BaseException) -> str:
    """The error message a server put in its body, shortened to one line."""
    body = getattr(exc, "body", None)
    message: Any = None
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
        if message is None:
            message = body.get("message") or body.get("detail")
    elif isinstance(body, str):
        message = body
    return _one_line(message, 160) if message else ""


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's transport errors, for failures the SDK lets through (mid-stream)."""
    errors: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)  # whichever the SDK loaded; never imported here
        error = getattr(module, "TransportError", None)
        if isinstance(error, type):
            errors.append(error)
    return tuple(errors)
