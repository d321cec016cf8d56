"""The benchmarks as a demanding user meets them: bad arguments are one line and a non-zero
exit before any work, never a traceback; a resumable run killed mid-write loses nothing."""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import answers, field, grader_auc, grading_cost
from benchmarks.common import append_jsonl, read_jsonl, run_main
from crag.errors import LLMError


def _killed_mid_write(path: Path, rows: list[dict]) -> None:
    """A record whose last line was cut short by ``kill -9``: no newline, not JSON."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + json.dumps({"key": "cut", "text": "half a row"})[:17])


def test_a_row_appended_after_a_truncated_line_gets_a_line_of_its_own(tmp_path):
    record = tmp_path / "r.jsonl"
    _killed_mid_write(record, [{"key": "a"}])
    append_jsonl(record, {"key": "b"})
    append_jsonl(record, {"key": "c"})
    assert [r["key"] for r in read_jsonl(record)] == ["a", "b", "c"]


def test_a_record_line_that_is_json_but_not_an_object_is_skipped(tmp_path):
    record = tmp_path / "r.jsonl"
    record.write_text('{"key": "a"}\n7\nnull\n["x"]\n{"key": "b"}\n')
    assert [r["key"] for r in read_jsonl(record)] == ["a", "b"]


def test_answers_resumes_after_a_killed_write_without_losing_the_next_row(tmp_path):
    path = tmp_path / "answers-x.jsonl"
    _killed_mid_write(path, [{"key": "m|crag|docs|1", "right": True}])
    answers.Record(path).add({"key": "m|crag|docs|2", "right": False})
    assert set(answers.Record(path).rows) == {"m|crag|docs|1", "m|crag|docs|2"}


class _Reply:
    text = "1: yes"
    prompt_tokens = completion_tokens = cached_tokens = 1
    latency_ms = 5.0
    finish_reason = "stop"
    logprobs = None


class _Chat:
    def complete(self, request):
        return _Reply()


def _request():
    return SimpleNamespace(node="grade_evidence", messages=({"role": "user", "content": "q"},), max_tokens=16,
                           temperature=0.0, reply_schema=None, logprobs=0)


def test_grader_auc_resumes_after_a_killed_write_without_losing_the_next_reply(tmp_path):
    path = tmp_path / "grader_auc.jsonl"
    _killed_mid_write(path, [{"key": "old", "text": "1: no", "logprobs": None}])
    rec = grader_auc.Recorded("http://127.0.0.1:9/v1", "m", path, 1.0)
    rec.chat = _Chat()
    rec.complete(_request())
    again = grader_auc.Recorded("http://127.0.0.1:9/v1", "m", path, 1.0)
    assert set(again.rows) == {"old", rec.key(_request())}


BAD_ARGUMENTS = [
    # (benchmark, arguments, what the one line says); "FILE" is a file where a folder belongs
    ("grounding", ["--quick", "--out", "FILE"], "argument --out: FILE is a file, not a folder"),
    ("grounding", ["--quick", "--out", "FILE/sub"], "argument --out: cannot make the folder FILE/sub"),
    ("offline_grading", ["--out", "FILE"], "is a file, not a folder"),
    ("grading_cost", ["--out", "FILE"], "is a file, not a folder"),
    ("grading_cost", ["--ks", "-1"], "argument --ks: must be at least 1, got -1"),
    ("grading_cost", ["--ks", "3,x"], "argument --ks: expected a whole number, got 'x'"),
    ("grading_cost", ["--queries", "-3"], "argument --queries: must be at least 1, got -3"),
    ("index_scale", ["--sizes", "-5"], "argument --sizes: must be at least 1, got -5"),
    ("store_scale", ["--chunks", "-3"], "argument --chunks: must be at least 1, got -3"),
    ("overhead", ["--runs", "0"], "argument --runs: must be at least 1, got 0"),
    ("retrieval", ["--out", "FILE"], "is a file, not a folder"),
    ("retrieval", ["--sample", "0"], "argument --sample: must be at least 1, got 0"),
    ("answers", ["--offline", "--out", "FILE"], "is a file, not a folder"),
    ("answers", ["--offline", "--answerable", "-2"], "argument --answerable: must be at least 0, got -2"),
    ("field", ["--offline", "--questions", "0"], "argument --questions: must be at least 1, got 0"),
    ("field", ["--offline", "--out", "FILE"], "is a file, not a folder"),
    ("grader_auc", ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--queries", "-1"],
     "argument --queries: must be at least 1, got -1"),
    ("grader_auc", ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--out", "FILE"], "is a file, not a folder"),
    ("run_all", ["--quick", "--out", "FILE"], "is a file, not a folder"),
    ("answers", ["--offline", "--record", "FILE/answers.jsonl"], "argument --record: FILE is a file, not a folder"),
    ("grader_auc", ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--record", "FILE/r.jsonl"],
     "argument --record: FILE is a file, not a folder"),
    ("grading_cost", ["--base-url", "http://127.0.0.1:9/v1", "--record", "FILE/r.jsonl"],
     "argument --record: FILE is a file, not a folder"),
    # a count or a time of 0 that crashed in FAISS, divided by zero or reported a median of nothing
    # a timeout crag refuses: its KB_AGENT_LLM_TIMEOUT line "set in the environment", exit
    # status 1, after the indexing for field
    ("grading_cost", ["--base-url", "http://127.0.0.1:9/v1", "--timeout", "-1"],
     "argument --timeout: must be a number of seconds between 0.001 and 86400, got -1"),
    ("grader_auc", ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--timeout", "0"],
     "argument --timeout: must be a number of seconds between 0.001 and 86400, got 0"),
    ("field", ["--offline", "--timeout", "-1"],
     "argument --timeout: must be a number of seconds between 0.001 and 86400, got -1"),
    ("field", ["--offline", "--wall-timeout", "0"], "argument --wall-timeout: must be a finite number above 0, got 0"),
    # infinity is above 0: "must be above 0, got inf" said nothing of what was wrong
    ("field", ["--offline", "--wall-timeout", "inf"], "argument --wall-timeout: must be a finite number above 0, got inf"),
    ("index_scale", ["--hnsw-m", "0"], "argument --hnsw-m: must be at least 1, got 0"),
    # a rank of 0 was FAISS's traceback ("input contains NaN's or Inf's"), a dimension of 0 a report
    ("index_scale", ["--rank", "0"], "argument --rank: must be at least 1, got 0"),
    ("index_scale", ["--dim", "0"], "argument --dim: must be at least 1, got 0"),
    ("index_scale", ["--dim", "-5"], "argument --dim: must be at least 1, got -5"),
    ("index_scale", ["--ivf-nprobe", "0"], "argument --ivf-nprobe: must be at least 1, got 0"),
    ("index_scale", ["--batch-repeats", "0"], "argument --batch-repeats: must be at least 1, got 0"),
    ("index_scale", ["--latency-budget-ms", "-5"], "argument --latency-budget-ms: must be a finite number above 0, got -5"),
    ("overhead", ["--blocks", "0"], "argument --blocks: must be at least 1, got 0"),
    ("overhead", ["--startup-runs", "0"], "argument --startup-runs: must be at least 1, got 0"),
    ("overhead", ["--target-ratio", "nan"], "argument --target-ratio: must be a finite number above 0, got nan"),
    # a store that is not one was measured as the embedded store under its name
    ("store_scale", ["--stores", "embedded,foo"], "--stores: unknown store foo (choose from embedded, postgresql)"),
    ("store_scale", ["--clients", "0"], "argument --clients: must be at least 1, got 0"),
    ("store_scale", ["--clients", "x"], "argument --clients: expected a whole number, got 'x'"),
    ("store_scale", ["--client-seconds", "0"], "argument --client-seconds: must be a finite number above 0, got 0"),
    ("store_scale", ["--frequent", "0"], "argument --frequent: must be at least 1, got 0"),
    # nothing to measure: empty tables reported as results
    ("grading_cost", ["--strategies", ""], "--strategies needs at least one strategy"),
    ("grader_auc", ["--data", "FILE", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--styles", " , "],
     "--styles needs at least one style"),
    ("grader_auc", ["--data", "FILE", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--styles",
                    "batch,nope"],
     "unknown style: nope (choose from batch, pointwise, scores)"),
    ("answers", ["--offline", "--configs", ""], "--configs needs at least one configuration"),
    ("answers", ["--offline", "--sets", " , "], "--sets needs at least one set"),
    ("answers", ["--offline", "--sets", "squad", "--answerable", "0", "--unanswerable", "0"],
     "no questions: every count of the sets asked for is 0"),
    # a name that is a path: the results would be written elsewhere, or lost at the end of the run
    ("answers", ["--offline", "--name", "../x"], "argument --name: a results name is one word of a file name, not '../x'"),
    ("field", ["--offline", "--name", "a/b"], "argument --name: a results name is one word of a file name, not 'a/b'"),
    ("grader_auc", ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--name", ""],
     "argument --name: a results name is one word of a file name, not ''"),
    # a failure of the first request (exit 1), or tiktoken's own message
    ("grader_auc", ["--base-url", "127.0.0.1:9", "--model", "m"],
     "--base-url must be an http:// or https:// URL, got '127.0.0.1:9'"),
    ("grading_cost", ["--data", "FILE", "--encoding", "nope"], "unknown tiktoken encoding 'nope' (choose from "),
    ("retrieval", ["--local-threads", "0"], "argument --local-threads: must be at least 1, got 0"),
    # crag's "OPENAI_BASE_URL=... is not valid ... (set in the environment)", after the indexing
    # (benchmarks.field: after every question)
    ("answers", ["--base-url", "127.0.0.1:9"],
     "argument --base-url: must be an http:// or https:// URL (printable ASCII, no spaces), got 127.0.0.1:9"),
    ("field", ["--base-url", "http://127.0.0.1:0/v1"],
     "argument --base-url: must be an http:// or https:// URL with a host and a port from 1 to 65535"),
    ("answerability", ["--base-url", ""], "argument --base-url: must be an http:// or https:// URL, got ''"),
    # a setting crag does not know: ignored by crag, the run measured the default under its name
    ("answers", ["--offline", "--set", "KB_AGENT_GRADE_MEMROY=on"],
     "--set: KB_AGENT_GRADE_MEMROY is not a crag setting; did you mean KB_AGENT_GRADE_MEMORY?"),
    ("field", ["--offline", "--set", "KB_AGENT_NO_SUCH_THING=1"], "--set: KB_AGENT_NO_SUCH_THING is not a crag setting"),
    # shlex's own "No closing quotation", naming neither the option nor the value
    ("run_all", ["--quick", "--args", 'grounding="--x'], """--args 'grounding="--x': no closing quotation"""),
]


@pytest.mark.parametrize(("name", "argv", "says"), BAD_ARGUMENTS, ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_argument_is_one_line_and_exit_status_2_before_any_work(name, argv, says, tmp_path, capsys):
    """A file where ``--out`` wants a folder, or a negative count, is refused when the
    arguments are read: not after the run (losing its results), not as a traceback."""
    file = tmp_path / "results.txt"
    file.write_text("not a folder\n")
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as exit_:
        module.main([a.replace("FILE", str(file)) for a in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"python -m benchmarks.{name}: error: ")
    assert says.replace("FILE", str(file)) in err[-1]
    assert "Traceback" not in "\n".join(err)


@pytest.mark.parametrize(("name", "argv", "says"), [
    ("offline_grading", ["--limit", "0"], "argument --limit: must be at least 1, got 0"),
    ("grading_cost", ["--queries", "0"], "argument --queries: must be at least 1, got 0"),
])
def test_a_count_of_0_that_ran_everything_is_refused_when_the_arguments_are_read(name, argv, says, capsys):
    """``--limit 0`` and ``--queries 0`` ran every question, as if no limit were given (the
    default was 0 and read as "all"); as ``overhead --runs 0``, 0 is refused. Only the arguments
    are read here, so the test runs no benchmark, with or without the check."""
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as exit_:
        module.parse_args(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"python -m benchmarks.{name}: error: {says}"


@pytest.mark.parametrize(("argv", "says"), [
    (["--sweep", "0.8,5"], "argument --sweep: must be between 0 and 1, got 5"),
    (["--sweep", "0.8,x"], "argument --sweep: expected a number, got 'x'"),
    (["--sweep", "nan"], "argument --sweep: must be between 0 and 1, got nan"),
    (["--noise", "nan"], "argument --noise: must be a number of at least 0, got nan"),
    (["--noise", "-0.1"], "argument --noise: must be a number of at least 0, got -0.1"),
    (["--latency-fixed-ms", "-5"], "argument --latency-fixed-ms: must be a number of at least 0, got -5"),
    (["--latency-prompt-ms", "inf"], "argument --latency-prompt-ms: must be a number of at least 0, got inf"),
    (["--latency-completion-ms", "x"], "argument --latency-completion-ms: expected a number, got 'x'"),
])
def test_a_grading_cost_number_it_cannot_use_is_refused_when_the_arguments_are_read(argv, says, capsys):
    """A ``--sweep`` threshold outside [0, 1] failed only after the run's work, naming a crag
    setting (or as ``could not convert string to float``); ``--noise nan`` and a negative latency
    made a report. Only the arguments are read here: no benchmark runs, with or without the check."""
    with pytest.raises(SystemExit) as exit_:
        grading_cost.parse_args(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"python -m benchmarks.grading_cost: error: {says}"


def test_grading_cost_reads_the_sweep_and_zero_noise_it_can_use(tmp_path):
    data = ["--data", str(tmp_path / "pairs.jsonl")]  # read later; given, so the shared data need not be here
    (tmp_path / "pairs.jsonl").write_text("")
    args = grading_cost.parse_args([*data, "--sweep", " 0.8, 0.3 ,0,1", "--noise", "0", "--latency-fixed-ms", "0"])
    assert args.sweep == [0.8, 0.3, 0.0, 1.0] and args.noise == 0.0 and args.latency_fixed_ms == 0.0
    assert grading_cost.parse_args([*data, "--sweep", ""]).sweep == []
    assert grading_cost.parse_args(data).sweep == list(grading_cost.SWEEP_THRESHOLDS)


def test_a_failure_the_benchmark_can_name_is_one_line_and_exit_status_1(capsys):
    def unreachable():
        raise LLMError("LLM server http://127.0.0.1:9/v1 could not be reached for node grade_evidence")

    assert run_main(unreachable, "python -m benchmarks.x") == 1
    assert run_main(lambda: {"a": 1}, "python -m benchmarks.x") == 0
    assert run_main(lambda: 3, "python -m benchmarks.x") == 3
    assert capsys.readouterr().err == ("python -m benchmarks.x: error: LLM server http://127.0.0.1:9/v1 could not "
                                       "be reached for node grade_evidence\n")


def test_grading_cost_names_a_data_file_that_is_not_judged_pairs(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text("<html>not json</html>\n")
    assert run_main(lambda: grading_cost.main(["--data", str(data), "--out", str(tmp_path), "--quiet"]),
                    "python -m benchmarks.grading_cost") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m benchmarks.grading_cost: error: {data}:1 is not a judged pair as JSON")
    assert len(err.splitlines()) == 1


def _judged_pairs(path: Path) -> Path:
    path.write_text("".join(json.dumps({"collection": "t", "qid": "1", "query": "how long do fleas live",
                                        "docid": f"d{i}", "bm25_rank": i, "passage": f"passage {i} about fleas",
                                        "grade": 3 if i % 2 else 0, "relevant": bool(i % 2)}) + "\n"
                            for i in range(1, 13)))
    return path


def _down_port() -> int:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_grading_cost_in_which_every_request_failed_leaves_the_earlier_report_alone(tmp_path):
    """A run that measured nothing (the server down) overwrote grading_cost_real.{json,md}, the
    report of an earlier run, with one of parse failures before it exited 1."""
    data = _judged_pairs(tmp_path / "pairs.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    earlier = {f"grading_cost_real.{ext}": f"the earlier run's report ({ext})\n" for ext in ("json", "md")}
    for name, text in earlier.items():
        (out / name).write_text(text)
    url = f"http://127.0.0.1:{_down_port()}/v1"
    with pytest.raises(SystemExit) as exit_:
        grading_cost.main(["--data", str(data), "--base-url", url, "--sample", "1", "--ks", "3",
                           "--strategies", "batch", "--timeout", "2", "--out", str(out), "--quiet"])
    assert str(exit_.value.code).startswith("python -m benchmarks.grading_cost: error: every request failed")
    assert {p.name: p.read_text() for p in out.glob("grading_cost_real*.*")} == earlier


def test_grading_cost_against_a_server_that_is_down_stops_at_its_first_request(tmp_path, monkeypatch):
    """Connection refused: every request of the sample was tried (with its retry) before the one
    line, minutes on the default sample; now the first that cannot reach the server ends the run."""
    from crag.llm.openai_chat import OpenAIChatModel

    tried = []
    complete = OpenAIChatModel.complete
    monkeypatch.setattr(OpenAIChatModel, "complete", lambda self, request, *a, **kw: (
        tried.append(request), complete(self, request, *a, **kw))[1])
    data = _judged_pairs(tmp_path / "pairs.jsonl")
    url = f"http://127.0.0.1:{_down_port()}/v1"
    with pytest.raises(SystemExit) as exit_:
        grading_cost.main(["--data", str(data), "--base-url", url, "--sample", "1", "--ks", "3,5",
                           "--strategies", "per_item,batch", "--timeout", "2", "--out", str(tmp_path), "--quiet"])
    assert str(exit_.value.code).startswith("python -m benchmarks.grading_cost: error: every request failed, the "
                                            f"first with: LLM server {url} could not be reached")
    assert len(tried) == 1


def test_retrieval_ended_by_sigterm_removes_its_temporary_folders(tmp_path):
    """Ctrl-C removed the run's /tmp/crag-bench-retrieval-* folders; SIGTERM left them."""
    import signal
    import time

    from benchmarks.common import SHARED

    if not (SHARED / "corpora" / "fastapi_docs").is_dir():
        pytest.skip(f"the shared corpora are not at {SHARED}")
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.retrieval", "--quick", "--corpus", "docs",
                             "--out", str(tmp_path / "out")], cwd=Path(__file__).resolve().parents[1],
                            env={**os.environ, "TMPDIR": str(tmp_path)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("crag-bench-retrieval-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob("crag-bench-retrieval-*")), "the run made no temporary folder"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(tmp_path.glob("crag-bench-retrieval-*")) == []


def test_grader_auc_against_an_unreachable_server_is_one_line_and_exit_status_1(tmp_path):
    data = _judged_pairs(tmp_path / "pairs.jsonl")
    port = _down_port()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.grader_auc", "--base-url", f"http://127.0.0.1:{port}/v1",
                           "--model", "m", "--queries", "1", "--per", "1", "--timeout", "2", "--data", str(data),
                           "--out", str(tmp_path), "--record", str(tmp_path / "r.jsonl")],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"python -m benchmarks.grader_auc: error: LLM server http://127.0.0.1:{port}/v1 could not be reached")


SHARED_CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"


def test_field_with_a_setting_crag_refuses_stops_on_crags_one_line(tmp_path, capfd):
    if not SHARED_CORPORA.is_dir():
        pytest.skip(f"benchmarks.field reads the shared corpora beside the clone, not at {SHARED_CORPORA}")
    with pytest.raises(SystemExit) as exit_:
        field.main(["--offline", "--questions", "1", "--set", "KB_AGENT_TOP_K=abc", "--out", str(tmp_path),
                    "--index-dir", str(tmp_path / "index")])
    assert exit_.value.code == 2
    err = capfd.readouterr().err
    assert "crag: error: KB_AGENT_TOP_K=abc is not valid" in err and "Traceback" not in err


def test_field_against_a_server_that_is_down_is_one_line_and_exit_status_1(tmp_path, capfd):
    if not SHARED_CORPORA.is_dir():
        pytest.skip(f"benchmarks.field reads the shared corpora beside the clone, not at {SHARED_CORPORA}")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    assert field.main(["--base-url", down, "--model", "m", "--questions", "1", "--timeout", "2", "--set",
                       "KB_AGENT_LLM_MAX_RETRIES=0", "--out", str(tmp_path), "--index-dir", str(tmp_path / "index")]) == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m benchmarks.field: error: no question was answered, the first failed with: "
                              f"crag: error: LLM server {down} ")
    # the report names the server the user gave (not the recording proxy in between), in one table cell
    error = json.loads((tmp_path / "field-m.json").read_text())["answers"][0]["error"]
    assert error.startswith(f"crag: error: LLM server {down} ") and "\n" not in error
    row = (tmp_path / "field-m.md").read_text().split("## Per answer")[1].strip().splitlines()[2]
    assert row.startswith("| ") and row.endswith(" |") and "crag: error: LLM server" in row


@pytest.mark.parametrize("extra", [[], ["--set", "KB_AGENT_TOP_K=abc"]], ids=["answered", "index-refused"])
def test_field_removes_the_temporary_index_it_made(extra, tmp_path):
    """Without ``--index-dir`` every run left its index (tens of MB) in the temporary folder,
    after a run that succeeded as after one that failed."""
    if not SHARED_CORPORA.is_dir():
        pytest.skip(f"benchmarks.field reads the shared corpora beside the clone, not at {SHARED_CORPORA}")
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.field", "--offline", "--questions", "1", *extra,
                           "--out", str(tmp_path / "out")], cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "TMPDIR": str(temp)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == (2 if extra else 0) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "indexing 1 corpora into " + str(temp) in proc.stderr  # it made one there
    assert not list(temp.glob("crag-field-*"))


@pytest.mark.parametrize(("text", "says"), [
    ("", "holds no questions"),
    ('{"question": "q"}\n', "line 1 is not a question as JSON {question, path, corpus}"),
    ("<html>\n", "line 1 is not a question as JSON {question, path, corpus}"),
])
def test_field_names_a_questions_file_it_cannot_read(text, says, tmp_path, capsys):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(text)
    argv = ["--offline", "--questions", "1", "--questions-file", str(questions), "--out", str(tmp_path)]
    assert run_main(lambda: field.main(argv), "python -m benchmarks.field") == 1
    assert capsys.readouterr().err == f"python -m benchmarks.field: error: {questions} {says}\n"


@pytest.mark.parametrize(("text", "says"), [
    ('{"x": 1}\n', ":1 is not a judged pair as JSON ('collection' is not a str)"),
    ('{"collection": "t", "qid": 7, "query": "q", "docid": "d", "bm25_rank": 1, "passage": "p", "grade": 3}\n',
     ":1 is not a judged pair as JSON ('qid' is not a str)"),
    ("[1, 2]\n", ":1 is not a judged pair as JSON (not an object)"),
    ("\n", " holds no judged pairs"),
])
@pytest.mark.parametrize("name", ["grading_cost", "grader_auc"])
def test_a_data_file_of_the_wrong_shape_is_one_line_naming_it(name, text, says, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text(text)
    argv = ["--data", str(data), "--out", str(tmp_path), "--record", str(tmp_path / "r.jsonl"),
            "--base-url", f"http://127.0.0.1:{_down_port()}/v1", "--model", "m"]
    module = importlib.import_module(f"benchmarks.{name}")
    assert run_main(lambda: module.main(argv), f"python -m benchmarks.{name}") == 1
    assert capsys.readouterr().err == f"python -m benchmarks.{name}: error: {data}{says}\n"


def test_grader_auc_with_no_query_as_large_as_asked_is_one_line(tmp_path, capsys):
    data = _judged_pairs(tmp_path / "pairs.jsonl")  # one query, 6 relevant and 6 irrelevant passages
    argv = ["--data", str(data), "--out", str(tmp_path), "--record", str(tmp_path / "r.jsonl"), "--per", "7",
            "--base-url", f"http://127.0.0.1:{_down_port()}/v1", "--model", "m"]
    assert run_main(lambda: grader_auc.main(argv), "python -m benchmarks.grader_auc") == 1
    assert capsys.readouterr().err == (f"python -m benchmarks.grader_auc: error: no query of {data} has 7 relevant "
                                       "(grade 2 or 3) and 7 irrelevant (grade 0) passages: lower --per\n")
    assert not (tmp_path / "grader_auc.json").exists()


def test_grading_cost_names_query_ids_its_data_does_not_hold_in_its_one_line_form(tmp_path, capsys):
    data = _judged_pairs(tmp_path / "pairs.jsonl")
    argv = ["--data", str(data), "--base-url", f"http://127.0.0.1:{_down_port()}/v1", "--qids", "1,7,x",
            "--out", str(tmp_path), "--quiet"]
    assert run_main(lambda: grading_cost.main(argv), "python -m benchmarks.grading_cost") == 1
    assert capsys.readouterr().err == (f"python -m benchmarks.grading_cost: error: no such query id in {data}: "
                                       "7, x\n")


@pytest.mark.parametrize(("name", "argv", "says"), [
    ("grounding", ["--quick"], "the shared corpora are not at ELSEWHERE/corpora"),
    ("retrieval", ["--corpus", "docs"], "missing ELSEWHERE/corpora/fastapi_docs"),
    ("offline_grading", [], "no such corpus: ELSEWHERE/corpora/fastapi_docs"),
    ("grading_cost", [], "no such file: ELSEWHERE/grading/trec_dl/judged_pairs.jsonl"),
    ("store_scale", ["--chunks", "1500", "--stores", "embedded"],
     "the shared corpora are not at ELSEWHERE: no folder ELSEWHERE/retrieval/squad_wiki/corpus"),
    # "[Errno 2] No such file or directory: PosixPath(...)", once a temporary index folder was
    # made (and left behind)
    ("field", ["--offline", "--questions", "1"], "the shared corpora are not at ELSEWHERE/corpora"),
    # "[Errno 2] No such file or directory: ...", after the arguments were read
    ("grader_auc", ["--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
     "missing data: no ELSEWHERE/grading/trec_dl/judged_pairs.jsonl"),
])
def test_crag_shared_points_every_benchmark_at_the_shared_data_and_its_absence_is_one_line(name, argv, says, tmp_path):
    """CRAG_SHARED, as benchmarks.field and benchmarks.answers read it, is where every benchmark
    looks for the shared data; data missing there is one line naming the place, before any work."""
    elsewhere = tmp_path / "shared"
    env = {**os.environ, "CRAG_SHARED": str(elsewhere), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *argv, "--out", str(tmp_path / "out")],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert says.replace("ELSEWHERE", str(elsewhere)) in proc.stderr.strip().splitlines()[-1]
    assert "CRAG_SHARED=DIR" in proc.stderr.strip().splitlines()[-1]  # and how to point it elsewhere
    assert not list(tmp_path.glob("crag-*")), "a temporary folder was left behind"


def test_an_empty_crag_shared_means_the_default_place_for_every_benchmark():
    """``CRAG_SHARED=`` (set, empty) is the default for every benchmark: benchmarks.field and
    benchmarks.answers read it as the current folder while the others ignored it."""
    code = ("import benchmarks.answers as a, benchmarks.common as c, benchmarks.field as f; "
            "print(a.SHARED, c.SHARED, f.SHARED, a.SQUAD.parent.parent)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "CRAG_SHARED": ""}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(set(proc.stdout.split())) == 1 and proc.stdout.split()[0] != ".", proc.stdout


def test_a_quick_grounding_run_without_the_shared_data_is_its_one_line_and_makes_no_folder(tmp_path):
    env = {**os.environ, "CRAG_SHARED": str(tmp_path / "shared"), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.grounding", "--quick"],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not list(tmp_path.glob("crag-*")), "a --quick run's temporary folder was made for nothing"


def test_answerability_without_the_shared_questions_is_one_line_naming_them(tmp_path):
    elsewhere = tmp_path / "shared"
    env = {**os.environ, "CRAG_SHARED": str(elsewhere), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.answerability", "--record", str(tmp_path / "r.jsonl")],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    path = elsewhere / "retrieval" / "squad_wiki" / "questions.jsonl"
    assert f"missing data: no {path}" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("name", "value", "says"), [
    ("KB_AGENT_CONTEXT_TOKENS", "abc", "expected a whole number, got 'abc'"),
    ("KB_AGENT_MAX_ANSWER_TOKENS", "0", "must be at least 1, got 0"),
])
def test_field_names_the_variable_of_a_budget_it_cannot_use(name, value, says, monkeypatch, capsys):
    """Its budgets default to crag's variables: a bad one is named, not a bare int() message."""
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        field.main(["--offline", "--questions", "1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {name} in the environment: {says}")


def test_field_asks_each_question_once_when_more_are_asked_for_than_the_file_holds(tmp_path, capsys):
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": f"q{i}", "path": None, "corpus": "c"}) + "\n" for i in range(3)))
    picked = field.load_questions(5, 1, questions)
    assert sorted(q["question"] for q in picked) == ["q0", "q1", "q2"]  # not q1, q2, q0, q1, q2: counted twice
    assert capsys.readouterr().err == f"benchmarks.field: --questions 5: {questions} holds 3, each asked once\n"
    assert [q["question"] for q in field.load_questions(2, 0, questions)] == ["q0", "q1"]


def test_store_scale_refuses_a_bad_argument_before_it_looks_for_the_shared_data(tmp_path, monkeypatch, capsys):
    """On a clean clone with no shared data beside it (``.ci/run`` on a fresh machine),
    ``--stores foo`` was answered with "the shared corpora are not at ...": the mistake in the
    command line went unnamed, and `make test` failed there. The arguments are checked first."""
    from benchmarks import store_scale

    monkeypatch.setattr(store_scale, "SOURCES", {k: tmp_path / "absent" / k for k in store_scale.SOURCES})
    with pytest.raises(SystemExit) as exit_:
        store_scale.main(["--stores", "foo"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: --stores: unknown store foo (choose from embedded, postgresql)")
