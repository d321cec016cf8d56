"""Earlier turns and the size of what is asked: a history read into ``Message`` records, the
newest turns that can fit, and the longest question ``KB_AGENT_CONTEXT_TOKENS`` can hold,
refused before any tokenizing. ``Agent`` and the command line read them alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .config import Settings
from .errors import UsageError
from .safe_text import short_value
from .state import Message

__all__ = ["fitting_turns", "input_limit", "parse_history", "too_long"]


# No token of the encodings crag counts with (cl100k_base, o200k_base) is longer than 128
# characters, so a text of more than 128 x KB_AGENT_CONTEXT_TOKENS characters cannot fit the
# window: it is refused (a question) or left out (the oldest turns of a history) before any
# tokenizing, which for a 300 MB question took minutes and gigabytes.
MAX_TOKEN_CHARS = 128
# And whatever the window, no question is over 64 Mi characters: more than any window up to
# KB_AGENT_CONTEXT_TOKENS' ceiling (10,000,000 tokens) holds of real text, and what a
# `chat` or `ask -` reading a stream with no end (/dev/zero) holds in memory before refusing it.
MAX_INPUT_CHARS = 64 * 2**20


def input_limit(settings: Settings) -> int:
    """The most characters a question can have and still fit ``KB_AGENT_CONTEXT_TOKENS``."""
    return min(MAX_TOKEN_CHARS * settings.context_tokens, MAX_INPUT_CHARS)


def too_long(what: str, size: int, settings: Settings) -> UsageError:
    """The refusal of an input that cannot fit the model's window, said before tokenizing it."""
    return UsageError(
        f"{what} is {size:,} characters, more than can fit KB_AGENT_CONTEXT_TOKENS={settings.context_tokens} "
        f"({input_limit(settings):,} characters at most): shorten it"
    )


def fitting_turns(turns: Sequence[Message], limit: int) -> tuple[Message, ...]:
    """The newest turns whose text adds up to at most ``limit`` characters: older ones could
    never fit the window, and the budget drops the oldest turns first anyway."""
    kept: list[Message] = []
    size = 0
    for turn in reversed(turns):
        size += len(turn.content)
        if size > limit:
            break
        kept.append(turn)
    return tuple(reversed(kept))


def parse_history(messages: Iterable[Any]) -> tuple[Message, ...]:
    """Earlier turns as ``Message`` records, from dicts with ``role`` and ``content`` (None: none)."""
    if messages is None:
        return ()
    # A string or one message is iterable too, but not a list of messages.
    if not isinstance(messages, Iterable) or isinstance(messages, (str, bytes, Mapping)):
        raise UsageError(f"history must be a list of {{\"role\", \"content\"}} messages, not {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, Message):
            out.append(m)
            continue
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(
            m.get("content"), str
        ):
            raise UsageError(
                f"history message {i} must be an object with string fields \"role\" and \"content\""
            )
        if m["role"] not in ROLES:
            raise UsageError(f"history message {i} has the role \"{short_value(m['role'])}\": "
                             f"earlier turns are \"user\" or \"assistant\"")
        out.append(Message(m["role"], m["content"]))
    return tuple(out)


ROLES = frozenset({"user", "assistant"})  # the roles of earlier turns a history may hold
