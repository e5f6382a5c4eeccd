"""What the affinity prototypes share: an affinity win on one worker, and the lane it passed.

Private to ``benchmarks/prototypes`` (not a prototype: :func:`prototypes.known` skips the
modules whose name starts with ``_``).
"""

from __future__ import annotations

from contextlib import closing

from prioqueue._core import choose
from prioqueue._core.core import Core
from prioqueue._lanes import _Lane
from prioqueue._workers import _Worker

__all__ = ["SCAN", "passed_lane"]

#: How many of the level's least-served lanes are looked at for the best key without
#: affinity (the measured prototypes' number; the least served is nearly always the best).
SCAN = 4


def passed_lane(d: Core, worker: _Worker, picked: choose.Pick) -> tuple[_Lane, float] | None:
    """The lane an affinity win passed, and by how many points, or None.

    ``picked`` must be a grant the ranking chose itself (no crossing, deferral or overdue rule
    named it) with the affinity term, by fair share on one live worker; then, among its level's
    ``SCAN`` least-served lanes, the first other lane with the highest key without affinity
    is returned with the points it ranks above the winner without affinity, when it does.
    Keys here leave out the level (the same for both): tier bonus minus ``s / d``.
    """
    lane, _entry, aff, _winner, _fast, _deferred, _weight, rule = picked
    if not d.config.fair_share or not aff > 0.0 or rule is not None:
        return None
    if d.workers.live + worker.timed_out != 1:
        return None
    div = d.divisor
    mine = lane.head().job.tier_bonus - lane.s / div
    best, best_key = None, mine
    with closing(choose._by_service(d, d.lanes.levels[lane.level])) as lanes:
        for seen, other in enumerate(lanes):
            if seen >= SCAN:
                break
            key = other.head().job.tier_bonus - other.s / div
            if other is not lane and key > best_key:
                best, best_key = other, key
    return None if best is None else (best, best_key - mine)
