"""An asyncio gate over a :class:`~prioqueue.fleet.FleetDispatcher`: one worker per upstream.

Theory of operation
-------------------
:class:`FleetGate` is the N-worker case of the one asyncio driver
(``prioqueue._driver.Driver``, whose one-worker case is
:class:`~prioqueue.asyncio.AsyncDispatcher`): its workers pull jobs with
``pop(worker, now)``. The driver keeps the rules (see ``docs/design/driver.md``); this module
adds what upstreams need (see ``docs/design/gateway.md``, "Several upstreams"):

1. **One waiter per job.** ``turn()`` submits the job and registers a waiter (the driver's
   record, read through a :class:`FleetTurn`) whose future only the driver's pump
   resolves. While a waiter is registered its job is queued or held in the fleet, and the
   other way round.
2. **Every free worker pulls after every change.** Submit, completion, cancel, time-out,
   expiry, a worker joining or coming back all end in the driver's pump: each live upstream with a
   free slot pops, in rotating order, until it gets nothing. A grant nobody can take is
   cancelled at once.
3. **Timers.** One timer at the fleet's ``next_deadline()`` (lease expiry), and while some
   free upstream was refused a queued job (a warm hold, see ``warm_hold``), one re-pump
   timer a quarter of the hold later (at most 1 s), so a held job reaches a cold upstream
   at most that long after its hold ends.
4. **A job counts on its upstream until its request really ends.** :meth:`FleetGate.take_out`
   stops an upstream from pulling, but the jobs it holds stay held (their requests are in
   flight there, or linger: see ``_idle.py``) and keep counting against its slots, out of
   the fleet and after :meth:`FleetGate.put_back`, until each ends; the worker leaves the
   fleet once it holds nothing. A request that could not reach its upstream is given back
   with :meth:`FleetGate.requeue` (the head of its lane) and its holder waits on
   :meth:`FleetTurn.regrant` for a grant on a live upstream.
5. **Leaving frees the slot.** A block that exits normally completes the job with the time it
   held the slot; one that raises cancels it (its lane charged for the time it ran). A lease
   expiry removes the job (one attempt per turn) and sets :attr:`FleetTurn.revoked`.
6. **Its own report counts too.** :meth:`FleetGate.set_reported` records work an upstream
   reports beyond the gateway's own requests there (a job the gateway no longer knows of):
   it pulls only while its held jobs plus that work leave a slot free.

``routing`` chooses how blind the gate is, for comparisons: ``"warm"`` (the fleet sees each
upstream's resident model, affinity and warm hold apply), ``"round-robin"`` and
``"least-busy"`` (the fleet never sees a resident model; free upstreams pull in rotating
order, or the least-used first).

The gate is the driver composed with a :class:`~prioqueue.gateway._fleetpull.FleetPull`
(the pull policy: order, slots, rotation, busy seconds), which owns the upstreams'
bookkeeping; the gate's methods below change the fleet and tell the policy.

Costs: a turn costs one submit, one pop per free upstream per change, and one complete.
Everything runs on the event loop's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prioqueue._driver import Driver
from prioqueue.clock import SYSTEM_CLOCK
from prioqueue.errors import UnknownWorker
from prioqueue.fleet import FleetDispatcher
from prioqueue.gateway._fleetpull import ROUTINGS, FleetPull, Routing
from prioqueue.records import Grant, WorkerInfo
from prioqueue.turn import Turn

__all__ = ["ROUTINGS", "FleetGate", "FleetTurn", "Routing"]

FleetTurn = Turn
"""One request's turn on some upstream (the driver's turn; ``grant.worker`` names it)."""


class FleetGate(Driver[FleetDispatcher]):
    """Drive a :class:`~prioqueue.fleet.FleetDispatcher` on an event loop (one worker each).

    Args:
        fleet: The fleet (its workers join through :meth:`put_back`).
        clock: Monotonic seconds for every ``now`` (inject a manual clock in tests and call
            :meth:`tick` after moving it).
        routing: ``"warm"``, ``"round-robin"`` or ``"least-busy"`` (see the module notes).
        warm_hold: The fleet's ``warm_hold`` (seconds), for the re-pump timer.

    Raises:
        ValueError: ``routing`` is unknown or ``warm_hold`` is negative.
    """

    def __init__(
        self,
        fleet: FleetDispatcher,
        *,
        clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,
        routing: Routing = "warm",
        warm_hold: float = 0.0,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        if not warm_hold >= 0:
            raise ValueError(f"warm_hold must be >= 0 seconds, got {warm_hold!r}")
        self._pull = FleetPull(fleet, routing)
        super().__init__(fleet, self._pull, clock=clock, hold=warm_hold)

    # -- reading -------------------------------------------------------------------------

    @property
    def routing(self) -> Routing:
        """How the gate routes: ``"warm"``, ``"round-robin"`` or ``"least-busy"``."""
        return self._pull.routing

    @property
    def live(self) -> tuple[str, ...]:
        """The upstreams in the fleet now (taken-out ones are not)."""
        return self._pull.live

    @property
    def busy_seconds(self) -> Mapping[str, float]:
        """Seconds each upstream held the gate's jobs, summed over ended grants."""
        return self._pull.busy_seconds

    @property
    def grants(self) -> Mapping[str, int]:
        """Grants each upstream took."""
        return self._pull.grants

    def workers(self) -> list[WorkerInfo]:
        """The fleet's workers (live upstreams), by name."""
        return self._d.workers()

    def holding(self, worker: str = "") -> int:
        """Jobs an upstream holds now (in flight or lingering), 0 when it is not joined. O(1)."""
        try:
            return len(self._d.worker(worker).held)
        except UnknownWorker:
            return 0

    def held(self) -> list[Grant]:
        """The grants the fleet's workers hold now. O(held)."""
        return self._d.held

    def holder(self, job_id: str) -> str | None:
        """The upstream holding a job, or None (queued or unknown). O(1)."""
        return self._d.holder(job_id) if job_id in self._d else None

    # -- changing ------------------------------------------------------------------------

    def set_reported(self, name: str, extra: int, *, since: float | None = None) -> None:
        """Record the work an upstream reports beyond the gateway's own jobs there.

        Args:
            name: The upstream.
            extra: Jobs it runs that the gateway does not hold (>= 0); they count against
                its slots until the next report.
            since: When the report was asked for (the gate's clock); a report asked before
                a lease cut a job there cannot lower the count (it may not know of it).
        """
        if self._pull.reported(name, extra, since):
            self._pump(self.now())

    def put_back(
        self,
        name: str,
        *,
        models: Iterable[str] | None,
        slots: int,
        slow: bool,
        resident: str | None,
        aborts: bool = True,
    ) -> None:
        """Add an upstream to the fleet (or update a live one), then let it pull.

        Args:
            name: The upstream's name.
            models: The models it serves (None: every model).
            slots: Requests it may run at once.
            slow: Whether its leases are three times as long.
            resident: The model it has loaded (ignored unless routing is ``"warm"``).
            aborts: Whether it stops a request when its connection closes. When not, a job
                whose lease runs out keeps counting against its slots until its next
                report (:meth:`set_reported`) says what it still runs.

        Raises:
            ValueError: A bad argument (see ``FleetDispatcher.join``).
        """
        now = self.now()
        warm = resident if self.routing == "warm" else None
        # A worker taken out while holding jobs is still joined: join updates it and its
        # held jobs keep counting against its slots.
        self._d.join(name, models=models, slots=slots, slow=slow, resident=warm, now=now)
        if warm is None and self.routing == "warm" and self._pull.known(name):
            self._d.heartbeat(name, now=now, resident=None)
        self._pull.joined(name, aborts=aborts)
        self._pump(now)

    def set_resident(self, worker: str, model: str | None) -> None:
        """Tell the fleet which model an idle upstream has loaded (warm routing only).

        Raises:
            UnknownWorker: The upstream is not in the fleet.
        """
        now = self.now()
        if self.routing == "warm":
            self._d.heartbeat(worker, now=now, resident=model)
            self._pump(now)

    def take_out(self, name: str) -> list[str]:
        """Stop an upstream from pulling jobs; the jobs it holds stay counted on it.

        Their requests are in flight there (or linger): each keeps its slot until it ends,
        and the worker leaves the fleet once it holds nothing. A holder whose request could
        not reach the upstream gives its job back with :meth:`requeue`. Taking out an
        upstream that is not in the fleet does nothing.

        Returns:
            The ids of the jobs still held on it.
        """
        if name not in self._pull.live:
            return []
        now = self.now()
        held = list(self._d.worker(name).held)
        self._pull.taken_out(name, holding=bool(held))
        if held:
            if self.routing == "warm":
                self._d.heartbeat(name, now=now, resident=None)  # attracts no warm hold
        else:
            self._d.leave(name, now=now)
        self._pump(now)
        return held

    def requeue(self, turn: Turn) -> bool:
        """Give back the job of a turn whose request never reached its upstream.

        The job goes to the head of its lane; the turn gets a fresh future and
        ``requeued = True`` (its holder calls :meth:`Turn.regrant`).

        Returns:
            False when the turn holds no grant any more (its lease ran out): nothing changed.
        """
        return self._requeue(turn, lambda job_id, now: self._d.requeue(job_id, now=now))
