"""The rules of :class:`~prioqueue.testing.ReferenceFleet`, from ``docs/design/fleet.md`` (private).

Eligibility, each lane's offer and key, the counterfactual winners behind the reorder counts,
the lift, the lease, the expected and final charges, the correction at completion and the
refund at a take-back, and the statistics: each recomputed from scratch over plain lists.
The reference's rules side by side, so one concern, past the 500-line gauge on purpose.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from prioqueue._errors import LeaseError
from prioqueue.lease import ImageRequest, Lease, LeaseCalculator
from prioqueue.records import Job, LevelStats, MemberStats, Reorders, Stats, WorkerInfo
from prioqueue.testing._state import (
    DEFAULT_EXPECTED_RUNTIME,
    LEAST_SERVED,
    RECENT_RUNTIMES,
    _Book,
    _Entry,
    _Held,
    _Lane,
    _Offer,
    _Worker,
)

__all__: list[str] = []  # private module


_AFFINITY_PRICE = 1.0  # k of "Affinity as a priced trade" (docs/design/fleet.md)


class _Rules(_Book):
    """The note's rules over the state (see the module docstring)."""

    def _ineligible(
        self, worker: _Worker, entry: _Entry, now: float, capped: bool = False
    ) -> str | None:
        """The first cause that keeps ``entry`` from ``worker`` (None: it is eligible).

        ``capped``: the hold for a busy warm worker is capped at the model's load time (the
        note: only when nothing else is eligible for ``worker``).
        """
        job = entry.job
        if len(worker.held) >= worker.slots:
            return "slots_full"
        if self._max_running is not None:
            running = sum(1 for held in self._held() if held.job.member == job.member)
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
            others = [other for other in self._workers.values() if other is not worker]
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
        top = max(entry.job.priority for entry in self._queued())
        return now - job.arrival >= (top - job.priority) * self._divisor + offsets

    def _kept_for_busy_warm(
        self, job: Job, others: list[_Worker], now: float, capped: bool
    ) -> bool:
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
            (e.job for e in self._queued() if e.job.model == job.model and e.job.seq < job.seq),
            key=lambda j: j.seq,
        )
        for ahead in older:
            start = min(free)
            if start > deadline:
                return False
            free.remove(start)
            free.append(max(start, now) + self._expected_runtime(ahead))
        return min(free) <= deadline

    def _fast_path(self, worker: _Worker, now: float) -> bool:
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
            for other in self._workers.values()
        ):
            return False
        if self._max_running is not None:
            offers = self._offers(worker, lambda entry: True)
            win = min(offers, key=lambda o: (-self._key(o), o.s, o.tie))
            mine = sum(1 for held in self._held() if held.job.member == win.head.member)
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
        # A resident the worker does not serve earns no bonus (a job that accepts it and
        # another model would run on the other: a swap).
        resident = worker.resident if worker.serves(worker.resident) else None
        for level, s, entries, lane in self._backlogged():
            eligible = [e for e in entries if eligible_to(e)]
            if eligible:
                offers.append(self._offer(level, s, entries, eligible, resident, lane))
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
        choice = self._affinity_entry(head, entries, resident, eligible)
        if choice is None or resident is None:
            return _Offer(level, s, head, eligible[0], head.tier_bonus, 0.0, lane, head.seq)
        bonus = self._bonus(resident)
        first = next(e.job.seq for e in entries if _takes(e.job, resident))
        return _Offer(level, s, head, choice, head.tier_bonus, bonus, lane, first)

    def _bonus(self, model: str) -> float:
        """The affinity bonus of ``model``: the scorer's, priced (docs/design/fleet.md).

        With the model's load time ``L`` known, at most ``k * L / d`` with ``k = 1``: affinity
        may cost a waiting job at most one cold load of the model it keeps loaded.
        """
        bonus = self._scorer.affinity(model)
        load = self._load_seconds.get(model)
        if load is not None:
            bonus = min(bonus, _AFFINITY_PRICE * load / self._scorer.config.aging_divisor)
        return bonus

    def _affinity_entry(
        self,
        head: Job,
        entries: list[_Entry],
        model: str | None,
        eligible: list[_Entry] | None = None,
    ) -> _Entry | None:
        """The lane's affinity job for ``model`` (None: the lane is not eligible for it).

        The lane's jobs for ``model`` are read in lane order: the first that arrived later than
        ``W`` after ``head`` ends the search; otherwise the first in ``eligible`` (every one
        when None) is the affinity job.
        """
        if model is None or not self._bonus(model) > 0:
            return None
        config = self._scorer.config
        limit = head.arrival + config.max_affinity * config.aging_divisor
        for entry in entries:
            if not _takes(entry.job, model):
                continue
            if entry.job.arrival > limit:
                return None
            if eligible is None or any(entry is other for other in eligible):
                return entry
        return None

    def _least_served(self, offers: list[_Offer], level: int) -> _Offer | None:
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
        return min(there[:LEAST_SERVED], key=lambda o: (-self._key(o), o.s, o.tie))

    def _key(self, offer: _Offer) -> float:
        d = self._scorer.config.aging_divisor
        return offer.level + offer.tier + offer.affinity - offer.s / d

    def _counterfactuals(self, offers: list[_Offer], worker: _Worker) -> dict[str, Job]:
        """The winner without each term of the score (the size-1 note's Observability)."""
        d = self._scorer.config.aging_divisor

        def order(key: Callable[[_Offer], float]) -> Callable[[_Offer], tuple[float, ...]]:
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
        bonus = 0.0 if model is None else self._bonus(model)
        for level, _, entries, _ in self._backlogged():
            head = entries[0].job
            picks = [head]
            if model is not None and bonus > 0:
                picks += [e.job for e in entries if _takes(e.job, model)][:1]
            for job in picks:
                aff = bonus if model is not None and bonus > 0 and _takes(job, model) else 0
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
        return attrs.evolve(offer, entry=entries[0], affinity=0.0, tie=entries[0].job.seq)

    def _lift_floor(self, job: Job) -> float:
        """The lift's floor for a lane that ``job`` makes backlogged (``inf``: none at level)."""
        backlogged = [m for m in self._lanes.values() if m.level == job.priority and m.jobs]
        if not backlogged:
            return math.inf
        starved = min(backlogged, key=lambda m: m.s)  # min() keeps the first (oldest) on ties
        residents = {
            w.resident for w in self._workers.values() if not w.timed_out and w.resident is not None
        }
        mine = job.tier_bonus
        mine += max((self._bonus(r) for r in residents if _takes(job, r)), default=0.0)
        head = starved.jobs[0].job
        theirs = head.tier_bonus
        bonuses = [
            self._bonus(r)
            for r in residents
            if r is not None and self._affinity_entry(head, starved.jobs, r) is not None
        ]
        theirs += max(bonuses, default=0.0)
        return starved.s + max(0.0, mine - theirs) * self._scorer.config.aging_divisor

    def _lease(self, job: Job, info: WorkerInfo, now: float) -> Lease:
        """The grant's lease; ``LeaseError`` (naming the job) when ``lease_for`` fails."""
        fn = self._lease_for
        assert fn is not None
        calculator: object = fn
        try:
            if isinstance(calculator, LeaseCalculator):  # the slow flag is its extra_slow_worker
                seconds: object = calculator(job)
                if info.slow:
                    payload = job.payload
                    request = (
                        payload
                        if isinstance(payload, ImageRequest)
                        else ImageRequest.from_mapping(payload)
                    )
                    request = attrs.evolve(request, extra_slow_worker=True)
                    seconds = calculator.for_request(request)
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

    def _end_run(self, job_id: str, worker: str | None, now: float) -> _Held:
        """Finish a held job's run as a cancel or a failure does: charged for the time held.

        Only a call naming the holder counts as word from it (its ``last_seen``).
        """
        held = self._held_for(job_id, worker)
        seen = self._workers[held.worker].last_seen
        self._finish(held, now - held.grant.granted_at, now)
        if worker is None:  # a client's call is no word from the worker
            self._workers[held.worker].last_seen = seen
        return held

    def _finish(self, held: _Held, runtime: float, now: float) -> float:
        """Free a held job and correct its lane (complete, or cancel); return the charge."""
        job = held.job
        charge = self._charge_of(job, runtime)
        self._credit += held.weight * (runtime - held.expected_runtime)
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
        for held in sorted(taken, key=lambda h: h.job.seq, reverse=True):
            job = held.job
            self._workers[held.worker].held.remove(held)
            # The crossing credit counts the GPU time the job really held (a hang up to its
            # lease's expiry, a lost worker until it was given up), not its estimate.
            spent = max(0.0, now - held.grant.granted_at)
            self._credit += held.weight * (spent - held.expected_runtime)
            if self._fair_share:
                self._lane_of(job).release(held.c)  # the refund: exactly what was charged
            self._counts["expired"] += not always_requeue
            if always_requeue or held.grants < (job.max_attempts or self._max_attempts):
                self._lane_of(job).jobs.insert(0, _Entry(job, now, held.grants))
                requeued.add(job.seq)
            else:
                self._counts["failed"] += 1
        return requeued

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
        with self._at(now) as t:
            queued = [entry.job for entry in self._queued()]
            levels: dict[int, LevelStats] = {}
            for level in sorted(self._levels, reverse=True):
                counters = self._levels[level]
                waits = [t - job.arrival for job in queued if job.priority == level]
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
                    running=sum(1 for h in self._held() if h.job.member == name),
                )
                for name, counters in self._members.items()
            }
            held = self._held()
            first = next(iter(self._workers.values()), None)
            return Stats(
                now=t,
                levels=levels,
                members=members,
                running=held[0].job if held else None,
                resident_model=None if first is None else first.resident,
                queued=len(queued),
                dispatched=sum(counters.dispatched for counters in self._levels.values()),
                **self._counts,
                held=tuple(h.job for h in held),
                workers=tuple(self.workers()),
            )


def _takes(job: Job, model: str | None) -> bool:
    """Whether ``job`` runs on ``model``: its model, or one of several it accepts."""
    if job.model is not None:
        return job.model == model
    return job.needs is not None and model in job.needs.models
