"""``grade_evidence`` replies read into one score per item, from the text or the token probabilities.

Two reply shapes are read, whatever style asked (``crag.grading.GRADERS``):

* a label per item, one per line: ``1: yes`` / ``2: no`` (the ``batch`` prompt asks for
  this; a ``pointwise`` request asks for one bare ``yes`` or ``no``). Read from the text, a
  label is 1.0 or 0.0. Where the reply carries token probabilities (``Completion.logprobs``),
  an item's score is the model's probability of ``yes`` against ``no`` at the label's token:
  the expected grade, not the one sampled, so that "yes, barely" and "yes, surely" differ.
  That token is the one at the label's place in the text read, the tokens lined up with it;
  tokens that spell something else give none (``Reading.unaligned``: the text's labels);
* the seed's JSON array of N numbers (or ``{"scores": [...]}``), read by ``parse_scores``.

A reply that gives neither exactly N labels (one per item, numbered 1..N) nor N numbers is no
reading (None): the node's parse-failure fallback applies. ``Reading.tosses`` counts the items
whose probabilities were a coin toss (``yes`` and ``no`` both near even), for
``crag.grading.uninformative``.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from attrs import frozen

from ..state import Completion, TokenLogprob
from .clean import strip_think
from .scores import parse_scores

__all__ = ["LABELS", "TOSS_MARGIN", "Reading", "read_grades", "read_replies"]

# Label words and the score each stands for, lower-cased, without surrounding space or punctuation.
LABELS = {"yes": 1.0, "no": 0.0}
# An item whose P(yes) is within this of 0.5 was a coin toss.
TOSS_MARGIN = 0.15
# A label the model gave with at least this probability was a sure one.
SURE = 0.9

# "1: yes", "[2] no", "3. Yes", "4 - no", "Passage 5: yes", "**6**: no" (the number, then the label)
_LINE = re.compile(r"^[ \t>*-]*(?:passage|item)?\s*\[?(\d{1,4})\]?\**\s*[:.)\-=]?\s*\**\s*([A-Za-z]+)", re.I | re.M)


@frozen
class Reading:
    """The scores read from one grading reply, and how: ``from_logprobs`` when every score
    came from token probabilities; ``tosses`` items whose probabilities were a coin toss;
    ``labels`` the label words of the reply's text, one per item (none for a JSON reply);
    ``sure`` items whose written label had a probability of at least ``SURE``; ``unaligned``
    when the reply's token probabilities did not line up with its text, so the labels were
    read from the text (audited ``logprobs_unaligned``)."""

    scores: tuple[float, ...]
    from_logprobs: bool = False
    tosses: int = 0
    labels: tuple[str, ...] = ()
    sure: int = 0
    unaligned: bool = False


_MARKS = ".,;:!*\"'`()[]"  # what may wrap a label word: "Yes.", "**no**", "(yes)"


def _word(token: str) -> str:
    return token.strip().strip(_MARKS).lower()


def p_label(choice: TokenLogprob) -> float | None:
    """The expected label score at one token, from its alternatives (``top``): sum of P(label)
    x score over the distinct label tokens among them, renormalised; None when no label word is among
    them. A token sent without alternatives (llama.cpp on some tokens; a server that honours
    ``logprobs`` but not ``top_logprobs``) is read from its own probability
    (``own_label``), not as a sure one. A label word missing from the alternatives of its own
    token counts with that token's probability; when that is unknown too (a ``null`` or
    unreadable logprob), the other label's alone would read as a sure grade against the label
    written: None."""
    if not any(token != choice.token for token, _ in choice.top):
        return own_label(choice)
    weights: dict[str, float] = {}
    for token, logprob in dict(reversed(choice.top)).items():  # each token once (vLLM repeats some)
        word = _word(token)
        if word in LABELS:
            weights[word] = weights.get(word, 0.0) + math.exp(logprob)
    written = _word(choice.token)
    if written in LABELS and not weights.get(written):  # not among its alternatives, or at -inf there
        weights[written] = math.exp(choice.logprob)
    total = sum(weights.values())
    if total <= 0.0 or weights.get(written) == 0.0:  # nothing to read, or nothing for the label written
        return None
    return sum(LABELS[w] * p for w, p in weights.items()) / total


def own_label(choice: TokenLogprob) -> float | None:
    """The expected score at a label token with no alternatives: its label has P = exp(logprob),
    the other label the rest (the only other answer the prompt allows); None when the token is
    no label or its probability is unknown (-inf: the sampled token had some)."""
    word = _word(choice.token)
    if word not in LABELS or not math.isfinite(choice.logprob):
        return None
    p = math.exp(choice.logprob)
    return p * LABELS[word] + (1.0 - p) * (1.0 - LABELS[word])


def _from_logprobs(tokens: Sequence[TokenLogprob], text: str, at: dict[int, int]) -> dict[int, float] | None:
    """Item number -> expected score, read at the token that is the item's label in ``text``
    (``at``: where each label word begins in it); None when the tokens do not line up with the
    text. A server with a reasoning parser sends the answer as the text but every generated
    token, its thinking first, as logprobs: the text is found at the end of the tokens, and a
    label is read only at its own position there, never at a label-shaped token elsewhere (the
    thinking's ``Passage 1: yes``, or a separator listing ``yes`` as an alternative)."""
    # Compared on their ASCII characters alone: a character outside ASCII may come as several
    # tokens each holding a part of its bytes ("\ufffd", "bytes:\xc3"), which no text holds;
    # the labels and their numbers are ASCII.
    pieces = ["" if _PARTIAL_BYTES.fullmatch(t.token) else _ascii(t.token) for t in tokens]
    stream = "".join(pieces)
    lead = len(text) - len(text.lstrip())
    core = _ascii(text.strip())
    found = stream.rfind(core)
    if found < 0 and stream.strip() and core.startswith(stream.strip()):  # tokens for the text's start only
        found = stream.find(stream.strip())
    if not core or found < 0:
        return None
    starts = list(accumulate((len(p) for p in pieces), initial=0))
    probs: dict[int, float] = {}
    for k, pos in at.items():
        where = found + len(_ascii(text[lead:pos]))  # the label's first character among the tokens'
        i = bisect_right(starts, where) - 1  # the token holding it
        if 0 <= i < len(tokens) and _word(tokens[i].token) in LABELS:
            p = p_label(tokens[i])
            if p is not None:
                probs[k] = p
    return probs


# A token that spells part of a character's bytes (``bytes:\xc3``): no text holds it. Only a
# whole token is one; a reply that writes an escape (``\x1b``) keeps it, in its text and tokens.
_PARTIAL_BYTES = re.compile(r"(?:bytes:)?(?:\\x[0-9a-fA-F]{2})+")


def _ascii(text: str) -> str:
    """``text``'s ASCII characters."""
    return text.encode("ascii", "ignore").decode("ascii")


def _from_text(text: str, n: int) -> dict[int, tuple[float, int]]:
    """Item number -> (label score, where its label word begins in ``text``); empty when the
    labels are not one per item: a label for a number outside 1..n, or two different labels
    for one item (not exactly N grades). An item labelled twice alike is read at its first."""
    found: dict[int, tuple[float, int]] = {}
    if n == 1:
        first = re.search(r"\S+", text)
        word = _word(first.group()) if first else ""
        if first and word in LABELS:
            found[1] = (LABELS[word], first.end() - len(first.group().lstrip(_MARKS)))
    for m in _LINE.finditer(text):
        k, word = int(m.group(1)), m.group(2).lower()
        if word not in LABELS:
            continue
        if not 1 <= k <= n or found.get(k, (LABELS[word],))[0] != LABELS[word]:
            return {}
        found.setdefault(k, (LABELS[word], m.start(2)))
    return found


def read_grades(text: Any, n: int, logprobs: Sequence[TokenLogprob] | None = None) -> Reading | None:
    """Exactly ``n`` scores in [0, 1] from a grading reply, or None (see the module doc)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1 or not isinstance(text, str):
        return None
    numbers = parse_scores(text, n)
    if numbers is not None:
        return Reading(numbers)
    cleaned = strip_think(text)
    found = _from_text(cleaned, n)
    if any(k not in found for k in range(1, n + 1)):
        return None
    labels = {k: score for k, (score, _) in found.items()}
    at = {k: pos for k, (_, pos) in found.items()}
    read = _from_logprobs(logprobs, cleaned, at) if logprobs else {}  # the tokens after any thinking
    probs = read or {}
    scores = []
    tosses = sure = 0
    for k in range(1, n + 1):
        p = probs.get(k)
        if p is None:
            scores.append(labels[k])
            continue
        p = min(1.0, max(0.0, p))
        tosses += abs(p - 0.5) < TOSS_MARGIN
        sure += max(p, 1.0 - p) >= SURE
        scores.append(round(p, 4))
    words = tuple("yes" if labels[k] == LABELS["yes"] else "no" for k in range(1, n + 1))
    return Reading(tuple(scores), from_logprobs=len(probs) >= n and all(k in probs for k in range(1, n + 1)),
                   tosses=tosses, labels=words, sure=sure, unaligned=read is None)


def read_replies(reply: Completion | tuple[Completion, ...] | None, n: int) -> Reading | None:
    """The reading of a grading reply: one completion for all ``n`` items, or one completion per
    item (a pointwise grading); None when there is none or it gives no ``n`` scores.

    A pointwise reading carries no ``labels`` on purpose, so ``same_label`` never calls it
    uninformative: that rule catches a label copied down a batch's list, and separate requests
    have none to copy; their one label for every item is N verdicts (docs/real-models.md: every
    item ``yes`` at P 0.72-0.93, yet the best ranking measured, AUC 0.74)."""
    if reply is None or n < 1:
        return None
    if isinstance(reply, tuple):
        readings = [read_grades(r.text, 1, r.logprobs) for r in reply]
        if len(readings) != n or any(r is None for r in readings):
            return None
        return Reading(
            tuple(r.scores[0] for r in readings if r is not None),
            from_logprobs=all(r is not None and r.from_logprobs for r in readings),
            tosses=sum(r.tosses for r in readings if r is not None),
            unaligned=any(r is not None and r.unaligned for r in readings),
        )
    return read_grades(reply.text, n, reply.logprobs)
