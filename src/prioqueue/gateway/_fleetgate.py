"""An asyncio gate over a :class:`~prioqueue.fleet.FleetDispatcher`: one worker per upstream.

Theory of operation
-------------------
:class:`FleetGate` is the N-worker case of the one asyncio driver
(``prioqueue._driver.Driver``, whose one-worker case is
:class:`~prioqueue.asyncio.AsyncDispatcher`): its workers pull jobs with
``pop(worker, now)``. The driver keeps the rules (see ``docs/design/driver.md``); this module
adds what upstreams need (see ``docs/design/gateway.md``, "Several upstreams"):

1. **One waiter per job.** ``turn()`` submits the job and registers a :class:`FleetTurn`
   whose future only :meth:`FleetGate._pump` resolves. While a waiter is registered its job is
   queued or held in the fleet, and the other way round.
2. **Every free worker pulls after every change.** Submit, completion, cancel, time-out,
   expiry, a worker joining or coming back all end in ``_pump()``: each live upstream with a
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

Costs: a turn costs one submit, one pop per free upstream per change, and one complete.
Everything runs on the event loop's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Literal

from prioqueue._driver import Driver, Turn
from prioqueue._errors import InvalidState, UnknownJob, UnknownWorker
from prioqueue.fleet import FleetDispatcher
from prioqueue.records import Expired, Grant, WorkerInfo

__all__ = ["ROUTINGS", "FleetGate", "FleetTurn", "Routing"]

Routing = Literal["warm", "round-robin", "least-busy"]
ROUTINGS: tuple[Routing, ...] = ("warm", "round-robin", "least-busy")

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
        clock: Callable[[], float] = time.monotonic,
        routing: Routing = "warm",
        warm_hold: float = 0.0,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        if not warm_hold >= 0:
            raise ValueError(f"warm_hold must be >= 0 seconds, got {warm_hold!r}")
        super().__init__(fleet, clock=clock, hold=warm_hold)
        self.routing: Routing = routing
        self._live: list[str] = []
        self._out: set[str] = set()
        self._extra: dict[str, int] = {}
        self._goes_on: set[str] = set()
        self._bumped: dict[str, float] = {}
        self._next = 0
        self.busy_seconds: dict[str, float] = {}
        self.grants: dict[str, int] = {}

    # -- reading -------------------------------------------------------------------------

    @property
    def live(self) -> tuple[str, ...]:
        """The upstreams in the fleet now (taken-out ones are not)."""
        return tuple(self._live)

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
        before = self._extra.get(name, 0)
        bumped = self._bumped.get(name)
        if bumped is not None:
            if since is not None and since < bumped:
                extra = max(extra, before)
            else:
                del self._bumped[name]
        if extra > 0:
            self._extra[name] = extra
        else:
            self._extra.pop(name, None)
        if extra < before:
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
        if warm is None and self.routing == "warm" and (name in self._live or name in self._out):
            self._d.heartbeat(name, now=now, resident=None)
        self._out.discard(name)
        if aborts:
            self._goes_on.discard(name)
        else:
            self._goes_on.add(name)
        if name not in self._live:
            self._live.append(name)
            self._live.sort()
            self.busy_seconds.setdefault(name, 0.0)
            self.grants.setdefault(name, 0)
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
        if name not in self._live:
            return []
        now = self.now()
        self._live.remove(name)
        held = list(self._d.worker(name).held)
        if held:
            self._out.add(name)
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
        grant = turn._grant
        if self._waiters.get(turn.job_id) is not turn or grant is None:
            return False
        now = self.now()
        try:
            self._d.requeue(turn.job_id, now=now)
        except (UnknownJob, InvalidState):
            return False
        self._ended(grant, now)
        turn._grant = None
        turn._requeued = True
        turn._revoked = None
        loop = self._loop
        turn._future = None if loop is None else loop.create_future()
        self._pump(now)
        return True

    # -- the N-worker hooks of the driver ------------------------------------------------

    def _order(self, now: float) -> list[str]:
        if self._out:
            self._settle(now)
        live = self._live
        if not live:
            return []
        if self.routing == "least-busy":
            return sorted(live, key=lambda name: (self.busy_seconds.get(name, 0.0), name))
        start = self._next % len(live)
        self._next += 1
        return live[start:] + live[:start]

    def _settle(self, now: float) -> None:
        """Let taken-out workers that hold nothing any more leave the fleet."""
        for name in sorted(self._out):
            try:
                empty = not self._d.worker(name).held
            except UnknownWorker:
                self._out.discard(name)
                continue
            if empty:
                self._out.discard(name)
                self._d.leave(name, now=now)

    def _full(self, worker: str) -> bool:
        """Whether an upstream's held jobs plus the work it reports beyond them fill it."""
        if not self._extra:
            return False
        info = self._d.worker(worker)
        return len(info.held) + self._extra.get(worker, 0) >= info.slots

    def _pop(self, worker: str, now: float) -> Grant | None:
        grant = self._d.pop(worker, now=now)
        if grant is not None and self.routing != "warm":
            self._d.heartbeat(worker, now=now, resident=None)  # blind routing: forget residency
        return grant

    def _refused(self, worker: str) -> bool:
        info = self._d.worker(worker)
        return len(info.held) < info.slots

    def _granted(self, turn: Turn, grant: Grant) -> None:
        worker = grant.worker
        assert worker is not None
        self.grants[worker] = self.grants.get(worker, 0) + 1

    def _ended(self, grant: Grant, now: float) -> None:
        if grant.worker is not None:
            held = max(0.0, now - grant.granted_at)
            self.busy_seconds[grant.worker] = self.busy_seconds.get(grant.worker, 0.0) + held

    def _on_expiry(self, record: Expired, now: float) -> None:
        worker = record.worker
        if worker is not None and worker in self._goes_on:
            # Cut by its lease, it still runs there until the upstream says otherwise.
            self._extra[worker] = self._extra.get(worker, 0) + 1
            self._bumped[worker] = now
