"""The corrective graph: nodes, outcomes, and the one table that connects them.

Theory of operation
-------------------
A question moves through five nodes. After a node has run, ``outcome`` reads the new state
and names what happened (the routing complexity, the grader's action, or that the cap on
retrieval rounds was reached); ``TRANSITIONS`` maps ``(node, outcome)`` to the next node.
The table is the whole control flow: ``crag graph`` draws it, the tests walk it, and the
driver only ever asks it where to go. A pair missing from the table is a bug and raises
``GraphError`` naming the pair, never a bare ``KeyError``.

``iteration`` counts completed retrieval rounds (``tool_exec`` adds one). Once it reaches
``max_iterations`` the grader's outcome is ``CAP_REACHED`` whatever its action, so no path
can run more rounds than the cap, whatever any LLM says.
"""

from __future__ import annotations

import enum

from .state import AgentState, Complexity, GraderAction

__all__ = ["END", "START", "TRANSITIONS", "GraphError", "Node", "Outcome", "mermaid", "next_node", "outcome"]


class Node(str, enum.Enum):
    START = "start"
    ANALYZE_AND_ROUTE = "analyze_and_route"
    PLAN = "plan"
    TOOL_EXEC = "tool_exec"
    GRADE_EVIDENCE = "grade_evidence"
    SYNTHESIZE = "synthesize"
    END = "end"

    def __str__(self) -> str:
        return self.value


START, END = Node.START, Node.END


class Outcome(str, enum.Enum):
    DONE = "done"
    CHITCHAT = "chitchat"
    SIMPLE = "simple"
    COMPLEX = "complex"
    GENERATE = "GENERATE"
    REFINE = "REFINE"
    RE_RETRIEVE = "RE_RETRIEVE"
    CAP_REACHED = "iteration >= max"

    def __str__(self) -> str:
        return self.value


class GraphError(RuntimeError):
    """The table has no entry for a (node, outcome) pair: a bug in crag, not in the input."""


TRANSITIONS: dict[tuple[Node, Outcome], Node] = {
    (Node.START, Outcome.DONE): Node.ANALYZE_AND_ROUTE,
    (Node.ANALYZE_AND_ROUTE, Outcome.CHITCHAT): Node.SYNTHESIZE,
    (Node.ANALYZE_AND_ROUTE, Outcome.SIMPLE): Node.PLAN,
    (Node.ANALYZE_AND_ROUTE, Outcome.COMPLEX): Node.PLAN,
    (Node.PLAN, Outcome.DONE): Node.TOOL_EXEC,
    (Node.TOOL_EXEC, Outcome.SIMPLE): Node.SYNTHESIZE,
    (Node.TOOL_EXEC, Outcome.COMPLEX): Node.GRADE_EVIDENCE,
    (Node.GRADE_EVIDENCE, Outcome.GENERATE): Node.SYNTHESIZE,
    (Node.GRADE_EVIDENCE, Outcome.REFINE): Node.PLAN,
    (Node.GRADE_EVIDENCE, Outcome.RE_RETRIEVE): Node.ANALYZE_AND_ROUTE,
    (Node.GRADE_EVIDENCE, Outcome.CAP_REACHED): Node.SYNTHESIZE,
    (Node.SYNTHESIZE, Outcome.DONE): Node.END,
}

_COMPLEXITY_OUTCOME = {
    Complexity.CHITCHAT: Outcome.CHITCHAT,
    Complexity.SIMPLE: Outcome.SIMPLE,
    Complexity.COMPLEX: Outcome.COMPLEX,
    None: Outcome.COMPLEX,  # classification unavailable is treated as complex
}
_ACTION_OUTCOME = {
    GraderAction.GENERATE: Outcome.GENERATE,
    GraderAction.REFINE: Outcome.REFINE,
    GraderAction.RE_RETRIEVE: Outcome.RE_RETRIEVE,
}


def outcome(node: Node, state: AgentState, max_iterations: int) -> Outcome:
    """What happened at ``node``, as far as routing cares, given the state it produced."""
    if node is Node.ANALYZE_AND_ROUTE:
        return _COMPLEXITY_OUTCOME[state.complexity]
    if node is Node.TOOL_EXEC:
        # tool_exec never answers chitchat (it is not reached); anything else but simple grades.
        return Outcome.SIMPLE if state.complexity is Complexity.SIMPLE else Outcome.COMPLEX
    if node is Node.GRADE_EVIDENCE:
        if state.iteration >= max_iterations:
            return Outcome.CAP_REACHED
        if state.grader_action is None:
            raise GraphError("grade_evidence finished without a grader_action")
        return _ACTION_OUTCOME[state.grader_action]
    return Outcome.DONE


def next_node(node: Node, state: AgentState, max_iterations: int) -> Node:
    """The node after ``node``, looked up in ``TRANSITIONS``."""
    result = outcome(node, state, max_iterations)
    try:
        return TRANSITIONS[node, result]
    except KeyError:
        raise GraphError(f"no transition from {node.value} on outcome {result.value!r}") from None


def mermaid() -> str:
    """The transition table as a Mermaid flowchart (what ``crag graph`` prints)."""
    lines = ["flowchart TD"]
    for (src, result), dst in TRANSITIONS.items():
        label = "" if result is Outcome.DONE else f"|{_mermaid_label(result)}|"
        lines.append(f"    {_mermaid_id(src)} -->{label} {_mermaid_id(dst)}")
    return "\n".join(lines) + "\n"


def _mermaid_id(node: Node) -> str:
    if node is Node.START:
        return "start([start])"
    if node is Node.END:
        return "end_([end])"
    return node.value


def _mermaid_label(result: Outcome) -> str:
    text = {
        Outcome.SIMPLE: "simple",
        Outcome.COMPLEX: "complex / unclassified",
        Outcome.REFINE: "REFINE and iteration < max",
        Outcome.RE_RETRIEVE: "RE_RETRIEVE and iteration < max",
        Outcome.CAP_REACHED: "iteration ≥ max, any action",
    }.get(result, result.value)
    return '"' + text.replace('"', "'") + '"'
