"""The tools: ``BUILTIN_TOOLS``, the registry, and ``Toolbox``, which runs checked calls.

One module per tool. Each defines ``TOOL``, its ``crag.toolspec.Tool`` record (planner
description, argument schema, when it is enabled, what the core may rely on, the function
that runs it, which turns checked arguments and a ``ToolContext`` into a ``ToolResult`` or
raises ``ToolError``):

    vector_search(query, top_k)             the hybrid index search (crag.index)
    grep_search(pattern, glob, regex)       matching lines, read from disk
    read_file(path, start_line, end_line)   lines of one file inside the roots
    jira_fetch(key)                         when JIRA_BASE_URL is set
    confluence_fetch(page_id)               when CONFLUENCE_BASE_URL is set
    web_fetch(url)                          when KB_AGENT_WEB_FETCH=on; public addresses only

``Toolbox(settings, roots=None, cwd=None, tools=())`` implements the ``Toolbox`` port for
the driver; ``tools`` adds your own ``Tool`` records to the built-in ones. A tool is never
handed the toolbox: it gets a ``ToolContext`` (``ToolboxContext``), the roots, labels,
retriever and HTTP options of this toolbox and nothing else. ``roots`` are the knowledge-base roots the tools look in (``None``: every root the
index holds; either way, one gone from disk or out of reach is left out); ``cwd`` is where
citations are relative to (default: the working directory).
The index is opened on the first search and re-opened when an indexer has
published a newer generation. ``run`` is thread-safe: the driver runs calls in parallel.
Index problems (missing, damaged, another embedder) are raised as ``IndexStoreError`` so
the user learns to re-index; everything else that goes wrong in a call is a ``ToolError``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ToolError, UsageError
from ..safe_text import redact_message
from ..state import EvidenceItem, ToolCall
from ..toolspec import ArgumentError, Http, Tool, ToolResult, check_args, planner_line
from . import confluence_fetch, grep_search, jira_fetch, read_file, vector_search, web_fetch

if TYPE_CHECKING:
    from ..config import Settings
    from ..ports import Embedder, Retriever, Store

__all__ = ["BUILTIN_TOOLS", "LOCAL_TOOLS", "Toolbox", "ToolboxContext", "builtin", "describe"]

# The registry: every built-in tool, in the order the planner is shown them.
BUILTIN_TOOLS: tuple[Tool, ...] = tuple(
    m.TOOL for m in (vector_search, grep_search, read_file, jira_fetch, confluence_fetch, web_fetch)
)
LOCAL_TOOLS = ("vector_search", "grep_search", "read_file")
_BUILTIN = {t.name: t for t in BUILTIN_TOOLS}


def describe(tools: Sequence[Tool] = BUILTIN_TOOLS) -> str:
    """The tools as docs/tools.md lists them: what turns each on, and the planner's line."""
    rows = ["| tool | enabled | its argument |", "|---|---|---|"]
    for t in tools:
        source = f"{t.question_arg.what}, written in the question" if t.question_arg else "chosen by the planner"
        rows.append(f"| `{t.name}` | {t.enable_hint or 'always'} | {source} |")
    lines = "\n".join(planner_line(t) for t in tools)
    return "\n".join(rows) + "\n\nWhat the planner is shown:\n\n```\n" + lines + "\n```\n"


def builtin(*names: str) -> tuple[Tool, ...]:
    """The built-in tool records of ``names``, in that order (``BUILTIN_TOOLS``: all)."""
    return tuple(_BUILTIN[n] for n in names)


class Toolbox:
    """The tools of a knowledge base (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        roots: Sequence[str | os.PathLike[str]] | None = None,
        cwd: Path | str | None = None,
        *,
        embedder: Embedder | None = None,
        address_allowed: Callable[[Any], bool] | None = None,
        resolver: Callable[[str, int], Sequence[str]] | None = None,
        http_timeout: float = 20.0,
        tools: Sequence[Tool] = (),
    ) -> None:
        from ..index.discover import normalize_root

        self.settings = settings
        self.cwd = Path(os.path.abspath(cwd if cwd is not None else os.getcwd()))
        self.index_dir = os.path.abspath(settings.index_dir)
        self._store: Store | None = None
        self._roots = None if roots is None else tuple(dict.fromkeys(normalize_root(r) for r in roots))
        self._embedder = embedder
        self._own_embedder = embedder is None  # made here on first search, so closed here
        # None: public addresses only and the system resolver (crag.tools.http, which loads
        # when a remote tool first runs).
        self.http = Http(http_timeout, address_allowed, resolver)
        self._lock = threading.Lock()
        self._reader: Retriever | None = None
        self._running = 0  # tool calls running now, on any thread
        self._retired: list[Any] = []  # what close() let go of while calls ran: closed after the last
        self._tools = _registry(tools)
        self._context = ToolboxContext(self)

    # -- the port ---------------------------------------------------------------------

    def tools(self) -> tuple[Tool, ...]:
        """The records of the tools the settings enable, built-in ones first."""
        return tuple(t for t in self._tools.values() if t.enabled(self.settings))

    def available(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools())

    def run(self, call: ToolCall) -> ToolResult:
        with self._lock:
            self._running += 1
        try:
            return self._run(call)
        finally:
            with self._lock:
                self._running -= 1
                retired, self._retired = (self._retired, []) if not self._running else ([], self._retired)
            _close_parts(retired)

    def _run(self, call: ToolCall) -> ToolResult:
        name = call.tool
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            raise ToolError(str(name), f"unknown tool; available: {', '.join(self.available())}")
        if not tool.enabled(self.settings):
            raise ToolError(name, f"{name} is not enabled ({tool.enable_hint or 'see its settings'})")
        try:
            args = check_args(tool, call.args, planned=False, top_k=self.settings.top_k)
        except ArgumentError as exc:
            raise ToolError(name, exc.reason) from None
        try:
            if name in _BUILTIN and tool is _BUILTIN[name]:
                return tool.run(args, self._context)
            return _run_own(tool, args, self._context)
        except ToolError as exc:
            # The boundary every tool failure crosses on its way to tool_history and the
            # audit log: a server may echo a token or a URL with a password back at us.
            message = redact_message(str(exc), self.settings.secrets())
            if message == str(exc):
                raise
            raise ToolError(exc.tool, message.removeprefix(f"{exc.tool}: ")) from exc

    # -- what the tools need --------------------------------------------------------------

    def store(self) -> Store:
        """Where the index lives (``crag.index.open_store``)."""
        if self._store is None:
            from ..index import open_store

            self._store = open_store(self.settings)
        return self._store

    def retriever(self) -> Retriever:
        """The index, opened on first use and re-opened after a re-index."""
        with self._lock:
            store = self.store()
            reader = self._reader
            if reader is not None and store.version() == reader.version:
                return reader
            if self._embedder is None:
                from ..index import make_embedder

                self._embedder = make_embedder(self.settings)
            # A replaced reader is left to the garbage collector: another thread may still use it.
            self._reader = store.open_retriever(self._embedder)
            return self._reader

    def check(self) -> None:
        """Open the index now: a missing or damaged one, or one built with another embedder,
        raises its ``IndexStoreError`` here, so a question fails before any model call is
        spent on it (``vector_search`` runs the question in every first round, SPEC §5)."""
        self.retriever()

    def search_roots(self) -> tuple[str, ...] | None:
        """The roots an index search is restricted to (None: the whole index).

        A root of the index whose folder is gone from disk is left out: its chunks stay in
        the index until the next ``index`` drops them, but are never returned as if nothing
        had happened (``missing_roots`` names them); so is one that cannot be reached now
        (it, or a folder on its way, may not be entered), whose chunks stay. With a database (``KB_AGENT_STORE``)
        only the second is left out: it is shared by machines, and a root absent from this one is most often the indexer's
        (docs/postgresql.md: a reader needs only the database to search); its hits are returned
        and ``missing_roots`` still names it, for the note that file tools cannot open it here.
        Roots given to the toolbox (``--kb``) are checked alike: one deleted while a server runs
        is left out, not searched and cited as if nothing had happened.
        """
        from ..index.discover import is_gone, reachable

        roots = self._roots if self._roots is not None else self.retriever().roots
        shared = bool(self.settings.store)  # a root gone from this disk is searched, one it holds but may not enter is not
        present = tuple(r for r in roots if reachable(r) or (shared and is_gone(r)))
        if self._roots is not None:
            return present  # (): none is left, so nothing is searched, not the whole index
        return None if len(present) == len(roots) else present

    def file_roots(self) -> tuple[str, ...]:
        """The roots file tools (grep_search, read_file) look in (those on disk that can be reached)."""
        from ..index.discover import reachable

        return tuple(r for r in self._all_roots() if reachable(r))

    def missing_roots(self) -> tuple[str, ...]:
        """Roots (those given to the toolbox, else those of the index) that are gone from disk
        or cannot be reached now, and so left out of every tool."""
        from ..index.discover import reachable

        return tuple(r for r in self._all_roots() if not reachable(r))

    def _all_roots(self) -> tuple[str, ...]:
        """The roots given to the toolbox, else every root of the index, whether on disk or not."""
        return self._roots if self._roots is not None else tuple(self.store().roots())

    def label(self, path: str) -> str:
        """A path as evidence and citations carry it: relative to ``cwd`` when under it, else
        absolute, the file's own name (``relative_path``); the footer, prompts and ``search``'s
        text escape it when they show it."""
        from ..index.discover import relative_path

        return relative_path(path, self.cwd)

    def close(self) -> None:
        """Let go of the index reader, the store and the embedder's connections (an ``openai``
        embedder this toolbox made reopens them when used again). While calls run on other
        threads, what they may be using is closed when the last of them ends, not under them;
        a call that starts after ``close`` opens the index again."""
        with self._lock:
            parts = [part for part in (self._reader, self._store) if part is not None]
            if self._own_embedder and self._embedder is not None:
                parts.append(self._embedder)
            self._reader = self._store = None
            if self._running:
                self._retired.extend(parts)
                return
        _close_parts(parts)


class ToolboxContext:
    """The ``ToolContext`` a toolbox gives its tools: what they need of it, and nothing else."""

    __slots__ = ("_box", "cwd", "http", "index_dir", "settings")

    def __init__(self, box: Toolbox) -> None:
        self._box = box
        self.settings = box.settings
        self.cwd = str(box.cwd)
        self.index_dir = box.index_dir
        self.http = box.http

    def file_roots(self) -> tuple[str, ...]:
        return self._box.file_roots()

    def search_roots(self) -> tuple[str, ...] | None:
        return self._box.search_roots()

    def retriever(self) -> Retriever:
        return self._box.retriever()

    def label(self, path: str) -> str:
        return self._box.label(path)


def _close_parts(parts: Sequence[Any]) -> None:
    for part in parts:
        close = getattr(part, "close", None)
        if close is not None:
            close()


def _registry(extra: Sequence[Tool]) -> dict[str, Tool]:
    tools = dict(_BUILTIN)
    for tool in extra:
        if not isinstance(tool, Tool):
            raise UsageError(f"tools must be crag.Tool records, not {type(tool).__name__}")
        if tool.name in tools:
            raise UsageError(f"there is already a tool named {tool.name}")
        tools[tool.name] = tool
    return tools


def _run_own(tool: Tool, args: dict[str, Any], context: ToolboxContext) -> ToolResult:
    """A tool from the user's program: what it raises or returns wrongly is a ToolError. A
    plain list of items is read as ``ToolResult(items)``."""
    try:
        result = ToolResult.of(tool.run(args, context))
    except ToolError:
        raise
    except Exception as exc:  # the boundary to code crag does not own
        raise ToolError(tool.name, f"failed: {type(exc).__name__}: {exc}") from exc
    for item in result:
        if not isinstance(item, EvidenceItem):
            raise ToolError(tool.name, f"returned {type(item).__name__}, not crag.EvidenceItem")
    return result
