"""What a knowledge base leaves out: ``.cragignore``, ``.ignore`` and ``.gitignore`` files, and ``--exclude``.

Read as ripgrep reads ignore files: every folder may hold them, their patterns are relative
to that folder, ``!pattern`` takes a path back in, and of each kind the deepest file that
matches a path decides for its kind. The kinds rank as ripgrep ranks them, whatever their
depth: ``.cragignore`` (crag's own, as ripgrep's ``.rgignore``) first, then ``.ignore``,
then ``.gitignore``, then the repository's ``.git/info/exclude``, then git's
``core.excludesFile``: a ``.gitignore`` deeper down cannot take back what a ``.cragignore``
leaves out. A folder holding a ``.git`` git takes for a repository (not an empty
``.git`` folder, nor a ``.git`` file naming one gone) is a repository of its own: ``.gitignore`` files
above it do not reach into it, and its own ``.git/info/exclude`` applies (in the folder a
``.git`` file names, for a linked work tree or a submodule, as git finds it). The
``.cragignore`` and ``.ignore`` files of every folder above a root are read, up to the
filesystem's root, git work tree or not (as ripgrep reads its own in parent folders); the
``.gitignore`` files above it only up to the top of its git work tree (the nearest folder
holding such a ``.git``; none outside one), so ``crag index docs`` in a repository honours the
repository's ``.gitignore``. Unlike ripgrep, a ``.gitignore`` inside the root counts
outside a git work tree too. A folder that is
ignored is not entered, so nothing under it can be taken back (as in git). ``--exclude
GLOB`` patterns are gitignore patterns relative to the root being indexed, for one run.

Patterns follow git's (``crag.index.globs``: parsed as git parses them, matched without
backtracking, a large file looked up rather than scanned). Within one file the last
matching line decides.

A line git would never match (``!`` alone, a trailing ``\\``, an unclosed ``[``, an unknown
``[:class:]``, a ``.`` or ``..`` folder as in ``./drafts``) is skipped and named once, with
its file and line, as a ``CragWarning`` (the CLI prints it as ``crag: warning: ...``; ten per
file, then one warning counts the rest); so is an ignore file that cannot be read, whose exclusions are then missing. A byte-order mark is
dropped, and size is no reason to skip a file. In ``--exclude`` such a pattern is a
``UsageError``.
"""

from __future__ import annotations

import functools
import os
import stat
import warnings
from collections.abc import Sequence

from ..errors import CragWarning, UsageError
from ..safe_text import display_name
from .globs import Problem, Rule, RuleSet, parse_rules

__all__ = ["IGNORE_FILES", "Ignores", "check_excludes"]

IGNORE_FILES = (".cragignore", ".ignore", ".gitignore")  # by rank: an earlier kind wins at any depth


def _shown(path: str) -> str:
    """A path as messages show it: relative to the working folder when below it."""
    try:
        cwd = os.getcwd()
        rel = os.path.relpath(path, cwd)
        if not rel.startswith(".." + os.sep) and rel != "..":
            path = rel
    except (OSError, ValueError):
        pass
    return display_name(path)


def _warn(message: str) -> None:
    # Said once per message and process: the CLI prints it as `crag: warning: ...`.
    warnings.warn(CragWarning(message), stacklevel=2)


def _parsed(path: str) -> RuleSet | None:
    """The rules of the ignore file ``path``, none when there is none; its problems, and a
    file that cannot be read (whose exclusions are then missing), are said each time: the
    CLI says each warning once."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return None  # a folder of that name holds no patterns, for git either
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device: reading it could block or never end
            _warn(f"{_shown(path)} cannot be read (it is not a regular file), so the paths it leaves out are not "
                  "left out (they may hold secrets): make it a file, or remove it")
            return None
        found, problems = _parse_version(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    except (FileNotFoundError, NotADirectoryError):  # none there: its folder is gone, or is now a file
        return None
    except OSError as exc:
        if not _listed(path):  # e.g. a folder that lists but cannot be entered, or a name too long to open
            return None
        _warn(f"{_shown(path)} cannot be read ({exc.strerror or exc}), so the paths it leaves out are not "
              "left out (they may hold secrets): make it readable, or remove it")
        return None
    _report(_shown(path), problems)
    return found


def _listed(path: str) -> bool:
    """Whether the folder of ``path`` lists its name (True when the folder cannot be listed:
    the file may be there). An ignore file that cannot be opened is said only when it exists."""
    folder, name = os.path.split(path)
    try:
        return name in os.listdir(folder)
    except OSError:
        return True


@functools.lru_cache(maxsize=64)
def _parse_version(path: str, version: tuple[int, ...]) -> tuple[RuleSet | None, tuple[Problem, ...]]:
    """One version of an ignore file, parsed once (a large file is read once for all the
    searches of a session, not once per search). A BOM is dropped, as git drops it."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = [line[:-1] if line.endswith("\r") else line for line in data.decode("utf-8", errors="replace").split("\n")]
    found, problems = parse_rules(lines)
    return (RuleSet(found) if found else None), tuple(problems)


_NAMED = 10  # problem lines named per ignore file; the rest are counted in one more line


def _report(source: str, problems: Sequence[Problem]) -> None:
    for p in problems[:_NAMED]:
        shown_line = display_name(p.text)
        if p.skipped:
            _warn(f"{source} line {p.line} \"{shown_line}\" is skipped: {p.why}")
        else:
            _warn(f"{source} line {p.line} \"{shown_line}\": {p.why}")
    if len(problems) > _NAMED:  # a file that is not an ignore file at all would name each of its lines
        rest = problems[_NAMED:]
        skipped = sum(p.skipped for p in rest)
        _warn(f"{source} has {len(rest)} more lines with such problems (lines {rest[0].line} to {rest[-1].line}, "
              f"{skipped} of them skipped); they are not named one by one")


def _exclude_rules(patterns: Sequence[str]) -> RuleSet:
    """``--exclude`` patterns; one git would never match is a ``UsageError``."""
    rules: list[Rule] = []
    for pattern in patterns:
        found, problems = parse_rules([pattern])
        if problems:
            raise UsageError(f"--exclude \"{display_name(pattern)}\" is not a pattern crag can use: {problems[0].why}")
        if not found and pattern.startswith("#"):  # a name starting with "#" is written escaped, as in an ignore file
            raise UsageError(f"--exclude \"{display_name(pattern)}\" is a # comment, not a pattern; for a name "
                             f"starting with #, write --exclude \"\\{display_name(pattern)}\"")
        if not found:
            raise UsageError(f"--exclude \"{display_name(pattern)}\" is not a pattern (it is empty, or a # comment)")
        rules += found
    return RuleSet(rules)


def check_excludes(patterns: Sequence[str], roots: Sequence[str] = ()) -> None:
    """Raise ``UsageError`` for an ``--exclude`` pattern that could never match, or one written
    from the working folder (``crag index docs --exclude docs/drafts``, ``docs/drafts/*.md``, or
    an absolute path): relative to every root it names nothing, and what it means would be
    indexed. A glob is judged by the folders written before its first wildcard (``./docs/drafts``
    too, which git would never match: the error names the pattern to write). So is a ``!``
    pattern with no earlier one to take back from (``--exclude '!drafts'``, as ripgrep's
    ``--glob`` is written, leaves nothing out)."""
    for pattern in patterns:
        path = pattern.rstrip("/")
        if pattern.startswith("!") or "/" not in path:
            continue  # a name matched at any depth (no slash but a trailing one)
        parts = path.split("/")
        literal = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[\\")), len(parts))
        head = "/".join(parts[:literal])  # "docs/drafts" of "docs/drafts/*.md"
        if not head.strip("/"):
            continue  # "**/drafts", "*/x": no folder written
        meant = os.path.realpath(head)
        folders = [root for root in map(os.path.realpath, roots) if os.path.isdir(root)]
        if not os.path.lexists(meant) or any(os.path.lexists(os.path.join(r, head.lstrip("/"))) for r in folders):
            continue  # it names something in a root (or nothing anywhere): a pattern as meant
        rest = pattern[len(head):]  # what follows the folders: "/*.md", "/", ""
        for root in folders:
            if meant == root and rest.strip("/"):
                written = rest  # "docs/*.md" for the root docs: its own "/*.md"
            elif meant != root and meant.startswith(root.rstrip(os.sep) + os.sep):
                written = os.path.relpath(meant, root).replace(os.sep, "/") + rest
            else:
                continue
            try:
                _exclude_rules([written])
            except UsageError:
                continue  # a pattern git would never match, said as such below
            raise UsageError(f"--exclude \"{display_name(pattern)}\" names nothing in {_shown(root)}: patterns are "
                             f"relative to the root indexed; write --exclude \"{display_name(written)}\"")
    _exclude_rules(patterns)
    for i, pattern in enumerate(patterns):  # "!drafts" takes back only what an earlier --exclude leaves out
        if pattern.startswith("!") and all(p.startswith("!") for p in patterns[:i]):
            raise UsageError(f"--exclude \"{display_name(pattern)}\" leaves nothing out: a \"!\" pattern takes back only "
                             "what an earlier --exclude leaves out (not what an ignore file does); to leave "
                             f"{display_name(pattern[1:])} out, write --exclude \"{display_name(pattern[1:])}\"")


class Ignores:
    """The ignore rules of one root; ``ignored(path, is_dir)`` for any path under it.

    Raises ``UsageError`` for an ``exclude`` pattern that could never match."""

    def __init__(self, root: str, exclude: Sequence[str] = ()) -> None:
        self.root = root
        self.exclude = _exclude_rules(exclude) if exclude else None
        self.top = _work_tree_top(root)
        self._specs: dict[str, tuple[RuleSet | None, ...]] = {}
        self._above: list[tuple[str, tuple[RuleSet | None, ...]]] | None = None  # read on first use
        self._repos: dict[str, bool] = {}  # folder -> whether it holds .git
        self._info: dict[str, RuleSet | None] = {}  # repository -> its .git/info/exclude, read on first use
        self._user: RuleSet | None = None  # git's core.excludesFile, read on first use
        self._user_read = False

    def _folder_specs(self, folder: str) -> tuple[RuleSet | None, ...]:
        """The rules of ``folder``'s ignore files, one per kind (``IGNORE_FILES``' order)."""
        if folder not in self._specs:
            self._specs[folder] = tuple(_parsed(os.path.join(folder, name)) for name in IGNORE_FILES)
        return self._specs[folder]

    def _above_top(self) -> list[tuple[str, tuple[RuleSet | None, ...]]]:
        """The ``.cragignore`` and ``.ignore`` rules of each folder above the top of the work
        tree (above the root, outside one) up to the filesystem root, nearest first: ripgrep
        reads its own ignore files in every parent folder, git repository or not. Only the
        folders holding one are kept; their ``.gitignore`` is never read."""
        if self._above is None:
            self._above = []
            folder = self.top
            while (parent := os.path.dirname(folder)) != folder:
                folder = parent
                specs = tuple(_parsed(os.path.join(folder, name)) for name in IGNORE_FILES[:2])
                if any(spec is not None for spec in specs):
                    self._above.append((folder, specs))
        return self._above

    def _repository(self, folder: str) -> bool:
        if folder not in self._repos:
            self._repos[folder] = _holds_repository(folder)
        return self._repos[folder]

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (absolute, under the root) is left out."""
        if self.exclude is not None and path != self.root:
            rel = os.path.relpath(path, self.root).replace(os.sep, "/")
            if self.exclude.decide(rel, is_dir):
                return True
        found: list[bool | None] = [None] * len(IGNORE_FILES)  # the deepest decision of each kind
        git = len(IGNORE_FILES) - 1
        repository = None  # the nearest folder holding .git: .gitignore files above it do not count
        folder = os.path.dirname(path)
        while True:
            rel = None  # the path relative to a folder, worked out only where an ignore file is
            for kind, spec in enumerate(self._folder_specs(folder)):
                if found[kind] is None and spec is not None and (kind != git or repository is None):
                    rel = rel or os.path.relpath(path, folder).replace(os.sep, "/")
                    found[kind] = spec.decide(rel, is_dir)
            if found[0] is not None:
                return found[0]  # .cragignore outranks every other kind
            if repository is None and self._repository(folder):
                repository = folder
            if folder == self.top or len(folder) <= len(self.top):
                break
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
        for folder, specs in self._above_top():
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            for kind, spec in enumerate(specs):
                if found[kind] is None and spec is not None:
                    found[kind] = spec.decide(rel, is_dir)
            if found[0] is not None:
                return found[0]
        for decision in found:
            if decision is not None:
                return decision
        # Then the repository's own patterns, and the user's (core.excludesFile).
        if repository is None:
            return False
        rel = os.path.relpath(path, repository).replace(os.sep, "/")
        for spec in (self._info_exclude(repository), self._user_exclude()):
            result = spec.decide(rel, is_dir) if spec is not None else None
            if result is not None:
                return result
        return False

    def _info_exclude(self, repository: str) -> RuleSet | None:
        """The patterns of ``info/exclude`` in the git folder of ``repository``, if any."""
        if repository not in self._info:
            common = _git_common_dir(os.path.join(repository, ".git"))
            self._info[repository] = _parsed(os.path.join(common, "info", "exclude")) if common else None
        return self._info[repository]


    def _user_exclude(self) -> RuleSet | None:
        """The patterns of git's ``core.excludesFile`` when the root is in a git work tree."""
        if not self._user_read:
            self._user_read = True
            common = _git_common_dir(os.path.join(self.top, ".git"))
            if common is not None:
                found = _excludes_file(common, self.top)
                self._user = _parsed(found) if found else None
        return self._user


def _excludes_file(common: str, top: str) -> str | None:
    """The file git reads as ``core.excludesFile`` for the repository in ``common``: the last
    value in the system, user and repository configuration (``GIT_CONFIG_NOSYSTEM`` and
    ``GIT_CONFIG_GLOBAL`` honoured; ``include`` directives are not followed; an empty one
    names no file), else ``$XDG_CONFIG_HOME/git/ignore`` (``~/.config/git/ignore``)."""
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    configs = [] if os.environ.get("GIT_CONFIG_NOSYSTEM") else ["/etc/gitconfig"]
    user = os.environ.get("GIT_CONFIG_GLOBAL")
    configs += [user] if user else [os.path.join(xdg, "git", "config"), os.path.join(home, ".gitconfig")]
    configs.append(os.path.join(common, "config"))
    value = None
    for config in configs:
        found = _core_excludes(config)
        value = value if found is None else found
    if value is None:
        return os.path.join(xdg, "git", "ignore")
    if not value:  # set empty: git reads no excludes file, not even its default one
        return None
    if value == "~" or value.startswith("~/"):
        value = home + value[1:]
    return os.path.join(top, value)  # an absolute value stays as it is


def _core_excludes(config: str) -> str | None:
    """The last ``excludesFile`` of the ``[core]`` section of a git config file, if any
    (``""``: set empty)."""
    try:
        with open(config, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "surrogateescape")
    except (OSError, ValueError):
        return None
    value, section = None, ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line[1:line.find("]")].strip().lower() if "]" in line else ""
            line = line[line.find("]") + 1:].strip() if "]" in line else ""
        if section != "core" or "=" not in line:
            continue
        key, _, rest = line.partition("=")
        if key.strip().lower() != "excludesfile":
            continue
        out, quoted = [], False
        for ch in rest.strip():
            if ch == '"':
                quoted = not quoted
            elif ch in "#;" and not quoted:
                break
            else:
                out.append(ch)
        value = "".join(out).strip()
    return value


def _holds_repository(folder: str) -> bool:
    """Whether ``folder/.git`` is a repository as git recognises one: its git folder holds
    ``HEAD``, its common folder ``objects`` and ``refs``. An empty ``.git`` folder, or a
    ``.git`` file naming a folder that is gone (a submodule copied out of its project), is
    not one, and the ignore files above still reach into ``folder``, as git applies them."""
    git = os.path.join(folder, ".git")
    common = _git_common_dir(git)
    if common is None:
        return False
    own = git if os.path.isdir(git) else _gitdir_named(git)
    return (own is not None and os.path.isfile(os.path.join(own, "HEAD"))
            and all(os.path.isdir(os.path.join(common, name)) for name in ("objects", "refs")))


def _gitdir_named(git: str) -> str | None:
    """The folder a ``.git`` file's ``gitdir:`` line names (None: not such a file)."""
    try:
        with open(git, "rb") as f:
            head = f.read(4096).decode("utf-8", "surrogateescape")
    except (OSError, ValueError):
        return None
    if not head.startswith("gitdir:"):
        return None
    return os.path.join(os.path.dirname(git), head[len("gitdir:"):].splitlines()[0].strip())


def _git_common_dir(git: str) -> str | None:
    """The folder holding a work tree's ``info/exclude``, as git finds it: ``.git`` itself; for
    a ``.git`` file (a linked work tree, a submodule) the folder its ``gitdir:`` line names, or
    the common folder that folder's ``commondir`` names. None when there is none."""
    if os.path.isdir(git):
        return git
    found = _gitdir_named(git)
    if found is None:
        return None
    try:
        with open(os.path.join(found, "commondir"), "rb") as f:
            common = f.read(4096).decode("utf-8", "surrogateescape").splitlines()
    except (OSError, ValueError):
        common = []
    if common and common[0].strip():
        found = os.path.join(found, common[0].strip())
    return found if os.path.isdir(found) else None


def _work_tree_top(root: str) -> str:
    """The nearest folder at or above ``root`` that holds ``.git``; ``root`` (or its folder,
    for a file) when there is none."""
    start = root if os.path.isdir(root) else os.path.dirname(root)
    folder = start
    while True:
        if _holds_repository(folder):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return start
        folder = parent
