"""``plan`` replies: validated ``ToolCall``s plus the reason for every refusal.

A JSON reply (``{"tool_calls": [...]}``, a bare array, OpenAI function-call shapes) is
checked entry by entry against each tool's record (``crag.toolspec``); any other reply
falls back to the tools its text names, with arguments built from the question. A tool's
``question_arg`` must be written in the user's question; when nothing valid remains, the
plan is the question's own search (``toolspec.question_search``: ``vector_search``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..state import RoutingPlan, ToolCall
from ..text import one_line as _one_line
from ..toolspec import MAX_TOP_K, ArgumentError, Tool, check_args, question_search
from .clean import strip_think
from .lenient_json import iter_json_values
from .route import tool_name as _tool_name

__all__ = ["MAX_CALLS", "MAX_TOP_K", "parse_plan"]

MAX_CALLS = 8  # tool calls per round; a plan asking for more keeps the first ones


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _raw_calls(text: Any) -> list[Any] | None:
    """The list of call entries in a JSON reply, or None when the reply holds none."""
    for value in iter_json_values(text):
        if isinstance(value, dict):
            for key in ("tool_calls", "calls", "plan"):
                if isinstance(value.get(key), list):
                    return value[key]
            if "tool" in value or "name" in value or isinstance(value.get("function"), dict):
                cut = _cut_list(text)
                return cut if cut and cut[0] == value else [value]
        elif isinstance(value, list) and any(
            isinstance(e, dict) and ("tool" in e or "name" in e or "function" in e) for e in value
        ):
            return value
        elif isinstance(value, list) and not value:
            return []
    return None


_LIST_KEY = re.compile(r'"(?:tool_calls|calls|plan)"\s*:\s*\[')


def _cut_list(text: Any) -> list[Any] | None:
    """The complete entries of the call list a reply breaks off in (cut by its token budget:
    ``{"tool_calls": [{...}, {...}, {"to``), or None when that list (the first one, when no key
    names it: prose before the JSON may hold a "[") closes or holds none."""
    cleaned = strip_think(text) if isinstance(text, str) else ""
    keyed = _LIST_KEY.search(cleaned)
    start = keyed.end() - 1 if keyed else cleaned.find("[")
    if start < 0:
        return None
    decoder = json.JSONDecoder()
    try:
        decoder.raw_decode(cleaned, start)
        return None  # a whole list: read as it is
    except (ValueError, RecursionError):
        pass
    entries: list[Any] = []
    pos = start + 1
    while True:
        try:
            value, pos = decoder.raw_decode(cleaned, _skip(cleaned, pos))
        except (ValueError, RecursionError):
            return entries or None
        if not isinstance(value, dict):
            return entries or None
        entries.append(value)
        pos = _skip(cleaned, pos)
        if not cleaned.startswith(",", pos):
            return entries
        pos += 1


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _entry(entry: Any) -> tuple[Any, Any]:
    """(tool name, args) of one entry; OpenAI function-call shapes are understood too."""
    if not isinstance(entry, dict):
        return None, None
    if isinstance(entry.get("function"), dict):
        entry = entry["function"]
    tool = entry.get("tool", entry.get("name"))
    args = entry.get("args", entry.get("arguments", entry.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            pass
    if args is None:
        args = {}
    return tool, args


def _mentioned_tools(text: Any, tools: Sequence[Tool]) -> list[str]:
    """Names of ``tools`` that free text mentions (``jira fetch``, ``grep-search``), in order."""
    if not isinstance(text, str) or not tools:
        return []
    names = sorted((t.name for t in tools), key=len, reverse=True)
    alternatives = "|".join(re.escape(n).replace("_", "[_ -]") for n in names)
    mention = re.compile(rf"(?<![A-Za-z0-9])({alternatives})(?![A-Za-z0-9])", re.I)
    found: list[str] = []
    for match in mention.finditer(strip_think(text)):
        name = re.sub(r"[ -]", "_", match.group(1).lower())
        if name not in found:
            found.append(name)
    return found


def parse_plan(
    text: Any,
    question: str,
    routing_plan: RoutingPlan,
    tools: Sequence[Tool],
    top_k: int,
    searched: str | None = None,
) -> tuple[tuple[ToolCall, ...], tuple[str, ...]]:
    """The valid tool calls of a plan reply, and a reason for every entry refused.

    A JSON reply (``{"tool_calls": [...]}`` or a bare array) is validated entry by entry
    against the tools' own records (``crag.toolspec.check_args``, planned mode). Any other
    reply falls back to the tools its text names, with arguments built from the question
    (``Tool.from_question``). Either way a tool outside ``routing_plan.suggested_tools`` or
    ``tools`` is refused, a ``question_arg`` must be written in the question, and when no
    call survives the plan is the question's own search (``toolspec.question_search``).
    ``searched`` is what that search looks for (``searches.searched_question``: a follow-up
    such as "why?" with the question it follows), default ``question``; the text fallback's
    search for the question looks for it too.
    """
    searched = question if searched is None else searched
    by_name = {t.name: t for t in tools}
    suggested = tuple(routing_plan.suggested_tools)
    top_k = min(max(top_k, 1), MAX_TOP_K) if _is_int(top_k) else 5
    reasons: list[str] = []
    calls: list[ToolCall] = []
    seen: set[str] = set()

    def admit(tool: Any, args: Any) -> None:
        if not isinstance(tool, str) or not tool.strip():
            reasons.append(f"plan entry has no tool name: {_one_line(repr(tool))[:80]}")
            return
        name = _tool_name(tool) or tool
        record = by_name.get(name)
        if record is None:
            reasons.append(f"{_one_line(name)[:80]} is not an available tool")
            return
        if name not in suggested:
            reasons.append(f"{name} is not among the routing plan's suggested tools")
            return
        if args is None:
            args = _question_args(record, searched if record.searches_question else question)
            if args is None:
                reasons.append(f"{name}: no arguments can be built from the question")
                return
        try:
            checked = check_args(record, args, planned=True, question=question, top_k=top_k)
        except ArgumentError as exc:
            reasons.append(str(exc))
            return
        signature = name + json.dumps(checked, sort_keys=True, ensure_ascii=False)
        if signature in seen:
            return
        if len(calls) >= MAX_CALLS:
            reasons.append(f"{name}: more than {MAX_CALLS} calls in one round")
            return
        seen.add(signature)
        calls.append(ToolCall(name, checked))

    entries = _raw_calls(text)
    if entries is not None:
        for entry in entries:
            admit(*_entry(entry))
    else:
        for name in _mentioned_tools(text, tools):
            admit(name, None)

    fallback = None if calls else question_search(tools, searched.strip() or searched, top_k)
    if fallback is not None:
        reasons.append(f"no valid tool call in the plan; searching for the question with {fallback.tool}")
        calls.append(fallback)
    return tuple(calls), tuple(reasons)


def _question_args(tool: Tool, question: str) -> Mapping[str, Any] | None:
    """Arguments from the question alone (a plan reply that only names ``tool``)."""
    if tool.from_question is not None:
        return tool.from_question(question)
    if tool.question_arg is not None:
        return {}  # filled in from the question by check_args
    return None
