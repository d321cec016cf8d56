"""The same command-line session on both stores prints the same (SPEC §8: "same commands, same
incremental semantics"; docs/postgresql.md).

A table of steps (a change to the files, then a ``crag`` command) is run once with the embedded
store and once with ``KB_AGENT_STORE`` naming a fresh PostgreSQL database; the transcripts (exit
status, stdout, stderr) must be equal once the index's own name and the run's duration are
masked. ``tests/test_store_contract.py`` holds the store port to the same contract below the
command line. One step differs, as docs/postgresql.md says it must: a root gone from this machine's
disk is still searched in a database, which other machines share.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from crag.index.postgres import redact
from tests.fakes import clean_env, cli

FILES = {
    "docs/retries.md": "# Retries\n\nThe client retries a failed upload three times with backoff.\n",
    "docs/deploy.md": "# Deploy\n\nDeploy the service with docker compose on port 8080.\n",
    "docs/guide/auth.md": "# Auth\n\nTokens expire after ninety days and must be rotated.\n",
    "docs/drafts/plan.md": "# Plan\n\nThe draft plan rotates tokens weekly.\n",
    "docs/.cragignore": "drafts/\n",
    "docs/notes.txt": "The temporary note mentions the upload retries.\n",
    "team/queue.md": "# Queue\n\nThe queue drains every five seconds and retries a failed upload once.\n",
}


def _write(root: Path, path: str, text: str) -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text, encoding="utf-8")


def _edit(path: str, text: str) -> Callable[[Path], None]:
    return lambda root: _write(root, path, text)


def _delete(path: str) -> Callable[[Path], None]:
    return lambda root: (root / path).unlink()


def _move(src: str, dst: str) -> Callable[[Path], None]:
    return lambda root: shutil.move(root / src, root / dst)


def _same(root: Path) -> None:
    return None


QUESTION = "How many times does the client retry a failed upload?"

# (what changes on disk first, the command)
SESSION: list[tuple[Callable[[Path], None], tuple[str, ...]]] = [
    (_same, ("index", "docs", "--exclude", "*.txt")),
    (_same, ("index", "docs", "--exclude", "*.txt")),  # nothing changed
    (_same, ("index", "team")),
    (_same, ("roots",)),
    (_same, ("search", "upload retries", "--json")),
    (_same, ("search", "upload retries", "--kb", "team", "--json")),
    (_same, ("search", "tokens", "--kb", "docs/guide")),
    (_same, ("ask", QUESTION, "--json")),
    (_same, ("ask", QUESTION, "--kb", "team", "--json")),
    (_edit("docs/retries.md", "# Retries\n\nThe client retries a failed upload five times.\n"), ("index", "docs")),
    (_delete("docs/deploy.md"), ("index", "docs")),
    (_same, ("search", "docker compose port", "--json")),
    (_same, ("roots", "--remove", "team")),
    (_same, ("roots", "--remove", "team")),  # no longer a root
    (_same, ("index", "team")),
    (_move("team", "team-moved"), ("roots",)),  # a root gone from disk is reported missing
    (_same, ("search", "queue drains", "--json")),
    (_same, ("index", "docs")),  # and dropped by the next index
    (_same, ("roots",)),
    (_same, ("ask", "What does the queue do?", "--json")),
]


def _transcript(root: Path, masks: list[str]) -> list[tuple[str, int, str, str]]:
    def masked(text: str) -> str:
        for mask in masks:
            text = text.replace(mask, "INDEX")
        text = re.sub(r"; \d+\.\d+s$", "; TIME", text, flags=re.M)
        return text

    lines = []
    for change, argv in SESSION:
        change(root)
        code, out, err = cli(*argv)
        if argv[0] == "ask":  # timings and the index's name aside, the whole result
            result = json.loads(out)
            result.pop("index")
            for node in result["usage"]["by_node"].values():
                node.pop("latency_ms")
            result["usage"].pop("latency_ms", None)
            result.pop("answer")  # holds the latency in its stats block; "body" is the answer itself
            out = json.dumps(result, sort_keys=True)
        lines.append((" ".join(argv), code, masked(out), masked(err)))
    return lines


def _run(store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, str, str]]:
    root = tmp_path / store
    for path, text in FILES.items():
        _write(root, path, text)
    monkeypatch.chdir(root)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(root / ".crag"))
    monkeypatch.delenv("KB_AGENT_STORE", raising=False)
    masks = [str(root / ".crag"), ".crag"]
    if store == "postgresql":
        uri = tmp_path.joinpath("uri").read_text()
        monkeypatch.setenv("KB_AGENT_STORE", uri)
        masks = [redact(uri), uri]
    return _transcript(root, masks)


def test_a_session_prints_the_same_on_both_stores(pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    tmp_path.joinpath("uri").write_text(pg_uri)
    embedded = _run("embedded", tmp_path, monkeypatch)
    postgresql = _run("postgresql", tmp_path, monkeypatch)
    # The session does what it says on the embedded store, so that equality means something.
    steps = {step: (code, out, err) for step, code, out, err in embedded}
    assert "3 added" in embedded[0][2] and "already up to date" in embedded[1][2]
    assert "notes.txt" not in embedded[0][2] and "plan.md" not in embedded[0][2]
    assert "team/queue.md" in steps["search upload retries --json"][1]
    assert json.loads(steps["search upload retries --kb team --json"][1])[0]["path"] == "team/queue.md"
    assert steps[f"ask {QUESTION} --kb team --json"][1].count('"path": "team/queue.md"')
    assert "docs/notes.txt" in embedded[9][2] and "missing on disk" in embedded[15][2] and "1 removed" in embedded[17][2]
    # The one difference, inherent (docs/postgresql.md): a database is shared by machines, so a root
    # absent from this one is still searched there; an index folder's root gone from disk is not.
    gone = 16
    assert embedded[gone][:3] == ("search queue drains --json", 0, "[]\n") and "no longer exists" in embedded[gone][3]
    assert json.loads(postgresql[gone][2])[0]["path"] == "team/queue.md"
    assert "team is not on this machine's disk" in postgresql[gone][3]
    for want, got in zip(embedded, postgresql, strict=True):
        assert got == want or want is embedded[gone], want[0]
