"""The asyncio driver of the core, for one worker or many (private).

:class:`Driver` (``_driver.py``) holds the rules every asyncio front end keeps: one waiter per
job, pull after every change, one lease timer, one attempt per turn, leaving frees the
resource. :class:`~prioqueue.asyncio.AsyncDispatcher` is its one-worker case (over a
``SizeOneDispatcher``); the gateway's ``FleetGate`` its case of one worker per upstream (over
a ``FleetDispatcher``). ``prioqueue.turn`` holds the read-only turn both hand out, ``_policy.py``
the pull policy a driver is composed with, ``_alarm.py`` its loop and timers, ``_reader.py``
its reads of the core, ``_core.py`` what the driver needs of a core. See
``docs/design/driver.md``.

Theory of operation
-------------------
The core is sans-IO: it takes ``now`` and never sleeps. A :class:`Driver` owns one core
(a ``SizeOneDispatcher``, or a ``FleetDispatcher`` whose workers it pulls for), one clock and
one event loop, and keeps these rules whatever the number of workers, so that the one-worker
adapter (:class:`~prioqueue.asyncio.AsyncDispatcher`) and the gateway's fleet gate cannot
drift apart:

1. **One waiter per job.** ``turn()`` submits the job and registers a waiter (the
   driver's own record, whose future only the driver's pump resolves; the caller holds a
   read-only :class:`~prioqueue.turn.Turn` over it). While a waiter is
   registered its job is known to the core (queued or held),
   and the other way round for every job submitted through the driver. Removing a waiter
   and removing its job happen in the same synchronous step, so a job id can be reused as
   soon as its turn is over.
2. **Pull after every change.** Submit, completion, cancel, time-out, expiry (and, with
   workers, a worker joining or coming back) all end in ``_pump()``: each worker with a free
   slot pulls (the policy's ``pop``, in its ``order``) until it gets nothing, and each
   grant goes to its waiter. A grant that nobody can take (its waiter was cancelled in the
   same instant, or the job was submitted behind the driver's back) is given back at once,
   so the resource never leaks. A job whose ``lease_for`` raises, or whose charge model gives
   no valid expected charge, is removed and its waiter fails with that error.
3. **One timer.** A single ``loop.call_later`` handle is armed at the core's
   ``next_deadline()`` and re-armed only when the deadline changes (a fired timer forgets its
   deadline, so the same deadline is armed again when the clock was not quite there yet).
   With a warm hold (``hold > 0``) one re-pump timer a quarter of the hold later (at most
   1 s) lets a held job reach a cold worker. Nothing polls.
4. **A turn is one attempt.** When a lease expires the holder loses the resource: the job is
   removed (the core would requeue it, but its holder is still inside its ``async with``
   block), ``Turn.revoked`` is set, ``Turn.expired`` recorded and every ``on_expired``
   callback called.
5. **Leaving frees the resource.** A block that exits normally completes the job with the
   time it held the resource; one that raises cancels it (its lane charged for the time it
   ran; a chain's turn *fails* it). A charge model that fails at that moment is reported to
   the loop's exception handler and the job is finished with a zero charge.

Clock: every ``now`` given to the core comes from ``clock()`` (``SYSTEM_CLOCK.monotonic`` of
:mod:`prioqueue.clock` by default). Sleeping (the lease timer, queue timeouts) uses the event
loop's timer with delays computed from that clock. With an injected manual clock, call
:meth:`Driver.tick` after moving it.

Who owns what: the driver owns its waiter records (``_Waiter``, created and changed in
``_driver.py`` only); a turn reads its record and asks it to submit, wait and leave. The
alarm (``_alarm.py``) owns the loop and the timers. What differs with the number of workers
is one :class:`PullPolicy` (``order``, ``full``, ``pop``, ``refused``, ``give_back``,
``granted``, ``unused``, ``ended``, ``on_expiry``) the driver is composed with: the
one-worker adapter's, and the fleet gate's (``prioqueue.gateway._fleetpull``). Nothing
outside this package assigns to a driver's or a turn's fields or reaches their private ones.

Everything here must run on the event loop's thread; a driver is not thread-safe.
"""

from __future__ import annotations

from prioqueue._driver._core import Clock, DrivenCore, ExpiryCallback
from prioqueue._driver._driver import Driver
from prioqueue._driver._policy import PullPolicy, Remove

__all__ = ["Clock", "DrivenCore", "Driver", "ExpiryCallback", "PullPolicy", "Remove"]
