"""A discrete-event simulation of 1..N workers pulling jobs from one queue, on a virtual clock.

Theory of operation
-------------------
The engine replays a :class:`~prioqueue.sim.workload.Workload` through one policy's queue (a
:class:`~prioqueue.sim.queues.SimQueue`: the real dispatcher or a baseline). Time is virtual:
the clock jumps from one event to the next and nothing ever sleeps. One loop serves every
fleet; **one GPU is a fleet of one worker** (one slot, speed 1) whose queue is the
``SizeOneDispatcher`` (or a one-worker baseline), and a fleet's queue is the
``FleetDispatcher``.

Each worker holds at most ``slots`` jobs: the first runs, the others are prefetched and run in
grant order. A job runs for its warm duration divided by the worker's ``speed``, after a cold
load when its model is not the one loaded on that worker (a **swap**).

Events, in the order they are handled at one instant (one step method each, in
:mod:`prioqueue.sim._loop`):

1. running jobs complete (every worker whose run ends now), and each worker starts its next
   prefetched job;
2. leases run out (only a job that *hangs* runs past its lease): ``expire`` takes the jobs
   back, and their workers go on with their next job; with a level's ``ttl``
   (``PolicyParams.budgets``) queued jobs past their deadline leave as ``EXPIRED`` (``expire``
   reports both, told apart by ``cause``);
3. callers cancel jobs (``cancel_after`` seconds after arrival; queued, prefetched or
   running);
4. jobs arrive (:class:`~prioqueue.sim.feeder.Feeder`; a submit that a level's ``max_queued``
   or ``max_wait`` refuses leaves at once as ``REFUSED``; all the arrivals of the instant are
   submitted before anything is granted, so a film submitted at once competes as a whole); a
   chained group's jobs are submitted as its chain releases them (:mod:`prioqueue.sim.groups`);
5. every worker with a free slot pulls, the longest-idle first, until a whole round grants
   nothing (a grant can free a job for another worker: a warm hold ends when the warm worker
   is busy). A job that the ``FleetDispatcher`` keeps for a warm worker becomes free for the
   others ``warm_hold`` seconds after it was queued (a free warm worker), or when a busy warm
   worker is ``warm_hold`` past its expected free time (``next_hold_end()``), so the engine
   also wakes up then (docs/design/fleet.md, "Placement: the warm hold").

**Polling.** With ``poll = 0`` (the default) a free worker pulls at every instant, as a
gateway that pops for its free upstreams whenever something changes. With ``poll = p > 0``
workers behave like remote workers that ask for work: a worker pulls at once when one of its
jobs ends (completed, cancelled or taken back), and otherwise only at its own ticks, every
``p`` seconds (worker ``k`` of ``W`` at ``k * p / W + m * p``). One GPU ignores ``poll``.

Leases: a grant's lease is ``factor`` times its duration on that worker plus the slowest cold
load, counted from when the worker's jobs ahead of it must have ended (their lease
deadlines), so a prefetched job never expires while it waits behind a healthy one. Workers
report the seconds a job really ran (``complete(..., runtime=...)``); under
``charge="runtime"`` a fleet's cancelled held job is charged the seconds it ran (0 while it
was still prefetched; on one GPU the dispatcher charges it).

The run ends when every job has left, or at the ``horizon`` when one is given: events at the
horizon itself are still handled, and whatever is queued or running then is left as it is
(``QUEUED`` or ``RUNNING``) so that the report can count it as unfinished work.

What differs between one GPU and a fleet is only what the result reports: a fleet's result
has one :class:`WorkerStats` per worker, each job's worker and every run, and counts idle
time as the workers' seconds not busy up to the end of the clock; one GPU's counts the idle
gaps before its grants. Each step is O(log n) plus the policy's cost and O(workers) for the
pull round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prioqueue.errors import ConfigError
from prioqueue.sim._loop import Loop
from prioqueue.sim.policies import PolicySpec
from prioqueue.sim.results import (
    CANCELLED,
    DONE,
    EXPIRED,
    FAILED,
    PENDING,
    QUEUED,
    REFUSED,
    RUNNING,
    JobState,
    RunResult,
    WorkerStats,
    check_run_args,
)
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
    "JobState",
    "RunResult",
    "WorkerStats",
    "simulate",
]


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

    O((n + grants) (log n + W)) plus the policy's own cost per call, for W workers.

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
            instant; see the module docstring). Ignored on one GPU.

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
    one_gpu = workers is None
    if workers is None:
        fleet = fleet_of(1)
    else:
        fleet = fleet_of(workers) if isinstance(workers, int) else tuple(workers)
    names = [w.name for w in fleet]
    if not fleet or len(set(names)) != len(names):
        raise ConfigError(f"workers must be non-empty with unique names, got {names}")
    run = Loop(
        workload,
        spec,
        fleet,
        lease_factor=lease_factor,
        one_gpu=one_gpu,
        poll=0.0 if one_gpu else float(poll),
        progress=progress,
    )
    return run.run(horizon)
