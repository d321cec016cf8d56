"""Store scale: both stores at 100k and 1M chunks of real text, searched as users search.

The knowledge base is copies of the shared corpora (``../shared``): the SQuAD Wikipedia
articles and the two documentation sets, about 14,600 chunks a copy, hard-linked into
``copyNN/`` folders (``--chunks`` picks the number of copies; below one copy, a smoke run,
every n-th file of one copy). Each store indexes it with
``crag index`` in a child process, from empty, with crag's defaults (the hash embedder),
then answers searches through the library's entry point, ``Agent.search``: one agent
opened once, as the MCP server holds one. Reported for each store:

* indexing: wall and CPU seconds, MB/s of text (wall and CPU), peak memory of the
  indexing process, disk used, and for the embedded store the bytes its vectors take
  (the FAISS index, which a search process holds in memory) and the vector index's kind;
* search latency, p50 / p95 of single searches (top 5, hybrid): real questions (SQuAD
  questions and the docs questions of ``benchmarks/questions.jsonl``) and frequent-word
  queries (one to three of the corpus's most frequent content words), each in its own set;
* recall against exact search, on the questions: of the vector ranking (the 50 candidates a
  search takes; an approximate result counts when its cosine reaches the exact 50th's, so
  copies of one chunk count alike), and of the top 5 hybrid hits against a search whose
  vector ranking is exact and whose full-text rankings score every matching row (a hit
  counts by its place in the corpus, whichever copy it comes from);
* throughput: searches per second with 1, 4 and 16 clients (threads sharing the agent,
  as concurrent MCP requests do; PostgreSQL gives each its own connection);
* PostgreSQL only: search latency while an index run writes (a tenth of the copies'
  files changed and re-indexed in a child process).

``--questions-check`` (on by default below 200k chunks) also indexes the shared corpora
themselves on each store and reports recall@5 / MRR@5 there (``benchmarks/retrieval.py``'s
scoring), so the two stores' ranking quality can be compared.

Run: ``python -m benchmarks.store_scale --chunks 100000`` (``make bench``) or ``--chunks
1000000`` (``make bench-full``). PostgreSQL is the server ``--postgres URI`` names, or one
started with ``pgserver`` in the work folder. Writes ``store_scale.json`` and ``.md`` to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    SHARED,
    at_least,
    counts,
    environment,
    fmt,
    markdown_table,
    out_dir,
    percentile,
    positive,
    run_main,
    write_json,
    write_text,
)

NAME = "store_scale"
REPO = Path(__file__).resolve().parents[1]
SOURCES = {
    "squad": SHARED / "retrieval" / "squad_wiki" / "corpus",
    "fastapi": SHARED / "corpora" / "fastapi_docs",
    "hfhub": SHARED / "corpora" / "hf_hub_docs",
}
STORES = ("embedded", "postgresql")
CHUNKS_PER_COPY = 14_600  # the three sources chunked with crag's defaults
COPY = re.compile(r"^copy\d+/")


# ---------------------------------------------------------------------------------------
# The knowledge base and the queries


def make_corpus(root: Path, copies: int, every: int = 1) -> int:
    """``copies`` copies of the sources under ``root`` (hard links where possible), each of every
    ``every``-th file of a source (a smoke run's corpus is a part of one copy); returns bytes of text."""
    total = 0
    for c in range(copies):
        for name, src in SOURCES.items():
            dest = root / f"copy{c:03d}" / name
            if dest.exists():
                total += sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
                continue
            for path in sorted(p for p in src.rglob("*") if p.is_file())[::every]:
                target = dest / path.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(path, target)
                except OSError:
                    shutil.copyfile(path, target)
                total += path.stat().st_size
    return total


def gold_questions(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` answerable SQuAD questions with their gold article (its path in one copy, ``squad/<name>.txt``)."""
    rows = [json.loads(line) for line in (SHARED / "retrieval" / "squad_wiki" / "questions.jsonl").open()]
    picked = random.Random(seed + 3).sample([r for r in rows if r.get("answerable")], n)
    return [(r["question"], "squad/" + r["gold_file"].removeprefix("corpus/")) for r in picked]


def real_questions(n: int, seed: int) -> list[str]:
    """SQuAD questions (three quarters) and docs questions (a quarter), ``n`` in all."""
    rng = random.Random(seed)
    squad = [json.loads(line)["question"] for line in (SHARED / "retrieval" / "squad_wiki" / "questions.jsonl").open()]
    docs = [json.loads(line)["question"] for line in (REPO / "benchmarks" / "questions.jsonl").open() if line.strip()]
    n_docs = min(len(docs), n // 4)
    return rng.sample(squad, n - n_docs) + rng.sample(docs, n_docs)


def warmup_questions(args: argparse.Namespace) -> list[str]:
    """``--warmup`` SQuAD questions the measured ones do not include (another seed, then filtered)."""
    measured = set(real_questions(args.questions, args.seed))
    pool = [q for q in real_questions(args.warmup + args.questions, args.seed + 7) if q not in measured]
    return pool[: args.warmup]


def frequent_queries(n: int, seed: int, copy: Path) -> tuple[list[str], list[tuple[str, float]]]:
    """``n`` queries of one to three of the 60 content words in most chunks of one copy (the
    folder ``copy``); and those words."""
    from crag.index.chunker import chunk_text
    from crag.text import STOPWORDS, words

    df: Counter[str] = Counter()
    chunks = 0
    for src in SOURCES:
        for path in sorted((copy / src).rglob("*")):
            if path.is_file() and path.suffix in {".md", ".txt"}:
                for chunk in chunk_text(path.read_text(encoding="utf-8", errors="replace"), path.suffix):
                    df.update({w for w in words(chunk.text) if w not in STOPWORDS and len(w) > 2 and w.isalpha()})
                    chunks += 1
    top = [(w, c / chunks) for w, c in df.most_common(60)]
    rng = random.Random(seed + 1)
    pool = [w for w, _ in top]
    return [" ".join(rng.sample(pool, rng.randint(1, 3))) for _ in range(n)], top


# ---------------------------------------------------------------------------------------
# Measuring


def index_child(env: dict[str, str], corpus: Path) -> dict[str, Any]:
    """``crag index corpus`` in a child process: wall and CPU seconds, its peak memory."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "crag", "index", str(corpus)], env=env, cwd=REPO,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"crag index failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mb": after.ru_maxrss / 1024,  # the largest child so far: indexing is the first
        "output": next((line for line in proc.stdout.splitlines() if line.startswith("indexed")), ""),
    }


def timed(agent: Any, queries: list[str]) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (this process, every thread) of each search, one after another."""
    wall, cpu = [], []
    for q in queries:
        t, c = time.perf_counter(), time.process_time()
        agent.search(q, top_k=5)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return wall, cpu


def server_cpu_s(agent: Any) -> float | None:
    """CPU seconds the PostgreSQL backends of the agent's connections have used (None: not PostgreSQL,
    or their /proc is not readable). Ticks of 10 ms: meaningful over many searches, not one."""
    conns = getattr(agent.toolbox.retriever(), "_conns", None)
    if conns is None:
        return None
    total = 0
    try:
        for conn in conns.connections():
            with open(f"/proc/{conn.info.backend_pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, ValueError, IndexError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def server_tree_cpu_s(uri: str) -> float | None:
    """CPU seconds the PostgreSQL server at ``uri`` has used so far, every process of it: the
    postmaster's own and its ended children's (``cutime``/``cstime``) and its running children's
    (None: the server is not on this machine, or its /proc is not readable). The difference
    over an index run is the server's share of the indexing."""
    import psycopg

    def stat(pid: int | str) -> list[str]:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    try:
        with psycopg.connect(uri, autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            postmaster = int(stat(backend)[1])
        fields = stat(postmaster)
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    child = stat(pid)
                except OSError:
                    continue
                if int(child[1]) == postmaster:
                    ticks += int(child[11]) + int(child[12])
    except (OSError, ValueError, IndexError, psycopg.Error):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def latency(times: list[float], cpu: list[float] | None = None) -> dict[str, float]:
    out = {"p50_ms": 1000 * percentile(times, 50), "p95_ms": 1000 * percentile(times, 95)}
    if cpu:
        out.update(cpu_p50_ms=1000 * percentile(cpu, 50), cpu_p95_ms=1000 * percentile(cpu, 95))
    return out


def throughput(agent: Any, queries: list[str], clients: int, seconds: float) -> float:
    """Searches per second of ``clients`` threads searching through one agent for ``seconds``."""
    counts = [0] * clients
    stop = time.perf_counter() + seconds
    errors: list[BaseException] = []

    def client(i: int) -> None:
        j = i
        try:
            while time.perf_counter() < stop:
                agent.search(queries[j % len(queries)], top_k=5)
                counts[i] += 1
                j += clients
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - start)


def exact_vector_top(retriever: Any, qvecs: Any, k: int) -> list[list[tuple[int, float]]]:
    """The exact top ``k`` (chunk id, cosine) of each query vector over every stored vector."""
    import numpy as np

    from crag.index import vectors

    if hasattr(retriever, "_vectors"):  # the embedded store: decode its codes block by block
        blocks = vectors._contents(retriever._vectors)
    else:  # PostgreSQL: read the stored vectors
        blocks = _pg_vector_blocks(retriever)
    best_ids = np.full((len(qvecs), k), -1, dtype=np.int64)
    best = np.full((len(qvecs), k), -np.inf, dtype=np.float32)
    q = np.ascontiguousarray(qvecs, dtype=np.float32)
    for ids, vecs in blocks:
        scores = q @ vecs.T
        ids_all = np.concatenate([best_ids, np.broadcast_to(ids, (len(q), len(ids)))], axis=1)
        s_all = np.concatenate([best, scores], axis=1)
        top = np.argpartition(-s_all, k - 1, axis=1)[:, :k]
        best_ids = np.take_along_axis(ids_all, top, axis=1)
        best = np.take_along_axis(s_all, top, axis=1)
    out = []
    for i in range(len(q)):
        order = np.argsort(-best[i])
        out.append([(int(best_ids[i][j]), float(best[i][j])) for j in order])
    return out


def _pg_vector_blocks(retriever: Any, block: int = 50_000) -> Any:
    """(ids, vectors) blocks of a PostgreSQL store, read with a binary COPY (fixed-size rows)."""
    import numpy as np

    from crag.index.postgres_schema import SCHEMA

    row = np.dtype([("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"), ("vec_len", ">i4"), ("dim", ">i2"),
                    ("unused", ">i2"), ("vec", ">f4", (retriever.dim,))])
    conn = retriever.store.connect(autocommit=True)
    try:
        buffer = bytearray()
        header = 19  # signature, flags, extension length
        with conn.cursor().copy(f"COPY (SELECT id, embedding FROM {SCHEMA}.chunks) TO STDOUT (FORMAT BINARY)") as copy:
            for part in copy:
                buffer += part
                if header and len(buffer) >= header:
                    del buffer[:header]
                    header = 0
                n = len(buffer) // row.itemsize
                if n >= block:
                    rows = np.frombuffer(bytes(buffer[: n * row.itemsize]), dtype=row)
                    del buffer[: n * row.itemsize]
                    yield rows["id"].astype(np.int64), rows["vec"].astype(np.float32)
        n = len(buffer) // row.itemsize  # the trailer (two bytes) is left over
        if n:
            rows = np.frombuffer(bytes(buffer[: n * row.itemsize]), dtype=row)
            yield rows["id"].astype(np.int64), rows["vec"].astype(np.float32)
    finally:
        conn.close()


def recall(retriever: Any, questions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Vector recall@50 and hybrid recall@5 against exact search (see the module docstring)."""
    from crag.index import lexical
    from crag.index.fusion import SearchWeights

    k = SearchWeights().candidates
    qs = questions[: args.recall_queries]
    qvecs = [retriever.embed_query(q).reshape(-1) for q in qs]
    t = time.perf_counter()
    exact = exact_vector_top(retriever, qvecs, k)
    exact_s = time.perf_counter() - t
    found = 0
    for qv, ex in zip(qvecs, exact):
        approx = retriever.vector_ranking(qv.reshape(1, -1), k)
        floor = ex[-1][1] - 1e-5
        found += sum(1 for _, s in approx if s >= floor)
    vector_recall = found / (k * len(qs))

    def place(hit: Any) -> tuple[str, int]:
        rel = os.path.relpath(hit.path, args.corpus)
        return COPY.sub("", rel), hit.start_line

    approx_hits = [{place(h) for h in retriever.search(q, 5)} for q in qs]
    exact_of = dict(zip(qs, exact))
    budgets = (lexical.CHUNK_BUDGET, lexical.FILE_BUDGET)
    real_ranking = retriever.vector_ranking
    current: dict[str, Any] = {}

    def reference(unbounded: bool) -> list[set[tuple[str, int]]]:
        """Top 5 with the exact vector ranking, and the full text unbounded too when asked."""
        df_cache = getattr(retriever, "_df_cache", None)
        try:
            if unbounded:
                lexical.CHUNK_BUDGET = lexical.FILE_BUDGET = 10**9
                if df_cache is not None:
                    df_cache.clear()
            retriever.vector_ranking = lambda qv, kk, roots=None: current["exact"][:kk]
            out = []
            for q in qs:
                current["exact"] = exact_of[q]
                out.append({place(h) for h in retriever.search(q, 5)})
            return out
        finally:
            lexical.CHUNK_BUDGET, lexical.FILE_BUDGET = budgets
            retriever.vector_ranking = real_ranking
            if df_cache is not None:
                df_cache.clear()

    def overlap(ref: list[set[tuple[str, int]]]) -> float | None:
        total = sum(len(e) for e in ref)
        return sum(len(a & e) for a, e in zip(approx_hits, ref)) / total if total else None

    gold = gold_questions(args.gold_questions, args.seed)
    gold_found = sum(any(place(h)[0] == article for h in retriever.search(q, 5)) for q, article in gold)
    return {
        "queries": len(qs),
        "gold_questions": len(gold),
        "gold_article_recall_at_5": gold_found / len(gold) if gold else None,
        "vector_recall_at_50": vector_recall,
        "hybrid_recall_at_5_exact_vectors": overlap(reference(False)),
        "hybrid_recall_at_5": overlap(reference(True)),
        "exact_scan_s": exact_s,
    }


def disk_bytes(path: Path) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for p in path.rglob("*"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def open_agent(settings: dict[str, str]) -> Any:
    from crag import Agent

    return Agent.from_env(environ={"KB_AGENT_LLM": "offline", **settings}, dotenv=None)


def _previous_row(args: argparse.Namespace, name: str) -> dict[str, Any] | None:
    """The row of ``name`` in the results this run found in ``--out`` when it started."""
    return next((r for r in getattr(args, "previous_rows", []) if r.get("store") == name), None)


def measure(name: str, env_settings: dict[str, str], corpus: Path, text_bytes: int, queries: dict[str, list[str]],
            args: argparse.Namespace, work: Path) -> dict[str, Any]:
    env = {**os.environ, "KB_AGENT_LLM": "offline", **env_settings}
    row: dict[str, Any] = {"store": name}
    previous = _previous_row(args, name) if args.reuse_index else None  # None: this store is indexed now
    if previous is not None:
        print(f"[{name}] reusing the index in {args.workdir} ...", flush=True)
        row.update({k: v for k, v in previous.items() if k.startswith("index_") or k == "text_mb"})
    else:
        print(f"[{name}] indexing {text_bytes / 1e6:,.0f} MB ...", flush=True)
        uri = env_settings.get("KB_AGENT_STORE")
        server_before = server_tree_cpu_s(uri) if uri else None
        ix = index_child(env, corpus)
        server_after = server_tree_cpu_s(uri) if uri else None
        if server_before is not None and server_after is not None:
            row["index_server_cpu_s"] = server_after - server_before
            row["index_server_cpu_s_per_mb"] = row["index_server_cpu_s"] / (text_bytes / 1e6)
        row["index_load_average"] = round(os.getloadavg()[0], 2)
        row.update(
            index_wall_s=ix["wall_s"], index_cpu_s=ix["cpu_s"], index_peak_rss_mb=ix["peak_rss_mb"],
            index_mb_s=text_bytes / 1e6 / ix["wall_s"], index_mb_s_cpu=text_bytes / 1e6 / ix["cpu_s"],
            index_output=ix["output"], text_mb=text_bytes / 1e6,
        )
        print(f"[{name}] {ix['output']}", flush=True)
    from crag.config import Settings
    from crag.index import open_index

    settings = Settings.from_env({"KB_AGENT_LLM": "offline", **env_settings}, None)
    with open_index(settings) as retriever:
        row["chunks"] = retriever.n_chunks
        if name == "embedded":
            gen = Path(settings.index_dir) / retriever.generation
            row["disk_mb"] = disk_bytes(Path(settings.index_dir)) / 1e6
            row["vectors_mb"] = (gen / "vectors.faiss").stat().st_size / 1e6
            from crag.index import vectors

            row["vector_index"] = vectors.describe(retriever._vectors)
        else:
            with retriever.store.session() as conn:
                row["disk_mb"] = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 1e6
                row["vectors_mb"] = conn.execute(
                    "SELECT sum(pg_column_size(embedding)) FROM crag.chunks").fetchone()[0] / 1e6
                row["vector_index_mb"] = conn.execute(
                    "SELECT coalesce(sum(pg_relation_size(format('%I.%I', schemaname, indexname)::regclass)), 0)::bigint "
                    "FROM pg_indexes WHERE schemaname = 'crag' AND indexname LIKE 'chunks\\_embedding\\_%'"
                ).fetchone()[0] / 1e6
                row["shared_buffers"] = conn.execute("SHOW shared_buffers").fetchone()[0]
            row["vector_index"] = retriever.vector_index
        print(f"[{name}] recall against exact search ...", flush=True)
        row["recall"] = recall(retriever, queries["questions"], args)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    agent = open_agent(env_settings)
    try:
        t = time.perf_counter()
        agent.search(queries["questions"][0], top_k=5)  # opens the index
        row["open_s"] = time.perf_counter() - t
        # Warm-up with other questions: each store's indexes in memory, as in a server that has
        # been answering for a while (the embedded store reads its vectors whole when it opens).
        t = time.perf_counter()
        timed(agent, warmup_questions(args))
        row["warmup"] = {"searches": args.warmup, "s": time.perf_counter() - t}
        for kind, qs in queries.items():
            print(f"[{name}] {len(qs)} {kind} ...", flush=True)
            before = server_cpu_s(agent)
            row[kind] = latency(*timed(agent, qs))
            after = server_cpu_s(agent)
            if before is not None and after is not None:
                row[kind]["server_cpu_mean_ms"] = 1000 * (after - before) / len(qs)
        for clients in args.clients:
            print(f"[{name}] {clients} concurrent client(s) ...", flush=True)
            row[f"qps_{clients}"] = throughput(agent, queries["questions"], clients, args.client_seconds)
        if name == "postgresql" and args.during_writes:
            row["during_writes"] = searches_during_an_update(agent, env, corpus, queries["questions"], work)
    finally:
        agent.close()
    row["search_process_peak_rss_mb"] = max(rss_before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024
    return row


def searches_during_an_update(agent: Any, env: dict[str, str], corpus: Path, questions: list[str], work: Path) -> dict[str, Any]:
    """Latency of searches while a child re-indexes a tenth of the files (changed), against before."""
    files = sorted(p for p in corpus.rglob("*.txt"))[:: 10]
    saved = []
    for p in files:  # a hard link is replaced, not written through, so the shared corpus is untouched
        text = p.read_text(encoding="utf-8") + "\nChanged for the store_scale benchmark.\n"
        saved.append((p, p.read_bytes()))
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    proc = subprocess.Popen([sys.executable, "-m", "crag", "index", str(corpus)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    times: list[float] = []
    i = 0
    t0 = time.perf_counter()
    while proc.poll() is None:
        q = questions[i % len(questions)]
        t = time.perf_counter()
        agent.search(q, top_k=5)
        times.append(time.perf_counter() - t)
        i += 1
    update_s = time.perf_counter() - t0
    _, err = proc.communicate()
    for p, data in saved:
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, p)
    if proc.returncode != 0:
        raise RuntimeError(f"crag index (during searches) failed ({proc.returncode}): {err[-2000:]}")
    return {"files_changed": len(files), "update_s": update_s, "searches": len(times), **latency(times),
            "exit_status": proc.returncode}


# ---------------------------------------------------------------------------------------
# The questions check: the shared corpora on each store


def questions_check(env_settings: dict[str, dict[str, str]], sample: int) -> list[dict[str, Any]]:
    from benchmarks import retrieval
    from crag.config import Settings
    from crag.index import index_roots, open_index

    rows = []
    for name, kw in env_settings.items():
        settings = Settings.from_env({"KB_AGENT_LLM": "offline", **kw}, None)
        for corpus in retrieval.CORPORA:
            print(f"[{name}] questions check: {corpus.name} ...", flush=True)
            questions = retrieval.load_questions(corpus, sample if corpus.name == "prose" else None)
            index_roots(settings, list(corpus.roots))
            with open_index(settings) as reader:
                r = retrieval.evaluate(reader, questions, "hybrid")["file"]
            rows.append({"store": name, "corpus": corpus.name, "questions": len(questions),
                         "recall@5": r["recall@5"], "mrr@5": r["mrr@5"]})
            from crag.index import drop_roots

            drop_roots(settings, list(corpus.roots))
    return rows


# ---------------------------------------------------------------------------------------
# PostgreSQL


def shared_buffers(setting: str) -> str | None:
    """The ``shared_buffers`` to give the server (``--shared-buffers``): None keeps its own."""
    if setting == "keep":
        return None
    if setting != "auto":
        return setting
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None
    return f"{max(128, int(pages * page * 0.4 / 2**20))}MB"


def start_postgres(folder: str, fresh: bool = True, buffers: str | None = None) -> tuple[Any, str]:
    """A pgserver in ``folder``; with ``buffers``, restarted with that ``shared_buffers`` (a server
    for a knowledge base this size is given memory for its indexes: docs/postgresql.md)."""
    import pgserver
    import psycopg

    server = pgserver.get_server(folder, cleanup_mode="stop")
    if buffers is not None:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            current = conn.execute("SHOW shared_buffers").fetchone()[0]
            if current.lower() != buffers.lower():
                conn.execute(f"ALTER SYSTEM SET shared_buffers = '{buffers}'")
                conn.execute(f"ALTER SYSTEM SET effective_cache_size = '{buffers}'")
                restart = True
            else:
                restart = False
        if restart:
            server.cleanup()
            server = pgserver.get_server(folder, cleanup_mode="stop")
    if fresh:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS crag_bench")
            conn.execute("CREATE DATABASE crag_bench")
            # An HNSW build is much faster when its graph fits in maintenance_work_mem.
            conn.execute("ALTER DATABASE crag_bench SET maintenance_work_mem = '8GB'")
    return server, server.get_uri().replace("/postgres?", "/crag_bench?")


def other_database(uri: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


# ---------------------------------------------------------------------------------------
# Report


def _lat(d: dict[str, float] | None) -> str:
    if not d:
        return "–"
    text = f"{fmt(d['p50_ms'], 1)} / {fmt(d['p95_ms'], 1)}"
    if "cpu_p50_ms" in d:
        text += f" (CPU {fmt(d['cpu_p50_ms'], 1)} / {fmt(d['cpu_p95_ms'], 1)}"
        if "server_cpu_mean_ms" in d:
            text += f", server CPU {fmt(d['server_cpu_mean_ms'], 1)} a search"
        text += ")"
    return text


def render_markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    a = result["args"]
    clients = a["clients"]
    header = ["store", "chunks", "text MB", "index s (CPU s)", "MB/s (per CPU s)", "server CPU s a MB indexing", "peak RSS indexing MB", "disk MB",
              "vectors MB (index)", "questions p50 / p95 ms", "frequent words p50 / p95 ms",
              "gold article in the top 5", "vector recall@50", "hybrid recall@5 (exact vectors / exact all)", *[f"{c} client(s)/s" for c in clients]]
    body = []
    for r in rows:
        rc = r.get("recall", {})
        body.append([
            r["store"], f"{r.get('chunks', 0):,}", fmt(r["text_mb"], 0),
            f"{fmt(r['index_wall_s'], 0)} ({fmt(r['index_cpu_s'], 0)})",
            f"{fmt(r['index_mb_s'], 2)} ({fmt(r['index_mb_s_cpu'], 2)})",
            fmt(r.get("index_server_cpu_s_per_mb"), 2),
            fmt(r["index_peak_rss_mb"], 0), fmt(r.get("disk_mb"), 0),
            f"{fmt(r.get('vectors_mb'), 0)} ({r.get('vector_index', '')})",
            _lat(r.get("questions")), _lat(r.get("frequent")),
            fmt(rc.get("gold_article_recall_at_5"), 3), fmt(rc.get("vector_recall_at_50"), 3),
            f"{fmt(rc.get('hybrid_recall_at_5_exact_vectors'), 3)} / {fmt(rc.get('hybrid_recall_at_5'), 3)}",
            *[fmt(r.get(f"qps_{c}"), 1) for c in clients],
        ])
    intro = (
        f"{a['copies']} copies of the shared corpora (SQuAD articles, FastAPI and Hugging Face Hub docs); "
        f"crag's defaults (hash embedder, hybrid search, top 5) through `Agent.search`; "
        f"{len(result['queries']['questions'])} real questions and {len(result['queries']['frequent'])} frequent-word "
        f"queries; recall on {a['recall_queries']} questions (the gold article: on {a.get('gold_questions', 0)} SQuAD questions, any copy counts); clients are threads sharing one agent for "
        f"{a['client_seconds']:g} s; {result['environment'].get('cpu_count', '?')} CPUs, load average "
        f"{result.get('load_average', '?')} at the start; each store searched {a.get('warmup', 0)} other questions "
        "first (warm-up).\n\n"
    )
    if any(r["store"] == "postgresql" for r in rows):
        intro += ("PostgreSQL's indexing CPU and peak memory are those of the `crag index` process; the server's "
                  "CPU while indexing is its own column (every server process's, from /proc, when the server runs on "
                  "this machine), as is its CPU a search (the backends' /proc counters). 1-minute load average when each "
                  "index run ended (its own processes included): " + ", ".join(f"{r['store']} {r['index_load_average']}" for r in rows
                                                      if "index_load_average" in r) + ".")
        pg = next(r for r in rows if r["store"] == "postgresql")
        if pg.get("shared_buffers"):
            intro += (f" The server's `shared_buffers`: {pg['shared_buffers']}; its vector index: "
                      f"{fmt(pg.get('vector_index_mb'), 0)} MB.")
        intro += "\n\n"
    out = intro + markdown_table(header, body) + "\n"
    for r in rows:
        dw = r.get("during_writes")
        if dw:
            out += (f"\n{r['store']}: while an index run rewrote {dw['files_changed']} files ({fmt(dw['update_s'], 0)} s), "
                    f"{dw['searches']} searches took p50 {fmt(dw['p50_ms'], 1)} / p95 {fmt(dw['p95_ms'], 1)} ms.\n")
    words = result.get("frequent_words") or []
    if words:
        out += "\nFrequent words (share of one copy's chunks holding them): " + ", ".join(
            f"{w} {s:.0%}" for w, s in words[:15]) + " ...\n"
    if result.get("questions_check"):
        out += "\nOn the shared corpora themselves (hybrid, by file):\n\n" + markdown_table(
            ["store", "corpus", "questions", "recall@5", "MRR@5"],
            [[r["store"], r["corpus"], r["questions"], f"{r['recall@5']:.3f}", f"{r['mrr@5']:.3f}"]
             for r in result["questions_check"]]) + "\n"
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.store_scale", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=at_least(1), default=100_000, help="about this many chunks (default: %(default)s)")
    p.add_argument("--questions", type=at_least(1), default=200, help="real questions for latency (default: %(default)s)")
    p.add_argument("--frequent", type=at_least(1), default=100, help="frequent-word queries (default: %(default)s)")
    p.add_argument("--recall-queries", type=at_least(1), default=50, help="questions for recall (default: %(default)s)")
    p.add_argument("--gold-questions", type=at_least(1), default=200,
                   help="SQuAD questions whose gold article is looked for in the top 5 (default: %(default)s)")
    p.add_argument("--warmup", type=at_least(0), default=300,
                   help="searches of other questions before the measured ones, on each store (default: %(default)s)")
    p.add_argument("--shared-buffers", default="auto",
                   help="shared_buffers of the PostgreSQL server this benchmark starts: auto (40%% of memory), "
                        "a size (8GB), or keep (default: %(default)s)")
    p.add_argument("--clients", type=counts(1), default="1,4,16", help="concurrent client counts (default: %(default)s)")
    p.add_argument("--client-seconds", type=positive, default=10.0, help="seconds per client count (default: %(default)s)")
    p.add_argument("--stores", default="embedded,postgresql", help="which stores (default: %(default)s)")
    p.add_argument("--postgres", default="", help="a postgresql:// URI to use instead of starting pgserver")
    p.add_argument("--workdir", default="", help="where the corpus and the indexes go (default: a temporary folder)")
    p.add_argument("--questions-check", choices=("auto", "yes", "no"), default="auto",
                   help="also rank the shared corpora's questions on each store (auto: below 200k chunks)")
    p.add_argument("--reuse-index", action="store_true",
                   help="search the indexes a previous run left in --workdir (their indexing figures from --out); "
                        "a store with no row there is indexed")
    p.add_argument("--no-during-writes", dest="during_writes", action="store_false",
                   help="skip PostgreSQL searches during an index run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=out_dir, default=RESULTS_DIR)
    args = p.parse_args(argv)
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = sorted(set(args.stores) - set(STORES))
    if unknown or not args.stores or not args.clients:
        p.error(f"--stores: unknown store {', '.join(unknown)} (choose from {', '.join(STORES)})" if unknown
                else "--stores needs at least one store" if not args.stores else "--clients needs at least one count")
    # The command line's own mistakes first: they are named whether or not the data is there.
    absent = [str(src) for src in SOURCES.values() if not src.is_dir()]
    if absent:
        p.error(f"the shared corpora are not at {SHARED}: no folder {', '.join(absent)} (CRAG_SHARED=DIR to point "
                "elsewhere)")
    args.copies = max(1, math.ceil(args.chunks / CHUNKS_PER_COPY))
    # Fewer chunks than a copy (a smoke run, run_all --quick): every n-th file of one copy.
    args.every = max(1, CHUNKS_PER_COPY // max(1, args.chunks))
    return args


def with_unmeasured(result: dict[str, Any], previous_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``result`` with the previous rows of stores it has not measured (yet) as ``unmeasured_rows``:
    a run that stops part-way must not lose the figures a later ``--reuse-index`` needs (without
    them it would index that store again, and drop the database of a ``--postgres`` URI)."""
    measured = {r.get("store") for r in result["rows"]}
    kept = [r for r in previous_rows if r.get("store") not in measured]
    return {**result, "unmeasured_rows": kept} if kept else dict(result)


def run(args: argparse.Namespace) -> dict[str, Any]:
    try:  # read before this run writes over it: --reuse-index takes the indexing figures from there
        previous = json.loads((args.out / f"{NAME}.json").read_text())
        args.previous_rows = previous.get("rows", []) + previous.get("unmeasured_rows", [])
    except (OSError, ValueError):
        args.previous_rows = []
    work = Path(args.workdir or tempfile.mkdtemp(prefix="crag-store-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus"
    args.corpus = str(corpus)
    server = None
    try:
        print(f"linking {args.copies} copies of the shared corpora into {corpus} ...", flush=True)
        text_bytes = make_corpus(corpus, args.copies, args.every)
        frequent, top_words = frequent_queries(args.frequent, args.seed, corpus / "copy000")
        queries = {"questions": real_questions(args.questions, args.seed), "frequent": frequent}
        arguments = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "previous_rows"}
        result: dict[str, Any] = {
            "args": arguments, "rows": [], "queries": queries, "frequent_words": top_words,
            "environment": environment(["faiss-cpu", "numpy", "psycopg", "pgserver"]),
            "load_average": round(os.getloadavg()[0], 2),
        }
        settings: dict[str, dict[str, str]] = {}

        def save() -> None:
            write_json(args.out / f"{NAME}.json", with_unmeasured(result, args.previous_rows))
            write_text(args.out / f"{NAME}.md", "# Store scale\n\n" + render_markdown(result))

        for store in args.stores:
            # A store is reused only when the previous figures have its row (an index built then).
            reuse = args.reuse_index and _previous_row(args, store) is not None
            if store == "embedded":
                index_dir = work / "embedded-index"
                if not reuse:
                    shutil.rmtree(index_dir, ignore_errors=True)
                kw = {"KB_AGENT_INDEX_DIR": str(index_dir)}
                settings["embedded"] = {"KB_AGENT_INDEX_DIR": str(work / "questions-index")}
            else:
                uri = args.postgres
                if not uri:
                    server, uri = start_postgres(str(work / "pg"), fresh=not reuse, buffers=shared_buffers(args.shared_buffers))
                elif not reuse:
                    uri = other_database(uri, "crag_bench")
                kw = {"KB_AGENT_STORE": uri, "KB_AGENT_INDEX_DIR": str(work / "unused-index")}
                settings["postgresql"] = {"KB_AGENT_STORE": other_database(uri, "crag_questions"),
                                          "KB_AGENT_INDEX_DIR": str(work / "unused-index")}
            result["rows"].append(measure(store, kw, corpus, text_bytes, queries, args, work))
            save()
        check = args.questions_check == "yes" or (args.questions_check == "auto" and args.chunks < 200_000)
        if check and (SHARED / "corpora").is_dir():
            result["questions_check"] = questions_check(settings, 1000)
            save()
        return result
    finally:
        if server is not None:
            server.cleanup()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = run(args)
    print(render_markdown(result))
    return result


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.store_scale"))
