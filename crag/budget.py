"""The context budget: every request's prompt plus its reply budget fits the model's window.

Theory of operation. A node renders its task into messages; ``fit`` makes the task smaller
until the prompt's tokens plus the request's ``max_tokens`` are at most 90% of
``KB_AGENT_CONTEXT_TOKENS`` (the 10% is headroom for tokenizers other than the one crag
counts with). What gives way, in this order (see ``docs/real-models.md``):

1. history, oldest turns first;
2. the text of evidence items: each is cut to the lines around its best match for the
   question (the line holding most of the question's keywords), in steps of
   ``EXCERPT_LINES``; an item that still does not fit alone (a paragraph written as one line,
   a minified file) is its best line cut to the characters around the match, in steps of
   ``EXCERPT_CHARS``; the item keeps its header with the real line numbers of the excerpt,
   and two items cut to the same lines of a file are shown once (the later one is left out);
3. the lowest-ranked items, left out of the prompt (``Fitted.dropped`` says which): the
   node decides what that means (grading: they leave ``context``; the answer: not cited).

The system prompt and the question are never cut: a question that cannot fit even with no
history and no evidence is a ``UsageError`` (exit status 2) that says so. So is one that
leaves no room for a single evidence item where the node needs one (``min_items``: grading
and the answer), rather than an answer written from no evidence.

``fit`` is pure: it takes the token counter as an argument (tiktoken in production, see
``crag.agent``), so the same state always gives the same prompt, and a node's ``apply`` can
recompute what its ``prepare`` sent.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Sequence
from typing import Any

from attrs import evolve, frozen

from .errors import UsageError
from .ports import GradeTask, PlanTask, SynthesizeTask, Task
from .state import EvidenceItem
from .text import keywords

__all__ = ["EXCERPT_CHARS", "EXCERPT_LINES", "HEADROOM", "Fitted", "excerpt", "fit", "prompt_tokens", "rough_count"]

HEADROOM = 0.10
EXCERPT_LINES = (40, 20, 10, 5, 2)  # the excerpt sizes tried, longest first
EXCERPT_CHARS = (2000, 1000, 500, 250)  # then, for an item too long alone, its best line cut to these

Counter = Callable[[str], int]
Render = Callable[[Any], Sequence[dict[str, str]]]


def rough_count(text: str) -> int:
    """A tokenizer-free estimate that errs on the high side (about 3 bytes a token)."""
    return len(text.encode("utf-8")) // 3 + 1


def prompt_tokens(messages: Sequence[dict[str, str]], count: Counter) -> int:
    """Tokens of a chat prompt: its contents plus OpenAI's framing (4 a message, 3 for the reply)."""
    return sum(count(str(m.get("content", ""))) + 4 for m in messages) + 3


@frozen
class Fitted:
    """A task that fits, what it became, and what was left out or cut on the way."""

    task: Any
    messages: tuple[dict[str, str], ...]
    prompt_tokens: int
    dropped: tuple[int, ...] = ()  # indexes (into the original items) left out of the prompt
    history_dropped: int = 0
    cut: bool = False  # item texts were cut to excerpts


def _items_field(task: Task) -> str | None:
    if isinstance(task, (GradeTask, SynthesizeTask)):
        return "items"
    if isinstance(task, PlanTask):
        return "evidence"
    return None


def excerpt(item: EvidenceItem, words: Sequence[str], lines: int, chars: int | None = None) -> EvidenceItem:
    """``item`` cut to ``lines`` lines around its best match for ``words`` (real line numbers kept);
    with ``chars``, those lines also cut to at most that many characters around the match."""
    text_lines = item.text.split("\n")
    if len(text_lines) <= lines:
        if chars is None or len(item.text) <= chars:
            return item
        return evolve(item, text=_around(item.text, words, chars))
    wanted = set(words)
    best, best_score = 0, -1
    for i, line in enumerate(text_lines):
        score = len(wanted & set(keywords(line))) if wanted else 0
        if score > best_score:
            best, best_score = i, score
    if item.anchor_line is not None and item.start_line is not None and best_score <= 0:
        best = min(max(item.anchor_line - item.start_line, 0), len(text_lines) - 1)
    lo = max(0, min(best - (lines - 1) // 2, len(text_lines) - lines))
    hi = lo + lines
    start = item.start_line + lo if item.start_line is not None else None
    end = start + lines - 1 if start is not None else item.end_line
    anchor = item.anchor_line
    if anchor is not None and start is not None and not start <= anchor <= (end or anchor):
        anchor = None
    text = "\n".join(text_lines[lo:hi])
    if chars is not None and len(text) > chars:
        text = _around(text, words, chars)
    return evolve(item, text=text, start_line=start, end_line=end, anchor_line=anchor)


def _around(text: str, words: Sequence[str], chars: int) -> str:
    """At most ``chars`` characters of ``text`` holding the most of ``words`` (the first such
    stretch, starting a little before it; the opening when none is held), cut between words
    where there are spaces."""
    wanted = set(words)
    hits = [(m.start(), collections.Counter(set(keywords(m.group())) & wanted)) for m in re.finditer(r"\S+", text)]
    hits = [(at, held) for at, held in hits if held]
    best, best_at, held, j = 0, 0, collections.Counter[str](), 0
    for at, first in hits:  # a window from each hit: the words held by the hits inside it
        while j < len(hits) and hits[j][0] < at + chars:
            held += hits[j][1]
            j += 1
        if len(held) > best:
            best, best_at = len(held), at
        held -= first
    lo = max(0, min(best_at - chars // 4, len(text) - chars))
    hi = lo + chars
    if lo > 0 and not text[lo - 1].isspace() and " " in text[lo : lo + chars // 4]:
        lo = text.index(" ", lo) + 1  # not from the middle of a word
    if hi < len(text) and not text[hi].isspace() and " " in text[hi - chars // 4 : hi]:
        hi = text.rindex(" ", lo, hi)
    return text[lo:hi].strip()


def fit(
    task: Task,
    max_tokens: int | Callable[[int], int],
    context_tokens: int,
    render: Render,
    count: Counter,
    rank: Sequence[int] | Callable[[], Sequence[int]] | None = None,
    min_items: int = 0,
) -> Fitted:
    """``task`` made small enough that its prompt + ``max_tokens`` fits 90% of ``context_tokens``.

    ``max_tokens`` is the reply budget, or a function of the number of items the prompt
    shows giving it (grading: 16 + 8 per item), so items left out take their reply room
    with them. ``rank`` lists item indexes best first (default: their order), or is a
    function giving them, called only when items must be left out; the last ones are left out
    first. Raises ``UsageError`` when even the bare question does not fit, or when the task
    has items and fewer than ``min_items`` of them fit.
    """
    room = int(context_tokens * (1.0 - HEADROOM))
    name = _items_field(task)

    def reply(t: Any) -> int:  # the reply budget of the task ``t``
        return max_tokens(len(getattr(t, name) if name else ())) if callable(max_tokens) else max_tokens

    def size(t: Any) -> tuple[tuple[dict[str, str], ...], int]:
        messages = tuple(render(t))
        return messages, prompt_tokens(messages, count)

    limit = room - reply(task)
    messages, tokens = size(task)
    if tokens <= limit:
        return Fitted(task, messages, tokens)
    history = tuple(getattr(task, "history", ()))
    history_dropped = 0
    if history:  # 1. history, oldest first: as few turns as make it fit
        task, messages, tokens, history_dropped = _without_oldest(task, "history", history, limit, size)
    if tokens <= limit:
        return Fitted(task, messages, tokens, history_dropped=history_dropped)
    attempts = tuple(getattr(task, "previous_attempts", ()))
    if attempts:  # then this question's earlier calls, oldest first (they grow with every round)
        task, messages, tokens, _ = _without_oldest(task, "previous_attempts", attempts, limit, size)
    if tokens <= limit:
        return Fitted(task, messages, tokens, history_dropped=history_dropped)
    items: tuple[EvidenceItem, ...] = tuple(getattr(task, name)) if name else ()
    cut = False
    if items:  # 2. item texts cut to the lines around their best match
        words = keywords(task.question)
        twins: tuple[int, ...] = ()
        for lines in EXCERPT_LINES:
            shorter = tuple(excerpt(i, words, lines) for i in items)
            cut = cut or shorter != items
            twins = _twins(shorter)
            task = evolve(task, **{name: tuple(x for k, x in enumerate(shorter) if k not in twins)})
            messages, tokens = size(task)
            limit = room - reply(task)
            if tokens <= limit:
                return Fitted(task, messages, tokens, dropped=twins, history_dropped=history_dropped, cut=cut)
        ranked = range(len(items)) if rank is None else rank() if callable(rank) else rank
        alive = [k for k in range(len(items)) if k not in twins]  # original index of each item left
        at = {k: n for n, k in enumerate(alive)}
        order = [at[k] for k in ranked if k in at]
        items = tuple(getattr(task, name))

        def keep(m: int) -> Any:  # the m best-ranked items, in their original order
            chosen = sorted(order[:m])
            return evolve(task, **{name: tuple(items[i] for i in chosen)})

        def fits(t: Any) -> bool:
            return size(t)[1] <= room - reply(t)

        def alone(item: EvidenceItem) -> bool:
            return fits(evolve(task, **{name: (item,)}))

        # an item too long to fit even alone (a line no excerpt of lines shortens: a paragraph
        # written as one line, a minified file) is its best line cut to the characters around the
        # match; one that fits no way goes last, whatever its rank: ranked first, it left out
        # every item after it
        fitting = {}
        for n in order:
            fitting[n] = alone(items[n])
            for chars in () if fitting[n] else EXCERPT_CHARS:
                shorter = excerpt(items[n], words, 1, chars)
                if alone(shorter):
                    items, fitting[n], cut = (*items[:n], shorter, *items[n + 1 :]), True, True
                    task = evolve(task, **{name: items})
                    break
        order = [n for n in order if fitting[n]] + [n for n in order if not fitting[n]]
        lo, hi = 0, len(items)  # 3. the largest number of best-ranked items that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(keep(mid)):
                lo = mid
            else:
                hi = mid - 1
        kept = keep(lo)
        messages, tokens = size(kept)
        limit = room - reply(kept)
        if tokens <= limit and lo < min(min_items, len(items)):
            one = keep(1)
            raise UsageError(
                f"the question leaves no room for its evidence in the model's context window: with one "
                f"evidence item the prompt needs {size(one)[1]} tokens + {reply(one)} for the reply, more "
                f"than 90% of KB_AGENT_CONTEXT_TOKENS={context_tokens}; ask a shorter question or raise "
                "KB_AGENT_CONTEXT_TOKENS to match the server"
            )
        if tokens <= limit:
            dropped = tuple(sorted([*twins, *(alive[n] for n in order[lo:])]))
            return Fitted(kept, messages, tokens, dropped=dropped, history_dropped=history_dropped, cut=cut)
    raise UsageError(
        f"the question does not fit the model's context window: its prompt needs {tokens} tokens "
        f"+ {room - limit} for the reply, more than 90% of KB_AGENT_CONTEXT_TOKENS={context_tokens}; "
        "ask a shorter question or raise KB_AGENT_CONTEXT_TOKENS to match the server"
    )


def _twins(items: Sequence[EvidenceItem]) -> tuple[int, ...]:
    """Indexes of the items that repeat an earlier item's span: two windows of one file cut to
    the same excerpt are one item, shown once."""
    seen: set[tuple[str, int | None, int | None]] = set()
    out = []
    for k, item in enumerate(items):
        if item.key in seen:
            out.append(k)
        seen.add(item.key)
    return tuple(out)


def _without_oldest(task: Any, name: str, history: tuple[Any, ...], limit: int, size: Callable[[Any], Any]) -> Any:
    """``task`` without the fewest oldest entries of ``history`` (its field ``name``: the
    conversation's turns, or the question's earlier calls) that make it fit ``limit`` (all
    of them when even that does not), with its messages, tokens and the number dropped.

    The prompt only shrinks as the oldest entries go, so the number to drop is found by
    bisection: a session of 10,000 turns costs a dozen renders, not 10,000."""
    bare = evolve(task, **{name: ()})
    messages, tokens = size(bare)
    if tokens > limit:  # no history fits: the items give way next
        return bare, messages, tokens, len(history)
    lo, hi = 1, len(history)  # dropping ``hi`` fits; dropping ``lo - 1`` does not
    best = (bare, messages, tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        shorter = evolve(task, **{name: history[mid:]})
        got = size(shorter)
        if got[1] <= limit:
            hi, best = mid, (shorter, *got)
        else:
            lo = mid + 1
    return (*best, hi)

