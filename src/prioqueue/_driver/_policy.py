"""The pull policy: what differs between a driver of one worker and of many (private).

A :class:`~prioqueue._driver.Driver` keeps the rules (one waiter per job, pull after every
change, one timer, one attempt per turn, leaving frees the resource); *which* workers pull,
how, and what to remember about each grant is a :class:`PullPolicy` the driver is composed
with. The one-worker adapter's (``prioqueue.asyncio``) pulls with ``dispatch(now)`` and
remembers the resident model; the gateway's fleet gate's (``prioqueue.gateway._fleetpull``)
lets each live upstream ``pop(worker, now)`` and keeps the upstreams' bookkeeping.

The protocol is the driver's internal contract with prioqueue's own adapters, not a type of
the public API (no public module hands it out), so it lives with the driver. A policy is
called on the event loop's thread, from inside the driver's synchronous steps: it must not
call back into the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prioqueue.records import Expired, Grant

__all__ = ["PullPolicy", "Remove"]

Remove = Callable[[str, float, "float | None"], None]
"""``remove(job_id, now, charge)``: cancel a job in the core (charge None: the charge model's;
a failing charge model is reported and the job removed with no charge)."""


class PullPolicy(Protocol):
    """How the workers of a driven core pull jobs, and what each grant leaves behind.

    Every method is O(1) unless it says otherwise; the driver calls :meth:`order` once per
    pump and :meth:`full`, :meth:`pop` (and :meth:`refused`) once per pull.
    """

    def order(self, now: float) -> Sequence[str]:
        """Return the workers that may pull now, in the order they pull (``("",)``: one).

        Called once per pump; the place to settle workers that left (O(workers)).
        """
        ...

    def full(self, worker: str) -> bool:
        """Return whether a worker must not pull although the core would give it a job."""
        ...

    def pop(self, worker: str, now: float) -> Grant | None:
        """Let a worker pull its next job from the core (None: nothing for it now).

        Raises:
            UnknownWorker: The worker left the core (the driver goes on with the next one).
            LeaseError, ChargeError: The job cannot be granted (the core is unchanged; the
                driver removes the job and fails its waiter).
        """
        ...

    def refused(self, worker: str) -> bool:
        """Return whether a worker that got nothing had a free slot (a warm hold kept a job).

        True arms the driver's re-pump timer (when the core has a hold).
        """
        ...

    def give_back(self, grant: Grant, now: float, remove: Remove) -> None:
        """Give back a grant nobody can take: remove its job with ``remove``, undo the pull."""
        ...

    def granted(self, grant: Grant) -> None:
        """A grant reached its waiter."""
        ...

    def unused(self, grant: Grant) -> None:
        """A grant was given back before its holder entered its block (already removed)."""
        ...

    def ended(self, grant: Grant, now: float) -> None:
        """A grant ended: completed, cancelled, expired, requeued or unused."""
        ...

    def on_expiry(self, record: Expired, now: float) -> None:
        """A job's lease ran out (called before its holder is told)."""
        ...
