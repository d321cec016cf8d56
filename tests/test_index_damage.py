"""A damaged embedded index under the commands that write it: nothing certifies the damage,
and a rebuild keeps what the index held.

The real CLI over a real index (hash embedder, FAISS, SQLite) in a temporary folder, which is
the working directory, so paths are shown relative to it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .fakes import clean_env, cli

DOCS = "# Setup\n\nThe server listens on port 8080 by default.\n\n## Extra\n\nRetention of setup logs is 9 days.\n"
NOTES = "# Notes\n\nThe notes server port is 9090.\n\n## Backups\n\nThe port for backups is 7070.\n"


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crag: error: "), err
    return lines[0]


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    clean_env(monkeypatch)
    for name, text in (("docs/setup.md", DOCS), ("docs/more.md", "# More\n\nUploads are retried 3 times.\n"),
                       ("notes/notes.md", NOTES), ("notes/list.md", "# List\n\nThe port list is kept here.\n")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    code, _, err = cli("index", "docs", "notes")
    assert code == 0, err
    return tmp_path


def generation(kb: Path) -> Path:
    index = kb / "index"
    return index / (index / "CURRENT").read_text().strip()


def garble_vectors(kb: Path) -> None:
    """Zeros over most of the FAISS file's vectors, its size unchanged (a bad sector, say)."""
    path = generation(kb) / "vectors.faiss"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 4)
        f.write(bytes(size // 2))


def hits(*argv: str) -> list[tuple[str, float]]:
    code, out, err = cli("search", "--json", *argv)
    assert code == 0, err
    return [(h["path"], h["score"]) for h in json.loads(out)]


def test_removing_a_root_from_a_damaged_index_does_not_certify_its_damage(kb: Path) -> None:
    """`roots --remove` built its new generation on the damaged one without checking it, and
    wrote fresh checksums over the garbled vectors: the index then passed every check and
    search answered with wrong scores, silently."""
    garble_vectors(kb)
    before = generation(kb).name
    code, out, err = cli("roots", "--remove", "notes")
    line = one_error_line(err)
    assert code == 1 and not out and "damaged" in line and "crag index" in line, err
    assert generation(kb).name == before  # nothing was published on top of the damage
    assert cli("search", "port")[0] == 1  # still said to be damaged


def test_rebuilding_a_damaged_index_keeps_every_root_it_held(kb: Path) -> None:
    """`crag index docs` over a damaged index that held docs and notes rebuilt it with docs
    alone: notes left the index without a word, though its roots could still be read."""
    expected = hits("backups port")
    garble_vectors(kb)
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert out.startswith("re-embedded everything: the previous index could not be read"), out
    assert "indexed 2 path(s)" in out
    code, out, err = cli("roots")
    assert code == 0, err
    assert [row.split()[0] for row in out.splitlines()[1:]] == ["docs", "notes"], out
    assert hits("backups port") == expected


def test_a_damaged_index_whose_roots_cannot_be_read_is_rebuilt_from_the_paths_given(kb: Path) -> None:
    (generation(kb) / "chunks.sqlite").write_bytes(b"not a database" * 100)
    code, out, err = cli("index", "docs")
    assert code == 0 and "indexed 1 path(s)" in out, (out, err)
    assert [row.split()[0] for row in cli("roots")[1].splitlines()[1:]] == ["docs"]


def test_a_deleted_checksum_file_is_damage_not_an_older_index(kb: Path) -> None:
    """A generation that crag wrote with checksums and that lost its CHECKSUMS file was taken
    for one written before checksums existed: garbage in its FAISS file went unnoticed."""
    garble_vectors(kb)
    (generation(kb) / "CHECKSUMS").unlink()
    for argv in (("search", "port"), ("ask", "which port does the server use?")):
        code, out, err = cli(*argv)
        line = one_error_line(err)
        assert code == 1 and not out and "damaged (its checksum file CHECKSUMS is missing)" in line, (argv, err)
    code, out, err = cli("index", "docs", "notes")
    assert code == 0 and "re-embedded everything: the previous index could not be read" in out, (out, err)
    assert (generation(kb) / "CHECKSUMS").is_file() and cli("search", "port")[0] == 0


def test_an_index_written_before_checksums_existed_is_still_read(kb: Path) -> None:
    import sqlite3

    expected = hits("backups port")
    db = generation(kb) / "chunks.sqlite"
    (generation(kb) / "CHECKSUMS").unlink()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM meta WHERE key = 'checksums'")
    conn.close()
    assert hits("backups port") == expected
    code, out, _ = cli("index", "docs", "notes")
    assert code == 0 and "4 unchanged" in out


def test_roots_of_a_damaged_index_says_it_is_damaged(kb: Path) -> None:
    """`roots` listed the files and chunks of an index whose files no longer matched their
    checksums, exit status 0, while search and ask called it damaged."""
    garble_vectors(kb)
    code, out, err = cli("roots")
    line = one_error_line(err)
    assert code == 1 and not out and "damaged" in line and "crag index" in line, err


def test_an_old_generation_left_by_a_killed_indexer_goes_with_the_next_run(kb: Path) -> None:
    """An indexer killed after publishing its generation, before removing the previous one,
    left that one behind; the next run, finding nothing changed, kept it for good."""
    current = generation(kb)
    stale = current.parent / "gen-000000"
    shutil.copytree(current, stale)
    unfinished = current.parent / "gen-000009"
    unfinished.mkdir()
    (unfinished / "chunks.sqlite").write_bytes(b"half written")
    code, out, err = cli("index", "docs", "notes")
    assert code == 0 and "the index was already up to date" in out, (out, err)
    assert sorted(p.name for p in current.parent.iterdir() if p.name.startswith("gen-")) == [current.name]


def test_an_index_path_below_a_file_names_the_file(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`KB_AGENT_INDEX_DIR=notes/list.md/index` was "notes/list.md/index is a file" for search
    and "cannot create the index folder ... (Not a directory)" for index."""
    blocker = kb / "notes" / "list.md"
    for index_dir in (blocker, blocker / "index"):
        monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(index_dir))
        for argv in (("search", "port"), ("roots",), ("index", "docs")):
            code, out, err = cli(*argv)
            line = one_error_line(err)
            assert code == 1 and not out, (argv, err)
            assert f"{blocker} is a file, not an index folder" in line and "KB_AGENT_INDEX_DIR" in line, (argv, line)
    assert blocker.read_text(encoding="utf-8").startswith("# List")


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="root reads every file")
def test_an_unreadable_file_of_the_generation_is_named(kb: Path) -> None:
    """A generation file crag may not open was reported as the generation folder."""
    import subprocess
    import sys

    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps",
              "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    if prefix and subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("root reads every file, and may not give that up here")
    target = generation(kb) / "vectors.faiss"
    target.chmod(0)
    try:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        run = subprocess.run([*prefix, sys.executable, "-m", "crag", "search", "port"], capture_output=True,
                             text=True, env=env, cwd=kb, timeout=120)
    finally:
        target.chmod(0o644)
    line = one_error_line(run.stderr)
    assert run.returncode == 1 and f"cannot read {target} (Permission denied)" in line, run.stderr


def test_an_index_folder_linked_round_in_a_loop_is_named_so(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `.crag` linked to itself was "a symbolic link to .crag, which does not exist"."""
    monkeypatch.delenv("KB_AGENT_INDEX_DIR")
    (kb / ".crag").symlink_to(".crag")
    for argv in (("search", "port"), ("roots",), ("index", "docs")):
        code, out, err = cli(*argv)
        line = one_error_line(err)
        assert code == 1 and not out, (argv, err)
        assert f"the index folder {kb / '.crag'} is a symbolic link that leads round in a loop" in line, line
    code, out, err = cli("log")  # the answer log, kept in the index folder, was "a symbolic link to nothing"
    assert (code, out, err) == (1, "", "crag: error: the answer log cannot be kept in .crag: it is a symbolic link "
                                       "that leads round in a loop\n")


@pytest.mark.parametrize("argv", [("index", "docs", "notes"), ("roots", "--remove", "notes"),
                                  ("ask", "--kb", "docs", "which port?")])
def test_a_lock_file_that_is_a_link_to_a_document_never_writes_the_document(kb: Path, argv: tuple[str, ...]) -> None:
    """A LOCK that was a symbolic link to a document was opened through the link, truncated and
    given the indexer's process id: the document's text was lost, and indexed as changed."""
    (kb / "docs" / "setup.md").write_text(DOCS + "\nA new line.\n", encoding="utf-8")  # something to index
    document = kb / "notes" / "notes.md"
    (kb / "index" / "LOCK").symlink_to(document)
    code, out, err = cli(*argv)
    line = one_error_line(err)
    assert code == 1 and not out, err
    assert f"the lock file {kb / 'index' / 'LOCK'} is a symbolic link" in line and "remove it" in line, line
    assert document.read_text(encoding="utf-8") == NOTES
    (kb / "index" / "LOCK").unlink()
    assert cli(*argv)[0] == 0


def test_a_lock_file_that_is_a_named_pipe_never_hangs_a_reader(kb: Path) -> None:
    """With no index yet, search asks whether an indexer holds LOCK: a named pipe there made it
    wait for a writer forever."""
    import threading

    index = kb / "fresh"
    index.mkdir()
    os.mkfifo(index / "LOCK")
    done: list[tuple[int, str, str]] = []
    worker = threading.Thread(target=lambda: done.append(cli("--index", str(index), "search", "port")), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "search still waiting after 30s"
    code, out, err = done[0]
    assert code == 1 and not out and "no index in" in one_error_line(err)
    code, out, err = cli("--index", str(index), "index", "docs")
    line = one_error_line(err)
    assert code == 1 and f"the lock file {index / 'LOCK'} is a named pipe" in line, line


def _within(seconds: float, *argv: str, pipe: Path) -> tuple[int, str, str]:
    """``cli(*argv)`` on a thread; a run still waiting after ``seconds`` fails the test, and the
    named pipe it waits on is opened for writing so that its thread ends."""
    import threading

    done: list[tuple[int, str, str]] = []
    worker = threading.Thread(target=lambda: done.append(cli(*argv)), daemon=True)
    worker.start()
    worker.join(seconds)
    if not done:
        try:
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        pytest.fail(f"crag {' '.join(argv)} still waiting on the named pipe {pipe.name} after {seconds}s")
    return done[0]


@pytest.mark.parametrize("name", ["CURRENT", "CHECKSUMS", "vectors.faiss", "chunks.sqlite"])
def test_a_named_pipe_in_place_of_an_index_file_is_damage_not_a_hang(kb: Path, name: str) -> None:
    """A named pipe where CURRENT or a generation's file belongs made search, roots and index
    wait for a writer forever (open() of a pipe blocks; SIGTERM could not stop it either)."""
    pipe = kb / "index" / name if name == "CURRENT" else generation(kb) / name
    pipe.unlink()
    os.mkfifo(pipe)
    rel = name if name == "CURRENT" else f"{pipe.parent.name}/{name}"
    for argv in (("search", "port"), ("roots",)):
        code, out, err = _within(30, *argv, pipe=pipe)
        line = one_error_line(err)
        assert code == 1 and not out and f"is damaged ({rel} is not a regular file)" in line, line
    code, out, err = _within(60, "index", "docs", "notes", pipe=pipe)
    assert code == 0 and "re-embedded everything: the previous index could not be read" in out, out + err
    assert {path for path, _ in hits("port")} >= {"docs/setup.md", "notes/notes.md"}


@pytest.mark.parametrize("name", ["CURRENT", "CHECKSUMS", "vectors.faiss", "chunks.sqlite"])
def test_a_socket_in_place_of_an_index_file_is_damage(kb: Path, name: str) -> None:
    """A socket cannot be opened at all (ENXIO): it was "cannot read ... (No such device or
    address)", and for CURRENT the advice to check --index, which no check mends."""
    import socket

    path = kb / "index" / name if name == "CURRENT" else generation(kb) / name
    path.unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        rel = name if name == "CURRENT" else f"{path.parent.name}/{name}"
        for argv in (("search", "port"), ("roots",)):
            code, out, err = cli(*argv)
            line = one_error_line(err)
            assert code == 1 and not out and f"is damaged ({rel} is not a regular file)" in line, line
        code, out, err = cli("index", "docs", "notes")
        assert code == 0 and "re-embedded everything: the previous index could not be read" in out, out + err
    assert {path for path, _ in hits("port")} >= {"docs/setup.md", "notes/notes.md"}


def test_a_named_pipe_by_a_generation_name_is_removed_without_waiting(kb: Path) -> None:
    """Each indexer removes the generations it does not keep; shutil.rmtree opens what it is
    given, so a named pipe called gen-000009 in the index folder made `crag index` wait for a
    writer forever. A link by such a name goes too, and what it leads to stays."""
    index = kb / "index"
    os.mkfifo(index / "gen-000009")
    (kb / "victim").mkdir()
    (kb / "victim" / "f").write_text("kept")
    (index / "gen-000010").symlink_to(kb / "victim")
    code, out, err = _within(60, "index", "docs", pipe=index / "gen-000009")
    assert code == 0 and "up to date" in out, out + err
    assert not os.path.lexists(index / "gen-000009") and not os.path.lexists(index / "gen-000010")
    assert (kb / "victim" / "f").read_text() == "kept"


def test_publishing_never_writes_through_a_link_where_its_temporary_file_goes(kb: Path) -> None:
    """`CURRENT` is replaced by writing `CURRENT.tmp-PID` first; a symbolic link by that name
    (left over, or put there) was written through, truncating what it named."""
    document = kb / "notes" / "notes.md"
    (kb / "index" / "CURRENT").write_text("garbage\n")  # damaged: nothing tidies the folder first
    (kb / "index" / f"CURRENT.tmp-{os.getpid()}").symlink_to(document)
    code, out, err = cli("index", "docs", "notes")
    assert code == 0 and "re-embedded everything" in out, err
    assert document.read_text(encoding="utf-8") == NOTES
    assert cli("search", "port")[0] == 0


def test_rebuilding_an_index_of_an_older_format_keeps_every_root_it_held(kb: Path) -> None:
    """An index of an older format is rebuilt by `crag index`, which opened it only through
    the format check: its roots could not be read, and `crag index docs` dropped notes."""
    import sqlite3

    conn = sqlite3.connect(generation(kb) / "chunks.sqlite")
    with conn:
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    conn.close()
    (generation(kb) / "CHECKSUMS").unlink()
    code, out, err = cli("search", "port")
    assert code == 1 and "has format 1, this crag reads format 2" in one_error_line(err)
    code, out, err = cli("index", "docs")
    assert code == 0 and "re-embedded everything" in out and "indexed 2 path(s)" in out, (out, err)
    assert [row.split()[0] for row in cli("roots")[1].splitlines()[1:]] == ["docs", "notes"]


@pytest.mark.parametrize("damage", ["garbage", "missing", "dangling"])
def test_rebuilding_an_index_whose_current_file_is_damaged_keeps_every_root_it_held(kb: Path, damage: str) -> None:
    """`CURRENT` holding garbage, deleted, or naming a generation that is not there, beside an
    intact generation: `crag index docs` rebuilt the index with docs alone and deleted the
    generation that still held notes, without a word; with `CURRENT` deleted, search said "no
    index" and the rebuild was not even called one."""
    expected = hits("backups port")
    current = kb / "index" / "CURRENT"
    if damage == "garbage":
        current.write_bytes(b"\x00garbage\xff\n")
    elif damage == "missing":
        current.unlink()
    else:
        current.write_text("gen-000099\n")
    code, out, err = cli("search", "port")
    line = one_error_line(err)
    assert code == 1 and not out and f"the index in {kb / 'index'} is damaged (" in line, line
    if damage == "missing":
        assert "damaged (CURRENT is missing)" in line, line
    code, out, err = cli("index", "docs")
    assert code == 0, err
    assert out.startswith("re-embedded everything: the previous index could not be read"), out
    assert "indexed 2 path(s)" in out, out
    assert [row.split()[0] for row in cli("roots")[1].splitlines()[1:]] == ["docs", "notes"]
    assert hits("backups port") == expected


def test_a_generation_an_indexer_left_unfinished_is_no_index(kb: Path) -> None:
    """An indexer killed before it first published leaves a generation whose database does not
    name it: that folder is no index (`search` says so), not a damaged one."""
    import sqlite3

    shutil.rmtree(kb / "index")
    (kb / "index" / "gen-000001").mkdir(parents=True)
    conn = sqlite3.connect(kb / "index" / "gen-000001" / "chunks.sqlite")
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("CREATE TABLE roots (path TEXT PRIMARY KEY)")
    conn.close()
    code, out, err = cli("search", "port")
    assert code == 1 and one_error_line(err).startswith(f"crag: error: no index in {kb / 'index'}: "), err
    code, out, err = cli("index", "docs")
    assert code == 0 and not out.startswith("re-embedded") and "indexed 1 path(s)" in out, out + err
    assert [p.name for p in (kb / "index").iterdir() if p.name.startswith("gen-")] == ["gen-000001"]


def test_a_failed_rebuild_of_an_index_that_lost_its_current_file_keeps_its_generation(
    kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild removed the generation `CURRENT` had named before it began, taking the
    folder for leftovers of a first index: when the rebuild then failed, notes was lost to
    every later run."""
    (kb / "index" / "CURRENT").unlink()
    with monkeypatch.context() as failing:
        failing.setenv("KB_AGENT_EMBEDDER", "openai")
        failing.setenv("KB_AGENT_EMBEDDING_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
        failing.setenv("KB_AGENT_EMBEDDING_MODEL", "gone-embed")
        failing.setenv("OPENAI_API_KEY", "sk-test")
        failing.setenv("KB_AGENT_LLM_MAX_RETRIES", "0")
        code, out, err = cli("index", "docs")
        assert code == 1 and one_error_line(err), out + err
    assert [p.name for p in (kb / "index").iterdir() if p.name.startswith("gen-")] == ["gen-000001"]
    code, out, err = cli("index", "docs")
    assert code == 0 and "indexed 2 path(s)" in out, out + err
    assert [row.split()[0] for row in cli("roots")[1].splitlines()[1:]] == ["docs", "notes"]
