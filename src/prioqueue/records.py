"""The values the dispatcher hands out: jobs, grants, explanations and statistics.

Every class here is a frozen, slotted attrs class: safe to share, to hash where it makes sense,
and to keep after the dispatcher has moved on. None of them refers back to the dispatcher.

It is one concern, past the 500-line gauge on purpose: the public value types, each a few
fields and their docs, read together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from prioqueue.capabilities import Capabilities, Needs
    from prioqueue.errors import QueueFull
    from prioqueue.lease import Lease
    from prioqueue.lifecycle import Backoff
    from prioqueue.scoring import ScoreBreakdown

__all__ = [
    "REORDER_CAUSES",
    "AheadJob",
    "Completed",
    "Expired",
    "Explanation",
    "Grant",
    "Job",
    "JobState",
    "LevelStats",
    "MemberStats",
    "Overtake",
    "OvertakeCause",
    "Refusal",
    "Reorders",
    "Stats",
    "Ticket",
    "WorkerInfo",
]

JobState = Literal["queued", "running"]
OvertakeCause = Literal[
    "priority",
    "tier",
    "affinity",
    "fair share",
    "crossing deferred",
    "least served",
    "overdue",
    "eligibility",
]

#: The terms whose effect on the dispatch order `Stats` counts, in report order, and the
#: crossings deferred by the crossing share (``deferred_crossings``).
REORDER_CAUSES: tuple[str, ...] = (
    "aging",
    "affinity",
    "tier",
    "fair_share",
    "deferred_crossings",
)


@attrs.frozen
class Job:
    """One unit of work waiting for (or holding) the resource.

    Attributes:
        id: The caller's job id, unique among the jobs the dispatcher knows.
        member: Who the job belongs to; fair share is per member inside a level.
        priority: The resolved priority number; it is the job's band (level).
        tier: The member's tier name (``"free"``, ``"pro"``, ``"max"`` by default).
        tier_bonus: The tier's bonus in score points, looked up at submit time.
        model: The model the job needs loaded, or None when it does not care.
        estimate: The caller's runtime estimate in seconds, or None.
        arrival: The ``now`` the job was submitted at.
        seq: The dispatcher's submission counter: the final tie-breaker (FIFO).
        payload: An opaque value for the caller (e.g. the image request a lease is sized
            from). It must be JSON-serialisable for ``snapshot()``.
        deadline: When the job expires if it is still queued (``ttl`` after it became
            eligible), or None (docs/design/lifecycle.md).
        not_before: The delay its submit asked for (its ``arrival`` is then this time), or
            None.
        max_attempts: Its own grant budget, or None for the dispatcher's.
        backoff: Its own retry backoff, or None for the dispatcher's.
        needs: What a worker must offer to run it (``prioqueue.capabilities.Needs``: its
            accepted models, pixels, steps, features...), or None: any worker that serves
            ``model`` may. A grant of a job that accepts several models carries the job with
            ``model`` set to the one the grant chose.
    """

    id: str
    member: str
    priority: int
    tier: str
    tier_bonus: float
    model: str | None
    estimate: float | None
    arrival: float
    seq: int
    payload: Any = None
    deadline: float | None = None
    not_before: float | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    needs: Needs | None = None

    def runs_on(self, model: str | None) -> bool:
        """Whether it runs on ``model``: its model, or one it accepts (``needs.models``). O(k)."""
        if self.model is not None or self.needs is None or not self.needs.models:
            return self.model == model
        return model in self.needs.models


@attrs.frozen
class Ticket:
    """What ``submit`` returns: the accepted job and the queue depth after it."""

    job: Job
    queued: int


@attrs.frozen
class Grant:
    """A dispatch decision: the job that runs now.

    Attributes:
        job: The granted job.
        score: The winner's score at dispatch time, broken into its four terms.
        lease: The lease when the dispatcher has a ``lease_for`` callable, else None.
        granted_at: The ``now`` of the dispatch.
        attempt: 1 for the first grant, 2 after one expired lease, and so on.
        waited: Seconds between the job's arrival and this grant.
        swap: True when the job's model differs from the model that was resident (on the
            worker that got it).
        worker: The worker that got the job (``FleetDispatcher``), or None
            (``SizeOneDispatcher``).
    """

    job: Job
    score: ScoreBreakdown
    lease: Lease | None
    granted_at: float
    attempt: int
    waited: float
    swap: bool
    worker: str | None = None


@attrs.frozen
class Completed:
    """What ``complete`` (and ``cancel`` of a running job) reports.

    Attributes:
        job: The finished job.
        runtime: Seconds the job ran (reported, or measured from its grant).
        charge: The charge model's value in seconds: added to its lane's virtual start when
            fair share is on (before the ``now`` clamp), and to the member's
            ``MemberStats.gpu_seconds`` in any case.
    """

    job: Job
    runtime: float
    charge: float


@attrs.frozen
class Expired:
    """A job taken back (its lease ran out, or its worker fell silent), or one whose ttl ran out.

    Attributes:
        job: The job.
        attempt: The attempt that expired (1-based).
        deadline: The lease deadline that passed (for a silent worker's job without a lease,
            the worker's ``last_seen + worker_timeout``).
        requeued: True when the job went back to the head of its lane; False when it used its
            last attempt and is reported as failed (it is no longer in the dispatcher).
        worker: The worker that held it (``FleetDispatcher``), or None.
        cause: ``"lease"`` (its lease ran out), ``"worker_timeout"`` (its worker was silent)
            or ``"ttl"`` (it was still queued at its ``Job.deadline``: it left the dispatcher
            as expired, ``requeued`` is False and ``worker`` None).
    """

    job: Job
    attempt: int
    deadline: float
    requeued: bool
    worker: str | None = None
    cause: Literal["lease", "worker_timeout", "ttl"] = "lease"


@attrs.frozen
class AheadJob:
    """A job predicted to run before the explained one."""

    job_id: str
    member: str
    priority: int
    score: float
    estimated_start: float | None


@attrs.frozen
class Overtake:
    """A dispatch that served a later arrival before the explained job.

    Attributes:
        job_id: The job that was served.
        member: Its member.
        priority: Its priority level.
        at: When it was dispatched.
        cause: The term that contributed most to its lead over the explained job at that
            moment. When the explained job had the *higher* score (a negative margin), the
            rule that decided instead (issue 26): ``"crossing deferred"`` (the job would
            have crossed a higher level whose share crossings had used up; see
            ``crossing_share``), ``"least served"`` (a crossing went to its level's
            least-served lane), ``"overdue"`` (that level's oldest job was overdue), or
            ``"eligibility"`` (the job could not go to that worker: its models, filter,
            member cap or warm hold).
        margin: Its score minus the explained job's score at that moment: > 0 when a term
            decided, 0 for an exact tie, < 0 when a rule decided (``cause`` names it).
    """

    job_id: str
    member: str
    priority: int
    at: float
    cause: OvertakeCause
    margin: float


@attrs.frozen
class Explanation:
    """Why a job is where it is: ``sprio`` for one job.

    Attributes:
        job: The job.
        state: ``"queued"`` or ``"running"``.
        now: The time of the explanation.
        waited: Seconds since arrival (until the grant, for a running job).
        score: The job's current score in four terms (at its grant, for a running job).
        lane_start: Its lane's virtual start ``s``.
        position: 1-based position in the predicted dispatch order (0 when running).
        ahead: The queued jobs predicted to run before it, in order (the running job, whose
            remaining time counts towards ``estimated_start``, is not listed).
        estimated_start: Predicted start time, or None when no runtime is known yet.
        overtaken_by: Dispatches of later arrivals while it waited, oldest first (from the
            dispatcher's bounded history; at most ``overtakes_limit`` of them, the latest).
        ahead_complete: False when ``ahead_limit`` cut the forecast before the job: ``ahead``
            then lists only the first jobs and ``position`` is a lower bound.
        not_before: For a delayed job (a delayed submit, or a retry waiting out its backoff),
            when it becomes eligible; None otherwise. A delayed job has ``position`` 0 and
            nothing ahead.
        deadline: When it expires if still queued (its ttl), or None.
        attempt: The job's current attempt (1-based; a queued retry counts the next one).
        max_attempts: The grants it may get (its own, else the dispatcher's).
        unfit: For a queued job, the live workers that may not run it and the first cause
            (``"model"``, ``"max_pixels"``, ``"lora"``...: ``prioqueue.capabilities``), by
            worker name; the ``FleetDispatcher`` skips it on their pops.
    """

    job: Job
    state: JobState
    now: float
    waited: float
    score: ScoreBreakdown
    lane_start: float
    position: int
    ahead: tuple[AheadJob, ...]
    estimated_start: float | None
    overtaken_by: tuple[Overtake, ...]
    ahead_complete: bool = True
    not_before: float | None = None
    deadline: float | None = None
    attempt: int = 1
    max_attempts: int | None = None
    unfit: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def estimated_wait(self) -> float | None:
        """Seconds from ``now`` until the predicted start (0 when running), or None."""
        if self.state == "running":
            return 0.0
        if self.estimated_start is None:
            return None
        return max(0.0, self.estimated_start - self.now)

    def __str__(self) -> str:
        lines = [
            f"job {self.job.id} (member {self.job.member}, priority {self.job.priority}, "
            f"tier {self.job.tier}, model {self.job.model}): {self.state}, "
            f"waited {self.waited:.1f} s",
            f"  score: {self.score}",
        ]
        if self.not_before is not None:
            lines.append(f"  delayed until {self.not_before:.1f} (attempt {self.attempt})")
        if self.deadline is not None:
            lines.append(f"  expires at {self.deadline:.1f} if still queued")
        if self.state == "queued" and self.not_before is None:
            start = (
                "unknown"
                if self.estimated_start is None
                else f"in ~{self.estimated_wait or 0.0:.0f} s"
            )
            lines.append(f"  position {self.position}, {len(self.ahead)} ahead, start {start}")
            for ahead in self.ahead[:10]:
                lines.append(
                    f"    ahead: {ahead.job_id} (member {ahead.member}, "
                    f"priority {ahead.priority}, score {ahead.score:.2f})"
                )
            if len(self.ahead) > 10:
                lines.append(f"    ... and {len(self.ahead) - 10} more")
        if self.unfit:
            skipped = ", ".join(f"{name} ({cause})" for name, cause in sorted(self.unfit.items()))
            lines.append(f"  does not fit: {skipped}")
        for overtake in self.overtaken_by:
            lines.append(
                f"  overtaken at {overtake.at:.1f} by {overtake.job_id} "
                f"(member {overtake.member}, priority {overtake.priority}): "
                + (
                    f"{overtake.cause}, by {overtake.margin:.2f} points"
                    if overtake.margin >= 0
                    else f"{overtake.cause} (the job had out-scored it by "
                    f"{-overtake.margin:.2f} points)"
                )
            )
        return "\n".join(lines)


@attrs.frozen
class Reorders:
    """Dispatches whose winner would have been another job without one term of the score.

    Attributes:
        aging: Grants at this level that aging changed.
        affinity: Grants at this level that swap affinity changed.
        tier: Grants at this level that the tier bonus changed.
        fair_share: Grants at this level that fair share (lane virtual starts) changed.
        deferred_crossings: Grants that a job of this level would have won by crossing a
            higher level, deferred because crossings had used their share of GPU time
            (``crossing_share``); counted on every grant, even with ``track_reorders`` off.
    """

    aging: int = 0
    affinity: int = 0
    tier: int = 0
    fair_share: int = 0
    deferred_crossings: int = 0

    def as_dict(self) -> dict[str, int]:
        """Return the counts keyed by cause name (see ``REORDER_CAUSES``)."""
        return {cause: getattr(self, cause) for cause in REORDER_CAUSES}


@attrs.frozen
class LevelStats:
    """Statistics of one priority level.

    Attributes:
        level: The priority number.
        queued: Jobs waiting now.
        oldest_wait: Seconds the oldest waiting job has waited (0 when none waits).
        mean_wait: Mean seconds waited so far by the waiting jobs (0 when none waits).
        dispatched: Grants so far (a requeued job counts once per grant).
        total_wait: Sum of the waits (arrival to grant) of those grants, in seconds.
        reorders: Dispatches at this level whose winner a term of the score changed.
        wait_buckets: Cumulative histogram of grant waits: ``(upper bound, count)`` pairs,
            the last bound is ``inf``.
        ttl_expired: Jobs of the level that expired queued (their ttl ran out).
        refused: Submits the level's ``LevelBudget`` refused (``max_queued`` or ``max_wait``).
        delayed: Jobs of the level delayed now (``not_before`` or a retry's backoff); not in
            ``queued``.
    """

    level: int
    queued: int
    oldest_wait: float
    mean_wait: float
    dispatched: int
    total_wait: float
    reorders: Reorders
    wait_buckets: tuple[tuple[float, int], ...]
    ttl_expired: int = 0
    refused: int = 0
    delayed: int = 0


@attrs.frozen
class MemberStats:
    """Statistics of one member, over all levels.

    Attributes:
        member: The member.
        queued: Jobs waiting now.
        running: Jobs that workers hold now (running or prefetched); listed last.
        dispatched: Grants so far.
        completed: Jobs completed so far.
        gpu_seconds: Sum of the charges of the member's finished jobs (completed, or cancelled
            while running): GPU-seconds with the default ``"runtime"`` charge model, the
            charge model's unit otherwise.
    """

    member: str
    queued: int
    dispatched: int
    completed: int
    gpu_seconds: float
    running: int = 0


@attrs.frozen
class Stats:
    """A consistent picture of the dispatcher at one moment (``stats(now=...)``).

    Attributes:
        now: The time of the picture.
        levels: Per priority level, highest first (levels ever used are kept).
        members: Per member (members ever seen are kept).
        running: The job holding the resource, or None.
        resident_model: The model believed loaded, or None.
        queued: Jobs waiting now.
        dispatched: Grants so far.
        completed: Jobs completed so far.
        cancelled: Jobs cancelled so far (queued or running).
        expired: Leases that ran out so far.
        failed: Jobs dropped after their last attempt (each reported by ``expire``), and
            jobs reported failed by ``fail``.
        swaps: Grants whose model differed from the resident model (cold loads).
        held: Every job that workers hold now, in grant order (``running`` is the first).
        workers: The fleet's workers, by name (empty for ``SizeOneDispatcher``).
        groups: Groups with a job queued or running (a film in progress is one).
        ttl_expired: Jobs that expired queued, their ttl run out (not in ``expired``, which
            counts leases).
        refused: Submits refused by a level's budget (``max_queued`` or ``max_wait``).
        retried: Failed attempts requeued by ``fail(retry=True)``.
        delayed: Jobs delayed now (counted in ``queued`` too).
    """

    now: float
    levels: Mapping[int, LevelStats]
    members: Mapping[str, MemberStats]
    running: Job | None
    resident_model: str | None
    queued: int
    dispatched: int
    completed: int
    cancelled: int
    expired: int
    failed: int
    swaps: int
    held: tuple[Job, ...] = ()
    workers: tuple[WorkerInfo, ...] = ()
    groups: int = 0
    ttl_expired: int = 0
    refused: int = 0
    retried: int = 0
    delayed: int = 0


@attrs.frozen
class WorkerInfo:
    """One worker of a :class:`~prioqueue.fleet.FleetDispatcher`, as it stands.

    Attributes:
        name: The worker's name.
        models: The models it serves (None: every model).
        resident: The model believed loaded on it, or None.
        slots: How many jobs it may hold at once (1: run one; 2: run one and prefetch one).
        slow: Whether it is marked extra slow (its leases are longer).
        held: The ids of the jobs it holds, in grant order.
        last_seen: The latest ``now`` of its join, pop, heartbeat or completion.
        timed_out: True when ``worker_timeout`` passed without a word from it (its jobs were
            taken back; its next pop or heartbeat revives it).
        filtered: Whether it has an ``accepts`` filter.
        capabilities: What it declared it can run (``prioqueue.capabilities``), or None.
    """

    name: str
    models: frozenset[str] | None
    resident: str | None
    slots: int
    slow: bool
    held: tuple[str, ...]
    last_seen: float
    timed_out: bool
    filtered: bool
    capabilities: Capabilities | None = None


@attrs.frozen
class Refusal:
    """Why ``admit`` refuses a batch: its first job a submit would refuse, and how.

    Attributes:
        index: The position of that job in the batch (the jobs before it would be queued,
            one by one, and take the room that refuses it).
        error: What ``submit`` would raise for it: a ``QueueFull`` (``scope`` ``"queue"``,
            ``"member"`` or ``"level"``) or an ``Overloaded`` (``max_wait``).
    """

    index: int
    error: QueueFull
