"""``ManualClock``: time that moves only when a test says so (private; see ``testing``).

It implements :class:`prioqueue.clock.Clock`, so any adapter that takes a clock takes it:
``monotonic`` and ``wall`` read the same value, and ``sleep`` moves time forward instead of
waiting (trio's ``MockClock`` with autojump), so a waiting loop ends at once, in order.
"""

from __future__ import annotations

import math

__all__ = ["ManualClock"]


class ManualClock:
    """A monotonic clock that moves only when told to.

    Example:
        >>> clock = ManualClock(start=100.0)
        >>> clock.advance(2.5)
        102.5
        >>> clock()
        102.5

    Args:
        start: The initial reading in seconds (default 0.0); finite.

    Raises:
        ValueError: ``start`` is not finite.
    """

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = _finite("start", start)

    def now(self) -> float:
        """Return the current reading in seconds. O(1)."""
        return self._now

    def __call__(self) -> float:
        """Return the current reading: the clock is a zero-argument callable. O(1)."""
        return self._now

    def monotonic(self) -> float:
        """Return the current reading (:class:`prioqueue.clock.Clock`). O(1)."""
        return self._now

    def wall(self) -> float:
        """Return the current reading as the wall clock (:class:`prioqueue.clock.Clock`). O(1)."""
        return self._now

    def sleep(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` instead of blocking (autojump). O(1).

        Raises:
            ValueError: ``seconds`` is negative or not finite.
            TypeError: ``seconds`` is not a number.
        """
        self.advance(seconds)

    def advance(self, seconds: float) -> float:
        """Move the clock forward.

        Args:
            seconds: How far to move; finite and >= 0.

        Returns:
            The new reading.

        Raises:
            ValueError: ``seconds`` is negative or not finite.
        """
        step = _finite("seconds", seconds)
        if step < 0:
            raise ValueError(f"a clock never goes backwards: advance({seconds!r})")
        self._now += step
        return self._now

    def jump_to(self, t: float) -> float:
        """Set the clock to ``t``, which must not be earlier than the current reading.

        Args:
            t: The new reading; finite and >= :meth:`now`.

        Returns:
            The new reading.

        Raises:
            ValueError: ``t`` is earlier than the current reading, or not finite.
        """
        target = _finite("t", t)
        if target < self._now:
            raise ValueError(f"a clock never goes backwards: jump_to({t!r}) at {self._now!r}")
        self._now = target
        return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)
