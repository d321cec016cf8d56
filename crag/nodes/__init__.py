"""The five nodes, each a pair of pure functions over ``AgentState``.

``prepare(state, cfg)`` returns a ``crag.ports.Step``: what the node needs from the outside
world (an ``LLMRequest``, ``LLMRequests``, a ``ToolRequest``, or None) and the plan behind
it. ``apply(state, step, reply, cfg)`` returns the new state given that step and the reply
(a ``Completion``, a tuple of them, a tuple of ``ToolOutcome``, or None); it reads what
``prepare`` decided from the step (the fast-path rule, the items sent, the fitted prompt)
and never decides it again. Neither does any I/O; the driver performs the request in
between. ``ASKS_MODEL`` says whether the node's step may ask the model: such a node is in the
usage block whenever it runs, with 0 calls when it asked nothing (a grading fast path).
``NODES`` maps each graph node to its module.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from attrs import evolve, field, fields, frozen

from ..budget import rough_count
from ..graph import Node
from ..toolspec import Tool
from . import analyze_and_route, grade_evidence, plan, synthesize, tool_exec

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["NODES", "NodeConfig"]


@frozen
class NodeConfig:
    """What the nodes need to know besides the state: the settings they read, the tools on offer
    and a token counter.

    ``settings`` is a ``crag.config.Settings``; the nodes read the fields it marks for them
    (``node=True``: thresholds, limits, the answer's budget, the grounding mode) as attributes
    of this record (``cfg.top_k``), and nothing else of it (no keys, no URLs). A setting
    added there for the nodes is here with no change to this class. ``count_tokens`` counts a
    prompt's tokens for the context budget (``crag.budget``); the agent gives it the model's
    tiktoken encoding, the default is a rough, generous estimate.
    """

    settings: Settings
    tools: tuple[Tool, ...] = field(default=(), converter=tuple)
    count_tokens: Callable[[str], int] = field(default=rough_count, eq=False, repr=False)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not this record's own.
        if name != "settings" and name in _node_settings(type(self.settings)):
            return getattr(self.settings, name)
        raise AttributeError(f"NodeConfig has no attribute {name!r}")

    @property
    def available_tools(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        tools: tuple[Tool, ...] = (),
        count_tokens: Callable[[str], int] = rough_count,
    ) -> NodeConfig:
        return cls(settings, tools, count_tokens)

    def with_settings(self, **changes: Any) -> NodeConfig:
        """This config with some node settings changed (checked like any setting)."""
        return evolve(self, settings=evolve(self.settings, **changes))


@cache
def _node_settings(settings_class: type) -> frozenset[str]:
    """The fields of a settings class marked for the nodes (``crag.config.setting(..., node=True)``)."""
    return frozenset(f.name for f in fields(settings_class) if f.metadata.get("node"))


NODES: dict[Node, ModuleType] = {
    Node.ANALYZE_AND_ROUTE: analyze_and_route,
    Node.PLAN: plan,
    Node.TOOL_EXEC: tool_exec,
    Node.GRADE_EVIDENCE: grade_evidence,
    Node.SYNTHESIZE: synthesize,
}
