"""Token probabilities in a chat completion's reply (``choices[0].logprobs``), as records.

OpenAI, vLLM and llama.cpp answer ``logprobs: true`` with ``top_logprobs: k`` by a
``content`` list: per reply token its text, its log probability and the ``k`` most likely
tokens at that position. ``read_logprobs`` turns it into ``TokenLogprob`` records, or None
when the server sent none or something else (then the reply is read from its text).
"""

from __future__ import annotations

import math
from typing import Any

from ..state import TokenLogprob

__all__ = ["read_logprobs"]


def read_logprobs(value: Any) -> tuple[TokenLogprob, ...] | None:
    """The reply's tokens with their probabilities (``choices[0].logprobs.content``), or None
    when the server sent none or sent something else."""
    content = getattr(value, "content", None) if not isinstance(value, dict) else value.get("content")
    if not isinstance(content, list) or not content:
        return None

    def get(obj: Any, name: str) -> Any:
        return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)

    def number(x: Any) -> float | None:
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x <= 0.0
        return float(x) if ok else None

    out = []
    for entry in content:
        token, logprob = get(entry, "token"), number(get(entry, "logprob"))
        if not isinstance(token, str) or logprob is None:
            return None
        top = []
        for alt in get(entry, "top_logprobs") or ():
            t, lp = get(alt, "token"), number(get(alt, "logprob"))
            if isinstance(t, str) and lp is not None:
                top.append((t, lp))
        out.append(TokenLogprob(token, logprob, tuple(top)))
    return tuple(out)
