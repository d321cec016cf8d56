"""The modes: settings that name one of a few behaviours, as enums, and the bounds the pure
core and the settings share (``MAX_TOP_K``). Pure, no I/O.

``crag.config`` reads them from the environment (``Choice``) and re-exports them; they live
here so the pure core can name them too (``crag.grading.GRADERS`` from ``GraderStyle``,
``crag.grounding.MODES`` from ``GroundingMode``) without importing the module that reads
the environment: each list of a setting's choices is written once.

StrEnum: each member is its own value, so it compares, prints and serialises as the word a
user sets (``settings.grounding == "strict"``, ``f"{settings.llm}"`` is ``openai``).
"""

from __future__ import annotations

import enum

__all__ = ["MAX_TOP_K", "EmbedderKind", "GraderStyle", "GradingPolicyName", "GroundingMode", "LLMBackend",
           "StructuredOutput"]

MAX_TOP_K = 50  # the largest top_k any search takes; KB_AGENT_TOP_K and --top-k are held to it


class LLMBackend(enum.StrEnum):
    OPENAI = "openai"
    OFFLINE = "offline"


class EmbedderKind(enum.StrEnum):
    HASH = "hash"
    OPENAI = "openai"
    LOCAL = "local"


class StructuredOutput(enum.StrEnum):
    AUTO = "auto"
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    OFF = "off"


class GraderStyle(enum.StrEnum):
    """``KB_AGENT_GRADER``: how grades are asked for and read; each style's ``description``
    says what it is (docs/real-models.md, "Grading a real model")."""

    description: str

    def __new__(cls, value: str, description: str) -> GraderStyle:
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    BATCH = "batch", "one request for all N items; one yes/no line per item, read from token probabilities"
    POINTWISE = "pointwise", "one request per item; one yes/no, read from token probabilities"
    SCORES = "scores", "one request for all N items; N numbers as JSON (structured output)"


class GradingPolicyName(enum.StrEnum):
    """``KB_AGENT_GRADING_POLICY``: rules beyond the seeds' (``crag.grading.policy``); ``seed``: none."""

    DEFAULT = "default"
    SEED = "seed"


class GroundingMode(enum.StrEnum):
    NOTE = "note"
    STRICT = "strict"
    OFF = "off"
