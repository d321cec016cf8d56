"""What a conformance audit of the configuration and the command line (SPEC §3, §4) found.

Each test types what a new user might type wrong, through the real command line
(``crag.cli.main``, the real index, the offline backend), and checks what the SPEC promises:
one ``crag: error:`` line (or one warning) on stderr, the right exit status, and nothing
spent or logged for a question that holds nothing to ask.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import clean_env, cli

ROOT = Path(__file__).resolve().parents[1]

DOC = "# Backups\n\nBackups are kept for 30 days on the storage bucket.\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with docs indexed into its own ./.crag; the working directory is the project."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "backup.md").write_text(DOC, encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("index", "docs")
    assert code == 0, err
    return tmp_path


def logged_questions() -> list[str]:
    code, out, err = cli("log", "--json", "-n", "100")
    assert code == 0, err
    return [entry["question"] for entry in json.loads(out)]


# Text a person cannot read: control characters, an escape sequence, zero-width and no-break spaces.
NOTHING_TO_ASK = ["\x01\x02\t", "\x1b[31m", "\u200b\u00a0", "\u202e\x7f"]


@pytest.mark.parametrize("question", NOTHING_TO_ASK)
def test_a_question_of_only_control_characters_is_empty_not_asked(project: Path, question: str) -> None:
    """``crag ask $'\\x01\\x02'`` was answered (the no-evidence sentence, two LLM calls on a
    real backend) and logged with a blank question; ``crag search`` said "no matching chunks"."""
    for argv, stdin, said in ((("ask", question), None, "the question is empty"),
                              (("ask", "-"), question + "\n", "the question read from standard input is empty"),
                              (("ask", question, "--json"), None, "the question is empty"),
                              (("search", question), None, "the search query is empty")):
        code, out, err = cli(*argv, stdin=stdin)
        assert (code, out, err) == (2, "", f"crag: error: {said}\n"), argv
    assert logged_questions() == []


def test_chat_refuses_a_line_of_only_control_characters_and_goes_on(project: Path) -> None:
    code, out, err = cli("chat", stdin="\x01\x02\nhow long are backups kept\n")
    assert code == 0
    assert err == "crag: error: the question is empty\n"
    assert "30 days" in out and out.count("LLM Usage Stats") == 1
    assert logged_questions() == ["how long are backups kept"]


@pytest.mark.parametrize(("name", "where", "shown", "meant"), [
    ("kb_agent_top_k", ".env", "kb_agent_top_k", "KB_AGENT_TOP_K"),
    ("Kb_Agent_Grounding", ".env", "Kb_Agent_Grounding", "KB_AGENT_GROUNDING"),
    ("kb_agent_max_iterations", "environment", "kb_agent_max_iterations", "KB_AGENT_MAX_ITERATIONS"),
    ("KB_AGENT_TOP_K ", "environment", '"KB_AGENT_TOP_K "', "KB_AGENT_TOP_K"),
    ("kb_agent_topk", "environment", "kb_agent_topk", "KB_AGENT_TOP_K"),
])
def test_a_setting_in_the_wrong_case_or_with_a_stray_space_is_warned_about(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, where: str, shown: str, meant: str) -> None:
    """``kb_agent_top_k=3`` in .env was silently ignored (SPEC §3: unknown ``KB_AGENT_*`` names are
    warned about, with the closest known name); ``"KB_AGENT_TOP_K "`` was named without its space,
    so the warning read as "KB_AGENT_TOP_K is not a setting; did you mean KB_AGENT_TOP_K?"."""
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    if where == ".env":
        (tmp_path / ".env").write_text(f"{name}=3\n", encoding="utf-8")
        origin = ".env"
    else:
        monkeypatch.setenv(name, "3")
        origin = "the environment"
    code, out, err = cli("graph")
    assert code == 0 and out.startswith("flowchart TD")
    assert err == f"crag: warning: {shown} (in {origin}) is not a crag setting; did you mean {meant}?\n"


def test_a_command_suggested_after_index_dir_names_that_index(project: Path, tmp_path: Path) -> None:
    """With ``--index DIR``, the advice "run `python -m crag index PATH` first" (and `roots`,
    `log --show`) named a command that works on another index: the one in the working folder."""
    other = tmp_path / "other index"
    code, out, err = cli("--index", str(other), "ask", "how long are backups kept")
    assert (code, out) == (1, "")
    assert err == (f"crag: error: no index in {other}: run `python -m crag --index '{other}' index PATH` first\n")
    code, out, err = cli("ask", "how long are backups kept", "--kb", "docs", "--index", str(other))
    assert code == 0 and "30 days" in out
    assert f"(`python -m crag --index '{other}' roots` lists its roots" in err
    code, out, err = cli("--index", str(other), "log")
    assert code == 0 and out.endswith(f"`python -m crag --index '{other}' log --show ID` prints one answer in full\n")
    code, _, err = cli("log", "--show", "999", "--index", str(other))
    assert code == 2 and f"(`python -m crag --index '{other}' log` lists them)" in err
    code, _, err = cli("ask", "how long are backups kept")  # the next run has no --index: none is suggested
    assert code == 0 and "--index" not in err


@pytest.mark.parametrize("command", ["ask", "search"])
def test_a_kb_path_that_fails_is_one_error_line_without_the_index_note(
        project: Path, tmp_path_factory: pytest.TempPathFactory, command: str) -> None:
    """``crag --index ../elsewhere ask hi --kb typo`` printed "crag: index ..." and then the
    error: two lines for one failure (SPEC §4: one line)."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # outside the working folder: its index is named
    (elsewhere / "notes").mkdir()
    (elsewhere / "notes" / "n.md").write_text("# Notes\n\nThe archive moves to glacier after a year.\n")
    code, _, err = cli("--index", str(elsewhere / ".crag"), "index", str(elsewhere / "notes"))
    assert code == 0, err
    code, out, err = cli("--index", str(elsewhere / ".crag"), command, "archive", "--kb", "typo")
    assert (code, out) == (1, "")
    assert err == "crag: error: knowledge-base path typo does not exist\n"  # as typed: under the working folder
    # A --kb that indexed something says so, naming the index: no second note about it.
    code, out, err = cli("--index", str(elsewhere / ".crag"), command, "backups", "--kb", "docs")
    assert code == 0 and "30 days" in out
    assert f"into {elsewhere / '.crag'}" in err and "crag: index " not in err
    # Nothing to index: the note says which index was used.
    code, out, err = cli("--index", str(elsewhere / ".crag"), command, "backups", "--kb", "docs")
    assert code == 0 and err == f"crag: index {elsewhere / '.crag'}\n"


@pytest.mark.parametrize("argv", [("ask", "how long are backups kept"), ("chat",)])
def test_a_damaged_index_named_by_index_dir_is_one_error_line(project: Path, tmp_path_factory: pytest.TempPathFactory,
                                                              argv: tuple[str, ...]) -> None:
    """``crag --index /elsewhere ask ...`` over a damaged index printed "crag: index /elsewhere"
    before the error, which names it again (and the advice said the folder twice, as ``--index``
    and as ``(with KB_AGENT_INDEX_DIR=...)``)."""
    elsewhere = tmp_path_factory.mktemp("elsewhere") / ".crag"
    code, _, err = cli("--index", str(elsewhere), "index", "docs")
    assert code == 0, err
    generation = (elsewhere / "CURRENT").read_text().strip()
    for part in (elsewhere / generation).iterdir():
        part.write_bytes(b"not an index " * 10)
    code, out, err = cli("--index", str(elsewhere), *argv, stdin="how long are backups kept\n")
    assert (code, out) == (1, "")
    assert err == (f"crag: error: the index database in {elsewhere / generation} is damaged (file is not a database): "
                   f"run `python -m crag --index {elsewhere} index PATH` to rebuild it\n")


@pytest.mark.parametrize("argv", [("ask", "how long are backups kept"), ("chat",)])
def test_the_index_used_is_still_named_after_a_good_answer(project: Path, tmp_path_factory: pytest.TempPathFactory,
                                                           argv: tuple[str, ...]) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere") / ".crag"
    assert cli("--index", str(elsewhere), "index", "docs")[0] == 0
    code, out, err = cli("--index", str(elsewhere), *argv, stdin="how long are backups kept\n")
    assert code == 0 and "30 days" in out
    assert err == f"crag: index {elsewhere}\n"


@pytest.mark.parametrize("argv", [("ask", "how long are backups kept"), ("search", "backups"), ("index", "docs"),
                                  ("roots",), ("log",), ("graph",), ("chat",)])
def test_a_working_folder_deleted_under_crag_is_one_error_line(project: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               argv: tuple[str, ...]) -> None:
    """A shell still standing in a folder that was deleted (``rm -rf`` from another terminal, a
    checkout that switched branches) made every command end in a ``FileNotFoundError``
    traceback from ``os.getcwd()``; SPEC §4: one ``crag: error:`` line, no traceback."""
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(project / ".crag"))
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    code, out, err = cli(*argv, stdin="how long are backups kept\n")
    assert (code, out) == (1, "")
    assert err == ("crag: error: the working folder no longer exists (it was deleted or moved while this shell was "
                   "in it): cd to a folder that exists and run crag again\n")
    code, out, err = cli("--version")  # what needs no folder still works
    assert code == 0 and out.startswith("crag ")


def test_a_history_file_that_cannot_be_used_is_named_in_plain_words(project: Path) -> None:
    """``--history ""`` (a variable that was never set, ``--history "$HIST"``) was dropped without
    a word and the question asked with no history; a folder or bytes that are not UTF-8 were
    told as Python's ``[Errno 21] Is a directory: 'x'`` and ``'utf-8' codec can't decode...``."""
    code, out, err = cli("ask", "how long are backups kept", "--history", "")
    assert (code, out) == (2, "")
    assert err == ("crag: error: argument --history: an empty path names no file or folder "
                   "(it is not taken for the working directory)\n")
    (project / "turns").mkdir()
    code, out, err = cli("ask", "how long are backups kept", "--history", "turns")
    assert (code, out, err) == (2, "", "crag: error: --history file turns cannot be read (Is a directory)\n")
    (project / "latin1.json").write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    code, out, err = cli("ask", "how long are backups kept", "--history", "latin1.json")
    assert (code, out, err) == (2, "", "crag: error: --history file latin1.json is not UTF-8 text (byte 0xe9 at offset 33): "
                                "save it as UTF-8\n")
    assert logged_questions() == []


@pytest.mark.parametrize(("argv", "said"), [
    (("--json", "ask", "how long are backups kept"),
     "--json is an option of ask: give it after the command's name (python -m crag ask ... --json)"),
    (("--top-k", "2", "search", "backups"),
     "--top-k is an option of search: give it after the command's name (python -m crag search ... --top-k 2)"),
    (("--kb", "docs", "ask", "how long are backups kept"),
     "--kb is an option of ask: give it after the command's name (python -m crag ask ... --kb docs)"),
    (("-m", "llama3", "-c", "ask", "and then?"),
     "-c is an option of ask: give it after the command's name (python -m crag ask ... -c)"),
    (("--exclude=drafts", "index", "docs"),
     "--exclude=drafts is an option of index: give it after the command's name (python -m crag index ... "
     "--exclude=drafts)"),
    (("--json", "graph"), "unrecognized arguments: --json (see python -m crag graph --help)"),
])
def test_an_option_of_a_command_given_before_its_name_says_where_it_goes(
        project: Path, argv: tuple[str, ...], said: str) -> None:
    """``crag --json ask ...`` said "unrecognized arguments: --json (see python -m crag ask
    --help)", whose help lists --json; ``crag --top-k 2 search ...`` said "argument COMMAND:
    invalid choice: '2'"."""
    code, out, err = cli(*argv)
    assert (code, out, err) == (2, "", f"crag: error: {said}\n")
    assert logged_questions() == []


def test_options_of_crag_itself_still_go_before_the_command(project: Path) -> None:
    for argv in (("-m", "llama3", "--index", ".crag", "search", "backups"), ("-mllama3", "search", "backups"),
                 ("--model=llama3", "--ind", ".crag", "search", "backups")):
        code, _, err = cli(*argv)
        assert code == 0, (argv, err)


@pytest.mark.parametrize(("typed", "said"), [
    (("ASK", "how long are backups kept"), "'ASK' is not a crag command; did you mean 'ask'? (commands are lower case)"),
    (("Search", "backups"), "'Search' is not a crag command; did you mean 'search'? (commands are lower case)"),
    (("help",), "'help' is not a crag command: the help is python -m crag --help, or python -m crag COMMAND --help "
                "for one command"),
    (("help", "ask"), "'help' is not a crag command: the help is python -m crag --help, or python -m crag COMMAND "
                      "--help for one command"),
    (("version",), "'version' is not a crag command: the version is python -m crag --version"),
])
def test_a_command_in_capitals_or_help_and_version_as_words_are_answered(project: Path, typed: tuple[str, ...],
                                                                         said: str) -> None:
    """``crag ASK ...`` got the bare list of commands (difflib finds nothing close to 'ASK' in
    'ask'); ``crag help`` and ``crag version``, which git and many tools take, got it too."""
    code, out, err = cli(*typed)
    assert (code, out) == (2, "")
    assert err == f"crag: error: {said}\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device that is always full")
@pytest.mark.parametrize("argv", [("--help",), ("-h",), ("ask", "--help"), ("search", "-h"), ("--version",), ()])
def test_help_that_cannot_be_written_is_one_error_line(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """``crag --help > /dev/full`` (a full disk) ended with exit status 0 and not a word:
    argparse drops a failed write of the help, so the user had no help and no error."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    environ.update(PYTHONPATH=str(ROOT), KB_AGENT_LLM="offline")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "crag", *argv], cwd=tmp_path, env=environ, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (1, "crag: error: cannot write the output (No space left on device): "
                                                 "free some space, or send the output elsewhere\n")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full, a device that is always full")
@pytest.mark.parametrize(("argv", "environ", "code"), [
    (("ask", "--wat", "hi"), {}, 2), (("ask", ""), {}, 2), (("ask", "hi"), {"KB_AGENT_MAX_ITERATIONS": "lots"}, 2),
    (("ask", "where are backups kept", "--index", "nowhere"), {}, 1),
])
def test_an_error_line_stderr_cannot_take_keeps_the_exit_status(tmp_path: Path, argv, environ, code) -> None:
    """``crag ask "" 2>/dev/full`` exited 1: the error line's failed write (a traceback no one
    saw) took the place of the usage error's status 2. Scripts read the status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update(PYTHONPATH=str(ROOT), KB_AGENT_LLM="offline", **environ)
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "crag", *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=full, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (code, "")


def test_a_question_file_saved_with_a_byte_order_mark_is_read_without_it(project: Path) -> None:
    """``crag ask - < question.txt`` of a file saved by an editor that writes a byte order mark
    asked "\\ufeffhow long are backups kept": an invisible character at the head of the question,
    sent to the model, logged and printed back by ``--json``."""
    code, out, err = cli("ask", "-", "--json", stdin="\ufeffhow long are backups kept\n")
    assert code == 0, err
    assert json.loads(out)["question"] == "how long are backups kept"
    code, out, err = cli("chat", stdin="\ufeffwhere are backups written\n")  # `crag chat < questions.txt`
    assert code == 0 and "30 days" in out, err
    assert logged_questions() == ["where are backups written", "how long are backups kept"]


def test_removing_a_path_that_is_no_root_names_the_roots_as_roots_lists_them(project: Path, tmp_path: Path) -> None:
    """``crag roots`` listed "docs" while ``crag roots --remove doc`` answered "/tmp/.../doc is not
    a root of the index (its roots: /tmp/.../docs)": SPEC §4's paths relative to the working
    directory when under it, absolute otherwise, hold for messages as for listings."""
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "n.md").write_text("# N\n\nThe archive moves to glacier after a year.\n", encoding="utf-8")
    assert cli("index", str(outside))[0] == 0
    code, out, err = cli("roots")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == [str(outside), "docs"]
    code, out, err = cli("roots", "--remove", "doc")
    assert (code, out) == (1, "")
    assert err == f"crag: error: doc is not a root of the index (its roots: {outside}, docs)\n"
    code, out, err = cli("index", "doc")  # the path a user typed, as crag shows every path under the working folder
    assert (code, out, err) == (1, "", "crag: error: knowledge-base path doc does not exist\n")
    code, out, err = cli("roots", "--remove", str(tmp_path.parent / "elsewhere"))
    assert err == f"crag: error: {tmp_path.parent / 'elsewhere'} is not a root of the index (its roots: {outside}, docs)\n"


def test_every_knowledge_base_path_error_names_the_path_as_crag_shows_paths(project: Path) -> None:
    """``crag index .crag`` said "knowledge-base path /home/me/proj/.crag is crag's index
    folder", and a named pipe "/home/me/proj/queue is not a file or folder", while a path that
    does not exist was already named as typed (``typo``): every such line names the path as
    crag shows paths, relative to the working folder when under it."""
    os.mkfifo(project / "queue")
    for path, said in ((".crag", "is crag's index folder or inside it: give the folders of your documents"),
                       ("queue", "is not a file or folder")):
        code, out, err = cli("index", path)
        assert (code, out, err) == (1, "", f"crag: error: knowledge-base path {path} {said}\n"), path
