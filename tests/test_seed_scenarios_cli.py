"""Seeds 000 and 001 through ``python -m crag ask --json`` on a loopback OpenAI-compatible server.

Uniform grading replies (one value for every item) of 3, 4 and 10 items, and mixed ones, with
crag's default settings apart from the iteration cap and ``KB_AGENT_TOP_K`` (which sets how many
items the question's search brings): every one is decided by the seeds' rule.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from crag.answer import NO_EVIDENCE
from crag.cli import main
from tests.fakes import clean_env
from tests.openai_server import FakeOpenAIServer, NullContent, Raw, Text, grades, item_count

QUESTION = "What is the upload retry policy?"


def _page(k: int) -> str:
    return f"# Service {k}\n\nService {k} keeps an upload retry policy of its own: it retries {k} times.\n"


@pytest.fixture
def llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "docs"
    root.mkdir()
    for k in range(1, 31):
        (root / f"service{k}.md").write_text(_page(k), encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert _cli("index", "docs")[0] == 0
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "5")
        srv.default("analyze_and_route", json.dumps({"complexity": "complex", "suggested_tools": ["vector_search"]}))
        srv.default("plan", json.dumps({"tool_calls": [{"tool": "vector_search", "args": {"query": QUESTION}}]}))
        srv.default("synthesize", "Service 1 retries 1 times [1].")
        yield srv


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), out, err), out.getvalue(), err.getvalue()


def _ask(monkeypatch, n: int, cap: int, grade) -> dict:
    monkeypatch.setenv("KB_AGENT_MAX_ITERATIONS", str(cap))
    monkeypatch.setenv("KB_AGENT_TOP_K", str(n))
    code, out, err = _cli("ask", QUESTION, "--json")
    assert code == 0, err
    return json.loads(out)


def _decided(result: dict) -> list[str]:
    return [e["action"] for e in result["audit"] if e["event"] == "grade_decided"]


def _after_grading(result: dict) -> list[str]:
    trace = result["trace"]
    return [trace[i + 1] for i, node in enumerate(trace) if node == "grade_evidence"]


@pytest.mark.parametrize("n", [3, 4, 10])
def test_uniform_half_grades_refine_back_to_plan(llm, monkeypatch, n):
    llm.default("grade_evidence", grades(rest=0.5))
    result = _ask(monkeypatch, n, 3, grades(rest=0.5))
    first = next(r.body for r in llm.requests if r.node == "grade_evidence")
    assert item_count(first) == n
    assert _decided(result)[0] == "REFINE"
    assert _after_grading(result)[:2] == ["plan", "plan"]  # REFINE → plan, twice, then the cap
    assert result["iterations"] == 3 and result["trace"][-1] == "synthesize"
    assert not [e for e in result["audit"] if e["event"] in ("grader_uninformative", "evidence_removed")]
    assert "weak" in result["answer"].lower()  # the cap forced an answer from evidence scored 0.5


@pytest.mark.parametrize("n", [3, 4, 10])
def test_uniform_low_grades_remove_everything_and_re_retrieve(llm, monkeypatch, n):
    llm.default("grade_evidence", grades(rest=0.1))
    result = _ask(monkeypatch, n, 3, None)
    assert _decided(result)[0] == "RE_RETRIEVE"
    assert _after_grading(result)[0] == "analyze_and_route"
    removed = [e for e in result["audit"] if e["event"] == "evidence_removed"]
    assert len(removed) >= n and all(e["score"] == 0.1 for e in removed)
    assert result["iterations"] == 3, (result["trace"], [e for e in result["audit"] if e["event"] != "sentence_judged"])
    assert result["answer"].startswith(NO_EVIDENCE)  # all filtered: the fixed sentence


@pytest.mark.parametrize("n", [3, 10])
def test_at_the_cap_refine_synthesizes_with_what_is_left(llm, monkeypatch, n):
    llm.default("grade_evidence", grades(rest=0.5))
    result = _ask(monkeypatch, n, 2, None)
    assert result["iterations"] == 2 and result["trace"].count("tool_exec") == 2
    assert result["grader_action"] == "REFINE" and result["trace"][-1] == "synthesize"
    assert result["evidence_scores"] and all(s == 0.5 for s in result["evidence_scores"])


@pytest.mark.parametrize("n", [4, 10])
def test_uniform_high_grades_generate_whatever_retrieval_scored(llm, monkeypatch, n):
    llm.default("grade_evidence", grades(rest=0.9))
    result = _ask(monkeypatch, n, 3, None)
    assert _decided(result) == ["GENERATE"] and result["iterations"] == 1
    assert result["evidence_scores"] == [0.9] * n


@pytest.mark.parametrize("n", [4, 10])
def test_no_labels_without_token_probabilities_re_retrieve(llm, monkeypatch, n):
    llm.default("grade_evidence", lambda body: "\n".join(f"{k}: no" for k in range(1, item_count(body) + 1)))
    result = _ask(monkeypatch, n, 3, None)
    assert _decided(result)[0] == "RE_RETRIEVE"
    assert _after_grading(result)[0] == "analyze_and_route"


def test_mixed_grades_filter_and_decide_by_the_mean_of_the_rest(llm, monkeypatch):
    llm.script("grade_evidence", grades(0.9, 0.1, 0.8, 0.2, 0.7))
    result = _ask(monkeypatch, 5, 3, None)
    assert _decided(result) == ["GENERATE"]  # mean of 0.9, 0.8, 0.7 = 0.8
    assert result["evidence_scores"] == [0.9, 0.8, 0.7]
    assert [e["score"] for e in result["audit"] if e["event"] == "evidence_removed"] == [0.1, 0.2]


def test_a_grader_that_refuses_is_the_seeds_parse_failure(llm, monkeypatch):
    # OpenAI's structured outputs answer a request the model declines with content null and
    # a `refusal`: that is grader output that cannot be parsed as scores (seed 000), not a
    # failure of the server.
    llm.script("grade_evidence", NullContent(refusal="I can't help with that."))
    llm.default("grade_evidence", grades(rest=0.9))
    result = _ask(monkeypatch, 5, 3, None)
    failures = [e for e in result["audit"] if e["event"] == "grader_parse_failure"]
    assert failures and failures[0]["level"] == "warning"
    assert _decided(result)[:2] == ["REFINE", "GENERATE"]  # every item 0.5, then a real grade
    assert {"event": "reply_refused", "node": "grade_evidence", "refusal": "I can't help with that."} in result["audit"]
    assert result["usage"]["by_node"]["grade_evidence"]["calls"] == 2  # the refused call is counted


def test_a_router_or_planner_that_refuses_takes_the_specs_fallbacks(llm, monkeypatch):
    llm.script("analyze_and_route", NullContent(refusal="No."))
    llm.script("plan", NullContent(refusal="No."))
    llm.default("grade_evidence", grades(rest=0.9))
    result = _ask(monkeypatch, 5, 3, None)
    assert result["complexity"] == "complex"  # §5: anything else → complex with the default tools
    assert result["trace"] == ["analyze_and_route", "plan", "tool_exec", "grade_evidence", "synthesize"]
    assert result["evidence_scores"] == [0.9] * 5  # the plan fell back to the question's search
    assert [e["node"] for e in result["audit"] if e["event"] == "reply_refused"] == ["analyze_and_route", "plan"]


def test_an_answer_the_model_refuses_is_one_line_and_status_1(llm, monkeypatch):
    llm.default("grade_evidence", grades(rest=0.9))
    llm.script("synthesize", NullContent(refusal="I can't help with that."))
    monkeypatch.setenv("KB_AGENT_TOP_K", "5")
    code, out, err = _cli("ask", QUESTION, "--json")
    assert (code, out) == (1, "")
    assert err.startswith("crag: error: ") and err.count("\n") == 1 and "refusal: I can't help with that." in err


def _labelled(*p_yes: float):
    """A grading reply of one label per item whose label token has P(yes) = ``p_yes`` (the
    last value for every item after them), with its token probabilities (as llama.cpp, vLLM
    and OpenAI send them when asked)."""

    def top(p: float) -> list[tuple[str, float]]:
        return sorted([(" yes", math.log(p)), (" no", math.log(1.0 - p))], key=lambda t: -t[1])

    def reply(body: dict) -> Text:
        n = item_count(body)
        tokens = []
        for k in range(1, n + 1):
            best = top(p_yes[min(k, len(p_yes)) - 1])
            tokens += [(str(k), 0.0, []), (":", 0.0, []), (best[0][0], best[0][1], best), ("\n", 0.0, [])]
        return Text("".join(t for t, _, _ in tokens).rstrip("\n"), logprobs=tokens[:-1])

    return reply


@pytest.mark.parametrize("p_yes", [0.005, 0.02])
def test_a_grader_sure_that_no_item_is_relevant_is_information(llm, monkeypatch, p_yes):
    # SPEC §2: only a reading with no information (coin tosses; one label copied down the
    # list *without confidence*) is uninformative. A model sure of "no" for every item has
    # said something: every item goes (RE_RETRIEVE), however alike its probabilities.
    llm.default("grade_evidence", _labelled(p_yes))
    result = _ask(monkeypatch, 5, 3, None)
    assert not [e for e in result["audit"] if e["event"] == "grader_uninformative"]
    assert _decided(result)[0] == "RE_RETRIEVE"
    assert _after_grading(result)[0] == "analyze_and_route"


def test_a_grader_sure_that_every_item_is_relevant_graded_them(llm, monkeypatch):
    llm.default("grade_evidence", _labelled(0.995))
    result = _ask(monkeypatch, 5, 3, None)
    assert not [e for e in result["audit"] if e["event"] == "grader_uninformative"]
    assert _decided(result) == ["GENERATE"] and "not graded" not in result["answer"]


def test_one_unsure_probability_copied_down_the_list_is_uninformative(llm, monkeypatch):
    llm.default("grade_evidence", _labelled(0.2))
    result = _ask(monkeypatch, 5, 3, None)
    assert [e["reason"] for e in result["audit"] if e["event"] == "grader_uninformative"] == ["same_score"]
    assert not [e for e in result["audit"] if e["event"] == "evidence_removed"]


@pytest.mark.parametrize("policy", ["default", "seed"])
def test_no_item_scored_below_the_drop_threshold_reaches_synthesis(llm, monkeypatch, policy):
    # Seed 000 "Low-score evidence removed": an item scoring < 0.3 leaves context before
    # synthesis, under every policy. The default policy's first_label rule keeps a batch's
    # first item that a small model labelled "no" without being sure: kept, it is ungraded
    # (0.5, as a grade that carries no information), never a score below 0.3 in context.
    monkeypatch.setenv("KB_AGENT_GRADING_POLICY", policy)
    llm.default("grade_evidence", _labelled(0.2, 0.95, 0.9))
    result = _ask(monkeypatch, 5, 3, None)
    assert _decided(result) == ["GENERATE"]
    assert result["evidence_scores"] and min(result["evidence_scores"]) >= 0.3
    spared = [e for e in result["audit"] if e["event"] == "first_label_spared"]
    if policy == "seed":
        assert not spared and result["evidence_scores"] == [0.95] + [0.9] * 3
        assert [e["score"] for e in result["audit"] if e["event"] == "evidence_removed"] == [0.2]
    else:
        assert [e["score"] for e in spared] == [0.2]  # what was read, in the audit
        assert result["evidence_scores"] == [0.5, 0.95] + [0.9] * 3


def test_an_answer_the_cap_forces_after_an_unreadable_grade_says_so(llm, monkeypatch):
    # Seed 000: a parse failure gives every item the default 0.5; with the cap at one round
    # the answer is made from them. Its note says the grade could not be read, not that the
    # evidence's relevance was measured at 0.50, and counts one round as one round.
    llm.default("grade_evidence", "I think they are all fairly relevant.")
    result = _ask(monkeypatch, 5, 1, None)
    assert result["evidence_scores"] == [0.5] * 5 and result["grader_action"] == "REFINE"
    note = result["body"].splitlines()[-1]
    assert "could not be read" in note and "mean relevance" not in note
    assert "after 1 retrieval round " in note

    llm.default("grade_evidence", grades(rest=0.5))
    weak = _ask(monkeypatch, 5, 2, None)["body"].splitlines()[-1]
    assert "mean relevance 0.50" in weak and "after 2 retrieval rounds " in weak


def test_the_line_counting_unsupported_sentences_ends_the_body_after_the_weak_evidence_note(llm, monkeypatch):
    """SPEC §7: with ``note`` the answer "ends its body with one line saying how many sentences
    the evidence does not support"; the weak-evidence note of a capped answer came after it."""
    llm.default("grade_evidence", grades(rest=0.5))
    llm.default("synthesize", "Service 1 retries 1 times [1]. The moon is made of green cheese [1].")
    body = _ask(monkeypatch, 5, 2, None)["body"].splitlines()
    assert body[-1].startswith("_Note: 1 sentence of this answer is not supported")
    assert "mean relevance 0.50" in body[-3]


def test_a_refusal_that_names_a_tool_is_no_plan(llm, monkeypatch):
    llm.script("analyze_and_route", json.dumps({"complexity": "complex", "suggested_tools": ["vector_search", "grep_search"]}))
    llm.script("plan", NullContent(refusal="I won't run grep_search for `retries 7 times`."))
    llm.default("grade_evidence", grades(rest=0.9))
    monkeypatch.setenv("KB_AGENT_TOP_K", "5")
    code, out, err = _cli("ask", "Which service has `retries 7 times`?", "--json")
    assert code == 0, err
    reasons = [e["reason"] for e in json.loads(out)["audit"] if e["event"] == "plan_call_rejected"]
    assert reasons and reasons[-1].startswith("no valid tool call in the plan")  # the question's search alone


def _spent(node_reply_text: None = None, finish: str = "length") -> Raw:
    """A reply whose budget ran out before any content (a reasoning model still thinking):
    ``content`` null, ``finish_reason`` ``length``, as vLLM's reasoning parsers send it."""
    return Raw({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": finish,
                             "message": {"role": "assistant", "content": node_reply_text}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 256, "total_tokens": 356}})


def test_a_reply_whose_budget_ran_out_before_any_text_is_truncated_not_a_failure(llm, monkeypatch):
    # SPEC §5: a reply stopped by its budget is audited reply_truncated and parsed like any
    # other; with no text at all, the node's fall-back for a reply it cannot read applies.
    llm.script("analyze_and_route", _spent())
    llm.script("grade_evidence", _spent())
    llm.default("grade_evidence", grades(rest=0.9))
    result = _ask(monkeypatch, 5, 3, None)
    assert result["complexity"] == "complex"
    assert [e["node"] for e in result["audit"] if e["event"] == "reply_truncated"] == ["analyze_and_route",
                                                                                      "grade_evidence"]
    assert [e["event"] for e in result["audit"] if e["event"] == "grader_parse_failure"]
    assert _decided(result)[:2] == ["REFINE", "GENERATE"]


def test_a_reply_with_null_content_is_an_empty_reply_not_a_failure(llm, monkeypatch):
    # Seed 002: classification unavailable -> the full pipeline; seeds 000/001: grader output
    # that cannot be read as scores -> 0.5 each. A reply whose content is null (finish_reason
    # "stop") holds no output to read: it ended the question with exit status 1.
    llm.script("analyze_and_route", _spent(finish="stop"))
    llm.script("grade_evidence", _spent(finish="stop"))
    llm.default("grade_evidence", grades(rest=0.9))
    llm.script("synthesize", _spent(finish="stop"))
    llm.default("synthesize", "Service 1 retries 1 times [1].")
    result = _ask(monkeypatch, 5, 3, None)
    assert result["complexity"] == "complex"
    assert "classification_unavailable" in [e["event"] for e in result["audit"]]
    assert [e["event"] for e in result["audit"] if e["event"] == "grader_parse_failure"]
    assert _decided(result)[:2] == ["REFINE", "GENERATE"]
    assert result["body"].startswith("Service 1 retries 1 times [1].")
    assert [e["event"] for e in result["audit"] if e["event"] == "reply_empty"] == ["reply_empty"]


def test_an_answer_whose_budget_ran_out_before_any_text_says_so(llm, monkeypatch):
    llm.default("grade_evidence", grades(rest=0.9))
    llm.script("synthesize", _spent())
    result = _ask(monkeypatch, 5, 3, None)
    assert result["body"].startswith("The model returned no answer text.")
    assert [e["node"] for e in result["audit"] if e["event"] == "reply_truncated"] == ["synthesize"]


def test_an_answer_cut_by_its_token_budget_says_so(llm, monkeypatch):
    # SPEC §5: a reply stopped by max_tokens is parsed like any other; the answer the user
    # reads then ends mid-sentence, so it says that it was cut and which setting to raise.
    llm.default("grade_evidence", grades(rest=0.9))
    llm.script("synthesize", Text("Service 1 retries 1 times [1]. Service 2 keeps an upload retr",
                                  finish_reason="length"))
    result = _ask(monkeypatch, 5, 3, None)
    assert result["body"].startswith("Service 1 retries 1 times [1].")
    lines = result["body"].splitlines()  # the line counting unsupported sentences ends it (SPEC §7)
    assert lines[-3] == "_Note: the answer was cut short at its budget of 1024 tokens (KB_AGENT_MAX_ANSWER_TOKENS)._"
    assert lines[-1].startswith("_Note: 1 sentence of this answer is not supported")
    assert result["answer"].count("LLM Usage Stats") == 1


def test_a_grade_stopped_by_a_content_filter_is_a_refusal(llm, monkeypatch):
    # Azure OpenAI answers a filtered request with content null and finish_reason content_filter.
    filtered = Raw({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "finish_reason": "content_filter",
                                 "message": {"role": "assistant", "content": None}}]})
    llm.script("grade_evidence", filtered)
    llm.default("grade_evidence", grades(rest=0.9))
    result = _ask(monkeypatch, 5, 3, None)
    assert [e["node"] for e in result["audit"] if e["event"] == "reply_refused"] == ["grade_evidence"]
    assert _decided(result)[:2] == ["REFINE", "GENERATE"]


def test_files_the_question_points_at_answer_it(llm, monkeypatch):
    # Seed 001's read_file rule from the outside: the user names the files, crag reads only
    # them (SPEC §5) and approves them without a grade. The paths are where the answer is,
    # not terms the documents must write: a right answer from them is not refused.
    question = "What is the upload retry policy? See docs/service3.md and ./docs/service4.md"
    llm.script("analyze_and_route", json.dumps({"complexity": "complex", "suggested_tools": ["read_file"]}))
    llm.script("plan", json.dumps({"tool_calls": [{"tool": "read_file", "args": {"path": "docs/service3.md"}},
                                                  {"tool": "read_file", "args": {"path": "docs/service4.md"}}]}))
    llm.script("synthesize", "Service 3 retries 3 times [1]. Service 4 retries 4 times [2].")
    code, out, err = _cli("ask", question, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [e["rule_name"] for e in result["audit"] if e["event"] == "fast_path_hit"] == ["read_file"]
    assert llm.calls("grade_evidence") == 0 and result["evidence_scores"] == [1.0, 1.0]
    assert result["grounding"]["verdict"] == "answered"
    assert result["body"] == "Service 3 retries 3 times [1]. Service 4 retries 4 times [2]."
    assert [(c["path"], c["line"]) for c in result["citations"]] == [("docs/service3.md", 3), ("docs/service4.md", 3)]
    assert not [e for e in result["audit"] if e["event"] in ("question_terms_missing", "question_not_addressed")]


@pytest.mark.parametrize("reply", [
    "1: yes\n2: yes\n3: yes\n4: yes\n5: yes\n6: yes",  # a label for a passage that is not there
    "1: yes\n2: yes\n3: yes\n4: yes\n5: yes\n1: no",  # two different labels for one passage
])
def test_labels_that_are_not_one_per_item_are_a_parse_failure(llm, monkeypatch, reply):
    # SPEC §2: a reply that is not exactly N grades is the seeds' parse failure, whether it
    # is written as numbers ([0.9] x 6 for 5 items) or as labels.
    llm.script("grade_evidence", reply)
    llm.default("grade_evidence", grades(rest=0.9))
    result = _ask(monkeypatch, 5, 1, None)
    failures = [e for e in result["audit"] if e["event"] == "grader_parse_failure"]
    assert len(failures) == 1 and failures[0]["level"] == "warning" and failures[0]["items"] == 5
    assert result["evidence_scores"] == [0.5] * 5 and _decided(result) == ["REFINE"]


def test_every_grading_names_the_rule_that_decided_it(llm, monkeypatch):
    # SPEC §2: the verdict names the rule that decided. Every visit of grade_evidence ends
    # with one grade_decided, also when no LLM call was made: a fast-path approval, or a
    # round that brought nothing new (the question's search had returned every chunk).
    llm.default("grade_evidence", grades(rest=0.0))
    result = _ask(monkeypatch, 30, 3, None)
    assert result["trace"].count("grade_evidence") == 3 and llm.calls("grade_evidence") == 1
    decided = [(e["rule"], e["action"]) for e in result["audit"] if e["event"] == "grade_decided"]
    assert decided == [("none_left", "RE_RETRIEVE"), ("no_context", "RE_RETRIEVE"), ("no_context", "RE_RETRIEVE")]

    approved = _ask(monkeypatch, 2, 3, None)
    assert [(e["rule"], e["action"]) for e in approved["audit"] if e["event"] == "grade_decided"] == [
        ("fast_path", "GENERATE")]
    assert [e["rule_name"] for e in approved["audit"] if e["event"] == "fast_path_hit"] == ["few_context"]


def test_a_grading_fast_path_is_in_the_usage_block_with_0_calls(llm, monkeypatch):
    # SPEC §7: the usage block gives the figures per node. A grading decided by a fast path
    # (few_context: 2 items) made no call, and grade_evidence was missing from usage.by_node and
    # the block though the trace held it; a node that may ask the model is listed whenever it
    # runs, with 0 calls when it asked none (tool_exec never asks one, and is not).
    result = _ask(monkeypatch, 2, 3, None)
    assert [e["rule_name"] for e in result["audit"] if e["event"] == "fast_path_hit"] == ["few_context"]
    assert llm.calls("grade_evidence") == 0 and "grade_evidence" in result["trace"]
    by_node = result["usage"]["by_node"]
    assert list(by_node) == ["analyze_and_route", "plan", "grade_evidence", "synthesize"], by_node
    assert by_node["grade_evidence"] == {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                                         "latency_ms": 0.0}
    assert "  - `grade_evidence`: 0 calls, 0 prompt / 0 completion / 0 total tokens, 0 ms" in result["answer"].splitlines()
    assert result["usage"]["llm_calls"] == 3


@pytest.mark.parametrize("again", ["simple", "chitchat"])
def test_a_retry_after_re_retrieve_is_graded_again(llm, monkeypatch, again):
    # Seed 000 "Poor evidence triggers RE-RETRIEVE": back to analyze_and_route to try another
    # retrieval strategy, not to leave the corrective loop. A question whose evidence the
    # grader removed stays complex, so the next round's evidence is graded too (one grading
    # call per round) instead of going to synthesis ungraded under a stale RE_RETRIEVE.
    complex_ = json.dumps({"complexity": "complex", "suggested_tools": ["vector_search"]})
    llm.script("analyze_and_route", complex_, json.dumps({"complexity": again, "suggested_tools": ["vector_search"]}))
    llm.script("grade_evidence", grades(rest=0.1))
    llm.default("grade_evidence", grades(rest=0.9))
    result = _ask(monkeypatch, 5, 3, None)
    assert result["trace"] == ["analyze_and_route", "plan", "tool_exec", "grade_evidence",
                               "analyze_and_route", "plan", "tool_exec", "grade_evidence", "synthesize"]
    assert result["complexity"] == "complex"
    assert _decided(result) == ["RE_RETRIEVE", "GENERATE"]
    assert result["grader_action"] == "GENERATE" and result["evidence_scores"] == [0.9] * 5
    assert {"event": "route_kept", "complexity": "complex", "reason": "retry of a retrieval"} in result["audit"]
    assert result["usage"]["by_node"]["grade_evidence"]["calls"] == 2


def test_the_cap_note_never_calls_well_graded_evidence_weak_by_its_mean(llm, monkeypatch):
    # The default policy's term_missing row sends a first round back to search (REFINE) when
    # the question names a term (HTTP/3) no item holds, whatever the grades. At a cap of one
    # round the answer is made from those items: their mean (0.97) is not "below 0.7", so the
    # note says why the search stopped, not a weakness the grades do not show.
    question = "What is the upload retry policy for HTTP/3 uploads?"
    llm.default("grade_evidence", _labelled(0.97))
    monkeypatch.setenv("KB_AGENT_MAX_ITERATIONS", "1")
    monkeypatch.setenv("KB_AGENT_TOP_K", "5")
    code, out, err = _cli("ask", question, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [(e["rule"], e["action"]) for e in result["audit"] if e["event"] == "grade_decided"] == [
        ("term_missing", "REFINE")]
    note = result["body"].splitlines()[-1]
    assert "below 0.7" not in note and "mean relevance" not in note
    assert note == ("_Note: the search stopped after 1 retrieval round (KB_AGENT_MAX_ITERATIONS) while the grader "
                    "still asked for more evidence._")
