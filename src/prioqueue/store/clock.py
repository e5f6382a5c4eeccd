"""Time across restarts: monotonic inside a process, anchored by the wall clock (private).

The dispatcher needs a ``now`` that never decreases. A service that restarts cannot use
``time.monotonic()`` alone (it restarts from an arbitrary origin) and should not shift stored
times by its downtime either: a worker's lease, a job's wait and a lane's age are facts about
the world, and they keep running while the broker is down. The rules (docs/durability.md):

1. **Inside a process, time is monotonic.** The clock reads the wall clock once (the
   anchor) and then advances by ``time.monotonic()``: a wall-clock step while the process
   runs (NTP, an operator, a moved VM) changes nothing; a step larger than the horizon is
   logged once.
2. **Across restarts, the wall clock anchors and the store's high-water mark is a floor.**
   The latest ``now`` the store recorded is raised as the floor at recovery. When the wall
   clock is behind it by at most ``horizon`` seconds (a small step back, a replica whose clock
   is a little behind), time stands still at the floor until the wall clock catches up.
3. **A larger gap is logged and bounded.** When the store's time is more than ``horizon``
   seconds ahead of the wall clock (a previous run had its clock years ahead), standing still
   would freeze every lease, worker time-out and retention for that long. Instead the clock
   continues from the floor at the monotonic rate (it never runs backwards: stored deadlines
   are in the store's time) and the warning says by how much broker time is ahead. An owner
   that can move its whole state back (the broker's journaled ``rebase_time``) does so and
   calls :meth:`WallClock.rebase`, so the saved step does not stick.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Final

from prioqueue._readonly import ReadOnly

__all__ = ["DEFAULT_HORIZON", "WallClock"]

_log = logging.getLogger("prioqueue.store")

DEFAULT_HORIZON: Final = 3600.0
"""Seconds of clock step tolerated silently (rule 2) when the owner gives no lease horizon."""

_SYSTEM: Final = object()


class WallClock:
    """Monotonic time anchored to the wall clock, never below a floor (see the module rules).

    Args:
        floor: The earliest value to return (the store's high-water mark), or None.
        source: The wall clock (``time.time`` by default; tests inject their own).
        monotonic: The in-process clock. By default ``time.monotonic`` with the default
            ``source``, and None with an injected one; None follows ``source`` itself (its
            backward steps hold time still), which is what a test's manual clock wants.
        horizon: Seconds (> 0): the longest lease or time-out that matters; a store ahead of
            the wall clock by more, or a wall-clock step larger than it, is logged, and the
            former makes time continue from the floor instead of standing still.

    Attributes:
        floor: The least value the next call may return (the high-water mark so far).
        offset: Seconds by which this clock runs ahead of the wall clock after a bounded gap.

    Raises:
        ValueError: ``floor`` is not finite, or ``horizon`` is not a positive number.
        TypeError: ``source`` or ``monotonic`` is not callable.
    """

    def __init__(
        self,
        floor: float | None = None,
        *,
        source: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | object | None = _SYSTEM,
        horizon: float = DEFAULT_HORIZON,
    ) -> None:
        if floor is not None and not math.isfinite(floor):
            raise ValueError(f"floor must be a finite number of seconds or None, got {floor!r}")
        if not callable(source):
            raise TypeError(f"source must be a callable returning seconds, got {source!r}")
        if monotonic is _SYSTEM:
            monotonic = time.monotonic if source is time.time else None
        if monotonic is not None and not callable(monotonic):
            raise TypeError(f"monotonic must be a callable or None, got {monotonic!r}")
        if (
            isinstance(horizon, bool)
            or not isinstance(horizon, (int, float))
            or not (math.isfinite(horizon) and horizon > 0)
        ):
            raise ValueError(f"horizon must be a positive number of seconds, got {horizon!r}")
        self._source = source
        self._monotonic: Callable[[], float] | None = monotonic
        self._horizon = float(horizon)
        self._last = -math.inf if floor is None else float(floor)
        self._anchor: tuple[float, float] | None = None  # (wall, monotonic) at the first read
        self._offset = 0.0  # added to the wall-clock estimate after a bounded large gap
        self._warned_step = False

    floor = ReadOnly[float](
        "_last", "The least value the next call may return (the high-water mark so far)."
    )
    offset = ReadOnly[float](
        "_offset", "Seconds by which this clock runs ahead of the wall clock after a bounded gap."
    )

    def _wall(self) -> float:
        """The wall clock as this process sees it: the anchor plus monotonic time elapsed."""
        mono = self._monotonic
        if mono is None:
            return float(self._source())
        if self._anchor is None:
            self._anchor = (float(self._source()), float(mono()))
        wall, start = self._anchor
        return wall + (float(mono()) - start)

    def raise_floor(self, t: float | None) -> None:
        """Never return less than ``t`` from now on (None: no change). O(1).

        When ``t`` is more than ``horizon`` seconds ahead of the wall clock, the gap is
        logged and time continues from ``t`` at the monotonic rate (rule 3).
        """
        if t is None or t <= self._last:
            return
        self._last = float(t)
        ahead = self._last - (self._wall() + self._offset)
        if ahead > self._horizon:
            _log.warning(
                "the store's time is %.0f s ahead of this machine's wall clock (more than the "
                "%.0f s horizon): a previous run's clock was ahead. Time continues from the "
                "store's at the monotonic rate, so leases and time-outs still run; broker "
                "time stays %.0f s ahead of the wall clock (see docs/durability.md)",
                ahead,
                self._horizon,
                ahead,
            )
            self._offset += ahead

    def rebase(self, by: float) -> None:
        """Run ``by`` seconds behind from now on: the owner moved every stored time back. O(1).

        After rule 3 the clock runs ahead of the wall clock by :attr:`offset`. An owner that
        can shift its whole state (the broker's ``rebase_time``) does so by ``offset`` and
        calls this, and the clock follows the wall clock again; the floor moves back with it,
        so the next value is still not below any time of the (shifted) state.

        Raises:
            ValueError: ``by`` is not a positive finite number.
        """
        if isinstance(by, bool) or not isinstance(by, (int, float)) or not 0 < by < math.inf:
            raise ValueError(f"by must be a positive number of seconds, got {by!r}")
        self._offset -= by
        self._last -= by
        _log.warning(
            "time rebased %.0f s back: the store's times were saved by a clock that ran "
            "ahead; durations left are kept (see docs/durability.md)",
            by,
        )

    def __call__(self) -> float:
        """Return the current time: never less than before or than the floor. O(1)."""
        t = self._wall() + self._offset
        if self._monotonic is not None and not self._warned_step:
            step = float(self._source()) - (t - self._offset)
            if abs(step) > self._horizon:
                self._warned_step = True
                _log.warning(
                    "the wall clock stepped %+.0f s while the process ran (more than the "
                    "%.0f s horizon); ignored: time inside a process is monotonic",
                    step,
                    self._horizon,
                )
        if t < self._last:
            return self._last
        self._last = t
        return t
