"""A discrete-event simulation of one GPU that runs one job at a time, on a virtual clock.

With ``workers=...``, :func:`simulate` runs a fleet instead
(:mod:`prioqueue.sim.fleet_engine`).

Theory of operation
-------------------
The engine replays a :class:`~prioqueue.sim.workload.Workload` through one policy (a
:class:`~prioqueue.sim.policies.SimQueue`, usually the real ``SizeOneDispatcher``). Time is
virtual: the clock jumps from one event to the next and nothing ever sleeps.

Events, in the order they are handled at one instant:

1. the running job completes (its grant time + cold load + duration);
2. the running job's lease expires (only a job that *hangs* runs past its lease), and, with
   a level's ``ttl`` (``PolicyParams.budgets``), queued jobs past their deadline leave as
   ``EXPIRED`` (``expire`` reports both; the lease deadline comes from the grant, since
   ``next_deadline()`` also holds the ttl timers);
3. callers cancel jobs (``cancel_after`` seconds after arrival, queued or running);
4. jobs arrive (a submit that a level's ``max_queued`` or ``max_wait`` refuses leaves at
   once as ``REFUSED``; all the arrivals of the instant are submitted before anything is granted,
   so a film submitted at once competes as a whole); a chained group's jobs are submitted as
   its chain releases them (:mod:`prioqueue.sim.groups`): on arrival while fewer than its
   depth are in flight, else when an earlier one leaves;
5. the GPU, when free, asks the policy for the next job.

Only the dispatcher's public API is used. The running job lives in one slot (``running``,
``run_end``, ``deadline``, ``loaded``); the fleet engine makes these per-worker state and
step 5 a pull round over the free workers. The report's measures (waits, fair shares,
service gaps) accept several jobs running at once.

The run ends when every job has left, or at the ``horizon`` when one is given: events at the
horizon itself are still handled, and whatever is queued or running then is left as it is
(``QUEUED`` or ``RUNNING``) so that the report can count it as unfinished work.

A grant whose model differs from the loaded one pays the model's cold-load time first. Only
one job runs, so the completion is a single variable; cancellations wait in a ``heapq``; the
arrivals are already sorted. Each step is O(log n) plus the policy's own cost.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from prioqueue._errors import ConfigError, QueueFull
from prioqueue.sim.groups import ChainFeed, ForecastLog
from prioqueue.sim.policies import PolicySpec, SimQueue, build_queue, reorder_counts
from prioqueue.sim.workers import WorkerSpec, fleet_of
from prioqueue.sim.workload import Workload

__all__ = [
    "CANCELLED",
    "DONE",
    "EXPIRED",
    "FAILED",
    "PENDING",
    "QUEUED",
    "REFUSED",
    "RUNNING",
    "RunResult",
    "WorkerStats",
    "simulate",
]

PENDING, QUEUED, RUNNING, DONE, CANCELLED, FAILED, EXPIRED, REFUSED = range(8)
"""Job states; ``EXPIRED`` (its ttl ran out while queued) and ``REFUSED`` (a level's queue
budget turned its submit away) happen only with ``PolicyParams.budgets``."""

_PROGRESS_EVERY = 4096


@attrs.define
class WorkerStats:
    """What one worker of a fleet did during a run.

    Attributes:
        name: The worker.
        slots: Jobs it held at once.
        speed: Its speed factor.
        models: The models it served (None: every model).
        jobs: Runs it started (attempts, hung ones included).
        swaps: Cold loads it paid.
        load_seconds: Seconds it spent loading models.
        busy_seconds: Seconds it ran something (cold loads and hung attempts included).
        lost_seconds: Seconds it held attempts that hung until their lease ran out.
    """

    name: str
    slots: int
    speed: float
    models: list[str] | None
    jobs: int = 0
    swaps: int = 0
    load_seconds: float = 0.0
    busy_seconds: float = 0.0
    lost_seconds: float = 0.0


@attrs.define
class RunResult:
    """What one policy did to one workload: per-job times and GPU totals.

    Job ``i`` is ``workload.arrivals[i]``.

    Attributes:
        spec: The policy.
        workload: The workload.
        status: Final state of each job (``DONE``, ``CANCELLED`` or ``FAILED``; with queue
            budgets also ``EXPIRED`` and ``REFUSED``; with a horizon also ``QUEUED`` or
            ``RUNNING`` for unfinished work and ``PENDING`` for a job that arrives after it).
        start: Grant time of each job's last attempt, NaN when it never ran (or only hung).
        end: Time each job left: completed, cancelled or failed (NaN while unfinished).
        load: Cold-load seconds paid by each job's last attempt.
        retries: ``(job, granted, expired, load)`` of every attempt whose lease ran out.
        swaps: Cold loads (grants whose model was not the loaded one).
        load_seconds: GPU seconds spent loading models.
        idle_seconds: GPU seconds with nothing running before the last job left.
        idle_waiting_seconds: GPU seconds with nothing running while jobs were queued.
        lost_seconds: GPU seconds held by attempts that hung until their lease ran out.
        makespan: The time the last job left.
        events: Calls into the policy (submit, dispatch, complete, cancel, expire).
        wall_seconds: Real seconds the run took.
        reorders: The dispatcher's reorders by level and cause (empty for baselines).
        horizon: The time the clock stopped when a horizon cut the run short, else None.
        submitted: When each job was submitted (its arrival, or later for a chained job;
            NaN when it never was).
        workers: One entry per worker of a fleet (empty on one GPU).
        worker_of: The index of the worker that ran each job's last attempt (-1: none;
            empty on one GPU).
        forecasts: Per group, the finish forecasts ``(now, fraction done, forecast)`` taken
            during the run (only for a dispatcher with groups).
        runs: Every attempt a fleet's worker ran: ``(worker index, job, start, end)``, in the
            order they ended (running ones at the end of the run last; empty on one GPU).
    """

    spec: PolicySpec
    workload: Workload
    status: list[int]
    start: list[float]
    end: list[float]
    load: list[float]
    retries: list[tuple[int, float, float, float]] = attrs.field(factory=list)
    swaps: int = 0
    load_seconds: float = 0.0
    idle_seconds: float = 0.0
    idle_waiting_seconds: float = 0.0
    lost_seconds: float = 0.0
    makespan: float = 0.0
    events: int = 0
    wall_seconds: float = 0.0
    reorders: dict[int, dict[str, int]] = attrs.field(factory=dict)
    horizon: float | None = None
    submitted: list[float] = attrs.field(factory=list)
    workers: list[WorkerStats] = attrs.field(factory=list)
    worker_of: list[int] = attrs.field(factory=list)
    forecasts: dict[str, list[tuple[float, float, float | None]]] = attrs.field(factory=dict)
    runs: list[tuple[int, int, float, float]] = attrs.field(factory=list)

    @property
    def clock_end(self) -> float:
        """The time the run ended: the horizon when one cut it short, else the makespan."""
        return self.makespan if self.horizon is None else self.horizon


class Feeder:
    """Submits the arrivals to a policy and records the jobs that leave (both engines).

    Args:
        workload: The workload (its arrivals, groups and chains).
        queue: The policy (a ``SimQueue`` or a ``FleetQueue``).
        status: Each job's status, set to ``QUEUED`` on submission.
        submitted: Each job's submission time, set on submission.
        end: Each job's leaving time, set by :meth:`left`.
        cancels: The engine's heap of ``(cancel time, job)``; a submission pushes onto it.
        began: ``time.perf_counter()`` when the run began (for its wall time).
        progress: The run's progress callback, told the final count in :meth:`close`.
        wakes: The fleet engine's heap of warm-hold expiries, or None (one GPU).
        hold: Warm hold seconds: when ``hold > 0``, submitting a job with a model pushes
            its submission time plus ``hold`` onto ``wakes``.

    Attributes:
        events: The calls into the policy made here (its submissions).
        finished: The jobs that have left for good.
        forecasts: The group forecast log.
        submitted: Each job's submission time (the list given).

    Complexity: every call is O(log n) plus the chain's jobs it submits.
    """

    __slots__ = (
        "_arrivals",
        "_began",
        "_cancels",
        "_chained",
        "_end",
        "_feed",
        "_grouped",
        "_hold",
        "_progress",
        "_queue",
        "_status",
        "_wakes",
        "events",
        "finished",
        "forecasts",
        "submitted",
    )

    def __init__(
        self,
        workload: Workload,
        queue: Any,
        status: list[int],
        submitted: list[float],
        end: list[float],
        cancels: list[tuple[float, int]],
        *,
        began: float,
        progress: Callable[[int], None] | None = None,
        wakes: list[float] | None = None,
        hold: float = 0.0,
    ) -> None:
        self._began = began
        self._progress = progress
        self._arrivals = workload.arrivals
        self._queue = queue
        self._status = status
        self.submitted = submitted
        self._end = end
        self._cancels = cancels
        self._wakes: list[float] = [] if wakes is None else wakes
        self._hold = hold
        self._feed = ChainFeed(workload)
        self.forecasts = ForecastLog(workload, queue, self._feed)
        self._grouped = self.forecasts.active
        self._chained = bool(workload.chains)
        self.events = 0
        self.finished = 0

    def arrive(self, j: int, t: float) -> None:
        """Job ``j`` arrived at ``t``: submit it, or what its chain lets through."""
        if self._chained and self._feed.chained(j):
            for k in self._feed.arrive(j):
                self.submit(k, t)
        else:
            self.submit(j, t)

    def arrivals_until(self, i: int, now: float) -> int:
        """Submit the arrivals from index ``i`` on that are due by ``now``; log forecasts.

        Returns:
            The index of the first arrival still to come.
        """
        arrivals = self._arrivals
        n = len(arrivals)
        while i < n and arrivals[i].arrival <= now:
            self.arrive(i, now)
            i += 1
        if self._grouped:
            self.forecasts.flush(now)
        return i

    def submit(self, j: int, t: float) -> None:
        """Submit job ``j`` to the policy at ``t``."""
        a = self._arrivals[j]
        grouped = self._grouped
        extra = {"group": a.group} if grouped and a.group is not None else {}
        try:
            self._queue.submit(
                str(j),
                member=a.member,
                priority=a.priority,
                tier=a.tier,
                model=a.model,
                estimate=a.estimate,
                now=t,
                **extra,
            )
        except QueueFull:  # a level's budget refused it (only with PolicyParams.budgets)
            self.events += 1
            self._status[j] = REFUSED
            self.submitted[j] = t
            self.left(j, t, forecast=False)
            return
        self.events += 1
        self._status[j] = QUEUED
        self.submitted[j] = t
        if a.cancel_after is not None:
            heapq.heappush(self._cancels, (t + a.cancel_after, j))
        if self._hold > 0 and a.model is not None:
            heapq.heappush(self._wakes, t + self._hold)
        if grouped and a.group is not None:
            self.forecasts.started(a.group)

    def left(self, j: int, t: float, *, forecast: bool = True) -> None:
        """Job ``j`` left for good at ``t``: count it, feed its chain, log its group.

        ``forecast=False`` (a refused job, never queued) skips the group's forecast log.
        """
        self._end[j] = t
        self.finished += 1
        group = self._arrivals[j].group
        if group is None:
            return
        if self._chained and self._feed.chained(j):
            for k in self._feed.left(j):
                self.submit(k, t)
        if self._grouped and forecast:
            self.forecasts.finished(group, t)

    def close(self, result: RunResult, *, now: float, events: int, horizon: float | None) -> None:
        """Fill in what both engines report at the end of a run: clock, counts, forecasts.

        Args:
            result: The run's result (its ``end`` times are final).
            now: The engine's clock when the loop stopped.
            events: The policy calls the engine made itself (the feeder's are added).
            horizon: The horizon when the run stopped there with work left, else None.
        """
        result.makespan = now
        if horizon is not None:
            result.horizon = horizon
            result.makespan = max((e for e in result.end if not math.isnan(e)), default=0.0)
        result.submitted = self.submitted
        result.forecasts = self.forecasts.points if self._grouped else {}
        result.events = events + self.events
        result.reorders = reorder_counts(self._queue, now)
        result.wall_seconds = time.perf_counter() - self._began
        if self._progress is not None:
            self._progress(self.finished)


def check_run_args(lease_factor: float | None, horizon: float | None, poll: float) -> None:
    """Validate the run arguments both engines take.

    Raises:
        ValueError: ``lease_factor`` is below 1, ``horizon`` or ``poll`` is negative or not
            a finite number.
    """
    if lease_factor is not None and not lease_factor >= 1:
        raise ValueError(f"lease_factor must be >= 1, got {lease_factor!r}")
    if horizon is not None and not (isinstance(horizon, (int, float)) and 0 <= horizon < math.inf):
        raise ValueError(f"horizon must be a finite number of seconds >= 0, got {horizon!r}")
    if not (isinstance(poll, (int, float)) and 0 <= poll < math.inf):
        raise ValueError(f"poll must be a finite number of seconds >= 0, got {poll!r}")


def _lease_for(workload: Workload, factor: float) -> Callable[[Any], float]:
    """Return a lease rule: ``factor`` times the job's duration plus the slowest cold load."""
    slack = max([workload.default_load, *workload.load_seconds.values()]) + 1.0
    durations = [a.duration for a in workload.arrivals]

    def lease_for(job: Any) -> float:
        return factor * durations[int(job.id)] + slack

    return lease_for


def simulate(
    workload: Workload,
    spec: PolicySpec,
    *,
    lease_factor: float | None = 3.0,
    horizon: float | None = None,
    progress: Callable[[int], None] | None = None,
    workers: Sequence[WorkerSpec] | int | None = None,
    poll: float = 0.0,
) -> RunResult:
    """Run ``workload`` through a fresh queue for ``spec`` until every job has left.

    O((n + grants) log n) plus the policy's own cost per call (see the fleet engine for
    several workers).

    Args:
        workload: The arrivals (sorted by time) and the models' cold-load times.
        spec: The policy to run.
        lease_factor: Leases last ``lease_factor * duration`` plus the slowest cold load
            (>= 1, so only a hanging job expires); None for no leases, when hanging jobs
            are treated as healthy.
        horizon: Stop the clock at this many seconds (None: run until every job has left);
            jobs still queued or running then stay unfinished.
        progress: Called now and then with the number of jobs that have left.
        workers: A fleet to run on (worker specs, or a count of identical workers) instead
            of one GPU; None uses ``workload.workers`` when the scenario names a fleet, else
            one GPU.
        poll: A fleet's idle workers ask for work every ``poll`` seconds (0: at every
            instant; see :mod:`prioqueue.sim.fleet_engine`). Ignored on one GPU.

    Returns:
        The per-job outcomes and the GPU totals (and per-worker figures for a fleet).

    Raises:
        ValueError: ``lease_factor`` is below 1, ``horizon`` or ``poll`` is negative or not
            a number.
        ConfigError: ``workers`` is empty, out of range or names a worker twice.
    """
    check_run_args(lease_factor, horizon, poll)
    if workers is None and workload.workers is not None:
        workers = workload.workers
    if workers is not None:
        fleet = fleet_of(workers) if isinstance(workers, int) else tuple(workers)
        names = [w.name for w in fleet]
        if not fleet or len(set(names)) != len(names):
            raise ConfigError(f"workers must be non-empty with unique names, got {names}")
        from prioqueue.sim.fleet_engine import simulate_fleet

        return simulate_fleet(
            workload,
            spec,
            fleet,
            lease_factor=lease_factor,
            horizon=horizon,
            progress=progress,
            poll=float(poll),
        )
    stop = math.inf if horizon is None else float(horizon)
    cut = False
    began = time.perf_counter()
    arrivals = workload.arrivals
    n = len(arrivals)
    queue: SimQueue = build_queue(
        spec, None if lease_factor is None else _lease_for(workload, lease_factor)
    )
    leases = lease_factor is not None
    nan = math.nan
    inf = math.inf
    status = [PENDING] * n
    start = [nan] * n
    end = [nan] * n
    load = [0.0] * n
    result = RunResult(spec, workload, status, start, end, load)
    retries = result.retries
    load_of: dict[str | None, float] = {None: 0.0}

    cancels: list[tuple[float, int]] = []
    i = 0
    running = -1
    started = 0.0
    run_end = inf
    deadline = inf
    timer = inf  # the dispatcher's next ttl lapse, when a level has a ttl
    lapses = not spec.is_baseline and any(b.ttl is not None for b in spec.params.budgets.values())
    loaded: str | None = None
    idle_from = 0.0
    idle = 0.0
    idle_waiting = 0.0
    waiting_from = -1.0
    swaps = 0
    load_total = 0.0
    lost = 0.0
    events = 0
    now = 0.0
    loops = 0
    dispatch = queue.dispatch
    complete = queue.complete
    submitted = [nan] * n
    feeder = Feeder(
        workload, queue, status, submitted, end, cancels, began=began, progress=progress
    )
    left = feeder.left

    while True:
        t = arrivals[i].arrival if i < n else inf
        t = min(t, run_end)
        t = min(t, deadline)
        t = min(t, timer)
        if cancels and cancels[0][0] < t:
            t = cancels[0][0]
        if t == inf:
            break
        if t > stop:
            cut = True
            break
        if waiting_from >= 0:
            idle_waiting += t - waiting_from
            waiting_from = -1.0
        now = t

        if run_end <= now:  # 1. completion
            complete(str(running), now=now, runtime=now - started)
            events += 1
            status[running] = DONE
            left(running, now)
            running = -1
            run_end = deadline = inf
            idle_from = now
        if deadline <= now or timer <= now:  # 2. a hanging job's lease ran out; ttl lapses
            for expired in queue.expire(now):
                events += 1
                j = int(expired.job.id)
                if getattr(expired, "cause", "lease") == "ttl":  # queued past its deadline
                    status[j] = EXPIRED
                    left(j, now)
                    continue
                retries.append((j, start[j], now, load[j]))
                lost += now - start[j]
                start[j] = nan
                if expired.requeued:
                    status[j] = QUEUED
                else:
                    status[j] = FAILED
                    left(j, now)
                running = -1
                run_end = deadline = inf
                idle_from = now
        while cancels and cancels[0][0] <= now:  # 3. cancellations
            j = heapq.heappop(cancels)[1]
            if status[j] == QUEUED or status[j] == RUNNING:
                queue.cancel(str(j), now=now)
                events += 1
                if j == running:
                    running = -1
                    run_end = deadline = inf
                    idle_from = now
                status[j] = CANCELLED
                left(j, now)
        i = feeder.arrivals_until(i, now)  # 4. arrivals
        if running < 0 and len(queue):  # 5. dispatch
            grant = dispatch(now)
            events += 1
            if grant is None:
                waiting_from = now
            else:
                j = int(grant.job.id)
                a = arrivals[j]
                idle += now - idle_from
                model = a.model
                cold = 0.0
                if model is not None and model != loaded:
                    cold = load_of.get(model, -1.0)
                    if cold < 0:
                        cold = load_of[model] = workload.load_time(model)
                    loaded = model
                    swaps += 1
                    load_total += cold
                running = j
                started = now
                status[j] = RUNNING
                start[j] = now
                load[j] = cold
                if leases and grant.attempt <= a.hangs:
                    run_end = inf
                    # The grant's own lease (next_deadline also holds ttl timers).
                    lease = getattr(grant, "lease", None)
                    next_deadline = queue.next_deadline() if lease is None else lease.deadline
                    deadline = inf if next_deadline is None else next_deadline
                else:
                    run_end = now + cold + a.duration
                    deadline = inf
        if lapses:  # the next ttl lapse (or lease deadline: both are handled at step 2)
            next_timer = queue.next_deadline()
            timer = inf if next_timer is None else next_timer
        loops += 1
        if progress is not None and not loops % _PROGRESS_EVERY:
            progress(feeder.finished)

    result.swaps = swaps
    result.load_seconds = load_total
    result.idle_seconds = idle
    result.idle_waiting_seconds = idle_waiting
    result.lost_seconds = lost
    feeder.close(result, now=now, events=events, horizon=stop if cut else None)
    return result
