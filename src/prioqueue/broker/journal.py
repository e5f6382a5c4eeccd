"""The in-memory journal of ``store = "memory://"``: nothing survives a restart.

For tests, demos and the benchmark's no-store baseline. It keeps the operations the broker
applied (``entries``), in order, so a test can replay them into a fresh engine and compare
states; the durable stores go through :mod:`prioqueue.store` instead (see
:mod:`prioqueue.broker.service`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from prioqueue.clock import SYSTEM_CLOCK

__all__ = ["Entry", "MemoryJournal"]


@attrs.frozen
class Entry:
    """One applied operation."""

    seq: int
    op: str
    args: Mapping[str, Any]
    now: float


class MemoryJournal:
    """The applied operations, in memory, and a wall clock that never goes backwards.

    Args:
        clock: Wall-clock source (default ``SYSTEM_CLOCK.wall`` of :mod:`prioqueue.clock`);
            its readings are made monotonic.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._source = SYSTEM_CLOCK.wall if clock is None else clock
        self._last = -float("inf")
        self.entries: list[Entry] = []

    def append(self, op: str, args: Mapping[str, Any], now: float) -> None:
        """Keep one applied operation. O(1)."""
        self.entries.append(Entry(len(self.entries) + 1, op, dict(args), now))

    def clock(self) -> float:
        """``max(source(), the last value returned)``. O(1)."""
        self._last = max(self._last, float(self._source()))
        return self._last
