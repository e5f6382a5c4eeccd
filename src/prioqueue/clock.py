"""Time, read in one place: the ``Clock`` protocol, the real clock and the event loop's time.

Every adapter that needs time takes a clock injected (a constructor parameter defaulting to
:data:`SYSTEM_CLOCK`, or its bound ``monotonic`` where the parameter is a zero-argument
callable) and reads time only through it, as trio reads time only through its run's
``Clock``. Tests give a manual clock (:class:`prioqueue.testing.ManualClock`: its ``sleep``
moves time instead of waiting, like trio's ``MockClock`` with autojump) or run on a loop
whose time they control.

The rules (asserted by ``tests/test_architecture.py``):

1. **No ``time.time``, ``time.monotonic``, ``time.sleep``, ``time.perf_counter`` or
   ``loop.time`` outside this module** (and ``store/clock.py``, the store's anchored clock,
   built on the same readings). The sans-IO core reads no clock at all: it takes ``now``.
2. **Code on an event loop reads the loop's time** (:func:`loop_time`) when it computes a
   deadline for the loop's own timers (``asyncio.wait_for``, ``call_at``): a test's virtual
   loop then moves both together.
3. **A blocking sleep goes through a clock** (:meth:`Clock.sleep`), so a manual clock can
   jump instead; sleeps that wait for another process or thread use :data:`SYSTEM_CLOCK`
   and say so.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

if TYPE_CHECKING:
    import asyncio

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "loop_time", "perf_counter"]


@runtime_checkable
class Clock(Protocol):
    """What an adapter needs of time: a monotonic reading, the wall clock, a blocking sleep.

    Implementations: :class:`SystemClock` (the real one) and
    :class:`prioqueue.testing.ManualClock` (time that moves when a test says so).
    """

    def monotonic(self) -> float:
        """Return seconds from an arbitrary origin; never decreases within a process."""
        ...

    def wall(self) -> float:
        """Return the wall clock in seconds since the Unix epoch (may step)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` (a manual clock moves instead)."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic``, ``time.time`` and ``time.sleep`` themselves.

    The methods are the ``time`` functions (static), so an adapter that takes
    ``SYSTEM_CLOCK.monotonic`` as its callable pays nothing over ``time.monotonic``.
    Stateless; use the shared :data:`SYSTEM_CLOCK`.
    """

    __slots__ = ()

    monotonic = staticmethod(time.monotonic)
    """Return ``time.monotonic()``. O(1)."""
    wall = staticmethod(time.time)
    """Return ``time.time()``. O(1)."""
    sleep = staticmethod(time.sleep)
    """Block the calling thread for ``seconds`` (``time.sleep``; ValueError if negative)."""

    def __repr__(self) -> str:
        return "SYSTEM_CLOCK"


SYSTEM_CLOCK: Final = SystemClock()
"""The process's real clock: the default of every adapter's ``clock`` parameter."""


def loop_time(loop: asyncio.AbstractEventLoop | None = None) -> float:
    """Return an event loop's time (``loop.time()``), for deadlines of that loop's timers.

    Args:
        loop: The loop (None: the running one). A test's virtual loop moves this time.

    Raises:
        RuntimeError: ``loop`` is None and no event loop runs in this thread.
    """
    if loop is None:
        import asyncio  # here: a process without an event loop never imports asyncio

        loop = asyncio.get_running_loop()
    return loop.time()


def perf_counter() -> float:
    """Return ``time.perf_counter()``: a host's elapsed time, for reports of wall time only."""
    return time.perf_counter()
