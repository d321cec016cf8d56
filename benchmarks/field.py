"""Field benchmark: crag against a real OpenAI-compatible server, on questions with known answers.

Run from the repository root (``make field`` runs it with ``FIELD_ARGS``)::

    .venv/bin/python -m benchmarks.field --base-url http://127.0.0.1:8091/v1 --model qwen --questions 8
    .venv/bin/python -m benchmarks.field --offline --questions 8     # the offline backend, same questions

It indexes the two shared documentation corpora (``../shared/corpora``) once with the hash
embedder, then runs ``python -m crag ask --json --kb CORPUS QUESTION`` for each selected
question of ``benchmarks/questions.jsonl`` (every n-th one, so both corpora are covered),
exactly as a user would. Between crag and the server sits a small recording proxy on
127.0.0.1, so every request is measured as the server saw it: the node (``X-Crag-Node``),
``max_tokens``, prompt / cached / completion tokens from the server's ``usage``,
``finish_reason``, HTTP status and latency.

Reported, per node: requests, parse failures (a route or grade reply crag could not read,
a plan with no usable call), replies cut by ``max_tokens``, prompt / cached / completion
tokens and latency; per answer: whether a cited file is the gold file, rounds, LLM calls,
prompt tokens, and failures (exit status, timeouts); and the largest request (prompt +
``max_tokens``) against ``KB_AGENT_CONTEXT_TOKENS``. Results go to
``benchmarks/results/field-NAME.json`` and ``.md`` (``--name``, ``--out``). This is never
part of ``make test``: a CPU-only server takes minutes per question.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .common import (
    RESULTS_DIR,
    SHARED,
    at_least,
    check_server_url,
    crag_settings,
    environment,
    llm_timeout,
    markdown_table,
    out_dir,
    positive,
    results_name,
    run_main,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = Path(__file__).with_name("questions.jsonl")
NODES = ("analyze_and_route", "plan", "grade_evidence", "synthesize")


# --------------------------------------------------------------------------------------
# The recording proxy
# --------------------------------------------------------------------------------------


class Recorder:
    """A forwarding HTTP proxy on 127.0.0.1 that records every chat request it passes on."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream.rstrip("/"))
        self.records: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                recorder.forward(self, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                recorder.forward(self, self.rfile.read(length) if length else b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        prefix = self.upstream.path or ""
        return f"http://127.0.0.1:{self.server.server_address[1]}{prefix}"

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def forward(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        up = self.upstream
        conn_cls = http.client.HTTPSConnection if up.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(up.hostname, up.port, timeout=3600)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("host", "content-length", "connection")}
        started = time.perf_counter()
        try:
            conn.request(h.command, h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status = resp.status
            content_type = resp.getheader("Content-Type", "application/json")
        except OSError as exc:
            data, status, content_type = json.dumps({"error": {"message": str(exc)}}).encode(), 502, "application/json"
        finally:
            conn.close()
        latency_ms = (time.perf_counter() - started) * 1000.0
        if h.path.endswith("/chat/completions"):
            self.record(h.headers.get("X-Crag-Node"), body, status, data, latency_ms)
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def record(self, node: str | None, body: bytes, status: int, data: bytes, latency_ms: float) -> None:
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        try:
            reply = json.loads(data)
        except ValueError:
            reply = {}
        usage = reply.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        choices = reply.get("choices") or [{}]
        fmt = request.get("response_format")
        with self.lock:
            self.records.append({
                "node": node,
                "status": status,
                "max_tokens": request.get("max_tokens", request.get("max_completion_tokens")),
                "temperature": request.get("temperature"),
                "response_format": fmt.get("type") if isinstance(fmt, dict) else None,
                "prompt_tokens": usage.get("prompt_tokens"),
                "cached_tokens": details.get("cached_tokens") or 0,
                "completion_tokens": usage.get("completion_tokens"),
                "finish_reason": choices[0].get("finish_reason") if choices else None,
                "latency_ms": round(latency_ms, 1),
                "error": (reply.get("error") or {}).get("message") if status >= 400 else None,
            })

    def take(self) -> list[dict[str, Any]]:
        with self.lock:
            out, self.records = self.records, []
        return out


# --------------------------------------------------------------------------------------
# Running questions
# --------------------------------------------------------------------------------------


def load_questions(n: int, offset: int = 0, path: Path = QUESTIONS) -> list[dict[str, str]]:
    questions = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except ValueError:
                q = None
            if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not isinstance(q.get("corpus"), str):
                raise ValueError(f"{path} line {number} is not a question as JSON {{question, path, corpus}}")
            questions.append(q)
    if not questions:
        raise ValueError(f"{path} holds no questions")
    if n > len(questions):  # each question once: a repeated one would be counted twice
        print(f"benchmarks.field: --questions {n}: {path} holds {len(questions)}, each asked once", file=sys.stderr)
        n = len(questions)
    step = max(1, len(questions) // max(1, n))
    picked = [questions[(offset + i * step) % len(questions)] for i in range(n)]
    return picked


def corpus_root(q: dict[str, str]) -> Path:
    return SHARED / "corpora" / q["corpus"] / "corpus"


def gold_path(q: dict[str, str]) -> Path | None:
    """The file that answers ``q``; None for a question the corpus does not answer."""
    return SHARED / "corpora" / q["corpus"] / q["path"] if q.get("path") else None


# How an answer says the knowledge base does not hold what was asked: the no-evidence
# sentence, the opening of an answer grounding found unsupported (grounding.verdict), or the
# note of an answer the iteration cap forced from weak evidence.
NOT_FOUND_MARKS = ("I couldn't find relevant information", "The knowledge base does not appear to answer",
                   "_Note: the evidence for this answer is weak")


def says_not_found(answer: str) -> bool:
    return any(mark in answer for mark in NOT_FOUND_MARKS)


def crag_env(index_dir: str, base_url: str | None, model: str, context_tokens: int, timeout: float,
             answer_tokens: int = 1024) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update({
        "KB_AGENT_INDEX_DIR": index_dir,
        "KB_AGENT_CONTEXT_TOKENS": str(context_tokens),
        "KB_AGENT_MAX_ANSWER_TOKENS": str(answer_tokens),
        "KB_AGENT_LLM_TIMEOUT": str(timeout),
        "KB_AGENT_LLM_MAX_RETRIES": "0",
        "KB_AGENT_MODEL": model,
        "PYTHONPATH": str(ROOT),
    })
    if base_url is None:
        env["KB_AGENT_LLM"] = "offline"
    else:
        env.update({"KB_AGENT_LLM": "openai", "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "not-needed"})
    return env


def ask(q: dict[str, str], env: dict[str, str], cwd: Path, wall_timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "crag", "ask", "--json", "--kb", str(corpus_root(q)), q["question"]]
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=wall_timeout)
    except subprocess.TimeoutExpired:
        return {"exit": None, "error": f"no answer within {wall_timeout:g} s", "seconds": wall_timeout}
    seconds = time.perf_counter() - started
    if proc.returncode != 0:  # crag's error line, not the notes before it
        lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        error = next((line for line in reversed(lines) if line.startswith("crag: error:")), lines[-1])
        return {"exit": proc.returncode, "error": error[:300], "seconds": seconds}
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        return {"exit": proc.returncode, "error": "stdout is not JSON", "seconds": seconds}
    return {"exit": 0, "result": result, "seconds": seconds}


def summarize_answer(q: dict[str, str], run: dict[str, Any], requests: list[dict[str, Any]], cwd: Path) -> dict[str, Any]:
    out: dict[str, Any] = {
        "question": q["question"],
        "corpus": q["corpus"],
        "gold": q["path"],
        "exit": run.get("exit"),
        "error": run.get("error"),
        "seconds": round(run.get("seconds", 0.0), 1),
        "requests": requests,
    }
    result = run.get("result")
    if result is None:
        out.update(gold_cited=False, answerable=bool(q.get("path")), says_not_found=False, rounds=None,
                   llm_calls=len(requests), prompt_tokens=None, audit={})
        return out
    gold = gold_path(q).resolve() if gold_path(q) else None
    cited = [(cwd / c["path"]).resolve() for c in result.get("citations", [])]
    audit: dict[str, int] = {}
    for event in result.get("audit", []):
        audit[event["event"]] = audit.get(event["event"], 0) + 1
    plan_unusable = sum(
        1 for e in result.get("audit", [])
        if e["event"] == "plan_call_rejected" and str(e.get("reason", "")).startswith("no valid tool call")
    )
    usage = result.get("usage", {})
    out.update(
        gold_cited=gold is not None and gold in cited,
        answerable=gold is not None,
        says_not_found=says_not_found(result.get("answer", "")),
        verdict=(result.get("grounding") or {}).get("verdict"),
        complexity=result.get("complexity"),
        rounds=result.get("iterations"),
        llm_calls=usage.get("llm_calls"),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        cited=[c["path"] for c in result.get("citations", [])],
        no_evidence=result.get("answer", "").startswith("I couldn't find relevant information"),
        audit=audit,
        parse_failures={
            "analyze_and_route": audit.get("classification_unavailable", 0),
            "plan": plan_unusable,
            "grade_evidence": audit.get("grader_parse_failure", 0),
        },
        answer=result.get("answer", "").split("\n---\n")[0][:600],
    )
    return out


def node_table(answers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for node in NODES:
        reqs = [r for a in answers for r in a["requests"] if r["node"] == node]
        parse = sum((a.get("parse_failures") or {}).get(node, 0) for a in answers)
        table[node] = {
            "requests": len(reqs),
            "errors": sum(1 for r in reqs if r["status"] >= 400),
            "parse_failures": parse if node != "synthesize" else None,
            "cut_by_max_tokens": sum(1 for r in reqs if r["finish_reason"] == "length"),
            "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in reqs),
            "cached_tokens": sum(r["cached_tokens"] or 0 for r in reqs),
            "completion_tokens": sum(r["completion_tokens"] or 0 for r in reqs),
            "max_prompt_tokens": max((r["prompt_tokens"] or 0 for r in reqs), default=0),
            "latency_s": round(sum(r["latency_ms"] for r in reqs) / 1000.0, 1),
            "response_formats": sorted({str(r["response_format"]) for r in reqs}),
        }
    return table


def run(args: argparse.Namespace, save: Any = None) -> dict[str, Any]:
    """Every question, one by one; ``save(report)`` is called after each, so a long run that
    is stopped early still leaves its figures so far. Without ``--index-dir`` the corpora are
    indexed into a temporary folder, removed when the run ends (also on an error or Ctrl-C)."""
    questions = load_questions(args.questions, args.offset, args.questions_file)
    cwd = SHARED / "corpora"
    if not cwd.is_dir():  # before a temporary index folder is made for nothing
        raise ValueError(f"the shared corpora are not at {cwd} (CRAG_SHARED=DIR to point elsewhere)")
    if args.index_dir:
        return _run(args, questions, cwd, args.index_dir, save)
    with tempfile.TemporaryDirectory(prefix="crag-field-") as index_dir:
        return _run(args, questions, cwd, index_dir, save)


def _run(args: argparse.Namespace, questions: list[dict[str, Any]], cwd: Path, index_dir: str,
         save: Any) -> dict[str, Any]:
    offline = args.offline
    env = crag_env(index_dir, None, args.model, args.context_tokens, args.timeout, args.max_answer_tokens)
    env.update(args.settings)
    roots = sorted({str(corpus_root(q)) for q in questions})
    print(f"indexing {len(roots)} corpora into {index_dir} ...", file=sys.stderr)
    indexed = subprocess.run([sys.executable, "-m", "crag", "index", *roots], env=env, cwd=cwd, check=False,
                             stdout=subprocess.DEVNULL)
    if indexed.returncode:  # crag has said why, in one line on stderr
        raise SystemExit(indexed.returncode)
    answers = []
    recorder = None if offline else Recorder(args.base_url)
    try:
        if recorder is not None:
            recorder.__enter__()
            env = crag_env(index_dir, recorder.base_url, args.model, args.context_tokens, args.timeout,
                           args.max_answer_tokens)
            env.update(args.settings)
        for n, q in enumerate(questions, 1):
            print(f"[{n}/{len(questions)}] {q['question']}", file=sys.stderr, flush=True)
            outcome = ask(q, env, cwd, args.wall_timeout)
            requests = recorder.take() if recorder is not None else []
            summary = summarize_answer(q, outcome, requests, cwd)
            if recorder is not None and summary["error"]:  # the server the user gave, not the proxy
                summary["error"] = summary["error"].replace(recorder.base_url, args.base_url.rstrip("/"))
            answers.append(summary)
            if save is not None:
                save(report(args, answers))
            print(f"    gold cited: {summary['gold_cited']}  rounds: {summary['rounds']}  "
                  f"calls: {summary['llm_calls']}  prompt tokens: {summary['prompt_tokens']}  "
                  f"{summary['seconds']} s  {summary['error'] or ''}", file=sys.stderr, flush=True)
    finally:
        if recorder is not None:
            recorder.__exit__()
    return report(args, answers)


def report(args: argparse.Namespace, answers: list[dict[str, Any]]) -> dict[str, Any]:
    offline = args.offline
    all_requests = [r for a in answers for r in a["requests"]]
    largest = max(all_requests, key=lambda r: (r["prompt_tokens"] or 0) + (r["max_tokens"] or 0), default=None)
    done = [a for a in answers if a["exit"] == 0]
    return {
        "backend": "offline" if offline else "openai",
        "base_url": None if offline else args.base_url,
        "model": "offline" if offline else args.model,
        "context_tokens": args.context_tokens,
        "max_answer_tokens": args.max_answer_tokens,
        "questions": len(answers),
        "answered": len(done),
        "timeouts": sum(1 for a in answers if "within" in str(a.get("error") or "") or "did not answer" in str(a.get("error") or "")),
        "gold_cited": sum(1 for a in answers if a["gold_cited"]),
        "answerable": sum(1 for a in answers if a.get("answerable", True)),
        "unanswerable": sum(1 for a in answers if not a.get("answerable", True)),
        "unanswerable_said_not_found": sum(1 for a in answers if not a.get("answerable", True)
                                           and a.get("says_not_found")),
        "grader_uninformative": sum((a.get("audit") or {}).get("grader_uninformative", 0) for a in answers),
        "no_evidence": sum(1 for a in answers if a.get("no_evidence")),
        "prompt_tokens_per_question": round(sum(a.get("prompt_tokens") or 0 for a in done) / max(1, len(done)), 1),
        "llm_calls_per_question": round(sum(a.get("llm_calls") or 0 for a in done) / max(1, len(done)), 2),
        "largest_request": None if largest is None else {
            "node": largest["node"], "prompt_tokens": largest["prompt_tokens"], "max_tokens": largest["max_tokens"],
            "total": (largest["prompt_tokens"] or 0) + (largest["max_tokens"] or 0),
        },
        "by_node": node_table(answers),
        "answers": answers,
        "command": " ".join(["python -m benchmarks.field", *sys.argv[1:]]),
        "environment": environment(["openai", "tiktoken"]),
    }


def render_markdown(r: dict[str, Any]) -> str:
    lines = [
        f"# Field run: {r['model']} ({r['backend']})",
        "",
        f"Command: `{r['command']}`  ",
        f"Date: {r['environment']['date']}; context budget (KB_AGENT_CONTEXT_TOKENS): {r['context_tokens']}",
        "",
        f"- questions: {r['questions']}, answered: {r['answered']}, timeouts: {r['timeouts']}",
        f"- a gold file cited: **{r['gold_cited']} of {r.get('answerable', r['questions'])}** answerable; "
        f"no-evidence answers: {r['no_evidence']}",
        *([f"- questions the corpus does not answer: {r['unanswerable']}; the answer says the knowledge base does "
           f"not hold it (no-evidence sentence, grounding's opening, or the weak-evidence note): "
           f"**{r['unanswerable_said_not_found']} of {r['unanswerable']}**"] if r.get("unanswerable") else []),
        f"- gradings audited `grader_uninformative`: {r.get('grader_uninformative', 0)}",
        f"- prompt tokens per question: **{r['prompt_tokens_per_question']}**; LLM calls per question: "
        f"{r['llm_calls_per_question']}",
    ]
    if r["largest_request"]:
        big = r["largest_request"]
        lines.append(
            f"- largest request: {big['node']}, {big['prompt_tokens']} prompt + {big['max_tokens']} max_tokens = "
            f"{big['total']} of {r['context_tokens']}"
        )
    if r["backend"] != "offline":
        lines += ["", "## Per node", ""]
        rows = []
        for node, t in r["by_node"].items():
            rows.append([node, t["requests"], t["errors"], "" if t["parse_failures"] is None else t["parse_failures"],
                         t["cut_by_max_tokens"], t["prompt_tokens"], t["cached_tokens"], t["completion_tokens"],
                         t["max_prompt_tokens"], t["latency_s"], ", ".join(t["response_formats"])])
        lines.append(markdown_table(
            ["node", "requests", "HTTP errors", "parse failures", "cut by max_tokens", "prompt", "cached",
             "completion", "largest prompt", "latency s", "response_format"], rows))
    lines += ["", "## Per answer", ""]
    rows = []
    for a in r["answers"]:
        gold = ("yes" if a["gold_cited"] else "no") if a.get("answerable", True) else (
            "(none) says not found" if a.get("says_not_found") else "(none) answered")
        rows.append([a["question"][:70], a["corpus"], gold, a.get("complexity") or "",
                     a.get("rounds") if a.get("rounds") is not None else "", a.get("llm_calls") or 0,
                     a.get("prompt_tokens") if a.get("prompt_tokens") is not None else "", a["seconds"],
                     " ".join((a.get("error") or "").split()).replace("|", "/")[:120]])
    lines.append(markdown_table(
        ["question", "corpus", "gold cited", "route", "rounds", "LLM calls", "prompt tokens", "seconds", "error"], rows))
    return "\n".join(lines) + "\n"


def _env_count(p: argparse.ArgumentParser, name: str, default: str) -> int:
    """A count from the environment variable ``name`` (else ``default``), or the parser's error naming it."""
    value = os.environ.get(name, default)
    try:
        return at_least(1)(value)
    except argparse.ArgumentTypeError as e:
        p.error(f"{name} in the environment: {e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.field", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8091/v1"))
    p.add_argument("--model", default=os.environ.get("KB_AGENT_MODEL", "local"))
    p.add_argument("--offline", action="store_true", help="the offline backend instead of a server")
    p.add_argument("--questions", type=at_least(1), default=8, help="how many questions (spread over the set)")
    p.add_argument("--offset", type=at_least(0), default=0)
    p.add_argument("--questions-file", type=Path, default=QUESTIONS,
                   help="JSONL of {question, path, corpus}; path null: the corpus does not answer it "
                        "(e.g. benchmarks/unanswerable.jsonl)")
    p.add_argument("--context-tokens", type=at_least(1), default=_env_count(p, "KB_AGENT_CONTEXT_TOKENS", "8192"),
                   help="the context budget (default: KB_AGENT_CONTEXT_TOKENS, else 8192)")
    p.add_argument("--max-answer-tokens", type=at_least(1), default=_env_count(p, "KB_AGENT_MAX_ANSWER_TOKENS", "1024"),
                   help="the answer's reply budget (default: KB_AGENT_MAX_ANSWER_TOKENS, else 1024)")
    p.add_argument("--timeout", type=llm_timeout, default=600.0, help="KB_AGENT_LLM_TIMEOUT for crag, seconds")
    p.add_argument("--wall-timeout", type=positive, default=3600.0, help="most seconds one question may take")
    p.add_argument("--index-dir", default=None, help="reuse an index (default: a new temporary one, removed after the run)")
    p.add_argument("--name", type=results_name, default=None, help="results file name (field-NAME.json / .md)")
    p.add_argument("--out", type=out_dir, default=RESULTS_DIR)
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KB_AGENT_X=VALUE",
                   help="another crag setting for every question (repeatable), e.g. KB_AGENT_GRADE_MEMORY=on")
    args = p.parse_args(argv)
    if not args.offline:
        check_server_url(p, args.base_url)
    args.settings = crag_settings(p, args.settings)
    name = args.name or ("offline" if args.offline else "".join(c if c.isalnum() else "-" for c in args.model))

    def save(result: dict[str, Any]) -> None:
        write_json(args.out / f"field-{name}.json", result)
        write_text(args.out / f"field-{name}.md", render_markdown(result))

    result = run(args, save)
    save(result)
    print(render_markdown(result))
    if result["questions"] and not result["answered"]:
        first = next((a["error"] for a in result["answers"] if a.get("error")), None) or "no answer"
        first = first.strip().splitlines()[-1]
        print(f"{p.prog}: error: no question was answered, the first failed with: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.field"))
