"""``grade_evidence`` replies: exactly N finite scores in [0, 1], or None."""

from __future__ import annotations

import math
from typing import Any

from .clean import strip_think
from .lenient_json import FENCE, MAX_JSON_TEXT, iter_json_values, scan_one

__all__ = ["parse_scores"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _scores(value: Any, n: int) -> tuple[float, ...] | None:
    if isinstance(value, dict):
        value = value.get("scores")
    if n == 1 and isinstance(value, (int, float)):  # the whole reply one number: one item's score
        value = [value]
    if not isinstance(value, list) or len(value) != n:
        return None
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return None
        x = float(x)
        if not math.isfinite(x) or not 0.0 <= x <= 1.0:
            return None
        out.append(x)
    return tuple(out)


def parse_scores(text: Any, n: int) -> tuple[float, ...] | None:
    """Exactly ``n`` finite scores in [0, 1] from a grader reply, or None.

    Accepts a JSON array or ``{"scores": [...]}``, in code fences or amid prose (for one item,
    also a reply that is one number and nothing else: ``0.9``, alone, in a code fence or in
    backticks); the first
    JSON value that is a valid answer wins. Booleans, strings and out-of-range numbers are
    not scores; numbers inside ``<think>`` only, and ``[1]``-style markers in prose, are
    not either (a parse failure, not a guess).
    """
    if not _is_int(n) or n < 0 or not isinstance(text, str):
        return None
    cleaned = strip_think(text[:MAX_JSON_TEXT])  # scores only thought about are no answer
    for value in iter_json_values(cleaned):
        if _is_marker(value, cleaned):
            continue
        scores = _scores(value, n)
        if scores is not None:
            return scores
    if n == 1:  # one item: the number alone in a code fence ("```\n0.9\n```") or backticks, as it is alone
        for part in [m.group(1) for m in FENCE.finditer(cleaned)] + [_in_backticks(cleaned.strip())]:
            scores = _scores(scan_one(part), 1)
            if scores is not None:
                return scores
    return None


def _in_backticks(text: str) -> str:
    """What ``text`` holds between the backticks that open and close it ("`0.9`", "```0.9```" on
    one line, which ``FENCE`` reads as a language name); "" when it is not so wrapped."""
    ticks = len(text) - len(text.lstrip("`"))
    if ticks and len(text) > 2 * ticks and text.endswith("`" * ticks):
        return text[ticks:-ticks]
    return ""


def _is_marker(value: Any, text: str) -> bool:
    """A one-integer list inside prose (``Item [1] is weak``) is a reference, not a score."""
    if not (isinstance(value, list) and len(value) == 1 and _is_int(value[0])):
        return False
    alone = {text.strip(), *(m.group(1).strip() for m in FENCE.finditer(text))}
    return not any(scan_one(part) == value for part in alone)

