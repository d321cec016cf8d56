"""Index scale: when does crag's exact FAISS index stop being good enough?

crag keeps its chunk vectors in an exact inner-product index (``IndexFlatIP``: unit vectors,
so inner product = cosine). This benchmark measures it against two approximate indexes at
growing sizes, so the docs can say at what size switching pays:

* ``flat``  ``IndexFlatIP``, exact (brute force);
* ``hnsw``  ``IndexHNSWFlat`` (graph; ``--hnsw-m`` links per node, ``--hnsw-ef-construction``,
  ``--hnsw-ef-search``). Its build is slow, so by default it runs up to ``--hnsw-max``
  chunks (200k); ``--full`` builds it at every size;
* ``ivf``   ``IndexIVFFlat`` (k-means cells: ``4·√N``, at most ``--ivf-max-nlist``, trained
  on ``--ivf-train`` vectors; ``--ivf-nprobe`` cells visited per query).

For every size (default 10k, 100k and 1M chunks) and index it reports:

* build throughput: chunks per second for training + adding every vector (the time spent
  in FAISS; generating the synthetic vectors is not counted);
* search latency, top-10: p50 and p95 of single-query searches (at least ``--min-single``
  of them, then more until ``--single-budget-s`` has passed), and the per-query time of one
  batched search of all ``--queries`` queries (median of ``--batch-repeats``);
* memory per chunk: the bytes the index holds (vectors plus structure; equal to its
  serialised size) divided by the number of chunks. crag's SQLite chunk metadata comes on
  top and is the same whichever index is used;
* recall@10 of the approximate indexes against the exact one, on the same queries.

The vectors are synthetic, since no corpus of a million chunks ships with crag (see
``Corpus``: unit vectors on a ``--rank``-dimensional subspace with a decaying spectrum,
queries drawn fresh from the same distribution). ``--dim`` defaults to the dimension of
crag's hash embedder when ``crag.index.embedders`` tells it, else 384. FAISS runs on all
cores unless ``--threads`` says otherwise.

Run: ``python -m benchmarks.index_scale`` (``--sizes 10000,100000`` for a quick look,
``--full`` for HNSW at 1M). Writes ``index_scale.json``, ``.md`` and ``.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    at_least,
    counts,
    environment,
    fmt,
    load_pyplot,
    markdown_table,
    out_dir,
    percentile,
    positive,
    run_main,
    write_report,
)

NAME = "index_scale"
METHODS = ("flat", "hnsw", "ivf")
FALLBACK_DIM = 384


def default_dim() -> tuple[int, str]:
    """crag's hash-embedder dimension when crag.index.embedders tells it, else FALLBACK_DIM."""
    try:
        from crag.index import embedders
    except Exception:
        return FALLBACK_DIM, "fallback (crag.index.embedders not importable)"
    dim = getattr(embedders, "DEFAULT_HASH_DIM", None)
    if isinstance(dim, int):
        return dim, "crag's hash embedder (crag.index.embedders.DEFAULT_HASH_DIM)"
    return FALLBACK_DIM, "fallback (no hash embedder dimension found)"


class Corpus:
    """Synthetic embeddings of ``n`` chunks, generated batch by batch and reproducibly.

    A vector is ``normalise(z @ W)``: ``z`` has ``rank`` independent Gaussian coordinates
    whose standard deviations fall off as ``i ** -0.5`` and ``W`` is a fixed random
    ``rank x dim`` projection. Real text embeddings look like this: unit vectors with a
    decaying spectrum on a low-dimensional subspace, so neighbourhoods are continuous and
    an approximate index has to work for its recall (unlike uniform random vectors, which
    have no neighbours worth the name, or well-separated clusters, which make IVF exact).
    Every call of ``batches()`` yields the same vectors, so each index can be built by
    streaming them without holding a second copy of a million vectors in memory.
    """

    def __init__(self, n: int, dim: int, rank: int, seed: int, batch: int = 50_000) -> None:
        import numpy as np

        self.n, self.dim, self.batch, self.seed = n, dim, batch, seed
        rng = np.random.default_rng([seed, 0])
        self.rank = min(rank, dim)
        self.w = (rng.standard_normal((self.rank, dim)) / math.sqrt(dim)).astype(np.float32)
        self.scale = (np.arange(1, self.rank + 1, dtype=np.float32) ** -0.5).astype(np.float32)

    def _draw(self, rng, m: int):
        import numpy as np

        z = rng.standard_normal((m, self.rank), dtype=np.float32)
        z *= self.scale
        x = z @ self.w
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    def batches(self):
        import numpy as np

        rng = np.random.default_rng([self.seed, 1])
        for start in range(0, self.n, self.batch):
            yield self._draw(rng, min(self.batch, self.n - start))

    def queries(self, m: int):
        """Fresh draws from the same distribution (not copies of stored chunks)."""
        import numpy as np

        return self._draw(np.random.default_rng([self.seed, 2]), m)


def ivf_nlist(n: int, args) -> int:
    return max(1, min(int(4 * math.sqrt(n)), args.ivf_max_nlist, n // 39))


def build_index(method: str, corpus: Corpus, args) -> tuple[Any, float]:
    """The index with every chunk added, and the seconds spent in FAISS (generation excluded)."""
    import faiss
    import numpy as np

    n, dim = corpus.n, corpus.dim
    spent = 0.0
    if method == "flat":
        index = faiss.IndexFlatIP(dim)
    elif method == "hnsw":
        index = faiss.IndexHNSWFlat(dim, args.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = args.hnsw_ef_construction
    elif method == "ivf":
        nlist = ivf_nlist(n, args)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = args.ivf_niter
        want = min(n, max(args.ivf_train, 39 * nlist))
        parts, have = [], 0
        for x in corpus.batches():
            parts.append(x[: want - have])
            have += parts[-1].shape[0]
            if have >= want:
                break
        train = np.concatenate(parts)
        del parts
        t = time.perf_counter()
        index.train(train)
        spent += time.perf_counter() - t
        del train
    else:
        raise ValueError(method)
    for x in corpus.batches():
        t = time.perf_counter()
        index.add(x)
        spent += time.perf_counter() - t
    if method == "hnsw":
        index.hnsw.efSearch = args.hnsw_ef_search
    elif method == "ivf":
        index.nprobe = args.ivf_nprobe
    return index, spent


def index_bytes(method: str, index) -> int:
    """What the index holds in memory (and on disk), computed from its parts.

    Equal to ``len(faiss.serialize_index(index))`` up to a header of a few bytes, without
    making an 8 GB copy of a million-chunk index to find out.
    """
    import faiss

    if method == "flat":
        return int(index.ntotal * index.code_size)
    if method == "hnsw":
        h = index.hnsw
        return int(index.ntotal * faiss.downcast_index(index.storage).code_size + h.neighbors.size() * 4
                   + h.levels.size() * 4 + h.offsets.size() * 8)
    if method == "ivf":
        ivf = faiss.extract_index_ivf(index)
        return int(ivf.invlists.compute_ntotal() * (ivf.code_size + 8) + ivf.nlist * ivf.d * 4)
    raise ValueError(method)


def index_params(method: str, index, args) -> dict[str, Any]:
    if method == "hnsw":
        return {"M": args.hnsw_m, "efConstruction": args.hnsw_ef_construction, "efSearch": args.hnsw_ef_search}
    if method == "ivf":
        return {"nlist": int(index.nlist), "nprobe": int(index.nprobe)}
    return {}


def time_single_queries(index, xq, k: int, args) -> list[float]:
    """ms per single-query search: at least --min-single queries, then until --single-budget-s."""
    out = []
    began = time.perf_counter()
    for i in range(xq.shape[0]):
        t = time.perf_counter_ns()
        index.search(xq[i : i + 1], k)
        out.append((time.perf_counter_ns() - t) / 1e6)
        if i + 1 >= args.min_single and time.perf_counter() - began > args.single_budget_s:
            break
    return out


def measure(method: str, corpus: Corpus, xq, exact_ids, args) -> tuple[dict[str, Any], Any]:
    import faiss
    import numpy as np

    n = corpus.n
    index, build_s = build_index(method, corpus, args)

    k = args.k
    threads = faiss.omp_get_max_threads()
    index.search(xq[:1], k)  # warm-up
    singles = time_single_queries(index, xq, k, args)
    singles_1 = singles
    if threads > 1:
        faiss.omp_set_num_threads(1)
        try:
            singles_1 = time_single_queries(index, xq, k, args)
        finally:
            faiss.omp_set_num_threads(threads)
    batched = []
    ids = None
    for _ in range(args.batch_repeats):
        t = time.perf_counter_ns()
        _, ids = index.search(xq, k)
        batched.append((time.perf_counter_ns() - t) / 1e6 / xq.shape[0])
    if exact_ids is None:
        recall = 1.0
    else:
        hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ids, exact_ids))
        recall = hits / (k * xq.shape[0])
    size = index_bytes(method, index)
    row = {
        "method": method,
        "chunks": n,
        "params": index_params(method, index, args),
        "build_s": build_s,
        "build_chunks_per_s": n / build_s if build_s > 0 else math.inf,
        "single_queries_timed": len(singles),
        "search_p50_ms": percentile(singles, 50),
        "search_p95_ms": percentile(singles, 95),
        "search_p50_ms_1_thread": percentile(singles_1, 50),
        "search_p95_ms_1_thread": percentile(singles_1, 95),
        "batched_ms_per_query": float(np.median(batched)),
        "bytes_per_chunk": size / n,
        "index_mb": size / 2**20,
        f"recall_at_{k}": recall,
    }
    del index
    return row, ids


def run(args) -> dict[str, Any]:
    import faiss

    faiss.omp_set_num_threads(args.threads or faiss.omp_get_max_threads())
    dim = args.dim
    rows = []
    for n in args.sizes:
        corpus = Corpus(n, dim, args.rank, args.seed)
        xq = corpus.queries(args.queries)
        exact = None
        methods = [m for m in args.methods if not (m == "hnsw" and n > args.hnsw_max)]
        if "flat" not in methods:
            methods.insert(0, "flat")  # recall needs the exact answer
        methods.sort(key=lambda m: m != "flat")
        for method in methods:
            row, ids = measure(method, corpus, xq, exact, args)
            if method == "flat":
                exact = ids
            rows.append(row)
            if args.verbose:
                print(
                    f"  index_scale: {method:5s} {n:>9,} chunks  build {row['build_s']:6.1f}s  "
                    f"p50 {row['search_p50_ms']:8.3f} ms  recall@{args.k} {row[f'recall_at_{args.k}']:.3f}",
                    flush=True,
                )
            gc.collect()
        for method in args.methods:
            if method not in methods:
                rows.append({"method": method, "chunks": n,
                             "skipped": f"HNSW above {args.hnsw_max:,} chunks needs --full (slow build)"})
        gc.collect()
    return {
        "benchmark": NAME,
        "args": {
            "sizes": args.sizes,
            "dim": dim,
            "dim_source": args.dim_source,
            "rank": args.rank,
            "queries": args.queries,
            "k": args.k,
            "seed": args.seed,
            "threads": faiss.omp_get_max_threads(),
            "methods": list(args.methods),
            "hnsw_max": args.hnsw_max,
        },
        "environment": environment(["faiss-cpu", "numpy"]),
        "rows": rows,
        "advice": advice(rows, args),
    }


def advice(rows: list[dict[str, Any]], args) -> dict[str, Any]:
    """Where exact search crosses the latency budget, extrapolated linearly in N (brute force is O(N))."""
    flat = [r for r in rows if r["method"] == "flat" and "skipped" not in r]
    if not flat:
        return {}
    largest = max(flat, key=lambda r: r["chunks"])
    out: dict[str, Any] = {"latency_budget_ms": args.latency_budget_ms}
    for suffix, key in (("", "search_p50_ms"), ("_1_thread", "search_p50_ms_1_thread")):
        per_chunk_ms = largest[key] / largest["chunks"]
        out[f"flat_ms_per_million_chunks{suffix}"] = per_chunk_ms * 1e6
        out[f"flat_exceeds_budget_at_chunks{suffix}"] = (
            int(args.latency_budget_ms / per_chunk_ms) if per_chunk_ms > 0 else None)
    return out


def render_markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    k = a["k"]
    lines = [(
        f"Synthetic unit vectors, dim {a['dim']} ({a['dim_source']}), intrinsic rank {a['rank']}; "
        f"{a['queries']} queries, top-{k}; FAISS on {a['threads']} threads.\n\n"
    )]
    headers = [
        "chunks", "index", "params", "build (chunks/s)", f"search p50 / p95 (ms), {a['threads']} threads",
        "search p50 / p95 (ms), 1 thread", "batched (ms/query)", "bytes/chunk", f"recall@{k}",
    ]
    rows = []
    for r in result["rows"]:
        if "skipped" in r:
            rows.append([fmt(r["chunks"]), r["method"], "–", "skipped: " + r["skipped"], "–", "–", "–", "–", "–"])
            continue
        params = ", ".join(f"{key}={val}" for key, val in r["params"].items()) or "exact"
        rows.append([
            fmt(r["chunks"]), r["method"], params, fmt(round(r["build_chunks_per_s"])),
            f"{fmt(r['search_p50_ms'], 2)} / {fmt(r['search_p95_ms'], 2)}",
            f"{fmt(r['search_p50_ms_1_thread'], 2)} / {fmt(r['search_p95_ms_1_thread'], 2)}",
            fmt(r["batched_ms_per_query"], 3),
            fmt(round(r["bytes_per_chunk"])), fmt(r[f"recall_at_{k}"], 3),
        ])
    lines.append(markdown_table(headers, rows, "rllrrrrrr"))
    adv = result.get("advice") or {}
    if adv.get("flat_exceeds_budget_at_chunks"):
        lines.append(
            f"\nExact search of one query costs about {adv['flat_ms_per_million_chunks']:.0f} ms per million "
            f"chunks on {a['threads']} threads ({adv['flat_ms_per_million_chunks_1_thread']:.0f} ms on 1 thread); "
            f"it passes a {adv['latency_budget_ms']:g} ms budget at about "
            f"{adv['flat_exceeds_budget_at_chunks']:,} chunks ({adv['flat_exceeds_budget_at_chunks_1_thread']:,} "
            f"on 1 thread).\n"
        )
    return "".join(lines)


def render_chart(result: dict[str, Any], path: Path) -> Path | None:
    plt = load_pyplot()
    if plt is None:
        return None
    k = result["args"]["k"]
    rows = [r for r in result["rows"] if "skipped" not in r]
    colours = {"flat": "#1f77b4", "hnsw": "#d62728", "ivf": "#2ca02c"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for method in METHODS:
        rs = sorted((r for r in rows if r["method"] == method), key=lambda r: r["chunks"])
        if not rs:
            continue
        xs = [r["chunks"] for r in rs]
        label = {"flat": "exact (IndexFlatIP)", "hnsw": "HNSW", "ivf": "IVF"}[method]
        axes[0].plot(xs, [r["search_p50_ms"] for r in rs], "o-", color=colours[method], label=label)
        axes[0].plot(xs, [r["search_p50_ms_1_thread"] for r in rs], "o--", color=colours[method], alpha=0.6,
                     label=f"{label}, 1 thread")
        axes[1].plot(xs, [r["build_chunks_per_s"] for r in rs], "o-", color=colours[method], label=label)
        if method != "flat":
            axes[2].plot(xs, [r[f"recall_at_{k}"] for r in rs], "o-", color=colours[method], label=label)
    budget = result.get("advice", {}).get("latency_budget_ms")
    if budget:
        axes[0].axhline(budget, color="grey", ls="--", lw=1)
        axes[0].annotate(f"{budget:g} ms budget", (0.02, budget), xycoords=("axes fraction", "data"),
                         va="bottom", color="grey", fontsize=8)
    axes[0].set(xscale="log", yscale="log", xlabel="chunks", ylabel="ms per query (p50)",
                title="Single-query search latency")
    axes[1].set(xscale="log", yscale="log", xlabel="chunks", ylabel="chunks / s", title="Build throughput")
    axes[2].set(xscale="log", xlabel="chunks", ylabel=f"recall@{k} vs exact", title="Approximate recall",
                ylim=(0, 1.02))
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    a = result["args"]
    fig.suptitle(f"FAISS index scale: synthetic unit vectors (dim {a['dim']}, intrinsic rank {a['rank']}), "
                 f"top-{k}, {a['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv=None) -> argparse.Namespace:
    dim, source = default_dim()
    p = argparse.ArgumentParser(prog="python -m benchmarks.index_scale", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=counts(1), default="10000,100000,1000000", help="comma-separated chunk counts (default: %(default)s)")
    p.add_argument("--dim", type=at_least(1), default=None, help=f"vector dimension (default: {dim}, {source})")
    p.add_argument("--rank", type=at_least(1), default=128, help="intrinsic dimension of the synthetic vectors (default: %(default)s)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of flat,hnsw,ivf")
    p.add_argument("--queries", type=at_least(1), default=100, help="queries per size, for recall and batched search (default: %(default)s)")
    p.add_argument("--k", type=at_least(1), default=10, help="top-k searched, recall@k (default: %(default)s)")
    p.add_argument("--min-single", type=int, default=20,
                   help="single-query searches timed at least (default: %(default)s) ...")
    p.add_argument("--single-budget-s", type=float, default=5.0,
                   help="... and then until this many seconds have passed or every query ran (default: %(default)s)")
    p.add_argument("--hnsw-m", type=at_least(1), default=16)
    p.add_argument("--hnsw-ef-construction", type=at_least(1), default=40)
    p.add_argument("--hnsw-ef-search", type=at_least(1), default=128)
    p.add_argument("--hnsw-max", type=int, default=200_000,
                   help="skip HNSW above this many chunks: its build is the slow part (default: %(default)s)")
    p.add_argument("--ivf-nprobe", type=at_least(1), default=32)
    p.add_argument("--ivf-max-nlist", type=at_least(1), default=1024, help="cells: 4*sqrt(N), at most this (default: %(default)s)")
    p.add_argument("--ivf-train", type=int, default=50_000, help="training vectors, at least 39 per cell (default: %(default)s)")
    p.add_argument("--ivf-niter", type=at_least(1), default=10, help="k-means iterations (default: %(default)s)")
    p.add_argument("--full", action="store_true", help="also build HNSW at every size (adds minutes at 1M chunks)")
    p.add_argument("--batch-repeats", type=at_least(1), default=3)
    p.add_argument("--latency-budget-ms", type=positive, default=50.0,
                   help="per-query search budget the advice is computed for (default: %(default)s)")
    p.add_argument("--threads", type=at_least(0), default=0, help="FAISS threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=out_dir, default=RESULTS_DIR)
    p.add_argument("--quiet", dest="verbose", action="store_false")
    args = p.parse_args(argv)
    if not args.sizes:
        p.error("--sizes needs at least one chunk count")
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        p.error(f"unknown method(s): {', '.join(sorted(unknown))}")
    if args.full:
        args.hnsw_max = max(args.sizes)
    args.dim_source = "--dim" if args.dim else source
    args.dim = args.dim or dim
    return args


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    return write_report(NAME, run(args), args.out, render_markdown, render_chart, args.verbose)


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.index_scale"))
