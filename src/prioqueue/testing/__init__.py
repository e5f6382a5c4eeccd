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
The public names above are all this package exports; the models live in private modules, each
class one layer on the one below it: ``_state`` (the records and ``_Book``, which finds things
in them), ``_rules`` (offers, keys, charges, leases, statistics), ``_lifecycle`` (deadlines,
delays, retries, budgets), ``_workers`` (join, heartbeat, leave, idle reasons) and ``_fleet``
(``ReferenceFleet``: submit, pop, complete, cancel, expire); ``_dispatcher`` puts the size-one
API over a fleet of one, and ``_clock`` holds ``ManualClock``. The models read the core's
public modules only (records, scoring, priority, lease, lifecycle, the dispatcher's types),
never its engine, and keep their own copy of the design notes' numbers: they stay an
independent implementation of the notes.
"""

from __future__ import annotations

from prioqueue.testing._clock import ManualClock
from prioqueue.testing._dispatcher import ReferenceDispatcher
from prioqueue.testing._fleet import ReferenceFleet

__all__ = ["ManualClock", "ReferenceDispatcher", "ReferenceFleet"]
