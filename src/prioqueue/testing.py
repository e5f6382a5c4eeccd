"""Helpers for testing code that uses prioqueue: a manual clock and reference dispatchers.

Theory of operation
-------------------
:class:`ManualClock` is time you control: it only moves when a test calls :meth:`~ManualClock.
advance` or :meth:`~ManualClock.jump_to`, never backwards, so tests of waits and leases take no
real time. It is a zero-argument callable returning a float, so it can stand wherever a
``clock`` callable is expected (the asyncio adapter's, for one).

:class:`ReferenceDispatcher` is a brute-force model of
:class:`~prioqueue.dispatcher.SizeOneDispatcher` written straight from the design note
(``docs/design/dispatcher.md``). It keeps plain lists and recomputes every lane's score from
scratch on each call: no heaps, no lazy deletion, no cached keys. It is slow (every dispatch is
O(n) in the queued jobs) and meant to be obviously right, so that random tests can drive both
dispatchers side by side and compare every decision. The rules it keeps:

* A lane is ``(member, level)``; its jobs are FIFO (a requeued job goes back to the head).
  With ``fair_share=False`` every job is its own lane with ``s = arrival``.
* A lane's key is ``level + tier + affinity - s / d`` (that expression, in that order), with
  ``tier`` its head's tier bonus and ``affinity`` the resident model's bonus when the lane is
  eligible. The highest key wins; ties go to the smaller ``s``, then to the smaller ``seq`` of
  the job the lane would give up.
* A lane is eligible for the resident model ``r`` when ``aff(r) > 0`` and some queued job for
  ``r`` arrived no later than ``W = max_affinity * d`` seconds after the lane's head; the first
  such job in lane order is its affinity job, and the lane gives it up whenever it is eligible.
* Charge on complete or cancel while running: ``s = min(s + charge, now)``. Lift when a submit
  makes a lane backlogged: ``s = max(s, min(now, floor))`` with ``floor = s(M) + max(0,
  offsets(new) - offsets(M)) * d`` for the most-starved backlogged lane ``M`` at the level
  (``inf`` when there is none; a new lane has ``s = -inf`` before the lift). A requeue
  neither lifts nor charges.

:class:`ReferenceFleet` (defined in ``prioqueue._reference_fleet``) is the same kind of model
for :class:`~prioqueue.fleet.FleetDispatcher`, written from ``docs/design/fleet.md``.

Only the decisions and the statistics are modelled; ``explain``, ``forecast`` and snapshots are
not. Argument validation is minimal, but every error the tests compare (unknown ids, wrong
states, expired leases, duplicates, full queues, time going backwards) raises the same
exception type as the real dispatcher.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from prioqueue._errors import (
    DuplicateJob,
    InvalidState,
    LeaseError,
    LeaseExpired,
    QueueFull,
    UnknownJob,
)
from prioqueue._reference_fleet import ReferenceFleet
from prioqueue.dispatcher import DEFAULT_WAIT_BUCKETS, ChargeModel
from prioqueue.lease import Lease
from prioqueue.priority import PriorityPolicy
from prioqueue.records import (
    Completed,
    Expired,
    Grant,
    Job,
    JobState,
    LevelStats,
    MemberStats,
    Reorders,
    Stats,
    Ticket,
)
from prioqueue.scoring import Scorer

__all__ = ["ManualClock", "ReferenceDispatcher", "ReferenceFleet"]


class ManualClock:
    """A monotonic clock that moves only when told to.

    Example:
        >>> clock = ManualClock(start=100.0)
        >>> clock.advance(2.5)
        102.5
        >>> clock()
        102.5

    Args:
        start: The initial reading in seconds (default 0.0); finite.

    Raises:
        ValueError: ``start`` is not finite.
    """

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = _finite("start", start)

    def now(self) -> float:
        """Return the current reading in seconds. O(1)."""
        return self._now

    def __call__(self) -> float:
        """Return the current reading: the clock is a zero-argument callable. O(1)."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward.

        Args:
            seconds: How far to move; finite and >= 0.

        Returns:
            The new reading.

        Raises:
            ValueError: ``seconds`` is negative or not finite.
        """
        step = _finite("seconds", seconds)
        if step < 0:
            raise ValueError(f"a clock never goes backwards: advance({seconds!r})")
        self._now += step
        return self._now

    def jump_to(self, t: float) -> float:
        """Set the clock to ``t``, which must not be earlier than the current reading.

        Args:
            t: The new reading; finite and >= :meth:`now`.

        Returns:
            The new reading.

        Raises:
            ValueError: ``t`` is earlier than the current reading, or not finite.
        """
        target = _finite("t", t)
        if target < self._now:
            raise ValueError(f"a clock never goes backwards: jump_to({t!r}) at {self._now!r}")
        self._now = target
        return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


@attrs.define
class _Lane:
    """A lane's state: its virtual start and its queued jobs in lane order."""

    member: str
    level: int
    s: float = -math.inf
    jobs: list[Job] = attrs.field(factory=list)


@attrs.frozen
class _Offer:
    """What one lane offers at a dispatch: the job it would give up and its score terms."""

    level: int
    s: float
    head: Job
    job: Job
    tier: float
    affinity: float


@attrs.define
class _LevelCounters:
    dispatched: int = 0
    total_wait: float = 0.0
    waits: list[float] = attrs.field(factory=list)
    reorders: dict[str, int] = attrs.field(
        factory=lambda: {"aging": 0, "affinity": 0, "tier": 0, "fair_share": 0}
    )


@attrs.define
class _MemberCounters:
    dispatched: int = 0
    completed: int = 0
    gpu_seconds: float = 0.0


class ReferenceDispatcher:
    """A brute-force model of ``SizeOneDispatcher`` for tests: same calls, same answers.

    Every dispatch rescans every queued job and recomputes every lane's key, so the result is
    the contract of ``docs/design/dispatcher.md`` evaluated literally. Use it to check a real
    dispatcher in random tests, or as an executable specification when reading the design.

    Args:
        scorer: The scoring weights (default ``Scorer()``).
        policy: Resolves priority numbers and aliases (default ``PriorityPolicy()``).
        charge: ``"runtime"``, ``"estimate"``, a constant number of seconds, or a callable
            ``(job, runtime) -> seconds``.
        lease_for: ``job -> seconds`` for each grant's lease, or None for no leases.
        max_queued: The most queued jobs, or None.
        max_queued_per_member: The most queued jobs of one member, or None.
        max_attempts: Grants a job gets before an expired lease fails it.
        fair_share: False makes every job its own lane with ``s = arrival`` and no charge.
        track_reorders: False leaves the reorder counts at zero.
        wait_buckets: Upper bounds of the grant-wait histogram (``inf`` is appended).
    """

    def __init__(
        self,
        scorer: Scorer | None = None,
        *,
        policy: PriorityPolicy | None = None,
        charge: ChargeModel = "runtime",
        lease_for: Callable[[Job], float] | None = None,
        max_queued: int | None = None,
        max_queued_per_member: int | None = None,
        max_attempts: int = 3,
        fair_share: bool = True,
        track_reorders: bool = True,
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
    ) -> None:
        self._scorer = Scorer() if scorer is None else scorer
        self._policy = PriorityPolicy() if policy is None else policy
        self._charge = charge
        self._lease_for = lease_for
        self._max_queued = max_queued
        self._max_per_member = max_queued_per_member
        self._max_attempts = max_attempts
        self._fair_share = fair_share
        self._track_reorders = track_reorders
        bounds = tuple(float(bound) for bound in wait_buckets)
        self._buckets = bounds if bounds and bounds[-1] == math.inf else (*bounds, math.inf)
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._running: Grant | None = None
        self._resident: str | None = None
        self._latest = -math.inf
        self._seq = 0
        self._attempts: dict[int, int] = {}  # by seq: grants so far of a live job
        self._levels: dict[int, _LevelCounters] = {}
        self._members: dict[str, _MemberCounters] = {}
        self._runtimes: list[float] = []
        self._counts = {"completed": 0, "cancelled": 0, "expired": 0, "failed": 0, "swaps": 0}

    # -- reading -----------------------------------------------------------------------------

    @property
    def scorer(self) -> Scorer:
        """The scorer."""
        return self._scorer

    @property
    def policy(self) -> PriorityPolicy:
        """The priority policy."""
        return self._policy

    @property
    def resident_model(self) -> str | None:
        """The model believed loaded, or None."""
        return self._resident

    @property
    def running(self) -> Grant | None:
        """The grant of the job holding the resource, or None."""
        return self._running

    def __len__(self) -> int:
        return len(self._queued())

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self._find(job_id) is not None

    def job(self, job_id: str) -> Job:
        """Return a queued or running job.

        Args:
            job_id: The job's id.

        Returns:
            The job.

        Raises:
            UnknownJob: The id is neither queued nor running.
        """
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return found[0]

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"``.

        Args:
            job_id: The job's id.

        Returns:
            The job's state.

        Raises:
            UnknownJob: The id is neither queued nor running.
        """
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return found[1]

    def next_deadline(self) -> float | None:
        """Return the running job's lease deadline, or None."""
        if self._running is None or self._running.lease is None:
            return None
        return self._running.lease.deadline

    def set_resident_model(self, model: str | None) -> None:
        """Say which model is loaded (None: nothing is).

        Args:
            model: The model name, or None.
        """
        self._resident = model

    # -- changing ----------------------------------------------------------------------------

    def submit(
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
    ) -> Ticket:
        """Queue a job at the tail of its lane, lifting the lane if it was not backlogged.

        Args:
            job_id: A unique id among the queued and running jobs.
            member: Who the job belongs to.
            priority: A priority number, alias or header value (resolved by the policy).
            tier: The member's tier name.
            model: The model the job needs, or None.
            estimate: A runtime estimate in seconds (> 0), or None.
            payload: An opaque value.
            now: The current time.

        Returns:
            The ticket.

        Raises:
            ValueError: ``now`` went backwards, the tier is unknown, or an argument is bad.
            DuplicateJob: The id is queued or running.
            QueueFull: A queue limit is reached.
        """
        now = self._time(now)
        with self._commit(now):
            if not isinstance(job_id, str) or not job_id:
                raise ValueError(f"job_id must be a non-empty str, got {job_id!r}")
            if not isinstance(member, str) or not member:
                raise ValueError(f"member must be a non-empty str, got {member!r}")
            if estimate is not None and not (_finite("estimate", estimate) > 0):
                raise ValueError(f"estimate must be > 0 or None, got {estimate!r}")
            level = self._policy.parse(priority)
            bonus = self._scorer.tier_bonus(tier)
            if self._find(job_id) is not None:
                raise DuplicateJob(f"job {job_id!r} is already queued or running")
            queued = self._queued()
            if self._max_queued is not None and len(queued) >= self._max_queued:
                raise QueueFull(
                    f"{len(queued)} jobs queued, the limit",
                    retry_after=self._retry_after(),
                    limit=self._max_queued,
                    scope="queue",
                )
            mine = sum(1 for job in queued if job.member == member)
            if self._max_per_member is not None and mine >= self._max_per_member:
                raise QueueFull(
                    f"member {member!r} has {mine} jobs queued, the limit",
                    retry_after=self._retry_after(),
                    limit=self._max_per_member,
                    scope="member",
                )
            job = Job(
                id=job_id,
                member=member,
                priority=level,
                tier=tier,
                tier_bonus=bonus,
                model=model,
                estimate=None if estimate is None else float(estimate),
                arrival=now,
                seq=self._seq,
                payload=payload,
            )
            self._seq += 1
            lane = self._lanes.setdefault((member, level), _Lane(member, level))
            if self._fair_share and not lane.jobs:  # the lift
                lane.s = max(lane.s, min(now, self._lift_floor(job)))
            lane.jobs.append(job)
            self._levels.setdefault(level, _LevelCounters())
            self._members.setdefault(member, _MemberCounters())
            return Ticket(job=job, queued=len(queued) + 1)

    def dispatch(self, now: float) -> Grant | None:
        """Grant the best-scoring queued job when nothing runs.

        Args:
            now: The current time.

        Returns:
            The grant, or None when a job runs or nothing is queued.

        Raises:
            ValueError: ``now`` went backwards.
        """
        now = self._time(now)
        with self._commit(now):
            if self._running is not None:
                return None
            offers = self._offers(self._resident)
            if not offers:
                return None
            win = min(offers, key=lambda o: (-self._key(o), o.s, o.job.seq))
            job = win.job
            lease = None if self._lease_for is None else self._lease(job, now)
            attempt = self._attempts.get(job.seq, 0) + 1
            swap = job.model is not None and job.model != self._resident
            grant = Grant(
                job=job,
                score=self._scorer.breakdown(win.level, win.tier, win.affinity, now - win.s),
                lease=lease,
                granted_at=now,
                attempt=attempt,
                waited=now - job.arrival,
                swap=swap,
            )
            level = self._levels[job.priority]
            if self._track_reorders:
                for cause, other in self._counterfactuals(offers).items():
                    if other.seq != job.seq:
                        level.reorders[cause] += 1
            self._lane_of(job).jobs.remove(job)
            self._attempts[job.seq] = attempt
            self._running = grant
            if job.model is not None:
                self._resident = job.model
            level.dispatched += 1
            level.total_wait += grant.waited
            level.waits.append(grant.waited)
            self._members[job.member].dispatched += 1
            self._counts["swaps"] += swap
            return grant

    def complete(self, job_id: str, *, now: float, runtime: float | None = None) -> Completed:
        """Finish the running job and charge its lane.

        Args:
            job_id: The running job's id.
            now: The current time.
            runtime: Seconds it ran (default: measured since its grant).

        Returns:
            The job, its runtime and its charge.

        Raises:
            ValueError: ``now`` went backwards or ``runtime`` is negative.
            UnknownJob: The id is neither queued nor running.
            InvalidState: The job is queued.
            LeaseExpired: Its lease deadline has passed (nothing changes).
        """
        now = self._time(now)
        with self._commit(now):
            grant = self._running_grant(job_id)
            if grant.lease is not None and now >= grant.lease.deadline:
                raise LeaseExpired(f"the lease of {job_id!r} expired at {grant.lease.deadline}")
            if runtime is not None and not _finite("runtime", runtime) >= 0:
                raise ValueError(f"runtime must be >= 0, got {runtime!r}")
            ran = now - grant.granted_at if runtime is None else float(runtime)
            charge = self._finish(grant.job, ran, now)
            self._counts["completed"] += 1
            self._members[grant.job.member].completed += 1
            return Completed(job=grant.job, runtime=ran, charge=charge)

    def cancel(self, job_id: str, *, now: float) -> Job:
        """Drop a queued job, or stop the running one (its lane is charged for the time it ran).

        Args:
            job_id: The job's id.
            now: The current time.

        Returns:
            The cancelled job.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownJob: The id is neither queued nor running.
        """
        now = self._time(now)
        with self._commit(now):
            found = self._find(job_id)
            if found is None:
                raise UnknownJob(f"unknown job {job_id!r}")
            job, state = found
            if state == "running":
                assert self._running is not None
                self._finish(job, now - self._running.granted_at, now)
            else:
                self._lane_of(job).jobs.remove(job)
                self._attempts.pop(job.seq, None)
            self._counts["cancelled"] += 1
            return job

    def expire(self, now: float) -> list[Expired]:
        """Take the resource back from a job whose lease has run out.

        Args:
            now: The current time.

        Returns:
            One record per expired lease (at most one): requeued at its lane's head, or
            failed after ``max_attempts`` grants.

        Raises:
            ValueError: ``now`` went backwards.
        """
        now = self._time(now)
        with self._commit(now):
            grant = self._running
            if grant is None or grant.lease is None or now < grant.lease.deadline:
                return []
            self._running = None
            self._counts["expired"] += 1
            requeued = grant.attempt < self._max_attempts
            if requeued:
                self._lane_of(grant.job).jobs.insert(0, grant.job)
            else:
                del self._attempts[grant.job.seq]
                self._counts["failed"] += 1
            return [Expired(grant.job, grant.attempt, grant.lease.deadline, requeued)]

    def stats(self, *, now: float) -> Stats:
        """Return the counters and per-level and per-member statistics at ``now``.

        Args:
            now: The current time.

        Returns:
            The statistics.

        Raises:
            ValueError: ``now`` went backwards.
        """
        now = self._time(now)
        with self._commit(now):
            queued = self._queued()
            levels: dict[int, LevelStats] = {}
            for level in sorted(self._levels, reverse=True):
                counters = self._levels[level]
                waits = [now - job.arrival for job in queued if job.priority == level]
                levels[level] = LevelStats(
                    level=level,
                    queued=len(waits),
                    oldest_wait=max(waits, default=0.0),
                    mean_wait=math.fsum(waits) / len(waits) if waits else 0.0,
                    dispatched=counters.dispatched,
                    total_wait=counters.total_wait,
                    reorders=Reorders(**counters.reorders),
                    wait_buckets=tuple(
                        (bound, sum(1 for wait in counters.waits if wait <= bound))
                        for bound in self._buckets
                    ),
                )
            members = {
                name: MemberStats(
                    member=name,
                    queued=sum(1 for job in queued if job.member == name),
                    dispatched=counters.dispatched,
                    completed=counters.completed,
                    gpu_seconds=counters.gpu_seconds,
                )
                for name, counters in self._members.items()
            }
            return Stats(
                now=now,
                levels=levels,
                members=members,
                running=None if self._running is None else self._running.job,
                resident_model=self._resident,
                queued=len(queued),
                dispatched=sum(counters.dispatched for counters in self._levels.values()),
                **self._counts,
            )

    def lane_jobs(self, member: str, level: int) -> tuple[Job, ...]:
        """Return the queued jobs of a lane in lane order (the head first).

        With ``fair_share=False`` the jobs of ``(member, level)`` are returned in submission
        order (requeued jobs first), although each is its own lane.

        Args:
            member: The lane's member.
            level: The lane's level.

        Returns:
            The jobs; empty for a lane that is not backlogged.
        """
        lane = self._lanes.get((member, level))
        return () if lane is None else tuple(lane.jobs)

    def lane_start(self, member: str, level: int) -> float:
        """Return the virtual start ``s`` of a lane (``-inf`` for a lane never seen).

        With ``fair_share=False`` lanes keep no start; this returns ``-inf``.

        Args:
            member: The lane's member.
            level: The lane's level.

        Returns:
            The lane's ``s``.
        """
        lane = self._lanes.get((member, level))
        return -math.inf if lane is None or not self._fair_share else lane.s

    # -- the rules ---------------------------------------------------------------------------

    def _lift_floor(self, job: Job) -> float:
        """The lift's floor for a lane that ``job`` makes backlogged (``inf``: none at level).

        The most-starved backlogged lane ``M`` at the level (smallest ``s``, then the lane
        created first) sets it: ``s(M) + max(0, offsets(new) - offsets(M)) * d``, offsets being
        the tier bonus plus the affinity bonus as it stands now.
        """
        backlogged = [m for m in self._lanes.values() if m.level == job.priority and m.jobs]
        if not backlogged:
            return math.inf
        starved = min(backlogged, key=lambda m: m.s)  # min() keeps the first (oldest) on ties
        resident = self._resident
        mine = job.tier_bonus
        if resident is not None and job.model == resident:
            mine += self._scorer.affinity(resident)
        theirs = starved.jobs[0].tier_bonus
        if self._affinity_job(starved.jobs, resident) is not None:
            theirs += self._scorer.affinity(resident)
        return starved.s + max(0.0, mine - theirs) * self._scorer.config.aging_divisor

    def _key(self, offer: _Offer) -> float:
        d = self._scorer.config.aging_divisor
        return offer.level + offer.tier + offer.affinity - offer.s / d

    def _backlogged(self) -> list[tuple[int, float, list[Job]]]:
        """``(level, s, jobs)`` of each backlogged lane (of each queued job without fair share)."""
        if self._fair_share:
            return [(lane.level, lane.s, lane.jobs) for lane in self._lanes.values() if lane.jobs]
        return [
            (job.priority, job.arrival, [job]) for lane in self._lanes.values() for job in lane.jobs
        ]

    def _offers(self, resident: str | None) -> list[_Offer]:
        """One offer per backlogged lane, for the resident model ``resident``."""
        return [self._offer(level, s, jobs, resident) for level, s, jobs in self._backlogged()]

    def _offer(self, level: int, s: float, jobs: list[Job], resident: str | None) -> _Offer:
        head = jobs[0]
        choice = self._affinity_job(jobs, resident)
        if choice is None:
            return _Offer(level, s, head, head, head.tier_bonus, 0)
        return _Offer(level, s, head, choice, head.tier_bonus, self._scorer.affinity(resident))

    def _affinity_job(self, jobs: list[Job], model: str | None) -> Job | None:
        """The lane's affinity job for ``model``, or None when the lane is not eligible."""
        if model is None or not self._scorer.affinity(model) > 0:
            return None
        config = self._scorer.config
        limit = jobs[0].arrival + config.max_affinity * config.aging_divisor
        for job in jobs:
            if job.model == model and job.arrival <= limit:
                return job
        return None

    def _counterfactuals(self, offers: list[_Offer]) -> dict[str, Job]:
        """The winner without each term of the score (see the note's Observability)."""
        d = self._scorer.config.aging_divisor
        aging = min(offers, key=lambda o: (-(o.level + o.tier + o.affinity), o.s, o.job.seq))
        plain = self._offers(None)  # without affinity every lane gives up its head
        affinity = min(plain, key=lambda o: (-(o.level + o.tier - o.s / d), o.s, o.job.seq))
        tier = min(offers, key=lambda o: (-(o.level + o.affinity - o.s / d), o.s, o.job.seq))
        # Fair share: per-job aging over each lane's head and its oldest resident-model job.
        rows: list[tuple[float, float, int, Job]] = []
        model = self._resident
        bonus = 0.0 if model is None else self._scorer.affinity(model)
        for level, _, jobs in self._backlogged():
            head = jobs[0]
            picks = [head]
            if model is not None and bonus > 0:
                picks += [job for job in jobs if job.model == model][:1]
            for job in picks:
                aff = bonus if model is not None and bonus > 0 and job.model == model else 0
                key = level + head.tier_bonus + aff - job.arrival / d
                rows.append((-key, job.arrival, job.seq, job))
        fair = min(rows, key=lambda row: row[:3])[3]
        return {"aging": aging.job, "affinity": affinity.job, "tier": tier.job, "fair_share": fair}

    def _lease(self, job: Job, now: float) -> Lease:
        """The winner's lease; ``LeaseError`` (naming the job) when ``lease_for`` fails."""
        assert self._lease_for is not None
        try:
            seconds = self._lease_for(job)
        except Exception as exc:
            raise LeaseError(
                f"lease_for raised for job {job.id!r}: {exc!r}", job_id=job.id
            ) from exc
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not 0 < seconds < math.inf
        ):
            raise LeaseError(f"lease_for returned {seconds!r} for job {job.id!r}", job_id=job.id)
        return Lease(now, seconds)

    def _finish(self, job: Job, runtime: float, now: float) -> float:
        """Free the resource from the running job and charge its lane; return the charge.

        The charge is the charge model's value whether or not fair share is on (without fair
        share it is reported and counted in ``MemberStats.gpu_seconds`` but moves no ``s``).
        """
        if self._charge == "runtime":
            charge = runtime
        elif self._charge == "estimate":
            charge = runtime if job.estimate is None else job.estimate
        elif callable(self._charge):
            charge = self._charge(job, runtime)
        else:
            charge = float(self._charge)
        if isinstance(charge, bool) or not isinstance(charge, (int, float)):
            charge = math.nan
        if not (math.isfinite(charge) and charge >= 0):
            raise ValueError(
                f"the charge model returned {charge!r} for job {job.id!r}; a charge must be a "
                "finite number of seconds >= 0"
            )
        charge = float(charge)
        self._running = None
        del self._attempts[job.seq]
        self._runtimes.append(runtime)
        self._members[job.member].gpu_seconds += charge
        if self._fair_share:
            lane = self._lane_of(job)
            lane.s = min(lane.s + charge, now)
            others = [m for m in self._lanes.values() if m.level == lane.level and m.jobs]
            if lane.jobs and others == [lane]:
                lane.s = now  # alone at its level: re-anchored, as a resubmission would be
        return charge

    # -- bookkeeping -------------------------------------------------------------------------

    def _time(self, now: float) -> float:
        """Check ``now``: finite and not earlier than the latest call that succeeded."""
        value = _finite("now", now)
        if value < self._latest:
            raise ValueError(f"time went backwards: now={now!r} < {self._latest!r}")
        return value

    @contextmanager
    def _commit(self, now: float) -> Iterator[None]:
        """Make ``now`` the latest time when the block succeeds (a call that raises does not)."""
        yield
        self._latest = now

    def _queued(self) -> list[Job]:
        return [job for lane in self._lanes.values() for job in lane.jobs]

    def _find(self, job_id: str) -> tuple[Job, JobState] | None:
        if self._running is not None and self._running.job.id == job_id:
            return self._running.job, "running"
        for job in self._queued():
            if job.id == job_id:
                return job, "queued"
        return None

    def _running_grant(self, job_id: str) -> Grant:
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        if found[1] != "running" or self._running is None:
            raise InvalidState(f"job {job_id!r} is queued, not running")
        return self._running

    def _lane_of(self, job: Job) -> _Lane:
        return self._lanes[(job.member, job.priority)]

    def _retry_after(self) -> float:
        recent = self._runtimes[-64:]
        return max(1.0, math.fsum(recent) / len(recent)) if recent else 30.0
