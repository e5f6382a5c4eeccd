"""Cancelling an event loop's timer that may not be armed (private).

The adapters that keep an optional ``asyncio.TimerHandle`` (the driver's lease and re-pump
timers, a turn's queue time-out, an asyncio chain's top-up, the hardened HTTP protocol's
header deadline) cancel one the same way: ``disarm(self._timer)``, then forget it
(``self._timer = None``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

__all__: list[str] = []  # private module


def disarm(timer: asyncio.TimerHandle | None) -> None:
    """Cancel ``timer``, unless it is None (no timer armed). O(1)."""
    if timer is not None:
        timer.cancel()
