"""crag: Corrective-RAG answers over your documents, citing file:line, with the cost of each answer.

The public API. Importing crag is cheap: openai, faiss, numpy and tiktoken are loaded only
when a backend, the index or token counting is first used.
"""

from .agent import Agent, Answer
from .config import Settings
from .errors import (
    ConfigError,
    CragError,
    EmbedderMismatchError,
    IndexStoreError,
    KnowledgeBaseError,
    LLMError,
    LLMTimeoutError,
    ToolError,
    UsageError,
)
from .state import AgentState, Citation, EvidenceItem, Usage

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentState",
    "Answer",
    "Citation",
    "ConfigError",
    "CragError",
    "EmbedderMismatchError",
    "EvidenceItem",
    "IndexStoreError",
    "KnowledgeBaseError",
    "LLMError",
    "LLMTimeoutError",
    "Settings",
    "ToolError",
    "Usage",
    "UsageError",
]
