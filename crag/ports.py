"""The ports: what a node asks of the outside world, and the small interfaces that answer.

A node's ``prepare`` returns a ``Step``: the request the outside world must answer (one of
these, or None when the node needs nothing) and the plan behind it; the driver performs the
request and hands the step back to ``apply`` with the reply, so ``apply`` reads what
``prepare`` decided instead of deciding it again. The requests:

* ``LLMRequest``: a chat completion for one node. It carries both the rendered
  ``messages`` (what an OpenAI-compatible server receives) and the structured ``task`` they
  were rendered from, so that the offline backend can answer the same contract from data
  instead of parsing prompts. Its reply is a ``Completion``.
* ``LLMRequests``: several of those, made one after another; its reply is one
  ``Completion`` per request.
* ``ToolRequest``: the validated tool calls of one retrieval round, and ``fallback`` calls
  run only when one of those found nothing. Its reply is one ``ToolOutcome`` per call
  run, in order.

Adapters implement ``ChatModel``, ``Toolbox``, ``Embedder``, and the knowledge-base
ports ``Store``, ``StoreUpdate`` and ``Retriever``; only they touch the network, the disk
or the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from attrs import frozen

from .state import AuditEvent, Completion, EvidenceItem, Message, RoutingPlan, ToolCall, ToolRun
from .toolspec import Tool, ToolResult  # ToolResult: re-exported, a tool's run returns it

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BINARY_MARK",
    "AnalyzeTask",
    "ChatModel",
    "Chunk",
    "ChunkRow",
    "DocumentVersion",
    "Embedder",
    "FileRecord",
    "GradeTask",
    "Hit",
    "LLMRequest",
    "LLMRequests",
    "PlanTask",
    "Retriever",
    "SearchWeights",
    "Step",
    "Store",
    "StoreState",
    "StoreUpdate",
    "SynthesizeTask",
    "Task",
    "ToolOutcome",
    "ToolRequest",
    "ToolResult",
    "Toolbox",
]


@frozen
class AnalyzeTask:
    """Classify the question and suggest tools."""

    question: str
    history: tuple[Message, ...]
    tools: tuple[Tool, ...]
    previous_attempts: tuple[ToolRun, ...] = ()

    @property
    def available_tools(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)


@frozen
class PlanTask:
    """Choose this round's tool calls."""

    question: str
    routing_plan: RoutingPlan
    evidence: tuple[EvidenceItem, ...]
    previous_attempts: tuple[ToolRun, ...]
    tools: tuple[Tool, ...]
    top_k: int
    history: tuple[Message, ...] = ()  # earlier turns: a follow-up question is planned in context

    @property
    def available_tools(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)


@frozen
class GradeTask:
    """Score each of ``items`` for relevance to ``question``, 0.0 to 1.0.

    ``style`` is how the grade is asked for (``KB_AGENT_GRADER``, ``crag.grading.GRADERS``):
    the prompt and the reply's shape; every style's reply is read into one score per item.
    """

    question: str
    items: tuple[EvidenceItem, ...]
    style: str = "batch"


@frozen
class SynthesizeTask:
    """Write the answer from ``items`` (numbered 1..M), or chat when ``chitchat``."""

    question: str
    history: tuple[Message, ...]
    items: tuple[EvidenceItem, ...]
    chitchat: bool = False


Task = AnalyzeTask | PlanTask | GradeTask | SynthesizeTask


@frozen
class LLMRequest:
    """One chat completion a node asks for.

    ``max_tokens`` is the reply's budget and ``temperature`` its sampling temperature (None:
    the server's default). ``reply_schema``, for nodes whose reply is JSON, is
    ``{"name": ..., "schema": {JSON Schema}}``: the adapter asks for structured output with
    it, as far as the server and ``KB_AGENT_STRUCTURED_OUTPUT`` allow. ``logprobs`` > 0 asks
    for the reply's token probabilities with that many alternatives per token (the grader
    reads its grades from them); a server that refuses or ignores them is remembered, and the
    reply comes back without them.
    """

    node: str
    task: Task
    messages: tuple[dict[str, str], ...]
    max_tokens: int | None = None
    temperature: float | None = None
    reply_schema: Mapping[str, Any] | None = None
    logprobs: int = 0


@frozen
class LLMRequests:
    """Several chat completions one node asks for, made one after another (the ``pointwise``
    grader asks one per item). Its reply is one ``Completion`` per request, in order."""

    requests: tuple[LLMRequest, ...]


@frozen
class ToolRequest:
    calls: tuple[ToolCall, ...]
    fallback: tuple[ToolCall, ...] = ()  # run after ``calls`` when one of them found no item


@frozen
class Step:
    """What a node's ``prepare`` decided: ``request``, what the outside world must answer
    (None: nothing), and ``plan``, the node's own record of the decisions behind it (which
    rule fired, which items were sent, which were left out of the prompt). The driver hands
    the step back to ``apply`` with the reply, as an HTTP client hands a response back with
    its request: ``apply`` never decides again what ``prepare`` decided."""

    request: LLMRequest | LLMRequests | ToolRequest | None = None
    plan: Any = None


@frozen
class ToolOutcome:
    """What one tool call produced: items, or an error message (never both), the call's
    audit events, and how many more results the tool found than it returned (``ToolResult.more``)."""

    call: ToolCall
    items: tuple[EvidenceItem, ...] = ()
    error: str | None = None
    audit: tuple[AuditEvent, ...] = ()
    more: int = 0


@runtime_checkable
class ChatModel(Protocol):
    """One chat completion per request. Raises ``crag.errors.LLMError`` when it cannot.

    ``on_delta``, when given and the backend can stream, receives the reply text as it
    arrives; the returned ``Completion`` always holds the whole text.
    """

    model: str

    def complete(
        self, request: LLMRequest, on_delta: Callable[[str], None] | None = None
    ) -> Completion: ...


@runtime_checkable
class Toolbox(Protocol):
    """The tools of one question: the records of those on offer, and running one call.

    ``run`` returns the call's ``ToolResult`` (its items, and audit events about it) and
    raises ``crag.errors.ToolError`` for a failed call; the driver records it. A toolbox may
    also offer ``check()``, raising ``crag.errors.IndexStoreError`` when its index cannot be
    searched: ``Agent.ask`` then fails a question as planning starts (crag's own toolbox does).
    """

    def tools(self) -> tuple[Tool, ...]: ...

    def run(self, call: ToolCall) -> ToolResult: ...


@runtime_checkable
class Embedder(Protocol):
    """Texts to unit-length float32 vectors, shape (len(texts), dim).

    An embedder may say ``relates_words = False`` (the hash embedder): its vectors relate no
    texts that share no word, so a search keeps only hits sharing a word with the query
    (``crag.index.search``). Without the attribute it relates them (a learned model).
    """

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...



# ---------------------------------------------------------------------------------------
# The knowledge-base store (see docs/architecture.md, "Adding a store")
#
# A store keeps published *states* of the index: the roots, one recorded version of each
# file (size, mtime, sha256) and its chunks, their vectors and text for lexical search,
# and the embedder and chunking they were made with. An indexer takes the store's writer
# lock, reads the published state, and sends its edits to one ``StoreUpdate``; ``commit``
# publishes them all at once (readers see the previous state or the new one, never a mix)
# and ``abort`` (or a killed process) leaves the previous state. ``crag.index.build`` is
# the one driver of updates; ``crag.index.search`` fuses a ``Retriever``'s rankings.


# A file recorded so that it is not read again although it is no file of the index (binary
# data): its sha256 is written after this mark, and it has no chunks.
BINARY_MARK = "binary:"


@frozen
class FileRecord:
    """The version of one file the store holds (``binary``: left out as binary data, recorded
    only so that it is not read again while unchanged)."""

    path: str
    size: int
    mtime_ns: int
    sha256: str
    chunks: int

    @property
    def binary(self) -> bool:
        return self.sha256.startswith(BINARY_MARK)


@frozen
class StoreState:
    """A published state: what it was built with, its roots and (when asked for) its files."""

    version: str
    embedder: str
    dim: int
    chunker: str
    chunks: int
    roots: tuple[str, ...]
    files: Mapping[str, FileRecord] = MappingProxyType({})


@frozen
class Chunk:
    """A contiguous range of lines of one file (1-based, inclusive) and its heading path (``crag.index.chunker``
    makes them)."""

    start_line: int
    end_line: int
    text: str
    heading: str
    tokens: int


@frozen
class DocumentVersion:
    """One version of a file to write: where it is, what it hashed to, and its chunks."""

    path: str
    root: str
    size: int
    mtime_ns: int
    sha256: str
    chunks: tuple[Chunk, ...] = ()
    text: str = ""


@frozen
class Hit:
    """One chunk found by a search, best first.

    ``score`` is the chunk's cosine similarity to the query clipped to [0, 1]; ``fused``
    is the fusion value the order comes from (``crag.index.fusion``).
    """

    chunk_id: int
    path: str
    start_line: int
    end_line: int
    heading: str
    text: str
    score: float
    fused: float = 0.0
    vector_rank: int | None = None
    lexical_rank: int | None = None


@frozen
class ChunkRow:
    """A chunk's metadata and text, as a store returns it to the search."""

    chunk_id: int
    file_id: int
    path: str
    start_line: int
    end_line: int
    heading: str
    text: str


@runtime_checkable
class StoreUpdate(Protocol):
    """The edits of one update; nothing is visible until ``commit`` publishes them all.

    ``add_file`` writes a document version (its chunks are embedded with the update's
    embedder); ``remove_file`` removes the recorded version of a path; ``touch_file``
    records a new size and mtime for unchanged content; ``set_roots`` replaces the roots.
    ``commit`` returns the number of chunks of the published state; ``abort`` drops the
    edits. ``embedded`` counts the chunks embedded so far; ``version`` names the new state.
    """

    embedded: int
    version: str

    def add_file(self, doc: DocumentVersion) -> None: ...

    def remove_file(self, path: str) -> None: ...

    def touch_file(self, path: str, size: int, mtime_ns: int) -> None: ...

    def set_roots(self, roots: Sequence[str]) -> None: ...

    def commit(self) -> int: ...

    def abort(self) -> None: ...


@frozen
class SearchWeights:
    """How the rankings are fused (``crag.index.fusion``).

    ``vector``, ``lexical`` and ``file`` weigh the three rescaled rankings; ``same_file``
    (in (0, 1]; 1 turns it off) is the factor by which a chunk's value shrinks for each
    chunk of its file placed above it. ``candidates`` chunks are taken from each chunk
    ranking; the file ranking ranks the files of those candidates, at most ``file_candidates``
    of them (on the shared questions, ranking only them ranks better than the best 20 files
    of the whole index did, and costs a bounded number of rows: ``docs/retrieval.md``). ``bm25_*`` weigh the
    title (path words), heading path and body columns of the embedded store's BM25.
    Defaults measured by ``benchmarks/retrieval.py``; ``crag.index.fusion`` applies them.
    """

    vector: float = 0.2
    lexical: float = 1.0
    file: float = 0.6
    same_file: float = 0.8
    candidates: int = 50
    file_candidates: int = 100
    bm25_title: float = 4.0
    bm25_heading: float = 4.0
    bm25_body: float = 1.0


@runtime_checkable
class Retriever(Protocol):
    """A published state opened for search. Rankings are (id, score) pairs, best first.

    ``vector_ranking`` ranks chunks by cosine similarity to a unit query vector;
    ``lexical_ranking`` ranks chunks, and ``file_ranking`` whole files, by the store's
    full-text ranking of ``query`` (``file_ranking`` only the ids ``files`` names, when given). The fusion rescales each ranking's scores within the
    ranking (its first at 1, its last at 0), so a store's scores may have any scale and
    either direction, as long as the pairs come best first. ``roots`` restricts every
    ranking to files under those paths (None: the whole index). ``search`` is
    ``crag.index.search.hybrid_search`` over these rankings, with ``embedder``'s rule for
    which hits a query may find.
    """

    embedder: Embedder
    version: str
    embedder_name: str
    dim: int
    n_chunks: int
    roots: tuple[str, ...]

    def embed_query(self, query: str) -> np.ndarray: ...

    def vector_ranking(self, query_vec: np.ndarray, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]: ...

    def lexical_ranking(self, query: str, k: int, roots: Sequence[str] | None = None) -> list[tuple[int, float]]: ...

    def file_ranking(
        self, query: str, k: int, roots: Sequence[str] | None = None, files: Sequence[int] | None = None
    ) -> list[tuple[int, float]]: ...

    def chunk_files(self, chunk_ids: Sequence[int]) -> dict[int, int]: ...

    def cosines(self, query_vec: np.ndarray, chunk_ids: Sequence[int]) -> dict[int, float]: ...

    def chunk_rows(self, chunk_ids: Sequence[int]) -> dict[int, ChunkRow]: ...

    def search(self, query: str, top_k: int = 5, roots: Sequence[str] | None = None, mode: str = "hybrid") -> list[Hit]: ...

    def close(self) -> None: ...


@runtime_checkable
class Store(Protocol):
    """Where the index lives: the embedded FAISS + SQLite folder, or a PostgreSQL database.

    ``location`` names it in messages; ``reindex_hint`` tells the user how to rebuild it.
    ``state(files=..., check=...)`` is the published state, with its files when asked
    (None before the first update; raises ``IndexStoreError`` when it cannot be read, and
    with ``check`` also when its vectors do not match its metadata); ``version()`` is a cheap check of which
    state is published. ``writer_lock(timeout, waiting)`` is held by the one indexer allowed
    at a time (a second calls ``waiting()`` once, when given, then waits up to ``timeout``
    seconds and raises ``IndexStoreError``); ``building()`` whether an indexer holds it now.
    ``roots()`` are the published state's roots; ``roots(salvage=True)`` the roots a state
    that cannot be read as this crag's (damaged, an older format) still records, as far as
    they can be read, else (): what a rebuild walks besides the paths it is given.
    ``begin(base, embedder, chunker)`` starts an update on top of ``base`` (None: from
    empty). ``open_retriever`` opens the published state for search.
    """

    location: str
    reindex_hint: str

    def state(self, files: bool = True, check: bool = False) -> StoreState | None: ...

    def version(self) -> str | None: ...

    def roots(self, salvage: bool = False) -> tuple[str, ...]: ...

    def writer_lock(self, timeout: float, waiting: Callable[[], None] | None = None) -> AbstractContextManager[object]: ...

    def building(self) -> bool: ...

    def begin(self, base: StoreState | None, embedder: Embedder, chunker: str) -> StoreUpdate: ...

    def open_retriever(self, embedder: Embedder, weights: SearchWeights | None = None) -> Retriever: ...

    def close(self) -> None: ...
