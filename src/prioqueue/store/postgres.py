"""The PostgreSQL backend (psycopg 3, the ``postgres`` extra) (private).

Same tables as SQLite. Every append locks the leader row ``FOR SHARE`` and compares its epoch
inside the append's transaction: a takeover's ``UPDATE`` of that row waits for an append that
passed the check and every later check sees the new epoch, so a deposed leader can never add a
row after the new leader recovered (fencing). An append without a snapshot is one statement
(:data:`_APPEND`: the fence and the insert in one CTE, its own transaction in autocommit), so
one round trip; before issue 30 it was five (BEGIN, check, insert, fence, COMMIT).
``idle_in_transaction_session_timeout`` makes the server end a transaction whose client
stopped (SIGSTOP), so a hung leader cannot hold that row lock and block the takeover.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prioqueue.store.base import Store
from prioqueue.store.errors import StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresStore", "connect"]

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_SETUP_LOCK = "SELECT pg_advisory_xact_lock(hashtext('prioqueue.setup'))"

# One statement, so one round trip and its own transaction (the connection autocommits):
# ``fence`` locks the leader row FOR SHARE and reads its epoch (referenced twice, so it is
# evaluated once); the rows go in only when it is the writer's. A takeover's UPDATE waits for
# this statement's commit, and a statement that starts after it sees the new epoch.
_APPEND = """
WITH fence AS (SELECT epoch FROM prioqueue_leader WHERE id = 1 FOR SHARE),
added AS (
    INSERT INTO prioqueue_journal (seq, epoch, op, args, now)
    SELECT t.seq, fence.epoch, t.op, t.args, t.now
    FROM fence, unnest(%s::bigint[], %s::text[], %s::text[], %s::float8[]) AS t(seq, op, args, now)
    WHERE fence.epoch = %s
    RETURNING 1
)
SELECT (SELECT epoch FROM fence), (SELECT count(*) FROM added)
"""


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def connect(
    url: str, *, schema: str | None = None, idle_timeout: float = 5.0
) -> psycopg.Connection[Any]:
    """Open an autocommit connection, with ``search_path`` set to ``schema`` (created if missing).

    Args:
        url: A libpq URL (``postgresql://user@host:port/db``).
        schema: A schema for the tables (lower-case identifier), or None for the default.
        idle_timeout: Seconds after which the server ends a transaction left idle.

    Raises:
        StoreError: psycopg is not installed, the server is unreachable or ``schema`` is
            not a plain identifier.
    """
    if schema is not None and not _SCHEMA_NAME.match(schema):
        raise ValueError(f"schema must be a lower-case identifier, got {schema!r}")
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise StoreError(
            "PostgreSQL stores need psycopg 3: pip install '.[postgres]' from a clone "
            "(prioqueue-lanes[postgres] once released)"
        ) from exc
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        raise StoreError(f"{_redact(url)}: cannot connect: {exc}") from exc
    try:
        ms = max(1, int(idle_timeout * 1000))
        conn.execute(f"SET idle_in_transaction_session_timeout = {ms}")
        if schema is not None:
            with conn.transaction():
                # CREATE ... IF NOT EXISTS races between sessions; a lock serialises them.
                conn.execute(_SETUP_LOCK)
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            conn.execute(f"SET search_path TO {schema}")
    except psycopg.Error as exc:
        conn.close()
        raise StoreError(f"{_redact(url)}: cannot prepare the session: {exc}") from exc
    return conn


class PostgresStore(Store):
    """A store in a PostgreSQL database (or one schema of it).

    Args:
        url: A libpq URL, e.g. ``postgresql://postgres@127.0.0.1:5432/prioqueue``.
        schema: The schema holding the tables (created if missing); None for the default
            ``search_path``.
        idle_timeout: Seconds after which the server ends a transaction of this connection
            left idle (a process stopped mid-append), freeing its locks for a takeover;
            keep it below the elector's lease.

    Raises:
        StoreError: psycopg is missing or the server is unreachable.
        SchemaVersionError: The tables were written by a newer prioqueue.
        CorruptStore: The schema version row is unreadable.
    """

    kind = "postgresql"

    def __init__(self, url: str, *, schema: str | None = None, idle_timeout: float = 5.0) -> None:
        super().__init__(_redact(url) + ("" if schema is None else f"#{schema}"))
        self.schema = schema
        self._conn = connect(url, schema=schema, idle_timeout=idle_timeout)
        try:
            self._setup()
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    def backend_pid(self) -> int:
        """The server process id of this store's connection (for takeovers)."""
        return int(self._conn.info.backend_pid)

    def _lock_setup(self) -> None:
        self._execute(_SETUP_LOCK)

    def _fence_sql(self) -> str:
        return "SELECT epoch FROM prioqueue_leader WHERE id = 1 FOR SHARE"

    def _append_journal(self, rows: list[tuple[Any, ...]], epoch: int) -> None:
        # One statement inserts the rows and checks the fence (a snapshot's several
        # statements go through the base class's transaction).
        seqs, _, ops, args, nows = zip(*rows, strict=True)
        current, added = self._execute(
            _APPEND, (list(seqs), list(ops), list(args), list(nows), epoch)
        )[0]
        if current != epoch:
            raise self._fenced(epoch, int(current))
        if added != len(rows):  # pragma: no cover - the statement inserts all or raises
            raise StoreError(f"{self.url}: {added} of {len(rows)} journal rows were written")

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            cur = self._conn.execute(sql, tuple(params))
            return cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            raise StoreError(f"{self.url}: {exc}") from exc

    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        import psycopg

        try:
            with self._conn.cursor() as cur:
                cur.executemany(sql, rows)
        except psycopg.Error as exc:
            raise StoreError(f"{self.url}: {exc}") from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        import psycopg

        try:
            with self._conn.transaction():
                yield
        except psycopg.Error as exc:
            raise StoreError(f"{self.url}: transaction failed: {exc}") from exc

    def _close(self) -> None:
        self._conn.close()
