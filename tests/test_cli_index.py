"""``python -m crag index`` and ``python -m crag search`` as a user runs them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crag.cli import main

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "docs"
    write(root / "setup.md", "# Setup\n\n## Retries\n\nThe client retries failed uploads three times.\n")
    write(root / "deploy.md", "# Deploy\n\nRun the container with docker compose up.\n")
    for key in list(os.environ):
        if key.startswith(("KB_AGENT_", "OPENAI_", "JIRA_", "CONFLUENCE_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.chdir(tmp_path)
    return root


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def test_index_prints_what_changed_and_is_incremental(kb: Path) -> None:
    code, out, err = cli("index", "docs")
    assert code == 0 and err == ""  # no progress: stderr is not a terminal
    assert "2 added, 0 changed, 0 removed, 0 unchanged" in out and "docs/setup.md" in out
    code, out, _ = cli("index", "docs")
    assert code == 0 and "0 added, 0 changed, 0 removed, 2 unchanged" in out and "already up to date" in out
    write(kb / "deploy.md", "# Deploy\n\nRun it on kubernetes instead.\n")
    os.utime(kb / "deploy.md", (1, 1))
    (kb / "setup.md").unlink()
    code, out, _ = cli("index", "docs")
    assert "0 added, 1 changed, 1 removed, 0 unchanged" in out
    assert "changed:\n  docs/deploy.md" in out and "removed:\n  docs/setup.md" in out


def test_an_edit_that_keeps_size_and_modification_time_is_seen(kb: Path) -> None:
    """One byte changed and the modification time set back (an editor, a restore, a build tool
    that keeps times): the index kept the old text, and answers cited words no longer there."""
    cli("index", "docs")
    deploy = kb / "deploy.md"
    before = deploy.stat()
    deploy.write_text(deploy.read_text(encoding="utf-8").replace("docker", "DOCKER"), encoding="utf-8")
    os.utime(deploy, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (deploy.stat().st_size, deploy.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    code, out, _ = cli("index", "docs")
    assert code == 0 and "0 added, 1 changed, 0 removed, 1 unchanged" in out and "changed:\n  docs/deploy.md" in out
    _, out, _ = cli("search", "compose", "--json")
    assert "DOCKER compose" in json.loads(out)[0]["text"]
    os.chmod(deploy, 0o600)  # the status changes, the text does not: read again, not re-embedded
    code, out, _ = cli("index", "docs")
    assert code == 0 and "0 added, 0 changed, 0 removed, 2 unchanged; 0 chunks embedded" in out


def test_a_question_while_the_first_index_is_built_says_it_is_being_built(kb: Path, tmp_path: Path) -> None:
    """``ask`` or ``search`` while the first ``crag index`` runs said "no index: run `python -m
    crag index PATH` first", to a user who just did."""
    from crag.index.layout import IndexLock

    (tmp_path / "index").mkdir()
    with IndexLock(str(tmp_path / "index")):
        code, out, err = cli("search", "docker")
    assert (code, out) == (1, "")
    assert err == (f"crag: error: no index in {tmp_path / 'index'} yet: a crag index is building it now; "
                   "try again when it has finished\n")
    assert not (tmp_path / "index" / "LOCK").exists()  # let go, and a reader leaves nothing behind
    code, _, err = cli("search", "docker")
    assert code == 1 and "run `python -m crag index PATH` first" in err


def test_index_says_so_when_the_embedder_changed(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index built by a crag whose hash embedder had 2,048 dimensions is re-embedded at today's 1,008."""
    import crag.index.embedders as embedders

    with monkeypatch.context() as older:
        older.setattr(embedders, "DEFAULT_HASH_DIM", 2048)
        older.setattr(embedders.HashEmbedder.__init__, "__defaults__", (2048, embedders.BIGRAM_WEIGHT))
        cli("index", "docs")
    code, out, _ = cli("index", "docs")
    assert code == 0
    assert out.startswith("re-embedded everything: the index was built with hash:v1:2048, the configured embedder is hash:v1:1008\n")
    assert "0 added, 2 changed" in out


def test_search_json_prints_only_the_hits_best_first(kb: Path) -> None:
    cli("index", "docs")
    code, out, err = cli("search", "how many times are uploads retried", "--json", "--top-k", "2")
    assert code == 0 and err == ""
    hits = json.loads(out)
    assert 1 <= len(hits) <= 2
    assert set(hits[0]) == {"path", "start_line", "end_line", "score", "text"}
    assert hits[0]["path"] == "docs/setup.md" and hits[0]["start_line"] == 1
    assert "three times" in hits[0]["text"] and 0 <= hits[0]["score"] <= 1


def test_search_plain_output_is_a_ranked_list(kb: Path) -> None:
    cli("index", "docs")
    code, out, _ = cli("search", "docker compose")
    assert code == 0 and out.startswith("1. docs/deploy.md:L1-L3  score ")


def test_search_kb_indexes_new_roots_first_and_stays_inside_them(kb: Path, tmp_path: Path) -> None:
    other = write(tmp_path / "other" / "compose.md", "# Compose\n\nAnother note about docker compose files.\n").parent
    cli("index", "docs")
    code, out, err = cli("search", "docker compose", "--kb", str(other), "--json")
    assert code == 0 and "1 added" in err
    assert [h["path"] for h in json.loads(out)] == ["other/compose.md"]
    code, out, err = cli("search", "docker compose", "--kb", "other", "--json")
    assert err == ""  # nothing new to index
    code, out, _ = cli("search", "docker compose", "--json")
    assert {h["path"] for h in json.loads(out)[:2]} == {"other/compose.md", "docs/deploy.md"}


def test_a_link_to_nothing_given_as_a_root_is_named_as_given(kb: Path, tmp_path: Path) -> None:
    """``--kb notes`` with notes a symbolic link to a folder since moved said "knowledge-base
    path moved-away does not exist", a path the user never typed; ``crag index notes`` too."""
    os.symlink("moved-away", tmp_path / "notes")
    cli("index", "docs")  # an index to check --kb against, as ask and search do first
    for argv in (("index", "notes"), ("search", "port", "--kb", "notes", "--json"), ("ask", "port", "--kb", "notes")):
        code, out, err = cli(*argv)
        assert (code, out) == (1, "") and err == (
            "crag: error: knowledge-base path notes is a symbolic link to moved-away, which does not exist\n"), err


def test_a_link_to_a_pipe_or_device_given_as_a_root_is_named_as_given(kb: Path, tmp_path: Path) -> None:
    """``crag index notes.md`` with notes.md a symbolic link to ``/dev/zero`` said "knowledge-base
    path /dev/zero is not a file or folder", a path the user never typed; a pipe given as
    itself is named as before."""
    os.mkfifo(tmp_path / "queue")
    os.symlink("queue", tmp_path / "notes.md")
    os.symlink(os.devnull, tmp_path / "null.md")
    cli("index", "docs")  # an index to check --kb against, as ask and search do first
    said = {"notes.md": "notes.md is a symbolic link to queue, which is not a file or folder",
            "null.md": f"null.md is a symbolic link to {os.devnull}, which is not a file or folder",
            "queue": "queue is not a file or folder"}
    for path, why in said.items():
        for argv in (("index", path), ("search", "port", "--kb", path, "--json")):
            code, out, err = cli(*argv)
            assert (code, out, err) == (1, "", f"crag: error: knowledge-base path {why}\n"), argv


def test_errors_are_one_line_with_the_right_exit_status(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = cli("search", "anything")
    assert code == 1 and out == ""
    assert err.startswith("crag: error: no index in ") and err.count("\n") == 1 and "python -m crag index PATH" in err
    code, _, err = cli("index", "no-such-folder")
    assert code == 1 and "no-such-folder does not exist" in err
    cli("index", "docs")
    monkeypatch.setenv("KB_AGENT_EMBEDDER", "openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    code, _, err = cli("search", "anything")
    assert code == 1
    assert err == (
        "crag: error: index was built with hash:v1:1008, configured embedder is openai:text-embedding-3-small: "
        "run `python -m crag index docs` to re-index\n"
    )
    monkeypatch.delenv("KB_AGENT_EMBEDDER")
    code, _, err = cli("search", "x", "--top-k", "0")
    assert code == 2 and "--top-k must be at least 1" in err


def test_the_re_index_advice_for_a_root_named_like_an_option_runs_as_written(kb: Path, monkeypatch) -> None:
    """A root named ``-docs`` was advised as `python -m crag index -docs`, which is a usage error."""
    write(kb.parent / "-docs" / "notes.md", "# Notes\n\nThe dashboard shows upload retries.\n")
    assert cli("index", "--", "-docs")[0] == 0
    monkeypatch.setenv("KB_AGENT_EMBEDDER", "openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    code, _, err = cli("search", "retries")
    assert code == 1 and err.endswith(": run `python -m crag index ./-docs` to re-index\n"), err
    monkeypatch.delenv("KB_AGENT_EMBEDDER")
    assert cli("index", "./-docs")[0] == 0


def test_search_json_through_a_real_process(kb: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update(KB_AGENT_INDEX_DIR=str(tmp_path / "proc-index"), KB_AGENT_LLM="offline", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-m", "crag", "search", "retries for failed uploads", "--kb", "docs", "--json", "--top-k", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    hits = json.loads(run.stdout)
    assert len(hits) == 1 and hits[0]["path"] == "docs/setup.md" and "retries" in hits[0]["text"]
    assert "2 added" in run.stderr


def test_index_and_tools_packages_import_no_heavy_library() -> None:
    code = (
        "import sys, crag.cli, crag.index, crag.tools, crag.cli.index_text; crag.cli.build_parser(); "
        "print(sorted(m for m in ('numpy', 'faiss', 'tiktoken', 'openai') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_shown_on_a_terminal_only(kb: Path) -> None:
    out, err = io.StringIO(), FakeTerminal()
    assert main(["index", "docs"], out, err) == 0
    shown = err.getvalue()
    assert "\rindexing 1/2: deploy.md" in shown and "\rindexing 2/2: setup.md" in shown
    assert shown.endswith("\r") and "indexing" not in out.getvalue().split("\n")[1:]
    assert "2 added" in out.getvalue()


def test_kb_indexing_progress_on_a_terminal_reads_like_index_progress(kb: Path) -> None:
    """``ask --kb`` drew "crag: indexing 1 2 /abs/path/deploy.md": the count and the name as
    ``crag index`` shows them are "1/2: deploy.md". Piped or with ``--json``, ``ask`` shows
    none of its progress, the indexing line included: only the note of what was indexed."""
    out, err = FakeTerminal(), FakeTerminal()
    assert main(["ask", "how are uploads retried?", "--kb", "docs"], out, err) == 0
    shown = err.getvalue()
    assert "crag: indexing 1/2: deploy.md" in shown and "crag: indexing 2/2: setup.md" in shown, shown
    assert str(kb) not in shown
    for argv, out in ((["ask", "how are uploads retried?"], io.StringIO()),
                      (["ask", "--json", "how are uploads retried?"], FakeTerminal())):
        write(kb / "setup.md", (kb / "setup.md").read_text() + "\nMore.\n")  # something to index again
        err = FakeTerminal()
        assert main([*argv, "--kb", "docs"], out, err) == 0
        assert "\r" not in err.getvalue() and err.getvalue().startswith("crag: indexed docs into "), err.getvalue()


def test_indexing_progress_fits_the_terminal_width(kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A progress line wider than the terminal wraps, and ``\\r`` then returns to its last row
    only: every file left a line behind. The line is clipped to the terminal's width (in
    columns: a wide character takes two), for ``crag index`` and ``ask --kb`` alike."""
    import shutil

    from crag.cli.live import width

    write(kb / ("2024-01-15-meeting-notes-with-the-infrastructure-team-" + "会议" * 10 + ".md"),
          "# Notes\n\nThe gateway moves to the new cluster in March.\n")
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size((40, 24)))
    for argv in (["index", "docs"], ["ask", "--kb", "docs", "--index", "other", "when does the gateway move?"]):
        err = FakeTerminal()
        assert main(argv, FakeTerminal(), err) == 0
        rows = [row.replace("\033[K", "") for row in err.getvalue().split("\r")]
        assert any("indexing 1/3" in row for row in rows), rows
        assert all(sum(width(ch) for ch in row) < 40 for row in rows if "indexing" in row), rows



def test_search_kb_says_what_it_indexed_in_the_one_line_ask_kb_writes(kb: Path) -> None:
    """``search --kb`` wrote ``crag index``'s whole report on stderr (``indexed 1 path(s) ...``,
    ``added:`` and a line per file, no ``crag: `` prefix) where ``ask --kb`` writes one line;
    and, as ``ask --kb``, it draws the indexing line on a terminal, not piped or with ``--json``."""
    code, _, err = cli("search", "--json", "--kb", "docs", "docker compose")
    assert code == 0 and err.splitlines() == [
        "crag: indexed docs into index: 2 added, 0 changed, 0 removed, 2 chunks in the index "
        "(`python -m crag roots` lists its roots, `python -m crag roots --remove PATH` drops one)"], err
    write(kb / "setup.md", (kb / "setup.md").read_text() + "\nMore.\n")
    code, _, asked = cli("ask", "--json", "--kb", "docs", "how are uploads retried?")
    write(kb / "setup.md", (kb / "setup.md").read_text() + "\nMore again.\n")
    code, _, searched = cli("search", "--kb", "docs", "docker compose")
    assert code == 0 and searched == asked and "1 changed" in searched, searched
    write(kb / "setup.md", (kb / "setup.md").read_text() + "\nOnce more.\n")
    err = FakeTerminal()
    assert main(["search", "--kb", "docs", "docker compose"], FakeTerminal(), err) == 0
    shown = err.getvalue()
    assert "crag: indexing 1/1: setup.md" in shown and shown.endswith("\rcrag: indexed docs into index: 0 added, "
                                                                      "1 changed, 0 removed, 2 chunks in the index "
                                                                      "(`python -m crag roots` lists its roots, "
                                                                      "`python -m crag roots --remove PATH` drops one)\n"), shown
    write(kb / "setup.md", (kb / "setup.md").read_text() + "\nAnd again.\n")
    err = FakeTerminal()
    assert main(["search", "--json", "--kb", "docs", "docker compose"], FakeTerminal(), err) == 0
    assert "\r" not in err.getvalue() and err.getvalue().startswith("crag: indexed docs into "), err.getvalue()


FILE_TOO_BIG = r"""
import resource, signal, sys
from crag.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", [("index", "docs"), ("ask", "how are uploads retried?", "--kb", "docs")])
def test_a_disk_that_refuses_the_write_is_one_line_and_the_previous_index_answers(
    kb: Path, tmp_path: Path, command: tuple[str, ...]
) -> None:
    # faiss's "RuntimeError ... No space left on device" and sqlite3's "database or disk is
    # full" were tracebacks. A file size limit makes every library's write fail for real.
    assert cli("index", "docs")[0] == 0
    for i in range(40):
        write(kb / f"big{i}.md", f"# Big {i}\n\n" + " ".join(f"w{j}x{i}" for j in range(3000)) + "\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-c", FILE_TOO_BIG, *command], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("crag: error: cannot write the index: " + str(tmp_path / "index" / "gen-000002"))
    assert "File too large; the previous index is unchanged" in line
    assert sorted(os.listdir(tmp_path / "index")) == ["CURRENT", "gen-000001"]
    code, out, _ = cli("search", "uploads retried")
    assert code == 0 and "setup.md" in out


@pytest.mark.parametrize(
    ("where", "error", "said"),
    [
        ("faiss", RuntimeError("Error in void faiss::write_index(...) at index_write.cpp:499: Error: 'ret == (size * 4)' "
                               "failed: write error in {gen}/vectors.faiss: 4014 != 4915200 (No space left on device)"),
         "{gen}/vectors.faiss: No space left on device"),
        ("sqlite", __import__("sqlite3").OperationalError("database or disk is full"),
         "{gen}/chunks.sqlite: database or disk is full"),
        ("checksums", OSError(122, os.strerror(122), "{gen}/CHECKSUMS"), "{gen}/CHECKSUMS: Disk quota exceeded"),
        ("checksums", OSError(30, os.strerror(30), "{gen}/CHECKSUMS"), "{gen}/CHECKSUMS: Read-only file system"),
        ("checksums", OSError(13, os.strerror(13), "{gen}/CHECKSUMS"), "{gen}/CHECKSUMS: Permission denied"),
    ],
)
def test_every_kind_of_refused_write_is_one_line_naming_the_path(
    kb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, error: Exception, said: str
) -> None:
    import faiss

    from crag.index import embedded_write, integrity

    assert cli("index", "docs")[0] == 0
    gen = str(tmp_path / "index" / "gen-000002")
    if isinstance(error, OSError):
        error = OSError(error.errno, error.strerror, error.filename.format(gen=gen))
    elif isinstance(error, RuntimeError):
        error = RuntimeError(str(error).format(gen=gen))

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    target = {"faiss": (faiss, "write_index"), "sqlite": (embedded_write.EmbeddedUpdate, "_insert_rows"),
              "checksums": (integrity, "write_checksums")}[where]
    monkeypatch.setattr(*target, fail)
    write(kb / "new.md", "# New\n\nA new page about restores.\n")
    code, _, err = cli("index", "docs")
    assert code == 1 and err == f"crag: error: cannot write the index: {said.format(gen=gen)}; the previous index is " \
        "unchanged (free some space, or point --index or KB_AGENT_INDEX_DIR at a writable folder)\n"
    assert sorted(os.listdir(tmp_path / "index")) == ["CURRENT", "gen-000001"]


def test_a_full_disk_under_the_spilled_vectors_is_the_index_write_error_and_leaves_no_generation(
    kb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a full disk the spill's files failed again when the aborted update closed them: that
    second error was blamed on "the output" (standard output) and the unfinished generation,
    left behind, kept the disk full."""
    from crag.index import vectors_write

    assert cli("index", "docs")[0] == 0
    gen = tmp_path / "index" / "gen-000002"

    class Full:  # a file on a full disk: what is written and what close flushes both fail
        def __init__(self, f) -> None:
            self.f = f

        def write(self, data: bytes) -> None:
            raise OSError(28, os.strerror(28), self.f.name)

        def close(self) -> None:
            self.f.close()
            raise OSError(28, os.strerror(28), self.f.name)

    def add(self, x, ids) -> None:
        self._files = [Full(f) for f in self._files]
        self._files[0].write(b"")

    monkeypatch.setattr(vectors_write.Spill, "add", add)
    write(kb / "new.md", "# New\n\nA new page about restores.\n")
    code, _, err = cli("index", "docs")
    assert code == 1 and err.startswith(f"crag: error: cannot write the index: {gen}")
    assert "No space left on device; the previous index is unchanged" in err and len(err.splitlines()) == 1
    assert sorted(os.listdir(tmp_path / "index")) == ["CURRENT", "gen-000001"]


def test_a_file_with_a_million_blanks_in_a_row_is_indexed(kb: Path) -> None:
    """A run of over a million spaces before more text (a padded export) made tiktoken's
    pre-tokenizer give up, and `crag index` ended in that traceback, indexing nothing."""
    write(kb / "padded.txt", "The marmoset report" + " " * 1_100_000 + "ends with the capybara census.\n")
    code, out, err = cli("index", "docs")
    assert (code, err) == (0, "") and "3 added" in out and "docs/padded.txt" in out
    code, out, err = cli("search", "capybara", "census", "--json")
    hits = json.loads(out)
    assert code == 0 and hits[0]["path"] == "docs/padded.txt" and "capybara census" in hits[0]["text"]
    code, out, _ = cli("search", "client", "retries", "--json")
    assert json.loads(out)[0]["path"] == "docs/setup.md"


def test_no_index_anywhere_says_that_parents_were_searched_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md, "Which index": with no .crag in the working folder nor above it, `ask` and
    `search` report `no index in .crag (nor a .crag in any parent folder)`."""
    for key in list(os.environ):
        if key.startswith(("KB_AGENT_", "OPENAI_", "JIRA_", "CONFLUENCE_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    monkeypatch.setenv("HOME", str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for argv in (("search", "anything"), ("ask", "anything")):
        code, out, err = cli(*argv)
        assert code == 1 and out == ""
        assert err == ("crag: error: no index in .crag (nor a .crag in any parent folder): "
                       "run `python -m crag index PATH` first\n"), err
