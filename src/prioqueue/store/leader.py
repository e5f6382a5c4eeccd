"""``Elector``: one leader among several brokers sharing a PostgreSQL store (private).

Theory of operation
-------------------
Leadership is the ``prioqueue_leader`` row: ``(epoch, holder, address, pids, expires_at)``,
with ``expires_at`` on the *database's* clock, so brokers' clocks need not agree. Two
signals end a leader's term:

* **Its session died** (SIGKILL, a crash, a lost network): the leader holds a session-level
  advisory lock on its election connection, so the lock frees the moment PostgreSQL drops the
  session. A standby polls ``pg_try_advisory_lock`` every ``poll_interval``; getting it means
  no live leader, and it takes over at once.
* **Its lease ran out** (SIGSTOP, a stuck loop): the leader renews ``expires_at`` every
  ``renew_interval``. A standby that sees ``expires_at`` in the past takes over with a
  compare-and-set on the epoch, then ends the hung leader's election session
  (``pg_terminate_backend``) to free the lock.

Taking over bumps the epoch. Every journal append checks the epoch inside its transaction
(:meth:`Store.append`), so a deposed leader that wakes up writes nothing: its append raises
:class:`Fenced`, its renewal finds a newer epoch, and it steps down. A leader also steps down
on its own when it could not renew for a whole lease (its local monotonic clock), so it never
believes itself leader past the lease other brokers see.

The service: ``await elector.wait_leader()``, then open the store with ``epoch=
elector.epoch`` (recovery happens after the epoch bump, so it sees every append of the old
leader), serve, and stop serving when ``await elector.wait_step_down()`` returns or an append
raises :class:`Fenced`. Standbys answer clients with :attr:`leader_address`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
from collections.abc import Callable
from typing import Any

from prioqueue.clock import SYSTEM_CLOCK, Clock
from prioqueue.store.errors import StoreError
from prioqueue.store.postgres import PostgresStore, connect

__all__ = ["Elector"]

_LOCK_RETRY = 0.05
"""Seconds between tries of a hung leader's lock after ending its session."""
_LOCK_KEY = "hashtext('prioqueue.leader:' || current_schema())"


class Elector:
    """Leader election for brokers on one PostgreSQL store (advisory lock + renewed lease).

    Args:
        url: The store's libpq URL.
        schema: The store's schema (None: the default ``search_path``).
        address: What clients should use to reach this broker when it leads (for standbys'
            ``Retry-After`` answers), e.g. ``"http://10.0.0.5:8091"``.
        name: This broker's name in the leader row (default ``host:pid``).
        lease: Seconds a leader's term lasts without renewal (default 10).
        renew_interval: Seconds between renewals (default 2; < lease / 2).
        poll_interval: Seconds between a standby's checks (default 0.5).
        clock: The clock that times this broker's own lease and its wait for a hung
            leader's lock (a :class:`prioqueue.clock.Clock`, :data:`SYSTEM_CLOCK` by default;
            tests inject :class:`prioqueue.testing.ManualClock`), or a zero-argument callable
            for the lease alone. The waits between checks stay on the event loop.

    Defaults give a takeover within about 1 s of a leader's SIGKILL and within the lease plus
    about 1 s of a hang, before recovery.

    Raises:
        ValueError: The URL is empty or a timing is out of range.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        address: str | None = None,
        name: str | None = None,
        lease: float = 10.0,
        renew_interval: float = 2.0,
        poll_interval: float = 0.5,
        clock: Clock | Callable[[], float] = SYSTEM_CLOCK,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ValueError(f"url must be a non-empty PostgreSQL URL, got {url!r}")
        for label, value in (
            ("lease", lease),
            ("renew_interval", renew_interval),
            ("poll_interval", poll_interval),
        ):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
        if renew_interval * 2 > lease:
            raise ValueError(
                f"renew_interval ({renew_interval}) must be at most half the lease ({lease})"
            )
        if isinstance(clock, Clock):
            self._clock: Callable[[], float] = clock.monotonic
            self._sleep: Callable[[float], None] = clock.sleep
        elif callable(clock):
            self._clock, self._sleep = clock, SYSTEM_CLOCK.sleep
        else:
            raise TypeError(f"clock must be a Clock or a callable returning seconds, got {clock!r}")
        self._url = url
        self._schema = schema
        self.address = address
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._lease = float(lease)
        self._renew = float(renew_interval)
        self._poll = float(poll_interval)
        self._conn: Any = None
        self._epoch: int | None = None
        self._renewed: float = -math.inf
        self._leader_address: str | None = None
        self._leader_name: str | None = None
        self._became_leader = asyncio.Event()
        self._stepped_down = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._handover: int | None = None  # a term given up, still to release in the database

    # ------------------------------------------------------------------ public face

    @property
    def is_leader(self) -> bool:
        """Whether this broker leads now (its lease, by its own clock, has not run out)."""
        return self._epoch is not None and self._clock() - self._renewed < self._lease

    @property
    def epoch(self) -> int | None:
        """The epoch of this broker's term while it leads, else None."""
        return self._epoch if self.is_leader else None

    @property
    def leader_address(self) -> str | None:
        """The current leader's advertised address as last seen (None when unknown)."""
        return self.address if self.is_leader else self._leader_address

    @property
    def leader_name(self) -> str | None:
        """The current leader's name as last seen (None when unknown)."""
        return self.name if self.is_leader else self._leader_name

    async def start(self) -> None:
        """Connect, create the tables if missing and start campaigning in the background.

        Raises:
            StoreError: The database is unreachable, or its schema is from a newer version.
        """
        if self._task is not None:
            raise RuntimeError("the elector is already started")
        await asyncio.to_thread(self._connect)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="prioqueue-elector")

    async def wait_leader(self) -> int:
        """Wait until this broker leads; return its epoch.

        Raises:
            StoreError: The election loop failed (database gone for good).
        """
        while True:
            self._raise_if_failed()
            epoch = self.epoch
            if epoch is not None:
                return epoch
            self._became_leader.clear()
            await self._wait(self._became_leader)

    async def wait_step_down(self) -> None:
        """Wait until this broker, leading now, stops leading (deposed, lease lost, closed)."""
        while self.is_leader:
            self._raise_if_failed()
            self._stepped_down.clear()
            await self._wait(self._stepped_down, timeout=self._renew)

    def step_down(self) -> None:
        """Stop leading now (e.g. after :class:`Fenced`); keep campaigning as a standby.

        The term is handed over in the background (its lease expired, its lock freed), so a
        standby can take over at once; this call never blocks the loop.
        """
        if self._epoch is not None:
            self._handover = self._epoch
            self._epoch = None
            self._renewed = -math.inf
            self._stepped_down.set()

    async def aclose(self) -> None:
        """Stop; a leader hands over at once (expires its lease and frees its lock)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        epoch = self._epoch
        if self._conn is not None:
            await asyncio.to_thread(self._release, epoch)
        self._epoch = None
        self._stepped_down.set()

    # ------------------------------------------------------------------ the loop

    async def _wait(self, event: asyncio.Event, timeout: float | None = None) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise StoreError(f"leader election stopped: {self._error}") from self._error
        if self._task is None:
            raise StoreError("the elector is not started")

    def _connect(self) -> None:
        PostgresStore(self._url, schema=self._schema).close()  # creates the tables
        self._conn = connect(self._url, schema=self._schema, idle_timeout=self._lease)
        ms = max(1, int(self._renew * 1000))
        self._conn.execute(f"SET statement_timeout = {ms}")
        self._conn.execute(f"SET lock_timeout = {ms}")

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                if self._handover is not None:
                    term, self._handover = self._handover, None
                    await asyncio.to_thread(self._end_term, term)
                if self._epoch is None:
                    started = self._clock()  # before the lease row is written
                    epoch = await asyncio.to_thread(self._campaign)
                    if epoch is not None:
                        self._epoch = epoch
                        self._renewed = started
                        self._became_leader.set()
                        continue
                    await asyncio.sleep(self._poll)
                else:
                    started = self._clock()
                    kept = await asyncio.to_thread(self._renew_lease, self._epoch)
                    if kept and self._epoch is not None:
                        self._renewed = started
                    elif not kept:
                        self.step_down()
                    await asyncio.sleep(self._renew)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A lost connection: a leader stops leading; everyone reconnects and retries.
                self.step_down()
                failures += 1
                if failures >= 30:
                    self._error = exc
                    self._became_leader.set()
                    self._stepped_down.set()
                    return
                await asyncio.sleep(self._poll)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._reconnect)
            if self._epoch is not None and not self.is_leader:
                self.step_down()

    def _reconnect(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
        self._conn = None
        self._connect()

    def _row(self) -> tuple[int, str | None, str | None, str | None, float, float]:
        row = self._conn.execute(
            "SELECT epoch, holder, address, pids, expires_at,"
            " extract(epoch from clock_timestamp())::double precision"
            " FROM prioqueue_leader WHERE id = 1"
        ).fetchone()
        epoch, holder, address, pids, expires_at, db_now = row
        self._leader_name, self._leader_address = holder, address
        return int(epoch), holder, address, pids, float(expires_at), float(db_now)

    def _campaign(self) -> int | None:
        """One standby check; return the new epoch when this broker took over."""
        conn = self._conn
        epoch, _holder, _address, pids, expires_at, db_now = self._row()
        locked = bool(conn.execute(f"SELECT pg_try_advisory_lock({_LOCK_KEY})").fetchone()[0])
        if not locked and expires_at > db_now:
            return None  # a live leader holds the lock and its lease
        new = self._take(epoch)
        if new is None:
            if locked:
                conn.execute("SELECT pg_advisory_unlock_all()")
            return None
        if not locked:
            # The old leader hangs while holding the lock: end its election session so the
            # lock frees (its journal writes are already fenced by the new epoch).
            for pid in (pids or "").split(","):
                if pid.strip().isdigit():
                    with contextlib.suppress(Exception):
                        conn.execute("SELECT pg_terminate_backend(%s)", (int(pid),))
            deadline = self._clock() + self._renew
            for _ in range(math.ceil(self._renew / _LOCK_RETRY)):  # bounded on any clock
                if self._clock() >= deadline:
                    break
                if conn.execute(f"SELECT pg_try_advisory_lock({_LOCK_KEY})").fetchone()[0]:
                    break
                self._sleep(_LOCK_RETRY)  # waits for PostgreSQL to end the old session
        return new

    def _take(self, seen: int) -> int | None:
        row = self._conn.execute(
            "UPDATE prioqueue_leader SET epoch = epoch + 1, holder = %s, address = %s,"
            " pids = %s, expires_at = extract(epoch from clock_timestamp()) + %s"
            " WHERE id = 1 AND epoch = %s RETURNING epoch",
            (self.name, self.address, str(self._conn.info.backend_pid), self._lease, seen),
        ).fetchone()
        if row is None:
            return None
        self._leader_name, self._leader_address = self.name, self.address
        return int(row[0])

    def _renew_lease(self, epoch: int) -> bool:
        row = self._conn.execute(
            "UPDATE prioqueue_leader SET expires_at = extract(epoch from clock_timestamp()) + %s"
            " WHERE id = 1 AND epoch = %s RETURNING epoch",
            (self._lease, epoch),
        ).fetchone()
        return row is not None

    def _end_term(self, epoch: int | None) -> None:
        """Expire this broker's term (if still its own) and free the lock."""
        if epoch is not None:
            self._conn.execute(
                "UPDATE prioqueue_leader SET expires_at = 0 WHERE id = 1 AND epoch = %s",
                (epoch,),
            )
        self._conn.execute("SELECT pg_advisory_unlock_all()")

    def _release(self, epoch: int | None) -> None:
        with contextlib.suppress(Exception):
            self._end_term(epoch if epoch is not None else self._handover)
        with contextlib.suppress(Exception):
            self._conn.close()
        self._conn = None
