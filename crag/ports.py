"""The ports: what a node asks of the outside world, and the small interfaces that answer.

A node's ``prepare`` returns one of two requests, or None:

* ``LLMRequest``: a chat completion for one node. It carries both the rendered
  ``messages`` (what an OpenAI-compatible server receives) and the structured ``task`` they
  were rendered from, so that the offline backend can answer the same contract from data
  instead of parsing prompts. Its reply is a ``Completion``.
* ``ToolRequest``: the validated tool calls of one retrieval round. Its reply is one
  ``ToolOutcome`` per call, in order.

Adapters implement ``ChatModel``, ``Toolbox`` and ``Embedder``; only they touch the
network, the disk or the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from attrs import frozen

from .state import Completion, EvidenceItem, Message, RoutingPlan, ToolCall, ToolRun

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "AnalyzeTask",
    "ChatModel",
    "Embedder",
    "GradeTask",
    "LLMRequest",
    "PlanTask",
    "SynthesizeTask",
    "Task",
    "ToolOutcome",
    "ToolRequest",
    "Toolbox",
]


@frozen
class AnalyzeTask:
    """Classify the question and suggest tools."""

    question: str
    history: tuple[Message, ...]
    available_tools: tuple[str, ...]
    previous_attempts: tuple[ToolRun, ...] = ()


@frozen
class PlanTask:
    """Choose this round's tool calls."""

    question: str
    routing_plan: RoutingPlan
    evidence: tuple[EvidenceItem, ...]
    previous_attempts: tuple[ToolRun, ...]
    available_tools: tuple[str, ...]
    top_k: int
    history: tuple[Message, ...] = ()  # earlier turns: a follow-up question is planned in context


@frozen
class GradeTask:
    """Score each of ``items`` for relevance to ``question``, 0.0 to 1.0."""

    question: str
    items: tuple[EvidenceItem, ...]


@frozen
class SynthesizeTask:
    """Write the answer from ``items`` (numbered 1..M), or chat when ``chitchat``."""

    question: str
    history: tuple[Message, ...]
    items: tuple[EvidenceItem, ...]
    chitchat: bool = False


Task = AnalyzeTask | PlanTask | GradeTask | SynthesizeTask


@frozen
class LLMRequest:
    node: str
    task: Task
    messages: tuple[dict[str, str], ...]


@frozen
class ToolRequest:
    calls: tuple[ToolCall, ...]


@frozen
class ToolOutcome:
    """What one tool call produced: items, or an error message (never both)."""

    call: ToolCall
    items: tuple[EvidenceItem, ...] = ()
    error: str | None = None


@runtime_checkable
class ChatModel(Protocol):
    """One chat completion per request. Raises ``crag.errors.LLMError`` when it cannot.

    ``on_delta``, when given and the backend can stream, receives the reply text as it
    arrives; the returned ``Completion`` always holds the whole text.
    """

    model: str

    def complete(
        self, request: LLMRequest, on_delta: Callable[[str], None] | None = None
    ) -> Completion: ...


@runtime_checkable
class Toolbox(Protocol):
    """The tools of one question: which are available, and running one call.

    ``run`` raises ``crag.errors.ToolError`` for a failed call; the driver records it.
    """

    def available(self) -> tuple[str, ...]: ...

    def run(self, call: ToolCall) -> Sequence[EvidenceItem]: ...


@runtime_checkable
class Embedder(Protocol):
    """Texts to unit-length float32 vectors, shape (len(texts), dim)."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

