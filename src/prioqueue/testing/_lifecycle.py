"""The job lifecycle in the brute-force reference model (private; see ``_fleet``).

``ReferenceLifecycle`` owns the delayed jobs, the lapsed jobs not yet reported, the levels'
budgets and the default backoff; it makes a submit's job (its deadline and ``not_before``)
and admits it. Written from docs/design/lifecycle.md
alone, by brute force: no heap of timers. At the start of every call of the fleet that takes
``now``, ``advance`` repeatedly looks at every queued
and delayed job for the earliest due event (a deadline before a release at the same time,
then the smaller ``seq``), applies it at its own time, and starts over until nothing is due:

* a **lapse** (a queued or delayed job at or past its deadline) removes the job and buffers
  its ``Expired(cause="ttl")`` for the next ``expire``;
* a **release** (a delayed job at its ``not_before``) queues the job exactly as a submit at
  that time would (tail of its lane, an idle lane lifted), its ``queued_at`` the release time.

``fail(retry=True)`` of a held job with attempts left finishes it as a failed run would (its
lane charged for the time it was held), then delays it by its backoff (or queues it at once):
the fleet finishes the run, ``retry`` delays or queues it.
Budgets are checked after the queue limits: a level's ``max_queued`` counts its queued and
delayed jobs; ``max_wait`` compares the sum, over the levels at or above the job's, of their
queued jobs times the mean of the level's recent runtimes (60 s when none), over the capacity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs

from prioqueue.capabilities import checked_needs
from prioqueue.errors import DuplicateJob, Overloaded, QueueFull
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.records import Expired, Job
from prioqueue.testing._lanes import ReferenceLanes
from prioqueue.testing._records import finite
from prioqueue.testing._rules import ReferenceRules
from prioqueue.testing._stats import ReferenceStats, Runtimes

if TYPE_CHECKING:
    from prioqueue._spec import SubmitOptions

__all__: list[str] = []  # private module


@attrs.define(eq=False)
class Delayed:
    """A delayed job: the job, its grants so far, and when it becomes eligible."""

    job: Job
    grants: int
    release_at: float


def _budget_dict(budgets: Mapping[int, LevelBudget] | None) -> dict[int, LevelBudget]:
    """The levels' budgets as a dict of their own (None: none)."""
    return dict(budgets or {})


@attrs.define(eq=False)
class ReferenceLifecycle:
    """Deadlines, delays, retries and budgets for ``ReferenceFleet``.

    Args:
        lanes: The lanes (a release queues into them, a lapse takes out of them).
        rules: The rules (the lift of a released job's lane, the capacity).
        runtimes: The recent runtimes (``max_wait``'s forecast, ``retry_after``).
        stats: The counters (lapses and refusals are counted).
        budgets: ``{level: LevelBudget}``, or None.
        backoff: The retry delays for jobs without their own, or None.
        max_queued: The most queued jobs, or None.
        max_per_member: The most queued jobs of one member, or None.
    """

    _lanes: ReferenceLanes
    _rules: ReferenceRules
    _runtimes: Runtimes
    _stats: ReferenceStats
    _budgets: dict[int, LevelBudget] = attrs.field(kw_only=True, converter=_budget_dict)
    _backoff: Backoff | None = attrs.field(kw_only=True)
    _max_queued: int | None = attrs.field(kw_only=True)
    _max_per_member: int | None = attrs.field(kw_only=True)
    _delayed: list[Delayed] = attrs.field(init=False, factory=list)
    _lapsed: list[Expired] = attrs.field(init=False, factory=list)

    # -- time --------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Apply every lapse and release due at ``now``, each at its own time, in order."""
        while True:
            events: list[tuple[float, int, int, Any]] = []
            for entry in self._lanes.queued():
                deadline = entry.job.deadline
                if deadline is not None and deadline <= now:
                    events.append((deadline, 0, entry.job.seq, entry))
            for delayed in self._delayed:
                deadline = delayed.job.deadline
                if deadline is not None and deadline <= now:
                    events.append((deadline, 0, delayed.job.seq, delayed))
                if delayed.release_at <= now:
                    events.append((delayed.release_at, 1, delayed.job.seq, delayed))
            if not events:
                return
            at, kind, _, item = min(events, key=lambda event: event[:3])
            if isinstance(item, Delayed):
                self._delayed.remove(item)
                if kind == 0:
                    self._lapse(item.job, item.grants + 1)
                else:
                    self.queue(item.job, at, item.grants)
            else:
                self._lanes.remove(item.job, item)
                self._lapse(item.job, item.grants + 1)

    def _lapse(self, job: Job, attempt: int) -> None:
        assert job.deadline is not None
        self._lapsed.append(
            Expired(job=job, attempt=attempt, deadline=job.deadline, requeued=False, cause="ttl")
        )
        self._stats.lapsed(job.priority)

    def take_lapsed(self) -> list[Expired]:
        """The lapses not yet reported, in the order they happened (the buffer empties)."""
        lapsed, self._lapsed = self._lapsed, []
        return lapsed

    def queue(self, job: Job, at: float, grants: int) -> None:
        """Queue ``job`` at ``at`` as a submit then would: its lane's tail, an idle lane lifted."""
        self._lanes.queue(job, at, grants, self._rules.lift_floor)

    def delay(self, job: Job, grants: int, release_at: float) -> None:
        """Hold ``job`` back until ``release_at`` (a ``not_before``, or a retry's backoff)."""
        self._delayed.append(Delayed(job, grants, release_at))

    def retry(self, job: Job, grants: int, now: float) -> None:
        """A failed run retried: delayed by its backoff (the job's, else the default), or queued."""
        backoff = job.backoff or self._backoff
        delay = 0.0 if backoff is None else backoff.delay(job.id, grants)
        if delay > 0:
            self.delay(job, grants, now + delay)
        else:
            self.queue(job, now, grants)

    # -- submit ------------------------------------------------------------------------------

    def new_job(
        self,
        job_id: str,
        member: str,
        now: float,
        options: SubmitOptions,
        seq: int,
        known: Callable[[str], bool],
    ) -> Job:
        """The job a submit describes, after every check (in the real dispatcher's order).

        ``seq`` is the job's; ``known`` says whether an id is held, queued or delayed (a
        duplicate). The submit is admitted (``admit``): nothing is queued yet.
        """
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty str, got {job_id!r}")
        if not isinstance(member, str) or not member:
            raise ValueError(f"member must be a non-empty str, got {member!r}")
        estimate = options.get("estimate")
        if estimate is not None and not (finite("estimate", estimate) > 0):
            raise ValueError(f"estimate must be > 0 or None, got {estimate!r}")
        level = self._rules.policy.parse(options.get("priority", 0), options.get("ceiling"))
        tier = options.get("tier", "free")
        bonus = self._rules.scorer.tier_bonus(tier)
        if known(job_id):
            raise DuplicateJob(f"job {job_id!r} is already queued or held")
        not_before = options.get("not_before")
        delayed = not_before is not None and not_before > now
        budget = self.admit(member, level, delayed)
        ttl = options.get("ttl")
        if ttl is None and budget is not None:
            ttl = budget.ttl
        arrival = float(not_before) if delayed and not_before is not None else now
        return Job(
            id=job_id,
            member=member,
            priority=level,
            tier=tier,
            tier_bonus=bonus,
            model=options.get("model"),
            estimate=None if estimate is None else float(estimate),
            arrival=arrival,
            seq=seq,
            payload=options.get("payload"),
            deadline=None if ttl is None else arrival + ttl,
            not_before=arrival if delayed else None,
            max_attempts=options.get("max_attempts"),
            backoff=cast("Backoff | None", options.get("backoff")),
            needs=checked_needs(options.get("needs")),
        )

    def admit(self, member: str, level: int, delayed: bool) -> LevelBudget | None:
        """Check the queue limits and the level's budget; return the budget (None: none)."""
        if self._max_queued is not None and len(self) >= self._max_queued:
            raise QueueFull(
                f"{len(self)} jobs queued, the limit",
                retry_after=self._runtimes.retry_after(),
                limit=self._max_queued,
                scope="queue",
            )
        budget = self._check_budget(level, delayed)
        mine = sum(1 for entry in self._lanes.queued() if entry.job.member == member)
        if self._max_per_member is not None and mine >= self._max_per_member:
            raise QueueFull(
                f"member {member!r} has {mine} jobs queued, the limit",
                retry_after=self._runtimes.retry_after(),
                limit=self._max_per_member,
                scope="member",
            )
        return budget

    def _check_budget(self, level: int, delayed: bool) -> LevelBudget | None:
        budget = self._budgets.get(level)
        if budget is None or budget.empty:
            return None
        if budget.max_queued is not None:
            count = sum(1 for e in self._lanes.queued() if e.job.priority == level)
            count += sum(1 for d in self._delayed if d.job.priority == level)
            if count >= budget.max_queued:
                self._stats.refused(level)
                raise QueueFull(
                    "level full",
                    retry_after=self._runtimes.retry_after(),
                    limit=budget.max_queued,
                    scope="level",
                )
        if budget.max_wait is not None and not delayed:
            ahead = 0.0
            for other in self._stats.levels():
                if other >= level:
                    count = sum(1 for e in self._lanes.queued() if e.job.priority == other)
                    ahead += count * self._runtimes.level_mean(other)
            wait = ahead / self._rules.capacity
            if wait > budget.max_wait:
                self._stats.refused(level)
                raise Overloaded(
                    "overloaded",
                    retry_after=float(max(1, math.ceil(wait - budget.max_wait))),
                    forecast_wait=wait,
                    max_wait=budget.max_wait,
                    level=level,
                )
        return budget

    # -- reads and removal -------------------------------------------------------------------

    def __len__(self) -> int:
        """Queued and delayed jobs."""
        return len(self._lanes.queued()) + len(self._delayed)

    def delayed(self) -> list[Job]:
        """The delayed jobs, in the order they were delayed."""
        return [delayed.job for delayed in self._delayed]

    def find(self, job_id: str) -> Job | None:
        """The delayed job ``job_id``, or None."""
        for delayed in self._delayed:
            if delayed.job.id == job_id:
                return delayed.job
        return None

    def release_at(self, job_id: str) -> float | None:
        """When the delayed job ``job_id`` becomes eligible (None: not delayed)."""
        for delayed in self._delayed:
            if delayed.job.id == job_id:
                return delayed.release_at
        return None

    def drop(self, job: Job) -> None:
        """Drop a job that is delayed or queued (cancelled, or failed)."""
        for delayed in self._delayed:
            if delayed.job is job:
                self._delayed.remove(delayed)
                return
        self._lanes.drop(job)

    def timer_times(self) -> list[float]:
        """Every lifecycle timer: unreported lapses, deadlines, releases."""
        times = [e.deadline for e in self._lapsed]
        times += [e.job.deadline for e in self._lanes.queued() if e.job.deadline is not None]
        for delayed in self._delayed:
            times.append(delayed.release_at)
            if delayed.job.deadline is not None:
                times.append(delayed.job.deadline)
        return times
