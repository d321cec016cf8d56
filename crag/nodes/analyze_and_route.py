"""``analyze_and_route``: classify the question and suggest the tools worth trying.

An unusable reply means the classification is unavailable: the question is treated as
``complex`` with the default tools, and an audit event says so. When the graph comes back
here after ``RE_RETRIEVE``, a question already being researched is not downgraded: a reply of
``chitchat`` or ``simple`` keeps its earlier complexity (only the suggested tools change), so a
retry retrieves again instead of chatting, and its evidence is graded like the first round's
instead of going to synthesis ungraded.

Before a question's first call, the planning prompt and the answer's prompt with the bare
question (no history, no evidence) must fit the context window too, each with its reply
budget: a question that cannot fit them is refused then (``UsageError``), not after the
routing, planning and grading calls the user pays for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve

from .. import budget, prompts, schemas
from ..ports import AnalyzeTask, LLMRequest, PlanTask, Step, SynthesizeTask
from ..state import AgentState, Completion, Complexity, RoutingPlan
from ..toolspec import search_tools
from . import synthesize

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "analyze_and_route"
ASKS_MODEL = True  # listed in the usage block whenever it runs, with 0 calls when it asked none
# How much research a complexity asks for; a retry never lowers it.
_RANK = {Complexity.CHITCHAT: 0, Complexity.SIMPLE: 1, Complexity.COMPLEX: 2}


def prepare(state: AgentState, cfg: NodeConfig) -> Step:
    if not state.trace:  # the question's first step: would planning have room for it?
        bare = PlanTask(state.question, RoutingPlan(Complexity.COMPLEX, search_tools(cfg.tools), classified=False),
                        (), (), cfg.tools, cfg.top_k)
        budget.fit(bare, schemas.PLAN_MAX_TOKENS, cfg.context_tokens, prompts.render, cfg.count_tokens)
        synthesize.fit_answer(SynthesizeTask(state.question, (), ()), cfg)  # the smallest answer prompt
    task = AnalyzeTask(
        question=state.question,
        history=state.history,
        tools=cfg.tools,
        previous_attempts=state.tool_history,
    )
    fitted = budget.fit(task, schemas.ANALYZE_MAX_TOKENS, cfg.context_tokens, prompts.render, cfg.count_tokens)
    return Step(LLMRequest(
        NAME,
        fitted.task,
        fitted.messages,
        max_tokens=schemas.ANALYZE_MAX_TOKENS,
        temperature=0.0,
        reply_schema=schemas.route_schema(cfg.available_tools),
    ))


def apply(state: AgentState, step: Step, reply: Completion | None, cfg: NodeConfig) -> AgentState:
    defaults = search_tools(cfg.tools)
    plan = prompts.parse_route(reply.text, cfg.available_tools, defaults) if reply is not None else None
    audit = state.audit
    previous = state.complexity or Complexity.COMPLEX
    if plan is None:
        plan = RoutingPlan(Complexity.COMPLEX, defaults, classified=False)
        audit = state.log("classification_unavailable", treated_as="complex")
    elif state.iteration > 0 and _RANK[plan.complexity] < _RANK[previous]:
        plan = evolve(plan, complexity=previous)
        audit = state.log("route_kept", complexity=previous.value, reason="retry of a retrieval")
    return evolve(state, routing_plan=plan, audit=audit)
