"""``DurableDispatcher``: a dispatcher whose every state change is journaled before it is answered.

Theory of operation
-------------------
One event loop owns the dispatcher; one writer thread owns the store. The rules:

1. **Apply, then journal, then answer.** A call (``await durable.call("submit", ...)``) is
   stamped with the clock's ``now``, its arguments go through JSON (so the dispatcher sees
   exactly what replay will), and it is applied to the in-memory dispatcher at once. If it
   raises, nothing is journaled (the core changes no state when it raises) and the error is
   re-raised once everything applied before it is committed. Otherwise its event joins the
   pending batch and the caller waits for that batch's commit before getting the result.
2. **Group commit, pipelined.** The writer takes every pending event at once and appends them
   in one transaction (in the writer thread, so the loop keeps accepting calls; those form the
   next batch). Calls made in the same loop turn always share a batch. The writer is a chain
   of callbacks, not a task: the thread hands each commit back with one
   ``call_soon_threadsafe``, whose callback wakes that batch's callers (each has its own
   future) and sends the next batch at once. Under 2,000 connections a loop turn lasts up to
   a second, so every turn saved on this path is latency saved for every caller.
3. **Reads wait for the disk, not for each other.** ``await durable.read(fn)`` runs
   ``fn(dispatcher)`` at once, on the applied state, and returns its result only once every
   event applied before it is committed (at most the batch in flight and the pending one).
   Writers never wait for readers and a commit releases every reader and writer whose events
   it holds, so a client never sees a change the store lacks and nobody queues behind a
   global barrier. ``fn`` must return data, not a live view of the dispatcher.
   :meth:`DurableDispatcher.read_settled` is the older, stronger form (``fn`` runs when
   nothing applied is uncommitted, holding back new writers meanwhile): use it only for a
   reader that cannot copy what it needs, since under load every reader stalls the writers.
4. **Crash-only.** A failed commit (or a :class:`Fenced` append: another leader took over)
   makes the wrapper *fatal*: every waiting and later call raises :class:`StoreFatal`, and the
   ``on_fatal`` callback runs (a service exits there). The in-memory state is never served
   again; the next start recovers from the store.
5. **Snapshots.** Every ``snapshot_every`` events or ``snapshot_interval`` seconds, the batch
   being written carries a snapshot of the state after its last event (taken on the loop, so
   it matches the batch exactly); the store prunes the journal behind it in the same
   transaction.

Time: see :class:`~prioqueue.store.WallClock`: monotonic inside the process, anchored by the
wall clock; the floor is the store's high-water mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Generic, TypeVar

from prioqueue.store._base import Event, Snapshot, Store
from prioqueue.store._clock import WallClock
from prioqueue.store._errors import CommitFailed, StoreFatal
from prioqueue.store._journal import Restorable, declared_ops, replay, takes_now

__all__ = ["DurableDispatcher"]

D = TypeVar("D", bound=Restorable)
T = TypeVar("T")

FatalCallback = Callable[[StoreFatal], object]


def _journaled(
    dispatcher: object, ops: Iterable[str] | None, skip: Iterable[str] | None
) -> tuple[frozenset[str], frozenset[str]]:
    """What the dispatcher's class declares ``@journaled``, narrowed by the caller's names.

    Returns:
        ``(ops, skip_when_empty)``: only declared names; ``skip_when_empty`` only names the
        declaration marks so (a call that may change state is never answered unjournaled).
    """
    declared, skippable = declared_ops(type(dispatcher))
    chosen = declared if ops is None else declared & frozenset(ops)
    skipped = skippable if skip is None else skippable & frozenset(skip)
    return chosen, skipped & chosen


# Argument types whose JSON round trip is the identity (floats must also be finite).
_SCALARS = frozenset({str, int, float, bool, type(None)})


class DurableDispatcher(Generic[D]):
    """A dispatcher wrapped so that no result is released before its call is on disk.

    Make one with :meth:`open` (it recovers the dispatcher from the store). Every method
    must be called on the event loop that opened it.
    """

    def __init__(
        self,
        store: Store,
        dispatcher: D,
        *,
        epoch: int,
        last_seq: int,
        snapshot_seq: int,
        clock: Callable[[], float],
        snapshot_every: int,
        snapshot_interval: float,
        ops: frozenset[str],
        skip_when_empty: frozenset[str],
        on_fatal: FatalCallback | None,
        executor: ThreadPoolExecutor,
    ) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._epoch = epoch
        self._clock = clock
        self._snapshot_every = snapshot_every
        self._snapshot_interval = snapshot_interval
        self._ops = ops
        self._skip = skip_when_empty
        self._on_fatal = on_fatal
        self._executor = executor
        self._loop = asyncio.get_running_loop()
        self._applied = last_seq
        self._committed = last_seq
        self._snapshot_seq = snapshot_seq
        self._snapshot_at = time.monotonic()
        self._pending: list[Event] = []
        self._pending_future: asyncio.Future[None] | None = None
        self._pending_waiters: list[asyncio.Future[None]] = []
        self._inflight_waiters: list[asyncio.Future[None]] = []
        self._inflight_future: asyncio.Future[None] | None = None
        self._inflight_last = last_seq
        self._start_scheduled = False
        self._idle = asyncio.Event()  # set while no commit is in flight
        self._idle.set()
        self._readers = 0
        self._fatal: StoreFatal | None = None
        self._closing = False
        self._now_cache: dict[str, bool] = {}

    # ------------------------------------------------------------------ opening

    @classmethod
    async def open(
        cls,
        store: Store,
        factory: Callable[[Mapping[str, Any] | None], D],
        *,
        epoch: int | None = None,
        clock: Callable[[], float] | None = None,
        snapshot_every: int = 10_000,
        snapshot_interval: float = 300.0,
        ops: Iterable[str] | None = None,
        skip_when_empty: Iterable[str] | None = None,
        on_fatal: FatalCallback | None = None,
    ) -> DurableDispatcher[D]:
        """Recover the dispatcher from ``store`` and start serving it durably.

        Args:
            store: The store (the wrapper uses it from its own thread; do not share it).
            factory: Makes a fresh dispatcher from None or restores a snapshot, keeping times
                (:func:`~prioqueue.store.dispatcher_factory`).
            epoch: The leader epoch to write with (from :class:`~prioqueue.store.Elector`);
                None claims the store (``store.claim()``: bump the epoch, fencing any older
                writer), which is right for a single broker.
            clock: A :class:`~prioqueue.store.WallClock` (its horizon and sources), or a
                callable giving wall-clock seconds that is followed as is (a test's manual
                clock); default ``WallClock()``: monotonic inside the process, anchored by
                ``time.time``. Either way it never goes below the store's high-water mark or
                a value it returned before, and a store far ahead of the wall clock is
                logged and continued from, not waited for (docs/durability.md).
            snapshot_every: Events between snapshots (>= 1).
            snapshot_interval: Seconds between snapshots while events arrive (> 0).
            ops: None (the default): every method the dispatcher's class declares
                ``@journaled`` (``prioqueue._journaled``); else only those of these names
                that it declares. :meth:`call` refuses any other.
            skip_when_empty: None (the default): the declared operations marked
                ``@journaled(skip_when_empty=True)``, whose None or empty-list results
                changed nothing, so they are answered without a journal event
                (``SizeOneDispatcher.dispatch`` and ``expire``; not a fleet's ``expire``,
                which may mark a silent worker timed out while returning ``[]``); else only
                those of these names that are so marked.
            on_fatal: Called once with the :class:`StoreFatal` when a commit fails or the
                store is fenced; a service exits there.

        Returns:
            The durable dispatcher.

        Raises:
            CorruptStore: The store's journal or snapshot cannot be replayed.
            StoreError: The store cannot be read or claimed.
            ValueError: An option is out of range.

        Complexity: O(snapshot + journal tail) to replay.
        """
        if (
            not isinstance(snapshot_every, int)
            or isinstance(snapshot_every, bool)
            or snapshot_every < 1
        ):
            raise ValueError(f"snapshot_every must be an int >= 1, got {snapshot_every!r}")
        if not (isinstance(snapshot_interval, (int, float)) and snapshot_interval > 0):
            raise ValueError(f"snapshot_interval must be > 0 seconds, got {snapshot_interval!r}")
        if epoch is not None and (not isinstance(epoch, int) or epoch < 1):
            raise ValueError(f"epoch must be an int >= 1 or None, got {epoch!r}")
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(1, thread_name_prefix="prioqueue-store")
        try:
            if epoch is None:
                epoch = await loop.run_in_executor(executor, store.claim)
            recovery = await loop.run_in_executor(executor, store.recover)
            dispatcher = await loop.run_in_executor(executor, partial(replay, recovery, factory))
        except BaseException:
            executor.shutdown(wait=False)
            raise
        if isinstance(clock, WallClock):
            wall = clock
        else:
            wall = WallClock() if clock is None else WallClock(source=clock)
        wall.raise_floor(recovery.high_water)
        journaled = _journaled(dispatcher, ops, skip_when_empty)
        return cls(
            store,
            dispatcher,
            epoch=epoch,
            last_seq=recovery.last_seq,
            snapshot_seq=0 if recovery.snapshot is None else recovery.snapshot.seq,
            clock=wall,
            snapshot_every=snapshot_every,
            snapshot_interval=float(snapshot_interval),
            ops=journaled[0],
            skip_when_empty=journaled[1],
            on_fatal=on_fatal,
            executor=executor,
        )

    # ------------------------------------------------------------------ properties

    @property
    def dispatcher(self) -> D:
        """The in-memory dispatcher, possibly ahead of the store.

        It may hold changes not yet committed: read through :meth:`read` to see only committed
        state, and never call its mutating methods directly.
        """
        return self._dispatcher

    @property
    def store(self) -> Store:
        """The store the journal goes to."""
        return self._store

    @property
    def epoch(self) -> int:
        """The leader epoch this wrapper writes with."""
        return self._epoch

    @property
    def committed_seq(self) -> int:
        """The number of the last event known to be on disk."""
        return self._committed

    @property
    def applied_seq(self) -> int:
        """The number of the last event applied in memory (>= ``committed_seq``)."""
        return self._applied

    @property
    def fatal(self) -> StoreFatal | None:
        """The error that stopped the wrapper, or None while it serves."""
        return self._fatal

    def now(self) -> float:
        """The clock's current time: wall-clock seconds, never going backwards. O(1)."""
        return self._clock()

    # ------------------------------------------------------------------ calls

    async def call(self, op: str, /, **kwargs: Any) -> Any:
        """Call ``dispatcher.<op>(**kwargs, now=...)`` durably and return its result.

        The wrapper stamps ``now`` (methods that take one); do not pass it.

        Args:
            op: A method the dispatcher's class declares ``@journaled`` (see ``ops`` in
                :meth:`open`).
            **kwargs: The method's other arguments; they must be JSON data.

        Returns:
            What the dispatcher returned, once the call's event is committed.

        Raises:
            StoreFatal: The store failed or was fenced (now or earlier); nothing is served.
            ValueError: ``op`` is not journaled, ``now`` was passed, or an argument is not
                JSON data.
            Exception: Whatever the dispatcher raised (nothing was journaled), after every
                earlier event committed.

        Complexity: the dispatcher call's, plus O(size of the arguments) for JSON, plus one
        share of a commit.
        """
        self._check_usable()
        if op not in self._ops:
            kind = type(self._dispatcher).__name__
            if not callable(getattr(self._dispatcher, op, None)):
                raise ValueError(f"{kind} has no method {op!r}")
            raise ValueError(
                f"{op!r} is not a journaled operation of {kind}; allowed: {sorted(self._ops)}"
            )
        if "now" in kwargs:
            raise ValueError("do not pass now: the durable dispatcher stamps it from its clock")
        if self._readers:
            await self._wait_committed(self._applied)
            self._check_usable()
        stamp = self._now_cache.get(op)
        if stamp is None:
            stamp = self._now_cache[op] = takes_now(self._dispatcher, op)
        now = self._clock() if stamp else None
        if stamp:
            kwargs["now"] = now
        text: str | None = None
        if all(type(v) in _SCALARS for v in kwargs.values()) and all(
            math.isfinite(v) for v in kwargs.values() if type(v) is float
        ):
            args = kwargs  # plain scalars come back from JSON unchanged (encoded by the writer)
        else:
            try:
                text = json.dumps(kwargs, allow_nan=False, separators=(",", ":"))
                args = json.loads(text)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"the arguments of {op} must be JSON data: {exc}") from None
        try:
            result = getattr(self._dispatcher, op)(**args)
        except Exception:
            await self._wait_committed(self._applied)
            self._check_usable()
            raise
        if op in self._skip and (result is None or (isinstance(result, list) and not result)):
            await self._wait_committed(self._applied)
            self._check_usable()
            return result
        self._applied += 1
        self._enqueue(Event(seq=self._applied, op=op, args=args, now=now, text=text))
        # Its own future (not a shield around the batch's): the commit wakes this caller
        # directly, one loop turn sooner, and cancelling it cancels nobody else.
        waiter = self._loop.create_future()
        self._pending_waiters.append(waiter)
        await waiter
        return result

    async def read(self, fn: Callable[[D], T]) -> T:
        """Return ``fn(dispatcher)``, computed now, once everything it could see is committed.

        ``fn`` runs at once on the applied state; its result is held until every event
        applied so far is committed (the batch in flight and the pending one, at most), so a
        client never observes a change the store lacks. Writers do not wait for readers.
        Use it for anything a client sees that depends on state (``explain``, ``stats``,
        ``job``); ``fn`` must return data (copies), not a live view of the dispatcher.

        Args:
            fn: Reads the dispatcher (it must not change it); runs on the loop.

        Returns:
            What ``fn`` returned.

        Raises:
            StoreFatal: The store failed; nothing is served.
            TypeError: ``fn`` is not callable.

        Complexity: ``fn``'s, then a wait of at most two commits.
        """
        if not callable(fn):
            raise TypeError(f"fn must be a callable taking the dispatcher, got {fn!r}")
        self._check_usable()
        result = fn(self._dispatcher)
        if self._committed < self._applied:
            await self._wait_committed(self._applied)
            self._check_usable()
        return result

    async def read_settled(self, fn: Callable[[D], T]) -> T:
        """Return ``fn(dispatcher)`` run at a moment when every applied event is committed.

        Stronger than :meth:`read` (``fn`` may return a live view, read before the caller's
        next ``await``) and much costlier under load: while a settled read waits, new writers
        wait for the commit too. Prefer :meth:`read`.

        Args:
            fn: Reads the dispatcher (it must not change it); runs on the loop.

        Returns:
            What ``fn`` returned.

        Raises:
            StoreFatal: The store failed; nothing is served.
            TypeError: ``fn`` is not callable.

        Complexity: ``fn``'s, after at most two commits.
        """
        if not callable(fn):
            raise TypeError(f"fn must be a callable taking the dispatcher, got {fn!r}")
        self._check_usable()
        self._readers += 1
        try:
            while self._committed < self._applied:
                await self._wait_committed(self._applied)
                self._check_usable()
        finally:
            self._readers -= 1
        return fn(self._dispatcher)

    async def sync(self) -> None:
        """Wait until every applied event is committed.

        Raises:
            StoreFatal: The store failed before they were.
        """
        await self._wait_committed(self._applied)
        self._check_usable()

    async def snapshot(self) -> None:
        """Write a snapshot now (with any pending events) and prune the journal behind it.

        Raises:
            StoreFatal: The store failed (the snapshot, if written, is harmless).

        Complexity: O(queued jobs) on the loop, plus the write.
        """
        self._check_usable()
        self._snapshot_at = -math.inf
        if self._applied == self._snapshot_seq:
            # Nothing pending: force a batch that only carries the snapshot.
            self._force_snapshot = True
        future = self._enqueue(None)
        await asyncio.shield(future)
        self._check_usable()

    async def aclose(self, *, snapshot: bool = True) -> None:
        """Commit what is pending, optionally write a final snapshot, and stop the writer.

        The store stays open (the caller closes it). Idempotent; a fatal wrapper just stops.
        """
        if self._closing:
            return
        try:
            if self._fatal is None:
                if snapshot and self._applied > self._snapshot_seq:
                    await self.snapshot()
                else:
                    await self.sync()
        finally:
            self._closing = True
            await self._idle.wait()  # a commit in flight finishes (or fails) first
            self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ internals

    _force_snapshot = False

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closing:
            raise StoreFatal("the durable dispatcher is closed")

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
        while self._committed < seq and self._fatal is None:
            future = self._inflight_future
            if future is None or seq > self._inflight_last:
                future = self._pending_future
            if future is None:  # pragma: no cover - applied events are always queued
                raise AssertionError("applied events without a pending batch")
            await asyncio.wait([future])

    def _take_snapshot(self, last: int) -> Snapshot | None:
        due = (
            self._force_snapshot
            or last - self._snapshot_seq >= self._snapshot_every
            or (
                last > self._snapshot_seq
                and time.monotonic() - self._snapshot_at >= self._snapshot_interval
            )
        )
        if not due:
            return None
        self._force_snapshot = False
        now = self._clock()
        state = self._dispatcher.snapshot(now=now)
        return Snapshot(seq=last, taken_at=now, state=state)

    # The writer is a pipeline of callbacks, not a task: the writer thread hands each commit
    # back with one call_soon_threadsafe, and that callback starts the next commit at once.
    # A task awaiting run_in_executor needed four or five loop turns per commit, and with
    # 2,000 connections a loop turn lasts a second (issue 21): commits lagged the requests.

    def _start_commit(self) -> None:
        self._start_scheduled = False
        if self._fatal is not None or self._inflight_future is not None:
            return
        if self._pending_future is None:
            return
        batch, future = self._pending, self._pending_future
        waiters, self._pending_waiters = self._pending_waiters, []
        self._pending, self._pending_future = [], None
        self._inflight_waiters = waiters
        last = batch[-1].seq if batch else self._committed
        try:
            snap = self._take_snapshot(last)
        except Exception as exc:  # a payload that cannot be snapshotted, say
            snap = None
            self._report_snapshot_error(exc)
        self._inflight_future, self._inflight_last = future, last
        self._idle.clear()
        try:
            self._executor.submit(self._commit, batch, snap, future, last)
        except RuntimeError:  # pragma: no cover - closed: a call that raced aclose()
            self._inflight_future = None
            self._idle.set()
            closed = StoreFatal("the durable dispatcher is closed")
            for f in (future, *self._inflight_waiters):
                if not f.done():
                    f.set_exception(closed)
                    f.exception()  # retrieved: its callers re-raise through _check_usable
            self._inflight_waiters = []

    def _commit(
        self, batch: list[Event], snap: Snapshot | None, future: asyncio.Future[None], last: int
    ) -> None:
        """In the writer thread: append, then hand the outcome back to the loop."""
        try:
            self._store.append(batch, epoch=self._epoch, snapshot=snap)
        except BaseException as exc:
            outcome: Callable[[], None] = partial(self._failed, batch, last, future, exc)
        else:
            outcome = partial(self._committed_batch, last, snap, future)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(outcome)

    def _committed_batch(
        self, last: int, snap: Snapshot | None, future: asyncio.Future[None]
    ) -> None:
        self._committed = last
        if snap is not None:
            self._snapshot_seq = last
            self._snapshot_at = time.monotonic()
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
                f"{self._store.url}: committing events {batch[0].seq if batch else last}"
                f"..{last} failed: {exc}; the process must stop and recover"
            )
            fatal.__cause__ = exc
        self._idle.set()
        self._die(fatal, future)

    def _report_snapshot_error(self, exc: Exception) -> None:
        # The journal still holds every event; only pruning is delayed. Try again later.
        self._snapshot_at = time.monotonic()
        self._loop.call_exception_handler(
            {"message": f"prioqueue.store: snapshot skipped: {exc!r}", "exception": exc}
        )

    def _die(self, fatal: StoreFatal, future: asyncio.Future[None]) -> None:
        self._fatal = fatal
        for f in (future, self._pending_future):
            if f is not None and not f.done():
                f.set_exception(fatal)
                f.exception()  # mark retrieved: every waiter re-raises through _check_usable
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
