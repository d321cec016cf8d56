"""The JSON Schemas of the replies crag asks for, and each node's reply budget (pure data).

A node whose reply is JSON (``analyze_and_route``, ``plan``, ``grade_evidence``) puts one of
these schemas in its ``LLMRequest``; the openai adapter sends it as structured output
(``response_format`` of type ``json_schema``) when the server accepts that. The schemas
describe the same replies the prompts ask for and the parsers read (see
``docs/wire-contract.md``); the parsers stay lenient, because servers may ignore the format.

The grading schema is an object ``{"scores": [...]}`` rather than a bare array: OpenAI's
structured output needs an object at the top, and the parser accepts both shapes.

Reply budgets (``max_tokens``): a route or plan reply is a small JSON object, a grade is N
short numbers. They are deliberately tight, so a model that starts writing prose instead of
JSON stops early instead of running into the request timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ANALYZE_MAX_TOKENS",
    "PLAN_MAX_TOKENS",
    "grade_max_tokens",
    "grade_schema",
    "plan_schema",
    "route_schema",
]

ANALYZE_MAX_TOKENS = 256
PLAN_MAX_TOKENS = 512


def grade_max_tokens(n_items: int) -> int:
    """The budget of a grading reply for ``n_items`` items: 16 + 8 per item."""
    return 16 + 8 * max(0, n_items)


def _tool_names(tools: Sequence[str]) -> dict[str, Any]:
    names = list(dict.fromkeys(tools))
    return {"type": "string", "enum": names} if names else {"type": "string"}


def route_schema(tools: Sequence[str]) -> dict[str, Any]:
    """``{"complexity": ..., "suggested_tools": [...]}``."""
    return {
        "name": "route",
        "schema": {
            "type": "object",
            "properties": {
                "complexity": {"type": "string", "enum": ["chitchat", "simple", "complex"]},
                "suggested_tools": {"type": "array", "items": _tool_names(tools)},
            },
            "required": ["complexity", "suggested_tools"],
            "additionalProperties": False,
        },
    }


def plan_schema(tools: Sequence[str]) -> dict[str, Any]:
    """``{"tool_calls": [{"tool": name, "args": {...}}, ...]}`` (1 to 4 calls)."""
    return {
        "name": "plan",
        "schema": {
            "type": "object",
            "properties": {
                "tool_calls": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 4,
                    "items": {
                        "type": "object",
                        "properties": {"tool": _tool_names(tools), "args": {"type": "object"}},
                        "required": ["tool", "args"],
                    },
                }
            },
            "required": ["tool_calls"],
            "additionalProperties": False,
        },
    }


def grade_schema(n_items: int) -> dict[str, Any]:
    """``{"scores": [N numbers in [0, 1]]}``."""
    return {
        "name": "grades",
        "schema": {
            "type": "object",
            "properties": {
                "scores": {
                    "type": "array",
                    "minItems": n_items,
                    "maxItems": n_items,
                    "items": {"type": "number", "minimum": 0, "maximum": 1},
                }
            },
            "required": ["scores"],
            "additionalProperties": False,
        },
    }
