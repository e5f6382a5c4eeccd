"""The simulator's one loop: :class:`Loop` drives 1..N workers over a queue (private).

:func:`prioqueue.sim.engine.simulate` builds a :class:`Loop` and runs it; the module
docstring of :mod:`prioqueue.sim.engine` describes the events, the polling model and the
leases. Each step of an instant is one method here.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from prioqueue.clock import perf_counter
from prioqueue.sim.feeder import Feeder
from prioqueue.sim.policies import PolicySpec
from prioqueue.sim.queues import GrantLike, OneGpu, build_queue
from prioqueue.sim.results import JobState, RunResult, WorkerStats
from prioqueue.sim.workers import WorkerSpec
from prioqueue.sim.workload import Workload

__all__ = ["Loop"]

_PROGRESS_EVERY = 4096
_INF = math.inf


class _Worker:
    """One worker's state during a run."""

    __slots__ = (
        "awake",
        "busy_seconds",
        "held",
        "idle",
        "idle_from",
        "index",
        "jobs",
        "load_seconds",
        "loaded",
        "lost_seconds",
        "models",
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
        self.run_end = _INF
        self.idle_from = 0.0
        self.idle = 0.0  # the idle gaps before its grants
        self.models = None if spec.models is None else sorted(spec.models)
        # What it did (runs, swaps, loads, busy and lost seconds), counted where it happens.
        self.jobs = 0
        self.swaps = 0
        self.load_seconds = 0.0
        self.busy_seconds = 0.0
        self.lost_seconds = 0.0
        self.phase = phase
        self.tick = _INF  # its next poll tick (when polling)
        self.awake = False  # pulls at the next instant whatever its ticks (a job ended)

    def did(self) -> WorkerStats:
        """What it did during the run (its public record). O(1)."""
        return WorkerStats(
            self.name, self.slots, self.speed, self.models,
            jobs=self.jobs, swaps=self.swaps, load_seconds=self.load_seconds,
            busy_seconds=self.busy_seconds, lost_seconds=self.lost_seconds,
        )  # fmt: skip


class Loop:
    """One run: the workers, the queue, the clock and the event heaps; a step method each.

    One GPU is a fleet of one worker whose queue is the ``SizeOneDispatcher`` (``one_gpu``):
    only the result's idle seconds and per-worker fields differ (see
    :mod:`prioqueue.sim.engine`). Each step is O(log n) plus the queue's cost and O(workers).

    Args:
        workload: The workload.
        spec: The policy.
        workers: The fleet (non-empty, unique names).
        lease_factor: As for :func:`~prioqueue.sim.engine.simulate`.
        one_gpu: The fleet is one GPU (a ``SizeOneDispatcher``; see :mod:`prioqueue.sim.engine`).
        poll: As for :func:`~prioqueue.sim.engine.simulate` (0 on one GPU).
        progress: As for :func:`~prioqueue.sim.engine.simulate`.
    """

    def __init__(
        self,
        workload: Workload,
        spec: PolicySpec,
        workers: Sequence[WorkerSpec],
        *,
        lease_factor: float | None,
        one_gpu: bool,
        poll: float,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.began = perf_counter()
        self.workload = workload
        self.spec = spec
        self.arrivals = arrivals = workload.arrivals
        self.one_gpu = one_gpu
        self.poll = poll
        self.progress = progress
        self.fleet = [_Worker(k, w, k * poll / len(workers)) for k, w in enumerate(workers)]
        self.by_name = {w.name: w for w in self.fleet}
        self.leases = lease_factor is not None
        self.factor = 1.0 if lease_factor is None else float(lease_factor)
        self.slack = max([workload.default_load, *workload.load_seconds.values()]) + 1.0
        self.now = 0.0
        self.deadline_of: dict[int, float] = {}  # lease deadline of each held job
        self.holder: dict[int, _Worker] = {}  # the worker holding each held job
        self.leased: dict[str, float] = {}  # the lease just computed for a job being granted
        models = sorted({a.model for a in arrivals if a.model is not None})
        rule = self._lease if self.leases else None
        loads = {model: workload.load_time(model) for model in models}
        self.queue = build_queue(spec, workers, rule, loads, one_gpu=one_gpu)
        self.hold = 0.0 if spec.is_baseline or one_gpu else float(spec.params.warm_hold)
        hold_end = getattr(self.queue, "next_hold_end", None)
        self.hold_end: Callable[[], float | None] | None = hold_end if self.hold > 0 else None
        self.by_runtime = not spec.is_baseline and spec.params.charge == "runtime"
        self.lapses = not spec.is_baseline and any(
            b.ttl is not None for b in spec.params.budgets.values()
        )
        self._init_jobs(spec)
        self.hung = 0  # hung attempts held now: only they can reach a lease deadline
        self.deadline = _INF  # the queue's next_deadline (leases of hung jobs, ttl lapses)
        self.idle_waiting = 0.0
        self.events = 0

    def _init_jobs(self, spec: PolicySpec) -> None:
        """The per-job lists, the event heaps, the result and the feeder."""
        n = len(self.arrivals)
        self.status: list[int] = [JobState.PENDING] * n
        self.start = [math.nan] * n
        self.load = [0.0] * n
        self.worker_of = [-1] * n
        self.attempts = [0] * n
        self.end = end = [math.nan] * n
        self.retries: list[tuple[int, float, float, float]] = []  # hung attempts' leases ran out
        self.runs: list[tuple[int, int, float, float]] = []
        self.cancels: list[tuple[float, int]] = []
        self.ends: list[tuple[float, int, int]] = []  # (run end, worker, job)
        self.wakes: list[float] = []  # warm holds running out
        self.feeder = Feeder(
            self.workload,
            self.queue,
            self.status,
            [math.nan] * n,
            end,
            self.cancels,
            began=self.began,
            progress=self.progress,
            wakes=self.wakes,
            hold=self.hold,
            policy=self.queue.policy if isinstance(self.queue, OneGpu) else self.queue,
        )

    def _lease(self, job: Any, name: str) -> float:
        """The lease rule given to the queue: ``(job, worker name) -> seconds``."""
        worker = self.by_name[name]
        now = self.now
        ahead = max((self.deadline_of.get(x, now) for x in worker.held), default=now)
        duration = self.arrivals[int(job.id)].duration / worker.speed
        seconds = self.leased[job.id] = (ahead - now) + self.factor * duration + self.slack
        return seconds

    def run(self, horizon: float | None) -> RunResult:
        """Run until every job has left, or to ``horizon``; return the result."""
        stop = _INF if horizon is None else float(horizon)
        feeder, progress = self.feeder, self.progress
        i = loops = 0
        while True:
            t = self._next_instant(i)
            if t == _INF or t > stop:
                break
            self._advance(t)
            self._complete_due()
            if self.deadline <= t:
                self._expire_due()
            self._cancel_due()
            i = feeder.arrivals_until(i, t)
            self._pull()
            self._rearm()
            loops += 1
            if progress is not None and not loops % _PROGRESS_EVERY:
                progress(feeder.finished)
        return self._finish(stop if t != _INF else None)

    def _next_instant(self, i: int) -> float:
        """The time of the next event (``i``: the next arrival's index)."""
        arrivals, ends, fleet, now = self.arrivals, self.ends, self.fleet, self.now
        t = arrivals[i].arrival if i < len(arrivals) else _INF
        while ends and fleet[ends[0][1]].run_end != ends[0][0]:  # stale: cancelled
            heapq.heappop(ends)
        if ends and ends[0][0] < t:
            t = ends[0][0]
        t = min(t, self.deadline)
        cancels, wakes = self.cancels, self.wakes
        if cancels and cancels[0][0] < t:
            t = cancels[0][0]
        while wakes and wakes[0] <= now:
            heapq.heappop(wakes)
        if wakes and wakes[0] < t:
            t = wakes[0]
        if self.poll > 0:
            t = self._next_tick(t)
        return t

    def _next_tick(self, t: float) -> float:
        """``t``, or a free worker's next poll tick before it while jobs wait."""
        poll, now = self.poll, self.now
        waiting = len(self.queue) > 0
        for w in self.fleet:
            if len(w.held) < w.slots:
                w.tick = w.phase + poll * (math.floor((now - w.phase) / poll) + 1)
                if w.tick <= now:  # (now - phase) / poll rounded just below a whole period
                    w.tick += poll
                if waiting and w.tick < t:
                    t = w.tick
        return t

    def _advance(self, t: float) -> None:
        """Move the clock to ``t``, counting the idle workers' seconds while jobs waited."""
        if len(self.queue):
            self.idle_waiting += (t - self.now) * sum(1 for w in self.fleet if w.running < 0)
        self.now = t

    def _complete_due(self) -> None:
        """Step 1: the runs that end now complete."""
        ends, fleet, now = self.ends, self.fleet, self.now
        while ends and ends[0][0] <= now:
            done_at, k, j = heapq.heappop(ends)
            w = fleet[k]
            if w.running != j or w.run_end != done_at:
                continue
            self.queue.complete(str(j), now=now, runtime=self.ran(j), worker=w.name)
            self.events += 1
            self.status[j] = JobState.DONE
            self._stop_running(w, j)
            self.feeder.left(j, now)

    def ran(self, j: int) -> float:
        """The runtime reported for running job ``j`` now, its cold load included.

        The seconds since it started on its worker: what a caller timing its request measures.
        """
        return self.now - self.start[j]

    def _expire_due(self) -> None:
        """Step 2: hung jobs' leases ran out (requeued or failed); ttl lapses leave."""
        now, status, start = self.now, self.status, self.start
        for expired in self.queue.expire(now):
            self.events += 1
            j = int(expired.job.id)
            if getattr(expired, "cause", "lease") == "ttl":  # queued past its deadline
                status[j] = JobState.EXPIRED
                self.feeder.left(j, now)
                continue
            w = self.holder[j]
            ran = w.running == j
            granted = start[j] if ran else now
            self.retries.append((j, granted, now, self.load[j] if ran else 0.0))
            if ran:
                w.lost_seconds += now - start[j]
            self._stop_running(w, j)
            start[j] = math.nan
            if expired.requeued:
                status[j] = JobState.QUEUED
                if self.hold > 0 and self.arrivals[j].model is not None:
                    heapq.heappush(self.wakes, now + self.hold)
            else:
                status[j] = JobState.FAILED
                self.feeder.left(j, now)

    def _cancel_due(self) -> None:
        """Step 3: callers cancel their queued, prefetched or running jobs."""
        cancels, holder, now, status = self.cancels, self.holder, self.now, self.status
        while cancels and cancels[0][0] <= now:
            j = heapq.heappop(cancels)[1]
            if status[j] != JobState.QUEUED and status[j] != JobState.RUNNING:
                continue
            charge = None
            if j in holder and self.by_runtime:  # charge what it ran, not its prefetch wait
                charge = self.ran(j) if holder[j].running == j else 0.0
            self.queue.cancel(str(j), now=now, charge=charge)
            self.events += 1
            if j in holder:
                self._stop_running(holder[j], j)
            status[j] = JobState.CANCELLED
            self.feeder.left(j, now)

    def _pull(self) -> None:
        """Step 5: every worker with a free slot pulls, round after round."""
        poll, now, queue = self.poll, self.now, self.queue
        if poll > 0:  # a tick that passed while nothing waited: the next one from now
            for w in self.fleet:
                if w.tick < now:
                    w.tick = w.phase + poll * math.ceil((now - w.phase) / poll)
        granted_any = True
        while granted_any and len(queue):
            granted_any = False
            free = sorted(
                (
                    w
                    for w in self.fleet
                    if len(w.held) < w.slots and (poll == 0 or w.awake or w.tick == now)
                ),
                key=lambda w: (w.idle_from, w.index),
            )
            for w in free:
                while len(w.held) < w.slots and len(queue):
                    grant = queue.pop(w.name, now=now)
                    self.events += 1
                    if grant is None:
                        break
                    granted_any = True
                    self._grant(w, grant)

    def _grant(self, w: _Worker, grant: GrantLike) -> None:
        """Worker ``w`` got ``grant``: hold the job, and start it when the worker is idle."""
        j = int(grant.job.id)
        self.attempts[j] = grant.attempt
        self.holder[j] = w
        self.status[j] = JobState.RUNNING
        if self.leases:
            self.deadline_of[j] = self.now + self.leased.pop(grant.job.id)
        w.held.append(j)
        if w.running < 0:
            w.idle += self.now - w.idle_from
            self._begin(w)

    def _begin(self, w: _Worker) -> None:
        """Start the worker's first held job, if any (else it idles from now)."""
        t = self.now
        if not w.held:
            w.running = -1
            w.run_end = _INF
            w.idle_from = t
            return
        j = w.held[0]
        a = self.arrivals[j]
        model = a.model
        cold = 0.0
        if model is not None and model != w.loaded:
            cold = self.workload.load_time(model)
            w.loaded = model
            w.swaps += 1
            w.load_seconds += cold
        w.running = j
        w.jobs += 1
        self.status[j] = JobState.RUNNING
        self.start[j] = t
        self.load[j] = cold
        self.worker_of[j] = w.index
        if self.attempts[j] <= a.hangs and self.leases:
            w.run_end = _INF
            self.hung += 1
        else:
            w.run_end = t + cold + a.duration / w.speed
            heapq.heappush(self.ends, (w.run_end, w.index, j))

    def _stop_running(self, w: _Worker, j: int) -> None:
        """Job ``j`` leaves worker ``w`` (done, cancelled or taken back)."""
        w.held.remove(j)
        self.deadline_of.pop(j, None)
        del self.holder[j]
        w.awake = True
        if w.running == j:
            self.runs.append((w.index, j, self.start[j], self.now))
            w.busy_seconds += self.now - self.start[j]
            if w.run_end == _INF:
                self.hung -= 1
            self._begin(w)

    def _rearm(self) -> None:
        """End of an instant: wake for a warm hold's lapse; the queue's next deadline."""
        queue = self.queue
        if (
            self.hold_end is not None
            and len(queue)
            and any(len(w.held) < w.slots for w in self.fleet)
        ):
            # A warm hold may be keeping a job from a free worker: pull again when it lapses.
            lapse = self.hold_end()
            if lapse is not None:
                heapq.heappush(self.wakes, lapse)
        for w in self.fleet:
            w.awake = False
        # Leases (of hung jobs) and ttl lapses both come from next_deadline; step 2 tells
        # them apart by the Expired's cause.
        next_deadline = queue.next_deadline() if self.hung or self.lapses else None
        self.deadline = _INF if next_deadline is None else next_deadline

    def _finish(self, cut: float | None) -> RunResult:
        """Fill in the result; ``cut`` is the horizon when it stopped the clock, else None."""
        start = self.start
        clock = self.now if cut is None else cut
        for w in self.fleet:  # unfinished work at the horizon
            if w.running >= 0:
                self.runs.append((w.index, w.running, start[w.running], clock))
                w.busy_seconds += clock - start[w.running]
            for j in w.held:
                if w.running != j:
                    self.status[j] = JobState.QUEUED  # prefetched, never started: still waiting
        did = [w.did() for w in self.fleet]
        fed = self.feeder.close(now=self.now, events=self.events, horizon=cut)
        clock_end = fed.makespan if cut is None else cut
        if self.one_gpu:
            idle = self.fleet[0].idle
        else:
            busy = math.fsum(d.busy_seconds for d in did)
            idle = max(0.0, len(self.fleet) * clock_end - busy)
        return RunResult(
            self.spec, self.workload, self.status, start, self.end, self.load,
            retries=self.retries,
            swaps=sum(d.swaps for d in did),
            load_seconds=math.fsum(d.load_seconds for d in did),
            idle_seconds=idle,
            idle_waiting_seconds=self.idle_waiting,
            lost_seconds=math.fsum(d.lost_seconds for d in did),
            makespan=fed.makespan, events=fed.events, wall_seconds=fed.wall_seconds,
            reorders=fed.reorders, horizon=fed.horizon, submitted=fed.submitted,
            forecasts=fed.forecasts,
            # A fleet's per-worker record (one GPU reports none).
            workers=[] if self.one_gpu else did,
            worker_of=[] if self.one_gpu else self.worker_of,
            runs=[] if self.one_gpu else self.runs,
        )  # fmt: skip
