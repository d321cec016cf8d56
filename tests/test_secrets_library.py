"""Secrets in what the library raises: a service embedding crag logs its errors whole.

``logging.exception`` prints an error with the exceptions chained behind it; crag chains the
SDK's exception, whose message holds the server's error body. A server that echoes the
request's Authorization header (a proxy, a debugging gateway) must not put the key in a log
through either link, nor in the message of an error raised to the caller.
"""

from __future__ import annotations

import io
import logging
import traceback
from pathlib import Path

import pytest

from crag import Agent, LLMError
from tests.fakes import clean_env
from tests.openai_server import FakeOpenAIServer, Status

KEY = "sk-live-SECRET123abcdefXYZ"
ECHO = {"error": {"message": f"bad request, you sent Authorization: Bearer {KEY} (key {KEY})", "code": KEY}}


def logged(error: BaseException) -> str:
    """What ``logging.exception`` writes for ``error``, chain included."""
    out = io.StringIO()
    log = logging.getLogger("crag-test-service")
    handler = logging.StreamHandler(out)
    log.addHandler(handler)
    try:
        try:
            raise error
        except BaseException:
            log.exception("the question failed")
    finally:
        log.removeHandler(handler)
    return out.getvalue()


@pytest.fixture
def docs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "docs"
    root.mkdir()
    (root / "retry.md").write_text("# Retries\n\ncrag retries on 429 with backoff.\n", encoding="utf-8")
    return root


@pytest.mark.parametrize("status", [400, 401, 500])
def test_a_chat_server_echoing_the_key_leaves_it_out_of_the_error_and_its_chain(docs: Path, status: int) -> None:
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", Status(status, ECHO, retry_after=0))
        with Agent.from_env(kb=[docs], dotenv=None, index_dir=str(docs.parent / "idx"), llm="openai",
                            openai_base_url=srv.base_url, openai_api_key=KEY, llm_max_retries=1) as agent, \
                pytest.raises(LLMError) as caught:
            agent.ask("how do retries work")
        assert srv.requests[0].headers["authorization"] == f"Bearer {KEY}"  # the server did see it
    error = caught.value
    assert error.__cause__ is not None  # the cause is kept for a bug report, masked
    text = logged(error)
    assert f"answered {status}" in text and "Bearer ***" in text
    assert "SECRET123" not in text and "SECRET123" not in repr(error)
    assert "SECRET123" not in "".join(traceback.format_exception(error))


def test_an_embeddings_server_echoing_the_key_leaves_it_out_of_the_error_and_its_chain(docs: Path) -> None:
    with FakeOpenAIServer() as srv:
        srv.default("embeddings", Status(400, ECHO))
        with pytest.raises(LLMError) as caught:
            Agent.from_env(kb=[docs], dotenv=None, index_dir=str(docs.parent / "idx"), embedder="openai",
                           openai_base_url=srv.base_url, openai_api_key=KEY, llm="offline")
        assert srv.requests[0].headers["authorization"] == f"Bearer {KEY}"
    error = caught.value
    assert "HTTP 400" in str(error) and "***" in str(error)
    assert "SECRET123" not in str(error), str(error)
    assert error.__cause__ is not None and "SECRET123" not in logged(error)


def test_a_chained_exception_whose_text_cannot_be_rewritten_is_cut_from_the_chain() -> None:
    from crag.safe_text import scrub_error

    inner = OSError(2, f"no such file {KEY}")  # OSError's text comes from errno and strerror, not args
    middle = RuntimeError(f"reading failed with Bearer {KEY}")
    middle.__cause__ = inner
    outer = LLMError("the server failed")
    outer.__cause__ = middle
    assert scrub_error(outer, [KEY]) is outer
    assert "SECRET123" not in logged(outer)
    assert outer.__cause__ is middle and str(middle) == "reading failed with Bearer ***"
    assert middle.__cause__ is None and middle.__suppress_context__


def test_a_password_in_the_base_url_stays_out_of_the_http_librarys_log(docs: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's HTTP library logs every request's URL at INFO ("HTTP Request: POST
    http://user:password@host/v1/chat/completions"): a service logging at INFO wrote the
    password of OPENAI_BASE_URL to its log. crag sends the URL's credentials as the header the
    library made of them, and the URL without them."""
    import base64

    caplog.set_level(logging.DEBUG)
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", '{"complexity": "chitchat", "suggested_tools": []}')
        srv.default("synthesize", "Hello!")
        url = srv.base_url.replace("http://", "http://us%40er:pa55word-SECRET@")
        with Agent.from_env(kb=[docs], dotenv=None, index_dir=str(docs.parent / "idx"), llm="openai",
                            embedder="openai", embedding_model="fake-embed", openai_base_url=url,
                            openai_api_key=KEY) as agent:
            assert agent.ask("hello").answer.startswith("Hello!")
        sent = {r.headers.get("authorization") for r in srv.requests}
    assert sent == {"Basic " + base64.b64encode(b"us@er:pa55word-SECRET").decode()}
    assert "HTTP Request: POST" in caplog.text  # the library did log the requests
    assert "pa55word" not in caplog.text and "SECRET" not in caplog.text


def test_the_encoded_credentials_of_a_base_url_a_server_echoes_are_masked(docs: Path) -> None:
    """What crag sends for ``http://user:password@host`` is base64("user:password"), which is
    the password as plainly as the password itself; a server quoting it without the word
    ``Basic`` in front had it printed in crag's error."""
    import base64

    encoded = base64.b64encode(b"us@er:pa55word-SECRET").decode()
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", Status(403, {"error": {"message": f"credentials {encoded} are not allowed"}}))
        url = srv.base_url.replace("http://", "http://us%40er:pa55word-SECRET@")
        with Agent.from_env(kb=[docs], dotenv=None, index_dir=str(docs.parent / "idx"), llm="openai",
                            openai_base_url=url) as agent, pytest.raises(LLMError) as caught:
            agent.ask("how do retries work")
    text = logged(caught.value)
    assert "answered 403" in text and "credentials *** are not allowed" in text
    assert encoded not in text and "SECRET" not in text
