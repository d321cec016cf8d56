"""The driver: the only loop, and the only place node requests meet the outside world.

One step: look up the node, ``prepare`` its request, perform it (a chat completion through
the ``ChatModel`` port, or the round's tool calls through the ``Toolbox`` port, in parallel
threads when there are several), record the node in ``trace`` and the call in ``usage``,
``apply`` the reply, and ask ``graph.next_node`` where to go. The iteration cap lives in the
graph's table; as a second guard the loop refuses to run more steps than the longest legal
path, so no reply can keep a question running.

The state after every step is the whole truth: ``trace``, ``usage`` and the context window
requests are fitted to (``context_window``, after a server refused a longer request) are in
it, so a run can be inspected, or resumed with ``resume(state, node)``, between any two
steps. The driver's own ``cfg`` never changes; a window learnt from a server is also
offered to the driver's later questions (``learnt_window``), never to one already running.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import queue
import re
import threading
import unicodedata
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

from attrs import evolve

from .budget import HEADROOM, prompt_tokens
from .errors import CragError, LLMContextError, LLMError, ToolError, UsageError
from .events import AnswerDelta, AnswerStarted, EventHandler, NodeFinished, NodeStarted, RetryWaiting
from .graph import END, START, TRANSITIONS, GraphError, Node, Outcome, next_node
from .grounding import missing
from .llm.lease import fork_safe
from .llm.retry import WINDOW_ADVICE, reporting_waits
from .nodes import NODES, NodeConfig
from .nodes.synthesize import asked, verdict_may_rewrite
from .ports import ChatModel, LLMRequest, LLMRequests, Step, Toolbox, ToolOutcome, ToolRequest
from .state import AgentState, Message, Usage
from .text import one_line
from .toolspec import ToolResult

__all__ = ["Driver", "EventHandler", "max_steps"]



REFITS = 3  # times one request is fitted again to a smaller window the server reported
MIN_WINDOW = 1024  # below this, a window is too small to fit a request to


def smaller_window(current: int, reported: int | None, sent: int | None = None) -> int | None:
    """The window to fit a refused request to: the server's, when it said and it is smaller
    than the one used; else four fifths of the one used; None when that is too small.

    ``sent`` is what the refused request took (prompt tokens and reply budget, as crag counts
    them): the window used is then at most the one that request needed with its headroom, so
    a request far smaller than ``current`` is fitted to something smaller than itself, never
    sent again unchanged."""
    used = current if sent is None else min(current, math.ceil(sent / (1.0 - HEADROOM)))
    if reported is not None and reported < used:
        return reported if reported >= MIN_WINDOW else None
    smaller = used * 4 // 5
    return smaller if smaller >= MIN_WINDOW else None


def counted_longer(err: LLMContextError, sent: int, window: int | None) -> LLMContextError:
    """``err``, advising what can help when the refused request, as crag counts it (``sent``:
    its prompt and reply budget), was within the window the server named: the server's
    tokenizer counts the prompt longer, so setting KB_AGENT_CONTEXT_TOKENS to that window helps
    nothing. A larger window on the server does; a smaller setting does only when crag stopped
    for its number of tries and could have fitted to a smaller ``window`` (None: it could not)."""
    if err.window is None or sent > err.window or WINDOW_ADVICE not in str(err):
        return err
    lower = f", or set KB_AGENT_CONTEXT_TOKENS lower than {window}" if window is not None else ""
    advice = (f"crag counts the request as {sent} tokens and the server counts it longer (its tokenizer): "
              "give the model a larger window on the server (llama.cpp --ctx-size, vLLM --max-model-len, "
              f"Ollama num_ctx){lower}")
    err.args = (str(err).replace(WINDOW_ADVICE, advice, 1),)
    return err


_FIT_WINDOW = re.compile(r"KB_AGENT_CONTEXT_TOKENS=(\d+); (.*?)raise KB_AGENT_CONTEXT_TOKENS to match the server")


def learnt_window_named(message: str, setting: int) -> str:
    """A budget's refusal (``crag.budget.fit``) of a prompt fitted to a window the server's
    refusals taught crag (``context_refit``), smaller than KB_AGENT_CONTEXT_TOKENS: named as
    that window, with the setting the user made, and the server's window to raise (raising the
    setting would change nothing)."""
    found = _FIT_WINDOW.search(message)
    if found is None or int(found.group(1)) == setting:
        return message
    said = (f"the window of {int(found.group(1)):,} tokens the server's refusals left (KB_AGENT_CONTEXT_TOKENS="
            f"{setting}); {found.group(2)}give the model a larger window on the server")
    return message[: found.start()] + said + message[found.end():]


_NAMES = {node: node.value for node in Node}  # a node's name, without the Enum property per step


_PLAIN_FINISH = frozenset({"stop", "tool_calls", None})  # a reply that ended as replies do


def _noted(state: AgentState, node: str, request: LLMRequest, reply: Any) -> AgentState:
    """``state`` with what a reply says about itself audited: cut by its budget, a refusal, or counted
    by crag because the server's token counts were implausible (rare: no evolve otherwise)."""
    if reply.finish_reason in _PLAIN_FINISH and not (reply.refused or reply.usage_replaced or getattr(reply, "adapted", ())):
        return state  # the usual reply: nothing to audit, one test
    if reply.truncated:
        state = evolve(state, audit=state.log("reply_truncated", node=node, max_tokens=request.max_tokens))
    if reply.refused:
        state = evolve(state, audit=state.log("reply_refused", node=node, refusal=one_line(reply.refusal, 200)))
    elif reply.finish_reason == "content_filter":  # stopped by the filter after some text
        state = evolve(state, audit=state.log("reply_filtered", node=node))
    if reply.usage_replaced:
        state = evolve(state, audit=state.log("usage_implausible", node=node))
    if getattr(reply, "adapted", ()):
        state = evolve(state, audit=state.log("request_adapted", node=node, because_refused=list(reply.adapted)))
    return state


def max_steps(max_iterations: int) -> int:
    """The most node visits a question can take: per round analyze, plan, tool_exec, grade; then synthesize."""
    return 4 * max_iterations + 2


class Driver:
    """Runs questions through the graph with one chat model and one toolbox.

    ``learnt_window`` is the one thing a driver carries from one question to the next: the
    smallest context window a server asked for. A question that starts with it says so in its
    audit (``context_window_learnt``), so two identical questions that behave differently show
    why; set it to None to forget it."""

    def __init__(
        self,
        model: ChatModel,
        toolbox: Toolbox,
        cfg: NodeConfig,
        max_parallel_tools: int = 4,
    ) -> None:
        self.model = model
        self.toolbox = toolbox
        self.cfg = cfg
        self.max_parallel_tools = max_parallel_tools
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.learnt_window: int | None = None  # the smallest window a server asked for so far
        self._fitted: dict[int, NodeConfig] = {}
        fork_safe(self)

    def _forked(self) -> None:
        """In a forked child: the tool threads stayed in the parent (a pool without them would
        wait for ever); the child's next plan of several calls starts threads of its own."""
        self._pool = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_parallel_tools, thread_name_prefix="crag-tool")
            return self._pool

    def run(
        self,
        question: str,
        history: Sequence[Message] = (),
        on_event: EventHandler | None = None,
        stream: bool = False,
    ) -> AgentState:
        """Answer ``question``; returns the final state (``state.answer`` holds the text). The
        question is read composed (NFC): written decomposed (a name copied on macOS, Korean as
        jamo), its words were none of the composed evidence's, and a right answer was judged
        about something else."""
        window = self.learnt_window
        state = AgentState(
            question=unicodedata.normalize("NFC", question),
            history=tuple(history),
            usage=Usage(model=getattr(self.model, "model", "")),
            context_window=window,
        )
        if window is not None:
            state = evolve(state, audit=state.log("context_window_learnt", context_tokens=window))
        return self.resume(state, TRANSITIONS[START, Outcome.DONE], on_event, stream)

    def config(self, state: AgentState) -> NodeConfig:
        """The nodes' config for ``state``: the driver's, fitted to the state's ``context_window``."""
        window = state.context_window
        if window is None or window == self.cfg.context_tokens:
            return self.cfg
        fitted = self._fitted.get(window)
        if fitted is None:
            fitted = self.cfg.with_settings(context_tokens=window,
                                            max_answer_tokens=min(self.cfg.max_answer_tokens, window // 2))
            self._fitted[window] = fitted
        return fitted

    def resume(
        self,
        state: AgentState,
        node: Node,
        on_event: EventHandler | None = None,
        stream: bool = False,
    ) -> AgentState:
        """Run from ``node`` with ``state`` until the end (``run`` starts at the first node)."""
        limit = max_steps(self.cfg.settings.max_iterations)
        steps = 0
        while node is not END:
            steps += 1
            if steps > limit:
                raise GraphError(f"run exceeded {limit} steps at {node.value}")
            state, node = self.step(state, node, on_event, stream)
        return state

    def step(
        self,
        state: AgentState,
        node: Node,
        on_event: EventHandler | None = None,
        stream: bool = False,
    ) -> tuple[AgentState, Node]:
        """One node: prepare its step, perform the step's request, record it, apply the step
        with the reply; the new state and the node that comes next (``END`` after the last)."""
        name = _NAMES[node]
        module = NODES[node]
        cfg = self.cfg if state.context_window is None else self.config(state)
        usage = state.usage
        try:  # an error leaving the step carries the calls already paid for (``LLMError.spent``)
            if on_event is not None:  # a handler may stop the run here (``Agent``: no usable index)
                on_event(NodeStarted(name))
            step = module.prepare(state, cfg)
            request = step.request
            if request is None:
                reply: Any = None
            elif isinstance(request, LLMRequest):  # most steps: one call, once more for a reply with no text
                again = getattr(module, "ask_again", None)
                for attempt in range(2):
                    if attempt:
                        state = evolve(state, audit=state.log("reply_empty", node=name))
                    if on_event is None:
                        reply, request, refitted, cfg, state = self._complete(module, node, state, cfg, request, stream,
                                                                              None)
                    else:
                        with _waits_reported(name, on_event):
                            reply, request, refitted, cfg, state = self._complete(module, node, state, cfg, request,
                                                                                  stream, on_event)
                    step = refitted or step  # a request fitted again to a smaller window: its plan too
                    usage, state = usage.add(name, reply), _noted(state, name, request, reply)
                    if again is None or not again(step, reply):
                        break
            elif on_event is None:
                reply, step, usage, state, cfg = self._perform(module, node, name, state, cfg, step, usage, None)
            else:
                with _waits_reported(name, on_event) as relay:
                    reply, step, usage, state, cfg = self._perform(module, node, name, state, cfg, step, usage, on_event,
                                                                   relay)
        except CragError as err:  # a prompt that cannot fit is a UsageError; an index gone, a KnowledgeBaseError
            if isinstance(err, UsageError):
                err.args = (learnt_window_named(str(err), self.cfg.context_tokens),)
            if getattr(err, "spent", None) is None:
                billed = getattr(err, "billed", None)  # a refusal the server finished: paid for too
                err.spent = usage if billed is None else usage.add(name, billed)  # type: ignore[attr-defined]
            raise
        # The step's bookkeeping before apply, so synthesize's usage block counts its own call.
        if module.ASKS_MODEL:  # listed also when it asked nothing (a fast path): 0 calls
            usage = usage.ran(name)
        state = state.recorded(name, usage, state.audit)
        state = module.apply(state, step, reply, cfg)
        if on_event is not None:
            on_event(NodeFinished(name))
        # cfg.settings: NodeConfig.__getattr__ would cost this step a tenth of its time
        return state, next_node(node, state, cfg.settings.max_iterations)

    def _perform(
        self,
        module: Any,
        node: Node,
        name: str,
        state: AgentState,
        cfg: NodeConfig,
        step: Step,
        usage: Usage,
        on_event: EventHandler | None,
        relay: _Relay | None = None,
    ) -> tuple[Any, Step, Usage, AgentState, NodeConfig]:
        """A step's several requests (a pointwise grader's) or tool calls performed (``step``
        handles a single request itself): the replies, the step, the usage with their calls, the
        state with what the replies say about themselves audited, and the config (fitted to a
        smaller window a server reported). An error carries the calls made before it."""
        request = step.request
        if isinstance(request, LLMRequests):
            replies = []
            try:
                for one in request.requests:
                    done, one, _, cfg, state = self._complete(module, node, state, cfg, one, False, on_event)
                    usage = usage.add(name, done)
                    replies.append(done)
                    state = _noted(state, name, one, done)
            except (LLMError, UsageError) as err:
                if err.spent is None:
                    billed = getattr(err, "billed", None)
                    err.spent = usage if billed is None else usage.add(name, billed)
                raise
            return tuple(replies), step, usage, state, cfg
        if isinstance(request, ToolRequest):
            return self._run_tools(request, relay), step, usage, state, cfg
        raise GraphError(f"{name} asked for {type(request).__name__}")  # pragma: no cover - prepare is pure

    def _complete(
        self,
        module: Any,
        node: Node,
        state: AgentState,
        cfg: NodeConfig,
        request: LLMRequest,
        stream: bool,
        on_event: EventHandler | None,
    ) -> tuple[Any, LLMRequest, Step | None, NodeConfig, AgentState]:
        """One chat completion: the reply, the request it answers, the node's step prepared
        again when the request was (None: the step stands), the config and the state.

        A server that refuses the request as longer than its window gets it again, fitted to
        the window it reported (or a fifth smaller than what it took); that window is the state's
        ``context_window`` for the rest of the question (audit ``context_refit``) and
        ``learnt_window`` for the driver's later questions."""
        refits = 0
        refused_ms = 0.0  # the time of the requests refused as too long: the node's time too
        refitted_step: Step | None = None
        while True:
            try:
                if stream and on_event is not None and node is Node.SYNTHESIZE:
                    items = tuple(getattr(request.task, "items", ()))
                    question = asked(state, items)
                    absent = tuple(missing(question, [item.text for item in items]))
                    on_event(AnswerStarted(items, question, verdict_may_rewrite(state, items), absent,
                                           chitchat=bool(getattr(request.task, "chitchat", False))))
                    reply = self.model.complete(request, lambda text: on_event(AnswerDelta(text)))
                else:
                    reply = self.model.complete(request)
                if refused_ms:
                    reply = evolve(reply, latency_ms=reply.latency_ms + refused_ms)
                return reply, request, refitted_step, cfg, state
            except LLMContextError as err:
                refused_ms += err.latency_ms
                sent = prompt_tokens(request.messages, cfg.count_tokens) + (request.max_tokens or 0)
                window = smaller_window(cfg.context_tokens, err.window, sent)
                if refits == REFITS or window is None:
                    raise counted_longer(err, sent, window) from None
                refits += 1
                with self._lock:
                    if self.learnt_window is None or window < self.learnt_window:
                        self.learnt_window = window
                state = evolve(state, context_window=window, audit=state.log(
                    "context_refit", node=node.value, context_tokens=window, server_window=err.window))
                cfg = self.config(state)
                refitted_step = module.prepare(state, cfg)
                refitted = refitted_step.request
                if isinstance(refitted, LLMRequests):  # one of several: the same item's request, refitted
                    keys = [tuple(i.key for i in r.task.items) for r in refitted.requests]
                    mine = tuple(i.key for i in request.task.items)
                    refitted = refitted.requests[keys.index(mine)] if mine in keys else None
                if not isinstance(refitted, LLMRequest):  # pragma: no cover - prepare is pure
                    raise
                request = refitted

    def _run_tools(self, request: ToolRequest, relay: _Relay | None = None) -> tuple[ToolOutcome, ...]:
        outcomes = self._run_calls(request.calls, relay)
        if request.fallback and not all(o.items for o in outcomes):
            outcomes += self._run_calls(request.fallback, relay)
        return outcomes

    def _run_calls(self, calls: tuple[Any, ...], relay: _Relay | None) -> tuple[ToolOutcome, ...]:
        if len(calls) <= 1 or self.max_parallel_tools <= 1:
            return tuple(self._run_one(call) for call in calls)
        pool = self._executor()
        try:
            return self._gathered(pool, calls, relay)
        except (RuntimeError, CancelledError):
            if self._pool is pool:
                raise
        # close() shut that pool down meanwhile (another thread closed the agent): the question
        # still gets its answer, on new threads, as a question asked after close does.
        return self._gathered(self._executor(), calls, relay)

    def _gathered(self, pool: ThreadPoolExecutor, calls: Sequence[Any], relay: _Relay | None) -> tuple[ToolOutcome, ...]:
        """The calls' outcomes, in order, run on ``pool``; meanwhile the retry waits they report
        reach ``on_event`` on this thread (``_Relay``)."""
        futures = [pool.submit(self._run_in_context, context, call) for context, call in zip(_contexts(calls), calls)]
        if relay is not None:
            relay.deliver_until_done(futures)
        return tuple(future.result() for future in futures)

    def _run_in_context(self, context: contextvars.Context, call) -> ToolOutcome:
        return context.run(self._run_one, call)

    def _run_one(self, call) -> ToolOutcome:
        try:
            result = ToolResult.of(self.toolbox.run(call))
        except ToolError as exc:
            return ToolOutcome(call, (), str(exc))
        return ToolOutcome(call, result.items, audit=result.audit, more=result.more)


def _contexts(calls: Sequence[Any]) -> list[contextvars.Context]:
    """A copy of this thread's context for each call run on a pool thread: a cancellation, a
    request deadline and where retry waits are reported follow the question (crag.llm)."""
    return [contextvars.copy_context() for _ in calls]


class _Relay:
    """A step's retry waits on their way to ``on_event``, which is called on the thread that
    runs the question (crag.events), one event at a time: a wait reported on a tool thread (a
    search's embedding request) is queued, and the question's thread, waiting for the round's
    tool calls, hands it on (``deliver_until_done``)."""

    def __init__(self, node: str, on_event: EventHandler) -> None:
        self.node = node
        self.on_event = on_event
        self.owner = threading.get_ident()
        self.queue: queue.SimpleQueue[RetryWaiting | None] = queue.SimpleQueue()

    def report(self, wait: RetryWaiting) -> None:
        event = wait if wait.node else evolve(wait, node=self.node)  # an embedder does not know its step
        if threading.get_ident() == self.owner:
            self.on_event(event)
        else:
            self.queue.put(event)

    def deliver_until_done(self, futures: Sequence[Future[Any]]) -> None:
        """Hand queued waits to ``on_event`` until every future is done: each puts one None
        after whatever it reported, so nothing it reported is left behind."""
        for future in futures:
            future.add_done_callback(lambda _: self.queue.put(None))
        left = len(futures)
        while left:
            event = self.queue.get()
            if event is None:
                left -= 1
            else:
                self.on_event(event)


@contextlib.contextmanager
def _waits_reported(node: str, on_event: EventHandler | None) -> Iterator[_Relay | None]:
    """Inside the block, a request's retry waits reach ``on_event`` as ``RetryWaiting``
    records naming ``node``, on the question's thread (``_Relay``)."""
    if on_event is None:
        yield None
        return
    relay = _Relay(node, on_event)
    with reporting_waits(relay.report):
        yield relay
