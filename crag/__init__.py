"""crag: Corrective-RAG answers over your documents, citing file:line, with the cost of each answer.

The public API. Importing crag is cheap: openai, faiss, numpy and tiktoken are loaded only
when a backend, the index or token counting is first used.
"""

from typing import TYPE_CHECKING

from .errors import (
    ConfigError,
    CragError,
    CragWarning,
    EmbedderMismatchError,
    IndexFormatError,
    IndexStoreError,
    IndexUnavailableError,
    KnowledgeBaseError,
    LLMContextError,
    LLMError,
    LLMTimeoutError,
    ToolError,
    UnknownSettingError,
    UsageError,
)

if TYPE_CHECKING:
    from .agent import Agent, Answer
    from .config import Settings
    from .events import AnswerDelta, AnswerStarted, Event, EventHandler, NodeFinished, NodeStarted, RetryWaiting
    from .llm.scripted import ScriptedChatModel
    from .ports import ChatModel, Toolbox
    from .state import AgentState, Citation, Completion, Complexity, EvidenceItem, GraderAction, GroundingReport, Usage
    from .stream import AnswerStream, AsyncAnswerStream
    from .toolspec import Param, QuestionArg, Tool, ToolContext, ToolResult

# The agent, its settings and its records load on first use, so `python -m crag --help`
# and `graph` start without attrs, cattrs or asyncio.
_LAZY = {
    "Agent": "agent",
    "Answer": "agent",
    "Settings": "config",
    "AgentState": "state",
    "Citation": "state",
    "EvidenceItem": "state",
    "Usage": "state",
    "Completion": "state",
    "Complexity": "state",
    "GraderAction": "state",
    "GroundingReport": "state",
    "ChatModel": "ports",
    "Toolbox": "ports",
    "Tool": "toolspec",
    "Param": "toolspec",
    "QuestionArg": "toolspec",
    "ToolContext": "toolspec",
    "ToolResult": "toolspec",
    "ScriptedChatModel": "llm.scripted",
    "NodeStarted": "events",
    "NodeFinished": "events",
    "AnswerStarted": "events",
    "AnswerDelta": "events",
    "RetryWaiting": "events",
    "Event": "events",
    "EventHandler": "events",
    "AnswerStream": "stream",
    "AsyncAnswerStream": "stream",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'crag' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentState",
    "Answer",
    "AnswerDelta",
    "AnswerStarted",
    "AnswerStream",
    "AsyncAnswerStream",
    "ChatModel",
    "Citation",
    "Completion",
    "Complexity",
    "ConfigError",
    "CragError",
    "CragWarning",
    "EmbedderMismatchError",
    "Event",
    "EventHandler",
    "EvidenceItem",
    "GraderAction",
    "GroundingReport",
    "IndexFormatError",
    "IndexStoreError",
    "IndexUnavailableError",
    "KnowledgeBaseError",
    "LLMContextError",
    "LLMError",
    "LLMTimeoutError",
    "NodeFinished",
    "NodeStarted",
    "Param",
    "QuestionArg",
    "RetryWaiting",
    "ScriptedChatModel",
    "Settings",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "Toolbox",
    "UnknownSettingError",
    "Usage",
    "UsageError",
]
