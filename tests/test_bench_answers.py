"""``benchmarks.answers`` cannot rot: it runs on a tiny SQuAD-shaped set, on the offline
backend and against the scripted loopback server, and its scoring is checked on its own."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from benchmarks import answers
from tests.openai_server import FakeOpenAIServer, grades

ARTICLES = {
    "Lighthouses": ("The Fastnet lighthouse stands on a rock off the south coast of Ireland.\n"
                    "Its light was first lit in 1854 and was replaced by a granite tower in 1904.\n"),
    "Tea_clippers": ("The Cutty Sark was built in Dumbarton in 1869 as a tea clipper.\n"
                     "She carried tea from China to London and later wool from Australia.\n"),
    "Beekeeping": ("A honey bee colony has one queen and thousands of workers.\n"
                   "Beekeepers harvest honey in late summer.\n"),
    "Glaciers": ("The Aletsch glacier is the largest glacier in the Alps.\n"
                 "It has retreated by more than three kilometres since 1870.\n"),
}
QUESTIONS = [
    ("Lighthouses", "When was the Fastnet light first lit?", ["1854"], True),
    ("Lighthouses", "Who painted the Fastnet lighthouse in 1920?", [], False),
    ("Tea_clippers", "Where was the Cutty Sark built?", ["Dumbarton"], True),
    ("Tea_clippers", "How many masts did the Cutty Sark lose in 1880?", [], False),
    ("Beekeeping", "When do beekeepers harvest honey?", ["late summer"], True),
    ("Beekeeping", "What colour is the queen's marking in 2020?", [], False),
    ("Glaciers", "Which glacier is the largest in the Alps?", ["Aletsch glacier", "Aletsch"], True),
    ("Glaciers", "How fast did the Aletsch glacier flow in 1850?", [], False),
]


@pytest.fixture
def squad(tmp_path: Path) -> Path:
    """A SQuAD-shaped split: ``corpus/<Title>.txt`` and ``questions.jsonl``."""
    root = tmp_path / "squad"
    (root / "corpus").mkdir(parents=True)
    for title, text in ARTICLES.items():
        (root / "corpus" / f"{title}.txt").write_text(text, encoding="utf-8")
    with (root / "questions.jsonl").open("w", encoding="utf-8") as f:
        for n, (title, question, gold, answerable) in enumerate(QUESTIONS):
            f.write(json.dumps({"id": f"q{n}", "question": question, "answers": gold, "answerable": answerable,
                                "title": title, "gold_file": f"corpus/{title}.txt", "gold_line": 1,
                                "gold_line_end": 1}) + "\n")
    return root


def run(tmp_path: Path, squad: Path, *extra: str) -> dict:
    argv = ["--sets", "squad", "--squad", str(squad), "--answerable", "1", "--unanswerable", "1",
            "--out", str(tmp_path / "out"), "--index-dir", str(tmp_path / "index"), "--name", "t", *extra]
    assert answers.main(argv) == 0
    return json.loads((tmp_path / "out" / "answers-t.json").read_text())


def test_offline_run_scores_each_crag_configuration_and_resumes(tmp_path: Path, squad: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run(tmp_path, squad, "--offline")
    assert result["configs"] == ["crag", "crag-simple", "crag-complex"] and result["tutorial_left_out"]
    table = result["table"]["squad"]
    assert all(cell["answerable"] == 1 and cell["unanswerable"] == 1 for cell in table.values())
    rows = result["answers"]
    assert {r["route"] for r in rows if r["config"] == "crag-simple"} == {"simple"}
    assert {r["route"] for r in rows if r["config"] == "crag-complex"} == {"complex"}
    assert all("grade_evidence" not in r["trace"] for r in rows if r["config"] == "crag-simple")
    assert all("grade_evidence" in r["trace"] for r in rows if r["config"] == "crag-complex")
    heldout = answers.split_articles([f"corpus/{t}.txt" for t in ARTICLES])["heldout"]
    assert {r["gold"] for r in rows if r["answerable"]} <= set(heldout)
    assert "| squad | crag-simple |" in (tmp_path / "out" / "answers-t.md").read_text()
    record = tmp_path / "out" / "answers-t.jsonl"
    lines = record.read_text().splitlines()
    assert len(lines) == 6
    again = run(tmp_path, squad, "--offline")  # every question is in the record: nothing runs again
    assert record.read_text().splitlines() == lines and again["table"] == result["table"]


def test_all_four_configurations_against_a_scripted_server(tmp_path: Path, squad: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    heldout = answers.split_articles([f"corpus/{t}.txt" for t in ARTICLES])["heldout"]
    gold = next(g for title, _, g, ok in QUESTIONS if ok and f"corpus/{title}.txt" == heldout[0])
    with FakeOpenAIServer() as srv:
        srv.reject_json_schema = True  # an older server: the tutorial's grader falls back to plain text
        srv.default("analyze_and_route", json.dumps({"complexity": "simple", "suggested_tools": ["vector_search"]}))
        srv.default("plan", json.dumps({"tool_calls": []}))
        srv.default("grade_evidence", grades(rest=0.9))
        srv.default("synthesize", f"It is {gold[0]} [1].")
        srv.default("grade_documents", '{"binary_score": "no"}')
        srv.default("transform_query", "a better question")
        srv.default("generate", "I don't know.")
        result = run(tmp_path, squad, "--base-url", srv.base_url, "--model", "m", "--api-key", "k")
        generate = [r.body for r in srv.requests if r.node == "generate"]
        rewrites = srv.calls("transform_query")
        formats = [p["response_format"] for p in srv.params("grade_documents")]
    assert result["configs"] == list(answers.CONFIGS) and result["tutorial_runner"] in ("langgraph", "plain")
    table = result["table"]["squad"]
    assert table["tutorial"]["right"] == 0 and table["tutorial"]["honest_unanswerable"] == 1
    assert table["tutorial"]["loop_acted"] == 2  # every document graded "no": the question is rewritten
    assert formats[0] is not None and not any(formats[1:])  # refused once, then asked without a schema
    assert len(generate) == rewrites == 2  # the answer is generated for the rewritten question
    assert all(b["messages"][-1]["content"].startswith("You are an assistant for question-answering tasks. ")
               and "Question: a better question \nContext: " in b["messages"][-1]["content"] for b in generate)
    tutorial = [r for r in result["answers"] if r["config"] == "tutorial"]
    assert all(r["rewritten"] == "a better question" and r["calls"] >= 3 for r in tutorial)
    for config in ("crag", "crag-simple", "crag-complex"):
        assert table[config]["errors"] == 0 and table[config]["calls_per_question"] >= 3
    assert table["crag-simple"]["right"] == 1 and table["crag"]["right"] == 1
    assert {r["route"] for r in result["answers"] if r["config"] == "crag-complex"} == {"complex"}


def test_a_key_typed_on_the_command_line_stays_out_of_the_reports(tmp_path: Path, squad: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    key = "sk-live-0123456789abcdefXYZ"
    result = run(tmp_path, squad, "--offline", "--configs", "crag", "--api-key", key,
                 "--base-url", "http://user:hunter2pass@127.0.0.1:9/v1")
    written = "".join(path.read_text() for path in (tmp_path / "out").iterdir())
    assert key not in written and "hunter2pass" not in written
    assert "--api-key *** " in result["command"] and "--configs crag" in result["command"]


def test_a_failed_question_does_not_lower_the_cost_per_question() -> None:
    """A failed question's row says 0 calls and 0 s (a timeout may have taken minutes): the
    cost columns are per question answered, not halved by a server that failed half of them."""
    answered = {"answerable": True, "right": True, "refused": False, "calls": 4, "prompt_tokens": 2000,
                "seconds": 30.0}
    failed = {"answerable": True, "right": False, "refused": False, "calls": 0, "prompt_tokens": 0,
              "seconds": 0.0, "error": "LLMError: did not answer within 600 s"}
    s = answers.summarize([answered, failed])
    assert (s["calls_per_question"], s["prompt_tokens_per_question"], s["seconds_per_question"]) == (4, 2000, 30)
    assert s["errors"] == 1 and s["answerable"] == 2 and s["right"] == 1


def test_a_tutorial_call_ends_within_the_timeout_when_the_server_sends_a_byte_at_a_time() -> None:
    """``--timeout`` bounds a call of the tutorial's model as it bounds crag's: the SDK's own
    timeout bounds each network read, and a trickling server held the run for ever."""
    import time

    import openai

    from tests.openai_server import Trickle

    with FakeOpenAIServer() as srv:
        srv.default("*", Trickle(0.05, "yes"))
        model = answers.TutorialModel(srv.base_url, "k", "m", 1.0)
        started = time.monotonic()
        try:
            with pytest.raises(openai.APITimeoutError):
                model.chat("grade_documents", [{"role": "user", "content": "Is it relevant?"}])
        finally:
            model.close()
        assert time.monotonic() - started < 5


def test_squad_normalisation_and_refusals() -> None:
    assert answers.normalize("The  Aletsch-Glacier!") == "aletschglacier"
    assert answers.holds_answer("It is the Aletsch glacier, in the Alps.", ["Aletsch glacier"])
    assert not answers.holds_answer("It was lit in 18540.", ["1854"])
    assert answers.holds_answer("It came 100 years before Charles Darwin's theory.", ["Charles Darwin"])
    assert answers.holds_answer("It is Lorentz's law.", ["Lorentz's Law"])
    assert not answers.holds_answer("It was Darwinsky's idea.", ["Darwin"])
    # every punctuation character: a hyphen written for the gold answer's en dash is the same answer
    assert answers.holds_answer("It was the Cretaceous-Paleogene extinction event.", ["Cretaceous–Paleogene extinction"])
    assert answers.refuses("I couldn't find relevant information in the knowledge base to answer this question.")
    assert answers.refuses("The context does not mention who painted it.")
    assert answers.refuses("I don\u2019t know.")
    assert not answers.refuses("It was first lit in 1854 [1].")
    asked = "How can you find the age of rock units which do not contain radioactive isotopes?"
    assert not answers.refuses("To find the age of rock units which do not contain radioactive isotopes, "
                               "date the lava layers around them [1].", asked)
    assert answers.refuses("The context does not contain the age [1].", asked)  # "does not contain": not asked
    q = {"set": "squad", "answerable": True, "answers": ["1854"], "gold": "corpus/Lighthouses.txt"}
    assert answers.score(q, "It was lit in 1854, but I don't know more.", []) == {"right": False, "refused": True}


def test_the_article_split_is_deterministic_and_disjoint() -> None:
    titles = [f"corpus/A{n}.txt" for n in range(24)]
    first, second = answers.split_articles(titles), answers.split_articles(list(reversed(titles)))
    assert first == second and len(first["heldout"]) == len(first["tuning"]) == 12
    assert not set(first["heldout"]) & set(first["tuning"])


def test_the_tutorial_graph_follows_its_edges() -> None:
    seen: list[str] = []

    def node(name: str, **update):
        def run(state: dict) -> dict:
            seen.append(name)
            return update

        return run

    nodes = {"retrieve": node("retrieve", documents=[]), "grade_documents": node("grade_documents", web_search="No"),
             "transform_query": node("transform_query"), "web_search_node": node("web_search_node"),
             "generate": node("generate", generation="done")}
    invoke, _ = answers.build_tutorial(nodes)
    assert invoke({"question": "q"})["generation"] == "done"
    assert seen == ["retrieve", "grade_documents", "generate"]


def test_a_run_against_a_server_that_is_down_fails_in_one_line_and_a_later_run_asks_again(
        tmp_path: Path, squad: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Every question failing is exit status 1 with one line; the failures are not taken for
    finished questions, so the run resumed once the server is up asks them, not skips them."""
    monkeypatch.chdir(tmp_path)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    argv = ["--sets", "squad", "--squad", str(squad), "--answerable", "1", "--unanswerable", "1", "--configs", "crag",
            "--out", str(tmp_path / "out"), "--index-dir", str(tmp_path / "index"), "--name", "t", "--model", "m",
            "--set", "KB_AGENT_LLM_MAX_RETRIES=0"]
    assert answers.main([*argv, "--base-url", down]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m benchmarks.answers: error: every question failed, the first with LLMError: "
                              f"LLM server {down} could not be reached")
    assert answers.Record(tmp_path / "out" / "answers-t.jsonl").rows == {}
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", json.dumps({"complexity": "simple", "suggested_tools": ["vector_search"]}))
        srv.default("plan", json.dumps({"tool_calls": []}))
        srv.default("grade_evidence", grades(rest=0.9))
        srv.default("synthesize", "It is so [1].")
        assert answers.main([*argv, "--base-url", srv.base_url]) == 0
        assert srv.calls("synthesize") == 2
    result = json.loads((tmp_path / "out" / "answers-t.json").read_text())
    assert len(result["answers"]) == 2 and not any(r.get("error") for r in result["answers"])


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "1e6"])
def test_a_timeout_crag_refuses_is_refused_with_the_arguments_naming_timeout(
        timeout: str, tmp_path: Path, squad: Path, capsys: pytest.CaptureFixture) -> None:
    """``--timeout`` goes to crag as KB_AGENT_LLM_TIMEOUT: a value crag refuses was found only
    after the indexing, in a message blaming that variable "set in the environment"."""
    with pytest.raises(SystemExit) as exit_:
        answers.main(["--offline", "--sets", "squad", "--squad", str(squad), "--answerable", "1",
                      "--unanswerable", "1", "--out", str(tmp_path / "out"), "--index-dir", str(tmp_path / "index"),
                      "--timeout", timeout])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("python -m benchmarks.answers: error: argument --timeout: must be a number of seconds "
                       f"between 0.001 and 86400, got {timeout}")
    assert not (tmp_path / "index").exists()  # nothing was indexed


def test_offline_with_only_the_tutorial_is_refused_before_any_work(tmp_path: Path, squad: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """``--offline`` leaves the tutorial out: asked for alone, it indexed everything, wrote an
    empty table and exited 0, as though the run had measured something."""
    with pytest.raises(SystemExit) as exit_:
        answers.main(["--offline", "--configs", "tutorial", "--sets", "squad", "--squad", str(squad), "--quick",
                      "--out", str(tmp_path / "out"), "--index-dir", str(tmp_path / "index"), "--name", "t"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("python -m benchmarks.answers: error: --configs tutorial needs a server, and --offline "
                       "leaves it out: nothing to run")
    assert not (tmp_path / "index").exists() and not list((tmp_path / "out").glob("answers-t.*"))


@pytest.mark.parametrize(("sets", "where", "says"), [
    ("squad,docs", "--shared", "missing data: /nonexistent/corpora/fastapi_docs/corpus, "
                               "/nonexistent/corpora/hf_hub_docs/corpus"),
    ("squad", "--squad", "missing data: /nonexistent/questions.jsonl, /nonexistent/corpus"),
])
def test_data_missing_for_any_set_is_one_line_naming_it_before_any_work(
        sets: str, where: str, says: str, tmp_path: Path, squad: Path, capsys: pytest.CaptureFixture) -> None:
    """The docs corpora missing were found only after the whole SQuAD set had been indexed and
    asked; docs/benchmarks.md promises one line naming the path, before any work."""
    argv = ["--offline", "--quick", "--sets", sets, "--squad", str(squad), "--out", str(tmp_path / "out"),
            "--index-dir", str(tmp_path / "index"), "--name", "t", where, "/nonexistent"]
    with pytest.raises(SystemExit) as exit_:
        answers.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"python -m benchmarks.answers: error: {says} (")
    assert not (tmp_path / "index").exists() and not list((tmp_path / "out").glob("answers-t.*"))


def test_a_record_is_reused_only_by_a_run_of_the_same_server_and_settings(tmp_path: Path, squad: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The record was keyed by model, configuration, set and question alone: a second run at
    another server, or with other --set settings or --context-tokens, asked nothing and
    reported the first run's answers under its own command line."""
    monkeypatch.chdir(tmp_path)
    record = tmp_path / "out" / "answers-t.jsonl"

    def asked(*extra: str) -> int:
        """Runs crag on the 2 questions and says how many it asked (rows it added to the record)."""
        before = len(record.read_text().splitlines()) if record.exists() else 0
        result = run(tmp_path, squad, "--configs", "crag", "--model", "m", "--set", "KB_AGENT_LLM_MAX_RETRIES=0",
                     *extra)
        assert len(result["answers"]) == 2 and not any(r.get("error") for r in result["answers"])
        assert all(r.get("setup") == result.get("setup") for r in result["answers"])  # this setup's answers only
        return len(record.read_text().splitlines()) - before

    with FakeOpenAIServer() as first, FakeOpenAIServer() as second:
        for srv in (first, second):
            srv.default("analyze_and_route", json.dumps({"complexity": "simple", "suggested_tools": ["vector_search"]}))
            srv.default("plan", json.dumps({"tool_calls": []}))
            srv.default("synthesize", "It is so [1].")
        assert asked("--base-url", first.base_url) == 2
        assert asked("--base-url", second.base_url) == 2  # another server
        assert asked("--base-url", first.base_url, "--set", "KB_AGENT_TOP_K=3") == 2  # another crag setting
        assert asked("--base-url", first.base_url, "--context-tokens", "4096") == 2  # another window
        assert asked("--base-url", first.base_url + "/") == 0  # the first setup again: all in the record
        assert first.calls("synthesize") == 6 and second.calls("synthesize") == 2
        # a record written before rows carried their setup stays resumable: its rows count for any run
        rows = [json.loads(line) for line in record.read_text().splitlines()]
        record.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "setup"}) + "\n" for r in rows[:2]))
        result = run(tmp_path, squad, "--configs", "crag", "--model", "m", "--base-url", second.base_url,
                     "--set", "KB_AGENT_TOP_K=5")
        assert len(result["answers"]) == 2 and len(record.read_text().splitlines()) == 2


def test_a_resumed_report_says_what_ran_the_recorded_tutorial_rows(tmp_path: Path, squad: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner was known only when this run asked a tutorial question: a run resumed from
    its record said "tutorial graph: not run" beside the tutorial's rows."""
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer() as srv:
        srv.default("grade_documents", '{"binary_score": "yes"}')
        srv.default("generate", "I don't know.")
        argv = ("--configs", "tutorial", "--base-url", srv.base_url, "--model", "m")
        first = run(tmp_path, squad, *argv)
        again = run(tmp_path, squad, *argv)  # every question is in the record: nothing is asked
        assert srv.calls("generate") == 2
        record = tmp_path / "out" / "answers-t.jsonl"  # a record written before rows said what ran them
        record.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "runner"}) + "\n"
                                  for line in record.read_text().splitlines()))
        older = run(tmp_path, squad, *argv)
    assert first["tutorial_runner"] in ("langgraph", "plain") and again["tutorial_runner"] == first["tutorial_runner"]
    assert older["tutorial_runner"] == "unknown (an older record)"
    assert f"tutorial graph: {older['tutorial_runner']}" in (tmp_path / "out" / "answers-t.md").read_text()
