"""The driver's side of the event loop (private): its timers (rule 3) and what it tells others.

:class:`Alarm` owns the loop a driver is bound to, the one lease timer (armed at the core's
``next_deadline()``, re-armed only when that deadline changes, forgetting its deadline when
it fires), the warm-hold re-pump timer, the ``on_expired`` callbacks and the reports to the
loop's exception handler. The driver tells it the deadline after every change; the alarm
calls the driver back when a timer fires. See ``prioqueue._driver``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from prioqueue._driver._core import Clock, ExpiryCallback
from prioqueue._timers import disarm

if TYPE_CHECKING:
    from prioqueue.records import Expired

__all__ = ["Alarm"]


class Alarm:
    """One event loop, one lease timer, one re-pump timer.

    Args:
        clock: The driver's clock (delays are computed from it).
        hold: The core's warm hold in seconds (0: no re-pump timer ever).
        on_due: Called when the lease timer fires (the driver's ``tick``).
        on_retry: Called when the re-pump timer fires (the driver's pump).
        on_expired: The first expiry callback, or None.
        source: The driver, named in its reports (``"dispatcher"`` in the context).
    """

    __slots__ = (
        "_callbacks",
        "_clock",
        "_deadline",
        "_hold",
        "_lease",
        "_loop",
        "_on_due",
        "_on_retry",
        "_retry",
        "_source",
    )

    def __init__(
        self,
        clock: Clock,
        hold: float,
        on_due: Callable[[], object],
        on_retry: Callable[[], object],
        on_expired: ExpiryCallback | None,
        source: object,
    ) -> None:
        self._callbacks: list[ExpiryCallback] = [] if on_expired is None else [on_expired]
        self._source = source
        self._clock = clock
        self._hold = hold
        self._on_due = on_due
        self._on_retry = on_retry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lease: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        self._retry: asyncio.TimerHandle | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the driver is bound to (None before its first use)."""
        return self._loop

    @property
    def live(self) -> bool:
        """True while the bound loop is open."""
        return self._loop is not None and not self._loop.is_closed()

    @property
    def armed(self) -> bool:
        """True while the lease timer is armed."""
        return self._lease is not None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to a (new) loop; the old loop's timers are forgotten."""
        self._loop = loop
        self._lease = self._retry = None
        self._deadline = None

    def arm(self, deadline: float | None, retry: bool) -> None:
        """Keep exactly one lease timer, at ``deadline`` (none when None); maybe a re-pump.

        Args:
            deadline: The core's ``next_deadline()``.
            retry: A free worker was refused a queued job (a warm hold): re-pump a quarter
                of the hold later (at most 1 s), unless a re-pump is already armed.
        """
        loop = self._loop
        if deadline != self._deadline or (deadline is not None and self._lease is None):
            disarm(self._lease)
            self._lease = None
            self._deadline = deadline
            if deadline is not None and loop is not None and not loop.is_closed():
                delay = max(0.0, deadline - self._clock())
                self._lease = loop.call_later(delay, self._fire_due)
        if retry and self._hold > 0 and self._retry is None and self.live:
            assert loop is not None
            self._retry = loop.call_later(min(1.0, self._hold / 4), self._fire_retry)

    def cancel_retry(self) -> None:
        """Cancel the re-pump timer (the driver closed)."""
        disarm(self._retry)
        self._retry = None

    def _fire_due(self) -> None:
        self._lease = None
        self._deadline = None
        self._on_due()

    def _fire_retry(self) -> None:
        self._retry = None
        self._on_retry()

    def listen(self, callback: ExpiryCallback) -> Callable[[], None]:
        """Add an expiry callback; return the function that removes it."""
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    def notify(self, record: Expired) -> None:
        """Call every expiry callback; one that raises is reported, the others still run."""
        for callback in list(self._callbacks):
            try:
                callback(record)
            except Exception as exc:  # a callback's bug must not stop the driver
                self.report(exc, "an on_expired callback raised")

    def report(self, exc: BaseException, message: str) -> None:
        """Report an error to the bound loop's exception handler (none bound: dropped)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_exception_handler(
                {"message": message, "exception": exc, "dispatcher": self._source}
            )
