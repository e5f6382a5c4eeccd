"""The job lifecycle in the brute-force reference model (private; see ``_fleet``).

Written from docs/design/lifecycle.md alone, by brute force: no heap of timers. At the start
of every call that takes ``now`` (``_time``), ``_advance`` repeatedly looks at every queued
and delayed job for the earliest due event (a deadline before a release at the same time,
then the smaller ``seq``), applies it at its own time, and starts over until nothing is due:

* a **lapse** (a queued or delayed job at or past its deadline) removes the job and buffers
  its ``Expired(cause="ttl")`` for the next ``expire``;
* a **release** (a delayed job at its ``not_before``) queues the job exactly as a submit at
  that time would (tail of its lane, an idle lane lifted), its ``queued_at`` the release time.

``fail(retry=True)`` of a held job with attempts left finishes it as a failed run would (its
lane charged for the time it was held), then delays it by its backoff (or queues it at once).
Budgets are checked after the queue limits: a level's ``max_queued`` counts its queued and
delayed jobs; ``max_wait`` compares the sum, over the levels at or above the job's, of their
queued jobs times the mean of the level's recent runtimes (60 s when none), over the capacity.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue._errors import InvalidState, Overloaded, QueueFull, UnknownJob
from prioqueue.records import Expired, Job, JobState, Stats
from prioqueue.testing._rules import _Rules
from prioqueue.testing._state import DEFAULT_EXPECTED_RUNTIME, _Entry, _Lane

if TYPE_CHECKING:
    from prioqueue.lifecycle import Backoff, LevelBudget

__all__: list[str] = []  # private module


@attrs.define(eq=False)
class _Delayed:
    """A delayed job: the job, its grants so far, and when it becomes eligible."""

    job: Job
    grants: int
    release_at: float


class _ReferenceLifecycle(_Rules):
    """Deadlines, delays, retries and budgets for ``ReferenceFleet`` (a mixin)."""

    _budgets: dict[int, LevelBudget]
    _backoff: Backoff | None

    def _lifecycle_init(self, budgets: Any, backoff: Backoff | None) -> None:
        self._budgets = dict(budgets or {})
        self._backoff = backoff
        self._delayed: list[_Delayed] = []
        self._lapsed: list[Expired] = []
        self._level_counts: dict[int, list[int]] = {}  # level -> [ttl expired, refused]
        self._counts.update(ttl_expired=0, refused=0, retried=0)

    # -- time --------------------------------------------------------------------------------

    def _time(self, now: float) -> float:
        value = super()._time(now)
        self._advance(value)
        return value

    def _advance(self, now: float) -> None:
        """Apply every lapse and release due at ``now``, each at its own time, in order."""
        while True:
            events: list[tuple[float, int, int, Any]] = []
            for entry in self._queued():
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
            if isinstance(item, _Delayed):
                self._delayed.remove(item)
                if kind == 0:
                    self._lapse(item.job, item.grants + 1)
                else:
                    self._queue(item.job, at, item.grants)
            else:
                lane = self._lane_of(item.job)
                lane.jobs.remove(item)
                self._lapse(item.job, item.grants + 1)

    def _lapse(self, job: Job, attempt: int) -> None:
        assert job.deadline is not None
        self._lapsed.append(
            Expired(job=job, attempt=attempt, deadline=job.deadline, requeued=False, cause="ttl")
        )
        self._counts["ttl_expired"] += 1
        self._level_counts.setdefault(job.priority, [0, 0])[0] += 1

    def _queue(self, job: Job, at: float, grants: int) -> None:
        """Queue ``job`` at ``at`` as a submit then would: its lane's tail, an idle lane lifted."""
        lane = self._lane_of_new(job)
        if self._fair_share and not lane.jobs:
            lane.settled = max(lane.settled, min(at, self._lift_floor(job)))
        lane.jobs.append(_Entry(job, at, grants))

    def _lane_of_new(self, job: Job) -> _Lane:
        return self._lanes.setdefault((job.member, job.priority), _Lane(job.member, job.priority))

    # -- submit ------------------------------------------------------------------------------

    def _admit(self, member: str, level: int, delayed: bool) -> LevelBudget | None:
        """Check the queue limits and the level's budget; return the budget (None: none)."""
        if self._max_queued is not None and len(self) >= self._max_queued:
            raise QueueFull(
                f"{len(self)} jobs queued, the limit",
                retry_after=self._retry_after(),
                limit=self._max_queued,
                scope="queue",
            )
        budget = self._check_budget(level, delayed)
        mine = sum(1 for entry in self._queued() if entry.job.member == member)
        if self._max_per_member is not None and mine >= self._max_per_member:
            raise QueueFull(
                f"member {member!r} has {mine} jobs queued, the limit",
                retry_after=self._retry_after(),
                limit=self._max_per_member,
                scope="member",
            )
        return budget

    def _check_budget(self, level: int, delayed: bool) -> LevelBudget | None:
        budget = self._budgets.get(level)
        if budget is None or budget.empty:
            return None
        if budget.max_queued is not None:
            count = sum(1 for e in self._queued() if e.job.priority == level)
            count += sum(1 for d in self._delayed if d.job.priority == level)
            if count >= budget.max_queued:
                self._refused(level)
                raise QueueFull(
                    "level full",
                    retry_after=self._retry_after(),
                    limit=budget.max_queued,
                    scope="level",
                )
        if budget.max_wait is not None and not delayed:
            ahead = 0.0
            for other in sorted(self._levels, reverse=True):
                if other >= level:
                    count = sum(1 for e in self._queued() if e.job.priority == other)
                    recent = self._recent_by_level.get(other)
                    mean = sum(recent) / len(recent) if recent else DEFAULT_EXPECTED_RUNTIME
                    ahead += count * mean
            wait = ahead / self.capacity
            if wait > budget.max_wait:
                self._refused(level)
                raise Overloaded(
                    "overloaded",
                    retry_after=float(max(1, math.ceil(wait - budget.max_wait))),
                    forecast_wait=wait,
                    max_wait=budget.max_wait,
                    level=level,
                )
        return budget

    def _refused(self, level: int) -> None:
        self._counts["refused"] += 1
        self._level_counts.setdefault(level, [0, 0])[1] += 1

    # -- fail --------------------------------------------------------------------------------

    def fail(
        self, job_id: str, *, now: float, worker: str | None = None, retry: bool = False
    ) -> Job:
        """Fail a job; with ``retry`` a held one with attempts left is delayed instead.

        A queued or delayed job is dropped, a held one finished as a failed run (its lane
        charged for the time it was held); a retried one then waits out its backoff.

        Raises:
            ValueError: ``now`` went backwards or ``retry`` is not a bool.
            UnknownJob: The id is neither queued, delayed nor held.
            InvalidState: ``worker`` is given and does not hold the job.
        """
        with self._at(now) as t:
            if not isinstance(retry, bool):
                raise ValueError(f"retry must be a bool, got {retry!r}")
            job, state = self._found(job_id)
            if state == "running":
                held = self._end_run(job_id, worker, t)
                limit = job.max_attempts or self._max_attempts
                if retry and held.grants < limit:
                    backoff = job.backoff or self._backoff
                    delay = 0.0 if backoff is None else backoff.delay(job.id, held.grants)
                    if delay > 0:
                        self._delayed.append(_Delayed(job, held.grants, t + delay))
                    else:
                        self._queue(job, t, held.grants)
                    self._counts["retried"] += 1
                    return job
            elif worker is not None:
                raise InvalidState(f"job {job_id!r} is queued, not held by {worker!r}")
            else:
                self._drop_queued(job)
            self._counts["failed"] += 1
            return job

    def _drop_queued(self, job: Job) -> None:
        for delayed in self._delayed:
            if delayed.job is job:
                self._delayed.remove(delayed)
                return
        lane = self._lane_of(job)
        lane.jobs = [entry for entry in lane.jobs if entry.job is not job]

    def not_before(self, job_id: str) -> float | None:
        """When a delayed job becomes eligible, else None.

        Raises:
            UnknownJob: The id is neither queued, delayed nor held.
        """
        for delayed in self._delayed:
            if delayed.job.id == job_id:
                return delayed.release_at
        if self._find(job_id) is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return None

    # -- reads -------------------------------------------------------------------------------

    def _find(self, job_id: str) -> tuple[Job, JobState] | None:
        found = super()._find(job_id)
        if found is not None:
            return found
        for delayed in self._delayed:
            if delayed.job.id == job_id:
                return delayed.job, "queued"
        return None

    def __len__(self) -> int:
        return len(self._queued()) + len(self._delayed)

    def _timer_times(self) -> list[float]:
        times = [e.deadline for e in self._lapsed]
        times += [e.job.deadline for e in self._queued() if e.job.deadline is not None]
        for delayed in self._delayed:
            times.append(delayed.release_at)
            if delayed.job.deadline is not None:
                times.append(delayed.job.deadline)
        return times

    def _with_lifecycle(self, stats: Stats) -> Stats:
        levels = dict(stats.levels)
        for number, level in levels.items():
            expired, refused = self._level_counts.get(number, (0, 0))
            delayed = sum(1 for d in self._delayed if d.job.priority == number)
            levels[number] = attrs.evolve(
                level, ttl_expired=expired, refused=refused, delayed=delayed
            )
        return attrs.evolve(
            stats,
            levels=levels,
            queued=stats.queued + len(self._delayed),
            delayed=len(self._delayed),
        )
