"""Where the broker's operations go before they are acknowledged: the journal interface.

Theory of operation
-------------------
The broker applies an operation to its in-memory :class:`~prioqueue.broker.engine.BrokerEngine`
and hands ``(op, args, now)`` to its :class:`Journal` with :meth:`Journal.append`, which returns
an awaitable that completes once the entry is durable. The reply is sent only after that; the
journal is free to commit every entry appended in one event-loop turn in one transaction
(group commit). Entries must be committed in the order they were appended. A journal that
cannot commit raises :class:`JournalFailed` and the broker stops (crash-only: the next start
recovers from the store). A journal whose writer lost leadership raises :class:`NotLeader`:
the broker steps down and answers 503 until it leads again.

:class:`MemoryJournal` keeps nothing across restarts (``store = "memory://"``): tests, demos
and the benchmark's no-store baseline. The durable journals adapt ``prioqueue.store``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol

import attrs

__all__ = ["Entry", "Journal", "JournalFailed", "MemoryJournal", "NotLeader", "Recovered"]


class JournalFailed(Exception):
    """The journal could not make an entry durable; the broker must stop."""


class NotLeader(Exception):
    """This replica does not (or no longer) lead; ``leader`` is the leader's address if known."""

    def __init__(self, message: str, *, leader: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader


@attrs.frozen
class Entry:
    """One journaled operation."""

    seq: int
    op: str
    args: Mapping[str, Any]
    now: float


@attrs.frozen
class Recovered:
    """What a journal holds at start: the latest snapshot and the entries after it."""

    snapshot: Mapping[str, Any] | None
    entries: Sequence[Entry]


class Journal(Protocol):
    """The store as the broker sees it (see the module docstring)."""

    async def open(self) -> Recovered:
        """Start (as leader: the caller checks :meth:`is_leader` first) and read the state."""
        ...

    def append(self, op: str, args: Mapping[str, Any], now: float) -> Awaitable[None]:
        """Queue an entry; the awaitable completes once it is durable (in append order)."""
        ...

    async def save_snapshot(self, state: Mapping[str, Any]) -> None:
        """Store a snapshot of everything appended so far; older entries may be pruned."""
        ...

    def clock(self) -> float:
        """Wall-clock seconds that never go backwards, across restarts too."""
        ...

    async def is_leader(self) -> tuple[bool, str | None]:
        """Whether this replica leads now (acquiring if free), and the leader's address."""
        ...

    async def close(self) -> None:
        """Release the connection (and leadership)."""
        ...


class MemoryJournal:
    """A journal that keeps its entries in memory only: nothing survives a restart.

    Args:
        clock: Wall-clock source (default ``time.time``), made monotonic here.
    """

    def __init__(self, clock: Any = None) -> None:
        import time

        self._source = time.time if clock is None else clock
        self._last = 0.0
        self.entries: list[Entry] = []
        self.snapshots = 0

    async def open(self) -> Recovered:
        """Nothing to recover."""
        return Recovered(None, ())

    def append(self, op: str, args: Mapping[str, Any], now: float) -> Awaitable[None]:
        """Keep the entry; it is as durable as it gets at once."""
        self.entries.append(Entry(len(self.entries) + 1, op, args, now))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def save_snapshot(self, state: Mapping[str, Any]) -> None:
        """Count it (there is nothing to prune)."""
        self.snapshots += 1

    def clock(self) -> float:
        """``max(source(), last value)``."""
        self._last = max(self._last, float(self._source()))
        return self._last

    async def is_leader(self) -> tuple[bool, str | None]:
        """Always the leader."""
        return True, None

    async def close(self) -> None:
        """Nothing to release."""
