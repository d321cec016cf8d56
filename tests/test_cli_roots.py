"""``crag roots``, roots gone from disk, scores in rank order, the lock, the re-index advice.

The real CLI over a real index (hash embedder, FAISS, SQLite) in a temporary folder; the
working directory is that folder, so paths are shown relative to it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from crag.cli import main
from crag.index.fusion import scores_in_rank_order

from .fakes import clean_env

SETUP = "# Setup\n\nThe server listens on port 8080 by default.\nSet SERVICE_PORT to change the port.\n"
NOTES = "# Notes\n\nThe notes server port is 9090.\n\n## Backups\n\nThe port for backups is 7070.\n"


def cli(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err, io.StringIO(stdin) if stdin is not None else None)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    clean_env(monkeypatch)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "setup.md").write_text(SETUP)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.md").write_text(NOTES)
    (tmp_path / "notes" / "more.md").write_text("# More\n\nThe port list is kept here.\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    code, _, err = cli("index", "docs", "notes")
    assert code == 0, err
    return tmp_path


def test_roots_lists_each_root_with_its_file_and_chunk_counts(kb: Path) -> None:
    code, out, err = cli("roots")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("2 roots in index (hash:")
    assert lines[1].split() == ["docs", "1", "file,", "1", "chunk"]
    assert lines[2].split()[:3] == ["notes", "2", "files,"]
    total = int(lines[0].split("(")[1].split(",")[1].split()[0])
    assert total == 1 + int(lines[2].split()[3])


def test_roots_of_an_empty_index_says_how_to_add_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "none"))
    assert cli("roots") == (0, "no roots in none: `python -m crag index PATH` adds one\n", "")


def test_roots_remove_without_an_index_says_so_and_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "no index" and left an empty .crag behind (made for the writer's lock), which
    every later command then took for the project's index folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KB_AGENT_INDEX_DIR", raising=False)
    code, out, err = cli("roots", "--remove", "docs")
    assert (code, out) == (1, "") and err.startswith("crag: error: no index in ")
    assert not (tmp_path / ".crag").exists()


def test_roots_remove_drops_the_root_and_its_chunks(kb: Path) -> None:
    code, out, err = cli("roots", "--remove", "notes")
    assert code == 0, err
    assert out.startswith("removed notes (2 files, ")
    assert "2 files left the index in index; 1 chunk remains" in out
    assert cli("roots")[1].splitlines()[1:] == ["  docs  1 file, 1 chunk"]
    code, out, _ = cli("search", "port", "--json")
    assert {h["path"] for h in json.loads(out)} == {"docs/setup.md"}
    code, _, err = cli("roots", "--remove", "notes")
    assert code == 1 and "is not a root of the index (its roots: " in err and err.count("\n") == 1


def test_removing_a_path_that_is_no_root_names_it_escaped_as_every_path_crag_shows(kb: Path) -> None:
    """docs/safety.md: every path crag shows is escaped by one function. ``roots --remove`` of a
    path that is not a root named it raw, so the terminal filter turned ``x<ESC>[31m<LF>y``
    into "x y" (a name that does not exist) and a byte that is not UTF-8 into U+FFFD."""
    odd = kb / "odd\nroot"
    odd.mkdir()
    (odd / "a.md").write_text("# A\n\nThe odd port is 6060.\n")
    assert cli("index", str(odd))[0] == 0
    for name, shown in (("x\x1b[31m\ny", "x\\x1b[31m\\ny"), (os.fsdecode(b"r\xff"), "r\\xff")):
        code, out, err = cli("roots", "--remove", name)
        assert code == 1 and not out and err.count("\n") == 1, err
        assert f"error: {shown} is not a root of the index" in err and "\ufffd" not in err, err  # relative, as listed
        assert "odd\\nroot" in err, err  # the roots it holds are shown the same way


def test_a_root_is_removed_as_crag_roots_shows_it(kb: Path) -> None:
    """``crag roots`` lists a root named with a tab as ``kb/tab\\there.md``; ``roots --remove``
    of that text was refused with an error listing it among the roots."""
    odd = kb / "odd\troot"
    odd.mkdir()
    (odd / "a.md").write_text("# A\n\nThe odd port is 6060.\n")
    assert cli("index", str(odd))[0] == 0
    code, out, _ = cli("roots")
    assert "odd\\troot" in out
    code, out, err = cli("roots", "--remove", "odd\\troot")
    assert code == 0 and "removed odd\\troot" in out, err
    assert "odd\\troot" not in cli("roots")[1]


def test_a_root_named_twice_is_removed_once(kb: Path) -> None:
    code, out, err = cli("roots", "--remove", "notes", "--remove", "./notes")
    assert code == 0, err
    assert out.count("removed notes") == 1 and "2 files left the index" in out


def test_a_root_deleted_from_disk_is_reported_left_out_of_search_and_dropped_by_the_next_index(kb: Path) -> None:
    code, out, _ = cli("search", "notes", "server", "port", "--json")
    assert any(h["path"].startswith("notes/") for h in json.loads(out))
    shutil.rmtree(kb / "notes")

    code, out, err = cli("roots")
    assert code == 0 and "notes  missing on disk (2 files, " in out and "dropped by the next" in out

    code, out, err = cli("search", "notes", "server", "port", "--json")
    assert code == 0
    assert {h["path"] for h in json.loads(out)} <= {"docs/setup.md"}
    assert err == ("crag: note: notes no longer exists on disk and is left out of the search; the next "
                   "`python -m crag index` drops it (or `python -m crag roots --remove PATH`)\n")

    code, out, err = cli("ask", "what", "is", "the", "notes", "server", "port?", "--json")
    assert code == 0, err
    assert "9090" not in json.loads(out)["answer"]
    assert "crag: note: notes no longer exists on disk and is left out of the search" in err  # as search says it
    code, out, err = cli("ask", "hello", "--json")  # chitchat: no search, no note
    assert code == 0 and "no longer exists" not in err, err
    # chat said nothing of it: once a session, after the first answer that searched
    code, out, err = cli("chat", stdin="hello\nwhat is the notes server port?\nand the notes server host?\n")
    assert code == 0 and "9090" not in out, err
    assert err.count("crag: note: notes no longer exists on disk and is left out of the search") == 1, err

    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert "dropped knowledge-base path(s) that no longer exist: " in out and "notes/notes.md" in out
    assert cli("roots")[1].splitlines()[1:] == ["  docs  1 file, 1 chunk"]
    assert cli("search", "port")[2] == ""


def test_indexing_a_deleted_root_by_name_drops_it_instead_of_failing(kb: Path) -> None:
    shutil.rmtree(kb / "notes")
    code, out, err = cli("index", "notes")
    assert code == 0, err
    assert "dropped knowledge-base path(s) that no longer exist" in out
    code, _, err = cli("index", "never-was")
    assert code == 1 and "never-was does not exist" in err


def test_a_path_with_a_space_at_an_end_is_named_in_quotes_where_it_is_no_root(kb: Path) -> None:
    """A space typed after a path (``--kb "docs "``, a path pasted into an MCP client's
    settings) does not show: crag said "knowledge-base path docs does not exist" while docs
    did, and "notes is not a root of the index (its roots: docs, notes)"."""
    assert cli("index", "docs", "notes")[0] == 0
    for argv in (("index", "docs "), ("search", "port", "--kb", "docs ", "--json"), ("ask", "port", "--kb", " docs")):
        code, out, err = cli(*argv)
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert 'knowledge-base path "docs " does not exist' in err or 'path " docs" does not exist' in err, err
    code, _, err = cli("roots", "--remove", "notes ")
    assert code == 1 and err == 'crag: error: "notes " is not a root of the index (its roots: docs, notes)\n', err
    code, _, err = cli("index", "never-was")
    assert code == 1 and "path never-was does not exist" in err  # a plain name stays as it was


def test_a_kb_root_deleted_while_a_toolbox_serves_it_is_left_out_and_named(kb: Path) -> None:
    """``crag mcp --kb docs --kb notes`` with notes deleted meanwhile (one process given
    ``--kb`` roots: ``mcp``, ``chat``, ``ask`` and ``search --kb`` alike): its chunks were still
    searched and cited with no note, and ``read_file`` of the citation said there is no such
    file, while the same index searched without ``--kb`` left it out and said so."""
    from crag.config import Settings
    from crag.state import ToolCall
    from crag.tools import Toolbox

    box = Toolbox(Settings.from_env(), roots=["docs", "notes"], cwd=kb)
    query = ToolCall("vector_search", {"query": "notes server port", "top_k": 5})
    try:
        assert any(item.source.startswith("notes/") for item in box.run(query))
        assert box.missing_roots() == ()
        shutil.rmtree(kb / "notes")
        assert {item.source for item in box.run(query)} == {"docs/setup.md"}
        assert box.missing_roots() == (str(kb / "notes"),)
        assert box.file_roots() == (str(kb / "docs"),)
        assert not [i for i in box.run(ToolCall("grep_search", {"pattern": "9090"})) if i.source.startswith("notes/")]
        shutil.rmtree(kb / "docs")
        assert list(box.run(query)) == []  # no root left: nothing is searched, not the whole index
        assert box.missing_roots() == (str(kb / "docs"), str(kb / "notes"))
    finally:
        box.close()


def test_a_dropped_root_is_named_as_every_path_is_shown(kb: Path) -> None:
    """The line naming the dropped roots printed them raw and absolute: a folder named with a
    newline added a line to the report (``/tmp/.../evil`` then ``dir``), unlike the
    ``removed:`` list below it, which shows paths relative and escaped."""
    evil = kb / "evil\n\x1b[2Jdir"
    evil.mkdir()
    (evil / "e.md").write_text("# E\n\nThe evil port is 6666.\n")
    assert cli("index", "evil\n\x1b[2Jdir")[0] == 0
    shutil.rmtree(evil)
    shutil.rmtree(kb / "notes")
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert out.splitlines()[0] == (
        "dropped knowledge-base path(s) that no longer exist: evil\\n\\x1b[2Jdir, notes"
    )
    assert out.splitlines()[1].startswith("indexed 1 path(s) into index with ")


def test_a_root_that_cannot_be_reached_is_kept_not_dropped_as_gone(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root whose parent folder may not be entered (`chmod 000`, as a user other than root
    meets it; a stale network mount answers with an I/O error alike) is still on disk: `roots`
    called it "missing on disk", the next `crag index docs` dropped it with all its files, and
    `crag index notes` said it "does not exist"."""
    notes = str(kb / "notes")
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        name = os.fspath(path)
        if isinstance(name, str) and (name == notes or name.startswith(notes + os.sep)):
            raise PermissionError(13, "Permission denied", name)
        return real_stat(path, *args, **kwargs)

    with monkeypatch.context() as locked:
        locked.setattr(os, "stat", stat)
        code, out, err = cli("roots")
        assert code == 0, err
        assert out.splitlines()[2] == "  notes  cannot be reached (Permission denied; 2 files, 2 chunks kept)"
        code, out, err = cli("index", "docs")
        assert code == 0, err
        assert "dropped" not in out and "removed:" not in out
        assert "  notes: cannot be reached (Permission denied); its files stay in the index as they were" in out.splitlines()
        assert cli("roots")[1].splitlines()[1:] == ["  docs   1 file, 1 chunk",
                                                    "  notes  cannot be reached (Permission denied; 2 files, 2 chunks kept)"]
        code, out, err = cli("search", "port", "--json")
        assert code == 0 and err == ("crag: note: notes cannot be reached (Permission denied) and is left out of the "
                                     "search; its files stay in the index\n")
        code, _, err = cli("index", "notes")
        assert code == 1 and err == "crag: error: knowledge-base path notes cannot be reached (Permission denied)\n"
    assert cli("roots")[1].splitlines()[2] == "  notes  2 files, 2 chunks"


def test_a_file_named_as_a_root_that_may_not_be_read_is_an_error_as_a_folder_is(
        kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`crag index FILE` and `--kb FILE` of a file crag may not read (`chmod 000`, as a user other
    than root meets it) exited 0 with the file listed as skipped, while a root folder that may not
    be entered is an error, exit status 1 (SPEC §4: an unreadable knowledge-base path)."""
    locked = str(kb / "notes" / "notes.md")
    real_open = os.open

    def opener(path, flags, *args, **kwargs):
        if os.fsdecode(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", opener)
    line = "crag: error: knowledge-base path notes/notes.md cannot be read (Permission denied)\n"
    for argv in (["index", "notes/notes.md"], ["ask", "--kb", "notes/notes.md", "which", "port?", "--json"],
                 ["search", "--kb", "notes/notes.md", "port"]):
        assert cli(*argv) == (1, "", line), argv
    assert cli("index", "notes")[0] == 0  # in a folder named as the root, it is one file of it


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="root enters every folder")
def test_a_root_folder_that_may_not_be_entered_itself_cannot_be_reached(kb: Path) -> None:
    """`chmod 000` on the root itself (not on a folder on its way): `roots` showed it healthy,
    `search` returned its files with no note and `crag index docs` did not name it, while
    `crag index notes` said "knowledge-base folder notes cannot be read"."""
    import subprocess
    import sys

    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--inh-caps",
              "-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []
    if prefix and subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("root enters every folder, and may not give that up here")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def crag(*argv: str) -> tuple[int, str, str]:
        run = subprocess.run([*prefix, sys.executable, "-m", "crag", *argv], capture_output=True, text=True,
                             env=env, cwd=kb, timeout=120)
        return run.returncode, run.stdout, run.stderr

    kept = "  notes  cannot be reached (Permission denied; 2 files, 2 chunks kept)"
    (kb / "notes").chmod(0)
    try:
        code, out, err = crag("roots")
        assert code == 0 and out.splitlines()[2] == kept, out + err
        code, out, err = crag("search", "notes", "server", "port", "--json")
        assert code == 0 and {h["path"] for h in json.loads(out)} <= {"docs/setup.md"}, out
        assert err == ("crag: note: notes cannot be reached (Permission denied) and is left out of the "
                       "search; its files stay in the index\n")
        code, out, err = crag("index", "docs")
        assert code == 0, err
        assert "  notes: cannot be reached (Permission denied); its files stay in the index as they were" in out.splitlines()
        assert crag("roots")[1].splitlines()[2] == kept
        code, _, err = crag("index", "notes")
        assert code == 1 and err == "crag: error: knowledge-base path notes cannot be reached (Permission denied)\n"
        code, _, err = crag("search", "--kb", "notes", "server")  # as index says it, not "folder ... cannot be read"
        assert code == 1 and err == "crag: error: knowledge-base path notes cannot be reached (Permission denied)\n"
    finally:
        (kb / "notes").chmod(0o755)
    assert cli("roots")[1].splitlines()[2] == "  notes  2 files, 2 chunks"


def test_a_folder_inside_a_root_that_cannot_be_listed_keeps_its_files(tmp_path: Path) -> None:
    """A root inside another (`b` and `b/sub`) made `chmod 000`: `crag index b` walked `b`,
    could not list `b/sub`, and removed its files while saying they stay in the index. A plain
    folder that cannot be listed was taken for deleted the same way."""
    crag = _crag_as_a_user(tmp_path)
    for folder in ("b/sub", "b/plain"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "c.md").write_text("# C\n\nThe capybara toolkit syncs calendars.\n", encoding="utf-8")
    (tmp_path / "b" / "b.md").write_text("# B\n\nThe badger toolkit compresses logs nightly.\n", encoding="utf-8")
    assert crag("index", "b", "b/sub")[0] == 0
    for folder in ("b/sub", "b/plain"):
        (tmp_path / folder).chmod(0)
    try:
        code, out, err = crag("index", "b")
        assert code == 0 and "removed:" not in out and " 0 removed," in out, out + err
        code, out, _ = crag("roots")
        assert out.splitlines()[1].split()[:2] == ["b", "3"], out  # b.md and both c.md
    finally:
        for folder in ("b/sub", "b/plain"):
            (tmp_path / folder).chmod(0o755)


def _crag_as_a_user(tmp_path: Path) -> Callable[..., tuple[int, str, str]]:
    """``python -m crag`` in ``tmp_path`` as a process that folder permissions bind (root gives
    up reading and entering any folder); the test is skipped where that cannot be done."""
    import subprocess
    import sys

    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--inh-caps",
              "-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []
    if prefix and subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("root enters every folder, and may not give that up here")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), KB_AGENT_LLM="offline",
               KB_AGENT_INDEX_DIR=str(tmp_path / "idx"), XDG_STATE_HOME=str(tmp_path / "state"))

    def crag(*argv: str) -> tuple[int, str, str]:
        run = subprocess.run([*prefix, sys.executable, "-m", "crag", *argv], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=120)
        return run.returncode, run.stdout, run.stderr

    return crag


def test_a_root_inside_one_out_of_reach_is_searched_and_one_out_of_reach_is_not(tmp_path: Path) -> None:
    """Roots `b` and `b/sub`: `b` that may be entered but not listed is left out of the search,
    and `b/sub`, which can be reached, is searched still; `b/sub` out of reach is left out
    whole, as its note says, though `b` holds its files too."""
    crag = _crag_as_a_user(tmp_path)
    (tmp_path / "b" / "sub").mkdir(parents=True)
    (tmp_path / "b" / "b.md").write_text("# B\n\nThe badger toolkit compresses logs.\n", encoding="utf-8")
    (tmp_path / "b" / "sub" / "c.md").write_text("# C\n\nThe capybara toolkit syncs calendars.\n", encoding="utf-8")
    assert crag("index", "b", "b/sub")[0] == 0
    try:
        (tmp_path / "b").chmod(0o311)
        code, out, err = crag("search", "toolkit", "--json")
        assert code == 0 and [h["path"] for h in json.loads(out)] == ["b/sub/c.md"], out + err
        (tmp_path / "b").chmod(0o755)
        (tmp_path / "b" / "sub").chmod(0)
        code, out, err = crag("search", "toolkit", "--json")
        assert code == 0 and [h["path"] for h in json.loads(out)] == ["b/b.md"], out + err
        assert err.startswith("crag: note: b/sub cannot be reached (Permission denied)"), err
    finally:
        (tmp_path / "b").chmod(0o755)
        (tmp_path / "b" / "sub").chmod(0o755)


@pytest.mark.parametrize("target", ["not-there", "notes"], ids=["dangling", "loop"])
def test_a_root_replaced_by_a_link_to_nothing_is_missing_like_a_deleted_one(kb: Path, target: str) -> None:
    """``roots`` said such a root was missing and dropped by the next index, but search kept
    its chunks without a note, and the next index kept them (`crag index notes` said "already
    up to date")."""
    shutil.rmtree(kb / "notes")
    os.symlink(target, kb / "notes")
    assert "notes  missing on disk (2 files, " in cli("roots")[1]
    code, out, err = cli("search", "notes", "server", "port", "--json")
    assert code == 0 and {h["path"] for h in json.loads(out)} <= {"docs/setup.md"}
    assert err.startswith("crag: note: notes no longer exists on disk and is left out of the search"), err
    code, out, err = cli("index", "docs")
    assert code == 0 and "dropped knowledge-base path(s) that no longer exist" in out and "notes/notes.md" in out, out + err
    assert cli("roots")[1].splitlines()[1:] == ["  docs  1 file, 1 chunk"]


def test_a_deleted_root_inside_another_is_left_out_of_search_and_ask(kb: Path) -> None:
    """`crag index docs docs/drafts`, then docs/drafts deleted: the note said it was left out of
    the search, yet its file came back through docs, which holds it too, cited as if nothing
    had happened."""
    (kb / "docs" / "drafts").mkdir()
    (kb / "docs" / "drafts" / "draft.md").write_text("# Draft\n\nThe zeppelin port is 6060.\n")
    assert cli("index", "docs", "docs/drafts")[0] == 0
    shutil.rmtree(kb / "docs" / "drafts")
    code, out, err = cli("search", "zeppelin", "port", "--json")
    assert code == 0 and "docs/drafts/draft.md" not in {h["path"] for h in json.loads(out)}, out
    assert err.startswith("crag: note: docs/drafts no longer exists on disk and is left out of the search"), err
    code, out, err = cli("ask", "zeppelin", "port?", "--json")
    assert code == 0 and "docs/drafts/draft.md" not in {c["path"] for c in json.loads(out)["citations"]}, out


def test_search_scores_follow_the_rank_order(kb: Path) -> None:
    for query in ("port", "server port", "backups port", "notes", "change the port"):
        code, out, err = cli("search", query, "--top-k", "10", "--json")
        assert code == 0, err
        scores = [h["score"] for h in json.loads(out)]
        assert scores == sorted(scores, reverse=True), (query, scores)
        code, out, _ = cli("search", query, "--top-k", "10")
        shown = [float(line.rsplit("score ", 1)[1]) for line in out.splitlines() if "  score " in line]
        assert shown == sorted(shown, reverse=True)


@pytest.mark.parametrize(("cosines", "scores"), [
    ([0.272, 0.327, 0.247, 0.316, 0.265], [0.272, 0.272, 0.247, 0.247, 0.247]),
    ([0.9, 0.8, 0.7], [0.9, 0.8, 0.7]),
    ([], []),
    ([0.1, 0.5], [0.1, 0.1]),
])
def test_scores_in_rank_order_cap_each_cosine_by_the_score_above(cosines: list[float], scores: list[float]) -> None:
    result = scores_in_rank_order(cosines)
    assert result == scores
    assert all(s <= c for s, c in zip(result, cosines))


def test_no_lock_file_is_left_behind_after_an_index_run_or_a_failed_one(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not (kb / "index" / "LOCK").exists()
    (kb / "docs" / "new.md").write_text("# New\n\nA new page about ports.\n")
    monkeypatch.setenv("KB_AGENT_EMBEDDER", "openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens: the embedder fails
    monkeypatch.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("KB_AGENT_LLM_TIMEOUT", "2")
    code, _, err = cli("index", "docs")
    assert code == 1 and err.count("\n") == 1, err
    assert not (kb / "index" / "LOCK").exists()
    assert cli("roots")[0] == 0  # the previous index is intact


def test_the_reindex_advice_names_the_roots(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_AGENT_EMBEDDER", "openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    for argv in (["search", "port"], ["ask", "which", "port?"], ["ask", "which port?", "--kb", "docs"]):
        code, out, err = cli(*argv)
        assert code == 1 and out == ""
        assert err.endswith("run `python -m crag index docs notes` to re-index\n"), err


def test_roots_list_and_remove_on_the_postgresql_store(pg_uri: str, kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_AGENT_STORE", pg_uri)
    code, _, err = cli("index", "docs", "notes")
    assert code == 0, err
    code, out, err = cli("roots")
    assert code == 0, err
    assert out.splitlines()[1].split() == ["docs", "1", "file,", "1", "chunk"]
    assert out.splitlines()[2].split()[:3] == ["notes", "2", "files,"]
    code, out, err = cli("roots", "--remove", "notes")
    assert code == 0 and out.startswith("removed notes (2 files, "), err
    code, out, _ = cli("search", "port", "--json")
    assert {h["path"] for h in json.loads(out)} == {"docs/setup.md"}
    shutil.rmtree(kb / "docs")
    assert "docs  missing on disk" in cli("roots")[1]
    # A database is shared by machines: a root absent from this one is still searched (docs/postgresql.md).
    code, out, err = cli("search", "port", "--json")
    assert code == 0 and {h["path"] for h in json.loads(out)} == {"docs/setup.md"}
    assert err == ("crag: note: docs is not on this machine's disk: its hits come from the database, but "
                   "read_file and grep_search cannot open its files here\n")


def test_a_reader_on_a_machine_without_the_documents_searches_and_asks_the_database(
        pg_uri: str, kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/postgresql.md: readers (laptops, services) need only the database for vector_search.
    Every root is a path on the indexer's machine, absent from a reader's: search found nothing
    ("docs no longer exists on disk and is left out of the search") and every question got the
    no-evidence answer."""
    monkeypatch.setenv("KB_AGENT_STORE", pg_uri)
    assert cli("index", "docs")[0] == 0
    shutil.move(kb / "docs", kb / "elsewhere")  # the reader's machine: the indexer's paths are not there
    code, out, err = cli("search", "Which port does the server listen on?", "--json")
    assert code == 0 and json.loads(out)[0]["path"] == "docs/setup.md", err
    code, out, err = cli("ask", "Which port does the server listen on?", "--json")
    result = json.loads(out)
    assert code == 0 and {c["path"] for c in result["citations"]} == {"docs/setup.md"}, err
    assert "couldn't find" not in result["body"]
    code, out, err = cli("search", "port", "--kb", "docs")  # a --kb root must be on this machine: it is indexed first
    assert code == 1 and "docs does not exist" in err


def test_a_folder_through_a_symlink_and_through_its_real_path_is_one_root(kb: Path) -> None:
    # Indexed both ways it was two roots, and every hit came back twice.
    (kb / "docs-link").symlink_to(kb / "docs", target_is_directory=True)
    code, out, err = cli("index", "docs-link")
    assert code == 0 and "0 added" in out, err
    code, out, _ = cli("roots")
    assert out.splitlines()[0].startswith("2 roots in index") and "docs-link" not in out
    code, out, err = cli("search", "server port", "--json", "--kb", "docs-link")
    assert code == 0, err
    hits = [(h["path"], h["start_line"]) for h in json.loads(out)]
    assert hits and len(hits) == len(set(hits)) and all(path == "docs/setup.md" for path, _ in hits)
    code, out, err = cli("roots", "--remove", "docs-link")
    assert code == 0 and "docs" in out, err
    assert cli("roots")[1].splitlines()[0].startswith("1 root in index")


def test_a_binary_file_is_never_counted_as_indexed_and_is_named_on_every_run(kb: Path) -> None:
    """A file left out as binary is no file of the index: ``roots`` does not count it, every
    ``index`` run names it (not only the first), it is "added" when it becomes text and never
    "removed" when it was never in the index; a file that becomes binary leaves it."""
    (kb / "docs" / "junk.txt").write_bytes(b"binary\0data\0")
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert "0 added" in out and "junk.txt: binary file" in out
    assert cli("roots")[1].splitlines()[1] == "  docs   1 file, 1 chunk"
    os.utime(kb / "docs" / "junk.txt", ns=(1, 1))  # touched, not changed
    for _ in range(2):
        code, out, err = cli("index", "docs")
        assert code == 0 and "1 unchanged" in out and "junk.txt: binary file" in out, out
    assert cli("roots")[1].splitlines()[1] == "  docs   1 file, 1 chunk"
    (kb / "docs" / "junk.txt").write_text("The junk drawer holds spare keys.\n")
    code, out, _ = cli("index", "docs")
    assert "1 added" in out and "0 changed" in out and "docs/junk.txt" in out, out
    (kb / "docs" / "setup.md").write_bytes(b"now\0binary")
    code, out, _ = cli("index", "docs")
    assert "1 removed" in out and "setup.md: binary file" in out, out
    assert cli("roots")[1].splitlines()[1] == "  docs   1 file, 1 chunk"
    (kb / "docs" / "setup.md").unlink()
    code, out, _ = cli("index", "docs")
    assert "0 removed" in out and "setup.md" not in out, out
    assert cli("roots")[1].splitlines()[1] == "  docs   1 file, 1 chunk"


@pytest.mark.parametrize("key", ["dim", "chunks"])
def test_roots_of_an_index_whose_counts_are_not_numbers_says_it_is_damaged(kb: Path, key: str) -> None:
    """A ``meta`` count that is not a number (its checksums rewritten with it) was a
    traceback from ``crag roots`` and ``roots --remove``, while ``search`` called it damaged."""
    import sqlite3

    from crag.index import integrity, layout

    gen = os.path.join(kb, "index", layout.read_current(str(kb / "index")))
    with sqlite3.connect(os.path.join(gen, "chunks.sqlite")) as conn:
        conn.execute("UPDATE meta SET value = 'many' WHERE key = ?", (key,))
    conn.close()
    integrity.write_checksums(gen, integrity.CHECKED_FILES)
    for argv in (["roots"], ["roots", "--remove", "notes"], ["search", "port"]):
        code, out, err = cli(*argv)
        assert (code, out) == (1, ""), argv
        assert err.startswith(f"crag: error: the index in {kb / 'index'} is damaged (meta {key} is not a number): ")
        assert err.count("\n") == 1


def test_a_database_leaves_out_a_root_it_may_not_enter_and_searches_one_on_another_disk(monkeypatch) -> None:
    """With PostgreSQL a root on this disk that may not be entered was searched, its note saying
    it "is not on this machine's disk" while `roots` said it cannot be reached; only a root gone
    from this disk (most often on the indexer's) is the database's to answer for."""
    import crag.index.discover as discover
    from crag.cli.index_text import missing_roots_note

    monkeypatch.setattr(discover, "is_gone", lambda r: r == "/kb/old")
    monkeypatch.setattr(discover, "unreachable", lambda r: None if r == "/kb/old" else "Permission denied")
    note = missing_roots_note(["/kb/notes", "/kb/old"], "/", shared=True)
    assert note is not None and note.splitlines() == [
        "crag: note: kb/notes cannot be reached (Permission denied) and is left out of the search; its files stay "
        "in the index",
        "crag: note: kb/old is not on this machine's disk: its hits come from the database, but read_file and "
        "grep_search cannot open its files here",
    ]
