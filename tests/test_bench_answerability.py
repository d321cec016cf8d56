"""``benchmarks.answerability`` as a user runs it: against the scripted loopback server on a
tiny SQuAD-shaped set, resumed from its record, and failing in one line, never a traceback."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import pytest

from benchmarks import answerability
from benchmarks.common import run_main
from tests.openai_server import FakeOpenAIServer, Text
from tests.test_bench_answers import squad  # noqa: F401  (the fixture: a SQuAD-shaped split)

PROG = "python -m benchmarks.answerability"


def _label(p_yes: float) -> Text:
    """A one-token reply whose top alternatives give ``p_yes`` over yes and no."""
    return Text("yes", logprobs=[("yes", math.log(p_yes), [("yes", math.log(p_yes)), ("no", math.log(1 - p_yes))])])


def _argv(tmp_path: Path, squad_dir: Path, url: str, *extra: str) -> list[str]:
    return ["--base-url", url, "--model", "m", "--squad", str(squad_dir), "--index-dir", str(tmp_path / "index"),
            "--record", str(tmp_path / "record.jsonl"), "--timeout", "5", *extra]


def _summary(out: str) -> dict:
    lines = out.splitlines()
    return json.loads("\n".join(lines[lines.index("{"):]))


def test_a_run_reads_the_label_through_crag_and_a_resumed_run_counts_each_question_once(
        tmp_path: Path, squad: Path, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    with FakeOpenAIServer() as srv:
        srv.default("synthesize", _label(0.25))
        assert answerability.main(_argv(tmp_path, squad, srv.base_url, "--answerable", "1", "--unanswerable", "1")) == 0
        first = srv.calls("synthesize")
        body = srv.requests[-1].body
        first_summary = _summary(capsys.readouterr().out)
        # the same questions again, and one more of each: only the new ones are asked
        assert answerability.main(_argv(tmp_path, squad, srv.base_url, "--answerable", "2", "--unanswerable", "2")) == 0
        second = srv.calls("synthesize") - first
        summary = _summary(capsys.readouterr().out)
        # a smaller run (of the same server and model) reports its own questions, not every one the record holds
        assert answerability.main(_argv(tmp_path, squad, srv.base_url, "--answerable", "1", "--unanswerable", "1")) == 0
        assert srv.calls("synthesize") == first + second
    assert first == 2 and second == 2
    assert body["max_tokens"] == 1 and body["logprobs"] is True
    assert body["messages"][-1]["content"].endswith(answerability.LABEL)
    assert first_summary["questions"] == 2 and first_summary["answerable"] == first_summary["unanswerable"] == 1
    assert summary["questions"] == 4 and summary["answerable"] == summary["unanswerable"] == 2
    assert summary["p_yes_range"]["answerable"] == [pytest.approx(0.25)] * 2
    assert _summary(capsys.readouterr().out)["questions"] == 2


def test_a_record_counts_only_the_readings_of_the_same_model_and_server(
        tmp_path: Path, squad: Path, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    """The record was keyed by question alone: a run of another model (or server) asked nothing
    and reported the first model's readings as its own."""
    counts = ("--answerable", "1", "--unanswerable", "1")
    with FakeOpenAIServer() as first, FakeOpenAIServer() as second:
        first.default("synthesize", _label(0.25))
        second.default("synthesize", _label(0.75))
        assert answerability.main(_argv(tmp_path, squad, first.base_url, *counts)) == 0
        assert answerability.main([*_argv(tmp_path, squad, first.base_url, *counts), "--model", "other"]) == 0
        assert first.calls("synthesize") == 4  # another model: asked again
        capsys.readouterr()
        assert answerability.main(_argv(tmp_path, squad, second.base_url, *counts)) == 0
        assert second.calls("synthesize") == 2  # another server: asked again, its own readings reported
        assert _summary(capsys.readouterr().out)["p_yes_range"]["answerable"] == [pytest.approx(0.75)] * 2
        assert answerability.main(_argv(tmp_path, squad, first.base_url, *counts)) == 0
        assert first.calls("synthesize") == 4  # the first setup again: all in the record
        assert _summary(capsys.readouterr().out)["p_yes_range"]["answerable"] == [pytest.approx(0.25)] * 2
    # a record written before rows carried their setup stays resumable: its rows count for any run
    record = tmp_path / "record.jsonl"
    old = [{k: v for k, v in json.loads(line).items() if k != "setup"} for line in record.read_text().splitlines()]
    record.write_text("".join(json.dumps(row) + "\n" for row in old[:2]))
    with FakeOpenAIServer() as srv:
        assert answerability.main(_argv(tmp_path, squad, srv.base_url, *counts)) == 0
        assert srv.calls() == 0


def test_unequal_counts_ask_every_question_asked_for(tmp_path: Path, squad: Path,  # noqa: F811
                                                     capsys: pytest.CaptureFixture) -> None:
    with FakeOpenAIServer() as srv:
        srv.default("synthesize", _label(0.5))
        assert answerability.main(_argv(tmp_path, squad, srv.base_url, "--answerable", "2", "--unanswerable", "0")) == 0
        assert srv.calls("synthesize") == 2
    assert _summary(capsys.readouterr().out)["answerable"] == 2


def test_a_record_cut_short_by_a_killed_run_is_resumed(tmp_path: Path, squad: Path,  # noqa: F811
                                                       capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "record.jsonl").write_text('{"id": "q0", "question": "When was')
    with FakeOpenAIServer() as srv:
        srv.default("synthesize", _label(0.5))
        assert answerability.main(_argv(tmp_path, squad, srv.base_url, "--answerable", "1", "--unanswerable", "1")) == 0
        assert srv.calls("synthesize") == 2
    assert _summary(capsys.readouterr().out)["questions"] == 2
    assert len([json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()[1:]]) == 2


def test_a_server_that_is_down_is_one_line_and_nothing_is_recorded(tmp_path: Path, squad: Path,  # noqa: F811
                                                                   capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    argv = _argv(tmp_path, squad, down, "--answerable", "1", "--unanswerable", "1")
    assert run_main(lambda: answerability.main(argv), PROG) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{PROG}: error: LLM server {down} could not be reached") and err.count("\n") == 1
    assert not (tmp_path / "record.jsonl").exists() or not (tmp_path / "record.jsonl").read_text().strip()


def test_a_server_that_sends_no_token_probabilities_is_one_line_and_nothing_is_recorded(
        tmp_path: Path, squad: Path, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    """Without logprobs there is no p_yes: the run recorded rows of ``p_yes None`` as finished
    questions and reported an empty result with exit status 0."""
    with FakeOpenAIServer() as srv:
        srv.default("synthesize", Text("yes"))  # no logprobs, whatever the request asks
        argv = _argv(tmp_path, squad, srv.base_url, "--answerable", "1", "--unanswerable", "1")
        assert run_main(lambda: answerability.main(argv), PROG) == 1
        assert srv.calls("synthesize") == 1  # it stops at the first question
        url = srv.base_url
    err = capsys.readouterr().err
    assert err == (f"{PROG}: error: the server at {url} sent no token probabilities (logprobs) for the "
                   "label, and this benchmark reads them (llama.cpp sends them)\n")
    assert not (tmp_path / "record.jsonl").exists() or not (tmp_path / "record.jsonl").read_text().strip()


def test_nothing_to_ask_is_one_line_before_any_request(tmp_path: Path, squad: Path,  # noqa: F811
                                                       capsys: pytest.CaptureFixture) -> None:
    with FakeOpenAIServer() as srv:
        argv = _argv(tmp_path, squad, srv.base_url, "--answerable", "0", "--unanswerable", "0")
        assert run_main(lambda: answerability.main(argv), PROG) == 1
        assert srv.calls() == 0
    err = capsys.readouterr().err
    assert err == f"{PROG}: error: no questions: --answerable and --unanswerable are both 0\n"


def test_questions_that_are_not_there_are_refused_with_the_arguments(tmp_path: Path, squad: Path,  # noqa: F811
                                                                     capsys: pytest.CaptureFixture) -> None:
    with FakeOpenAIServer() as srv:
        with pytest.raises(SystemExit) as exit_:
            answerability.main(_argv(tmp_path, squad, srv.base_url, "--squad", "/nonexistent/squad"))
        assert srv.calls() == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[-1] == (
        f"{PROG}: error: missing data: no /nonexistent/squad/questions.jsonl "
        "(--squad says where; CRAG_SHARED=DIR for the shared data)")


def test_a_negative_count_is_refused_by_the_parser(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        answerability.main(["--answerable", "-1"])
    assert exit_.value.code == 2 and "must be at least 0" in capsys.readouterr().err


def test_a_timeout_crag_refuses_is_refused_when_the_arguments_are_read(capsys) -> None:
    """--timeout -1 was refused only when the model was first asked, exit 1, blaming
    KB_AGENT_LLM_TIMEOUT 'set in the environment'."""
    from benchmarks import answerability

    with pytest.raises(SystemExit) as done:
        answerability.main(["--timeout", "-1", "--answerable", "1", "--unanswerable", "0"])
    assert done.value.code == 2 and "argument --timeout: must be a number of seconds" in capsys.readouterr().err
