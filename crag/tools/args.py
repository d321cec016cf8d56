"""Validation of tool arguments: each tool declares its arguments, bad ones are a ToolError.

A model may send ``"5"`` for a number or omit optional arguments; values are coerced only
where that is unambiguous (digit strings to integers, ``"true"``/``"false"`` to booleans),
unknown argument names and wrong types are refused with a message naming the argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ToolError

__all__ = ["check_known", "opt_bool", "opt_int", "opt_str", "req_str"]


def check_known(tool: str, args: Mapping[str, Any], known: tuple[str, ...]) -> None:
    if not isinstance(args, Mapping):
        raise ToolError(tool, "arguments must be an object")
    unknown = sorted(str(k) for k in args if k not in known)
    if unknown:
        raise ToolError(tool, f"unknown argument(s) {', '.join(unknown)}; accepted: {', '.join(known)}")


def req_str(tool: str, args: Mapping[str, Any], name: str, max_len: int = 2000) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(tool, f"argument {name!r} must be a non-empty string")
    if len(value) > max_len:
        raise ToolError(tool, f"argument {name!r} is longer than {max_len} characters")
    if "\x00" in value:
        raise ToolError(tool, f"argument {name!r} contains a NUL character")
    return value.strip()


def opt_str(tool: str, args: Mapping[str, Any], name: str, max_len: int = 500) -> str | None:
    value = args.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return req_str(tool, args, name, max_len)


def opt_int(tool: str, args: Mapping[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        raise ToolError(tool, f"argument {name!r} must be an integer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        raise ToolError(tool, f"argument {name!r} must be an integer")
    if not lo <= value <= hi:
        raise ToolError(tool, f"argument {name!r} must be between {lo} and {hi}, got {value}")
    return value


def opt_bool(tool: str, args: Mapping[str, Any], name: str, default: bool) -> bool:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ToolError(tool, f"argument {name!r} must be true or false")
