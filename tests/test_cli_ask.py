"""``python -m crag ask`` / ``chat`` end to end: the real CLI, the real openai client, a loopback server.

The knowledge base is indexed for real (hash embedder, FAISS, SQLite) in a temporary
directory; the LLM is ``tests.openai_server.FakeOpenAIServer`` on 127.0.0.1, scripted per
node through the ``X-Crag-Node`` header, so every test also counts the calls each node made.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from crag.answer import NO_EVIDENCE, STATS_HEADING
from crag.cli import main
from tests.fakes import clean_env
from tests.openai_server import FakeOpenAIServer, Status, Text, grades, item_count

ROOT = Path(__file__).resolve().parents[1]

SETUP = """# Setup

Install the service with pip.

## Ports

The server listens on port 8080 by default.
Set `SERVICE_PORT` to change the port the server listens on.

## Retries

The client retries failed uploads three times before it gives up.
"""

DEPLOY = """# Deploy

Run the container with docker compose up.
The image is built from the Dockerfile at the repository root.
"""

BACKUP = """# Backups

Nightly backups are written to the object store at 02:00 UTC.
A backup is kept for thirty days.
"""

OLD_STATS = f"An old answer [1].\n\n[1] docs/setup.md:L3\n\n---\n{STATS_HEADING}\n- **API calls:** 9\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small indexed knowledge base under ``tmp_path/docs``; the working directory is ``tmp_path``."""
    root = tmp_path / "docs"
    write(root / "setup.md", SETUP)
    write(root / "deploy.md", DEPLOY)
    write(root / "backup.md", BACKUP)
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    assert cli("index", "docs")[0] == 0
    return root


@pytest.fixture
def llm(kb: Path, monkeypatch: pytest.MonkeyPatch):
    """The loopback OpenAI-compatible server, with crag's settings pointing at it."""
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("KB_AGENT_MODEL", "test-model")
        monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "5")
        yield srv


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def ask_json(*argv: str) -> dict:
    code, out, err = cli("ask", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def route(complexity: str, *tools: str) -> str:
    return json.dumps({"complexity": complexity, "suggested_tools": list(tools)})


def plan(*calls: tuple[str, dict]) -> str:
    return json.dumps({"tool_calls": [{"tool": tool, "args": args} for tool, args in calls]})


def footer(answer: str) -> list[tuple[int, str, int | None]]:
    """The ``[K] path:LN`` lines of an answer's footer."""
    found = []
    for match in re.finditer(r"^\[(\d+)\] (\S+?)(?::L(\d+))?$", answer, re.M):
        found.append((int(match[1]), match[2], int(match[3]) if match[3] else None))
    return found


def test_chitchat_takes_exactly_two_llm_calls(llm: FakeOpenAIServer) -> None:
    llm.script("analyze_and_route", route("chitchat"))
    llm.script("synthesize", "Hello! Ask me anything about your documents.")
    result = ask_json("hi there")
    assert llm.nodes() == ["analyze_and_route", "synthesize"]
    assert result["trace"] == ["analyze_and_route", "synthesize"]
    assert result["complexity"] == "chitchat" and result["usage"]["llm_calls"] == 2
    assert result["answer"].startswith("Hello! Ask me anything")
    assert result["citations"] == []


def test_simple_question_takes_exactly_three_llm_calls_and_cites_the_line(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("analyze_and_route", route("simple", "grep_search"))
    llm.script("plan", plan(("grep_search", {"pattern": "SERVICE_PORT"})))
    llm.script("synthesize", "Set `SERVICE_PORT` to change it [1].")
    result = ask_json("Which variable changes the port?")
    assert llm.nodes() == ["analyze_and_route", "plan", "synthesize"]
    assert result["trace"] == ["analyze_and_route", "plan", "tool_exec", "synthesize"]  # simple: no grading
    assert result["grader_action"] is None
    assert result["citations"] == [
        {"n": 1, "path": "docs/setup.md", "line": 8, "end_line": 8, "tool": "grep_search"}]
    assert "[1] docs/setup.md:L8" in result["answer"]
    assert "SERVICE_PORT" in SETUP.splitlines()[8 - 1]


def test_complex_question_is_graded_and_weak_items_are_removed(llm: FakeOpenAIServer) -> None:
    llm.script("analyze_and_route", route("complex", "vector_search", "grep_search"))
    llm.script("plan", plan(("vector_search", {"query": "how many times are uploads retried", "top_k": 3})))
    llm.script("grade_evidence", lambda body: "```json\n" + grades(0.95, 0.8, 0.1, rest=0.9)(body) + "\n```")
    llm.script("synthesize", "Uploads are retried three times [1]; see also [2].")
    result = ask_json("How often does the client retry an upload, and what happens when a backup or deploy fails?")
    assert llm.nodes() == ["analyze_and_route", "plan", "grade_evidence", "synthesize"]
    assert result["grader_action"] == "GENERATE" and result["iterations"] == 1
    grade_body = next(r.body for r in llm.requests if r.node == "grade_evidence")
    n = item_count(grade_body)
    assert n >= 3
    assert result["evidence_scores"] == [0.95, 0.8] + [0.9] * (n - 3)
    removed = [e for e in result["audit"] if e["event"] == "evidence_removed"]
    assert len(removed) == 1 and removed[0]["score"] == 0.1
    grade_prompt = json.dumps(grade_body)
    assert "[1]" in grade_prompt and f"[{n}]" in grade_prompt and f"[{n + 1}]" not in grade_prompt
    # "see also [2]" belongs to a sentence item 2 does not support: grounding drops that marker.
    assert [c["n"] for c in result["citations"]] == [1]


def test_refine_goes_back_for_more_evidence_within_the_iteration_cap(llm: FakeOpenAIServer, monkeypatch) -> None:
    monkeypatch.setenv("KB_AGENT_MAX_ITERATIONS", "2")
    llm.default("analyze_and_route", route("complex", "vector_search"))
    llm.default("plan", plan(("vector_search", {"query": "backups retention uploads server docker", "top_k": 3})))
    llm.script("grade_evidence", grades(rest=0.5))
    llm.default("grade_evidence", "not json at all")  # second round: parse failure, 0.5 each
    llm.script("synthesize", "Backups are kept for thirty days [1].")
    result = ask_json("How long are backups kept?")
    assert result["iterations"] == 2
    assert result["trace"].count("tool_exec") == 2 and result["trace"][-1] == "synthesize"
    assert any(e["event"] == "grader_parse_failure" for e in result["audit"])
    assert "weak" in result["answer"].lower()  # the cap forced an answer from weak evidence


def test_every_cited_line_shows_the_cited_text_in_the_file(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("analyze_and_route", route("complex", "vector_search", "grep_search"))
    llm.script("plan", plan(("grep_search", {"pattern": "retries failed uploads"}),
                            ("grep_search", {"pattern": "thirty days"}),
                            ("vector_search", {"query": "docker compose container", "top_k": 1})))
    llm.script("grade_evidence", grades(rest=0.9))
    llm.script("synthesize", "The client retries failed uploads three times before it gives up [1]. "
                             "A backup is kept for thirty days [2]. Run the container with docker compose up [3].")
    result = ask_json("Tell me about retries, backups and deploying")
    cited = footer(result["answer"])
    assert len(cited) == 3
    wanted = {"docs/setup.md": "retries failed uploads", "docs/backup.md": "thirty days",
              "docs/deploy.md": "docker compose up"}
    for _, path, line in cited:
        assert line is not None
        text = (kb.parent / path).read_text(encoding="utf-8").splitlines()[line - 1]
        assert wanted[path] in text, (path, line, text)


def test_exactly_one_stats_block_despite_history_and_a_hallucinating_model(
    llm: FakeOpenAIServer, tmp_path: Path
) -> None:
    history = tmp_path / "history.json"
    history.write_text(json.dumps([
        {"role": "user", "content": "How are uploads retried?"},
        {"role": "assistant", "content": OLD_STATS},
        {"role": "user", "content": "And the port?"},
        {"role": "assistant", "content": OLD_STATS.replace("9", "4")},
    ]))
    llm.script("analyze_and_route", route("simple", "grep_search"))
    llm.script("plan", plan(("grep_search", {"pattern": "port 8080"})))
    llm.script("synthesize", f"It listens on 8080 [1].\n\n---\n{STATS_HEADING}\n- **API calls:** 1\n- **Tokens:** 5")
    code, out, err = cli("ask", "What port by default?", "--history", str(history))
    assert code == 0, err
    assert out.count(STATS_HEADING) == 1 and out.count("\n---\n") == 1
    assert out.rstrip().splitlines()[-1].startswith("  - `synthesize`")
    assert "**API calls:** 3" in out
    for request in llm.requests:
        assert "LLM Usage Stats" not in json.dumps(request.body, ensure_ascii=False)
    first = json.dumps(llm.requests[0].body)
    assert "How are uploads retried?" in first  # the history reached the model, without its stats


def test_history_left_out_to_fit_the_window_is_audited_and_said(llm: FakeOpenAIServer, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``ask --history`` of turns longer than KB_AGENT_CONTEXT_TOKENS answered as if they had not
    been given, without a word; the oldest go first (docs/real-models.md), and now the answer's
    audit and a note on stderr say how many."""
    history = tmp_path / "history.json"
    history.write_text(json.dumps([
        {"role": "user", "content": "Tell me about uploads. " * 800},
        {"role": "assistant", "content": "Uploads are retried."},
        {"role": "user", "content": "And the port?"},
        {"role": "assistant", "content": "It is 8080."},
    ]))
    monkeypatch.setenv("KB_AGENT_CONTEXT_TOKENS", "2048")
    llm.script("analyze_and_route", route("simple", "grep_search"))
    llm.script("plan", plan(("grep_search", {"pattern": "port 8080"})))
    llm.script("synthesize", "It listens on 8080 [1].")
    code, out, err = cli("ask", "What port by default?", "--history", str(history), "--json")
    assert code == 0, err
    trimmed = [e for e in json.loads(out)["audit"] if e["event"] == "history_trimmed"]
    assert trimmed == [{"event": "history_trimmed", "node": "synthesize", "count": 1}]
    assert "And the port?" in json.dumps(llm.requests[-1].body)  # the newer turns were sent
    assert err == ("crag: note: the answer was written without the 1 oldest of the 4 history messages, "
                   "which do not fit KB_AGENT_CONTEXT_TOKENS=2048\n")


def test_history_left_out_to_fit_a_server_window_names_that_window(llm: FakeOpenAIServer, tmp_path: Path) -> None:
    """A server whose window is smaller than KB_AGENT_CONTEXT_TOKENS refuses the answer's request,
    and crag fits it to that window, leaving history out: the note named the setting (8192), which
    raising would not change; it names the server's window, as an answer cut at its budget does."""
    history = tmp_path / "history.json"
    turns = [m for i in range(12) for m in ({"role": "user", "content": f"Tell me about uploads {i}. " * 60},
                                            {"role": "assistant", "content": "Uploads are retried."})]
    history.write_text(json.dumps(turns))
    llm.context_window = 2048
    llm.default("analyze_and_route", route("simple", "grep_search"))
    llm.default("plan", plan(("grep_search", {"pattern": "port 8080"})))
    llm.default("synthesize", "It listens on 8080 [1].")
    code, _out, err = cli("ask", "What port by default?", "--history", str(history))
    assert code == 0, err
    assert err.startswith("crag: note: the answer was written without the ")
    assert err.endswith(" of the 24 history messages, which do not fit the model's context window on the server "
                        "(2,048 tokens)\n"), err


def test_no_evidence_gives_the_fixed_sentence_without_footer_or_answer_call(
    llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KB_AGENT_MAX_ITERATIONS", "1")
    llm.script("analyze_and_route", route("simple", "grep_search"))
    llm.script("plan", plan(("grep_search", {"pattern": "quantum flux capacitor"})))
    result = ask_json("Where is the quantum flux capacitor configured?")
    assert llm.nodes() == ["analyze_and_route", "plan"]
    assert result["answer"].startswith(NO_EVIDENCE + "\n\n---\n" + STATS_HEADING)
    assert footer(result["answer"]) == [] and result["citations"] == []


def test_json_output_has_every_field_of_the_spec(llm: FakeOpenAIServer) -> None:
    llm.script("analyze_and_route", Text(route("simple", "grep_search"), prompt_tokens=120, completion_tokens=12))
    llm.script("plan", Text(plan(("grep_search", {"pattern": "docker compose"})), prompt_tokens=300,
                            completion_tokens=40))
    llm.script("synthesize", Text("Use docker compose up [1].", prompt_tokens=500, completion_tokens=20))
    code, out, err = cli("ask", "How do I run it?", "--json")
    assert code == 0 and err == ""
    result = json.loads(out)  # stdout holds only the JSON object
    for key in ("answer", "complexity", "grader_action", "iterations", "trace", "evidence_scores",
                "citations", "usage", "audit", "grounding"):
        assert key in result, key
    usage = result["usage"]
    assert (usage["llm_calls"], usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        3, 920, 72, 992)
    assert usage["by_node"]["plan"]["calls"] == 1
    assert usage["by_node"]["plan"]["prompt_tokens"] == 300 and usage["by_node"]["plan"]["completion_tokens"] == 40
    assert isinstance(usage["by_node"]["plan"]["latency_ms"], float)
    assert result["complexity"] == "simple" and result["grader_action"] is None and result["iterations"] == 1
    assert result["citations"] == [
        {"n": 1, "path": "docs/deploy.md", "line": 3, "end_line": 3, "tool": "grep_search"}]
    assert result["grounding"] == {"sentences": 1, "supported": 1, "unsupported": [], "verdict": "answered"}
    assert "- **Tokens:** 920 prompt / 72 completion / 992 total" in result["answer"]


@pytest.mark.parametrize(("variable", "value"), [
    ("KB_AGENT_MAX_ITERATIONS", "lots"),
    ("KB_AGENT_MAX_ITERATIONS", "0"),
    ("KB_AGENT_GENERATE_THRESHOLD", "1.5"),
    ("KB_AGENT_LLM", "gpt-please"),
])
def test_malformed_settings_exit_2_with_one_line_naming_the_variable(
    kb: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    code, out, err = cli("ask", "anything")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("crag: error: ") and variable in err


def test_llm_down_exits_1_with_one_line_and_no_traceback(kb: Path, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "KB_AGENT_LLM": "openai", "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
           "OPENAI_API_KEY": "k", "KB_AGENT_LLM_MAX_RETRIES": "1", "KB_AGENT_LLM_TIMEOUT": "2",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "crag", "ask", "How are uploads retried?"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("crag: error: ")
    assert f"127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr


def test_server_errors_until_retries_run_out_name_the_status(
    llm: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "2")
    llm.default("analyze_and_route", Status(503, retry_after=0))
    code, out, err = cli("ask", "How are uploads retried?")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "503" in err and llm.calls("analyze_and_route") == 3


@pytest.mark.parametrize("index", ["nowhere", "empty-folder"])
def test_a_missing_index_fails_before_the_plan_call(index: str, tmp_path: Path) -> None:
    """Every question searches the index (SPEC §5), so with none there is nothing to answer
    from: ``ask`` and ``chat`` fail once the question is routed, without a plan call; a
    greeting (chitchat, seed 002) needs no index and is answered."""
    (tmp_path / "empty-folder").mkdir()
    with FakeOpenAIServer() as srv:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))},
               "KB_AGENT_LLM": "openai", "OPENAI_BASE_URL": srv.base_url, "OPENAI_API_KEY": "k",
               "KB_AGENT_INDEX_DIR": str(tmp_path / index), "PYTHONPATH": str(ROOT)}

        def run(argv, given=None):
            return subprocess.run([sys.executable, "-m", "crag", *argv], cwd=tmp_path, env=env, input=given,
                                  capture_output=True, text=True, timeout=120)

        srv.default("analyze_and_route", route("simple", "vector_search"))
        for argv, given in ((("ask", "How are uploads retried?"), None), (("ask", "--json", "Where are logs?"), None),
                            (("chat",), "How are uploads retried?\n")):
            before = srv.calls()
            proc = run(argv, given)
            assert proc.returncode == 1 and proc.stdout == "", (argv, proc.stderr)
            assert proc.stderr.startswith("crag: error: no index in ") and proc.stderr.count("\n") == 1, proc.stderr
            # no plan, no search (chat checks the index as the session opens: not even a route)
            assert srv.nodes()[before:] == ([] if argv == ("chat",) else ["analyze_and_route"]), argv
        srv.default("analyze_and_route", route("chitchat"))
        srv.default("synthesize", "Hello! Ask me about the documents.")
        proc = run(("ask", "hello"))
        assert proc.returncode == 0 and proc.stdout.startswith("Hello! Ask me"), proc.stderr


def test_missing_index_is_a_run_time_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "nowhere"))
    code, out, err = cli("ask", "How are uploads retried?")
    assert code == 1 and out == "" and err.startswith("crag: error: ") and "index" in err


def test_kb_flag_indexes_new_roots_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "fresh"))
    write(tmp_path / "notes" / "oncall.md", "# On-call\n\nThe on-call rotation changes every Monday at 09:00.\n")
    code, out, err = cli("ask", "When does the on-call rotation change?", "--kb", "notes", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["usage"]["llm_calls"] == 0 and result["usage"]["model"] == "offline"
    assert "Monday" in result["answer"] and "[1] notes/oncall.md:L" in result["answer"]


def test_bad_history_file_is_a_usage_error(kb: Path, tmp_path: Path) -> None:
    bad = tmp_path / "history.json"
    bad.write_text('{"role": "user"}')
    code, _, err = cli("ask", "hi", "--history", str(bad))
    assert code == 2 and "--history" in err and err.count("\n") == 1
    bad.write_text('[{"role": "user", "content": "hi"}, {"role": "bogus\\u001b[31m", "content": "x"}]')
    code, _, err = cli("ask", "hi", "--history", str(bad))  # a role no turn has: not sent on silently
    assert code == 2 and err.count("\n") == 1 and "history message 1" in err and "bogus" in err
    assert "\x1b" not in err and '"user" or "assistant"' in err


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_a_history_file_saved_with_a_byte_order_mark_is_read(kb: Path, tmp_path: Path, encoding: str) -> None:
    """Notepad and PowerShell 5 save JSON with a BOM: "is not JSON: Unexpected UTF-8 BOM (decode
    using utf-8-sig)", and UTF-16 "cannot be read: 'utf-8' codec can't decode byte 0xff"."""
    history = tmp_path / "history.json"
    history.write_text(json.dumps([{"role": "user", "content": "Where do uploads go?"},
                                   {"role": "assistant", "content": "To the bucket."}]), encoding=encoding)
    code, out, err = cli("ask", "how are uploads retried?", "--history", str(history))
    assert code == 0 and err == "", err
    assert "three times" in out


def test_chat_keeps_history_across_turns_and_streams(llm: FakeOpenAIServer, tmp_path: Path) -> None:
    llm.script("analyze_and_route", route("simple", "grep_search"), route("chitchat"))
    llm.script("plan", plan(("grep_search", {"pattern": "port 8080"})))
    llm.script("synthesize", "The server listens on 8080 [1].", "You're welcome!")
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "crag", "chat"], cwd=tmp_path, env=env,
                          input="What port does it use?\nthanks!\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "The server listens on 8080 [1]." in proc.stdout and "[1] docs/setup.md:L7" in proc.stdout
    assert "You're welcome!" in proc.stdout and proc.stdout.count(STATS_HEADING) == 2
    second = json.dumps([r.body for r in llm.requests if r.node == "analyze_and_route"][1])
    assert "What port does it use?" in second and "LLM Usage Stats" not in second
    assert all(r.body.get("stream") for r in llm.requests if r.node == "synthesize")


def test_a_source_list_the_model_writes_gives_way_to_the_footer(llm: FakeOpenAIServer, tmp_path: Path) -> None:
    # A small model ends its reply with its own source list. crag printed "Sources:" and
    # " docs/other.md:L5 [unsupported]" above its footer, and counted that line as an unsupported
    # sentence; now the list and its heading are left out, in ask and in chat's stream.
    reply = ("The server listens on port 8080 by default [1].\n\nReferences:\n"
             "[1] docs/setup.md:L7\n[2] docs/other.md:L5\n- [3]: https://example.com/ports")
    llm.default("analyze_and_route", route("simple", "grep_search"))
    llm.default("plan", plan(("grep_search", {"pattern": "port 8080"})))
    llm.default("synthesize", reply)
    result = ask_json("What port does it use?")
    assert result["answer"].startswith("The server listens on port 8080 by default [1].\n\n[1] docs/setup.md:L7\n\n---")
    assert result["grounding"]["unsupported"] == [] and footer(result["answer"]) == [(1, "docs/setup.md", 7)]
    asked = len(llm.requests)
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "crag", "chat"], cwd=tmp_path, env=env,
                          input="What port does it use?\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "The server listens on port 8080 by default [1].\n\n[1] docs/setup.md:L7\n\n---" in proc.stdout
    assert "References" not in proc.stdout and "other.md" not in proc.stdout and "unsupported" not in proc.stdout
    assert [r.body.get("stream") for r in llm.requests[asked:] if r.node == "synthesize"] == [True]


def test_a_piped_chat_line_over_the_limit_is_one_question_refused_and_the_session_goes_on(
        llm: FakeOpenAIServer, tmp_path: Path) -> None:
    """A line over 128 x KB_AGENT_CONTEXT_TOKENS characters (1 MiB by default) ended the whole
    session with exit status 2; the question after it was never asked."""
    llm.script("analyze_and_route", route("chitchat"))
    llm.script("synthesize", "You're welcome!")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    huge, also = "x" * (3 * 2**20 + 7), "y" * (2**20 + 1)  # 3 MiB read past in pieces; one over the limit
    proc = subprocess.run([sys.executable, "-m", "crag", "chat"], cwd=tmp_path, env=env,
                          input=f"{huge}\nthanks!\n{also}", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "You're welcome!" in proc.stdout and proc.stdout.count(STATS_HEADING) == 1
    assert proc.stderr.splitlines() == [
        f"crag: error: that line is {len(huge):,} characters, more than can fit KB_AGENT_CONTEXT_TOKENS "
        "(1,048,576 characters at most): shorten it",
        f"crag: error: that line is {len(also):,} characters, more than can fit KB_AGENT_CONTEXT_TOKENS "
        "(1,048,576 characters at most): shorten it",
    ]
    assert llm.nodes() == ["analyze_and_route", "synthesize"]  # the refused lines cost no call


def test_chat_and_ask_fit_to_a_server_window_smaller_than_configured(llm: FakeOpenAIServer, tmp_path: Path) -> None:
    llm.context_window = 1200  # llama.cpp --ctx-size 1200, while crag was told 8192
    llm.default("analyze_and_route", route("simple", "grep_search"))
    llm.default("plan", plan(("grep_search", {"pattern": "port 8080"})))
    llm.default("synthesize", "The server listens on 8080 [1].")
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "crag", "chat"], cwd=tmp_path, env=env,
                          input="What port does it use?\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # on a pipe, stdout holds the answer alone; the banner, prompt and lead go to stderr
    assert proc.stdout.startswith("The server listens on 8080 [1].") and proc.stdout.count("LLM Usage Stats") == 1
    assert "crag> " not in proc.stderr and "you> " not in proc.stderr  # a script sends the questions
    refused = [size for size in llm.prompt_sizes if size[1] + size[2] > 1200]
    assert [node for node, _, _ in refused] == ["synthesize"]  # once: not taken for a refusal to stream
    assert all(r.body.get("stream_options") for r in llm.requests if r.node == "synthesize")
    code, out, err = cli("ask", "--json", "What port does it use?")
    assert code == 0, err
    refit = [e for e in json.loads(out)["audit"] if e["event"] == "context_refit"]
    assert refit == [{"event": "context_refit", "node": "synthesize", "context_tokens": 1200, "server_window": 1200}]


def test_help_and_graph_import_no_heavy_library() -> None:
    for argv in (["--help"], ["graph"]):
        code = (f"import runpy, sys; sys.argv = ['crag', *{argv!r}]\n"
                "try:\n    runpy.run_module('crag', run_name='__main__')\n"
                "except SystemExit:\n    pass\n"
                "print(sorted(m for m in ('openai', 'faiss', 'numpy', 'tiktoken') if m in sys.modules))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
        assert proc.stdout.strip().splitlines()[-1] == "[]", argv


def test_library_api_sync_and_async(llm: FakeOpenAIServer, kb: Path) -> None:
    import asyncio

    from crag import Agent, CragError

    llm.default("analyze_and_route", route("simple", "grep_search"))
    llm.default("plan", plan(("grep_search", {"pattern": "docker compose"})))
    llm.default("synthesize", "Run docker compose up [1].")
    with Agent.from_env(kb=["docs"], dotenv=None) as agent:
        result = agent.ask("How do I deploy?", history=[{"role": "user", "content": "hello"}])
        assert result.citations[0].path == "docs/deploy.md" and result.citations[0].line == 3
        assert result.usage.llm_calls == 3 and result.state.routing_plan.complexity == "simple"
        again = asyncio.run(agent.aask("How do I deploy?"))
        assert again.answer.split("\n---\n")[0] == result.answer.split("\n---\n")[0]
        assert again.trace == result.trace
    with pytest.raises(CragError, match="KB_AGENT_MAX_ITERATIONS"):
        Agent.from_env(dotenv=None, max_iterations=0)


def test_chat_status_line_never_erases_streamed_text() -> None:
    from crag.cli import _Progress
    from crag.events import AnswerStarted, NodeFinished, NodeStarted

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    progress = _Progress(screen, screen)
    progress(NodeStarted("synthesize"))
    progress(AnswerStarted(()))
    progress.chunk("Hello there. ")
    progress(NodeFinished("synthesize"))
    progress.chunk("\n\n---\n" + STATS_HEADING)
    progress.finish()
    shown = screen.getvalue()
    assert "\033[K" not in shown[shown.index("Hello there."):]
    assert shown.count("Hello there.") == 1


def test_chat_fed_by_a_script_writes_no_lead_to_a_terminal_stderr(kb: Path) -> None:
    """A script sends the questions (stdin a pipe) and only stderr is a terminal: the running
    step may show there, but the ``crag>`` lead does not, as the banner and prompts do not
    (docs/cli.md, chat): it was left on stderr before every answer."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, err = io.StringIO(), Terminal()
    code = main(["chat", "--no-usage"], out, err, io.StringIO("Which port does the server listen on?\nAnd backups?\n"))
    assert code == 0 and "8080" in out.getvalue() and out.getvalue().count("Composed offline") == 2
    assert "crag> " not in err.getvalue() and "you> " not in err.getvalue() and "crag chat" not in err.getvalue()


def test_grounded_answer_through_ask_json(llm: FakeOpenAIServer, kb: Path) -> None:
    """A model reply with no markers comes back with markers on the sentences taken from the
    evidence and a footer of exactly those items; a sentence with a date no item holds is
    listed in ``grounding.unsupported`` and marked; every cited line shows the cited text."""
    llm.script("analyze_and_route", route("simple", "vector_search", "grep_search"))
    llm.script("plan", plan(("grep_search", {"pattern": "listens on"}), ("grep_search", {"pattern": "thirty days"})))
    reply = ("Here is what I found:\n\n"
             "The server listens on port 8080 by default. A backup is kept for thirty days.\n"
             "The backup policy was introduced on October 22, 2024.")
    llm.script("synthesize", reply)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "crag", "ask", "What port is used, and how long are backups kept?",
                           "--json"], cwd=kb.parent, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    answer = result["answer"]
    assert answer.startswith("Here is what I found:\n\n"
                             "The server listens on port 8080 by default [1]. A backup is kept for thirty days [2].\n"
                             "The backup policy was introduced on October 22, 2024 [unsupported].")
    assert result["grounding"] == {"sentences": 3, "supported": 2, "unsupported": [
        "The backup policy was introduced on October 22, 2024."], "verdict": "answered"}
    assert "_Note: 1 sentence of this answer is not supported" in answer
    cited = footer(answer)
    assert [(n, path) for n, path, _ in cited] == [(1, "docs/setup.md"), (2, "docs/backup.md")]
    assert [(c["n"], c["path"], c["line"]) for c in result["citations"]] == [(n, p, line) for n, p, line in cited]
    for sentence, (_, path, line) in zip(("The server listens on port 8080", "A backup is kept for thirty days"), cited):
        assert (kb.parent / path).read_text(encoding="utf-8").splitlines()[line - 1].startswith(sentence)
    assert answer.index("[2] docs/backup.md") < answer.index(STATS_HEADING)  # the usage block stays last


def test_a_failed_chat_question_leaves_no_extra_blank_line_between_answers(llm: FakeOpenAIServer,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped, standard output holds the answers with one blank line between two (docs/cli.md,
    chat); a question whose answer failed as it started wrote its blank line all the same."""
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    llm.default("analyze_and_route", route("simple", "grep_search"))
    llm.default("plan", plan(("grep_search", {"pattern": "port 8080"})))
    llm.script("synthesize", "The server listens on 8080 [1].", Status(500), "Set SERVICE_PORT to change the port [1].")
    out, err = io.StringIO(), io.StringIO()
    code = main(["chat", "--no-usage"], out, err, io.StringIO("Which port?\nwhat else?\nHow do I change it?\n"))
    assert code == 0 and err.getvalue().count("crag: error:") == 1, err.getvalue()
    first, second = out.getvalue().split("\n\n[1] docs/setup.md:L7\n")[:2]
    assert first == "The server listens on 8080 [1]."
    assert second.startswith("\nSet SERVICE_PORT") and out.getvalue().count("\n\n\n") == 0, out.getvalue()


def test_what_a_failed_question_cost_says_which_token_counts_crag_estimated(llm, monkeypatch) -> None:
    """A server that reported no usage for a call: the usage block says its counts are crag's
    estimates, but the error line of a question failing later gave them as the server's."""
    from tests.openai_server import NoUsage

    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    llm.default("analyze_and_route", route("simple", "vector_search"))
    llm.default("plan", NoUsage(plan(("vector_search", {"query": "port"}))))
    llm.default("synthesize", Status(500))
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 1 and out == ""
    assert re.search(r"; before it, this question made 2 LLM calls \([\d,]+ tokens, estimated for 1 of 2 calls\)$",
                     err.strip()), err


def test_a_refused_answer_counts_in_what_the_question_cost(llm) -> None:
    """The model declining to answer is a finished reply the server bills: the error line said
    "before it, this question made 2 LLM calls" for three calls paid for."""
    from tests.openai_server import NullContent

    llm.default("analyze_and_route", route("simple", "vector_search"))
    llm.default("plan", plan(("vector_search", {"query": "port"})))
    llm.default("synthesize", NullContent(refusal="I can't help with that."))
    code, out, err = cli("ask", "Which port does the server listen on?")
    assert code == 1 and out == ""
    assert "refusal: I can't help with that." in err  # (a refusal with no usage: counted by crag)
    assert re.search(r"; before it, this question made 3 LLM calls \([\d,]+ tokens, estimated for 1 of 3 calls\)$",
                     err.strip()), err


def test_a_piped_chat_answer_whose_stream_is_cut_leaves_no_fragment_on_standard_output(llm, tmp_path: Path) -> None:
    """Piped, ``chat`` wrote the chunks of an answer whose stream then broke off (no finish, no
    [DONE]) to standard output, a blank line before the next answer, as if it were one."""
    from tests.openai_server import Events

    def piece(delta: dict, finish=None) -> bytes:
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    cut = Events(piece({"role": "assistant", "content": ""}) + piece({"content": "The server listens on port "})
                 + piece({"content": "8080 by default [1]. It also listens"}))
    llm.script("analyze_and_route", route("complex", "grep_search"), route("simple", "grep_search"))
    llm.default("plan", plan(("grep_search", {"pattern": "port 8080"})))
    llm.default("grade_evidence", grades(rest=0.9))
    llm.script("synthesize", cut, "The client retries failed uploads three times [1].")
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "crag", "chat"], cwd=tmp_path, env=env,
                          input="What port does it use?\nHow often do uploads retry?\n", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ended the answer's stream before it was finished" in proc.stderr
    assert "8080" not in proc.stdout and proc.stdout.startswith("The client retries failed uploads three times [1].")


def test_a_question_naming_what_a_tool_that_is_off_would_fetch_gets_a_note(kb: Path) -> None:
    """A URL in the question while KB_AGENT_WEB_FETCH is off was answered from the documents
    alone, with nothing anywhere but --json's audit to say the page was never fetched."""
    for question, note in (
        ("What does https://example.com/notes say about retries?",
         "crag: note: the question names an http(s) URL, but web_fetch is off (set KB_AGENT_WEB_FETCH=on)\n"),
        ("What does OPS-7 say about retries?",
         "crag: note: the question names a Jira key (like ABC-123), but jira_fetch is off (set JIRA_BASE_URL)\n"),
        ("How do uploads retry?", ""),
        # web_fetch refuses such an address: turning it on would fetch nothing
        ("Why does http://localhost:8080/health retry uploads?", ""),
        ("Does https://10.0.0.5/notes say how uploads retry?", ""),
    ):
        code, out, err = cli("ask", "--json", question)
        assert code == 0 and err == note and json.loads(out)["answer"]


def test_a_fetch_that_failed_is_a_note_on_stderr(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Jira that refused the token was "I couldn't find relevant information...", exit
    status 0 and nothing on stderr: the cause was only in --json's audit."""
    from tests.test_tools_remote import FakeServer

    jira = FakeServer({"/rest/api/2/issue/OPS-7": lambda h: (401, {"Content-Type": "application/json"}, b"{}")})
    try:
        monkeypatch.setenv("JIRA_BASE_URL", jira.url)
        monkeypatch.setenv("JIRA_API_TOKEN", "wrong-token")
        note = "crag: note: jira_fetch: Jira refused the request (HTTP 401): check JIRA_EMAIL and JIRA_API_TOKEN\n"
        code, out, err = cli("ask", "What does OPS-7 say about retries?")
        assert code == 0 and err == note and "HTTP 401" not in out
        code, out, err = cli("ask", "--json", "What does OPS-7 say about retries?")
        assert code == 0 and err == note
        assert [e["error"] for e in json.loads(out)["audit"] if e["event"] == "tool_error"] == [note[12:-1]]
        chat_out, chat_err = io.StringIO(), io.StringIO()
        assert main(["chat"], chat_out, chat_err, io.StringIO("What does OPS-7 say?\nHow does the client retry?\n")) == 0
        assert chat_err.getvalue() == note  # after its answer; the next question, which fetches nothing, has none
        assert "three times" in chat_out.getvalue()
    finally:
        jira.close()
