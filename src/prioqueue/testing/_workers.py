"""The worker table of :class:`~prioqueue.testing.ReferenceFleet` (private).

``ReferenceWorkers`` owns every joined worker, in join order, and what each holds: joining,
heartbeats, leaving, timeouts, the capacity ``N = max(1, live workers)`` and the held jobs,
found by scanning (``docs/design/fleet.md``). Which job a worker gets is ``_rules``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from prioqueue._worker_info import worker_info
from prioqueue.capabilities import Capabilities
from prioqueue.errors import UnknownWorker
from prioqueue.records import Job, WorkerInfo
from prioqueue.testing._records import CauseName, Held, Worker

__all__: list[str] = []  # private module

#: ``heartbeat``'s default: the resident model is left as it is.
UNCHANGED: Any = object()


class ReferenceWorkers:
    """The joined workers and the jobs they hold.

    Args:
        worker_timeout: Seconds of silence after which a worker's jobs are taken back, or None.
        warm_hold: Placement's warm hold in seconds (0: off), for ``next_hold_end``.
    """

    def __init__(self, worker_timeout: float | None, warm_hold: float) -> None:
        self._timeout = worker_timeout
        self._warm_hold = warm_hold
        self._workers: dict[str, Worker] = {}

    # -- reading -----------------------------------------------------------------------------

    def get(self, name: str) -> Worker:
        """A known worker (``UnknownWorker``: never joined, or has left)."""
        worker = self._workers.get(name)
        if worker is None:
            raise UnknownWorker(f"unknown worker {name!r}")
        return worker

    def all(self) -> list[Worker]:
        """Every known worker (timed-out ones included), in join order."""
        return list(self._workers.values())

    def first(self) -> Worker | None:
        """The first-joined worker, or None."""
        return next(iter(self._workers.values()), None)

    def info(self, worker: Worker) -> WorkerInfo:
        """A worker's public record."""
        return worker_info(worker, tuple(held.job.id for held in worker.held))

    def infos(self) -> list[WorkerInfo]:
        """Every known worker's info (timed-out ones included), sorted by name."""
        return [self.info(self._workers[name]) for name in sorted(self._workers)]

    @property
    def capacity(self) -> int:
        """``N = max(1, live workers)``."""
        return max(1, sum(1 for w in self._workers.values() if not w.timed_out))

    def held(self) -> list[Held]:
        """Every held job, by grant time (then ``seq``)."""
        held = [h for worker in self._workers.values() for h in worker.held]
        return sorted(held, key=lambda h: (h.grant.granted_at, h.job.seq))

    def held_by_id(self, job_id: str) -> Held | None:
        """The held job ``job_id``, or None."""
        return next((h for h in self.held() if h.job.id == job_id), None)

    def next_deadline(self) -> float | None:
        """The earliest held lease deadline or live worker's timeout, or None."""
        times = [h.grant.lease.deadline for h in self.held() if h.grant.lease is not None]
        if self._timeout is not None:
            times += [
                w.last_seen + self._timeout for w in self._workers.values() if not w.timed_out
            ]
        return min(times, default=None)

    def next_hold_end(self, latest: float) -> float | None:
        """When a warm hold kept for a busy worker lapses after ``latest`` (None: none)."""
        if not self._warm_hold > 0:
            return None
        ends = [
            min(h.grant.granted_at + h.expected_runtime for h in worker.held) + self._warm_hold
            for worker in self._workers.values()
            if not worker.timed_out
            and worker.resident is not None
            and worker.serves(worker.resident)
            and worker.held
            and len(worker.held) >= worker.slots
        ]
        later = [end for end in ends if end > latest]
        return min(later) if later else None

    # -- changing ----------------------------------------------------------------------------

    def join(
        self,
        name: str,
        now: float,
        *,
        models: Iterable[str] | None,
        resident: str | None,
        slots: int,
        slow: bool,
        accepts: Callable[[Job], bool] | None,
        capabilities: Capabilities | None,
    ) -> WorkerInfo:
        """Add a worker, or update every field of a known one (``resident=None`` keeps it).

        Raises:
            ValueError: A bad argument.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a worker name must be a non-empty str, got {name!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        if not isinstance(slow, bool):
            raise ValueError(f"slow must be a bool, got {slow!r}")
        served = None if models is None else frozenset(models)
        if served is not None and not all(isinstance(m, str) and m for m in served):
            raise ValueError(f"models must be non-empty strs, got {models!r}")
        if accepts is not None and not callable(accepts):
            raise ValueError(f"accepts must be callable or None, got {accepts!r}")
        worker = Worker(
            name, served, resident, slots, bool(slow), accepts, now, capabilities=capabilities
        )
        known = self._workers.get(name)
        if known is not None:
            worker.succeed(known)
        self._workers[name] = worker
        return self.info(worker)

    def heartbeat(self, name: str, now: float, resident: str | None) -> WorkerInfo:
        """Mark a worker seen (reviving it); set its resident model unless ``UNCHANGED``."""
        worker = self.get(name)
        worker.revive(now)
        if resident is not UNCHANGED:
            worker.load(resident)
        return self.info(worker)

    def remove(self, name: str) -> None:
        """Forget a worker (its held jobs were taken back)."""
        del self._workers[name]

    def add_fixed(self, name: str) -> None:
        """Add a worker with the defaults (one slot, every model) outside time."""
        self._workers[name] = Worker(name, None, None, 1, False, None, -math.inf)

    def time_out(self, now: float, taken: set[int]) -> list[tuple[Held, float, CauseName]]:
        """Time out every live worker silent ``worker_timeout`` by ``now``; their jobs are due.

        Returns ``(held, deadline, "worker_timeout")`` for each job they hold that is not in
        ``taken`` (``id`` s of jobs already due), the deadline its lease's or the silence's end.
        """
        due: list[tuple[Held, float, CauseName]] = []
        if self._timeout is None:
            return due
        for worker in self._workers.values():
            silent_since = worker.last_seen + self._timeout
            if worker.timed_out or silent_since > now:
                continue
            worker.time_out()
            for held in worker.held:
                if id(held) not in taken:
                    lease = held.grant.lease
                    deadline = silent_since if lease is None else lease.deadline
                    due.append((held, deadline, "worker_timeout"))
        return due
