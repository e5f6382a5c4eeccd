"""An asyncio event loop whose time the test controls (trio's ``MockClock`` with autojump).

Time stands still while anything is ready to run; when every task waits and a timer is
pending, the loop's clock jumps straight to that timer instead of sleeping. Timeouts, lease
timers and ``asyncio.sleep`` then take no real time, and their order is exact: a test that
waits "past a timeout" waits in loop time, never on a busy machine's wall clock. Give the
driver the loop's clock (``clock=asyncio.get_running_loop().time``) so the dispatcher's
``now`` and the timers agree.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualTimeLoop", "run_virtual"]

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls without blocking; a wait with a timeout moves the loop's clock instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._virtual = loop

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        ready: list[tuple[Any, int]] = super().select(0)
        if ready:
            return ready
        if timeout is None:  # no timer pending: only real I/O can wake the loop
            return super().select(None)
        if timeout > 0:
            self._virtual.jump(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` moves only when nothing is ready to run.

    Args:
        start: The loop's time at the start (seconds).
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._virtual_now = start
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        """The loop's virtual time."""
        return self._virtual_now

    def jump(self, seconds: float) -> None:
        """Move the loop's clock forward (the selector does it when the loop is idle)."""
        self._virtual_now += seconds


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` to completion on a fresh :class:`VirtualTimeLoop` (like ``asyncio.run``)."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
