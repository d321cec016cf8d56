"""What a run reports while it goes: typed records for ``ask(..., on_event=...)``. Pure.

    NodeStarted(node)      before a node runs (``node`` is its name, e.g. ``"plan"``)
    NodeFinished(node)     after it
    AnswerStarted(items, question, verdict_may_rewrite)
                           streaming only: the answer's chat completion starts; ``items``
                           are the evidence items it may cite, numbered from 1;
                           ``verdict_may_rewrite``: grounding's verdict may still replace
                           the answer's opening (``grounding.verdict`` ``not_answered``:
                           no informative grade approved the evidence, or the question
                           names a term no item holds); it
                           comes again, before any delta, when a server refused the
                           request as too long and crag fitted it to a smaller window;
                           ``chitchat``: the answer has no evidence and cites nothing (its
                           markers are removed from the finished text)
    AnswerDelta(text)      streaming only: the next piece of the answer as it arrives
    RetryWaiting(node, server, reason, seconds, left, retry, retries, status)
                           a request failed in a way crag retries (429, 5xx, a timeout, a
                           dropped connection) and crag waits before retry ``retry`` of
                           ``retries`` (``KB_AGENT_LLM_MAX_RETRIES``): ``server`` is ``"LLM"``
                           or ``"embeddings"`` (a search's query), ``reason`` says why
                           (``"429 rate limited"``, ``"503 service unavailable"``,
                           ``"timed out"``), ``status`` the HTTP status or None, ``seconds``
                           the whole wait; it comes when the wait starts (``left ==
                           seconds``), about once a second as it counts down, and with
                           ``left == 0`` as the retry is sent

``Event`` is any of these records; an ``EventHandler`` (``on_event``) is a function that
receives them. It is called on the thread that runs the question, one event at a time (a
search's retry wait on a tool thread is handed over to that thread); the CLI's progress line
and ``Agent.stream``'s grounded chunks are built on these (``crag.stream``).
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import frozen

from .state import EvidenceItem

__all__ = ["AnswerDelta", "AnswerStarted", "Event", "EventHandler", "NodeFinished", "NodeStarted", "RetryWaiting"]


@frozen
class NodeStarted:
    node: str


@frozen
class NodeFinished:
    node: str


@frozen
class AnswerStarted:
    items: tuple[EvidenceItem, ...]
    question: str = ""
    verdict_may_rewrite: bool = True
    absent: tuple[str, ...] = ()  # the terms the question names that no item holds (verdict: not_answered)
    chitchat: bool = False  # no evidence, no citation: answer.without_citations edits the finished text


@frozen
class AnswerDelta:
    text: str


@frozen
class RetryWaiting:
    node: str  # the step that waits ("" outside a run: ``crag index``)
    server: str  # "LLM" or "embeddings"
    reason: str  # "429 rate limited", "503 service unavailable", "timed out", "connection failed"
    seconds: float  # the whole wait before this retry
    left: float  # seconds still to wait (0: the retry is being sent)
    retry: int  # this retry's number, from 1
    retries: int  # how many retries there may be (KB_AGENT_LLM_MAX_RETRIES)
    status: int | None = None  # the HTTP status that asked for the retry


Event = NodeStarted | NodeFinished | AnswerStarted | AnswerDelta | RetryWaiting
EventHandler = Callable[[Event], None]
