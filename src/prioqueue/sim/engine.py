"""A discrete-event simulation of one GPU that runs one job at a time, on a virtual clock.

Theory of operation
-------------------
The engine replays a :class:`~prioqueue.sim.workload.Workload` through one policy (a
:class:`~prioqueue.sim.policies.SimQueue`, usually the real ``SizeOneDispatcher``). Time is
virtual: the clock jumps from one event to the next and nothing ever sleeps.

Events, in the order they are handled at one instant:

1. the running job completes (its grant time + cold load + duration);
2. the running job's lease expires (only a job that *hangs* runs past its lease);
3. callers cancel jobs (``cancel_after`` seconds after arrival, queued or running);
4. jobs arrive (all the arrivals of the instant are submitted before anything is granted,
   so a film submitted at once competes as a whole);
5. the GPU, when free, asks the policy for the next job.

Only the dispatcher's public API is used. The running job lives in one slot (``running``,
``run_end``, ``deadline``, ``loaded``); a fleet of several workers makes these per-worker
arrays and step 5 a loop over the free workers. The report's measures (waits, fair shares,
service gaps) already accept several jobs running at once.

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
from collections.abc import Callable
from typing import Any

import attrs

from prioqueue.sim.policies import PolicySpec, SimQueue, build_queue, reorder_counts
from prioqueue.sim.workload import Workload

__all__ = [
    "CANCELLED",
    "DONE",
    "FAILED",
    "PENDING",
    "QUEUED",
    "RUNNING",
    "RunResult",
    "simulate",
]

PENDING, QUEUED, RUNNING, DONE, CANCELLED, FAILED = range(6)

_PROGRESS_EVERY = 4096


@attrs.define
class RunResult:
    """What one policy did to one workload: per-job times and GPU totals.

    Job ``i`` is ``workload.arrivals[i]``.

    Attributes:
        spec: The policy.
        workload: The workload.
        status: Final state of each job (``DONE``, ``CANCELLED`` or ``FAILED``; with a
            horizon also ``QUEUED`` or ``RUNNING`` for unfinished work and ``PENDING`` for a
            job that arrives after it).
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

    @property
    def clock_end(self) -> float:
        """The time the run ended: the horizon when one cut it short, else the makespan."""
        return self.makespan if self.horizon is None else self.horizon


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
) -> RunResult:
    """Run ``workload`` through a fresh queue for ``spec`` until every job has left.

    O((n + grants) log n) plus the policy's own cost per call.

    Args:
        workload: The arrivals (sorted by time) and the models' cold-load times.
        spec: The policy to run.
        lease_factor: Leases last ``lease_factor * duration`` plus the slowest cold load
            (>= 1, so only a hanging job expires); None for no leases, when hanging jobs
            are treated as healthy.
        horizon: Stop the clock at this many seconds (None: run until every job has left);
            jobs still queued or running then stay unfinished.
        progress: Called now and then with the number of jobs that have left.

    Returns:
        The per-job outcomes and the GPU totals.

    Raises:
        ValueError: ``lease_factor`` is below 1, or ``horizon`` is negative or not a number.
    """
    if lease_factor is not None and not lease_factor >= 1:
        raise ValueError(f"lease_factor must be >= 1, got {lease_factor!r}")
    if horizon is not None and not (isinstance(horizon, (int, float)) and 0 <= horizon < math.inf):
        raise ValueError(f"horizon must be a finite number of seconds >= 0, got {horizon!r}")
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
    loaded: str | None = None
    idle_from = 0.0
    idle = 0.0
    idle_waiting = 0.0
    waiting_from = -1.0
    swaps = 0
    load_total = 0.0
    lost = 0.0
    events = 0
    finished = 0
    now = 0.0
    loops = 0
    submit = queue.submit
    dispatch = queue.dispatch
    complete = queue.complete

    while True:
        t = arrivals[i].arrival if i < n else inf
        t = min(t, run_end)
        t = min(t, deadline)
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
            end[running] = now
            finished += 1
            running = -1
            run_end = deadline = inf
            idle_from = now
        if deadline <= now:  # 2. a hanging job's lease ran out
            for expired in queue.expire(now):
                events += 1
                j = int(expired.job.id)
                retries.append((j, start[j], now, load[j]))
                lost += now - start[j]
                start[j] = nan
                if expired.requeued:
                    status[j] = QUEUED
                else:
                    status[j] = FAILED
                    end[j] = now
                    finished += 1
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
                end[j] = now
                finished += 1
        while i < n and arrivals[i].arrival <= now:  # 4. arrivals
            a = arrivals[i]
            submit(
                str(i),
                member=a.member,
                priority=a.priority,
                tier=a.tier,
                model=a.model,
                estimate=a.estimate,
                now=now,
            )
            events += 1
            status[i] = QUEUED
            if a.cancel_after is not None:
                heapq.heappush(cancels, (now + a.cancel_after, i))
            i += 1
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
                    next_deadline = queue.next_deadline()
                    deadline = inf if next_deadline is None else next_deadline
                else:
                    run_end = now + cold + a.duration
                    deadline = inf
        loops += 1
        if progress is not None and not loops % _PROGRESS_EVERY:
            progress(finished)

    result.swaps = swaps
    result.load_seconds = load_total
    result.idle_seconds = idle
    result.idle_waiting_seconds = idle_waiting
    result.lost_seconds = lost
    result.makespan = now
    if cut:
        result.horizon = stop
        result.makespan = max((e for e in end if not math.isnan(e)), default=0.0)
    result.events = events
    result.reorders = reorder_counts(queue, now)
    result.wall_seconds = time.perf_counter() - began
    if progress is not None:
        progress(finished)
    return result
