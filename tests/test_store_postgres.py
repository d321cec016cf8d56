"""The PostgreSQL store as a user meets it: the CLI, a killed indexer, two indexers, errors.

Runs against a real PostgreSQL with pgvector started by the tests (``tests/postgres_server.py``).
The behaviour both stores share is in ``test_store_contract.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crag.config import Settings
from crag.errors import IndexStoreError
from crag.index import index_roots, open_index, open_store
from crag.index.postgres import redact

from .postgres_server import database_uri

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def make_kb(root: Path, n: int = 3, marker: str = "older") -> Path:
    write(root / "setup.md", "# Setup\n\n## Retries\n\nThe client retries failed uploads three times.\n")
    write(root / "deploy.md", "# Deploy\n\nRun the container with docker compose up.\n")
    for i in range(n):
        write(root / "pages" / f"page{i:03d}.md", f"# Page {i}\n\nThis page is the {marker} edition {i}.\n\n" + f"filler {marker} words. " * 30)
    return root


def env_for(uri: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_", "JIRA_", "CONFLUENCE_"))}
    env.update(KB_AGENT_STORE=uri, KB_AGENT_INDEX_DIR=str(tmp_path / "unused-index"), KB_AGENT_LLM="offline")
    env["PYTHONPATH"] = str(ROOT)  # this tree's crag, whatever .venv holds
    return env


def crag(env: dict[str, str], cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crag", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_index_search_and_ask_through_the_cli(pg_uri: str, tmp_path: Path) -> None:
    make_kb(tmp_path / "docs")
    env = env_for(pg_uri, tmp_path)
    first = crag(env, tmp_path, "index", "docs")
    assert first.returncode == 0, first.stderr
    assert "5 added, 0 changed, 0 removed, 0 unchanged" in first.stdout and redact(pg_uri) in first.stdout
    again = crag(env, tmp_path, "index", "docs")
    assert "5 unchanged" in again.stdout and "already up to date" in again.stdout
    found = crag(env, tmp_path, "search", "--json", "how often are uploads retried")
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)
    hits = hits["hits"] if isinstance(hits, dict) else hits
    assert hits[0]["path"] == "docs/setup.md" and 0 < hits[0]["score"] <= 1
    # The same hits and scores as the embedded store gives for the same files.
    embedded_env = {k: v for k, v in env.items() if k != "KB_AGENT_STORE"}
    crag(embedded_env, tmp_path, "index", "docs")
    reference = json.loads(crag(embedded_env, tmp_path, "search", "--json", "how often are uploads retried").stdout)
    reference = reference["hits"] if isinstance(reference, dict) else reference
    assert hits[0]["path"] == reference[0]["path"] and abs(hits[0]["score"] - reference[0]["score"]) < 1e-5
    answer = crag(env, tmp_path, "ask", "How many times does the client retry failed uploads?")
    assert answer.returncode == 0, answer.stderr
    assert "three times" in answer.stdout and "docs/setup.md" in answer.stdout


INDEXER = r"""
import sys, time
from crag.config import Settings
from crag.index import index_roots

uri, root = sys.argv[1:3]

def progress(done, total, path):
    if done == total // 2:
        print("HALF", flush=True)
        time.sleep(60)

index_roots(Settings(store=uri), [root], progress=progress)
"""


def test_a_killed_indexer_leaves_the_previous_state_and_frees_the_lock(pg_uri: str, tmp_path: Path) -> None:
    kb = make_kb(tmp_path / "kb", n=40, marker="older")
    cfg = Settings(store=pg_uri)
    index_roots(cfg, [kb])
    before = open_store(cfg).state()
    make_kb(kb, n=40, marker="newer")
    for page in (kb / "pages").iterdir():
        os.utime(page, ns=(page.stat().st_atime_ns, page.stat().st_mtime_ns + 10**10))
    proc = subprocess.Popen([sys.executable, "-c", INDEXER, pg_uri, str(kb)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HALF"
        with open_index(cfg) as reader:  # readers go on reading the previous state meanwhile
            assert "older edition 7" in reader.search("page 7 edition", 1)[0].text
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert open_store(cfg).state() == before
    report = index_roots(cfg, [kb], lock_timeout=20)  # the lock went with the killed session
    assert len(report.changed) == 40
    with open_index(cfg) as reader:
        assert "newer edition 7" in reader.search("page 7 edition", 1)[0].text


def test_a_second_indexer_waits_then_says_what_it_did(pg_uri: str, tmp_path: Path) -> None:
    make_kb(tmp_path / "docs")
    env = env_for(pg_uri, tmp_path)
    assert crag(env, tmp_path, "index", "docs").returncode == 0
    write(tmp_path / "docs" / "new.md", "# New\n\nA page about caching.\n")
    store = open_store(Settings(store=pg_uri))
    with store.writer_lock(5):
        second = subprocess.Popen(
            [sys.executable, "-m", "crag", "index", "docs"], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(2)
        assert second.poll() is None  # waiting for the lock
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "1 added, 0 changed, 0 removed, 5 unchanged" in out
    # the store it waits for, not the unused index folder
    assert err.splitlines()[0] == f"crag: another crag index is at work on {redact(pg_uri)}; waiting for it to finish"


def test_an_unreachable_server_is_one_line_without_the_password(tmp_path: Path) -> None:
    env = env_for("postgresql://crag:sekret@127.0.0.1:9/kb", tmp_path)
    write(tmp_path / "docs" / "a.md", "# A\n\ntext\n")
    for argv in (("index", "docs"), ("search", "anything"), ("ask", "anything?")):
        run = crag(env, tmp_path, *argv)
        assert run.returncode == 1, (argv, run.stderr)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("crag: error: cannot reach the PostgreSQL server postgresql://crag@127.0.0.1:9/kb")
        assert "sekret" not in run.stderr + run.stdout


@pytest.mark.parametrize("host", ["...", "a..b", "x" * 70 + ".example.com"])
def test_a_host_name_no_resolver_takes_is_one_line_not_a_traceback(tmp_path: Path, host: str) -> None:
    """``KB_AGENT_STORE=postgresql://...`` copied from the README's table (an empty label, or
    one over 63 characters) made the resolver raise UnicodeError out of psycopg: a traceback."""
    env = env_for(f"postgresql://crag:sekret@{host}/kb", tmp_path)
    write(tmp_path / "docs" / "a.md", "# A\n\ntext\n")
    for argv in (("roots",), ("search", "anything")):
        run = crag(env, tmp_path, *argv)
        assert run.returncode == 1, (argv, run.stderr)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("crag: error: cannot reach the PostgreSQL server"), run.stderr
        assert "sekret" not in run.stderr + run.stdout


def test_a_login_the_server_refuses_is_said_so_not_that_it_cannot_be_reached(pg_uri: str, tmp_path: Path) -> None:
    """A user the server does not know was reported as "cannot reach the PostgreSQL server
    ...: FATAL: role ... does not exist": the server was reached, and the fix is the user or
    password in KB_AGENT_STORE, not the network."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(pg_uri)
    host = parts.netloc.rsplit("@", 1)[-1]
    uri = urlunsplit((parts.scheme, f"nobody_here:sekret9@{host}", parts.path, parts.query, parts.fragment))
    run = crag(env_for(uri, tmp_path), tmp_path, "search", "anything")
    assert run.returncode == 1, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"crag: error: the PostgreSQL server {redact(uri)} refused the login: "), line
    assert "check the user and password KB_AGENT_STORE gives" in line and "sekret9" not in run.stderr + run.stdout


def test_a_database_the_server_does_not_have_is_said_so_not_that_it_cannot_be_reached(pg_server, tmp_path: Path) -> None:
    """A database name the server lacks was "cannot reach the PostgreSQL server ...: FATAL:
    database ... does not exist": the server was reached, and the fix is to create it."""
    uri = database_uri(pg_server, "crag_no_such_db")
    run = crag(env_for(uri, tmp_path), tmp_path, "search", "anything")
    assert run.returncode == 1, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "has no database 'crag_no_such_db': create it (createdb crag_no_such_db)" in line, line


def test_a_server_without_pgvector_says_how_to_enable_it(pg_server, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS crag_novector")
        conn.execute("DROP ROLE IF EXISTS crag_user")
        conn.execute("CREATE ROLE crag_user LOGIN")
        conn.execute("CREATE DATABASE crag_novector OWNER crag_user")
    uri = database_uri(pg_server, "crag_novector").replace("postgres:@", "crag_user@").replace("postgres@", "crag_user@")
    write(tmp_path / "docs" / "a.md", "# A\n\ntext\n")
    run = crag(env_for(uri, tmp_path), tmp_path, "index", "docs")
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "lacks the vector extension" in lines[0] and "CREATE EXTENSION vector;" in lines[0]


def test_without_psycopg_the_error_names_the_extra(tmp_path: Path) -> None:
    blocker = tmp_path / "block"
    write(blocker / "psycopg.py", "raise ImportError('No module named psycopg')\n")
    env = env_for("postgresql://crag@127.0.0.1:9/kb", tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(ROOT)])  # this tree's crag, whatever .venv holds
    run = crag(env, tmp_path, "search", "anything")
    # A missing extra is the installation's configuration, exit status 2, as for the MCP server's
    # and the local embedder's extras (it was 1, a failure at run time, for this one alone).
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "crag: error: KB_AGENT_STORE=postgresql://crag@127.0.0.1:9/kb is not valid: expected a store this "
        "installation can open: a PostgreSQL one needs psycopg, pip install 'crag-kb[postgres]'"
    ]
    env["KB_AGENT_STORE"] = "postgresql://crag:s3cret-pw@127.0.0.1:9/kb"
    run = crag(env, tmp_path, "search", "anything")
    assert run.returncode == 2 and "s3cret-pw" not in run.stderr + run.stdout
    assert len(run.stderr.strip().splitlines()) == 1 and "crag-kb[postgres]" in run.stderr


def test_a_bad_store_setting_names_the_variable(tmp_path: Path) -> None:
    run = crag(env_for("mysql://x", tmp_path), tmp_path, "search", "anything")
    assert run.returncode == 2 and "KB_AGENT_STORE" in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.fixture
def ivf_from_8_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """An IVFFlat index from 8 chunks on (crag builds one from 5,000), so that small stores get one."""
    from crag.index import postgres_vectors

    monkeypatch.setattr(postgres_vectors, "IVF_MIN_CHUNKS", 8)


def _vector_indexes(conn: object) -> set[str]:
    from crag.index.postgres_vectors import vector_index_names

    return set(vector_index_names(conn))


def _meta(conn: object) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM crag.meta").fetchall())  # type: ignore[attr-defined]


def test_the_schema_is_versioned_and_a_small_knowledge_base_is_searched_exactly(pg_uri: str, tmp_path: Path) -> None:
    import psycopg

    from crag.index.hash_embedder import HashEmbedder
    from crag.index.postgres_schema import MIGRATIONS

    cfg = Settings(store=pg_uri)
    index_roots(cfg, [make_kb(tmp_path / "kb", n=30)], embedder=HashEmbedder(1024))
    with psycopg.connect(pg_uri) as conn:
        applied = [v for (v,) in conn.execute("SELECT version FROM crag.migrations ORDER BY version")]
        indexes = {n for (n,) in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'crag'")}
        assert applied == [m[0] for m in MIGRATIONS]
        assert {"postings_lexeme", "file_postings_lexeme"} <= indexes
        assert _vector_indexes(conn) == set() and _meta(conn)["vectors"] == "exact"
    with open_index(cfg, HashEmbedder(1024)) as reader:
        assert reader.vector_index == "exact"
        hits = reader.search("page 12 edition", 3, mode="vector")
        assert hits and "edition 12" in hits[0].text


@pytest.mark.usefixtures("ivf_from_8_chunks")
def test_the_vector_index_is_ivfflat_with_cells_that_follow_the_knowledge_base(pg_uri: str, tmp_path: Path) -> None:
    import psycopg

    from crag.index import postgres_vectors as postgres_schema
    from crag.index.hash_embedder import HashEmbedder

    cfg = Settings(store=pg_uri)
    kb = make_kb(tmp_path / "kb", n=10)
    seen: list[int] = []
    for n in (10, 100, 400):  # 4 * sqrt(chunks) passes twice the cells each time: a new index
        make_kb(kb, n=n)
        index_roots(cfg, [kb], embedder=HashEmbedder(1024))
        with psycopg.connect(pg_uri) as conn:
            chunks = int(_meta(conn)["chunks"])
            lists = postgres_schema.wanted_lists(chunks, seen[-1] if seen else None)
            assert lists == postgres_schema.lists_for(chunks)
            assert _meta(conn)["vectors"] == f"ivf:{lists}"
            assert _vector_indexes(conn) == {postgres_schema.ivf_index("vector", 1024, lists)}  # the old one dropped
            conn.execute("SET enable_seqscan = off")  # a small table: make the planner show the index it can use
            plan = " ".join(r[0] for r in conn.execute(
                "EXPLAIN SELECT id FROM crag.chunks WHERE vector_dims(embedding) = 1024 ORDER BY "
                "embedding::vector(1024) <=> (SELECT embedding FROM crag.chunks LIMIT 1)::vector(1024) LIMIT 5"
            ))
            assert postgres_schema.ivf_index("vector", 1024, lists) in plan
        seen.append(lists)
        with open_index(cfg, HashEmbedder(1024)) as reader:
            assert reader.vector_index == f"ivf:{lists}" and reader.probes == postgres_schema.probes(lists, chunks)
            hits = reader.search("page 7 edition", 3, mode="vector")
            assert hits and "edition 7" in hits[0].text
    assert seen[0] < seen[1] < seen[2]
    make_kb(kb, n=401)  # one more file: the index is kept
    index_roots(cfg, [kb], embedder=HashEmbedder(1024))
    with psycopg.connect(pg_uri) as conn:
        assert _meta(conn)["vectors"] == f"ivf:{seen[-1]}"


def test_an_older_hnsw_index_is_searched_until_an_update_replaces_it(pg_uri: str, tmp_path: Path, monkeypatch: object) -> None:
    import psycopg

    from crag.index import postgres_vectors as postgres_schema
    from crag.index.hash_embedder import HashEmbedder

    cfg = Settings(store=pg_uri)
    kb = make_kb(tmp_path / "kb", n=30)
    index_roots(cfg, [kb], embedder=HashEmbedder(1024))
    with psycopg.connect(pg_uri, autocommit=True) as conn:  # as an older crag left it
        conn.execute("DELETE FROM crag.meta WHERE key IN ('vectors', 'vectors_error')")
        conn.execute(
            "CREATE INDEX chunks_embedding_hnsw_vector_1024 ON crag.chunks USING hnsw "
            "((embedding::vector(1024)) vector_cosine_ops) WHERE vector_dims(embedding) = 1024"
        )
    with open_index(cfg, HashEmbedder(1024)) as reader:
        assert reader.vector_index == "hnsw"
        hits = reader.search("page 12 edition", 3, mode="vector")
        assert hits and "edition 12" in hits[0].text
    monkeypatch.setattr(postgres_schema, "IVF_MIN_CHUNKS", 8)  # type: ignore[attr-defined]
    make_kb(kb, n=31)
    index_roots(cfg, [kb], embedder=HashEmbedder(1024))
    with psycopg.connect(pg_uri) as conn:
        lists = int(_meta(conn)["vectors"].removeprefix("ivf:"))
        assert _vector_indexes(conn) == {postgres_schema.ivf_index("vector", 1024, lists)}


@pytest.mark.usefixtures("ivf_from_8_chunks")
def test_a_vector_index_the_server_refuses_leaves_the_update_whole(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    from crag.index import postgres_vectors as postgres_schema
    from crag.index.hash_embedder import HashEmbedder


    def refused(conn: object, kind: str, dim: int, n: int, lists: int) -> str:
        conn.execute(  # type: ignore[attr-defined]
            "CREATE INDEX refused ON crag.chunks USING ivfflat ((embedding::vector(1024)) vector_cosine_ops) "
            "WITH (lists = 0) WHERE vector_dims(embedding) = 1024"
        )
        return "refused"

    monkeypatch.setattr(postgres_schema, "build_ivf", refused)  # type: ignore[attr-defined]
    cfg = Settings(store=pg_uri)
    kb = make_kb(tmp_path / "kb", n=30)
    index_roots(cfg, [kb], embedder=HashEmbedder(1024))
    with psycopg.connect(pg_uri) as conn:
        meta = _meta(conn)
        assert meta["vectors"] == "exact" and "lists" in meta["vectors_error"]
        assert int(meta["chunks"]) >= 30 and _vector_indexes(conn) == set()
    with open_index(cfg, HashEmbedder(1024)) as reader:
        hits = reader.search("page 12 edition", 3, mode="vector")
        assert hits and "edition 12" in hits[0].text


Rows = set[tuple[object, ...]]


def _postings_as_derived(conn: object, table: str = "chunks") -> tuple[Rows, Rows, Rows, Rows]:
    """(stored postings, postings derived from the tsvectors (a file's: from its chunks'), stored
    document frequencies, document frequencies counted from those postings)."""
    from crag.index.postgres_schema import postings_of

    postings, terms_table = ("postings", "terms") if table == "chunks" else ("file_postings", "file_terms")
    stored = set(conn.execute(f"SELECT * FROM crag.{postings}").fetchall())  # type: ignore[attr-defined]
    derived = set(conn.execute(postings_of(table)).fetchall())  # type: ignore[attr-defined]
    terms = set(conn.execute(f"SELECT lexeme, df FROM crag.{terms_table}").fetchall())  # type: ignore[attr-defined]
    counted = set(conn.execute(  # type: ignore[attr-defined]
        f"SELECT lexeme, count(*)::integer FROM ({postings_of(table)}) AS p GROUP BY lexeme").fetchall())
    return stored, derived, terms, counted


def test_postings_and_document_frequencies_follow_every_update(pg_uri: str, tmp_path: Path) -> None:
    import psycopg

    cfg = Settings(store=pg_uri)
    kb = make_kb(tmp_path / "kb", n=6)
    index_roots(cfg, [kb])
    write(kb / "pages" / "page002.md", "# Page 2\n\nRewritten: a zeppelin and a retry budget.\n")  # changed
    (kb / "pages" / "page004.md").unlink()  # removed
    write(kb / "new.md", "# Zeppelin\n\nA new page about the zeppelin hangar.\n")  # added
    index_roots(cfg, [kb])
    with psycopg.connect(pg_uri) as conn:
        stored, derived, terms, counted = _postings_as_derived(conn)
        weights = conn.execute("SELECT a, b, d FROM crag.postings WHERE lexeme = 'zeppelin' ORDER BY chunk_id").fetchall()
        files = _postings_as_derived(conn, "files")
    assert files[0] == files[1] and files[2] == files[3] and ("zeppelin", 2) in files[2]
    assert stored == derived and len(stored) > 30
    # "edition": pages 0, 1, 3 and 5 (2 was rewritten, 4 removed)
    assert terms == counted and ("zeppelin", 2) in terms and ("edit", 4) in terms
    assert sorted(weights) == [(0, 0, 1), (0, 1, 2)]  # new.md: heading (B) once, text (D) twice
    with open_index(cfg) as reader:
        hits = reader.search("zeppelin hangar", 2, mode="lexical")
    assert [Path(h.path).name for h in hits][:1] == ["new.md"]


def test_a_first_build_is_written_by_parallel_writers_and_matches_one_written_in_one_transaction(
    pg_server: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ivf_from_8_chunks: None
) -> None:
    """A first build's full batches go to the bulk writers (a few chunks a batch here): the same
    files, chunks, postings, document frequencies and vector index (built on a connection of its
    own beside the postings' indexes) as a build that writes them all in its own transaction,
    and the same search results."""
    import psycopg

    from crag.index import postgres_update

    kb = make_kb(tmp_path / "kb", n=40)
    names = ("crag_bulk_writers", "crag_bulk_inline")
    uris = [database_uri(pg_server, name) for name in names]
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:  # type: ignore[attr-defined]
        for name in names:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
    started = []
    real = postgres_update._BulkWriters
    monkeypatch.setattr(postgres_update, "_BulkWriters", lambda *a: started.append(1) or real(*a))
    monkeypatch.setattr(postgres_update, "BULK_BATCH", 5)
    index_roots(Settings(store=uris[0]), [kb])
    assert started == [1]
    monkeypatch.setattr(postgres_update, "BULK_BATCH", 10**9)  # never full: all in the update's transaction
    index_roots(Settings(store=uris[1]), [kb])
    assert started == [1]
    found = []
    for uri in uris:
        with psycopg.connect(uri) as conn:
            rows = {t: set(conn.execute(f"SELECT * FROM crag.{t}").fetchall())
                    for t in ("files", "postings", "file_postings", "terms", "file_terms")}
            rows["chunks"] = set(conn.execute("SELECT id, file_id, text, embedding::text FROM crag.chunks").fetchall())
            assert _postings_as_derived(conn)[2:] == (rows["terms"], rows["terms"])
            rows["vectors"] = {_meta(conn)["vectors"], *_vector_indexes(conn)}
            found.append(rows)
        with open_index(Settings(store=uri)) as reader:
            found[-1]["hits"] = {(h.path, h.start_line) for h in reader.search("page 7 edition", 5)}
    assert found[0] == found[1] and len(found[0]["chunks"]) > 40
    assert len(found[0]["vectors"]) == 2 and any(v.startswith("ivf:") for v in found[0]["vectors"])


BULK_INDEXER = r"""
import sys, time
from crag.config import Settings
from crag.index import index_roots, postgres_update

postgres_update.BULK_BATCH = 4
uri, root = sys.argv[1:3]

def progress(done, total, path):
    if done == total // 2:
        time.sleep(3)  # the writers commit the batches queued so far
        print("HALF", flush=True)
        time.sleep(60)

index_roots(Settings(store=uri), [root], progress=progress)
"""


def test_a_killed_first_build_leaves_no_index_and_the_next_one_starts_clean(pg_uri: str, tmp_path: Path) -> None:
    """The bulk writers commit their batches, yet a reader sees no index until the build publishes
    its version; killed half-way, the next build clears what it left and indexes every file once."""
    import psycopg

    kb = make_kb(tmp_path / "kb", n=40)
    proc = subprocess.Popen([sys.executable, "-c", BULK_INDEXER, pg_uri, str(kb)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HALF"
        with psycopg.connect(pg_uri) as conn:
            committed = conn.execute("SELECT count(*) FROM crag.chunks").fetchone()[0]
        assert committed > 0
        assert open_store(Settings(store=pg_uri)).state() is None
        with pytest.raises(IndexStoreError, match="yet: a crag index is building it now; try again when it has finished"):
            open_index(Settings(store=pg_uri))  # as the embedded store says it (it said: run `crag index`)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    cfg = Settings(store=pg_uri)
    assert open_store(cfg).state() is None
    with pytest.raises(IndexStoreError, match=r"first$"):
        open_index(cfg)
    report = index_roots(cfg, [kb], lock_timeout=20)
    assert len(report.added) == 42
    with psycopg.connect(pg_uri) as conn:
        files, distinct = conn.execute("SELECT count(*), count(DISTINCT path) FROM crag.files").fetchone()
        stored, derived, terms, counted = _postings_as_derived(conn)
    assert files == distinct == 42
    assert stored == derived and terms == counted
    with open_index(cfg) as reader:
        assert "older edition 7" in reader.search("page 7 edition", 1)[0].text


def conn_storage(uri: str) -> str:
    """The storage of the chunks' vectors (``e``: external, ``x``: extended)."""
    import psycopg

    with psycopg.connect(uri) as conn:
        return conn.execute("SELECT attstorage FROM pg_attribute WHERE attrelid = 'crag.chunks'::regclass "
                            "AND attname = 'embedding'").fetchone()[0]


def test_an_index_of_the_previous_format_is_upgraded_in_place(pg_uri: str, tmp_path: Path) -> None:
    """A database written before postings existed (format 2): a reader says to run crag index, in one
    line; `crag index` upgrades it in place (postings from the chunks already there) and searches."""
    import psycopg

    from crag.index.postgres_schema import SCHEMA_VERSION

    env = env_for(pg_uri, tmp_path)
    kb = make_kb(tmp_path / "kb", n=4)
    write(kb / "blank-zanzibar.md", "\n\n\n")  # no chunks
    assert crag(env, tmp_path, "index", str(kb)).returncode == 0
    with psycopg.connect(pg_uri, autocommit=True) as conn:  # back to format 2, as the previous crag left it
        conn.execute("UPDATE crag.files SET tsv = setweight(to_tsvector('english', 'blank zanzibar'), 'A') "
                     "WHERE chunks = 0")
        conn.execute("DROP TABLE crag.postings, crag.terms, crag.file_postings, crag.file_terms")
        conn.execute(  # a file's tsv held its title and whole text then
            "UPDATE crag.files f SET tsv = setweight(to_tsvector('english', k.title), 'A') || "
            "setweight(to_tsvector('english', k.text), 'D') FROM (SELECT file_id, min(title) AS title, "
            "string_agg(text, E'\\n' ORDER BY start_line) AS text FROM crag.chunks GROUP BY file_id) k "
            "WHERE k.file_id = f.id"
        )
        conn.execute("ALTER TABLE crag.chunks ALTER COLUMN embedding SET STORAGE EXTENDED")
        conn.execute("CREATE INDEX chunks_tsv ON crag.chunks USING gin (tsv) WITH (fastupdate = off)")
        conn.execute("CREATE INDEX files_tsv ON crag.files USING gin (tsv) WITH (fastupdate = off)")
        conn.execute("DELETE FROM crag.migrations WHERE version > 2")
    old = crag(env, tmp_path, "search", "docker compose")
    assert old.returncode == 1 and old.stdout == ""
    assert old.stderr.strip().splitlines() == [
        f"crag: error: the index in {redact(pg_uri)} has format 2, this crag reads format {SCHEMA_VERSION}: "
        "run `python -m crag index PATH` to upgrade it"
    ]
    upgraded = crag(env, tmp_path, "index", str(kb))
    assert upgraded.returncode == 0, upgraded.stderr
    assert "0 added, 0 changed, 0 removed" in upgraded.stdout  # nothing re-read: the chunks were migrated
    with psycopg.connect(pg_uri) as conn:
        stored, derived, terms, counted = _postings_as_derived(conn)
        files = _postings_as_derived(conn, "files")
    assert stored == derived and terms == counted and stored
    # As the previous crag derived them, from each file's tsv: the same as from its chunks, but
    # for the file without chunks, whose title's postings stay until it changes.
    assert files[1] < files[0] and {row[0] for row in files[0] - files[1]} == {"blank", "zanzibar"}
    assert files[2] - files[3] == {("blank", 1), ("zanzibar", 1)} and files[3] < files[2]
    storage = conn_storage(pg_uri)
    assert storage == "e"  # format 4: vectors stored out of line, uncompressed
    found = crag(env, tmp_path, "search", "docker compose")
    assert found.returncode == 0 and "deploy.md" in found.stdout
    # The rows that crag wrote go with their files: the file without chunks (its title's postings,
    # from its own tsv) and a changed one.
    (kb / "blank-zanzibar.md").unlink()
    write(kb / "deploy.md", "# Deploy\n\nRun the container with podman instead.\n")
    assert crag(env, tmp_path, "index", str(kb)).returncode == 0
    with psycopg.connect(pg_uri) as conn:
        files = _postings_as_derived(conn, "files")
        left = conn.execute("SELECT count(*) FROM crag.file_postings WHERE lexeme = 'zanzibar'").fetchone()[0]
    assert files[0] == files[1] and files[2] == files[3] and left == 0



def test_the_diacritics_folded_are_those_sqlite_fts5_folds() -> None:
    """``DIACRITICS`` is what FTS5's ``unicode61 remove_diacritics 2`` (the embedded store's
    tokenizer) does to each character of the Basic Multilingual Plane between two letters: folds it
    to a letter, or drops it (it folds nothing beyond)."""
    import sqlite3

    from crag.text import DIACRITICS

    conn = sqlite3.connect(":memory:")
    folded = {}
    for option in (0, 2):
        conn.execute(f"CREATE VIRTUAL TABLE t{option} USING fts5(x, tokenize='unicode61 remove_diacritics {option}')")
        conn.execute(f"CREATE VIRTUAL TABLE v{option} USING fts5vocab(t{option}, instance)")
        conn.executemany(f"INSERT INTO t{option} (rowid, x) VALUES (?, ?)",
                         [(c, f"q{chr(c)}q") for c in range(0x80, 0x10000) if not 0xD800 <= c < 0xE000])
        folded[option] = dict(conn.execute(f"SELECT doc, group_concat(term, ' ') FROM v{option} GROUP BY doc"))
    changed = {chr(c): word for c, word in folded[2].items() if folded[0].get(c) != word}
    assert changed == {c: f"q{target}q" for target, chars in DIACRITICS.items() for c in chars}


def test_postgresql_folds_diacritics_as_the_table_says(pg_uri: str, tmp_path: Path) -> None:
    """The SQL function folds every character as ``fold_diacritics`` does, and leaves the rest."""
    import psycopg

    from crag.text import DIACRITICS, fold_diacritics

    index_roots(Settings(store=pg_uri), [make_kb(tmp_path / "kb", n=1)])
    text = "".join(DIACRITICS.values()) + "".join(chr(c) for c in range(1, 0x250)) + "ø æ ß ł đ Ω й 東京 — “x” 'q' \\"
    with psycopg.connect(pg_uri) as conn:
        got = conn.execute("SELECT crag.fold_diacritics(%s), crag.fold_diacritics('plain'), "
                           "crag.fold_diacritics(NULL)", (text,)).fetchone()
        volatility = conn.execute("SELECT provolatile FROM pg_proc WHERE proname = 'fold_diacritics'").fetchone()[0]
    assert got == (fold_diacritics(text), "plain", None) and volatility == "i"
    assert fold_diacritics("Crème BRÛLÉE, Việt, re\u0301sume\u0301, smørrebrød") == "Creme BRuLeE, Viet, resume, smørrebrød"


def _back_to_format_5(conn: object) -> None:
    """The chunks' tsv, the files' and the postings as a crag of format 5 wrote them (accents kept)."""
    from crag.index.postgres_schema import postings_of

    unfolded = "setweight(to_tsvector('english', {}), '{}')"
    for sql in (
        "ALTER TABLE crag.chunks DROP COLUMN tsv",
        "ALTER TABLE crag.chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS ("
        f"{unfolded.format('title', 'A')} || {unfolded.format('heading', 'B')} || {unfolded.format('text', 'D')}) STORED",
        f"UPDATE crag.files f SET tsv = {unfolded.format('k.title', 'A')} FROM (SELECT DISTINCT file_id, title "
        "FROM crag.chunks) k WHERE k.file_id = f.id",
        "TRUNCATE crag.postings, crag.file_postings, crag.terms, crag.file_terms",
        f"INSERT INTO crag.postings {postings_of('chunks')}",
        f"INSERT INTO crag.file_postings {postings_of('files')}",
        "INSERT INTO crag.terms SELECT lexeme, count(*) FROM crag.postings GROUP BY lexeme",
        "INSERT INTO crag.file_terms SELECT lexeme, count(*) FROM crag.file_postings GROUP BY lexeme",
        "DROP FUNCTION crag.fold_diacritics",
        "DELETE FROM crag.migrations WHERE version > 5",
    ):
        conn.execute(sql)  # type: ignore[attr-defined]


def test_an_index_of_format_5_is_folded_in_place(pg_uri: str, tmp_path: Path) -> None:
    """A database written before diacritics were folded (format 5): `crag index` upgrades it
    without reading or embedding anything again; the postings of the chunks with accents (and of
    their files) are folded, the document frequencies follow, the texts stay as written."""
    import psycopg

    env = env_for(pg_uri, tmp_path)
    kb = make_kb(tmp_path / "kb", n=3)
    write(kb / "cafe.md", "# Café\n\nThe café in Zürich serves crème brûlée; the cafe in Bern does not.\n")
    assert crag(env, tmp_path, "index", str(kb)).returncode == 0
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        _back_to_format_5(conn)
        before = dict(conn.execute("SELECT lexeme, df FROM crag.terms WHERE lexeme IN ('café', 'cafe', 'zürich')"))
        others = conn.execute("SELECT count(*) FROM crag.postings p JOIN crag.chunks c ON c.id = p.chunk_id "
                              "WHERE c.text NOT LIKE '%café%'").fetchone()[0]
    assert before == {"café": 1, "cafe": 1, "zürich": 1}
    old = crag(env, tmp_path, "search", "cafe")
    from crag.index.postgres_schema import SCHEMA_VERSION

    assert old.returncode == 1 and f"has format 5, this crag reads format {SCHEMA_VERSION}" in old.stderr
    upgraded = crag(env, tmp_path, "index", str(kb))
    assert upgraded.returncode == 0, upgraded.stderr
    assert "0 added, 0 changed, 0 removed" in upgraded.stdout  # nothing re-read
    with psycopg.connect(pg_uri) as conn:
        stored, derived, terms, counted = _postings_as_derived(conn)
        files = _postings_as_derived(conn, "files")
        after = dict(conn.execute("SELECT lexeme, df FROM crag.terms WHERE lexeme IN ('café', 'cafe', 'zürich', "
                                  "'zurich', 'crème', 'creme')"))
        title = conn.execute("SELECT tsv FROM crag.files WHERE path LIKE '%cafe.md'").fetchone()[0]
        text = conn.execute("SELECT text FROM crag.chunks WHERE text LIKE '%café%'").fetchone()[0]
        kept = conn.execute("SELECT count(*) FROM crag.postings p JOIN crag.chunks c ON c.id = p.chunk_id "
                            "WHERE c.text NOT LIKE '%café%'").fetchone()[0]
    assert stored == derived and terms == counted and files[0] == files[1] and files[2] == files[3]
    assert after == {"cafe": 1, "zurich": 1, "creme": 1} and title == "'cafe':1A" and kept == others
    assert "The café in Zürich serves crème brûlée" in text  # as written
    found = crag(env, tmp_path, "search", "zurich creme")
    assert found.returncode == 0 and "cafe.md" in found.stdout and "Zürich serves crème" in found.stdout


def test_the_upgrade_to_format_6_builds_the_vector_index_again_with_the_memory_it_needs(
    pg_uri: str, tmp_path: Path, ivf_from_8_chunks: None
) -> None:
    """Migration 6 rewrites the chunks, so PostgreSQL builds their indexes again, the IVFFlat one
    too: with the server's maintenance_work_mem below what its k-means needs, the upgrade failed
    ("memory required is 133 MB, maintenance_work_mem is 64 MB" at 14,785 chunks), and crag index
    with it. The migration raises it for its transaction, as crag does for a build."""
    import psycopg

    env = env_for(pg_uri, tmp_path)
    kb = tmp_path / "kb"
    for i in range(300):
        write(kb / f"p{i:03d}.md", f"# Page {i}\n\nThe café {i} in Zürich.\n")
    index_roots(Settings(store=pg_uri), [kb])
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        built = _vector_indexes(conn)
        _back_to_format_5(conn)
        name = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(f"ALTER DATABASE \"{name}\" SET maintenance_work_mem = '1MB'")  # for the sessions to come
    assert built and _meta_of(pg_uri)["vectors"].startswith("ivf:")
    upgraded = crag(env, tmp_path, "index", str(kb))
    assert upgraded.returncode == 0, upgraded.stderr
    with psycopg.connect(pg_uri) as conn:
        assert _vector_indexes(conn) == built
        from crag.index.postgres_schema import SCHEMA_VERSION

        assert conn.execute("SELECT max(version) FROM crag.migrations").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT current_setting('maintenance_work_mem')").fetchone()[0] == "1MB"
    found = crag(env, tmp_path, "search", "zurich cafe 7")
    assert found.returncode == 0 and "p007.md" in found.stdout


def test_an_index_of_format_6_is_split_into_words_in_place(pg_uri: str, tmp_path: Path) -> None:
    """A database whose texts PostgreSQL parsed whole (format 6: ``crag/index/store.py`` one word):
    `crag index` upgrades it without reading or embedding anything again; the postings and
    document frequencies are derived again, and a part of a path finds its page."""
    import psycopg

    from crag.index.postgres_schema import postings_of

    env = env_for(pg_uri, tmp_path)
    kb = make_kb(tmp_path / "kb", n=3)
    write(kb / "notes.md", "# Notes\n\nThe handler in crag/index/store.py speaks HTTP/3 to api.example.com.\n")
    assert crag(env, tmp_path, "index", str(kb)).returncode == 0
    folded = "setweight(to_tsvector('english', crag.fold_diacritics({})), '{}')"
    with psycopg.connect(pg_uri, autocommit=True) as conn:  # back to format 6, as the previous crag left it
        for sql in (
            "ALTER TABLE crag.chunks DROP COLUMN tsv",
            "ALTER TABLE crag.chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS ("
            f"{folded.format('title', 'A')} || {folded.format('heading', 'B')} || {folded.format('text', 'D')}) STORED",
            f"UPDATE crag.files f SET tsv = {folded.format('k.title', 'A')} FROM (SELECT DISTINCT file_id, title "
            "FROM crag.chunks) k WHERE k.file_id = f.id",
            "TRUNCATE crag.postings, crag.file_postings, crag.terms, crag.file_terms",
            f"INSERT INTO crag.postings {postings_of('chunks')}",
            f"INSERT INTO crag.file_postings {postings_of('files')}",
            "INSERT INTO crag.terms SELECT lexeme, count(*) FROM crag.postings GROUP BY lexeme",
            "INSERT INTO crag.file_terms SELECT lexeme, count(*) FROM crag.file_postings GROUP BY lexeme",
            "DROP FUNCTION crag.fts_text",
            "DELETE FROM crag.migrations WHERE version > 6",
        ):
            conn.execute(sql)
        whole = conn.execute("SELECT count(*) FROM crag.terms WHERE lexeme = 'crag/index/store.py'").fetchone()[0]
    assert whole == 1
    upgraded = crag(env, tmp_path, "index", str(kb))
    assert upgraded.returncode == 0, upgraded.stderr
    assert "0 added, 0 changed, 0 removed" in upgraded.stdout  # nothing re-read
    with psycopg.connect(pg_uri) as conn:
        stored, derived, terms, counted = _postings_as_derived(conn)
        files = _postings_as_derived(conn, "files")
        after = dict(conn.execute("SELECT lexeme, df FROM crag.terms WHERE lexeme IN ('crag/index/store.py', "
                                  "'store', 'http/3', 'http', 'api.example.com', 'exampl')"))
    assert stored == derived and terms == counted and files[0] == files[1] and files[2] == files[3]
    assert after == {"store": 1, "http": 1, "exampl": 1}
    found = crag(env, tmp_path, "search", "store", "--json")
    assert found.returncode == 0 and json.loads(found.stdout)[0]["path"].endswith("notes.md")


def _meta_of(uri: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(uri) as conn:
        return _meta(conn)

CLI_INDEXER = r"""
import sys
import crag.index.postgres as pg
from crag.cli import main

real_flush, flushes = pg.PostgresUpdate.flush, []

def flush(self):
    flushes.append(1)
    if len(flushes) == 2:  # mid-update, with a transaction open: the test cuts the connection now
        print("HALF", flush=True)
        sys.stdin.readline()
    real_flush(self)

pg.PostgresUpdate.flush = flush
sys.exit(main(["index", sys.argv[1]]))
"""


def test_a_server_that_goes_away_mid_index_is_one_line_with_no_psycopg_chatter(pg_uri: str, tmp_path: Path) -> None:
    # Killing PostgreSQL mid-index printed "error ignored terminating <psycopg.Pipeline [BAD]
    # ...>: the connection is lost" before crag's own line.
    import psycopg

    kb = make_kb(tmp_path / "kb", n=700)
    env = {**env_for(pg_uri, tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CLI_INDEXER, str(kb)], cwd=tmp_path, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HALF"
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        _, err = proc.communicate("\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("crag: error: the PostgreSQL server ") and "password" not in line


@pytest.mark.usefixtures("ivf_from_8_chunks")
def test_after_a_pgvector_upgrade_a_refused_build_keeps_the_index_searches_use(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    from crag.index import postgres, postgres_search
    from crag.index import postgres_vectors as pv
    from crag.index.hash_embedder import HashEmbedder

    cfg = Settings(store=pg_uri)
    kb = make_kb(tmp_path / "kb", n=30)
    index_roots(cfg, [kb], embedder=HashEmbedder(1024))  # built on vector (pgvector 0.6)
    with psycopg.connect(pg_uri) as conn:
        lists = pv.ivf_lists(_meta(conn)["vectors"])
        assert lists and _vector_indexes(conn) == {pv.ivf_index("vector", 1024, lists)}

    def upgraded(pgvector: object, dim: int) -> str:  # as pgvector 0.7 answers
        return "halfvec"

    def refused(conn: object, kind: str, dim: int, n: int, lists: int) -> str:
        conn.execute("SELECT 1 / 0")  # type: ignore[attr-defined]
        return ""

    for module in (pv, postgres, postgres_search):
        monkeypatch.setattr(module, "vector_kind", upgraded)  # type: ignore[attr-defined]
    monkeypatch.setattr(pv, "build_ivf", refused)  # type: ignore[attr-defined]
    make_kb(kb, n=31)
    index_roots(cfg, [kb], embedder=HashEmbedder(1024))
    with psycopg.connect(pg_uri) as conn:
        meta = _meta(conn)
        assert meta["vectors"] == f"ivf:{lists}" and "division by zero" in meta["vectors_error"]
        assert _vector_indexes(conn) == {pv.ivf_index("vector", 1024, lists)}  # kept, not dropped
    with open_index(cfg, HashEmbedder(1024)) as reader:
        assert (reader.vector_index, reader.kind) == (f"ivf:{lists}", "vector")
        hits = reader.search("page 12 edition", 3, mode="vector")
        assert hits and "edition 12" in hits[0].text


def test_the_published_version_is_read_on_one_kept_connection(pg_uri: str, tmp_path: Path) -> None:
    """An agent asks for the version before every search: one statement, not a new connection
    each time; a connection the server dropped is replaced, and ``close`` closes it."""
    import psycopg

    cfg = Settings(store=pg_uri)
    store = open_store(cfg)
    assert store.version() is None  # no index yet
    kb = make_kb(tmp_path / "kb")
    index_roots(cfg, [kb])
    opened = []
    connect = store.connect
    store.connect = lambda autocommit=False: opened.append(autocommit) or connect(autocommit)  # type: ignore[method-assign]
    first = store.version()
    assert first is not None and all(store.version() == first for _ in range(10))
    assert opened == []  # the connection of the first question, kept
    write(kb / "new.md", "# New\n\nA page added later.\n")
    index_roots(cfg, [kb])
    second = store.version()
    assert second is not None and second != first
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    assert store.version() == second and len(opened) == 1
    kept = store._version_conns.current()  # type: ignore[attr-defined]
    assert store._version_conns.connections() == [kept]  # type: ignore[attr-defined]
    store.close()
    assert kept.closed
    assert store._version_conns.connections() == []  # type: ignore[attr-defined]


def test_a_query_of_frequent_words_only_ranks_the_rows_holding_every_word(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More rows than the budget hold each word (``lexical.ALL``): the ranking is of the rows
    holding them all, with and without roots; those of the embedded store's ranking that come
    before every word's budget-th row (all of them when nothing is cut)."""
    from crag.index import lexical

    kb = tmp_path / "kb"
    for n in range(12):
        extra = " zebra" * (1 + n % 3) if n % 2 else ""
        write(kb / "a" / f"doc{n:02d}.md", f"# Doc {n}\n\nThe system archive stores records{extra}.\n")
        write(kb / "b" / f"doc{n:02d}.md", f"# Other {n}\n\nEach system keeps records{extra} in an archive.\n")
    monkeypatch.setattr(lexical, "CHUNK_BUDGET", 5)
    pg, embedded = Settings(store=pg_uri), Settings(index_dir=str(tmp_path / "index"))
    index_roots(pg, [kb])
    index_roots(embedded, [kb])
    with open_index(pg) as got, open_index(embedded) as want:
        for query in ("system archive records", "system records zebra"):
            for roots in (None, [str(kb / "b")]):
                found, expect = got.lexical_ranking(query, 10, roots), want.lexical_ranking(query, 10, roots)
                paths_found = [got.chunk_rows([c])[c].path for c, _ in found]
                assert 0 < len(found) <= 5
                expected = {want.chunk_rows([c])[c].path for c, _ in expect}
                if "zebra" in query:  # "system" has its budget of rows before most of "zebra"'s
                    assert set(paths_found) < expected, (query, roots)
                else:
                    assert set(paths_found) == expected, (query, roots)
                texts = [got.chunk_rows([c])[c].text for c, _ in found]
                assert all(all(w in t for w in ("system", "records")) for t in texts)
                if "zebra" in query:
                    assert all("zebra" in t for t in texts)
                if roots:
                    assert all(p.startswith(roots[0] + os.sep) for p in paths_found)


def test_frequent_words_still_score_the_rows_a_rare_word_selects(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the budget a frequent word selects no rows of its own but still scores the rows the
    rare word selects, in chunk and file rankings, as in the embedded store."""
    from crag.index import lexical

    kb = tmp_path / "kb"
    for n in range(30):
        text = "The system stores records." if n % 4 == 1 else "The system stores data."
        if n == 5:
            text = "A zebra."  # the shortest row holding the rare word: first by the rare word alone
        if n == 7:
            text = "The zebra stores many records."
        write(kb / f"doc{n:02d}.md", f"# Doc {n}\n\n{text}\n")
    pg, embedded = Settings(store=pg_uri), Settings(index_dir=str(tmp_path / "index"))
    index_roots(pg, [kb])
    index_roots(embedded, [kb])
    monkeypatch.setattr(lexical, "CHUNK_BUDGET", 5)
    monkeypatch.setattr(lexical, "FILE_BUDGET", 5)
    with open_index(pg) as got, open_index(embedded) as want:
        for reader in (got, want):
            ranked = reader.lexical_ranking("zebra records", 10)
            assert [reader.chunk_rows([c])[c].path for c, _ in ranked] == [str(kb / "doc07.md"), str(kb / "doc05.md")]
            files = sorted(reader.chunk_files([c for c, _ in ranked]).values())
            by_file = reader.file_ranking("zebra records", 10, files=files)
            assert [reader.chunk_rows([c])[c].path for c, _ in ranked] == [
                next(reader.chunk_rows([c])[c].path for c, f in reader.chunk_files([c for c, _ in ranked]).items() if f == fid)
                for fid, _ in by_file
            ]


def test_connections_of_a_thread_that_ended_are_closed(pg_uri: str, tmp_path: Path) -> None:
    """``crag mcp`` runs each call in a worker thread, and worker threads come and go: the
    connections a thread opened (to search, to check the published version) close when it ends,
    so a long-running server does not pile them up on the database."""
    import gc
    import threading

    import psycopg

    cfg = Settings(store=pg_uri)
    index_roots(cfg, [make_kb(tmp_path / "kb")])
    store = open_store(cfg)

    def backends() -> int:
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND pid <> pg_backend_pid()").fetchone()[0]

    with open_index(cfg) as reader:
        assert store.version() and reader.search("retries", 2)  # this thread's, kept
        before = backends()
        for _ in range(4):
            worker = threading.Thread(target=lambda: (store.version(), reader.search("retries", 2)))
            worker.start()
            worker.join()
        gc.collect()
        deadline = time.monotonic() + 10
        while backends() > before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert backends() == before
        assert store.version() and reader.search("retries", 2)
    store.close()


def test_a_searcher_a_re_index_replaced_closes_its_connections_without_the_garbage_collector(
        pg_uri: str, tmp_path: Path) -> None:
    """A long-lived agent (``crag mcp``) opens a new searcher after each re-index and drops the
    one it replaces; that searcher and its connections were a reference cycle, closed only at
    the next full collection, which a server may not run for hours: each re-index left an idle
    connection on the database, towards its ``max_connections``."""
    import gc

    import psycopg

    from crag import Agent

    def backends() -> int:
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND pid <> pg_backend_pid()").fetchone()[0]

    kb = make_kb(tmp_path / "kb")
    agent = Agent.from_env([kb], dotenv=None, environ={}, llm="offline", store=pg_uri, log=False)
    try:
        assert agent.search("retries")
        gc.collect()
        gc.disable()
        before = backends()
        for round in range(3):
            write(kb / "setup.md", f"# Setup\n\n## Retries\n\nThe client retries failed uploads {round + 4} times.\n")
            index_roots(agent.settings, [kb])
            assert f"{round + 4} times" in agent.search("how many times does the client retry")[0].text
            deadline = time.monotonic() + 10
            while backends() > before and time.monotonic() < deadline:
                time.sleep(0.1)
            assert backends() == before
    finally:
        gc.enable()
        agent.close()


def test_a_files_postings_are_its_chunks_summed_so_its_text_is_parsed_once(pg_uri: str, tmp_path: Path) -> None:
    """A file's postings come from its chunks' (not from parsing its whole text again): a word's
    count is the sum of its chunks' counts, beyond the 256 positions a file's tsvector would keep,
    and the file's own tsvector holds its title alone."""
    import psycopg

    kb = tmp_path / "kb"
    body = "\n\n".join(f"## Part {i}\n\n" + "The zeppelin hangar holds a zeppelin. " * 15 for i in range(10))
    write(kb / "airships.md", "# Airships\n\n" + body + "\n")
    cfg = Settings(store=pg_uri)
    index_roots(cfg, [kb])
    with psycopg.connect(pg_uri) as conn:
        chunks = conn.execute("SELECT count(*) FROM crag.chunks").fetchone()[0]
        (a, b, d), = conn.execute("SELECT a, b, d FROM crag.file_postings WHERE lexeme = 'zeppelin'").fetchall()
        summed = conn.execute("SELECT sum(d) FROM crag.postings WHERE lexeme = 'zeppelin'").fetchone()[0]
        title_only = conn.execute("SELECT tsv = setweight(to_tsvector('english', 'airships'), 'A') FROM crag.files"
                                  ).fetchone()[0]
        files = _postings_as_derived(conn, "files")
    assert chunks > 1 and (a, b) == (0, 0) and d == summed == 300
    assert title_only and files[0] == files[1] and files[2] == files[3]


@pytest.mark.parametrize("text", ["", "a_b c", "é_x naïve café—über 12€ 3.5", "x\ud800y", "日本語 テキスト", "«q» a-b",
                                  "\u00a0a\u2003b", "ǅemal Ⅻ x²", "tab\tand\x0bvt"])
def test_word_count_counts_the_words_the_regex_finds(text: str) -> None:
    """The bytes-based count equals ``WORD.findall``'s (the length FTS5 counts), for ASCII and not."""
    from hypothesis import given
    from hypothesis import strategies as st

    from crag.index.postgres_update import word_count
    from crag.text import WORD

    assert word_count(text, text) == 2 * len(WORD.findall(text))

    @given(st.text())
    def same(t: str) -> None:
        assert word_count(t) == len(WORD.findall(t))

    if text == "":
        same()


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("postgresql://crag:sekret@db:5432/kb", "postgresql://crag@db:5432/kb"),
        ("postgresql:///kb?host=/run/pg&user=crag&password=sekret", "postgresql:///kb?host=/run/pg&user=crag"),
        ("postgresql://crag@db/kb?Password=sekret&sslmode=require", "postgresql://crag@db/kb?sslmode=require"),
        ("postgresql://crag:sekret@[::1]:5433/kb", "postgresql://crag@[::1]:5433/kb"),
        ("postgresql://:sekret@/kb?host=/run/pg", "postgresql:///kb?host=/run/pg"),
        ("postgresql://crag:sekret@db:x/kb", "postgresql://crag@db:x/kb"),
        ("postgresql://crag@db/kb", "postgresql://crag@db/kb"),
        # libpq reads the password up to the first "@" before any "/": "#" and "?" are its own
        ("postgresql://crag:Top#Secret?9@/kb?host=/run/pg", "postgresql://crag@/kb?host=/run/pg"),
        ("postgresql://crag:a?b@db/kb?sslmode=require&password=x#y", "postgresql://crag@db/kb?sslmode=require"),
        ("postgresql://jo?e@db/kb?password=sekret&sslmode=require", "postgresql://jo?e@db/kb?sslmode=require"),
    ],
)
def test_redact_drops_every_form_of_the_password(uri: str, shown: str) -> None:
    assert redact(uri) == shown


def test_a_password_in_the_uri_query_or_a_bad_port_is_one_line_without_the_password(tmp_path: Path) -> None:
    write(tmp_path / "docs" / "a.md", "# A\n\ntext\n")
    for uri in ("postgresql:///kb?host=127.0.0.1&port=9&user=crag&password=sekret9",
                "postgresql://crag:sekret9@127.0.0.1:x/kb"):
        for argv in (("index", "docs"), ("search", "anything")):
            run = crag(env_for(uri, tmp_path), tmp_path, *argv)
            assert run.returncode in (1, 2), (uri, argv, run.stderr)
            lines = run.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("crag: error: "), (uri, run.stderr)
            assert "sekret9" not in run.stderr + run.stdout


@pytest.mark.parametrize("uri", [
    "postgresql://crag:Qz@xw9@127.0.0.1:9/kb",  # libpq: password "Qz", host "xw9@127.0.0.1"
    "postgresql://crag:Qz/xw9@127.0.0.1:9/kb",  # libpq: no password, host "crag", port "Qz"
    "postgresql://crag:77/xw9@127.0.0.1:9/kb",  # libpq: host "crag", port 77, database "xw9@..."
    "postgresql://crag:Qz@x:w/9#?@127.0.0.1:9/kb?sslmode=disable",
])
def test_a_password_with_an_unencoded_at_or_slash_is_refused_without_any_part_of_it(uri: str, tmp_path: Path) -> None:
    """libpq ends the password at the first "@" or "/", and names the rest as the host or the
    database in its errors: crag refuses such a URI, names the server, and says how to write it."""
    write(tmp_path / "docs" / "a.md", "# A\n\ntext\n")
    password = uri.partition("crag:")[2].rpartition("@127")[0]
    for argv in (("index", "docs"), ("search", "anything"), ("ask", "--json", "anything"), ("roots",)):
        run = crag(env_for(uri, tmp_path), tmp_path, *argv)
        assert run.returncode == 2, (uri, argv, run.stderr)
        (line,) = run.stderr.strip().splitlines()
        assert line.startswith("crag: error: KB_AGENT_STORE=postgresql://***@127.0.0.1:9/kb"), line
        assert "percent-encoded (@ as %40, / as %2F" in line, line
        for part in {password, *password.replace("/", "@").split("@")} - {""}:
            assert part not in run.stderr + run.stdout, (part, line)
    assert redact(uri).startswith("postgresql://***@127.0.0.1:9/kb")


def test_an_unencoded_at_in_the_password_is_a_secret_as_the_user_meant_it() -> None:
    from crag.environment import find_secrets

    assert find_secrets({"KB_AGENT_STORE": "postgresql://crag:Qz@xw9@db/kb"}) == ("Qz@xw9",)
    assert find_secrets({"KB_AGENT_STORE": "postgresql://crag:Qz%40xw9@db/kb"}) == ("Qz%40xw9",)


def test_a_keyword_store_setting_is_refused_without_showing_its_password(tmp_path: Path) -> None:
    run = crag(env_for("host=db dbname=kb user=crag password=sekret9abc", tmp_path), tmp_path, "search", "anything")
    assert run.returncode == 2 and "KB_AGENT_STORE" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert "sekret" not in run.stderr


def test_a_search_after_the_server_dropped_its_connections_reconnects(pg_uri: str, tmp_path: Path) -> None:
    """A long-running reader (``crag mcp``) keeps a connection per thread; after the server
    restarts (or a pooler or failover drops them) the next search reconnects instead of
    failing once per kept connection."""
    import psycopg

    cfg = Settings(store=pg_uri)
    index_roots(cfg, [make_kb(tmp_path / "kb")])
    with open_index(cfg) as reader:
        assert reader.search("retries", 2)
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        time.sleep(0.2)
        assert reader.search("retries", 2)[0].path.endswith("setup.md")


def test_a_role_that_may_only_read_is_told_why_an_update_is_refused(pg_server, pg_uri: str, tmp_path: Path) -> None:
    """A reader's role (docs/postgresql.md: USAGE and SELECT only) searches; ``--kb`` with a
    changed file, or ``crag index``, failed with only "permission denied for table files"."""
    import psycopg

    make_kb(tmp_path / "docs")
    assert crag(env_for(pg_uri, tmp_path), tmp_path, "index", "docs").returncode == 0
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS crag_reader_only")
        conn.execute("CREATE ROLE crag_reader_only LOGIN")
        conn.execute("GRANT USAGE ON SCHEMA crag TO crag_reader_only")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA crag TO crag_reader_only")
    reader = env_for(pg_uri.replace("postgres:@", "crag_reader_only@").replace("postgres@", "crag_reader_only@"), tmp_path)
    assert crag(reader, tmp_path, "search", "retries").returncode == 0
    write(tmp_path / "docs" / "new.md", "# New\n\nA page about caching.\n")
    for argv in (("ask", "--kb", "docs", "How is caching done?"), ("index", "docs")):
        run = crag(reader, tmp_path, *argv)
        assert run.returncode == 1, run.stderr
        (line,) = run.stderr.strip().splitlines()
        assert "permission denied" in line and "may only read" in line, line


def test_a_role_not_granted_the_schema_is_told_the_grants(pg_server, pg_uri: str, tmp_path: Path) -> None:
    """A role no one granted crag's schema: ``search``, ``roots`` and ``index`` failed with only
    "permission denied for schema crag", then "... for table migrations" once given USAGE alone;
    the line gives the grants docs/postgresql.md lists and who may run them."""
    import psycopg

    make_kb(tmp_path / "docs")
    assert crag(env_for(pg_uri, tmp_path), tmp_path, "index", "docs").returncode == 0
    role = "crag no grants"
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    env = env_for(pg_uri.replace("postgres:@", "crag%20no%20grants@").replace("postgres@", "crag%20no%20grants@"),
                  tmp_path)
    grants = (f'`GRANT USAGE ON SCHEMA crag TO "{role}"; GRANT SELECT ON ALL TABLES IN SCHEMA crag TO "{role}";`')
    for usage in (False, True):
        if usage:
            with psycopg.connect(pg_uri, autocommit=True) as conn:
                conn.execute(f'GRANT USAGE ON SCHEMA crag TO "{role}"')
        for argv in (("search", "retries"), ("roots",), ("index", "docs")):
            run = crag(env, tmp_path, *argv)
            assert run.returncode == 1 and run.stdout == "", run.stdout
            (line,) = run.stderr.strip().splitlines()
            assert "permission denied" in line and f'role "{role}" may not read' in line, line
            assert f"as postgres, the role that owns schema crag, run {grants}" in line, line
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA crag TO "{role}"')
    found = crag(env, tmp_path, "search", "retries")
    assert found.returncode == 0 and "retries" in found.stdout, found.stderr


@pytest.mark.parametrize(
    ("uri", "password"),
    [
        ("postgresql://crag:sekret9@db/kb", "sekret9"),
        ("postgresql://crag:Top#Secret?9@/kb?host=/run/pg", "Top#Secret?9"),
        ("postgresql:///kb?host=/run/pg&user=crag&password=sekret9", "sekret9"),
    ],
)
def test_the_store_password_is_a_secret_however_the_uri_gives_it(uri: str, password: str) -> None:
    """Every message is redacted of the secrets ``find_secrets`` finds: the store's password as
    libpq reads it, also one with "#" or "?" (which a URL parser takes for the end of the host)."""
    from crag.environment import find_secrets

    assert find_secrets({"KB_AGENT_STORE": uri}) == (password,)


@pytest.mark.parametrize("host, cores, writers", [
    ("/tmp/pgserver", 8, 6),  # a Unix socket: this machine, one writer a core but one, at most six
    ("localhost", 4, 3),
    ("127.0.0.1", 2, 2),  # never below two
    ("::1", 16, 6),
    ("", 5, 4),  # libpq's default socket
    ("db.example.com", 32, 2),  # a server elsewhere: its cores are not this machine's
    ("10.0.0.7", 32, 2),
    ("localhost", None, 2),
])
def test_a_first_build_writes_with_a_writer_a_core_on_a_server_of_this_machine(host, cores, writers) -> None:
    from crag.index.postgres_update import bulk_writers

    assert bulk_writers(host, cores) == writers


def test_the_bulk_writers_follow_the_cores_of_this_machine(pg_server, tmp_path, monkeypatch) -> None:
    import psycopg

    from crag.index import postgres_update

    kb = make_kb(tmp_path / "kb", n=40)
    uri = database_uri(pg_server, "crag_bulk_cores")
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute("DROP DATABASE IF EXISTS crag_bulk_cores")
        conn.execute("CREATE DATABASE crag_bulk_cores")
    counts = []
    real = postgres_update._BulkWriters

    def counted(*a):
        writers = real(*a)
        counts.append(len(writers.conns))
        return writers

    monkeypatch.setattr(postgres_update, "_BulkWriters", counted)
    monkeypatch.setattr(postgres_update, "_cores", lambda: 4)  # the test server listens on a local socket
    monkeypatch.setattr(postgres_update, "BULK_BATCH", 5)
    index_roots(Settings(store=uri), [kb])
    assert counts == [3]
    with open_index(Settings(store=uri)) as reader:
        assert {h.path for h in reader.search("page 7 edition", 5)}


def test_full_text_scores_are_the_embedded_stores_bm25(pg_uri: str, tmp_path: Path) -> None:
    """BM25 as FTS5 computes it, IDF included: log((N - n + 0.5) / (n + 0.5)), at least 1e-6.
    PostgreSQL took log(1 + ...), which weighs a word most rows hold far more than FTS5 does,
    so a two-word question put its files and chunks in another order than the embedded store."""
    kb = tmp_path / "kb"
    write(kb / "a.md", "# Alpha\n\nThe service restarts after a crash.\n")
    write(kb / "b.md", "# Beta\n\nThe service logs every request.\n\nThe service is fast.\n")
    write(kb / "c.md", "# Gamma\n\nThe service runs on port 8080.\n")
    write(kb / "d.md", "# Delta\n\nBackups are nightly.\n")
    reference = Settings(index_dir=str(tmp_path / "reference"))
    cfg = Settings(store=pg_uri)
    index_roots(reference, [kb])
    index_roots(cfg, [kb])
    with open_index(reference) as want, open_index(cfg) as got:
        for query in ("service restarts", "service", "nightly service backups"):
            for ranking in ("lexical_ranking", "file_ranking"):
                expect = sorted(-s for _, s in getattr(want, ranking)(query, 10))
                found = sorted(s for _, s in getattr(got, ranking)(query, 10))
                assert found == pytest.approx(expect, rel=1e-3, abs=1e-5), (query, ranking)


def test_a_role_that_may_not_create_crags_schema_is_told_the_grant_it_needs(pg_server, tmp_path: Path) -> None:
    """A role with CONNECT only (docs/postgresql.md: the indexer needs CREATE on the database)
    got "permission denied for database ...", naming no right and no fix."""
    import psycopg

    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS crag_nocreate")
        conn.execute("DROP ROLE IF EXISTS crag_connect_only")
        conn.execute("CREATE ROLE crag_connect_only LOGIN")
        conn.execute("CREATE DATABASE crag_nocreate")
    with psycopg.connect(database_uri(pg_server, "crag_nocreate"), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    uri = database_uri(pg_server, "crag_nocreate").replace("postgres:@", "crag_connect_only@").replace(
        "postgres@", "crag_connect_only@")
    write(tmp_path / "docs" / "a.md", "# A\n\ntext\n")
    run = crag(env_for(uri, tmp_path), tmp_path, "index", "docs")
    assert run.returncode == 1
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("crag: error: ") and "permission denied for database crag_nocreate" in line, line
    assert "GRANT CONNECT, CREATE ON DATABASE crag_nocreate TO crag_connect_only" in line, line


def test_a_file_whose_path_is_longer_than_a_btree_row_is_indexed_as_by_the_embedded_store(
    pg_uri: str, tmp_path: Path
) -> None:
    """Paths beyond 2,704 bytes (nested folders of long names) failed the whole run: "index row
    size ... exceeds btree version 4 maximum 2704 for index files_path_key"."""
    import random
    import string

    rng = random.Random(5)
    deep = tmp_path / "long"
    for _ in range(12):
        deep /= "".join(rng.choice(string.ascii_letters) for _ in range(240))  # incompressible
    write(deep / "deep.md", "# Deep\n\nThe mole digs deep tunnels.\n")
    write(tmp_path / "kb" / "shallow.md", "# Shallow\n\nThe duck swims.\n")
    assert len(str(deep).encode()) > 2704
    cfg = Settings(store=pg_uri)
    report = index_roots(cfg, [tmp_path / "kb", deep])
    assert paths(report.added) == ["deep.md", "shallow.md"]
    with open_index(cfg) as reader:
        assert reader.search("mole tunnels", 1)[0].path == str(deep / "deep.md")
    (deep / "deep.md").write_text("# Deep\n\nThe badger digs deep tunnels.\n", encoding="utf-8")
    assert paths(index_roots(cfg, [tmp_path / "kb", deep]).changed) == ["deep.md"]
    (deep / "deep.md").unlink()
    assert paths(index_roots(cfg, [tmp_path / "kb", deep]).removed) == ["deep.md"]
    assert open_store(cfg).roots() == tuple(sorted((str(tmp_path / "kb"), str(deep))))


def paths(report_paths) -> list[str]:
    return sorted(Path(p).name for p in report_paths)


def test_pgvector_in_a_schema_off_the_search_path_is_named_with_the_fix(pg_server, tmp_path: Path) -> None:
    """An administrator who ran CREATE EXTENSION vector SCHEMA ext: crag index said only
    'type "vector" does not exist'."""
    import psycopg

    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute("DROP DATABASE IF EXISTS crag_ext_schema")
        conn.execute("CREATE DATABASE crag_ext_schema")
    uri = database_uri(pg_server, "crag_ext_schema")
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA ext")
        conn.execute("CREATE EXTENSION vector SCHEMA ext")
    write(tmp_path / "docs" / "a.md", "# A\n\nThe ext schema holds pgvector.\n")
    run = crag(env_for(uri, tmp_path), tmp_path, "index", "docs")
    assert run.returncode == 1
    (line,) = run.stderr.strip().splitlines()
    assert "schema ext" in line and "search_path" in line, line
    fixed = uri + ("&" if "?" in uri else "?") + "options=-c%20search_path%3Dpublic,ext"
    assert crag(env_for(fixed, tmp_path), tmp_path, "index", "docs").returncode == 0


DAMAGE = [
    ("DROP TABLE crag.chunks CASCADE", "table crag.chunks is missing"),
    ("DROP TABLE crag.postings", "table crag.postings is missing"),
    ("DROP TABLE crag.migrations", "table crag.migrations is missing"),
    # emptied: a search said "no index", and `crag index` failed on "relation meta already exists"
    ("DELETE FROM crag.migrations", "table crag.migrations is empty"),
    ("ALTER TABLE crag.files DROP COLUMN dl", "column crag.files.dl is missing"),
    ("DROP FUNCTION crag.fts_text CASCADE", "column crag.chunks.tsv is missing"),
    ("DROP FUNCTION crag.fold_diacritics CASCADE", "function crag.fold_diacritics is missing"),
    ("DROP EXTENSION vector CASCADE", "column crag.chunks.embedding is missing"),
    ("UPDATE crag.meta SET value = 'abc' WHERE key = 'chunks'", "meta chunks is not a number"),
    ("UPDATE crag.meta SET value = 'x' WHERE key = 'avgdl_chunks'", "meta avgdl_chunks is not a number"),
    ("DELETE FROM crag.meta WHERE key = 'dim'", "meta dim is not a number"),
    ("DELETE FROM crag.chunks", "0 chunk rows, 5 listed by its files, 5 recorded"),
    # emptied by hand: searches ranked no word and `crag index` said "already up to date"
    ("TRUNCATE crag.postings", "table crag.postings is empty"),
    ("TRUNCATE crag.file_terms", "table crag.file_terms is empty"),
    # a type changed by hand: `crag index` ended in a traceback (an integer has no startswith)
    ("ALTER TABLE crag.files ALTER COLUMN sha256 TYPE integer USING 0", "column crag.files.sha256 is of type integer, not text"),
    ("ALTER TABLE crag.chunks ALTER COLUMN start_line TYPE text", "column crag.chunks.start_line is of type text, not integer"),
]


@pytest.mark.parametrize(("damage", "what"), DAMAGE, ids=[d for d, _ in DAMAGE])
def test_a_damaged_index_is_said_to_be_damaged_and_the_next_index_rebuilds_it(
    pg_uri: str, tmp_path: Path, damage: str, what: str
) -> None:
    """Tables, columns, crag's function or meta values damaged by hand: a search said what the
    server said ("relation crag.chunks does not exist"), or gave a traceback, and `crag index`
    answered "already up to date", so nothing could mend it short of dropping the schema."""
    import psycopg

    from crag.errors import IndexStoreError

    kb = make_kb(tmp_path / "docs")
    cfg = Settings(store=pg_uri)
    index_roots(cfg, [kb])
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(damage)
    with pytest.raises(IndexStoreError) as caught:
        open_index(cfg).search("uploads retried", 2)
    said = re.fullmatch(
        re.escape(f"the index in {redact(pg_uri)} is damaged (") + "(.+)"
        + re.escape(f"): run `python -m crag index PATH` (with KB_AGENT_STORE={redact(pg_uri)}) to rebuild it"),
        str(caught.value),
    )
    assert said is not None, str(caught.value)
    # rows gone are counted by an update's check alone; a search finds a ranked row missing
    assert re.fullmatch(r"chunk \d+ has no metadata", said[1]) if damage == "DELETE FROM crag.chunks" else said[1] == what
    report = index_roots(cfg, [kb], lock_timeout=20)
    assert report.reembedded_all and what in report.reason and len(report.added) + len(report.changed) == 5
    with open_index(cfg) as reader:
        assert reader.search("how often are uploads retried", 1)[0].path.endswith("setup.md")


@pytest.mark.parametrize("damage", ["DROP TABLE crag.postings", "UPDATE crag.meta SET value = 'abc' WHERE key = 'chunks'"])
def test_rebuilding_a_damaged_index_from_one_root_keeps_the_others(pg_uri: str, tmp_path: Path, damage: str) -> None:
    """docs/cli.md: `crag index` of any one of its roots rebuilds it with all of them. The
    salvage read the roots through the whole state, which the damage broke: the other root
    left the index without a word, as the embedded store's salvage does not let it."""
    import psycopg

    kb = make_kb(tmp_path / "docs")
    write(tmp_path / "notes" / "n.md", "# Notes\n\nThe egret nests by the river.\n")
    cfg = Settings(store=pg_uri)
    index_roots(cfg, [kb, tmp_path / "notes"])
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(damage)
    report = index_roots(cfg, [kb], lock_timeout=20)
    assert report.reembedded_all
    with open_index(cfg) as reader:
        assert set(reader.roots) == {str(kb), str(tmp_path / "notes")}
        assert reader.search("egret nests", 1)[0].path.endswith("n.md")


def test_a_damaged_index_is_one_line_on_the_command_line(pg_uri: str, tmp_path: Path) -> None:
    import psycopg

    make_kb(tmp_path / "docs")
    env = env_for(pg_uri, tmp_path)
    assert crag(env, tmp_path, "index", "docs").returncode == 0
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("UPDATE crag.meta SET value = 'abc' WHERE key = 'chunks'")
    for argv in (("search", "uploads"), ("ask", "How often are uploads retried?"), ("roots",)):
        run = crag(env, tmp_path, *argv)
        assert run.returncode == 1, (argv, run.stderr)
        assert run.stderr.strip().splitlines() == [
            f"crag: error: the index in {redact(pg_uri)} is damaged (meta chunks is not a number): "
            f"run `python -m crag index PATH` (with KB_AGENT_STORE={redact(pg_uri)}) to rebuild it"
        ], argv
    rebuilt = crag(env, tmp_path, "index", "docs")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "re-embedded everything: the previous index could not be read" in rebuilt.stdout
    assert crag(env, tmp_path, "search", "uploads").returncode == 0


@pytest.mark.parametrize("failure", ["embedder", "vector extension"])
def test_a_failed_rebuild_of_a_damaged_index_leaves_it_as_it_was(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """docs/postgresql.md, Safety: a failed `crag index` leaves the previous state. The rebuild
    of a damaged index dropped crag's tables in a transaction of its own, committed before it
    indexed anything: an embeddings server down, or a vector extension the role may not create
    again, then left no files, no chunks and no roots ("no index in ..."), where the embedded
    store keeps its previous generation."""
    import psycopg

    from crag.index.hash_embedder import HashEmbedder

    uri, damage, what = pg_uri, "DROP FUNCTION crag.fold_diacritics CASCADE", "function crag.fold_diacritics is missing"
    if failure == "vector extension":  # a role that owns crag's tables but may not create the extension
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            database = conn.execute("SELECT current_database()").fetchone()[0]
            conn.execute("DROP ROLE IF EXISTS crag_mender")
            conn.execute("CREATE ROLE crag_mender LOGIN")
            conn.execute(f"GRANT CONNECT, CREATE ON DATABASE {database} TO crag_mender")
            conn.execute("CREATE EXTENSION vector")
        uri = pg_uri.replace("postgres:@", "crag_mender@").replace("postgres@", "crag_mender@")
        damage, what = "DROP EXTENSION vector CASCADE", "column crag.chunks.embedding is missing"
    kb = make_kb(tmp_path / "docs")
    cfg = Settings(store=uri)
    index_roots(cfg, [kb])
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(damage)
    if failure == "embedder":
        def down(self: object, texts: object) -> None:
            raise RuntimeError("the embeddings server is down")

        monkeypatch.setattr(HashEmbedder, "embed", down)
    with pytest.raises((RuntimeError, IndexStoreError)) as failed:
        index_roots(cfg, [kb], lock_timeout=20)
    assert ("is down" if failure == "embedder" else "lacks the vector extension") in str(failed.value)
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM crag.files").fetchone()[0] == 5
        assert conn.execute("SELECT path FROM crag.roots").fetchall() == [(str(kb),)]
    with pytest.raises(IndexStoreError, match=re.escape(f"is damaged ({what})")):
        open_index(cfg).search("uploads retried", 2)
    monkeypatch.undo()
    if failure == "vector extension":
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
    report = index_roots(cfg, [kb], lock_timeout=20)
    assert report.reembedded_all and what in report.reason
    with open_index(cfg) as reader:
        assert reader.search("how often are uploads retried", 1)[0].path.endswith("setup.md")


@pytest.mark.parametrize("damage", ["UPDATE crag.meta SET value = 'x' WHERE key = 'chunks'",
                                    "DROP TABLE crag.chunks CASCADE"])
def test_readers_during_the_rebuild_of_a_damaged_index_wait_for_it(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """docs/postgresql.md, Safety: readers wait for the rebuild of a damaged index. They waited
    for its lock on crag's tables inside a snapshot taken before it committed, in which the
    tables it created were empty: `crag roots` said "no roots ... adds one", exit status 0, and
    `crag search` "no index ... yet", or "is damaged", of the index just rebuilt."""
    import threading

    import psycopg

    from crag.index.hash_embedder import HashEmbedder

    kb = make_kb(tmp_path / "docs")
    cfg = Settings(store=pg_uri)
    index_roots(cfg, [kb])
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(damage)
    started, go, done = threading.Event(), threading.Event(), []
    embed = HashEmbedder.embed

    def held(self: HashEmbedder, texts: list[str]) -> object:  # the rebuild, its tables dropped, waits for `go`
        started.set()
        go.wait(60)
        return embed(self, texts)

    monkeypatch.setattr(HashEmbedder, "embed", held)
    rebuild = threading.Thread(target=lambda: done.append(index_roots(cfg, [kb], lock_timeout=20)))
    rebuild.start()
    try:
        assert started.wait(60)
        env = env_for(pg_uri, tmp_path)
        readers = [subprocess.Popen([sys.executable, "-m", "crag", *argv], cwd=tmp_path, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for argv in (("roots",), ("search", "uploads retried"))]
        waiting, deadline = 0, time.monotonic() + 60
        with psycopg.connect(pg_uri, autocommit=True) as conn:
            while waiting < 2 and time.monotonic() < deadline and all(r.poll() is None for r in readers):
                time.sleep(0.1)
                waiting = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND wait_event_type = 'Lock'").fetchone()[0]
        assert [r.poll() for r in readers] == [None, None]  # waiting for the rebuild
    finally:
        go.set()
        rebuild.join(60)
    assert done and done[0].reembedded_all
    (roots_out, roots_err), (search_out, search_err) = (r.communicate(timeout=120) for r in readers)
    assert readers[0].returncode == 0, roots_err
    assert roots_out.startswith(f"1 root in {redact(pg_uri)} "), roots_out
    assert readers[1].returncode == 0, search_err
    assert "setup.md" in search_out


@pytest.mark.parametrize(("uri", "reason"), [
    ("postgresql://crag:sekret9@127.0.0.1:9/kb?sslmod=require", 'invalid URI query parameter: "sslmod"'),
    ("postgresql://crag:sek%ZZret9@127.0.0.1:9/kb", 'invalid percent-encoded token: "***"'),
    ("postgresql://crag:sekret9@[::1:9/kb", "end of string reached when looking for matching"),
    # a %-escape of a byte that is not UTF-8 text: a traceback (UnicodeDecodeError), in a value or the password
    ("postgresql://crag:sekret9@127.0.0.1:9/kb?application_name=%FF", "a %-escape that is not UTF-8 text"),
    ("postgresql://crag:sek%FFret9@127.0.0.1:9/kb", "a %-escape that is not UTF-8 text"),
])
def test_a_store_uri_libpq_cannot_read_is_a_configuration_error(uri: str, reason: str, tmp_path: Path) -> None:
    """A misspelt parameter, a bad %-escape, an unclosed [: the URI is wrong, not the server
    unreachable (it said "cannot reach the PostgreSQL server", exit status 1). ``crag log``,
    which reads a local file, listed "no logged answers" for the same URI."""
    for argv in (("search", "anything"), ("log",)):
        line = setting_error(env_for(uri, tmp_path), tmp_path, argv)
        assert line.startswith(f"crag: error: KB_AGENT_STORE={redact(uri)} is not valid: expected a postgresql:// URI "
                               "that libpq reads") and reason in line, line


def setting_error(env: dict[str, str], tmp_path: Path, argv: tuple[str, ...]) -> str:
    """The one line ``crag ARGV`` prints for a setting it refuses (exit status 2), which shows
    no part of the password ("sek...")."""
    run = crag(env, tmp_path, *argv)
    assert run.returncode == 2, (argv, run.stderr)
    (line,) = run.stderr.strip().splitlines()
    assert "sek" not in run.stderr + run.stdout
    return line


@pytest.mark.parametrize(("uri", "reason", "offline"), [
    ("postgresql://crag:sekret9@127.0.0.1:9/kb?sslmode=bogus", 'invalid sslmode value: "bogus"', True),
    ("postgresql://crag:sekret9@127.0.0.1:abc/kb", 'invalid integer value "abc" for connection option "port"', True),
    ("postgresql://crag:sekret9@127.0.0.1:99999/kb", 'invalid port number: "99999"', True),
    ("postgresql://crag:sekret9@127.0.0.1:9/kb?gssencmode=bogus", 'invalid gssencmode value: "bogus"', False),
    ("postgresql://crag:sekret9@127.0.0.1:9/kb?target_session_attrs=bogus", "invalid target_session_attrs value", False),
])
def test_a_setting_libpq_refuses_is_a_configuration_error(uri: str, reason: str, offline: bool, tmp_path: Path) -> None:
    """An sslmode or a port libpq refuses before connecting said "cannot reach the PostgreSQL
    server ... connection is bad: invalid sslmode value", exit status 1: the URI is wrong, and
    docs/postgresql.md makes that a setting's error, exit status 2. An sslmode or a port is
    refused without connecting, so ``crag log`` (which reads a local file) refuses it too."""
    for argv in (("search", "anything"), ("log",)) if offline else (("search", "anything"),):
        line = setting_error(env_for(uri, tmp_path), tmp_path, argv)
        assert line.startswith(f"crag: error: KB_AGENT_STORE={redact(uri)} is not valid: expected a postgresql:// URI "
                               "whose settings libpq accepts (") and reason in line, line
    from_environment = {**env_for("postgresql://crag:sekret9@127.0.0.1:9/kb", tmp_path), "PGSSLMODE": "bogus"}
    run = crag(from_environment, tmp_path, "search", "anything")
    assert run.returncode == 2 and run.stderr.startswith("crag: error: PGSSLMODE=bogus is not valid: "), run.stderr


def test_options_the_server_refuses_are_a_configuration_error(pg_uri: str, tmp_path: Path) -> None:
    """A server that was reached and refused the URI's options ("FATAL: unrecognized configuration
    parameter") said "cannot reach the PostgreSQL server", exit status 1, as if it were down."""
    make_kb(tmp_path / "docs")
    assert crag(env_for(pg_uri, tmp_path), tmp_path, "index", "docs").returncode == 0
    uri = pg_uri + ("&" if "?" in pg_uri else "?") + "options=-c%20bogus_guc%3D1"
    run = crag(env_for(uri, tmp_path), tmp_path, "search", "uploads")
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("crag: error: KB_AGENT_STORE=") and line.endswith(
        'whose options the server accepts (it refused them: unrecognized configuration parameter "bogus_guc")'), line
    run = crag({**env_for(pg_uri, tmp_path), "PGOPTIONS": "-c bogus_guc=1"}, tmp_path, "search", "uploads")
    assert run.returncode == 2 and run.stderr.startswith("crag: error: PGOPTIONS=-c bogus_guc=1 is not valid: "), run.stderr
    assert crag(env_for(pg_uri, tmp_path), tmp_path, "search", "uploads").returncode == 0


def test_a_search_blocked_by_a_lock_ends_with_one_line_instead_of_waiting_for_ever(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session holding a lock on crag's tables (an administrator's VACUUM FULL or ALTER
    TABLE) made a search wait as long as it held it: `crag ask` hung with nothing on the screen."""
    import psycopg

    from crag.errors import IndexStoreError
    from crag.index import postgres

    index_roots(Settings(store=pg_uri), [make_kb(tmp_path / "kb")])
    monkeypatch.setattr(postgres, "READ_TIMEOUT_MS", 500)
    with open_index(Settings(store=pg_uri)) as reader, psycopg.connect(pg_uri) as admin:
        admin.execute("LOCK TABLE crag.chunks IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(IndexStoreError) as caught:
            reader.search("uploads retried", 2)
        assert str(caught.value) == (
            f"the PostgreSQL server {redact(pg_uri)} did not answer a read of the index within 0.5 s (another session may "
            "hold a lock on crag's tables, as an upgrade of the index does, or the server is overloaded): try again later"
        )
        admin.rollback()
        assert reader.search("uploads retried", 1)[0].path.endswith("setup.md")


def test_a_pdf_whose_text_holds_nul_is_indexed_not_the_run_failed(pg_uri: str, tmp_path: Path) -> None:
    pytest.importorskip("pypdf", reason="the pdf extra (make install has it)")
    from .test_readers import make_pdf

    # Helvetica's code 0 reads as U+0000, which PostgreSQL refuses in text: the whole run
    # failed with "invalid byte sequence for encoding UTF8: 0x00" and nothing was indexed.
    make_kb(tmp_path / "docs", n=0)
    make_pdf(tmp_path / "docs" / "valve.pdf", [["The zorblax valve\x00 opens at dawn."]])
    env = env_for(pg_uri, tmp_path)
    done = crag(env, tmp_path, "index", "docs")
    assert done.returncode == 0, done.stderr
    assert "3 added" in done.stdout
    found = crag(env, tmp_path, "search", "--json", "zorblax valve")
    hits = json.loads(found.stdout)
    assert hits[0]["path"] == "docs/valve.pdf" and hits[0]["text"] == "The zorblax valve opens at dawn."


def test_a_role_that_may_not_upgrade_an_older_index_is_told_which_role_can(pg_uri: str, tmp_path: Path) -> None:
    """An index of an older format, and ``crag index`` run by a role that does not own crag's
    schema: a reader's role was told to get CREATE on the database ("crag creates its schema on
    first use"; the schema was there, and that grant would not have let it upgrade), a writer's
    role only "must be owner of function fts_text". Both now hear that the index needs upgrading
    and which role may do it; that role's ``crag index`` upgrades it and the reader searches."""
    import psycopg

    from crag.index.postgres_schema import SCHEMA_VERSION

    make_kb(tmp_path / "docs")
    owner = env_for(pg_uri, tmp_path)
    assert crag(owner, tmp_path, "index", "docs").returncode == 0
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        for role in ("crag_old_reader", "crag_old_writer"):
            conn.execute(f"DROP ROLE IF EXISTS {role}")
            conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"GRANT USAGE ON SCHEMA crag TO {role}")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA crag TO crag_old_reader")
        conn.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA crag TO crag_old_writer")
        conn.execute("GRANT CREATE ON SCHEMA crag TO crag_old_writer")
        conn.execute(f"DELETE FROM crag.migrations WHERE version > {SCHEMA_VERSION - 1}")  # the previous format
    for role in ("crag_old_reader", "crag_old_writer"):
        env = env_for(pg_uri.replace("postgres:@", f"{role}@").replace("postgres@", f"{role}@"), tmp_path)
        run = crag(env, tmp_path, "index", "docs")
        assert run.returncode == 1 and run.stdout == "", run.stdout
        (line,) = run.stderr.strip().splitlines()
        assert line.startswith(f"crag: error: the index in {redact(env['KB_AGENT_STORE'])} has format "
                               f"{SCHEMA_VERSION - 1}, this crag reads format {SCHEMA_VERSION}"), line
        assert f"role {role} may not upgrade it" in line and "as postgres, the role that owns" in line, line
        assert "CREATE ON DATABASE" not in line, line
    assert crag(owner, tmp_path, "index", "docs").returncode == 0
    reader = env_for(pg_uri.replace("postgres:@", "crag_old_reader@").replace("postgres@", "crag_old_reader@"), tmp_path)
    found = crag(reader, tmp_path, "search", "retries")
    assert found.returncode == 0 and "retries" in found.stdout, found.stderr


@pytest.mark.parametrize("how", ["uri", "environment"])
def test_a_client_encoding_other_than_utf8_still_indexes_and_searches_any_text(
        pg_uri: str, tmp_path: Path, how: str) -> None:
    """``?client_encoding=LATIN1`` in the URI, or ``PGCLIENTENCODING`` in the environment (libpq
    reads both): ``crag index`` of a document with an emoji or CJK text ended in a
    UnicodeEncodeError traceback. crag's text is UTF-8 whatever the session's default."""
    write(tmp_path / "docs" / "gecko.md", "# Gecko\n\nThe gecko 🦎 naps in 東京 every afternoon.\n")
    env = env_for(pg_uri + "&client_encoding=LATIN1" if how == "uri" else pg_uri, tmp_path)
    if how == "environment":
        env["PGCLIENTENCODING"] = "LATIN1"
    run = crag(env, tmp_path, "index", "docs")
    assert run.returncode == 0 and "1 added" in run.stdout, run.stderr
    found = crag(env, tmp_path, "search", "gecko naps", "--json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)[0]["text"].endswith("The gecko 🦎 naps in 東京 every afternoon.")


def test_a_search_stopped_by_the_users_own_statement_timeout_names_that_timeout(pg_uri: str, tmp_path: Path) -> None:
    """crag keeps a statement_timeout the URI (``options``), PGOPTIONS or the role set; a search it
    stopped was reported as "did not answer a search within 120 s", a time that was never waited."""
    import psycopg

    from crag.errors import IndexStoreError

    index_roots(Settings(store=pg_uri), [make_kb(tmp_path / "kb")])
    uri = pg_uri + "&options=-c%20statement_timeout%3D300"
    with open_index(Settings(store=uri)) as reader, psycopg.connect(pg_uri) as admin:
        admin.execute("LOCK TABLE crag.chunks IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(IndexStoreError) as caught:
            reader.search("uploads retried", 2)
        assert str(caught.value).startswith(
            f"the PostgreSQL server {redact(uri)} did not answer a read of the index within 300ms (its statement_timeout, "
            "set by KB_AGENT_STORE's options, PGOPTIONS or the role; another session may hold a lock"
        ), str(caught.value)
        admin.rollback()


@pytest.mark.parametrize("how", ["uri", "environment", "role"])
def test_the_users_statement_timeout_is_named_when_it_stops_crags_first_statements(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A statement_timeout of 1 or 2 ms stopped the statements that open the index (its format,
    read before crag recorded the user's timeout): the line said "within 120 s", crag's own,
    which that session never had. A lock on crag.migrations stops them here, at 300 ms. The
    role's (``ALTER ROLE ... SET``), which no option shows, was still said to be crag's 120 s."""
    import psycopg

    index_roots(Settings(store=pg_uri), [make_kb(tmp_path / "kb")])
    uri = pg_uri + "&options=-c%20statement_timeout%3D300" if how == "uri" else pg_uri
    if how == "environment":
        monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=300")
    if how == "role":  # in this test's database alone
        with psycopg.connect(pg_uri, autocommit=True) as admin:
            admin.execute("DO $$ BEGIN EXECUTE format('ALTER ROLE %I IN DATABASE %I SET statement_timeout = 300', "
                          "current_user, current_database()); END $$")
    with psycopg.connect(pg_uri) as admin:
        admin.execute("LOCK TABLE crag.migrations IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(IndexStoreError) as caught:
            open_index(Settings(store=uri)).search("uploads retried", 2)
        admin.rollback()
    assert str(caught.value).startswith(
        f"the PostgreSQL server {redact(uri)} did not answer a read of the index within 300ms (its statement_timeout, "
    ), str(caught.value)


def test_crag_index_stopped_reading_the_index_by_a_statement_timeout_does_not_speak_of_a_search(
    pg_uri: str, tmp_path: Path
) -> None:
    """`crag index` reads the index before it updates it; stopped there by the user's
    statement_timeout, it said the server "did not answer a search", which it had not run."""
    import psycopg

    from crag.errors import IndexStoreError

    kb = make_kb(tmp_path / "kb")
    index_roots(Settings(store=pg_uri), [kb])
    uri = pg_uri + "&options=-c%20statement_timeout%3D300"
    with psycopg.connect(pg_uri) as admin:
        admin.execute("LOCK TABLE crag.migrations IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(IndexStoreError) as caught:
            index_roots(Settings(store=uri), [kb], lock_timeout=5)
        admin.rollback()
    assert str(caught.value).startswith(
        f"the PostgreSQL server {redact(uri)} did not answer a read of the index within 300ms (its statement_timeout, "
    ), str(caught.value)


def test_an_update_stopped_by_the_users_statement_timeout_says_how_to_run_without_it(
    pg_uri: str, tmp_path: Path
) -> None:
    """A statement_timeout of the URI, PGOPTIONS or the role (a managed service's role often has
    one) that stopped an update was only "canceling statement due to statement timeout"; here
    another session holds the row the update rewrites, so its write is the statement stopped."""
    import psycopg

    make_kb(tmp_path / "docs")
    assert crag(env_for(pg_uri, tmp_path), tmp_path, "index", "docs").returncode == 0
    write(tmp_path / "docs" / "setup.md", "# Setup\n\n## Retries\n\nThe client retries failed uploads five times.\n")
    uri = pg_uri + "&options=-c%20statement_timeout%3D1000"
    with psycopg.connect(pg_uri) as admin:
        admin.execute("SELECT * FROM crag.files FOR UPDATE").fetchall()
        run = crag(env_for(uri, tmp_path), tmp_path, "index", "docs")
        admin.rollback()
    assert run.returncode == 1 and run.stdout == "", run.stdout
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"crag: error: the PostgreSQL server {redact(uri)} failed: canceling statement due to "
                           "statement timeout: a statement_timeout (KB_AGENT_STORE's options, PGOPTIONS or the "
                           "role's) stopped the update, and the index is as it was; run `python -m crag index` "
                           "without one, e.g. `options=-c%20statement_timeout%3D0`"), line
    rerun = crag(env_for(uri.replace("%3D1000", "%3D0"), tmp_path), tmp_path, "index", "docs")
    assert rerun.returncode == 0 and "1 changed" in rerun.stdout, rerun.stderr  # the index was as it was


def test_an_index_that_could_not_be_read_just_now_is_not_rebuilt(pg_uri: str, tmp_path: Path) -> None:
    """``crag index`` whose read of the index was stopped (here by the user's statement_timeout,
    another session holding crag.files) took the index for damaged and re-embedded everything
    once the table was free again: "re-embedded everything: the previous index could not be read"."""
    import psycopg

    make_kb(tmp_path / "docs")
    assert crag(env_for(pg_uri, tmp_path), tmp_path, "index", "docs").returncode == 0
    env = env_for(pg_uri + "&options=-c%20statement_timeout%3D1000", tmp_path)
    waiting = ("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'crag.files'::regclass "
               "AND pid <> pg_backend_pid()")
    with psycopg.connect(pg_uri) as admin, psycopg.connect(pg_uri, autocommit=True) as watch:
        admin.execute("LOCK TABLE crag.files IN ACCESS EXCLUSIVE MODE")
        run = subprocess.Popen([sys.executable, "-m", "crag", "index", "docs"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not watch.execute(waiting).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.01)  # the indexer's read waits for the table ...
        while watch.execute(waiting).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.01)  # ... until its statement_timeout stops it
        admin.rollback()
        out, err = run.communicate(timeout=120)
    assert run.returncode == 1 and "re-embedded" not in out + err, out + err
    assert "did not answer" in err and "statement_timeout" in err, err


def test_a_search_path_without_pgvector_is_named_with_the_fix_when_searching(pg_uri: str, tmp_path: Path) -> None:
    """``options=-c search_path=...`` (or PGOPTIONS, or the role's) leaving out pgvector's schema:
    ``crag index`` of an up-to-date index worked, then every search failed with only
    'type "vector" does not exist'."""
    make_kb(tmp_path / "docs")
    assert crag(env_for(pg_uri, tmp_path), tmp_path, "index", "docs").returncode == 0
    env = env_for(pg_uri + "&options=-c%20search_path%3Delsewhere", tmp_path)
    run = crag(env, tmp_path, "search", "retries")
    assert run.returncode == 1 and run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert 'type "vector" does not exist' in line and "search_path" in line and "public" in line, line


def test_the_no_index_hint_does_not_name_the_index_folder_kb_agent_store_overrides(pg_uri: str, tmp_path: Path) -> None:
    """With KB_AGENT_STORE set, `--index DIR` is not used (a warning says so), yet the hint said
    "run `python -m crag --index DIR index PATH` first": a command that would not index the database either."""
    run = crag(env_for(pg_uri, tmp_path), tmp_path, "search", "--index", str(tmp_path / "folder"), "docker")
    assert run.returncode == 1, run.stderr
    warning, error = run.stderr.strip().splitlines()
    assert warning.startswith("crag: warning: --index DIR is not used while KB_AGENT_STORE names a database"), warning
    assert error == f"crag: error: no index in {redact(pg_uri)}: run `python -m crag index PATH` first", error


@pytest.mark.parametrize("encoding", ["SQL_ASCII", "LATIN1"])
def test_a_database_whose_encoding_is_not_utf8_is_refused_with_how_to_make_one(
        pg_server, tmp_path: Path, encoding: str) -> None:
    """In a SQL_ASCII database ``crag.fold_diacritics`` worked byte by byte ('café' folded to
    'cafae'), so `cafe` found nothing; a LATIN1 one failed every `crag index`, even of ASCII
    text, with "character with byte sequence 0xc4 0x80 ... has no equivalent". crag needs UTF8."""
    import psycopg

    name = f"crag_{encoding.lower()}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    with psycopg.connect(database_uri(pg_server, name), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    uri = database_uri(pg_server, name)
    write(tmp_path / "docs" / "office.md", "# Office\n\nOur café in Zürich opens at nine.\n")
    env = env_for(uri, tmp_path)
    for argv in (("index", "docs"), ("search", "cafe"), ("roots",)):
        run = crag(env, tmp_path, *argv)
        assert run.returncode == 1, (argv, run.stdout, run.stderr)
        (line,) = run.stderr.strip().splitlines()
        assert line.startswith(f"crag: error: the PostgreSQL database {redact(uri)} has encoding {encoding}, "
                               "and crag needs UTF8"), line
        assert f"`CREATE DATABASE {name}_utf8 ENCODING 'UTF8' TEMPLATE template0;`" in line, line
    with psycopg.connect(database_uri(pg_server, name)) as conn:  # refused before anything was written
        assert conn.execute("SELECT to_regclass('crag.migrations')").fetchone()[0] is None


def test_a_role_without_connect_on_the_database_is_told_the_grant_not_that_the_server_is_unreachable(
        pg_server, tmp_path: Path) -> None:
    """"cannot reach the PostgreSQL server ...: FATAL: permission denied for database": the
    server was reached, and refused; the fix is a GRANT CONNECT (docs/postgresql.md)."""
    import psycopg

    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS crag_noconnect")
        conn.execute("DROP ROLE IF EXISTS crag_no_connect")
        conn.execute("CREATE ROLE crag_no_connect LOGIN")
        conn.execute("CREATE DATABASE crag_noconnect")
        conn.execute("REVOKE CONNECT ON DATABASE crag_noconnect FROM PUBLIC")
    uri = database_uri(pg_server, "crag_noconnect").replace("postgres:@", "crag_no_connect@").replace(
        "postgres@", "crag_no_connect@")
    run = crag(env_for(uri, tmp_path), tmp_path, "search", "anything")
    assert run.returncode == 1, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"crag: error: the PostgreSQL server {redact(uri)} refused the connection: "), line
    assert 'permission denied for database "crag_noconnect"' in line, line
    assert line.endswith("run `GRANT CONNECT ON DATABASE crag_noconnect TO crag_no_connect;` (docs/postgresql.md)"), line


def test_of_several_hosts_the_one_that_refused_the_login_is_named_not_the_last_one_down(
        pg_server, tmp_path: Path) -> None:
    """psycopg's first line is the last host's failure: a URI whose first host refused the login
    and whose second is down said only "cannot reach ...: Connection refused"."""
    from urllib.parse import parse_qs, urlsplit

    socket_dir = parse_qs(urlsplit(pg_server.get_uri()).query)["host"][0]
    port = next(Path(socket_dir).glob(".s.PGSQL.*")).name.rsplit(".", 1)[1]
    uri = f"postgresql://crag_nobody_here:sekret9@/postgres?host={socket_dir},127.0.0.1&port={port},9"
    run = crag(env_for(uri, tmp_path), tmp_path, "search", "anything")
    assert run.returncode == 1, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"crag: error: the PostgreSQL server {redact(uri)} refused the login: "), line
    assert 'role "crag_nobody_here" does not exist' in line and "sekret9" not in run.stderr, line


def test_a_process_forked_after_the_agent_searched_reads_on_connections_of_its_own(
        pg_uri: str, tmp_path: Path, monkeypatch) -> None:
    """A server that makes its agent and then forks its workers kept, in each child, the
    parent's per-thread connection: both processes sent queries on one session and read each
    other's results, so the parent's searches failed ("got no result", "the last operation
    didn't produce a result", even a ValueError from another query's rows) and the child hung.
    A forked child now opens its own, and the parent's session is not ended by the child."""
    from crag import Agent

    docs = make_kb(tmp_path / "docs", n=6)
    monkeypatch.chdir(tmp_path)
    agent = Agent.from_env([docs], dotenv=None, environ={}, llm="offline", store=pg_uri, log=False)

    def found(n: int) -> list[str]:
        said = []
        for _ in range(15):
            try:
                hits = agent.search(f"page {n} edition {n}", top_k=1)
                said.append("ok" if hits and hits[0].source.endswith(f"page{n:03d}.md") else f"found {hits[:1]}")
            except Exception as exc:
                said.append(f"{type(exc).__name__}: {exc}")
        return said

    assert found(1) == ["ok"] * 15  # the session the child inherits is open
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        try:
            signal.alarm(60)
            os.write(write_end, json.dumps(found(2)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    parent = found(4)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    assert parent == ["ok"] * 15
    assert child and json.loads(child) == ["ok"] * 15
    assert found(5) == ["ok"] * 15  # the child's exit ended nothing of the parent's
    agent.close()


def test_an_update_reads_only_the_postings_of_the_rows_it_removes(
    pg_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changing a file removes its rows' postings by (lexeme, id): not every row of its frequent
    words (a scan by lexeme alone, which made each changed file cost seconds on a large index)."""
    from crag.index.postgres_update import PostgresUpdate

    kb = tmp_path / "kb"
    for n in range(300):
        unique = " ".join(f"word{n}x{k}" for k in range(20))
        write(kb / f"doc{n:03d}.md", f"# Doc {n}\n\nThe archive server keeps backup records. {unique}.\n")
    cfg = Settings(store=pg_uri)
    index_roots(cfg, [kb])
    write(kb / "doc007.md", "# Doc 7\n\nThe archive server keeps backup records, rewritten.\n")
    read: list[int] = []
    commit = PostgresUpdate.commit

    def counted(self: PostgresUpdate) -> int:
        read.append(self.conn.execute(
            "SELECT pg_stat_get_xact_tuples_returned('crag.postings_lexeme'::regclass)").fetchone()[0])
        return commit(self)

    monkeypatch.setattr(PostgresUpdate, "commit", counted)
    index_roots(cfg, [kb])
    # doc007's one chunk had 27 postings; "archive", "server", ... each hold 300 rows
    assert read and read[0] < 100, read
