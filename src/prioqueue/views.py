"""Read-only views of a dispatcher's state: what a dashboard or a broker reads, as copies.

A dispatcher (``SizeOneDispatcher``, ``FleetDispatcher``) keeps its state private; these
frozen, slotted attrs classes (and one NamedTuple, ``WorkerLoad``) are what its view methods
hand out (``recent_grants``, ``member_lanes``, ``worker_views``, ``worker_load``,
``group_finishes``). Like :mod:`prioqueue.records`, none refers back to the dispatcher, and
each is safe to keep after it has moved on (docs/design/state.md, "Previews and views").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import attrs

if TYPE_CHECKING:
    from prioqueue.records import Grant, Job, WorkerInfo
    from prioqueue.scoring import ScoreBreakdown

__all__ = ["GrantRecord", "GroupFinish", "GroupStatus", "LaneView", "WorkerLoad", "WorkerView"]


@attrs.frozen
class GrantRecord:
    """One grant the dispatcher remembers (its bounded history, which ``explain`` reads).

    Attributes:
        at: When it was granted.
        job_id: The job granted.
        member: Its member.
        priority: Its level.
        model: The model it ran on (a job that accepts several: the one chosen), or None.
        resident: The model resident on the worker before the grant, or None.
        worker: The worker's name (a fleet's grants), or None.
        score: The job's score terms at the grant.
        rule: The rule that chose it instead of the score's winner (``"crossing deferred"``,
            ``"least served"``, ``"overdue"``), or None (the ranking).
    """

    at: float
    job_id: str
    member: str
    priority: int
    model: str | None
    resident: str | None
    worker: str | None
    score: ScoreBreakdown
    rule: str | None


@attrs.frozen
class LaneView:
    """One member's lane at one level, with a job queued or held.

    Attributes:
        member: The lane's member.
        level: Its priority level.
        queued: Its queued jobs.
        running: Its jobs held by workers.
        heads: Its oldest queued jobs, in lane order (at most the ``heads`` asked for).
    """

    member: str
    level: int
    queued: int
    running: int
    heads: tuple[Job, ...]


@attrs.frozen
class WorkerView:
    """One worker and the jobs it holds.

    Attributes:
        info: The worker as it stands (``FleetDispatcher.worker``'s record).
        jobs: The jobs it holds as submitted (``job(id)``), in grant order: the first runs,
            the others are prefetched.
        grants: Their current grants, in the same order (a job that accepts several models
            is granted with the one chosen).
    """

    info: WorkerInfo
    jobs: tuple[Job, ...]
    grants: tuple[Grant, ...]


@attrs.frozen
class GroupFinish:
    """A group's predicted finish from one bounded dry run (``group_finishes``).

    Attributes:
        finish: When its last queued or running job is predicted to finish, or None (a
            runtime on the way is unknown, or ``beyond``).
        beyond: Some of its queued jobs lie past the dry run's ``limit``.
    """

    finish: float | None
    beyond: bool


class WorkerLoad(NamedTuple):
    """A worker's liveness and load, the few fields a long poll reads (``worker_load``).

    An immutable tuple, cheap to build (a long poll reads it at every try), unlike the full
    ``WorkerInfo``.

    Attributes:
        last_seen: The latest ``now`` of its join, pop, heartbeat or completion.
        timed_out: Whether ``worker_timeout`` passed without a word from it.
        held: How many jobs it holds.
        slots: How many it may hold.
    """

    last_seen: float
    timed_out: bool
    held: int
    slots: int


@attrs.frozen
class GroupStatus:
    """How far a group (a film, a batch) has got: ``group_status(group, now=...)``.

    Attributes:
        group: The group's label.
        now: The time of the status.
        queued: Jobs waiting now.
        running: Jobs holding a resource now.
        done: Jobs completed.
        failed: Jobs that failed for good (last lease expired, or reported by ``fail``).
        cancelled: Jobs cancelled, queued or running (``cancel``, ``cancel_group``).
        gpu_seconds: Seconds the group's jobs held a resource: every finished attempt,
            expired leases included (the running attempt is not counted until it ends).
        mean_runtime: Mean runtime of the ``done`` jobs in seconds, None before the first.
        forecast_finish: When the group's last queued (or running) job is predicted to
            finish, from the same dry run as ``forecast()``: the current load, no new
            arrivals, runtimes from estimates or recent means (a fleet as its capacity of
            identical workers sharing the work). None when nothing of the group is queued or
            running, or when a runtime on the way is unknown.
        members: The members that submitted jobs in the group, sorted (a service shows and
            cancels a group only for its own members).
    """

    group: str
    now: float
    queued: int
    running: int
    done: int
    failed: int
    cancelled: int
    gpu_seconds: float
    mean_runtime: float | None
    forecast_finish: float | None
    members: tuple[str, ...] = ()

    @property
    def submitted(self) -> int:
        """Jobs ever submitted in the group (each counted in exactly one state)."""
        return self.queued + self.running + self.done + self.failed + self.cancelled

    @property
    def active(self) -> bool:
        """True while a job of the group is queued or running."""
        return self.queued + self.running > 0

    @property
    def remaining(self) -> float | None:
        """Seconds from ``now`` to ``forecast_finish`` (never negative), or None."""
        if self.forecast_finish is None:
            return None
        return max(0.0, self.forecast_finish - self.now)

    def __str__(self) -> str:
        finish = (
            "unknown"
            if self.forecast_finish is None
            else f"finishes in ~{self.remaining or 0.0:.0f} s"
        )
        mean = "-" if self.mean_runtime is None else f"{self.mean_runtime:.0f} s"
        return (
            f"group {self.group}: {self.done} done, {self.running} running, "
            f"{self.queued} queued, {self.failed} failed, {self.cancelled} cancelled; "
            f"{self.gpu_seconds:.0f} GPU-s, mean runtime {mean}; "
            f"{finish if self.active else 'idle'}"
        )
