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
5. **Snapshots.** Every ``snapshot_every`` events or ``snapshot_interval`` seconds (of the
   event loop's clock), the batch being written carries a snapshot of the state after its
   last event; the store prunes the journal behind it in the same transaction. The writer
   thread takes it from a replica of the dispatcher that it brings up to that event
   (:mod:`prioqueue.store._replica`), so the loop never walks the state.

The writer (rules 2, 4 and 5) is :class:`~prioqueue.store._commit.GroupCommit`; this module
is the dispatcher's side (rules 1 and 3).

Time: see :class:`~prioqueue.store.WallClock`: monotonic inside the process, anchored by the
wall clock; the floor is the store's high-water mark.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Generic, TypeVar

import attrs

from prioqueue._readonly import ReadOnly
from prioqueue.store._commit import FatalCallback, GroupCommit
from prioqueue.store._journal import Restorable, declared_ops, replay, takes_now
from prioqueue.store._replica import Replica
from prioqueue.store.base import Recovery, Store
from prioqueue.store.clock import WallClock
from prioqueue.store.errors import StoreFatal

__all__ = ["DurableDispatcher"]

D = TypeVar("D", bound=Restorable)
T = TypeVar("T")


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


def _check_options(snapshot_every: Any, snapshot_interval: Any, epoch: Any) -> None:
    """Raise ValueError for an option of :meth:`DurableDispatcher.open` out of range."""
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


async def _recover(
    store: Store,
    factory: Callable[[Mapping[str, Any] | None], D],
    epoch: int | None,
    executor: ThreadPoolExecutor,
) -> tuple[int, Recovery, D, Replica]:
    """Claim the store (``epoch`` None), read it and replay it, in the writer thread."""
    loop = asyncio.get_running_loop()
    if epoch is None:
        epoch = await loop.run_in_executor(executor, store.claim)
    recovery = await loop.run_in_executor(executor, store.recover)
    # The replica's copy first: the live dispatcher may keep and change what it restores.
    replica = await loop.run_in_executor(executor, Replica, recovery, factory)
    dispatcher = await loop.run_in_executor(executor, partial(replay, recovery, factory))
    return epoch, recovery, dispatcher, replica


# Argument types whose JSON round trip is the identity (floats must also be finite).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _as_replayed(op: str, kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The arguments as replay will see them (through JSON), and their JSON text if made.

    Raises:
        ValueError: An argument is not JSON data (or a float is not finite).
    """
    if all(type(v) in _SCALARS for v in kwargs.values()) and all(
        math.isfinite(v) for v in kwargs.values() if type(v) is float
    ):
        return kwargs, None  # plain scalars come back from JSON unchanged (encoded by the writer)
    try:
        text = json.dumps(kwargs, allow_nan=False, separators=(",", ":"))
        args: dict[str, Any] = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the arguments of {op} must be JSON data: {exc}") from None
    return args, text


@attrs.define(eq=False, repr=False)
class DurableDispatcher(Generic[D]):
    """A dispatcher wrapped so that no result is released before its call is on disk.

    Make one with :meth:`open` (it recovers the dispatcher from the store). Every method
    must be called on the event loop that opened it.

    Attributes:
        store: The store the journal goes to.
        epoch: The leader epoch this wrapper writes with.
        committed_seq: The number of the last event known to be on disk.
        applied_seq: The number of the last event applied in memory (>= ``committed_seq``).
    """

    _dispatcher: D
    _writer: GroupCommit
    _clock: Callable[[], float] = attrs.field(kw_only=True)
    _ops: frozenset[str] = attrs.field(kw_only=True)
    _skip: frozenset[str] = attrs.field(kw_only=True, alias="skip_when_empty")
    _readers: int = attrs.field(init=False, default=0)
    _now_cache: dict[str, bool] = attrs.field(init=False, factory=dict)

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
            snapshot_interval: Seconds between snapshots while events arrive (> 0), on the
                event loop's clock.
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
        _check_options(snapshot_every, snapshot_interval, epoch)
        executor = ThreadPoolExecutor(1, thread_name_prefix="prioqueue-store")
        try:
            epoch, recovery, dispatcher, replica = await _recover(store, factory, epoch, executor)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        if isinstance(clock, WallClock):
            wall = clock
        else:
            wall = WallClock() if clock is None else WallClock(source=clock)
        wall.raise_floor(recovery.high_water)
        writer = GroupCommit(
            store,
            executor,
            epoch=epoch,
            last_seq=recovery.last_seq,
            snapshot_seq=0 if recovery.snapshot is None else recovery.snapshot.seq,
            replica=replica,
            clock=wall,
            snapshot_every=snapshot_every,
            snapshot_interval=float(snapshot_interval),
            on_fatal=on_fatal,
        )
        journaled, skipped = _journaled(dispatcher, ops, skip_when_empty)
        return cls(
            dispatcher,
            writer,
            clock=wall,
            ops=journaled,
            skip_when_empty=skipped,
        )

    # ------------------------------------------------------------------ properties

    @property
    def dispatcher(self) -> D:
        """The in-memory dispatcher, possibly ahead of the store.

        It may hold changes not yet committed: read through :meth:`read` to see only committed
        state, and never call its mutating methods directly.
        """
        return self._dispatcher

    store = ReadOnly[Store]("_writer.store", "The store the journal goes to.")
    epoch = ReadOnly[int]("_writer.epoch", "The leader epoch this wrapper writes with.")
    committed_seq = ReadOnly[int](
        "_writer.committed", "The number of the last event known to be on disk."
    )
    applied_seq = ReadOnly[int](
        "_writer.applied",
        "The number of the last event applied in memory (>= ``committed_seq``).",
    )

    @property
    def fatal(self) -> StoreFatal | None:
        """The error that stopped the wrapper, or None while it serves."""
        return self._writer.fatal

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
        writer = self._writer
        writer.check_usable()
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
            await writer.wait_applied()
            writer.check_usable()
        stamp = self._now_cache.get(op)
        if stamp is None:
            stamp = self._now_cache[op] = takes_now(self._dispatcher, op)
        now = self._clock() if stamp else None
        if stamp:
            kwargs["now"] = now
        args, text = _as_replayed(op, kwargs)
        try:
            result = getattr(self._dispatcher, op)(**args)
        except Exception:
            await writer.wait_applied()
            writer.check_usable()
            raise
        if op in self._skip and (result is None or (isinstance(result, list) and not result)):
            await writer.wait_applied()
            writer.check_usable()
            return result
        await writer.add(op, args, now, text)
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
        self._check_reader(fn)
        result = fn(self._dispatcher)
        if self._writer.committed < self._writer.applied:
            await self._writer.wait_applied()
            self._writer.check_usable()
        return result

    async def read_settled(self, fn: Callable[[D], T]) -> T:
        """Return ``fn(dispatcher)`` run at a moment when every applied event is committed.

        Stronger than :meth:`read` (``fn`` may return a live view, read before the caller's
        next ``await``) and much costlier under load: while a settled read waits, new writers
        wait for the commit too. Prefer :meth:`read`. Arguments, result and errors as
        :meth:`read`'s.

        Complexity: ``fn``'s, after at most two commits.
        """
        self._check_reader(fn)
        self._readers += 1
        try:
            while self._writer.committed < self._writer.applied:
                await self._writer.wait_applied()
                self._writer.check_usable()
        finally:
            self._readers -= 1
        return fn(self._dispatcher)

    def _check_reader(self, fn: object) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be a callable taking the dispatcher, got {fn!r}")
        self._writer.check_usable()

    async def sync(self) -> None:
        """Wait until every applied event is committed.

        Raises:
            StoreFatal: The store failed before they were.
        """
        await self._writer.wait_applied()
        self._writer.check_usable()

    async def snapshot(self) -> None:
        """Write a snapshot now (with any pending events) and prune the journal behind it.

        Raises:
            StoreFatal: The store failed (the snapshot, if written, is harmless).

        Complexity: O(1) on the loop; the writer thread brings the replica up to date,
        snapshots it and writes it.
        """
        self._writer.check_usable()
        await asyncio.shield(self._writer.snapshot_now())
        self._writer.check_usable()

    async def aclose(self, *, snapshot: bool = True) -> None:
        """Commit what is pending, optionally write a final snapshot, and stop the writer.

        The store stays open (the caller closes it). Idempotent; a fatal wrapper just stops.
        """
        writer = self._writer
        if writer.closing:
            return
        try:
            if writer.fatal is None:
                if snapshot and writer.unsnapshotted:
                    await self.snapshot()
                else:
                    await self.sync()
        finally:
            await writer.close()  # a commit in flight finishes (or fails) first
