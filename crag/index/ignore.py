"""What a knowledge base leaves out: ``.gitignore`` and ``.cragignore`` files, and ``--exclude``.

Read as ripgrep reads ignore files: every folder may hold them, their patterns are relative
to that folder, a deeper file's match wins over a shallower one's, ``!pattern`` takes a path
back in, and ``.cragignore`` wins over ``.gitignore`` in the same folder (as ripgrep's
``.ignore`` does). Ignore files above a root are read up to the top of its git work tree
(the nearest folder holding ``.git``), so ``crag index docs`` in a repository honours the
repository's ``.gitignore``. Unlike ripgrep, a ``.gitignore`` counts outside a git work tree
too. A folder that is ignored is not entered, so nothing under it can be taken back (as in
git). ``--exclude GLOB`` patterns are gitignore patterns relative to the root being indexed,
for one run. Patterns are matched by ``pathspec``'s ``GitIgnoreSpec``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["IGNORE_FILES", "Ignores"]

IGNORE_FILES = (".gitignore", ".cragignore")  # later files win over earlier ones in a folder
_MAX_IGNORE_BYTES = 1024 * 1024


def _spec(lines: Sequence[str]) -> Any:
    from pathspec import GitIgnoreSpec

    return GitIgnoreSpec.from_lines(lines)


class Ignores:
    """The ignore rules of one root; ``ignored(path, is_dir)`` for any path under it."""

    def __init__(self, root: str, exclude: Sequence[str] = ()) -> None:
        self.root = root
        self.exclude = _spec(exclude) if exclude else None
        self.top = _work_tree_top(root)
        self._specs: dict[str, Any] = {}

    def _folder_spec(self, folder: str) -> Any:
        if folder not in self._specs:
            lines: list[str] = []
            for name in IGNORE_FILES:
                path = os.path.join(folder, name)
                try:
                    if os.path.isfile(path) and os.path.getsize(path) <= _MAX_IGNORE_BYTES:
                        with open(path, encoding="utf-8", errors="replace") as f:
                            lines += f.read().splitlines()
                except OSError:
                    continue
            self._specs[folder] = _spec(lines) if any(ln.strip() and not ln.startswith("#") for ln in lines) else None
        return self._specs[folder]

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (absolute, under the root) is left out."""
        suffix = "/" if is_dir else ""
        rel = os.path.relpath(path, self.root).replace(os.sep, "/") + suffix
        if self.exclude is not None and path != self.root and self.exclude.match_file(rel):
            return True
        folder = os.path.dirname(path)
        while True:
            spec = self._folder_spec(folder)
            if spec is not None:
                result = spec.check_file(os.path.relpath(path, folder).replace(os.sep, "/") + suffix)
                if result.include is not None:
                    return bool(result.include)
            if folder == self.top or len(folder) <= len(self.top):
                return False
            parent = os.path.dirname(folder)
            if parent == folder:
                return False
            folder = parent


def _work_tree_top(root: str) -> str:
    """The nearest folder at or above ``root`` that holds ``.git``; ``root`` (or its folder,
    for a file) when there is none."""
    start = root if os.path.isdir(root) else os.path.dirname(root)
    folder = start
    while True:
        if os.path.exists(os.path.join(folder, ".git")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return start
        folder = parent
