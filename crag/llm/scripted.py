"""A scripted chat model: queued replies per node, every request recorded.

It ships with the library (like httpx's mock transport) so that programs embedding crag
can test their own code without a server:

    model = ScriptedChatModel({"analyze_and_route": ['{"complexity": "chitchat", ...}'],
                               "synthesize": ["Hello!"]})

A reply is a string, a ``Completion`` (to report token usage), or an exception instance to
raise; a node's queue is a list of replies, or one reply alone. A node whose queue is empty
raises ``LLMError`` naming the node, so a test that expects fewer calls than the run makes
fails loudly; a node crag does not have (``"synthesise"``) is a ``UsageError`` at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping

from ..errors import LLMError, UsageError
from ..graph import Node
from ..ports import LLMRequest
from ..state import Completion

__all__ = ["ScriptedChatModel"]

Reply = str | Completion | BaseException
NODES = tuple(n.value for n in Node if n not in (Node.START, Node.END))


class ScriptedChatModel:
    """In-process ``ChatModel`` returning queued replies; ``requests`` records every call."""

    def __init__(
        self,
        replies: Mapping[str, Iterable[Reply]] | None = None,
        model: str = "scripted",
        default: Mapping[str, Reply] | None = None,
    ) -> None:
        for name, given in (("replies", replies), ("default", default)):
            if given is not None and not isinstance(given, Mapping):
                raise UsageError(f"{name} must be a mapping of node names to replies, not {type(given).__name__}")
        self.model = model
        self.queues: dict[str, deque[Reply]] = {}
        for node, queue in (replies or {}).items():
            one = isinstance(queue, (str, Completion, BaseException))  # one reply, not its characters
            self.push(node, *((queue,) if one else queue))
        self.default = {_node(node): reply for node, reply in (default or {}).items()}
        self.requests: list[LLMRequest] = []

    def push(self, node: str, *replies: Reply) -> None:
        self.queues.setdefault(_node(node), deque()).extend(replies)

    def calls(self, node: str | None = None) -> int:
        return sum(1 for r in self.requests if node is None or r.node == node)

    def complete(
        self, request: LLMRequest, on_delta: Callable[[str], None] | None = None
    ) -> Completion:
        self.requests.append(request)
        queue = self.queues.get(request.node)
        if queue:
            reply = queue.popleft()
        elif request.node in self.default:
            reply = self.default[request.node]
        else:
            raise LLMError(f"scripted model has no reply left for node {request.node}", node=request.node)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Completion):
            if on_delta is not None:
                on_delta(reply.text)
            return reply
        if on_delta is not None:
            on_delta(reply)
        return Completion(text=reply, model=self.model)


def _node(name: object) -> str:
    if name not in NODES:
        from ..safe_text import short_value

        raise UsageError(f"the scripted model has no node {short_value(name)} (the nodes: {', '.join(NODES)})")
    return str(name)
