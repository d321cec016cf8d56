"""The five nodes, each a pair of pure functions over ``AgentState``.

``prepare(state, cfg)`` says what the node needs from the outside world: an ``LLMRequest``,
a ``ToolRequest``, or None. ``apply(state, reply, cfg)`` returns the new state given the
reply (a ``Completion``, a tuple of ``ToolOutcome``, or None). Neither does any I/O; the
driver performs the request in between. ``NODES`` maps each graph node to its module.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from attrs import field, frozen

from ..budget import rough_count
from ..graph import Node
from ..toolspec import Tool
from . import analyze_and_route, grade_evidence, plan, synthesize, tool_exec

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["NODES", "NodeConfig"]


@frozen
class NodeConfig:
    """What the nodes need to know besides the state: thresholds, limits and the tools on offer.

    ``count_tokens`` counts a prompt's tokens for the context budget (``crag.budget``); the
    agent gives it the model's tiktoken encoding, the default is a rough, generous estimate.
    """

    tools: tuple[Tool, ...] = ()
    max_iterations: int = 3
    auto_approve_max_items: int = 2
    vector_score_threshold: float = 0.8
    drop_threshold: float = 0.3
    generate_threshold: float = 0.7
    top_k: int = 5
    temperature: float = 0.2
    max_answer_tokens: int = 1024
    context_tokens: int = 8192
    grade_memory: bool = False
    grounding: str = "note"
    count_tokens: Callable[[str], int] = field(default=rough_count, eq=False, repr=False)

    @property
    def available_tools(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        tools: tuple[Tool, ...],
        count_tokens: Callable[[str], int] = rough_count,
    ) -> NodeConfig:
        return cls(
            tools=tuple(tools),
            max_iterations=settings.max_iterations,
            auto_approve_max_items=settings.auto_approve_max_items,
            vector_score_threshold=settings.vector_score_threshold,
            drop_threshold=settings.drop_threshold,
            generate_threshold=settings.generate_threshold,
            top_k=settings.top_k,
            temperature=settings.temperature,
            max_answer_tokens=settings.max_answer_tokens,
            context_tokens=settings.context_tokens,
            grounding=settings.grounding,
            count_tokens=count_tokens,
            grade_memory=settings.grade_memory,
        )


NODES: dict[Node, ModuleType] = {
    Node.ANALYZE_AND_ROUTE: analyze_and_route,
    Node.PLAN: plan,
    Node.TOOL_EXEC: tool_exec,
    Node.GRADE_EVIDENCE: grade_evidence,
    Node.SYNTHESIZE: synthesize,
}
