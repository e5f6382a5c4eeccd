"""The SQLite backend: one file, WAL, one writer process (private).

The connection runs in WAL mode with ``synchronous=FULL`` by default (a commit is on disk
when it returns; ``synchronous="normal"`` trades power-loss safety for speed) and
``locking_mode=EXCLUSIVE``: the first transaction takes the file's write lock and keeps it
until the store is closed, so a second broker on the same file fails at once with
:class:`StoreLocked` instead of interleaving its journal with ours. Opening runs
``PRAGMA quick_check``, so a truncated or damaged file is refused before anything is read.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from prioqueue.store.base import Snapshot, Store
from prioqueue.store.errors import CorruptStore, StoreError, StoreLocked

__all__ = ["SQLiteStore"]

# Bound parameters per statement: SQLite's historical default limit (999 before 3.32), so a
# multi-row INSERT fits whatever library Python was built with.
_MAX_VARIABLES = 999


class SQLiteStore(Store):
    """A store in one SQLite file (the default backend).

    Args:
        path: The database file; created (with its tables) when missing.
        timeout: Seconds to wait for another process's lock before :class:`StoreLocked`.
        synchronous: ``"full"`` (the default): a commit is on disk (fsync) before it
            returns, so it survives a power loss. ``"normal"``: WAL commits are fsynced only
            at checkpoints; a commit survives the process's crash (SIGKILL) but an operating
            system crash or power loss may lose the last ones. Much faster on slow disks.

    Raises:
        CorruptStore: The file is not a SQLite database, fails its integrity check, or is
            empty (0 bytes) without having been created by this open.
        SchemaVersionError: The file was written by a newer prioqueue.
        StoreLocked: Another process holds the file.
        StoreError: The file cannot be opened (its directory does not exist, no
            permission).
    """

    kind = "sqlite"

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 1.0, synchronous: str = "full"
    ) -> None:
        path = os.fspath(path)
        if not path:
            raise ValueError("path must name a file, got an empty path")
        if synchronous not in ("full", "normal"):
            raise ValueError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
        self.synchronous = synchronous
        super().__init__(f"sqlite:///{os.path.abspath(path)}")
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise StoreError(
                f"{self.url}: the directory {directory} does not exist (create it, or fix the "
                "path: sqlite:///relative.db is relative, sqlite:////absolute.db absolute)"
            )
        try:
            empty = os.path.getsize(path) == 0
        except OSError:  # missing: this open creates it
            empty = False
        if empty:
            # SQLite reads a 0-byte file as a new, empty database: the broker would start
            # with no jobs and hand out job-1 again to a new job, while clients hold the old
            # job-1 (issue 21). A store this class created is never left empty (the first
            # open writes the header), so an empty file was truncated or replaced.
            raise CorruptStore(
                f"{self.url}: the file is empty (0 bytes): a store is never empty once opened, "
                "so it was truncated or replaced; restore it from a backup, or delete it to "
                "start a new store on purpose (job ids restart at job-1)"
            )
        try:
            self._conn = sqlite3.connect(
                path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.url}: cannot open: {exc}") from exc
        try:
            self._configure()
            self._setup()
        except sqlite3.OperationalError as exc:
            self._conn.close()
            self._closed = True
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreLocked(
                    f"{self.url}: another process holds this store (one writer per file)"
                ) from exc
            raise StoreError(f"{self.url}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            self._closed = True
            raise CorruptStore(f"{self.url}: not a valid prioqueue store: {exc}") from exc
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    def _configure(self) -> None:
        conn = self._conn
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise StoreError(f"{self.url}: cannot switch to WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
        # Take the write lock now (and keep it: exclusive locking mode).
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("COMMIT")
        rows = conn.execute("PRAGMA quick_check").fetchall()
        if [tuple(r) for r in rows] != [("ok",)]:
            problems = "; ".join(str(r[0]) for r in rows[:5])
            raise CorruptStore(f"{self.url}: the file fails its integrity check: {problems}")

    # SQLite 3.40 has no ORDER BY inside group_concat; an aggregate over a subquery that
    # is ordered (here a scan of an INTEGER PRIMARY KEY, the rowid) takes its rows in that
    # order (tests/store/test_snapshot_encoding.py checks it with many chunks).
    _concat_parts_sql = (
        "SELECT group_concat(text, '') FROM"
        " (SELECT text FROM temp.prioqueue_snapshot_parts ORDER BY part)"
    )

    def _write_snapshot(self, snapshot: Snapshot, epoch: int, chunks: list[str]) -> None:
        """Write the snapshot's text chunk by chunk into a preallocated blob (Python 3.11+).

        ``group_concat`` builds the whole text in memory (200 MB at 10^5 jobs): on a busy
        machine that allocation stalled the event loop once per snapshot (issue 30). With
        incremental blob I/O SQLite writes ``zeroblob(n)`` pages, then each chunk in place;
        nothing of the text's size is allocated. The value is read back as bytes (JSON all
        the same). Python 3.10 has no ``blobopen``: the database joins the chunks instead.
        """
        blobopen = getattr(self._conn, "blobopen", None)
        if blobopen is None or len(chunks) == 1:
            super()._write_snapshot(snapshot, epoch, chunks)
            return
        data = [chunk.encode() for chunk in chunks]
        self._execute("DELETE FROM prioqueue_snapshot WHERE seq <= %s", (snapshot.seq,))
        self._execute(
            "INSERT INTO prioqueue_snapshot (seq, epoch, taken_at, state) "
            "VALUES (%s, %s, %s, zeroblob(%s))",
            (snapshot.seq, epoch, snapshot.taken_at, sum(map(len, data))),
        )
        rowid = self._execute(
            "SELECT rowid FROM prioqueue_snapshot WHERE seq = %s", (snapshot.seq,)
        )[0][0]
        try:
            with blobopen("prioqueue_snapshot", "state", rowid) as blob:
                for piece in data:
                    blob.write(piece)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.url}: writing the snapshot failed: {exc}") from exc

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql.replace("%s", "?"), tuple(params)).fetchall()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):
                raise
            raise CorruptStore(f"{self.url}: {exc}") from exc

    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        # One multi-row INSERT per chunk, not one statement per row: sqlite3 releases the GIL
        # around every step, and a writer thread that must win the GIL back from a busy event
        # loop once per row waits a switch interval (5 ms) each time. A batch of 2,000 events
        # took seconds that way (issue 21); as one statement it is one hand-off.
        head, sep, values = sql.replace("%s", "?").rpartition(" VALUES ")
        try:
            if not sep or not rows:
                self._conn.executemany(sql.replace("%s", "?"), rows)
                return
            per = max(1, _MAX_VARIABLES // len(rows[0]))
            for start in range(0, len(rows), per):
                chunk = rows[start : start + per]
                statement = head + sep + ",".join([values] * len(chunk))
                self._conn.execute(statement, [v for row in chunk for v in row])
        except sqlite3.Error as exc:
            raise StoreError(f"{self.url}: {exc}") from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise StoreError(f"{self.url}: commit failed: {exc}") from exc

    def _close(self) -> None:
        # Fold the WAL into the main file, so a closed store is one self-contained file (safe
        # to copy). Best effort: a failure leaves the WAL, which the next open replays.
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._conn.close()
