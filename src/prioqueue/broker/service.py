"""The broker's driver: one writer that applies, journals and only then acknowledges.

Theory of operation
-------------------
:class:`Broker` owns a :class:`~prioqueue.broker.engine.BrokerEngine` and a
:class:`~prioqueue.broker.journal.Journal`. Every state change goes through :meth:`Broker.run`:
it reads the journal's clock, journals a ``tick`` first when a lease or a retention ran out,
applies the operation to the engine (a :class:`~prioqueue.broker.engine.Rejected` operation
changed nothing and is not journaled), appends it to the journal and awaits its commit before
returning. The event loop is single-threaded and ``apply`` is synchronous, so the journal
order is the apply order. Reads (:meth:`Broker.read`) first wait for everything applied so far
to be committed, so no client ever sees state the store lacks.

Leadership: a replica that is not the leader is *standby*; :meth:`Broker.run` and
:meth:`Broker.read` raise :class:`Standby` (the app answers 503 with ``Retry-After`` and the
leader's address). A background task polls the journal; once this replica leads it recovers
(snapshot + replay) and serves. A journal that reports :class:`NotLeader` on append (a deposed
leader: its epoch is stale) makes this replica drop its in-memory state and go back to
standby; :class:`JournalFailed` stops the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.engine import BrokerEngine, Rejected
from prioqueue.broker.journal import Journal, JournalFailed, MemoryJournal, NotLeader

__all__ = ["Broker", "Standby", "open_journal"]

_log = logging.getLogger("prioqueue.broker")


class Standby(Exception):
    """This replica is not serving; ``leader`` is the leader's address when known."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(
            "this broker is a standby" + (f"; the leader is {leader}" if leader else "")
        )
        self.leader = leader


def open_journal(config: BrokerConfig) -> Journal:
    """The journal named by ``config.store``.

    Args:
        config: The configuration.

    Returns:
        A journal (not yet opened).

    Raises:
        ConfigError: The store's package is missing or the URL is not usable.
    """
    if config.store == "memory://":
        return MemoryJournal()
    from prioqueue.broker._store import StoreJournal

    return StoreJournal(config)


class Broker:
    """The single writer in front of the engine; see the module docstring.

    Args:
        config: The configuration.
        journal: The journal (default: the one ``config.store`` names).
        poll_seconds: How often a standby asks whether it may lead.
    """

    def __init__(
        self, config: BrokerConfig, journal: Journal | None = None, *, poll_seconds: float = 0.5
    ) -> None:
        self.config = config
        self.journal = open_journal(config) if journal is None else journal
        self.engine: BrokerEngine | None = None
        self.leader: str | None = None
        self.poll_seconds = poll_seconds
        self._pending: asyncio.Future[None] | None = None
        self._since_snapshot = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._wake: asyncio.Event | None = None
        self.recovered_entries = 0
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Become leader if the store allows (else standby) and start the background tasks."""
        self._wake = asyncio.Event()
        await self._try_lead()
        self._tasks.append(asyncio.create_task(self._lead_loop()))
        self._tasks.append(asyncio.create_task(self._tick_loop()))

    async def stop(self) -> None:
        """Stop the background tasks and close the journal."""
        self._stopped = True
        if self._wake is not None:
            self._wake.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._pending is not None:
            with contextlib.suppress(Exception):
                await self._pending
        await self.journal.close()

    @property
    def serving(self) -> bool:
        """Whether this replica leads and has recovered its state."""
        return self.engine is not None

    async def _try_lead(self) -> None:
        leads, leader = await self.journal.is_leader()
        self.leader = leader
        if leads and self.engine is None:
            recovered = await self.journal.open()
            engine = (
                BrokerEngine(self.config)
                if recovered.snapshot is None
                else BrokerEngine.restore(recovered.snapshot, self.config)
            )
            for entry in recovered.entries:
                with contextlib.suppress(Rejected):
                    engine.apply(entry.op, dict(entry.args), entry.now)
            self.recovered_entries = len(recovered.entries)
            self.engine = engine
            self._since_snapshot = len(recovered.entries)
            _log.info("leading: recovered %d journal entries", len(recovered.entries))
        elif not leads and self.engine is not None:
            self._step_down(leader)

    def _step_down(self, leader: str | None) -> None:
        _log.warning("stepping down: another replica leads (%s)", leader)
        self.engine = None
        self.leader = leader
        self._pending = None

    async def _lead_loop(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.poll_seconds)
            try:
                await self._try_lead()
            except NotLeader as exc:
                self._step_down(exc.leader)
            except JournalFailed:
                _fatal("the store failed")
            except Exception:
                _log.exception("leadership check failed")

    async def _tick_loop(self) -> None:
        """Journal a ``tick`` when a lease or a retention runs out, so GETs see it."""
        assert self._wake is not None
        while not self._stopped:  # the flag too: wait_for may swallow a cancel (bpo-42130)
            engine = self.engine
            delay = 1.0
            if engine is not None:
                due = engine.next_due()
                if due is not None:
                    delay = min(1.0, max(0.0, due - self.journal.clock()) + 0.001)
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            self._wake.clear()
            if (
                not self._stopped
                and self.engine is not None
                and self.engine.due(self.journal.clock())
            ):
                with contextlib.suppress(Standby):
                    await self.run("tick", {})

    # ------------------------------------------------------------------ operations

    def _engine(self) -> BrokerEngine:
        if self.engine is None:
            raise Standby(self.leader)
        return self.engine

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
        engine = self._engine()
        now = self.journal.clock()
        if op != "tick" and engine.due(now):
            engine.apply("tick", {}, now)
            self._append("tick", {}, now)
        try:
            result = engine.apply(op, args, now)
        except Rejected:
            await self._commit()
            raise
        except Exception:
            self._append(op, args, now)  # replays the same way: see the engine's rule 1
            await self._commit()
            raise
        self._append(op, args, now)
        await self._commit()
        if self._wake is not None:
            self._wake.set()
        return result

    def _append(self, op: str, args: Mapping[str, Any], now: float) -> None:
        awaitable = self.journal.append(op, args, now)
        self._pending = asyncio.ensure_future(awaitable)
        self._since_snapshot += 1

    async def _commit(self) -> None:
        pending = self._pending
        if pending is None:
            return
        try:
            await asyncio.shield(pending)
        except NotLeader as exc:
            self._step_down(exc.leader)
            raise Standby(exc.leader) from None
        except JournalFailed:
            _fatal("a journal commit failed")
        if self._pending is pending:
            self._pending = None
        if self._since_snapshot >= self.config.snapshot_every and self.engine is not None:
            self._since_snapshot = 0
            await self.journal.save_snapshot(self.engine.snapshot())

    async def read(self) -> BrokerEngine:
        """The engine, once everything applied so far is durable.

        Raises:
            Standby: This replica does not serve.
        """
        self._engine()
        await self._commit()
        return self._engine()


def _fatal(reason: str) -> None:
    """Crash-only: never serve state the store lacks; the next start recovers."""
    _log.critical("%s: stopping (the next start recovers from the store)", reason)
    os._exit(70)
