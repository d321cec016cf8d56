"""Token probabilities: asking for them, and reading them from a reply, as records.

A request with ``LLMRequest.logprobs`` > 0 (the grader's) sends ``logprobs: true`` and
``top_logprobs`` (``logprob_params``). A server that refuses them (400 or 422 naming
``logprobs``: ``refuses_logprobs``) is asked again without them, and one that answers
without them is taken at its word; either is remembered for the server and model for the
rest of the process (``crag.llm.openai_chat``), so later requests do not ask again. Neither
counts as a retry.

OpenAI, vLLM and llama.cpp answer ``logprobs: true`` with ``top_logprobs: k`` by a
``content`` list: per reply token its text, its log probability and the ``k`` most likely
tokens at that position. ``read_logprobs`` turns it into ``TokenLogprob`` records, or None
when the server sent none or something else (then the reply is read from its text);
``covering`` keeps the tokens of a reply's first characters, those the reply is read up to.
"""

from __future__ import annotations

import math
from typing import Any

from ..state import TokenLogprob

__all__ = ["LOGPROBS", "covering", "logprob_params", "read_logprobs", "refuses_logprobs"]

LOGPROBS = "logprobs"  # the request parameter, and its name among the parameters a server refused
TOP_LOGPROBS_MAX = 20  # OpenAI's limit on top_logprobs


def logprob_params(wanted: int, refused: frozenset[str]) -> dict[str, Any]:
    """The request parameters that ask for ``wanted`` alternatives per token (none when 0 or
    when the server refused or ignored them)."""
    if wanted <= 0 or LOGPROBS in refused:
        return {}
    return {LOGPROBS: True, "top_logprobs": min(int(wanted), TOP_LOGPROBS_MAX)}


def refuses_logprobs(params: Any, named: Any, message: str) -> bool:
    """A refused request that asked for logprobs names them (its ``param`` or its message)."""
    return LOGPROBS in params and (named in (LOGPROBS, "top_logprobs") or LOGPROBS in message.lower())


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


def covering(tokens: tuple[TokenLogprob, ...], chars: int) -> tuple[TokenLogprob, ...]:
    """The tokens that begin within the first ``chars`` characters of the reply, and at most
    ``chars`` of them: a server that ignores ``max_tokens`` is read no further in its token
    probabilities than in its text (``crag.llm.openai_chat`` cuts that at its budget)."""
    size = 0
    for i, token in enumerate(tokens):
        if size >= chars or i >= chars:
            return tokens[:i]
        size += len(token.token)
    return tokens
