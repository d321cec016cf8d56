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

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from attrs import frozen

from .state import AuditEvent, Completion, EvidenceItem, Message, RoutingPlan, ToolCall, ToolRun
from .toolspec import Tool

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
    "ToolResult",
    "Toolbox",
]


@frozen
class AnalyzeTask:
    """Classify the question and suggest tools."""

    question: str
    history: tuple[Message, ...]
    tools: tuple[Tool, ...]
    previous_attempts: tuple[ToolRun, ...] = ()

    @property
    def available_tools(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)


@frozen
class PlanTask:
    """Choose this round's tool calls."""

    question: str
    routing_plan: RoutingPlan
    evidence: tuple[EvidenceItem, ...]
    previous_attempts: tuple[ToolRun, ...]
    tools: tuple[Tool, ...]
    top_k: int
    history: tuple[Message, ...] = ()  # earlier turns: a follow-up question is planned in context

    @property
    def available_tools(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)


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
    """One chat completion a node asks for.

    ``max_tokens`` is the reply's budget and ``temperature`` its sampling temperature (None:
    the server's default). ``reply_schema``, for nodes whose reply is JSON, is
    ``{"name": ..., "schema": {JSON Schema}}``: the adapter asks for structured output with
    it, as far as the server and ``KB_AGENT_STRUCTURED_OUTPUT`` allow.
    """

    node: str
    task: Task
    messages: tuple[dict[str, str], ...]
    max_tokens: int | None = None
    temperature: float | None = None
    reply_schema: Mapping[str, Any] | None = None


@frozen
class ToolRequest:
    calls: tuple[ToolCall, ...]


@frozen
class ToolResult:
    """What a tool may return instead of a bare list of items: the items plus audit events
    about the call (a ``glob`` that matched no file and was dropped, for instance)."""

    items: tuple[EvidenceItem, ...] = ()
    audit: tuple[AuditEvent, ...] = ()

    def __iter__(self) -> Iterator[EvidenceItem]:  # reads like the plain list of items
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@frozen
class ToolOutcome:
    """What one tool call produced: items, or an error message (never both), and the
    call's audit events."""

    call: ToolCall
    items: tuple[EvidenceItem, ...] = ()
    error: str | None = None
    audit: tuple[AuditEvent, ...] = ()


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
    """The tools of one question: the records of those on offer, and running one call.

    ``run`` returns the call's items (or a ``ToolResult`` with audit events too) and raises
    ``crag.errors.ToolError`` for a failed call; the driver records it.
    """

    def tools(self) -> tuple[Tool, ...]: ...

    def run(self, call: ToolCall) -> Sequence[EvidenceItem] | ToolResult: ...


@runtime_checkable
class Embedder(Protocol):
    """Texts to unit-length float32 vectors, shape (len(texts), dim)."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

