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
to ``--record`` (JSONL) as it finishes, with the setup that produced it (``--model``,
``--base-url`` and ``--context-tokens``), and a later run asks only the questions its record
lacks for its own setup: another model's or server's readings are asked again, never
reported as this one's (a row written before rows carried a setup counts for any). The
report counts the questions of this run's ``--half``, ``--answerable`` and
``--unanswerable``, each once, whatever else the record holds. A question whose request the
server failed, or answered without token probabilities, is not recorded: the run stops on one
line (exit status 1) and a resumed run asks it again.
Never part of ``make test``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import attrs

from benchmarks.answers import SQUAD, holds_answer, llm_timeout, squad_questions
from benchmarks.common import (
    append_jsonl,
    at_least,
    check_server_url,
    read_jsonl,
    record_file,
    run_main,
    same_setup,
)

LABEL = "Does the evidence above state the answer to this exact question? Reply with one word: yes or no."
THRESHOLDS = (0.28, 0.30, 0.32, 0.34, 0.36, 0.38, 0.40)


class LabelProbe:
    """A chat model: crag's offline backend for every node but ``synthesize``, whose request is
    sent to the server through crag's OpenAI adapter with ``LABEL`` added, for one token and
    its probabilities. A request the server fails is kept in ``failed`` (the answer may go on
    without it) so the question is not recorded as asked."""

    def __init__(self, base_url: str, api_key: str, model: str, timeout: float) -> None:
        from crag.config import Settings
        from crag.llm.offline import OfflineChatModel
        from crag.llm.openai_chat import OpenAIChatModel

        self.offline = OfflineChatModel()
        settings = Settings(llm="openai", model=model, openai_base_url=base_url.rstrip("/"), openai_api_key=api_key,
                            llm_timeout=timeout, llm_max_retries=1)
        self.chat = OpenAIChatModel(settings)
        self.model = model
        self.base_url = base_url
        self.reading: dict[str, Any] | None = None
        self.failed: Exception | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.offline, name)

    def complete(self, request: Any, on_delta: Any = None) -> Any:
        from crag.errors import LLMError
        from crag.ports import Completion, SynthesizeTask

        if not isinstance(request.task, SynthesizeTask):
            return self.offline.complete(request, on_delta)
        messages = tuple(dict(m) for m in request.messages)
        messages[-1]["content"] += "\n\n" + LABEL
        asked = attrs.evolve(request, messages=messages, max_tokens=1, temperature=0.0, reply_schema=None,
                                    logprobs=10)
        try:
            reply = self.chat.complete(asked)
        except LLMError as exc:
            self.failed = exc
            raise
        if not reply.logprobs:  # no p_yes to read: a row of None is no measurement, and the run stops
            self.failed = ValueError(f"the server at {self.base_url} sent no token probabilities (logprobs) for "
                                     "the label, and this benchmark reads them (llama.cpp sends them)")
            return Completion("Read [1].", model=self.model, latency_ms=1.0)
        p = {"yes": 0.0, "no": 0.0}
        for alt, logprob in reply.logprobs[0].top:
            word = alt.strip().lower()
            if word in p:
                p[word] += math.exp(logprob)
        total = p["yes"] + p["no"]
        self.reading = {"p_yes": p["yes"] / total if total else None,
                        "evidence": "\n".join(item.text for item in request.task.items),
                        "prompt_tokens": reply.prompt_tokens}
        # a placeholder answer with a word in it: markers alone are asked for once more
        return Completion("Read [1].", model=self.model, latency_ms=1.0)


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


def interleave(questions: list[dict]) -> list[dict]:
    """Answerable and unanswerable questions taken in turn; the rest of the longer list after."""
    answerable = [q for q in questions if q["answerable"]]
    unanswerable = [q for q in questions if not q["answerable"]]
    pairs = itertools.zip_longest(answerable, unanswerable)
    return [q for pair in pairs for q in pair if q is not None]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.answerability", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8091/v1"))
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "not-needed"))
    p.add_argument("--model", default=os.environ.get("KB_AGENT_MODEL", "local"))
    p.add_argument("--half", choices=("heldout", "tuning"), default="tuning")
    p.add_argument("--answerable", type=at_least(0), default=30)
    p.add_argument("--unanswerable", type=at_least(0), default=30)
    p.add_argument("--squad", type=Path, default=SQUAD)
    p.add_argument("--context-tokens", type=at_least(1), default=4096, help="the server's context window")
    p.add_argument("--timeout", type=llm_timeout, default=600.0, help="seconds one LLM call may take")
    p.add_argument("--index-dir", type=Path, default=Path(tempfile.gettempdir()) / "crag-answers-index")
    p.add_argument("--record", type=record_file, default=None, help="JSONL of finished questions (resumable)")
    args = p.parse_args(argv)
    check_server_url(p, args.base_url)
    if not (args.squad / "questions.jsonl").is_file():
        p.error(f"missing data: no {args.squad / 'questions.jsonl'} (--squad says where; CRAG_SHARED=DIR for the shared data)")
    from crag import Agent

    if args.answerable == args.unanswerable == 0:
        raise ValueError("no questions: --answerable and --unanswerable are both 0")
    record = args.record or Path(tempfile.gettempdir()) / f"answerability-{args.half}.jsonl"
    ordered = interleave(squad_questions(args.squad, args.half, args.answerable, args.unanswerable, 0))
    if not ordered:
        raise ValueError(f"{args.squad / 'questions.jsonl'} holds no question of the {args.half} half")
    wanted = {q["id"] for q in ordered}
    setup = {"model": args.model, "base_url": args.base_url.rstrip("/"), "context_tokens": args.context_tokens}
    recorded = {r["id"]: r for r in read_jsonl(record)  # this run's questions, once each, of this setup
                if r.get("id") in wanted and same_setup(r, setup)}
    rows = [recorded[q["id"]] for q in ordered if q["id"] in recorded]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update({"KB_AGENT_INDEX_DIR": str(args.index_dir / "squad"), "KB_AGENT_LLM": "offline", "KB_AGENT_LOG": "off",
                "KB_AGENT_CONTEXT_TOKENS": str(args.context_tokens)})
    probe = LabelProbe(args.base_url, args.api_key, args.model, args.timeout)
    with Agent.from_env(kb=[str(args.squad / "corpus")], chat_model=probe, environ=env, dotenv=None) as agent:
        for q in ordered:
            if q["id"] in recorded:
                continue
            probe.reading = probe.failed = None
            agent.ask(q["question"])
            if probe.failed is not None:  # not asked: a resumed run asks it again
                raise probe.failed
            got = probe.reading or {}
            row = {"id": q["id"], "setup": setup, "question": q["question"], "answerable": q["answerable"],
                   "p_yes": got.get("p_yes"),
                   "held": holds_answer(got.get("evidence", ""), q["answers"]) if q["answers"] else None,
                   "prompt_tokens": got.get("prompt_tokens")}
            append_jsonl(record, row)
            rows.append(row)
            print(f"[{len(rows)}/{len(ordered)}] p_yes {row['p_yes']}  {q['question']}", flush=True)
    print(json.dumps(summarize(rows), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.answerability"))
