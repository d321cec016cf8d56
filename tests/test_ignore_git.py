"""crag indexes what git leaves untracked and not ignored: random folder trees with
``.gitignore`` files in any folder (negations, ``**``, anchors, escapes, trailing spaces,
character classes, backslashes, non-ASCII names) give the same files to ``crag.index.discover``
as to ``git ls-files --others --exclude-standard`` in a ``git init`` of the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings

from crag.index.discover import discover
from tests.strategies import ignore_trees

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="compares with git")


def git_env(home: str) -> dict[str, str]:
    """git with no user or system settings (no global excludes file, no ignorecase)."""
    return {**os.environ, "HOME": home, "XDG_CONFIG_HOME": home, "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull}


def build(top: Path, folders: list[str], files: list[str], ignores: dict[str, list[str]]) -> None:
    for folder in ["", *folders]:
        (top / folder).mkdir(parents=True, exist_ok=True)
    for name in files:
        (top / name).write_text("# Note\n\nSome text.\n", encoding="utf-8")
    for folder, lines in ignores.items():
        (top / folder / ".gitignore").write_bytes("\n".join(lines).encode("utf-8") + b"\n")


def git_untracked(top: Path, root: Path) -> set[str]:
    env = git_env(str(top.parent))
    subprocess.run(["git", "init", "-q", str(top)], check=True, env=env)
    out = subprocess.run(["git", "-C", str(root), "ls-files", "--others", "--exclude-standard", "-z"],
                         check=True, capture_output=True, env=env).stdout
    names = {os.fsdecode(p) for p in out.split(b"\0") if p}
    return {n for n in names if not os.path.basename(n).startswith(".")}


def crag_indexed(root: Path) -> set[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lines git never matches are named; compared here by effect
        found = discover([root])
    return {Path(f.path).relative_to(root).as_posix() for f in found.files}


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(tree=ignore_trees())
@example(tree=([""], ["a.md"], {"": ["!a.md", "!a.md", "**\\/a.md"]}))  # once found: an escaped slash after **
def test_crag_indexes_the_files_git_leaves_untracked(tree: tuple[list[str], list[str], dict[str, list[str]]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp) / "kb"
        build(top, *tree)
        assert crag_indexed(top) == git_untracked(top, top), tree[2]


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(tree=ignore_trees())
def test_a_root_below_the_top_of_a_repository_honours_the_ignore_files_above_it(
        tree: tuple[list[str], list[str], dict[str, list[str]]]) -> None:
    folders, _, ignores = tree
    below = [f for f in folders if f]
    if not below:
        return
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp) / "kb"
        build(top, *tree)
        root = top / below[0]
        left = git_untracked(top, root)
        named = subprocess.run(["git", "-C", str(top), "check-ignore", "-q", below[0]], env=git_env(tmp), check=False)
        if named.returncode == 0:  # a root the user names is indexed (as ripgrep searches it), git leaves it out
            return
        assert crag_indexed(root) == left, ignores


@pytest.mark.parametrize(("lines", "files", "left"), [
    # A "**" right after the pattern's leading plain text spans folders, as in git.
    (["d**/b.md"], ["d/b.md", "dx/y/b.md", "d/e/b.md", "b.md"], {"b.md"}),
    (["x/d**", "!x/dfoo/"], ["x/dfoo/bar.md", "x/e.md"], {"x/e.md"}),
    # A class may hold "/", which it never matches; the pattern is then anchored.
    (["a[!/]b.md", "x[a/b]y.md"], ["axb.md", "s/axb.md", "xay.md", "a/b.md"], {"s/axb.md", "a/b.md"}),
    # "\/" is a slash.
    (["d\\/b.md"], ["d/b.md", "d/c.md"], {"d/c.md"}),
    # Patterns match bytes, as git's do: "?" is one byte, not one character.
    (["?b.md", "[é]c.md", "[!a]d.md", "éé.md"], ["éb.md", "ab.md", "éc.md", "éd.md", "éé.md"], {"éb.md", "éc.md", "éd.md"}),
    # A "." or ".." folder never matches (paths hold none), a "." within a name does.
    (["./a.md", "d/../b.md", "d/.", "x/..", "*/.c.md", "d.?/e.md"], ["a.md", "b.md", "d/b.md", "x/y.md", "d.x/e.md"],
     {"a.md", "b.md", "d/b.md", "x/y.md"}),
])
def test_patterns_git_reads_in_its_own_way(tmp_path: Path, lines: list[str], files: list[str], left: set[str]) -> None:
    top = tmp_path / "kb"
    build(top, sorted({str(Path(f).parent) for f in files} - {"."}), files, {"": lines})
    assert git_untracked(top, top) == left
    assert crag_indexed(top) == left


@pytest.mark.parametrize("kind", ["worktree", "submodule"])
def test_a_linked_work_tree_or_submodule_reads_its_repositorys_info_exclude(tmp_path: Path, kind: str) -> None:
    """A work tree whose ``.git`` is a file (``git worktree add``, a submodule) takes the
    repository's ``info/exclude`` from the folder that file names, as git does: crag read none."""
    env = git_env(str(tmp_path))
    run = {"env": env, "check": True, "capture_output": True}
    main = tmp_path / "main"
    build(main, [], ["README.md"], {})
    subprocess.run(["git", "init", "-q", str(main)], **run)
    subprocess.run(["git", "-C", str(main), "add", "README.md"], **run)
    subprocess.run(["git", "-C", str(main), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], **run)
    if kind == "worktree":
        tree = tmp_path / "linked"
        subprocess.run(["git", "-C", str(main), "worktree", "add", "-q", str(tree)], **run)
        exclude = main / ".git" / "info" / "exclude"
    else:
        tree = tmp_path / "super" / "sub"
        subprocess.run(["git", "init", "-q", str(tmp_path / "super")], **run)
        subprocess.run(["git", "-C", str(tmp_path / "super"), "-c", "protocol.file.allow=always", "submodule", "add",
                        "-q", str(main), "sub"], **run)
        exclude = tmp_path / "super" / ".git" / "modules" / "sub" / "info" / "exclude"
    assert (tree / ".git").is_file()
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.write_text("secret.md\n", encoding="utf-8")
    build(tree, ["notes"], ["notes/secret.md", "notes/plan.md"], {})
    assert git_untracked(tree, tree) == {"notes/plan.md"}
    assert crag_indexed(tree) == {"README.md", "notes/plan.md"}  # README.md is tracked: crag indexes it


_FILES = ["a.md", "x/a.md", "x/y/a.md", "docs.md", "docsa/x.md", "docs/x.md", "docsx.md", "docsa/b/x.md",
          "d/docs/x.md", "d/docsq/r/x.md"]


@pytest.mark.parametrize("pattern", ["**\\/a.md", "/**\\/a.md", "x/**\\/a.md", "***\\/a.md", "docs**\\/x.md",
                                     "d/docs**\\/x.md", "a*b**\\/a.md", "**/a.md", "x/**/a.md", "docs**/x.md"])
def test_an_escaped_slash_after_a_double_star_is_matched_as_git_matches_it(pattern: str, tmp_path: Path) -> None:
    """A ``**`` followed by ``\\/`` (an escaped slash) spans folders in git but, unlike ``**/``,
    never matches nothing: ``**\\/a.md`` leaves the top folder's ``a.md`` untracked, and
    ``docs**\\/x.md`` leaves ``docsx.md``. crag read ``\\/`` there as ``/`` and left them out
    of the index (found by the property test above: ``!a.md``, ``!a.md``, ``**\\/a.md``)."""
    folders = sorted({str(Path(f).parent) for f in _FILES if "/" in f} | {"d/docsq", "x/y", "docsa/b"})
    top = tmp_path / "kb"
    build(top, folders, _FILES, {"": [pattern]})
    assert crag_indexed(top) == git_untracked(top, top)


@pytest.mark.parametrize("configured", [True, False])
def test_the_users_global_excludes_file_is_read_as_git_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                configured: bool) -> None:
    """git leaves out what the user's ``core.excludesFile`` names (``~/.config/git/ignore``
    unless the configuration names another), below the repository's own ignore files; crag
    indexed it all."""
    top = tmp_path / "kb"
    build(top, ["", "sub"], ["a.md", "secret-b.md", "sub/secret-c.md", "sub/d.md", "e.log"], {"sub": ["!secret-c.md"]})
    config, home = tmp_path / "gitconfig", tmp_path / "home"
    (home / "git").mkdir(parents=True)
    if configured:
        (tmp_path / "global ignore").write_text("secret-*\n", encoding="utf-8")
        config.write_text('[user]\n\tname = t\n[core]\n\texcludesFile = "' + str(tmp_path / "global ignore")
                          + '"  ; the user\'s\n', encoding="utf-8")
    else:
        config.write_text("", encoding="utf-8")
        (home / "git" / "ignore").write_text("secret-*\n", encoding="utf-8")  # git's default place
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": str(config)}
    subprocess.run(["git", "init", "-q", str(top)], check=True, env=env)
    out = subprocess.run(["git", "-C", str(top), "ls-files", "--others", "--exclude-standard", "-z"],
                         check=True, capture_output=True, env=env).stdout
    by_git = {os.fsdecode(p) for p in out.split(b"\0") if p and not os.path.basename(os.fsdecode(p)).startswith(".")}
    for name in ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL"):
        monkeypatch.setenv(name, env[name])
    assert by_git == {"a.md", "sub/secret-c.md", "sub/d.md", "e.log"}
    assert crag_indexed(top) == by_git
    shutil.rmtree(top / ".git")  # outside a git work tree the user's git settings do not apply
    assert crag_indexed(top) == by_git | {"secret-b.md"}


def test_a_repository_inside_the_root_has_its_own_ignore_rules_as_git_reads_them(tmp_path: Path) -> None:
    """The outer repository's ``.gitignore`` ("a.md", "d/") left out ``inner/d/c.md``, which
    git does not ignore in the inner repository, and the inner one's ``.git/info/exclude``
    was not read: the same folder was indexed one way as part of ``kb`` and another as a root."""
    env = git_env(str(tmp_path))
    kb = tmp_path / "kb"
    for name in ("a.md", "inner/a.md", "inner/b.md", "inner/d/c.md", "inner/e.md"):
        (kb / name).parent.mkdir(parents=True, exist_ok=True)
        (kb / name).write_text("# Note\n\nSome text.\n", encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(kb)], check=True, env=env)
    subprocess.run(["git", "init", "-q", str(kb / "inner")], check=True, env=env)
    (kb / ".gitignore").write_text("a.md\nd/\ne.md\n", encoding="utf-8")
    (kb / "inner" / ".gitignore").write_text("!a.md\n", encoding="utf-8")
    (kb / "inner" / ".git" / "info" / "exclude").write_text("b.md\n", encoding="utf-8")
    inner = git_untracked(kb / "inner", kb / "inner")
    assert inner == {"a.md", "d/c.md", "e.md"}  # what git says of the inner repository
    assert crag_indexed(kb / "inner") == inner
    assert crag_indexed(kb) == {f"inner/{name}" for name in inner}


def test_cragignore_and_ignore_outrank_a_deeper_gitignore_as_ripgrep_ranks_them(tmp_path: Path) -> None:
    """A ``.gitignore`` negation deeper down took back what the user left out in a shallower
    ``.cragignore``; ripgrep ranks its own ignore files above every ``.gitignore``, whatever
    their depth, and reads ``.ignore`` files too."""
    kb = tmp_path / "kb"
    for name in ("sub/x.md", "sub/y.md", "z.md", "w.md"):
        (kb / name).parent.mkdir(parents=True, exist_ok=True)
        (kb / name).write_text("# Note\n\nSome text.\n", encoding="utf-8")
    (kb / ".cragignore").write_text("x.md\n", encoding="utf-8")
    (kb / ".ignore").write_text("y.md\nw.md\n", encoding="utf-8")
    (kb / "sub" / ".gitignore").write_text("!x.md\n!y.md\n", encoding="utf-8")
    (kb / ".gitignore").write_text("z.md\n", encoding="utf-8")
    assert crag_indexed(kb) == set()
    (kb / "sub" / ".ignore").write_text("!y.md\n", encoding="utf-8")  # a deeper file of the same kind decides
    (kb / ".cragignore").write_text("x.md\n!w.md\n", encoding="utf-8")  # and .cragignore outranks .ignore
    assert crag_indexed(kb) == {"sub/y.md", "w.md"}


@pytest.mark.parametrize("kind", ["empty folder", "file naming a folder that is gone", "repository"])
def test_a_git_that_is_no_repository_does_not_stop_the_ignore_files_above(tmp_path: Path, kind: str) -> None:
    """A folder holding an empty ``.git`` folder, or a ``.git`` file whose ``gitdir:`` is gone (a
    submodule copied out of its project), is no repository to git, which leaves out there what
    the ``.gitignore`` above says; crag took any ``.git`` for a repository of its own and indexed
    ``sub/secret.md``. A real repository inside keeps its own rules."""
    kb = tmp_path / "kb"
    build(kb, ["sub"], ["ok.md", "secret.md", "sub/ok.md", "sub/secret.md"], {"": ["secret.md"]})
    if kind == "empty folder":
        (kb / "sub" / ".git").mkdir()
    elif kind == "repository":
        subprocess.run(["git", "init", "-q", str(kb / "sub")], check=True, env=git_env(str(tmp_path)))
    else:
        (kb / "sub" / ".git").write_text("gitdir: ../../super/.git/modules/sub\n", encoding="utf-8")
    outer = git_untracked(kb, kb)
    assert outer == ({"ok.md", "sub/"} if kind == "repository" else {"ok.md", "sub/ok.md"})  # git does not enter a repository
    inner = {"sub/ok.md", "sub/secret.md"} if kind == "repository" else {"sub/ok.md"}
    assert crag_indexed(kb) == {"ok.md"} | inner
    assert crag_indexed(kb / "sub") == {name.removeprefix("sub/") for name in inner}


def test_an_excludes_file_set_empty_reads_none_as_git_reads_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``core.excludesFile`` set empty in the repository's configuration turns off the user's
    excludes file for that repository, the default one as well, in git; crag took an empty
    value for an unset one and went on leaving out what the global one names."""
    top, home = tmp_path / "kb", tmp_path / "home"
    build(top, [], ["a.md", "global-secret.md", "default-secret.md"], {})
    (home / "git").mkdir(parents=True)
    (home / "git" / "ignore").write_text("default-*\n", encoding="utf-8")
    (tmp_path / "global ignore").write_text("global-*\n", encoding="utf-8")
    config = tmp_path / "gitconfig"
    config.write_text(f'[core]\n\texcludesFile = "{tmp_path / "global ignore"}"\n', encoding="utf-8")
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": str(config)}
    for name in ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL"):
        monkeypatch.setenv(name, env[name])
    subprocess.run(["git", "init", "-q", str(top)], check=True, env=env)
    assert crag_indexed(top) == {"a.md", "default-secret.md"}
    subprocess.run(["git", "-C", str(top), "config", "core.excludesFile", ""], check=True, env=env)
    out = subprocess.run(["git", "-C", str(top), "ls-files", "--others", "--exclude-standard", "-z"],
                         check=True, capture_output=True, env=env).stdout
    by_git = {os.fsdecode(p) for p in out.split(b"\0") if p}
    assert by_git == {"a.md", "global-secret.md", "default-secret.md"}
    assert crag_indexed(top) == by_git
