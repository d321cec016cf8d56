"""The public API does what it says: Settings names as keywords, your own parts under
names that cannot collide, aask with ask's parameters, what extending crag needs exported."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

import crag
from crag import Agent, ScriptedChatModel, Settings

from .fakes import FakeToolbox, route


def test_from_env_keywords_are_settings_fields_including_model(tmp_path) -> None:
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline"}
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "a.md").write_text("# A\n\nHello from the knowledge base.\n", encoding="utf-8")
    with Agent.from_env(tmp_path / "kb", environ=env, dotenv=None, model="gpt-4o", top_k=8) as agent:
        assert agent.settings.model == "gpt-4o" and agent.settings.top_k == 8
        assert agent.model.model == "offline"  # the backend KB_AGENT_LLM chose, not the string
        assert agent.ask("hello!").answer
    with Agent.from_env(environ={**env, "KB_AGENT_INDEX_DIR": str(tmp_path / "none")}, dotenv=None) as agent:
        assert agent.ask("hello!").answer.startswith("Hello")  # a greeting needs no index
        with pytest.raises(crag.IndexStoreError, match="no index in"):  # a question fails before planning
            agent.ask("How are uploads retried?")
    with pytest.raises(crag.ConfigError):
        Agent.from_env(environ=env, dotenv=None, chat_model_name="x")


def test_your_own_chat_model_and_toolbox_go_in_under_their_own_names(tmp_path) -> None:
    model = ScriptedChatModel({"analyze_and_route": [route("chitchat", ())], "synthesize": ["Hi!"]})
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i")}
    with Agent.from_env(environ=env, dotenv=None, chat_model=model, toolbox=FakeToolbox(), model="m2") as agent:
        assert agent.ask("hello").answer.startswith("Hi!")
        assert agent.settings.model == "m2"


def test_aask_takes_the_same_parameters_as_ask_and_streams() -> None:
    ask, aask = inspect.signature(Agent.ask), inspect.signature(Agent.aask)
    assert list(ask.parameters) == list(aask.parameters)
    model = ScriptedChatModel({"analyze_and_route": [route("chitchat", ())], "synthesize": ["Hello there."]})
    events = []
    agent = Agent(model, FakeToolbox(), Settings())
    result = asyncio.run(agent.aask("hi", [], events.append, stream=True))
    assert result.answer.startswith("Hello there.")
    assert any(type(e).__name__ == "AnswerDelta" for e in events)


def test_what_extending_crag_needs_is_exported() -> None:
    for name in ("ChatModel", "Toolbox", "Tool", "Param", "QuestionArg", "ScriptedChatModel", "EvidenceItem",
                 "Completion", "Settings", "Agent"):
        assert name in crag.__all__ and getattr(crag, name) is not None
    assert isinstance(ScriptedChatModel(), crag.ChatModel)
    assert isinstance(FakeToolbox(), crag.Toolbox)


def test_search_is_what_crag_search_prints_and_asks_no_model(tmp_path, monkeypatch) -> None:
    import json

    from crag.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "setup.md").write_text("# Setup\n\n## Retries\n\nThe client retries failed uploads three times.\n")
    (docs / "deploy.md").write_text("# Deploy\n\nRun the container with docker compose up.\n")
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "index"), "KB_AGENT_LLM": "offline"}
    monkeypatch.chdir(tmp_path)
    model = ScriptedChatModel({})  # any request would fail: search asks no model
    with Agent.from_env(["docs"], environ=env, dotenv=None, chat_model=model) as agent:
        hits = agent.search("how many times are uploads retried", top_k=2)
        assert 1 <= len(hits) <= 2 and hits[0].source == "docs/setup.md" and "three times" in hits[0].text
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert len(agent.search("docker compose", top_k=500)) <= 50
        with pytest.raises(crag.UsageError, match="empty"):
            agent.search("  ")
        with pytest.raises(crag.UsageError, match="top_k"):
            agent.search("docker", top_k=0)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from io import StringIO
    out = StringIO()
    monkeypatch.setattr("sys.stdout", out)
    assert main(["search", "how many times are uploads retried", "--json", "--top-k", "2"]) == 0
    printed = json.loads(out.getvalue())
    assert [(h["path"], h["start_line"], h["end_line"], h["score"], h["text"]) for h in printed] == [
        (h.source, h.start_line, h.end_line, h.score, h.text) for h in hits]


def test_results_carry_each_files_own_name_and_the_answer_text_its_display_form(tmp_path, monkeypatch) -> None:
    """``Agent.search``'s sources and ``Answer.citations[].path`` were the escaped display form:
    ``a<newline>b.md`` came back as ``a\\nb.md``, the name of another file, so a program
    citing it opened the wrong one. The answer's own text keeps the footer in display form."""
    from crag.safe_text import display_name

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a\nb.md").write_text("The first file says the lemming runs.\n", encoding="utf-8")
    (docs / "a\\nb.md").write_text("The second file says the lemming swims.\n", encoding="utf-8")
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "index"), "KB_AGENT_LLM": "offline"}
    monkeypatch.chdir(tmp_path)
    names = {"docs/a\nb.md", "docs/a\\nb.md"}
    with Agent.from_env(["docs"], environ=env, dotenv=None) as agent:
        hits = agent.search("lemming")
        assert {h.source for h in hits} == names
        assert all(Path(h.source).read_text(encoding="utf-8").strip() == h.text for h in hits)
        result = agent.ask("what does the lemming do?")
    assert {c.path for c in result.citations} == names
    assert {c["path"] for c in result.to_dict()["citations"]} == names
    assert all(c.ref == f"{display_name(c.path)}:L1" for c in result.citations)
    assert [line for line in result.answer.splitlines() if line.startswith("[")] == [
        f"[{c.n}] docs/a\\nb.md:L1" for c in result.citations]


def test_search_through_a_toolbox_without_a_search_tool_says_so() -> None:
    agent = Agent(ScriptedChatModel({}), FakeToolbox(tools=()), Settings())
    with pytest.raises(crag.UsageError, match="searches the knowledge base"):
        agent.search("anything")


def test_an_answer_holds_its_enums_and_grounding_and_json_writes_their_words() -> None:
    import json

    from crag import Complexity, EvidenceItem, GraderAction, GroundingReport

    from .fakes import scores

    items = [EvidenceItem("vector_search", f"docs/{k}.md", "Uploads are retried three times.", 1, 1, score=0.5)
             for k in range(3)]
    model = ScriptedChatModel({"analyze_and_route": [route("complex", ("vector_search",))],
                               "plan": ['{"tool_calls": [{"tool": "vector_search", "args": {"query": "retries"}}]}'],
                               "grade_evidence": [scores(0.9, 0.9, 0.9)],
                               "synthesize": ["Uploads are retried three times [1]."]})
    result = Agent(model, FakeToolbox({"vector_search": [items]}), Settings()).ask("How often are uploads retried?")
    assert result.grader_action is GraderAction.GENERATE and result.grader_action == "GENERATE"
    assert result.complexity is Complexity.COMPLEX
    assert isinstance(result.grounding, GroundingReport) and result.grounding is result.state.grounding
    printed = json.loads(json.dumps(result.to_dict()))
    assert (printed["grader_action"], printed["complexity"]) == ("GENERATE", "complex")
    assert type(result.to_dict()["grader_action"]) is str


def test_an_answer_has_every_field_ask_json_prints_under_the_same_name() -> None:
    """``ask --json`` prints ``question`` and ``judgements``, which the ``Answer`` a library
    caller gets had no attribute for (``result.question`` was an AttributeError)."""
    from crag import EvidenceItem

    items = [EvidenceItem("vector_search", "docs/retries.md", "Uploads are retried three times.", 1, 1, score=0.5)]
    model = ScriptedChatModel({"analyze_and_route": [route("simple", ("vector_search",))],
                               "plan": ['{"tool_calls": [{"tool": "vector_search", "args": {"query": "retries"}}]}'],
                               "synthesize": ["Uploads are retried three times [1]."]})
    result = Agent(model, FakeToolbox({"vector_search": [items]}), Settings()).ask("How often are uploads retried?")
    printed = result.to_dict()
    assert [name for name in printed if not hasattr(result, name)] == []
    assert result.question == printed["question"] == "How often are uploads retried?"
    assert result.judgements == result.grounding.judgements and len(printed["judgements"]) == 1


def test_event_is_what_a_handler_receives() -> None:
    from crag import AnswerDelta, AnswerStarted, Event, EventHandler, NodeFinished, NodeStarted, RetryWaiting

    assert set(Event.__args__) == {NodeStarted, NodeFinished, AnswerStarted, AnswerDelta, RetryWaiting}
    seen: list[Event] = []
    handler: EventHandler = seen.append
    Agent(ScriptedChatModel({"analyze_and_route": [route("chitchat", ())], "synthesize": ["Hi."]}), FakeToolbox(),
          Settings()).ask("hi", on_event=handler)
    assert seen[0] == NodeStarted("analyze_and_route") and all(isinstance(e, Event.__args__) for e in seen)


@pytest.mark.parametrize("kb", ["docs", b"docs", "{path}", b"{path}"])
def test_kb_of_one_path_is_that_root_not_its_characters(tmp_path, monkeypatch, kb) -> None:
    """``Agent.from_env(kb="docs")`` was read as the roots "d", "o", "c", "s" and failed with
    "knowledge-base path .../d does not exist"; a single path (str, bytes or PathLike) is one root."""
    from pathlib import Path

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "setup.md").write_text("# Setup\n\nThe server listens on port 8080 by default.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    if kb in ("{path}", b"{path}"):
        kb = Path(docs) if isinstance(kb, str) else bytes(docs)
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline"}
    with Agent.from_env(kb, environ=env, dotenv=None) as agent:
        assert agent.ask("Which port does the server listen on?").citations[0].path == "docs/setup.md"


def test_an_environ_mapping_with_numbers_is_read_like_the_environment(tmp_path) -> None:
    """``environ={"KB_AGENT_TOP_K": 8}`` was an AttributeError ('int' object has no attribute
    'strip'); a value that is no string is read as its text, and a bad one names its variable."""
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline", "KB_AGENT_TOP_K": 8,
           "KB_AGENT_LLM_TIMEOUT": 2.5, "KB_AGENT_WEB_FETCH": True, "KB_AGENT_MODEL": None}
    settings = Settings.from_env(environ=env, dotenv=None)
    assert (settings.top_k, settings.llm_timeout, settings.web_fetch, settings.model) == (8, 2.5, True, "gpt-4o-mini")
    with pytest.raises(crag.ConfigError, match="KB_AGENT_MAX_ITERATIONS"):
        Settings.from_env(environ={**env, "KB_AGENT_MAX_ITERATIONS": 0}, dotenv=None)


@pytest.mark.parametrize("value", [42, b"which port?", None, ["which port?"]])
def test_a_question_or_query_that_is_not_text_is_said_so_not_called_empty(value) -> None:
    """``agent.ask(42)`` and ``agent.search(b"port")`` said "the question is empty"."""
    agent = Agent(ScriptedChatModel(), FakeToolbox(), Settings())
    for call, what in ((agent.ask, "the question"), (agent.search, "the search query"), (agent.stream, "the question")):
        with pytest.raises(crag.UsageError, match=f"^{what} must be text \\(a str\\), not {type(value).__name__}$"):
            call(value)
    with pytest.raises(crag.UsageError, match=r"^the question is empty$"):
        agent.ask("  ")


def test_arguments_of_the_wrong_type_are_one_usage_error_not_a_type_or_attribute_error(tmp_path) -> None:
    """``history=5``, ``from_env(kb=5)``, ``environ=5``, ``chat_model=5``, ``Agent(None, None)``
    and ``on_event="x"`` were TypeErrors and AttributeErrors from crag's insides."""
    agent = Agent(ScriptedChatModel(), FakeToolbox(), Settings())
    for history in (5, 2.5, object(), "hi there", b"hi", {"role": "user", "content": "hi"}):
        with pytest.raises(crag.UsageError, match=r"^history must be a list of"):
            agent.ask("which port?", history=history)
        with pytest.raises(crag.UsageError, match=r"^history must be a list of"):
            agent.stream("which port?", history=history)
        with pytest.raises(crag.UsageError, match=r"^history must be a list of"):
            asyncio.run(agent.aask("which port?", history=history))
    with pytest.raises(crag.UsageError, match=r"^on_event must be callable"):
        agent.ask("which port?", on_event="print")
    for wrong in ("5", 2.0):  # "top_k must be at least 1, got '5'" said the wrong thing
        with pytest.raises(crag.UsageError, match=rf"^top_k must be a whole number of hits \(an int\), got {wrong!r}$"):
            agent.search("port", top_k=wrong)
    with pytest.raises(crag.UsageError, match=r"^top_k must be at least 1, got 0$"):
        agent.search("port", top_k=0)
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline"}
    for kb in (5, [None], ["docs", 3]):
        with pytest.raises(crag.UsageError, match=r"^kb must be a path or a list of paths"):
            Agent.from_env(kb, environ=env, dotenv=None)
    with pytest.raises(crag.UsageError, match=r"^environ must be a mapping"):
        Agent.from_env(environ=5, dotenv=None)
    with pytest.raises(crag.UsageError, match=r"^chat_model must be a crag\.ChatModel"):
        Agent.from_env(chat_model=5, environ=env, dotenv=None)
    with pytest.raises(crag.UsageError, match=r"^toolbox must be a crag\.Toolbox"):
        Agent(ScriptedChatModel(), None)


def test_history_none_is_no_history() -> None:
    agent = Agent(ScriptedChatModel({"analyze_and_route": [route("chitchat", ())], "synthesize": ["Hi."]}),
                  FakeToolbox(), Settings())
    assert agent.ask("hi", history=None).answer.startswith("Hi.")


def test_closing_the_agent_while_another_thread_asks_lets_that_question_finish() -> None:
    """``close`` shut the tool threads down under a question running in another thread, which
    then failed with concurrent.futures' CancelledError (or RuntimeError: cannot schedule new
    futures after shutdown); an agent used after ``close`` works, and so does one closed meanwhile."""
    import threading

    from .fakes import plan

    started, release = threading.Event(), threading.Event()

    class Slow(FakeToolbox):
        def run(self, call):
            started.set()
            release.wait(10)
            return super().run(call)

    searches = [("vector_search", {"query": f"words {i}"}) for i in range(6)]  # more calls than tool threads
    model = ScriptedChatModel({"analyze_and_route": [route("simple")], "plan": [plan(*searches)],
                               "synthesize": ["Nothing."]})
    agent = Agent(model, Slow(), Settings())
    outcome: list[object] = []
    asker = threading.Thread(target=lambda: outcome.append(_result_or_error(agent.ask, "What is the retry policy?")))
    asker.start()
    assert started.wait(10)
    agent.close()
    release.set()
    asker.join(10)
    assert outcome and isinstance(outcome[0], crag.Answer), outcome


def _result_or_error(f, *args):
    try:
        return f(*args)
    except Exception as exc:
        return exc


def test_a_library_user_filters_what_crag_works_around_by_its_warning_class(tmp_path) -> None:
    """README: a bad ignore-file line is a ``crag.CragWarning``, which ``warnings`` filters."""
    import warnings

    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "notes.md").write_text("# Notes\n\nThe client retries failed uploads three times.\n")
    (kb / ".gitignore").write_text("[unclosed\n")
    settings = {"llm": "offline", "index_dir": str(tmp_path / "idx"), "log": "off"}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with Agent.from_env(kb=[str(kb)], dotenv=None, environ={}, **settings) as agent:
            assert agent.search("retries")
    assert any(issubclass(w.category, crag.CragWarning) and ".gitignore" in str(w.message) for w in seen)
    with warnings.catch_warnings():
        warnings.simplefilter("error", crag.CragWarning)
        with pytest.raises(crag.CragWarning):
            Agent.from_env(kb=[str(kb)], dotenv=None, environ={}, **{**settings, "index_dir": str(tmp_path / "b")})


def test_a_document_the_agent_could_not_read_is_a_crag_warning_naming_it_on_every_start(tmp_path, monkeypatch) -> None:
    """README: a document crag could not read comes as a ``crag.CragWarning``. ``Agent.from_env(kb=...)``
    skipped a damaged PDF in silence (``crag ask --kb`` names it on stderr): its questions were
    answered "couldn't find" with no word of why."""
    import warnings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "notes.md").write_text("# Notes\n\nThe client retries failed uploads three times.\n")
    (tmp_path / "kb" / "manual.pdf").write_bytes(b"The valve is blue, but this is no PDF.\n")
    settings = {"llm": "offline", "index_dir": "idx", "log": "off"}
    for _ in range(2):  # indexed, then found current: named both times, as --kb names it
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            Agent.from_env(kb="kb", dotenv=None, environ={}, **settings).close()
        said = [str(w.message) for w in seen if issubclass(w.category, crag.CragWarning)]
        assert said == ["skipped kb/manual.pdf: it is not a PDF (it does not start with %PDF-, as a PDF does)"], said
        assert all(w.filename == __file__ for w in seen)  # said at the caller's line


@pytest.mark.parametrize("backend", ["offline", "openai"])
def test_an_agent_from_env_reused_after_close_answers_and_its_next_close_releases_everything(
        tmp_path, monkeypatch, backend) -> None:
    """``close`` forgot what ``from_env`` had opened: a reused agent reopened its index (four
    descriptors) that no later ``close`` released, and with the openai backend the reuse failed
    with httpx's raw ``RuntimeError: Cannot send a request, as the client has been closed``."""
    import os
    import time

    from .openai_server import FakeOpenAIServer

    def open_files() -> set[str]:
        """What this process holds open, but the test server's own sockets (which it closes in
        its own time): the index's files and crag's connections to the server."""
        servers = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as rows:
                for row in list(rows)[1:]:
                    local, inode = row.split()[1], row.split()[9]
                    if int(local.rsplit(":", 1)[1], 16) == srv.port:
                        servers.add(f"socket:[{inode}]")
        out = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                out.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # the listing's own descriptor, closed meanwhile
                continue
        return out - servers

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "retry.md").write_text("# Retries\n\ncrag retries on 429 with backoff.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer() as srv:
        srv.default("analyze_and_route", route("simple"))
        srv.default("plan", '{"tool_calls": []}')
        srv.default("synthesize", "crag retries on 429 with backoff [1].")
        env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": backend, "OPENAI_BASE_URL": srv.base_url}
        agent = Agent.from_env([docs], environ=env, dotenv=None)
        before = open_files()
        for _ in range(3):
            assert agent.ask("How does crag retry?").citations[0].path == "docs/retry.md"
            agent.close()
            # The test server shuts a connection down before it closes its descriptor: for that
            # moment its socket is in no table, so a leak is what is still open a while later.
            for _ in range(100):
                if open_files() <= before:
                    break
                time.sleep(0.05)
            assert open_files() <= before
        assert srv.calls("synthesize") == (3 if backend == "openai" else 0)


def _held_deleted(prefix: Path) -> list[str]:
    """The deleted files under ``prefix`` this process still holds open (Linux: ``/proc``)."""
    import os

    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(prefix)) and target.endswith("(deleted)"):
            out.append(target)
    return out


def test_a_long_lived_agent_lets_go_of_the_generations_a_re_index_replaced(tmp_path, monkeypatch) -> None:
    """A service's agent asked between re-indexes kept every replaced generation's files open
    (three descriptors each, deleted but holding their disk space): the reader a re-index
    replaces was left to the garbage collector, which closed its database but not the
    descriptors that keep a deleted generation readable."""
    import gc

    from crag.index import index_roots

    docs = tmp_path / "docs"
    docs.mkdir()
    monkeypatch.chdir(tmp_path)
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline"}
    with Agent.from_env([docs], environ=env, dotenv=None) as agent:
        for round in range(4):
            (docs / "retry.md").write_text(f"# Retries\n\ncrag retries {round + 1} times on 429.\n", encoding="utf-8")
            index_roots(agent.settings, [docs])  # publishes a new generation, deletes the old one
            assert f"{round + 1} times" in agent.ask("How many times does crag retry?").answer
            gc.collect()
            assert _held_deleted(tmp_path / "i") == []


def test_a_replaced_generations_database_is_let_go_of_without_waiting_for_the_garbage_collector(
        tmp_path, monkeypatch) -> None:
    """A replaced reader's descriptors were closed as soon as it was dropped, but its SQLite
    connection (a reference cycle of its own) only at the next full collection, which a
    long-lived server may not run for hours: ``crag mcp`` held a deleted database per re-index
    open, and with it that database's disk space."""
    import gc

    from crag.index import index_roots

    docs = tmp_path / "docs"
    docs.mkdir()
    monkeypatch.chdir(tmp_path)
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline"}
    with Agent.from_env([docs], environ=env, dotenv=None) as agent:
        gc.collect()
        gc.disable()
        try:
            for round in range(3):
                (docs / "retry.md").write_text(f"# Retries\n\ncrag retries {round + 1} times on 429.\n",
                                               encoding="utf-8")
                index_roots(agent.settings, [docs])
                assert f"{round + 1} times" in agent.ask("How many times does crag retry?").answer
                assert _held_deleted(tmp_path / "i") == []
        finally:
            gc.enable()


def test_an_agent_searches_an_index_folder_deleted_and_built_again_not_the_one_it_had_open(
        tmp_path, monkeypatch) -> None:
    """``rm -rf .crag && crag index other`` while a service's agent was open: the new index's
    first generation has the old one's name (gen-000001), and the agent went on searching and
    citing the deleted one, where ``crag search`` and the agent's own ``read_file`` saw the new."""
    import shutil

    from crag.index import index_roots

    for name, port in (("alpha", 7001), ("beta", 7002)):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.md").write_text(f"# {name}\n\nThe {name} service listens on port {port}.\n",
                                                 encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline"}
    with Agent.from_env(environ=env, dotenv=None) as agent:
        index_roots(agent.settings, [tmp_path / "alpha"])
        assert [h.source for h in agent.search("service port")] == ["alpha/alpha.md"]
        shutil.rmtree(tmp_path / "i")
        index_roots(agent.settings, [tmp_path / "beta"])
        assert [h.source for h in agent.search("service port")] == ["beta/beta.md"]
        assert [c.path for c in agent.ask("Which port does the service listen on?").citations] == ["beta/beta.md"]


def test_the_other_arguments_of_the_wrong_type_are_usage_errors_said_before_any_work(tmp_path) -> None:
    """``Settings.from_env(dotenv=1)``, ``environ=[...]``, ``Agent.from_env(tools=5)``,
    ``progress=5`` and ``agent.stream(q, on_event=5)`` were TypeErrors and AttributeErrors from
    crag's insides; ``progress=5`` failed half way through indexing, ``on_event=5`` only once the
    stream was iterated."""
    from crag import Tool

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nThe server listens on port 8080.\n", encoding="utf-8")
    env = {"KB_AGENT_INDEX_DIR": str(tmp_path / "i"), "KB_AGENT_LLM": "offline"}
    for dotenv in (1, True, 2.5, ["a.env"]):
        with pytest.raises(crag.UsageError, match=r"^dotenv must be the path of a \.env file or None"):
            Settings.from_env(environ={}, dotenv=dotenv)
        with pytest.raises(crag.UsageError, match=r"^dotenv must be the path"):
            Agent.from_env(environ=env, dotenv=dotenv)
    with pytest.raises(crag.UsageError, match=r"^environ must be a mapping"):
        Settings.from_env(environ=[("KB_AGENT_TOP_K", "3")], dotenv=None)
    # A name that is not text was passed over by Settings and a TypeError in Agent.from_env's
    # warnings; a value given as bytes was read as its repr, the model "b'gpt-4o'".
    for environ in ({b"KB_AGENT_MODEL": "gpt-4o"}, {**env, 1: "x"}):
        with pytest.raises(crag.UsageError, match=r"^environ's variable names must be text \(str\), not (bytes|int)$"):
            Settings.from_env(environ=environ, dotenv=None)
        with pytest.raises(crag.UsageError, match=r"^environ's variable names must be text"):
            Agent.from_env(docs, environ=environ, dotenv=None)
    assert Settings.from_env(environ={"KB_AGENT_MODEL": b"gpt-4o"}, dotenv=None).model == "gpt-4o"
    for tools in (5, object()):
        with pytest.raises(crag.UsageError, match=r"^tools must be a crag\.Tool or a list of them"):
            Agent.from_env(docs, environ=env, dotenv=None, tools=tools)
    with pytest.raises(crag.UsageError, match=r"^progress must be callable"):
        Agent.from_env(docs, environ=env, dotenv=None, progress=5)
    assert not (tmp_path / "i").exists()  # refused before anything was indexed
    own = Tool(name="ticket_lookup", description="read a ticket", run=lambda args, context: [])
    for tools in (own, [own], None):  # one tool is that tool, as one path is one root
        with Agent.from_env(docs, environ=env, dotenv=None, tools=tools) as agent:
            assert ("ticket_lookup" in [t.name for t in agent.toolbox.tools()]) is (tools is not None)
            with pytest.raises(crag.UsageError, match=r"^on_event must be callable"):
                agent.stream("which port?", on_event=5)
            with pytest.raises(crag.UsageError, match=r"^on_event must be callable"):
                agent.astream("which port?", on_event=5)


def test_an_async_event_handler_is_a_usage_error_not_every_event_lost() -> None:
    """``on_event`` is called, never awaited: an ``async def`` handler (a service forwarding
    events to a websocket, say) was accepted by ``ask``, ``aask``, ``stream`` and ``astream``,
    and each event became a coroutine never awaited, so the handler saw nothing and the answer
    came back as if all was well."""
    seen: list[object] = []

    async def handler(event) -> None:
        seen.append(event)

    class Forwarder:
        async def __call__(self, event) -> None:
            seen.append(event)

    agent = Agent(ScriptedChatModel({"analyze_and_route": [route("chitchat")], "synthesize": ["Hello!"]}),
                  FakeToolbox(), Settings())
    for on_event in (handler, Forwarder()):
        with pytest.raises(crag.UsageError, match=r"^on_event must be a plain function, not async"):
            agent.ask("hi", on_event=on_event)
        with pytest.raises(crag.UsageError, match=r"^on_event must be a plain function, not async"):
            agent.stream("hi", on_event=on_event)
        with pytest.raises(crag.UsageError, match=r"^on_event must be a plain function, not async"):
            agent.astream("hi", on_event=on_event)
        with pytest.raises(crag.UsageError, match=r"^on_event must be a plain function, not async"):
            asyncio.run(agent.aask("hi", on_event=on_event))
    assert not seen
    assert agent.ask("hi", on_event=seen.append).answer.startswith("Hello!") and seen  # a plain one is called


def test_a_plain_handler_that_returns_a_coroutine_is_a_usage_error_at_its_first_event() -> None:
    """``on_event=lambda event: queue.put(event)`` (an ``asyncio.Queue``'s ``put`` is async) is
    a plain function, so it passed the check for an ``async def`` handler, and each event it
    was given became a coroutine never awaited: the handler saw nothing and the answer came
    back as if all was well. A handler that schedules a task (``create_task``) still works."""
    model = ScriptedChatModel({"analyze_and_route": [route("chitchat")] * 4, "synthesize": ["Hello!"] * 4})
    agent = Agent(model, FakeToolbox(), Settings())
    put: list[object] = []

    async def store(event) -> None:
        put.append(event)

    def forward(event):
        return store(event)

    async def streamed() -> str:
        return "".join([chunk async for chunk in agent.astream("hi", on_event=forward)])

    refused = r"^on_event must be a plain function, not async: it returned a coroutine"
    with pytest.raises(crag.UsageError, match=refused):
        agent.ask("hi", on_event=forward)
    with pytest.raises(crag.UsageError, match=refused):
        asyncio.run(agent.aask("hi", on_event=forward))
    assert not model.calls("analyze_and_route")  # refused before any call to the model
    with pytest.raises(crag.UsageError, match=refused):
        "".join(agent.stream("hi", on_event=forward))
    with pytest.raises(crag.UsageError, match=refused):
        asyncio.run(streamed())
    assert not put

    async def scheduled() -> crag.Answer:
        answer = await agent.aask("hi", on_event=lambda event: asyncio.get_running_loop().create_task(store(event)))
        await asyncio.sleep(0)
        return answer

    assert asyncio.run(scheduled()).answer.startswith("Hello!") and put

def test_every_error_crag_raises_on_purpose_can_be_caught_by_its_name_from_crag() -> None:
    """``crag.IndexFormatError`` (an index written by a newer crag) was raised to library users
    but was no name of ``crag``, unlike its sibling ``crag.EmbedderMismatchError``."""
    import crag.errors

    for name in crag.errors.__all__:
        assert name in crag.__all__ and getattr(crag, name) is getattr(crag.errors, name), name


def test_every_crag_error_crosses_a_process_boundary_as_itself() -> None:
    """A ``ConfigError`` raised in a ``ProcessPoolExecutor`` worker (``Agent.from_env(top_k="lots")``)
    broke the whole pool (``BrokenProcessPool`` for that call and every later one): the parent
    unpickles an exception by calling its class with its message alone, which ``ConfigError``,
    ``UnknownSettingError`` and ``ToolError`` do not take."""
    import pickle

    from crag.answer_log import LogError

    errors = [
        crag.ConfigError("KB_AGENT_TOP_K", "lots", "a whole number from 1 to 50"),
        crag.UnknownSettingError("topk", ("top_k", "model")),
        crag.ToolError("vector_search", "the index is busy"),
        crag.LLMContextError("too long", node="plan", status=400, window=4096),
        crag.IndexStoreError("no index in .crag", index_dir=".crag"),
        crag.UsageError("the question is empty"),
        LogError("the answer log is damaged"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error), error
        assert vars(copy) == vars(error), error


def test_agent_settings_of_the_wrong_type_are_a_usage_error_when_the_agent_is_made() -> None:
    """``Agent(model, toolbox, {"top_k": 3})`` (or the class ``Settings``) was accepted and
    failed at the first question with an AttributeError from crag's insides."""
    for settings in ({"top_k": 3}, Settings, 5):
        with pytest.raises(crag.UsageError, match=r"^settings must be a crag\.Settings"):
            Agent(ScriptedChatModel(), FakeToolbox(), settings)


def test_a_scripted_model_takes_one_reply_as_one_reply_and_names_a_node_it_does_not_know() -> None:
    """``ScriptedChatModel({"synthesize": "Hello!"})`` replayed "H", "e", "l", ... one character
    a call; a misspelt node ("synthesise") was kept and never used; ``ScriptedChatModel(5)`` was
    an AttributeError."""
    model = ScriptedChatModel({"analyze_and_route": route("chitchat", ()), "synthesize": "Hello there!"})
    assert Agent(model, FakeToolbox(), Settings()).ask("hi").answer.startswith("Hello there!")
    with pytest.raises(crag.UsageError, match=r"^the scripted model has no node synthesise \(the nodes: "
                                               r"analyze_and_route, plan, tool_exec, grade_evidence, synthesize\)"):
        ScriptedChatModel({"synthesise": ["Hello!"]})
    with pytest.raises(crag.UsageError, match=r"^the scripted model has no node synthesise"):
        ScriptedChatModel().push("synthesise", "Hello!")
    for replies in (5, ["Hello!"]):
        with pytest.raises(crag.UsageError, match=r"^replies must be a mapping of node names to replies"):
            ScriptedChatModel(replies)


def test_a_library_user_is_warned_about_unknown_names_and_bad_dotenv_lines_as_the_cli_user_is(
        tmp_path, monkeypatch) -> None:
    """SPEC §3: unknown ``KB_AGENT_*`` names and ``.env`` lines that are not assignments are warned
    about. ``crag`` said so on stderr; ``Agent.from_env``, which reads the same settings, said
    nothing, so a program whose ``KB_AGENT_TOPK=8`` was ignored never learnt why."""
    from .fakes import clean_env

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("KB_AGENT_TOPK=8\nKB_AGENT_LLM offline\n", encoding="utf-8")
    monkeypatch.setenv("KB_AGENT_GROUDNING", "strict")
    with pytest.warns(crag.CragWarning) as caught:
        Agent.from_env(chat_model=ScriptedChatModel(), toolbox=FakeToolbox()).close()
    said = [str(w.message) for w in caught]
    assert said == [".env line 2 is not an assignment (NAME=value); it is ignored; did you mean KB_AGENT_LLM=...?",
                    "KB_AGENT_TOPK (in .env) is not a crag setting; did you mean KB_AGENT_TOP_K?",
                    "KB_AGENT_GROUDNING (in the environment) is not a crag setting; did you mean KB_AGENT_GROUNDING?"]
    with pytest.warns(crag.CragWarning, match=r"^KB_AGENT_TOPK \(in the environment\)"):
        Agent.from_env(chat_model=ScriptedChatModel(), toolbox=FakeToolbox(), environ={"KB_AGENT_TOPK": "8"},
                       dotenv=None).close()


def test_the_cli_says_each_configuration_warning_once_though_ask_builds_its_agent_from_env(
        tmp_path, monkeypatch) -> None:
    from .fakes import clean_env, cli

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_TOPK", "8")
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    code, out, err = cli("ask", "hello")
    assert code == 0 and out.startswith("Hello")
    assert err.count("KB_AGENT_TOPK (in the environment) is not a crag setting") == 1, err
