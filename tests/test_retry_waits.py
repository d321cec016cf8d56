"""A retry's wait is reported (``crag.llm.retry.reporting_waits``): to an ``on_event``
handler as ``crag.events.RetryWaiting`` records naming the step, counting the wait down, and
to no one else; a retried call still counts once in the usage.

The server is ``tests.openai_server.FakeOpenAIServer`` on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crag.events import RetryWaiting
from crag.llm.retry import RetryPolicy, StatusFailure, TimeoutFailure, reporting_waits
from tests import test_cli_ask_terminal
from tests.openai_server import FakeOpenAIServer, Status
from tests.test_cli_ask_terminal import QUESTION, child_env

RATE_LIMITED = "LLM server answered 429 rate limited; retry 1 of 3"


kb = test_cli_ask_terminal.kb  # the fixtures: a folder indexed offline, the loopback server scripted
llm = test_cli_ask_terminal.llm  # for a complex question (every step runs once)


# -- the policy's waits -------------------------------------------------------------------------


def test_a_reported_wait_counts_down_by_seconds_and_sleeps_as_long_in_all() -> None:
    slept: list[float] = []
    seen: list[RetryWaiting] = []
    policy = RetryPolicy(3, sleep=slept.append)
    with reporting_waits(seen.append):
        policy.rest(2.5, 1, StatusFailure(429, retry=True, retry_after=2.5), node="plan")
    assert [w.left for w in seen] == [2.5, 2.0, 1.0, 0.0]
    assert slept == [0.5, 1.0, 1.0]
    assert {(w.node, w.server, w.reason, w.seconds, w.retry, w.retries, w.status) for w in seen} == {
        ("plan", "LLM", "429 rate limited", 2.5, 1, 3, 429)}


def test_an_unreported_wait_is_one_sleep() -> None:
    slept: list[float] = []
    RetryPolicy(3, sleep=slept.append).rest(2.5, 1, TimeoutFailure())
    assert slept == [2.5]


@pytest.mark.parametrize(("failure", "reason"), [
    (StatusFailure(503, retry=True), "503 service unavailable"),
    (StatusFailure(500, retry=True), "500 internal server error"),
    (StatusFailure(599, retry=True), "599 server error"),
    (TimeoutFailure(), "timed out"),
])
def test_a_wait_says_why(failure, reason) -> None:
    seen: list[RetryWaiting] = []
    with reporting_waits(seen.append):
        RetryPolicy(2, sleep=lambda s: None).rest(0.5, 2, failure)
    assert seen[0].reason == reason and seen[0].retry == 2 and seen[0].retries == 2


# -- the library ----------------------------------------------------------------------------------


def test_the_library_reports_a_wait_as_an_event_of_the_step_and_counts_no_extra_call(
        llm: FakeOpenAIServer, kb: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture) -> None:
    from crag import Agent

    for name, value in child_env(kb, llm).items():
        if name.startswith(("KB_AGENT_", "OPENAI_")):
            monkeypatch.setenv(name, value)
    with Agent.from_env() as agent:
        plain = agent.ask(QUESTION)
        llm.script("plan", Status(429, retry_after=1.5))
        events: list[object] = []
        waited = agent.ask(QUESTION, on_event=events.append)
        llm.script("plan", Status(503, retry_after=0.2))
        silent = agent.ask(QUESTION)  # no handler: nothing reported, nothing printed
    waits = [e for e in events if isinstance(e, RetryWaiting)]
    assert [w.left for w in waits] == [1.5, 1.0, 0.0]
    assert {(w.node, w.server, w.reason, w.retry, w.retries, w.status) for w in waits} == {
        ("plan", "LLM", "429 rate limited", 1, 3, 429)}
    plan_started = events.index(next(e for e in events if getattr(e, "node", "") == "plan"))
    assert plan_started < events.index(waits[0])
    assert capfd.readouterr() == ("", "")
    for answer in (waited, silent):  # a retry is not an API call of its own (SPEC §5, §7)
        assert answer.usage.llm_calls == plain.usage.llm_calls
        assert answer.usage.by_node["plan"].calls == 1


def test_a_checked_body_the_sdk_wraps_as_a_connection_error_is_not_asked_for_again() -> None:
    """Older openai SDKs (1.40 to 1.55.3, crag's floor, at least) wrap whatever the HTTP client
    raises while reading a response as ``APIConnectionError``: with them a 200 reply holding a
    gzip bomb was refused by crag's body check, taken for a dropped connection, fetched three
    more times and reported as "closed the connection ... after 3 retries". The check's
    verdict under that wrapper is a bad reply, never retried."""
    import openai

    from crag.llm.retry import BadReply, BadReplyFailure

    def wrapped(cause: BaseException) -> openai.APIConnectionError:
        try:
            try:
                raise cause
            except BaseException as err:
                raise openai.APIConnectionError(request=None) from err  # what the SDK does
        except openai.APIConnectionError as exc:
            return exc

    failure = RetryPolicy(3).classify(wrapped(BadReply("sent a body over 64 MiB", "limit")))
    assert failure == BadReplyFailure("sent a body over 64 MiB", "limit") and not failure.retry
    assert RetryPolicy(3).classify(wrapped(ConnectionResetError("reset"))).retry  # a real drop still is


def test_a_read_timeout_the_sdk_lets_through_mid_stream_is_a_timeout() -> None:
    """openai 1.55 lets the HTTP library's ``ReadTimeout`` through while a stream is read: an
    answer cut by KB_AGENT_LLM_TIMEOUT was reported as "closed the connection ... (timed out)"
    instead of "did not finish its answer within N s ... (KB_AGENT_LLM_TIMEOUT)", which names
    the setting to raise. A timeout of the HTTP library is a timeout whoever raises it."""
    import sys

    import openai  # loads the HTTP library the SDK uses

    http = sys.modules.get("httpx2") or sys.modules["httpx"]
    assert openai is not None
    assert RetryPolicy(3).classify(http.ReadTimeout("the request's deadline has passed")) == TimeoutFailure()
    assert not isinstance(RetryPolicy(3).classify(http.RemoteProtocolError("peer closed")), TimeoutFailure)
