"""Reading what a chat completion brought back: the text, the finish reason, a refusal.

``read_completion`` turns a whole ``chat.completion`` (as the openai SDK parsed it, or as a
server sent it whole to a streaming request) into a ``Reply``, or raises ``BadReply`` for one
that holds no usable message (native tool calls instead of text are read as a plan, except for
the answer, where they are an error); ``parts_text`` reads content sent as a list of parts, streamed
or not. What to do with a refusal is the caller's (``crag.llm.openai_chat``'s module doc).
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from ..state import TokenLogprob
from .logprobs import read_logprobs
from .retry import EMPTY_BODY, BadReply, body_message, one_line, web_page

__all__ = ["FILTERED", "Reply", "parts_text", "read_completion"]

FILTERED = "the server's content filter (finish_reason content_filter)"  # a refusal with no words


@frozen
class Reply:
    """What one request brought back, before accounting."""

    text: str
    usage: Any = None
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    refusal: str | None = None  # the model declined: its reply is empty
    whole: bool = False  # asked to stream, the server answered with a whole reply


def read_completion(reply: Any, logprobs: bool = False, refusal_is_reply: bool = False) -> Reply:
    """The ``Reply`` of a whole chat completion; ``logprobs``: they were asked for.
    ``refusal_is_reply``: a refusal is the reply (empty, with ``refusal``), else an error."""
    choices = getattr(reply, "choices", None)
    if isinstance(reply, (str, bytes)) and not reply.strip():
        raise BadReply(EMPTY_BODY)
    if isinstance(reply, (str, bytes)) or not hasattr(reply, "choices"):
        shown = as_sent(reply)
        if isinstance(reply, (str, bytes)) and shown.lstrip().startswith(("data:", "event:")):
            # a gateway that streams every reply: the request asked for one whole completion
            raise BadReply("sent an event stream to a request that did not ask to stream", repr(one_line(shown, 80)))
        page = web_page(shown) if isinstance(reply, (str, bytes)) else None
        if page is not None:  # a proxy's sign-in page, a web UI at the base URL: what it says, not its markup
            raise BadReply("sent a web page instead of a chat completion", repr(page))
        raise BadReply("sent a reply that is not a chat completion", repr(one_line(shown, 80)))
    if not isinstance(choices, list) or not choices:
        extra = getattr(reply, "model_extra", None) or {}
        said = body_message(extra) if "error" in extra or getattr(reply, "object", None) == "error" else ""
        if said:  # an error sent with status 200, as some gateways do
            raise BadReply("sent an error instead of a completion", said)
        raise BadReply("returned no choices")
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    finish = getattr(choices[0], "finish_reason", None)
    finish = finish if isinstance(finish, str) else None
    content = parts_text(content)
    calls = getattr(message, "tool_calls", None)
    if not (isinstance(content, str) and content.strip()) and isinstance(calls, list) and calls:
        if not refusal_is_reply:  # an answer is text: tool calls are none
            raise BadReply("returned tool calls instead of an answer", one_line(tool_names(calls), 120),
                           billed=True, usage=getattr(reply, "usage", None))
        content = tool_calls_text(calls)  # crag sends no tools: the model wrote its plan as calls
    refusal = getattr(message, "refusal", None)
    refusal = refusal.strip() if isinstance(refusal, str) else ""
    if not isinstance(content, str) or ((refusal or finish == "content_filter") and not content.strip()):
        # (some send "" with a refusal, or with the filter's finish: as null content)
        refusal = refusal or (FILTERED if finish == "content_filter" else "")
        if not refusal:  # no text at all (the budget ran out first, or the server sent none): an
            return Reply("", getattr(reply, "usage", None), finish)  # empty reply, for the node's fall-back
        if refusal_is_reply and refusal:
            return Reply("", getattr(reply, "usage", None), finish, refusal=refusal)
        raise BadReply("returned no message content", f"refusal: {one_line(refusal, 120)}",
                       billed=True, usage=getattr(reply, "usage", None))
    return Reply(content, getattr(reply, "usage", None), finish,
                 read_logprobs(getattr(choices[0], "logprobs", None)) if logprobs else None)


def as_sent(value: Any) -> str:
    """A body the SDK read as no completion, as the server wrote it: the text of a body that
    is no JSON, else JSON again (``null``, ``[true, {"a": 1}]``), never a Python repr of what
    the SDK made of it (``None``, ``[True, ChatCompletion(id=None, ...)]``)."""
    import json

    def plain(item: Any) -> Any:
        dump = getattr(item, "model_dump", None)
        if callable(dump):  # an object the SDK read as a completion: the keys the server sent
            return dump(mode="json", exclude_unset=True, warnings=False)
        return [plain(each) for each in item] if isinstance(item, list) else item

    if isinstance(value, (str, bytes)):
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    try:
        return json.dumps(plain(value), ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def tool_calls_text(calls: list[Any]) -> str:
    """Native tool calls (``message.tool_calls``, which some servers send although crag offers no
    tools) as the plan reply they stand for: ``{"tool_calls": [{"tool": name, "args": ...}]}``,
    each call's arguments parsed when they are a JSON object, else kept as sent, for the plan's
    validation to refuse."""
    import json

    plan = []
    for call in calls:
        function = _field(call, "function")
        name = _field(function, "name")
        raw = _field(function, "arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            args = raw
        plan.append({"tool": name if isinstance(name, str) else "", "args": args})
    return json.dumps({"tool_calls": plan})


def _field(record: Any, name: str) -> Any:
    """A field of a record the SDK parsed, or of a dict it left as sent."""
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def tool_names(calls: list[Any]) -> str:
    """The names of ``calls`` (native tool calls), for a message."""
    names = (_field(_field(call, "function"), "name") for call in calls)
    return ", ".join(str(name) for name in names if name) or "unnamed"


def parts_text(content: Any) -> Any:
    """``content`` as text when it is a list of content parts, as some servers send it, streamed
    or not: the text of its ``text`` parts (a part holding a model's thinking has none)."""
    if not isinstance(content, list):
        return content
    texts = (part.get("text") if isinstance(part, dict) else getattr(part, "text", None) for part in content)
    return "".join(text for text in texts if isinstance(text, str))
