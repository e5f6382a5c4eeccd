"""An asyncio gate over a :class:`~prioqueue.fleet.FleetDispatcher`: one worker per upstream.

Theory of operation
-------------------
:class:`~prioqueue.asyncio.AsyncDispatcher` drives a size-1 dispatcher with ``dispatch(now)``;
a fleet is driven by its workers pulling jobs with ``pop(worker, now)``. :class:`FleetGate`
keeps the adapter's rules (see ``docs/design/gateway.md``, "Several upstreams") for a fleet:

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

import asyncio
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Literal

from prioqueue._async_errors import DispatcherClosed, JobCancelled, QueueTimeout, ttl_timeout
from prioqueue._errors import (
    ChargeError,
    InvalidState,
    LeaseError,
    LeaseExpired,
    UnknownJob,
    UnknownWorker,
)
from prioqueue._groups import GroupStatus
from prioqueue.fleet import FleetDispatcher
from prioqueue.records import Expired, Explanation, Grant, Job, Stats, Ticket, WorkerInfo

__all__ = ["ROUTINGS", "FleetGate", "FleetTurn", "Routing"]

Routing = Literal["warm", "round-robin", "least-busy"]
ROUTINGS: tuple[Routing, ...] = ("warm", "round-robin", "least-busy")


class FleetTurn:
    """One request's turn on some upstream: ``async with gate.turn(...) as grant``.

    ``grant.worker`` names the upstream that popped it. See :class:`FleetGate`.
    """

    __slots__ = (
        "_entered",
        "_expired",
        "_future",
        "_gate",
        "_grant",
        "_kwargs",
        "_requeued",
        "_revoked",
        "_ticket",
        "_timeout",
        "_timer",
        "attempts",
        "job_id",
    )

    def __init__(
        self, gate: FleetGate, job_id: str, kw: dict[str, Any], timeout: float | None
    ) -> None:
        self._gate = gate
        self.job_id = job_id
        self._kwargs = kw
        self._timeout = timeout
        self._ticket: Ticket | None = None
        self._future: asyncio.Future[Grant] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._grant: Grant | None = None
        self._expired: Expired | None = None
        self._revoked: asyncio.Event | None = None
        self._entered = False
        self._requeued = False
        self.attempts = 0

    @property
    def ticket(self) -> Ticket | None:
        """The submit's ticket, None before the turn was entered."""
        return self._ticket

    @property
    def grant(self) -> Grant | None:
        """The current grant (None while queued, or after its upstream was taken out)."""
        return self._grant

    @property
    def requeued(self) -> bool:
        """True when its upstream was taken out and the job is owed a new grant."""
        return self._requeued

    @property
    def expired(self) -> Expired | None:
        """The expiry record when the job's lease ran out while it held a slot."""
        return self._expired

    @property
    def revoked(self) -> asyncio.Event:
        """Set when the gate took the slot back (lease expiry, cancel)."""
        if self._revoked is None:
            self._revoked = asyncio.Event()
        return self._revoked

    async def __aenter__(self) -> Grant:
        """Submit, then wait for the grant.

        Raises:
            QueueTimeout: The job waited longer than ``timeout``; it was removed.
            DispatcherClosed: The gate was closed.
            JobCancelled: The job was cancelled (e.g. its group) before it began.
            QueueFull: The queue or the member's share of it is full.
            ValueError: A bad argument.
            RuntimeError: The turn was already entered.
        """
        if self._entered:
            raise RuntimeError(f"turn {self.job_id!r} was already entered")
        self._entered = True
        self._gate._submit(self)
        return await self._wait()

    async def regrant(self) -> Grant:
        """Wait for the next grant after this job's upstream was taken out.

        Call it only when :attr:`requeued` is true, inside the block (see
        :meth:`FleetGate.take_out`); the new grant may already be there.

        Raises:
            RuntimeError: The job is not waiting for a new grant.
            DispatcherClosed, JobCancelled, QueueTimeout: As when entering.
        """
        if not self._requeued or self._future is None:
            raise RuntimeError(f"turn {self.job_id!r} is not waiting for a new grant")
        self._requeued = False
        return await self._wait()

    async def _wait(self) -> Grant:
        future = self._future
        assert future is not None
        try:
            grant = await future
        except BaseException:
            self._gate._release(self, failed=True)
            raise
        if self._gate._waiters.get(self.job_id) is not self:
            why = "its lease expired" if self._expired else "it was cancelled"
            raise JobCancelled(f"job {self.job_id!r} lost its grant before it began: {why}")
        self.attempts += 1
        return grant

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._gate._release(self, failed=exc_type is not None)

    def __repr__(self) -> str:
        state = "granted" if self._grant else "submitted" if self._ticket else "new"
        return f"<FleetTurn {self.job_id!r} {state}>"


class FleetGate:
    """Drive a :class:`~prioqueue.fleet.FleetDispatcher` on an event loop (one worker each).

    Args:
        fleet: The fleet (its workers join through :meth:`put_back`).
        clock: Monotonic seconds for every ``now``.
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
        self._d = fleet
        self._clock = clock
        self.routing: Routing = routing
        self._hold = warm_hold
        self._waiters: dict[str, FleetTurn] = {}
        self._live: list[str] = []
        self._out: set[str] = set()
        self._extra: dict[str, int] = {}
        self._goes_on: set[str] = set()
        self._bumped: dict[str, float] = {}
        self._next = 0
        self.busy_seconds: dict[str, float] = {}
        self.grants: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: float | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False

    # -- reading -------------------------------------------------------------------------

    @property
    def dispatcher(self) -> FleetDispatcher:
        """The driven fleet (``stats``, ``explain``, ``forecast``, ``workers``)."""
        return self._d

    @property
    def closed(self) -> bool:
        """True after :meth:`aclose`."""
        return self._closed

    @property
    def live(self) -> tuple[str, ...]:
        """The upstreams in the fleet now (taken-out ones are not)."""
        return tuple(self._live)

    def now(self) -> float:
        """The clock's current time."""
        return self._clock()

    def stats(self) -> Stats:
        """``fleet.stats(now=self.now())``."""
        return self._d.stats(now=self.now())

    def explain(self, job_id: str) -> Explanation:
        """``fleet.explain(job_id, now=self.now())``.

        Raises:
            UnknownJob: The job is neither queued nor held.
        """
        return self._d.explain(job_id, now=self.now())

    def workers(self) -> list[WorkerInfo]:
        """The fleet's workers (live upstreams), by name."""
        return self._d.workers()

    def group_status(self, group: str) -> GroupStatus:
        """``fleet.group_status(group, now=self.now())``.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
        """
        return self._d.group_status(group, now=self.now())

    # -- changing ------------------------------------------------------------------------

    def turn(
        self,
        job_id: str,
        *,
        member: str,
        priority: int | str | bytes | None = 0,
        tier: str = "free",
        model: str | None = None,
        estimate: float | None = None,
        payload: Any = None,
        timeout: float | None = None,
        group: str | None = None,
        ceiling: int | None = None,
    ) -> FleetTurn:
        """Make one request's turn (see ``AsyncDispatcher.turn``; same arguments).

        Raises:
            ValueError: ``timeout`` is negative or not a number.
        """
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        kwargs: dict[str, Any] = {
            "member": member,
            "priority": priority,
            "tier": tier,
            "model": model,
            "estimate": estimate,
            "payload": payload,
        }
        if group is not None:
            kwargs["group"] = group
        if ceiling is not None:
            kwargs["ceiling"] = ceiling
        return FleetTurn(self, job_id, kwargs, timeout)

    def holding(self, name: str) -> int:
        """Jobs an upstream holds now (in flight or lingering), 0 when it is not joined. O(1)."""
        try:
            return len(self._d.worker(name).held)
        except UnknownWorker:
            return 0

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

    def set_resident(self, name: str, model: str | None) -> None:
        """Tell the fleet which model an idle upstream has loaded (warm routing only).

        Raises:
            UnknownWorker: The upstream is not in the fleet.
        """
        now = self.now()
        if self.routing == "warm":
            self._d.heartbeat(name, now=now, resident=model)
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

    def requeue(self, turn: FleetTurn) -> bool:
        """Give back the job of a turn whose request never reached its upstream.

        The job goes to the head of its lane; the turn gets a fresh future and
        ``requeued = True`` (its holder calls :meth:`FleetTurn.regrant`).

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
        self._busy(grant, now)
        turn._grant = None
        turn._requeued = True
        turn._revoked = None
        loop = self._loop
        turn._future = None if loop is None else loop.create_future()
        self._pump(now)
        return True

    def cancel_group(self, group: str, *, running: Literal["keep", "cancel"] = "keep") -> list[Job]:
        """Cancel a group's queued jobs (and its running ones when asked); fail their waiters.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: ``running`` is not ``"keep"`` or ``"cancel"``.
        """
        now = self.now()
        jobs = self._d.cancel_group(group, now=now, running=running)
        for job in jobs:
            turn = self._waiters.pop(job.id, None)
            if turn is not None:
                self._drop(turn, JobCancelled(f"job {job.id!r} was cancelled with its group"))
        self._pump(now)
        return jobs

    def tick(self) -> list[Expired]:
        """Run what is due now: lease expiry, then pulls; re-arm the timers."""
        return self._run_due(self.now())

    async def aclose(self) -> None:
        """Refuse new turns and fail every queued waiter with ``DispatcherClosed``."""
        if self._closed:
            return
        self._closed = True
        now = self.now()
        for turn in list(self._waiters.values()):
            if turn._grant is None and self._d.state(turn.job_id) == "queued":
                del self._waiters[turn.job_id]
                self._d.cancel(turn.job_id, now=now)
                self._drop(turn, DispatcherClosed("the dispatcher was closed"))
        for handle in (self._timer, self._retry):
            if handle is not None:
                handle.cancel()
        self._timer = self._retry = None
        await asyncio.sleep(0)

    # -- internals -----------------------------------------------------------------------

    def _submit(self, turn: FleetTurn) -> None:
        if self._closed:
            raise DispatcherClosed("the dispatcher was closed")
        loop = asyncio.get_running_loop()
        self._loop = loop
        now = self.now()
        turn._ticket = self._d.submit(turn.job_id, now=now, **turn._kwargs)
        turn._future = loop.create_future()
        self._waiters[turn.job_id] = turn
        if turn._timeout is not None:
            turn._timer = loop.call_later(turn._timeout, self._on_timeout, turn)
        self._pump(now)

    def _order(self) -> list[str]:
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

    def _busy_by_report(self, name: str) -> bool:
        """Whether an upstream's held jobs plus the work it reports beyond them fill it."""
        info = self._d.worker(name)
        return len(info.held) + self._extra.get(name, 0) >= info.slots

    def _pump(self, now: float) -> None:
        """Let every live upstream with a free slot pull until it gets nothing."""
        d = self._d
        if self._out:
            self._settle(now)
        refused = False
        extra = self._extra
        for name in self._order():
            while len(d):
                try:
                    if extra and self._busy_by_report(name):
                        break
                    grant = d.pop(name, now=now)
                except UnknownWorker:
                    break
                except (LeaseError, ChargeError) as exc:
                    self._drop_unleasable(exc, now)
                    continue
                if grant is None:
                    held = len(d.worker(name).held)
                    refused = refused or held < d.worker(name).slots
                    break
                self._hand(grant, now)
        self._arm(refused and len(d) > 0)

    def _hand(self, grant: Grant, now: float) -> None:
        d = self._d
        worker = grant.worker
        assert worker is not None
        if self.routing != "warm":
            d.heartbeat(worker, now=now, resident=None)  # blind routing: forget residency
        turn = self._waiters.get(grant.job.id)
        future = None if turn is None else turn._future
        if turn is None or future is None or future.done():
            if turn is not None:
                del self._waiters[turn.job_id]
            d.cancel(grant.job.id, now=now, charge=0.0)
            return
        turn._grant = grant
        self.grants[worker] = self.grants.get(worker, 0) + 1
        if turn._timer is not None:
            turn._timer.cancel()
            turn._timer = None
        future.set_result(grant)

    def _drop_unleasable(self, exc: LeaseError | ChargeError, now: float) -> None:
        self._d.cancel(exc.job_id, now=now)
        turn = self._waiters.pop(exc.job_id, None)
        if turn is not None:
            self._drop(turn, exc)

    def _arm(self, retry: bool) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        deadline = self._d.next_deadline()
        if deadline != self._timer_deadline or (deadline is not None and self._timer is None):
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._timer_deadline = deadline
            if deadline is not None:
                delay = max(0.0, deadline - self.now())
                self._timer = loop.call_later(delay, self._on_timer)
        if retry and self._hold > 0 and self._retry is None:
            self._retry = loop.call_later(min(1.0, self._hold / 4), self._on_retry)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_deadline = None
        self.tick()

    def _on_retry(self) -> None:
        self._retry = None
        self._pump(self.now())

    def _run_due(self, now: float) -> list[Expired]:
        expired = self._d.expire(now)
        for record in expired:
            job_id = record.job.id
            if record.requeued:
                self._d.cancel(job_id, now=now)  # one attempt per turn
            worker = record.worker
            if worker is not None and worker in self._goes_on:
                # Cut by its lease, it still runs there until the upstream says otherwise.
                self._extra[worker] = self._extra.get(worker, 0) + 1
                self._bumped[worker] = now
            turn = self._waiters.pop(job_id, None)
            if turn is not None and record.cause == "ttl":  # expired queued: never granted
                self._drop(turn, ttl_timeout(record))
            elif turn is not None:
                if turn._grant is not None:
                    self._busy(turn._grant, now)
                turn._expired = record
                turn.revoked.set()
        self._pump(now)
        return expired

    def _on_timeout(self, turn: FleetTurn) -> None:
        turn._timer = None
        if self._waiters.get(turn.job_id) is not turn or turn._grant is not None:
            return
        now = self.now()
        del self._waiters[turn.job_id]
        self._d.cancel(turn.job_id, now=now)
        timeout = turn._timeout if turn._timeout is not None else 0.0
        error = QueueTimeout(
            f"job {turn.job_id!r} waited more than {timeout:g} s in the queue",
            job_id=turn.job_id,
            timeout=timeout,
        )
        self._drop(turn, error)
        self._pump(now)

    def _drop(self, turn: FleetTurn, error: BaseException) -> None:
        if turn._timer is not None:
            turn._timer.cancel()
            turn._timer = None
        if turn._grant is not None:
            turn.revoked.set()
        elif turn._future is not None and not turn._future.done():
            turn._future.set_exception(error)

    def _busy(self, grant: Grant, now: float) -> None:
        if grant.worker is not None:
            held = max(0.0, now - grant.granted_at)
            self.busy_seconds[grant.worker] = self.busy_seconds.get(grant.worker, 0.0) + held

    def _release(self, turn: FleetTurn, *, failed: bool) -> None:
        if self._waiters.get(turn.job_id) is not turn:
            return
        if turn._timer is not None:
            turn._timer.cancel()
            turn._timer = None
        del self._waiters[turn.job_id]
        now = self.now()
        grant = turn._grant
        d = self._d
        if grant is not None:
            self._busy(grant, now)
        try:
            if grant is not None and not failed:
                runtime = max(0.0, now - grant.granted_at)
                try:
                    d.complete(turn.job_id, now=now, runtime=runtime, worker=grant.worker)
                except ChargeError:
                    d.complete(turn.job_id, now=now, runtime=runtime, charge=0.0)
            else:
                try:
                    d.cancel(turn.job_id, now=now)
                except ChargeError:
                    d.cancel(turn.job_id, now=now, charge=0.0)
        except LeaseExpired:
            self._waiters[turn.job_id] = turn
            self._run_due(now)
            return
        except UnknownJob:
            pass  # expired and failed: nothing is held
        except InvalidState:
            # Requeued by a take-out while its request went on and ended: it was served.
            d.cancel(turn.job_id, now=now)
        self._pump(now)
