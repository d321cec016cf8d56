"""Whether a path is on disk and can be reached now, as crag tells a root's state.

A root is gone (it, or a folder on its way, does not exist; a symbolic link to nothing or
round in a loop): its files leave the index with the next update. Or it is there but cannot
be reached now (the root folder itself, or a folder on its way, may not be entered or listed;
an I/O error; a network mount that went stale): its files are kept as they were. Or it is
reachable. ``crag.index.build``, ``crag roots``, the search notes and the toolbox all ask here.
A file named as a root that may not be read (``unreadable_file``) is an error of ``crag index``.
"""

from __future__ import annotations

import errno
import os

from ..safe_text import display_name
from .labels import relative_label

__all__ = ["is_gone", "not_a_file_or_folder", "reachable", "refused_root", "stat_error", "unreachable", "unreadable_file"]

_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def stat_error(path: str) -> OSError | None:
    """Why ``os.stat(path)`` fails (None: it does not), for ``is_gone`` and ``unreachable``."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc
    return None


def is_gone(path: str) -> bool:
    """Whether ``path`` is gone from disk: it (or a folder on its way) does not exist, or it is
    a symbolic link to nothing or round in a loop. A path that cannot be reached for another
    reason (a folder on its way that may not be entered, an I/O error, a mount that went
    stale) is not gone: its files are kept in the index rather than dropped."""
    exc = stat_error(path)
    return exc is not None and exc.errno in _GONE


def unreachable(path: str) -> str | None:
    """Why ``path``, which is not gone, cannot be reached now (``Permission denied``): a folder
    on its way, or the folder itself, may not be entered, or it may not be listed; None when it
    can, or when it is gone (``is_gone``)."""
    exc = stat_error(path) or _folder_error(path)
    if exc is None or exc.errno in _GONE:
        return None
    return exc.strerror or str(exc)


def reachable(path: str) -> bool:
    """Whether ``path`` is on disk and can be reached now: neither gone nor ``unreachable``."""
    return stat_error(path) is None and _folder_error(path) is None


def unreadable_file(path: str) -> str | None:
    """Why the file ``path`` may not be opened for reading now (``Permission denied``); None when
    it can, or when it is no regular file (a folder's reach is ``unreachable``'s)."""
    if not os.path.isfile(path):
        return None
    try:
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))  # a pipe swapped in never blocks
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _folder_error(path: str) -> OSError | None:
    """Why the folder ``path`` cannot be listed or entered (``chmod 000``); None when it can, or
    when it is no folder."""
    if not os.path.isdir(path):
        return None
    try:
        with os.scandir(path):  # opening it needs leave to list it
            pass
        os.stat(os.path.join(path, os.curdir))  # looking inside it needs leave to enter it
    except OSError as exc:
        return exc
    return None


def not_a_file_or_folder(path: str, given: str | os.PathLike[str]) -> str:
    """Why a root that is there cannot be indexed: it is neither a file nor a folder (a named
    pipe, a device, a socket). A symbolic link the user ``given`` is named as typed, with where
    it leads, not by the path it leads to (which ``path`` resolves): ``/dev/zero`` is no name
    the user wrote."""
    if os.path.islink(link := os.path.abspath(os.path.expanduser(os.fspath(given)))):
        return (f"knowledge-base path {relative_label(link, typed=True)} is a symbolic link to "
                f"{display_name(os.readlink(link))}, which is not a file or folder")
    return f"knowledge-base path {relative_label(path)} is not a file or folder"


def refused_root(path: str, given: str | os.PathLike[str]) -> str | None:
    """Why a root that is there cannot be indexed, as a message (None: it can): a file named as
    a root that may not be read, or a path that is neither a file nor a folder (named as
    ``given``, see ``not_a_file_or_folder``). Asked before anything is written."""
    import stat

    if (why := unreadable_file(path)) is not None:
        return f"knowledge-base path {relative_label(path)} cannot be read ({why})"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # said by the walk, as it finds it
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else not_a_file_or_folder(path, given)
