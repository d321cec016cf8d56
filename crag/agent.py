"""The library API: ``Agent`` answers questions and returns a frozen ``Answer``.

    from crag import Agent
    agent = Agent.from_env(kb=["docs"])           # same settings as the CLI, plus overrides
    result = agent.ask("How do I configure retries?", history=[...])
    print(result.answer); result.citations; result.usage.llm_calls; result.state

Keyword overrides of ``from_env`` are ``Settings`` field names (``model="gpt-4o"``,
``top_k=8``); your own parts go in under names no setting has: ``chat_model=`` (any
``ChatModel``; for tests ``crag.ScriptedChatModel``), ``toolbox=`` (a whole ``Toolbox``),
``tools=`` (``crag.Tool`` records added to the built-in tools). ``Agent(chat_model,
toolbox, settings)`` wires the parts directly. ``await agent.aask(...)`` runs the same
question in a worker thread so an event loop is never blocked. ``agent.search(query,
top_k=8)`` is retrieval alone, what ``crag search`` prints: no model is asked.
``agent.stream(question)`` (and ``astream``) yields the grounded answer while the model
writes it, in chunks that join to the answer ``ask`` returns (``crag.stream``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from .config import MAX_WINDOW, Settings
from .driver import Driver
from .errors import IndexStoreError, UsageError
from .events import EventHandler, NodeStarted
from .history import fitting_turns, input_limit, parse_history, too_long
from .nodes import NodeConfig
from .ports import ChatModel, Toolbox
from .safe_text import blank, valid_text
from .state import (
    AgentState,
    Citation,
    Complexity,
    EvidenceItem,
    GraderAction,
    GroundingReport,
    Judgement,
    Message,
    Usage,
    output_converter,
)
from .toolspec import MAX_TOP_K, Tool, ToolResult, question_search

if TYPE_CHECKING:
    from .stream import AnswerStream, AsyncAnswerStream

__all__ = ["Agent", "Answer", "parse_history", "search"]


@frozen
class Answer:
    """The result of one question: the text users read, and everything behind it.

    ``complexity`` and ``grader_action`` are the enums the state holds (``Complexity``,
    ``GraderAction``; each compares equal to its word, ``"GENERATE"``), None when the run
    did not classify or grade; ``grounding`` is the grounding report (None with
    ``KB_AGENT_GROUNDING=off`` or no answer to ground). ``to_dict`` is ``ask --json``.
    """

    answer: str
    citations: tuple[Citation, ...]
    usage: Usage
    trace: tuple[str, ...]
    state: AgentState

    @property
    def body(self) -> str:
        """The answer without its footer and usage block (``ask --json``'s ``body``): the text,
        with its ``[K]`` markers and any note lines."""
        from .answer import answer_parts

        return answer_parts(self.answer, self.citations)[0]

    @property
    def without_usage(self) -> str:
        """The answer without its usage block: body, notes and footer (``--no-usage``)."""
        from .answer import answer_parts

        body, footer, _ = answer_parts(self.answer, self.citations)
        return f"{body}\n\n{footer}" if footer else body

    @property
    def question(self) -> str:
        return self.state.question

    @property
    def complexity(self) -> Complexity | None:
        return self.state.complexity

    @property
    def grader_action(self) -> GraderAction | None:
        return self.state.grader_action

    @property
    def grounding(self) -> GroundingReport | None:
        return self.state.grounding

    @property
    def iterations(self) -> int:
        return self.state.iteration

    @property
    def evidence_scores(self) -> tuple[float, ...]:
        return self.state.evidence_scores

    @property
    def audit(self) -> list[dict[str, Any]]:
        return output_converter.unstructure(self.state.audit)

    @property
    def judgements(self) -> tuple[Judgement, ...]:
        """Each judged sentence's verdict (docs/grounding.md); empty when nothing was grounded."""
        return self.grounding.judgements if self.grounding is not None else ()

    def to_dict(self) -> dict[str, Any]:
        """The object ``ask --json`` prints (docs/wire-contract.md), by ``output_converter``."""
        return output_converter.unstructure(self)


def _answer_json(a: Answer) -> dict[str, Any]:
    return {
        "question": a.question,
        "answer": a.answer,
        "body": a.body,
        "complexity": a.complexity.value if a.complexity is not None else None,
        "grader_action": a.grader_action.value if a.grader_action is not None else None,
        "iterations": a.iterations,
        "trace": list(a.trace),
        "evidence_scores": [round(s, 4) for s in a.evidence_scores],
        "citations": output_converter.unstructure(a.citations),
        "usage": output_converter.unstructure(a.usage),
        "audit": output_converter.unstructure(a.state.audit),
        "grounding": output_converter.unstructure(a.grounding),
        "judgements": output_converter.unstructure(a.judgements),
    }


output_converter.register_unstructure_hook(Answer, _answer_json)


class Agent:
    """A configured crag: a chat model, a toolbox and the settings, reusable across questions."""

    def __init__(self, chat_model: ChatModel, toolbox: Toolbox, settings: Settings | None = None) -> None:
        if not callable(getattr(chat_model, "complete", None)):
            raise UsageError(f"chat_model must be a crag.ChatModel (with .complete), not {type(chat_model).__name__}")
        if not all(callable(getattr(toolbox, name, None)) for name in ("tools", "run")):
            raise UsageError(f"toolbox must be a crag.Toolbox (with .tools and .run), not {type(toolbox).__name__}")
        if settings is not None and not isinstance(settings, Settings):
            raise UsageError("settings must be a crag.Settings (Settings(top_k=8), Settings.from_env()), "
                             f"not {type(settings).__name__ if not isinstance(settings, type) else 'the class itself'}")
        self.settings = Settings() if settings is None else settings
        self.model = chat_model
        self.toolbox = toolbox
        nodes = self.settings  # a model that sends no prompt has no window: a long question is no error
        if getattr(chat_model, "fits_any_prompt", False) is True:
            nodes = evolve(nodes, context_tokens=MAX_WINDOW)
        self.driver = Driver(chat_model, toolbox, NodeConfig.from_settings(nodes, toolbox.tools(), _token_counter(chat_model)))
        self._owned: list[Any] = []  # what from_env built, closed with the agent

    @classmethod
    def from_env(
        cls,
        kb: Sequence[str | os.PathLike[str]] | str | os.PathLike[str] | None = None,
        *,
        chat_model: ChatModel | None = None,
        toolbox: Toolbox | None = None,
        tools: Sequence[Tool] | Tool | None = (),
        environ: Mapping[str, str] | None = None,
        dotenv: str | os.PathLike[str] | None = ".env",
        progress: Callable[..., None] | None = None,
        **settings: Any,
    ) -> Agent:
        """An agent from the environment, ``.env`` and keyword overrides (field names of ``Settings``).

        ``kb`` names the knowledge-base roots (one path or a list of them): they are indexed first when new or changed,
        and the tools look only inside them. Without it every root the index holds is used.
        ``chat_model`` and ``toolbox`` replace the ones the settings would build; ``tools``
        adds your own ``Tool`` records to the built-in tools (neither it nor ``kb`` with ``toolbox``).
        """
        if progress is not None and not callable(progress):
            raise UsageError(f"progress must be callable (it receives the indexer's progress), not {type(progress).__name__}")
        tools = _tool_list(tools)
        if isinstance(kb, (str, bytes, os.PathLike)):  # one path is one root, not its characters
            kb = [kb]
        kb = list(kb) if isinstance(kb, Iterable) else kb
        if kb is not None and (not isinstance(kb, list) or not all(isinstance(p, (str, bytes, os.PathLike)) for p in kb)):
            raise UsageError("kb must be a path or a list of paths (str, bytes or os.PathLike)")
        if toolbox is not None and tools:
            raise UsageError("pass tools= or toolbox=, not both: a toolbox of your own holds its own tools")
        if toolbox is not None and kb:  # it would be neither indexed nor the tools' bound
            raise UsageError("pass kb= or toolbox=, not both: a toolbox of your own searches its own roots")
        config = Settings.from_env(environ, dotenv, **settings)
        _warn_about_configuration(environ, dotenv)
        roots = [os.fsdecode(p) for p in kb] if kb else None
        owned: list[Any] = []
        if toolbox is None:
            from .index import ensure_indexed, warn_skipped
            from .tools import Toolbox as LocalToolbox

            if roots:  # a file it could not read is a warning: the answer cannot say why it is not cited
                warn_skipped(ensure_indexed(config, roots, progress=progress))
            toolbox = LocalToolbox(config, roots=roots, tools=tools)
            owned.append(toolbox)
        if chat_model is None:
            from .llm import make_chat_model

            chat_model = make_chat_model(config)
            owned.append(chat_model)
        agent = cls(chat_model, toolbox, config)
        agent._owned = owned
        return agent

    def ask(
        self,
        question: str,
        history: Iterable[Any] = (),
        on_event: EventHandler | None = None,
        stream: bool = False,
    ) -> Answer:
        """Answer one question. ``history`` is a list of ``{"role", "content"}`` dicts or Messages."""
        _check_text("the question", question)
        on_event = _check_handler(on_event)
        limit = input_limit(self.settings)
        if len(question) > limit and len(question := question.strip()) > limit:
            raise too_long("the question", len(question), self.settings)
        # Bytes that were not UTF-8 (a command line, a JSON escape) cannot go to a server as they are.
        turns = tuple(Message(m.role, valid_text(m.content)) for m in fitting_turns(parse_history(history), limit))
        on_event = self._index_guard(on_event)
        state = self.driver.run(valid_text(question.strip()), turns, on_event, stream)
        return Answer(
            answer=state.answer or "",
            citations=state.citations,
            usage=state.usage,
            trace=state.trace,
            state=state,
        )

    def _index_guard(self, on_event: EventHandler | None) -> EventHandler | None:
        """``on_event``, or, when crag's own toolbox finds no usable index (missing, damaged,
        built with another embedder), a handler that raises that error as ``plan`` starts: a
        question fails before any call is spent on planning or searching (SPEC §4: exit 1),
        while a greeting, which ``analyze_and_route`` answers as chitchat, is still answered."""
        check = getattr(self.toolbox, "check", None)
        if not callable(check):
            return on_event
        try:
            check()
        except IndexStoreError as exc:
            error = exc
        else:
            return on_event

        def guard(event: Any) -> None:
            if isinstance(event, NodeStarted) and event.node == "plan":
                raise error
            if on_event is not None:
                on_event(event)

        return guard

    async def aask(
        self,
        question: str,
        history: Iterable[Any] = (),
        on_event: EventHandler | None = None,
        stream: bool = False,
    ) -> Answer:
        """``ask`` without blocking the event loop: it runs in a thread of its own, and a
        cancelled await (``asyncio.wait_for``, ``task.cancel()``) stops it at its next wait for
        a server (``crag.llm.deadline``) instead of letting it run on, holding up the loop's
        shutdown. ``on_event`` is called on the loop's thread, as ``astream``'s is."""
        import asyncio
        import contextvars
        import threading

        from .llm.deadline import cancellable

        on_event = _check_handler(on_event)
        turns = parse_history(history)
        context = contextvars.copy_context()  # as asyncio.to_thread does
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Answer] = loop.create_future()
        cancel = threading.Event()
        if on_event is not None:
            on_event = _on_loop(on_event, loop, cancel)

        def settle(result: Answer | None, error: BaseException | None) -> None:
            if done.done():  # cancelled meanwhile
                return
            if error is not None or result is None:
                done.set_exception(error or RuntimeError("the question ended without an answer"))
            else:
                done.set_result(result)

        def run() -> Answer:
            with cancellable(cancel):
                return self.ask(question, turns, on_event, stream)

        def work() -> None:
            result, error = None, None
            try:
                result = context.run(run)
            except BaseException as exc:  # handed to the awaiting task, which raises it
                error = exc
            if not cancel.is_set():
                try:
                    loop.call_soon_threadsafe(settle, result, error)
                except RuntimeError:  # the loop that was waiting is closed
                    pass

        threading.Thread(target=work, name="crag-aask", daemon=True).start()
        try:
            return await done
        except asyncio.CancelledError:
            cancel.set()
            raise

    def stream(self, question: str, history: Iterable[Any] = (), on_event: EventHandler | None = None) -> AnswerStream:
        """``ask`` with the answer shown as the model writes it: iterate the returned stream
        for grounded text chunks that join to the answer ``ask`` returns, then read its
        ``result`` (the ``Answer``). ``crag.stream`` says what the chunks are and when."""
        from .stream import AnswerStream

        return AnswerStream(*self._streamed(question, history, on_event))

    def astream(self, question: str, history: Iterable[Any] = (), on_event: EventHandler | None = None) -> AsyncAnswerStream:
        """``stream`` for an event loop: ``async for chunk in agent.astream(...)``, then ``.result``."""
        from .stream import AsyncAnswerStream

        return AsyncAnswerStream(*self._streamed(question, history, on_event))

    def _streamed(self, question: str, history: Iterable[Any],
                  on_event: EventHandler | None) -> tuple[Callable[[EventHandler], Answer], str, EventHandler | None]:
        """The streamed run of ``ask``, checked now, run when the stream is iterated; the
        grounding and the checked ``on_event`` the stream hands its events to."""
        _check_text("the question", question)
        on_event = _check_handler(on_event)
        turns = parse_history(history)
        return lambda relay: self.ask(question, turns, relay, stream=True), self.settings.grounding, on_event

    def search(self, query: str, top_k: int | None = None) -> tuple[EvidenceItem, ...]:
        """The knowledge-base passages that best match ``query``, best first: retrieval alone,
        as ``crag search`` does it (no model call). ``top_k`` hits (default ``KB_AGENT_TOP_K``,
        at most 50); each item has ``source``, ``start_line``, ``end_line``, ``score`` and ``text``."""
        return search(self.toolbox, query, self.settings.top_k if top_k is None else top_k)

    def close(self) -> None:
        """Stop the tool threads and close what ``from_env`` opened (HTTP clients, the index).
        An agent asked again after ``close`` opens them again, and its next ``close`` closes them."""
        self.driver.close()
        for part in self._owned:
            close = getattr(part, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def search(toolbox: Toolbox, query: str, top_k: int) -> tuple[EvidenceItem, ...]:
    """``query`` searched by the toolbox's search tool (the one that ``searches_question``),
    ``top_k`` hits at most ``MAX_TOP_K``; ``UsageError`` for an empty query or a ``top_k`` below 1.

    The one retrieval-only search: ``Agent.search``, ``crag search`` and the MCP server's
    ``search`` all run it, so they return the same hits for the same arguments."""
    _check_text("the search query", query)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise UsageError(f"top_k must be a whole number of hits (an int), got {top_k!r}")
    if top_k < 1:
        raise UsageError(f"top_k must be at least 1, got {top_k!r}")
    call = question_search(toolbox.tools(), valid_text(query), min(top_k, MAX_TOP_K))
    if call is None:
        raise UsageError("no tool of this toolbox searches the knowledge base")
    return ToolResult.of(toolbox.run(call)).items


def _check_text(what: str, value: object) -> None:
    """``UsageError`` for a question or query that is not text, or is blank (whitespace, control
    characters and escape sequences only: nothing to search for, nothing to log)."""
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text (a str), not {type(value).__name__}")
    if blank(value):
        raise UsageError(f"{what} is empty")


def _warn_about_configuration(environ: Mapping[str, str] | None, dotenv: str | os.PathLike[str] | None) -> None:
    """What the CLI says as ``crag: warning:`` about the settings (SPEC §3: unknown ``KB_AGENT_*``
    names, ``.env`` lines that are not assignments), said as ``CragWarning``s at the caller."""
    import warnings

    from .config import config_warnings
    from .errors import CragWarning

    for warning in config_warnings(environ, dotenv):
        warnings.warn(CragWarning(warning), stacklevel=3)


def _check_handler(on_event: Any) -> EventHandler | None:
    """``on_event`` checked, and refused (``UsageError``) at its first event when it returns a
    coroutine (``lambda event: queue.put(event)``): crag never awaits what it returns."""
    if on_event is not None and not callable(on_event):
        raise UsageError(f"on_event must be callable (it receives each crag.Event), not {type(on_event).__name__}")
    from inspect import iscoroutine, iscoroutinefunction

    if on_event is not None and (iscoroutinefunction(on_event) or iscoroutinefunction(type(on_event).__call__)):
        # crag calls the handler and never awaits it: every event would be lost unseen
        raise UsageError("on_event must be a plain function, not async: crag calls it without awaiting it "
                         "(under aask and astream on the event loop's thread, so it may put_nowait on an asyncio.Queue)")
    if on_event is None:
        return None

    def called(event: Any) -> None:
        if iscoroutine(result := on_event(event)):  # every event would be lost unseen, as above
            result.close()
            raise UsageError("on_event must be a plain function, not async: it returned a coroutine, which crag never "
                             "awaits (under aask and astream it runs on the event loop's thread: put_nowait on an "
                             "asyncio.Queue, or create_task)")

    return called


def _on_loop(on_event: EventHandler, loop: Any, cancel: Any) -> EventHandler:
    """``on_event`` for a question ``aask`` runs on a worker thread: each event is handled on
    the event loop's thread, in order, while the worker waits for it, so a handler may touch
    the loop's objects (an ``asyncio.Queue``), and one that raises stops the question, its
    error coming out of the await. A cancelled await (``cancel``) ends the wait."""
    from concurrent.futures import Future, wait

    from .llm.deadline import CANCEL_CHECK, Cancelled

    def handle(event: Any) -> None:
        handled: Future[None] = Future()

        def call() -> None:
            if not handled.set_running_or_notify_cancel():
                return
            try:
                on_event(event)
            except BaseException as exc:  # handed to the worker, which raises it
                handled.set_exception(exc)
            else:
                handled.set_result(None)

        try:
            loop.call_soon_threadsafe(call)
        except RuntimeError:  # the loop is closed: nothing awaits this question any more
            raise Cancelled("the event loop that awaited the question is closed") from None
        while not wait([handled], CANCEL_CHECK).done:
            if cancel.is_set() and handled.cancel():
                raise Cancelled("the call was cancelled")
        handled.result()

    return handle


def _tool_list(tools: object) -> list[Tool]:
    """``tools=`` of ``from_env`` as a list: one ``Tool`` is that tool (as one path is one root),
    None none; each element is checked by the toolbox (``tools must be crag.Tool records``)."""
    if tools is None:
        return []
    if isinstance(tools, Tool):
        return [tools]
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
        raise UsageError(f"tools must be a crag.Tool or a list of them, not {type(tools).__name__}")
    return list(tools)


def _token_counter(model: ChatModel) -> Callable[[str], int]:
    """Counts a prompt's tokens for the context budget: tiktoken, the larger of the model's
    encoding and cl100k_base (the older encoding splits non-English text into more tokens,
    closer to what local models' tokenizers do)."""
    from .llm.tokens import count_tokens, encoding_for_model

    encodings = tuple(dict.fromkeys((encoding_for_model(str(getattr(model, "model", "") or "")), "cl100k_base")))

    def count(text: str) -> int:
        try:
            return max(count_tokens(text, encoding) for encoding in encodings)
        except Exception:  # no tokenizer at all: the rough estimate errs on the high side
            from .budget import rough_count

            return rough_count(text)

    return count
