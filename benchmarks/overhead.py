"""State-machine overhead: what crag's driver costs per question when the LLM and the tools
cost nothing, compared with the same graph run by LangGraph; and how fast crag starts.

Three measurements, all in one run so that the figures are comparable as ratios:

1. Orchestration only. The five nodes are trivial (``TRIVIAL_NODES``: each ``prepare``
   returns a constant request or None, each ``apply`` sets the one field routing needs), the
   model returns a constant reply and the toolbox a constant list. The same node functions
   and the same conditional edges (built from ``crag.graph.TRANSITIONS`` and
   ``crag.graph.outcome``) run under

   * ``plain loop``: a ``while`` loop over a dict of functions and a dict state, the floor
     any orchestration is measured against;
   * ``crag driver``: ``crag.driver.Driver`` itself (its ``NODES`` table swapped for the
     trivial nodes for the duration of the measurement), with its trace and usage
     bookkeeping;
   * ``langgraph``: a compiled ``langgraph.graph.StateGraph`` with the same five nodes and
     conditional edges, whose nodes do the same prepare / model / apply / bookkeeping.

2. Per question with crag's real nodes: prompt rendering, reply parsing, grading, answer
   composition, an instant ``ScriptedChatModel`` and an instant toolbox, run by crag's
   driver and by the same LangGraph graph wrapping the same node functions. ``node work``
   is the same sequence of prepare / complete / apply calls replayed without any
   orchestration; ``overhead = total - node work``. Both runners must end in the same
   state (checked), so they ran the same questions the same way.

3. Start-up: ``python -m crag --help`` (median of ``--startup-runs`` subprocesses, next to
   the bare interpreter), the cost of importing each heavy library, and which of
   openai / faiss / numpy / tiktoken are loaded before the first LLM request, both for the
   embedded library (an ``Agent`` with a scripted model) and for ``python -m crag ask``
   with the openai backend (the first ``socket.connect``, seen by an audit hook, is the
   first LLM request; it goes to a closed port on 127.0.0.1, so nothing leaves the
   machine).

Paths: ``chitchat`` (analyze, synthesize), ``simple`` (analyze, plan, tool_exec,
synthesize) and ``complex`` (analyze, plan, tool_exec, grade_evidence, synthesize: one
round, graded by the LLM). Each runner is timed with ``time.perf_counter_ns`` over
``--runs`` questions per path after ``--warmup`` questions, the runners of one path in
alternating blocks (``--blocks``) so that they share whatever else the machine is doing; the
tables give the median (and p95) per question. When crag's driver misses the target ratio, the complex path is profiled
with cProfile and the top functions are written to the JSON and Markdown.

Run: ``python -m benchmarks.overhead``. Writes ``overhead.json``, ``.md`` and ``.png``.
LangGraph is optional (``pip install -e '.[bench]'``); without it those columns are empty.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import gc
import io
import json
import os
import pstats
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    at_least,
    environment,
    fmt,
    load_pyplot,
    markdown_table,
    out_dir,
    percentile,
    positive,
    python_cmd,
    run_main,
    write_report,
)

NAME = "overhead"
PATHS = ("chitchat", "simple", "complex")
BENCH_EXTRA = "pip install -e '.[bench]'"
HEAVY = ("openai", "faiss", "numpy", "tiktoken")
TARGET_RATIO = 50.0
REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------
# The instant outside world: a scripted model and a toolbox that answer at once
# --------------------------------------------------------------------------------------


def _items():
    from crag.state import EvidenceItem

    return tuple(
        EvidenceItem(
            tool="vector_search",
            source=f"docs/retries-{n}.md",
            text=f"Uploads are retried {n + 2} times with exponential back-off; see `upload.retries`.",
            start_line=10 * n,
            end_line=10 * n + 6,
            score=0.6,
        )
        for n in range(1, 4)
    )


class InstantToolbox:
    """The Toolbox port answering every call at once with the same three chunks."""

    def __init__(self) -> None:
        self.items = _items()

    def tools(self):
        from crag.tools import LOCAL_TOOLS, builtin

        return builtin(*LOCAL_TOOLS)

    def run(self, call):
        return self.items


def scripted_model(path: str):
    """crag's own ScriptedChatModel with one reply per node, reused for every question."""
    from crag.llm.scripted import ScriptedChatModel

    route = json.dumps({"complexity": path, "suggested_tools": ["vector_search"]})
    plan = json.dumps({"tool_calls": [{"tool": "vector_search", "args": {"query": "upload retries"}}]})
    return ScriptedChatModel(
        default={
            "analyze_and_route": route,
            "plan": plan,
            "grade_evidence": "[0.9, 0.8, 0.85]",
            "synthesize": "Hello! Ask me about your documents." if path == "chitchat"
            else "Uploads are retried with back-off [1], configured by `upload.retries` [2].",
        }
    )


class ConstantModel:
    """A ChatModel returning one constant completion: the model of the orchestration test."""

    model = "constant"

    def __init__(self) -> None:
        from crag.state import Completion

        self.reply = Completion(text="", model=self.model, prompt_tokens=10, completion_tokens=2)

    def complete(self, request, on_delta=None):
        return self.reply


# --------------------------------------------------------------------------------------
# Trivial nodes: crag's node interface with (almost) nothing inside
# --------------------------------------------------------------------------------------


def trivial_nodes(path: str) -> dict:
    """Node modules (``prepare``/``apply``) that do the least routing needs, for ``path``."""
    from attrs import evolve

    from crag.graph import Node
    from crag.ports import GradeTask, LLMRequest, Step, ToolRequest
    from crag.state import Complexity, GraderAction, RoutingPlan, ToolCall

    plan_ = RoutingPlan(Complexity(path), ("vector_search",))
    calls = (ToolCall("vector_search", {"query": "q"}),)
    step = {n: Step(LLMRequest(n.value, GradeTask("q", ()), ())) for n in Node}
    tool_step = Step(ToolRequest(calls))

    def llm(node):
        return lambda state, cfg: step[node]

    return {
        Node.ANALYZE_AND_ROUTE: SimpleNamespace(
            prepare=llm(Node.ANALYZE_AND_ROUTE), apply=lambda s, st, r, c: evolve(s, routing_plan=plan_), ASKS_MODEL=True
        ),
        Node.PLAN: SimpleNamespace(prepare=llm(Node.PLAN), apply=lambda s, st, r, c: evolve(s, tool_calls=calls),
                                   ASKS_MODEL=True),
        Node.TOOL_EXEC: SimpleNamespace(
            prepare=lambda s, c: tool_step, apply=lambda s, st, r, c: evolve(s, iteration=s.iteration + 1),
            ASKS_MODEL=False,
        ),
        Node.GRADE_EVIDENCE: SimpleNamespace(
            prepare=llm(Node.GRADE_EVIDENCE),
            apply=lambda s, st, r, c: evolve(s, grader_action=GraderAction.GENERATE),
            ASKS_MODEL=True,
        ),
        Node.SYNTHESIZE: SimpleNamespace(prepare=llm(Node.SYNTHESIZE),
                                         apply=lambda s, st, r, c: evolve(s, answer="ok"), ASKS_MODEL=True),
    }


@contextlib.contextmanager
def driver_nodes(nodes: dict) -> Iterator[None]:
    """Swap the driver's node table for ``nodes`` (benchmark only; restored on exit)."""
    import crag.driver

    saved = dict(crag.driver.NODES)
    crag.driver.NODES.clear()
    crag.driver.NODES.update(nodes)
    try:
        yield
    finally:
        crag.driver.NODES.clear()
        crag.driver.NODES.update(saved)


def plain_loop_runner(path: str) -> Callable[[], Any]:
    """The floor: five trivial functions over a dict, routed by a dict, in a while loop."""
    route = {"chitchat": "synthesize", "simple": "plan", "complex": "plan"}

    def analyze(s):
        s["complexity"] = path
        return route[path]

    def plan(s):
        s["calls"] = ("vector_search",)
        return "tool_exec"

    def tool_exec(s):
        s["iteration"] += 1
        return "synthesize" if s["complexity"] == "simple" else "grade_evidence"

    def grade(s):
        s["action"] = "GENERATE"
        return "synthesize"

    def synthesize(s):
        s["answer"] = "ok"
        return "end"

    nodes = {"analyze_and_route": analyze, "plan": plan, "tool_exec": tool_exec,
             "grade_evidence": grade, "synthesize": synthesize}

    def run():
        s = {"question": "q", "iteration": 0}
        node = "analyze_and_route"
        while node != "end":
            node = nodes[node](s)
        return s

    return run


# --------------------------------------------------------------------------------------
# The same graph in LangGraph
# --------------------------------------------------------------------------------------


def langgraph_available() -> bool:
    try:
        import langgraph.graph  # noqa: F401
    except ImportError:
        return False
    return True


def build_langgraph(nodes: dict, model, toolbox, cfg):
    """A compiled StateGraph: crag's five nodes and conditional edges, the driver's bookkeeping.

    Each LangGraph node does what one step of crag's driver does (prepare, perform the
    request, record trace and usage, apply); edges come from ``crag.graph.TRANSITIONS`` and
    the conditional ones call ``crag.graph.outcome``, exactly as the driver routes.
    """
    from typing import TypedDict

    from attrs import evolve
    from langgraph.graph import END as LG_END
    from langgraph.graph import START as LG_START
    from langgraph.graph import StateGraph

    from crag.graph import END, START, TRANSITIONS, Node, outcome
    from crag.ports import LLMRequest, ToolOutcome, ToolRequest
    from crag.state import AgentState

    S = TypedDict("S", {"state": AgentState})  # noqa: UP013 - functional form: no string annotations to resolve

    def make(node: Node):
        module = nodes[node]
        name = node.value

        def step(st):
            state = st["state"]
            prepared = module.prepare(state, cfg)
            request = prepared.request
            if request is None:
                state = evolve(state, trace=(*state.trace, name))
                reply = None
            elif isinstance(request, LLMRequest):
                reply = model.complete(request)
                state = evolve(state, trace=(*state.trace, name), usage=state.usage.add(name, reply))
            elif isinstance(request, ToolRequest):
                reply = tuple(ToolOutcome(c, tuple(toolbox.run(c))) for c in request.calls)
                state = evolve(state, trace=(*state.trace, name))
            return {"state": module.apply(state, prepared, reply, cfg)}

        return step

    g = StateGraph(S)
    real = [n for n in Node if n not in (START, END)]
    for node in real:
        g.add_node(node.value, make(node))
    g.add_edge(LG_START, TRANSITIONS[START, next(o for (n, o) in TRANSITIONS if n is START)].value)
    for node in real:
        exits = {o: dst for (src, o), dst in TRANSITIONS.items() if src is node}
        targets = {o.value: (LG_END if dst is END else dst.value) for o, dst in exits.items()}
        if len(exits) == 1:
            g.add_edge(node.value, next(iter(targets.values())))
        else:
            g.add_conditional_edges(
                node.value,
                (lambda st, node=node: outcome(node, st["state"], cfg.max_iterations).value),
                targets,
            )
    return g.compile()


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def _stats(samples: list[float]) -> dict[str, float]:
    return {
        "median_us": percentile(samples, 50),
        "p95_us": percentile(samples, 95),
        "mean_us": sum(samples) / len(samples),
        "runs": len(samples),
    }


def time_runs(fn: Callable[[], Any], runs: int, warmup: int) -> dict[str, float]:
    """Median, p95 and mean of ``runs`` calls of ``fn`` (after ``warmup`` calls), in µs."""
    return time_interleaved({"fn": (fn, runs)}, warmup, blocks=1)["fn"]


def time_interleaved(fns: dict[str, tuple[Callable[[], Any], int]], warmup: int, blocks: int = 10) -> dict[str, dict]:
    """Time several runners in alternating blocks, so that they share whatever else the
    machine is doing at the time; each gets its ``runs`` samples (µs) over ``blocks`` blocks."""
    for fn, _ in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    clock = time.perf_counter_ns
    for b in range(blocks):
        for name, (fn, runs) in fns.items():
            n = runs * (b + 1) // blocks - runs * b // blocks
            out = samples[name]
            for _ in range(n):
                t = clock()
                fn()
                out.append((clock() - t) / 1000.0)
    return {name: _stats(xs) for name, xs in samples.items()}


def replay_runner(path: str, cfg, nodes: dict | None = None, model=None):
    """Node work only: the prepare / complete / apply calls of one question, no routing.

    The sequence of nodes is taken from a real driver run with the same nodes; the replay
    performs each node's request with the same instant model and toolbox and applies the
    reply, and nothing else (no trace, no usage, no routing).
    """
    from crag.driver import Driver
    from crag.graph import Node
    from crag.nodes import NODES
    from crag.ports import LLMRequest, ToolOutcome, ToolRequest
    from crag.state import AgentState, Usage

    model = model or scripted_model(path)
    toolbox = InstantToolbox()
    with driver_nodes(nodes) if nodes is not None else contextlib.nullcontext():
        trace = [Node(n) for n in Driver(model, toolbox, cfg).run(QUESTION[path]).trace]
    table = nodes if nodes is not None else NODES
    steps = [table[n] for n in trace]

    def run():
        state = AgentState(question=QUESTION[path], usage=Usage(model=model.model))
        for module in steps:
            prepared = module.prepare(state, cfg)
            request = prepared.request
            reply = None
            if isinstance(request, LLMRequest):
                reply = model.complete(request)
            elif isinstance(request, ToolRequest):
                reply = tuple(ToolOutcome(c, tuple(toolbox.run(c))) for c in request.calls)
            state = module.apply(state, prepared, reply, cfg)
        return state

    return run, model


QUESTION = {
    "chitchat": "Hi there, who are you?",
    "simple": "What is the upload retry setting called?",
    "complex": "How do upload retries work, and how do I tune them for a flaky network?",
}


def node_config():
    from crag.config import Settings
    from crag.nodes import NodeConfig
    from crag.tools import LOCAL_TOOLS, builtin

    return NodeConfig(Settings(), tools=builtin(*LOCAL_TOOLS))


def _lg_invoke(app, model, path: str):
    """One LangGraph question from a fresh start state, as ``Driver.run`` makes one."""
    from crag.state import AgentState, Usage

    def invoke():
        return app.invoke({"state": AgentState(question=QUESTION[path], usage=Usage(model=model.model))})

    return invoke


def measure_orchestration(args) -> list[dict[str, Any]]:
    from crag.driver import Driver

    cfg = node_config()
    rows = []
    for path in PATHS:
        nodes = trivial_nodes(path)
        model, toolbox = ConstantModel(), InstantToolbox()
        row: dict[str, Any] = {"path": path}
        replay, _ = replay_runner(path, cfg, nodes, model)
        with driver_nodes(nodes):
            driver = Driver(model, toolbox, cfg)
            final = driver.run(QUESTION[path])
            row["nodes_visited"] = len(final.trace)
            runners = {
                "plain_loop": (plain_loop_runner(path), args.runs),
                "node_work": (replay, args.runs),
                "crag_driver": (functools.partial(driver.run, QUESTION[path]), args.runs),
            }
            if langgraph_available():
                invoke = _lg_invoke(build_langgraph(nodes, model, toolbox, cfg), model, path)
                lg_final = invoke()["state"]
                if lg_final.trace != final.trace:
                    raise AssertionError(f"langgraph visited {lg_final.trace}, crag {final.trace}")
                runners["langgraph"] = (invoke, args.runs_langgraph)
            row.update(time_interleaved(runners, args.warmup, args.blocks))
        work = row["node_work"]["median_us"]
        row["crag_overhead_us"] = max(row["crag_driver"]["median_us"] - work, 0.0)
        if "langgraph" in row:
            row["ratio_langgraph_vs_crag"] = row["langgraph"]["median_us"] / row["crag_driver"]["median_us"]
            row["langgraph_overhead_us"] = max(row["langgraph"]["median_us"] - work, 0.0)
            if row["crag_overhead_us"] > 0:
                row["ratio_overhead_langgraph_vs_crag"] = row["langgraph_overhead_us"] / row["crag_overhead_us"]
        row["ratio_crag_vs_plain_loop"] = row["crag_driver"]["median_us"] / row["plain_loop"]["median_us"]
        rows.append(row)
        if args.verbose:
            lg = row.get("langgraph", {}).get("median_us")
            print(f"  overhead: orchestration {path:8s} plain {row['plain_loop']['median_us']:.2f} µs  "
                  f"work {work:.1f} µs  crag {row['crag_driver']['median_us']:.1f} µs  "
                  f"langgraph {fmt(lg, 1)} µs", flush=True)
    return rows


def measure_real_nodes(args) -> list[dict[str, Any]]:
    from crag.driver import Driver
    from crag.nodes import NODES

    cfg = node_config()
    rows = []
    for path in PATHS:
        model, toolbox = scripted_model(path), InstantToolbox()
        driver = Driver(model, toolbox, cfg)
        final = driver.run(QUESTION[path])
        replay, replay_model = replay_runner(path, cfg)
        row: dict[str, Any] = {"path": path, "trace": list(final.trace), "llm_calls": final.usage.llm_calls}
        runners = {
            "node_work": (replay, args.runs),
            "crag_driver": (functools.partial(driver.run, QUESTION[path]), args.runs),
        }
        if langgraph_available():
            invoke = _lg_invoke(build_langgraph(NODES, model, toolbox, cfg), model, path)
            lg_final = invoke()["state"]
            if (lg_final.trace, lg_final.answer) != (final.trace, final.answer):
                raise AssertionError(f"langgraph and crag disagree on the {path} path")
            runners["langgraph"] = (invoke, args.runs_langgraph)
        row.update(time_interleaved(runners, args.warmup, args.blocks))
        work = row["node_work"]["median_us"]
        row["crag_overhead_us"] = max(row["crag_driver"]["median_us"] - work, 0.0)
        if "langgraph" in row:
            row["langgraph_overhead_us"] = max(row["langgraph"]["median_us"] - work, 0.0)
            row["ratio_total_langgraph_vs_crag"] = row["langgraph"]["median_us"] / row["crag_driver"]["median_us"]
            if row["crag_overhead_us"] > 0:
                row["ratio_overhead_langgraph_vs_crag"] = row["langgraph_overhead_us"] / row["crag_overhead_us"]
        model.requests.clear()
        replay_model.requests.clear()
        rows.append(row)
        if args.verbose:
            lg = row.get("langgraph", {}).get("median_us")
            print(f"  overhead: real nodes    {path:8s} work {work:.1f} µs  crag {row['crag_driver']['median_us']:.1f} µs  "
                  f"langgraph {fmt(lg, 1)} µs", flush=True)
    return rows


def profile_driver(args, trivial: bool) -> list[dict[str, Any]]:
    """cProfile of the complex path in crag's driver: where a question's microseconds go."""
    from crag.driver import Driver

    cfg = node_config()
    path = "complex"
    ctx = driver_nodes(trivial_nodes(path)) if trivial else contextlib.nullcontext()
    with ctx:
        driver = Driver(ConstantModel() if trivial else scripted_model(path), InstantToolbox(), cfg)
        driver.run(QUESTION[path])
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.profile_runs):
            driver.run(QUESTION[path])
        prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    total = sum(v[2] for v in stats.stats.values())  # total internal time
    for (file, line, func), (_cc, nc, tt, ct, _) in stats.stats.items():
        rows.append({
            "function": f"{_short_path(file)}:{line}({func})",
            "calls_per_question": nc / args.profile_runs,
            "tottime_us_per_question": tt * 1e6 / args.profile_runs,
            "cumtime_us_per_question": ct * 1e6 / args.profile_runs,
            "share_of_tottime": tt / total if total else 0.0,
        })
    rows.sort(key=lambda r: -r["tottime_us_per_question"])
    return rows[: args.profile_top]


def _short_path(file: str) -> str:
    for marker in ("/crag/", "/site-packages/", "/lib/python"):
        if marker in file:
            return file[file.index(marker) + 1 :]
    return file


# --------------------------------------------------------------------------------------
# Start-up and imports
# --------------------------------------------------------------------------------------


def _median_subprocess_ms(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter_ns()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=env)
        samples.append((time.perf_counter_ns() - t) / 1e6)
    return percentile(samples, 50)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def import_cost_ms(module: str, runs: int) -> float | None:
    """Median time to import ``module`` in a fresh interpreter, minus an empty one."""
    code = f"import time; t=time.perf_counter(); import {module}; print((time.perf_counter()-t)*1000)"
    samples = []
    for _ in range(runs):
        proc = subprocess.run([*python_cmd(), "-c", code], capture_output=True, text=True, cwd=REPO, env=_env(),
                              check=False)
        if proc.returncode != 0:
            return None
        samples.append(float(proc.stdout.strip().splitlines()[-1]))
    return percentile(samples, 50)


_LIBRARY_PROBE = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    HEAVY = %r
    from crag import Agent
    from crag.llm.scripted import ScriptedChatModel
    from benchmarks.overhead import InstantToolbox
    seen = {}
    class Probe(ScriptedChatModel):
        def complete(self, request, on_delta=None):
            if not seen:
                seen.update(ms=(time.perf_counter() - t0) * 1000, node=request.node,
                            heavy=[m for m in HEAVY if m in sys.modules], modules=len(sys.modules))
            return super().complete(request, on_delta)
    model = Probe(default={"analyze_and_route": '{"complexity": "chitchat", "suggested_tools": []}',
                           "synthesize": "Hello!"})
    Agent(model, InstantToolbox()).ask("Hi, who are you?")
    seen["heavy_at_end"] = [m for m in HEAVY if m in sys.modules]
    print(json.dumps(seen))
    """
)

_CLI_PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    t0 = time.perf_counter()
    HEAVY = %r
    seen = {}
    def hook(event, args):
        if event == "socket.connect" and not seen:
            seen.update(ms=(time.perf_counter() - t0) * 1000,
                        heavy=[m for m in HEAVY if m in sys.modules], modules=len(sys.modules))
    sys.addaudithook(hook)
    from crag.cli import main
    try:
        rc = main(sys.argv[1:], stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"))
    except SystemExit as exc:
        rc = exc.code
    seen["exit_status"] = rc
    seen["heavy_at_end"] = [m for m in HEAVY if m in sys.modules]
    with open(os.environ["CRAG_BENCH_PROBE_OUT"], "w") as f:
        json.dump(seen, f)
    """
)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_first_call_probe() -> dict[str, Any]:
    """``python -m crag ask`` against an existing index with the openai backend: what is
    imported before the first request leaves (to a closed local port; nothing is sent)."""
    with tempfile.TemporaryDirectory() as tmp:
        kb = Path(tmp, "kb")
        kb.mkdir()
        (kb / "retries.md").write_text("# Retries\n\nUploads are retried five times with exponential back-off.\n"
                                       "Set `upload.retries` in `crag.toml` to change it.\n")
        env = _env()
        env.update(KB_AGENT_INDEX_DIR=str(Path(tmp, "index")), KB_AGENT_EMBEDDER="hash", KB_AGENT_LLM="offline")
        proc = subprocess.run([*python_cmd(), "-m", "crag", "index", str(kb)], capture_output=True, text=True,
                              cwd=tmp, env=env, check=False)
        if proc.returncode != 0:
            return {"error": f"crag index failed: {(proc.stderr or proc.stdout).strip()[-300:]}"}
        out = Path(tmp, "probe.json")
        env.update(
            KB_AGENT_LLM="openai",
            OPENAI_API_KEY="sk-benchmark",
            OPENAI_BASE_URL=f"http://127.0.0.1:{_closed_port()}/v1",
            KB_AGENT_LLM_MAX_RETRIES="0",
            KB_AGENT_LLM_TIMEOUT="5",
            CRAG_BENCH_PROBE_OUT=str(out),
        )
        t = time.perf_counter()
        proc = subprocess.run(
            [*python_cmd(), "-c", _CLI_PROBE % (HEAVY,), "ask", "How are uploads retried?"],
            capture_output=True, text=True, cwd=tmp, env=env, timeout=120, check=False,
        )
        wall = (time.perf_counter() - t) * 1000
        if not out.exists():
            return {"error": f"probe failed: {(proc.stderr or proc.stdout).strip()[-300:]}"}
        data = json.loads(out.read_text())
        data["wall_ms"] = wall
        if "ms" not in data:
            data["error"] = "no LLM request was made (the command ended before the first call)"
        return data


def library_first_call_probe() -> dict[str, Any]:
    proc = subprocess.run([*python_cmd(), "-c", _LIBRARY_PROBE % (HEAVY,)], capture_output=True, text=True,
                          cwd=REPO, env=_env(), check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-300:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_startup(args) -> dict[str, Any]:
    env = _env()
    py = python_cmd()
    result: dict[str, Any] = {"runs": args.startup_runs}
    result["python_bare_ms"] = _median_subprocess_ms([*py, "-c", "pass"], args.startup_runs, env)
    result["import_crag_ms"] = _median_subprocess_ms([*py, "-c", "import crag"], args.startup_runs, env)
    result["crag_help_ms"] = _median_subprocess_ms([*py, "-m", "crag", "--help"], args.startup_runs, env)
    result["crag_help_over_bare_ms"] = result["crag_help_ms"] - result["python_bare_ms"]
    result["import_cost_ms"] = {m: import_cost_ms(m, max(3, args.startup_runs // 2)) for m in (*HEAVY, "crag")}
    result["library_first_llm_call"] = library_first_call_probe()
    result["cli_first_llm_call"] = cli_first_call_probe() if args.cli_probe else {"skipped": "--no-cli-probe"}
    if args.verbose:
        print(f"  overhead: start-up  bare python {result['python_bare_ms']:.0f} ms, "
              f"python -m crag --help {result['crag_help_ms']:.0f} ms", flush=True)
    return result


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def anatomy(repeat: int = 5, number: int = 20_000) -> dict[str, float]:
    """Micro-costs (µs, best of ``repeat``) of the operations a driver step is made of."""
    import timeit

    from attrs import evolve

    from crag.driver import Driver
    from crag.graph import Node, next_node
    from crag.state import AgentState, Completion

    cfg = node_config()
    state = Driver(scripted_model("complex"), InstantToolbox(), cfg).run(QUESTION["complex"])
    reply = Completion("x", "m", 10, 2)
    ops = {
        "evolve(AgentState, trace=...)": lambda: evolve(state, trace=(*state.trace, "plan")),
        "AgentState(question=...)": lambda: AgentState(question="q"),
        "Usage.add(node, completion)": lambda: state.usage.add("plan", reply),
        "graph.next_node(...)": lambda: next_node(Node.GRADE_EVIDENCE, state, 3),
        "dict update (plain loop step)": lambda: {"a": 1}.update(b=2),
    }
    return {name: min(timeit.repeat(fn, repeat=repeat, number=number)) / number * 1e6 for name, fn in ops.items()}


def run(args) -> dict[str, Any]:
    gc.collect()
    result: dict[str, Any] = {
        "benchmark": NAME,
        "args": {"runs": args.runs, "runs_langgraph": args.runs_langgraph, "warmup": args.warmup,
                 "blocks": args.blocks,
                 "startup_runs": args.startup_runs, "target_ratio": args.target_ratio},
        "environment": environment(["crag", "langgraph", "attrs", "cattrs"]),
        "langgraph": langgraph_available(),
    }
    if not result["langgraph"]:
        print(f"{NAME}: LangGraph is not installed, its columns are empty ({BENCH_EXTRA})", flush=True)
    result["orchestration"] = measure_orchestration(args)
    result["real_nodes"] = measure_real_nodes(args)
    orch = result["orchestration"]
    ratios = [r["ratio_overhead_langgraph_vs_crag"] for r in orch if "ratio_overhead_langgraph_vs_crag" in r]
    totals = [r["ratio_langgraph_vs_crag"] for r in orch if "ratio_langgraph_vs_crag" in r]
    result["headline"] = {
        "min_ratio_overhead_langgraph_vs_crag": min(ratios) if ratios else None,
        "min_ratio_total_langgraph_vs_crag": min(totals) if totals else None,
        "crag_overhead_us": {r["path"]: r["crag_overhead_us"] for r in orch},
        "langgraph_overhead_us": {r["path"]: r.get("langgraph_overhead_us") for r in orch},
        "target_ratio": args.target_ratio,
        "target_met": (min(ratios) >= args.target_ratio) if ratios else None,
    }
    result["anatomy"] = anatomy()
    if args.profile or (ratios and min(ratios) < args.target_ratio):
        result["profile_trivial_nodes"] = profile_driver(args, trivial=True)
        result["profile_real_nodes"] = profile_driver(args, trivial=False)
    if args.startup:
        result["startup"] = measure_startup(args)
    return result


def _us(stat: dict[str, float] | None) -> str:
    if not stat:
        return "–"
    return f"{stat['median_us']:,.1f} ({stat['p95_us']:,.1f})"


def render_markdown(result: dict[str, Any]) -> str:
    out = []
    a = result["args"]
    langgraph = (f"{a['runs_langgraph']:,} for LangGraph" if result.get("langgraph", True)
                 else f"LangGraph is not installed: its columns are empty ({BENCH_EXTRA})")
    out.append(
        f"Median per question in µs (p95 in brackets); {a['runs']:,} questions per path for crag and the plain "
        f"loop, {langgraph}, after {a['warmup']} warm-up questions.\n\n"
    )
    out.append("**Orchestration only** (trivial nodes, constant model and tools). Node work = the same trivial "
               "prepare / model / apply calls replayed without any orchestration; overhead = total − node work:\n\n")
    rows = []
    for r in result["orchestration"]:
        rows.append([
            r["path"], r["nodes_visited"], _us(r["plain_loop"]), _us(r["node_work"]), _us(r["crag_driver"]),
            _us(r.get("langgraph")), fmt(r["crag_overhead_us"], 1), fmt(r.get("langgraph_overhead_us"), 1),
            f"**{r['ratio_overhead_langgraph_vs_crag']:.0f}×**" if "ratio_overhead_langgraph_vs_crag" in r else "–",
            f"{r['ratio_langgraph_vs_crag']:.0f}×" if "ratio_langgraph_vs_crag" in r else "–",
        ])
    out.append(markdown_table(
        ["path", "nodes", "plain loop", "node work", "crag driver", "LangGraph", "crag overhead",
         "LangGraph overhead", "overhead LangGraph / crag", "total LangGraph / crag"], rows))
    out.append("\n**With crag's real nodes** (prompts rendered, replies parsed, answer composed; instant "
               "ScriptedChatModel and toolbox). Overhead = total − node work:\n\n")
    rows = []
    for r in result["real_nodes"]:
        lg_over = r.get("langgraph_overhead_us")
        rows.append([
            r["path"], r["llm_calls"], _us(r["node_work"]), _us(r["crag_driver"]), _us(r.get("langgraph")),
            fmt(r["crag_overhead_us"], 1), fmt(lg_over, 1),
            f"{r['ratio_total_langgraph_vs_crag']:.1f}×" if "ratio_total_langgraph_vs_crag" in r else "–",
        ])
    out.append(markdown_table(
        ["path", "LLM calls", "node work", "crag total", "LangGraph total", "crag overhead", "LangGraph overhead",
         "total LangGraph / crag"], rows))
    h = result["headline"]
    if h["min_ratio_overhead_langgraph_vs_crag"] is not None:
        verdict = "met" if h["target_met"] else "NOT met"
        out.append(
            f"\nHeadline: LangGraph's overhead per question is at least {h['min_ratio_overhead_langgraph_vs_crag']:.0f}× "
            f"crag's driver's on every path (target ≥ {h['target_ratio']:g}×: {verdict}); in total time, "
            f"at least {h['min_ratio_total_langgraph_vs_crag']:.0f}×.\n"
        )
    an = result.get("anatomy")
    if an:
        out.append("\nWhat one driver step is made of (µs per operation, best of 5 × 20,000): "
                   + "; ".join(f"{k} {v:.2f}" for k, v in an.items()) + ".\n")
    # Only the orchestration profile is shown: with the real nodes, cProfile charges every resume of
    # the reply parsers' generators as a call and inflates them several times over (the JSON keeps it).
    for key, title in (("profile_trivial_nodes", "orchestration only"),):
        if key in result:
            out.append(f"\n**Where crag's driver spends a complex question ({title}), cProfile, top functions "
                       f"by own time:**\n\n")
            out.append(markdown_table(
                ["function", "calls / question", "own µs / question", "share"],
                [[f"`{p['function']}`", fmt(p["calls_per_question"], 1), fmt(p["tottime_us_per_question"], 1),
                  f"{p['share_of_tottime']:.0%}"] for p in result[key][:10]],
                "lrrr",
            ))
    s = result.get("startup")
    if s:
        out.append(f"\n**Start-up** (median of {s['runs']} subprocess runs):\n\n")
        rows = [
            ["`python -c pass`", fmt(s["python_bare_ms"], 0)],
            ["`python -c 'import crag'`", fmt(s["import_crag_ms"], 0)],
            ["`python -m crag --help`", fmt(s["crag_help_ms"], 0)],
        ]
        out.append(markdown_table(["command", "ms"], rows))
        costs = s["import_cost_ms"]
        out.append("\nImport cost in a fresh interpreter (ms): "
                   + ", ".join(f"{m} {fmt(v, 0)}" for m, v in costs.items()) + ".\n")
        for key, title in (("library_first_llm_call", "embedded library (`Agent.ask`, scripted model)"),
                           ("cli_first_llm_call", "`python -m crag ask` (openai backend, existing index)")):
            p = s.get(key) or {}
            if "error" in p or "skipped" in p:
                out.append(f"\nFirst LLM request, {title}: not measured ({p.get('error') or p.get('skipped')}).\n")
                continue
            heavy = ", ".join(p.get("heavy", [])) or "none"
            out.append(
                f"\nFirst LLM request, {title}: {p['ms']:.0f} ms after the interpreter started running crag; "
                f"heavy modules loaded by then: {heavy} (by the end: {', '.join(p.get('heavy_at_end', [])) or 'none'}).\n"
            )
    return "".join(out)


def render_chart(result: dict[str, Any], path: Path) -> Path | None:
    plt = load_pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    runners = [("plain_loop", "plain loop", "#7f7f7f"), ("crag_driver", "crag driver", "#1f77b4"),
               ("langgraph", "LangGraph", "#d62728")]
    paths = [r["path"] for r in result["orchestration"]]
    width = 0.27
    for i, (key, label, colour) in enumerate(runners):
        vals = [r.get(key, {}).get("median_us", 0.0) for r in result["orchestration"]]
        xs = [j + (i - 1) * width for j in range(len(paths))]
        bars = axes[0].bar(xs, vals, width, label=label, color=colour)
        for b, v in zip(bars, vals):
            if v:
                axes[0].text(b.get_x() + b.get_width() / 2, v, f"{v:,.1f}" if v < 10 else f"{v:,.0f}",
                             ha="center", va="bottom", fontsize=7)
    for j, r in enumerate(result["orchestration"]):
        if "ratio_overhead_langgraph_vs_crag" in r:
            axes[0].annotate(f"overhead ratio {r['ratio_overhead_langgraph_vs_crag']:.0f}×", (j + width, r["langgraph"]["median_us"]),
                             xytext=(0, 12), textcoords="offset points", ha="center", fontsize=8, color="#d62728")
    axes[0].margins(y=0.25)
    axes[0].set(yscale="log", xticks=range(len(paths)), xticklabels=paths, ylabel="µs per question (median, log)",
                title="Orchestration only (trivial nodes)")
    axes[0].legend(fontsize=8)
    rows = result["real_nodes"]
    paths = [r["path"] for r in rows]
    work = [r["node_work"]["median_us"] for r in rows]
    crag_over = [r["crag_overhead_us"] for r in rows]
    lg_over = [r.get("langgraph_overhead_us", 0.0) for r in rows]
    xs = range(len(paths))
    axes[1].bar([x - 0.2 for x in xs], work, 0.38, color="#aec7e8", label="node work (prompts, parsing, answer)")
    axes[1].bar([x - 0.2 for x in xs], crag_over, 0.38, bottom=work, color="#1f77b4", label="crag driver overhead")
    axes[1].bar([x + 0.2 for x in xs], work, 0.38, color="#aec7e8")
    axes[1].bar([x + 0.2 for x in xs], lg_over, 0.38, bottom=work, color="#d62728", label="LangGraph overhead")
    axes[1].set(xticks=list(xs), xticklabels=[f"{p}\ncrag | LG" for p in paths], ylabel="µs per question (median)",
                title="With crag's real nodes, instant LLM and tools")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=at_least(1), default=2000, help="timed questions per path, crag and plain loop (default: %(default)s)")
    p.add_argument("--runs-langgraph", type=at_least(1), default=None, help="timed questions per path for LangGraph (default: --runs)")
    p.add_argument("--warmup", type=at_least(0), default=200)
    p.add_argument("--blocks", type=at_least(1), default=10,
                   help="runners are timed in this many alternating blocks (default: %(default)s)")
    p.add_argument("--startup-runs", type=at_least(1), default=10, help="subprocess runs per start-up figure (default: %(default)s)")
    p.add_argument("--no-startup", dest="startup", action="store_false", help="skip the start-up measurements")
    p.add_argument("--no-cli-probe", dest="cli_probe", action="store_false",
                   help="skip the `crag ask` first-request probe (it builds a tiny index)")
    p.add_argument("--profile", action="store_true", help="always profile (default: only when the target is missed)")
    p.add_argument("--profile-runs", type=at_least(1), default=500)
    p.add_argument("--profile-top", type=at_least(1), default=15)
    p.add_argument("--target-ratio", type=positive, default=TARGET_RATIO)
    p.add_argument("--out", type=out_dir, default=RESULTS_DIR)
    p.add_argument("--quiet", dest="verbose", action="store_false")
    args = p.parse_args(argv)
    args.runs_langgraph = args.runs_langgraph or args.runs
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    return write_report(NAME, run(args), args.out, render_markdown, render_chart, args.verbose)


if __name__ == "__main__":
    raise SystemExit(run_main(lambda: 0 if main() else 1, "python -m benchmarks.overhead"))
