"""Helpers for testing code that uses prioqueue: a manual clock and reference dispatchers.

Theory of operation
-------------------
:class:`ManualClock` is time you control: it only moves when a test calls :meth:`~ManualClock.
advance` or :meth:`~ManualClock.jump_to`, never backwards, so tests of waits and leases take no
real time. It is a zero-argument callable returning a float, so it can stand wherever a
``clock`` callable is expected (the asyncio adapter's, for one).

:class:`ReferenceFleet` is a brute-force model of
:class:`~prioqueue.fleet.FleetDispatcher` written straight from the design note
(``docs/design/fleet.md``). It keeps plain lists and recomputes every lane's offer and key from
scratch at every pop: no heaps, no lazy deletion, no cached keys. It is slow (every pop is O(n)
in the queued jobs) and meant to be obviously right, so that random tests can drive both
dispatchers side by side and compare every decision.

:class:`ReferenceDispatcher` is the same model seen through
:class:`~prioqueue.dispatcher.SizeOneDispatcher`'s API: a ``ReferenceFleet`` of one worker
(one slot, every model, no timeout, no warm hold) that is never removed, exactly as
``SizeOneDispatcher`` is a ``FleetDispatcher`` of one (one algorithm, one reference model).
``dispatch`` is that worker's ``pop``; its grants and expiries name no worker.

Only the decisions and the statistics are modelled; ``explain``, ``forecast`` and snapshots are
not. Argument validation is minimal, but every error the tests compare (unknown ids, wrong
states, expired leases, duplicates, full queues, time going backwards) raises the same
exception type as the real dispatchers.

Layout
------
The public names above are all this package exports; the models live in private modules.
``ReferenceFleet`` (``_fleet``) composes the reference owners, each a class with its own
state, changed only through its own methods (issue 29: no tower of mixins, no reach into
another's private fields):

* ``ReferenceLanes`` (``_lanes``): the lanes and their queued jobs;
* ``ReferenceWorkers`` (``_workers``): the workers and the jobs they hold;
* ``ReferenceRules`` (``_rules``): eligibility, offers, keys, the lift and the crossing
  credit, read off the lanes and workers; ``choose`` (``_choice``, with ``_overdue``'s
  refill and overdue rules) decides a pop;
* ``ReferenceLifecycle`` (``_lifecycle``): deadlines, delays, retries, budgets, admission;
* ``ReferenceGrants`` (``_grants``): a grant, the end of a run, a take-back, across those
  owners, priced by ``ReferenceCharges`` (``_charges``: leases and charges);
* ``Runtimes`` and ``ReferenceStats`` (``_stats``): the runtimes and counters.

Their plain records (lanes, entries, held jobs, workers, offers, counters) are in
``_records``; ``_dispatcher`` puts the size-one API over a fleet of one, and ``_clock`` holds
``ManualClock``. The models read the core's public modules only (records, scoring, priority,
lease, lifecycle, the dispatcher's types), never its engine, and keep their own copy of the
design notes' numbers: they stay an independent implementation of the notes.
"""

from __future__ import annotations

from prioqueue.testing.manual_clock import ManualClock
from prioqueue.testing.reference_dispatcher import ReferenceDispatcher
from prioqueue.testing.reference_fleet import ReferenceFleet

__all__ = ["ManualClock", "ReferenceDispatcher", "ReferenceFleet"]
