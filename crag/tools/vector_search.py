"""``vector_search(query, top_k)``: the hybrid index search, one evidence item per chunk.

Each item carries the chunk's path (relative to the working directory when under it),
1-based start and end lines, its text, the heading path as ``title``, and as ``score`` the
chunk's cosine similarity to the query clipped to [0, 1] (see ``crag.index.store``), which
is what the ``high_vector_score`` rule compares with ``KB_AGENT_VECTOR_SCORE_THRESHOLD``.

With the default ``hash`` embedder a hit must share at least one content word (stemmed, not
a stop word) with the query: hashed vectors of unrelated texts are never quite orthogonal,
and a question about something the documents never mention should find nothing (and get
the no-evidence answer) rather than the least unrelated chunks. A learned embedder
(``openai``) relates words that differ, so its hits are kept as ranked.
Index errors (missing, damaged, built with another embedder) are raised as they are, so
the user is told to re-index; a failing embedder is a ``ToolError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import LLMError, ToolError
from ..state import EvidenceItem
from ..text import keywords
from ..toolspec import CONFIGURED_TOP_K, MAX_TOP_K, Param, Tool

if TYPE_CHECKING:
    from . import Toolbox

NAME = "vector_search"


def run(args: Mapping[str, Any], box: Toolbox) -> list[EvidenceItem]:
    query, top_k = args["query"], args["top_k"]
    reader = box.reader()
    try:
        hits = reader.search(query, top_k, roots=box.search_roots())
    except LLMError as exc:
        raise ToolError(NAME, f"the embedder failed: {exc}") from exc
    if box.settings.embedder == "hash":
        words = set(keywords(query))
        hits = [h for h in hits if words & set(keywords(f"{box.label(h.path)}\n{h.heading}\n{h.text}"))]
    return [
        EvidenceItem(
            tool=NAME,
            source=box.label(hit.path),
            text=hit.text,
            start_line=hit.start_line,
            end_line=hit.end_line,
            score=hit.score,
            title=hit.heading,
        )
        for hit in hits
    ]


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
    searches_question=True,
)
