"""``vector_search(query, top_k)``: the hybrid index search, one evidence item per chunk.

Each item carries the chunk's path (relative to the working directory when under it),
1-based start and end lines, its text, the heading path as ``title``, and as ``score`` the
chunk's cosine similarity to the query clipped to [0, 1] (see ``crag.index.store``), which
is what the ``high_vector_score`` rule compares with ``KB_AGENT_VECTOR_SCORE_THRESHOLD``.

A file edited since it was indexed is read as it is now (``crag.index.current``): a hit
whose text moved is the file's lines where it is now, one whose text is gone is no
evidence, and either is audited ``source_changed``, so a citation never opens a file at a
line that does not show the cited text. A file an ignore file leaves out since it was indexed
is no evidence either (``crag.index.current.left_out``), as ``read_file`` refuses it.

Which hits a query finds is the retriever's business (``crag.index.search``: with the
``hash`` embedder, only chunks sharing a content word with the query). Index errors (missing,
damaged, built with another embedder) are raised as they are, so the user is told to
re-index, and so is an embeddings server that fails after its retries (``LLMError``, exit
status 1 as for the chat server): a search that could not run is not a search that found
nothing, which the answer would say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..index.current import current_lines, left_out, place_now
from ..index.decoding import without_invisible
from ..index.discover import is_gone, is_within, reachable
from ..pages import span_ref
from ..state import AuditEvent, EvidenceItem
from ..toolspec import CONFIGURED_TOP_K, MAX_TOP_K, Paging, Param, Searches, Tool, ToolContext, ToolResult

NAME = "vector_search"
REINDEX_HINT = "the file changed since it was indexed: run crag index to search its new text"
IGNORED_HINT = "an ignore file (.cragignore, .ignore, .gitignore) leaves the file out since it was indexed: run crag index to drop it"


def run(args: Mapping[str, Any], context: ToolContext) -> ToolResult:
    query, top_k = args["query"], args["top_k"]
    searched = context.search_roots()
    hits = context.retriever().search(query, top_k, roots=searched)
    items, audit = [], []
    files: dict[str, list[str] | None] = {}
    ignored: set[str] = set()  # files an ignore file leaves out now: read_file would refuse them
    roots = context.retriever().roots
    absent = () if searched is None else _left_out_roots(roots, shared=bool(context.settings.store))
    for hit in hits:
        if absent and _innermost_root(hit.path, roots) in absent:
            continue
        source = context.label(hit.path)
        if hit.path not in files:
            if left_out(hit.path, roots):
                ignored.add(hit.path)
            files[hit.path] = None if hit.path in ignored else current_lines(hit.path, roots)
        lines = files[hit.path]
        # read as the file is read now: an older crag kept its zero-width spaces and soft hyphens
        indexed = hit.text if lines is None else without_invisible(hit.text)
        if hit.path in ignored:
            place = None
        else:
            place = (hit.start_line, hit.end_line, indexed) if lines is None else place_now(
                indexed, hit.start_line, hit.end_line, lines)
        if place != (hit.start_line, hit.end_line, indexed):
            audit.append(AuditEvent("source_changed", {
                "source": source, "indexed": span_ref(source, hit.start_line, hit.end_line),
                "line": None if place is None else place[0],
                "hint": IGNORED_HINT if hit.path in ignored else REINDEX_HINT}))
        if place is None:
            continue
        start, end, text = place
        items.append(EvidenceItem(tool=NAME, source=source, text=text, start_line=start, end_line=end,
                                  score=hit.score, title=hit.heading))
    return ToolResult(items, audit)


def _left_out_roots(roots: Sequence[str], *, shared: bool) -> tuple[str, ...]:
    """The roots of the index the search leaves out (``Toolbox.search_roots``: gone from disk,
    or out of reach). A root inside another that is still searched (``crag index docs
    docs/drafts``, then ``docs/drafts`` deleted) has its files held by the outer one too, and
    they are left out with it, as the note on the search says, not cited as if nothing had happened."""
    return tuple(r for r in roots if not (reachable(r) or (shared and is_gone(r))))


def _innermost_root(path: str, roots: Sequence[str]) -> str | None:
    """The deepest of ``roots`` that holds ``path``: a root inside one left out (a folder that
    may be entered but not listed) is searched still, and its files with it."""
    return max((r for r in roots if is_within(path, r)), key=len, default=None)


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
