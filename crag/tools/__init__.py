"""The tools: ``Toolbox`` runs validated tool calls and turns what they find into evidence.

One module per tool, each a function from validated arguments to ``list[EvidenceItem]``
that raises ``ToolError`` when the call fails:

    vector_search(query, top_k)             the hybrid index search (crag.index)
    grep_search(pattern, glob, regex)       matching lines, read from disk
    read_file(path, start_line, end_line)   lines of one file inside the roots
    jira_fetch(key)                         when JIRA_BASE_URL is set
    confluence_fetch(page_id)               when CONFLUENCE_BASE_URL is set
    web_fetch(url)                          when KB_AGENT_WEB_FETCH=on; public addresses only

``Toolbox(settings, roots=None, cwd=None)`` implements the ``Toolbox`` port for the
driver. ``roots`` are the knowledge-base roots the tools look in (``None``: every root the
index holds); ``cwd`` is where citations are relative to (default: the working directory).
The index is opened on the first ``vector_search`` and re-opened when an indexer has
published a newer generation. ``run`` is thread-safe: the driver runs calls in parallel.
Index problems (missing, damaged, another embedder) are raised as ``IndexStoreError`` so
the user learns to re-index; everything else that goes wrong in a call is a ``ToolError``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ToolError
from ..safe_text import redact
from ..state import EvidenceItem, ToolCall

if TYPE_CHECKING:
    from ..config import Settings
    from ..index.store import IndexReader
    from ..ports import Embedder

__all__ = ["LOCAL_TOOLS", "Toolbox"]

LOCAL_TOOLS = ("vector_search", "grep_search", "read_file")


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
    ) -> None:
        from ..index.discover import normalize_root
        from .http import is_public_address, system_resolver

        self.settings = settings
        self.cwd = Path(os.path.abspath(cwd if cwd is not None else os.getcwd()))
        self.index_dir = os.path.abspath(settings.index_dir)
        self._roots = None if roots is None else tuple(dict.fromkeys(normalize_root(r) for r in roots))
        self._embedder = embedder
        self.address_allowed = address_allowed or is_public_address
        self.resolver = resolver or system_resolver
        self.http_timeout = http_timeout
        self._lock = threading.Lock()
        self._reader: IndexReader | None = None

    # -- the port ---------------------------------------------------------------------

    def available(self) -> tuple[str, ...]:
        tools = list(LOCAL_TOOLS)
        if self.settings.jira_base_url:
            tools.append("jira_fetch")
        if self.settings.confluence_base_url:
            tools.append("confluence_fetch")
        if self.settings.web_fetch:
            tools.append("web_fetch")
        return tuple(tools)

    def run(self, call: ToolCall) -> list[EvidenceItem]:
        name = call.tool
        if name not in self.available():
            if name in _ALL:
                raise ToolError(name, f"{name} is not enabled ({_ENABLE[name]})")
            raise ToolError(str(name), f"unknown tool; available: {', '.join(self.available())}")
        args = call.args if isinstance(call.args, Mapping) else None
        if args is None:
            raise ToolError(name, "arguments must be an object")
        try:
            return _module(name).run(self, args)
        except ToolError as exc:
            # The boundary every tool failure crosses on its way to tool_history and the
            # audit log: a server may echo a token or a URL with a password back at us.
            message = redact(str(exc), self.settings.secrets())
            if message == str(exc):
                raise
            raise ToolError(exc.tool, message.removeprefix(f"{exc.tool}: ")) from exc

    # -- what the tools need --------------------------------------------------------------

    def reader(self) -> IndexReader:
        """The index, opened on first use and re-opened after a re-index."""
        from ..index import open_index
        from ..index.store import current_generation

        with self._lock:
            reader = self._reader
            if reader is not None and current_generation(self.index_dir) == reader.generation:
                return reader
            if self._embedder is None:
                from ..index import make_embedder

                self._embedder = make_embedder(self.settings)
            # A replaced reader is left to the garbage collector: another thread may still use it.
            self._reader = open_index(self.settings, self._embedder)
            return self._reader

    def search_roots(self) -> tuple[str, ...] | None:
        """The roots vector_search is restricted to (None: the whole index)."""
        return self._roots

    def file_roots(self) -> tuple[str, ...]:
        """The roots grep_search and read_file look in."""
        if self._roots is not None:
            return self._roots
        from ..index.store import indexed_roots

        return indexed_roots(self.index_dir)

    def label(self, path: str) -> str:
        """A path as citations show it: relative to ``cwd`` when under it, else absolute."""
        from ..index.discover import relative_label

        return relative_label(path, self.cwd)

    def close(self) -> None:
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


_ALL = ("vector_search", "grep_search", "read_file", "jira_fetch", "confluence_fetch", "web_fetch")
_ENABLE = {
    "jira_fetch": "set JIRA_BASE_URL",
    "confluence_fetch": "set CONFLUENCE_BASE_URL",
    "web_fetch": "set KB_AGENT_WEB_FETCH=on",
}


def _module(name: str) -> Any:
    import importlib

    return importlib.import_module(f"{__name__}.{name}")
