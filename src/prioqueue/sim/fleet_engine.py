"""The fleet's entry point under the name it had before one GPU and a fleet shared a loop.

:func:`simulate_fleet` is :func:`prioqueue.sim.engine.simulate` with ``workers`` given; the
loop, its events and the polling model are described in :mod:`prioqueue.sim.engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prioqueue.sim.engine import simulate
from prioqueue.sim.policies import PolicySpec
from prioqueue.sim.results import RunResult
from prioqueue.sim.workers import WorkerSpec
from prioqueue.sim.workload import Workload

__all__ = ["simulate_fleet"]


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

    O((n + grants) (log n + W)) plus the policy's cost, for W workers.

    Args:
        workload: The arrivals and the models' cold-load times.
        spec: The policy.
        workers: The fleet (non-empty, unique names).
        lease_factor: As for ``simulate`` (None: no leases).
        horizon: As for ``simulate``.
        progress: Called now and then with the number of jobs that have left.
        poll: Seconds between an idle worker's requests for work (0: it pulls at every
            instant; see :mod:`prioqueue.sim.engine`).

    Returns:
        The per-job outcomes, the fleet totals and one ``WorkerStats`` per worker.

    Raises:
        ValueError: ``lease_factor`` is below 1, ``horizon`` or ``poll`` is negative or not
            a finite number.
        ConfigError: ``workers`` is empty or names a worker twice.
    """
    return simulate(
        workload,
        spec,
        lease_factor=lease_factor,
        horizon=horizon,
        progress=progress,
        workers=tuple(workers),
        poll=poll,
    )
