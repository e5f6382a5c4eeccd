"""A discrete-event simulation of a fleet of workers pulling jobs from one queue.

Theory of operation
-------------------
The fleet engine is the one-GPU engine (:mod:`prioqueue.sim.engine`) with per-worker state.
Each worker holds at most ``slots`` jobs: the first runs, the others are prefetched and run in
grant order. A job runs for its warm duration divided by the worker's ``speed``, after a cold
load when its model is not the one loaded on that worker (a **swap**). The queue is a
:class:`~prioqueue.sim.fleet_policies.FleetQueue`: the real ``FleetDispatcher`` or a pull
baseline.

Events, in the order they are handled at one instant:

1. running jobs complete (every worker whose run ends now), and each worker starts its next
   prefetched job;
2. leases run out (only a job that *hangs* runs past its lease): ``expire`` takes the jobs
   back, and their workers go on with their next job; with a level's ``ttl`` queued jobs past
   their deadline leave as ``EXPIRED`` (``expire`` reports both, told apart by ``cause``);
3. callers cancel jobs (queued, prefetched or running);
4. jobs arrive (a chained group's jobs as its chain releases them; a submit that a level's
   budget refuses leaves at once as ``REFUSED``);
5. every worker with a free slot pulls, the longest-idle first, until a whole round grants
   nothing (a grant can free a job for another worker: a warm hold ends when the warm worker
   is busy). A job that the dispatcher keeps for a warm worker becomes free for the others
   ``warm_hold`` seconds after it was queued (a free warm worker), or when a busy warm worker
   is ``warm_hold`` past its expected free time (``FleetDispatcher.next_hold_end()``), so the
   engine also wakes up then. The dispatcher gets the workload's cold-load times as
   ``load_seconds`` (docs/design/fleet.md, "Placement: the warm hold").

**Polling.** With ``poll = 0`` (the default) a free worker pulls at every instant, as a
gateway that pops for its free upstreams whenever something changes. With ``poll = p > 0``
workers behave like remote workers that ask for work: a worker pulls at once when one of its
jobs ends (completed, cancelled or taken back), and otherwise only at its own ticks, every
``p`` seconds (worker ``k`` of ``W`` at ``k * p / W + m * p``). Arrivals then wait for the
next tick of a free worker, and a warm worker that is free may not ask before a cold one:
that is where ``warm_hold`` matters, and the measurement in docs/simulator.md varies both.

Leases: a grant's lease is ``factor`` times its duration on that worker plus the slowest cold
load, counted from when the worker's jobs ahead of it must have ended (their lease
deadlines), so a prefetched job never expires while it waits behind a healthy one.

Workers report the seconds a job really ran (``complete(..., runtime=...)``), as the design
note asks of workers with prefetch slots; under ``charge="runtime"`` a cancelled held job is
charged the seconds it ran (0 while it was still prefetched). Each step is O(log n) plus the
policy's cost and O(workers) for the pull round.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from prioqueue._errors import ConfigError
from prioqueue.sim.engine import (
    CANCELLED,
    DONE,
    EXPIRED,
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    Feeder,
    RunResult,
    WorkerStats,
    check_run_args,
)
from prioqueue.sim.fleet_policies import FleetQueue, build_fleet_queue
from prioqueue.sim.policies import PolicySpec
from prioqueue.sim.workers import WorkerSpec
from prioqueue.sim.workload import Workload

__all__ = ["simulate_fleet"]

_PROGRESS_EVERY = 4096


class _Worker:
    """One worker's state during a run."""

    __slots__ = (
        "awake",
        "busy",
        "held",
        "idle_from",
        "index",
        "jobs",
        "load",
        "loaded",
        "lost",
        "name",
        "phase",
        "run_end",
        "running",
        "slots",
        "speed",
        "swaps",
        "tick",
    )

    def __init__(self, index: int, spec: WorkerSpec, phase: float) -> None:
        self.index = index
        self.name = spec.name
        self.slots = spec.slots
        self.speed = spec.speed
        self.loaded = spec.resident
        self.held: deque[int] = deque()  # job indices; the first runs once started
        self.running = -1  # the job running now, -1 when none
        self.run_end = math.inf
        self.idle_from = 0.0
        self.busy = 0.0
        self.load = 0.0
        self.lost = 0.0
        self.swaps = 0
        self.jobs = 0
        self.phase = phase
        self.tick = math.inf  # its next poll tick (when polling)
        self.awake = False  # pulls at the next instant whatever its ticks (a job ended)


def _models(spec: WorkerSpec) -> list[str] | None:
    return None if spec.models is None else sorted(spec.models)


def simulate_fleet(
    workload: Workload,
    spec: PolicySpec,
    workers: Sequence[WorkerSpec],
    *,
    lease_factor: float | None = 3.0,
    horizon: float | None = None,
    progress: Callable[[int], None] | None = None,
    poll: float = 0.0,
) -> RunResult:
    """Run ``workload`` through a fresh fleet queue for ``spec`` on ``workers``.

    :func:`prioqueue.sim.engine.simulate` with ``workers=...`` calls this.
    O((n + grants) (log n + W)) plus the policy's cost, for W workers.

    Args:
        workload: The arrivals and the models' cold-load times.
        spec: The policy.
        workers: The fleet (non-empty, unique names).
        lease_factor: As for ``simulate`` (None: no leases).
        horizon: As for ``simulate``.
        progress: Called now and then with the number of jobs that have left.
        poll: Seconds between an idle worker's requests for work (0: it pulls at every
            instant; see the module docstring).

    Returns:
        The per-job outcomes, the fleet totals and one :class:`WorkerStats` per worker.

    Raises:
        ValueError: ``lease_factor`` is below 1, ``horizon`` or ``poll`` is negative or not
            a finite number.
        ConfigError: ``workers`` is empty or names a worker twice.
    """
    check_run_args(lease_factor, horizon, poll)
    names = [w.name for w in workers]
    if not names or len(set(names)) != len(names):
        raise ConfigError(f"workers must be non-empty with unique names, got {names}")
    stop = math.inf if horizon is None else float(horizon)
    began = time.perf_counter()
    arrivals = workload.arrivals
    n = len(arrivals)
    fleet = [_Worker(k, w, k * poll / len(workers)) for k, w in enumerate(workers)]
    by_name = {w.name: w for w in fleet}
    nan = math.nan
    inf = math.inf
    deadline_of: dict[int, float] = {}  # lease deadline of each held job
    holder: dict[int, _Worker] = {}  # the worker holding each held job
    leased: dict[str, float] = {}  # the lease just computed for a job being granted
    now = 0.0
    slack = max([workload.default_load, *workload.load_seconds.values()]) + 1.0

    def lease_for(job: Any, name: str) -> float:
        worker = by_name[name]
        ahead = max((deadline_of.get(x, now) for x in worker.held), default=now)
        duration = arrivals[int(job.id)].duration / worker.speed
        seconds = leased[job.id] = (ahead - now) + factor * duration + slack
        return seconds

    factor = 1.0 if lease_factor is None else float(lease_factor)
    models = sorted({a.model for a in arrivals if a.model is not None})
    queue: FleetQueue = build_fleet_queue(
        spec,
        workers,
        None if lease_factor is None else lease_for,
        {model: workload.load_time(model) for model in models},
    )
    hold = 0.0 if spec.is_baseline else float(spec.params.warm_hold)
    hold_end: Callable[[], float | None] | None = getattr(queue, "next_hold_end", None)
    hold_end = hold_end if hold > 0 else None
    by_runtime = not spec.is_baseline and spec.params.charge == "runtime"
    status = [PENDING] * n
    start = [nan] * n
    end = [nan] * n
    load = [0.0] * n
    submitted = [nan] * n
    worker_of = [-1] * n
    result = RunResult(spec, workload, status, start, end, load)
    retries = result.retries
    runs = result.runs
    cancels: list[tuple[float, int]] = []
    ends: list[tuple[float, int, int]] = []  # (run end, worker, job)
    wakes: list[float] = []  # warm holds running out
    feeder = Feeder(
        workload,
        queue,
        status,
        submitted,
        end,
        cancels,
        began=began,
        progress=progress,
        wakes=wakes,
        hold=hold,
    )
    left = feeder.left
    hung = 0  # hung attempts held now: only they can reach a lease deadline
    lapses = not spec.is_baseline and any(b.ttl is not None for b in spec.params.budgets.values())
    deadline = inf
    idle_waiting = 0.0
    events = 0
    i = 0
    loops = 0
    cut = False

    def begin(w: _Worker, t: float) -> None:
        """Start the worker's first held job, if any."""
        nonlocal hung
        if not w.held:
            w.running = -1
            w.run_end = inf
            w.idle_from = t
            return
        j = w.held[0]
        a = arrivals[j]
        model = a.model
        cold = 0.0
        if model is not None and model != w.loaded:
            cold = workload.load_time(model)
            w.loaded = model
            w.swaps += 1
            w.load += cold
        w.running = j
        w.jobs += 1
        status[j] = RUNNING
        start[j] = t
        load[j] = cold
        worker_of[j] = w.index
        if attempts[j] <= a.hangs and lease_factor is not None:
            w.run_end = inf
            hung += 1
        else:
            w.run_end = t + cold + a.duration / w.speed
            heapq.heappush(ends, (w.run_end, w.index, j))

    def stop_running(w: _Worker, j: int, t: float) -> None:
        """Job ``j`` leaves worker ``w`` (done, cancelled or taken back)."""
        nonlocal hung
        w.held.remove(j)
        deadline_of.pop(j, None)
        del holder[j]
        w.awake = True
        if w.running == j:
            runs.append((w.index, j, start[j], t))
            w.busy += t - start[j]
            if w.run_end == inf:
                hung -= 1
            begin(w, t)

    attempts = [0] * n
    while True:
        t = arrivals[i].arrival if i < n else inf
        while ends and fleet[ends[0][1]].run_end != ends[0][0]:  # stale: cancelled
            heapq.heappop(ends)
        if ends and ends[0][0] < t:
            t = ends[0][0]
        t = min(t, deadline)
        if cancels and cancels[0][0] < t:
            t = cancels[0][0]
        while wakes and wakes[0] <= now:
            heapq.heappop(wakes)
        if wakes and wakes[0] < t:
            t = wakes[0]
        if poll > 0:
            waiting = len(queue) > 0
            for w in fleet:
                if len(w.held) < w.slots:
                    w.tick = w.phase + poll * (math.floor((now - w.phase) / poll) + 1)
                    if waiting and w.tick < t:
                        t = w.tick
        if t == inf:
            break
        if t > stop:
            cut = True
            break
        if len(queue):
            idle_waiting += (t - now) * sum(1 for w in fleet if w.running < 0)
        now = t

        while ends and ends[0][0] <= now:  # 1. completions
            done_at, k, j = heapq.heappop(ends)
            w = fleet[k]
            if w.running != j or w.run_end != done_at:
                continue
            queue.complete(str(j), now=now, runtime=now - start[j], worker=w.name)
            events += 1
            status[j] = DONE
            stop_running(w, j, now)
            left(j, now)
        if deadline <= now:  # 2. hung jobs' leases ran out
            for expired in queue.expire(now):
                events += 1
                j = int(expired.job.id)
                if getattr(expired, "cause", "lease") == "ttl":  # queued past its deadline
                    status[j] = EXPIRED
                    left(j, now)
                    continue
                w = holder[j]
                ran = w.running == j
                granted = start[j] if ran else now
                retries.append((j, granted, now, load[j] if ran else 0.0))
                if ran:
                    w.lost += now - start[j]
                stop_running(w, j, now)
                start[j] = nan
                if expired.requeued:
                    status[j] = QUEUED
                    if hold > 0 and arrivals[j].model is not None:
                        heapq.heappush(wakes, now + hold)
                else:
                    status[j] = FAILED
                    left(j, now)
        while cancels and cancels[0][0] <= now:  # 3. cancellations
            j = heapq.heappop(cancels)[1]
            if status[j] == QUEUED or status[j] == RUNNING:
                charge = None
                if j in holder and by_runtime:  # charge what it ran, not its prefetch wait
                    charge = now - start[j] if holder[j].running == j else 0.0
                queue.cancel(str(j), now=now, charge=charge)
                events += 1
                if j in holder:
                    stop_running(holder[j], j, now)
                status[j] = CANCELLED
                left(j, now)
        i = feeder.arrivals_until(i, now)  # 4. arrivals
        if poll > 0:  # a tick that passed while nothing waited: the next one from now
            for w in fleet:
                if w.tick < now:
                    w.tick = w.phase + poll * math.ceil((now - w.phase) / poll)
        granted_any = True  # 5. pull rounds
        while granted_any and len(queue):
            granted_any = False
            free = sorted(
                (
                    w
                    for w in fleet
                    if len(w.held) < w.slots and (poll == 0 or w.awake or w.tick == now)
                ),
                key=lambda w: (w.idle_from, w.index),
            )
            for w in free:
                while len(w.held) < w.slots and len(queue):
                    grant = queue.pop(w.name, now=now)
                    events += 1
                    if grant is None:
                        break
                    granted_any = True
                    j = int(grant.job.id)
                    attempts[j] = grant.attempt
                    holder[j] = w
                    status[j] = RUNNING
                    if lease_factor is not None:
                        deadline_of[j] = now + leased.pop(grant.job.id)
                    w.held.append(j)
                    if w.running < 0:
                        begin(w, now)
        if hold_end is not None and len(queue) and any(len(w.held) < w.slots for w in fleet):
            # A warm hold may be keeping a job from a free worker: pull again when it lapses.
            lapse = hold_end()
            if lapse is not None:
                heapq.heappush(wakes, lapse)
        for w in fleet:
            w.awake = False
        # Leases (of hung jobs) and ttl lapses both come from next_deadline; step 2 tells
        # them apart by the Expired's cause.
        next_deadline = queue.next_deadline() if hung or lapses else None
        deadline = inf if next_deadline is None else next_deadline
        loops += 1
        if progress is not None and not loops % _PROGRESS_EVERY:
            progress(feeder.finished)

    for w in fleet:  # unfinished work at the horizon
        if w.running >= 0:
            runs.append((w.index, w.running, start[w.running], stop if cut else now))
        for j in w.held:
            if w.running != j:
                status[j] = QUEUED  # prefetched, never started: still waiting
    clock = stop if cut else now
    result.workers = [
        WorkerStats(
            name=w.name,
            slots=w.slots,
            speed=w.speed,
            models=_models(workers[w.index]),
            jobs=w.jobs,
            swaps=w.swaps,
            load_seconds=w.load,
            busy_seconds=w.busy + (clock - start[w.running] if w.running >= 0 else 0.0),
            lost_seconds=w.lost,
        )
        for w in fleet
    ]
    result.swaps = sum(w.swaps for w in fleet)
    result.load_seconds = math.fsum(w.load for w in fleet)
    result.lost_seconds = math.fsum(w.lost for w in fleet)
    result.idle_waiting_seconds = idle_waiting
    result.worker_of = worker_of
    feeder.close(result, now=now, events=events, horizon=stop if cut else None)
    busy = math.fsum(ws.busy_seconds for ws in result.workers)
    result.idle_seconds = max(0.0, len(fleet) * result.clock_end - busy)
    return result
