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


def kb(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("alpha", "bravo", "charlie"):
        (docs / f"{name}.md").write_text(f"# {name}\n\nThe {name} service listens on port 80{len(name)}.\n",
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
