"""``Changes``: the broadcast that wakes long polls when the broker's state or role changes.

The engine fires it after every applied operation (``on_change``), the broker when it stops
leading, and ``drain()`` for good when it stops (SIGTERM). The waiters
(:mod:`prioqueue.broker._waiters`) take a token, read, and sleep on the token. Private.
"""

from __future__ import annotations

import asyncio

__all__ = ["Changes"]


class Changes:
    """A broadcast of "the broker's state or role changed", for waiting requests.

    ``token()`` returns the future the next :meth:`fire` resolves; each waiter awaits it
    with its own timeout. All methods are O(1) and run on the broker's event loop.
    """

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        self.draining = False
        """True once the broker is stopping: waiters answer at once."""
        self.fired = 0
        """How many times :meth:`fire` ran (diagnostics, tests)."""
        self.waiting: dict[str, int] = {}
        """Workers in a long poll now (name -> open pops)."""
        self.refreshing: asyncio.Future[None] | None = None
        """The liveness refresh in flight, if any (one at a time for the whole fleet)."""

    def token(self) -> asyncio.Future[None]:
        """The future the next change resolves (take it before reading the state)."""
        future = self._future
        if future is None:
            future = self._future = asyncio.get_running_loop().create_future()
        return future

    def fire(self) -> None:
        """Wake every waiter (a change happened)."""
        self.fired += 1
        future, self._future = self._future, None
        if future is not None and not future.done():
            future.set_result(None)

    def drain(self) -> None:
        """The broker is stopping: wake every waiter and let none wait again."""
        self.draining = True
        self.fire()
