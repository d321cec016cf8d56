"""Does the model know when its evidence answers? An answerability label read from token probabilities.

Run from the repository root, against a server that returns ``logprobs`` (llama.cpp does)::

    .venv/bin/python -m benchmarks.answerability --base-url http://127.0.0.1:8091/v1 --half tuning

For each SQuAD 2.0 question of the shared split (``--half``, the same questions and order as
``benchmarks.answers``, answerable and unanswerable taken in turn), crag answers with its
offline backend for routing and planning, so the evidence is what crag's own searches find,
and its answer request (``synthesize``: the same system prompt, question and numbered
evidence the model would get) goes to the server with one line added to its last message:
whether the evidence states the answer to this exact question, one word, yes or no. The
reply is one token; ``p_yes`` is the probability of "yes" over "yes" and "no" (any case) among
its top alternatives. What a label in the answer call itself could read, at no extra call.

The report: the area under the ROC curve between answerable questions whose evidence holds a
gold answer and unanswerable ones, and for each threshold how many of each fall below it
(what a refusal at that threshold would cost and catch). Resumable: each question is appended
to ``--record`` (JSONL) as it finishes. Never part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.answers import SQUAD, holds_answer, squad_questions

LABEL = "Does the evidence above state the answer to this exact question? Reply with one word: yes or no."
THRESHOLDS = (0.28, 0.30, 0.32, 0.34, 0.36, 0.38, 0.40)


class LabelProbe:
    """A chat model: crag's offline backend for every node but ``synthesize``, whose request is
    sent to the server with ``LABEL`` added, for one token and its probabilities."""

    def __init__(self, base_url: str, api_key: str, model: str, timeout: float) -> None:
        from openai import OpenAI

        from crag.llm.offline import OfflineChatModel

        self.offline = OfflineChatModel()
        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=1)
        self.model = model
        self.reading: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.offline, name)

    def complete(self, request: Any, on_delta: Any = None) -> Any:
        from crag.ports import Completion, SynthesizeTask

        if not isinstance(request.task, SynthesizeTask):
            return self.offline.complete(request, on_delta)
        messages = [dict(m) for m in request.messages]
        messages[-1]["content"] += "\n\n" + LABEL
        reply = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=1, temperature=0,
                                                    logprobs=True, top_logprobs=10)
        p = {"yes": 0.0, "no": 0.0}
        content = reply.choices[0].logprobs.content if reply.choices[0].logprobs else []
        for alt in content[0].top_logprobs if content else []:
            word = alt.token.strip().lower()
            if word in p:
                p[word] += math.exp(alt.logprob)
        total = p["yes"] + p["no"]
        self.reading = {"p_yes": p["yes"] / total if total else None,
                        "evidence": "\n".join(item.text for item in request.task.items),
                        "prompt_tokens": reply.usage.prompt_tokens if reply.usage else None}
        return Completion("[1]", model=self.model, latency_ms=1.0)


def auc(pos: list[float], neg: list[float]) -> float | None:
    if not pos or not neg:
        return None
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def summarize(rows: list[dict]) -> dict[str, Any]:
    held = [r["p_yes"] for r in rows if r["answerable"] and r["held"] and r["p_yes"] is not None]
    answerable = [r["p_yes"] for r in rows if r["answerable"] and r["p_yes"] is not None]
    unanswerable = [r["p_yes"] for r in rows if not r["answerable"] and r["p_yes"] is not None]
    return {
        "questions": len(rows), "answerable": len(answerable), "answerable_evidence_holds_gold": len(held),
        "unanswerable": len(unanswerable),
        "auc_held_vs_unanswerable": auc(held, unanswerable), "auc_answerable_vs_unanswerable": auc(answerable, unanswerable),
        "p_yes_range": {"answerable": [min(answerable, default=None), max(answerable, default=None)],
                        "unanswerable": [min(unanswerable, default=None), max(unanswerable, default=None)]},
        "below": [{"threshold": t, "answerable": sum(p < t for p in answerable),
                   "unanswerable": sum(p < t for p in unanswerable)} for t in THRESHOLDS],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.answerability", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8091/v1"))
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "not-needed"))
    p.add_argument("--model", default=os.environ.get("KB_AGENT_MODEL", "local"))
    p.add_argument("--half", choices=("heldout", "tuning"), default="tuning")
    p.add_argument("--answerable", type=int, default=30)
    p.add_argument("--unanswerable", type=int, default=30)
    p.add_argument("--squad", type=Path, default=SQUAD)
    p.add_argument("--context-tokens", type=int, default=4096, help="the server's context window")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--index-dir", type=Path, default=Path(tempfile.gettempdir()) / "crag-answers-index")
    p.add_argument("--record", type=Path, default=None, help="JSONL of finished questions (resumable)")
    args = p.parse_args(argv)
    from crag import Agent

    record = args.record or Path(tempfile.gettempdir()) / f"answerability-{args.half}.jsonl"
    rows = [json.loads(line) for line in record.open()] if record.exists() else []
    done = {r["id"] for r in rows}
    questions = squad_questions(args.squad, args.half, args.answerable, args.unanswerable, 0)
    answerable = [q for q in questions if q["answerable"]]
    unanswerable = [q for q in questions if not q["answerable"]]
    ordered = [q for pair in zip(answerable, unanswerable, strict=False) for q in pair]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update({"KB_AGENT_INDEX_DIR": str(args.index_dir / "squad"), "KB_AGENT_LLM": "offline", "KB_AGENT_LOG": "off",
                "KB_AGENT_CONTEXT_TOKENS": str(args.context_tokens)})
    probe = LabelProbe(args.base_url, args.api_key, args.model, args.timeout)
    with Agent.from_env(kb=[str(args.squad / "corpus")], chat_model=probe, environ=env, dotenv=None) as agent, \
            record.open("a") as out:
        for q in ordered:
            if q["id"] in done:
                continue
            probe.reading = None
            agent.ask(q["question"])
            got = probe.reading or {}
            row = {"id": q["id"], "question": q["question"], "answerable": q["answerable"], "p_yes": got.get("p_yes"),
                   "held": holds_answer(got.get("evidence", ""), q["answers"]) if q["answers"] else None,
                   "prompt_tokens": got.get("prompt_tokens")}
            out.write(json.dumps(row) + "\n")
            out.flush()
            rows.append(row)
            print(f"[{len(rows)}/{len(ordered)}] p_yes {row['p_yes']}  {q['question']}", flush=True)
    print(json.dumps(summarize(rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
