"""Grader quality on a real model: each ``KB_AGENT_GRADER`` style on expert-labelled pairs.

``python -m benchmarks.grader_auc --base-url http://127.0.0.1:8091/v1 --model qwen2.5-coder-1.5b``

The pairs are TREC Deep Learning 2019 + 2020 (``--data``, the shared
``grading/trec_dl/judged_pairs.jsonl``): for ``--queries`` queries drawn with ``--seed`` among
those with at least ``--per`` relevant (NIST grade >= 2) and ``--per`` irrelevant (grade 0)
BM25 passages, the ``--per`` best-ranked of each, shuffled (seeded by the query id), so
a grading sees 2 x ``--per`` passages of one query as one retrieval round would hand them to
``grade_evidence`` (default 10 queries x 8 = 80 pairs). Hard pairs: every passage is a BM25
hit for the query.

Every style runs through crag's own code: ``grade_evidence.prepare`` builds the request(s)
(fast-path rules off, so the grader is always asked), crag's OpenAI adapter sends them
(``logprobs`` included where the style asks), and ``grade_evidence.read_reply`` reads the
reply into one score per passage, exactly as ``apply`` does. Reported per style: AUC (the
probability that a relevant passage scores above an irrelevant one, ties counting half),
the share of relevant passages kept and of irrelevant ones let through at the drop
threshold 0.3, distinct score values, gradings crag would find uninformative
(``grader_uninformative``) or unreadable (``grader_parse_failure``), calls, prompt and
completion tokens, and wall time.

Resumable: each reply (its text, token probabilities, usage and time) is appended to
``--record`` keyed by a hash of the model and the request; a later run replays what it holds
and sends only what is missing. Results: ``benchmarks/results/grader_auc.json`` and ``.md``
(``--name``). Never part of ``make test``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    SHARED,
    append_jsonl,
    at_least,
    environment,
    llm_timeout,
    markdown_table,
    out_dir,
    read_jsonl,
    read_judged_pairs,
    record_file,
    results_name,
    run_main,
    write_json,
    write_text,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = SHARED / "grading" / "trec_dl" / "judged_pairs.jsonl"
STYLES = ("batch", "pointwise", "scores")


def sample(path: Path, queries: int, per: int, seed: int, offset: int = 0) -> list[tuple[str, list[dict]]]:
    """``queries`` (query text, shuffled passages) with ``per`` relevant and ``per`` irrelevant each."""
    by_q: dict[str, list[dict]] = defaultdict(list)
    for row in read_judged_pairs(path):
        by_q[row["qid"]].append(row)
    eligible = sorted(
        q for q, rows in by_q.items()
        if sum(r["grade"] >= 2 for r in rows) >= per and sum(r["grade"] == 0 for r in rows) >= per
    )
    if not eligible:
        raise ValueError(f"no query of {path} has {per} relevant (grade 2 or 3) and {per} irrelevant (grade 0) "
                         "passages: lower --per")
    random.Random(seed).shuffle(eligible)
    out = []
    for qid in eligible[offset : offset + queries]:
        rows = sorted(by_q[qid], key=lambda r: r["bm25_rank"])
        chosen = [r for r in rows if r["grade"] >= 2][:per] + [r for r in rows if r["grade"] == 0][:per]
        random.Random(qid).shuffle(chosen)
        out.append((rows[0]["query"], chosen))
    return out


def auc(scored: list[tuple[float, bool]]) -> float:
    pos = [s for s, y in scored if y]
    neg = [s for s, y in scored if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


class Recorded:
    """crag's OpenAI adapter behind an append-only record of replies, keyed by request."""

    def __init__(self, base_url: str, model: str, record: Path, timeout: float) -> None:
        from crag.config import Settings
        from crag.llm.openai_chat import OpenAIChatModel

        settings = Settings(llm="openai", model=model, openai_base_url=base_url.rstrip("/"),
                            llm_timeout=timeout, llm_max_retries=1)
        self.chat = OpenAIChatModel(settings)
        self.model = model
        self.record = record
        self.rows: dict[str, dict] = {}
        self.sent = self.replayed = 0
        self.rows.update((row["key"], row) for row in read_jsonl(record) if "key" in row)

    def key(self, request) -> str:
        sent = {"messages": request.messages, "max_tokens": request.max_tokens, "temperature": request.temperature,
                "reply_schema": request.reply_schema, "logprobs": request.logprobs}
        blob = json.dumps({"model": self.model, **sent}, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def complete(self, request):
        from crag.state import Completion, TokenLogprob

        key = self.key(request)
        row = self.rows.get(key)
        if row is None:
            c = self.chat.complete(request)
            row = {"key": key, "text": c.text, "prompt_tokens": c.prompt_tokens, "cached_tokens": c.cached_tokens,
                   "completion_tokens": c.completion_tokens, "latency_ms": round(c.latency_ms, 1),
                   "finish_reason": c.finish_reason,
                   "logprobs": None if c.logprobs is None else [[t.token, t.logprob, [list(a) for a in t.top]]
                                                                for t in c.logprobs]}
            self.rows[key] = row
            append_jsonl(self.record, row)
            self.sent += 1
        else:
            self.replayed += 1
        logprobs = None if row["logprobs"] is None else tuple(
            TokenLogprob(t, lp, tuple((a, b) for a, b in top)) for t, lp, top in row["logprobs"])
        return Completion(row["text"], self.model, prompt_tokens=row["prompt_tokens"],
                          completion_tokens=row["completion_tokens"], latency_ms=row["latency_ms"],
                          cached_tokens=row.get("cached_tokens", 0), finish_reason=row.get("finish_reason"),
                          logprobs=logprobs)


def grade(style: str, question: str, passages: list[dict], model: Recorded) -> dict[str, Any]:
    """One grading of ``passages`` by ``style``, through crag's grade_evidence."""
    from crag import grading
    from crag.config import Settings
    from crag.nodes import NodeConfig, grade_evidence
    from crag.ports import LLMRequests
    from crag.state import AgentState, EvidenceItem, ToolCall, ToolRun

    items = tuple(EvidenceItem(tool="vector_search", source=f"msmarco/{r['docid']}.txt", text=r["passage"],
                               start_line=1, end_line=1, score=0.5) for r in passages)
    run = ToolRun(1, ToolCall("vector_search", {"query": question}), items)
    state = AgentState(question=question, context=items, iteration=1, tool_history=(run,))
    cfg = NodeConfig(Settings(auto_approve_max_items=0, vector_score_threshold=1.0, grader=style,
                              context_tokens=8192))  # no fast path: items score 0.5
    request = grade_evidence.prepare(state, cfg).request
    requests = request.requests if isinstance(request, LLMRequests) else (request,)
    started = time.perf_counter()
    replies = tuple(model.complete(r) for r in requests)
    reply = replies if isinstance(request, LLMRequests) else replies[0]
    reading = grade_evidence.read_reply(reply, len(items), style)
    return {
        "scores": None if reading is None else list(reading.scores),
        "from_logprobs": reading is not None and reading.from_logprobs,
        "uninformative": None if reading is None else grading.uninformative(reading.scores, reading.tosses),
        "calls": len(replies),
        "prompt_tokens": sum(r.prompt_tokens for r in replies),
        "completion_tokens": sum(r.completion_tokens for r in replies),
        "wall_s": sum(r.latency_ms for r in replies) / 1000.0,
        "elapsed_s": time.perf_counter() - started,
        "texts": [r.text[:200] for r in replies],
        "relevant": [r["grade"] >= 2 for r in passages],
        "grades": [r["grade"] for r in passages],
    }


def summarise(style: str, gradings: list[dict], drop: float = 0.3) -> dict[str, Any]:
    scored, failures, uninformative, values = [], 0, 0, set()
    for g in gradings:
        if g["scores"] is None:
            failures += 1
            scores = [0.5] * len(g["relevant"])  # what crag does with a parse failure
        else:
            scores = g["scores"]
            uninformative += g["uninformative"] is not None
        values.update(round(s, 2) for s in scores)
        scored += list(zip(scores, g["relevant"]))
    rel = [s for s, y in scored if y]
    irr = [s for s, y in scored if not y]
    return {
        "style": style,
        "gradings": len(gradings),
        "pairs": len(scored),
        "auc": auc(scored),
        "relevant_kept": sum(s >= drop for s in rel) / max(1, len(rel)),
        "irrelevant_through": sum(s >= drop for s in irr) / max(1, len(irr)),
        "distinct_scores": len(values),
        "from_logprobs": sum(g["from_logprobs"] for g in gradings),
        "uninformative": uninformative,
        "parse_failures": failures,
        "calls": sum(g["calls"] for g in gradings),
        "prompt_tokens": sum(g["prompt_tokens"] for g in gradings),
        "completion_tokens": sum(g["completion_tokens"] for g in gradings),
        "wall_s": sum(g["wall_s"] for g in gradings),
    }


def render_markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    rows = [[f"`{r['style']}`", f"{r['pairs']}", f"{r['auc']:.3f}", f"{100 * r['relevant_kept']:.0f}%",
             f"{100 * r['irrelevant_through']:.0f}%", str(r["distinct_scores"]),
             f"{r['from_logprobs']} of {r['gradings']}", str(r["uninformative"]), str(r["parse_failures"]),
             f"{r['calls']:,}", f"{r['prompt_tokens']:,}", f"{r['completion_tokens']:,}", f"{r['wall_s']:.0f}"]
            for r in result["rows"]]
    head = ["style", "pairs", "AUC", "relevant kept (≥ 0.3)", "irrelevant through (≥ 0.3)", "distinct scores",
            "read from logprobs", "uninformative", "parse failures", "calls", "prompt tokens", "completion tokens",
            "wall s"]
    return (
        f"# Grader styles on TREC DL pairs: {a['model']}\n\n"
        f"Command: `{result['command']}`  \nDate: {result['environment']['date']}; {a['queries']} queries x "
        f"{2 * a['per']} passages ({a['per']} relevant, NIST grade >= 2; {a['per']} irrelevant, grade 0; BM25 hits, "
        f"shuffled), sample seed {a['seed']}, offset {a['offset']}. {result['sent']} requests sent, "
        f"{result['replayed']} replayed from `{Path(a['record']).name}`.\n\n"
        + markdown_table(head, rows)
        + "\n\nWall time is the server's reply time summed over the requests (2 CPU cores shared with other jobs).\n"
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.grader_auc", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="an OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1")
    p.add_argument("--model", required=True, help="the model name sent to the server")
    p.add_argument("--styles", default=",".join(STYLES), help="comma-separated KB_AGENT_GRADER styles")
    p.add_argument("--queries", type=at_least(1), default=10, help="TREC DL queries sampled (default: %(default)s)")
    p.add_argument("--per", type=at_least(1), default=4, help="relevant and irrelevant passages per query, each")
    p.add_argument("--seed", type=int, default=30)
    p.add_argument("--offset", type=at_least(0), default=0, help="skip this many sampled queries (a fresh sample)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="judged_pairs.jsonl (default: %(default)s)")
    p.add_argument("--record", type=record_file, default=RESULTS_DIR / "grader_auc.jsonl",
                   help="append-only JSONL of replies; a later run resumes from it (default: %(default)s)")
    p.add_argument("--timeout", type=llm_timeout, default=900.0, help="seconds per request (default: %(default)s)")
    p.add_argument("--name", type=results_name, default="grader_auc", help="results file name (NAME.json / .md)")
    p.add_argument("--out", type=out_dir, default=RESULTS_DIR)
    args = p.parse_args(argv)
    if not args.base_url.startswith(("http://", "https://")):
        p.error(f"--base-url must be an http:// or https:// URL, got {args.base_url!r}")
    if not args.data.is_file():
        p.error(f"missing data: no {args.data} (--data says where; CRAG_SHARED=DIR for the shared data)")
    args.styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    unknown = [s for s in args.styles if s not in STYLES]
    if not args.styles or unknown:
        p.error(f"unknown style: {', '.join(unknown)} (choose from {', '.join(STYLES)})" if unknown
                else "--styles needs at least one style")
    return args


def main(argv=None) -> dict[str, Any]:
    import shlex
    import sys

    args = parse_args(argv)
    styles = args.styles
    model = Recorded(args.base_url, args.model, args.record, args.timeout)
    data = sample(args.data, args.queries, args.per, args.seed, args.offset)
    gradings: dict[str, list[dict]] = {s: [] for s in styles}
    command = "python -m benchmarks.grader_auc " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    result: dict[str, Any] = {}
    for i, (question, passages) in enumerate(data):
        for style in styles:
            g = grade(style, question, passages, model)
            gradings[style].append(g)
            shown = None if g["scores"] is None else [round(s, 2) for s in g["scores"]]
            print(f"q{i} {style}: {g['wall_s']:.0f}s {shown} relevant={[int(x) for x in g['relevant']]}"
                  f"{' uninformative' if g['uninformative'] else ''}", flush=True)
        result = {
            "command": command,
            "environment": environment(("openai",)),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "sent": model.sent,
            "replayed": model.replayed,
            "rows": [summarise(s, gradings[s]) for s in styles],
            "gradings": gradings,
        }
        write_json(args.out / f"{args.name}.json", result)
        write_text(args.out / f"{args.name}.md", render_markdown(result))
    for r in result.get("rows", []):
        print(f"{r['style']}: AUC {r['auc']:.3f} on {r['pairs']} pairs, {r['calls']} calls, "
              f"{r['prompt_tokens']} prompt tokens, {r['wall_s']:.0f} s", flush=True)
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.grader_auc"))
