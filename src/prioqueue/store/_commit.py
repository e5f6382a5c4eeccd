"""Group commit: the writer that takes applied events to the store in batches (private).

:class:`GroupCommit` is the writing half of :class:`~prioqueue.store.DurableDispatcher` (see
its module for the rules). Events are numbered and queued on the event loop; one writer thread
appends each batch (with a snapshot when one is due) in one transaction, and hands the outcome
back with one ``call_soon_threadsafe``, whose callback wakes that batch's callers and sends the
next batch at once. A failed commit is fatal: every waiting and later caller gets the
:class:`StoreFatal`. Snapshots are due every ``snapshot_every`` events or
``snapshot_interval`` seconds of the event loop's clock (``loop.time()``: a test that runs on
a loop whose time it controls controls them). The loop only decides that one is due and
stamps its time; the writer thread takes it from the :class:`~prioqueue.store._replica.Replica`
(a second dispatcher that trails the store), so the loop never walks the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import attrs

from prioqueue.clock import loop_time
from prioqueue.store._encode import release
from prioqueue.store._replica import Replica
from prioqueue.store.base import Event, Snapshot, Store
from prioqueue.store.errors import CommitFailed, StoreFatal

__all__ = ["FatalCallback", "GroupCommit"]

FatalCallback = Callable[[StoreFatal], object]


@contextlib.contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Disable the cyclic collector meanwhile (process-wide), if ``pause`` and it is on."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@attrs.define(eq=False, repr=False)
class GroupCommit:
    """Numbered events, committed in pipelined batches by one writer thread.

    Every method runs on the event loop that made it, except :meth:`_commit` (the writer).

    Args:
        store: The store (used from the writer thread only).
        executor: The writer thread.
        epoch: The leader epoch to append with.
        last_seq: The last event already in the store.
        snapshot_seq: The event of the store's latest snapshot (0: none).
        replica: The copy of the dispatcher that snapshots are taken from (writer thread).
        clock: The wall clock that stamps snapshots.
        snapshot_every: Events between snapshots.
        snapshot_interval: Seconds (of the loop's clock) between snapshots while events arrive.
        on_fatal: Called once with the error that stopped the writer.
    """

    store: Store
    """The store (appended to from the writer thread only)."""
    _executor: ThreadPoolExecutor
    epoch: int = attrs.field(kw_only=True)
    """The leader epoch every append carries."""
    applied: int = attrs.field(kw_only=True, alias="last_seq")
    """The number of the last event applied in memory (>= ``committed``)."""
    _snapshot_seq: int = attrs.field(kw_only=True)
    _replica: Replica = attrs.field(kw_only=True)
    _clock: Callable[[], float] = attrs.field(kw_only=True)
    _snapshot_every: int = attrs.field(kw_only=True)
    _snapshot_interval: float = attrs.field(kw_only=True)
    _on_fatal: FatalCallback | None = attrs.field(kw_only=True)
    committed: int = attrs.field(init=False)
    """The number of the last event known to be on disk."""
    fatal: StoreFatal | None = attrs.field(init=False, default=None)
    """The error that stopped the writer, or None."""
    closing: bool = attrs.field(init=False, default=False)
    _loop: asyncio.AbstractEventLoop = attrs.field(init=False, factory=asyncio.get_running_loop)
    _snapshot_at: float = attrs.field(init=False)
    _force_snapshot: bool = attrs.field(init=False, default=False)
    _pending: list[Event] = attrs.field(init=False, factory=list)
    _pending_future: asyncio.Future[None] | None = attrs.field(init=False, default=None)
    _pending_waiters: list[asyncio.Future[None]] = attrs.field(init=False, factory=list)
    _inflight_waiters: list[asyncio.Future[None]] = attrs.field(init=False, factory=list)
    _inflight_future: asyncio.Future[None] | None = attrs.field(init=False, default=None)
    _inflight_last: int = attrs.field(init=False)
    _start_scheduled: bool = attrs.field(init=False, default=False)
    _idle: asyncio.Event = attrs.field(init=False, factory=asyncio.Event)
    """Set while no commit is in flight."""

    def __attrs_post_init__(self) -> None:
        # Everything up to ``last_seq`` is in the store: applied, committed, none in flight.
        self.committed = self._inflight_last = self.applied
        self._snapshot_at = loop_time(self._loop)
        self._idle.set()

    @property
    def unsnapshotted(self) -> bool:
        """Whether events were applied since the latest snapshot."""
        return self.applied > self._snapshot_seq

    def check_usable(self) -> None:
        """Raise the fatal error, or StoreFatal once closing.

        Raises:
            StoreFatal: The writer failed or is closed.
        """
        if self.fatal is not None:
            raise self.fatal
        if self.closing:
            raise StoreFatal("the durable dispatcher is closed")

    def add(
        self, op: str, args: Mapping[str, Any], now: float | None, text: str | None
    ) -> asyncio.Future[None]:
        """Number an applied call's event and queue it; the future resolves on its commit.

        The caller's own future (not a shield around the batch's): the commit wakes it
        directly, one loop turn sooner, and cancelling it cancels nobody else. O(1).
        """
        self.applied += 1
        self._enqueue(Event(seq=self.applied, op=op, args=args, now=now, text=text))
        waiter = self._loop.create_future()
        self._pending_waiters.append(waiter)
        return waiter

    async def wait_applied(self) -> None:
        """Wait until every event applied so far is committed (or the writer failed)."""
        await self._wait_committed(self.applied)

    def snapshot_now(self) -> asyncio.Future[None]:
        """Make the next batch carry a snapshot (a batch of its own when nothing is pending)."""
        self._snapshot_at = -math.inf
        if self.applied == self._snapshot_seq:
            self._force_snapshot = True
        return self._enqueue(None)

    async def close(self) -> None:
        """Refuse new work, let a commit in flight finish (or fail), and stop the writer."""
        self.closing = True
        await self._idle.wait()
        self._executor.shutdown(wait=True)

    def _enqueue(self, event: Event | None) -> asyncio.Future[None]:
        if event is not None:
            self._pending.append(event)
        future = self._pending_future
        if future is None:
            future = self._pending_future = self._loop.create_future()
        if self._inflight_future is None and not self._start_scheduled:
            # Start the commit two turns on: every call of this turn, and of the next one
            # (tasks whose step was already scheduled), joins the batch.
            self._start_scheduled = True
            self._loop.call_soon(self._loop.call_soon, self._start_commit)
        return future

    async def _wait_committed(self, seq: int) -> None:
        while self.committed < seq and self.fatal is None:
            future = self._inflight_future
            if future is None or seq > self._inflight_last:
                future = self._pending_future
            if future is None:  # pragma: no cover - applied events are always queued
                raise AssertionError("applied events without a pending batch")
            await asyncio.wait([future])

    def _snapshot_due(self, last: int) -> float | None:
        """The snapshot's time when the batch ending at ``last`` should carry one, else None."""
        if self._replica.broken is not None:
            return None  # reported once when it broke; the journal keeps everything
        due = (
            self._force_snapshot
            or last - self._snapshot_seq >= self._snapshot_every
            or (
                last > self._snapshot_seq
                and loop_time(self._loop) - self._snapshot_at >= self._snapshot_interval
            )
        )
        if not due:
            return None
        self._force_snapshot = False
        return self._clock()

    # The writer is a pipeline of callbacks, not a task: the writer thread hands each commit
    # back with one call_soon_threadsafe, and that callback starts the next commit at once.
    # A task awaiting run_in_executor needed four or five loop turns per commit, and with
    # 2,000 connections a loop turn lasts a second (issue 21): commits lagged the requests.

    def _start_commit(self) -> None:
        self._start_scheduled = False
        if self.fatal is not None or self._inflight_future is not None:
            return
        if self._pending_future is None:
            return
        batch, future = self._pending, self._pending_future
        waiters, self._pending_waiters = self._pending_waiters, []
        self._pending, self._pending_future = [], None
        self._inflight_waiters = waiters
        last = batch[-1].seq if batch else self.committed
        snap_at = self._snapshot_due(last)
        self._inflight_future, self._inflight_last = future, last
        self._idle.clear()
        try:
            self._executor.submit(self._commit, batch, snap_at, future, last)
        except RuntimeError:  # pragma: no cover - closed: a call that raced aclose()
            self._inflight_future = None
            self._idle.set()
            closed = StoreFatal("the durable dispatcher is closed")
            for f in (future, *self._inflight_waiters):
                if not f.done():
                    f.set_exception(closed)
                    f.exception()  # retrieved: its callers re-raise through check_usable
            self._inflight_waiters = []

    def _commit(
        self, batch: list[Event], snap_at: float | None, future: asyncio.Future[None], last: int
    ) -> None:
        """In the writer thread: snapshot if due, append, then hand the outcome to the loop."""
        self._replica.committed(batch)
        snap: Snapshot | None = None
        state: Mapping[str, Any] | None = None
        # A snapshot makes ~10 container objects per job, alive until written: collections
        # meanwhile would scan them (and everything not frozen) with the GIL held, and
        # promote them to the oldest generation, whose full collection stalled the loop for
        # seconds at 10^5 jobs (issue 30). Reference counting frees them after the write.
        with _collector_paused(snap_at is not None):
            if snap_at is not None:
                try:
                    state = self._replica.snapshot(snap_at)
                    snap = Snapshot(seq=last, taken_at=snap_at, state=state)
                except Exception as exc:  # the replica diverged: no more snapshots
                    with contextlib.suppress(RuntimeError):
                        self._loop.call_soon_threadsafe(self._report_snapshot_error, exc)
            try:
                self.store.append(batch, epoch=self.epoch, snapshot=snap)
            except BaseException as exc:
                outcome: Callable[[], None] = partial(self._failed, batch, last, future, exc)
            else:
                outcome = partial(self._committed_batch, last, snap is not None, future)
            box = [state]
            snap = state = None
            release(box)  # freed in slices, before the collector runs again
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(outcome)

    def _committed_batch(self, last: int, snapshotted: bool, future: asyncio.Future[None]) -> None:
        self.committed = last
        if snapshotted:
            self._snapshot_seq = last
            self._snapshot_at = loop_time(self._loop)
        self._inflight_future = None
        self._idle.set()
        if not future.done():
            future.set_result(None)
        waiters, self._inflight_waiters = self._inflight_waiters, []
        for waiter in waiters:
            if not waiter.done():  # a caller cancelled meanwhile
                waiter.set_result(None)
        if self._pending_future is not None:
            self._start_commit()  # the next batch leaves now, not after more loop turns

    def _failed(
        self, batch: list[Event], last: int, future: asyncio.Future[None], exc: BaseException
    ) -> None:
        if isinstance(exc, StoreFatal):
            fatal = exc
        else:  # whatever failed, the batch may not be on disk
            fatal = CommitFailed(
                f"{self.store.url}: committing events {batch[0].seq if batch else last}"
                f"..{last} failed: {exc}; the process must stop and recover"
            )
            fatal.__cause__ = exc
        self._idle.set()
        self._die(fatal, future)

    def _report_snapshot_error(self, exc: Exception) -> None:
        # The journal still holds every event; only pruning stops until the next start.
        self._snapshot_at = loop_time(self._loop)
        self._loop.call_exception_handler(
            {
                "message": f"prioqueue.store: snapshots stopped for this process: {exc!r}; "
                "the journal keeps every event and the next start snapshots again",
                "exception": exc,
            }
        )

    def _die(self, fatal: StoreFatal, future: asyncio.Future[None]) -> None:
        self.fatal = fatal
        for f in (future, self._pending_future):
            if f is not None and not f.done():
                f.set_exception(fatal)
                f.exception()  # mark retrieved: every waiter re-raises through check_usable
        for waiter in (*self._inflight_waiters, *self._pending_waiters):
            if not waiter.done():
                waiter.set_exception(fatal)
                waiter.exception()
        self._pending_waiters, self._inflight_waiters = [], []
        self._pending, self._pending_future = [], None
        self._inflight_future = None
        if self._on_fatal is not None:
            try:
                self._on_fatal(fatal)
            except Exception as exc:  # the callback's own failure must not hide the fatal one
                self._loop.call_exception_handler(
                    {"message": "prioqueue.store: on_fatal raised", "exception": exc}
                )
