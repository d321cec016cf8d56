"""The agent's state: one immutable record and the small records inside it.

Every node is a pure function from an ``AgentState`` to a new one, made with
``attrs.evolve``; the invariants below are checked in ``__attrs_post_init__`` and so re-run
on every step (scores in [0, 1], one score per context item once graded, iteration >= 0).
The names come from the user's requirement documents: ``context``, ``evidence_scores``,
``grader_action``, ``iteration``, ``tool_history``, ``routing_plan``.

``converter`` is the cattrs converter that turns a state (or any record here) into plain
JSON-ready data and back (replay). ``output_converter`` is the one that writes crag's JSON
output (``ask --json``, the MCP server): the same, plus the output's own shapes for usage
totals and audit events.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from operator import attrgetter
from typing import Any

import cattrs
from attrs import evolve, field, fields, frozen

from .pages import location, location_ref
from .safe_text import display_name

__all__ = [
    "AgentState",
    "AuditEvent",
    "Citation",
    "Completion",
    "Complexity",
    "EvidenceItem",
    "Grade",
    "GradedBy",
    "GraderAction",
    "GroundingReport",
    "Judgement",
    "Message",
    "NodeUsage",
    "RoutingPlan",
    "TokenLogprob",
    "ToolCall",
    "ToolRun",
    "Usage",
    "converter",
    "evolve",
]


class Complexity(str, enum.Enum):
    CHITCHAT = "chitchat"
    SIMPLE = "simple"
    COMPLEX = "complex"

    def __str__(self) -> str:
        return self.value


class GradedBy(enum.StrEnum):
    """How the current ``evidence_scores`` came about (``AgentState.graded_by``; crag.grading)."""

    GRADER = "grader"  # a grade that informs: numbers, or labels read through their probabilities
    FAST_PATH = "fast_path"
    UNGRADED = "ungraded"  # the grade carried no information (a grading policy's rule)
    PARSE_FAILURE = "parse_failure"


class GraderAction(str, enum.Enum):
    GENERATE = "GENERATE"
    REFINE = "REFINE"
    RE_RETRIEVE = "RE_RETRIEVE"

    def __str__(self) -> str:
        return self.value


@frozen
class Message:
    """One turn of conversation history."""

    role: str
    content: str


@frozen
class EvidenceItem:
    """One piece of evidence: a chunk, a grep match, lines read, or a remote page.

    ``source`` is what a citation names: a path (relative to the working directory when the
    file is under it, absolute otherwise), a URL, or a Jira key. A path is the file's own
    name, unescaped (a newline in it is a newline), so two files are never one source and a
    program can open it; what shows it to a person (the footer, prompts, ``search``'s text)
    escapes it with ``crag.safe_text.display_name``. ``start_line`` and
    ``end_line`` are 1-based and inclusive; ``anchor_line`` is the line a citation points at
    when it is not ``start_line`` (a grep match inside its window). ``score`` is the score
    the tool itself gave (vector_search: cosine-like in [0, 1]); relevance grades live in
    ``AgentState.evidence_scores``.
    """

    tool: str
    source: str
    text: str
    start_line: int | None = None
    end_line: int | None = None
    score: float | None = None
    anchor_line: int | None = None
    url: str | None = None
    title: str = ""

    @property
    def key(self) -> tuple[str, int | None, int | None]:
        """Identity for de-duplication: source and line span, never the path alone."""
        return (self.source, self.start_line, self.end_line)

    @property
    def cite_line(self) -> int | None:
        """The 1-based line a citation points at, or None when the source has no lines."""
        return self.anchor_line if self.anchor_line is not None else self.start_line

    @property
    def label(self) -> str:
        """``docs/setup.md:L40-L58``, ``docs/setup.md:L40``, ``guide.pdf:p2:L1-L6`` (a PDF's
        page and lines on it, ``crag.pages``) or just the source; unescaped, as ``source``."""
        if self.start_line is None:
            return self.source
        end = None if self.end_line == self.start_line else self.end_line
        return f"{self.source}:{location_ref(location(self.source, self.start_line, end))}"


def _unit_score(instance: object, attribute: Any, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} {value!r} is outside [0, 1]")


@frozen
class Grade:
    """A relevance grade an item got in an earlier grading of the same question.

    Kept by item identity (source and line span), so the memories of ``grade_evidence``
    recognise the item when a later round retrieves it again. ``from_logprobs``: it was read
    through token probabilities, so the grading policy's rules apply to it when remembered.
    """

    source: str
    start_line: int | None
    end_line: int | None
    score: float = field(validator=_unit_score)
    from_logprobs: bool = False

    @classmethod
    def of(cls, item: EvidenceItem, score: float, from_logprobs: bool = False) -> Grade:
        return cls(item.source, item.start_line, item.end_line, float(score), from_logprobs)

    @property
    def key(self) -> tuple[str, int | None, int | None]:
        return (self.source, self.start_line, self.end_line)


@frozen
class ToolCall:
    """A validated request to run one tool."""

    tool: str
    args: Mapping[str, Any] = field(factory=dict)


@frozen
class ToolRun:
    """One entry of ``tool_history``: a call, the round it ran in, and what came back."""

    round: int
    call: ToolCall
    items: tuple[EvidenceItem, ...] = ()
    error: str | None = None


@frozen
class RoutingPlan:
    """What ``analyze_and_route`` decided: the complexity and the tools worth trying.

    ``classified`` is False when the classification was unavailable (bad or missing reply),
    in which case the complexity is ``complex`` with the default tools.
    """

    complexity: Complexity
    suggested_tools: tuple[str, ...]
    classified: bool = True


@frozen
class NodeUsage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    cached_tokens: int = 0  # prompt tokens the server reported as served from its cache
    estimated_calls: int = 0  # calls whose tokens crag counted: the server reported none (or impossible ones)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@frozen
class TokenLogprob:
    """One token of a reply with its log probability, and the most likely tokens the model
    weighed at that position (``top``: (token, logprob) pairs, best first), as servers
    return them under ``logprobs``."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@frozen
class Completion:
    """What a chat model returned for one request, with what it cost.

    ``billable`` is False for the offline backend, which makes no LLM call: its replies
    count no calls and no tokens. ``cached_tokens`` is the part of the prompt the server
    reported as cached (0 when it says nothing); ``finish_reason`` is the server's
    (``"length"`` when the reply ran into ``max_tokens``); ``usage_replaced`` says the server's
    counts were implausible and tiktoken's stand in, ``usage_estimated`` that crag counted some of
    them (the server reported none, or they were replaced). ``logprobs`` holds the reply's tokens
    with their probabilities when the request asked for them and the server returned them
    (None otherwise). ``refusal`` is the model's refusal when it declined to reply (``text``
    is then empty, so the node's fallback for a reply it cannot read applies).
    """

    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    billable: bool = True
    cached_tokens: int = 0
    finish_reason: str | None = None
    usage_replaced: bool = False  # the server's token counts were implausible: counted instead
    usage_estimated: bool = False  # crag counted some of the tokens (the server reported none, or replaced)
    logprobs: tuple[TokenLogprob, ...] | None = None
    # What the adapter left out or sent another way because the server refused it earlier
    # (crag.llm.server_memory): "logprobs", "temperature", "max_tokens", "response_format=...".
    adapted: tuple[str, ...] = ()
    refusal: str | None = None

    @property
    def truncated(self) -> bool:
        """The reply was stopped by its ``max_tokens`` budget."""
        return self.finish_reason == "length"

    @property
    def refused(self) -> bool:
        """The model declined to reply (``refusal`` says how)."""
        return self.refusal is not None


_NO_USAGE = NodeUsage()


@frozen
class Usage:
    """LLM usage accumulated over one question, per node, in the order nodes first called."""

    model: str = ""
    by_node: Mapping[str, NodeUsage] = field(factory=dict)

    def add(self, node: str, completion: Completion) -> Usage:
        prev = self.by_node.get(node) or _NO_USAGE
        billable = completion.billable
        # Positional arguments, in field order: the driver adds usage once per LLM call.
        now = NodeUsage(
            prev.calls + (1 if billable else 0),
            prev.prompt_tokens + (completion.prompt_tokens if billable else 0),
            prev.completion_tokens + (completion.completion_tokens if billable else 0),
            prev.latency_ms + completion.latency_ms,
            prev.cached_tokens + (completion.cached_tokens if billable else 0),
            prev.estimated_calls + (1 if billable and completion.usage_estimated else 0),
        )
        return Usage(completion.model or self.model, {**self.by_node, node: now})

    def ran(self, node: str) -> Usage:
        """This usage with ``node`` listed, with 0 calls when it made none (a grading fast path,
        a synthesis with no evidence): the block gives every node that may ask the model."""
        return self if node in self.by_node else Usage(self.model, {**self.by_node, node: _NO_USAGE})

    @property
    def llm_calls(self) -> int:
        return sum(u.calls for u in self.by_node.values())

    @property
    def prompt_tokens(self) -> int:
        return sum(u.prompt_tokens for u in self.by_node.values())

    @property
    def completion_tokens(self) -> int:
        return sum(u.completion_tokens for u in self.by_node.values())

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def latency_ms(self) -> float:
        return sum(u.latency_ms for u in self.by_node.values())

    @property
    def cached_tokens(self) -> int:
        return sum(u.cached_tokens for u in self.by_node.values())

    @property
    def estimated_calls(self) -> int:
        """Calls whose token counts crag made itself, with its tokenizer (an estimate)."""
        return sum(u.estimated_calls for u in self.by_node.values())


@frozen
class AuditEvent:
    """One line of the audit log (``log_audit`` in the requirement documents)."""

    event: str
    fields: Mapping[str, Any] = field(factory=dict)


@frozen
class Citation:
    """One footer entry of an answer: ``[n] path:Lline``; ``line`` to ``end_line`` is the
    supporting text in the file.

    ``path`` is the file's own name (the evidence item's ``source``), what ``--json``, MCP and
    the answer log carry; ``ref`` is the footer's text, the path in the display form of
    ``crag.safe_text.display_name`` (a newline in a name is ``\\n`` there), so a name can
    never add a line to the answer. Two files whose display forms are alike (``a<newline>b.md``
    and ``a\\nb.md``) have one ``ref`` and two different ``path`` values."""

    n: int
    path: str
    line: int | None
    tool: str
    end_line: int | None = None
    page: int | None = None  # a PDF's page; ``line`` and ``end_line`` then count lines on it

    @property
    def ref(self) -> str:
        """How the footer names it: ``docs/a.md:L42``, ``guide.pdf:p3:L12`` or just the path,
        escaped for display."""
        shown = display_name(self.path)
        if self.line is None:
            return shown
        return f"{shown}:p{self.page}:L{self.line}" if self.page is not None else f"{shown}:L{self.line}"



@frozen
class Judgement:
    """Grounding's verdict on one judged sentence (or code block, or table): whether the
    evidence supports it, and the rule that decided (``crag.grounding.RULES``; ``none``
    when no rule held; ``clauses`` when it was judged clause by clause, with the clauses'
    own verdicts)."""

    sentence: str
    supported: bool
    rule: str
    clauses: tuple[Judgement, ...] = ()


@frozen
class GroundingReport:
    """How many answer sentences were judged against the evidence, how many it supports,
    the text of those it does not, and each verdict with its rule (``ask --json``'s
    ``grounding``)."""

    sentences: int = 0
    supported: int = 0
    unsupported: tuple[str, ...] = ()
    judgements: tuple[Judgement, ...] = ()
    # What the answer makes of the report (crag.nodes.synthesize): "answered", or
    # "not_answered" when most judged sentences are unsupported and no informative grade
    # approved the evidence (the answer then says the knowledge base does not appear to hold
    # it), or "unsupported" when most are unsupported but a grader approved the evidence.
    verdict: str | None = None


@frozen
class AgentState:
    """Everything one question's run knows. Immutable; change it with ``evolve``."""

    question: str
    history: tuple[Message, ...] = ()
    routing_plan: RoutingPlan | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    context: tuple[EvidenceItem, ...] = ()
    evidence_scores: tuple[float, ...] = ()
    grader_action: GraderAction | None = None
    iteration: int = 0
    tool_history: tuple[ToolRun, ...] = ()
    audit: tuple[AuditEvent, ...] = ()
    usage: Usage = field(factory=Usage)
    trace: tuple[str, ...] = ()
    answer: str | None = None
    citations: tuple[Citation, ...] = ()
    grounding: GroundingReport | None = None
    # The two memories of grade_evidence across rounds (docs/architecture.md, "Grading"):
    # items the filter removed (never added to context again), and every item's latest
    # grade (re-used instead of re-graded when KB_AGENT_GRADE_MEMORY=on).
    removed: tuple[Grade, ...] = ()
    grades: tuple[Grade, ...] = ()
    # How the current evidence_scores came about (GradedBy); None before any grading (the
    # simple path).
    graded_by: GradedBy | None = None
    # The context window requests are fitted to after a server refused a longer one
    # (audit ``context_refit``); None: KB_AGENT_CONTEXT_TOKENS.
    context_window: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {self.iteration}")
        if self.context_window is not None and self.context_window < 1:
            raise ValueError(f"context_window must be >= 1, got {self.context_window}")
        scores = self.evidence_scores
        if scores:
            if len(scores) != len(self.context):
                raise ValueError(
                    f"evidence_scores has {len(scores)} scores for {len(self.context)} context items"
                )
            for s in scores:
                if not 0.0 <= s <= 1.0:
                    raise ValueError(f"evidence score {s!r} is outside [0, 1]")

    @property
    def complexity(self) -> Complexity | None:
        return self.routing_plan.complexity if self.routing_plan is not None else None

    def log(self, event: str, **fields: Any) -> tuple[AuditEvent, ...]:
        """The audit log with one more event (``log_audit``); use inside ``evolve``."""
        return (*self.audit, AuditEvent(event, fields))

    def recorded(self, node: str, usage: Usage, audit: tuple[AuditEvent, ...]) -> AgentState:
        """This state with one more step recorded: ``node`` added to ``trace``, and the
        step's ``usage`` and ``audit``. What ``evolve(state, trace=..., usage=..., audit=...)``
        returns, invariants checked alike; the driver calls it after every step, and this
        way it costs half of ``evolve``'s generic walk over the fields (docs/benchmarks.md)."""
        values = list(_state_values(self))
        values[_TRACE] = (*self.trace, node)
        values[_USAGE] = usage
        values[_AUDIT] = audit
        return AgentState(*values)


# AgentState's fields in order, read in one call (AgentState.recorded).
_STATE_FIELDS = tuple(a.name for a in fields(AgentState))
_state_values = attrgetter(*_STATE_FIELDS)
_TRACE, _USAGE, _AUDIT = (_STATE_FIELDS.index(name) for name in ("trace", "usage", "audit"))


def _make_converter() -> cattrs.Converter:
    """cattrs handles every record here as is; free-form mappings (tool args, audit
    fields) become plain dicts, and enums their values."""
    return cattrs.Converter()


converter = _make_converter()


def _node_usage_json(u: NodeUsage) -> dict[str, Any]:
    return {
        "calls": u.calls,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        **({"cached_tokens": u.cached_tokens} if u.cached_tokens else {}),
        **({"estimated_calls": u.estimated_calls} if u.estimated_calls else {}),
        "latency_ms": round(u.latency_ms, 1),
    }


def _usage_json(u: Usage) -> dict[str, Any]:
    """The ``usage`` object of ``ask --json``; ``cached_tokens`` appears (in total and per
    node) only when the server reported cached prompt tokens, ``estimated_calls`` only when crag
    counted some calls' tokens itself."""
    return {
        "model": u.model,
        "llm_calls": u.llm_calls,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        **({"cached_tokens": u.cached_tokens} if u.cached_tokens else {}),
        **({"estimated_calls": u.estimated_calls} if u.estimated_calls else {}),
        "latency_ms": round(u.latency_ms, 1),
        "by_node": {node: _node_usage_json(n) for node, n in u.by_node.items()},
    }


def _make_output_converter() -> cattrs.Converter:
    """``converter`` plus the shapes of crag's JSON output (``ask --json``, the MCP server):
    usage with its totals and rounded latencies, an audit event as one flat object, the
    grounding report as SPEC's three fields and a verdict without empty clauses."""
    out = converter.copy()
    out.register_unstructure_hook(NodeUsage, _node_usage_json)
    out.register_unstructure_hook(Usage, _usage_json)
    out.register_unstructure_hook(Citation, lambda c: {
        "n": c.n, "path": c.path, "line": c.line, "tool": c.tool, "end_line": c.end_line,
        **({"page": c.page} if c.page is not None else {}),
    })
    out.register_unstructure_hook(AuditEvent, lambda e: {"event": e.event, **out.unstructure(dict(e.fields))})
    out.register_unstructure_hook(GroundingReport, _grounding_json)
    out.register_unstructure_hook(Judgement, _judgement_json)
    return out


def _grounding_json(g: GroundingReport) -> dict[str, Any]:
    """SPEC's ``grounding`` object: its three fields and the answer's ``verdict`` (SPEC §7);
    the sentences' verdicts go in ``judgements``."""
    return {"sentences": g.sentences, "supported": g.supported, "unsupported": list(g.unsupported),
            "verdict": g.verdict}


def _judgement_json(j: Judgement) -> dict[str, Any]:
    out: dict[str, Any] = {"sentence": j.sentence, "supported": j.supported, "rule": j.rule}
    if j.clauses:
        out["clauses"] = [_judgement_json(c) for c in j.clauses]
    return out


# The one converter for JSON output; ``crag.agent`` adds the shape of an ``Answer``.
output_converter = _make_output_converter()

