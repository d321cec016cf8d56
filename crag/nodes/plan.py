"""``plan``: choose this round's tool calls.

The reply is validated strictly by ``prompts.parse_plan``: tools outside the routing plan's
suggestions or not available are dropped, remote tools need their argument pattern in the
question, bad arguments never run. Each refusal is audited (``plan_call_rejected``). When
nothing valid remains the plan is the question's own search (``vector_search``).

Then ``crag.searches`` makes sure the plan cannot make retrieval worse: the first round also
searches the question itself, and a call identical to one already run goes one page deeper.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve

from .. import budget, prompts, schemas, searches
from ..ports import LLMRequest, PlanTask, Step
from ..state import AgentState, AuditEvent, Completion, Complexity, RoutingPlan
from ..toolspec import question_search, search_tools

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "plan"
ASKS_MODEL = True  # listed in the usage block whenever it runs, with 0 calls when it asked none


def _routing_plan(state: AgentState, cfg: NodeConfig) -> RoutingPlan:
    if state.routing_plan is not None:
        return state.routing_plan
    return RoutingPlan(Complexity.COMPLEX, search_tools(cfg.tools), classified=False)


def prepare(state: AgentState, cfg: NodeConfig) -> Step:
    """The planning request; its plan is the routing plan the reply is checked against."""
    task = PlanTask(
        question=state.question,
        routing_plan=_routing_plan(state, cfg),
        evidence=state.context,
        previous_attempts=state.tool_history,
        tools=cfg.tools,
        top_k=cfg.top_k,
        history=state.history,
    )
    allowed = tuple(t for t in task.routing_plan.suggested_tools if t in cfg.available_tools)
    if not allowed:
        own = question_search(cfg.tools, state.question, cfg.top_k)
        allowed = (own.tool,) if own is not None else ()
    fitted = budget.fit(task, schemas.PLAN_MAX_TOKENS, cfg.context_tokens, prompts.render, cfg.count_tokens)
    request = LLMRequest(
        NAME,
        fitted.task,
        fitted.messages,
        max_tokens=schemas.PLAN_MAX_TOKENS,
        temperature=0.0,
        reply_schema=schemas.plan_schema(allowed),
    )
    return Step(request, task.routing_plan)


def apply(state: AgentState, step: Step, reply: Completion | None, cfg: NodeConfig) -> AgentState:
    text = reply.text if reply is not None else ""
    searched = searches.searched_question(state.question, state.history)  # "why?" with what it asks about
    calls, rejected = prompts.parse_plan(text, state.question, step.plan, cfg.tools, cfg.top_k, searched)
    events = [AuditEvent("plan_call_rejected", {"reason": reason}) for reason in rejected]
    if state.iteration == 0:
        calls, added = searches.with_question_search(
            calls, searched, cfg.top_k, prompts.find_paths(state.question), cfg.tools
        )
        events.extend(added)
    calls, repeated = searches.deepen_repeats(calls, state.tool_history, cfg.top_k, searched, cfg.tools)
    events.extend(repeated)
    if events:
        return evolve(state, tool_calls=calls, audit=(*state.audit, *events))
    return evolve(state, tool_calls=calls)
