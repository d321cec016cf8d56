"""``plan`` replies: validated ``ToolCall``s plus the reason for every refusal.

A JSON reply (``{"tool_calls": [...]}``, a bare array, OpenAI function-call shapes) is
validated entry by entry; any other reply falls back to the tools its text names, with
arguments built from the question. Remote tools only run with an argument the user's
question contains; when nothing valid remains, the plan is one ``vector_search`` for the
question.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..state import RoutingPlan, ToolCall
from ..text import one_line as _one_line
from .clean import strip_think
from .find import find_confluence_page_ids, find_identifiers, find_jira_keys, find_paths, find_urls
from .lenient_json import iter_json_values
from .route import tool_name as _tool_name

__all__ = ["ALL_TOOLS", "MAX_CALLS", "MAX_TOP_K", "REMOTE_TOOLS", "parse_plan"]

REMOTE_TOOLS = ("jira_fetch", "confluence_fetch", "web_fetch")
ALL_TOOLS = ("vector_search", "grep_search", "read_file", *REMOTE_TOOLS)
MAX_CALLS = 8  # tool calls per round; a plan asking for more keeps the first ones
MAX_TOP_K = 50


class _Reject(Exception):
    """One plan entry that cannot run; the message is the reason."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need_str(tool: str, args: Mapping[str, Any], name: str, required: bool = True) -> str | None:
    value = args.get(name)
    if value is None:
        if required:
            raise _Reject(f"{tool}: argument {name!r} is missing")
        return None
    if not isinstance(value, str):
        raise _Reject(f"{tool}: argument {name!r} must be a string, got {type(value).__name__}")
    value = value.strip()
    if not value:
        if required:
            raise _Reject(f"{tool}: argument {name!r} is empty")
        return None
    if "\x00" in value and name in ("path", "glob"):  # no file name can hold one
        raise _Reject(f"{tool}: argument {name!r} contains a NUL character")
    return value


def _need_line(tool: str, args: Mapping[str, Any], name: str) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise _Reject(f"{tool}: argument {name!r} must be a positive integer, got {value!r}")
    return value


def _validate_args(tool: str, args: Mapping[str, Any], question: str, top_k: int) -> dict[str, Any]:
    """Normalised arguments for ``tool``; raises ``_Reject`` with the reason."""
    if tool == "vector_search":
        query = _need_str(tool, args, "query")
        k = args.get("top_k", top_k)
        if k is None:
            k = top_k
        if not _is_int(k):
            raise _Reject(f"vector_search: top_k must be an integer, got {k!r}")
        return {"query": query, "top_k": min(max(k, top_k), MAX_TOP_K)}  # never fewer than the default
    if tool == "grep_search":
        pattern = _need_str(tool, args, "pattern")
        out: dict[str, Any] = {"pattern": pattern}
        glob = _need_str(tool, args, "glob", required=False)
        if glob is not None:
            out["glob"] = glob
        regex = args.get("regex", False)
        if regex is None:
            regex = False
        if not isinstance(regex, bool):
            raise _Reject(f"grep_search: regex must be true or false, got {regex!r}")
        if regex:
            try:
                re.compile(pattern)
            except (re.error, RecursionError, OverflowError) as exc:
                raise _Reject(f"grep_search: invalid regular expression {pattern!r} ({exc})") from None
        out["regex"] = regex
        return out
    if tool == "read_file":
        path = _need_str(tool, args, "path")
        start, end = _need_line(tool, args, "start_line"), _need_line(tool, args, "end_line")
        if start is not None and end is not None and end < start:
            raise _Reject(f"read_file: end_line {end} is before start_line {start}")
        out = {"path": path}
        if start is not None:
            out["start_line"] = start
        if end is not None:
            out["end_line"] = end
        return out
    if tool == "jira_fetch":
        keys = find_jira_keys(question)
        if not keys:
            raise _Reject("jira_fetch needs a Jira key (like ABC-123) in the question")
        key = _need_str(tool, args, "key", required=False)
        if key is None:
            return {"key": keys[0]}
        key = key.upper()
        if key not in keys:
            raise _Reject(f"jira_fetch: key {key!r} is not in the question")
        return {"key": key}
    if tool == "confluence_fetch":
        ids = find_confluence_page_ids(question)
        if not ids:
            raise _Reject("confluence_fetch needs a Confluence page id or page URL in the question")
        raw = args.get("page_id")
        if raw is None:
            return {"page_id": ids[0]}
        if _is_int(raw):
            raw = str(raw)
        if not isinstance(raw, str):
            raise _Reject(f"confluence_fetch: page_id must be a string of digits, got {raw!r}")
        given = find_confluence_page_ids(raw) if not raw.strip().isdigit() else (raw.strip().lstrip("0") or "0",)
        if not given or given[0] not in ids:
            raise _Reject(f"confluence_fetch: page id {raw!r} is not in the question")
        return {"page_id": given[0]}
    if tool == "web_fetch":
        urls = find_urls(question)
        if not urls:
            raise _Reject("web_fetch needs an http(s) URL in the question")
        url = _need_str(tool, args, "url", required=False)
        if url is None:
            return {"url": urls[0]}
        for candidate in urls:
            if url == candidate or url.rstrip("/") == candidate.rstrip("/"):
                return {"url": candidate}
        raise _Reject(f"web_fetch: URL {url!r} is not in the question")
    # A tool of the deployment that crag has no schema for: JSON-ready arguments as given.
    try:
        clean = json.loads(json.dumps(dict(args)))
    except (TypeError, ValueError):
        raise _Reject(f"{tool}: arguments are not plain JSON") from None
    return clean


def _question_args(tool: str, question: str, top_k: int) -> dict[str, Any]:
    """Arguments built from the question alone (the text fallback)."""
    if tool == "vector_search":
        return {"query": question.strip(), "top_k": top_k}
    if tool == "grep_search":
        identifiers = find_identifiers(question)
        if not identifiers:
            raise _Reject("grep_search: the question has no identifier or phrase to search for")
        return {"pattern": identifiers[0]}
    if tool == "read_file":
        paths = find_paths(question)
        if not paths:
            raise _Reject("read_file: the question names no file")
        return {"path": paths[0]}
    if tool in REMOTE_TOOLS:
        return {}  # filled in from the question by _validate_args
    raise _Reject(f"{tool}: no arguments can be built from the question")


def _raw_calls(text: Any) -> list[Any] | None:
    """The list of call entries in a JSON reply, or None when the reply holds none."""
    for value in iter_json_values(text):
        if isinstance(value, dict):
            for key in ("tool_calls", "calls", "plan"):
                if isinstance(value.get(key), list):
                    return value[key]
            if "tool" in value or "name" in value:
                return [value]
        elif isinstance(value, list) and any(
            isinstance(e, dict) and ("tool" in e or "name" in e or "function" in e) for e in value
        ):
            return value
        elif isinstance(value, list) and not value:
            return []
    return None


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


_TOOL_MENTION = re.compile(r"(?<![A-Za-z0-9])([a-z]+)[_ -](search|file|fetch)(?![A-Za-z0-9])", re.I)


def _mentioned_tools(text: str, known: Sequence[str]) -> list[str]:
    names: list[str] = []
    if not isinstance(text, str):
        return names
    for match in _TOOL_MENTION.finditer(strip_think(text)):
        name = f"{match.group(1)}_{match.group(2)}".lower()
        if name in known and name not in names:
            names.append(name)
    return names


def parse_plan(
    text: Any,
    question: str,
    routing_plan: RoutingPlan,
    available_tools: Sequence[str],
    top_k: int,
) -> tuple[tuple[ToolCall, ...], tuple[str, ...]]:
    """The valid tool calls of a plan reply, and a reason for every entry refused.

    A JSON reply (``{"tool_calls": [...]}`` or a bare array) is validated entry by entry.
    Any other reply falls back to the tools its text names, with arguments built from the
    question. Either way a tool outside ``routing_plan.suggested_tools`` or
    ``available_tools`` is refused, remote tools need their argument in the question, and
    when no call survives the plan is one ``vector_search`` for the question.
    """
    available = tuple(available_tools)
    suggested = tuple(routing_plan.suggested_tools)
    top_k = min(max(top_k, 1), MAX_TOP_K) if _is_int(top_k) else 5
    reasons: list[str] = []
    calls: list[ToolCall] = []
    seen: set[str] = set()

    def admit(tool: Any, build: Any) -> None:
        if not isinstance(tool, str) or not tool.strip():
            reasons.append(f"plan entry has no tool name: {_one_line(repr(tool))[:80]}")
            return
        name = _tool_name(tool) or tool
        if name not in available:
            reasons.append(f"{_one_line(name)[:80]} is not an available tool")
            return
        if name not in suggested:
            reasons.append(f"{name} is not among the routing plan's suggested tools")
            return
        try:
            args = build(name)
        except _Reject as exc:
            reasons.append(str(exc))
            return
        signature = name + json.dumps(args, sort_keys=True, ensure_ascii=False)
        if signature in seen:
            return
        if len(calls) >= MAX_CALLS:
            reasons.append(f"{name}: more than {MAX_CALLS} calls in one round")
            return
        seen.add(signature)
        calls.append(ToolCall(name, args))

    entries = _raw_calls(text)
    if entries is not None:
        for entry in entries:
            tool, args = _entry(entry)
            if not isinstance(args, dict):
                admit(tool, lambda name, args=args: _bad_args(name, args))
                continue
            admit(tool, lambda name, args=args: _validate_args(name, args, question, top_k))
    else:
        known = tuple(dict.fromkeys((*ALL_TOOLS, *available)))
        for name in _mentioned_tools(text, known):
            admit(name, lambda n: _validate_args(n, _question_args(n, question, top_k), question, top_k))

    if not calls:
        fallback = ToolCall("vector_search", {"query": question.strip() or question, "top_k": top_k})
        reasons.append("no valid tool call in the plan; searching for the question with vector_search")
        calls.append(fallback)
    return tuple(calls), tuple(reasons)


def _bad_args(tool: str, args: Any) -> dict[str, Any]:
    raise _Reject(f"{tool}: args must be a JSON object, got {type(args).__name__}")
