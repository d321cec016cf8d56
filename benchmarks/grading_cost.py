"""Grading cost: how much LLM grading is worth paying for.

Every strategy runs through crag's real grading code, on real prompts, against expert
relevance labels; only the grader model itself is simulated.

Workload
--------
The judged (query, passage) pairs of TREC Deep Learning 2019 + 2020 (``--data``, default
``../shared/grading/trec_dl/judged_pairs.jsonl``): for each of the 97 queries, the BM25
top-100 passages that NIST assessors graded 0-3, in BM25 order; relevant = grade >= 2 (the
TREC cut). These are hard candidates: same topic, shared words, often not an answer.
A passage becomes an ``EvidenceItem(tool="vector_search", source="msmarco/<docid>.txt",
start_line=1)`` whose retrieval ``score`` is what crag's ``vector_search`` would record for
it: the cosine between query and passage under crag's default embedder
(``crag.index.embedders.HashEmbedder``), clipped to [0, 1]. That is the value the
``high_vector_score`` fast path compares with ``KB_AGENT_VECTOR_SCORE_THRESHOLD``.

Two workloads, each for every ``k`` in ``--ks`` (default 3, 5, 10):

* ``single round``: the top-k candidates of each query, as one retrieval round hands them to
  ``grade_evidence``. A state after ``tool_exec`` is built and the node's own
  ``prepare`` / ``apply`` run on it (fast-path rules, one batched request rendered by
  ``crag.prompts.render``, ``parse_scores``, the drop filter and the decision).
* ``up to 3 rounds``: whole questions through ``crag.driver.Driver`` with
  ``KB_AGENT_MAX_ITERATIONS=3``. The toolbox's ``vector_search`` returns the next ``k``
  unseen candidates of the query on every call (a refined or re-routed search finds new
  passages further down the list), so REFINE rounds re-grade the survivors of earlier
  rounds together with the new items, as crag's grading does by default (docs/architecture.md). The planner asks for a
  keyword query (the question's content words), as planners do; crag's first round also
  searches the question itself (docs/real-models.md), so a question's first round grades 2k candidates
  (two searches) and each later round k more (the planned search one page deeper).

Strategies
----------
* ``per_item``: one LLM call per item, no fast path: the common LangGraph CRAG tutorial's
  grader, and crag's ``KB_AGENT_GRADER=pointwise`` (each call is the request crag's
  pointwise grader makes for that item);
* ``batch``: seed 000: one call for all N items, no fast path (``KB_AGENT_GRADER=batch``,
  crag's default style: a yes/no line per item, read from token probabilities);
* ``scores``: as ``batch``, with ``KB_AGENT_GRADER=scores`` (N numbers as JSON, the first
  prompt);
* ``batch_rules``: seed 001, crag's default: fast-path rules first, then one batch call;
* ``batch_rules_memory``: ``batch_rules`` with crag's grade memory on
  (``KB_AGENT_GRADE_MEMORY=on``): an item graded in an earlier round of the question keeps
  its score, only new items are sent (in one batch call), and no call is made when nothing
  is new. It changes nothing in a single round; it saves the re-grading of survivors in
  REFINE rounds.

The simulated grader
--------------------
A grader's score for a passage is ``clip(MEAN[grade] + N(0, --noise), 0, 1)`` rounded to
one decimal, with ``MEAN = {0: 0.05, 1: 0.45, 2: 0.8, 3: 0.95}`` (``--means``): crag's
grading prompt asks for 1.0 when an item answers the question, 0.5 when it is related but
partial and 0.0 when unrelated, which is what TREC grades 3-2, 1 and 0 mean. The noise is
drawn once per (query, passage) from ``--seed``, so every strategy sees the same grade for
the same pair (a temperature-0 grader) and the strategies differ only in what they send and
what they decide. Position effects of long batches and per-item calibration differences are
not modelled. The reply is what the style's prompt asks for, read by ``crag.prompts``: a
``yes`` / ``no`` line per item for ``batch`` (``1: yes``), one bare ``yes`` or ``no`` for a
per-item call, the object ``{"scores": [0.8, 0.1, 0.5]}`` for ``scores``; a label is ``yes``
at a score of 0.5 or more, and carries the score as its P(yes) in the token probabilities
crag asks for, so crag reads the same score whatever the style. The simulated grades are
decided by the seeds' rules (``KB_AGENT_GRADING_POLICY=seed``, ``node_config``), as when every
reply was numbers: the default policy's rows are for a real model's uninformative or
undecided probabilities, which this grader does not have.

Tokens are counted with tiktoken (``--encoding``, o200k_base as for gpt-4o-mini) on the
messages the real prompt builders produce, as the chat format bills them: per message 3
tokens plus its role and content, plus 3 for the reply primer. Latency per call is
``--latency-fixed-ms + --latency-prompt-ms * prompt tokens + --latency-completion-ms *
completion tokens`` (350 ms + 0.2 ms + 15 ms by default, a hosted small model); the calls of
one per-item grading are counted one after another, as the tutorial makes them. Dollars
come from ``--price NAME=INPUT/OUTPUT`` (USD per million tokens, repeatable).

Report
------
Per strategy and workload: the AUC of the grader's scores against the expert labels over
every item an LLM graded (relevant = grade >= 2; the probability that a relevant item scores
above an irrelevant one, ties half), grading LLM calls, prompt and completion tokens, simulated
latency and dollars (per 1,000 gradings or questions), and decision quality against the
expert labels over the passages that reach synthesis: the share of retrieved relevant
passages kept, the share of retrieved irrelevant passages that got through, and the
fast-path false approvals (irrelevant passages approved by a rule without any LLM having
seen them) separately. A sweep of the ``high_vector_score`` threshold shows what the rule
would save, and let through, if it were lowered.

Run: ``python -m benchmarks.grading_cost``. Writes ``grading_cost.json``, ``.md``, ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    SHARED,
    at_least,
    counts,
    environment,
    fmt,
    fractions,
    llm_timeout,
    load_pyplot,
    markdown_table,
    non_negative,
    out_dir,
    read_judged_pairs,
    record_file,
    run_main,
    write_report,
)

NAME = "grading_cost"
REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = SHARED / "grading" / "trec_dl" / "judged_pairs.jsonl"
STRATEGIES = ("per_item", "batch", "scores", "batch_rules", "batch_rules_memory")
DEFAULT_STRATEGY = "batch_rules"
DEFAULT_MEANS = {0: 0.05, 1: 0.45, 2: 0.8, 3: 0.95}
DEFAULT_PRICES = ("gpt-4o-mini=0.15/0.60", "gpt-4o=2.50/10.00")
SWEEP_THRESHOLDS = (0.8, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3)
# The fast-path rules off: few_context needs at most 0 items, high_vector_score a perfect
# cosine for every item (the highest threshold a setting holds; no TREC top-k has one).
NO_RULES = {"auto_approve_max_items": 0, "vector_score_threshold": 1.0}


# --------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    qid: str
    docid: str
    bm25_rank: int
    grade: int
    item: Any  # crag.state.EvidenceItem

    @property
    def relevant(self) -> bool:
        return self.grade >= 2


@dataclass
class Query:
    qid: str
    text: str
    candidates: list[Candidate]


def load_queries(path: Path, max_queries: int | None = None) -> list[Query]:
    """The judged pairs grouped by query, in BM25 order, with crag's retrieval score."""
    from crag.index.embedders import HashEmbedder
    from crag.state import EvidenceItem

    rows = read_judged_pairs(path)
    by_q: dict[str, list[dict]] = defaultdict(list)
    texts: dict[str, str] = {}
    for r in rows:
        by_q[r["qid"]].append(r)
        texts[r["qid"]] = r["query"]
    qids = sorted(by_q, key=lambda q: (by_q[q][0]["collection"], int(q) if q.isdigit() else q))
    if max_queries:
        qids = qids[:max_queries]
    embedder = HashEmbedder()
    qvec = dict(zip(qids, embedder.embed([texts[q] for q in qids])))
    queries = []
    for qid in qids:
        rs = sorted(by_q[qid], key=lambda r: r["bm25_rank"])
        pvec = embedder.embed([r["passage"] for r in rs])
        cands = []
        for r, v in zip(rs, pvec):
            cos = float(min(1.0, max(0.0, float(qvec[qid] @ v))))
            item = EvidenceItem(
                tool="vector_search",
                source=f"msmarco/{r['docid']}.txt",
                text=r["passage"],
                start_line=1,
                end_line=1,
                score=round(cos, 6),
            )
            cands.append(Candidate(qid, r["docid"], int(r["bm25_rank"]), int(r["grade"]), item))
        queries.append(Query(qid, texts[qid], cands))
    return queries


# --------------------------------------------------------------------------------------
# The simulated grader, the meter, and the strategies as a ChatModel
# --------------------------------------------------------------------------------------


class SimulatedGrader:
    """Scores from the expert grade plus seeded Gaussian noise (see the module docstring)."""

    def __init__(self, labels: dict[tuple[str, str], int], means: dict[int, float], noise: float, seed: int) -> None:
        self.labels = labels
        self.means = means
        self.noise = noise
        self.seed = seed
        self._scores: dict[tuple[str, str], float] = {}

    def score(self, question: str, source: str) -> float:
        key = (question, source)
        if key not in self._scores:
            import numpy as np

            rng = np.random.default_rng([self.seed, zlib.crc32(f"{question}\x00{source}".encode())])
            value = self.means[self.labels[key]] + self.noise * float(rng.standard_normal())
            self._scores[key] = round(min(1.0, max(0.0, value)), 1)
        return self._scores[key]

    @staticmethod
    def reply(scores: Sequence[float], style: str = "scores") -> str:
        """The reply the style's prompt asks for, so completion tokens (and the modelled time)
        are counted as a real grader spends them: ``scores`` the JSON object its schema asks
        for, ``{"scores": [0.8, 0.1]}``; ``batch`` a label line per item, ``1: yes`` / ``2: no``;
        ``pointwise`` one bare ``yes`` or ``no``. A label is ``yes`` when the score is at least 0.5."""
        if style == "scores":
            return '{"scores": [' + ", ".join(f"{s:.1f}" for s in scores) + "]}"
        labels = ["yes" if s >= 0.5 else "no" for s in scores]
        if style == "pointwise":
            return labels[0]
        return "\n".join(f"{i}: {label}" for i, label in enumerate(labels, start=1))

    @staticmethod
    def logprobs(scores: Sequence[float], style: str):
        """The token probabilities a server sends with a label reply when crag asks for them:
        at each label, P(yes) is the item's score, so crag reads the grade the score is."""
        from crag.state import TokenLogprob

        def log(p: float) -> float:
            return math.log(p) if p > 0 else -math.inf

        def label(s: float, lead: str) -> TokenLogprob:
            word = "yes" if s >= 0.5 else "no"
            top = ((lead + "yes", log(s)), (lead + "no", log(1.0 - s)))
            return TokenLogprob(lead + word, log(s if word == "yes" else 1.0 - s),
                                tuple(sorted(top, key=lambda t: -t[1])))

        if style == "pointwise":
            return (label(scores[0], ""),)
        tokens: list[TokenLogprob] = []
        for i, s in enumerate(scores, start=1):
            tokens += [TokenLogprob(str(i), 0.0), TokenLogprob(":", 0.0), label(s, " ")]
            if i < len(scores):
                tokens.append(TokenLogprob("\n", 0.0))
        return tuple(tokens)


@dataclass
class CostModel:
    encoding: str
    fixed_ms: float
    prompt_ms: float
    completion_ms: float
    _counted: dict[str, int] = field(default_factory=dict, repr=False)

    def _tokens(self, text: str) -> int:
        n = self._counted.get(text)
        if n is None:
            from crag.llm.tokens import count_tokens

            n = self._counted[text] = count_tokens(text, self.encoding)
        return n

    def prompt_tokens(self, messages: Sequence[dict[str, str]]) -> int:
        return sum(3 + self._tokens(m["role"]) + self._tokens(m["content"]) for m in messages) + 3

    def completion_tokens(self, text: str) -> int:
        return self._tokens(text)

    def latency_ms(self, prompt: int, completion: int) -> float:
        return self.fixed_ms + self.prompt_ms * prompt + self.completion_ms * completion


@dataclass
class Meter:
    """Grading usage of one strategy on one workload."""

    gradings: int = 0  # grade_evidence visits that had context
    llm_gradings: int = 0  # ... of which made at least one LLM call
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, what the server took from its prefix cache
    completion_tokens: int = 0
    latency_ms: float = 0.0
    fast_path: Counter = field(default_factory=Counter)
    grades_reused: int = 0  # items whose remembered grade was used (grade memory on)
    items_graded: int = 0  # items an LLM read
    parse_failures: int = 0  # items that got the 0.5 default because a reply did not parse
    calls_replayed: int = 0  # real grader: replies taken from the record of an earlier run
    estimated_calls: int = 0  # real grader: calls whose token counts crag counted (the server reported none usable)
    scored: list = field(default_factory=list)  # (score, relevant) of every item an LLM graded
    # Where the prompt tokens go (tiktoken counts of the rendered prompts, whichever grader):
    header_tokens: int = 0  # instructions, question and reply format: paid once per call
    new_item_tokens: int = 0  # items an LLM reads for the first time in this question
    resent_item_tokens: int = 0  # items an LLM already graded in an earlier round, sent again

    def add(self, completion) -> None:
        self.calls += 1
        self.prompt_tokens += completion.prompt_tokens
        self.cached_tokens += completion.cached_tokens
        self.completion_tokens += completion.completion_tokens
        self.latency_ms += completion.latency_ms
        self.estimated_calls += completion.usage_estimated


class StrategyModel:
    """crag's ChatModel port: scripted replies for routing, planning and synthesis; the
    grader behind ``grade_evidence``, called the way ``strategy`` calls it.

    The grader is the simulated one (``grader`` + ``cost``: tiktoken counts and modelled
    latency) or, with ``real``, a real OpenAI-compatible server through crag's own adapter
    (``benchmarks.real_grader.RecordedGrader``: real replies, usage and wall time).
    """

    def __init__(self, strategy: str, grader: SimulatedGrader, cost: CostModel, meter: Meter, k: int,
                 real=None, label: dict | None = None) -> None:
        from crag.llm.scripted import ScriptedChatModel

        self.strategy = strategy
        self.grader = grader
        self.cost = cost
        self.meter = meter
        self.real = real
        self.label = label or {}
        self.seen_by_llm: set[tuple[str, str]] = set()  # (question, source) an LLM graded
        self.k = k
        self.model = real.model if real is not None else "simulated-grader"
        self._other = ScriptedChatModel(default={"synthesize": "The passages say so [1]."}, model=self.model)

    def complete(self, request, on_delta=None):
        from crag.state import Completion

        if request.node == "analyze_and_route":
            return Completion('{"complexity": "complex", "suggested_tools": ["vector_search"]}', self.model)
        if request.node == "plan":  # a keyword query, as planners write; crag searches the question too
            call = {"tool": "vector_search", "args": {"query": planner_query(request.task.question), "top_k": self.k}}
            return Completion(json.dumps({"tool_calls": [call]}), self.model)
        if request.node != "grade_evidence":
            self._other.requests.clear()
            return self._other.complete(request, on_delta)
        return self.grade(request)

    def _ask(self, request):
        """One grading call: the real server's reply, or the simulated grader's."""
        from crag.state import Completion

        if self.real is not None:
            completion = self.real.complete(request, {**self.label, "strategy": self.strategy})
            self.meter.calls_replayed += self.real.last_replayed
            return completion
        task = request.task
        scores = [self.grader.score(task.question, it.source) for it in task.items]
        text = self.grader.reply(scores, task.style)
        logprobs = self.grader.logprobs(scores, task.style) if request.logprobs and task.style != "scores" else None
        p = self.cost.prompt_tokens(request.messages)
        c = self.cost.completion_tokens(text)
        return Completion(text, self.model, prompt_tokens=p, completion_tokens=c, latency_ms=self.cost.latency_ms(p, c),
                          logprobs=logprobs)

    def _split(self, question: str, items, messages, style: str) -> None:
        """Meter where a grading's prompt tokens go: the fixed part of each call, the items read
        for the first time, and the items sent again (graded by an LLM in an earlier round),
        each rendered in the grading's own ``style`` (the ``scores`` instructions are its header)."""
        from crag import prompts
        from crag.ports import GradeTask

        tokens = self.cost.prompt_tokens
        seen = [(question, it.source) in self.seen_by_llm for it in items]
        if self.strategy == "per_item":
            for item, again in zip(items, seen):
                header = tokens(prompts.render(GradeTask(question=question, items=(), style="pointwise")))
                body = tokens(prompts.render(GradeTask(question=question, items=(item,), style="pointwise"))) - header
                self.meter.header_tokens += header
                if again:
                    self.meter.resent_item_tokens += body
                else:
                    self.meter.new_item_tokens += body
            return
        header = tokens(prompts.render(GradeTask(question=question, items=(), style=style)))
        fresh = tuple(it for it, again in zip(items, seen) if not again)
        new = tokens(prompts.render(GradeTask(question=question, items=fresh, style=style))) - header if fresh else 0
        self.meter.header_tokens += header
        self.meter.new_item_tokens += new
        self.meter.resent_item_tokens += tokens(messages) - header - new

    def grade(self, request):
        """One grading: the strategy's LLM calls, metered; the reply holds all N scores."""
        from crag.grading import PARSE_FAILURE_SCORE
        from crag.nodes import grade_evidence
        from crag.state import Completion

        task = request.task
        q, items = task.question, task.items
        meter = self.meter
        meter.llm_gradings += 1
        meter.items_graded += len(items)
        self._split(q, items, request.messages, task.style)
        self.seen_by_llm.update((q, it.source) for it in items)
        if self.strategy != "per_item":
            completion = self._ask(request)
            meter.add(completion)
            reading = grade_evidence.read_reply(completion, len(items), task.style)
            if reading is None:
                meter.parse_failures += len(items)
            else:
                self._score(q, items, reading.scores)
            return completion
        scores, p, c, ms = [], 0, 0, 0.0
        for it in items:  # one call per item, one after another, as the tutorial makes them
            completion = self._ask(single_item_request(q, it))
            meter.add(completion)
            reading = grade_evidence.read_reply(completion, 1, "pointwise")
            if reading is None:
                meter.parse_failures += 1
            else:
                self._score(q, (it,), reading.scores)
            scores.append(reading.scores[0] if reading else PARSE_FAILURE_SCORE)
            p, c, ms = p + completion.prompt_tokens, c + completion.completion_tokens, ms + completion.latency_ms
        return Completion(json.dumps(scores), self.model, prompt_tokens=p, completion_tokens=c, latency_ms=ms)

    def _score(self, question: str, items, scores) -> None:
        labels = self.grader.labels
        self.meter.scored += [(s, labels[(question, it.source)] >= 2) for it, s in zip(items, scores)
                              if (question, it.source) in labels]


def single_item_request(question: str, item):
    """The request crag's pointwise grader makes for this item (rules off): the per-item
    strategy sends exactly what crag would, parameters included."""
    from crag.config import Settings
    from crag.nodes import NodeConfig, grade_evidence
    from crag.state import AgentState

    state = AgentState(question=question, context=(item,), iteration=1)
    return grade_evidence.prepare(state, NodeConfig(Settings(**NO_RULES, grader="pointwise"))).request.requests[0]


def auc(scored) -> float | None:
    """The probability that a relevant item scores above an irrelevant one (ties count half)."""
    pos = sorted(s for s, y in scored if y)
    neg = sorted(s for s, y in scored if not y)
    if not pos or not neg:
        return None
    import bisect

    wins = sum(bisect.bisect_left(neg, p) + 0.5 * (bisect.bisect_right(neg, p) - bisect.bisect_left(neg, p))
               for p in pos)
    return wins / (len(pos) * len(neg))


def planner_query(question: str) -> str:
    """The planned search: the question's content words (a reformulation, not the question)."""
    from crag.text import content_words

    return " ".join(content_words(question)) or question


class TrecToolbox:
    """``vector_search`` returns the next ``k`` unseen candidates of the question, in BM25 order."""

    def __init__(self, query: Query, k: int) -> None:
        self.query = query
        self.k = k
        self.next = 0

    def tools(self):
        from crag.tools import builtin

        return builtin("vector_search")

    def run(self, call):
        items = [c.item for c in self.query.candidates[self.next : self.next + self.k]]
        self.next += len(items)
        return items


# --------------------------------------------------------------------------------------
# Running the strategies
# --------------------------------------------------------------------------------------


@dataclass
class Quality:
    relevant_retrieved: int = 0
    relevant_kept: int = 0
    irrelevant_retrieved: int = 0
    irrelevant_through: int = 0
    fast_path_false_approvals: int = 0
    fast_path_approved: int = 0
    no_evidence: int = 0
    actions: Counter = field(default_factory=Counter)
    rounds: int = 0
    retrieved_by_grade: Counter = field(default_factory=Counter)
    kept_by_grade: Counter = field(default_factory=Counter)
    questions_by_rounds: Counter = field(default_factory=Counter)  # retrieval rounds -> questions

    def add(self, retrieved: Iterable[Candidate], kept_sources: set[str]) -> None:
        for c in retrieved:
            kept = c.item.source in kept_sources
            self.retrieved_by_grade[c.grade] += 1
            self.kept_by_grade[c.grade] += kept
            if c.relevant:
                self.relevant_retrieved += 1
                self.relevant_kept += kept
            else:
                self.irrelevant_retrieved += 1
                self.irrelevant_through += kept


def node_config(strategy: str, k: int, threshold: float | None = None, simulated: bool = True):
    """crag's defaults (3 rounds, rules on), with the rules off for the strategies without them.
    The simulated grader's grades are decided by the seeds' rules (``KB_AGENT_GRADING_POLICY=seed``):
    its label replies carry the score as P(yes), and the default policy's rows for a real model's
    uninformative or undecided probabilities would read them otherwise than the numbers they are."""
    from crag.config import Settings
    from crag.nodes import NodeConfig

    extra: dict[str, Any] = {"grade_memory": strategy == "batch_rules_memory",
                             "grader": "scores" if strategy == "scores" else "batch"}
    if simulated:
        extra["grading_policy"] = "seed"
    if strategy in ("per_item", "batch", "scores"):
        extra.update(NO_RULES)
    elif threshold is not None:
        extra["vector_score_threshold"] = threshold
    from crag.tools import builtin

    return NodeConfig(Settings(max_iterations=3, top_k=k, **extra), tools=builtin("vector_search"))


def grade_once(strategy: str, query: Query, k: int, model, meter: Meter, quality: Quality, cfg=None) -> None:
    """The query's top-k through grade_evidence.prepare / apply, once."""
    from crag.nodes import grade_evidence
    from crag.state import AgentState, Complexity, RoutingPlan, ToolCall, ToolRun

    cfg = cfg or node_config(strategy, k)
    cands = query.candidates[:k]
    items = tuple(c.item for c in cands)
    call = ToolCall("vector_search", {"query": query.text, "top_k": k})
    state = AgentState(
        question=query.text,
        routing_plan=RoutingPlan(Complexity.COMPLEX, ("vector_search",)),
        iteration=1,
        context=items,
        tool_history=(ToolRun(1, call, items),),
        trace=("analyze_and_route", "plan", "tool_exec"),
    )
    meter.gradings += 1
    step = grade_evidence.prepare(state, cfg)
    request = step.request
    reply = model.complete(request) if request is not None else None
    after = grade_evidence.apply(state, step, reply, cfg)
    kept = {it.source for it in after.context}
    quality.add(cands, kept)
    quality.actions[after.grader_action.value] += 1
    quality.rounds += 1
    if request is None:
        rule = next(e.fields["rule_name"] for e in after.audit if e.event == "fast_path_hit")
        meter.fast_path[rule] += 1
        quality.fast_path_approved += len(cands)
        quality.fast_path_false_approvals += sum(not c.relevant for c in cands)
    if not after.context:
        quality.no_evidence += 1


def run_single_round(strategy: str, queries: list[Query], ks: Sequence[int], grader, cost, threshold=None):
    """Each query's top-k through grade_evidence.prepare / apply, once."""
    meter, quality = Meter(), Quality()
    for k in ks:
        cfg = node_config(strategy, k, threshold)
        for query in queries:
            model = StrategyModel(strategy, grader, cost, meter, k)
            grade_once(strategy, query, k, model, meter, quality, cfg)
    return meter, quality


def run_question(strategy: str, query: Query, k: int, model, meter: Meter, quality: Quality, cfg=None) -> None:
    """One question through crag's Driver, up to KB_AGENT_MAX_ITERATIONS=3 rounds."""
    from crag.driver import Driver

    cfg = cfg or node_config(strategy, k)
    toolbox = TrecToolbox(query, k)
    driver = Driver(model, toolbox, cfg, max_parallel_tools=1)
    state = driver.run(query.text)
    retrieved = query.candidates[: toolbox.next]
    kept = {it.source for it in state.context}
    quality.add(retrieved, kept)
    quality.rounds += state.iteration
    quality.questions_by_rounds[state.iteration] += 1
    quality.actions[state.grader_action.value if state.grader_action else "none"] += 1
    meter.gradings += state.trace.count("grade_evidence")
    meter.grades_reused += sum(e.fields["items"] for e in state.audit if e.event == "grades_reused")
    hits = [e for e in state.audit if e.event == "fast_path_hit"]
    for e in hits:
        meter.fast_path[e.fields["rule_name"]] += 1
    if hits:  # a rule hit means GENERATE: it was the question's last grading
        approved = [c for c in retrieved if c.item.source in kept]
        quality.fast_path_approved += len(approved)
        quality.fast_path_false_approvals += sum(
            not c.relevant and (query.text, c.item.source) not in model.seen_by_llm for c in approved
        )
    if not state.context:
        quality.no_evidence += 1


def run_rounds(strategy: str, queries: list[Query], ks: Sequence[int], grader, cost, threshold=None):
    """Whole questions through crag's Driver, up to KB_AGENT_MAX_ITERATIONS=3 rounds."""
    meter, quality = Meter(), Quality()
    for k in ks:
        cfg = node_config(strategy, k, threshold)
        for query in queries:
            model = StrategyModel(strategy, grader, cost, meter, k)
            run_question(strategy, query, k, model, meter, quality, cfg)
    return meter, quality


def summarise(strategy: str, meter: Meter, quality: Quality, prices: dict[str, tuple[float, float]], unit: int) -> dict:
    n = max(meter.gradings, 1) if unit == 0 else unit
    row = {
        "strategy": strategy,
        "units": unit,
        "gradings": meter.gradings,
        "llm_calls": meter.calls,
        "prompt_tokens": meter.prompt_tokens,
        "completion_tokens": meter.completion_tokens,
        "total_tokens": meter.prompt_tokens + meter.completion_tokens,
        "cached_tokens": meter.cached_tokens,
        "items_read_by_llm": meter.items_graded,
        "grades_reused": meter.grades_reused,
        "parse_failures": meter.parse_failures,
        "auc": auc(meter.scored),
        "items_scored": len(meter.scored),
        "calls_replayed": meter.calls_replayed,
        "estimated_calls": meter.estimated_calls,
        "prompt_split_tiktoken": {"header": meter.header_tokens, "new_items": meter.new_item_tokens,
                                  "resent_items": meter.resent_item_tokens},
        "questions_by_rounds": {str(r): n for r, n in sorted(quality.questions_by_rounds.items())},
        "fast_path_hits": dict(meter.fast_path),
        "latency_s": meter.latency_ms / 1000,
        "latency_s_per_unit": meter.latency_ms / 1000 / n,
        "calls_per_unit": meter.calls / n,
        "tokens_per_unit": (meter.prompt_tokens + meter.completion_tokens) / n,
        "usd": {name: (meter.prompt_tokens * pin + meter.completion_tokens * pout) / 1e6
                for name, (pin, pout) in prices.items()},
        "usd_per_1000_units": {name: 1000 / n * (meter.prompt_tokens * pin + meter.completion_tokens * pout) / 1e6
                               for name, (pin, pout) in prices.items()},
        "relevant_retrieved": quality.relevant_retrieved,
        "relevant_kept": quality.relevant_kept,
        "relevant_kept_pct": 100 * quality.relevant_kept / max(quality.relevant_retrieved, 1),
        "irrelevant_retrieved": quality.irrelevant_retrieved,
        "irrelevant_through": quality.irrelevant_through,
        "irrelevant_through_pct": 100 * quality.irrelevant_through / max(quality.irrelevant_retrieved, 1),
        "kept_pct_by_grade": {str(g): 100 * quality.kept_by_grade[g] / quality.retrieved_by_grade[g]
                              for g in sorted(quality.retrieved_by_grade)},
        "fast_path_approved": quality.fast_path_approved,
        "fast_path_false_approvals": quality.fast_path_false_approvals,
        "no_evidence_answers": quality.no_evidence,
        "actions": dict(quality.actions),
        "rounds": quality.rounds,
    }
    return row


def run(args) -> dict[str, Any]:
    queries = load_queries(args.data, args.queries)
    labels = {(q.text, c.item.source): c.grade for q in queries for c in q.candidates}
    grader = SimulatedGrader(labels, args.means, args.noise, args.seed)
    cost = CostModel(args.encoding, args.latency_fixed_ms, args.latency_prompt_ms, args.latency_completion_ms)
    n_single = len(queries) * len(args.ks)
    workloads: dict[str, list[dict]] = {"single_round": [], "rounds": []}
    by_k: dict[str, dict[str, list[dict]]] = {"single_round": {}, "rounds": {}}
    for strategy in args.strategies:
        meter, quality = run_single_round(strategy, queries, args.ks, grader, cost)
        workloads["single_round"].append(summarise(strategy, meter, quality, args.prices, n_single))
        meter, quality = run_rounds(strategy, queries, args.ks, grader, cost)
        workloads["rounds"].append(summarise(strategy, meter, quality, args.prices, n_single))
        if len(args.ks) > 1:
            for k in args.ks:
                for workload, fn in (("single_round", run_single_round), ("rounds", run_rounds)):
                    meter, quality = fn(strategy, queries, [k], grader, cost)
                    by_k[workload].setdefault(str(k), []).append(
                        summarise(strategy, meter, quality, args.prices, len(queries)))
        if args.verbose:
            s, r = workloads["single_round"][-1], workloads["rounds"][-1]
            print(f"  grading_cost: {strategy:18s} single: {s['llm_calls']:5d} calls {s['total_tokens']:8,d} tokens   "
                  f"3 rounds: {r['llm_calls']:5d} calls {r['total_tokens']:8,d} tokens", flush=True)
    sweep = []
    if args.sweep and "batch" in args.strategies:
        batch = next(r for r in workloads["single_round"] if r["strategy"] == "batch")
        for t in args.sweep:
            meter, quality = run_single_round("batch_rules", queries, args.ks, grader, cost, threshold=t)
            row = summarise("batch_rules", meter, quality, args.prices, n_single)
            sweep.append({
                "threshold": t,
                "high_vector_score_hits": row["fast_path_hits"].get("high_vector_score", 0),
                "gradings": row["gradings"],
                "tokens_saved_vs_batch_pct": 100 * (1 - row["total_tokens"] / max(batch["total_tokens"], 1)),
                "fast_path_false_approvals": row["fast_path_false_approvals"],
                "irrelevant_through_pct": row["irrelevant_through_pct"],
                "irrelevant_through_pts_vs_batch": row["irrelevant_through_pct"] - batch["irrelevant_through_pct"],
                "relevant_kept_pct": row["relevant_kept_pct"],
            })
    few = []
    for k in args.few_context_ks:
        rows = {}
        for strategy in ("batch", "batch_rules"):
            meter, quality = run_single_round(strategy, queries, [k], grader, cost)
            rows[strategy] = summarise(strategy, meter, quality, args.prices, len(queries))
        b, d = rows["batch"], rows["batch_rules"]
        few.append({
            "k": k,
            "few_context_hits": d["fast_path_hits"].get("few_context", 0),
            "gradings": d["gradings"],
            "tokens_saved_vs_batch_pct": 100 * (1 - d["total_tokens"] / max(b["total_tokens"], 1)),
            "irrelevant_retrieved": d["irrelevant_retrieved"],
            "fast_path_false_approvals": d["fast_path_false_approvals"],
            "irrelevant_through_pct": d["irrelevant_through_pct"],
            "irrelevant_through_pts_vs_batch": d["irrelevant_through_pct"] - b["irrelevant_through_pct"],
        })
    result = {
        "benchmark": NAME,
        "args": {
            "data": _display_path(args.data),
            "queries": len(queries),
            "pairs": sum(len(q.candidates) for q in queries),
            "ks": list(args.ks),
            "strategies": list(args.strategies),
            "default_strategy": DEFAULT_STRATEGY,
            "grader_means": {str(g): m for g, m in args.means.items()},
            "grader_noise_sd": args.noise,
            "seed": args.seed,
            "encoding": args.encoding,
            "latency_model_ms": {"fixed": args.latency_fixed_ms, "per_prompt_token": args.latency_prompt_ms,
                                 "per_completion_token": args.latency_completion_ms},
            "prices_usd_per_million": {n: {"input": p[0], "output": p[1]} for n, p in args.prices.items()},
            "retrieval_score": "crag HashEmbedder cosine(query, passage), clipped to [0, 1]",
            "crag_thresholds": {"auto_approve_max_items": 2, "vector_score_threshold": 0.8, "drop": 0.3,
                                "generate": 0.7, "max_iterations": 3},
        },
        "environment": environment(["crag", "tiktoken"]),
        "retrieval_score_stats": _score_stats(queries),
        "workloads": workloads,
        "by_k": by_k,
        "threshold_sweep": sweep,
        "few_context": few,
    }
    result["headline"] = headline(result)
    return result


def _display_path(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO.parent))
    except ValueError:
        return str(path)


def _score_stats(queries: list[Query]) -> dict[str, Any]:
    from benchmarks.common import percentile

    out = {}
    for label, pick in (("relevant", True), ("irrelevant", False)):
        xs = [c.item.score for q in queries for c in q.candidates if c.relevant is pick]
        out[label] = {"n": len(xs), "p5": percentile(xs, 5), "p50": percentile(xs, 50), "p95": percentile(xs, 95),
                      "max": max(xs) if xs else None}
    return out


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, checked for the default strategy and for every strategy."""
    out: dict[str, Any] = {"targets": {"calls_vs_per_item": 5.0, "tokens_saved_vs_batch_pct": 25.0,
                                       "extra_irrelevant_pts_vs_batch": 2.0}}
    for workload, rows in result["workloads"].items():
        by = {r["strategy"]: r for r in rows}
        if "per_item" not in by or "batch" not in by:
            continue
        per_item, batch = by["per_item"], by["batch"]
        verdicts = {}
        for name, r in by.items():
            calls_ratio = per_item["llm_calls"] / r["llm_calls"] if r["llm_calls"] else math.inf
            saved = 100 * (1 - r["total_tokens"] / batch["total_tokens"]) if batch["total_tokens"] else 0.0
            extra = r["irrelevant_through_pct"] - batch["irrelevant_through_pct"]
            verdicts[name] = {
                "calls_ratio_vs_per_item": calls_ratio,
                "tokens_saved_vs_batch_pct": saved,
                "extra_irrelevant_pts_vs_batch": extra,
                "relevant_kept_pts_vs_batch": r["relevant_kept_pct"] - batch["relevant_kept_pct"],
                "meets_calls": calls_ratio >= 5.0,
                "meets_tokens": saved >= 25.0,
                "meets_quality": extra <= 2.0,
            }
            verdicts[name]["meets_all"] = all(verdicts[name][k] for k in ("meets_calls", "meets_tokens", "meets_quality"))
        out[workload] = verdicts
    return out


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------

WORKLOAD_TITLES = {
    "single_round": "Single round: each query's top-k graded once ({n:,} gradings)",
    "rounds": "Whole questions, up to 3 retrieval rounds through crag's driver ({n:,} questions)",
}


def render_markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    price_names = list(a["prices_usd_per_million"])
    out = [(
        f"{a['queries']} TREC DL queries × k ∈ {{{', '.join(map(str, a['ks']))}}} ({a['pairs']:,} judged passages); "
        f"simulated grader: mean score by grade "
        f"{', '.join(f'{g}→{m:g}' for g, m in a['grader_means'].items())}, noise sd {a['grader_noise_sd']}, "
        f"seed {a['seed']}; "
        f"tokens: tiktoken {a['encoding']}; latency: {a['latency_model_ms']['fixed']:g} ms + "
        f"{a['latency_model_ms']['per_prompt_token']:g} ms/prompt token + "
        f"{a['latency_model_ms']['per_completion_token']:g} ms/completion token per call.\n"
    )]
    for workload, rows in result["workloads"].items():
        unit = "grading" if workload == "single_round" else "question"
        n = rows[0]["units"] if rows else 0
        out.append(f"\n**{WORKLOAD_TITLES[workload].format(n=n)}**\n\n")
        headers = ["strategy", "LLM calls", "prompt tokens", "completion tokens", f"latency s / {unit}",
                   *[f"$ / 1k {unit}s ({p})" for p in price_names],
                   "relevant kept", "irrelevant through", "AUC (items an LLM graded)", "fast-path false approvals"]
        table = []
        for r in rows:
            table.append([
                f"`{r['strategy']}`" + (" (default)" if r["strategy"] == a["default_strategy"] else ""),
                fmt(r["llm_calls"]), fmt(r["prompt_tokens"]), fmt(r["completion_tokens"]),
                fmt(r["latency_s_per_unit"], 2),
                *[fmt(r["usd_per_1000_units"][p], 3) for p in price_names],
                f"{r['relevant_kept_pct']:.1f}% ({r['relevant_kept']:,}/{r['relevant_retrieved']:,})",
                f"{r['irrelevant_through_pct']:.1f}% ({r['irrelevant_through']:,}/{r['irrelevant_retrieved']:,})",
                "–" if r.get("auc") is None else f"{r['auc']:.3f} ({r['items_scored']:,})",
                fmt(r["fast_path_false_approvals"]),
            ])
        out.append(markdown_table(headers, table))
        default = next((r for r in rows if r["strategy"] == a["default_strategy"]), None)
        if default:
            out.append(
                f"\nPassages kept, by expert grade (`{a['default_strategy']}`): "
                + ", ".join(f"grade {g} {p:.1f}%" for g, p in sorted(default["kept_pct_by_grade"].items(),
                                                                    reverse=True))
                + ". Final actions: "
                + ", ".join(f"{k} {v:,}" for k, v in sorted(default["actions"].items())) + ".\n"
            )
        verdicts = result["headline"].get(workload, {})
        if verdicts:
            out.append("\nAgainst the targets (vs `per_item` calls, vs `batch` tokens and irrelevant passages):\n\n")
            vt = []
            for name, v in verdicts.items():
                vt.append([
                    f"`{name}`", f"{v['calls_ratio_vs_per_item']:.1f}× {'✓' if v['meets_calls'] else '✗'}",
                    f"{v['tokens_saved_vs_batch_pct']:.1f}% {'✓' if v['meets_tokens'] else '✗'}",
                    f"{v['extra_irrelevant_pts_vs_batch']:+.1f} pts {'✓' if v['meets_quality'] else '✗'}",
                    f"{v['relevant_kept_pts_vs_batch']:+.1f} pts",
                ])
            out.append(markdown_table(
                ["strategy", "fewer calls than per_item (≥ 5×)", "fewer tokens than batch (≥ 25%)",
                 "more irrelevant than batch (≤ +2)", "relevant kept vs batch"], vt, "lrrrr"))
    by_k = result.get("by_k") or {}
    if by_k.get("single_round") and by_k.get("rounds"):
        out.append("\n**By k** (calls and tokens per grading in a single round, per question over up to 3 rounds):\n\n")
        table = []
        for k, rows in by_k["single_round"].items():
            one = {r["strategy"]: r for r in rows}
            multi = {r["strategy"]: r for r in by_k["rounds"].get(k, [])}
            cells = [k]
            for src in (one, multi):
                pi, b, d = src.get("per_item"), src.get("batch"), src.get(DEFAULT_STRATEGY)
                cached = src.get("batch_rules_memory")
                cells += [
                    fmt(pi["calls_per_unit"], 1) if pi else "–",
                    fmt(d["calls_per_unit"], 2) if d else "–",
                    fmt(b["tokens_per_unit"], 0) if b else "–",
                    fmt(d["tokens_per_unit"], 0) if d else "–",
                    fmt(cached["tokens_per_unit"], 0) if cached else "–",
                ]
            table.append(cells)
        out.append(markdown_table(
            ["k", "per_item calls", "default calls", "batch tokens", "default tokens", "memory tokens",
             "per_item calls / q", "default calls / q", "batch tokens / q", "default tokens / q",
             "memory tokens / q"], table))
    out.append(render_split(result))
    sweep = result.get("threshold_sweep") or []
    if sweep:
        out.append("\n**`high_vector_score` threshold sweep** (single round, `batch_rules`; the score is crag's "
                   "hash-embedder cosine):\n\n")
        out.append(markdown_table(
            ["threshold", "rule hits", "tokens saved vs batch", "false approvals", "irrelevant through",
             "vs batch", "relevant kept"],
            [[f"{s['threshold']:g}", f"{s['high_vector_score_hits']:,} / {s['gradings']:,}",
              f"{s['tokens_saved_vs_batch_pct']:.1f}%", fmt(s["fast_path_false_approvals"]),
              f"{s['irrelevant_through_pct']:.1f}%", f"{s['irrelevant_through_pts_vs_batch']:+.1f} pts",
              f"{s['relevant_kept_pct']:.1f}%"] for s in sweep],
        ))
    few = result.get("few_context") or []
    if few:
        out.append("\n**`few_context` rule at small k** (single round, `batch_rules` vs `batch`: lists of at most "
                   "`KB_AGENT_AUTO_APPROVE_MAX_ITEMS` = 2 items are approved unread):\n\n")
        out.append(markdown_table(
            ["k", "rule hits", "tokens saved vs batch", "false approvals", "irrelevant through", "vs batch"],
            [[str(f["k"]), f"{f['few_context_hits']:,} / {f['gradings']:,}", f"{f['tokens_saved_vs_batch_pct']:.1f}%",
              f"{f['fast_path_false_approvals']:,} of {f['irrelevant_retrieved']:,}",
              f"{f['irrelevant_through_pct']:.1f}%", f"{f['irrelevant_through_pts_vs_batch']:+.1f} pts"] for f in few],
        ))
    st = result["retrieval_score_stats"]
    out.append(
        f"\nRetrieval scores (hash-embedder cosine): relevant passages p50 {st['relevant']['p50']:.2f} "
        f"(p95 {st['relevant']['p95']:.2f}), irrelevant p50 {st['irrelevant']['p50']:.2f} "
        f"(p95 {st['irrelevant']['p95']:.2f}); highest of all {max(st['relevant']['max'] or 0, st['irrelevant']['max'] or 0):.2f}.\n"
    )
    return "".join(out)


def render_split(result: dict[str, Any]) -> str:
    """Where each strategy's grading tokens go over whole questions: what grade memory can save."""
    rows = [r for r in result["workloads"].get("rounds", []) if r.get("prompt_split_tiktoken")]
    if not rows:
        return ""
    def share(n: int, total: int) -> str:
        return f"{n:,} ({100 * n / max(total, 1):.0f}%)"

    table = []
    for r in rows:
        split, total = r["prompt_split_tiktoken"], r["total_tokens"]
        table.append([f"`{r['strategy']}`", fmt(r["llm_calls"]), share(split["header"], total),
                      share(split["new_items"], total), share(split["resent_items"], total),
                      share(r["completion_tokens"], total),
                      " / ".join(str(r["questions_by_rounds"].get(str(n), 0)) for n in (1, 2, 3))])
    out = ["\n**Where the grading tokens go** (whole questions; prompt split by tiktoken counts of the rendered "
           "prompts; share of the strategy's prompt + completion tokens):\n\n",
           markdown_table(["strategy", "LLM calls", "instructions + question (once per call)", "items read first time",
                           "items sent again", "completion", "questions with 1 / 2 / 3 rounds"], table)]
    by = {r["strategy"]: r for r in rows}
    if "batch" in by:
        b = by["batch"]
        ceiling = 100 * b["prompt_split_tiktoken"]["resent_items"] / max(b["total_tokens"], 1)
        one = b["questions_by_rounds"].get("1", 0)
        out.append(f"\nWhat `batch` sends again (survivors re-graded in later rounds) is {ceiling:.1f}% of its "
                   "tokens; with their scores in the reply, that is all that grading each item once can save. "
                   "The rest is read once by any strategy (each item, and its score) or paid once per call (the "
                   f"instructions and the question), and {one:,} of {b['units']:,} questions end after one round, "
                   "where there is nothing to re-grade.\n")
    return "".join(out)


def render_chart(result: dict[str, Any], path: Path) -> Path | None:
    """Six panels: cost (calls, tokens, latency, dollars), quality, and the cost/quality trade-off."""
    plt = load_pyplot()
    if plt is None:
        return None
    workloads = list(result["workloads"])
    wl_label = {"single_round": "single round\n(per grading)", "rounds": "up to 3 rounds\n(per question)"}
    strategies = [r["strategy"] for r in result["workloads"][workloads[0]]]
    colours = {"per_item": "#d62728", "batch": "#ff7f0e", "scores": "#9467bd", "batch_rules": "#1f77b4", "batch_rules_memory": "#2ca02c"}
    price = next(iter(result["args"]["prices_usd_per_million"]))
    get = {w: {r["strategy"]: r for r in rows} for w, rows in result["workloads"].items()}
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    width = 0.8 / max(len(strategies), 1)
    panels = [
        (axes[0, 0], lambda r: r["calls_per_unit"], "LLM grading calls", "{:.1f}"),
        (axes[0, 1], lambda r: r["tokens_per_unit"], "Grading tokens (prompt + completion)", "{:,.0f}"),
        (axes[0, 2], lambda r: r["latency_s_per_unit"], "Simulated grading latency (s)", "{:.1f}"),
        (axes[1, 0], lambda r: r["usd_per_1000_units"][price], f"$ per 1,000 ({price})", "{:.3f}"),
    ]
    for ax, value, title, label in panels:
        for i, s in enumerate(strategies):
            vals = [value(get[w][s]) for w in workloads]
            xs = [j + (i - (len(strategies) - 1) / 2) * width for j in range(len(workloads))]
            bars = ax.bar(xs, vals, width, color=colours.get(s), label=s)
            for b, v in zip(bars, vals):
                ax.text(b.get_x() + b.get_width() / 2, v, label.format(v), ha="center", va="bottom", fontsize=7)
        ax.set(xticks=range(len(workloads)), xticklabels=[wl_label[w] for w in workloads], title=title)
        ax.margins(y=0.12)
        ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1, 1]
    rounds = get["rounds"]
    metrics = [
        ("relevant kept", lambda r: r["relevant_kept_pct"], "#2ca02c"),
        ("grade 1 (related) through", lambda r: r["kept_pct_by_grade"].get("1", 0.0), "#ff7f0e"),
        ("grade 0 (unrelated) through", lambda r: r["kept_pct_by_grade"].get("0", 0.0), "#d62728"),
        ("fast-path false approvals\n(% of irrelevant)",
         lambda r: 100 * r["fast_path_false_approvals"] / max(r["irrelevant_retrieved"], 1), "#9467bd"),
    ]
    w2 = 0.8 / len(metrics)
    for i, (name, value, colour) in enumerate(metrics):
        vals = [value(rounds[s]) for s in strategies]
        xs = [j + (i - (len(metrics) - 1) / 2) * w2 for j in range(len(strategies))]
        bars = ax.bar(xs, vals, w2, color=colour, label=name)
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set(xticks=range(len(strategies)), xticklabels=[s.replace("_", "_\n", 1) for s in strategies],
           ylabel="% of retrieved passages of that kind", ylim=(0, 140),
           title="Decision quality vs expert labels (up to 3 rounds)")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1, 2]
    h = result.get("headline", {})
    tgt = h.get("targets", {})
    ax.fill_between([tgt.get("tokens_saved_vs_batch_pct", 25), 100], -100, tgt.get("extra_irrelevant_pts_vs_batch", 2),
                    color="#2ca02c", alpha=0.08)
    ax.axhline(tgt.get("extra_irrelevant_pts_vs_batch", 2), color="#2ca02c", ls="--", lw=1)
    ax.axvline(tgt.get("tokens_saved_vs_batch_pct", 25), color="#2ca02c", ls="--", lw=1)
    ax.text(tgt.get("tokens_saved_vs_batch_pct", 25) + 1, tgt.get("extra_irrelevant_pts_vs_batch", 2) - 0.3,
            "target: ≥ 25% fewer tokens,\n≤ +2 pts irrelevant", fontsize=7, color="#2ca02c", va="top")
    sweep = result.get("threshold_sweep") or []
    if sweep:
        xs = [sw["tokens_saved_vs_batch_pct"] for sw in sweep]
        ys = [sw["irrelevant_through_pts_vs_batch"] for sw in sweep]
        ax.plot(xs, ys, "-o", color="#7f7f7f", ms=3, lw=1, label="batch_rules, lower vector threshold")
        for sw, x, y in zip(sweep, xs, ys):
            ax.annotate(f"{sw['threshold']:g}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points",
                        color="#555")
    for w, marker in (("single_round", "s"), ("rounds", "o")):
        for s, v in h.get(w, {}).items():
            if s == "per_item":
                continue
            ax.scatter(v["tokens_saved_vs_batch_pct"], v["extra_irrelevant_pts_vs_batch"], s=70, marker=marker,
                       color=colours.get(s), edgecolors="black", linewidths=0.5, zorder=3,
                       label=f"{s} ({'single round' if w == 'single_round' else 'up to 3 rounds'})")
    ax.set(xlabel="grading tokens saved vs batch (%)", ylabel="irrelevant passages let through vs batch (pts)",
           title="Savings vs what gets through", xlim=(-5, 60),
           ylim=(-1.5, max([2.5] + [sw["irrelevant_through_pts_vs_batch"] + 1 for sw in sweep])))
    ax.legend(fontsize=6, loc="upper left")
    ax.grid(True, alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(strategies), fontsize=9, bbox_to_anchor=(0.5, 0.965))
    a = result["args"]
    fig.suptitle(f"Grading cost: {a['queries']} TREC DL queries, k in {a['ks']} "
                 f"(simulated grader, real crag prompts and decisions)", y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def _price(text: str) -> tuple[str, tuple[float, float]]:
    try:
        name, rest = text.split("=", 1)
        pin, pout = rest.split("/", 1)
        return name.strip(), (float(pin), float(pout))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=INPUT/OUTPUT (USD per million tokens), got {text!r}") from None


def _means(text: str) -> dict[int, float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("expected four numbers for grades 0,1,2,3") from None
    if len(values) != 4 or not all(0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError("expected four numbers in [0, 1] for grades 0,1,2,3")
    return dict(enumerate(values))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.grading_cost", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="judged_pairs.jsonl (default: %(default)s)")
    # 0 is refused: it was read as "no limit" and ran them all
    p.add_argument("--queries", type=at_least(1), default=None, help="use only the first N queries (default: all)")
    p.add_argument("--ks", type=counts(1), default="3,5,10", help="candidate list sizes (default: %(default)s)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated (default: %(default)s)")
    p.add_argument("--noise", type=non_negative, default=0.15, help="grader noise sd (default: %(default)s)")
    p.add_argument("--means", type=_means, default=DEFAULT_MEANS,
                   help="grader mean score for grades 0,1,2,3 (default: 0.05,0.45,0.8,0.95)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--encoding", default="o200k_base", help="tiktoken encoding (default: %(default)s)")
    p.add_argument("--latency-fixed-ms", type=non_negative, default=350.0)
    p.add_argument("--latency-prompt-ms", type=non_negative, default=0.2, help="ms per prompt token (default: %(default)s)")
    p.add_argument("--latency-completion-ms", type=non_negative, default=15.0,
                   help="ms per completion token (default: %(default)s)")
    p.add_argument("--price", action="append", type=_price, metavar="NAME=IN/OUT",
                   help="USD per million input/output tokens, repeatable (default: gpt-4o-mini=0.15/0.60, "
                        "gpt-4o=2.50/10.00)")
    p.add_argument("--sweep", type=fractions, default=",".join(f"{t:g}" for t in SWEEP_THRESHOLDS),
                   help="high_vector_score thresholds to sweep, '' for none (default: %(default)s)")
    p.add_argument("--few-context-ks", type=counts(1), default="1,2",
                   help="small k at which the few_context rule is checked, '' for none (default: %(default)s)")
    real = p.add_argument_group("real grader (benchmarks/real_grader.py)")
    real.add_argument("--base-url", help="an OpenAI-compatible server: grade with its model instead of the simulated "
                                         "grader (writes grading_cost_real.*)")
    real.add_argument("--model", default="local", help="model name sent to the server (default: %(default)s)")
    real.add_argument("--sample", type=at_least(1), default=3, help="evenly spaced TREC DL queries (default: %(default)s)")
    real.add_argument("--workload", choices=("rounds", "single"), default="rounds",
                      help="rounds: whole questions, up to 3 rounds; single: each query's top-k graded once "
                           "(default: %(default)s)")
    real.add_argument("--qids", default="", help="comma-separated TREC query ids instead of --sample")
    real.add_argument("--record", type=record_file,
                      help="append-only JSONL of replies; a later run resumes from it "
                           "(default: grading_cost_real.jsonl under --out)")
    real.add_argument("--timeout", type=llm_timeout, default=900.0, help="seconds per request (default: %(default)s)")
    p.add_argument("--out", type=out_dir, default=RESULTS_DIR)
    p.add_argument("--quiet", dest="verbose", action="store_false")
    args = p.parse_args(argv)
    if not args.ks:
        p.error("--ks needs at least one candidate list size")
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not args.strategies:
        p.error("--strategies needs at least one strategy")
    unknown = set(args.strategies) - set(STRATEGIES)
    if unknown:
        p.error(f"unknown strategy: {', '.join(sorted(unknown))} (choose from {', '.join(STRATEGIES)})")
    args.prices = dict(args.price or [_price(x) for x in DEFAULT_PRICES])
    args.checkpoint = None
    args.qids = [q.strip() for q in args.qids.split(",") if q.strip()]
    args.record = args.record or args.out / "grading_cost_real.jsonl"
    if not Path(args.data).exists():
        p.error(f"no such file: {args.data} (the TREC DL judged pairs; --data says where, CRAG_SHARED=DIR for the "
                "shared data)")
    if args.base_url is not None and not args.base_url.startswith(("http://", "https://")):
        p.error(f"--base-url must be an http:// or https:// URL, got {args.base_url!r}")
    import tiktoken

    if args.encoding not in tiktoken.list_encoding_names():
        p.error(f"unknown tiktoken encoding {args.encoding!r} (choose from {', '.join(tiktoken.list_encoding_names())})")
    if args.sample < 1:
        p.error("--sample must be at least 1")
    return args


# --------------------------------------------------------------------------------------
# With a real grader (--base-url): benchmarks/real_grader.py records its replies
# --------------------------------------------------------------------------------------


def sample_queries(queries: Sequence, n: int) -> list:
    """``n`` queries evenly spaced over the list (deterministic; a larger n keeps the smaller one's
    queries only when it is a multiple of it)."""
    if n >= len(queries):
        return list(queries)
    step = len(queries) / n
    return [queries[int(i * step)] for i in range(n)]


def run_real(args) -> dict[str, Any]:
    """The simulated benchmark's workload with a real grader beside the simulated one (``--base-url``)."""
    import copy

    from benchmarks.real_grader import ORDER, RecordedGrader, Unreachable

    everything = load_queries(args.data)
    if args.qids:
        by_id = {q.qid: q for q in everything}
        missing = [q for q in args.qids if q not in by_id]
        if missing:
            raise ValueError(f"no such query id in {args.data}: {', '.join(missing)}")
        queries = [by_id[q] for q in args.qids]
    else:
        queries = sample_queries(everything, args.sample)
        if args.sample > len(queries):
            print(f"grading_cost: --sample {args.sample}: the data holds {len(queries)} queries, all of them run",
                  file=sys.stderr)
    labels = {(q.text, c.item.source): c.grade for q in queries for c in q.candidates}
    simulated = SimulatedGrader(labels, args.means, args.noise, args.seed)
    cost = CostModel(args.encoding, args.latency_fixed_ms, args.latency_prompt_ms, args.latency_completion_ms)
    real = RecordedGrader(args.base_url, args.model, args.record, args.timeout, args.verbose)
    strategies = [s for s in ORDER if s in args.strategies]
    acc = {(kind, s): (Meter(), Quality()) for kind in ("real", "simulated") for s in strategies}
    done: list[str] = []
    failed: list[str] = []  # questions left out: a request of theirs failed
    started = time.perf_counter()
    run = grade_once if args.workload == "single" else run_question
    for k in args.ks:
        for query in queries:
            before, errors = copy.deepcopy(acc), real.errors
            try:
                for strategy in strategies:
                    for kind in ("real", "simulated"):
                        meter, quality = acc[(kind, strategy)]
                        model = StrategyModel(strategy, simulated, cost, meter, k,
                                              real=real if kind == "real" else None,
                                              label={"qid": query.qid, "k": k})
                        run(strategy, query, k, model, meter, quality,
                            node_config(strategy, k, simulated=kind == "simulated"))
            except Unreachable:  # nothing of this run reached the server: stop at once
                acc.update(before)
                failed.append(f"{query.qid}@k{k}")
                return summary_real(args, queries, acc, strategies, done, real, time.perf_counter() - started,
                                    failed)
            if real.errors > errors:  # counted only whole: its failed requests were no grades
                acc.update(before)
                failed.append(f"{query.qid}@k{k}")
            else:
                done.append(f"{query.qid}@k{k}")
            result = summary_real(args, queries, acc, strategies, done, real, time.perf_counter() - started, failed)
            if args.verbose:
                print(f"  grading_cost (real): {len(done)} of {len(queries) * len(args.ks)} questions done"
                      + (f", {len(failed)} left out (a request failed)" if failed else ""), flush=True)
            if args.checkpoint is not None:
                args.checkpoint(result)
    return summary_real(args, queries, acc, strategies, done, real, time.perf_counter() - started, failed)


def summary_real(args, queries, acc, strategies, done, real, elapsed_s, failed=()) -> dict[str, Any]:
    from benchmarks.real_grader import verdict

    rows = {kind: [summarise(s, *acc[(kind, s)], args.prices, len(done)) for s in strategies]
            for kind in ("real", "simulated")}
    return {
        "args": {"base_url": args.base_url, "model": args.model, "sample": len(queries),
                 "qids": args.qids, "ks": args.ks, "workload": args.workload,
                 "strategies": strategies, "record": str(args.record), "timeout_s": args.timeout,
                 "data": str(args.data), "noise": args.noise, "seed": args.seed},
        "questions_done": list(done),
        "questions_failed": list(failed),
        "requests_sent": real.sent,
        "requests_replayed": real.replayed,
        "request_errors": real.errors,
        "first_error": real.first_error,
        "elapsed_s": elapsed_s,
        "rows": rows,
        "memory_vs_batch": {kind: verdict(rows[kind]) for kind in rows},
    }


def every_request_failed(result: dict[str, Any]) -> bool:
    """Whether a real-grader run (so far) got no reply at all, sent or replayed: its report
    would be every strategy's parse failures, and would overwrite one that measured something."""
    return bool(result["request_errors"]) and not result["requests_sent"] and not result["requests_replayed"]


def further(earlier: Path, result: dict[str, Any]) -> bool:
    """Whether the report at ``earlier`` measured the same thing (model, questions, k, workload,
    strategies: the server's address, record and timeout aside) and got further than
    ``result``: a run in progress does not replace it with less."""
    aside = ("base_url", "record", "timeout_s")
    try:
        old = json.loads(earlier.read_text())
        same = ({k: v for k, v in old["args"].items() if k not in aside}
                == {k: v for k, v in result["args"].items() if k not in aside})
        return same and len(old["questions_done"]) > len(result["questions_done"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.base_url:
        from benchmarks import real_grader

        name = real_grader.NAME + ("_single" if args.workload == "single" else "")

        def checkpoint(result: dict[str, Any]) -> None:  # a report after every question, while none failed
            if not result["request_errors"] and not further(args.out / f"{name}.json", result):
                write_report(name, result, args.out, real_grader.render_markdown, lambda r, p: p, False)

        args.checkpoint = checkpoint
        result = run_real(args)
        if every_request_failed(result):  # the earlier report is kept: this run measured nothing
            raise SystemExit(f"python -m benchmarks.grading_cost: error: every request failed, the first with: "
                             f"{result['first_error']}")
        if result["request_errors"]:  # an earlier report is kept; this one counts the questions finished
            name += real_grader.INCOMPLETE
            done = len(result["questions_done"])
            if done:
                write_report(name, result, args.out, real_grader.render_markdown, real_grader.render_chart,
                             args.verbose)
            raise SystemExit(
                f"python -m benchmarks.grading_cost: error: {result['request_errors']} request(s) failed, the first "
                f"with: {result['first_error']}; "
                + (f"the {done} question(s) whose requests all got replies are reported in "
                   f"{args.out / (name + '.md')}" if done else "no question got a reply to every request")
                + f" (run it again to send only what {Path(args.record).name} lacks)")
        write_report(name, result, args.out, real_grader.render_markdown, real_grader.render_chart, args.verbose)
        return result
    return write_report(NAME, run(args), args.out, render_markdown, render_chart, args.verbose)


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.grading_cost"))
