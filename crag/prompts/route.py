"""``analyze_and_route`` replies: a ``RoutingPlan``, or None when the classification is unusable."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..state import Complexity, RoutingPlan
from .clean import strip_think
from .lenient_json import iter_json_values

__all__ = ["parse_route", "tool_name"]

_COMPLEXITIES = {c.value: c for c in Complexity}


def tool_name(value: Any) -> str | None:
    """A tool name as a model may write it (`` `Vector-Search()` ``), normalised; None if empty."""
    if not isinstance(value, str):
        return None
    name = value.strip().strip("`'\"").lower()
    name = re.sub(r"\(\)$", "", name)
    name = re.sub(r"[\s-]+", "_", name)
    return name or None


def parse_route(text: Any, available_tools: Sequence[str], default_tools: Sequence[str] = ()) -> RoutingPlan | None:
    """The routing plan in a reply, or None when it has no usable ``complexity``.

    Unknown or unavailable tools are dropped; when none remain, the ``default_tools`` that
    are available are suggested (the node's: the tools that search, ``toolspec.search_tools``).
    A route written only inside ``<think>`` (a reasoning model cut off by the routing budget)
    is a draft, not an answer: the classification is unavailable, which is ``complex`` (SPEC §1),
    never a guessed ``chitchat`` that would skip retrieval.
    """
    available = tuple(available_tools)
    if not isinstance(text, str):
        return None
    for value in iter_json_values(strip_think(text)):
        if not isinstance(value, dict) or "complexity" not in value:
            continue
        raw = value.get("complexity")
        if not isinstance(raw, str):
            return None
        key = re.sub(r"[^a-z]", "", raw.lower())
        complexity = _COMPLEXITIES.get(key)
        if complexity is None:
            return None
        suggested = value.get("suggested_tools", value.get("tools", []))
        if isinstance(suggested, str):
            suggested = [suggested]
        tools: list[str] = []
        if isinstance(suggested, list):
            for entry in suggested:
                name = tool_name(entry)
                if name in available and name not in tools:
                    tools.append(name)
        if not tools:
            tools = [t for t in default_tools if t in available]
        return RoutingPlan(complexity, tuple(tools))
    return None
