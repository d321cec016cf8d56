"""Grounded streaming: an answer shown while the model writes it, exactly as ``ask`` returns it.

    stream = agent.stream("How do I configure retries?")
    for chunk in stream:            # grounded text, a sentence or a few at a time
        print(chunk, end="", flush=True)
    stream.result                   # the Answer: ask()'s record, citations, usage, state

The chunks join to exactly ``stream.result.answer``, the text ``ask`` returns for the same
run, for every reply: a chunk is only text that nothing the model writes later can change.
Each sentence appears once it is final, already grounded, its markers moved to the passages
that support it and numbered as the footer numbers them. Held back until it is final: a
sentence that may still grow or join the next one, a line that may still become a heading,
list item, table, fence or usage block, a code span, think block or escape string not yet
closed, a marker in the making, and everything before the first sentence that ends with a
citation marker (until then a lone ``</think>`` would make it reasoning; ``crag.prompts.strip_think``). What
the finished answer adds after the streamed text (the notes, the citation footer, the usage
block) is the last chunk.

Held back whole, the answer is the last chunk: when grounding's verdict may still replace
its opening (no informative grade approved the evidence, as on the simple path, or the
question names a term no item holds; in ``note`` and ``strict``: ``grounding.verdict``
``not_answered`` opens the answer by saying
the knowledge base does not appear to answer the question, and is known only once every
sentence is in), an answer with no evidence (chitchat, whose markers are removed), a reply with no
cited sentence, a backend that does
not stream, and the no-evidence sentence. In ``strict`` grounding nothing is shown before
the first supported sentence either, since the answer may still become the no-evidence
sentence. ``stream.restarted`` stays for callers that checked it; it is True only if the
finished answer did not extend what was shown (the last chunk is then a blank line and the
whole answer), which the property tests in tests/test_stream.py check never happens.

``AnswerText`` is the pure part (driver events in, text out; no thread, no I/O).
``AnswerStream`` and ``AsyncAnswerStream`` run the question on a thread of their own, start
it when iteration starts, and hand its events over in order: ``on_event``, when given, is
called on the iterating thread (or the event loop), just before the chunk the event
produced. Stopping early (``break``, closing the iterator) makes the run stop at its next
event; a run that fails raises its error from the iteration.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from .answer import StreamRenderer
from .errors import UsageError
from .events import AnswerDelta, AnswerStarted, Event, EventHandler
from .grounding import addresses, cited, holds_focus, says_nothing_new
from .grounding.engine import ground_prefix
from .grounding.verdict import Verdict, judge
from .prompts import clean_answer, strip_think

if TYPE_CHECKING:
    from .agent import Answer

__all__ = ["AnswerStream", "AnswerText", "AsyncAnswerStream"]


def _unthink(text: str) -> str:
    return strip_think(text, answer=True)


class AnswerText:
    """The grounded answer text of one run, from its driver events: ``event`` returns what
    the event lets show now, ``finish`` what the finished answer adds after it."""

    def __init__(self, grounding: str = "note", every: int = 32) -> None:
        self.grounding = str(grounding)  # KB_AGENT_GROUNDING: the stream shows the grounded answer
        self.every = every
        self.renderer: StreamRenderer | None = None
        self.held = False  # nothing is shown before the verdict is known
        self.answered = False  # the final pieces so far make the verdict ``answered`` already
        self.restarted = False

    @property
    def shown(self) -> str:
        return self.renderer.shown if self.renderer is not None else ""

    def event(self, event: Event) -> str:
        if isinstance(event, AnswerStarted):
            items, question, mode = event.items, event.question, self.grounding
            ground = None
            if items:  # as synthesize grounds it ("off": markers pointed at the items, no verdicts)
                ground = self._grounder(items, question, mode, event.absent)
            shown = self.shown  # a request fitted to a smaller window starts again; nothing was shown
            self.renderer = StreamRenderer(len(items), clean_answer, _unthink, every=self.every, ground=ground)
            self.renderer.shown = shown
            # The verdict may replace the answer's opening (not_answered): held until it is known.
            # Chitchat is held whole: its markers and any source list the model wrote are
            # removed only from the finished text (answer.without_citations).
            self.held = event.chitchat or (bool(items) and mode != "off" and event.verdict_may_rewrite)
            self.answered = False
            return ""
        if isinstance(event, AnswerDelta) and self.renderer is not None:
            if not self.held:
                return self.renderer.feed(event.text)
            before = self.renderer.shown
            new = self.renderer.feed(event.text)
            if self.answered:  # the verdict is answered whatever follows: show from here on
                self.held = False
                return new
            self.renderer.shown = before
        return ""

    def _grounder(self, items, question: str, mode: str, absent: tuple[str, ...]):
        """The renderer's grounding of the final pieces so far; while the answer is held, it
        also asks the verdict (``crag.grounding.verdict.judge``) of those pieces: once a
        supported sentence holds the question's focus, the verdict is ``answered`` whatever the
        model writes next (more pieces only add support), so nothing can replace the opening."""

        def ground(text: str, others) -> tuple[str, int]:
            done = ground_prefix(text, items, mode, question, others, absent)
            if done is None or (mode == "strict" and not done.report.supported):
                return "", 0  # strict: it may still become the no-evidence sentence
            if self.held and not self.answered and not absent:
                chosen = cited(done.sources, items)
                said = [j.sentence for j in done.report.judgements if j.supported]
                addressed = (addresses(question, [item.text for item in chosen])
                             and not says_nothing_new(question, said))
                held = addressed and holds_focus(question, chosen)
                # Only what more sentences cannot undo: supported passages that hold the question's
                # focus and say something it does not (a majority of supported sentences so far
                # may still become a minority).
                self.answered = held and judge(done.report, False, absent, addressed, held) is Verdict.ANSWERED
            return done.body, len(done.sources)

        return ground

    def finish(self, answer: str) -> str:
        """The rest of ``answer`` after what was shown (all of it when nothing was)."""
        shown = self.shown
        self.restarted = not answer.startswith(shown)
        return answer[len(shown) :] if not self.restarted else "\n\n" + answer


class _Closed(BaseException):
    """Raised inside the run, at its next event, when the stream was closed: the run stops.
    A BaseException, so no ``except Exception`` on the way turns it into an error to report."""


class _Run:
    """The question on a thread of its own; its events, then its Answer or its error, go
    to ``put`` as ("event", event), ("done", answer) or ("error", exc)."""

    def __init__(self, ask: Callable[[EventHandler], Answer], put: Callable[[tuple[str, Any]], None]) -> None:
        self.ask = ask
        self.put = put
        self.closed = False
        self.cancel = threading.Event()  # set by close: a request under way stops too (crag.llm.deadline)

    def close(self) -> None:
        self.closed = True
        self.cancel.set()

    def start(self) -> None:
        threading.Thread(target=self._work, name="crag-stream", daemon=True).start()

    def on_event(self, event: Event) -> None:
        if self.closed:
            raise _Closed
        self.put(("event", event))

    def _work(self) -> None:
        from .llm.deadline import cancellable

        try:
            with cancellable(self.cancel):
                item: tuple[str, Any] = ("done", self.ask(self.on_event))
        except _Closed:
            return
        except BaseException as exc:  # handed to the iterating thread, which raises it
            item = ("error", exc)
        if not self.closed:
            try:
                self.put(item)
            except RuntimeError:  # the event loop that was waiting for it is closed
                pass


class _Stream:
    """What the sync and async streams share: the text, the result, one item's handling."""

    def __init__(self, ask: Callable[[EventHandler], Answer], grounding: str, on_event: EventHandler | None = None) -> None:
        self._ask = ask
        self._text = AnswerText(grounding)
        self._on_event = on_event
        self._result: Answer | None = None
        self._started = False

    @property
    def result(self) -> Answer:
        """The finished run's ``Answer`` (the same record ``ask`` returns)."""
        if self._result is None:
            raise UsageError("the stream has not finished: iterate it to the end first")
        return self._result

    @property
    def restarted(self) -> bool:
        """Whether the finished answer did not extend what was streamed: never, unless crag
        has a bug (see the module doc)."""
        return self._text.restarted

    def _begin(self) -> None:
        if self._started:
            raise UsageError("an answer stream can be iterated once")
        self._started = True

    def _take(self, kind: str, value: Any) -> str:
        """The text an item from the run adds; raises the run's error."""
        if kind == "event":
            if self._on_event is not None:
                self._on_event(value)
            return self._text.event(value)
        if kind == "error":
            raise value
        self._result = value
        return self._text.finish(value.answer)


class AnswerStream(_Stream):
    """The grounded chunks of one question's answer (``Agent.stream``); ``result`` after."""

    def __iter__(self) -> Iterator[str]:
        self._begin()
        items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        run = _Run(self._ask, items.put)
        run.start()
        try:
            while self._result is None:
                text = self._take(*items.get())
                if text:
                    yield text
        finally:
            run.close()


class AsyncAnswerStream(_Stream):
    """``AnswerStream`` for an event loop (``Agent.astream``): ``async for chunk in ...``."""

    def __aiter__(self) -> AsyncIterator[str]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[str]:
        import asyncio

        self._begin()
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        run = _Run(self._ask, lambda item: loop.call_soon_threadsafe(items.put_nowait, item))
        run.start()
        try:
            while self._result is None:
                text = self._take(*await items.get())
                if text:
                    yield text
        finally:
            run.close()
