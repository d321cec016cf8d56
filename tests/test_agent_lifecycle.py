"""An Agent over its lifetime: what it holds open, what ``close`` lets go of, and where its
events are delivered while questions run at once."""

from __future__ import annotations

import os

from crag import Agent

from .fakes import route
from .openai_server import FakeOpenAIServer


def client_sockets(port: int) -> set[str]:
    """This process's open connections to the server on ``port`` (not the server's own ends)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed meanwhile
            continue
        if target in inodes:
            held.add(target)
    return held


def kb(tmp_path, more: int = 0):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("alpha", "bravo", "charlie"):
        (docs / f"{name}.md").write_text(f"# {name}\n\nThe {name} service listens on port 80{len(name)}.\n",
                                         encoding="utf-8")
    for n in range(more):  # vectors beyond the first page of the vector file
        (docs / f"note{n}.md").write_text(f"# Note {n}\n\nThe note number {n} holds remark {n * 7}.\n",
                                          encoding="utf-8")
    return docs


def test_close_lets_go_of_the_embedding_servers_connections_indexing_and_searching_opened(
        tmp_path, monkeypatch) -> None:
    """With ``KB_AGENT_EMBEDDER=openai``, ``from_env`` indexed the roots with an embedder whose
    connection nothing closed, and the toolbox's query embedder kept its connections after
    ``close``: a long-lived program leaked a socket per agent (``ResourceWarning``s at exit)."""
    docs = kb(tmp_path)
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer(embedding_dim=1536) as srv:
        settings = {"llm": "offline", "embedder": "openai", "openai_base_url": srv.base_url,
                    "index_dir": str(tmp_path / "index")}
        agent = Agent.from_env([docs], dotenv=None, environ={}, **settings)
        assert any(r.path.endswith("/embeddings") for r in srv.requests)  # the roots were embedded there
        assert not client_sockets(srv.port)  # indexing let go of its connection
        answer = agent.ask("Which port does the bravo service listen on?")
        assert answer.citations and answer.citations[0].path == "docs/bravo.md"
        agent.close()
        assert not client_sockets(srv.port)
        # and the agent still answers after close, as the library promises
        assert agent.ask("Which port does the alpha service listen on?").citations[0].path == "docs/alpha.md"
        agent.close()
        assert not client_sockets(srv.port)


def test_retry_waits_of_parallel_searches_reach_on_event_on_the_asking_thread(tmp_path, monkeypatch) -> None:
    """``on_event`` is called on the thread that runs the question (crag.events), but a retry
    wait of a search's embedding request was reported on the tool thread that waited, two at
    once when the round's searches ran in parallel: a handler that updates a user interface,
    or is not thread-safe, was called from threads it did not know."""
    import threading

    from crag import RetryWaiting, ScriptedChatModel

    from .fakes import plan
    from .openai_server import Status

    docs = kb(tmp_path)
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer(embedding_dim=1536) as srv:
        model = ScriptedChatModel({
            "analyze_and_route": [route("simple")],
            "plan": [plan(("vector_search", {"query": "bravo port"}))],
            "synthesize": ["The bravo service listens on port 805 [1]."],
        })
        agent = Agent.from_env([docs], chat_model=model, dotenv=None, environ={}, embedder="openai",
                               openai_base_url=srv.base_url, index_dir=str(tmp_path / "index"))
        srv.script("embeddings", Status(503, retry_after=0.2), Status(503, retry_after=0.2))
        threads: list[tuple[str, str]] = []
        answer = agent.ask("Which port does the bravo service listen on?",
                           on_event=lambda e: threads.append((type(e).__name__, threading.current_thread().name)))
        agent.close()
    waits = [name for kind, name in threads if kind == RetryWaiting.__name__]
    assert len(waits) >= 4  # each search's wait, told as it starts and as its retry is sent
    assert {name for _, name in threads} == {threading.current_thread().name}
    assert answer.citations[0].path == "docs/bravo.md"


OVERWRITTEN_IN_PLACE = """
import os, sys
from crag import Agent, IndexStoreError
from crag.index import index_roots
agent = Agent.from_env([sys.argv[1]], dotenv=None, environ={}, llm="offline", index_dir=sys.argv[2])
assert agent.ask("Which port does the bravo service listen on?").citations
(gen,) = [d for d in os.listdir(sys.argv[2]) if d.startswith("gen-")]
with open(os.path.join(sys.argv[2], gen, "vectors.faiss"), "r+b") as f:  # as `cp` over it does
    f.truncate(64)
try:
    agent.ask("Which port does the bravo service listen on?")
except IndexStoreError as exc:
    print("error:", exc)
index_roots(agent.settings, [sys.argv[1]])
print("after re-index:", agent.ask("Which port does the bravo service listen on?").citations[0].path)
agent.close()
"""


def test_an_index_file_overwritten_in_place_under_an_open_agent_is_damage_said_not_a_crash(tmp_path) -> None:
    """The reader maps the vector file into memory; a file cut short in place (``cp`` of an
    older index over it, a full disk) killed a long-lived agent at its next search with
    SIGBUS ("Bus error"), no message, no traceback. The search now says the index is damaged,
    and after a re-index the same agent answers."""
    import subprocess
    import sys

    docs = kb(tmp_path, more=40)
    run = subprocess.run([sys.executable, "-c", OVERWRITTEN_IN_PLACE, str(docs), str(tmp_path / "index")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(run.stdout.splitlines()) == 2, (run.stdout, run.stderr[-2000:])
    error, after = run.stdout.splitlines()
    assert error.startswith("error: ") and "damaged" in error and "crag index" in error
    assert after == "after re-index: docs/bravo.md"


def test_aask_calls_on_event_on_the_event_loops_thread_and_a_raising_handler_stops_the_question() -> None:
    """``astream`` hands its events to ``on_event`` on the thread iterating it, but ``aask``
    called the handler on its worker thread: a handler feeding an ``asyncio.Queue`` or
    touching any other object of the loop did so from a foreign thread. Now each event is
    handled on the loop's thread, in order, while the question waits for it; a handler that
    raises stops the question there, as in ``ask``, and the error comes out of the await."""
    import asyncio
    import threading

    from crag import NodeStarted, ScriptedChatModel, Settings

    from .fakes import FakeToolbox, search_plan

    def agent() -> tuple[Agent, ScriptedChatModel]:
        model = ScriptedChatModel({"analyze_and_route": [route("simple")], "plan": [search_plan()],
                                   "synthesize": ["Nothing to add."]})
        return Agent(model, FakeToolbox(), Settings()), model

    async def main() -> None:
        loop_thread = threading.get_ident()
        queue: asyncio.Queue = asyncio.Queue()
        threads = set()

        def on_event(event) -> None:
            threads.add(threading.get_ident())
            queue.put_nowait(event)

        answer = await agent()[0].aask("What is the retry policy?", on_event=on_event)
        assert threads == {loop_thread}
        names = []
        while not queue.empty():
            event = queue.get_nowait()
            names.append((type(event).__name__, getattr(event, "node", "")))
        assert names[0] == ("NodeStarted", "analyze_and_route") and names[-1] == ("NodeFinished", "synthesize")
        assert answer.trace[-1] == "synthesize"

        def stop_at_plan(event) -> None:
            if isinstance(event, NodeStarted) and event.node == "plan":
                raise ValueError("enough")

        stopped, model = agent()
        try:
            await stopped.aask("What is the retry policy?", on_event=stop_at_plan)
        except ValueError as exc:
            assert str(exc) == "enough"
        else:
            raise AssertionError("the handler's error did not stop the question")
        assert model.calls("plan") == 0

    asyncio.run(main())


def test_closing_an_agent_while_other_threads_ask_lets_their_questions_finish(tmp_path, monkeypatch) -> None:
    """``close`` closed the index under questions running on other threads, which failed
    with "the index database ... is damaged (Cannot operate on a closed database.)": an
    index called damaged that was not. What ``close`` lets go of while tool calls run is now
    closed when the last of them ends; questions asked after it open the index again."""
    import threading

    docs = kb(tmp_path, more=10)
    monkeypatch.chdir(tmp_path)
    agent = Agent.from_env([docs], dotenv=None, environ={}, llm="offline", index_dir=str(tmp_path / "index"))
    stop = threading.Event()
    errors: list[str] = []
    answered = [0]

    def ask() -> None:
        while not stop.is_set():
            try:
                if agent.ask("Which port does the bravo service listen on?").citations:
                    answered[0] += 1
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    askers = [threading.Thread(target=ask) for _ in range(3)]
    for t in askers:
        t.start()
    closes = 0
    while closes < 300 or (answered[0] < 20 and closes < 3000):
        stop.wait(0.005)
        agent.close()
        closes += 1
    stop.set()
    for t in askers:
        t.join()
    agent.close()
    assert not errors, errors[:3]


def test_a_process_forked_after_the_agent_asked_sends_its_requests_on_connections_of_its_own(
        tmp_path, monkeypatch) -> None:
    """A server that makes its agent and then forks its workers (``gunicorn --preload``, a
    ``multiprocessing`` pool) shared the parent's keep-alive connections to the LLM and
    embedding servers with every child: two processes wrote on one socket and read each
    other's replies, so one question got the answer to another (or a grading reply where it
    asked for a route), and the other waited for a reply that never came. A forked child now
    opens connections of its own."""
    import json
    import re
    import signal

    from .openai_server import Delay, Text

    docs = kb(tmp_path)
    monkeypatch.chdir(tmp_path)

    def tagged(node: str):
        def reply(body):  # the question's own number, read back from the reply's usage
            n = int(re.findall(r"Q(\d+)Q", json.dumps(body["messages"]))[0])
            text = (route("simple") if node == "analyze_and_route" else
                    '{"tool_calls": []}' if node == "plan" else "The bravo service listens on port 805 [1].")
            return Delay(0.2, Text(text, completion_tokens=n))
        return reply

    with FakeOpenAIServer(embedding_dim=1536) as srv:
        for node in ("analyze_and_route", "plan", "synthesize"):
            srv.default(node, tagged(node))
        agent = Agent.from_env([docs], dotenv=None, environ={}, openai_base_url=srv.base_url, llm_timeout=5,
                               embedder="openai", llm_max_retries=0, log=False, index_dir=str(tmp_path / "index"))

        def answered(n: int) -> str:
            try:
                usage = agent.ask(f"Which port does the bravo service listen on, Q{n}Q?").usage
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            got = {name: u.completion_tokens for name, u in usage.by_node.items()}
            return "ok" if set(got.values()) == {n} else f"got the replies of {got}"

        assert answered(1) == "ok"  # the connections the child inherits are open
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe, never return into pytest
            try:
                signal.alarm(30)
                os.write(write, ",".join(answered(n) for n in (200, 201)).encode())
            finally:
                os._exit(0)
        os.close(write)
        parent = [answered(n) for n in (100, 101)]
        with os.fdopen(read) as pipe:
            child = pipe.read()
        os.waitpid(pid, 0)
        agent.close()
    assert parent == ["ok", "ok"]
    assert child.split(",") == ["ok", "ok"]

    def ports(*tags: str) -> set[int]:
        return {r.client_port for r in srv.requests if any(tag in json.dumps(r.body) for tag in tags)}

    # every chat and embedding request of the child came on a connection the parent never used
    assert ports("Q200Q", "Q201Q") and not ports("Q200Q", "Q201Q") & ports("Q1Q", "Q100Q", "Q101Q")


def test_a_process_forked_after_the_agent_ran_tools_at_once_runs_them_on_threads_of_its_own(
        tmp_path, monkeypatch) -> None:
    """A plan of two searches runs them on the agent's tool threads. A process forked after
    such a question (a ``gunicorn --preload`` worker) inherited the pool but not its threads:
    its first plan of two searches waited for ever for threads that were not there."""
    import signal
    import time

    from .fakes import plan

    docs = kb(tmp_path)
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", route("simple"))
        srv.default("plan", plan(("vector_search", {"query": "bravo port"}), ("grep_search", {"pattern": "bravo"})))
        srv.default("synthesize", "The bravo service listens on port 805 [1].")
        agent = Agent.from_env([docs], dotenv=None, environ={}, openai_base_url=srv.base_url, llm_timeout=5,
                               llm_max_retries=0, log=False, index_dir=str(tmp_path / "index"))
        question = "Which port does the bravo service listen on?"
        assert agent.ask(question).citations  # the tool threads ran both searches, and are idle
        time.sleep(0.2)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe, never return into pytest
            try:
                signal.alarm(10)
                os.write(write, b"ok" if agent.ask(question).citations else b"no citation")
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            child = pipe.read()
        os.waitpid(pid, 0)
        assert agent.ask(question).citations  # the parent's threads still run its tools
        agent.close()
    assert child == "ok"
