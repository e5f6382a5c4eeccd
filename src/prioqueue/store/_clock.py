"""Time across restarts: a wall clock that never goes backwards (private).

The dispatcher needs a ``now`` that never decreases. A service that restarts cannot use
``time.monotonic()`` (it restarts from an arbitrary origin) and should not shift stored times
by its downtime either: a worker's lease, a job's wait and a lane's age are facts about the
world, and they keep running while the broker is down. So the durable dispatcher stamps calls
with wall-clock seconds (``time.time()``) clamped from below by a **floor**: the latest
``now`` it has journaled, or read back from the store at recovery (the high-water mark). When
the wall clock steps backwards (NTP, a moved VM), time stands still at the floor until the
wall clock catches up; it never runs backwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["WallClock"]


class WallClock:
    """``time.time()`` clamped so that it never returns less than it did before (or the floor).

    Args:
        floor: The earliest value to return (the store's high-water mark), or None.
        source: The underlying clock (``time.time`` by default; tests inject their own).

    Raises:
        ValueError: ``floor`` is not finite.
    """

    def __init__(
        self, floor: float | None = None, *, source: Callable[[], float] = time.time
    ) -> None:
        if floor is not None and not math.isfinite(floor):
            raise ValueError(f"floor must be a finite number of seconds or None, got {floor!r}")
        if not callable(source):
            raise TypeError(f"source must be a callable returning seconds, got {source!r}")
        self._source = source
        self._last = -math.inf if floor is None else float(floor)

    @property
    def floor(self) -> float:
        """The least value the next call may return (the high-water mark so far)."""
        return self._last

    def raise_floor(self, t: float | None) -> None:
        """Never return less than ``t`` from now on (None: no change). O(1)."""
        if t is not None and t > self._last:
            self._last = float(t)

    def __call__(self) -> float:
        """Return ``max(source(), every value returned before, floor)``. O(1)."""
        t = float(self._source())
        if t < self._last:
            return self._last
        self._last = t
        return t
