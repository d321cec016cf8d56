"""The openai adapter: the ``ChatModel`` port over the official SDK's chat completions API.

It owns everything between a node's ``LLMRequest`` and the HTTP server: the
``X-Crag-Node`` header on every request, the request parameters (``temperature``,
``max_tokens``, ``response_format``), the timeout, retries, streaming, token usage
(cached prompt tokens included) and latency, and the translation of the SDK's exceptions
into crag's errors.

Retries follow crag's one policy for OpenAI clients (``crag.llm.retry``): 429, 5xx,
timeouts and dropped connections, ``KB_AGENT_LLM_MAX_RETRIES`` times, honouring
``Retry-After``. Any other 4xx is final at once (401 and 403 point at the key, ``credentials_hint``).
A stream that has already delivered text is not retried, so a reader never sees an answer
twice; one that ends with neither a ``finish_reason`` nor ``[DONE]`` was cut mid-answer and is
an error like a dropped connection, never passed off as a whole answer; an error event in the
stream is an error with the server's message, whichever shape its data has.

Structured output: a request with a ``reply_schema`` asks for ``response_format``
``json_schema``. With ``KB_AGENT_STRUCTURED_OUTPUT=auto`` a server that refuses it (400 or
422) is asked again with ``json_object``, then with no ``response_format``; the first that
works is remembered for the server and model for the rest of the process, and these
fall-backs are not retries. ``json_schema``, ``json_object`` and ``off`` use that one format
only.

Parameters a model refuses: OpenAI's reasoning models (the o-series, GPT-5) answer
``max_tokens`` with a 400 asking for ``max_completion_tokens``, and a ``temperature`` other
than 1 with a 400 too. Such a refusal (the error names the parameter) is asked again with the
budget sent as ``max_completion_tokens``, or without ``temperature``; what the server refused
is remembered for the server and model for the rest of the process, and it is not a retry.

Streaming (``on_delta``) asks for ``stream_options.include_usage``; a server that refuses
that gets a plain stream, and one that refuses streaming (or answers it with no events) a
normal request whose text is passed to ``on_delta`` whole. One that answers a streaming request
with a whole completion has given the answer: it is used, not asked for again. What worked is
remembered.

No content with ``finish_reason`` ``length`` is an empty, truncated reply. A refusal (no content
and a ``refusal``, or ``finish_reason`` ``content_filter``) to route, plan or grade is an empty
reply with ``Completion.refusal`` beside it, so the node's fallback for a reply it cannot read
applies; an answer refused, streamed or not, is an ``LLMError`` naming the refusal.

Every failure leaves through one boundary, ``_translate``, as a one-line ``LLMError`` (or
``LLMTimeoutError``) naming the server, the status and the node, chained to the SDK's
exception, with the API key and any URL password redacted (a server may echo them).
``KB_AGENT_LLM_TIMEOUT`` bounds each request as a whole, stream included
(``crag.llm.deadline``), not only each network read. ``openai`` is imported when the adapter
is built, never by ``import crag``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import evolve

from ..config import Settings
from ..errors import ConfigError, LLMContextError, LLMError, LLMTimeoutError
from ..ports import LLMRequest, SynthesizeTask
from ..safe_text import redact_message, scrub_error, valid_text
from ..state import Completion
from .bodies import (
    Redirect,
    base_url_hint,
    client_address,
    credentials_hint,
    hops_note,
    http_client,
    redirect_note,
    saw_done,
    server_label,
    watching_redirects,
)
from .completions import Reply, read_completion
from .deadline import pause, request_deadline
from .lease import LeasedClient
from .logprobs import LOGPROBS as _LOGPROBS
from .logprobs import covering, logprob_params
from .retry import (
    RETRY_AFTER_CAP,
    WINDOW_ADVICE,
    BadReply,
    ConnectionFailure,
    Failure,
    RetryPolicy,
    StatusFailure,
    TimeoutFailure,
    context_overflow,
    one_line,
    parse_retry_after,
    server_message,
)
from .server_memory import PROCESS, ServerMemory, adapted, refused_param
from .streams import finished_reply, read_chunks, whole_completion
from .tokens import count_tokens, encoding_for_model
from .usage_counts import reply_usage

__all__ = ["NODE_HEADER", "RETRY_AFTER_CAP", "OpenAIChatModel", "parse_retry_after"]

NODE_HEADER = "X-Crag-Node"
PLACEHOLDER_API_KEY = "not-needed"  # local servers (Ollama, vLLM, llama.cpp) ignore the key

# A streaming request refused with one of these is tried again in a simpler mode.
_STREAM_REFUSALS = frozenset({400, 415, 422, 501})
_STREAM_MODES = ("usage", "plain", "off")

# A request with a response_format refused with one of these tries the next format (auto).
_FORMAT_REFUSALS = frozenset({400, 422})
_FORMATS = ("json_schema", "json_object", "off")

# What a server refused (or, for logprobs, ignored: crag.llm.logprobs) and the format that
# worked are remembered per Agent in a ServerMemory (crag.llm.server_memory).

_one_line = one_line

# The most characters a reply may hold per token of its ``max_tokens`` budget: four times what
# a tokenizer averages. A server that ignores the budget and sends more is cut here, its reply
# read as one stopped by the budget (``finish_reason`` ``length``), so that a reply of megabytes
# costs no more time than one of the size asked for.
_CHARS_PER_TOKEN = 16

class _StreamRefused(Exception):
    """The server refused this streaming mode; the next simpler one is worth a try."""


class _FormatRefused(Exception):
    """The server refused this response_format; the next simpler one is worth a try."""


class _ParamRefused(Exception):
    """The server refused a request parameter (``param``) that can be sent another way."""

    def __init__(self, param: str) -> None:
        super().__init__(param)
        self.param = param


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
        sleep: Callable[[float], None] = pause,  # time.sleep that a cancelled call cuts short
        rng: random.Random | None = None,
        memory: ServerMemory | None = None,
    ) -> None:
        self.settings = settings
        self.memory = memory if memory is not None else PROCESS
        self.model = settings.model
        self.timeout = float(settings.llm_timeout)
        self.policy = RetryPolicy(
            settings.llm_max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            retry_after_cap=retry_after_cap,
            sleep=sleep,
            rng=rng,
        )
        self.structured_output = getattr(settings, "structured_output", "auto")
        self._stream_mode = "usage"
        self._encoding = encoding_for_model(self.model)
        base_url = settings.openai_base_url or None
        api_key = settings.openai_api_key or (PLACEHOLDER_API_KEY if base_url else "")
        if not api_key:
            raise ConfigError(  # blamed on the setting that asks for a key, as the openai embedder's is
                "KB_AGENT_LLM",
                "openai",
                "offline, or openai with OPENAI_API_KEY set (or OPENAI_BASE_URL for a local server that needs no key)",
            )
        import openai

        self._openai = openai
        self._client_args = (api_key, base_url)
        self._clients = LeasedClient(self._new_client)
        self.server = redact_message(server_label(base_url), settings.secrets())
        self._secrets = (*settings.secrets(), api_key)

    @property
    def max_retries(self) -> int:
        return self.policy.max_retries

    def _new_client(self) -> Any:
        openai = self._openai
        api_key, base_url = self._client_args
        address, query, headers = client_address(base_url)
        try:
            return openai.OpenAI(
                api_key=api_key, base_url=address, default_query=query, default_headers=headers,
                timeout=self.timeout, max_retries=0, http_client=http_client(openai, timeout=self.timeout),
            )
        except openai.OpenAIError as exc:
            raise LLMError(f"cannot set up the OpenAI client: {_one_line(exc)}") from exc

    def close(self) -> None:
        """Release the client's connections, once the requests other threads are sending end.
        The model stays usable: a fresh client takes the closed one's place (crag.llm.lease)."""
        self._clients.close()

    # -- the port ------------------------------------------------------------------------

    def complete(
        self, request: LLMRequest, on_delta: Callable[[str], None] | None = None
    ) -> Completion:
        """One chat completion for ``request``, with retries; raises ``LLMError``."""
        started = time.perf_counter()
        node = request.node
        messages = [{"role": str(m["role"]), "content": valid_text(str(m["content"]))} for m in request.messages]
        delivered: list[str] = []
        mode = self._stream_mode if on_delta is not None else "off"
        fmt = self._first_format() if request.reply_schema is not None else "off"
        first, first_fmt = self._refused(), fmt
        retries = 0
        limit = request.max_tokens * _CHARS_PER_TOKEN if request.max_tokens else None
        while True:
            params = self._params(request, fmt)
            hops: list[Redirect] = []  # where the server redirected this request, if it did
            try:
                with request_deadline(self.timeout), watching_redirects(hops), self._clients.use() as client:
                    if mode == "off":
                        reply = self._plain(client, messages, node, params,
                                            not isinstance(request.task, SynthesizeTask))
                    else:
                        reply = self._stream(client, messages, node, params, mode, on_delta, delivered, limit)
            except _ParamRefused as refused:
                self._remember_refused(refused.param)
                continue
            except _FormatRefused:
                fmt = _FORMATS[_FORMATS.index(fmt) + 1]
                continue
            except _StreamRefused:
                mode = _STREAM_MODES[_STREAM_MODES.index(mode) + 1]
                continue
            except Exception as exc:
                failure = self.policy.classify(exc)
                if failure is None:
                    raise
                wait = self.policy.wait(retries, failure) if not delivered else None
                if wait is None:
                    error = self._translate(exc, failure, node, retries, "response_format" in params, bool(delivered),
                                            hops)
                    scrub_error(exc, self._secrets)  # its chain is logged with crag's error
                    error = _redacted(error, self._secrets)
                    error.latency_ms = (time.perf_counter() - started) * 1000.0
                    bad = exc if isinstance(exc, BadReply) else exc.__cause__
                    if isinstance(bad, BadReply) and bad.billed:  # a finished reply, paid for: counted
                        tokens = self._usage(bad.usage, messages, "", request.max_tokens)
                        error.billed = Completion(text="", model=self.model, prompt_tokens=tokens[0],
                                                  completion_tokens=tokens[1], latency_ms=error.latency_ms,
                                                  cached_tokens=tokens[2], usage_replaced=tokens[3],
                                                  usage_estimated=tokens[4])
                    raise error from exc
                retries += 1
                self.policy.rest(wait, retries, failure, node=node)
                continue
            break
        if reply.whole:  # the server does not stream: ask it for whole replies from now on
            mode = "off"
        if "logprobs" in params and reply.logprobs is None and reply.text.strip():
            self._remember_refused(_LOGPROBS)  # the server ignores them: stop asking (an empty reply has no tokens)
        if request.reply_schema is not None and self.structured_output == "auto":
            self.memory.remember_format(self._format_key, fmt)
        sent_bytes = None  # the size of what the server sent, when crag kept less: it bounds its usage
        if limit is not None and len(reply.text) > limit:  # it ignored max_tokens: cut to the budget
            sent_bytes = len(reply.text.encode("utf-8", "replace"))
            reply = evolve(reply, text=reply.text[:limit], finish_reason="length")
        if limit is not None and reply.logprobs is not None:  # and its probabilities no further than the text
            reply = evolve(reply, logprobs=covering(reply.logprobs, limit))
        if on_delta is not None:
            self._stream_mode = mode
            if mode == "off" and reply.text:
                on_delta(reply.text)
        prompt_tokens, completion_tokens, cached, replaced, counted = self._usage(
            reply.usage, messages, reply.text, request.max_tokens, sent_bytes)
        latency_ms = (time.perf_counter() - started) * 1000.0
        return Completion(
            text=reply.text,
            model=self.model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
            cached_tokens=cached,
            finish_reason=reply.finish_reason,
            usage_replaced=replaced,
            usage_estimated=counted,
            refusal=reply.refusal,
            logprobs=reply.logprobs,
            adapted=adapted(request, first, first_fmt if self.structured_output == "auto" else _FORMATS[0], fmt,
                            _FORMATS[0]),
        )

    # -- request parameters ----------------------------------------------------------------

    @property
    def _format_key(self) -> tuple[str, str]:
        return (self.server, self.model)

    def _first_format(self) -> str:
        """The structured-output format to try first for a JSON reply."""
        if self.structured_output != "auto":
            return self.structured_output
        return self.memory.format(self._format_key, _FORMATS[0])

    def _refused(self) -> frozenset[str]:
        return self.memory.refused(self._format_key)

    def _remember_refused(self, param: str) -> None:
        self.memory.remember_refused(self._format_key, param)

    def _params(self, request: LLMRequest, fmt: str) -> dict[str, Any]:
        params: dict[str, Any] = {}
        refused = self._refused()
        if request.temperature is not None and "temperature" not in refused:
            params["temperature"] = float(request.temperature)
        if request.max_tokens is not None:
            budget = "max_completion_tokens" if "max_tokens" in refused else "max_tokens"
            params[budget] = int(request.max_tokens)
        params.update(logprob_params(request.logprobs, refused))
        schema = request.reply_schema
        if schema is not None and fmt == "json_schema":
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": str(schema.get("name", "reply")),
                    "schema": schema.get("schema", {}),
                    "strict": False,
                },
            }
        elif schema is not None and fmt == "json_object":
            params["response_format"] = {"type": "json_object"}
        return params

    def _refused_param(self, exc: BaseException, params: Mapping[str, Any]) -> str | None:
        """The parameter of ``params`` that ``exc`` refuses and crag can send another way, if
        any (``crag.llm.server_memory.refused_param``)."""
        if not isinstance(exc, self._openai.APIStatusError) or exc.status_code not in _FORMAT_REFUSALS:
            return None
        return refused_param(exc, params)

    def _refused_format(self, exc: BaseException, params: Mapping[str, Any]) -> bool:
        """``exc`` is a refusal worth answering with a simpler response_format."""
        return (
            "response_format" in params
            and self.structured_output == "auto"
            and isinstance(exc, self._openai.APIStatusError)
            and exc.status_code in _FORMAT_REFUSALS
            and context_overflow(exc, server_message(exc)) is None  # too long is not a format refusal
        )

    # -- one request -----------------------------------------------------------------------

    def _plain(self, client: Any, messages: list[dict[str, str]], node: str, params: dict[str, Any],
               refusal_is_reply: bool = False) -> Reply:
        """One request. ``refusal_is_reply``: a refusal is the reply (module doc), else an error."""
        try:
            reply = client.chat.completions.create(
                model=self.model, messages=messages, extra_headers={NODE_HEADER: node}, **params
            )
        except self._openai.APIStatusError as exc:
            refused = self._refused_param(exc, params)
            if refused is not None:
                raise _ParamRefused(refused) from exc
            if self._refused_format(exc, params):
                raise _FormatRefused from exc
            raise
        return read_completion(reply, "logprobs" in params, refusal_is_reply)

    def _stream(
        self,
        client: Any,
        messages: list[dict[str, str]],
        node: str,
        params: dict[str, Any],
        mode: str,
        on_delta: Callable[[str], None] | None,
        delivered: list[str],
        limit: int | None = None,
    ) -> Reply:
        """One streamed request; past ``limit`` characters the stream is left unread and the
        reply is one stopped by its budget."""
        extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if mode == "usage" else {}
        try:
            stream = client.chat.completions.create(
                model=self.model,
                messages=messages,
                stream=True,
                extra_headers={NODE_HEADER: node},
                **params,
                **extra,
            )
        except self._openai.APIStatusError as exc:
            refused = self._refused_param(exc, params)
            if refused is not None:
                raise _ParamRefused(refused) from exc
            if self._refused_format(exc, params):
                raise _FormatRefused from exc
            if exc.status_code in _STREAM_REFUSALS and context_overflow(exc, server_message(exc)) is None:
                raise _StreamRefused from exc  # (too long is not a refusal to stream)
            raise
        with stream:
            read = read_chunks(stream, delivered, on_delta, limit, self._openai.APIError,
                               self._openai.APIConnectionError)
        if read.chunks == 0:  # not an event stream: the server ignored stream=True
            whole = whole_completion(getattr(stream, "response", None), self._openai.types.chat.ChatCompletion)
            if whole is None:
                raise _StreamRefused
            return evolve(read_completion(whole, "logprobs" in params), whole=True)  # its whole answer, not asked for again
        return finished_reply(read, delivered, saw_done(getattr(stream, "response", None)))

    # -- accounting ------------------------------------------------------------------------

    def _count(self, text: str) -> int:
        try:
            return count_tokens(text, self._encoding)
        except Exception:  # no tokenizer at all: a rough count beats none
            return max(1, len(text) // 4) if text else 0

    def _usage(
        self, usage: Any, messages: Sequence[Mapping[str, str]], text: str, budget: int | None = None,
        sent_bytes: int | None = None,
    ) -> tuple[int, int, int, bool, bool]:
        """Prompt, completion and cached prompt tokens, whether a reported count was replaced and
        whether crag counted any (``crag.llm.usage_counts.reply_usage``)."""
        return reply_usage(usage, messages, text, budget, self._count, sent_bytes)

    # -- failures --------------------------------------------------------------------------

    def _translate(self, exc: BaseException, failure: Failure, node: str, retries: int,
                   format_sent: bool = False, begun: bool = False, hops: Sequence[Redirect] = ()) -> LLMError:
        """The one place an SDK failure becomes a crag error: one line, server, status, node
        (``format_sent``: the request carried a ``response_format``; ``begun``: some of the
        answer had streamed in; ``hops``: the redirects the server answered it with)."""
        where = f"LLM server {self.server}"
        after = f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""
        moved = hops_note(list(hops), "OPENAI_BASE_URL")  # a status error finds it in its response
        if isinstance(failure, TimeoutFailure):
            return LLMTimeoutError(
                f"{where} did not {'finish its answer' if begun else 'answer'} within {self.timeout:g} s "
                f"for node {node}{after} "
                "(KB_AGENT_LLM_TIMEOUT)" + moved,
                node=node,
            )
        if isinstance(failure, ConnectionFailure):
            cause = exc.__cause__ or exc.__context__ or exc
            reason = _one_line(cause, 120) or type(cause).__name__
            if type(cause).__name__ == "TooManyRedirects":
                return LLMError(
                    f"{where} redirected the request too many times for node {node}{after}; check "
                    "OPENAI_BASE_URL (the address the API answers at, not one that redirects)",
                    node=node,
                )
            if "Connect" in type(cause).__name__ and hops:  # the server was reached: where it sent the request was not
                return LLMError(
                    f"{where} redirected the request for node {node} ({hops[0].status}) to "
                    f"{hops[-1].to or 'another address'}, which could not be reached{after} ({reason}): "
                    "set OPENAI_BASE_URL to the address the API answers at",
                    node=node,
                )
            if "Connect" in type(cause).__name__:
                return LLMError(
                    f"{where} could not be reached for node {node}{after} ({reason}); "
                    "check OPENAI_BASE_URL and that the server is running",
                    node=node,
                )
            return LLMError(f"{where} closed the connection for node {node}{after} ({reason}){moved}", node=node)
        if isinstance(failure, StatusFailure):
            status = failure.status
            message = f"{where} answered {status} for node {node}{after}"
            detail = server_message(exc)
            overflow = context_overflow(exc, detail) if status in (400, 413) else None
            if overflow is not None:
                window = overflow or None
                size = f" of {window} tokens" if window else ""
                return LLMContextError(
                    f"{message}: the request does not fit the model's context window{size}; {WINDOW_ADVICE}"
                    + (f" ({detail})" if detail else ""),
                    node=node, status=status, window=window,
                )
            if status == 401:
                message += f": check {credentials_hint(self._client_args[1])}"
            elif status == 403:
                message += f": access denied; check {credentials_hint(self._client_args[1])} and its access to model {self.model}"
            elif status == 404:
                message += f": check KB_AGENT_MODEL ({self.model}) and OPENAI_BASE_URL{base_url_hint(self.server)}"
            elif status in _FORMAT_REFUSALS and format_sent and self.structured_output != "auto":
                message += (f": the server may not support KB_AGENT_STRUCTURED_OUTPUT={self.structured_output}; "
                            "set it to auto to fall back")
            elif failure.too_long:
                message += (
                    f": it asked to retry after {_seconds(failure.retry_after)}, longer than "
                    f"{self.policy.retry_after_cap:g} s"
                )
            if detail:
                message += f" ({detail})"
            return LLMError(message + redirect_note(exc, "OPENAI_BASE_URL"), node=node, status=status)
        note = f" ({failure.note})" if failure.note else ""
        return LLMError(f"{where} {failure.what} for node {node}{note}{moved}", node=node)


def _seconds(seconds: float | None) -> str:
    """A wait a server asked for, for a message (one too long for a float said so)."""
    if seconds is None or not math.isfinite(seconds):
        return "more seconds than a number can hold"
    return f"{seconds:.0f} s"


def _redacted(error: LLMError, secrets: Sequence[str]) -> LLMError:
    """``error`` with every secret (and URL password) in its message replaced by ``***``."""
    message = redact_message(str(error), secrets)
    if message == str(error):
        return error
    if isinstance(error, LLMContextError):
        return LLMContextError(message, node=error.node, status=error.status, window=error.window)
    return type(error)(message, node=error.node, status=error.status)
