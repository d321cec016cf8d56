"""Ignore files as git reads them (``crag.index.ignore``, ``crag.index.globs``): the same
verdicts as ``git check-ignore``, a bad line skipped and named once, an ignore file never
dropped for its size or its byte-order mark, an unreadable one said, and matching that no
pattern or file name can make slow."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crag.cli import main
from tests.fakes import clean_env

ROOT = Path(__file__).resolve().parent.parent


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ok.md").write_text("# Deploy\n\nThe deploy runs nightly.\n", encoding="utf-8")
    (tmp_path / "docs" / "secret.md").write_text("# Vault\n\nThe vault code is zebra-plum-42.\n", encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def indexed(out: str) -> set[str]:
    """The files an index report says were added."""
    lines = out.splitlines()
    start = lines.index("added:") + 1 if "added:" in lines else len(lines)
    return {line.strip() for line in lines[start:] if line.startswith("  ")}


# ---------------------------------------------------------------------------------------
# The same verdicts as git


def git_verdicts(tmp: Path, patterns: list[str], paths: list[str]) -> dict[str, bool]:
    """Whether git ignores each path (a trailing ``/`` marks a folder) under these patterns."""
    repo = tmp / f"repo{len(list(tmp.iterdir()))}"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("\n".join(patterns) + "\n", encoding="utf-8")
    run = subprocess.run(["git", "-C", str(repo), "check-ignore", "--no-index", "-v", "-n", "-z", "--stdin"],
                         input="\0".join(paths) + "\0", capture_output=True, text=True, check=False)
    fields = run.stdout.split("\0")
    verdicts = {}
    for i in range(0, len(fields) - 3, 4):
        source, _, pattern, path = fields[i:i + 4]
        verdicts[path] = bool(source) and not pattern.startswith("!")
    return verdicts


def crag_verdict(patterns: list[str], path: str) -> bool:
    """Whether crag ignores ``path``: a folder on the way that is ignored is not entered."""
    from crag.index.globs import RuleSet, parse_rules

    rules = RuleSet(parse_rules(patterns)[0])
    parts = path.rstrip("/").split("/")
    if any(rules.decide("/".join(parts[:i]), True) for i in range(1, len(parts))):
        return True
    return bool(rules.decide(path.rstrip("/"), path.endswith("/")))


CASES = [
    (["*.log", "!keep.log"], ["a.log", "keep.log", "x/keep.log", "x/b.log"]),
    (["/build", "doc/*.txt", "doc/**/*.pdf", "**/foo", "a/**/b", "x/**"],
     ["build", "y/build", "doc/a.txt", "doc/s/a.txt", "doc/a.pdf", "doc/s/t/a.pdf", "foo", "q/r/foo",
      "a/b", "a/c/d/b", "x", "x/y", "x/y/z"]),
    (["dist/", "ab\\ ", "cd  ", "\\#x", "\\!y", "[a-c]z", "[!a]q", "[]]r", "[[:digit:]]d", "*a*a*c", "a?c", "**b",
      "x**y"],
     ["dist/", "dist", "ab ", "ab", "cd", "#x", "!y", "bz", "dz", "aq", "bq", "]r", "5d", "aaaac", "abc", "bb",
      "b", "xzzy"]),
    (["[z-a]", "[z-ab]x", "foo\\", "[abc", "[[:foo:]]", "!", "[a-]m", "[-a]n", "[\\]]o", "[a-c-e]p"],
     ["z", "a", "bx", "ax", "foo", "foo\\", "[abc", "-m", "am", "-n", "]o", "dp", "-p", "ep", "bp"]),
]


def random_case(rng: random.Random) -> tuple[list[str], list[str]]:
    atoms = ["a", "b", "*", "?", "/", "[a-b]", "[!a]", "**", "\\*", "[ab]", "!", "c"]
    patterns = []
    while len(patterns) < rng.randint(1, 4):
        pattern = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 6)))
        # A line that is only "!" is ignored by git's status but reported by check-ignore.
        if pattern.strip("!"):
            patterns.append(pattern)
    paths = sorted({"/".join("".join(rng.choice("abc*") for _ in range(rng.randint(1, 4)))
                             for _ in range(rng.randint(1, 4))) + rng.choice(["", "/"]) for _ in range(25)})
    return patterns, paths


@pytest.mark.skipif(shutil.which("git") is None, reason="compares with git")
def test_ignore_rules_give_gits_verdicts(tmp_path: Path) -> None:
    rng = random.Random(37)
    cases = CASES + [random_case(rng) for _ in range(60)]
    for patterns, paths in cases:
        git = git_verdicts(tmp_path, patterns, paths)
        for path in paths:
            assert crag_verdict(patterns, path) == git[path], (patterns, path)


def test_a_repositorys_info_exclude_is_read_as_git_and_ripgrep_read_it(project: Path) -> None:
    """``.git/info/exclude`` holds a repository's own ignore patterns, relative to its top; its
    lines come before every ``.gitignore``'s, so a ``.gitignore`` can take a path back in."""
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".git" / "info").mkdir(exist_ok=True)
    (project / ".git" / "info" / "exclude").write_text("secret.md\n/docs/drafts/\nkept.md\n", encoding="utf-8")
    (project / "docs" / "drafts").mkdir()
    (project / "docs" / "drafts" / "plan.md").write_text("# Plan\n", encoding="utf-8")
    (project / "docs" / "kept.md").write_text("# Kept\n", encoding="utf-8")
    (project / "docs" / ".gitignore").write_text("!kept.md\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert code == 0 and indexed(out) == {"docs/ok.md", "docs/kept.md"}, (out, err)
    verdicts = subprocess.run(["git", "-C", str(project), "check-ignore", "docs/secret.md", "docs/drafts/plan.md",
                               "docs/kept.md"], capture_output=True, text=True).stdout.split()
    assert verdicts == ["docs/secret.md", "docs/drafts/plan.md"]


# ---------------------------------------------------------------------------------------
# Ignore files above a root


def _discovered(root: Path) -> set[str]:
    from crag.index.discover import discover

    return {Path(f.path).relative_to(root).as_posix() for f in discover([root]).files}


def test_cragignore_and_ignore_above_a_root_are_read_outside_a_git_work_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ripgrep reads ``.rgignore`` and ``.ignore`` in every parent folder of what it searches,
    git repository or not; crag read those above a root only inside a git work tree, so
    ``crag index proj/docs`` indexed the ``docs/secret.md`` that ``proj/.cragignore`` names.
    Their patterns are relative to their own folder and rank as below the root; a
    ``.gitignore`` above a root still counts only in a git work tree. Each is read once."""
    from crag.index import ignore

    docs = tmp_path / "proj" / "docs"
    docs.mkdir(parents=True)
    for name in ("ok.md", "secret.md", "draft.md", "kept.md", "log.md"):
        (docs / name).write_text("# Note\n\nSome text.\n", encoding="utf-8")
    (tmp_path / ".ignore").write_text("log.md\n", encoding="utf-8")  # two folders up
    (tmp_path / "proj" / ".cragignore").write_text("docs/secret.md\n/ok.md\n!draft.md\n", encoding="utf-8")
    (tmp_path / "proj" / ".gitignore").write_text("kept.md\n", encoding="utf-8")  # no git work tree: not read
    (docs / ".ignore").write_text("draft.md\n", encoding="utf-8")  # a .cragignore above outranks it
    read: list[str] = []
    real = ignore._parsed
    monkeypatch.setattr(ignore, "_parsed", lambda path: read.append(path) or real(path))
    assert _discovered(docs) == {"ok.md", "draft.md", "kept.md"}  # "/ok.md" is proj/ok.md
    assert read.count(str(tmp_path / "proj" / ".cragignore")) == 1 and str(tmp_path / "proj" / ".gitignore") not in read
    (docs / ".cragignore").write_text("!secret.md\n", encoding="utf-8")  # the deepest of a kind decides
    assert _discovered(docs) == {"ok.md", "draft.md", "kept.md", "secret.md"}
    assert ignore.Ignores("/")._above_top() == [] and ignore.Ignores("/").ignored(str(docs / "log.md"), False)


@pytest.mark.skipif(shutil.which("git") is None, reason="makes a git repository")
def test_cragignore_above_the_top_of_a_git_work_tree_is_read_and_its_gitignore_is_not(tmp_path: Path) -> None:
    """The folders above a repository's top were not read at all: its ``.cragignore`` and
    ``.ignore`` count there (as ripgrep's ``.rgignore`` and ``.ignore``), its ``.gitignore``
    does not (git does not read it either)."""
    docs = tmp_path / "repo" / "docs"
    docs.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    for name in ("ok.md", "secret.md", "plan.md"):
        (docs / name).write_text("# Note\n\nSome text.\n", encoding="utf-8")
    (tmp_path / ".cragignore").write_text("repo/docs/secret.md\n", encoding="utf-8")
    (tmp_path / ".ignore").write_text("plan.md\n", encoding="utf-8")
    (tmp_path / ".gitignore").write_text("ok.md\n", encoding="utf-8")
    assert _discovered(docs) == {"ok.md"}
    assert _discovered(tmp_path / "repo") == {"docs/ok.md"}


def test_a_cragignore_added_above_a_root_drops_its_file_and_removed_brings_it_back(project: Path) -> None:
    code, out, _ = cli("index", "docs")
    assert code == 0 and indexed(out) == {"docs/ok.md", "docs/secret.md"}
    (project / ".cragignore").write_text("docs/secret.md\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert code == 0 and "removed:\n  docs/secret.md" in out and err == "", (out, err)
    code, out, _ = cli("search", "vault code zebra")
    assert code == 0 and "zebra-plum" not in out
    (project / ".cragignore").unlink()
    code, out, _ = cli("index", "docs")
    assert code == 0 and indexed(out) == {"docs/secret.md"}


def test_an_unreadable_ignore_file_above_a_root_is_said(project: Path) -> None:
    os.symlink(".cragignore", project / ".cragignore")  # a loop: it cannot be opened, even by root
    code, out, err = cli("index", "docs")
    assert code == 0 and "docs/secret.md" in indexed(out)
    assert err.splitlines() == [
        "crag: warning: .cragignore cannot be read (Too many levels of symbolic links), so the paths it "
        "leaves out are not left out (they may hold secrets): make it readable, or remove it"
    ]


# ---------------------------------------------------------------------------------------
# Bad lines, odd files


def test_a_bad_ignore_line_is_skipped_and_named_once(project: Path) -> None:
    (project / "docs" / ".gitignore").write_text("!\n[z-a]\nsecret.md\nfoo\\\n[abc\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert code == 0 and indexed(out) == {"docs/ok.md"}, err
    warnings = err.splitlines()
    assert warnings == [
        'crag: warning: docs/.gitignore line 1 "!" is skipped: a "!" alone negates no pattern',
        'crag: warning: docs/.gitignore line 2 "[z-a]": the range z-a is empty, so it matches nothing',
        'crag: warning: docs/.gitignore line 4 "foo\\" is skipped: it ends in an escaping backslash '
        '(write \\\\ for a backslash)',
        'crag: warning: docs/.gitignore line 5 "[abc" is skipped: the "[" at 1 is not closed (write \\[ for a bracket)',
    ]
    # ask and search through the same folder: the answer comes, each line is named once.
    code, out, err = cli("ask", "--json", "--kb", "docs", "What is the vault code?")
    assert code == 0 and "zebra-plum" not in out and json.loads(out)["question"] == "What is the vault code?"
    assert err.count("line 1") == 1 and "Traceback" not in err
    code, out, err = cli("search", "--kb", "docs", "vault code")
    assert code == 0 and "zebra-plum" not in out and err.count("line 4") == 1


def test_an_ignore_file_of_many_bad_lines_names_ten_and_counts_the_rest(project: Path) -> None:
    """A file that is no ignore file at all (a Windows path a line, each ending in ``\\``) does
    not fill the screen with one warning a line on every run."""
    (project / "docs" / ".gitignore").write_text("[z-a]\n" + "C:\\docs\\\n" * 20_000 + "secret.md\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert code == 0 and indexed(out) == {"docs/ok.md"}, err
    lines = err.splitlines()
    assert len(lines) == 11 and lines[0].startswith('crag: warning: docs/.gitignore line 1 "[z-a]"'), lines[:3]
    assert lines[9].startswith('crag: warning: docs/.gitignore line 10 "C:\\docs\\" is skipped'), lines[9]
    assert lines[10] == ("crag: warning: docs/.gitignore has 19991 more lines with such problems (lines 11 to 20001, "
                         "19991 of them skipped); they are not named one by one")


def test_an_exclude_that_cannot_match_is_a_usage_error(project: Path) -> None:
    for pattern in ("!", "[abc", "foo\\", ""):
        code, out, err = cli("index", "docs", "--exclude", pattern)
        assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith("crag: error: --exclude"), err
    assert not (project / ".crag").exists()


def test_an_exclude_that_is_a_comment_is_told_the_pattern_to_write(project: Path) -> None:
    """``--exclude '#draft.md'`` is a comment to git, as in an ignore file; the error said only
    "empty, or a # comment", not how to name a file whose name starts with ``#``."""
    (project / "docs" / "#draft.md").write_text("# Draft\n\nNot ready.\n", encoding="utf-8")
    code, out, err = cli("index", "docs", "--exclude", "#draft.md")
    assert code == 2 and out == "" and err == ('crag: error: --exclude "#draft.md" is a # comment, not a pattern; '
                                               'for a name starting with #, write --exclude "\\#draft.md"\n'), err
    code, out, err = cli("index", "docs", "--exclude", "\\#draft.md")
    assert code == 0 and indexed(out) == {"docs/ok.md", "docs/secret.md"}, (out, err)


def test_a_dot_folder_in_a_pattern_is_named_as_a_line_git_never_matches(project: Path) -> None:
    """git compares ``./secret.md`` with paths, which never hold a ``.`` or ``..`` folder: in
    ``--exclude`` it would leave in the file it means, so it is a usage error; in an ignore
    file it is a skipped line, named."""
    for pattern in ("./secret.md", "../docs/secret.md", "drafts/./x.md", "."):
        code, out, err = cli("index", "docs", "--exclude", pattern)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f'crag: error: --exclude "{pattern}" is not a pattern crag can use: it holds a "." '
                              'or ".." folder name'), err
    assert not (project / ".crag").exists()
    code, out, err = cli("index", "docs", "--exclude", "./docs/secret.md")  # from the working folder: as a path is
    assert code == 2 and '--exclude "secret.md"' in err, err
    (project / "docs" / ".gitignore").write_text("./secret.md\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert code == 0 and indexed(out) == {"docs/ok.md", "docs/secret.md"}, err
    assert err.startswith('crag: warning: docs/.gitignore line 1 "./secret.md" is skipped: it holds a "." or ".." '
                          'folder name'), err


def test_a_dot_folder_line_is_told_the_pattern_to_write(project: Path) -> None:
    """The error for ``./*.md`` said to write "drafts", not "./drafts", whatever was written: it
    names the line without its ``./`` now, anchored to its folder as ``./`` meant; an example
    only when no one pattern says what was meant (``../docs``)."""
    for pattern, meant in (("./*.md", "/*.md"), ("./drafts/", "/drafts/"), ("!./secret.md", "!/secret.md"),
                           ("./**/x.md", "**/x.md"), ("../docs", 'drafts", not "./drafts')):
        code, _, err = cli("index", "docs", "--exclude", "secret.md", "--exclude", pattern)
        assert code == 2 and err.rstrip().endswith(f'(patterns are relative to their folder: write "{meant}")'), err
    (project / "docs" / ".gitignore").write_text("./secret.md\n", encoding="utf-8")
    code, _, err = cli("index", "docs")
    assert code == 0 and 'write "/secret.md")' in err, err


def test_a_negated_exclude_with_nothing_to_take_back_is_a_usage_error(project: Path) -> None:
    """``--exclude '!secret.md'`` (ripgrep's ``--glob`` way of leaving a file out) left
    everything in; after a pattern it takes back from, it keeps its git meaning."""
    (project / "docs" / ".gitignore").write_text("ok.md\n", encoding="utf-8")
    for argv in (["--exclude", "!secret.md"], ["--exclude", "!ok.md", "--exclude", "secret.md"]):
        code, out, err = cli("index", "docs", *argv)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f'crag: error: --exclude "{argv[1]}" leaves nothing out') and \
            f'write --exclude "{argv[1][1:]}"' in err, err
    assert not (project / ".crag").exists()
    code, out, err = cli("index", "docs", "--exclude", "*.md", "--exclude", "!secret.md")
    assert code == 0 and indexed(out) == {"docs/secret.md"}, err


def test_an_exclude_written_from_the_working_folder_is_a_usage_error_naming_the_pattern_to_write(project: Path) -> None:
    """``--exclude`` patterns are relative to the root: ``docs/secret.md`` for the root docs names
    docs/docs/secret.md, which is not there, and would leave the file it means in the index."""
    for pattern in ("docs/secret.md", str(project / "docs" / "secret.md")):
        code, out, err = cli("index", "docs", "--exclude", pattern)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f'crag: error: --exclude "{pattern}"') and '--exclude "secret.md"' in err, err
    assert not (project / ".crag").exists()
    code, out, _ = cli("index", "docs", "--exclude", "secret.md")  # as the error says
    assert code == 0 and indexed(out) == {"docs/ok.md"}
    code, out, _ = cli("index", ".", "--index", "whole", "--exclude", "docs/secret.md")  # the root is the working folder
    assert code == 0 and indexed(out) == {"docs/ok.md"}
    (project / "notes" / "docs").mkdir(parents=True)
    (project / "notes" / "docs" / "secret.md").write_text("# Notes\n", encoding="utf-8")
    code, out, _ = cli("index", "docs", "notes", "--index", "two", "--exclude", "docs/secret.md")  # it names one in notes
    assert code == 0 and indexed(out) == {"docs/ok.md", "docs/secret.md"}


@pytest.mark.parametrize("pattern, written, left_out", [
    ("docs/drafts/*.md", "drafts/*.md", "docs/drafts/plan.md"),
    ("docs/drafts/**", "drafts/**", "docs/drafts/plan.md"),
    ("docs/*.md", "/*.md", "docs/ok.md"),  # the root's own files
    ("{project}/docs/drafts/*", "drafts/*", "docs/drafts/plan.md"),
])
def test_a_glob_written_from_the_working_folder_is_a_usage_error_naming_the_pattern_to_write(project: Path, pattern: str,
                                                                                            written: str, left_out: str) -> None:
    """The folders a glob writes before its first wildcard are read as a path's are:
    ``docs/drafts/*.md`` for the root docs names docs/docs/drafts, which is not there, and
    indexed the drafts it meant to leave out."""
    (project / "docs" / "drafts").mkdir()
    (project / "docs" / "drafts" / "plan.md").write_text("# Plan\n", encoding="utf-8")
    pattern = pattern.format(project=project)
    code, out, err = cli("index", "docs", "--exclude", pattern)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f'crag: error: --exclude "{pattern}"') and f'--exclude "{written}"' in err, err
    assert not (project / ".crag").exists()
    code, out, _ = cli("index", "docs", "--exclude", written)  # as the error says
    assert code == 0 and left_out not in indexed(out) and indexed(out)
    code, out, _ = cli("index", "docs", "--index", "other", "--exclude", "**/drafts/*.md")  # no folder written
    assert code == 0 and "docs/drafts/plan.md" not in indexed(out)


@pytest.mark.parametrize("content", [
    b"\xef\xbb\xbfsecret.md\n",  # a byte-order mark, which git drops
    b"# padding\n" * 120_000 + b"secret.md\n",  # over 1 MiB
    b"secret.md\r\n",  # Windows line endings
])
def test_an_ignore_file_is_never_dropped_for_its_size_or_bom(project: Path, content: bytes) -> None:
    (project / "docs" / ".gitignore").write_bytes(content)
    code, out, err = cli("index", "docs")
    assert code == 0 and indexed(out) == {"docs/ok.md"} and err == ""
    code, out, _ = cli("search", "vault code zebra")
    assert "zebra-plum" not in out


def test_an_unreadable_ignore_file_is_said(project: Path) -> None:
    os.symlink(".gitignore", project / "docs" / ".gitignore")  # a loop: it cannot be opened, even by root
    code, out, err = cli("index", "docs")
    assert code == 0 and "docs/secret.md" in indexed(out)  # indexed, as it would be by git, and said:
    assert err.splitlines() == [
        "crag: warning: docs/.gitignore cannot be read (Too many levels of symbolic links), so the paths it "
        "leaves out are not left out (they may hold secrets): make it readable, or remove it"
    ]


def test_a_folder_too_deep_to_open_names_no_ignore_file_it_does_not_hold(project: Path) -> None:
    """In a folder whose path is near the system's limit, ``folder/.gitignore`` is too long a
    name to open: crag warned that a .gitignore and a .cragignore "cannot be read" although the
    folder held neither. The folder below, too long to list, is the one line to say."""
    limit = os.pathconf("/", "PC_PATH_MAX")  # bytes of a path, with its closing NUL
    folder = project / "docs"
    while len(os.fsencode(folder)) < limit - 250:
        folder = folder / ("x" * 100)
        folder.mkdir()
    deepest = folder / ("x" * (limit - 4 - len(os.fsencode(folder))))  # listed; its .gitignore cannot be opened
    deepest.mkdir()
    fd = os.open(deepest, os.O_RDONLY)
    try:
        os.mkdir("yy", dir_fd=fd)  # a path of `limit` bytes: it cannot be listed
    finally:
        os.close(fd)
    code, out, err = cli("index", "docs")
    assert code == 0 and "added:\n  docs/ok.md\n  docs/secret.md\nskipped 1 file(s):\n" in out
    assert err == ""
    assert out.splitlines()[-1].endswith("/yy: cannot list folder (File name too long)")


def test_an_ignore_file_in_a_folder_that_cannot_be_entered_is_said_only_when_there(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder that can be listed but not entered (no x permission): nothing in it can be
    opened, its ignore files included. A warning named ignore files the folder did not hold."""
    locked = project / "docs" / "locked"
    locked.mkdir()
    (locked / "notes.md").write_text("# Notes\n", encoding="utf-8")
    real_stat = os.stat

    def stat(path, *args, **kwargs):  # what a user without the x permission gets
        if os.path.dirname(os.fspath(path)) == str(locked):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    code, _, err = cli("index", "docs")
    assert code == 0 and err == ""
    (locked / ".cragignore").write_text("notes.md\n", encoding="utf-8")
    code, _, err = cli("index", "docs")
    assert code == 0 and err.splitlines() == [
        "crag: warning: docs/locked/.cragignore cannot be read (Permission denied), so the paths it leaves out "
        "are not left out (they may hold secrets): make it readable, or remove it"
    ]


def test_a_folder_replaced_by_a_file_names_no_ignore_file(project: Path) -> None:
    """A folder of indexed files replaced by a file of that name holds no ignore file: a
    search that checked a hit there warned that its .cragignore, .ignore and .gitignore
    "cannot be read (Not a directory)", their exclusions missing and secrets at risk."""
    (project / "docs" / "runbooks").mkdir()
    (project / "docs" / "runbooks" / "restart.md").write_text("# Restart\n\nRestart the kafka broker.\n",
                                                              encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    shutil.rmtree(project / "docs" / "runbooks")
    (project / "docs" / "runbooks").write_text("now a file\n", encoding="utf-8")
    code, out, err = cli("search", "--json", "restart kafka broker")
    assert code == 0 and err == ""
    assert json.loads(out)[0]["path"] == "docs/runbooks/restart.md"  # cited as the index holds it (docs/cli.md)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_ignore_file_that_is_not_a_file_is_said(project: Path, kind: str) -> None:
    """An ignore file that cannot be read is a warning (docs/cli.md): its exclusions are missing.
    A ``.gitignore`` that is a FIFO or a link to ``/dev/zero`` was passed over in silence."""
    ignore = project / "docs" / ".gitignore"
    if kind == "fifo":
        os.mkfifo(ignore)
    else:
        os.symlink("/dev/zero", ignore)
    code, out, err = cli("index", "docs")
    assert code == 0 and "docs/secret.md" in indexed(out)
    assert err.splitlines() == [
        "crag: warning: docs/.gitignore cannot be read (it is not a regular file), so the paths it leaves out "
        "are not left out (they may hold secrets): make it a file, or remove it"
    ]


# ---------------------------------------------------------------------------------------
# Bounded work


def test_no_pattern_makes_matching_exponential(tmp_path: Path) -> None:
    """``*a*a*a*a*a*a*a*a*a*a*c`` against a name of a's took seconds a match with a
    backtracking regex (and doubled with every letter); here it is a few steps. The
    timeout only catches that blow-up."""
    script = (
        "from crag.index.ignore import Ignores\n"
        "import os, sys\n"
        "root = sys.argv[1]\n"
        "ig = Ignores(root, ['*a*a*a*a*a*a*a*a*a*a*c', 'x/**/**/**/**/**/**/**/**/**/y'])\n"
        "for n in range(30, 200):\n"
        "    assert not ig.ignored(os.path.join(root, 'a' * n), False)\n"
        "    assert not ig.ignored(os.path.join(root, 'x/' + 'q/' * n + 'z'), False)\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=False)
    assert run.stdout.strip() == "ok", run.stderr


def test_a_line_of_unclosed_brackets_is_skipped_in_one_pass(tmp_path: Path) -> None:
    """Every ``[`` of a line is a class that runs to its ``]``; a line of a hundred thousand
    unclosed ``[`` (across slashes) must not be scanned to its end once per bracket. The
    timeout only catches that blow-up."""
    script = (
        "import warnings\n"
        "from crag.index.globs import parse_rules\n"
        "rules, problems = parse_rules(['a/' + '[' * 100_000 + '/b', '[x/' * 50_000])\n"
        "print(len(rules), [p.skipped for p in problems])\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=False)
    assert run.stdout.strip() == "0 [True, True]", run.stderr


def test_a_line_of_many_globstars_after_plain_text_is_read_without_recursion() -> None:
    """``d**/**/**/.../x`` (git's folder-spanning ``**`` after plain text) recursed once per
    ``**``: a long line was a traceback (RecursionError) out of ``crag index``."""
    from crag.index.globs import RuleSet, parse_rules

    rules, problems = parse_rules(["d**/" + "**/" * 5000 + "x.md"])
    assert problems == [] and rules
    assert RuleSet(rules).decide("da/b/c/x.md", False) and RuleSet(rules).decide("dx.md", False)
    assert not RuleSet(rules).decide("e/x.md", False)


def test_a_large_ignore_file_is_looked_up_not_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    from crag.index import globs

    lines = [f"build-{i}.md" for i in range(25_000)] + [f"*.ext{i}" for i in range(25_000)]
    lines += [f"tmp{i}-*" for i in range(25_000)] + [f"/out/{i}/report.md" for i in range(25_000)]
    lines += ["!keep*.md", "*.md~"]  # the first is matched one by one
    rules = globs.RuleSet(globs.parse_rules(lines)[0])
    tried = []
    real = globs.Glob.matches
    monkeypatch.setattr(globs.Glob, "matches", lambda self, text: tried.append(text) or real(self, text))
    paths = [f"docs/page-{i}.md" for i in range(200)]
    assert [rules.decide(p, False) for p in paths] == [None] * 200
    assert rules.decide("a/build-7.md", False) and rules.decide("x.ext99", False)
    assert rules.decide("tmp5-a.md", False) and rules.decide("out/3/report.md", False)
    assert rules.decide("keep-build-7.md", False) is False  # the last match takes it back
    assert rules.decide("build-7.md~", False)
    assert len(tried) <= 206  # at most one line tried one by one per path


def test_a_pattern_or_name_with_a_lone_surrogate_is_matched_not_raised() -> None:
    """Patterns match bytes (as git's do); a lone surrogate in a library caller's pattern or
    path has no UTF-8 bytes, and was a UnicodeEncodeError out of the matcher."""
    from crag.index.globs import RuleSet, parse_rules

    rules = RuleSet(parse_rules(["\ud800*", "a\udcff"])[0])
    assert rules.decide("\ud800x.md", False) and rules.decide("a\udcff", False)
    assert rules.decide("b.md", False) is None
