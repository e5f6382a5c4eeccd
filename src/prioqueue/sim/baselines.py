"""The baselines the simulator compares the dispatcher with: pull queues for 1..N workers.

Theory of operation
-------------------
A baseline is a queue that workers **pull** from (the engine's
:class:`~prioqueue.sim.queues.SimQueue` protocol): ``pop(worker, now)`` returns the job that
worker should run next, or None. A worker only ever gets a job for a model it serves. The
baselines live here, never in the core:

* ``fifo``: global FIFO pull: a free worker takes the oldest job it can run (a requeued job
  first), as a plain shared work queue does; on one GPU, arrival order as llama-swap serves
  requests today.
* ``strict``: the highest priority level first, the oldest inside a level (no tiers, aging,
  affinity or fair share).
* ``warm-first``: Ray Serve's model-multiplexing rule: a free worker takes the oldest job for
  the model resident on it, else the oldest job it can run. No priorities.

The baselines keep one heap of queued jobs per model (model-less jobs under ``None``), so a
pop reads the tops of the heaps of the models the worker serves: O(M log n) for ``M`` models.
Cancelled jobs are deleted lazily. Leases and requeues follow the dispatcher's rules: a job
whose lease ran out goes back to the front (``fifo``) or to its submission place (``strict``,
``warm-first`` by age), and fails after three grants. One GPU is a fleet of one worker
(:class:`FifoQueue`, :class:`StrictQueue`), where ``dispatch(now)`` is that worker's pop.
"""

from __future__ import annotations

import abc
import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue._spec import check_options
from prioqueue.errors import ConfigError, InvalidState, UnknownJob
from prioqueue.sim.workers import WorkerSpec, fleet_of

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._spec import SubmitOptions

__all__ = [
    "MAX_ATTEMPTS",
    "FifoQueue",
    "FleetFifo",
    "FleetStrict",
    "LeaseRule",
    "StrictQueue",
    "WarmFirst",
    "build_pull_baseline",
]

MAX_ATTEMPTS = 3
"""Grants a job gets before a lease that runs out fails it (the dispatcher's policies too)."""

#: ``(job, worker name) -> lease seconds``.
LeaseRule = Callable[[Any, str], float]


@attrs.define(eq=False)
class _Job:
    """A baseline's job (``worker`` and ``deadline`` while a worker holds it)."""

    id: str
    member: str
    priority: int
    model: str | None
    arrival: float
    seq: int
    attempt: int = 0
    queued: bool = True
    worker: str | None = None
    deadline: float | None = None


class _Grant:
    __slots__ = ("attempt", "job", "worker")

    def __init__(self, job: _Job, attempt: int, worker: str | None = None) -> None:
        self.job = job
        self.attempt = attempt
        self.worker = worker


class _Expired:
    __slots__ = ("job", "requeued")

    def __init__(self, job: _Job, requeued: bool) -> None:
        self.job = job
        self.requeued = requeued


class _PullBaseline(abc.ABC):
    """Jobs by id, one heap per model, the workers' held counts and the leases.

    Subclasses give the order (``_key``) and may prefer a model (``_prefer``).

    Args:
        workers: The fleet.
        lease_for: ``(job, worker name) -> seconds`` of lease, or None for no leases.
    """

    def __init__(self, workers: Sequence[WorkerSpec], lease_for: LeaseRule | None = None) -> None:
        if not workers:
            raise ConfigError("a fleet needs at least one worker")
        self._jobs: dict[str, _Job] = {}
        self._queued = 0
        self._seq = 0
        self._serves = {w.name: w.models for w in workers}
        self._slots = {w.name: w.slots for w in workers}
        self._held = {w.name: 0 for w in workers}
        self._resident: dict[str, str | None] = {w.name: w.resident for w in workers}
        self._only = workers[0].name if len(workers) == 1 else None
        self._lease_for = lease_for
        self._heaps: dict[str | None, list[tuple[tuple[int, int], int, _Job]]] = {}
        self._deadlines: list[tuple[float, int, _Job]] = []
        self._pushes = 0

    def __len__(self) -> int:
        return self._queued

    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[SubmitOptions]
    ) -> object:
        """Queue a job (``priority`` must already be a number). O(log n).

        A baseline reads ``priority`` and ``model`` of the options and ignores the rest.

        Raises:
            TypeError: ``priority`` is not an int, or an option ``SubmitOptions`` does not name.
        """
        check_options(options)
        priority = options.get("priority", 0)
        if not isinstance(priority, int):
            raise TypeError(f"baselines take numeric priorities, got {priority!r}")
        job = _Job(job_id, member, priority, options.get("model"), now, self._seq)
        self._seq += 1
        self._jobs[job_id] = job
        self._queued += 1
        self._push(job, requeue=False)
        return job

    def _lease_ran_out(self, job: _Job) -> _Expired:
        """Requeue a job whose lease ran out, or fail it after ``MAX_ATTEMPTS`` grants."""
        if job.attempt >= MAX_ATTEMPTS:
            del self._jobs[job.id]
            return _Expired(job, False)
        job.queued = True
        self._queued += 1
        self._push(job, requeue=True)
        return _Expired(job, True)

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


def _one_worker(lease_for: Callable[[Any], float] | None) -> LeaseRule | None:
    return None if lease_for is None else (lambda job, _name: lease_for(job))


class FifoQueue(FleetFifo):
    """Arrival order on one GPU, whatever the priority: llama-swap today (a fleet of one).

    Args:
        lease_for: Seconds of lease for a granted job, or None for no leases.
    """

    def __init__(self, lease_for: Callable[[Any], float] | None = None) -> None:
        super().__init__(fleet_of(1), _one_worker(lease_for))


class StrictQueue(FleetStrict):
    """Highest priority level first on one GPU, FIFO inside a level (a fleet of one).

    Args:
        lease_for: Seconds of lease for a granted job, or None for no leases.
    """

    def __init__(self, lease_for: Callable[[Any], float] | None = None) -> None:
        super().__init__(fleet_of(1), _one_worker(lease_for))
