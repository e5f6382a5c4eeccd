"""Fixtures for the store tests: SQLite files in tmp_path, PostgreSQL schemas per test.

PostgreSQL tests read ``PRIOQUEUE_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``) and skip, saying why, when the server is not
reachable, unless ``PRIOQUEUE_REQUIRE_POSTGRES=1`` (CI sets it): then they fail.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prioqueue.store import PostgresStore, SQLiteStore, Store

from .pg import POSTGRES_URL, drop_schema, need_postgres


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh PostgreSQL schema for one test, dropped afterwards."""
    need_postgres()
    schema = f"pq_test_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        drop_schema(schema)


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
            drop_schema(schema)
        return
    for store in opened:
        store.close()
