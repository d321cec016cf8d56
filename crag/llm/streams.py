"""Reading a streamed chat completion: the answer's text, how it finished, its usage.

A stream is read as a whole reply is: from the choice whose ``index`` is 0 (``choices[0]`` of a
whole reply), up to and including the chunk that carries its ``finish_reason``; after that only
``usage`` is read (with ``include_usage`` it comes last), and a connection lost then leaves the
answer whole (its usage, when it had not come, is counted). Text is passed on piece by piece as it
arrives, at most ``limit`` characters of it (a server that ignores ``max_tokens`` is read no
further). ``finished_reply`` then says what the stream was, as ``read_completion`` does for a
whole reply: an answer, or a ``BadReply`` for a stream cut mid-answer, a refusal
(``delta.refusal``), native tool calls (``delta.tool_calls``) instead of text.

An error event (``event: error``) is an error with the server's message whatever the shape of
its data: ``{"error": {...}}`` or ``{"error": "..."}``, which the openai SDK raises as its
``APIError``, or ``{"message": ...}`` (or FastAPI's ``{"detail": ...}``), which it passes on as
a chunk with no choices (openai 1.55, the oldest crag supports, wraps it: ``{"data": {"message":
...}, "event": "error"}``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from attrs import Factory, define

from .bodies import whole_body
from .completions import FILTERED, Reply, parts_text, tool_names
from .retry import BadReply, body_message, one_line

__all__ = ["STREAM_ERROR", "Streamed", "finished_reply", "read_chunks", "whole_completion"]

STREAM_ERROR = "sent an error in the answer's stream"  # an error event, whatever its data's shape
_ERROR_KEYS = ("error", "message", "msg", "detail")  # where an error event's data has its words (``body_message``)


@define
class Streamed:
    """What the chunks of one stream said, besides the text (which goes to ``delivered``)."""

    chunks: int = 0
    usage: Any = None
    finish: str | None = None
    refusal: list[str] = Factory(list)  # a refusal streams as delta.refusal pieces, with no content
    calls: list[Any] = Factory(list)  # native tool calls stream as delta.tool_calls pieces, with no content


def read_chunks(stream: Iterable[Any], delivered: list[str], on_delta: Callable[[str], None] | None,
                limit: int | None, api_error: type[BaseException],
                lost: type[BaseException] | tuple[type[BaseException], ...] = ()) -> Streamed:
    """Read ``stream`` (the SDK's chunks), appending each piece of text to ``delivered`` and
    passing it to ``on_delta``; past ``limit`` characters the stream is left unread and the reply
    is one stopped by its budget. ``api_error``: the SDK's ``APIError``, raised for an error event;
    ``lost``: its errors of a connection closed or timed out, which after the finish end the
    reading (the answer is whole, only its usage or ``[DONE]`` was still to come)."""
    read = Streamed()
    size = 0
    try:
        for chunk in stream:
            if limit is not None and size >= limit:  # the server ignored max_tokens: read no more
                read.finish = "length"
                break
            read.chunks += 1
            said = _error_message(chunk)
            if said is not None:
                raise BadReply(STREAM_ERROR, said)
            if getattr(chunk, "usage", None) is not None:
                read.usage = chunk.usage
            choice = _first_choice(getattr(chunk, "choices", None))
            if choice is None or read.finish is not None:  # after the finish, only usage is read
                continue
            reason = getattr(choice, "finish_reason", None)
            if isinstance(reason, str) and reason:
                read.finish = reason
            delta = getattr(choice, "delta", None)
            refusal = getattr(delta, "refusal", None)
            if isinstance(refusal, str):
                read.refusal.append(refusal)
            calls = getattr(delta, "tool_calls", None)
            if isinstance(calls, list):
                read.calls += calls
            piece = parts_text(getattr(delta, "content", None))
            if isinstance(piece, str) and piece and limit is not None:
                piece = piece[:limit - size]
                size += len(piece)
            if isinstance(piece, str) and piece:
                delivered.append(piece)
                if on_delta is not None:
                    on_delta(piece)
    except api_error as exc:
        if read.finish is not None and isinstance(exc, lost):
            return read
        if type(exc) is not api_error:  # a status, a connection, a validation: not an error event
            raise
        raise BadReply(STREAM_ERROR, body_message(getattr(exc, "body", None)) or one_line(exc, 160)) from exc
    return read


def finished_reply(read: Streamed, delivered: list[str], done: bool) -> Reply:
    """The reply a stream that sent chunks gave (``done``: it ended with ``data: [DONE]``), or
    ``BadReply`` when it gave none (the module doc)."""
    if read.finish is None and not done:
        # Closed mid-answer: what was shown is a fragment, not an answer (as a dropped connection).
        raise BadReply("ended the answer's stream before it was finished", "no finish_reason and no [DONE]")
    declined = "".join(read.refusal).strip() or (FILTERED if read.finish == "content_filter" else "")
    if not delivered and declined:  # as a refusal without streaming
        raise BadReply("returned no message content", f"refusal: {one_line(declined, 120)}",
                       billed=True, usage=read.usage)
    if not "".join(delivered).strip() and (read.calls or read.finish == "tool_calls"):  # as tool calls, whole
        raise BadReply("returned tool calls instead of an answer", one_line(tool_names(read.calls), 120),
                       billed=True, usage=read.usage)
    return Reply("".join(delivered), read.usage, read.finish)


def whole_completion(response: Any, completion_type: Any) -> Any:
    """The chat completion a server sent whole when asked to stream (``completion_type``: the
    SDK's ``ChatCompletion``), or None. It is read as the SDK reads a reply it did not stream:
    without validation, so that a field the model requires (usage's ``total_tokens``, ``id``)
    missing, or a ``finish_reason`` outside its list, does not make it no completion."""
    import json

    body = whole_body(response)
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict) and "message" in choices[0]):
        return None  # not a whole completion either (a chunk's delta): the next streaming mode is worth a try
    return completion_type.construct(**data)


def _error_message(chunk: Any) -> str | None:
    """The message of an error event the SDK passed on as a chunk (data such as ``{"message":
    ...}``: no choices, an error, a message or a detail), or None for a chunk that is no error."""
    if isinstance(getattr(chunk, "choices", None), list):
        return None
    extra = getattr(chunk, "model_extra", None) or {}
    if extra.get("event") == "error":  # openai 1.55 passes any named event on as {"data": ..., "event": ...}
        return body_message(extra.get("data")) or "no message"
    if not (any(key in extra for key in _ERROR_KEYS) or getattr(chunk, "object", None) == "error"):
        return None
    return body_message(extra) or "no message"


def _first_choice(choices: Any) -> Any:
    """The choice of a chunk that the answer is read from: the one whose ``index`` is 0 (the
    first of the list when it has no index), as a whole reply is read from ``choices[0]``; None
    when the chunk has none (a usage chunk, a keep-alive, a server's junk)."""
    for position, choice in enumerate(choices if isinstance(choices, list) else ()):
        index = getattr(choice, "index", None)
        if (position if index is None else index) == 0:
            return choice
    return None
