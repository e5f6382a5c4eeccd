"""The broker's driver: one writer that applies, journals and only then acknowledges.

Theory of operation
-------------------
:class:`Broker` owns the :class:`~prioqueue.broker.engine.BrokerEngine` through a *backend*:

* ``memory://``: the engine in memory, each applied operation kept in a
  :class:`~prioqueue.broker.journal.MemoryJournal` (nothing survives a restart);
* SQLite or PostgreSQL: the engine wrapped in :class:`prioqueue.store.DurableDispatcher`, which
  journals every operation (``op``, JSON arguments, ``now``) and answers only once its group
  commit is on disk; recovery is the latest snapshot plus the journal's tail.

Every state change goes through :meth:`Broker.run`: when a lease or a retention has run out
it first runs a ``tick`` (itself journaled), then the operation. An operation the engine
refuses (:class:`~prioqueue.broker.engine.Rejected`) changed nothing and is not journaled.
Reads (:meth:`Broker.query`) see only committed state: the answer is computed at once and
released after the commit of every operation applied before it, with no barrier that holds
other callers back. Anything else that escapes the engine
is a bug that may have left memory ahead of the journal: the process stops (crash-only) and
the next start recovers what was acknowledged. So does a failed commit.

Leadership (PostgreSQL): a :class:`prioqueue.store.Elector` campaigns in the background. A
replica that does not lead is a *standby*: :meth:`Broker.run` and :meth:`Broker.read` raise
:class:`Standby` (the app answers 503 with ``Retry-After`` and the leader's address). On
winning, it recovers from the store at its new epoch and serves. It stops serving, drops its
in-memory state and campaigns again when the elector says it lost the lease or an append is
:class:`~prioqueue.store.Fenced` (a deposed leader that resumed: it appended nothing).
SQLite allows one broker per file (the store's lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from prioqueue._journaled import journaled_ops
from prioqueue.broker._changes import Changes
from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.engine import BrokerEngine, Rejected
from prioqueue.broker.journal import MemoryJournal

__all__ = ["BROKER_OPS", "Broker", "Standby", "Stopping"]

_log = logging.getLogger("prioqueue.broker")
T = TypeVar("T")

BROKER_OPS = frozenset(journaled_ops(BrokerEngine))
"""The engine's journaled operations: derived, its methods declared ``@journaled``."""
SKIPPED_OPS = frozenset(n for n, op in journaled_ops(BrokerEngine).items() if op.skip_when_empty)
"""Those declared ``skip_when_empty`` (``try_pop``): a None result changed nothing, so it is
answered without a journal entry."""


class Standby(Exception):
    """This replica is not serving; ``leader`` is the leader's address when known."""

    def __init__(self, leader: str | None) -> None:
        where = f"; the leader is {leader}" if leader else ""
        super().__init__(f"this broker is a standby{where}")
        self.leader = leader


class Stopping(Standby):
    """This broker is stopping (SIGTERM): a waiting request answers 503 at once."""

    def __init__(self) -> None:
        super().__init__(None)
        self.args = ("this broker is stopping; retry (another replica, or this one restarted)",)


class _Memory:
    """The memory backend: apply, keep the entry, answer."""

    def __init__(self, config: BrokerConfig, journal: MemoryJournal) -> None:
        self.engine = BrokerEngine(config)
        self.journal = journal

    def now(self) -> float:
        return self.journal.clock()

    async def call(self, op: str, args: Mapping[str, Any]) -> Any:
        now = self.journal.clock()
        result = self.engine.apply(op, args, now)
        if result is not None or op not in SKIPPED_OPS:
            self.journal.append(op, args, now)
        return result

    async def read(self) -> BrokerEngine:
        return self.engine

    async def query(self, fn: Callable[[BrokerEngine], T]) -> T:
        return fn(self.engine)

    async def close(self) -> None:
        return None


class _Durable:
    """The store backend: :class:`prioqueue.store.DurableDispatcher` around the engine."""

    def __init__(self, durable: Any, store: Any) -> None:
        self.durable = durable
        self.store = store

    @property
    def engine(self) -> BrokerEngine:
        engine: BrokerEngine = self.durable.dispatcher
        return engine

    def now(self) -> float:
        now: float = self.durable.now()
        return now

    async def call(self, op: str, args: Mapping[str, Any]) -> Any:
        return await self.durable.call(op, **args)

    async def read(self) -> BrokerEngine:
        engine: BrokerEngine = await self.durable.read_settled(lambda engine: engine)
        return engine

    async def query(self, fn: Callable[[BrokerEngine], T]) -> T:
        result: T = await self.durable.read(fn)
        return result

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.durable.aclose(snapshot=self.durable.fatal is None)
        await asyncio.to_thread(self.store.close)


class Broker:
    """The single writer in front of the engine; see the module docstring.

    Args:
        config: The configuration.
        journal: Use this in-memory journal whatever ``config.store`` says (tests).
        clock: The store backend's :class:`prioqueue.store.WallClock` (tests inject one with
            manual sources); default: one whose horizon is the longest default lease.
    """

    def __init__(
        self, config: BrokerConfig, journal: MemoryJournal | None = None, *, clock: Any = None
    ) -> None:
        self.config = config
        self._journal = journal
        self._clock = clock
        self._backend: _Memory | _Durable | None = None
        self._elector: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake: asyncio.Event | None = None
        self._fenced: asyncio.Event | None = None
        self._stopped = False
        self.recovered_entries = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.changes = Changes(member_cap=config.max_running_per_member is not None)
        """Wakes the long polls an applied operation concerns, and all on a change of role."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def engine(self) -> BrokerEngine | None:
        """The engine while this replica serves (possibly ahead of the store), else None."""
        return None if self._backend is None else self._backend.engine

    @property
    def serving(self) -> bool:
        """Whether this replica leads and has recovered its state."""
        return self._backend is not None

    @property
    def leader(self) -> str | None:
        """The leader's address as last seen (this replica's own while it leads)."""
        if self._elector is not None:
            address: str | None = self._elector.leader_address
            if self._backend is None and address == self.config.advertise:
                return None  # stepped down: not (or no longer) this replica; unknown yet
            return address
        return self.config.advertise if self.serving else None

    async def start(self) -> None:
        """Recover and serve, or start campaigning (PostgreSQL); start the tick task.

        Raises:
            StoreError: The store cannot be opened or recovered (corrupt, newer schema,
                locked by another broker).
        """
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._fenced = asyncio.Event()
        config = self.config
        if self._journal is not None or config.store == "memory://":
            self._backend = _Memory(config, self._journal or MemoryJournal())
            self._backend.engine.watch(self.changes.changed)
        elif config.store.startswith(("postgresql:", "postgres:")):
            from prioqueue.store import Elector

            lease = config.leader_lease_seconds
            self._elector = Elector(
                config.store,
                schema=config.store_schema,
                address=config.advertise,
                lease=lease,
                renew_interval=min(2.0, lease / 4),
                poll_interval=min(0.25, lease / 8),
            )
            await self._elector.start()
            self._tasks.append(asyncio.create_task(self._lead_loop()))
        else:
            self._backend = await self._open(None)
        self._tasks.append(asyncio.create_task(self._tick_loop()))

    async def _open(self, epoch: int | None) -> _Durable:
        from prioqueue.store import DurableDispatcher, open_store

        config = self.config
        if config.store.startswith("sqlite:"):
            store = await asyncio.to_thread(
                open_store, config.store, synchronous=config.sqlite_synchronous
            )
        else:
            store = await asyncio.to_thread(open_store, config.store, schema=config.store_schema)
        if self._clock is None:
            from prioqueue.store import WallClock

            # A gap between the store's time and the wall clock longer than any lease is
            # not waited out (docs/durability.md, "Time").
            lease = config.default_lease_seconds * float(config.lease.extra_slow_multiplier)
            self._clock = WallClock(horizon=max(60.0, lease))
        try:
            durable = await DurableDispatcher.open(
                store,
                self._factory,
                epoch=epoch,
                clock=self._clock,
                snapshot_every=config.snapshot_every,
                on_fatal=self._on_fatal,
            )
        except BaseException:
            await asyncio.to_thread(store.close)
            raise
        try:
            await self._undo_saved_clock_step(durable)
        except BaseException:
            await durable.aclose(snapshot=False)
            await asyncio.to_thread(store.close)
            raise
        backend = _Durable(durable, store)
        backend.engine.watch(self.changes.changed)  # wakes long polls as soon as applied
        self.recovered_entries = durable.committed_seq
        _log.info("serving from %s at epoch %s", config.store, durable.epoch)
        return backend

    async def _undo_saved_clock_step(self, durable: Any) -> None:
        """Rebase the engine's times when the store was saved by a clock far ahead.

        The clock continues from a store more than its horizon ahead of the wall clock (by
        its ``offset``) rather than go back below stored times; the broker then moves the
        clock and every stored time back by that gap in one journaled operation, so a saved
        forward step does not stick (docs/durability.md, "Time across restarts").
        """
        from prioqueue.store import WallClock

        clock = self._clock
        gap = clock.offset if isinstance(clock, WallClock) else 0.0
        if gap <= 0:
            return
        clock.rebase(gap)
        await durable.call("rebase_time", by=gap)

    def _factory(self, state: Mapping[str, Any] | None) -> BrokerEngine:
        if state is None:
            return BrokerEngine(self.config)
        return BrokerEngine.restore(state, self.config)

    def _on_fatal(self, exc: Exception) -> None:
        from prioqueue.store import Fenced

        if isinstance(exc, Fenced) and self._elector is not None and self._fenced is not None:
            _log.warning("fenced (another broker leads): stepping down")
            self._fenced.set()
            return
        _fatal(f"the store failed: {exc}")

    async def _lead_loop(self) -> None:
        """Campaign; on winning recover and serve until deposed; then campaign again."""
        elector = self._elector
        assert elector is not None
        assert self._fenced is not None
        while not self._stopped:
            epoch = await elector.wait_leader()
            self._fenced.clear()
            try:
                backend = await self._open(epoch)
            except Exception as exc:
                from prioqueue.store import Fenced

                if isinstance(exc, Fenced):
                    elector.step_down()
                    continue
                _fatal(f"cannot recover from the store: {exc}")
                return  # pragma: no cover - _fatal does not return
            self._backend = backend
            lost = asyncio.create_task(elector.wait_step_down())
            fenced = asyncio.create_task(self._fenced.wait())
            try:
                await asyncio.wait((lost, fenced), return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                fenced.cancel()
            self._backend = None
            elector.step_down()  # first: the waiters' 503s must not name this replica
            self.changes.fire()  # waiting requests answer 503 (with the leader when known)
            _log.warning("stepped down; the leader is now %s", elector.leader_address)
            await backend.close()

    def begin_stop(self) -> None:
        """Answer every waiting request now (a SIGTERM): safe from a signal handler. O(1)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.changes.drain)

    async def stop(self) -> None:
        """Stop the background tasks, commit what is pending and close the store."""
        self._stopped = True
        self.changes.drain()
        if self._wake is not None:
            self._wake.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        backend, self._backend = self._backend, None
        if backend is not None:
            await backend.close()
        if self._elector is not None:
            await self._elector.aclose()

    async def _tick_loop(self) -> None:
        """Run a ``tick`` when a lease or a retention runs out, so reads see it."""
        assert self._wake is not None
        while not self._stopped:  # the flag too: wait_for may swallow a cancel (bpo-42130)
            backend = self._backend
            delay = 1.0
            if backend is not None:
                due = backend.engine.next_due()
                if due is not None:
                    delay = min(1.0, max(0.0, due - backend.now()) + 0.001)
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            self._wake.clear()
            backend = self._backend
            if not self._stopped and backend is not None and backend.engine.due(backend.now()):
                with contextlib.suppress(Standby):
                    await self.run("tick", {})

    # ------------------------------------------------------------------ operations

    def _serving(self) -> _Memory | _Durable:
        if self._backend is None:
            raise Standby(self.leader)
        return self._backend

    async def run(self, op: str, args: Mapping[str, Any]) -> Any:
        """Apply one operation and return its result once it is durable.

        Args:
            op: The operation (see ``BrokerEngine.apply``).
            args: Its JSON arguments.

        Returns:
            The engine's result.

        Raises:
            Standby: This replica does not serve.
            Rejected: The engine refused the operation (nothing changed, nothing journaled).
        """
        backend = self._serving()
        if op != "tick" and backend.engine.due(backend.now()):
            await self._call(backend, "tick", {})
        result = await self._call(backend, op, args)
        if self._wake is not None:
            self._wake.set()
        return result

    async def _call(self, backend: _Memory | _Durable, op: str, args: Mapping[str, Any]) -> Any:
        from_store = isinstance(backend, _Durable)
        try:
            return await backend.call(op, args)
        except Rejected:
            raise
        except Exception as exc:
            if not from_store:
                raise  # memory only: nothing to recover from, a 500 and go on
            from prioqueue.store import StoreFatal

            if isinstance(exc, StoreFatal):  # fenced: stepping down; else on_fatal exits
                raise Standby(self.leader) from None
            _log.exception("operation %s failed inside the engine", op)
            _fatal(f"operation {op} failed inside the engine: {exc!r}")
            raise  # pragma: no cover - _fatal does not return

    def now(self) -> float:
        """The broker's wall-clock time (the store's clock; never goes backwards).

        Raises:
            Standby: This replica does not serve.
        """
        return self._serving().now()

    async def read(self) -> BrokerEngine:
        """The engine, at a moment when everything applied so far is durable.

        Costly under load: while it waits, new operations wait too (see
        ``DurableDispatcher.read_settled``). Prefer :meth:`query`.

        Raises:
            Standby: This replica does not serve.
        """
        backend = self._serving()
        try:
            return await backend.read()
        except Exception:
            raise Standby(self.leader) from None

    async def query(self, fn: Callable[[BrokerEngine], T]) -> T:
        """``fn(engine)`` computed now, returned once every operation it could see is durable.

        No barrier: ``fn`` runs at once and operations keep flowing; its result waits for the
        commit of what was applied before it (at most two group commits), so a client never
        sees a change the store lacks. ``fn`` must return data (copies or views built from
        the engine), never the engine or a live record.

        Raises:
            Standby: This replica does not serve.
            Rejected: ``fn`` refused (a 404, say); nothing changed.
        """
        backend = self._serving()
        try:
            return await backend.query(fn)
        except Rejected:
            raise
        except Exception as exc:
            from prioqueue.store import StoreFatal

            if isinstance(exc, StoreFatal):
                raise Standby(self.leader) from None
            raise

    def serving_engine(self) -> BrokerEngine:
        """The engine (possibly ahead of the store) for checks that read no state.

        Raises:
            Standby: This replica does not serve.
        """
        return self._serving().engine


def _fatal(reason: str) -> None:
    """Crash-only: never serve state the store lacks; the next start recovers."""
    _log.critical("%s: stopping (the next start recovers from the store)", reason)
    logging.shutdown()
    os._exit(75)
