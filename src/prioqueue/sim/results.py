"""What a simulation run gives: each job's outcome, the GPU totals and per-worker figures.

:func:`prioqueue.sim.engine.simulate` fills a :class:`RunResult`; :mod:`prioqueue.sim.report`
turns it into the report.
"""

from __future__ import annotations

import enum
import math

import attrs

from prioqueue.sim.policies import PolicySpec
from prioqueue.sim.workload import Workload

__all__ = [
    "JobState",
    "RunResult",
    "WorkerStats",
    "check_run_args",
]


class JobState(enum.IntEnum):
    """A job's state in a run (:attr:`RunResult.status`).

    ``EXPIRED`` (its ttl ran out while queued) and ``REFUSED`` (a level's queue budget turned
    its submit away) happen only with ``PolicyParams.budgets``.
    """

    PENDING = 0
    QUEUED = 1
    RUNNING = 2
    DONE = 3
    CANCELLED = 4
    FAILED = 5
    EXPIRED = 6
    REFUSED = 7


PENDING, QUEUED, RUNNING, DONE, CANCELLED, FAILED, EXPIRED, REFUSED = JobState
"""The states under the names :mod:`prioqueue.sim.engine` has always exported."""


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
