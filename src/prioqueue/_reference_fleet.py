"""A brute-force model of :class:`~prioqueue.fleet.FleetDispatcher`, for tests.

Theory of operation
-------------------
:class:`ReferenceFleet` is written from ``docs/design/fleet.md`` alone, rule by rule, with
plain lists: every ``pop`` rescans every queued job, decides its eligibility for the popping
worker and recomputes every lane's offer and key from scratch. There are no heaps, no lazy
deletion and no cached keys, so it is slow (O(n) per call in the queued jobs) and meant to be
obviously right: random tests drive it beside the real dispatcher and compare every answer.

The rules it keeps (the note's words, in code order):

* A lane is ``(member, level)``, FIFO, a requeued job at its head. Its virtual start is
  ``s = settled + held``: ``held`` sums the up-front charges of its jobs that workers hold, and
  ``settled`` never passes ``now`` (``s = settled`` exactly while it holds nothing). With
  ``fair_share=False`` every job is its own lane with ``s = arrival`` and no charge.
* A worker is live when joined and not timed out; the capacity is ``N = max(1, live)``.
* ``pop(w)``: a job is eligible unless (first cause wins) ``w`` holds ``slots`` jobs, its
  member holds ``max_running_per_member`` jobs, ``w`` does not serve its model, ``w.accepts``
  refuses it, or a warm hold keeps it for another live worker whose resident is its model and
  which has a free slot (for ``warm_hold`` seconds after the job was queued). Each lane offers
  its oldest eligible job at ``level + tier(head) - s / d``, or, when it holds an eligible job
  for ``w``'s resident model ``r`` within ``W`` of its head, the oldest such at
  ``+ aff(r)``. Highest key wins; ties by smaller ``s``, then smaller offered ``seq``.
* The grant charges the lane ``c = expected / N`` up front (``held += c``, no clamp).
  Completion corrects it: ``c`` leaves ``held`` and ``settled = min(settled + F / N, now)``,
  then ``settled = now`` (re-anchored) when the lane is the only backlogged one at its level;
  that is the note's ``s += F / N - c; s = min(s, now + held)``. A take-back (lease expiry,
  worker timeout, leave) refunds ``c`` exactly and requeues the job at its lane's head (or
  fails it after ``max_attempts`` grants; ``leave`` always requeues).
* The lift on submit is the size-1 note's, applied to the settled part (``settled =
  max(settled, min(now, floor))``, so a lane's held charges stay on top of it), with affinity
  offsets taken over the models resident on live workers.

Statistics are modelled (reorders only on fast-path grants: see ``_fast_path``); ``explain``,
``forecast`` and snapshots are not. Argument checks are minimal, but every error the tests
compare raises the same exception type as the real dispatcher.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import attrs

from prioqueue._errors import (
    DuplicateJob,
    InvalidState,
    LeaseError,
    LeaseExpired,
    QueueFull,
    UnknownJob,
    UnknownWorker,
)
from prioqueue.dispatcher import DEFAULT_WAIT_BUCKETS, ChargeModel
from prioqueue.lease import ImageRequest, Lease, LeaseCalculator
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
    WorkerInfo,
)
from prioqueue.scoring import ScoreBreakdown, Scorer

__all__ = ["DEFAULT_EXPECTED_RUNTIME", "RECENT_RUNTIMES", "ReferenceFleet"]

#: The expected runtime of a job with no estimate and no recent runtime of its model or level.
DEFAULT_EXPECTED_RUNTIME = 60.0

#: Finished jobs' runtimes kept per model and per level for the expected charge.
RECENT_RUNTIMES = 8

#: The causes ``idle_reasons`` reports, in the order they are tested.
IDLE_CAUSES = ("slots_full", "member_cap", "model", "accepts", "warm_hold")

_UNCHANGED: Any = object()

CauseName = Literal["lease", "worker_timeout"]


@attrs.define(eq=False)
class _Entry:
    """A queued job: the job, when it entered the queue, and its grants so far."""

    job: Job
    queued_at: float
    grants: int = 0


@attrs.define(eq=False)
class _Lane:
    """A lane: ``s = settled + held`` while it has held jobs, else ``s = settled``."""

    member: str
    level: int
    settled: float = -math.inf
    held: float = 0.0
    holding: int = 0
    jobs: list[_Entry] = attrs.field(factory=list)

    @property
    def s(self) -> float:
        return self.settled + self.held if self.holding else self.settled

    def hold(self, c: float) -> None:
        """A grant: the up-front charge ``c`` joins ``held`` (no clamp)."""
        self.holding += 1
        self.held += c

    def release(self, c: float) -> None:
        """A held job leaves (finished or taken back): its up-front charge leaves ``held``."""
        self.holding -= 1
        self.held = self.held - c if self.holding else 0.0


@attrs.define(eq=False)
class _Held:
    """A job a worker holds: its grant, the up-front charge ``c`` and the capacity ``n``."""

    grant: Grant
    worker: str
    grants: int
    c: float
    n: int


@attrs.define(eq=False)
class _Worker:
    name: str
    models: frozenset[str] | None
    resident: str | None
    slots: int
    slow: bool
    accepts: Callable[[Job], bool] | None
    last_seen: float
    timed_out: bool = False
    held: list[_Held] = attrs.field(factory=list)

    def serves(self, model: str | None) -> bool:
        return model is None or self.models is None or model in self.models


@attrs.frozen
class _Offer:
    """One lane's offer to a worker: the job it gives up and the terms of its key."""

    level: int
    s: float
    head: Job
    entry: _Entry
    tier: float
    affinity: float
    lane: _Lane | None  # None without fair share


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


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _takes_worker(fn: Callable[..., Any]) -> bool:
    """Whether ``lease_for`` takes ``(job, worker)`` rather than ``(job)``."""
    if isinstance(fn, LeaseCalculator):
        return False
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
    return varargs or len(positional) >= 2


class ReferenceFleet:
    """A brute-force model of ``FleetDispatcher`` for tests: same calls, same answers.

    Args:
        scorer: The scoring weights (default ``Scorer()``).
        policy: Resolves priority numbers and aliases (default ``PriorityPolicy()``).
        charge: ``"runtime"``, ``"estimate"``, a constant number of seconds, or a callable
            ``(job, runtime) -> seconds``.
        lease_for: ``(job, worker_info) -> seconds`` or ``job -> seconds`` for each grant's
            lease (a ``LeaseCalculator`` gets the worker's ``slow`` flag), or None.
        max_queued: The most queued jobs, or None.
        max_queued_per_member: The most queued jobs of one member, or None.
        max_running_per_member: The most jobs of one member that workers hold, or None.
        max_attempts: Grants a job gets before an expired lease fails it.
        worker_timeout: Seconds of silence after which ``expire`` takes a worker's jobs back.
        warm_hold: Seconds a job stays reserved for a free warm worker (0: off).
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
        lease_for: Callable[..., float] | None = None,
        max_queued: int | None = None,
        max_queued_per_member: int | None = None,
        max_running_per_member: int | None = None,
        max_attempts: int = 3,
        worker_timeout: float | None = None,
        warm_hold: float = 0.0,
        fair_share: bool = True,
        track_reorders: bool = True,
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
    ) -> None:
        self._scorer = Scorer() if scorer is None else scorer
        self._policy = PriorityPolicy() if policy is None else policy
        self._divisor = self._scorer.config.aging_divisor
        self._charge = charge
        self._lease_for = lease_for
        self._lease_takes_worker = lease_for is not None and _takes_worker(lease_for)
        self._max_queued = max_queued
        self._max_per_member = max_queued_per_member
        self._max_running = max_running_per_member
        self._max_attempts = max_attempts
        self._worker_timeout = worker_timeout
        self._warm_hold = float(warm_hold)
        self._fair_share = fair_share
        self._track_reorders = track_reorders
        bounds = tuple(float(bound) for bound in wait_buckets)
        self._buckets = bounds if bounds and bounds[-1] == math.inf else (*bounds, math.inf)
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._workers: dict[str, _Worker] = {}
        self._latest = -math.inf
        self._seq = 0
        self._levels: dict[int, _LevelCounters] = {}
        self._members: dict[str, _MemberCounters] = {}
        self._runtimes: list[float] = []
        self._recent_by_model: dict[str, list[float]] = {}
        self._recent_by_level: dict[int, list[float]] = {}
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
    def held(self) -> list[Grant]:
        """The grants of every held job, by grant time (then ``seq``)."""
        return [held.grant for held in self._held()]

    def workers(self) -> list[WorkerInfo]:
        """Every known worker's info (timed-out ones included), sorted by name."""
        return [self._info(self._workers[name]) for name in sorted(self._workers)]

    @property
    def capacity(self) -> int:
        """``N = max(1, live workers)``."""
        return max(1, sum(1 for w in self._workers.values() if not w.timed_out))

    def __len__(self) -> int:
        return len(self._queued())

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self._find(job_id) is not None

    def job(self, job_id: str) -> Job:
        """Return a queued or held job.

        Args:
            job_id: The job's id.

        Returns:
            The job.

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return found[0]

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"`` (held by a worker).

        Args:
            job_id: The job's id.

        Returns:
            The job's state.

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return found[1]

    def holder(self, job_id: str) -> str | None:
        """Return the name of the worker holding ``job_id``, or None when it is queued.

        Args:
            job_id: The job's id.

        Returns:
            The worker's name, or None.

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        if self._find(job_id) is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        held = self._held_by_id(job_id)
        return None if held is None else held.worker

    def worker(self, name: str) -> WorkerInfo:
        """Return a known worker's info.

        Args:
            name: The worker's name.

        Returns:
            Its info.

        Raises:
            UnknownWorker: The name was never joined, or has left.
        """
        return self._info(self._worker(name))

    def next_deadline(self) -> float | None:
        """The earliest held lease deadline or live worker's timeout, or None."""
        times = [h.grant.lease.deadline for h in self._held() if h.grant.lease is not None]
        if self._worker_timeout is not None:
            times += [
                w.last_seen + self._worker_timeout
                for w in self._workers.values()
                if not w.timed_out
            ]
        return min(times, default=None)

    def lane_jobs(self, member: str, level: int) -> tuple[Job, ...]:
        """Return the queued jobs of a lane in lane order (the head first).

        Args:
            member: The lane's member.
            level: The lane's level.

        Returns:
            The jobs; empty for a lane that is not backlogged.
        """
        lane = self._lanes.get((member, level))
        return () if lane is None else tuple(entry.job for entry in lane.jobs)

    def lane_start(self, member: str, level: int) -> float:
        """Return the virtual start ``s`` of a lane (``-inf`` for a lane never seen).

        Args:
            member: The lane's member.
            level: The lane's level.

        Returns:
            The lane's ``s`` (including the up-front charges of its held jobs); ``-inf``
            without fair share.
        """
        lane = self._lanes.get((member, level))
        return -math.inf if lane is None or not self._fair_share else lane.s

    def lane_held(self, member: str, level: int) -> float:
        """Return the up-front charges of a lane's held jobs (``held``; 0 for no lane).

        Args:
            member: The lane's member.
            level: The lane's level.

        Returns:
            The lane's ``held``.
        """
        lane = self._lanes.get((member, level))
        return 0.0 if lane is None else lane.held

    # -- workers -----------------------------------------------------------------------------

    def join(
        self,
        name: str,
        *,
        models: Iterable[str] | None = None,
        resident: str | None = None,
        slots: int = 1,
        slow: bool = False,
        accepts: Callable[[Job], bool] | None = None,
        now: float,
    ) -> WorkerInfo:
        """Add a worker, or update every field of a known one (``resident=None`` keeps it).

        Args:
            name: The worker's name.
            models: The models it serves, or None for every model.
            resident: The model it has loaded, or None.
            slots: How many jobs it holds at once (>= 1).
            slow: Whether it is extra slow (its leases are longer).
            accepts: A predicate over jobs it may take, or None.
            now: The current time.

        Returns:
            The worker's info.

        Raises:
            ValueError: ``now`` went backwards, or a bad argument.
            TypeError: An argument of the wrong type.
        """
        now = self._time(now)
        with self._commit(now):
            if not isinstance(name, str) or not name:
                raise ValueError(f"a worker name must be a non-empty str, got {name!r}")
            if isinstance(slots, bool) or not isinstance(slots, int):
                raise TypeError(f"slots must be an int, got {slots!r}")
            if slots < 1:
                raise ValueError(f"slots must be >= 1, got {slots!r}")
            served = None if models is None else frozenset(models)
            if served is not None and not all(isinstance(m, str) and m for m in served):
                raise ValueError(f"models must be non-empty strs, got {sorted(served)!r}")
            if accepts is not None and not callable(accepts):
                raise TypeError(f"accepts must be callable or None, got {accepts!r}")
            worker = self._workers.get(name)
            if worker is None:
                worker = _Worker(name, served, resident, slots, bool(slow), accepts, now)
                self._workers[name] = worker
            else:
                worker.models = served
                if resident is not None:
                    worker.resident = resident
                worker.slots = slots
                worker.slow = bool(slow)
                worker.accepts = accepts
                worker.last_seen = now
                worker.timed_out = False
            return self._info(worker)

    def heartbeat(self, name: str, *, now: float, resident: str | None = _UNCHANGED) -> WorkerInfo:
        """Mark a worker seen (reviving it), and set its resident model when given.

        Args:
            name: The worker's name.
            now: The current time.
            resident: The model it has loaded (None: nothing); omitted: unchanged.

        Returns:
            The worker's info.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        now = self._time(now)
        with self._commit(now):
            worker = self._worker(name)
            worker.last_seen = now
            worker.timed_out = False
            if resident is not _UNCHANGED:
                worker.resident = resident
            return self._info(worker)

    def leave(self, name: str, *, now: float) -> list[Job]:
        """Forget a worker; every job it holds is requeued at its lane's head.

        Args:
            name: The worker's name.
            now: The current time.

        Returns:
            The jobs requeued, in ascending ``seq``.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        now = self._time(now)
        with self._commit(now):
            worker = self._worker(name)
            taken = list(worker.held)
            self._take_back(taken, now, always_requeue=True)
            del self._workers[name]
            return sorted((held.grant.job for held in taken), key=lambda job: job.seq)

    def idle_reasons(self, name: str, *, now: float) -> Mapping[str, int]:
        """Why ``pop(name)`` finds nothing: queued jobs per first cause of ineligibility.

        Args:
            name: The worker's name.
            now: The current time.

        Returns:
            Counts per cause (causes with 0 omitted); empty when a pop would grant a job.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        now = self._time(now)
        worker = self._worker(name)
        counts: dict[str, int] = {}
        for entry in self._queued():
            cause = self._ineligible(worker, entry, now)
            if cause is not None:
                counts[cause] = counts.get(cause, 0) + 1
        return {cause: counts[cause] for cause in IDLE_CAUSES if cause in counts}

    # -- jobs --------------------------------------------------------------------------------

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
            job_id: A unique id among the queued and held jobs.
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
            DuplicateJob: The id is queued or held.
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
                raise DuplicateJob(f"job {job_id!r} is already queued or held")
            queued = self._queued()
            if self._max_queued is not None and len(queued) >= self._max_queued:
                raise QueueFull(
                    f"{len(queued)} jobs queued, the limit",
                    retry_after=self._retry_after(),
                    limit=self._max_queued,
                    scope="queue",
                )
            mine = sum(1 for entry in queued if entry.job.member == member)
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
            if self._fair_share and not lane.jobs:  # the lift, of the settled part
                lane.settled = max(lane.settled, min(now, self._lift_floor(job)))
            lane.jobs.append(_Entry(job, now))
            self._levels.setdefault(level, _LevelCounters())
            self._members.setdefault(member, _MemberCounters())
            return Ticket(job=job, queued=len(queued) + 1)

    def pop(self, name: str, *, now: float) -> Grant | None:
        """Grant the worker its best-scoring eligible job (it is marked seen first).

        Args:
            name: The worker's name.
            now: The current time.

        Returns:
            The grant, or None when the worker's slots are full or no job is eligible.

        Raises:
            ValueError: ``now`` went backwards, or the charge model's expected charge is bad.
            UnknownWorker: The name was never joined, or has left.
            LeaseError: ``lease_for`` failed (nothing changes).
        """
        now = self._time(now)
        with self._commit(now):
            worker = self._worker(name)
            was = (worker.last_seen, worker.timed_out)
            worker.last_seen, worker.timed_out = now, False
            try:
                return self._pop(worker, now)
            except BaseException:
                worker.last_seen, worker.timed_out = was
                raise

    def _pop(self, worker: _Worker, now: float) -> Grant | None:
        if len(worker.held) >= worker.slots:
            return None
        offers = self._offers(worker, lambda e: self._ineligible(worker, e, now) is None)
        if not offers:
            return None
        win = min(offers, key=lambda o: (-self._key(o), o.s, o.entry.job.seq))
        entry = win.entry
        job = entry.job
        info = self._info(worker)
        lease = None if self._lease_for is None else self._lease(job, info, now)
        expected = self._charge_of(job, self._expected_runtime(job))
        n = self.capacity
        c = expected / n if self._fair_share else 0.0
        resident = worker.resident
        swap = job.model is not None and job.model != resident
        grant = Grant(
            job=job,
            # Up-front charges may carry s past now: the aging term is then 0, never negative.
            score=ScoreBreakdown(
                win.level, win.tier, win.affinity, max(0.0, (now - win.s) / self._divisor)
            ),
            lease=lease,
            granted_at=now,
            attempt=entry.grants + 1,
            waited=now - job.arrival,
            swap=swap,
            worker=worker.name,
        )
        level = self._levels[job.priority]
        if self._track_reorders and self._fast_path(worker):
            # The counterfactual rankings know nothing of eligibility: every queued job counts.
            everything = self._offers(worker, lambda entry: True)
            for cause, other in self._counterfactuals(everything, worker).items():
                if other.seq != job.seq:
                    level.reorders[cause] += 1
        self._lane_of(job).jobs.remove(entry)
        if self._fair_share:
            self._lane_of(job).hold(c)
        worker.held.append(_Held(grant, worker.name, entry.grants + 1, c, n))
        if job.model is not None:
            worker.resident = job.model
        level.dispatched += 1
        level.total_wait += grant.waited
        level.waits.append(grant.waited)
        self._members[job.member].dispatched += 1
        self._counts["swaps"] += swap
        return grant

    def complete(
        self,
        job_id: str,
        *,
        now: float,
        runtime: float | None = None,
        worker: str | None = None,
    ) -> Completed:
        """Finish a held job and correct its lane's charge.

        Args:
            job_id: The held job's id.
            now: The current time.
            runtime: Seconds it ran (default: measured since its grant).
            worker: The worker reporting it; when given it must be the holder.

        Returns:
            The job, its runtime and its final charge.

        Raises:
            ValueError: ``now`` went backwards, ``runtime`` is negative, or a bad charge.
            UnknownJob: The id is neither queued nor held.
            InvalidState: The job is queued, or ``worker`` does not hold it.
            LeaseExpired: Its lease deadline has passed (nothing changes).
        """
        now = self._time(now)
        with self._commit(now):
            held = self._held_for(job_id, worker)
            grant = held.grant
            if grant.lease is not None and now >= grant.lease.deadline:
                raise LeaseExpired(f"the lease of {job_id!r} expired at {grant.lease.deadline}")
            if runtime is not None and not _finite("runtime", runtime) >= 0:
                raise ValueError(f"runtime must be >= 0, got {runtime!r}")
            ran = now - grant.granted_at if runtime is None else float(runtime)
            charge = self._finish(held, ran, now)
            self._counts["completed"] += 1
            self._members[grant.job.member].completed += 1
            return Completed(job=grant.job, runtime=ran, charge=charge)

    def cancel(self, job_id: str, *, now: float, worker: str | None = None) -> Job:
        """Drop a queued job, or finish a held one (charged for the time it ran).

        Args:
            job_id: The job's id.
            now: The current time.
            worker: For a held job, the worker reporting it; when given it must be the holder.

        Returns:
            The cancelled job.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownJob: The id is neither queued nor held.
            InvalidState: ``worker`` is given and does not hold the job.
        """
        now = self._time(now)
        with self._commit(now):
            found = self._find(job_id)
            if found is None:
                raise UnknownJob(f"unknown job {job_id!r}")
            job, state = found
            if state == "running":
                held = self._held_for(job_id, worker)
                self._finish(held, now - held.grant.granted_at, now)
            else:
                lane = self._lane_of(job)
                lane.jobs = [entry for entry in lane.jobs if entry.job is not job]
            self._counts["cancelled"] += 1
            return job

    def expire(self, now: float) -> list[Expired]:
        """Take back the jobs past their lease, and every job of a worker silent too long.

        Args:
            now: The current time.

        Returns:
            One record per job taken back, in ascending ``seq``: requeued at its lane's head,
            or failed after ``max_attempts`` grants.

        Raises:
            ValueError: ``now`` went backwards.
        """
        now = self._time(now)
        with self._commit(now):
            due: list[tuple[_Held, float, CauseName]] = [
                (held, held.grant.lease.deadline, "lease")
                for held in self._held()
                if held.grant.lease is not None and held.grant.lease.deadline <= now
            ]
            if self._worker_timeout is not None:
                taken = {id(held) for held, _, _ in due}
                for worker in self._workers.values():
                    silent_since = worker.last_seen + self._worker_timeout
                    if worker.timed_out or silent_since > now:
                        continue
                    worker.timed_out = True
                    for held in worker.held:
                        if id(held) not in taken:
                            lease = held.grant.lease
                            deadline = silent_since if lease is None else lease.deadline
                            due.append((held, deadline, "worker_timeout"))
            requeued = self._take_back([held for held, _, _ in due], now, always_requeue=False)
            records = [
                Expired(
                    held.grant.job,
                    held.grants,
                    deadline,
                    held.grant.job.seq in requeued,
                    worker=held.worker,
                    cause=cause,
                )
                for held, deadline, cause in due
            ]
            return sorted(records, key=lambda record: record.job.seq)

    def stats(self, *, now: float) -> Stats:
        """Return the counters and per-level and per-member statistics at ``now``.

        ``running`` is the first held job by grant time (None when none is held),
        ``resident_model`` the resident model of the first-joined worker.

        Args:
            now: The current time.

        Returns:
            The statistics.

        Raises:
            ValueError: ``now`` went backwards.
        """
        now = self._time(now)
        with self._commit(now):
            queued = [entry.job for entry in self._queued()]
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
                    running=sum(1 for h in self._held() if h.grant.job.member == name),
                )
                for name, counters in self._members.items()
            }
            held = self._held()
            first = next(iter(self._workers.values()), None)
            return Stats(
                now=now,
                levels=levels,
                members=members,
                running=held[0].grant.job if held else None,
                resident_model=None if first is None else first.resident,
                queued=len(queued),
                dispatched=sum(counters.dispatched for counters in self._levels.values()),
                **self._counts,
                held=tuple(h.grant.job for h in held),
                workers=tuple(self.workers()),
            )

    # -- the rules ---------------------------------------------------------------------------

    def _ineligible(self, worker: _Worker, entry: _Entry, now: float) -> str | None:
        """The first cause that keeps ``entry`` from ``worker`` (None: it is eligible)."""
        job = entry.job
        if len(worker.held) >= worker.slots:
            return "slots_full"
        if self._max_running is not None:
            running = sum(1 for held in self._held() if held.grant.job.member == job.member)
            if running >= self._max_running:
                return "member_cap"
        if not worker.serves(job.model):
            return "model"
        if worker.accepts is not None and not worker.accepts(job):
            return "accepts"
        if (
            self._warm_hold > 0
            and job.model is not None
            and job.model != worker.resident
            and now < entry.queued_at + self._warm_hold
            and any(
                other is not worker
                and not other.timed_out
                and other.resident == job.model
                and len(other.held) < other.slots
                and other.serves(job.model)
                for other in self._workers.values()
            )
        ):
            return "warm_hold"
        return None

    def _fast_path(self, worker: _Worker) -> bool:
        """Whether a grant to ``worker`` counts reorders (the note's fast path).

        The worker serves every model with no ``accepts``; with ``warm_hold``, no other live
        worker with a free slot has a model it serves loaded; with a member cap, the winner
        among *all* queued jobs belongs to a member under the cap. Then the winner is the one
        the counterfactual rankings (which know nothing of eligibility) compete with.
        """
        if worker.models is not None or worker.accepts is not None:
            return False
        if self._warm_hold > 0 and any(
            other is not worker
            and other.resident is not None
            and not other.timed_out
            and len(other.held) < other.slots
            and other.serves(other.resident)
            for other in self._workers.values()
        ):
            return False
        if self._max_running is not None:
            offers = self._offers(worker, lambda entry: True)
            win = min(offers, key=lambda o: (-self._key(o), o.s, o.entry.job.seq))
            mine = sum(1 for held in self._held() if held.grant.job.member == win.head.member)
            return mine < self._max_running
        return True

    def _backlogged(self) -> list[tuple[int, float, list[_Entry], _Lane | None]]:
        """``(level, s, entries, lane)`` of each backlogged lane (each job without fair share)."""
        if self._fair_share:
            return [
                (lane.level, lane.s, lane.jobs, lane) for lane in self._lanes.values() if lane.jobs
            ]
        return [
            (entry.job.priority, entry.job.arrival, [entry], None)
            for lane in self._lanes.values()
            for entry in lane.jobs
        ]

    def _offers(self, worker: _Worker, eligible_to: Callable[[_Entry], bool]) -> list[_Offer]:
        """Each backlogged lane's offer to ``worker`` among the entries ``eligible_to`` keeps.

        A lane with no such entry offers nothing.
        """
        offers = []
        for level, s, entries, lane in self._backlogged():
            eligible = [e for e in entries if eligible_to(e)]
            if eligible:
                offers.append(self._offer(level, s, entries, eligible, worker.resident, lane))
        return offers

    def _offer(
        self,
        level: int,
        s: float,
        entries: list[_Entry],
        eligible: list[_Entry],
        resident: str | None,
        lane: _Lane | None,
    ) -> _Offer:
        head = entries[0].job
        choice = self._affinity_entry(head, eligible, resident)
        if choice is None or resident is None:
            return _Offer(level, s, head, eligible[0], head.tier_bonus, 0.0, lane)
        bonus = self._scorer.affinity(resident)
        return _Offer(level, s, head, choice, head.tier_bonus, bonus, lane)

    def _affinity_entry(self, head: Job, entries: list[_Entry], model: str | None) -> _Entry | None:
        """The oldest of ``entries`` for ``model`` within ``W`` of ``head`` (None: not eligible)."""
        if model is None or not self._scorer.affinity(model) > 0:
            return None
        config = self._scorer.config
        limit = head.arrival + config.max_affinity * config.aging_divisor
        for entry in entries:
            if entry.job.model == model and entry.job.arrival <= limit:
                return entry
        return None

    def _key(self, offer: _Offer) -> float:
        d = self._scorer.config.aging_divisor
        return offer.level + offer.tier + offer.affinity - offer.s / d

    def _counterfactuals(self, offers: list[_Offer], worker: _Worker) -> dict[str, Job]:
        """The winner without each term of the score (the size-1 note's Observability)."""
        d = self._scorer.config.aging_divisor

        def order(key: Callable[[_Offer], float]) -> Callable[[_Offer], tuple[float, ...]]:
            return lambda o: (-key(o), o.s, o.entry.job.seq)

        aging = min(offers, key=order(lambda o: o.level + o.tier + o.affinity))
        affinity = min(
            (o if o.affinity == 0 else self._plain(o) for o in offers),
            key=order(lambda o: o.level + o.tier - o.s / d),
        )
        tier = min(offers, key=order(lambda o: o.level + o.affinity - o.s / d))
        # Fair share: per-job aging over each lane's head and its oldest resident-model job.
        rows: list[tuple[float, float, int, Job]] = []
        model = worker.resident
        bonus = 0.0 if model is None else self._scorer.affinity(model)
        for level, _, entries, _ in self._backlogged():
            head = entries[0].job
            picks = [head]
            if model is not None and bonus > 0:
                picks += [e.job for e in entries if e.job.model == model][:1]
            for job in picks:
                aff = bonus if model is not None and bonus > 0 and job.model == model else 0
                key = level + head.tier_bonus + aff - job.arrival / d
                rows.append((-key, job.arrival, job.seq, job))
        fair = min(rows, key=lambda row: row[:3])[3]
        return {
            "aging": aging.entry.job,
            "affinity": affinity.entry.job,
            "tier": tier.entry.job,
            "fair_share": fair,
        }

    def _plain(self, offer: _Offer) -> _Offer:
        """The offer without affinity: the lane's head (every job is eligible here)."""
        entries = offer.lane.jobs if offer.lane is not None else [offer.entry]
        return attrs.evolve(offer, entry=entries[0], affinity=0.0)

    def _lift_floor(self, job: Job) -> float:
        """The lift's floor for a lane that ``job`` makes backlogged (``inf``: none at level)."""
        backlogged = [m for m in self._lanes.values() if m.level == job.priority and m.jobs]
        if not backlogged:
            return math.inf
        starved = min(backlogged, key=lambda m: m.s)  # min() keeps the first (oldest) on ties
        residents = {w.resident for w in self._workers.values() if not w.timed_out}
        residents.discard(None)
        mine = job.tier_bonus
        if job.model is not None and job.model in residents:
            mine += self._scorer.affinity(job.model)
        head = starved.jobs[0].job
        theirs = head.tier_bonus
        bonuses = [
            self._scorer.affinity(r)
            for r in residents
            if r is not None and self._affinity_entry(head, starved.jobs, r) is not None
        ]
        theirs += max(bonuses, default=0.0)
        return starved.s + max(0.0, mine - theirs) * self._scorer.config.aging_divisor

    def _lease(self, job: Job, info: WorkerInfo, now: float) -> Lease:
        """The grant's lease; ``LeaseError`` (naming the job) when ``lease_for`` fails."""
        fn = self._lease_for
        assert fn is not None
        try:
            if isinstance(fn, LeaseCalculator):
                seconds: object = fn(job)
                if info.slow:
                    source = job.payload if isinstance(job.payload, Mapping) else job
                    request = (
                        source
                        if isinstance(source, ImageRequest)
                        else ImageRequest.from_mapping(source)  # type: ignore[arg-type]
                    )
                    seconds = fn.for_request(attrs.evolve(request, extra_slow_worker=True))
            elif self._lease_takes_worker:
                seconds = fn(job, info)
            else:
                seconds = fn(job)
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

    def _expected_runtime(self, job: Job) -> float:
        if job.estimate is not None:
            return job.estimate
        if job.model is not None and self._recent_by_model.get(job.model):
            recent = self._recent_by_model[job.model]
            return sum(recent) / len(recent)
        recent = self._recent_by_level.get(job.priority, [])
        return sum(recent) / len(recent) if recent else DEFAULT_EXPECTED_RUNTIME

    def _charge_of(self, job: Job, runtime: float) -> float:
        """The charge model's value for ``job`` run for ``runtime`` (ValueError when bad)."""
        if self._charge == "runtime":
            charge: object = runtime
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
        return float(charge)

    def _finish(self, held: _Held, runtime: float, now: float) -> float:
        """Free a held job and correct its lane (complete, or cancel); return the charge."""
        job = held.grant.job
        charge = self._charge_of(job, runtime)
        self._workers[held.worker].held.remove(held)
        self._workers[held.worker].last_seen = now
        self._runtimes.append(runtime)
        if job.model is not None:
            self._remember(self._recent_by_model.setdefault(job.model, []), runtime)
        self._remember(self._recent_by_level.setdefault(job.priority, []), runtime)
        self._members[job.member].gpu_seconds += charge
        if self._fair_share:
            lane = self._lane_of(job)
            lane.release(held.c)
            lane.settled = min(lane.settled + charge / held.n, now)
            others = [m for m in self._lanes.values() if m.level == lane.level and m.jobs]
            if lane.jobs and others == [lane]:
                lane.settled = now  # alone at its level: re-anchored
        return charge

    @staticmethod
    def _remember(recent: list[float], runtime: float) -> None:
        recent.append(runtime)
        del recent[:-RECENT_RUNTIMES]

    def _take_back(self, taken: list[_Held], now: float, *, always_requeue: bool) -> set[int]:
        """Refund and requeue (or fail) held jobs; return the ``seq`` of those requeued."""
        requeued: set[int] = set()
        for held in sorted(taken, key=lambda h: h.grant.job.seq, reverse=True):
            job = held.grant.job
            self._workers[held.worker].held.remove(held)
            if self._fair_share:
                self._lane_of(job).release(held.c)  # the refund: exactly what was charged
            self._counts["expired"] += not always_requeue
            if always_requeue or held.grants < self._max_attempts:
                self._lane_of(job).jobs.insert(0, _Entry(job, now, held.grants))
                requeued.add(job.seq)
            else:
                self._counts["failed"] += 1
        return requeued

    # -- bookkeeping -------------------------------------------------------------------------

    def _info(self, worker: _Worker) -> WorkerInfo:
        return WorkerInfo(
            name=worker.name,
            models=worker.models,
            resident=worker.resident,
            slots=worker.slots,
            slow=worker.slow,
            held=tuple(held.grant.job.id for held in worker.held),
            last_seen=worker.last_seen,
            timed_out=worker.timed_out,
            filtered=worker.accepts is not None,
        )

    def _worker(self, name: str) -> _Worker:
        worker = self._workers.get(name)
        if worker is None:
            raise UnknownWorker(f"unknown worker {name!r}")
        return worker

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

    def _queued(self) -> list[_Entry]:
        return [entry for lane in self._lanes.values() for entry in lane.jobs]

    def _held(self) -> list[_Held]:
        held = [h for worker in self._workers.values() for h in worker.held]
        return sorted(held, key=lambda h: (h.grant.granted_at, h.grant.job.seq))

    def _held_by_id(self, job_id: str) -> _Held | None:
        return next((h for h in self._held() if h.grant.job.id == job_id), None)

    def _find(self, job_id: str) -> tuple[Job, JobState] | None:
        held = self._held_by_id(job_id)
        if held is not None:
            return held.grant.job, "running"
        for entry in self._queued():
            if entry.job.id == job_id:
                return entry.job, "queued"
        return None

    def _held_for(self, job_id: str, worker: str | None) -> _Held:
        """The held job ``job_id``, reported by ``worker`` (None: whoever holds it)."""
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        held = self._held_by_id(job_id)
        if held is None:
            raise InvalidState(f"job {job_id!r} is queued, not held by a worker")
        if worker is not None and worker != held.worker:
            raise InvalidState(f"job {job_id!r} is held by {held.worker!r}, not {worker!r}")
        return held

    def _lane_of(self, job: Job) -> _Lane:
        return self._lanes[(job.member, job.priority)]

    def _retry_after(self) -> float:
        recent = self._runtimes[-64:]
        return max(1.0, math.fsum(recent) / len(recent)) if recent else 30.0
