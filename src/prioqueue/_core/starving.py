"""Which level starves: the crossing's level, the aging bound's constants, warm crossings.

Private helpers of ``choose`` (docs/design/dispatcher.md, "Bounded crossings", "Overdue jobs"
and "Issue 26, second round"; docs/design/fleet.md, "Warm crossings"). They only read the
state (stale heap items are dropped, which changes nothing observable).
"""

from __future__ import annotations

from collections.abc import Iterator
from heapq import heappop as _heappop

from prioqueue._core.config import AFFINITY_PRICE
from prioqueue._core.core import Core
from prioqueue._core.items import SHARE_WINDOW
from prioqueue._lanes import QUEUED, _Entry
from prioqueue.records import Job

__all__: list[str] = []  # private module

#: The starving first (issue 26; ``crossing_level``), on; only an ablation turns it off
#: (``benchmarks/check_wide.py --ablate STARVING_FIRST=0``); the reference model knows no switch.
STARVING_FIRST = True


#: The share of the band term ``(B - L) * d`` after which a job is overdue (the offsets
#: ``(T + A) * d`` come on top): a quarter of its band's overtake horizon is left to reach a
#: GPU before the report counts it starved (docs/design/dispatcher.md, "Overdue jobs").
OVERDUE_BAND = 0.75

#: The share of the highest level's aging bound ``(T + A) * d`` after which its oldest job is
#: overdue (issue 26, sixth round; ``overdue_wait``): a burst there is served by fair share
#: for half its bound, then drains in arrival order with half the bound left to reach a GPU.
#: Chosen by the sweep on the tuning seeds (0, 0.25, 0.5, 0.75, 1; docs/design/dispatcher.md).
TOP_OVERDUE = 0.5

#: The top level's earlier overdue wait, on; only an ablation turns it off (``check_wide.py
#: --ablate EARLY_TOP=0``: the wait is then the whole bound, as before the sixth round); the
#: reference model knows no switch.
EARLY_TOP = True


#: The share gate (issue 26, fourth round; ``short_of_share``): a crossing serves a level
#: only while the level's recent service is below this fraction of the crossing share of
#: the live workers. Chosen by the sweep on the tuning seeds (0.5 and 1; docs/design/dispatcher.md).
SHORT_OF_SHARE = 0.5

#: The share gate, on; only an ablation turns it off (``check_wide.py --ablate
#: SHARE_GATE=0``); the reference model knows no switch.
SHARE_GATE = True


def short_of_share(d: Core, number: int, live: int, t: float) -> bool:
    """Whether level ``number`` is short of its crossing share (a crossing may serve it).

    That is, whether the GPUs it has been using over the last ``SHARE_WINDOW`` (its recent
    service, ``Level.recent_gpu_seconds``, over the window) are fewer than
    ``SHORT_OF_SHARE * share * live``. A level served in the higher levels' idle gaps (or
    by warm crossings, overdue grants) at that rate needs no crossing, which would cost the
    higher levels two swaps and give it nothing it is not getting already. O(1).
    """
    if not SHARE_GATE:
        return True
    used = d.lanes.levels[number].recent_gpu_seconds(t) / SHARE_WINDOW
    return used < SHORT_OF_SHARE * d.config.share * (live if live > 1 else 1)


def waiting_below(d: Core, number: int) -> bool:
    """Whether a level below ``number`` has a backlogged lane. O(levels)."""
    levels = d.lanes.levels
    for other in reversed(d.lanes.level_order):
        if other >= number:
            return False
        if levels[other].lanes:
            return True
    return False


#: The warm crossing on one worker (issue 26, seventh round; ``warm_crossing``), on; only an
#: ablation turns it off (``check_wide.py --ablate ONE_WORKER_WARM=0``); the reference model
#: knows no switch.
ONE_WORKER_WARM = True


def warm_crossing(
    d: Core, live: int, resident: str | None, aff: float, crossing: Job, yielded: Job, t: float
) -> bool:
    """Whether a crossing past its credit is granted anyway (docs/design/fleet.md).

    The crossing (``crossing``, the offer that won below the top level) runs warm: its offer
    carries the worker's affinity ``aff > 0``; the job ``yielded`` that a deferral would
    grant instead needs another model than the worker's ``resident``. Then:

    * on a fleet (``live``: more than one live worker, the popping one counted) it is not
      deferred while ``yielded`` has waited less than that affinity is worth: ``aff * d``
      seconds, the score's own price of a swap;
    * on one worker, with the load times of both models known (``load_seconds``), it is not
      deferred while ``yielded``, once the crossing has run (its expected runtime), will have
      waited less than the loads a deferral costs: ``AFFINITY_PRICE * (L(m) + L(r))``, the
      swap to ``yielded``'s model ``m`` now and the swap back to ``r`` when the crossing's
      level is served next (issue 26, seventh round; docs/design/fleet.md, "Warm crossings").

    O(1).
    """
    model = yielded.model
    if not (aff > 0.0 and model is not None and model != resident):
        return False
    waited = t - yielded.arrival
    if live > 1:
        return waited < aff * d.divisor
    loads = d.config.load_seconds
    if not ONE_WORKER_WARM or resident is None or model not in loads or resident not in loads:
        return False
    price = AFFINITY_PRICE * (loads[model] + loads[resident])
    return waited + d.expected_runtime(crossing) < price


#: The swap back charged to a cold crossing on one worker (issue 26, eighth round;
#: ``return_load``), on; only an ablation turns it off (``check_wide.py --ablate
#: RETURN_LOAD=0``); the reference model knows no switch.
RETURN_LOAD = True


def return_load(d: Core, live: int, resident: str | None, job: Job) -> float:
    """The load a crossing ``job`` costs the levels above it beyond its own runtime.

    On one live worker (``live``, the popping one counted), when ``job`` runs cold (its
    model is not the worker's ``resident``), the resident's load time is known
    (``load_seconds``) and a level above ``job``'s has a queued job for the resident, that is
    the resident's load: the crossing evicts the model those jobs run on, and the one worker
    must load it back before they run (issue 26, eighth round; docs/design/dispatcher.md,
    "Bounded crossings"). Else 0: on a fleet another worker may hold the model, and a job
    that needs another model than the resident pays its own swap whatever the crossing does.
    The crossing's own load is in its runtime already. Amortised O(levels log n).
    """
    if not RETURN_LOAD or live > 1 or resident is None or job.model in (None, resident):
        return 0.0
    load = d.config.load_seconds.get(resident)
    if load is None:
        return 0.0
    levels = d.lanes.levels
    for number in d.lanes.level_order:  # highest first
        if number <= job.priority:
            break
        if levels[number].queued and levels[number].oldest_for(resident) is not None:
            return load
    return 0.0


def aging_exemption(d: Core) -> float:
    """``(T + A) * d``: the offsets' spread in seconds (the aging bound's constant)."""
    config = d.config.scorer.config
    bonuses = list(config.tier_bonuses.values())
    spread = max(bonuses) - min(bonuses) if bonuses else 0.0
    return (spread + config.max_affinity) * d.divisor


def overdue_wait(above: int, divisor: float, spread: float) -> float:
    """How long a level's oldest job waits before it is overdue (``choose.overdue``). O(1).

    ``above``: how many priority steps the highest level ``B`` is above the job's level;
    ``spread``: ``(T + A) * d``. Below ``B`` that is ``OVERDUE_BAND * (B - L) * d + (T + A) *
    d``: a quarter of the band term is left before the report's aging bound ``(B - L) * d +
    (T + A) * d``. At ``B`` there is no band term to leave a share of, so a share of the bound
    itself is left: the wait is ``TOP_OVERDUE * (T + A) * d`` (docs/design/dispatcher.md,
    "Overdue jobs").
    """
    if above > 0 or not EARLY_TOP:
        return OVERDUE_BAND * above * divisor + spread
    return TOP_OVERDUE * spread


def crossing_level(d: Core, b: int, t: float) -> int:
    """The level a crossing below ``b`` serves (docs/design/dispatcher.md, issue 26).

    The highest level below ``b`` whose oldest queued job waited past its aging bound
    ``(H - L) * d + (T + A) * d`` (``H`` as in ``overdue``: the highest of the named and the
    backlogged levels), that is the highest level with a starving job; when none has one,
    the level of ``oldest_below`` (the job that waited longest for its band). Amortised
    O(levels + named levels).
    """
    if STARVING_FIRST:
        top = d.lanes.top_level()
        assert top is not None
        top = max(top, *d.config.policy.aliases.values())
        spread = aging_exemption(d)
        for number, entry in _heads_below(d, b):
            if t - entry.job.arrival > (top - number) * d.divisor + spread:
                return number
    return oldest_below(d, b).job.priority


def _heads_below(d: Core, top: int) -> Iterator[tuple[int, _Entry]]:
    """Each backlogged level below ``top`` (in ``level_order``) with its oldest queued job.

    Amortised O(1) per level (the stale items met at the top of its arrival heap are dropped).
    """
    levels = d.lanes.levels
    for number in d.lanes.level_order:
        if number >= top:
            continue
        level = levels[number]
        if not level.queued:
            continue
        arrivals = level.arrivals
        while arrivals[0].entry.state != QUEUED:
            _heappop(arrivals)
        yield number, arrivals[0].entry


def oldest_below(d: Core, top: int) -> _Entry:
    """The queued job below level ``top`` that waited longest for its band.

    That is the highest ``level - arrival / d`` (band plus the aging of its own wait);
    ties by arrival, then seq. There is one: the caller found a backlogged lane below
    ``top``. O(levels).
    """
    best: tuple[tuple[float, float, int], _Entry] | None = None
    div = d.divisor
    for number, entry in _heads_below(d, top):
        arrival = entry.job.arrival
        key = (-(number - arrival / div), arrival, entry.job.seq)
        if best is None or key < best[0]:
            best = (key, entry)
    assert best is not None
    return best[1]
