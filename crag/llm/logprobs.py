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
when the server sent none or something else (then the reply is read from its text; an odd
entry among good ones is read as well as it can be, not taken for "none");
``covering`` keeps the tokens of a reply's first characters, those the reply is read up to.
"""

from __future__ import annotations

import math
from typing import Any

from ..state import TokenLogprob

__all__ = ["LOGPROBS", "covering", "logprob_params", "read_logprobs", "refuses_logprobs"]

LOGPROBS = "logprobs"  # the request parameter, and its name among the parameters a server refused
TOP_LOGPROBS_MAX = 20  # OpenAI's limit on top_logprobs
# A logprob this far above 0 is 0 that a float rounding moved (servers send 1e-7); more is no logprob.
ROUNDING = 1e-4


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
    when the server sent none or sent something else.

    One odd entry does not make the whole list "none" (that would also stop the grader asking
    for them for the rest of the process): a logprob a float rounding put just above 0 is 0, a
    ``null`` one is -inf (nlohmann-json, llama.cpp's, writes -inf and NaN as null), an
    unreadable one is -inf too (no probability is read from it), and a token sent as ``bytes``
    alone is those bytes decoded. An alternative without a usable logprob is left out."""
    content = _get(value, "content")
    if not isinstance(content, list) or not any(_is_record(entry) for entry in content):
        return None
    out = []
    for entry in content:
        logprob = _logprob(_get(entry, "logprob"))
        top = []
        alternatives = _get(entry, "top_logprobs")
        for alt in alternatives if isinstance(alternatives, (list, tuple)) else ():  # "top_logprobs": 5 is none
            t, lp = _token(alt), _logprob(_get(alt, "logprob"))
            if t and lp is not None:
                top.append((t, lp))
        out.append(TokenLogprob(_token(entry), -math.inf if logprob is None else logprob, tuple(top)))
    return tuple(out)


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _is_record(entry: Any) -> bool:
    """A token entry: a dict or a parsed object with a token's fields, not a stray value."""
    return any(_get(entry, name) is not None for name in ("token", "logprob", "bytes"))


def _logprob(x: Any) -> float | None:
    """A log probability in [-inf, 0]: ``null`` is -inf; up to ``ROUNDING`` above 0 is 0;
    anything else (a string, NaN, a positive number) is None."""
    if x is None:
        return -math.inf
    if not isinstance(x, (int, float)) or isinstance(x, bool) or math.isnan(x) or x > ROUNDING:
        return None
    return min(float(x), 0.0)


def _token(entry: Any) -> str:
    """A token's text: ``token``, or its ``bytes`` decoded when the text is missing or empty."""
    token = _get(entry, "token")
    if isinstance(token, str) and token:
        return token
    raw = _get(entry, "bytes")
    if isinstance(raw, list) and raw and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        return bytes(raw).decode("utf-8", errors="replace")
    return token if isinstance(token, str) else ""


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
