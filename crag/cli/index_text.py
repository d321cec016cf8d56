"""What ``crag index``, ``crag roots`` and ``crag search`` print, and the search they run.

Command-line code, kept out of ``crag.index`` (which knows nothing of terminals or of the
toolbox): ``crag.cli.indexing`` parses the arguments and prints; these functions render the
text it prints (the MCP server's search text too): ``index_report_text`` (what changed), ``search`` (hits as plain records,
best first), ``search_text`` (a readable ranked list), ``progress_printer`` (a
one-line progress display for a terminal), and for ``python -m crag roots``: ``root_rows``
(each root with its file and chunk counts, and whether it still exists on disk),
``roots_text`` and ``removed_text``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from attrs import frozen

from ..errors import UsageError
from ..index.discover import relative_label
from ..index.readers import skipped_line
from ..pages import location, location_ref
from ..safe_text import blank, display_name
from .common import not_utf8

if TYPE_CHECKING:
    from ..config import Settings
    from ..index.build import IndexReport
    from ..ports import StoreState

__all__ = [
    "ProgressLine",
    "RootRow",
    "hit_records",
    "index_report_text",
    "is_terminal",
    "missing_roots_note",
    "progress_printer",
    "removed_text",
    "root_rows",
    "roots_text",
    "search",
    "search_text",
]

_LIST_LIMIT = 10


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (progress is shown only there)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress_printer(stream: TextIO) -> ProgressLine:
    """A progress callback that redraws one line on ``stream`` (a terminal)."""
    return ProgressLine(stream)


class ProgressLine:
    """``crag index``'s line on a terminal: ``indexing 3/10: name``, rewritten in place as
    files are indexed (called as ``progress(done, total, path)``); ``waiting`` shows there a
    retry wait of the embeddings server (a ``RetryWaiting`` event, counting down), ``clear``
    erases the line."""

    def __init__(self, stream: TextIO, prefix: str = "") -> None:
        import threading

        self.stream = stream
        self.prefix = prefix  # "crag: " for the indexing ``ask --kb`` does first
        self.width = 0  # columns the line takes now
        self.lock = threading.Lock()  # waits are reported from the embedder's threads

    def __call__(self, done: int, total: int, path: str) -> None:
        name = display_name(os.path.basename(path))
        self._show(f"{self.prefix}indexing {done}/{total}: {name}"[:100])
        if done >= total:
            self.clear()

    def waiting(self, event: Any) -> None:
        from .live import waiting_text

        self._show(f"{self.prefix}indexing: {waiting_text(event)}")

    def _show(self, text: str) -> None:
        from .live import fitted
        from .live import width as columns_of

        line = fitted(text, self.stream)
        used = sum(columns_of(ch) for ch in line)
        with self.lock:
            self.stream.write("\r" + line + " " * max(self.width - used, 0))
            self.width = used
            self.stream.flush()

    def clear(self) -> None:
        with self.lock:
            if self.width:
                self.stream.write("\r" + " " * self.width + "\r")
                self.stream.flush()
            self.width = 0


def _names(paths: Sequence[str], cwd: str) -> list[str]:
    shown = [f"  {relative_label(p, cwd)}" for p in paths[:_LIST_LIMIT]]
    if len(paths) > _LIST_LIMIT:
        shown.append(f"  ... and {len(paths) - _LIST_LIMIT} more")
    return shown


def index_report_text(report: IndexReport, cwd: str | None = None) -> str:
    """What an index run changed, for stdout."""
    cwd = cwd or os.getcwd()
    lines = []
    if report.reembedded_all:
        lines.append(f"re-embedded everything: {report.reason}")
    elif report.reason:
        lines.append(report.reason)
    if report.dropped_roots:
        gone = ", ".join(relative_label(r, cwd) for r in report.dropped_roots)
        lines.append(f"dropped knowledge-base path(s) that no longer exist: {gone}")
    lines.append(
        f"indexed {len(report.roots)} path(s) into {relative_label(report.index_dir, cwd)} with {report.embedder}: "
        f"{len(report.added)} added, {len(report.changed)} changed, {len(report.removed)} removed, "
        f"{report.unchanged} unchanged; {report.chunks_embedded} chunks embedded, "
        f"{report.chunks_total} in the index; {report.seconds:.2f}s"
    )
    for label, paths in (("added", report.added), ("changed", report.changed), ("removed", report.removed)):
        if paths:
            lines.append(f"{label}:")
            lines += _names(paths, cwd)
    if report.warnings:  # every one named, however many: each has its own reason and its own fix
        lines.append(f"skipped {len(report.warnings)} file(s):")
        lines += [f"  {relative_label(path, cwd)}: {why}" for path, why in report.warnings]
    skipped = skipped_line(report.skipped_types, kept=report.kept_unread)
    if skipped:
        lines.append(skipped)
    if not report.wrote and not report.changed_anything:
        lines.append("the index was already up to date")
    return "\n".join(lines) + "\n"


def search(
    settings: Settings,
    query: str,
    top_k: int | None = None,
    kb: Sequence[str] = (),
    cwd: str | None = None,
    missing: list[str] | None = None,
    waiting: Callable[[], None] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple[list[dict[str, Any]], IndexReport | None]:
    """The hits ``vector_search`` would return, as ``{"path", "start_line", "end_line", "score", "text"}``.

    ``kb`` roots are indexed first when new or changed, and the search is limited to them.
    Returns the hits and the report of that indexing (None without ``kb``). ``missing``,
    when given, receives the roots of the index that are gone from disk (left out);
    ``progress`` is called as that indexing goes (``crag index``'s ``progress(done, total, path)``).
    """
    from ..agent import search as search_toolbox
    from ..index import ensure_indexed
    from ..tools import Toolbox

    if not_utf8(query):  # bytes Python kept as lone surrogates: searched, they became U+FFFD
        raise UsageError("the search query is not UTF-8 text: type it in a UTF-8 terminal")
    if blank(query):
        raise UsageError("the search query is empty")
    k = settings.top_k if top_k is None else top_k
    if k < 1:
        raise UsageError(f"--top-k must be at least 1, got {k}")
    report = ensure_indexed(settings, list(kb), progress=progress, waiting=waiting) if kb else None
    box = Toolbox(settings, roots=list(kb) if kb else None, cwd=cwd)
    try:
        items = search_toolbox(box, query, k)
        if missing is not None:
            missing.extend(box.missing_roots())
    finally:
        box.close()
    return hit_records(items), report


def hit_records(items: Sequence[Any]) -> list[dict[str, Any]]:
    """``vector_search`` evidence items as the records ``search --json`` prints, in their order:
    a PDF's hit has its ``page`` and lines counted on that page (``crag.pages.location``). The
    ``path`` is the file's own name, unescaped (``search_text`` escapes it for display)."""
    return [
        {"path": item.source, **location(item.source, item.start_line, item.end_line), "score": item.score, "text": item.text}
        for item in items
    ]


def search_text(hits: Sequence[dict[str, Any]], preview_lines: int = 4) -> str:
    """A readable ranked list of hits, each path in its display form (``display_name``)."""
    if not hits:
        return "no matching chunks\n"
    out = []
    for n, hit in enumerate(hits, 1):
        out.append(f"{n}. {display_name(hit['path'])}:{location_ref(hit)}  score {hit['score']:.3f}")
        body = [line for line in hit["text"].splitlines() if line.strip()]
        for line in body[:preview_lines]:
            out.append(f"     {line[:120]}")
        if len(body) > preview_lines:
            out.append("     ...")
    return "\n".join(out) + "\n"


@frozen
class RootRow:
    """One root of the index: how many files and chunks it holds, and whether it is still on disk."""

    path: str
    files: int
    chunks: int
    missing: bool
    unreachable: str | None = None  # why a root still on disk cannot be reached now


def root_rows(state: StoreState | None) -> list[RootRow]:
    """The roots of a published state, in path order (none when nothing is published)."""
    from ..index.discover import is_gone, is_within, unreachable

    if state is None:
        return []
    rows = []
    for root in state.roots:
        held = [f for path, f in state.files.items() if is_within(path, root) and not f.binary]
        rows.append(RootRow(root, len(held), sum(f.chunks for f in held), is_gone(root), unreachable(root)))
    return sorted(rows, key=lambda r: r.path)


def location_label(location: str, cwd: str | None = None) -> str:
    """A store's location as messages show it: a folder relative to ``cwd``, a server as named."""
    return relative_label(location, cwd) if os.path.isabs(location) else location


def _count(n: int, one: str) -> str:
    return f"{n} {one}" if n == 1 else f"{n} {one}s"


def roots_text(rows: Sequence[RootRow], location: str, state: StoreState | None, cwd: str | None = None,
               building: bool = False) -> str:
    """What ``python -m crag roots`` prints: one line per root, missing ones said so; with none
    published while the first ``crag index`` is ``building`` the index, that it is."""
    where = location_label(location, cwd)
    if state is None and building:
        return f"no roots in {where} yet: a crag index is building it now; try again when it has finished\n"
    if state is None or not rows:
        return f"no roots in {where}: `python -m crag index PATH` adds one\n"
    names = [display_name(relative_label(r.path, cwd)) for r in rows]
    width = max(len(n) for n in names)
    lines = [f"{_count(len(rows), 'root')} in {where} ({state.embedder}, {_count(state.chunks, 'chunk')}):"]
    for name, row in zip(names, rows):
        counts = f"{_count(row.files, 'file')}, {_count(row.chunks, 'chunk')}"
        if row.missing:
            lines.append(f"  {name.ljust(width)}  missing on disk ({counts}; dropped by the next `python -m crag index`)")
        elif row.unreachable:
            lines.append(f"  {name.ljust(width)}  cannot be reached ({row.unreachable}; {counts} kept)")
        else:
            lines.append(f"  {name.ljust(width)}  {counts}")
    return "\n".join(lines) + "\n"


def removed_text(report: IndexReport, before: Sequence[RootRow], cwd: str | None = None) -> str:
    """What ``python -m crag roots --remove`` prints."""
    gone = {r.path: r for r in before}
    lines = []
    for root in dict.fromkeys(report.roots):  # a root named twice was removed once
        row = gone.get(root)
        counts = f" ({_count(row.files, 'file')}, {_count(row.chunks, 'chunk')})" if row else ""
        lines.append(f"removed {display_name(relative_label(root, cwd))}{counts}")
    lines.append(
        f"{_count(len(report.removed), 'file')} left the index in {location_label(report.index_dir, cwd)}; "
        f"{_count(report.chunks_total, 'chunk')} remain{'s' if report.chunks_total == 1 else ''}"
    )
    return "\n".join(lines) + "\n"


def missing_roots_note(missing: Sequence[str], cwd: str | None = None, *, shared: bool = False) -> str | None:
    """A note for stderr when roots of the index are gone from disk (their chunks are left out).
    ``shared``: the index is a database other machines use, whose roots stay searched
    (``Toolbox.search_roots``): only the file tools cannot open them here."""
    from ..index.discover import is_gone, unreachable

    notes = [
        f"crag: note: {display_name(relative_label(r, cwd))} cannot be reached ({unreachable(r) or 'it is not there'}) "
        "and is left out of the search; its files stay in the index"
        for r in missing if not is_gone(r)
    ]
    missing = [r for r in missing if is_gone(r)]
    if shared and missing:  # a root on another machine's disk: the database still answers for it
        one = len(missing) == 1
        names = ", ".join(display_name(relative_label(r, cwd)) for r in missing)
        notes.append(f"crag: note: {names} {'is' if one else 'are'} not on this machine's disk: {'its' if one else 'their'} "
                     f"hits come from the database, but read_file and grep_search cannot open {'its' if one else 'their'} "
                     "files here")
        return "\n".join(notes)
    if not missing:
        return "\n".join(notes) or None
    names = ", ".join(display_name(relative_label(r, cwd)) for r in missing)
    return "".join(f"{n}\n" for n in notes) + (
        f"crag: note: {names} no longer exist{'s' if len(missing) == 1 else ''} on disk and {'is' if len(missing) == 1 else 'are'} "
        "left out of the search; the next `python -m crag index` drops "
        f"{'it' if len(missing) == 1 else 'them'} (or `python -m crag roots --remove PATH`)"
    )
