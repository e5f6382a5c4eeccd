"""The rules of :class:`~prioqueue.testing.ReferenceFleet`, from ``docs/design/fleet.md`` (private).

``ReferenceRules`` reads the lanes, the workers and the runtimes (it changes none of them) and
answers the note's questions, each recomputed from scratch over plain lists: whether a queued
job is eligible for a worker and the first cause when it is not, each lane's offer and key,
the least-served offers a crossing chooses among, the counterfactual winners behind the
reorder counts, whether a grant is on the fast path, the affinity bonus and the lift's floor.
It also keeps the one number its crossing rule carries from grant to grant: the crossing
credit. Which offer a pop grants is ``_choice``'s; the credit's refill and the overdue rule
are ``_overdue``'s.

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
  has an eligible job, the grant is a crossing. With the credit ``>= 0``, and the level it
  would serve (below) short of its share (the share gate: that level's grants' expected
  runtimes, each weighted ``exp(-age / 3600 s)``, over 3600 s, are below ``0.5 * share *
  N``), it goes ahead and the credit drops by ``(1 - share) * x``; the grant then goes to the
  best offer (by key) of the
  8 least-served lanes (smallest ``s``, ties: made first) at the level of the queued job below
  that level with the highest ``level - arrival / d`` (ties by arrival, then seq), or to the
  winner when that level offers the worker nothing or is the winner's. Otherwise the same
  choice at that highest level is granted instead, the credit rises by ``share * x`` (past
  the credit only: the gate earns nothing) and the deferred job's level counts a deferred
  crossing (``x`` the granted job's expected runtime).
  The completion moves the credit by ``weight * (runtime - x)``, a take-back by ``weight *
  (held - x)`` (``held``: the GPU time it held). On one worker a crossing that runs on
  another model than the resident one, while a higher level has a queued job for the
  resident, is charged that model's load too (the swap back, when its load time is known;
  ``load_back``), and no completion corrects it. The credit's refill and the overdue rule:
  ``_overdue``.
* The lift on submit is the size-1 note's, applied to the settled part (``settled =
  max(settled, min(now, floor))``, so a lane's held charges stay on top of it), with affinity
  offsets taken over the models resident on live workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs

from prioqueue._readonly import ReadOnly
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Job
from prioqueue.scoring import Scorer
from prioqueue.testing._lanes import Backlogged, ReferenceLanes
from prioqueue.testing._records import (
    IDLE_CAUSES,
    LEAST_SERVED,
    Entry,
    Lane,
    Offer,
    Worker,
    takes,
)
from prioqueue.testing._stats import Runtimes
from prioqueue.testing._workers import ReferenceWorkers

__all__: list[str] = []  # private module


_AFFINITY_PRICE = 1.0  # k of "Affinity as a priced trade" (docs/design/fleet.md)
# The share gate (docs/design/dispatcher.md, "The share gate"): a level's recent service
# decays by ``e`` per window; a crossing serves a level below this fraction of its share.
SHARE_WINDOW = 3600.0
SHORT_OF_SHARE = 0.5


class ReferenceRules:
    """The note's rules over the lanes and the workers (see the module docstring).

    Args:
        scorer: The scoring weights.
        policy: Resolves priority numbers and aliases (its named levels count as levels).
        lanes: The lanes (read).
        workers: The workers (read).
        runtimes: The finished runs' runtimes (read: the expected runtimes).
        fair_share: False makes every job its own lane.
        warm_hold: Placement: seconds a job stays reserved for a warm worker (0: off).
        load_seconds: Cold-load seconds per model.
        max_running: The most jobs of one member that workers hold, or None.
        share: The share of GPU time crossings may take.
    """

    scorer = ReadOnly[Scorer]("_scorer", "The scorer.")
    policy = ReadOnly[PriorityPolicy]("_policy", "The priority policy.")
    divisor = ReadOnly[float]("_divisor", "The aging divisor ``d``.")
    fair_share = ReadOnly[bool]("_fair_share", "Whether lanes are charged (fair share).")
    share = ReadOnly[float]("_share", "The share of GPU time crossings may take.")
    credit = ReadOnly[float]("_credit", "The crossing credit.")

    def __init__(
        self,
        scorer: Scorer,
        policy: PriorityPolicy,
        lanes: ReferenceLanes,
        workers: ReferenceWorkers,
        runtimes: Runtimes,
        *,
        fair_share: bool,
        warm_hold: float,
        load_seconds: Mapping[str, float],
        max_running: int | None,
        share: float,
    ) -> None:
        self._scorer = scorer
        self._policy = policy
        self._divisor = scorer.config.aging_divisor
        self._lanes = lanes
        self._workers = workers
        self._runtimes = runtimes
        self._fair_share = fair_share
        self._warm_hold = warm_hold
        self._load_seconds = dict(load_seconds)
        self._priced = True  # the affinity priced by the load times (a fleet's)
        self._max_running = max_running
        self._share = share
        self._credit = 0.0
        self._service: dict[int, tuple[float, float]] = {}

    def move_credit(self, delta: float) -> None:
        """Move the crossing credit by ``delta`` (a grant, a completion or a take-back)."""
        self._credit += delta

    def serve(self, level: int, now: float, runtime: float) -> None:
        """A grant at ``level`` adds its expected ``runtime`` to the level's recent service."""
        self._service[level] = (self._recent(level, now) + runtime, now)

    def _recent(self, level: int, now: float) -> float:
        served, at = self._service.get(level, (0.0, 0.0))
        return served * math.exp((at - now) / SHARE_WINDOW) if served else 0.0

    def short_of_share(self, level: int, now: float) -> bool:
        """The share gate: whether a crossing may serve ``level``.

        That is whether it used fewer GPUs over the recent window than
        ``SHORT_OF_SHARE * share * N``.
        """
        used = self._recent(level, now) / SHARE_WINDOW
        return used < SHORT_OF_SHARE * self._share * self.capacity

    def queued(self) -> list[Entry]:
        """Every queued entry (the lanes')."""
        return self._lanes.queued()

    def backlogged(self) -> list[Backlogged]:
        """``(level, s, entries, lane)`` of each backlogged lane (the lanes')."""
        return self._lanes.backlogged()

    @property
    def capacity(self) -> int:
        """``N = max(1, live workers)`` (the workers')."""
        return self._workers.capacity

    def keep_affinity_unpriced(self) -> None:
        """Leave the scorer's affinity unpriced.

        ``SizeOneDispatcher``'s load times price only its warm crossing.
        """
        self._priced = False

    def round_trip(self, resident: str | None, model: str) -> float | None:
        """What a deferral from ``resident`` to ``model`` costs one worker in loads, priced.

        ``k * (L(model) + L(resident))``: the swap to ``model`` now and the swap back (None
        when either load time is unknown). The one-worker warm crossing's limit.
        """
        back = self._load_seconds.get(resident or "")
        to = self._load_seconds.get(model)
        if resident is None or back is None or to is None:
            return None
        return _AFFINITY_PRICE * (to + back)

    def load_back(self, job: Job, resident: str | None) -> float:
        """The load a crossing ``job`` costs the levels above it: the swap back, or 0.

        The resident's load time when the capacity is one worker, ``job`` runs on another
        model than the ``resident``, that load time is known and a queued job of a level
        above ``job``'s runs on the resident (issue 26, eighth round).
        """
        if self.capacity > 1 or resident is None or job.model in (None, resident):
            return 0.0
        load = self._load_seconds.get(resident)
        above = (e.job for e in self._lanes.queued() if e.job.priority > job.priority)
        if load is None or not any(other.runs_on(resident) for other in above):
            return 0.0
        return load

    def expected_runtime(self, job: Job) -> float:
        """The expected runtime of ``job`` (the runtimes')."""
        return self._runtimes.expected(job)

    def idle_reasons(self, worker: Worker, now: float) -> dict[str, int]:
        """Queued jobs per first cause of ineligibility for ``worker`` (as ``pop`` decides)."""
        counts: dict[str, int] = {}
        queued = self._lanes.queued()
        causes = [self.ineligible(worker, entry, now) for entry in queued]
        if all(cause is not None for cause in causes):  # as pop: capped holds
            causes = [self.ineligible(worker, entry, now, True) for entry in queued]
        for cause in causes:
            if cause is not None:
                counts[cause] = counts.get(cause, 0) + 1
        return {cause: counts[cause] for cause in IDLE_CAUSES if cause in counts}

    def ineligible(
        self, worker: Worker, entry: Entry, now: float, capped: bool = False
    ) -> str | None:
        """The first cause that keeps ``entry`` from ``worker`` (None: it is eligible).

        ``capped``: the hold for a busy warm worker is capped at the model's load time (the
        note: only when nothing else is eligible for ``worker``).
        """
        job = entry.job
        if len(worker.held) >= worker.slots:
            return "slots_full"
        if self._max_running is not None:
            running = sum(1 for held in self._workers.held() if held.job.member == job.member)
            if running >= self._max_running:
                return "member_cap"
        misfit = worker.misfit(job)
        if misfit is not None:
            return misfit
        if worker.accepts is not None and not worker.accepts(job):
            return "accepts"
        if (
            self._warm_hold > 0
            and job.model is not None
            and job.model != worker.resident
            and not self._starving(job, now)
        ):
            others = [other for other in self._workers.all() if other is not worker]
            if (
                any(other.free_warm_for(job.model) for other in others)
                and now < entry.queued_at + self._warm_hold
            ):
                return "warm_hold"
            if self._kept_for_busy_warm(job, others, now, capped):
                return "warm_hold"
        return None

    def _starving(self, job: Job, now: float) -> bool:
        """Whether ``job`` waited its level's aging bound (placement never holds such a job).

        The bound is ``(top - level) * d + (T + A) * d`` with ``top`` the highest queued level.
        """
        config = self._scorer.config
        tiers = list(config.tier_bonuses.values())
        offsets = ((max(tiers) - min(tiers) if tiers else 0.0) + config.max_affinity) * (
            self._divisor
        )
        top = max(entry.job.priority for entry in self._lanes.queued())
        return now - job.arrival >= (top - job.priority) * self._divisor + offsets

    def _kept_for_busy_warm(self, job: Job, others: list[Worker], now: float, capped: bool) -> bool:
        """The note's case 2: the warm workers are expected to start ``job`` in time.

        Taking the model's queued jobs by seq, each on the first worker expected free, they
        start ``job`` within ``min(h, load)`` of ``now``.
        """
        h = self._warm_hold
        free: list[float] = []  # the busy warm workers' expected free times
        for other in others:
            if other.busy_warm_for(job.model, now, h):
                free.append(min(x.grant.granted_at + x.expected_runtime for x in other.held))
        if not free:
            return False
        load = self._load_seconds.get(job.model or "") if capped else None
        deadline = now + (h if load is None or load > h else load)
        older = sorted(
            (
                e.job
                for e in self._lanes.queued()
                if e.job.model == job.model and e.job.seq < job.seq
            ),
            key=lambda j: j.seq,
        )
        for ahead in older:
            start = min(free)
            if start > deadline:
                return False
            free.remove(start)
            free.append(max(start, now) + self._runtimes.expected(ahead))
        return min(free) <= deadline

    def fast_path(self, worker: Worker, now: float) -> bool:
        """Whether a grant to ``worker`` counts reorders (the note's fast path).

        The worker serves every model with no ``accepts``; with ``warm_hold``, no other live
        worker is free-warm or busy-warm for the model it has loaded (whether or not a queued
        job would be held); with a member cap, the winner among *all* queued jobs belongs to a
        member under the cap. Then the winner is the one the counterfactual rankings (which
        know nothing of eligibility) compete with.
        """
        if worker.models is not None or worker.accepts is not None or worker.capabilities:
            return False
        if self._warm_hold > 0 and any(
            other is not worker
            and (
                other.free_warm_for(other.resident)
                or other.busy_warm_for(other.resident, now, self._warm_hold)
            )
            for other in self._workers.all()
        ):
            return False
        if self._max_running is not None:
            offers = self.offers(worker, lambda entry: True)
            win = min(offers, key=lambda o: (-self.key(o), o.s, o.tie))
            mine = sum(1 for held in self._workers.held() if held.job.member == win.head.member)
            return mine < self._max_running
        return True

    def offers(self, worker: Worker, eligible_to: Callable[[Entry], bool]) -> list[Offer]:
        """Each backlogged lane's offer to ``worker`` among the entries ``eligible_to`` keeps.

        A lane with no such entry offers nothing.
        """
        offers = []
        # A resident the worker does not serve earns no bonus (a job that accepts it and
        # another model would run on the other: a swap).
        resident = worker.resident if worker.serves(worker.resident) else None
        for level, s, entries, lane in self.backlogged():
            eligible = [e for e in entries if eligible_to(e)]
            if eligible:
                offers.append(self.offer(level, s, entries, eligible, resident, lane))
        return offers

    def offer(
        self,
        level: int,
        s: float,
        entries: list[Entry],
        eligible: list[Entry],
        resident: str | None,
        lane: Lane | None,
    ) -> Offer:
        head = entries[0].job
        choice = self._affinity_entry(head, entries, resident, eligible)
        if choice is None or resident is None:
            return Offer(level, s, head, eligible[0], head.tier_bonus, 0.0, lane, head.seq)
        bonus = self.bonus(resident)
        first = next(e.job.seq for e in entries if takes(e.job, resident))
        return Offer(level, s, head, choice, head.tier_bonus, bonus, lane, first)

    def bonus(self, model: str) -> float:
        """The affinity bonus of ``model``: the scorer's, priced (docs/design/fleet.md).

        With the model's load time ``L`` known, at most ``k * L / d`` with ``k = 1``: affinity
        may cost a waiting job at most one cold load of the model it keeps loaded.
        """
        bonus = self._scorer.affinity(model)
        load = self._load_seconds.get(model)
        if load is not None and self._priced:
            bonus = min(bonus, _AFFINITY_PRICE * load / self._scorer.config.aging_divisor)
        return bonus

    def _affinity_entry(
        self,
        head: Job,
        entries: list[Entry],
        model: str | None,
        eligible: list[Entry] | None = None,
    ) -> Entry | None:
        """The lane's affinity job for ``model`` (None: the lane is not eligible for it).

        The lane's jobs for ``model`` are read in lane order: the first that arrived later than
        ``W`` after ``head`` ends the search; otherwise the first in ``eligible`` (every one
        when None) is the affinity job.
        """
        if model is None or not self.bonus(model) > 0:
            return None
        config = self._scorer.config
        limit = head.arrival + config.max_affinity * config.aging_divisor
        for entry in entries:
            if not takes(entry.job, model):
                continue
            if entry.job.arrival > limit:
                return None
            if eligible is None or any(entry is other for other in eligible):
                return entry
        return None

    def least_served(self, offers: list[Offer], level: int) -> Offer | None:
        """The offer a crossing or a deferral takes at ``level``, or None.

        Of the ``LEAST_SERVED`` offers at the level with the smallest ``s`` (ties: the lane made
        first; without fair share each job is a lane: by arrival, then seq), the one with the
        highest key (ties by ``s``, then the tie seq).
        """
        there = [o for o in offers if o.level == level]  # offers come in lane creation order
        if self._fair_share:
            there.sort(key=lambda o: o.s)  # stable: the lane made first stays first
        else:
            there.sort(key=lambda o: (o.s, o.entry.job.seq))
        if not there:
            return None
        return min(there[:LEAST_SERVED], key=lambda o: (-self.key(o), o.s, o.tie))

    def key(self, offer: Offer) -> float:
        d = self._scorer.config.aging_divisor
        return offer.level + offer.tier + offer.affinity - offer.s / d

    def counterfactuals(self, offers: list[Offer], worker: Worker) -> dict[str, Job]:
        """The winner without each term of the score (the size-1 note's Observability)."""
        d = self._scorer.config.aging_divisor

        def order(key: Callable[[Offer], float]) -> Callable[[Offer], tuple[float, ...]]:
            return lambda o: (-key(o), o.s, o.tie)

        aging = min(offers, key=order(lambda o: o.level + o.tier + o.affinity))
        affinity = min(
            (o if o.affinity == 0 else self._plain(o) for o in offers),
            key=order(lambda o: o.level + o.tier - o.s / d),
        )
        tier = min(offers, key=order(lambda o: o.level + o.affinity - o.s / d))
        # Fair share: per-job aging over each lane's head and its oldest resident-model job.
        rows: list[tuple[float, float, int, Job]] = []
        model = worker.resident
        bonus = 0.0 if model is None else self.bonus(model)
        for level, _, entries, _ in self.backlogged():
            head = entries[0].job
            picks = [head]
            if model is not None and bonus > 0:
                picks += [e.job for e in entries if takes(e.job, model)][:1]
            for job in picks:
                aff = bonus if model is not None and bonus > 0 and takes(job, model) else 0
                key = level + head.tier_bonus + aff - job.arrival / d
                rows.append((-key, job.arrival, job.seq, job))
        fair = min(rows, key=lambda row: row[:3])[3]
        return {
            "aging": aging.entry.job,
            "affinity": affinity.entry.job,
            "tier": tier.entry.job,
            "fair_share": fair,
        }

    def _plain(self, offer: Offer) -> Offer:
        """The offer without affinity: the lane's head (every job is eligible here)."""
        entries = offer.lane.jobs if offer.lane is not None else [offer.entry]
        return attrs.evolve(offer, entry=entries[0], affinity=0.0, tie=entries[0].job.seq)

    def lift_floor(self, job: Job) -> float:
        """The lift's floor for a lane that ``job`` makes backlogged (``inf``: none at level).

        The most-starved lane's ``s``, later by the tier bonus ``job`` has over its head's
        (the affinity is not counted: issue 26, twelfth round).
        """
        backlogged = [m for m in self._lanes.lanes() if m.level == job.priority and m.jobs]
        if not backlogged:
            return math.inf
        starved = min(backlogged, key=lambda m: m.s)  # min() keeps the first (oldest) on ties
        gap = job.tier_bonus - starved.jobs[0].job.tier_bonus
        return starved.s + max(0.0, gap) * self._scorer.config.aging_divisor
