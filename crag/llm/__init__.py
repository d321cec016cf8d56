"""The LLM port's adapters: the openai SDK, the offline backend, and a scripted model.

``make_chat_model(settings)`` picks the backend named by ``KB_AGENT_LLM``. The adapters are
imported when first used, so ``import crag`` loads neither the openai SDK nor tiktoken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .scripted import ScriptedChatModel

if TYPE_CHECKING:
    from ..config import Settings
    from ..ports import ChatModel
    from .offline import OfflineChatModel
    from .openai_chat import OpenAIChatModel

__all__ = ["OfflineChatModel", "OpenAIChatModel", "ScriptedChatModel", "make_chat_model"]


def make_chat_model(settings: Settings) -> ChatModel:
    """``OpenAIChatModel`` when ``settings.llm`` is ``openai``, else ``OfflineChatModel``."""
    if settings.llm == "openai":
        from .openai_chat import OpenAIChatModel

        return OpenAIChatModel(settings)
    from .offline import OfflineChatModel

    return OfflineChatModel(settings)


def __getattr__(name: str) -> Any:
    if name == "OpenAIChatModel":
        from .openai_chat import OpenAIChatModel

        return OpenAIChatModel
    if name == "OfflineChatModel":
        from .offline import OfflineChatModel

        return OfflineChatModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
