"""Right answers, end to end: crag and the LangGraph CRAG tutorial on the same questions.

Run from the repository root (``make answers`` runs it with ``ANSWERS_ARGS``)::

    .venv/bin/python -m benchmarks.answers --base-url http://127.0.0.1:8091/v1 --model qwen2.5-coder-1.5b
    .venv/bin/python -m benchmarks.answers --offline --quick      # crag's offline backend, 2 + 2 questions

Four configurations answer the same questions over the same index:

- ``crag``: crag's defaults.
- ``crag-simple``: grading off. Every question is routed ``simple`` (analyze, plan, synthesize;
  no ``grade_evidence``). crag has no setting for this. The benchmark wraps the chat model and
  rewrites the routing reply's ``complexity``, so the analyze call is still made and counted.
- ``crag-complex``: the same wrapper routes every question ``complex``, so the evidence is
  always graded and the loop may act (REFINE, RE_RETRIEVE).
- ``tutorial``: the graph of the LangGraph CRAG tutorial as published ("Corrective RAG (CRAG)",
  langgraph's examples). It retrieves 4 documents, grades each with one yes/no call, and
  when any is not relevant rewrites the question and searches again (3 more hits joined into
  one document, where the tutorial calls a web search). Then it generates from the relevant
  documents and that search with the rlm/rag-prompt. Its retrieval is crag's own search
  (``Agent.search``, the same index), and its model is the same server through the openai
  SDK. It is compiled with langgraph's ``StateGraph`` when langgraph is installed (the
  ``bench`` extra). Otherwise the same nodes and edges run in a plain loop, and the results
  say which (``runner``, kept in each record row: a resumed run's answers may come from an
  earlier run's). It needs a server: ``--offline`` leaves it out.

Two question sets:

- ``squad``: the shared SQuAD 2.0 split (``--squad``, ``retrieval/squad_wiki`` in the shared data: 490 Wikipedia
  articles, questions about 24 of them with gold answer strings, about half unanswerable). The
  24 articles are split in two by a hash of their names: ``tuning`` and ``heldout`` (reported
  by default, ``--half``). From that half, ``--answerable`` and ``--unanswerable`` questions
  are taken round-robin over its articles, each article's questions shuffled with ``--seed``.
- ``docs``: the two shared documentation corpora (``corpora`` in the shared data, ``--shared``) with
  ``benchmarks/questions.jsonl`` (spread over the file) and ``benchmarks/unanswerable.jsonl``.

Every data path of the chosen sets is looked for before any work: one missing is one line
naming it, exit status 2 (not a docs corpus missing found after the whole SQuAD set was asked).

Scoring (one table, per set and configuration):

- *right*: for SQuAD, a gold answer string is in the answer's body (SQuAD's normalisation:
  lower case, no punctuation, no articles, collapsed whitespace; a possessive holds its name:
  "Charles Darwin's theory" holds "Charles Darwin") and the answer does not refuse. For the
  docs set, the gold page is cited (the tutorial does not cite: the gold page is among the
  documents it generated from) and the answer does not refuse.
- *refused though answerable*.
- *honest when unanswerable*: the answer refuses.
- An answer refuses when it opens with one of crag's fixed sentences (no evidence, "does not
  appear to answer") or says in its first 300 characters that the context does not hold the
  answer ("I don't know", "does not mention", ...; ``REFUSAL_PHRASES``). The same test
  applies to every configuration.
- Calls, prompt tokens and seconds per question, over the questions answered (a failed one's
  row holds no count of what it spent before it failed). For crag also: whether the loop acted
  (``grade_evidence`` followed by another round: REFINE or RE_RETRIEVE), whether the first
  round's evidence held a gold answer, and right answers by route.

Resumable: each finished question is appended to ``--record`` (default
``benchmarks/results/answers-NAME.jsonl``), keyed by model, configuration, set and question,
with the setup that produced it: the server (``--base-url``), crag's settings (``--set``) and
its window (``--context-tokens``). A rerun skips what it holds for its own setup, except
questions that failed (server down, timeout), which it asks again; rows of another setup are
asked again, never reported under this run's command line (a row written before rows carried
a setup counts for any, so older records stay resumable). Every question failing is exit
status 1. Results: ``benchmarks/results/answers-NAME.json`` and ``.md``
(``--name``). Never part of ``make test``: a CPU-only server takes about a minute per answer.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import re
import string
import sys
import tempfile
import time
import unicodedata
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import (
    SHARED,
    append_jsonl,
    at_least,
    check_server_url,
    command_line,
    crag_settings,
    environment,
    fmt,
    llm_timeout,
    markdown_table,
    out_dir,
    quick_out,
    read_jsonl,
    record_file,
    results_name,
    run_main,
    same_setup,
    write_json,
    write_text,
)

SQUAD = SHARED / "retrieval" / "squad_wiki"
DOCS_QUESTIONS = Path(__file__).with_name("questions.jsonl")
DOCS_UNANSWERABLE = Path(__file__).with_name("unanswerable.jsonl")
CONFIGS = ("crag", "crag-simple", "crag-complex", "tutorial")
SETS = ("squad", "docs")
FORCED_ROUTE = {"crag-simple": "simple", "crag-complex": "complex"}


# --------------------------------------------------------------------------------------
# Questions
# --------------------------------------------------------------------------------------


def split_articles(titles: list[str]) -> dict[str, list[str]]:
    """The articles in two halves, ``tuning`` and ``heldout``, by a hash of each name."""
    ordered = sorted(set(titles), key=lambda t: hashlib.sha256(t.encode()).hexdigest())
    half = len(ordered) // 2
    return {"tuning": sorted(ordered[:half]), "heldout": sorted(ordered[half:])}


def round_robin(by_article: dict[str, list[dict]], n: int) -> list[dict]:
    picked: list[dict] = []
    queues = [list(rows) for _, rows in sorted(by_article.items())]
    while len(picked) < n and any(queues):
        for rows in queues:
            if rows and len(picked) < n:
                picked.append(rows.pop(0))
    return picked


def squad_questions(squad: Path, half: str, answerable: int, unanswerable: int, seed: int) -> list[dict]:
    rows = [json.loads(line) for line in (squad / "questions.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    articles = split_articles([r["gold_file"] for r in rows])[half]
    out = []
    for want, n in ((True, answerable), (False, unanswerable)):
        by_article: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            if r["gold_file"] in articles and bool(r["answerable"]) is want:
                by_article[r["gold_file"]].append(r)
        for title, group in by_article.items():
            random.Random(f"{seed}:{title}:{want}").shuffle(group)
        for r in round_robin(by_article, n):
            out.append({"set": "squad", "id": r["id"], "question": r["question"], "answers": list(r["answers"]),
                        "answerable": bool(r["answerable"]), "gold": r["gold_file"] if r["answerable"] else None,
                        "root": str(squad / "corpus"), "article": r["gold_file"]})
    return out


def spread(rows: list[dict], n: int) -> list[dict]:
    step = max(1, len(rows) // max(1, n))
    return [rows[(i * step) % len(rows)] for i in range(min(n, len(rows)))]


def docs_questions(answerable: int, unanswerable: int, shared: Path = SHARED) -> list[dict]:
    out = []
    for path, n in ((DOCS_QUESTIONS, answerable), (DOCS_UNANSWERABLE, unanswerable)):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for r in spread(rows, n):
            base = shared / "corpora" / r["corpus"]
            qid = hashlib.sha256(r["question"].encode()).hexdigest()[:16]
            out.append({"set": "docs", "id": qid, "question": r["question"], "answers": [],
                        "answerable": r.get("path") is not None, "gold": str(base / r["path"]) if r.get("path") else None,
                        "root": str(base / "corpus"), "article": r["corpus"]})
    return out


# --------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces.
    Punctuation is every Unicode punctuation character, not ASCII's alone: "Cretaceous-Paleogene"
    written with a hyphen is the gold "Cretaceous–Paleogene" (an en dash)."""
    text = "".join(ch for ch in text.lower()
                   if ch not in set(string.punctuation) and not unicodedata.category(ch).startswith("P"))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_POSSESSIVE = re.compile(r"(?<=\w)['’]s\b")


def holds_answer(text: str, answers: list[str]) -> bool:
    """Whether ``text`` writes one of the gold ``answers`` (normalised), also as a possessive:
    "Charles Darwin's theory" holds "Charles Darwin"."""
    bodies = {f" {normalize(text)} ", f" {normalize(_POSSESSIVE.sub('', text))} "}
    return any(f" {normalize(a)} " in body for a in answers if normalize(a) for body in bodies)


# crag's fixed openings (crag.answer: the no-evidence sentence and grounding's refusal).
CRAG_REFUSALS = ("I couldn't find relevant information", "The knowledge base does not appear to answer")
REFUSAL_PHRASES = (
    "don't know", "do not know", "not sure", "cannot answer", "can't answer", "unable to answer",
    "unable to determine", "cannot be determined", "can't be determined", "cannot determine",
    "not possible to determine", "no information", "not mentioned", "not mention", "doesn't mention",
    "does not mention", "do not mention", "does not provide", "do not provide", "doesn't provide",
    "not provided", "does not contain", "do not contain", "doesn't contain", "not specified",
    "does not specify", "do not specify", "doesn't specify", "not stated", "does not state",
    "does not say", "there is no mention", "not found in", "no relevant information", "not available in",
)


def refuses(body: str, question: str = "") -> bool:
    """Whether an answer says the documents do not hold what was asked. A phrase the question
    itself holds is its words, not a refusal ("... rock units which do not contain radioactive
    isotopes" repeated in the answer's opening)."""
    text = body.strip()
    if text.startswith(CRAG_REFUSALS):
        return True
    opening = text[:300].lower().replace("\u2019", "'")
    asked = question.lower().replace("\u2019", "'")
    return any(phrase in opening and phrase not in asked for phrase in REFUSAL_PHRASES)


def score(q: dict, body: str, sources: list[str]) -> dict[str, Any]:
    """``right`` / ``refused`` for one answer (``sources``: the files it cites or drew on)."""
    refused = refuses(body, q.get("question", ""))
    if not q["answerable"]:
        return {"right": False, "refused": refused}
    if q["set"] == "squad":
        found = holds_answer(body, q["answers"])
    else:
        gold = Path(q["gold"]).resolve()
        found = any(Path(s).resolve() == gold for s in sources)
    return {"right": found and not refused, "refused": refused}


# --------------------------------------------------------------------------------------
# crag
# --------------------------------------------------------------------------------------


class Routed:
    """A ``ChatModel`` whose routing replies say ``complexity``: the model is asked as usual
    (the call and its tokens count) and its reply's complexity is replaced."""

    def __init__(self, inner: Any, complexity: str) -> None:
        self.inner = inner
        self.complexity = complexity

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def complete(self, request: Any, on_delta: Any = None) -> Any:
        import attrs

        from crag.prompts.route import parse_route

        completion = self.inner.complete(request, on_delta)
        if request.node != "analyze_and_route":
            return completion
        tools = getattr(request.task, "available_tools", ())
        plan = parse_route(completion.text, tools)
        suggested = list(plan.suggested_tools) if plan is not None else []
        text = json.dumps({"complexity": self.complexity, "suggested_tools": suggested})
        return attrs.evolve(completion, text=text)


def crag_environ(args: argparse.Namespace, index_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update({"KB_AGENT_INDEX_DIR": str(index_dir), "KB_AGENT_CONTEXT_TOKENS": str(args.context_tokens),
                "KB_AGENT_LLM_TIMEOUT": str(args.timeout), "KB_AGENT_LLM_MAX_RETRIES": "1",
                "KB_AGENT_MODEL": args.model, "KB_AGENT_LOG": "off"})
    if args.offline:
        env["KB_AGENT_LLM"] = "offline"
    else:
        env.update({"KB_AGENT_LLM": "openai", "OPENAI_BASE_URL": args.base_url, "OPENAI_API_KEY": args.api_key})
    env.update(args.settings)
    return env


def make_agent(config: str, root: str, environ: dict[str, str]):
    """An agent over ``root`` for a crag configuration, and its chat model (the caller closes both)."""
    from crag import Agent
    from crag.config import Settings
    from crag.llm import make_chat_model

    model = make_chat_model(Settings.from_env(environ, None))
    wrapped = Routed(model, FORCED_ROUTE[config]) if config in FORCED_ROUTE else model
    return Agent.from_env(kb=[root], chat_model=wrapped, environ=environ, dotenv=None), model


def loop_acted(trace: list[str]) -> bool:
    """Whether grading sent the run round again (REFINE: plan; RE_RETRIEVE: analyze_and_route)."""
    return any(a == "grade_evidence" and b in ("plan", "analyze_and_route") for a, b in itertools.pairwise(trace))


def run_crag(agent, q: dict) -> dict[str, Any]:
    started = time.perf_counter()
    result = agent.ask(q["question"])
    seconds = time.perf_counter() - started
    state = result.state
    rounds = sorted({run.round for run in state.tool_history})
    first = " ".join(item.text for run in state.tool_history if rounds and run.round == rounds[0] for item in run.items)
    sources = [str(Path.cwd() / c.path) for c in result.citations]
    trace = list(result.trace)
    return {
        "body": result.body, "sources": sources, **score(q, result.body, sources),
        "calls": result.usage.llm_calls, "prompt_tokens": result.usage.prompt_tokens, "seconds": round(seconds, 2),
        "route": result.complexity.value if result.complexity is not None else None,
        "loop_acted": loop_acted(trace), "rounds": result.iterations, "trace": trace,
        "verdict": result.grounding.verdict if result.grounding is not None else None,
        "first_evidence_holds_answer": holds_answer(first, q["answers"]) if q["answers"] else None,
        "audit": sorted({e.event for e in state.audit}),
    }


# --------------------------------------------------------------------------------------
# The LangGraph CRAG tutorial
# --------------------------------------------------------------------------------------

# The tutorial's prompts, word for word (its typos included).
GRADE_SYSTEM = ("You are a grader assessing relevance of a retrieved document to a user question. \n \n"
                "    If the document contains keyword(s) or semantic meaning related to the question, grade it as "
                "relevant. \n\n"
                "    Give a binary score 'yes' or 'no' score to indicate whether the document is relevant to the question.")
GRADE_HUMAN = "Retrieved document: \n\n {document} \n\n User question: {question}"
REWRITE_SYSTEM = ("You a question re-writer that converts an input question to a better version that is optimized \n \n"
                  "     for web search. Look at the input and try to reason about the underlying semantic intent / meaning.")
REWRITE_HUMAN = "Here is the initial question: \n\n {question} \n Formulate an improved question."
RAG_PROMPT = ("You are an assistant for question-answering tasks. Use the following pieces of retrieved context to "
              "answer the question. If you don't know the answer, just say that you don't know. Use three sentences "
              "maximum and keep the answer concise.\nQuestion: {question} \nContext: {context} \nAnswer:")
GRADE_SCHEMA = {"type": "json_schema", "json_schema": {"name": "GradeDocuments", "strict": True, "schema": {
    "type": "object", "properties": {"binary_score": {"type": "string", "enum": ["yes", "no"],
                                                      "description": "Documents are relevant to the question, 'yes' or 'no'"}},
    "required": ["binary_score"], "additionalProperties": False}}}
RETRIEVE_K = 4  # the tutorial's retriever (a vector store's default k)
SEARCH_K = 3  # the tutorial's web search (TavilySearchResults(k=3))


class TutorialModel:
    """The tutorial's ``ChatOpenAI(temperature=0)``: the openai SDK on the same server, its
    calls and prompt tokens counted. The node name goes in ``X-Crag-Node`` so a recording
    proxy or a scripted server can tell the steps apart. A call, its retry included, ends
    within ``timeout`` (crag's total deadline): the SDK's own timeout bounds each network
    read, and a server sending its reply a byte at a time held the run for ever."""

    def __init__(self, base_url: str, api_key: str, model: str, timeout: float) -> None:
        import openai

        from crag.llm.deadline import deadline_http_client

        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=1,
                                    http_client=deadline_http_client(openai))
        self.timeout = timeout
        self.model = model
        self.calls = self.prompt_tokens = 0
        self.structured = True  # falls back to plain text when the server refuses a JSON schema

    def chat(self, node: str, messages: list[dict[str, str]], structured: bool = False) -> str:
        import openai

        from crag.llm.deadline import request_deadline

        extra: dict[str, Any] = {}
        if structured and self.structured:
            extra["response_format"] = GRADE_SCHEMA
        try:
            with request_deadline(self.timeout):
                reply = self.client.chat.completions.create(model=self.model, messages=messages, temperature=0,
                                                            extra_headers={"X-Crag-Node": node}, **extra)
        except openai.BadRequestError:
            if not extra:
                raise
            self.structured = False
            return self.chat(node, messages, structured)
        self.calls += 1
        self.prompt_tokens += (reply.usage.prompt_tokens or 0) if reply.usage else 0
        return (reply.choices[0].message.content or "") if reply.choices else ""

    def close(self) -> None:
        self.client.close()


def binary_score(text: str) -> str:
    """``yes`` or ``no`` from a grader reply (``no`` when it says neither)."""
    try:
        value = json.loads(text)
        if isinstance(value, dict) and str(value.get("binary_score", "")).strip().lower() in ("yes", "no"):
            return str(value["binary_score"]).strip().lower()
    except ValueError:
        pass
    found = re.search(r"\b(yes|no)\b", text.lower())
    return found.group(1) if found else "no"


def tutorial_nodes(model: TutorialModel, search) -> dict[str, Any]:
    """The tutorial's five nodes over ``search(query, k) -> evidence items`` (crag's search)."""

    def retrieve(state: dict) -> dict:
        return {"documents": list(search(state["question"], RETRIEVE_K)), "question": state["question"]}

    def grade_documents(state: dict) -> dict:
        filtered, web_search = [], "No"
        for d in state["documents"]:
            reply = model.chat("grade_documents", [
                {"role": "system", "content": GRADE_SYSTEM},
                {"role": "user", "content": GRADE_HUMAN.format(document=d.text, question=state["question"])},
            ], structured=True)
            if binary_score(reply) == "yes":
                filtered.append(d)
            else:
                web_search = "Yes"
        return {"documents": filtered, "question": state["question"], "web_search": web_search,
                "first": state["documents"]}

    def transform_query(state: dict) -> dict:
        better = model.chat("transform_query", [
            {"role": "system", "content": REWRITE_SYSTEM},
            {"role": "user", "content": REWRITE_HUMAN.format(question=state["question"])},
        ])
        return {"documents": state["documents"], "question": better.strip() or state["question"]}

    def web_search(state: dict) -> dict:
        hits = list(search(state["question"], SEARCH_K))
        joined = _Joined("\n".join(h.text for h in hits), [h.source for h in hits])
        return {"documents": [*state["documents"], joined], "question": state["question"]}

    def generate(state: dict) -> dict:
        context = "\n\n".join(d.text for d in state["documents"])
        answer = model.chat("generate", [{"role": "user", "content": RAG_PROMPT.format(
            question=state["question"], context=context)}])
        return {"documents": state["documents"], "question": state["question"], "generation": answer}

    return {"retrieve": retrieve, "grade_documents": grade_documents, "transform_query": transform_query,
            "web_search_node": web_search, "generate": generate}


class _Joined:
    """The tutorial's web results: one document of the hits' text, remembering their files."""

    def __init__(self, text: str, sources: list[str]) -> None:
        self.text = text
        self.sources = sources


def decide_to_generate(state: dict) -> str:
    return "transform_query" if state["web_search"] == "Yes" else "generate"


def build_tutorial(nodes: dict[str, Any]):
    """The tutorial's graph: ``(invoke(state) -> state, runner)``, with langgraph when installed."""
    try:
        from typing import TypedDict

        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return _plain_graph(nodes), "plain"

    class GraphState(TypedDict, total=False):
        question: str
        generation: str
        web_search: str
        documents: list
        first: list

    workflow = StateGraph(GraphState)
    for name, fn in nodes.items():
        workflow.add_node(name, fn)
    workflow.add_edge(START, "retrieve")
    workflow.add_edge("retrieve", "grade_documents")
    workflow.add_conditional_edges("grade_documents", decide_to_generate,
                                   {"transform_query": "transform_query", "generate": "generate"})
    workflow.add_edge("transform_query", "web_search_node")
    workflow.add_edge("web_search_node", "generate")
    workflow.add_edge("generate", END)
    return workflow.compile().invoke, "langgraph"


def _plain_graph(nodes: dict[str, Any]):
    """The same nodes and edges without langgraph: each node's reply merged into the state."""
    edges = {"retrieve": "grade_documents", "transform_query": "web_search_node", "web_search_node": "generate",
             "generate": None}

    def invoke(state: dict) -> dict:
        node: str | None = "retrieve"
        while node is not None:
            state = {**state, **nodes[node](state)}
            node = decide_to_generate(state) if node == "grade_documents" else edges[node]
        return state

    return invoke


def run_tutorial(graph, model: TutorialModel, q: dict) -> dict[str, Any]:
    model.calls = model.prompt_tokens = 0
    started = time.perf_counter()
    final = graph({"question": q["question"]})
    seconds = time.perf_counter() - started
    sources = [str(Path.cwd() / s) for d in final["documents"] for s in (d.sources if isinstance(d, _Joined) else [d.source])]
    body = final.get("generation", "")
    first = " ".join(d.text for d in final.get("first", []))
    return {
        "body": body, "sources": sources, **score(q, body, sources),
        "calls": model.calls, "prompt_tokens": model.prompt_tokens, "seconds": round(seconds, 2),
        "route": None, "loop_acted": final.get("web_search") == "Yes", "rewritten": final["question"],
        "first_evidence_holds_answer": holds_answer(first, q["answers"]) if q["answers"] else None,
    }


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


class Record:
    """Finished questions, one JSON object a line, keyed by model, configuration, set and question;
    with a ``setup`` (``run_setup``), only the rows that setup produced (or that carry none)."""

    def __init__(self, path: Path, setup: dict[str, Any] | None = None) -> None:
        self.path = path
        rows = [row for row in read_jsonl(path) if "key" in row and (setup is None or same_setup(row, setup))]
        # a question that failed (server down, timeout) is not finished: a later run asks it again
        self.rows: dict[str, dict] = {row["key"]: row for row in rows}
        self.rows = {key: row for key, row in self.rows.items() if not row.get("error")}

    @staticmethod
    def key(model: str, config: str, q: dict) -> str:
        return f"{model}|{config}|{q['set']}|{q['id']}"

    def add(self, row: dict) -> None:
        self.rows[row["key"]] = row
        append_jsonl(self.path, row)


def missing_data(args: argparse.Namespace) -> list[str]:
    """Each data path the chosen sets read that is not there: the SQuAD split's questions and
    corpus, the docs set's question files and the corpora they name. Checked before any work:
    a docs corpus missing was found only after the whole SQuAD set had been asked."""
    paths = []
    if "squad" in args.sets:
        paths += [args.squad / "questions.jsonl", args.squad / "corpus"]
    if "docs" in args.sets:
        paths += [DOCS_QUESTIONS, DOCS_UNANSWERABLE]
        named = {json.loads(line)["corpus"] for path in (DOCS_QUESTIONS, DOCS_UNANSWERABLE) if path.exists()
                 for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
        paths += [args.shared / "corpora" / corpus / "corpus" for corpus in sorted(named)]
    return [str(path) for path in paths if not path.exists()]


def run_setup(args: argparse.Namespace) -> dict[str, Any]:
    """What changes an answer besides the model and the question: the server, crag's settings
    and its window. Each record row carries it, so a resumed run with another server or other
    settings asks again rather than report the first run's answers under its own command line."""
    return {"base_url": None if args.offline else args.base_url.rstrip("/"), "settings": dict(sorted(args.settings.items())),
            "context_tokens": args.context_tokens}


def questions_for(args: argparse.Namespace) -> list[dict]:
    out = []
    if "squad" in args.sets:
        out += squad_questions(args.squad, args.half, args.answerable, args.unanswerable, args.seed)
    if "docs" in args.sets:
        out += docs_questions(args.docs_answerable, args.docs_unanswerable, args.shared)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    questions = questions_for(args)
    setup = run_setup(args)
    record = Record(args.record, setup)
    model_name = "offline" if args.offline else args.model
    configs = [c for c in args.configs if not (c == "tutorial" and args.offline)]
    runner = None  # the tutorial's, when this run asks it
    for set_name in SETS:
        qs = [q for q in questions if q["set"] == set_name]
        if not qs:
            continue
        index_dir = args.index_dir / set_name
        environ = crag_environ(args, index_dir)
        for root in sorted({q["root"] for q in qs}):
            from crag import Agent

            print(f"indexing {root} into {index_dir} ...", file=sys.stderr, flush=True)
            with Agent.from_env(kb=[root], environ={**environ, "KB_AGENT_LLM": "offline"}, dotenv=None):
                pass
            for config in configs:
                todo = [q for q in qs if q["root"] == root and Record.key(model_name, config, q) not in record.rows]
                if not todo:
                    continue
                agent, chat_model = make_agent("crag" if config == "tutorial" else config, root, environ)
                tutorial = graph = None
                if config == "tutorial":
                    tutorial = TutorialModel(args.base_url, args.api_key, args.model, args.timeout)
                    graph, runner = build_tutorial(tutorial_nodes(tutorial, agent.search))
                try:
                    for n, q in enumerate(todo, 1):
                        print(f"[{config} {set_name} {n}/{len(todo)}] {q['question']}", file=sys.stderr, flush=True)
                        try:
                            row = run_tutorial(graph, tutorial, q) if tutorial is not None else run_crag(agent, q)
                        except Exception as exc:  # one failed question (server down, timeout) is counted, not fatal
                            row = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "right": False, "refused": False,
                                   "calls": 0, "prompt_tokens": 0, "seconds": 0.0}
                        if tutorial is not None:
                            row["runner"] = runner
                        row.update(key=Record.key(model_name, config, q), setup=setup, model=model_name, config=config,
                                   set=set_name, id=q["id"], question=q["question"], answerable=q["answerable"],
                                   answers=q["answers"][:3], gold=q["gold"])
                        record.add(row)
                        print(f"    right: {row['right']}  refused: {row['refused']}  calls: {row['calls']}  "
                              f"{row['seconds']} s {row.get('error', '')}", file=sys.stderr, flush=True)
                finally:
                    if tutorial is not None:
                        tutorial.close()
                    agent.close()
                    close = getattr(chat_model, "close", None)
                    if close is not None:
                        close()
    keys = {Record.key(model_name, c, q) for c in configs for q in questions}
    rows = [r for k, r in record.rows.items() if k in keys]
    return report(args, rows, configs, questions, setup)


def summarize(rows: list[dict]) -> dict[str, Any]:
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    done = [r for r in rows if not r.get("error")]  # a failed question's row says 0 calls, 0 s
    n = max(1, len(done))
    by_route: dict[str, dict[str, int]] = {}
    for r in answerable:
        if r.get("route"):
            cell = by_route.setdefault(r["route"], {"answerable": 0, "right": 0, "prompt_tokens": 0})
            cell["answerable"] += 1
            cell["right"] += int(r["right"])
            cell["prompt_tokens"] += r["prompt_tokens"] or 0
    lacked = [r for r in answerable if r.get("first_evidence_holds_answer") is False]
    held = [r for r in answerable if r.get("first_evidence_holds_answer") is True]
    return {
        "questions": len(rows), "answerable": len(answerable), "unanswerable": len(unanswerable),
        "right": sum(r["right"] for r in answerable),
        "refused_answerable": sum(r["refused"] for r in answerable),
        "honest_unanswerable": sum(r["refused"] for r in unanswerable),
        "errors": sum(1 for r in rows if r.get("error")),
        "calls_per_question": round(sum(r["calls"] or 0 for r in done) / n, 2),
        "prompt_tokens_per_question": round(sum(r["prompt_tokens"] or 0 for r in done) / n, 1),
        "seconds_per_question": round(sum(r["seconds"] or 0 for r in done) / n, 2),
        "loop_acted": sum(1 for r in rows if r.get("loop_acted")),
        "first_evidence_lacked_answer": len(lacked),
        "right_when_first_evidence_lacked": sum(r["right"] for r in lacked),
        "loop_acted_when_first_evidence_lacked": sum(1 for r in lacked if r.get("loop_acted")),
        "right_when_first_evidence_held": sum(r["right"] for r in held),
        "first_evidence_held_answer": len(held),
        "by_route": by_route,
    }


def tutorial_runners(rows: list[dict]) -> str | None:
    """What ran the tutorial rows reported, from the rows themselves: a resumed run may ask
    none of them, and its own runner (none) would deny the answers in its table."""
    runners = {r.get("runner") or "unknown (an older record)" for r in rows if r["config"] == "tutorial"}
    return ", ".join(sorted(runners)) or None


def report(args: argparse.Namespace, rows: list[dict], configs: list[str], questions: list[dict],
           setup: dict[str, Any]) -> dict[str, Any]:
    table = {s: {c: summarize([r for r in rows if r["set"] == s and r["config"] == c]) for c in configs}
             for s in SETS if any(q["set"] == s for q in questions)}
    return {
        "model": "offline" if args.offline else args.model,
        "base_url": None if args.offline else args.base_url,
        "setup": setup,
        "half": args.half,
        "seed": args.seed,
        "configs": configs,
        "tutorial_runner": tutorial_runners(rows),
        "tutorial_left_out": "--offline: the tutorial needs a server" if args.offline and "tutorial" in args.configs
        else None,
        "table": table,
        "answers": sorted(rows, key=lambda r: (r["set"], r["config"], r["id"])),
        "command": command_line("python -m benchmarks.answers", args.argv or []),
        "environment": environment(["openai", "langgraph"]),
    }


def render_markdown(r: dict[str, Any]) -> str:
    lines = [f"# Answers end to end: {r['model']}", "", f"Command: `{r['command']}`  ",
             f"Date: {r['environment']['date']}; SQuAD half: {r['half']} (seed {r['seed']}); "
             f"tutorial graph: {r['tutorial_runner'] or 'not run'}", ""]
    if r.get("tutorial_left_out"):
        lines += [f"The tutorial was left out ({r['tutorial_left_out']}).", ""]
    rows = []
    for set_name, configs in r["table"].items():
        for config, s in configs.items():
            rows.append([set_name, config, f"{s['right']} / {s['answerable']}", s["refused_answerable"],
                         f"{s['honest_unanswerable']} / {s['unanswerable']}", fmt(s["calls_per_question"]),
                         fmt(s["prompt_tokens_per_question"], 0), fmt(s["seconds_per_question"], 1),
                         s["loop_acted"], f"{s['right_when_first_evidence_lacked']} / {s['first_evidence_lacked_answer']}",
                         s["errors"]])
    lines.append(markdown_table(
        ["set", "configuration", "right (answerable)", "refused though answerable", "honest (unanswerable)",
         "calls / q", "prompt tokens / q", "s / q", "loop acted", "right when first evidence lacked it", "errors"],
        rows, "llrrrrrrrrr"))
    route_rows = []
    for set_name, configs in r["table"].items():
        for config, s in configs.items():
            for route, cell in sorted(s["by_route"].items()):
                route_rows.append([set_name, config, route, f"{cell['right']} / {cell['answerable']}",
                                   fmt(cell["prompt_tokens"] / max(1, cell["answerable"]), 0)])
    if route_rows:
        lines += ["", "## crag's right answers by route (answerable questions)", "",
                  markdown_table(["set", "configuration", "route", "right", "prompt tokens / q"], route_rows, "lllrr")]
    lines += ["", "Right: a gold answer (SQuAD normalisation) in the body, or for the docs set the gold page cited, "
              "and no refusal. Honest: the answer refuses. Calls, tokens and seconds: per question answered (without "
              "an error). \"Right when first evidence lacked it\": answerable "
              "questions whose first round of evidence held no gold answer string (SQuAD only)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.answers", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8091/v1"))
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "not-needed"))
    p.add_argument("--model", default=os.environ.get("KB_AGENT_MODEL", "local"))
    p.add_argument("--offline", action="store_true", help="crag's offline backend (the tutorial is left out)")
    p.add_argument("--quick", action="store_true", help="2 answerable + 2 unanswerable questions per set")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated, of squad, docs")
    p.add_argument("--half", choices=("heldout", "tuning"), default="heldout", help="which half of the SQuAD articles")
    p.add_argument("--answerable", type=at_least(0), default=30, help="answerable SQuAD questions")
    p.add_argument("--unanswerable", type=at_least(0), default=30, help="unanswerable SQuAD questions")
    p.add_argument("--docs-answerable", type=at_least(0), default=16)
    p.add_argument("--docs-unanswerable", type=at_least(0), default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--squad", type=Path, default=SQUAD, help="the SQuAD split: corpus/ and questions.jsonl")
    p.add_argument("--shared", type=Path, default=SHARED, help="holds corpora/ for the docs set")
    p.add_argument("--context-tokens", type=at_least(1), default=int(os.environ.get("KB_AGENT_CONTEXT_TOKENS", "8192")))
    p.add_argument("--timeout", type=llm_timeout, default=600.0, help="seconds one LLM call may take")
    p.add_argument("--index-dir", type=Path, default=Path(tempfile.gettempdir()) / "crag-answers-index",
                   help="the indexes (one folder per set), kept between runs")
    p.add_argument("--name", type=results_name, default=None, help="results name (answers-NAME.json / .md / .jsonl)")
    p.add_argument("--record", type=record_file, default=None, help="the JSONL of finished questions (resumable)")
    p.add_argument("--out", type=out_dir, default=None,
                   help="results directory (default: benchmarks/results; a --quick run: a new temporary folder)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KB_AGENT_X=VALUE",
                   help="another crag setting for the crag configurations (repeatable)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not args.offline:
        check_server_url(p, args.base_url)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    args.sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = [c for c in args.configs if c not in CONFIGS] + [s for s in args.sets if s not in SETS]
    if unknown:
        p.error(f"unknown configuration or set: {unknown[0]!r}")
    if not args.configs or not args.sets:
        p.error("--configs needs at least one configuration" if not args.configs else "--sets needs at least one set")
    if args.offline and set(args.configs) == {"tutorial"}:  # the tutorial is left out offline: nothing would run
        p.error("--configs tutorial needs a server, and --offline leaves it out: nothing to run")
    counts = {"squad": (args.answerable, args.unanswerable), "docs": (args.docs_answerable, args.docs_unanswerable)}
    if not args.quick and not any(n for s in args.sets for n in counts[s]):
        p.error("no questions: every count of the sets asked for is 0")
    args.settings = crag_settings(p, args.settings)
    missing = missing_data(args)
    if missing:
        p.error(f"missing data: {', '.join(missing)} (--squad and --shared say where; CRAG_SHARED=DIR for both)")
    if args.quick:
        args.answerable = args.unanswerable = args.docs_answerable = args.docs_unanswerable = 2
    args.out = quick_out(args.out, args.quick)
    name = args.name or ("offline" if args.offline else "".join(c if c.isalnum() else "-" for c in args.model))
    args.record = args.record or args.out / f"answers-{name}.jsonl"
    result = run(args)
    write_json(args.out / f"answers-{name}.json", result)
    write_text(args.out / f"answers-{name}.md", render_markdown(result))
    print(render_markdown(result))
    failed = [r for r in result["answers"] if r.get("error")]
    if failed and len(failed) == len(result["answers"]):
        print(f"{p.prog}: error: every question failed, the first with {failed[0]['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.answers"))
