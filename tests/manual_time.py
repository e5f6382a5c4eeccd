"""Time the test sets: a manual clock, ``asyncio.run`` of a scenario, and loop turns.

Shared by the tests of the asyncio adapter, the durable store and the recovery property
(a test of the loop's own timers uses ``virtual_loop`` instead).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["ManualClock", "run", "turns"]

T = TypeVar("T")


class ManualClock:
    """A manual clock: a zero-argument callable returning ``t``, moved by ``advance``."""

    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the scenario ``main()`` on a fresh event loop and return its result."""
    return asyncio.run(main())


async def turns(n: int = 10) -> None:
    """Let the loop run ``n`` turns: every task ready now reaches its next wait (no time)."""
    for _ in range(n):
        await asyncio.sleep(0)
