"""The store interface: one schema, two backends (private; see ``prioqueue.store``).

Theory of operation
-------------------
A store holds three things, in four tables that both backends create identically:

* ``prioqueue_journal``: one row per state-changing call, ``(seq, epoch, op, args, now)``.
  ``seq`` counts from 1 without gaps; ``args`` is JSON text; ``epoch`` is the leader epoch that
  wrote the row.
* ``prioqueue_snapshot``: the latest ``snapshot()`` of the dispatcher, at the ``seq`` of the
  last event it includes. Writing one deletes older snapshots and every journal row at or
  below its ``seq`` (pruning), in the same transaction.
* ``prioqueue_leader``: one row ``(epoch, holder, address, pids, expires_at)``: who may write.
  Every append reads the row's epoch inside its own transaction and writes only when it equals
  the writer's (fencing).
* ``prioqueue_meta``: ``schema_version`` (a store from a newer version is refused).

Recovery reads the snapshot and the journal rows after it and checks them (contiguous ``seq``,
valid JSON, a known snapshot); anything else raises :class:`CorruptStore` instead of
recovering part of the history.

The backends are synchronous and not thread-safe: one thread uses a store at a time (the
durable dispatcher gives each store one writer thread).
"""

from __future__ import annotations

import abc
import contextlib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from prioqueue.store._encode import encode_chunks, encode_in_pieces
from prioqueue.store.errors import CorruptStore, Fenced, SchemaVersionError, StoreError

__all__ = [
    "SCHEMA_VERSION",
    "Event",
    "Recovery",
    "Snapshot",
    "Store",
    "encode_chunks",
    "encode_in_pieces",
]

#: The schema version this prioqueue writes and the highest it reads.
SCHEMA_VERSION = 1

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS prioqueue_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS prioqueue_journal ("
    " seq BIGINT PRIMARY KEY, epoch BIGINT NOT NULL, op TEXT NOT NULL, args TEXT NOT NULL,"
    " now DOUBLE PRECISION)",
    "CREATE TABLE IF NOT EXISTS prioqueue_snapshot ("
    " seq BIGINT PRIMARY KEY, epoch BIGINT NOT NULL, taken_at DOUBLE PRECISION NOT NULL,"
    " state TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS prioqueue_leader ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, holder TEXT,"
    " address TEXT, pids TEXT, expires_at DOUBLE PRECISION NOT NULL)",
)


def _json_value(name: str, value: object) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of JSON data, got {type(value).__name__}")


@attrs.frozen
class Event:
    """One journaled call: ``op(**args)`` at time ``now``, number ``seq``.

    Attributes:
        seq: The event's number (1, 2, ... without gaps).
        op: The name of a method the dispatcher's class declares ``@journaled``.
        args: The call's keyword arguments as JSON data (``now`` included when the method
            takes one).
        now: The call's time, or None for a method without one (``set_resident_model``).
    """

    seq: int
    op: str
    args: Mapping[str, Any]
    now: float | None = None
    #: ``args`` as JSON text when the caller has it already (saves encoding twice).
    text: str | None = attrs.field(default=None, eq=False, repr=False, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.seq, int) or isinstance(self.seq, bool) or self.seq < 1:
            raise ValueError(f"seq must be an int >= 1, got {self.seq!r}")
        if not isinstance(self.op, str) or not self.op:
            raise ValueError(f"op must be a non-empty str, got {self.op!r}")
        _json_value("args", self.args)
        if self.now is not None and not (
            isinstance(self.now, (int, float)) and math.isfinite(self.now)
        ):
            raise ValueError(f"now must be a finite number or None, got {self.now!r}")


@attrs.frozen
class Snapshot:
    """A dispatcher snapshot at journal position ``seq`` (the last event it includes).

    Attributes:
        seq: The number of the last event the state includes (0: none).
        taken_at: The snapshot's ``now``.
        state: What the dispatcher's ``snapshot()`` returned.
    """

    seq: int
    taken_at: float
    state: Mapping[str, Any]


@attrs.frozen
class Recovery:
    """What a store holds: the latest snapshot and the journal after it.

    Attributes:
        snapshot: The latest snapshot, or None for a store without one.
        events: The journal events after the snapshot, in order, contiguous.
        epoch: The store's leader epoch when it was read.
    """

    snapshot: Snapshot | None
    events: tuple[Event, ...]
    epoch: int

    @property
    def last_seq(self) -> int:
        """The number of the last event recorded (0 for an empty store)."""
        if self.events:
            return self.events[-1].seq
        return 0 if self.snapshot is None else self.snapshot.seq

    @property
    def high_water(self) -> float | None:
        """The latest ``now`` recorded (the clock's floor after a restart), or None.

        That is the last event's that has one (else the snapshot's ``taken_at``): times in a
        journal never decrease except across a rebase (a saved forward clock step undone,
        docs/durability.md), and the time after it is the one that counts.
        """
        for event in reversed(self.events):
            if event.now is not None:
                return event.now
        return None if self.snapshot is None else self.snapshot.taken_at


class Store(abc.ABC):
    """A journal and snapshot store: SQLite or PostgreSQL, one schema.

    Use :func:`~prioqueue.store.open_store` to make one from a URL. Not thread-safe.
    """

    #: ``"sqlite"`` or ``"postgresql"``.
    kind: str

    def __init__(self, url: str) -> None:
        self.url = url
        self._closed = False

    # -------------------------------------------------------------- backend hooks

    @abc.abstractmethod
    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (``%s`` placeholders); return its rows (empty for none)."""

    @abc.abstractmethod
    def _executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row."""

    @abc.abstractmethod
    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Commit on normal exit, roll back on an exception."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Close the connection."""

    def _lock_setup(self) -> None:  # noqa: B027 - a hook: SQLite's file lock already serialises
        """Serialise schema creation between processes."""

    def _fence_sql(self) -> str:
        return "SELECT epoch FROM prioqueue_leader WHERE id = 1"

    # -------------------------------------------------------------- schema

    def _setup(self) -> None:
        """Create the tables if missing; refuse a newer schema version."""
        with self._transaction():
            self._lock_setup()
            for statement in SCHEMA:
                self._execute(statement)
            rows = self._execute("SELECT value FROM prioqueue_meta WHERE key = 'schema_version'")
            if not rows:
                self._execute(
                    "INSERT INTO prioqueue_meta (key, value) VALUES ('schema_version', %s)",
                    (str(SCHEMA_VERSION),),
                )
            else:
                try:
                    found = int(rows[0][0])
                except ValueError:
                    raise CorruptStore(
                        f"{self.url}: schema_version is {rows[0][0]!r}, not a number"
                    ) from None
                if found > SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"{self.url}: the store has schema version {found}; this prioqueue "
                        f"reads up to version {SCHEMA_VERSION} (upgrade prioqueue)",
                        found=found,
                        supported=SCHEMA_VERSION,
                    )
                if found < 1:
                    raise CorruptStore(f"{self.url}: schema_version {found} is not valid")
            if not self._execute("SELECT epoch FROM prioqueue_leader WHERE id = 1"):
                self._execute(
                    "INSERT INTO prioqueue_leader (id, epoch, expires_at) VALUES (1, 0, 0)"
                )

    # -------------------------------------------------------------- public API

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def epoch(self) -> int:
        """Return the store's current leader epoch (0 for a store nobody claimed). O(1)."""
        self._check_open()
        rows = self._execute("SELECT epoch FROM prioqueue_leader WHERE id = 1")
        return int(rows[0][0])

    def recover(self) -> Recovery:
        """Read the latest snapshot and the journal after it, checking both.

        Returns:
            The snapshot (or None) and the events after it, in order.

        Raises:
            CorruptStore: A gap in the journal, unreadable JSON, a bad row.

        Complexity: O(events after the snapshot + snapshot size).
        """
        self._check_open()
        with self._transaction():
            epoch = int(self._execute("SELECT epoch FROM prioqueue_leader WHERE id = 1")[0][0])
            snap_rows = self._execute(
                "SELECT seq, taken_at, state FROM prioqueue_snapshot ORDER BY seq DESC LIMIT 1"
            )
            snapshot = None
            after = 0
            if snap_rows:
                seq, taken_at, text = snap_rows[0]
                state = self._decode(f"snapshot at seq {seq}", text)
                snapshot = Snapshot(seq=int(seq), taken_at=float(taken_at), state=state)
                after = snapshot.seq
            rows = self._execute(
                "SELECT seq, op, args, now FROM prioqueue_journal WHERE seq > %s ORDER BY seq",
                (after,),
            )
        events = []
        expected = after + 1
        for seq, op, text, now in rows:
            if seq != expected:
                raise CorruptStore(
                    f"{self.url}: the journal has a gap: event {expected} is missing "
                    f"(the next one is {seq}); refusing a partial recovery"
                )
            args = self._decode(f"event {seq} ({op})", text)
            try:
                events.append(Event(seq=int(seq), op=str(op), args=args, now=now))
            except (TypeError, ValueError) as exc:
                raise CorruptStore(f"{self.url}: event {seq} is invalid: {exc}") from None
            expected += 1
        if snapshot is None and events and events[0].seq != 1:  # pragma: no cover - see gap
            raise CorruptStore(f"{self.url}: the journal starts at {events[0].seq}, not 1")
        return Recovery(snapshot=snapshot, events=tuple(events), epoch=epoch)

    def append(
        self, events: Sequence[Event], *, epoch: int, snapshot: Snapshot | None = None
    ) -> None:
        """Write ``events`` (and optionally a snapshot) in one transaction, fenced by ``epoch``.

        Args:
            events: The events to add, contiguous after the last one stored.
            epoch: The writer's leader epoch; the store's must be the same.
            snapshot: A snapshot to store after the events; it replaces the older one and
                prunes the journal rows it covers.

        Raises:
            Fenced: The store's epoch is not ``epoch`` (another leader took over); nothing
                was written.
            StoreError: The write failed (the backend's error is the ``__cause__``); nothing
                was written.
            TypeError: An argument has the wrong type.

        Complexity: O(len(events)) rows written, plus the pruned rows.
        """
        self._check_open()
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise TypeError(f"epoch must be an int, got {epoch!r}")
        if snapshot is not None and not isinstance(snapshot, Snapshot):
            raise TypeError(f"snapshot must be a Snapshot or None, got {type(snapshot).__name__}")
        for event in events:
            if not isinstance(event, Event):
                raise TypeError(f"events must be Event values, got {type(event).__name__}")
        rows = [
            (
                e.seq,
                epoch,
                e.op,
                e.text
                if e.text is not None
                else json.dumps(e.args, allow_nan=False, separators=(",", ":")),
                e.now,
            )
            for e in events
        ]
        chunks = None if snapshot is None else encode_chunks(snapshot.state)
        try:
            if snapshot is None and rows:
                self._append_journal(rows, epoch)
            else:
                self._append_rows(rows, epoch, snapshot, chunks)
        except Fenced:
            raise
        except StoreError as exc:
            # A deposed writer may collide with its successor's rows: say why.
            try:
                current = self.epoch()
            except StoreError:
                raise exc from None
            if current != epoch:
                raise self._fenced(epoch, current) from exc
            raise

    def _append_journal(self, rows: list[tuple[Any, ...]], epoch: int) -> None:
        """Write checked journal rows, and nothing else, fenced (a backend may do it faster).

        Raises:
            Fenced: The store's epoch is not ``epoch``. StoreError: the write failed.
        """
        self._append_rows(rows, epoch, None, None)

    def _append_rows(
        self,
        rows: list[tuple[Any, ...]],
        epoch: int,
        snapshot: Snapshot | None,
        chunks: list[str] | None,
    ) -> None:
        """Write checked journal rows (and a snapshot's chunks) in one fenced transaction.

        Raises:
            Fenced: The store's epoch is not ``epoch``. StoreError: the write failed.
        """
        with self._transaction():
            # A cheap early answer for a writer that was deposed long ago.
            self._check_epoch(epoch, "SELECT epoch FROM prioqueue_leader WHERE id = 1")
            if rows:
                self._executemany(
                    "INSERT INTO prioqueue_journal (seq, epoch, op, args, now) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    rows,
                )
            if snapshot is not None and chunks is not None:
                self._write_snapshot(snapshot, epoch, chunks)
                self._execute("DELETE FROM prioqueue_journal WHERE seq <= %s", (snapshot.seq,))
            # The fence: locked and checked last, so the leader row is held only for the
            # commit (a long snapshot write does not block renewals); a takeover either
            # waits for this commit or makes this check fail.
            self._check_epoch(epoch, self._fence_sql())

    def _write_snapshot(self, snapshot: Snapshot, epoch: int, chunks: list[str]) -> None:
        """Replace the snapshot row; its text is ``chunks`` joined, by the database.

        A text of several chunks goes through a temporary table, one chunk per statement,
        and the database concatenates them: Python never holds the whole text (joining
        200 MB, or binding it as one parameter, holds the GIL for hundreds of ms).
        """
        self._execute("DELETE FROM prioqueue_snapshot WHERE seq <= %s", (snapshot.seq,))
        insert = "INSERT INTO prioqueue_snapshot (seq, epoch, taken_at, state) "
        if len(chunks) == 1:
            self._execute(
                insert + "VALUES (%s, %s, %s, %s)",
                (snapshot.seq, epoch, snapshot.taken_at, chunks[0]),
            )
            return
        self._execute(self._parts_table_sql)
        self._execute("DELETE FROM prioqueue_snapshot_parts")
        for part, chunk in enumerate(chunks):
            self._execute(
                "INSERT INTO prioqueue_snapshot_parts (part, text) VALUES (%s, %s)", (part, chunk)
            )
        self._execute(
            insert + f"SELECT %s, %s, %s, ({self._concat_parts_sql})",
            (snapshot.seq, epoch, snapshot.taken_at),
        )
        self._execute("DELETE FROM prioqueue_snapshot_parts")

    #: A temporary (per-connection) table for the chunks of a snapshot's text.
    _parts_table_sql = (
        "CREATE TEMP TABLE IF NOT EXISTS prioqueue_snapshot_parts"
        " (part INTEGER PRIMARY KEY, text TEXT NOT NULL)"
    )
    #: The chunks joined in ``part`` order, by the database.
    _concat_parts_sql = "SELECT string_agg(text, '' ORDER BY part) FROM prioqueue_snapshot_parts"

    def _check_epoch(self, epoch: int, sql: str) -> None:
        current = int(self._execute(sql)[0][0])
        if current != epoch:
            raise self._fenced(epoch, current)

    def _fenced(self, epoch: int, current: int) -> Fenced:
        return Fenced(
            f"{self.url}: the store's epoch is {current}, this writer's is {epoch}: "
            "another broker took over; nothing was written",
            epoch=epoch,
            current=current,
        )

    def claim(self) -> int:
        """Become the single writer: bump the epoch and return it (fencing older writers).

        A PostgreSQL service with several brokers uses :class:`~prioqueue.store.Elector`
        instead, which claims only after winning the election.

        Complexity: O(1).
        """
        self._check_open()
        with self._transaction():
            self._execute("UPDATE prioqueue_leader SET epoch = epoch + 1 WHERE id = 1")
            return int(self._execute("SELECT epoch FROM prioqueue_leader WHERE id = 1")[0][0])

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    # -------------------------------------------------------------- helpers

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.url}: the store is closed")

    def _decode(self, what: str, text: object) -> dict[str, Any]:
        try:
            value = json.loads(text)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise CorruptStore(f"{self.url}: {what} is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise CorruptStore(f"{self.url}: {what} is not a JSON object")
        return value


def default_path() -> str:
    """The default SQLite file: ``prioqueue.db`` in the working directory."""
    return os.path.join(os.getcwd(), "prioqueue.db")
