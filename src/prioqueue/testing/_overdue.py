"""The reference's credit refill and overdue rule (private; docs/design/dispatcher.md).

Written from the note alone, by rescanning the queued jobs, for :class:`ReferenceFleet` (and
the crossing's level, ``starving_level``):

* Refill: a grant that is no crossing and no deferral (``weight`` 0) moves a negative credit by
  ``share * x`` while a job below the grant's level is queued.
* Overdue jobs: with fair share, at the grant's level ``L`` (any level, the highest included:
  issue 26; ``top`` is the highest of the policy's named levels and the queued levels), the
  oldest queued job at ``L`` (by arrival, then seq) goes instead when it is in another lane,
  waited more than
  ``0.75 * (top - L) * d + (T + A) * d``, its lane's ``s`` is at most ``4 * (T + A) * d``
  above the smallest ``s`` at ``L`` when the job the pop would grant has not waited that long
  itself, ``(T + A) * d`` when it has (the overdue slack, issue 26 fifth round; below ``top``
  only), and it is eligible for the worker (as in the pop's offers). At ``top`` the wait is
  ``0.5 * (T + A) * d`` (half the level's aging bound left; issue 26 sixth round).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prioqueue.testing._records import takes

if TYPE_CHECKING:
    from prioqueue.testing._records import Offer, Worker
    from prioqueue.testing._rules import ReferenceRules

__all__: list[str] = []  # private module

#: How far, in multiples of the offsets ``(T + A) * d``, an overdue job's lane may be ahead of
#: the level's least-served lane (the note's ``k``; the core's own constant is separate on
#: purpose: the reference is written from the note, and a test holds the two equal).
OVERDUE_SLACK = 4.0

#: The share of the band term after which a job is overdue (the note's ``0.75``).
OVERDUE_BAND = 0.75

#: The share of the top level's offsets after which its oldest job is overdue (the note's
#: ``0.5``, issue 26 sixth round).
TOP_OVERDUE = 0.5


def refilled(model: ReferenceRules, win: Offer, weight: float) -> float:
    """The grant's credit weight after the refill rule."""
    waiting = any(entry.job.priority < win.level for entry in model.queued())
    if model.share < 1 and not weight and model.credit < 0 and waiting:
        return model.share
    return weight


def overdue(model: ReferenceRules, win: Offer, worker: Worker, now: float) -> Offer:
    """The offer granted instead of ``win`` by the overdue rule (else ``win``).

    Eligibility is the pop's: with the warm hold capped at load times only when nothing was
    eligible without the cap.
    """
    if not model.fair_share:
        return win
    level = win.level
    queued = model.queued()
    top = max([*(entry.job.priority for entry in queued), *model.policy.aliases.values()])
    old = min(
        (entry for entry in queued if entry.job.priority == level),
        key=lambda entry: (entry.job.arrival, entry.job.seq),
    )
    lanes = [(s, entries, lane) for lv, s, entries, lane in model.backlogged() if lv == level]
    s, entries, lane = next(row for row in lanes if any(e is old for e in row[1]))
    if lane is win.lane:
        return win
    config = model.scorer.config
    d = model.divisor
    tiers = list(config.tier_bonuses.values())
    offsets = ((max(tiers) - min(tiers) if tiers else 0.0) + config.max_affinity) * d
    # At the top there is no band term: half the offsets is left (the sixth round).
    above = top - level
    overdue_at = above * d * OVERDUE_BAND + offsets if above > 0 else TOP_OVERDUE * offsets
    if not now - old.job.arrival > overdue_at:
        return win
    slack = offsets if now - win.entry.job.arrival > overdue_at else OVERDUE_SLACK * offsets
    if level < top and not s <= min(row[0] for row in lanes) + slack:
        return win  # below the top only: at the top that wait is its aging bound
    capped = not model.offers(worker, lambda e: model.ineligible(worker, e, now) is None)
    if model.ineligible(worker, old, now, capped) is not None:
        return win
    resident = worker.resident if worker.serves(worker.resident) else None
    if resident is not None and old.job.model != resident and model.bonus(resident) > 0:
        window = config.max_affinity * d
        warm = [
            entry
            for entry in queued
            if entry.job.priority == level
            and takes(entry.job, resident)
            and entry.job.arrival <= old.job.arrival + window
        ]
        if warm:
            first = min(warm, key=lambda entry: (entry.job.arrival, entry.job.seq))
            if model.ineligible(worker, first, now, capped) is None:
                s, entries, lane = next(row for row in lanes if any(e is first for e in row[1]))
                return model.offer(level, s, entries, [first], resident, lane)
    return model.offer(level, s, entries, [old], worker.resident, lane)


def starving_level(model: ReferenceRules, top: int, now: float) -> int:
    """The level a crossing serves (issue 26: the starving first).

    The highest level below ``top`` with a queued job that waited past its aging bound
    ``(H - L) * d + (T + A) * d`` (``H`` the highest of the named and the queued levels);
    when there is none, the level of the queued job below ``top`` that waited longest for
    its band: the highest ``level - arrival / d``, ties by arrival, then seq.
    """
    config = model.scorer.config
    d = config.aging_divisor
    queued = model.queued()
    jobs = [entry.job for entry in queued if entry.job.priority < top]
    tiers = list(config.tier_bonuses.values())
    offsets = ((max(tiers) - min(tiers) if tiers else 0.0) + config.max_affinity) * d
    high = max([*(e.job.priority for e in queued), *model.policy.aliases.values()])
    starving = [
        job.priority for job in jobs if now - job.arrival > (high - job.priority) * d + offsets
    ]
    if starving:
        return max(starving)
    oldest = min(jobs, key=lambda job: (-(job.priority - job.arrival / d), job.arrival, job.seq))
    return oldest.priority
