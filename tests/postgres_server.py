"""A real PostgreSQL with pgvector for the tests, started by them (the ``pgserver`` package).

``pg_server`` (session) starts PostgreSQL 16 in a temporary folder on a Unix socket and
stops it afterwards; ``pg_uri`` gives each test a fresh empty database. Tests that need
it are skipped, saying why, only when pgserver is not installed or the server cannot start.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    try:
        import pgserver
        import psycopg  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"PostgreSQL tests need the dev extra (pgserver and psycopg): {exc}")
    # A short path: the server's Unix socket path must stay under about 100 bytes.
    folder = tempfile.mkdtemp(prefix="crag-pg-")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR is not set
            server = pgserver.get_server(folder, cleanup_mode="stop")
    except Exception as exc:  # pgserver raises plain exceptions when initdb or pg_ctl fail
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"pgserver could not start PostgreSQL in {folder}: {exc}")
    try:
        yield server
    finally:
        try:
            server.cleanup()
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def database_uri(server: object, name: str) -> str:
    parts = urlsplit(server.get_uri())  # type: ignore[attr-defined]
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@pytest.fixture
def pg_uri(pg_server: object) -> str:
    """A fresh, empty database on the test server."""
    import psycopg

    name = f"crag_test_{next(_databases)}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return database_uri(pg_server, name)
