"""``python -m crag mcp`` read as a hostile client writes to it: raw JSON-RPC lines on its stdin.

A real server process (offline backend, a small knowledge base indexed for real) is sent
lines no SDK client would write; every line that is a call gets one reply under its ``id``
when the ``id`` can be read, the server keeps serving, and it ends with status 0 and no
traceback when stdin closes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.test_mcp import BACKUP, SETUP, server_params

HELLO = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
READY = {"jsonrpc": "2.0", "method": "notifications/initialized"}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "setup.md").write_text(SETUP, encoding="utf-8")
    (docs / "backup.md").write_text(BACKUP, encoding="utf-8")
    return tmp_path


def search_call(n: int, query: str = "nightly backups") -> str:
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                       "params": {"name": "search", "arguments": {"query": query}}})


def exchange(workdir: Path, lines: list[str], replies: int, handshake: bool = True, **env: str) -> tuple[list[dict], str]:
    """Write the handshake (unless told not to) and ``lines`` to a server (with ``env`` added to
    its environment), read ``replies`` replies after the handshake's, close stdin; the replies
    and stderr, once the server ended with status 0."""
    params = server_params(workdir, "--kb", "docs")
    params.env.update(env)
    proc = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        first = [json.dumps(HELLO), json.dumps(READY)] if handshake else []
        proc.stdin.write("".join(line + "\n" for line in [*first, *lines]).encode())
        proc.stdin.flush()
        if handshake:
            assert json.loads(proc.stdout.readline())["id"] == 0
        got = []
        for _ in range(replies):
            line = proc.stdout.readline()
            assert line, f"the server ended early: {proc.stderr.read().decode()}"
            got.append(json.loads(line))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        return got, proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_json_nested_too_deeply_is_an_error_under_its_id_and_the_server_keeps_serving(workdir: Path) -> None:
    """Arguments nested thousands deep ended the server with a RecursionError's traceback
    (the parser's refusal was re-read by Python's recursive one), and every call in flight
    was lost; nested 300 deep (too deep for the SDK's parser, not for Python's) the call was
    answered with ``id`` null, which no client matches to its call."""
    deep = ('{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search", "arguments": '
            + '{"a": ' * 5000 + "1" + "}" * 5000 + "}}")
    less = ('{"jsonrpc": "2.0", "id": "eight", "method": "tools/call", "params": {"name": "search", "arguments": '
            '{"query": ' + "[" * 300 + "]" * 300 + "}}}")
    got, err = exchange(workdir, [deep, less, search_call(9)], 3)
    by_id = {reply["id"]: reply for reply in got}
    for n in (7, "eight"):
        assert by_id[n]["error"] == {"code": -32700, "message": "Parse error: the message nests JSON more than 200 levels deep"}
    assert by_id[9]["result"]["structuredContent"]["hits"][0]["path"] == "docs/backup.md"
    assert "Traceback" not in err


def test_a_request_that_is_no_message_is_answered_under_its_id_and_blank_lines_are_skipped(workdir: Path) -> None:
    """``{"jsonrpc": "1.0", "id": 3, ...}`` was answered with ``id`` null, so the client that
    sent it waited; a blank line (which some clients write between messages) got a parse
    error reply that answers nothing."""
    too_big = ('{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "search", "arguments": '
               '{"query": "port", "top_k": ' + "9" * 5000 + "}}}")
    got, err = exchange(workdir, ['{"jsonrpc": "1.0", "id": 3, "method": "tools/list"}', "", "   ", too_big,
                                  "[]", search_call(9)], 4)
    assert got[0] == {"jsonrpc": "2.0", "id": 3, "error": {"code": -32600, "message": "Invalid Request: not a JSON-RPC message"}}
    assert got[1] == {"jsonrpc": "2.0", "id": 5, "error": {"code": -32700, "message": "Parse error: a number in the message is out of range"}}
    assert got[2]["id"] is None and got[2]["error"]["code"] == -32600  # a JSON array: no id to read
    assert got[3]["id"] == 9 and "result" in got[3]
    assert "Traceback" not in err


def test_an_argument_the_tool_does_not_take_is_refused_by_name_and_tool_texts_read_cleanly(workdir: Path) -> None:
    """``{"query": ..., "topK": 3}`` (an agent's guess at ``top_k``) searched with the default
    number of hits and said nothing, and so for any misspelt argument; an unknown tool's error
    did not say which tools there are; and every description reached the agent with the
    eight-space indentation of the docstring it came from."""
    import anyio
    from mcp import Client

    from tests.test_mcp import text_of

    async def session() -> None:
        async with Client(server_params(workdir, "--kb", "docs"), read_timeout_seconds=120) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            for tool in tools.values():
                assert tool.input_schema["additionalProperties"] is False
                assert "\n " not in tool.description and tool.description == tool.description.strip()
            topk = await client.call_tool("search", {"query": "nightly backups", "topK": 1})
            assert topk.is_error and text_of(topk) == "search: unknown argument 'topK' (search takes query, top_k)"
            many = await client.call_tool("read_file", {"path": "docs/setup.md", "line": 2, "to\nline": 3})
            assert many.is_error and text_of(many) == (
                "read_file: unknown arguments 'line', 'to\\nline' (read_file takes path, start_line, end_line, page)")
            nothing = await client.call_tool("grep", {"pattern": "port"})
            assert nothing.is_error and text_of(nothing) == "unknown tool 'grep': this server's tools are ask, search, read_file"
            fine = await client.call_tool("search", {"query": "nightly backups", "top_k": 1})
            assert not fine.is_error and len(fine.structured_content["hits"]) == 1

    anyio.run(session)


def test_an_unknown_tool_or_argument_named_by_a_secret_is_masked_in_its_error(workdir: Path) -> None:
    """The errors naming an unknown tool or argument repeat what the client wrote; a configured
    secret in it (a key pasted as an argument) is masked as in every tool error."""
    secret = "sk-p25-recognisable-fake-0123456789"
    calls = [{"name": secret, "arguments": {}}, {"name": "search", "arguments": {"query": "port", secret: 1}}]
    lines = [json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": call}) for n, call in enumerate(calls, 1)]
    got, err = exchange(workdir, lines, 2, OPENAI_API_KEY=secret)
    texts = sorted(reply["result"]["content"][0]["text"] for reply in got)
    assert texts == ["search: unknown argument '***' (search takes query, top_k)",
                     "unknown tool '***': this server's tools are ask, search, read_file"]
    assert secret not in err


def test_a_call_before_initialize_and_params_the_protocol_refuses_say_what_is_wrong(workdir: Path) -> None:
    """A call before ``initialize``, a ``tools/call`` without a tool name and one whose
    arguments are a list were all answered ``Invalid request parameters`` with empty data:
    the client could not tell a missing handshake from a misspelt field."""
    before = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    nameless = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"arguments": {"query": "port"}}}
    listed = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "search", "arguments": ["port"]}}
    lines = [json.dumps(m) for m in (before, ping, HELLO, READY, nameless, listed)] + [search_call(5)]
    got, err = exchange(workdir, lines, 6, handshake=False)
    by_id = {reply["id"]: reply for reply in got}
    assert by_id[1]["error"]["code"] == -32602
    assert by_id[1]["error"]["message"] == ("Invalid request parameters: the session is not initialized: "
                                            "send initialize first, then notifications/initialized")
    assert by_id[2]["result"] == {} and "result" in by_id[0]
    assert by_id[3]["error"] == {"code": -32602, "message": "Invalid request parameters: tools/call: params.name: Field required",
                                 "data": ""}
    assert by_id[4]["error"]["code"] == -32602
    assert by_id[4]["error"]["message"].startswith("Invalid request parameters: tools/call: params.arguments: ")
    assert "\n" not in by_id[4]["error"]["message"]
    assert by_id[5]["result"]["structuredContent"]["hits"][0]["path"] == "docs/backup.md"
    assert "Traceback" not in err


def test_what_the_sdk_logs_is_one_crag_line_on_stderr(workdir: Path) -> None:
    """The SDK's warnings (a notification it drops) reached stderr through its own rich
    handler: a timestamp, the SDK's source line, and the message wrapped over two lines at 80
    columns, unlike every other line crag writes there."""
    malformed = json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": {"x": 1}}})
    got, err = exchange(workdir, [malformed, search_call(1)], 1)
    assert got[0]["id"] == 1 and "result" in got[0]
    assert [line for line in err.splitlines() if not line.startswith("crag: indexed")] == [
        "crag: warning: dropped 'notifications/cancelled': malformed params"]


def test_a_request_whose_id_is_no_string_or_integer_gets_an_error_reply(workdir: Path) -> None:
    """``{"id": 1.5, "method": "tools/list"}`` (and ``true``, ``null``, a list) was read by the
    SDK as a notification and dropped: no reply, and the client waited for ever. MCP's ids are
    strings or integers; a notification (``notifications/...``) still gets no reply."""
    bad = [json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/list"}) for rid in (1.5, True, None, [1])]
    cancelled = json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}})
    fine = [json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/list"}) for n in range(10, 15)]
    got, err = exchange(workdir, [*bad, cancelled, *fine], 5)  # dropped, the 5 calls still reply: no wait
    refused = {"jsonrpc": "2.0", "id": None,
               "error": {"code": -32600, "message": "Invalid Request: a request's id must be a string or an integer"}}
    assert got[:4] == [refused] * 4
    assert got[4]["id"] == 10 and "result" in got[4]
    assert "Traceback" not in err


def test_a_line_too_long_to_hold_is_an_error_under_its_id_and_the_server_keeps_its_memory(workdir: Path) -> None:
    """A line is read whole before it is parsed: one with no end (a client writing /dev/zero)
    took every byte of the machine's memory until the kernel killed a process. The server
    here may use 1 GiB (so that failing, it fails alone); the line is 300 Mi characters."""
    import resource

    def one_gib() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (2**30, 2**30))

    params = server_params(workdir, "--kb", "docs")
    proc = subprocess.Popen([params.command, *params.args], env=params.env, cwd=params.cwd, preexec_fn=one_gib,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(f"{json.dumps(HELLO)}\n{json.dumps(READY)}\n".encode())
        proc.stdin.write(search_call(7, "").removesuffix('"}}}').encode())
        for _ in range(300):
            proc.stdin.write(b"x" * 2**20)
        proc.stdin.write(f'"}}}}}}\n{search_call(8)}\n'.encode())
        proc.stdin.flush()
        got = [json.loads(proc.stdout.readline() or "null") for _ in range(3)]
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert got[1] == {"jsonrpc": "2.0", "id": 7,
                      "error": {"code": -32700, "message": "Parse error: the message is longer than 128 Mi characters"}}
    assert got[2]["id"] == 8 and got[2]["result"]["structuredContent"]["hits"][0]["path"] == "docs/backup.md"
    assert "Traceback" not in err


def test_a_byte_order_mark_before_the_first_message_is_no_part_of_it(workdir: Path) -> None:
    """A client writing UTF-8 with a byte order mark (as Windows tools do at a stream's start)
    had its ``initialize`` answered with a parse error and ``id`` null: it waited for ever."""
    got, err = exchange(workdir, ["\ufeff" + json.dumps(HELLO), json.dumps(READY), search_call(1)], 2, handshake=False)
    assert got[0]["id"] == 0 and got[0]["result"]["serverInfo"]["name"] == "crag"
    assert got[1]["id"] == 1 and "result" in got[1]
    assert "Traceback" not in err
