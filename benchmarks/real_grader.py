"""Grading cost with a real grader: crag's grading requests sent to a real model.

``python -m benchmarks.grading_cost --base-url URL --model M`` runs it instead of the
simulated benchmark (``grading_cost.run_real``); this module holds what only the real grader
needs (``RecordedGrader``, the report and chart) and imports nothing of ``grading_cost``.
The workload is the ``up to 3 rounds`` one of ``grading_cost`` (whole questions through
crag's Driver, ``k`` new TREC DL candidates per round), or with
``--workload single`` each query's top ``k`` graded once, on an evenly spaced sample of
``--sample`` queries (or the ``--qids`` given). Each strategy's grading requests are built by crag itself
(``grade_evidence.prepare``; per-item requests are what it builds for a one-item context)
and sent through crag's OpenAI adapter (``crag.llm.openai_chat.OpenAIChatModel``), so the
server sees exactly what crag sends: messages, and whatever sampling parameters crag sets.
The same sample also runs with the simulated grader, reported side by side.

Usage and time are the server's: ``usage.prompt_tokens``, ``completion_tokens`` and
``prompt_tokens_details.cached_tokens`` (the part of the prompt the server took from its
prefix cache), and the wall time of each request. A reply without usable counts is counted
by crag's adapter (tiktoken, ``Completion.usage_estimated``): the record keeps the flag, and
each row of the report says for how many of its calls the counts are estimates
(``estimated_calls``). Questions run one after another and, in
each question, the strategies one after another (``per_item``, ``batch``, ``batch_rules``,
``batch_rules_memory``), so a run stopped early still compares the strategies on the
questions it finished (the report counts only those).

Resumable: every reply is appended to ``--record`` (JSONL, one line per request, flushed at
once), keyed by a hash of the model and the request (messages and parameters), i.e. by the
item or items it grades. A later run, on this machine or a faster one, replays recorded
replies (their tokens and time included) and sends only what is missing; ``--sample``
can grow between runs. An identical request made by two strategies (``batch`` and
``batch_rules`` when no rule fires; the first round of ``batch_rules_memory``) is sent once
and its recorded reply, tokens and time count for each: at temperature 0 a server answers
it the same way (``calls replayed`` in the report says how many). A request that fails
(timeout, server error) counts as a parse failure in this run and is not recorded, so a
resumed run sends it again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import append_jsonl, load_pyplot, markdown_table, read_jsonl

NAME = "grading_cost_real"  # + "_single" for the single-round workload
INCOMPLETE = "_incomplete"  # + this: the report of a run in which requests failed


class Unreachable(Exception):
    """The server could not be reached at all (connection refused, no route) before any
    request of the run reached it: the run stops at once rather than fail every request."""


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (an ``LLMError``) was a connection that could not be made at all: refused,
    or no route to the host; not a timeout, a dropped connection or an error status."""
    import errno

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if type(cause).__name__ == "ConnectError" or isinstance(cause, ConnectionRefusedError):
            return True
        if isinstance(cause, OSError) and cause.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return True
        cause = cause.__cause__ or cause.__context__
    return False
ORDER = ("per_item", "batch", "scores", "batch_rules", "batch_rules_memory")


class RecordedGrader:
    """crag's OpenAI adapter behind an append-only record of replies, keyed by request."""

    def __init__(self, base_url: str, model: str, record: Path, timeout: float, verbose: bool = True) -> None:
        from crag.config import Settings
        from crag.llm.openai_chat import OpenAIChatModel

        settings = Settings(llm="openai", model=model, openai_base_url=base_url.rstrip("/"),
                            llm_timeout=timeout, llm_max_retries=1)
        self.chat = OpenAIChatModel(settings)
        self.model = model
        self.record = Path(record)
        self.verbose = verbose
        self.replies: dict[str, dict[str, Any]] = {}
        self.sent = self.replayed = self.errors = 0
        self.first_error: str | None = None
        self.last_replayed = False
        self.replies.update((row["key"], row) for row in read_jsonl(self.record) if "key" in row and "text" in row)

    def key(self, request) -> str:
        """The model and everything the request sends, hashed (the task is what was rendered)."""
        import attrs

        sent = {f.name: getattr(request, f.name) for f in attrs.fields(type(request)) if f.name not in ("task", "node")}
        blob = json.dumps({"model": self.model, **sent}, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def complete(self, request, label: dict[str, Any]):
        from crag.errors import LLMError
        from crag.state import Completion

        key = self.key(request)
        row = self.replies.get(key)
        self.last_replayed = row is not None
        if row is not None:
            from crag.state import TokenLogprob

            self.replayed += 1
            logprobs = None if not row.get("logprobs") else tuple(
                TokenLogprob(t, lp, tuple((a, b) for a, b in top)) for t, lp, top in row["logprobs"])
            return Completion(row["text"], self.model, prompt_tokens=row["prompt_tokens"],
                              completion_tokens=row["completion_tokens"], latency_ms=row["latency_ms"],
                              cached_tokens=row.get("cached_tokens", 0), logprobs=logprobs,
                              usage_estimated=bool(row.get("usage_estimated", False)))
        try:
            completion = self.chat.complete(request)
        except LLMError as exc:
            self.errors += 1
            self.first_error = self.first_error or str(exc)
            if self.verbose:
                print(f"  real grader: {label} failed: {exc}", flush=True)
            if not self.sent and unreachable(exc):
                raise Unreachable(str(exc)) from exc
            return Completion("", self.model)
        self.sent += 1
        row = {"key": key, **label, "items": [it.source for it in request.task.items], "text": completion.text,
               "prompt_tokens": completion.prompt_tokens, "cached_tokens": completion.cached_tokens,
               "completion_tokens": completion.completion_tokens, "latency_ms": round(completion.latency_ms, 1),
               "usage_estimated": completion.usage_estimated,
               "logprobs": None if completion.logprobs is None else [
                   [t.token, t.logprob, [list(a) for a in t.top]] for t in completion.logprobs],
               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.replies[key] = row
        append_jsonl(self.record, row)
        if self.verbose:
            print(f"  real grader: {label.get('strategy')} q{label.get('qid')} {len(request.task.items)} items: "
                  f"{completion.prompt_tokens} prompt ({completion.cached_tokens} cached) + "
                  f"{completion.completion_tokens} completion tokens, {completion.latency_ms / 1000:.1f} s "
                  f"-> {completion.text.strip()[:60]!r}", flush=True)
        return completion


def verdict(rows: Sequence[dict]) -> dict[str, Any] | None:
    by = {r["strategy"]: r for r in rows}
    batch, memory = by.get("batch"), by.get("batch_rules_memory")
    if not batch or not memory or not batch["total_tokens"]:
        return None
    saved = 100 * (1 - memory["total_tokens"] / batch["total_tokens"])
    extra = memory["irrelevant_through_pct"] - batch["irrelevant_through_pct"]
    return {"tokens_saved_pct": saved, "extra_irrelevant_pts": extra,
            "meets": saved >= 25 and extra <= 2}


def render_markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    n = len(result["questions_done"])
    if a.get("workload") == "single":
        shape = f"queries × top k = {', '.join(map(str, a['ks']))} candidates graded once (single round). "
    else:
        shape = f"queries × k = {', '.join(map(str, a['ks']))} new candidates per round, up to 3 rounds. "
    out = [
        f"# Grading cost with a real grader\n\n"
        f"`{a['model']}` at `{a['base_url']}`; {n} question(s) done of a sample of {a['sample']} TREC DL "
        f"{shape}{result['requests_sent']} requests sent in this run, {result['requests_replayed']} replayed from "
        f"`{Path(a['record']).name}`, {result['request_errors']} failed. Run time {result['elapsed_s'] / 60:.1f} min.\n\n"
    ]
    left_out = result.get("questions_failed") or []
    if left_out:
        out.append(f"**Incomplete:** {len(left_out)} question(s) left out ({', '.join(left_out)}): a request of "
                   f"theirs failed, the first with: {result['first_error']}. The tables count only the questions "
                   "whose requests all got replies.\n\n")
    headers = ["strategy", "grader", "calls", "prompt tokens", "cached", "completion tokens", "grading time (s)",
               "relevant kept", "irrelevant through", "AUC", "parse failures (items)", "fast-path false approvals"]
    table = []
    for s in a["strategies"]:
        for kind in ("real", "simulated"):
            r = next(x for x in result["rows"][kind] if x["strategy"] == s)
            estimated = r.get("estimated_calls", 0) if kind == "real" else 0
            note = f" (estimated for {estimated:,} of {r['llm_calls']:,} calls)" if estimated else ""
            table.append([
                f"`{s}`", kind, f"{r['llm_calls']:,}", f"{r['prompt_tokens']:,}{note}",
                f"{r['cached_tokens']:,}" if kind == "real" else "–", f"{r['completion_tokens']:,}{note}",
                f"{r['latency_s']:.0f}" if kind == "real" else f"{r['latency_s']:.1f} (modelled)",
                f"{r['relevant_kept_pct']:.0f}% ({r['relevant_kept']}/{r['relevant_retrieved']})",
                f"{r['irrelevant_through_pct']:.0f}% ({r['irrelevant_through']}/{r['irrelevant_retrieved']})",
                "–" if r.get("auc") is None else f"{r['auc']:.2f}",
                f"{r['parse_failures']:,}", f"{r['fast_path_false_approvals']:,}",
            ])
    out.append(markdown_table(headers, table))
    if any(r.get("estimated_calls") for r in result["rows"]["real"]):
        out.append("\nToken counts said to be estimated are crag's tiktoken counts of the request and the reply: "
                   "the server reported no usable usage for those calls.\n")
    detail = []
    for s in a["strategies"]:
        for kind in ("real", "simulated"):
            r = next(x for x in result["rows"][kind] if x["strategy"] == s)
            by_grade = r.get("kept_pct_by_grade", {})
            rounds = r.get("questions_by_rounds", {})
            detail.append([
                f"`{s}`", kind,
                *[f"{by_grade[g]:.0f}%" if g in by_grade else "–" for g in ("3", "2", "1", "0")],
                " / ".join(str(rounds.get(str(n), 0)) for n in (1, 2, 3)),
                ", ".join(f"{k} {v}" for k, v in sorted(r.get("actions", {}).items())),
            ])
    out.append("\nKept, by expert grade (3 = answers, 2 = relevant, 1 = related, 0 = unrelated), rounds per question "
               "and final actions:\n\n")
    out.append(markdown_table(["strategy", "grader", "grade 3 kept", "grade 2 kept", "grade 1 kept", "grade 0 kept",
                               "questions with 1 / 2 / 3 rounds", "final actions"], detail))
    out.append("\nTokens of the simulated grader are tiktoken counts (o200k_base) of the same prompts; its "
               "time is the benchmark's latency model, not a measurement.\n")
    for kind, v in result["memory_vs_batch"].items():
        if v:
            out.append(f"\n`batch_rules_memory` vs `batch` ({kind} grader): {v['tokens_saved_pct']:.1f}% fewer "
                       f"grading tokens, {v['extra_irrelevant_pts']:+.1f} pts irrelevant passages let through "
                       f"(target ≥ 25% and ≤ +2 pts: {'met' if v['meets'] else 'missed'}).\n")
    return "".join(out)


def render_chart(result: dict[str, Any], path: Path) -> Path | None:
    plt = load_pyplot()
    if plt is None:
        return None
    strategies = result["args"]["strategies"]
    get = {kind: {r["strategy"]: r for r in rows} for kind, rows in result["rows"].items()}
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    xs = range(len(strategies))
    w = 0.38
    ax = axes[0]
    for off, kind, colour in ((-w / 2, "real", "#1f77b4"), (w / 2, "simulated", "#aec7e8")):
        rows = [get[kind][s] for s in strategies]
        fresh = [r["prompt_tokens"] - r["cached_tokens"] for r in rows]
        cached = [r["cached_tokens"] for r in rows]
        comp = [r["completion_tokens"] for r in rows]
        pos = [x + off for x in xs]
        ax.bar(pos, fresh, w, color=colour, label=f"{kind}: prompt")
        ax.bar(pos, cached, w, bottom=fresh, color=colour, hatch="//", alpha=0.6, label=f"{kind}: prompt, cached")
        ax.bar(pos, comp, w, bottom=[f + c for f, c in zip(fresh, cached)], color="#ff7f0e", label="completion" if kind == "real" else None)
    ax.set(xticks=list(xs), xticklabels=[s.replace("_", "_\n", 1) for s in strategies], title="Grading tokens")
    ax.legend(fontsize=7)
    ax = axes[1]
    real = [get["real"][s] for s in strategies]
    ax.bar(list(xs), [r["latency_s"] for r in real], 0.6, color="#1f77b4")
    ax.set(xticks=list(xs), xticklabels=[s.replace("_", "_\n", 1) for s in strategies],
           title="Real grading time (s, wall clock)")
    ax = axes[2]
    for off, kind, alpha in ((-w / 2, "real", 1.0), (w / 2, "simulated", 0.45)):
        rows = [get[kind][s] for s in strategies]
        ax.bar([x + off - w / 4 for x in xs], [r["relevant_kept_pct"] for r in rows], w / 2, color="#2ca02c",
               alpha=alpha, label=f"relevant kept ({kind})")
        ax.bar([x + off + w / 4 for x in xs], [r["irrelevant_through_pct"] for r in rows], w / 2, color="#d62728",
               alpha=alpha, label=f"irrelevant through ({kind})")
    ax.set(xticks=list(xs), xticklabels=[s.replace("_", "_\n", 1) for s in strategies], ylim=(0, 115),
           title="Decisions vs expert labels (%)")
    ax.legend(fontsize=7, ncol=2)
    a = result["args"]
    how = "top k graded once" if a.get("workload") == "single" else "up to 3 rounds"
    fig.suptitle(f"Real grader {a['model']}: {len(result['questions_done'])} TREC DL questions, {how}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":  # what holds the real grader is run through the grading cost benchmark
    raise SystemExit("benchmarks.real_grader runs through the grading cost benchmark: "
                     "python -m benchmarks.grading_cost --base-url URL --model M (see its --help)")
