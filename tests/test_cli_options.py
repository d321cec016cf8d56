"""Index discovery (the nearest ``.crag``, as git finds ``.git``) and the options every command
takes: ``-m/--model``, ``--index DIR``, the program's own name in messages, warnings about
``.env`` and unknown ``KB_AGENT_*`` names, and errors that say where a bad value came from."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from crag.cli import main
from crag.config import Settings, config_warnings, find_index_dir
from tests.fakes import clean_env
from tests.openai_server import FakeOpenAIServer

DOC = "# Deploy\n\nRun docker compose up to deploy the server.\n"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with docs indexed into its own ./.crag; the working directory is the project."""
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "docs" / "deploy.md").write_text(DOC, encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("index", "docs")
    assert code == 0 and "into .crag" in out  # nothing found above: ./.crag is created
    return tmp_path


def test_a_subfolder_finds_the_index_of_its_project_and_says_which(project: Path, monkeypatch) -> None:
    monkeypatch.chdir(project / "docs" / "guides")
    assert find_index_dir() == str(project / ".crag")
    code, out, err = cli("ask", "How do I deploy the server?")
    assert code == 0 and "docker compose up" in out
    assert f"crag: index {project / '.crag'}" in err
    code, out, _ = cli("ask", "How do I deploy the server?", "--json")
    assert json.loads(out)["index"] == str(project / ".crag")
    code, out, _ = cli("roots")
    assert code == 0 and f"1 root in {project / '.crag'}" in out
    code, out, _ = cli("search", "deploy", "--json")
    assert code == 0 and json.loads(out)[0]["path"] == str(project / "docs" / "deploy.md")


def test_a_subfolder_is_told_the_dotenv_of_its_project_is_not_read(project: Path, monkeypatch) -> None:
    """Only the working folder's .env is read: from a subfolder, the project's (beside the index
    found above) was passed over without a word, so a search ran with the hash embedder and was
    told to rebuild the project's index with it, and a question was answered offline."""
    (project / ".env").write_text("# the project's\nKB_AGENT_TOP_K=2\nKB_AGENT_MODEL=llama3.1\nOTHER=1\n", encoding="utf-8")
    monkeypatch.chdir(project / "docs" / "guides")
    code, _, err = cli("search", "deploy")
    assert code == 0 and err == (
        f"crag: warning: {project / '.env'} is not read here, only the working folder's .env is: its "
        f"KB_AGENT_TOP_K, KB_AGENT_MODEL are not used; run crag in {project}, or set them in the environment\n"
        f"crag: index {project / '.crag'}\n")
    monkeypatch.setenv("KB_AGENT_TOP_K", "2")
    monkeypatch.setenv("KB_AGENT_MODEL", "llama3.1")  # set in the environment: nothing differs
    assert "warning" not in cli("search", "deploy")[2]
    monkeypatch.delenv("KB_AGENT_MODEL")
    assert "its KB_AGENT_MODEL is not used" in cli("search", "deploy")[2]
    (project / "docs" / "guides" / ".env").write_text("KB_AGENT_TOP_K=3\n", encoding="utf-8")  # a .env of its own
    assert "warning" not in cli("search", "deploy")[2]
    monkeypatch.chdir(project)
    assert "warning" not in cli("search", "deploy")[2]


def test_a_subfolder_is_told_the_dotenv_above_it_that_places_the_index_is_not_read(tmp_path: Path, monkeypatch) -> None:
    """A project whose .env sets KB_AGENT_INDEX_DIR has no .crag to find: from its subfolder,
    crag said "no index in .crag (nor a .crag in any parent folder)" without a word of that .env,
    and `crag index` made a second index there; with an index found further up (~/.crag), that
    one was searched instead of the project's."""
    project = tmp_path / "home" / "proj"
    (project / "docs" / "guides").mkdir(parents=True)
    (project / "docs" / "deploy.md").write_text(DOC, encoding="utf-8")
    (project / ".env").write_text("KB_AGENT_INDEX_DIR=idx\nKB_AGENT_TOP_K=2\n", encoding="utf-8")
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(project)
    assert cli("index", "docs")[0] == 0 and (project / "idx" / "CURRENT").exists()
    monkeypatch.chdir(project / "docs" / "guides")
    warning = (f"crag: warning: {project / '.env'} is not read here, only the working folder's .env is: its "
               f"KB_AGENT_INDEX_DIR, KB_AGENT_TOP_K are not used; run crag in {project}, or set them in the environment")
    code, _, err = cli("search", "deploy")
    assert code == 1 and err.splitlines()[0] == warning, err
    monkeypatch.chdir(tmp_path / "home")
    assert cli("index", str(project / "docs"))[0] == 0  # an index above the project: ~/.crag
    monkeypatch.chdir(project / "docs" / "guides")
    code, _, err = cli("search", "deploy")
    assert code == 0 and err.splitlines()[0] == warning, err
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(project / "idx"))  # set in the environment: nothing differs
    assert "warning" not in cli("search", "deploy")[2]
    monkeypatch.delenv("KB_AGENT_INDEX_DIR")
    # a .env nearer that leaves the name empty says nothing of where the index is (.crag, as
    # unset): it was named instead of the project's, and "run crag in docs" changed nothing
    (project / "docs" / ".env").write_text("KB_AGENT_INDEX_DIR=\n", encoding="utf-8")
    code, _, err = cli("search", "deploy")
    assert code == 0 and err.splitlines()[0] == warning, err


def test_index_dir_from_the_environment_or_index_option_wins_over_the_search(project: Path, monkeypatch) -> None:
    monkeypatch.chdir(project / "docs")
    code, out, _ = cli("--index", str(project / "elsewhere"), "roots")
    assert code == 0 and "no roots in" in out and "elsewhere" in out
    code, out, _ = cli("roots", "--index", str(project / ".crag"))
    assert code == 0 and "1 root in" in out
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(project / "other"))
    code, _, err = cli("ask", "How do I deploy?")
    assert code == 1 and "no index in" in err and "other" in err
    assert Settings.from_env(dotenv=None).index_dir == str(project / "other")


@pytest.mark.parametrize("argv", [("search", "deploy"), ("ask", "How do I deploy?"), ("chat",)])
def test_no_index_outside_the_working_directory_is_one_line_not_a_note_and_an_error(project: Path, monkeypatch,
                                                                                 argv: tuple[str, ...]) -> None:
    """``crag: index /elsewhere`` came before ``crag: error: no index in /elsewhere``: two lines for
    one failure, the second naming the folder already."""
    monkeypatch.chdir(project / "docs")
    code, out, err = cli("--index", str(project / "elsewhere"), *argv)
    assert code == 1 and not out
    assert err.splitlines() == [f"crag: error: no index in {project / 'elsewhere'}: run `python -m crag --index "
                                f"{project / 'elsewhere'} index PATH` first"], err


def test_an_index_in_the_working_directory_itself_needs_no_note(project: Path) -> None:
    """``--index .`` said "crag: index /the/working/folder", as for an index found elsewhere."""
    assert cli("--index", ".", "index", "docs")[0] == 0
    code, out, err = cli("--index", ".", "ask", "How do I deploy the server?")
    assert code == 0 and "docker compose up" in out and err == "", err


def test_from_the_root_folder_every_index_and_log_is_under_it_and_needs_no_note(project: Path, monkeypatch) -> None:
    """From ``/``, "crag: index tmp/.../.crag" and "crag: log tmp/.../log.sqlite" were said on
    stderr, as for an index outside the working folder: the test looked for "//" at the start."""
    assert cli("ask", "How do I deploy the server?")[0] == 0  # a log beside the index
    monkeypatch.chdir("/")
    code, out, err = cli("--index", str(project / ".crag"), "search", "deploy")
    assert code == 0 and out.startswith(f"1. {str(project / 'docs' / 'deploy.md').lstrip('/')}:") and err == "", err
    code, out, err = cli("--index", str(project / ".crag"), "log")
    assert code == 0 and "How do I deploy the server?" in out and err == "", err


def test_an_index_kept_in_the_project_folder_indexes_the_folder_and_its_roots_again(project: Path) -> None:
    """docs/cli.md: ``--index .`` leaves the project's documents indexable (``crag --index .
    index docs``, or ``.``). After ``index docs``, ``index .`` was exit status 1, "knowledge-base
    path docs is crag's index folder" (its files had been found through ``.`` already); and
    indexing ``.`` listed crag's own files as "skipped by type: 3 no suffix, 1 .sqlite, 1 .faiss"."""
    assert cli("--index", ".", "index", "docs")[0] == 0
    cli("--index", ".", "ask", "How do I deploy the server?")  # the answer log is one of crag's files too
    for _ in range(2):
        code, out, err = cli("--index", ".", "index", ".")
        assert (code, err) == (0, ""), err
        assert "skipped" not in out, out
    code, out, err = cli("--index", ".", "index", "docs")
    assert (code, err) == (0, ""), err
    code, out, _ = cli("--index", ".", "search", "deploy")
    assert code == 0 and "docs/deploy.md" in out


@pytest.mark.parametrize("where", ["dotenv", "environment", "option"])
def test_an_index_dir_under_the_home_folder_written_with_a_tilde_is_there(project: Path, monkeypatch,
                                                                          tmp_path_factory, where: str) -> None:
    """No shell expands ``~`` in ``.env`` (nor in a quoted ``--index '~/x'``): crag made a folder
    named ``~`` in the working directory and put the index there."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    if where == "dotenv":
        (project / ".env").write_text("KB_AGENT_INDEX_DIR=~/kb-index\n", encoding="utf-8")
    elif where == "environment":
        monkeypatch.setenv("KB_AGENT_INDEX_DIR", "~/kb-index")
    code, _, err = cli(*(("--index", "~/kb-index") if where == "option" else ()), "index", "docs")
    assert code == 0, err
    assert (home / "kb-index" / "CURRENT").is_file() and not (project / "~").exists()


@pytest.mark.parametrize("value", ["$HOME/kb-index", "${HOME}/kb-index", "/srv/$USER/kb-index"])
def test_an_index_dir_with_a_shell_variable_is_refused_not_made_a_folder(project: Path, monkeypatch,
                                                                         value: str) -> None:
    """Nothing expands ``$HOME`` in ``.env`` (nor in a systemd ``Environment=``): crag made a folder
    named ``$HOME`` (or ``${HOME}``) in the working directory and put the index there."""
    monkeypatch.setenv("USER", "ada")  # as a login shell sets it: /srv/$USER may be on disk, made so before
    (project / ".env").write_text(f"KB_AGENT_INDEX_DIR={value}\n", encoding="utf-8")
    code, out, err = cli("index", "docs")
    assert (code, out) == (2, "") and err == (
        f"crag: error: KB_AGENT_INDEX_DIR={value} is not valid: expected a folder's path, in which $VARIABLES "
        "are not expanded (write ~ for your home folder) (set in .env)\n")
    assert sorted(p.name for p in project.iterdir()) == [".crag", ".env", "docs"]


@pytest.mark.parametrize("where", ["environment", "option"])
def test_an_index_dir_in_a_folder_whose_name_holds_a_dollar_is_used(project: Path, monkeypatch, where: str) -> None:
    """A folder that is named ``my$idx`` on disk, written in quotes (``--index 'my$idx/.crag'``),
    was refused as a ``$VARIABLE`` nothing expanded, though the shell had read it as meant."""
    (project / "my$idx").mkdir()
    if where == "environment":
        monkeypatch.setenv("KB_AGENT_INDEX_DIR", "my$idx/.crag")
    code, _, err = cli(*(("--index", "my$idx/.crag") if where == "option" else ()), "index", "docs")
    assert code == 0, err
    assert (project / "my$idx" / ".crag" / "CURRENT").is_file()


def test_model_option_overrides_the_setting_for_one_call(project: Path, monkeypatch) -> None:
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KB_AGENT_LLM", "openai")
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("KB_AGENT_MODEL", "configured-model")
        srv.default("analyze_and_route", json.dumps({"complexity": "chitchat", "suggested_tools": []}))
        srv.default("synthesize", "Hello.")
        code, out, err = cli("ask", "-m", "my-model", "hello", "--json")
        assert code == 0, err
        assert json.loads(out)["usage"]["model"] == "my-model"
        assert {r.body["model"] for r in srv.requests if isinstance(r.body, dict)} == {"my-model"}
        code, out, _ = cli("--model", "other-model", "ask", "hello", "--json")
        assert json.loads(out)["usage"]["model"] == "other-model"
        code, out, _ = cli("ask", "hello", "--json")
        assert json.loads(out)["usage"]["model"] == "configured-model"
    code, _, err = cli("ask", "-m", " ", "hello")
    assert code == 2 and "KB_AGENT_MODEL" in err and "given as an argument" in err


def test_a_model_the_server_does_not_know_is_named_as_it_was_given(project: Path, monkeypatch) -> None:
    """``crag ask -m llama3.1:8b ...`` against a server without that model said "check
    KB_AGENT_MODEL (llama3.1:8b)": the setting was not where the name came from."""
    from tests.openai_server import Status

    monkeypatch.setenv("KB_AGENT_LLM", "openai")
    monkeypatch.setenv("KB_AGENT_MODEL", "configured-model")
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        srv.default("analyze_and_route", Status(404))
        for argv in (("ask", "-m", "llama3.1:8b", "hello"), ("--model", "llama3.1:8b", "ask", "hello")):
            code, _, err = cli(*argv)
            assert code == 1 and err.count("\n") == 1, err
            assert "answered 404 for node analyze_and_route: check -m/--model (llama3.1:8b) and OPENAI_BASE_URL" in err
        code, _, err = cli("ask", "hello")  # the setting's own model: the setting is named
        assert "answered 404 for node analyze_and_route: check KB_AGENT_MODEL (configured-model) and OPENAI_BASE_URL" in err


def test_messages_name_the_program_as_it_was_run(tmp_path: Path, monkeypatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/crag"])
    _, _, err = cli("ask", "anything")
    assert "`crag index PATH`" in err and "python -m crag" not in err
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/crag/__main__.py"])
    _, _, err = cli("ask", "anything")
    assert "`python -m crag index PATH`" in err


def test_dotenv_lines_that_are_not_assignments_and_unknown_names_are_warned_about(tmp_path: Path, monkeypatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("KB_AGENT_TOPK=3\nKB_AGENT_LLM offline\n# a comment\n\nKB_AGENT_LLM=offline\n")
    monkeypatch.setenv("KB_AGENT_GROUDNING", "strict")
    code, _, err = cli("graph")
    assert code == 0
    assert "crag: warning: .env line 2 is not an assignment (NAME=value); it is ignored" in err
    assert "KB_AGENT_TOPK (in .env) is not a crag setting; did you mean KB_AGENT_TOP_K?" in err
    assert "KB_AGENT_GROUDNING (in the environment) is not a crag setting; did you mean KB_AGENT_GROUNDING?" in err
    assert config_warnings(environ={}, dotenv=None) == []


@pytest.mark.parametrize("where", ["environment", ".env"])
def test_a_bad_value_says_where_it_came_from(tmp_path: Path, monkeypatch, where: str) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    if where == ".env":
        (tmp_path / ".env").write_text("KB_AGENT_MAX_ITERATIONS=lots\n")
    else:
        monkeypatch.setenv("KB_AGENT_MAX_ITERATIONS", "lots")
    code, _, err = cli("ask", "anything")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("crag: error: KB_AGENT_MAX_ITERATIONS=lots is not valid: expected an integer from 1 to 100")
    assert f"(set in {'the environment' if where == 'environment' else '.env'})" in err


# -- values sent to a server must be UTF-8 ----------------------------------------------------


def test_a_model_name_that_is_not_utf8_is_one_line_naming_the_option(project: Path) -> None:
    code, out, err = cli("ask", "-m", "caf\udce9", "How do I deploy?")  # as Python reads $'caf\xe9'
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("crag: error: KB_AGENT_MODEL=caf\\xe9 is not valid: expected UTF-8 text")
    assert "given as an argument" in err


@pytest.mark.parametrize(("var", "value"), [
    ("KB_AGENT_MODEL", "caf\udce9"), ("KB_AGENT_EMBEDDING_MODEL", "emb\udce9"), ("JIRA_EMAIL", "ada\udce9@example.com"),
    ("CONFLUENCE_EMAIL", "ada\udce9@example.com"), ("KB_AGENT_STORE", "postgresql://u:pw@db/caf\udce9"),
    ("OPENAI_BASE_URL", "http://caf\udce9/v1"), ("OPENAI_API_KEY", "sk-caf\udce9"), ("JIRA_API_TOKEN", "tok\udce9"),
])
def test_a_setting_sent_to_a_server_that_is_not_utf8_is_a_usage_error(project: Path, monkeypatch, var: str,
                                                                      value: str) -> None:
    monkeypatch.setenv(var, value)
    code, out, err = cli("ask", "How do I deploy?")
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith(f"crag: error: {var}")
    assert "(set in the environment)" in err and "pw" not in err.split(var, 1)[1].split("is not valid")[0]


# -- .env is read once, and its warnings are bounded ---------------------------------------------


def test_dotenv_is_parsed_once_however_many_lines_are_printed(project: Path, monkeypatch) -> None:
    import os

    for n in range(12):
        assert cli("ask", f"How do I deploy, question {n}?")[0] == 0
    env = project / ".env"
    env.write_text("".join(f"OTHER_PROGRAM_{i}=value {i}\n" for i in range(3000)) + "GITHUB_TOKEN=ghp_Env0123456789abcdef\n")
    # A .env changed in the last two seconds is parsed at every read (it may change again within
    # the same tick of the file system's clock); this one counts as older.
    monkeypatch.setattr("crag.environment._RACY_NS", 0, raising=False)
    opened = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        if os.fspath(path) == ".env":
            opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    code, out, _ = cli("log", "-n", "12")
    assert code == 0 and out.count("\n#") + out.startswith("#") == 12
    # Not once for every printed line (12); a second parse can happen when the process's cache of
    # .env reads let this one go (one run in five of the whole suite): still far from one a line.
    assert len(opened) <= 2


def test_a_changed_dotenv_is_read_again_even_with_the_same_size_and_time(tmp_path: Path) -> None:
    import os

    from crag.config import secret_values

    env = tmp_path / ".env"
    env.write_text("GITHUB_TOKEN=ghp_First0123456789\n")
    os.utime(env, (1_600_000_000, 1_600_000_000))
    assert secret_values(environ={}, dotenv=env) == ("ghp_First0123456789",)
    env.write_text("GITHUB_TOKEN=ghp_Other0123456789\n")
    os.utime(env, (1_600_000_000, 1_600_000_000))  # same size, same modification time
    assert secret_values(environ={}, dotenv=env) == ("ghp_Other0123456789",)


def test_thousands_of_unknown_names_are_warned_about_boundedly(tmp_path: Path, monkeypatch) -> None:
    import difflib

    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("".join(f"KB_AGENT_UNKNOWN_{i}=x\n" for i in range(30_000))
                                   + "".join(f"not an assignment {i}\n" for i in range(50)))
    looked_up = []
    real = difflib.get_close_matches
    monkeypatch.setattr(difflib, "get_close_matches", lambda *a, **k: looked_up.append(a[0]) or real(*a, **k))
    code, _, err = cli("graph")
    lines = err.splitlines()
    assert code == 0 and len(lines) == 42 and all(line.startswith("crag: warning: ") for line in lines)
    assert "29,980 more KB_AGENT_* names are not crag settings" in lines[-1]
    assert "30 more lines of .env are not assignments" in err
    assert len(looked_up) <= 20


def test_an_index_option_naming_a_file_is_named_as_the_option_too(project: Path) -> None:
    (project / "notes.txt").write_text("not an index\n")
    code, out, err = cli("--index", str(project / "notes.txt"), "search", "retries")
    assert code == 1 and not out
    assert err.count("\n") == 1 and "is a file, not an index folder" in err and "--index" in err


def test_the_index_option_while_the_store_setting_names_a_database_is_said_to_be_unused(
    project: Path, monkeypatch
) -> None:
    """``KB_AGENT_STORE`` chooses where the index lives (SPEC §3); ``--index DIR`` overrides
    KB_AGENT_INDEX_DIR, which a database does not use: the command says so instead of ignoring
    the option silently, and never shows the database's password."""
    monkeypatch.setenv("KB_AGENT_STORE", "postgresql://crag:sekret@127.0.0.1:9/kb")
    _, out, err = cli("roots", "--index", str(project / ".crag"))
    assert "crag: warning: --index DIR is not used while KB_AGENT_STORE names a database" in err
    assert "sekret" not in out + err


@pytest.mark.parametrize("value", ["1_0", "\uff15", "\u0663"])
def test_a_count_on_the_command_line_is_written_in_ascii_digits_as_in_the_environment(value, tmp_path, monkeypatch):
    """``--top-k 1_0`` returned 10 hits and ``--top-k ５`` five, while KB_AGENT_TOP_K refuses both."""
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    assert main(["search", "widget", "--top-k", value], io.StringIO(), err) == 2
    assert err.getvalue() == f"crag: error: argument --top-k: invalid int value: {value!r}\n"
