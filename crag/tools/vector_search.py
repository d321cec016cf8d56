"""``vector_search(query, top_k)``: the hybrid index search, one evidence item per chunk.

Each item carries the chunk's path (relative to the working directory when under it),
1-based start and end lines, its text, the heading path as ``title``, and as ``score`` the
chunk's cosine similarity to the query clipped to [0, 1] (see ``crag.index.store``), which
is what the ``high_vector_score`` rule compares with ``KB_AGENT_VECTOR_SCORE_THRESHOLD``.

Which hits a query finds is the retriever's business (``crag.index.search``: with the
``hash`` embedder, only chunks sharing a content word with the query). Index errors (missing, damaged, built with another embedder) are raised as they are, so
the user is told to re-index; a failing embedder is a ``ToolError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import LLMError, ToolError
from ..state import EvidenceItem
from ..toolspec import CONFIGURED_TOP_K, MAX_TOP_K, Paging, Param, Searches, Tool, ToolContext, ToolResult

NAME = "vector_search"


def run(args: Mapping[str, Any], context: ToolContext) -> ToolResult:
    query, top_k = args["query"], args["top_k"]
    try:
        hits = context.retriever().search(query, top_k, roots=context.search_roots())
    except LLMError as exc:
        raise ToolError(NAME, f"the embedder failed: {exc}") from exc
    return ToolResult(
        EvidenceItem(
            tool=NAME,
            source=context.label(hit.path),
            text=hit.text,
            start_line=hit.start_line,
            end_line=hit.end_line,
            score=hit.score,
            title=hit.heading,
        )
        for hit in hits
    )


def _same_search(args: Mapping[str, Any]) -> str:
    """Two queries are the same search when they differ only in case and spacing."""
    return " ".join(str(args.get("query", "")).split()).casefold()


TOOL = Tool(
    name=NAME,
    description="semantic search over the indexed documents",
    run=run,
    params=(
        Param("query", required=True, max_length=4000, nul_ok=True),
        Param("top_k", "integer", default=CONFIGURED_TOP_K, minimum=1, maximum=MAX_TOP_K, clamp=True,
              floor_at_default=True),
    ),
    from_question=lambda question: {"query": question.strip()},
    searches=Searches.QUESTION,
    query_arg="query",
    paging=Paging.DEEPER,
    same_search=_same_search,
    vector_scores=True,
)
