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
  its oldest eligible job at ``level + tier(head) - s / d``, or, when its jobs for ``w``'s
  resident model ``r`` (read in lane order, stopping at the first that arrived more than
  ``W`` after the head) include an eligible one, the first such at ``+ aff(r)``. Highest key
  wins; ties by smaller ``s``, then by the smaller seq of the lane's own job (its head for a
  plain offer, its first job for ``r`` for an affinity offer).
* The grant charges the lane ``c = expected / N`` up front (``held += c``, no clamp).
  Completion corrects it: ``c`` leaves ``held`` and ``settled = min(settled + F / N, now)``,
  then ``settled = now`` (re-anchored) when the lane is the only backlogged one at its level;
  that is the note's ``s += F / N - c; s = min(s, now + held)``. A take-back (lease expiry,
  worker timeout, leave) refunds ``c`` exactly and requeues the job at its lane's head (or
  fails it after ``max_attempts`` grants; ``leave`` always requeues).
* Bounded crossings: when the winner's level is below the highest level at which the worker
  has an eligible job, the grant is a crossing. With the credit ``>= 0`` it goes ahead and the
  credit drops by ``(1 - share) * x``; the grant then goes to the best offer (by key) of the
  8 least-served lanes (smallest ``s``, ties: made first) at the level of the queued job below
  that level with the highest ``level - arrival / d`` (ties by arrival, then seq), or to the
  winner when that level offers the worker nothing or is the winner's. Otherwise the same
  choice at that highest level is granted instead, the credit rises by ``share * x`` and the
  deferred job's level counts a deferred crossing (``x`` the granted job's expected runtime).
  The completion moves the credit by ``weight * (runtime - x)``, a take-back by ``-weight *
  x``. The credit's refill and the overdue rule: ``_overdue``.
* The lift on submit is the size-1 note's, applied to the settled part (``settled =
  max(settled, min(now, floor))``, so a lane's held charges stay on top of it), with affinity
  offsets taken over the models resident on live workers.

Statistics are modelled (reorders only on fast-path grants: see ``_fast_path``); ``explain``,
``forecast`` and snapshots are not. Argument checks are minimal, but every error the tests
compare raises the same exception type as the real dispatcher.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

from prioqueue._batch import BatchPop
from prioqueue._errors import DuplicateJob, LeaseExpired
from prioqueue._groups import checked_group
from prioqueue._spec import check_options
from prioqueue.capabilities import checked_needs
from prioqueue.lifecycle import Backoff
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Completed, Expired, Grant, Job, Stats, Ticket
from prioqueue.scoring import ScoreBreakdown, Scorer
from prioqueue.testing._lifecycle import _Delayed
from prioqueue.testing._options import DEFAULTS, FleetOptions
from prioqueue.testing._overdue import overdue, refilled, starving_level
from prioqueue.testing._state import (
    DEFAULT_EXPECTED_RUNTIME,
    RECENT_RUNTIMES,
    CauseName,
    _Entry,
    _finite,
    _Held,
    _Lane,
    _LevelCounters,
    _MemberCounters,
    _Offer,
    _takes_worker,
    _Worker,
)
from prioqueue.testing._workers import _Workers

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._spec import SubmitOptions

__all__ = ["DEFAULT_EXPECTED_RUNTIME", "RECENT_RUNTIMES", "ReferenceFleet"]


class ReferenceFleet(BatchPop, _Workers):
    """A brute-force model of ``FleetDispatcher`` for tests: same calls, same answers.

    Each option left out takes ``FleetDispatcher``'s default.

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
        warm_hold: Placement: seconds a job stays reserved for a warm worker (0: off).
        load_seconds: Cold-load seconds per model (caps the wait for a busy warm worker).
        fair_share: False makes every job its own lane with ``s = arrival`` and no charge.
        track_reorders: False leaves the reorder counts at zero.
        crossing_share: The share of GPU time crossings may take (1: never deferred).
        wait_buckets: Upper bounds of the grant-wait histogram (``inf`` is appended).
        budgets: ``{level: LevelBudget}`` (docs/design/lifecycle.md; ``_lifecycle``).
        backoff: The retry delays of ``fail(retry=True)`` for jobs without their own.

    Attributes:
        scorer: The scorer (read-only).
        policy: The priority policy (read-only).

    Raises:
        TypeError: An option ``FleetDispatcher`` does not take (or ``history``,
            ``history_bytes``: the model keeps no history).
    """

    def __init__(self, scorer: Scorer | None = None, **options: Unpack[FleetOptions]) -> None:
        check_options(
            options, call="ReferenceFleet()", named="scorer", allowed=FleetOptions.__annotations__
        )
        o: FleetOptions = {**DEFAULTS, **options}
        policy, lease_for = o["policy"], o["lease_for"]
        self._scorer = Scorer() if scorer is None else scorer
        self._policy = PriorityPolicy() if policy is None else policy
        self._divisor = self._scorer.config.aging_divisor
        self._charge = o["charge"]
        self._lease_for = lease_for
        self._lease_takes_worker = lease_for is not None and _takes_worker(lease_for)
        self._max_queued = o["max_queued"]
        self._max_per_member = o["max_queued_per_member"]
        self._max_running = o["max_running_per_member"]
        self._max_attempts = o["max_attempts"]
        self._worker_timeout = o["worker_timeout"]
        self._warm_hold = float(o["warm_hold"])
        self._load_seconds = dict(o["load_seconds"] or {})
        self._fair_share = o["fair_share"]
        self._track_reorders = o["track_reorders"]
        self._share = float(o["crossing_share"])
        self._credit = 0.0
        bounds = tuple(float(bound) for bound in o["wait_buckets"])
        self._buckets = bounds if bounds and bounds[-1] == math.inf else (*bounds, math.inf)
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._workers: dict[str, _Worker] = {}
        self._latest = -math.inf
        self._seq = 0
        self._labels: dict[str, str | None] = {}  # job id -> group label
        self._levels: dict[int, _LevelCounters] = {}
        self._members: dict[str, _MemberCounters] = {}
        self._runtimes: list[float] = []
        self._recent_by_model: dict[str, list[float]] = {}
        self._recent_by_level: dict[int, list[float]] = {}
        self._counts = {"completed": 0, "cancelled": 0, "expired": 0, "failed": 0, "swaps": 0}
        self._lifecycle_init(o["budgets"], o["backoff"])

    # -- jobs --------------------------------------------------------------------------------

    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[SubmitOptions]
    ) -> Ticket:
        """Queue a job at the tail of its lane, lifting the lane if it was not backlogged.

        With a ``not_before`` after ``now`` the job is delayed instead (its arrival is then
        ``not_before``); ``ttl`` gives it a deadline ``ttl`` after its arrival (the level's
        budget's ``ttl`` when not given).

        Args:
            job_id: A unique id among the queued and held jobs.
            member: Who the job belongs to.
            now: The current time.
            **options: What :meth:`FleetDispatcher.submit <prioqueue.fleet.FleetDispatcher.
                submit>` takes: ``priority`` (a number, alias or header value, resolved by the
                policy), ``tier``, ``model``, ``estimate`` (> 0 or None), ``payload``,
                ``ceiling`` (kept even below the policy's minimum), ``ttl``, ``not_before``,
                ``max_attempts`` and ``backoff``. Of ``group``, only the label is kept (for
                ``pop_many(siblings=True)``): group counts are not modelled.

        Returns:
            The ticket.

        Raises:
            TypeError: An unknown option.
            ValueError: ``now`` went backwards, the tier is unknown, or an argument is bad.
            DuplicateJob: The id is queued or held.
            QueueFull: A queue limit is reached.
        """
        check_options(options)
        with self._at(now) as t:
            job = self._new_job(job_id, member, t, options)
            group = options.get("group")
            self._labels[job_id] = None if group is None else checked_group(group)
            self._seq += 1
            self._levels.setdefault(job.priority, _LevelCounters())
            self._members.setdefault(member, _MemberCounters())
            if job.not_before is not None:
                self._delayed.append(_Delayed(job, 0, job.arrival))
                return Ticket(job=job, queued=len(self))
            lane = self._lanes.setdefault((member, job.priority), _Lane(member, job.priority))
            if self._fair_share and not lane.jobs:  # the lift, of the settled part
                lane.settled = max(lane.settled, min(t, self._lift_floor(job)))
            lane.jobs.append(_Entry(job, t))
            return Ticket(job=job, queued=len(self))

    def _new_job(self, job_id: str, member: str, now: float, options: SubmitOptions) -> Job:
        """The job a submit describes, after every check (in the real dispatcher's order)."""
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty str, got {job_id!r}")
        if not isinstance(member, str) or not member:
            raise ValueError(f"member must be a non-empty str, got {member!r}")
        estimate = options.get("estimate")
        if estimate is not None and not (_finite("estimate", estimate) > 0):
            raise ValueError(f"estimate must be > 0 or None, got {estimate!r}")
        level = self._policy.parse(options.get("priority", 0), options.get("ceiling"))
        tier = options.get("tier", "free")
        bonus = self._scorer.tier_bonus(tier)
        if self._find(job_id) is not None:
            raise DuplicateJob(f"job {job_id!r} is already queued or held")
        not_before = options.get("not_before")
        delayed = not_before is not None and not_before > now
        budget = self._admit(member, level, delayed)
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
            seq=self._seq,
            payload=options.get("payload"),
            deadline=None if ttl is None else arrival + ttl,
            not_before=arrival if delayed else None,
            max_attempts=options.get("max_attempts"),
            backoff=cast("Backoff | None", options.get("backoff")),
            needs=checked_needs(options.get("needs")),
        )

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
        with self._at(now) as t:
            worker = self._worker(name)
            worker.last_seen, worker.timed_out = t, False  # heard from, whatever follows
            return self._pop(worker, t)

    def _warm_crossing(self, worker: _Worker, win: _Offer, served: _Offer, now: float) -> bool:
        """Whether a crossing past its credit is granted anyway (the design note's warm rule).

        On a fleet (more than one live worker), a crossing that runs warm (its offer carries
        the worker's affinity) is not deferred for a job that needs another model on this
        worker and has waited less than that affinity is worth: ``affinity * divisor``.
        """
        job = served.entry.job
        return (
            self.capacity > 1
            and win.affinity > 0
            and job.model is not None
            and job.model != worker.resident
            and now - job.arrival < win.affinity * self._divisor
        )

    def _pop(self, worker: _Worker, now: float) -> Grant | None:
        if len(worker.held) >= worker.slots:
            return None
        offers = self._offers(worker, lambda e: self._ineligible(worker, e, now) is None)
        if not offers:  # nothing else to run: holds for busy warm workers capped at loads
            offers = self._offers(worker, lambda e: self._ineligible(worker, e, now, True) is None)
        if not offers:
            return None
        win = min(offers, key=lambda o: (-self._key(o), o.s, o.tie))
        scored = win
        # Bounded crossings: a winner below the highest level with an eligible job crosses it.
        top = max(o.level for o in offers)
        weight = 0.0
        deferred: _Offer | None = None
        if self._share < 1 and win.level < top:
            if self._credit >= 0:
                weight = -(1 - self._share)
                starving = starving_level(self, top, now)
                if starving != win.level:
                    win = self._least_served(offers, starving) or win
            else:
                served = self._least_served(offers, top)
                assert served is not None
                if self._warm_crossing(worker, win, served, now):
                    weight = -(1 - self._share)
                else:
                    deferred = win
                    weight = self._share
                    win = served
        weight = refilled(self, win, weight)  # and the overdue rule (see ``_overdue``)
        win = overdue(self, win, worker, now)
        entry = win.entry
        job = worker.chosen(entry.job)  # a multi-model job carries the model it was granted
        info = self._info(worker)
        lease = None if self._lease_for is None else self._lease(job, info, now)
        runtime = self._expected_runtime(job)
        expected = self._charge_of(job, runtime)
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
        if self._track_reorders and self._fast_path(worker, now):
            # The counterfactual rankings know nothing of eligibility: every queued job counts.
            # They are compared with the score's winner (before a crossing changes the grant),
            # at its level.
            everything = self._offers(worker, lambda entry: True)
            for cause, other in self._counterfactuals(everything, worker).items():
                if other.seq != scored.entry.job.seq:
                    self._levels[scored.level].reorders[cause] += 1
        self._lane_of(job).jobs.remove(entry)
        if self._fair_share:
            self._lane_of(job).hold(c)
        self._credit += weight * runtime
        if deferred is not None:
            self._levels[deferred.level].reorders["deferred_crossings"] += 1
        worker.held.append(
            _Held(grant, worker.name, entry.grants + 1, c, n, runtime, weight, entry.job)
        )
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
        with self._at(now) as t:
            held = self._held_for(job_id, worker)
            grant = held.grant
            if grant.lease is not None and t >= grant.lease.deadline:
                raise LeaseExpired(f"the lease of {job_id!r} expired at {grant.lease.deadline}")
            if runtime is not None and not _finite("runtime", runtime) >= 0:
                raise ValueError(f"runtime must be >= 0, got {runtime!r}")
            ran = t - grant.granted_at if runtime is None else float(runtime)
            charge = self._finish(held, ran, t)
            self._counts["completed"] += 1
            self._members[held.job.member].completed += 1
            return Completed(job=held.job, runtime=ran, charge=charge)

    def cancel(self, job_id: str, *, now: float, worker: str | None = None) -> Job:
        """Drop a queued job, or finish a held one (charged for the time it ran).

        A cancel naming the holding worker counts as word from it (its ``last_seen``); a
        client's cancel without ``worker`` does not.

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
        with self._at(now) as t:
            job, state = self._found(job_id)
            if state == "running":
                self._end_run(job_id, worker, t)
            else:
                self._drop_queued(job)
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
        with self._at(now) as t:
            due: list[tuple[_Held, float, CauseName]] = [
                (held, held.grant.lease.deadline, "lease")
                for held in self._held()
                if held.grant.lease is not None and held.grant.lease.deadline <= t
            ]
            if self._worker_timeout is not None:
                taken = {id(held) for held, _, _ in due}
                for worker in self._workers.values():
                    silent_since = worker.last_seen + self._worker_timeout
                    if worker.timed_out or silent_since > t:
                        continue
                    worker.timed_out = True
                    for held in worker.held:
                        if id(held) not in taken:
                            lease = held.grant.lease
                            deadline = silent_since if lease is None else lease.deadline
                            due.append((held, deadline, "worker_timeout"))
            lapsed, self._lapsed = self._lapsed, []
            requeued = self._take_back([held for held, _, _ in due], t, always_requeue=False)
            self._advance(t)  # a job requeued past its deadline expires t
            lapsed += self._lapsed
            self._lapsed = []
            records = [
                Expired(
                    held.job,
                    held.grants,
                    deadline,
                    held.job.seq in requeued,
                    worker=held.worker,
                    cause=cause,
                )
                for held, deadline, cause in due
            ]
            return sorted(records, key=lambda record: record.job.seq) + lapsed

    def next_deadline(self) -> float | None:
        """The earliest lease deadline, live worker's timeout, or lifecycle timer, or None."""
        times = self._timer_times()
        base = super().next_deadline()
        if base is not None:
            times.append(base)
        return min(times, default=None)

    def stats(self, *, now: float) -> Stats:
        """The statistics (see ``_Rules.stats``) with the lifecycle's counts."""
        return self._with_lifecycle(super().stats(now=now))
