"""The asyncio driver of the core, for one worker or many (private).

:class:`Driver` (``_driver.py``) holds the rules every asyncio front end keeps: one waiter per
job, pull after every change, one lease timer, one attempt per turn, leaving frees the
resource. :class:`~prioqueue.asyncio.AsyncDispatcher` is its one-worker case (over a
``SizeOneDispatcher``); the gateway's ``FleetGate`` its case of one worker per upstream (over
a ``FleetDispatcher``). ``_turn.py`` holds the turn both hand out, ``_core.py`` what the driver
needs of a core. See ``docs/design/driver.md``.

Theory of operation
-------------------
The core is sans-IO: it takes ``now`` and never sleeps. A :class:`Driver` owns one core
(a ``SizeOneDispatcher``, or a ``FleetDispatcher`` whose workers it pulls for), one clock and
one event loop, and keeps these rules whatever the number of workers, so that the one-worker
adapter (:class:`~prioqueue.asyncio.AsyncDispatcher`) and the gateway's fleet gate cannot
drift apart:

1. **One waiter per job.** ``turn()`` submits the job and registers a waiter
   (a :class:`~prioqueue._driver._turn.Turn` whose future only :meth:`Driver._pump`
   resolves). While a waiter is registered its job is known to the core (queued or held),
   and the other way round for every job submitted through the driver. Removing a waiter
   and removing its job happen in the same synchronous step, so a job id can be reused as
   soon as its turn is over.
2. **Pull after every change.** Submit, completion, cancel, time-out, expiry (and, with
   workers, a worker joining or coming back) all end in ``_pump()``: each worker with a free
   slot pulls (:meth:`Driver._pop`, in :meth:`Driver._order`) until it gets nothing, and each
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

Clock: every ``now`` given to the core comes from ``clock()`` (``time.monotonic`` by
default). Sleeping (the lease timer, queue timeouts) uses the event loop's timer with delays
computed from that clock. With an injected manual clock, call :meth:`Driver.tick` after
moving it.

Who calls what: the turn calls ``_submit``, ``_wait`` and ``_release``; the timers call
``_on_timer``, ``_on_retry`` and ``_on_timeout``; every path ends in ``_pump`` and ``_arm``.
What differs with the number of workers is in a few hooks (``_order``, ``_pop``, ``_full``,
``_refused``, ``_give_back``, ``_granted``, ``_ended``, ``_on_expiry``, ``_unused``) that the
one-worker adapter and the fleet gate define.

Everything here must run on the event loop's thread; a driver is not thread-safe.
"""

from __future__ import annotations

from prioqueue._driver._core import Clock, DrivenCore, ExpiryCallback
from prioqueue._driver._driver import Driver
from prioqueue._driver._turn import Turn

__all__ = ["Clock", "DrivenCore", "Driver", "ExpiryCallback", "Turn"]
