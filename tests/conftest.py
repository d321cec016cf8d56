"""Test-wide settings.

``HYPOTHESIS_PROFILE=ci`` (set by ``.ci/run``) makes every property test draw the same
examples on every run, so CI passes or fails reproducibly; locally the default profile
draws new examples each time and keeps looking for counterexamples; ``thorough`` draws
2,000 examples for each property that does not fix its own number.
"""

import os

import pytest
from hypothesis import settings

# No deadline: a wall-clock limit per example fails on a busy machine, and crag measures
# time in benchmarks/, never in tests.
settings.register_profile("default", deadline=None)
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
# A longer hunt, run by hand: HYPOTHESIS_PROFILE=thorough pytest tests/test_stream.py
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# A real PostgreSQL with pgvector, started by the tests that ask for it (tests/postgres_server.py).
from tests.postgres_server import pg_server, pg_uri  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _user_state_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer log kept outside an index folder (``crag.answer_log.log_folder``) goes to a
    temporary state folder, never the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    # nor do the user's git settings (a global excludes file) change what a test indexes
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


@pytest.fixture(autouse=True)
def _fresh_server_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the process's chat models learnt of a server (a parameter it refused or ignored)
    is keyed by its address: a test server on a port an earlier test's used inherited it."""
    from crag.llm import openai_chat, server_memory

    fresh = server_memory.ServerMemory()
    monkeypatch.setattr(server_memory, "PROCESS", fresh)
    monkeypatch.setattr(openai_chat, "PROCESS", fresh)
