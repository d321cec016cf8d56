"""The benchmarks as a demanding user meets them: bad arguments are one line and a non-zero
exit before any work, never a traceback; a resumable run killed mid-write loses nothing."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from benchmarks import answers, grader_auc
from benchmarks.common import append_jsonl, read_jsonl


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
