"""Lenient JSON reading: every JSON value a model's reply holds, most likely first.

Replies wrap JSON in ``<think>`` blocks, code fences, prose and trailing commas; the
readers here find the values anyway and never raise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from .clean import strip_think

__all__ = ["FENCE", "MAX_JSON_TEXT", "extract_json", "iter_json_values", "scan_one"]

FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+.-]*[^\n`]*\n?(.*?)(?:```|\Z)", re.S)
_JSON_START = re.compile(r"[\[{]")
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_MAX_DECODE_TRIES = 300
MAX_JSON_TEXT = 200_000


def _scan(text: str) -> Iterator[Any]:
    """Every top-level JSON object or array in ``text``, left to right."""
    decoder = json.JSONDecoder()
    pos, tries = 0, 0
    while tries < _MAX_DECODE_TRIES:
        match = _JSON_START.search(text, pos)
        if match is None:
            return
        try:
            value, end = decoder.raw_decode(text, match.start())
        except (ValueError, RecursionError):
            tries += 1
            pos = match.start() + 1
            continue
        yield value
        pos = end


def iter_json_values(text: Any) -> Iterator[Any]:
    """JSON values found in a reply, most likely first; never raises.

    Order: code-fenced blocks, then objects and arrays in the text without ``<think>``
    blocks, then the whole text as one scalar, then (when nothing else was found) the raw
    text including thinking. Each source is also tried with trailing commas removed.
    """
    if not isinstance(text, str):
        return
    text = text[:MAX_JSON_TEXT]
    found = False
    cleaned = strip_think(text)
    sources: list[str] = [m.group(1) for m in FENCE.finditer(cleaned)]
    sources.append(cleaned)
    for source in sources:
        for variant in dict.fromkeys((source, _TRAILING_COMMA.sub(r"\1", source))):
            for value in _scan(variant):
                found = True
                yield value
    stripped = cleaned.strip()
    if stripped and stripped[0] not in "[{":
        try:
            value = json.loads(stripped)
        except (ValueError, RecursionError):
            pass
        else:
            found = True
            yield value
    if not found and cleaned != text:
        yield from _scan(text)


def extract_json(text: Any) -> Any | None:
    """The first JSON value found in ``text`` (see ``iter_json_values``), or None."""
    for value in iter_json_values(text):
        return value
    return None


def scan_one(text: str) -> Any:
    """``text`` as one JSON value, or None."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
