"""How crag names a path to a person and to a program: relative to the working folder when
under it (``relative_path``), and in a display form for a person (``relative_label``); a
citation's path as the answer log keeps it (``logged_path``) and shows it (``shown_logged_path``)."""

from __future__ import annotations

import os

from ..safe_text import display_name

__all__ = ["is_within", "logged_path", "relative_label", "relative_path", "shown_logged_path"]


def is_within(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or lies below it (both absolute and normalised)."""
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


def relative_path(path: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None) -> str:
    """``path`` as crag cites it: relative to ``cwd`` (default: the working directory) when under
    it, else absolute; a URI as it is. Unescaped, so a program opens the file it names (evidence,
    citations, ``--json``); what crag shows a person is ``relative_label``."""
    if "://" in os.fspath(path):
        return os.fspath(path)
    p = os.path.abspath(os.fspath(path))
    base = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
    if is_within(p, base) and p != base:
        return os.path.relpath(p, base)
    return p


def relative_label(path: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None, *,
                   typed: bool = False) -> str:
    """``relative_path`` as crag shows it, in the display form of ``crag.safe_text.display_name``
    (a newline or bytes that are not UTF-8 escaped: a name never adds a line to a report).
    ``typed``: a path as given, quoted when a name in it starts or ends with a space, which
    the message would hide (``"docs " does not exist``, while ``docs`` does)."""
    label = display_name(relative_path(path, cwd))
    return f'"{label}"' if typed and any(part != part.strip() for part in label.split(os.sep)) else label


def logged_path(path: str, line: int | None) -> str:
    """A citation's path as the answer log keeps it: absolute for a file, so that ``crag log``
    run from another folder names it relative to that folder (``shown_logged_path``). A source
    with no line (SPEC §4: a URL, a Jira key) is kept as it is."""
    return os.path.abspath(path) if line is not None and path and "://" not in path else path


def shown_logged_path(path: str) -> str:
    """A logged citation's path as crag cites paths (``relative_path``). An older crag logged it
    relative to the folder the question was asked in, which is not known: such a path stays as
    it is."""
    return relative_path(path) if os.path.isabs(path) else path
