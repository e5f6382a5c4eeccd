"""``ReferenceDispatcher``: the reference fleet of one worker behind the size-one API (private).

See ``prioqueue.testing`` for the theory of operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from prioqueue._readonly import ReadOnly
from prioqueue._spec import check_options
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Completed, Expired, Grant, Job, JobState, Stats, Ticket
from prioqueue.scoring import Scorer
from prioqueue.testing._options import SizeOneOptions
from prioqueue.testing.reference_fleet import (
    ReferenceFleet,
    add_fixed_worker,
    keep_affinity_unpriced,
    set_resident,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._spec import SubmitOptions

__all__ = ["ReferenceDispatcher"]


class ReferenceDispatcher:
    """A brute-force model of ``SizeOneDispatcher``: a :class:`ReferenceFleet` of one worker.

    Same calls, same answers as ``SizeOneDispatcher``; every decision is the fleet model's
    (``docs/design/fleet.md``, "SizeOneDispatcher = a fleet of one worker").

    Args:
        scorer: The scoring weights (default ``Scorer()``).
        policy: Resolves priority numbers and aliases (default ``PriorityPolicy()``).
        charge: ``"runtime"``, ``"estimate"``, a constant number of seconds, or a callable
            ``(job, runtime) -> seconds`` (also called at the grant with the expected runtime).
        lease_for: ``job -> seconds`` for each grant's lease, or None for no leases.
        max_queued: The most queued jobs, or None.
        max_queued_per_member: The most queued jobs of one member, or None.
        max_attempts: Grants a job gets before an expired lease fails it.
        fair_share: False makes every job its own lane with ``s = arrival`` and no charge.
        track_reorders: False leaves the reorder counts at zero.
        crossing_share: The share of GPU time crossings may take (1: never deferred).
        wait_buckets: Upper bounds of the grant-wait histogram (``inf`` is appended).
        budgets: ``{level: LevelBudget}`` (docs/design/lifecycle.md).
        backoff: The retry delays of ``fail(retry=True)`` for jobs without their own.
        load_seconds: Cold-load seconds per model (the warm crossing's price; the affinity
            stays the scorer's).

    Attributes:
        fleet: The one-worker fleet behind it (read-only, as the two below).
        scorer: The scorer.
        policy: The priority policy.

    Raises:
        TypeError: An option ``SizeOneDispatcher`` does not take.
    """

    _WORKER = "default"

    fleet = ReadOnly[ReferenceFleet]("_fleet", "The one-worker fleet behind it.")
    scorer = ReadOnly[Scorer]("_fleet.scorer", "The scorer.")
    policy = ReadOnly[PriorityPolicy]("_fleet.policy", "The priority policy.")

    def __init__(self, scorer: Scorer | None = None, **options: Unpack[SizeOneOptions]) -> None:
        check_options(
            options,
            call="ReferenceDispatcher()",
            named="scorer",
            allowed=SizeOneOptions.__annotations__,
        )
        self._fleet = ReferenceFleet(scorer, **options)
        add_fixed_worker(self._fleet, self._WORKER)
        keep_affinity_unpriced(self._fleet)

    @property
    def resident_model(self) -> str | None:
        """The model believed loaded (the worker's resident model), or None."""
        return self._fleet.worker(self._WORKER).resident

    @property
    def running(self) -> Grant | None:
        """The grant of the job holding the resource, or None."""
        held = self._fleet.held
        return attrs.evolve(held[0], worker=None) if held else None

    def __len__(self) -> int:
        return len(self._fleet)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._fleet

    def job(self, job_id: str) -> Job:
        """Return a queued or running job (``UnknownJob`` otherwise)."""
        return self._fleet.job(job_id)

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"`` (``UnknownJob`` otherwise)."""
        return self._fleet.state(job_id)

    def next_deadline(self) -> float | None:
        """Return the running job's lease deadline, or None."""
        return self._fleet.next_deadline()

    def set_resident_model(self, model: str | None) -> None:
        """Say which model is loaded (None: nothing is)."""
        set_resident(self._fleet, self._WORKER, model)

    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[SubmitOptions]
    ) -> Ticket:
        """Queue a job (the options and errors of :meth:`ReferenceFleet.submit`)."""
        return self._fleet.submit(job_id, member=member, now=now, **options)

    def fail(self, job_id: str, *, now: float, retry: bool = False) -> Job:
        """Fail a job, or retry the running one (see :meth:`ReferenceFleet.fail`)."""
        return self._fleet.fail(job_id, now=now, retry=retry)

    def not_before(self, job_id: str) -> float | None:
        """When a delayed job becomes eligible, else None (``UnknownJob`` if unknown)."""
        return self._fleet.not_before(job_id)

    def dispatch(self, now: float) -> Grant | None:
        """Grant the best-scoring queued job when nothing runs: the one worker's pop."""
        grant = self._fleet.pop(self._WORKER, now=now)
        return None if grant is None else attrs.evolve(grant, worker=None)

    def complete(self, job_id: str, *, now: float, runtime: float | None = None) -> Completed:
        """Finish the running job (see :meth:`ReferenceFleet.complete`)."""
        return self._fleet.complete(job_id, now=now, runtime=runtime)

    def cancel(self, job_id: str, *, now: float) -> Job:
        """Drop a queued job or stop the running one (see :meth:`ReferenceFleet.cancel`)."""
        return self._fleet.cancel(job_id, now=now)

    def expire(self, now: float) -> list[Expired]:
        """Take the resource back from a job past its lease (at most one record)."""
        return [attrs.evolve(e, worker=None) for e in self._fleet.expire(now)]

    def stats(self, *, now: float) -> Stats:
        """Return the statistics (no workers listed, as ``SizeOneDispatcher``'s)."""
        return attrs.evolve(self._fleet.stats(now=now), workers=())

    def lane_jobs(self, member: str, level: int) -> tuple[Job, ...]:
        """Return the queued jobs of a lane in lane order (the head first)."""
        return self._fleet.lane_jobs(member, level)

    def lane_start(self, member: str, level: int) -> float:
        """Return the virtual start ``s`` of a lane (``-inf`` for a lane never seen)."""
        return self._fleet.lane_start(member, level)
