"""Grants and the ends of runs in :class:`~prioqueue.testing.ReferenceFleet` (private).

``ReferenceGrants`` applies what happens to a held job across the owners it is given, each
through its own methods: a grant (the offer ``choose`` picks, its lease and up-front charge,
the reorder counts), the end of a run (the charge, the lane's correction, the crossing
credit's, the runtime remembered) and a take-back (the refund, the requeue or the failure),
and finds the jobs that are due to be taken back (``docs/design/fleet.md``).
"""

from __future__ import annotations

import attrs

from prioqueue.records import Grant
from prioqueue.scoring import ScoreBreakdown
from prioqueue.testing._charges import ReferenceCharges
from prioqueue.testing._choice import choose
from prioqueue.testing._lanes import ReferenceLanes
from prioqueue.testing._records import CauseName, Held, Worker
from prioqueue.testing._rules import ReferenceRules
from prioqueue.testing._stats import ReferenceStats, Runtimes
from prioqueue.testing._workers import ReferenceWorkers

__all__: list[str] = []  # private module


@attrs.define(eq=False)
class ReferenceGrants:
    """Grants, completions, cancels and take-backs, applied to the owners.

    Args:
        lanes: The lanes (a grant takes its job out, a take-back puts it back).
        workers: The workers (who holds what).
        rules: The rules (the choice, the counterfactuals, the crossing credit).
        charges: Leases and charges.
        runtimes: The runtimes (a finished run's is remembered).
        stats: The counters.
        fair_share: False: no lane is charged.
        track_reorders: False leaves the reorder counts at zero.
        max_attempts: Grants a job gets before an expired lease fails it.
    """

    _lanes: ReferenceLanes
    _workers: ReferenceWorkers
    _rules: ReferenceRules
    _charges: ReferenceCharges
    _runtimes: Runtimes
    _stats: ReferenceStats
    _fair_share: bool = attrs.field(kw_only=True)
    _track_reorders: bool = attrs.field(kw_only=True)
    _max_attempts: int = attrs.field(kw_only=True)

    def grant(self, worker: Worker, now: float) -> Grant | None:
        """Grant ``worker`` the job ``choose`` picks at ``now`` (None: slots full, or nothing).

        The lease and the expected charge are computed first: when either fails, nothing
        changes.
        """
        if len(worker.held) >= worker.slots:
            return None
        choice = choose(self._rules, worker, now)
        if choice is None:
            return None
        win, scored = choice.granted, choice.scored
        entry = win.entry
        job = worker.chosen(entry.job)  # a multi-model job carries the model it was granted
        info = self._workers.info(worker)
        lease = self._charges.lease(job, info, now) if self._charges.leases else None
        runtime = self._rules.expected_runtime(job)
        expected = self._charges.charge(job, runtime)
        n = self._workers.capacity
        c = expected / n if self._fair_share else 0.0
        swap = job.model is not None and job.model != worker.resident
        grant = Grant(
            job=job,
            # Up-front charges may carry s past now: the aging term is then 0, never negative.
            score=ScoreBreakdown(
                win.level, win.tier, win.affinity, max(0.0, (now - win.s) / self._rules.divisor)
            ),
            lease=lease,
            granted_at=now,
            attempt=entry.grants + 1,
            waited=now - job.arrival,
            swap=swap,
            worker=worker.name,
        )
        if self._track_reorders and self._rules.fast_path(worker, now):
            # The counterfactual rankings know nothing of eligibility: every queued job counts.
            # They are compared with the score's winner (before a crossing changes the grant),
            # at its level.
            everything = self._rules.offers(worker, lambda entry: True)
            for cause, other in self._rules.counterfactuals(everything, worker).items():
                if other.seq != scored.entry.job.seq:
                    self._stats.reordered(scored.level, cause)
        back = self._rules.load_back(job, worker.resident) if choice.weight < 0 else 0.0
        self._lanes.remove(job, entry)
        if self._fair_share:
            self._lanes.hold(job, c)
        self._rules.move_credit(choice.weight * (runtime + back))
        self._rules.serve(job.priority, now, runtime)
        if choice.deferred is not None:
            self._stats.reordered(choice.deferred.level, "deferred_crossings")
        worker.take(
            Held(grant, worker.name, entry.grants + 1, c, n, runtime, choice.weight, entry.job)
        )
        if job.model is not None:
            worker.load(job.model)
        self._stats.granted(job, grant.waited)
        self._stats.count("swaps", swap)
        return grant

    def end_run(self, held: Held, by_holder: bool, now: float) -> None:
        """Finish a held job's run as a cancel or a failure does: charged for the time held.

        Only a call naming the holder (``by_holder``) counts as word from it (its
        ``last_seen``).
        """
        holder = self._workers.get(held.worker)
        seen = holder.last_seen
        self.finish(held, now - held.grant.granted_at, now)
        if not by_holder:  # a client's call is no word from the worker
            holder.seen_at(seen)

    def finish(self, held: Held, runtime: float, now: float) -> float:
        """Free a held job and correct its lane (complete, or cancel); return the charge."""
        job = held.job
        charge = self._charges.charge(job, runtime)
        self._rules.move_credit(held.weight * (runtime - held.expected_runtime))
        holder = self._workers.get(held.worker)
        holder.give_up(held)
        holder.seen_at(now)
        self._runtimes.remember(job, runtime)
        self._stats.charged(job.member, charge)
        if self._fair_share:
            self._lanes.settle(job, held.c, charge, held.n, now)
        return charge

    def take_back(self, taken: list[Held], now: float, *, always_requeue: bool) -> set[int]:
        """Refund and requeue (or fail) held jobs; return the ``seq`` of those requeued."""
        requeued: set[int] = set()
        for held in sorted(taken, key=lambda h: h.job.seq, reverse=True):
            job = held.job
            self._workers.get(held.worker).give_up(held)
            # The crossing credit counts the GPU time the job really held (a hang up to its
            # lease's expiry, a lost worker until it was given up), not its estimate.
            spent = max(0.0, now - held.grant.granted_at)
            self._rules.move_credit(held.weight * (spent - held.expected_runtime))
            if self._fair_share:
                self._lanes.release(job, held.c)  # the refund: exactly what was charged
            self._stats.count("expired", not always_requeue)
            if always_requeue or held.grants < (job.max_attempts or self._max_attempts):
                self._lanes.requeue(job, now, held.grants)
                requeued.add(job.seq)
            else:
                self._stats.count("failed")
        return requeued

    def due(self, now: float) -> list[tuple[Held, float, CauseName]]:
        """The held jobs to take back at ``now``: past their lease, or their worker silent.

        Each with its deadline and cause; a worker silent too long is timed out here.
        """
        due: list[tuple[Held, float, CauseName]] = [
            (held, held.grant.lease.deadline, "lease")
            for held in self._workers.held()
            if held.grant.lease is not None and held.grant.lease.deadline <= now
        ]
        due += self._workers.time_out(now, {id(held) for held, _, _ in due})
        return due
