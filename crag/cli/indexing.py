"""``index``, ``roots`` and ``search``: the commands that build, list and query the index.

The text they print, and the search they run, are in ``crag.cli.index_text``.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from .common import (
    index_note,
    own_name,
    require_index_libraries,
    settings,
    shown,
    shown_json,
    waiting_note,
    waits_shown,
)


def cmd_index(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..index import index_roots
    from .index_text import index_report_text, is_terminal, progress_printer

    config = settings()
    require_index_libraries()
    progress = progress_printer(err) if is_terminal(err) else None

    with waits_shown(progress):
        report = index_roots(config, args.paths, progress=progress, patterns=args.exclude,
                             waiting=waiting_note(config, err))
    out.write(shown(own_name(index_report_text(report))))
    return 0


def cmd_roots(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..index import drop_roots, open_store
    from .index_text import removed_text, root_rows, roots_text

    config = settings()
    require_index_libraries()
    store = open_store(config)
    try:
        before = root_rows(store.state(files=True, check=True))  # a damaged index is said to be, as search says
        if args.remove:
            report = drop_roots(config, args.remove, waiting=waiting_note(config, err))
            out.write(shown(own_name(removed_text(report, before))))
        else:
            state = store.state(files=False)
            out.write(shown(own_name(roots_text(before, store.location, state, building=state is None and store.building()))))
    finally:
        store.close()
    return 0


def cmd_search(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .ask import IndexNotes, extras_note, kb_note, skipped_note
    from .index_text import missing_roots_note, search, search_text
    from .live import wants_progress

    config = settings()
    require_index_libraries()
    missing: list[str] = []
    notes = IndexNotes(err, wants_progress(out, args.json))  # the indexing line, as ``ask --kb`` draws it
    with waits_shown(notes if notes.tty else None):
        hits, report = search(config, " ".join(args.words), args.top_k, args.kb, missing=missing,
                              waiting=waiting_note(config, err), progress=notes)
    # after the search: a failure is its one error line, with no note before it
    if report is not None:
        skipped_note(report, err)
        extras_note(report, err)
    if report is not None and report.changed_anything:
        err.write(shown(kb_note(report)) + "\n")  # the one line ``ask --kb`` writes; it names the index
    else:
        index_note(config, err)
    note = missing_roots_note(missing, shared=bool(config.store))
    if note:
        err.write(shown(own_name(note)) + "\n")
    if args.json:
        out.write(shown_json(hits, out) + "\n")
    else:
        out.write(shown(search_text(hits)))
    return 0
