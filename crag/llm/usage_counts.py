"""A reply's token counts: the server's ``usage`` where it can be one, else counted.

``reply_usage`` reads prompt, completion and cached prompt tokens from the reply's ``usage``
and counts what the server did not report (OpenAI's chat framing: 4 per message plus 3 for the
reply; nothing cached). A tokenizer makes at most one token of each byte, so a count far above
the bytes of its text is not a count (a server once reported 3 x 10^29 completion tokens): it
is replaced by the counted one, and the caller is told so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["is_count", "reply_usage"]

# Tokens a server may count beyond one per byte of the text crag sent or received (a chat
# template, a system prompt of its own): a reported count above that cannot be one.
_SLACK_TOKENS = 8192


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _whole(value: Any) -> Any:
    """A count a server wrote with a decimal point (``120.0``) as the integer it is; anything
    else as it came (``is_count`` judges it)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def reply_usage(
    usage: Any,
    messages: Sequence[Mapping[str, str]],
    text: str,
    budget: int | None,
    count: Callable[[str], int],
    sent_bytes: int | None = None,
) -> tuple[int, int, int, bool, bool]:
    """Prompt, completion and cached prompt tokens, whether a reported count was replaced, and
    whether crag counted any of them (the server reported none, or one that was replaced).

    The bound is generous (``_SLACK_TOKENS`` for a chat template or a system prompt the server
    adds, and hidden reasoning tokens up to the reply's ``budget``): only an impossible count
    is replaced. ``count`` counts the tokens of a text. ``text`` is the reply as crag kept it;
    ``sent_bytes``, when the server sent more (a reply cut to its budget), the size of what it
    sent, which bounds a reported count: an unreported one is counted on what was kept.
    """
    prompt = getattr(usage, "prompt_tokens", None) if usage is not None else None
    completion = getattr(usage, "completion_tokens", None) if usage is not None else None
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    if isinstance(details, dict):
        cached = details.get("cached_tokens")
    else:
        cached = getattr(details, "cached_tokens", None)
    prompt, completion, cached = _whole(prompt), _whole(completion), _whole(cached)
    replaced = False
    prompt_bytes = sum(len(m["content"].encode("utf-8", "replace")) for m in messages)
    if is_count(prompt) and prompt > prompt_bytes + _SLACK_TOKENS:
        prompt, replaced = None, True
    if sent_bytes is None:
        sent_bytes = len(text.encode("utf-8", "replace"))
    if is_count(completion) and completion > max(sent_bytes + _SLACK_TOKENS, budget or 0):
        completion, replaced = None, True
    counted = not (is_count(prompt) and is_count(completion))
    if not is_count(prompt):
        prompt = sum(count(m["content"]) + 4 for m in messages) + 3
    if not is_count(completion):
        completion = count(text)
    if not is_count(cached):
        cached = 0
    return prompt, completion, min(cached, prompt), replaced, counted
