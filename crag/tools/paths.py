"""Confinement of file access to the knowledge-base roots (for read_file and grep_search).

``resolve_in_roots`` turns a path a model asked for into a real file inside one of the
roots, or raises ``ToolError``. A path is accepted only when its *real* path (all symbolic
links resolved) lies inside the *real* path of a root, so ``..``, absolute paths elsewhere
and links pointing out of a root are all refused the same way. Within a root only what
discovery would index is served (``crag.index.discover.excluded_reason``, the same rules):
hidden files and folders (``.env``, ``.git/``), skipped folders (``node_modules``, virtual
environments), the index directory, and files that are not text by name (``server.key``,
``credentials``) are refused.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence

from ..errors import ToolError
from ..index.discover import excluded_reason, is_within
from ..safe_text import display_name, read_back_name

__all__ = ["resolve_in_roots"]


def resolve_in_roots(
    tool: str,
    requested: str,
    roots: Sequence[str],
    cwd: str,
    excluded: Sequence[str] = (),
) -> str:
    """The real path of ``requested`` when it is a file inside one of ``roots``.

    A relative path is tried against ``cwd`` first, since crag shows a file under the working
    folder relative to it, and then against each root (a file root: its folder); an absolute
    path is taken as is. A path as crag shows it (a name with a newline
    or a control character escaped, ``a\\nb.md``) is taken back when no file has the name as
    written, and so is a name written in another Unicode form than its folder's (``_respelled``).
    Raises ``ToolError`` otherwise.
    """
    try:
        return _resolve(tool, requested, roots, cwd, excluded)
    except ToolError as first:
        bases = [cwd] + [r if os.path.isdir(r) else os.path.dirname(r) for r in roots]
        for name in (read_back_name(requested), _respelled(requested, bases)):
            if name is not None:
                try:
                    return _resolve(tool, name, roots, cwd, excluded)
                except ToolError:
                    pass
        raise first from None


def _respelled(requested: str, bases: Sequence[str]) -> str | None:
    """``requested`` with each name spelled as its folder spells it, where the two differ only in
    their Unicode form: macOS writes file names decomposed (NFD: ``ë`` as ``e`` and a combining
    diaeresis, ``가`` as two jamo), a keyboard and a model write them composed (NFC). The first
    base (``bases``, for a relative path) under which every name is found; None when none is."""
    path = unicodedata.normalize("NFC", os.path.expanduser(requested.strip()))  # "~/...": as ``_resolve`` reads it
    names = [n for n in path.replace("\\", "/").split("/") if n]
    for base in [os.sep] if os.path.isabs(path) else bases:
        current = base
        for name in names:
            if name in (".", "..") or os.path.lexists(os.path.join(current, name)):
                current = os.path.join(current, name)
                continue
            try:
                same = [e for e in os.listdir(current) if unicodedata.normalize("NFC", e) == name]
            except OSError:
                break
            if len(same) != 1:
                break
            current = os.path.join(current, same[0])
        else:
            if names:
                return current
    return None


def _resolve(tool: str, requested: str, roots: Sequence[str], cwd: str, excluded: Sequence[str]) -> str:
    if "\x00" in requested:
        raise ToolError(tool, "the path contains a NUL character")
    path = os.path.expanduser(requested.strip()) if requested.strip().startswith("~") else requested.strip()
    real_roots = [(r, os.path.realpath(r)) for r in roots]
    candidates: list[str] = []
    if os.path.isabs(path):
        candidates.append(os.path.normpath(path))
    else:  # a path crag showed names its file first, whatever another root holds under that name
        candidates.append(os.path.normpath(os.path.join(cwd, path)))
        for root, _ in real_roots:
            base = root if os.path.isdir(root) else os.path.dirname(root)
            candidates.append(os.path.normpath(os.path.join(base, path)))
    real_excluded = [os.path.realpath(e) for e in excluded]
    found_outside = False
    within = False  # a candidate lies in a root's folder, whether or not the file is there
    folder = False  # a candidate in the roots is a folder (the planner named one, not a file)
    refused: str | None = None
    for candidate in candidates:
        try:
            real = os.path.realpath(candidate)
        except (OSError, ValueError):
            continue
        inside = [rr for _, rr in real_roots if is_within(real, rr)]
        if not inside or any(is_within(real, e) for e in real_excluded):
            if os.path.exists(real):
                found_outside = True
            continue
        within = True
        if not os.path.isfile(real):
            folder = folder or os.path.isdir(real)
            continue
        reasons = [excluded_reason(real, rr) for rr in inside]
        if None in reasons:
            return real
        refused = refused or reasons[0]
    if refused is not None:
        raise ToolError(tool, f"{display_name(requested)} is not part of the knowledge base: {refused}")
    # a path in a root's folder names no file there (deleted since a search found it): no file,
    # not "outside"
    if folder:
        raise ToolError(tool, f"{display_name(requested)} is a folder: give the path of one of its files")
    if found_outside or (not within and (os.path.isabs(path) or ".." in path.replace("\\", "/").split("/"))):
        raise ToolError(tool, f"{display_name(requested)} is outside the knowledge base: only files inside its folders can be read")
    raise ToolError(tool, f"no file {display_name(requested)} in the knowledge base")
