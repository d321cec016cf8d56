"""Store scale: the embedded store (FAISS + SQLite) and PostgreSQL + pgvector on one corpus.

Both stores index the same synthetic Markdown corpus through crag's own update path
(discovery, chunking, the hash embedder, the store's writes) and answer the same queries
through ``Retriever.search`` (hybrid: vector + full-text + file ranking, fused). Reported
for each store:

* indexing throughput: chunks per second of a first ``index_roots`` over the corpus, and
  the time of a second run that finds nothing changed;
* search latency: p50 and p95 of single hybrid searches (top 5), and of vector-only ones;
* throughput with 1, 4 and 16 concurrent clients (``--clients``): separate processes, each
  opening the store and searching for ``--client-seconds``; searches per second in total;
* for PostgreSQL, recall@10 of the HNSW index against exact search over the same vectors.

The corpus (``--chunks``, default 100k) is generated from a Zipf-distributed vocabulary, in
files of 8 sections each; queries are phrases from random chunks. ``--dim`` sets the hash
embedder's dimension (default 1024: pgvector before 0.7 builds HNSW indexes of at most 2000
dimensions; crag's default of 2048 searches exactly on those servers). PostgreSQL is the
server ``--postgres URI`` names, or one started with ``pgserver`` in a temporary folder.

Run: ``python -m benchmarks.store_scale --chunks 100000`` (``--chunks 1000000`` on a bigger
machine). Writes ``store_scale.json`` and ``.md`` to ``--out`` (no chart).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, environment, fmt, markdown_table, percentile, write_report

NAME = "store_scale"
SECTIONS_PER_FILE = 8


def make_corpus(root: Path, chunks: int, seed: int, words_per_section: int = 90) -> int:
    """Write about ``chunks`` sections of Zipf-distributed words; returns the number of files."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qui", "dor", "fen", "gal", "hul", "jix"]
    vocab = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(30_000)})
    weights = [1.0 / (r + 1) ** 1.05 for r in range(len(vocab))]
    files = max(1, chunks // SECTIONS_PER_FILE)
    for f in range(files):
        folder = root / f"area{f % 100:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        words = rng.choices(vocab, weights, k=SECTIONS_PER_FILE * (words_per_section + 3) + 4)
        it = iter(words)
        lines = [f"# {' '.join(next(it) for _ in range(4))}", ""]
        for s in range(SECTIONS_PER_FILE):
            lines += [f"## {s + 1}. {' '.join(next(it) for _ in range(3))}", ""]
            body = [next(it) for _ in range(words_per_section)]
            lines += [" ".join(body[i : i + 15]) + "." for i in range(0, len(body), 15)] + [""]
        (folder / f"doc{f:06d}.md").write_text("\n".join(lines), encoding="utf-8")
    return files


def make_queries(root: Path, n: int, seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    paths = sorted(root.rglob("*.md"))
    queries = []
    for _ in range(n):
        text = rng.choice(paths).read_text(encoding="utf-8").split()
        start = rng.randrange(0, max(1, len(text) - 5))
        queries.append(" ".join(w.strip(".#") for w in text[start : start + rng.randint(3, 5)]))
    return queries


def timed_searches(reader: Any, queries: list[str], mode: str) -> list[float]:
    times = []
    for q in queries:
        t = time.perf_counter()
        reader.search(q, 5, mode=mode)
        times.append(time.perf_counter() - t)
    return times


def _client(job: tuple[dict[str, Any], list[str], float, int]) -> int:
    settings_kw, queries, seconds, dim = job
    from crag.config import Settings
    from crag.index import open_index
    from crag.index.hash_embedder import HashEmbedder

    done = 0
    with open_index(Settings(**settings_kw), HashEmbedder(dim)) as reader:
        deadline = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < deadline:
            reader.search(queries[i % len(queries)], 5)
            done += 1
            i += 1
    return done


def concurrent_throughput(settings_kw: dict[str, Any], queries: list[str], clients: int, seconds: float, dim: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(clients) as pool:
        shares = [queries[i::clients] or queries for i in range(clients)]
        start = time.perf_counter()
        counts = pool.map(_client, [(settings_kw, s, seconds, dim) for s in shares])
        elapsed = max(seconds, time.perf_counter() - start)
    return sum(counts) / elapsed


def hnsw_recall(reader: Any, queries: list[str], root: str, k: int) -> float | None:
    """recall@k of the PostgreSQL store's HNSW ranking against its exact ranking."""
    if getattr(reader, "hnsw", None) is None:
        return None
    found = total = 0
    for q in queries:
        vec = reader.embed_query(q)
        approx = {i for i, _ in reader.vector_ranking(vec, k)}
        exact = {i for i, _ in reader.vector_ranking(vec, k, roots=[root])}  # restricted: exact search
        found += len(approx & exact)
        total += len(exact)
    return found / total if total else None


def measure(name: str, settings_kw: dict[str, Any], corpus: Path, queries: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from crag.config import Settings
    from crag.index import index_roots, open_index
    from crag.index.hash_embedder import HashEmbedder

    settings = Settings(**settings_kw)
    embedder = HashEmbedder(args.dim)
    print(f"[{name}] indexing ...", flush=True)
    t = time.perf_counter()
    report = index_roots(settings, [corpus], embedder=embedder, lock_timeout=600)
    seconds = time.perf_counter() - t
    t = time.perf_counter()
    index_roots(settings, [corpus], embedder=embedder)
    again = time.perf_counter() - t
    row: dict[str, Any] = {
        "store": name,
        "chunks": report.chunks_total,
        "files": len(report.added),
        "index_s": seconds,
        "index_chunks_per_s": report.chunks_total / seconds,
        "reindex_unchanged_s": again,
    }
    print(f"[{name}] {row['chunks']} chunks in {seconds:.1f}s; searching ...", flush=True)
    with open_index(settings, embedder) as reader:
        timed_searches(reader, queries[:5], "hybrid")  # warm caches
        hybrid = timed_searches(reader, queries, "hybrid")
        vector = timed_searches(reader, queries, "vector")
        row.update(
            hybrid_p50_ms=1000 * percentile(hybrid, 50), hybrid_p95_ms=1000 * percentile(hybrid, 95),
            vector_p50_ms=1000 * percentile(vector, 50), vector_p95_ms=1000 * percentile(vector, 95),
        )
        if name == "postgresql":
            row["hnsw"] = reader.hnsw or "none (exact)"
            row["hnsw_recall_at_10"] = hnsw_recall(reader, queries[: args.recall_queries], str(corpus), 10)
    for clients in args.clients:
        print(f"[{name}] {clients} concurrent clients ...", flush=True)
        row[f"qps_{clients}"] = concurrent_throughput(settings_kw, queries, clients, args.client_seconds, args.dim)
    return row


def ranking_parity(settings_kw: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """recall@5 and MRR@5 of each store on the shared corpora's questions (benchmarks/retrieval.py)."""
    from benchmarks import retrieval
    from crag.config import Settings
    from crag.index import index_roots, open_index
    from crag.index.hash_embedder import HashEmbedder

    docs = retrieval.CORPORA[0]
    questions = retrieval.load_questions(docs, None)
    roots = list(docs.roots)
    rows = []
    for name, kw in settings_kw.items():
        settings = Settings(**kw)
        print(f"[{name}] questions: indexing the shared corpora ...", flush=True)
        index_roots(settings, roots, embedder=HashEmbedder())
        row: dict[str, Any] = {"store": name}
        with open_index(settings, HashEmbedder()) as reader:
            for mode in ("vector", "lexical", "hybrid"):
                r = retrieval.evaluate(reader, questions, mode)["file"]
                row[f"{mode}_recall@5"], row[f"{mode}_mrr@5"] = r["recall@5"], r["mrr@5"]
        rows.append(row)
    return rows


def start_postgres(folder: str) -> tuple[Any, str]:
    import pgserver

    server = pgserver.get_server(folder, cleanup_mode="stop")
    import psycopg

    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS crag_bench")
        conn.execute("CREATE DATABASE crag_bench")
        # An HNSW build is much faster when its graph fits in maintenance_work_mem.
        conn.execute("ALTER DATABASE crag_bench SET maintenance_work_mem = '2GB'")
    uri = server.get_uri().replace("/postgres?", "/crag_bench?")
    return server, uri


def _other_database(uri: str, name: str) -> str:
    """A fresh database ``name`` on the server of ``uri``, and its URI."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def render_markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    clients = result["args"]["clients"]
    header = ["store", "chunks", "index chunks/s", "re-index (nothing changed) s", "hybrid p50 / p95 ms",
              "vector p50 / p95 ms", *[f"{c} client(s) searches/s" for c in clients], "HNSW recall@10"]
    body = []
    for r in rows:
        recall = r.get("hnsw_recall_at_10")
        body.append([
            r["store"], f"{r['chunks']:,}", fmt(r["index_chunks_per_s"], 0), fmt(r["reindex_unchanged_s"], 2),
            f"{fmt(r['hybrid_p50_ms'], 1)} / {fmt(r['hybrid_p95_ms'], 1)}",
            f"{fmt(r['vector_p50_ms'], 1)} / {fmt(r['vector_p95_ms'], 1)}",
            *[fmt(r[f"qps_{c}"], 1) for c in clients],
            "exact" if r["store"] == "embedded" else (f"{recall:.3f} ({r['hnsw']})" if recall is not None else r.get("hnsw", "")),
        ])
    a = result["args"]
    parity = ""
    if result.get("questions"):
        modes = ("vector", "lexical", "hybrid")
        parity = (
            "\n\nOn the shared corpora's questions (benchmarks/questions.jsonl, hash embedder at its default "
            "dimension; recall@5 / MRR@5 by file):\n\n"
            + markdown_table(["store", *modes], [[r["store"], *[f"{r[m + '_recall@5']:.3f} / {r[m + '_mrr@5']:.3f}" for m in modes]] for r in result["questions"]])
        )
    intro = (
        f"Synthetic Markdown corpus, {a['chunks']:,} chunks requested, hash embedder at {a['dim']} dimensions; "
        f"{a['queries']} queries of 3-5 words; top 5; clients are separate processes searching for "
        f"{a['client_seconds']:g}s each; {result['environment'].get('cpu_count', '?')} CPU(s).\n\n"
    )
    return intro + markdown_table(header, body) + parity + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.store_scale", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, default=100_000, help="chunks in the corpus (default: %(default)s)")
    p.add_argument("--dim", type=int, default=1024, help="hash embedder dimension (default: %(default)s)")
    p.add_argument("--queries", type=int, default=200, help="queries for the latency figures (default: %(default)s)")
    p.add_argument("--recall-queries", type=int, default=100, help="queries for HNSW recall (default: %(default)s)")
    p.add_argument("--clients", default="1,4,16", help="concurrent client counts (default: %(default)s)")
    p.add_argument("--client-seconds", type=float, default=10.0, help="seconds each client searches (default: %(default)s)")
    p.add_argument("--stores", default="embedded,postgresql", help="which stores (default: %(default)s)")
    p.add_argument("--postgres", default="", help="a postgresql:// URI to use instead of starting pgserver")
    p.add_argument("--workdir", default="", help="where the corpus and the embedded index go (default: a temporary folder)")
    p.add_argument("--no-questions", action="store_true", help="skip recall@5 / MRR@5 on the shared corpora's questions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",") if c]
    args.stores = [s for s in args.stores.split(",") if s]
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="crag-store-scale-"))
    corpus = work / "corpus"
    server = None
    try:
        if not corpus.exists():
            print(f"writing the corpus to {corpus} ...", flush=True)
            make_corpus(corpus, args.chunks, args.seed)
        queries = make_queries(corpus, args.queries, args.seed)
        rows: list[dict[str, Any]] = []
        uris: dict[str, dict[str, Any]] = {}
        env = environment(["faiss-cpu", "numpy", "psycopg", "pgserver"])
        arguments = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}

        def partial(questions: list[dict[str, Any]]) -> dict[str, Any]:
            result = {"args": arguments, "rows": rows, "questions": questions, "environment": env}
            write_report(NAME, result, args.out, render_markdown, lambda r, p: None, False)  # kept if a later step fails
            return result

        for store in args.stores:
            if store == "embedded":
                index_dir = work / "embedded-index"
                shutil.rmtree(index_dir, ignore_errors=True)
                rows.append(measure("embedded", {"index_dir": str(index_dir)}, corpus, queries, args))
                uris["embedded"] = {"index_dir": str(work / "questions-index")}
                partial([])
            elif store == "postgresql":
                uri = args.postgres
                if not uri:
                    server, uri = start_postgres(str(work / "pg"))
                rows.append(measure("postgresql", {"store": uri}, corpus, queries, args))
                uris["postgresql"] = {"store": _other_database(uri, "crag_questions")}
                partial([])
        questions = []
        from benchmarks import retrieval

        if not args.no_questions and (retrieval.SHARED / "corpora").is_dir():
            questions = ranking_parity(uris)
        return partial(questions)
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
    main()
