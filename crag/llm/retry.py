"""The one retry policy of crag's OpenAI clients: chat completions and embeddings.

Retries are crag's own loop, not the SDK's (clients are built with ``max_retries=0``): the
SDK also retries 408 and 409 and cannot say how many retries it took, while crag retries
exactly 429, 5xx, timeouts and dropped connections, ``KB_AGENT_LLM_MAX_RETRIES`` times (so
at most that many + 1 requests). The wait is exponential backoff with jitter, or the
server's ``Retry-After`` (seconds or an HTTP date, or ``Retry-After-Ms``) when it sends
one; a ``Retry-After`` longer than ``retry_after_cap`` is not waited for and the error says
what the server asked. Any other 4xx is final at once.

``RetryPolicy.classify`` turns an exception into one of the typed failures below (or None
when it is not the server's doing, so it propagates untouched); ``RetryPolicy.wait`` says
how long to wait before the next try, or None when there is none; ``RetryPolicy.rest``
waits that long; ``RetryPolicy.call`` runs a request under the policy. Turning a failure
into a one-line ``LLMError`` stays with each client, which knows what to say (the chat node,
the embedding model). ``server_message`` and ``context_overflow`` read what a server's error
says (its message; a request longer than the model's window, and that window).

A wait can last a minute (a ``Retry-After`` of up to 60 s, before each retry). Inside
``reporting_waits(handler)`` each wait is reported to ``handler`` as ``RetryWaiting`` records
(``crag.events``): when it starts, about once a second as it counts down, and as the retry
is sent; the CLI shows them on its status line. The handler lives in a context variable, so
it follows the thread that makes the request (and the threads given a copy of its context);
outside the block nothing is reported and the wait is one sleep.
"""

from __future__ import annotations

import contextlib
import contextvars
import email.utils
import http
import json
import math
import random
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from attrs import frozen

from ..events import RetryWaiting
from .deadline import pause

__all__ = [
    "EMPTY_BODY",
    "RETRY_AFTER_CAP",
    "WINDOW_ADVICE",
    "BadReply",
    "BadReplyFailure",
    "ConnectionFailure",
    "Failure",
    "RetryPolicy",
    "StatusFailure",
    "TimeoutFailure",
    "body_message",
    "context_overflow",
    "one_line",
    "parse_retry_after",
    "reporting_waits",
    "wait_reason",
    "web_page",
]

RETRY_AFTER_CAP = 60.0  # seconds; a server asking for longer gets an error, not a wait
TICK = 1.0  # seconds between two reports of a wait that counts down

_ON_WAIT: contextvars.ContextVar[Callable[[RetryWaiting], None] | None] = contextvars.ContextVar(
    "crag_on_wait", default=None)

T = TypeVar("T")


EMPTY_BODY = "sent an empty body"  # a 2xx reply with no text at all, whatever its content type


class BadReply(Exception):
    """The server answered 2xx with something that is not a usable reply. ``billed``: it is a
    finished reply (a refusal, tool calls), which the server counts as a call; ``usage`` is
    what it said that call cost, if anything."""

    def __init__(self, what: str, note: str = "", *, billed: bool = False, usage: Any = None) -> None:
        super().__init__(what)
        self.what = what
        self.note = note
        self.billed = billed
        self.usage = usage


@frozen
class TimeoutFailure:
    """The server did not answer within the timeout."""

    retry: bool = True


@frozen
class ConnectionFailure:
    """The connection could not be made, or it was dropped."""

    retry: bool = True


@frozen
class StatusFailure:
    """The server answered with an error status.

    ``too_long``: a retryable status whose ``Retry-After`` exceeds the policy's cap.
    """

    status: int
    retry: bool
    retry_after: float | None = None
    too_long: bool = False


@frozen
class BadReplyFailure:
    """The server answered, but with something that is not a usable reply (never retried)."""

    what: str
    note: str = ""
    retry: bool = False


Failure = TimeoutFailure | ConnectionFailure | StatusFailure | BadReplyFailure


@contextlib.contextmanager
def reporting_waits(handler: Callable[[RetryWaiting], None]) -> Iterator[None]:
    """Every retry wait inside the block is reported to ``handler`` (module doc)."""
    token = _ON_WAIT.set(handler)
    try:
        yield
    finally:
        _ON_WAIT.reset(token)


def wait_reason(failure: Failure) -> str:
    """Why a retry waits, in a few words: ``429 rate limited``, ``503 service unavailable``."""
    if isinstance(failure, StatusFailure):
        if failure.status == 429:
            return "429 rate limited"
        try:
            return f"{failure.status} {http.HTTPStatus(failure.status).phrase.lower()}"
        except ValueError:
            return f"{failure.status} server error"
    if isinstance(failure, TimeoutFailure):
        return "timed out"
    if isinstance(failure, ConnectionFailure):
        return "connection failed"
    return "bad reply"


def one_line(text: object, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``Retry-After-Ms`` / ``Retry-After`` (seconds or an HTTP date).

    None when the header is absent or unreadable; never negative; ``math.inf`` for a number of
    seconds too large for a float (``1e400``, four hundred nines), which is longer than any cap.
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
            if when is None or when.tzinfo is None:
                return None
            reference = time.time() if now is None else now
            return max(0.0, when.timestamp() - reference)
        if math.isinf(seconds) and any(c.isdigit() for c in raw):  # a number too large for a float
            return max(0.0, seconds)  # (negative: 0)
        if not math.isfinite(seconds):  # "inf", "nan": no number of seconds
            if name == "retry-after-ms":
                continue
            return None
        return max(0.0, seconds)
    return None


class RetryPolicy:
    """Which failures are retried, how often, and how long to wait in between.

    ``sleep`` and ``rng`` are there so tests can observe the waits.
    """

    def __init__(
        self,
        max_retries: int,
        *,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        retry_after_cap: float = RETRY_AFTER_CAP,
        sleep: Callable[[float], None] = pause,  # time.sleep that a cancelled call cuts short
        rng: random.Random | None = None,
    ) -> None:
        self.max_retries = int(max_retries)
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_cap = retry_after_cap
        self.sleep = sleep
        self.rng = rng or random.Random()

    def classify(self, exc: BaseException) -> Failure | None:
        """What kind of failure ``exc`` is, or None when it is not the server's doing."""
        if isinstance(exc, BadReply):
            return BadReplyFailure(exc.what, exc.note)
        if isinstance(exc, (TypeError, AttributeError)) and _in_sdk_models(exc):
            # a reply the SDK fails to build its objects from (a key "_fields_set", which it
            # takes for an argument of its own): the server's doing, not a bug to show as one
            return BadReplyFailure("sent a reply the openai SDK cannot read", one_line(exc, 80))
        if isinstance(exc, json.JSONDecodeError):
            if not exc.doc.strip():  # the parser's "Expecting value: line 1 column 1" says nothing of it
                return BadReplyFailure(EMPTY_BODY)
            return BadReplyFailure("sent a body that is not valid JSON", one_line(exc, 80))
        oa = sys.modules.get("openai")  # the clients import it; never imported here
        if oa is not None:
            if isinstance(exc, oa.APITimeoutError):
                return TimeoutFailure()
            if isinstance(exc, oa.APIConnectionError):
                if isinstance(exc.__cause__, BadReply):  # older SDKs wrap what the HTTP client raised
                    return self.classify(exc.__cause__)
                # A redirect loop is the server's setup, not a passing failure: asking again loops again.
                return ConnectionFailure(retry=not _redirect_loop(exc))
            if isinstance(exc, oa.APIStatusError):
                status = exc.status_code
                retry_after = parse_retry_after(getattr(exc.response, "headers", None))
                retryable = status == 429 or status >= 500
                too_long = retry_after is not None and retry_after > self.retry_after_cap
                return StatusFailure(
                    status=status,
                    retry=retryable and not too_long,
                    retry_after=retry_after,
                    too_long=retryable and too_long,
                )
            if isinstance(exc, (oa.APIResponseValidationError, oa.APIError)):
                return BadReplyFailure("sent an unusable reply", one_line(exc, 120))
        transport = _transport_errors()
        if transport and isinstance(exc, transport):
            # Older SDKs let a read timeout through mid-stream: it is a timeout all the same.
            return TimeoutFailure() if type(exc).__name__.endswith("Timeout") else ConnectionFailure()
        return None

    def wait(self, retries: int, failure: Failure) -> float | None:
        """Seconds to wait before retry number ``retries + 1``, or None when there is none."""
        if not failure.retry or retries >= self.max_retries:
            return None
        if isinstance(failure, StatusFailure) and failure.retry_after is not None:
            return float(failure.retry_after)
        ceiling = min(self.backoff_max, self.backoff_base * (2.0 ** min(retries, 64)))  # 2.0**1024 overflows
        return ceiling / 2.0 + self.rng.uniform(0.0, ceiling / 2.0)

    def rest(self, seconds: float, retry: int, failure: Failure, node: str = "", server: str = "LLM") -> None:
        """Wait ``seconds`` before retry number ``retry``, reporting the wait inside
        ``reporting_waits`` (module doc)."""
        report = _ON_WAIT.get()
        if report is None:
            self.sleep(seconds)
            return
        status = failure.status if isinstance(failure, StatusFailure) else None
        reason = wait_reason(failure)

        def tell(left: float) -> None:
            report(RetryWaiting(node, server, reason, seconds, left, retry, self.max_retries, status))

        left = max(0.0, float(seconds))
        while left > 0:
            tell(left)
            fraction = left % TICK
            step = fraction if fraction > 1e-6 else min(TICK, left)  # to a whole second, then by seconds
            self.sleep(step)
            left = max(0.0, left - step)
        tell(0.0)

    def call(
        self,
        request: Callable[[], T],
        translate: Callable[[BaseException, Failure, int], BaseException],
        server: str = "LLM",
    ) -> T:
        """``request()`` with retries; a final failure is raised as ``translate(exc, failure, retries)``."""
        retries = 0
        while True:
            try:
                return request()
            except Exception as exc:
                failure = self.classify(exc)
                if failure is None:
                    raise
                wait = self.wait(retries, failure)
                if wait is None:
                    raise translate(exc, failure, retries) from exc
                retries += 1
                self.rest(wait, retries, failure, server=server)


def _in_sdk_models(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in the openai SDK's model building (``openai/_models.py``)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("/openai/_models.py")


def _redirect_loop(exc: BaseException) -> bool:
    """Whether ``exc`` was caused by the HTTP library giving up on a chain of redirects."""
    cause = exc.__cause__ or exc.__context__
    return type(cause).__name__ == "TooManyRedirects"


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's transport errors, for failures the SDK lets through (mid-stream)."""
    errors: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)  # whichever the SDK loaded; never imported here
        error = getattr(module, "TransportError", None)
        if isinstance(error, type):
            errors.append(error)
    return tuple(errors)


def server_message(exc: BaseException) -> Any:
    """The error message a server put in its body, shortened to one line ("" when none)."""
    return body_message(getattr(exc, "body", None))


def body_message(body: Any) -> Any:
    """The error message of an error body (``error.message``, ``message`` or ``detail``; an
    HTML page's title, else its text), shortened to one line ("" when none)."""
    message = _said(body) if isinstance(body, dict) else _page_text(body) if isinstance(body, str) else None
    return one_line(message, 160) if message else ""


_MESSAGE_KEYS = ("error", "message", "msg", "detail")  # where servers put an error's words, in this order


def _said(value: Any, depth: int = 0) -> str:
    """The words of an error however a server nested them: a string; the first of an object's
    ``_MESSAGE_KEYS`` that has some (FastAPI's ``{"loc": [...], "msg": ...}`` as ``loc: msg``);
    a list's items joined by "; ". Never a Python repr."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if depth > 4:
        return ""
    if isinstance(value, list):
        return "; ".join(text for text in (_said(item, depth + 1) for item in value[:8]) if text)
    if not isinstance(value, dict):
        return ""
    for key in _MESSAGE_KEYS:
        text = _said(value.get(key), depth + 1)
        loc = value.get("loc")
        if text and key == "msg" and isinstance(loc, list) and loc:
            return ".".join(str(part) for part in loc) + ": " + text
        if text:
            return text
    return ""


_HTML_PAGE = re.compile(r"\s*<(?:!doctype\s+html|html)\b", re.I)
_PAGE_TITLE = re.compile(r"<title\b[^>]*>(.*?)</title\s*>", re.I | re.S)
_PAGE_HIDDEN = re.compile(r"<(head|script|style)\b.*?</\1\s*>", re.I | re.S)
_PAGE_TAG = re.compile(r"<[^>]*>")


def web_page(text: str) -> str | None:
    """What ``text`` says when it is an HTML page (its title, else its text, on one line), or
    None when it is not one."""
    return one_line(_page_text(text), 160) if _HTML_PAGE.match(text) else None


def _page_text(text: str) -> str:
    """What an HTML error page (a proxy's, a web server's) says: its title, else its text."""
    if not _HTML_PAGE.match(text):
        return text
    import html

    title = _PAGE_TITLE.search(text)
    if title and title.group(1).strip():
        return html.unescape(title.group(1))
    return html.unescape(_PAGE_TAG.sub(" ", _PAGE_HIDDEN.sub(" ", text)))


# How servers say a request is longer than the model's window, and where they give its size:
# llama.cpp: type "exceed_context_size_error", "n_ctx"; OpenAI: code "context_length_exceeded";
# vLLM: "This model's maximum context length is 4096 tokens".
_OVERFLOW_KINDS = frozenset({"exceed_context_size_error", "context_length_exceeded"})
_OVERFLOW = re.compile(
    r"maximum context length|exceeds? (?:the )?(?:available |maximum )?context (?:size|length|window)"
    r"|context (?:length|size|window) (?:exceeded|is too small)|too many tokens|prompt is too long", re.I)
_WINDOW = re.compile(
    r"maximum context length (?:is|of) (\d+)|available context size \((\d+) tokens\)"
    r"|context (?:window|length|size) (?:is|of) (\d+)", re.I)

# What a refusal for length advises (crag.driver advises otherwise when crag had already fitted
# the request to the window the server named: then its tokenizer counts the prompt longer).
WINDOW_ADVICE = "set KB_AGENT_CONTEXT_TOKENS to the window the server gives a request"


def context_overflow(exc: BaseException, detail: str) -> int | None:
    """For a refusal because the request is longer than the model's window: that window in
    tokens, or 0 when the server did not say; None for any other refusal."""
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else {}
    error = error if isinstance(error, dict) else {}
    kinds = {str(error.get("type") or ""), str(error.get("code") or ""), str(getattr(exc, "code", "") or "")}
    text = detail or str(error.get("message") or "")
    if not (kinds & _OVERFLOW_KINDS or _OVERFLOW.search(text)):
        return None
    n_ctx = error.get("n_ctx")
    if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
        return n_ctx
    found = _WINDOW.search(text)
    return int(next(g for g in found.groups() if g)) if found else 0
