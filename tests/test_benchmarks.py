"""The benchmarks cannot rot: each runs on a tiny workload and writes its report files.

Nothing here asserts a wall-clock figure; the checks are on what the numbers must satisfy
whatever the machine (call counts, token orderings, recall of the exact index, identical
decisions). langgraph and matplotlib are optional: without them the LangGraph columns and
the PNG charts are skipped, and so are the assertions about them.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys

import pytest

from benchmarks import grading_cost, index_scale, overhead, run_all

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HAS_LANGGRAPH = importlib.util.find_spec("langgraph") is not None

PASSAGES = {
    # qid: (query, [(grade, passage), ...] in BM25 order)
    "101": ("how long do fleas live", [
        (3, "A flea lives from two weeks to a year depending on temperature and hosts."),
        (0, "The cat flea's main host is the domestic cat."),
        (2, "Adult fleas live about two to three months on a host."),
        (1, "Fleas go through egg, larva, pupa and adult stages."),
        (0, "Flea markets sell second-hand goods on weekends."),
        (2, "Without a host an adult flea survives only a week or two."),
    ]),
    "102": ("what is the boiling point of water at altitude", [
        (1, "Water boils at 100 degrees Celsius at sea level."),
        (3, "At higher altitude air pressure drops, so water boils below 100 C, about 95 C at 1,500 m."),
        (0, "Altitude sickness starts around 2,500 metres."),
        (2, "Boiling point falls about 1 degree C for every 300 m of altitude."),
        (0, "A kettle is a pot for boiling water."),
        (1, "Pressure cookers raise the boiling point of water."),
    ]),
    "103": ("who wrote the origin of species", [
        (3, "On the Origin of Species was written by Charles Darwin and published in 1859."),
        (1, "Alfred Russel Wallace also proposed natural selection."),
        (0, "The species count of beetles is enormous."),
        (2, "Darwin's book on natural selection appeared in November 1859."),
        (0, "Origin is a game distribution platform."),
        (0, "Species are groups of organisms that can interbreed."),
    ]),
}


@pytest.fixture
def judged_pairs(tmp_path):
    path = tmp_path / "judged_pairs.jsonl"
    with path.open("w") as f:
        for qid, (query, passages) in PASSAGES.items():
            for rank, (grade, text) in enumerate(passages, start=1):
                f.write(json.dumps({"collection": "tiny", "qid": qid, "query": query, "docid": f"{qid}{rank:03d}",
                                    "bm25_rank": rank, "passage": text, "grade": grade,
                                    "relevant": grade >= 2}) + "\n")
    return path


def _files(out, name):
    assert (out / f"{name}.json").is_file()
    assert (out / f"{name}.md").read_text().strip()
    if HAS_MATPLOTLIB:
        assert (out / f"{name}.png").stat().st_size > 1000
    return json.loads((out / f"{name}.json").read_text())


def test_grading_cost_runs_every_strategy_through_crag(tmp_path, judged_pairs):
    out = tmp_path / "out"
    grading_cost.main(["--data", str(judged_pairs), "--ks", "3,5", "--sweep", "0.8,0.3", "--few-context-ks", "2",
                       "--out", str(out), "--quiet"])
    result = _files(out, "grading_cost")
    single = {r["strategy"]: r for r in result["workloads"]["single_round"]}
    rounds = {r["strategy"]: r for r in result["workloads"]["rounds"]}
    assert set(single) == set(grading_cost.STRATEGIES)
    # one call per item for per_item, one per grading for batch: 3 queries x (3 + 5) items
    assert single["per_item"]["llm_calls"] == 3 * (3 + 5)
    assert single["batch"]["llm_calls"] == 3 * 2
    assert single["per_item"]["prompt_tokens"] > single["batch"]["prompt_tokens"] > 0
    # the same simulated grades: strategies without rules decide alike
    for key in ("relevant_kept", "irrelevant_through", "actions"):
        assert single["per_item"][key] == single["batch"][key]
        assert rounds["batch_rules_memory"][key] == rounds["batch_rules"][key]
    # the memory never costs more than re-grading, and saves only when a round is re-graded
    assert rounds["batch_rules_memory"]["total_tokens"] <= rounds["batch_rules"]["total_tokens"]
    assert single["batch_rules_memory"]["total_tokens"] == single["batch_rules"]["total_tokens"]
    # few_context at k=2 approves every list unread
    few = result["few_context"][0]
    assert few["few_context_hits"] == few["gradings"] == 3
    assert set(result["headline"]["rounds"]) == set(grading_cost.STRATEGIES)


def test_simulated_grader_is_deterministic_and_follows_the_grade():
    labels = {("q", f"s{g}"): g for g in range(4)}
    exact = grading_cost.SimulatedGrader(labels, grading_cost.DEFAULT_MEANS, noise=0.0, seed=1)
    scores = [exact.score("q", f"s{g}") for g in range(4)]
    assert scores == sorted(scores) and len(set(scores)) == 4
    noisy = [grading_cost.SimulatedGrader(labels, grading_cost.DEFAULT_MEANS, noise=0.15, seed=1) for _ in range(2)]
    assert noisy[0].score("q", "s2") == noisy[1].score("q", "s2")
    assert all(0.0 <= noisy[0].score("q", f"s{g}") <= 1.0 for g in range(4))
    assert exact.reply([0.8, 0.1]) == '{"scores": [0.8, 0.1]}'


def _simulated(strategy: str, judged_pairs, noise: float):
    """The first judged query, and ``strategy``'s model over a simulated grader with its meter
    and quality counters, as grading_cost builds them for k = 3."""
    queries = grading_cost.load_queries(judged_pairs, 1)
    labels = {(q.text, c.item.source): c.grade for q in queries for c in q.candidates}
    grader = grading_cost.SimulatedGrader(labels, grading_cost.DEFAULT_MEANS, noise=noise, seed=1)
    cost = grading_cost.CostModel("o200k_base", 350.0, 0.2, 15.0)
    meter, quality = grading_cost.Meter(), grading_cost.Quality()
    return queries, grading_cost.StrategyModel(strategy, grader, cost, meter, 3), meter, quality


@pytest.mark.parametrize("strategy", ["per_item", "batch", "scores"])
def test_grading_cost_splits_a_first_reading_into_its_header_and_new_items(strategy, judged_pairs):
    """One grading of items never graded sends nothing again: the prompt is the style's own
    header (rendered in ``task.style``, not the default style) plus the items read first time."""
    queries, model, meter, quality = _simulated(strategy, judged_pairs, noise=0.0)
    grading_cost.grade_once(strategy, queries[0], 3, model, meter, quality)
    assert meter.calls == (3 if strategy == "per_item" else 1)
    assert meter.resent_item_tokens == 0
    assert meter.header_tokens + meter.new_item_tokens == meter.prompt_tokens


def test_the_index_scale_docs_say_the_dimension_the_benchmark_measures():
    """docs/benchmarks.md said index_scale measures 2048 dimensions after the hash embedder's
    became 1,008 (the dimension the benchmark takes by default)."""
    from pathlib import Path

    from crag.index.embedders import DEFAULT_HASH_DIM

    doc = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    section = doc.split("## Index scale (`benchmarks/index_scale.py`)", 1)[1].strip().split("\n\n", 1)[0]
    assert index_scale.default_dim()[0] == DEFAULT_HASH_DIM
    assert f"`DEFAULT_HASH_DIM`, {DEFAULT_HASH_DIM:,}" in section
    assert "hash embedder's dimension (2048)" not in doc


@pytest.mark.parametrize(("strategy", "asked"), [("per_item", r"(yes|no)"), ("batch", r"(\d+: (yes|no)\n)*\d+: (yes|no)"),
                                               ("scores", r'\{"scores": \[[0-9., ]+\]\}')])
def test_the_simulated_grader_replies_as_each_styles_prompt_asks(strategy, asked, judged_pairs, monkeypatch):
    """It answered every style with the scores style's JSON (8 tokens for a pointwise yes/no),
    so completion tokens and time were not a real grader's; its scores are still what crag reads."""
    import re

    from crag.llm.tokens import count_tokens

    queries, model, meter, quality = _simulated(strategy, judged_pairs, noise=0.15)
    replies = []
    ask = model._ask
    monkeypatch.setattr(model, "_ask", lambda request: replies.append(ask(request)) or replies[-1])
    grading_cost.grade_once(strategy, queries[0], 3, model, meter, quality)
    assert replies and all(re.fullmatch(asked, r.text) for r in replies)
    assert meter.completion_tokens == sum(count_tokens(r.text, "o200k_base") for r in replies)
    if strategy == "per_item":
        assert meter.completion_tokens == meter.calls == 3  # one token, yes or no, a call
    q = queries[0]
    assert meter.parse_failures == 0
    assert meter.scored == [(model.grader.score(q.text, c.item.source), c.relevant) for c in q.candidates[:3]]


def test_overhead_runs_and_both_runners_agree(tmp_path):
    out = tmp_path / "out"
    result = overhead.main(["--runs", "20", "--warmup", "2", "--no-startup", "--profile", "--profile-runs", "5",
                            "--out", str(out), "--quiet"])
    saved = _files(out, "overhead")
    assert [r["path"] for r in saved["orchestration"]] == list(overhead.PATHS)
    real = {r["path"]: r for r in result["real_nodes"]}
    assert real["chitchat"]["trace"] == ["analyze_and_route", "synthesize"]
    assert real["complex"]["trace"] == ["analyze_and_route", "plan", "tool_exec", "grade_evidence", "synthesize"]
    assert real["complex"]["llm_calls"] == 4
    if HAS_LANGGRAPH:
        assert all("langgraph" in r for r in result["orchestration"])
    assert result["profile_real_nodes"], "cProfile rows"


def test_overhead_without_langgraph_says_so_instead_of_counting_its_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(overhead, "langgraph_available", lambda: False)
    result = overhead.main(["--runs", "10", "--warmup", "1", "--no-startup", "--out", str(tmp_path), "--quiet"])
    assert result["langgraph"] is False and not any("langgraph" in r for r in result["orchestration"])
    first = (tmp_path / "overhead.md").read_text().splitlines()[0]
    assert "for LangGraph" not in first
    assert "LangGraph is not installed: its columns are empty (pip install -e '.[bench]')" in first
    assert "overhead: LangGraph is not installed, its columns are empty" in capsys.readouterr().out


def test_driver_node_table_is_restored_after_the_orchestration_benchmark():
    import crag.driver
    from crag.nodes import NODES

    before = dict(crag.driver.NODES)
    with overhead.driver_nodes(overhead.trivial_nodes("complex")):
        assert before != crag.driver.NODES
    assert crag.driver.NODES == before == NODES


def test_index_scale_small(tmp_path):
    out = tmp_path / "out"
    index_scale.main(["--sizes", "500,2000", "--dim", "32", "--rank", "16", "--queries", "10", "--min-single", "3",
                      "--single-budget-s", "0.05", "--ivf-train", "1000", "--batch-repeats", "1",
                      "--out", str(out), "--quiet"])
    result = _files(out, "index_scale")
    rows = [r for r in result["rows"] if "skipped" not in r]
    assert {(r["method"], r["chunks"]) for r in rows} == {(m, n) for m in index_scale.METHODS for n in (500, 2000)}
    for r in rows:
        assert 0.0 <= r["recall_at_10"] <= 1.0
        assert r["bytes_per_chunk"] >= 32 * 4  # at least the float32 vector
        if r["method"] == "flat":
            assert r["recall_at_10"] == 1.0
            assert r["bytes_per_chunk"] == 32 * 4


# What each benchmark reads from the shared data beside the clone (../shared); without it the
# benchmark's smoke run is skipped, saying so.
SHARED = run_all.REPO.parent / "shared"
SHARED_DATA = {
    "grading_cost": "grading/trec_dl/judged_pairs.jsonl",
    "offline_grading": "corpora",
    "grounding": "corpora",
    "retrieval": "retrieval/squad_wiki",
    "store_scale": "retrieval/squad_wiki",
}


@pytest.mark.parametrize("name", run_all.BENCHMARKS)
def test_every_benchmark_runs_at_its_quick_size(name, tmp_path, request):
    """``python -m benchmarks.run_all --quick``, one benchmark at a time, in its own process as
    ``make bench`` runs it: a change to the code a benchmark drives fails here, not in the next
    ``make bench``. store_scale measures both stores (PostgreSQL: the tests' server). Without
    the bench extra the parts that need it are left out (no chart, no LangGraph, no BM25 row)."""
    need = SHARED_DATA.get(name)
    if need and not (SHARED / need).exists():
        pytest.skip(f"benchmarks.{name} reads {need} from the shared data beside the clone, not at {SHARED}")
    extra = []
    if name == "store_scale":
        server = request.getfixturevalue("pg_server")
        extra = ["--args", f"store_scale=--postgres {shlex.quote(server.get_uri())}"]
    assert run_all.main(["--quick", "--only", name, "--out", str(tmp_path), *extra]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["name"], r["exit_status"]) for r in summary["runs"]] == [(name, 0)]
    assert (tmp_path / f"{name}.md").read_text().strip()
    result = json.loads((tmp_path / f"{name}.json").read_text())
    assert summary["headlines"], "the headline figures are read back from what the benchmark wrote"
    if name == "store_scale":
        rows = {r["store"]: r for r in result["rows"]}
        assert set(rows) == {"embedded", "postgresql"}
        assert all(r["chunks"] > 0 and r["questions"]["p50_ms"] > 0 for r in rows.values())
        assert rows["postgresql"]["during_writes"]["exit_status"] == 0


def test_the_field_benchmark_runs_offline(tmp_path):
    """``make field``'s default (the offline backend; no server), on two questions, as a process."""
    if not (SHARED / "corpora").is_dir():
        pytest.skip(f"benchmarks.field reads the shared corpora beside the clone, not at {SHARED / 'corpora'}")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.field", "--offline", "--questions", "2", "--out",
                           str(tmp_path), "--index-dir", str(tmp_path / "index")],
                          cwd=run_all.REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "field-offline.json").read_text())
    assert result["questions"] == result["answered"] == len(result["answers"]) == 2


def test_run_all_quick_writes_a_summary(tmp_path):
    code = run_all.main(["--quick", "--only", "index_scale", "--out", str(tmp_path),
                         "--args", "index_scale=--dim 32 --sizes 1000 --ivf-train 1000"])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["name"] for r in summary["runs"]] == ["index_scale"]
    assert any("1,000 chunks" in line for line in summary["headlines"])


def test_run_all_headlines_come_from_this_runs_successful_benchmarks_only(tmp_path):
    """An --out holding an earlier run's files: a benchmark not run now, or failed now, has no
    headline (its JSON is the earlier run's, not this one's)."""
    (tmp_path / "overhead.json").write_text(json.dumps(
        {"headline": {"crag_overhead_us": {"simple": 1.0}, "min_ratio_overhead_langgraph_vs_crag": None}}))
    small = "index_scale=--dim 32 --sizes 1000 --ivf-train 1000"
    assert run_all.main(["--quick", "--only", "index_scale", "--out", str(tmp_path), "--args", small]) == 0
    first = json.loads((tmp_path / "summary.json").read_text())["headlines"]
    assert any("1,000 chunks" in line for line in first)
    assert not any(line.startswith("Driver overhead") for line in first)
    assert run_all.main(["--quick", "--only", "index_scale", "--out", str(tmp_path),
                         "--args", small + " --methods nope"]) == 1  # refused by its parser
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"][0]["exit_status"] == 2 and summary["headlines"] == []
    assert "1,000 chunks" not in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize(("flags", "index_sizes", "retrieval_quick"), [
    ([], ["--sizes", "10000,30000,100000"], True),   # make bench: under 10 minutes
    (["--full"], [], False),                                  # make bench-full: 1M chunks, every prose question
])
def test_run_all_default_is_the_short_run_and_full_the_long_one(tmp_path, monkeypatch, flags, index_sizes,
                                                                retrieval_quick):
    ran = {}

    def fake_run_one(name, argv, out):
        ran[name] = argv
        return {"name": name, "exit_status": 0, "wall_s": 0.0, "command": argv}

    monkeypatch.setattr(run_all, "run_one", fake_run_one)
    monkeypatch.setattr(run_all, "RESULTS_DIR", tmp_path)
    assert run_all.main(flags) == 0
    assert ran["index_scale"] == index_sizes
    assert ran["grading_cost"] == [] and ran["overhead"] == []
    assert ("--quick" in ran["retrieval"]) == retrieval_quick
    assert ran["store_scale"] == ["--chunks", "1000000" if flags else "100000"]
    out = tmp_path / "full" if flags else tmp_path  # neither run overwrites the other's results
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == ("full" if flags else "default")


def test_run_all_full_and_quick_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        run_all.main(["--full", "--quick"])
    assert "not allowed with" in capsys.readouterr().err


def test_retrieval_scoring_paragraphs_and_the_previous_fusion(tmp_path):
    """The retrieval benchmark's own arithmetic (its corpora are not needed for this)."""
    from benchmarks import retrieval

    q = [
        retrieval.Question("a", "/kb/a.txt", (3, 3), "s"),
        retrieval.Question("b", "/kb/b.txt", None, "s"),
    ]
    hits = [
        [("/kb/x.txt", 1, 9), ("/kb/a.txt", 1, 2), ("/kb/a.txt", 3, 4)],  # file at 2, paragraph at 3
        [("/kb/x.txt", 1, 1)],  # missed
    ]
    s = retrieval.score(q, hits)
    assert s["file"] == {"questions": 2, "recall@5": 0.5, "mrr@5": 0.25}
    assert s["paragraph"] == {"questions": 1, "recall@5": 1.0, "mrr@5": round(1 / 3, 4)}

    prose = tmp_path / "prose.txt"
    prose.write_text("First paragraph.\nSecond one.\nThird.\n")
    docs = tmp_path / "doc.md"
    docs.write_text("# Title\n\nSome text\nwrapped.\n\nLast.\n")
    assert [p[:2] for p in retrieval.paragraphs(str(prose))] == [(1, 1), (2, 2), (3, 3)]
    assert [p[:2] for p in retrieval.paragraphs(str(docs))] == [(1, 1), (3, 4), (6, 6)]

    r = retrieval.Rankings([(1, 0.9), (2, 0.8)], [(2, -5.0), (3, -1.0)], [(7, -3.0)], {1: 7, 2: 8, 3: 7})
    assert retrieval.rrf_before(r) == [1, 2, 3]  # 2/61 for chunk 1; 1/61 + 1/62 for 2 and 3 (tie: smaller id)


def test_retrieval_tunes_the_fusion_on_one_half_of_the_articles_and_reports_the_other():
    """Held-out tuning: questions split by article, the setting chosen on the tuning half alone."""
    from benchmarks import retrieval

    q = [retrieval.Question(f"q{i}", f"/kb/{a}.txt", None, "s") for i, a in enumerate("abcdabcd")]
    tune, test = retrieval.split_by_article(q)
    assert tune == [0, 2, 4, 6] and test == [1, 3, 5, 7]  # articles a and c tune, b and d are held out
    assert {q[i].gold for i in tune}.isdisjoint({q[i].gold for i in test})

    miss = [("/kb/NONE", 1, 1)]
    def hits_of(setting):
        # vector 0.4 finds every tuning question's article and none held out; the default the reverse
        if setting["vector"] == 0.4 and setting["file"] == 0.0 and setting["same_file"] == 0.6:
            return [[(x.gold, 1, 1)] if i in tune else miss for i, x in enumerate(q)]
        return [[(x.gold, 1, 1)] if i in test else miss for i, x in enumerate(q)]

    default = {"vector": 0.6, "file": 0.6, "same_file": 0.8}
    r = retrieval.held_out(q, hits_of, [miss] * len(q), default)
    rows = {row["retrieval"]: row for row in r["rows"]}
    assert rows["best on the tuning half"]["setting"] == {"vector": 0.4, "file": 0.0, "same_file": 0.6}
    assert rows["best on the tuning half"]["held_out"]["file"]["mrr@5"] == 0.0
    assert rows["crag default"]["held_out"]["file"]["mrr@5"] == 1.0
    assert r["held_out_questions"] == 4 and r["settings_tried"] == len(retrieval.fusion_grid())


def test_grading_cost_with_a_real_server_sends_crags_requests_and_resumes_from_its_record(tmp_path, judged_pairs):
    from .openai_server import FakeOpenAIServer, Text

    out = tmp_path / "out"
    argv = ["--data", str(judged_pairs), "--ks", "3", "--sample", "2", "--model", "m", "--out", str(out), "--quiet"]
    with FakeOpenAIServer() as srv:
        # every one-item request parses; a batch of three gets one number: a parse failure
        srv.default("grade_evidence", Text("[0.9]", prompt_tokens=100, completion_tokens=4, cached_tokens=60))
        first = grading_cost.main([*argv, "--base-url", srv.base_url])
        sent = srv.calls()
        assert sent == first["requests_sent"] > 0
        assert {r.headers["x-crag-node"] for r in srv.requests} == {"grade_evidence"}
        second = grading_cost.main([*argv, "--base-url", srv.base_url])
        assert srv.calls() == sent  # everything replayed from the record
    assert second["requests_sent"] == 0 and second["requests_replayed"] > 0
    same = ("llm_calls", "prompt_tokens", "cached_tokens", "completion_tokens", "relevant_kept", "irrelevant_through",
            "parse_failures", "actions")
    for a, b in zip(first["rows"]["real"], second["rows"]["real"]):
        assert {k: a[k] for k in same} == {k: b[k] for k in same}
        assert b["calls_replayed"] == b["llm_calls"]
    assert len((out / "grading_cost_real.jsonl").read_text().splitlines()) == sent
    saved = _files(out, "grading_cost_real")
    real = {r["strategy"]: r for r in saved["rows"]["real"]}
    assert real["per_item"]["parse_failures"] == 0 and real["batch"]["parse_failures"] > 0
    assert real["per_item"]["cached_tokens"] == 60 * real["per_item"]["llm_calls"]
    assert real["per_item"]["relevant_kept_pct"] == 100.0  # 0.9 for every item keeps all
    simulated = {r["strategy"]: r for r in saved["rows"]["simulated"]}
    assert set(simulated) == set(real) == set(grading_cost.STRATEGIES)
    assert "real" in (out / "grading_cost_real.md").read_text()
    with FakeOpenAIServer() as srv:  # the single-round workload: its one-item requests are in the record;
        srv.default("grade_evidence", Text("[0.9]"))  # a first round holds 2k items, so each top-k batch is new
        single = grading_cost.main([*argv, "--base-url", srv.base_url, "--workload", "single"])
        assert srv.calls() == 2 * 2  # per query: one shared by the three batch strategies, one for scores
    rows = {r["strategy"]: r for r in single["rows"]["real"]}
    assert rows["per_item"]["llm_calls"] == 2 * 3 and rows["batch"]["llm_calls"] == 2
    assert (out / "grading_cost_real_single.md").is_file()


def test_grading_cost_with_a_sample_larger_than_the_data_reports_the_queries_it_ran(tmp_path, judged_pairs, capsys):
    from .openai_server import FakeOpenAIServer, Text

    out = tmp_path / "out"
    with FakeOpenAIServer() as srv:
        srv.default("grade_evidence", Text("[0.9]"))
        result = grading_cost.main(["--data", str(judged_pairs), "--ks", "3", "--sample", "9", "--model", "m",
                                    "--strategies", "batch", "--out", str(out), "--quiet", "--base-url", srv.base_url])
    assert result["args"]["sample"] == len(result["questions_done"]) == 3
    assert "3 question(s) done of a sample of 3 TREC DL queries" in (out / "grading_cost_real.md").read_text()
    assert "--sample 9: the data holds 3 queries, all of them run" in capsys.readouterr().err


def test_grading_cost_says_which_token_counts_of_a_real_grader_are_estimates(tmp_path, judged_pairs):
    """A server that sends no ``usage``: crag's tiktoken counts stand in, and the report, its
    JSON (per row) and the record (per reply, so a replayed run says so too) say they are estimates."""
    from .openai_server import FakeOpenAIServer, NoUsage

    out = tmp_path / "out"
    argv = ["--data", str(judged_pairs), "--ks", "3", "--sample", "1", "--model", "m", "--strategies",
            "per_item,batch", "--out", str(out), "--quiet"]
    with FakeOpenAIServer() as srv:
        srv.default("grade_evidence", NoUsage("[0.9]"))
        grading_cost.main([*argv, "--base-url", srv.base_url])
        replayed = grading_cost.main([*argv, "--base-url", srv.base_url])
    assert replayed["requests_sent"] == 0
    record = [json.loads(line) for line in (out / "grading_cost_real.jsonl").read_text().splitlines()]
    assert record and all(row["usage_estimated"] is True for row in record)
    for result in (json.loads((out / "grading_cost_real.json").read_text()), replayed):
        real = {r["strategy"]: r for r in result["rows"]["real"]}
        assert real["per_item"]["estimated_calls"] == real["per_item"]["llm_calls"] > 0
        assert real["batch"]["estimated_calls"] == real["batch"]["llm_calls"] > 0
    md = (out / "grading_cost_real.md").read_text()
    n = real["per_item"]["llm_calls"]
    assert f"{real['per_item']['prompt_tokens']:,} (estimated for {n:,} of {n:,} calls)" in md
    assert "the server reported no usable usage for those calls" in md


def test_grading_cost_reports_a_servers_token_counts_as_its_own(tmp_path, judged_pairs):
    from .openai_server import FakeOpenAIServer, Text

    out = tmp_path / "out"
    with FakeOpenAIServer() as srv:
        srv.default("grade_evidence", Text("[0.9]", prompt_tokens=100, completion_tokens=4))
        result = grading_cost.main(["--data", str(judged_pairs), "--ks", "3", "--sample", "1", "--model", "m",
                                    "--strategies", "batch", "--out", str(out), "--quiet", "--base-url", srv.base_url])
    assert all(r["estimated_calls"] == 0 for r in result["rows"]["real"])
    assert "estimated" not in (out / "grading_cost_real.md").read_text()


def test_grading_cost_whose_server_fails_partway_keeps_the_earlier_report_and_exits_1(tmp_path, judged_pairs):
    """HTTP 500 after some replies: exit status 0, the earlier complete report overwritten, the
    failed requests counted as calls and their items scored 0.5. Now only the questions whose
    requests all got replies are counted, in a report of their own, and the run exits 1."""
    from .openai_server import FakeOpenAIServer, Status, Text

    out = tmp_path / "out"
    argv = ["--data", str(judged_pairs), "--ks", "3", "--sample", "2", "--model", "m", "--strategies", "per_item",
            "--out", str(out), "--quiet", "--timeout", "5"]
    with FakeOpenAIServer() as srv:
        srv.default("grade_evidence", Text("[0.9]"))
        good = grading_cost.main([*argv, "--base-url", srv.base_url, "--record", str(tmp_path / "first.jsonl")])
    per_question = good["rows"]["real"][0]["llm_calls"] // 2
    assert len(good["questions_done"]) == 2 and per_question > 1
    earlier = {p.name: p.read_bytes() for p in out.glob("grading_cost_real.*")}
    with FakeOpenAIServer() as srv:  # the first question's replies, and one of the second's; then errors
        srv.script("grade_evidence", *[Text("[0.9]")] * (per_question + 1))
        srv.default("grade_evidence", Status(500))
        with pytest.raises(SystemExit) as exit_:
            grading_cost.main([*argv, "--base-url", srv.base_url, "--record", str(tmp_path / "second.jsonl")])
    said = str(exit_.value.code)
    assert said.startswith("python -m benchmarks.grading_cost: error: ") and " request(s) failed, the first with: " in said
    assert f"are reported in {out / 'grading_cost_real_incomplete.md'}" in said
    assert {p.name: p.read_bytes() for p in out.glob("grading_cost_real.*")} == earlier
    partial = json.loads((out / "grading_cost_real_incomplete.json").read_text())
    assert partial["questions_done"] == good["questions_done"][:1]
    assert partial["questions_failed"] == good["questions_done"][1:]
    assert partial["request_errors"] >= 1
    real = partial["rows"]["real"][0]
    assert real["llm_calls"] == per_question and real["parse_failures"] == 0
    assert partial["rows"]["simulated"][0]["units"] == 1
    md = (out / "grading_cost_real_incomplete.md").read_text()
    assert f"{partial['request_errors']} failed" in md and "**Incomplete:** 1 question(s) left out" in md


def test_offline_grading_summary_counts_notes_only_where_the_gold_file_was_retrieved():
    from benchmarks import offline_grading

    def row(note, retrieved=True, off_topic=False, top=(0.9, 0.85, 0.8, 0.82, 0.81), gold_at=0, action="REFINE"):
        return {"question": "q", "off_topic": off_topic, "no_evidence": False, "gold_retrieved": retrieved,
                "gold_cited": retrieved, "rounds": 3 if note else 1, "action": action, "note": note,
                "complexity": "complex", "fast_path": None, "fast_path_items": 0, "fast_path_off_gold": 0,
                "removed": 0, "skipped": 0, "scores": [],
                "top5": [{"score": s, "gold": i == gold_at} for i, s in enumerate(top)]}

    rows = [row(True), row(False), row(False), row(False), row(True, retrieved=False),
            row(True, off_topic=True, top=()), row(False, off_topic=True, top=(), action="GENERATE"),
            row(False, off_topic=True, top=(), action=None)]  # classified simple: answered, never graded
    s = offline_grading.summarise(rows)
    assert (s["questions"], s["gold_retrieved"], s["note_when_gold_retrieved"]) == (5, 4, 1)
    assert s["note_when_gold_retrieved_pct"] == 25.0 and s["target_met"]
    assert (s["off_topic"], s["off_topic_note"], s["off_topic_generate"], s["off_topic_ungraded"]) == (3, 1, 1, 1)
    # the off-topic line accounts for every off-topic question
    text = offline_grading.render_markdown({"summary": s, "index_s": 0.0})
    assert ("3 off-topic questions (nothing in these docs answers them): weak-evidence note on 1, the no-evidence "
            "answer on 0, graded GENERATE 1, answered without grading (no note) 1.") in " ".join(text.split())
    at_08 = s["high_vector_score_sweep"][0]
    assert at_08["threshold"] == 0.8 and at_08["questions"] == 5 and at_08["off_gold"] == 4 * 5


def test_the_field_benchmark_refuses_a_setting_that_is_not_crags(capsys):
    from benchmarks import field

    with pytest.raises(SystemExit) as exit_:
        field.main(["--offline", "--set", "OPENAI_API_KEY=sk-x"])
    assert exit_.value.code == 2
    assert "--set takes KB_AGENT_NAME=VALUE" in capsys.readouterr().err


def test_store_scale_copies_and_report(tmp_path, monkeypatch):
    """store_scale's arithmetic and report (its corpora and stores are not needed for this: on a
    clean clone, with no shared data beside it, this test failed where the corpora were looked for)."""
    from benchmarks import store_scale

    monkeypatch.setattr(store_scale, "SOURCES", {k: tmp_path for k in store_scale.SOURCES})
    args = store_scale.parse_args(["--chunks", "1000000", "--clients", "1,4"])
    assert args.copies == 69 and args.clients == [1, 4]
    assert store_scale.parse_args(["--chunks", "1"]).copies == 1
    row = {
        "store": "embedded", "chunks": 1_007_607, "text_mb": 1335.0, "index_wall_s": 200.0, "index_cpu_s": 250.0,
        "index_mb_s": 6.7, "index_mb_s_cpu": 5.3, "index_peak_rss_mb": 3000.0, "disk_mb": 9000.0,
        "vectors_mb": 1070.0, "vector_index": "ivf:1024",
        "questions": {"p50_ms": 30.0, "p95_ms": 80.0, "cpu_p50_ms": 25.0, "cpu_p95_ms": 60.0},
        "frequent": {"p50_ms": 20.0, "p95_ms": 40.0},
        "recall": {"vector_recall_at_50": 0.7, "hybrid_recall_at_5": 0.95}, "qps_1": 30.0, "qps_4": 40.0,
    }
    result = {"args": vars(args) | {"corpus": "x"}, "rows": [row], "queries": {"questions": ["q"], "frequent": ["f"]},
              "environment": {"cpu_count": 2}, "load_average": 3.0, "frequent_words": [("one", 0.28)]}
    md = store_scale.render_markdown(result)
    assert "| embedded | 1,007,607 |" in md and "30.0 / 80.0 (CPU 25.0 / 60.0)" in md and "ivf:1024" in md
    assert "one 28%" in md


def test_store_scale_keeps_the_figures_of_stores_a_run_has_not_measured():
    """A run stopped after its first store keeps the other store's previous row for --reuse-index."""
    from benchmarks import store_scale

    previous = [{"store": "embedded", "index_wall_s": 1.0}, {"store": "postgresql", "index_wall_s": 2.0}]
    part = store_scale.with_unmeasured({"rows": [{"store": "embedded", "index_wall_s": 3.0}]}, previous)
    assert part["rows"] == [{"store": "embedded", "index_wall_s": 3.0}]
    assert part["unmeasured_rows"] == [{"store": "postgresql", "index_wall_s": 2.0}]
    whole = store_scale.with_unmeasured({"rows": [{"store": "embedded"}, {"store": "postgresql"}]}, previous)
    assert "unmeasured_rows" not in whole


def test_every_benchmark_module_run_alone_says_what_it_does() -> None:
    """``python -m benchmarks.X --help`` prints usage, or where the module is run from."""
    names = sorted(p.stem for p in (run_all.REPO / "benchmarks").glob("*.py") if p.stem not in ("__init__", "common"))
    for name in names:
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=run_all.REPO, capture_output=True,
                              text=True, timeout=120)
        said = (proc.stdout + proc.stderr).strip()
        assert said and "Traceback" not in said, name


def test_retrieval_scoring_counts_a_gold_file_reached_through_a_symbolic_link(tmp_path):
    """The shared data may sit behind a link (a clone beside a linked ``shared``): crag reports
    one path, the questions name the other, and both are the same file."""
    import json as _json

    from benchmarks import retrieval

    (tmp_path / "data" / "corpus").mkdir(parents=True)
    (tmp_path / "data" / "corpus" / "a.txt").write_text("text\n")
    (tmp_path / "data" / "q.jsonl").write_text(_json.dumps(
        {"question": "a?", "gold_file": "corpus/a.txt", "title": "a", "answerable": False}) + "\n")
    (tmp_path / "shared").symlink_to(tmp_path / "data")
    linked = tmp_path / "shared"
    corpus = retrieval.Corpus("t", "t", (linked / "corpus",), linked / "q.jsonl")
    questions = retrieval.load_questions(corpus, None)
    for path in (linked / "corpus" / "a.txt", tmp_path / "data" / "corpus" / "a.txt"):
        assert retrieval.score(questions, [[(str(path), 1, 1)]])["file"]["recall@5"] == 1.0


def test_a_quick_run_without_out_leaves_the_committed_results_alone(tmp_path, monkeypatch, capsys):
    """`python -m benchmarks.grounding --quick` wrote its 20-question figures over the
    committed full-run ones in benchmarks/results: a quick run goes to a temporary folder."""
    from benchmarks import common

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    folder = common.quick_out(None, True)
    assert folder.parent == tmp_path and folder.is_dir() and str(folder) in capsys.readouterr().err
    assert common.quick_out(None, False) == common.RESULTS_DIR
    assert common.quick_out(tmp_path / "mine", True) == tmp_path / "mine"
