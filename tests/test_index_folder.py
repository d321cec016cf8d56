"""Which index folder a command uses, and what stands in its place: the answer log never
creates one, discovery passes over a ``.crag`` without an index, and a newer crag's index,
a ``.crag`` that is a file or a link to nothing are each one line, never a silent rebuild or
an empty answer."""

from __future__ import annotations

import io
import json
import os
import sqlite3
from pathlib import Path

import pytest

from crag.cli import main
from crag.config import find_index_dir
from tests.fakes import clean_env

DEPLOY = "# Deploy\n\nRun the server with docker compose up.\n"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "proj" / "docs").mkdir(parents=True)
    (tmp_path / "proj" / "sub").mkdir()
    (tmp_path / "proj" / "docs" / "deploy.md").write_text(DEPLOY, encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path / "proj")
    return tmp_path / "proj"


def test_a_question_asked_before_any_index_creates_no_index_folder(proj: Path, monkeypatch) -> None:
    monkeypatch.chdir(proj / "sub")
    code, out, _ = cli("ask", "hello")
    assert code == 0 and out.startswith("Hello")
    assert not (proj / "sub" / ".crag").exists()
    state = Path(os.environ["XDG_STATE_HOME"]) / "crag" / "log.sqlite"
    assert state.is_file()  # logged all the same, in the user's state folder
    code, out, _ = cli("log")
    assert code == 0 and "hello" in out and str(state) not in out

    monkeypatch.chdir(proj)
    assert cli("index", "docs")[0] == 0
    monkeypatch.chdir(proj / "sub")
    code, out, err = cli("search", "docker compose")
    assert code == 0 and "docs/deploy.md" in out, err
    code, out, err = cli("ask", "How do I run the server?")
    assert code == 0 and "docker compose up" in out, err
    assert (proj / ".crag" / "log.sqlite").is_file()  # now beside the index


def test_discovery_passes_over_a_crag_that_holds_no_index(proj: Path, monkeypatch) -> None:
    assert cli("index", "docs")[0] == 0
    (proj / "sub" / ".crag").mkdir()
    sqlite3.connect(proj / "sub" / ".crag" / "log.sqlite").close()  # what an older crag's ask left
    monkeypatch.chdir(proj / "sub")
    assert find_index_dir() == str(proj / ".crag")
    code, out, err = cli("search", "docker compose")
    assert code == 0 and "docs/deploy.md" in out, err
    # With no index above, the nearest .crag is the index still (where `index` builds it).
    os.rename(proj / ".crag", proj / "moved")
    assert find_index_dir() == ".crag"


def test_an_index_written_by_a_newer_crag_is_refused_not_rebuilt(proj: Path) -> None:
    assert cli("index", "docs")[0] == 0
    generation = (proj / ".crag" / "CURRENT").read_text().strip()
    with sqlite3.connect(proj / ".crag" / generation / "chunks.sqlite") as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    for argv in (("index", "docs"), ("search", "docker"), ("ask", "How do I run the server?")):
        code, out, err = cli(*argv)
        assert code == 1 and out == "", argv
        assert err.splitlines() == [
            f"crag: error: the index in {proj / '.crag'} was written by a newer crag (format 99; this crag "
            "reads format 2): upgrade crag, or index into another folder with --index DIR"
        ]
    assert (proj / ".crag" / "CURRENT").read_text().strip() == generation  # untouched


def test_crag_log_says_what_stands_where_the_log_belongs(proj: Path) -> None:
    (proj / ".crag").write_text("not a folder\n")
    code, out, err = cli("log")
    assert code == 1 and out == "" and err == "crag: error: the answer log cannot be kept in .crag: it is not a folder\n"
    (proj / ".crag").unlink()
    (proj / ".crag" / "log.sqlite").mkdir(parents=True)
    code, out, err = cli("log")
    assert code == 1 and out == ""
    assert err == ("crag: error: the answer log .crag/log.sqlite is not a file (a folder?): move it away to start "
                   "a new log\n")
    code, out, err = cli("ask", "hello")  # the answer is given; the log's trouble is a note
    assert code == 0 and out.startswith("Hello") and "crag: note: the answer log .crag/log.sqlite is not a file" in err


def test_crag_log_names_a_named_pipe_or_socket_standing_for_the_log(proj: Path) -> None:
    """A named pipe or a socket where ``log.sqlite`` belongs was "not a file (a folder?)"."""
    import socket

    (proj / ".crag").mkdir()
    os.mkfifo(proj / ".crag" / "log.sqlite")
    code, out, err = cli("log")
    assert code == 1 and out == ""
    assert err == "crag: error: the answer log .crag/log.sqlite is not a file (a named pipe): move it away to start a new log\n"
    (proj / ".crag" / "log.sqlite").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(proj / ".crag" / "log.sqlite"))
        code, out, err = cli("ask", "hello")  # the answer is given; the log's trouble is a note
        assert code == 0 and out.startswith("Hello")
        assert "crag: note: the answer log .crag/log.sqlite is not a file (a socket)" in err


def test_crag_log_says_where_a_link_standing_for_the_log_or_its_folder_leads(proj: Path) -> None:
    """A ``.crag`` linked to a file was called "a symbolic link to nothing", and a ``log.sqlite``
    linked to nothing, or round in a loop, "not a file (a folder?)": the line says what the link is."""
    (proj / "notes.txt").write_text("a file\n")
    os.symlink("notes.txt", proj / ".crag")
    code, out, err = cli("log")
    assert code == 1 and out == ""
    assert err == "crag: error: the answer log cannot be kept in .crag: it is a symbolic link to a file, not a folder\n"
    (proj / ".crag").unlink()
    (proj / ".crag").mkdir()
    for target, what in (("nowhere", "a symbolic link to nothing"), ("log.sqlite", "a symbolic link that leads "
                         "round in a loop"), (".", "a symbolic link to a folder")):
        os.symlink(target, proj / ".crag" / "log.sqlite")
        code, out, err = cli("log")
        assert code == 1 and out == ""
        assert err == f"crag: error: the answer log .crag/log.sqlite is {what}: move it away to start a new log\n"
        code, out, err = cli("ask", "hello")  # the answer is given; the log's trouble is a note
        assert code == 0 and out.startswith("Hello") and f"crag: note: the answer log .crag/log.sqlite is {what}" in err
        (proj / ".crag" / "log.sqlite").unlink()


def test_an_index_folder_whose_name_is_not_utf8_is_one_line(proj: Path) -> None:
    """The vector library takes file names as UTF-8 text: ``crag --index $'caf\\xe9' index docs``
    (or a working folder so named, where ``.crag`` is looked for) died in faiss's
    ``write_index`` with a TypeError traceback. It is refused at once, naming the folder."""
    folder = os.fsdecode(os.fsencode(str(proj)) + b"/caf\xe9-index")
    for argv in (("--index", folder, "index", "docs"), ("--index", folder, "search", "docker"),
                 ("--index", folder, "ask", "How do I run the server?")):
        code, out, err = cli(*argv)
        assert code == 1 and out == "" and len(err.splitlines()) == 1, (argv, err)
        assert err.startswith("crag: error: the index folder ") and "caf\\xe9-index" in err
        assert "not valid UTF-8" in err and "--index DIR" in err


def test_a_crag_link_to_nothing_is_named_by_every_command(proj: Path, tmp_path: Path) -> None:
    target = tmp_path / "unmounted" / "index"
    os.symlink(target, proj / ".crag")
    line = (f"crag: error: the index folder {proj / '.crag'} is a symbolic link to {target}, which does not "
            "exist: create that folder (or mount its drive), or remove the link")
    for argv in (("ask", "How do I run the server?"), ("index", "docs"), ("search", "docker")):
        code, out, err = cli(*argv)
        assert code == 1 and out == "" and err.splitlines() == [line], argv
    assert not target.parent.exists()  # nothing was made where the link points
    code, _, err = cli("log")
    assert code == 1 and err == "crag: error: the answer log cannot be kept in .crag: it is a symbolic link to nothing\n"
    target.mkdir(parents=True)  # mounted again: the link is the index folder
    code, out, _ = cli("index", "docs")
    assert code == 0 and (target / "CURRENT").is_file()
    assert json.loads(cli("search", "docker", "--json")[1])[0]["path"] == "docs/deploy.md"
