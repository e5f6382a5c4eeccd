"""The policies of a simulated fleet: three pull baselines and the real ``FleetDispatcher``.

Theory of operation
-------------------
A fleet policy is a queue that workers **pull** from (:class:`FleetQueue`): ``pop(worker,
now)`` returns the job that worker should run next, or None. A worker only ever gets a job
for a model it serves. The baselines live here, never in the core:

* ``fifo``: global FIFO pull: a free worker takes the oldest job it can run (a requeued job
  first), as a plain shared work queue does.
* ``strict``: the highest priority level first, the oldest inside a level.
* ``warm-first``: Ray Serve's model-multiplexing rule: a free worker takes the oldest job for
  the model resident on it, else the oldest job it can run. No priorities.
* ``prioqueue`` and its ablations: the real :class:`~prioqueue.fleet.FleetDispatcher`, one
  ``join`` per worker, with the policy's ``warm_hold``.

The baselines keep one heap of queued jobs per model (model-less jobs under ``None``), so a
pop reads the tops of the heaps of the models the worker serves: O(M log n) for ``M`` models.
Cancelled jobs are deleted lazily. Leases and requeues follow the dispatcher's rules: a job
whose lease ran out goes back to the front (``fifo``) or to its submission place (``strict``,
``warm-first`` by age), and fails after three grants. With one worker, ``dispatch(now)`` is
its pop, so ``warm-first`` also runs on the one-GPU engine.
"""

from __future__ import annotations

import abc
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from prioqueue._errors import ConfigError, InvalidState, UnknownJob
from prioqueue.scoring import Scorer
from prioqueue.sim.policies import (
    _MAX_ATTEMPTS,
    ExpiredLike,
    GrantLike,
    PolicySpec,
    _Expired,
    _Grant,
    _Job,
    _JobBook,
)
from prioqueue.sim.workers import WorkerSpec

__all__ = [
    "DEFAULT_FLEET_POLICIES",
    "FleetFifo",
    "FleetQueue",
    "FleetStrict",
    "WarmFirst",
    "build_fleet_queue",
    "build_pull_baseline",
]

DEFAULT_FLEET_POLICIES = ("fifo", "strict", "warm-first", "prioqueue")
"""What a fleet report compares unless told otherwise: three pull baselines and prioqueue."""

#: ``(job, worker name) -> lease seconds``.
LeaseRule = Callable[[Any, str], float]


class FleetQueue(Protocol):
    """The part of ``FleetDispatcher``'s API the fleet engine drives."""

    def submit(  # noqa: D102
        self,
        job_id: str,
        *,
        member: str,
        priority: int | str | bytes | None = 0,
        tier: str = "free",
        model: str | None = None,
        estimate: float | None = None,
        payload: Any = None,
        now: float,
    ) -> object: ...

    def pop(self, name: str, *, now: float) -> GrantLike | None: ...  # noqa: D102

    def complete(  # noqa: D102
        self, job_id: str, *, now: float, runtime: float | None = None, worker: str | None = None
    ) -> object: ...

    def cancel(  # noqa: D102
        self, job_id: str, *, now: float, charge: float | None = None
    ) -> object: ...

    def expire(self, now: float) -> Sequence[ExpiredLike]: ...  # noqa: D102

    def next_deadline(self) -> float | None: ...  # noqa: D102

    def __len__(self) -> int: ...


class _PullBaseline(_JobBook):
    """Jobs by id, one heap per model, the workers' held counts and the leases.

    Subclasses give the order (``_key``) and may prefer a model (``_prefer``).

    Args:
        workers: The fleet.
        lease_for: ``(job, worker name) -> seconds`` of lease, or None for no leases.
    """

    def __init__(self, workers: Sequence[WorkerSpec], lease_for: LeaseRule | None = None) -> None:
        if not workers:
            raise ConfigError("a fleet needs at least one worker")
        super().__init__()
        self._serves = {w.name: w.models for w in workers}
        self._slots = {w.name: w.slots for w in workers}
        self._held = {w.name: 0 for w in workers}
        self._resident: dict[str, str | None] = {w.name: w.resident for w in workers}
        self._only = workers[0].name if len(workers) == 1 else None
        self._lease_for = lease_for
        self._heaps: dict[str | None, list[tuple[tuple[int, int], int, _Job]]] = {}
        self._deadlines: list[tuple[float, int, _Job]] = []
        self._pushes = 0

    @abc.abstractmethod
    def _key(self, job: _Job, *, requeue: bool) -> tuple[int, int]:
        """The job's place: smaller goes first."""

    def _prefer(self, name: str) -> str | None:
        """A model whose oldest job the worker takes before anything else (None: none)."""
        return None

    def resident(self, name: str) -> str | None:
        """The model of the last job granted to worker ``name`` (or its starting model)."""
        return self._resident[name]

    def _push(self, job: _Job, *, requeue: bool) -> None:
        self._pushes += 1
        heap = self._heaps.setdefault(job.model, [])
        heapq.heappush(heap, (self._key(job, requeue=requeue), self._pushes, job))

    def _top(self, model: str | None) -> _Job | None:
        heap = self._heaps.get(model)
        while heap and not heap[0][2].queued:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def _candidates(self, name: str) -> Iterable[str | None]:
        served = self._serves[name]
        if served is None:
            return list(self._heaps)
        return [m for m in self._heaps if m is None or m in served]

    def pop(self, name: str, *, now: float) -> _Grant | None:
        """Grant worker ``name`` its next job, or None (slots full, nothing it can run).

        O(M log n) for M models with queued jobs.

        Raises:
            ConfigError: ``name`` is not a worker of the fleet.
        """
        if name not in self._held:
            raise ConfigError(f"unknown worker {name!r}; workers: {', '.join(self._held)}")
        if self._held[name] >= self._slots[name] or not self._queued:
            return None
        best: _Job | None = None
        preferred = self._prefer(name)
        served = self._serves[name]
        if preferred is not None and (served is None or preferred in served):
            best = self._top(preferred)
        if best is None:
            best_key: tuple[tuple[int, int], int] | None = None
            for model in self._candidates(name):
                top = self._top(model)
                if top is None:
                    continue
                heap = self._heaps[model]
                key = (heap[0][0], heap[0][1])
                if best_key is None or key < best_key:
                    best, best_key = top, key
        if best is None:
            return None
        heapq.heappop(self._heaps[best.model])  # best is the top of its heap
        self._queued -= 1
        best.queued = False
        best.attempt += 1
        best.worker = name
        self._held[name] += 1
        if best.model is not None:
            self._resident[name] = best.model
        if self._lease_for is not None:
            best.deadline = now + self._lease_for(best, name)
            heapq.heappush(self._deadlines, (best.deadline, best.seq, best))
        return _Grant(best, best.attempt, name)

    def dispatch(self, now: float) -> _Grant | None:
        """The one-worker form of :meth:`pop` (the one-GPU engine's protocol).

        Raises:
            ConfigError: The fleet has more than one worker.
        """
        if self._only is None:
            raise ConfigError("dispatch() needs a fleet of one worker; use pop(worker, now=)")
        return self.pop(self._only, now=now)

    def _release(self, job: _Job) -> None:
        assert job.worker is not None
        self._held[job.worker] -= 1
        job.worker = None
        job.deadline = None

    def complete(
        self, job_id: str, *, now: float, runtime: float | None = None, worker: str | None = None
    ) -> object:
        """Finish a held job.

        Raises:
            InvalidState: The job is not held (or not by ``worker``).
        """
        job = self._jobs.get(job_id)
        if job is None or job.worker is None or (worker is not None and job.worker != worker):
            raise InvalidState(f"job {job_id!r} is not held by {worker or 'a worker'}")
        self._release(job)
        del self._jobs[job_id]
        return job

    def cancel(self, job_id: str, *, now: float, charge: float | None = None) -> object:
        """Drop a queued or held job (``charge`` is accepted and ignored: no fair share).

        Raises:
            UnknownJob: The id is not queued or held.
        """
        job = self._jobs.pop(job_id, None)
        if job is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        if job.worker is not None:
            self._release(job)
        else:
            job.queued = False
            self._queued -= 1
        return job

    def expire(self, now: float) -> list[_Expired]:
        """Requeue (or fail, after three grants) every held job whose lease ran out."""
        result = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, job = heapq.heappop(self._deadlines)
            if job.worker is None or job.deadline != deadline:
                continue  # finished or regranted since
            self._release(job)
            result.append(self._lease_ran_out(job))
        return result

    def next_deadline(self) -> float | None:
        """The earliest lease deadline of a held job, or None."""
        heap = self._deadlines
        while heap and (heap[0][2].worker is None or heap[0][2].deadline != heap[0][0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None


class FleetFifo(_PullBaseline):
    """Global FIFO pull: the oldest job the worker can run; a requeued job goes first."""

    def _key(self, job: _Job, *, requeue: bool) -> tuple[int, int]:
        return (0, -self._pushes) if requeue else (1, job.seq)


class FleetStrict(_PullBaseline):
    """The highest priority level first, the oldest (by submission) inside a level."""

    def _key(self, job: _Job, *, requeue: bool) -> tuple[int, int]:
        return (-job.priority, job.seq)


class WarmFirst(FleetFifo):
    """Ray Serve's rule: the oldest job for the worker's resident model, else the oldest."""

    def _prefer(self, name: str) -> str | None:
        return self._resident[name]


_BASELINES: dict[str, type[_PullBaseline]] = {
    "fifo": FleetFifo,
    "strict": FleetStrict,
    "warm-first": WarmFirst,
}


def build_pull_baseline(
    kind: str, workers: Sequence[WorkerSpec], lease_for: LeaseRule | None = None
) -> _PullBaseline:
    """Make a pull baseline for a fleet.

    Args:
        kind: ``"fifo"``, ``"strict"`` or ``"warm-first"``.
        workers: The fleet.
        lease_for: ``(job, worker name) -> seconds``, or None for no leases.

    Returns:
        The queue.

    Raises:
        ConfigError: An unknown kind or an empty fleet.
    """
    cls = _BASELINES.get(kind)
    if cls is None:
        raise ConfigError(f"unknown fleet baseline {kind!r}; known: {', '.join(_BASELINES)}")
    return cls(workers, lease_for)


def build_fleet_queue(
    spec: PolicySpec,
    workers: Sequence[WorkerSpec],
    lease_for: LeaseRule | None = None,
    load_seconds: Mapping[str, float] | None = None,
) -> FleetQueue:
    """Make a fresh fleet queue for ``spec``, every worker joined at time 0.

    Args:
        spec: The policy.
        workers: The fleet.
        lease_for: ``(job, worker name) -> seconds``, or None for no leases.
        load_seconds: The models' cold-load seconds (the dispatcher's ``load_seconds``).

    Returns:
        A pull baseline, or a ``FleetDispatcher`` configured from ``spec.params``.

    Raises:
        ConfigError: An empty fleet or a bad parameter.
    """
    if spec.is_baseline:
        return build_pull_baseline(spec.kind, workers, lease_for)
    from prioqueue.fleet import FleetDispatcher

    params = spec.params
    rule: Callable[..., float] | None = None
    if lease_for is not None:
        sized = lease_for

        def rule(job: Any, info: Any) -> float:
            return sized(job, info.name)

    fleet = FleetDispatcher(
        Scorer(params.scoring_config()),
        charge=params.charge,
        lease_for=rule,
        fair_share=params.fair_share,
        crossing_share=params.crossing_share,
        max_attempts=_MAX_ATTEMPTS,
        warm_hold=params.warm_hold,
        load_seconds=load_seconds,
        budgets=params.budgets or None,
    )
    for worker in workers:
        fleet.join(
            worker.name,
            models=worker.models,
            resident=worker.resident,
            slots=worker.slots,
            now=0.0,
        )
    return fleet
