"""Fixtures for the store tests: SQLite files in tmp_path, PostgreSQL schemas per test.

PostgreSQL tests read ``PRIOQUEUE_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and skip, saying why, when the server is not
reachable, unless ``PRIOQUEUE_REQUIRE_POSTGRES=1`` (CI sets it): then they fail.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The shared Hypothesis strategies live in tests/strategies.py.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prioqueue.store import PostgresStore, SQLiteStore, Store

POSTGRES_URL = os.environ.get("PRIOQUEUE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("PRIOQUEUE_REQUIRE_POSTGRES") == "1"

_reachable: str | None = None  # None: not probed yet; "" reachable; else the reason


def postgres_unavailable() -> str:
    """Return "" when PostgreSQL answers, else why not (probed once)."""
    global _reachable  # noqa: PLW0603
    if _reachable is None:
        try:
            import psycopg
        except ImportError:
            _reachable = "psycopg is not installed (pip install 'prioqueue-lanes[postgres]')"
        else:
            try:
                psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
                _reachable = ""
            except psycopg.Error as exc:
                _reachable = f"PostgreSQL at {POSTGRES_URL} is unreachable: {exc}"
    return _reachable


def need_postgres() -> None:
    """Skip (or fail, when PostgreSQL is required) a test PostgreSQL cannot serve."""
    reason = postgres_unavailable()
    if reason:
        if REQUIRE_POSTGRES:
            pytest.fail(f"PRIOQUEUE_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        # End sessions a test left behind (an elector's hung leader, say) before dropping.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND application_name = %s",
            (schema,),
        )
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh PostgreSQL schema for one test, dropped afterwards."""
    need_postgres()
    schema = f"pq_test_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        _drop_schema(schema)


@pytest.fixture(params=["sqlite", "postgresql"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """A factory opening the same store again and again (SQLite file or PostgreSQL schema).

    Each call opens a new connection to the same store (close the previous SQLite one first:
    one writer per file).
    """
    opened: list[Store] = []
    if request.param == "sqlite":
        path = tmp_path / "store.db"

        def make() -> Store:
            store = SQLiteStore(path)
            opened.append(store)
            return store

        yield make
    else:
        need_postgres()
        schema = f"pq_test_{uuid.uuid4().hex[:12]}"

        def make() -> Store:
            store = PostgresStore(POSTGRES_URL, schema=schema)
            opened.append(store)
            return store

        try:
            yield make
        finally:
            for store in opened:
                store.close()
            _drop_schema(schema)
        return
    for store in opened:
        store.close()
