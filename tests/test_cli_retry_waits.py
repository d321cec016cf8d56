"""A retry's wait is shown where progress is shown (``crag.events.RetryWaiting`` on the
status line): on a terminal, ``ask``, ``chat``, ``index`` and ``--kb`` say which step waits,
why, which retry of how many, and count the wait down; on a pipe or with ``--json`` nothing
of it appears (docs/cli.md, "Waiting for a retry").

The server is ``tests.openai_server.FakeOpenAIServer`` on 127.0.0.1; the terminal a real
pseudo-terminal (``tests.test_cli_ask_terminal.Terminal``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import test_retry_waits
from tests.openai_server import FakeOpenAIServer, Status
from tests.test_cli_ask_terminal import QUESTION, REPLY, Terminal, chat_with_a_terminal_stderr, child_env

kb = test_retry_waits.kb  # the fixtures: a folder indexed offline, the loopback server
llm = test_retry_waits.llm

RATE_LIMITED = "LLM server answered 429 rate limited; retry 1 of 3"


# -- the command line -----------------------------------------------------------------------------


def test_ask_on_a_terminal_counts_a_retry_wait_down_on_the_step_line(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("plan", Status(429, retry_after=2))
    term = Terminal(["ask", QUESTION], kb, child_env(kb, llm))
    assert term.finish() == 0, term.text
    shown = term.text
    counted = [shown.find(f"… plan: {RATE_LIMITED} in {n} s") for n in (2, 1)]
    sent = shown.find(f"… plan: {RATE_LIMITED} sent")
    assert -1 not in counted and counted == sorted(counted) and counted[-1] < sent, shown
    assert sent < shown.find("… tool_exec") < shown.index(REPLY)


def test_ask_on_a_dumb_terminal_says_a_wait_once_in_a_plain_line(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("plan", Status(429, retry_after=2))
    term = Terminal(["ask", QUESTION], kb, child_env(kb, llm, term="dumb"))
    assert term.finish() == 0, term.text
    lines = term.text.replace("\r\n", "\n").splitlines()
    assert lines[:3] == ["crag: analyze_and_route…", "crag: plan…", f"crag: plan: {RATE_LIMITED} in 2 s"]
    assert "\033" not in term.text


def test_ask_piped_shows_nothing_of_a_wait(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("plan", Status(429, retry_after=1))
    piped = subprocess.run([sys.executable, "-m", "crag", "ask", "--no-usage", QUESTION], cwd=kb,
                           env=child_env(kb, llm), capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""
    assert piped.stdout.startswith(REPLY) and "rate limited" not in piped.stdout
    assert llm.calls("plan") == 2


def test_ask_json_on_a_terminal_shows_nothing_of_a_wait(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("plan", Status(429, retry_after=1))
    term = Terminal(["ask", "--json", QUESTION], kb, child_env(kb, llm))
    assert term.finish() == 0
    assert "rate limited" not in term.text and "…" not in term.text and llm.calls("plan") == 2


def test_chat_on_a_terminal_counts_a_retry_wait_down(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("synthesize", Status(503, retry_after=2))
    term = Terminal(["chat"], kb, child_env(kb, llm), typed=QUESTION + "\n")
    assert term.finish() == 0, term.text
    shown = term.text
    waiting = "… synthesize: LLM server answered 503 service unavailable; retry 1 of 3"
    assert f"{waiting} in 2 s" in shown and f"{waiting} in 1 s" in shown and f"{waiting} sent" in shown, shown
    assert shown.index(f"{waiting} sent") < shown.index("crag> ")


def test_chat_with_only_stderr_a_terminal_shows_a_wait_there(llm: FakeOpenAIServer, kb: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    llm.script("plan", Status(429, retry_after=1))
    shown = chat_with_a_terminal_stderr(kb, llm, monkeypatch)
    assert f"  … plan: {RATE_LIMITED} in 1 s" in shown and f"\r\033[K  … plan: {RATE_LIMITED} sent" in shown, shown
    assert shown.index(f"{RATE_LIMITED} sent") < shown.index("  … tool_exec")
    llm.script("plan", Status(429, retry_after=1))
    dumb = chat_with_a_terminal_stderr(kb, llm, monkeypatch, term="dumb")
    assert dumb.splitlines()[:3] == ["crag: analyze_and_route…", "crag: plan…", f"crag: plan: {RATE_LIMITED} in 1 s"]


def embeddings_env(kb: Path, srv: FakeOpenAIServer, term: str = "xterm") -> dict[str, str]:
    env = child_env(kb, srv, term)
    env.update(KB_AGENT_EMBEDDER="openai", KB_AGENT_EMBEDDING_MODEL="test-embed",
               KB_AGENT_INDEX_DIR=str(kb / "index-openai"))
    return env


def test_index_on_a_terminal_shows_the_embeddings_servers_wait(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("embeddings", Status(429, retry_after=2))
    term = Terminal(["index", "docs"], kb, embeddings_env(kb, llm))
    assert term.finish() == 0, term.text
    shown = term.text
    waiting = "indexing: embeddings server answered 429 rate limited; retry 1 of 3"
    assert f"{waiting} in 2 s" in shown and f"{waiting} in 1 s" in shown, shown
    assert shown.index(f"{waiting} in 1 s") < shown.index("indexed 1 path(s)")


def test_index_piped_shows_nothing_of_a_wait(llm: FakeOpenAIServer, kb: Path) -> None:
    llm.script("embeddings", Status(429, retry_after=1))
    piped = subprocess.run([sys.executable, "-m", "crag", "index", "docs"], cwd=kb, env=embeddings_env(kb, llm),
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == "" and "rate limited" not in piped.stdout
    assert piped.stdout.startswith("indexed 1 path(s)")


def test_ask_kb_on_a_terminal_shows_the_waits_of_indexing_and_of_the_search(llm: FakeOpenAIServer,
                                                                          kb: Path) -> None:
    env = embeddings_env(kb, llm)
    llm.script("embeddings", Status(503, retry_after=1))
    term = Terminal(["ask", "--kb", "docs", QUESTION], kb, env)
    assert term.finish() == 0, term.text
    assert "crag: indexing: embeddings server answered 503 service unavailable; retry 1 of 3 in 1 s" in term.text
    llm.script("embeddings", Status(429, retry_after=1))  # the index is up to date: the question's search waits
    term = Terminal(["ask", "--kb", "docs", QUESTION], kb, env)
    assert term.finish() == 0, term.text
    assert "… tool_exec: embeddings server answered 429 rate limited; retry 1 of 3 in 1 s" in term.text, term.text
    assert "crag: indexing:" not in term.text
