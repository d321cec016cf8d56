"""``python -m crag mcp`` end to end: the MCP SDK's own client drives a real server process over stdio.

The server runs with the offline backend over a small knowledge base indexed for real
(hash embedder, FAISS, SQLite) in a temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.auth_words import auth_word_document, auth_word_lines

ROOT = Path(__file__).resolve().parents[1]

SETUP = """# Setup

Install the service with pip.

## Ports

The server listens on port 8080 by default.
Set `SERVICE_PORT` to change the port the server listens on.
"""

BACKUP = """# Backups

Nightly backups are written to the object store at 02:00 UTC.
A backup is kept for thirty days.
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "setup.md").write_text(SETUP, encoding="utf-8")
    (docs / "backup.md").write_text(BACKUP, encoding="utf-8")
    (tmp_path / "secret.txt").write_text("not in the knowledge base\n", encoding="utf-8")
    return tmp_path


def server_params(workdir: Path, *args: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update(PYTHONPATH=str(ROOT), KB_AGENT_LLM="offline", KB_AGENT_INDEX_DIR=str(workdir / "index"))
    return StdioServerParameters(command=sys.executable, args=["-m", "crag", "mcp", *args], env=env, cwd=str(workdir))


def text_of(result) -> str:
    return "".join(block.text for block in result.content if getattr(block, "type", "") == "text")


def test_mcp_server_lists_and_runs_its_three_tools_and_survives_a_failing_call(workdir: Path) -> None:
    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == {"ask", "search", "read_file"}
            assert set(tools["ask"].input_schema["properties"]) == {"question", "history"}
            assert tools["ask"].input_schema["required"] == ["question"]
            assert set(tools["search"].input_schema["properties"]) == {"query", "top_k"}
            assert set(tools["read_file"].input_schema["properties"]) == {"path", "start_line", "end_line", "page"}

            found = await client.call_tool("search", {"query": "which port does the server listen on", "top_k": 2})
            assert not found.is_error, text_of(found)
            hits = found.structured_content["hits"]
            assert 1 <= len(hits) <= 2
            assert hits[0]["path"] == "docs/setup.md" and set(hits[0]) == {"path", "start_line", "end_line", "score", "text"}
            assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
            assert "docs/setup.md" in text_of(found)

            answer = await client.call_tool("ask", {"question": "Which port does the server listen on?"})
            assert not answer.is_error, text_of(answer)
            assert "8080" in text_of(answer) and "LLM Usage Stats" in text_of(answer)
            data = answer.structured_content
            assert data["citations"] and data["citations"][0]["path"] == "docs/setup.md"
            assert data["usage"]["llm_calls"] == 0 and data["usage"]["model"] == "offline"

            follow_up = await client.call_tool("ask", {
                "question": "and how long is a backup kept?",
                "history": [{"role": "user", "content": "Which port?"}, {"role": "assistant", "content": "8080."}],
            })
            assert not follow_up.is_error and "thirty days" in text_of(follow_up)

            lines = await client.call_tool("read_file", {"path": "docs/setup.md", "start_line": 7, "end_line": 8})
            assert not lines.is_error, text_of(lines)
            assert text_of(lines) == "The server listens on port 8080 by default.\nSet `SERVICE_PORT` to change the port the server listens on."
            assert lines.structured_content == {"path": "docs/setup.md", "start_line": 7, "end_line": 8,
                                                "text": text_of(lines)}

            outside = await client.call_tool("read_file", {"path": str(workdir / "secret.txt")})
            assert outside.is_error
            message = text_of(outside)
            assert "read_file" in message and "\n" not in message and "not in the knowledge base" not in message

            empty = await client.call_tool("ask", {"question": "   "})
            assert empty.is_error and "empty" in text_of(empty)

            for name, args, field in (("search", {"query": "port", "top_k": "lots"}, "top_k"),
                                      ("ask", {}, "question"), ("ask", {"question": "hi", "history": "x"}, "history")):
                wrong = await client.call_tool(name, args)  # refused by the schema: still one line
                assert wrong.is_error and field in text_of(wrong) and "\n" not in text_of(wrong), text_of(wrong)

            again = await client.call_tool("search", {"query": "nightly backups"})
            assert not again.is_error and again.structured_content["hits"][0]["path"] == "docs/backup.md"

    anyio.run(session)


def test_a_boolean_is_no_integer_argument_and_every_error_names_its_tool_once(workdir: Path) -> None:
    """``top_k: true`` searched for one hit (a bool is an int in Python), and failing calls read
    ``Error executing tool read_file: read_file: no file ...``: each error is one line that
    names the tool once."""

    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            for name, args, text in (
                ("search", {"query": "port", "top_k": True}, "search: top_k: Input should be a valid integer, not true"),
                ("search", {"query": "port", "top_k": False}, "search: top_k: Input should be a valid integer, not false"),
                ("read_file", {"path": "docs/setup.md", "start_line": True},
                 "read_file: start_line: Input should be a valid integer, not true"),
                ("read_file", {"path": "docs/setup.md", "end_line": False},
                 "read_file: end_line: Input should be a valid integer, not false"),
                ("read_file", {"path": "docs/setup.md", "page": True},
                 "read_file: page: Input should be a valid integer, not true"),
                ("read_file", {"path": "docs/nowhere.md"}, "read_file: no file docs/nowhere.md in the knowledge base"),
                ("search", {"query": "port", "top_k": 0}, "search: top_k must be at least 1, got 0"),
                ("search", {"query": "port", "top_k": 2.5},
                 "search: top_k: Input should be a valid integer, got a number with a fractional part"),
                ("ask", {"question": "   "}, None),
            ):
                got = await client.call_tool(name, args)
                assert got.is_error, (name, args, text_of(got))
                message = text_of(got)
                assert "\n" not in message and message.count(name) == 1 and "Error executing" not in message, message
                assert text is None or message == text, message
            fine = await client.call_tool("search", {"query": "port", "top_k": 1})
            assert not fine.is_error and len(fine.structured_content["hits"]) == 1
            # a number with no fraction is a count however it is written: 1e30 asks for 50 as 10**30 does
            for top_k in (1.0, 1e30, 10**30):
                many = await client.call_tool("search", {"query": "port", "top_k": top_k})
                assert not many.is_error, (top_k, text_of(many))

    anyio.run(session)


def test_ask_history_schema_names_role_and_content_and_takes_messages_as_crag_ask_does(workdir: Path) -> None:
    """``history``'s items were published as any object of strings, so an agent reading the
    schema could not know a turn needs ``role`` and ``content``; and a turn carrying a field
    that is not a string (an OpenAI message's ``"name": null``, say), which ``crag ask
    --history`` reads, was refused (``history.0.name: Input should be a valid string``)."""

    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            ask = next(tool for tool in (await client.list_tools()).tools if tool.name == "ask")
            history = ask.input_schema["properties"]["history"]
            (items,) = [part["items"] for part in history["anyOf"] if part.get("type") == "array"]
            if "$ref" in items:
                items = ask.input_schema["$defs"][items["$ref"].rsplit("/", 1)[-1]]
            assert items["type"] == "object" and sorted(items["required"]) == ["content", "role"]
            assert items["properties"]["role"]["enum"] == ["user", "assistant"]
            assert items["properties"]["content"]["type"] == "string"

            turns = [{"role": "user", "content": "Which port?", "name": None},
                     {"role": "assistant", "content": "8080.", "tool_calls": [], "refusal": None}]
            follow_up = await client.call_tool("ask", {"question": "and how long is a backup kept?", "history": turns})
            assert not follow_up.is_error and "thirty days" in text_of(follow_up), text_of(follow_up)

            for turn, text in (({"role": "system", "content": "x"}, "ask: history.0.role: Input should be 'user' or 'assistant'"),
                               ({"role": "user"}, "ask: history.0.content: Field required"),
                               ({"role": "user", "content": 5}, "ask: history.0.content: Input should be a valid string")):
                wrong = await client.call_tool("ask", {"question": "hi", "history": [turn]})
                assert wrong.is_error and text_of(wrong) == text, text_of(wrong)

    anyio.run(session)


def test_mcp_search_returns_at_most_50_hits_as_crag_search_does(workdir: Path) -> None:
    """MCP ``search`` runs the search ``crag search`` and ``Agent.search`` run: a ``top_k`` above
    50 gets 50 hits (it was refused: "must be between 1 and 50, got 500"), one below 1 is refused."""
    for n in range(60):
        (workdir / "docs" / f"part{n:02}.md").write_text(f"# Part {n}\n\nThe gearbox part {n} is bolted on.\n",
                                                        encoding="utf-8")

    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            many = await client.call_tool("search", {"query": "gearbox part", "top_k": 500})
            assert not many.is_error, text_of(many)
            hits = many.structured_content["hits"]
            assert len(hits) == 50 and all(h["path"].startswith("docs/part") for h in hits)
            assert text_of(many).count("docs/part") == 50
            none = await client.call_tool("search", {"query": "gearbox part", "top_k": 0})
            assert none.is_error and "top_k must be at least 1, got 0" in text_of(none), text_of(none)
            assert "\n" not in text_of(none)

    anyio.run(session)


def test_a_pdf_place_is_a_page_and_lines_on_that_page_in_every_tool(workdir: Path) -> None:
    """``ask`` cites p2:L2; ``search`` gives page 2, lines 1-3; ``read_file`` takes page 2 and
    line 2 back to the same sentence (it gave page 1 for start_line 1 and search said 1001)."""
    pytest.importorskip("pypdf", reason="the pdf extra (make install has it)")
    from tests.test_readers import make_pdf

    make_pdf(workdir / "docs" / "guide.pdf", [
        ["Widget guide", "An introduction to the widget."],
        ["Installation steps follow.", "The widget needs a torque wrench.", "Tighten every flange to forty newton metres."],
    ])

    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            found = await client.call_tool("search", {"query": "torque wrench flange newton", "top_k": 3})
            hit = next(h for h in found.structured_content["hits"] if h["path"] == "docs/guide.pdf")
            assert (hit["page"], hit["start_line"], hit["end_line"]) == (2, 1, 3)
            assert "docs/guide.pdf:p2:L1-L3" in text_of(found)

            answer = await client.call_tool("ask", {"question": "Which torque wrench does the widget need?"})
            cited = [c for c in answer.structured_content["citations"] if c["path"] == "docs/guide.pdf"]
            assert cited and (cited[0]["page"], cited[0]["line"]) == (2, 2)

            line = await client.call_tool("read_file", {"path": "docs/guide.pdf", "page": 2, "start_line": 2, "end_line": 2})
            assert not line.is_error, text_of(line)
            assert line.structured_content == {"path": "docs/guide.pdf", "page": 2, "start_line": 2, "end_line": 2,
                                               "text": "The widget needs a torque wrench."}
            page = await client.call_tool("read_file", {"path": "docs/guide.pdf", "page": 2})
            assert (page.structured_content["start_line"], page.structured_content["end_line"]) == (1, 3)
            first = await client.call_tool("read_file", {"path": "docs/guide.pdf", "start_line": 1})
            assert first.structured_content["page"] == 1 and text_of(first).startswith("Widget guide")
            for args, why in (({"page": 3}, "has 2 pages; page 3 is past the end"),
                              ({"page": 2, "start_line": 4}, "page 2 of docs/guide.pdf has 3 lines; start_line 4")):
                wrong = await client.call_tool("read_file", {"path": "docs/guide.pdf", **args})
                assert wrong.is_error and why in text_of(wrong), text_of(wrong)
            no_pages = await client.call_tool("read_file", {"path": "docs/setup.md", "page": 1})
            assert no_pages.is_error and "has no pages" in text_of(no_pages)

    anyio.run(session)


def test_structured_paths_are_the_files_own_names_and_the_text_their_display_form(workdir: Path) -> None:
    """``search``, ``ask`` and ``read_file`` gave ``a<newline>b.md`` in structured content as
    ``a\\nb.md``, the name of another file: a client reading the path back read the other
    file. Their text content, shown to a person, keeps the escaped form."""
    (workdir / "docs" / "a\nb.md").write_text("The first file says the lemming runs.\n", encoding="utf-8")
    (workdir / "docs" / "a\\nb.md").write_text("The second file says the lemming swims.\n", encoding="utf-8")
    names = {"docs/a\nb.md", "docs/a\\nb.md"}

    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            found = await client.call_tool("search", {"query": "what does the lemming do", "top_k": 3})
            hits = [h for h in found.structured_content["hits"] if "lemming" in h["text"]]
            assert {h["path"] for h in hits} == names
            assert text_of(found).count("docs/a\\nb.md:L1-L1") == 2 and "docs/a\n" not in text_of(found)
            answer = await client.call_tool("ask", {"question": "what does the lemming do?"})
            assert {c["path"] for c in answer.structured_content["citations"]} == names
            assert "docs/a\n" not in answer.structured_content["answer"]
            for hit in hits:  # a path read back is the file it names
                read = await client.call_tool("read_file", {"path": hit["path"]})
                assert read.structured_content["path"] == hit["path"] and text_of(read) == hit["text"]

    anyio.run(session)


def test_mcp_tools_redact_configured_secrets_only(workdir: Path) -> None:
    key = "sk-mcp-Secret-0123456789"
    (workdir / "docs" / "leak.md").write_text(
        f"# Leak\n\nThe deploy key is {key} for the deploy job.\n"
        "The deploy database is postgresql://deployer:Hunter2Pw@db.internal/deploy for the deploy job.\n",
        encoding="utf-8",
    )
    params = server_params(workdir, "--kb", "docs")
    params.env["OPENAI_API_KEY"] = key  # a configured secret (the backend stays offline)

    async def session() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            calls = [("search", {"query": "deploy key database"}), ("ask", {"question": "What is the deploy key?"}),
                     ("read_file", {"path": "docs/leak.md"})]
            for name, args in calls:
                got = await client.call_tool(name, args)
                assert not got.is_error, text_of(got)
                shown = text_of(got) + repr(got.structured_content)
                assert "deploy" in shown and "***" in shown, name
                assert key not in shown, name
            # The document's own credential-shaped text is the user's data, shown as written.
            got = await client.call_tool("read_file", {"path": "docs/leak.md"})
            assert "postgresql://deployer:Hunter2Pw@db.internal/deploy" in text_of(got)

    anyio.run(session)


def test_mcp_without_the_sdk_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    # A Python in which the SDK cannot be found.
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name.split('.')[0] in ('mcp', 'mcp_types') else real(name, *a)\n"
        "from crag.cli import main\n"
        "sys.exit(main(['mcp']))\n"
    )
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "crag: error: the MCP server needs the optional extra: pip install 'crag-kb[mcp]' (make install includes it)"
    )
    assert proc.stdout == ""




@pytest.mark.parametrize("index_first", [True, False])
def test_an_embedder_setting_that_cannot_work_stops_the_server_at_its_start(workdir: Path, index_first: bool) -> None:
    """``KB_AGENT_EMBEDDER=openai`` with no key or server: ``ask``, ``search`` and ``chat`` stop at
    once (exit 2, one line); ``crag mcp`` started, answered ``initialize``, and failed every call."""
    import subprocess

    params = server_params(workdir)
    if index_first:
        indexed = subprocess.run([sys.executable, "-m", "crag", "index", "docs"], cwd=workdir, env=params.env,
                                 capture_output=True, text=True, timeout=60)
        assert indexed.returncode == 0, indexed.stderr
    env = {**params.env, "KB_AGENT_EMBEDDER": "openai"}
    hello = ('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
             '"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n')
    proc = subprocess.run([sys.executable, "-m", "crag", "mcp"], cwd=workdir, env=env, input=hello,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("crag: error: KB_AGENT_EMBEDDER=openai is not valid") and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("uri, psycopg, said", [
    ("postgresql://crag:Hunter2Pw@127.0.0.1:9/kb", False, "a PostgreSQL one needs psycopg, pip install 'crag-kb[postgres]'"),
    ("postgresql://crag:Hunter2Pw@127.0.0.1:9/kb?sslmode=bogus", True, "a postgresql:// URI"),
])
def test_a_store_setting_that_cannot_work_stops_the_server_at_its_start(workdir: Path, uri: str, psycopg: bool,
                                                                          said: str) -> None:
    """A ``postgresql://`` store without the postgres extra, or with a URI libpq refuses, stops
    ``ask`` and ``chat`` (exit 2, one line); ``crag mcp`` started and failed every call with it."""
    import subprocess

    if psycopg:
        pytest.importorskip("psycopg", reason="the postgres extra (make install has it)")
    code = ("import sys\n" + ("" if psycopg else "sys.modules['psycopg'] = None  # not installed\n")
            + "from crag.cli import main\nsys.exit(main(['mcp']))\n")
    env = {**server_params(workdir).env, "KB_AGENT_STORE": uri}
    hello = ('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
             '"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n')
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env, input=hello,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("crag: error: KB_AGENT_STORE=postgresql://crag@127.0.0.1:9/kb")
    assert said in proc.stderr and proc.stderr.count("\n") == 1 and "Hunter2Pw" not in proc.stderr

def test_mcp_prints_documents_with_auth_words_unchanged(workdir: Path) -> None:
    document = auth_word_document()
    (workdir / "docs" / "auth.md").write_text(document, encoding="utf-8")

    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            found = await client.call_tool("search", {"query": "basic bearer token", "top_k": 20})
            assert not found.is_error and "***" not in text_of(found)
            assert all(hit["text"] in document for hit in found.structured_content["hits"])
            got = await client.call_tool("read_file", {"path": "docs/auth.md", "start_line": 1, "end_line": 200})
            assert not got.is_error and got.structured_content["text"] in document
            answer = await client.call_tool("ask", {"question": auth_word_lines()[0]})
            assert not answer.is_error and "***" not in text_of(answer)

    anyio.run(session)


def test_mcp_search_text_is_the_list_crag_search_prints_without_a_documents_escapes(workdir: Path) -> None:
    """``search``'s text content is the ranked list ``crag search`` prints (docs/mcp.md), shown to
    a person; it carried a document's escape sequences (a window title, a clipboard write, a
    cleared screen) and bidirectional overrides as they are, which ``crag search`` leaves out.
    The hits keep the document's text as it is."""
    hostile = ("The quokka relay retitles \x1b]0;owned\x07 windows, writes \x1b]52;c;ZWNobw==\x1b\\ clipboards,\n"
               "clears \x1b[2J\x1b[H screens and reverses \u202eeht\u202c text; C1 \x9b31m too.\n")
    (workdir / "docs" / "quokka.md").write_text(hostile, encoding="utf-8")

    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            found = await client.call_tool("search", {"query": "quokka relay", "top_k": 1})
            assert not found.is_error, text_of(found)
            assert found.structured_content["hits"][0]["text"] == hostile.rstrip("\n")
            text = text_of(found)
            assert "docs/quokka.md:L1-L2" in text and "The quokka relay retitles" in text, text
            assert not any(c in text for c in "\x1b\x07\x9b\u202e\u202c"), repr(text)

    anyio.run(session)


def _slow_llm_params(workdir: Path, srv) -> StdioServerParameters:
    params = server_params(workdir, "--kb", "docs")
    params.env.update(KB_AGENT_LLM="openai", OPENAI_BASE_URL=srv.base_url, OPENAI_API_KEY="sk-test",
                      KB_AGENT_LLM_TIMEOUT="60", KB_AGENT_LLM_MAX_RETRIES="3")
    return params


def test_a_cancelled_ask_frees_the_server(workdir: Path) -> None:
    # After notifications/cancelled for an ask waiting on a slow model, a read_file waited 29 s
    # (with the defaults about four minutes): the abandoned call held the server.
    import time

    from tests.openai_server import Delay, FakeOpenAIServer

    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", Delay(120, "{}"))
        params = _slow_llm_params(workdir, srv)

        async def session() -> None:
            async with Client(params, read_timeout_seconds=120) as client:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "ask", {"question": "Which port does the server listen on?"})
                    while not srv.requests:  # the ask is waiting on the model
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()  # the client sends notifications/cancelled
                started = time.monotonic()
                got = await client.call_tool("read_file", {"path": "docs/setup.md"})
                assert not got.is_error and "8080" in text_of(got)
                # a held server would answer after the model's 60 s timeout at the soonest; the
                # bound is loose so a loaded machine cannot fail it (within a second when measured)
                assert time.monotonic() - started < 20.0
                await anyio.sleep(0.5)
                assert srv.calls() == 1  # the cancelled ask stopped: no retry was sent

        anyio.run(session)


def test_a_slow_ask_never_holds_other_calls(workdir: Path) -> None:
    import time

    from tests.openai_server import Delay, FakeOpenAIServer

    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", Delay(120, "{}"))
        params = _slow_llm_params(workdir, srv)

        async def session() -> None:
            async with Client(params, read_timeout_seconds=120) as client, anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "ask", {"question": "Which port does the server listen on?"})
                while not srv.requests:
                    await anyio.sleep(0.05)
                started = time.monotonic()
                found = await client.call_tool("search", {"query": "nightly backups"})
                assert not found.is_error and time.monotonic() - started < 20.0  # held: >= 60 s
                tg.cancel_scope.cancel()

        anyio.run(session)


def test_a_finished_ask_is_answered_while_more_asks_wait_for_a_thread(workdir: Path) -> None:
    """An answer the model had given waited for a worker thread to add it to the answer log,
    queued behind asks that had not started yet, so it reached its client only once enough
    asks held by a slow model had ended (their timeout, then their retries)."""
    import threading
    import time

    from tests.fakes import route
    from tests.openai_server import Delay, FakeOpenAIServer

    released = threading.Event()

    def held(body):  # the first ask's reply, once the others fill every ask thread and queue
        released.wait(60)
        return route("chitchat")

    with FakeOpenAIServer() as srv:
        srv.script("analyze_and_route", held)
        srv.default("analyze_and_route", Delay(120, route("chitchat")))
        srv.default("synthesize", "Hello! Ask me about the documents.")
        params = _slow_llm_params(workdir, srv)

        async def session() -> None:
            async with Client(params, read_timeout_seconds=120) as client, anyio.create_task_group() as tg:
                done = anyio.Event()

                async def first() -> None:
                    got = await client.call_tool("ask", {"question": "hello there"})
                    assert not got.is_error and "Hello!" in text_of(got), text_of(got)
                    done.set()

                tg.start_soon(first)
                while not srv.requests:
                    await anyio.sleep(0.05)
                for n in range(43):  # 40 threads: the first ask and 39 more hold them, 4 wait
                    tg.start_soon(client.call_tool, "ask", {"question": f"hello {n}"})
                while len(srv.requests) < 40:
                    await anyio.sleep(0.05)
                await anyio.sleep(1.0)  # the 4 others are queued for a thread
                started = time.monotonic()
                released.set()
                with anyio.fail_after(30):  # held: until 4 slow asks end, >= 60 s
                    await done.wait()
                assert time.monotonic() - started < 20.0
                tg.cancel_scope.cancel()

        anyio.run(session)


def test_searches_waiting_on_a_slow_embeddings_server_never_hold_a_read_file(workdir: Path) -> None:
    """Searches and reads took their worker threads from one pool of 40: 40 searches waiting on
    an embeddings server that does not answer held every one, and a read_file, which needs no
    server, waited as long as they did (the server's timeout, then its retries)."""
    import time

    from tests.openai_server import Delay, FakeOpenAIServer

    with FakeOpenAIServer(embedding_dim=1536) as srv:
        params = server_params(workdir, "--kb", "docs")
        params.env.update(KB_AGENT_EMBEDDER="openai", OPENAI_BASE_URL=srv.base_url, OPENAI_API_KEY="sk-test",
                          KB_AGENT_LLM_TIMEOUT="60")

        async def session() -> None:
            async with Client(params, read_timeout_seconds=120) as client, anyio.create_task_group() as tg:
                indexed = len(srv.requests)  # the --kb indexing's embeddings
                srv.default("embeddings", Delay(120, None))
                for n in range(40):
                    tg.start_soon(client.call_tool, "search", {"query": f"backups {n}"})
                while len(srv.requests) < indexed + 40:  # every search is waiting on the server
                    await anyio.sleep(0.05)
                started = time.monotonic()
                got = await client.call_tool("read_file", {"path": "docs/setup.md", "end_line": 1})
                assert not got.is_error and text_of(got) == "# Setup"
                assert time.monotonic() - started < 20.0  # held: >= 60 s; within a second when measured
                tg.cancel_scope.cancel()

        anyio.run(session)


# A client's first lines, written raw to the server's stdin, and an ask it then sends.
_HANDSHAKE = (
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
)
_ASK_CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ask", "arguments": {
    "question": "Which port does the server listen on?"}}}


def _raw_server(workdir: Path, srv) -> subprocess.Popen[bytes]:
    """``crag mcp`` on ``srv`` (a slow model), its three streams pipes a test writes and reads."""
    params = _slow_llm_params(workdir, srv)
    return subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_closed_stdin_ends_the_server_promptly_with_a_call_in_flight(workdir: Path) -> None:
    import json
    import time

    from tests.openai_server import Delay, FakeOpenAIServer

    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", Delay(120, "{}"))
        proc = _raw_server(workdir, srv)
        lines = [*_HANDSHAKE, _ASK_CALL]
        try:
            for line in lines:
                proc.stdin.write(json.dumps(line).encode() + b"\n")
                proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1
            deadline = time.monotonic() + 60
            while not srv.requests and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.requests
            proc.stdin.close()
            # The model would keep the call for 120 s and crag would wait 60 s a try: a server that
            # waited for the call would still be running. The bound is loose so that a loaded
            # machine cannot fail it (promptness is measured by hand, docs/mcp.md).
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("ask_in_flight", [False, True])
def test_ctrl_c_ends_the_server_at_once_with_exit_status_130(workdir: Path, ask_in_flight: bool) -> None:
    """docs/cli.md: Ctrl-C ends a run with ``crag: interrupted`` and exit status 130, and
    ``crag mcp`` ends at once, as on SIGTERM. SIGINT was raised as ``KeyboardInterrupt``, which
    waited for the thread reading stdin: the server ran on until the client wrote a line or
    closed stdin (in a terminal, until Enter)."""
    import json
    import signal
    import time

    from tests.openai_server import Delay, FakeOpenAIServer

    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", Delay(120, "{}"))
        proc = _raw_server(workdir, srv)
        lines = [*_HANDSHAKE, _ASK_CALL] if ask_in_flight else list(_HANDSHAKE)
        try:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            for line in lines:
                proc.stdin.write(json.dumps(line).encode() + b"\n")
                proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1
            deadline = time.monotonic() + 60
            while ask_in_flight and not srv.requests and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.requests or not ask_in_flight
            proc.send_signal(signal.SIGINT)  # stdin stays open, and nothing more is sent
            assert proc.wait(timeout=30) == 130  # loose bound for a loaded machine: at once when measured
            assert proc.stderr.read().decode().endswith("\ncrag: interrupted\n")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_sigterm_while_kb_is_indexed_stops_as_crag_index_stops(workdir: Path) -> None:
    """docs/cli.md: SIGTERM while the documents of ``--kb`` are read stops the reading, publishes
    nothing and lets the index lock go, with ``crag: terminated`` and exit status 143, as for
    ``crag index``. ``crag mcp`` took the signal's default from its start, so it was killed
    mid-indexing: no line, and its LOCK and a partial generation were left in the index folder."""
    import signal
    import subprocess
    import time

    many = workdir / "many"
    many.mkdir()
    for i in range(1500):  # about two seconds of reading
        lines = "".join(f"Line {j} of note {i}: the harbor valve {i * j} opens.\n" for j in range(40))
        (many / f"n{i:04d}.md").write_text(f"# Note {i}\n\n{lines}", encoding="utf-8")
    params = server_params(workdir, "--kb", "many")
    index = workdir / "index"
    proc = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not list(index.glob("gen-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None and list(index.glob("gen-*")), "the indexing never started"
        proc.send_signal(signal.SIGTERM)  # while the files are read: the server is not serving yet
        assert proc.wait(timeout=30) == 143
        assert proc.stderr.read().decode().endswith("crag: terminated\n")
        assert sorted(p.name for p in index.iterdir()) == []  # no LOCK, no partial generation
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_sigterm_ends_the_serving_server_at_once(workdir: Path) -> None:
    """docs/mcp.md: SIGTERM (how a client stops its server) ends a serving ``crag mcp`` at once,
    by the signal's default action, whatever it was doing."""
    import json
    import signal
    import subprocess

    params = server_params(workdir, "--kb", "docs")
    proc = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    try:
        proc.stdin.write(json.dumps(hello).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        proc.send_signal(signal.SIGTERM)  # stdin stays open
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert "crag: terminated" not in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_line_that_is_not_json_rpc_gets_an_error_reply(workdir: Path) -> None:
    import json
    import subprocess

    params = server_params(workdir)
    proc = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    try:
        proc.stdin.write(json.dumps(hello).encode() + b"\nnot json at all\n" + b'{"jsonrpc": "2.0", "id": 5}\n')
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        assert json.loads(proc.stdout.readline()) == {
            "jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error: not a JSON-RPC message"}}
        assert json.loads(proc.stdout.readline())["error"]["code"] == -32600
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_call_holding_a_lone_surrogate_is_answered_under_its_id(workdir: Path) -> None:
    """JSON that escapes half of a surrogate pair (``"\\ud83d"``: what JavaScript's
    ``JSON.stringify`` writes for a string cut inside an emoji) is valid JSON that the SDK's
    parser refuses: the call was answered as a parse error with ``id`` null, which no client
    matches to its call, so the client waited until its timeout. It is read as crag reads
    text that is not UTF-8 elsewhere (a U+FFFD in its place) and answered."""
    import json
    import subprocess

    params = server_params(workdir, "--kb", "docs")
    proc = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    call = ('{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search", '
            '"arguments": {"query": "which port does the server listen on \\ud83d"}}}')
    try:
        proc.stdin.write(json.dumps(hello).encode() + b"\n" + b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n'
                         + call.encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        reply = json.loads(proc.stdout.readline())
        assert reply["id"] == 7 and "error" not in reply, reply
        assert reply["result"]["structuredContent"]["hits"][0]["path"] == "docs/setup.md"
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_mcp_tools_have_output_schemas_read_only_hints_and_descriptions_from_the_environment(workdir: Path) -> None:
    from crag.config import config_warnings
    from crag.mcp_server import description_variable

    params = server_params(workdir, "--kb", "docs")
    params.env["KB_AGENT_MCP_SEARCH_DESCRIPTION"] = "Search the runbooks of the payments team."

    async def session() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            capabilities = client.server_capabilities
            assert capabilities.tools is not None
            assert capabilities.resources is None and capabilities.prompts is None  # nothing empty advertised
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            for tool in tools.values():
                assert tool.annotations.read_only_hint is True and tool.annotations.destructive_hint is False
                assert tool.output_schema and tool.output_schema["type"] == "object"
            assert tools["search"].description == "Search the runbooks of the payments team."
            named = {description_variable(name): "text" for name in tools}  # names crag warns about never
            assert config_warnings(environ=named, dotenv=None) == []
            assert tools["ask"].description.startswith("Answer a question from the knowledge base")
            assert {"answer", "body", "citations", "usage"} <= set(tools["ask"].output_schema["properties"])
            assert tools["search"].output_schema["required"] == ["hits"]
            answer = await client.call_tool("ask", {"question": "Which port does the server listen on?"})
            assert not answer.is_error and "LLM Usage Stats" not in answer.structured_content["body"]
            # The schema describes everything the structured content holds (judgements included).
            assert set(answer.structured_content) <= set(tools["ask"].output_schema["properties"])

    anyio.run(session)
    log = workdir / "index" / "log.sqlite"  # the MCP ask is in the answer log
    assert log.is_file()


def test_a_description_that_is_not_utf8_is_one_line_naming_its_variable(workdir: Path) -> None:
    import subprocess

    params = server_params(workdir, "--kb", "docs")
    env = {os.fsencode(k): os.fsencode(v) for k, v in params.env.items()}
    env[b"KB_AGENT_MCP_ASK_DESCRIPTION"] = b"caf\xe9 docs"  # as a shell's $'caf\xe9 docs' sets it
    proc = subprocess.run([sys.executable, *params.args], env=env, cwd=workdir, capture_output=True, timeout=120,
                          input=b"")
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("crag: error: KB_AGENT_MCP_ASK_DESCRIPTION=caf\\xe9 docs")
    assert "UTF-8" in err and proc.stdout == b""


def test_a_log_note_with_standard_error_closed_never_reaches_the_protocol_stream(workdir: Path) -> None:
    """``crag mcp 2>&-`` with an answer log it cannot write: its note was printed to standard
    output (Python prints to sys.stdout when sys.stderr is None), in the middle of the JSON-RPC
    stream, and the client lost the answer."""
    index = workdir / "index"
    base = server_params(workdir, "--kb", "docs")
    index.mkdir()
    (index / "log.sqlite").mkdir()  # a log that is a folder: every ask has a note to say
    params = StdioServerParameters(command="sh", args=["-c", 'exec "$0" "$@" 2>&-', base.command, *base.args],
                                   env=base.env, cwd=base.cwd)

    async def session() -> None:
        with anyio.fail_after(60):
            async with Client(params, read_timeout_seconds=60) as client:
                answer = await client.call_tool("ask", {"question": "Which port does the server listen on?"})
                assert not answer.is_error and "8080" in text_of(answer), text_of(answer)
                again = await client.call_tool("search", {"query": "nightly backups"})
                assert not again.is_error

    anyio.run(session)


def test_a_client_that_closes_the_servers_stdout_ends_it_though_it_writes_nothing_more(workdir: Path) -> None:
    """docs/mcp.md: a client that stops reading ends the server, with exit status 141. The
    server went on until the client wrote again (the thread reading stdin cannot be stopped),
    holding its index and its threads for a client that was gone."""
    import json
    import subprocess

    params = server_params(workdir, "--kb", "docs")
    proc = subprocess.Popen([sys.executable, "-m", "crag", "mcp", "--kb", "docs"], cwd=workdir, env=params.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}) + "\n").encode())
        proc.stdin.flush()
        assert b'"id":1' in proc.stdout.readline()
        proc.stdout.close()  # stdin stays open, and nothing more is sent
        assert proc.wait(timeout=30) == 141
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_client_that_stops_reading_ends_the_server_without_a_traceback(workdir: Path) -> None:
    """A client that closes its end of the server's standard output (it crashed, or gave up)
    while stdin stays open: the next reply hit a broken pipe, and the server ended with
    an exception group's traceback of some 60 lines on stderr, which a client's log shows."""
    import json
    import subprocess
    import time

    params = server_params(workdir, "--kb", "docs")
    proc = subprocess.Popen([sys.executable, "-m", "crag", "mcp", "--kb", "docs"], cwd=workdir, env=params.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def send(message: dict) -> None:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(message) + "\n").encode())
            proc.stdin.flush()

        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert proc.stdout is not None and b'"id":1' in proc.stdout.readline()
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        proc.stdout.close()
        for n in range(2, 12):
            try:
                send({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                      "params": {"name": "search", "arguments": {"query": "port"}}})
            except BrokenPipeError:  # the server is gone
                break
            time.sleep(0.3)
        proc.wait(timeout=30)
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        assert "Traceback" not in stderr and proc.returncode in (0, 141), (proc.returncode, stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_mcp_search_says_when_a_root_of_the_index_is_gone_from_disk(workdir: Path) -> None:
    """With a root of the index gone from disk, ``crag search`` notes on stderr that it is left
    out of the search, but MCP ``search`` said only "no matching chunks": an agent took the
    knowledge base for one without the answer."""
    import subprocess

    params = server_params(workdir)
    built = subprocess.run([params.command, "-m", "crag", "index", "docs"], env=params.env, cwd=params.cwd,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    (workdir / "docs").rename(workdir / "moved")

    async def session() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            found = await client.call_tool("search", {"query": "nightly backups"})
            assert not found.is_error and found.structured_content == {"hits": []}
            assert text_of(found).startswith("no matching chunks\n")
            assert "crag: note: docs no longer exists on disk and is left out of the search" in text_of(found)
            # typed in a shell without the client's KB_AGENT_INDEX_DIR, `python -m crag index` would build ./.crag
            index = workdir / "index"
            assert (f"the next `python -m crag --index {index} index` drops it "
                    f"(or `python -m crag --index {index} roots --remove PATH`)") in text_of(found)

    anyio.run(session)


def test_a_kb_root_deleted_while_the_server_runs_is_left_out_with_the_note(workdir: Path) -> None:
    """``crag mcp --kb docs --kb notes`` with notes deleted while it ran: its file was still
    found and cited with no note, and ``read_file`` of the citation then said there is no such
    file; without ``--kb`` the same root is left out with the note."""
    import shutil

    (workdir / "notes").mkdir()
    (workdir / "notes" / "api.md").write_text("The api server listens on port 9191.\n", encoding="utf-8")
    params = server_params(workdir, "--kb", "docs", "--kb", "notes")

    async def session() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            shutil.rmtree(workdir / "notes")
            found = await client.call_tool("search", {"query": "which port does the api server listen on"})
            assert not found.is_error and found.structured_content is not None
            assert [h["path"] for h in found.structured_content["hits"] if h["path"].startswith("notes/")] == []
            assert "crag: note: notes no longer exists on disk and is left out of the search" in text_of(found)

    anyio.run(session)


def test_an_ask_that_fails_after_calls_it_paid_for_says_what_they_cost(workdir: Path) -> None:
    # The command line's error line ends with the calls already made; the MCP error did not.
    from tests.openai_server import FakeOpenAIServer, Status

    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", '{"complexity": "simple", "suggested_tools": ["vector_search"]}')
        srv.default("plan", '{"tool_calls": []}')
        srv.default("synthesize", Status(400, "bad request"))
        params = _slow_llm_params(workdir, srv)
        params.env.update(KB_AGENT_LLM_MAX_RETRIES="0")

        async def session() -> None:
            async with Client(params, read_timeout_seconds=60) as client:
                got = await client.call_tool("ask", {"question": "Which port does the server listen on?"})
                assert got.is_error and "answered 400 for node synthesize" in text_of(got), text_of(got)
                assert "; before it, this question made 2 LLM calls (" in text_of(got), text_of(got)

        anyio.run(session)


def test_the_command_a_tool_error_suggests_builds_the_index_the_server_reads(workdir: Path) -> None:
    """With no index, every tool said "run `python -m crag index PATH` first": typed in a shell,
    which has not the client's KB_AGENT_INDEX_DIR, that builds ./.crag, not the server's index."""
    params = server_params(workdir)

    async def session() -> None:
        async with Client(params, read_timeout_seconds=60) as client:
            for tool, args in (("search", {"query": "backups"}), ("ask", {"question": "When do backups run?"})):
                got = await client.call_tool(tool, args)
                assert got.is_error, text_of(got)
                assert f"run `python -m crag --index {workdir / 'index'} index PATH` first" in text_of(got), text_of(got)

    anyio.run(session)


def test_the_command_a_failed_kb_indexing_suggests_builds_the_index_the_server_reads(workdir: Path) -> None:
    """``crag mcp --kb docs`` over an index built with another embedder stopped with "run
    `python -m crag index docs` to re-index": typed in a shell without the client's
    KB_AGENT_INDEX_DIR, that builds ./.crag, and the server fails again as it did."""
    from tests.openai_server import FakeOpenAIServer

    env = server_params(workdir).env
    with FakeOpenAIServer(embedding_dim=1536) as srv:
        built = subprocess.run([sys.executable, "-m", "crag", "index", "docs"], cwd=workdir, capture_output=True,
                               text=True, timeout=60, env={**env, "KB_AGENT_EMBEDDER": "openai",
                                                           "OPENAI_BASE_URL": srv.base_url, "OPENAI_API_KEY": "sk-test"})
    assert built.returncode == 0, built.stderr
    proc = subprocess.run([sys.executable, "-m", "crag", "mcp", "--kb", "docs"], cwd=workdir, env=env, input="",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("crag: error: index was built with openai:") and proc.stderr.count("\n") == 1
    assert proc.stderr.endswith(f"run `python -m crag --index {workdir / 'index'} index docs` to re-index\n")


@pytest.mark.parametrize("folder", ["/srv/kb\\g<1>index", "/srv/kb\\1x", "/srv/my kb/.crag", "/srv/it's/.crag"])
def test_the_suggested_command_takes_any_index_folder_name(folder: str) -> None:
    """An index folder whose name held a backslash made every such tool error a traceback
    (``re.error``: the folder's name was read as a regular expression's replacement)."""
    import shlex

    from crag.config import Settings
    from crag.mcp_server import for_a_shell

    said = for_a_shell("no index in x: run `python -m crag index PATH` first", Settings(index_dir=folder))
    assert said == f"no index in x: run `python -m crag --index {shlex.quote(folder)} index PATH` first"


def test_a_model_given_with_the_model_option_is_named_so_in_a_tool_error() -> None:
    """``crag mcp -m NAME`` with a server that knows no such model: the tool error names the
    option the client's configuration gave it, not KB_AGENT_MODEL, as ``crag ask -m`` does."""
    from crag.config import Settings
    from crag.mcp_server import for_a_shell

    said = "LLM server x answered 404 for node plan: check KB_AGENT_MODEL (llama3.1:8b) and OPENAI_BASE_URL"
    assert "check -m/--model (llama3.1:8b)" in for_a_shell(said, Settings(), model_option=True)
    assert "check KB_AGENT_MODEL (llama3.1:8b)" in for_a_shell(said, Settings())


def test_a_store_servers_suggested_command_says_it_needs_the_servers_kb_agent_store() -> None:
    """Typed in a shell without the client's KB_AGENT_STORE, `python -m crag index PATH` builds
    ./.crag instead of indexing the database the server reads."""
    from crag.config import Settings
    from crag.mcp_server import for_a_shell

    said = for_a_shell("no index in postgresql://crag@db/kb: run `python -m crag index PATH` first",
                       Settings(store="postgresql://crag@db/kb"))
    assert said == ("no index in postgresql://crag@db/kb: run `python -m crag index PATH` (with KB_AGENT_STORE set "
                    "as this server has it) first")
