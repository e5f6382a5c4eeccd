"""Which offer a pop of :class:`~prioqueue.testing.ReferenceFleet` grants (private).

From ``docs/design/fleet.md`` and ``docs/design/dispatcher.md``: the highest key among the
offers of the jobs eligible for the worker (the warm hold capped at load times only when
nothing is eligible without the cap) wins; a winner below the highest level with an eligible
job is a crossing, bounded by the crossing credit and the share gate (``_rules``), then the
credit's refill and the overdue rule (``_overdue``) have their say. Nothing here changes
anything: the grant is the fleet's.
"""

from __future__ import annotations

import attrs

from prioqueue.testing._overdue import overdue, refilled, starving_level
from prioqueue.testing._records import Offer, Worker
from prioqueue.testing._rules import ReferenceRules

__all__: list[str] = []  # private module


@attrs.frozen
class Choice:
    """A pop's decision: the offer granted, the score's winner, the credit weight, a deferral.

    ``scored`` is the winner by key before a crossing changes the grant (the reorder counts
    compare with it); ``weight`` moves the crossing credit by ``weight * expected runtime``;
    ``deferred`` is the crossing deferred for ``granted`` (its level counts it), or None.
    """

    granted: Offer
    scored: Offer
    weight: float
    deferred: Offer | None


def choose(rules: ReferenceRules, worker: Worker, now: float) -> Choice | None:
    """The offer granted to ``worker`` at ``now`` (None: nothing is eligible)."""
    offers = rules.offers(worker, lambda e: rules.ineligible(worker, e, now) is None)
    if not offers:  # nothing else to run: holds for busy warm workers capped at loads
        offers = rules.offers(worker, lambda e: rules.ineligible(worker, e, now, True) is None)
    if not offers:
        return None
    win = min(offers, key=lambda o: (-rules.key(o), o.s, o.tie))
    scored = win
    # Bounded crossings: a winner below the highest level with an eligible job crosses it.
    top = max(o.level for o in offers)
    weight = 0.0
    deferred: Offer | None = None
    if rules.share < 1 and win.level < top:
        starving = starving_level(rules, top, now) if rules.credit >= 0 else None
        if starving is not None and rules.short_of_share(starving, now):
            weight = -(1 - rules.share)
            if starving != win.level:
                win = rules.least_served(offers, starving) or win
        else:  # past the credit, or the share gate: the level has its share already
            served = rules.least_served(offers, top)
            assert served is not None
            if _warm_crossing(rules, worker, win, served, now):
                # Charged to the credit on a fleet; on one worker bounded by the loads it
                # saves instead, the credit kept for the crossings to a starving level.
                weight = -(1 - rules.share) if rules.capacity > 1 else 0.0
            else:
                deferred = win
                weight = rules.share if rules.credit < 0 else 0.0
                win = served
    weight = refilled(rules, win, weight)  # and the overdue rule (see ``_overdue``)
    win = overdue(rules, win, worker, now)
    return Choice(win, scored, weight, deferred)


def _warm_crossing(
    rules: ReferenceRules, worker: Worker, win: Offer, served: Offer, now: float
) -> bool:
    """Whether a crossing past its credit is granted anyway (the design note's warm rules).

    A crossing that runs warm (its offer carries the worker's affinity) is not deferred for
    a job that needs another model on this worker: on a fleet (more than one live worker)
    while that job has waited less than the affinity is worth, ``affinity * divisor``; on one
    worker, with both load times known, while that job will have waited, once the crossing
    has run its expected runtime, less than the two loads a deferral costs (the swap to the
    job's model and the swap back).
    """
    job = served.entry.job
    if not (win.affinity > 0 and job.model is not None and job.model != worker.resident):
        return False
    waited = now - job.arrival
    if rules.capacity > 1:
        return waited < win.affinity * rules.divisor
    price = rules.round_trip(worker.resident, job.model)
    return price is not None and waited + rules.expected_runtime(win.entry.job) < price
