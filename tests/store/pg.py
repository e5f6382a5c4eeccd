"""PostgreSQL for the store tests: where it is, and skipping (or failing) without it.

Tests read ``PRIOQUEUE_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``)
and skip, saying why, when the server is not reachable, unless ``PRIOQUEUE_REQUIRE_POSTGRES=1``
(CI sets it): then they fail.
"""

from __future__ import annotations

import os

import pytest

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
            _reachable = "psycopg is not installed (pip install '.[postgres]' from a clone)"
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


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        # End sessions a test left behind (an elector's hung leader, say) before dropping.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND application_name = %s",
            (schema,),
        )
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
