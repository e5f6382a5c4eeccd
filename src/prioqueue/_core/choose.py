"""Which job a worker gets: the ranking's winner, bounded crossings, the warm hold (private).

Theory of operation (the model is docs/design/fleet.md and docs/design/dispatcher.md):

* ``pick`` finds the winner for one worker (the ranking's best when the worker serves every
  model with no filter and no warm hold applies, else ``_workers.best_for`` over the
  ``Search`` that ``search_for`` builds), then applies bounded crossings: a winner below the
  highest eligible level is granted while the crossing credit is not negative (to the level
  whose oldest job waited longest, its least-served lane), else deferred in favour of the
  higher level's least-served offer; a grant at the highest eligible level refills a negative
  credit while a lower level waits. Last, ``overdue_offer`` may swap the choice for its level's
  oldest job when that job is overdue and fair share's slack allows it (same level).
* Nothing here changes the state (stale heap items are dropped, which changes nothing
  observable); ``grant.pop`` applies the pick.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import closing
from heapq import heappop as _heappop
from heapq import heappush as _heappush
from heapq import heapreplace as _heapreplace
from itertools import islice

from prioqueue._core.config import LEAST_SERVED, OVERDUE_SLACK
from prioqueue._core.core import Core
from prioqueue._core.items import Arrival, Backlog, Level, new_item
from prioqueue._core.starving import (
    OVERDUE_BAND,
    aging_exemption,
    crossing_level,
    overdue_wait,
    short_of_share,
    waiting_below,
    warm_crossing,
)
from prioqueue._lanes import QUEUED, _Entry, _Lane
from prioqueue._workers import Search, _Worker, best_for
from prioqueue.records import Job

__all__: list[str] = []  # private module


#: What ``pick`` chose, unpacked by ``grant.pop`` (a plain tuple: built once per grant):
#: the lane, entry and affinity to grant; the score's winner (the reorder counts compare
#: against it); whether the ranking's best was eligible as it stands (no search needed);
#: the crossing this grant deferred, if any; and how the grant moves the crossing credit
#: (per expected second).
#: Last, the rule that chose the grant instead of the ranking's winner (None: the ranking;
#: ``explain`` names it when the explained job had out-scored the grant).
Pick = tuple[_Lane, _Entry, float, Job, bool, "_Entry | None", float, "str | None"]


def pick(d: Core, worker: _Worker, t: float) -> Pick | None:
    """The job to grant the worker, or None: the ranking's winner, or a crossing's choice.

    Reads the state and changes nothing but stale heap items (see the design note).
    """
    d.lanes.flush()
    resident = worker.resident
    search: Search | None = None
    fast = worker.models is None and worker.accepts is None and worker.capabilities is None
    if fast and d.config.warm_hold > 0:
        search = search_for(d, worker, t)
        fast = not search.warm
    best = d.lanes.ranking.best(resident) if fast else None
    cap = d.config.max_running
    if cap is not None and best is not None:
        best_lane, _, _ = best
        fast = best_lane.owner.running < cap
    view: Search | None = None  # the eligibility view of the pop (None: every job)
    if not fast:
        if search is None:
            search = search_for(d, worker, t)
        view = search
        best = best_for(d.lanes.ranking, search, d.window)
        if best is None:
            # The longer hold applies only while the worker has something else to run.
            relaxed = search.relaxed()
            if relaxed is not None:
                view = relaxed
                best = best_for(d.lanes.ranking, relaxed, d.window)
    if best is None:
        return None
    lane, entry, aff = best
    winner = entry.job  # the score's winner (the reorder counts compare against it)
    # Bounded crossings (docs/design/dispatcher.md): a winner below the top eligible level
    # crosses it; it is granted while the credit is not negative, else deferred.
    deferred: _Entry | None = None
    rule: str | None = None
    weight = 0.0
    share = d.config.share
    if share < 1.0:
        top = d.lanes.top_level()
        if top is not None and lane.level < top:
            if search is None:
                search = search_for(d, worker, t)
            every = fast and cap is None  # every queued job is eligible: B is top
            higher = None if every else above(d, search, lane.level, top, every)
            if every or higher is not None:
                offer = (lane, entry, aff)
                lane, entry, aff, deferred, weight, rule = cross_or_defer(
                    d, search, worker, offer, higher, top, every, t
                )
        # A grant at the highest eligible level while a lower level waits refills the
        # credit too (not only a deferral): crossings get their share of that time.
        weight = weight or (share if d.lanes.credit < 0.0 and waiting_below(d, lane.level) else 0.0)
    # Overdue jobs: the level's oldest job, past its aging bound, goes first when fair
    # share allows it (its lane is within the offsets of the level's least-served lane).
    chosen = overdue_offer(d, worker, view, (lane, entry, aff), t)
    if chosen[1] is not entry:
        lane, entry, aff = chosen
        rule = "overdue"
    return lane, entry, aff, winner, fast, deferred, weight, rule


#: What a crossing pop grants: the offer, the entry it deferred (or None), the credit's
#: weight, and the rule named by ``explain`` (None: the winner itself).
Crossed = tuple[_Lane, _Entry, float, "_Entry | None", float, "str | None"]


def cross_or_defer(
    d: Core,
    search: Search,
    worker: _Worker,
    offer: tuple[_Lane, _Entry, float],
    higher: tuple[_Lane, _Entry, float] | None,
    top: int,
    every: bool,
    t: float,
) -> Crossed:
    """A crossing's grant (``offer`` won below the top eligible level): cross, or defer.

    It crosses while the credit is not negative and the level it would serve is short of
    its share (the share gate, ``short_of_share``), else a warm crossing still goes ahead
    (``warm_crossing``; charged to the credit on a fleet only), else the higher level's offer
    ``higher`` goes instead (found here when the caller had no need of it). Amortised
    O(K log n + levels).
    """
    lane, entry, aff = offer
    share = d.config.share
    live = d.workers.live + worker.timed_out  # a pop (or its preview) revives it
    credit = d.lanes.credit
    if credit >= 0.0:
        b = top if higher is None else higher[0].level  # (lane, entry, aff)
        starving = crossing_level(d, b, t)
        if short_of_share(d, starving, live, t):
            lane, entry, aff, rule = cross_to(d, search, offer, starving, every)
            return lane, entry, aff, None, share - 1.0, rule
    # Past the credit, or the level the crossing would serve has its share already (the
    # share gate): the higher level's offer goes instead.
    if higher is None:
        higher = above(d, search, lane.level, top, every)
    assert higher is not None
    if warm_crossing(d, live, worker.resident, aff, entry.job, higher[1].job, t):
        # On a fleet the credit is charged as for any crossing; on one worker the crossing is
        # bounded per job passed over (the loads it saves), not by the share: the credit stays
        # the budget of the crossings that serve a starving level (docs/design/fleet.md).
        return lane, entry, aff, None, share - 1.0 if live > 1 else 0.0, None
    weight = share if credit < 0.0 else 0.0  # the gate earns nothing
    return higher[0], higher[1], higher[2], entry, weight, "crossing deferred"


def cross_to(
    d: Core, search: Search, offer: tuple[_Lane, _Entry, float], starving: int, every: bool
) -> tuple[_Lane, _Entry, float, str | None]:
    """A crossing's grant, and its rule (None: the winner ``offer`` itself).

    The crossing goes to the level ``starving`` (``crossing_level``: the highest level with
    a starving job, else the one whose oldest job has waited longest for its band), to that
    level's least-served choice. Amortised O(K log n).
    """
    lane, entry, aff = offer
    if starving != lane.level:
        found = least_served(d, starving, search, every)
        if found is not None and found[1] is not entry:
            return found[0], found[1], found[2], "least served"
    return lane, entry, aff, None


#: The warm overdue grant (issue 26; ``overdue_offer``), on; only an ablation turns it off
#: (``benchmarks/check_wide.py --ablate WARM_OVERDUE=0``); the reference model knows no switch.
WARM_OVERDUE = True


def overdue_offer(
    d: Core, worker: _Worker, view: Search | None, offer: tuple[_Lane, _Entry, float], t: float
) -> tuple[_Lane, _Entry, float]:
    """``offer``, or the overdue job's offer that replaces it (see ``overdue``).

    The overdue job ``o`` goes, or instead the oldest queued job of its level for the
    worker's resident model when that job arrived at most the affinity window ``W`` after
    ``o`` and is eligible (the warm overdue choice, issue 26; docs/design/dispatcher.md,
    "Overdue jobs"): FIFO among overdue jobs, with the same bounded reordering for the
    resident model that the window allows inside a lane. Amortised O(log n).
    """
    old = overdue(d, offer[1], t)
    if old is None or not eligible(d, worker, view, old):
        return offer
    resident = worker.resident
    if (
        WARM_OVERDUE
        and resident is not None
        and old.job.model != resident
        and d.affinity(resident) > 0.0
        and worker.serves(resident)
        and (found := d.lanes.levels[old.job.priority].oldest_for(resident)) is not None
    ):
        warm = found.entry
        if warm.job.arrival <= old.job.arrival + d.window and eligible(d, worker, view, warm):
            return warm.lane, warm, offered_affinity(d, resident, warm)
    return old.lane, old, offered_affinity(d, resident, old)


def offered_affinity(d: Core, resident: str | None, entry: _Entry) -> float:
    """The affinity term of ``entry`` granted on its own (O(1)).

    That is ``aff(r)`` when it runs on the resident ``r`` (its model, or one of several it
    accepts) and it arrived within the window after its lane's head, else 0.
    """
    if resident is None or not entry.job.runs_on(resident):
        return 0.0
    bonus = d.affinity(resident)
    if bonus > 0.0 and entry.job.arrival <= entry.lane.head().job.arrival + d.window:
        return bonus
    return 0.0


def overdue(d: Core, entry: _Entry, t: float) -> _Entry | None:
    """The job that goes instead of ``entry`` because it is overdue, or None.

    With fair share, at ``entry``'s level ``L`` (any level, ``B`` itself included since issue
    26; ``B`` is the highest of the policy's named levels and the backlogged levels), that is
    the oldest queued job at ``L`` (by arrival, then seq) when it is in another lane than
    ``entry``, has waited more than ``overdue_wait`` (``OVERDUE_BAND * (B - L) * d + (T + A)
    * d``; at ``B`` itself ``TOP_OVERDUE * (T + A) * d``, issue 26 sixth round), and its
    lane's ``s`` is at most ``OVERDUE_SLACK * (T + A) * d`` above the smallest ``s`` among the
    level's backlogged lanes when ``entry`` is not overdue itself, ``(T + A) * d`` when it is
    (the fairness bound's slack, issue 26 fifth round); at ``B`` without the check on ``s``
    (a burst at the top level drains, FIFO, before it reaches its aging bound). Amortised
    O(log n) plus O(levels + named levels).
    """
    if not d.config.fair_share:
        return None  # every job ages from its own arrival: none waits for a lane's turn
    number = entry.job.priority
    top = d.lanes.top_level()
    assert top is not None  # entry is queued
    top = max(top, *d.config.policy.aliases.values())
    level = d.lanes.levels[number]
    arrivals = level.arrivals
    while arrivals[0].entry.state != QUEUED:
        _heappop(arrivals)
    old = arrivals[0].entry
    if old.lane is entry.lane:
        return None  # inside a lane the affinity window bounds the reordering already
    above = max(0, top - number)
    wait = t - old.job.arrival
    if not wait > above * d.divisor * OVERDUE_BAND:  # cheap test first: most pops stop here
        return None
    spread = aging_exemption(d)
    due = overdue_wait(above, d.divisor, spread)
    if not wait > due:
        return None
    if number >= top:
        return old  # the highest level: a burst drains before its aging bound, FIFO
    with closing(_by_service(d, level)) as lanes:
        least = next(lanes)
    # Past a job that is not overdue itself the overdue job may run k offsets ahead; past an
    # overdue one only the ranking's own width (issue 26, fifth round).
    slack = spread if t - entry.job.arrival > due else OVERDUE_SLACK * spread
    if not old.lane.s <= least.s + slack:
        return None
    return old


def eligible(d: Core, worker: _Worker, view: Search | None, entry: _Entry) -> bool:
    """Whether ``entry`` may go to the worker under the pop's view.

    ``view`` None: every job may, but for the member cap. O(1) (a warm hold's limit is
    computed once per model and pop).
    """
    if view is None:
        cap = d.config.max_running
        return cap is None or entry.lane.owner.running < cap
    return worker.serves(entry.job.model) and not view.at_cap(entry.lane) and view.ok(entry)


def search_for(d: Core, worker: _Worker, t: float) -> Search:
    """The pop's eligibility view, with the warm hold's workers (the design note's rule).

    With ``warm_hold = h > 0``, each other live worker that has a model resident and
    serves it is *warm* for it: free now (a free slot), or busy (``slots`` jobs held) and
    expected to free a slot at ``e`` with ``t - h < e <= t + h`` (``free_at`` lists the
    busy ones' ``e`` per model). O(workers x slots).
    """
    hold = d.config.warm_hold
    if not hold > 0:
        return Search(worker, d.config.max_running)
    low = t - hold
    high = t + hold
    free: set[str] = set()
    free_at: dict[str, list[float]] = {}
    for other in d.workers.by_name.values():
        resident = other.resident
        if other is worker or resident is None or other.timed_out or not other.serves(resident):
            continue
        if len(other.held) < other.slots:
            free.add(resident)
            continue
        at = other.expected_free()
        if not low < at <= high:
            continue
        times = free_at.get(resident)
        if times is None:
            free_at[resident] = [at]
        else:
            times.append(at)
    return Search(
        worker,
        d.config.max_running,
        frozenset(free),
        free_at,
        d.lanes.by_key.values(),
        d.expected_runtime,
        d.config.load_seconds,
        hold,
        t,
        max((level for level, counts in d.lanes.levels.items() if counts.queued), default=0),
        aging_exemption(d),
        d.divisor,
    )


# ------------------------------------------------------------------ pop


def above(
    d: Core, search: Search, level: int, top: int, every: bool
) -> tuple[_Lane, _Entry, float] | None:
    """The least-served lane's offer at the highest level above ``level`` with one.

    None when the worker has no eligible job above ``level``; ``top`` is the highest
    backlogged level. With ``every`` (the fast path, no member cap) every job is
    eligible, so that level is ``top``: amortised O(log n). Otherwise the levels are
    tried from ``top`` down (see ``_least_served``).
    """
    if every:
        return least_served(d, top, search, True)
    levels = d.lanes.levels
    for number in d.lanes.level_order:
        if number <= level:
            break
        if number > top or not levels[number].lanes:
            continue
        offer = least_served(d, number, search, False)
        if offer is not None:
            return offer
    return None


def least_served(
    d: Core, number: int, search: Search, every: bool
) -> tuple[_Lane, _Entry, float] | None:
    """The offer a crossing or a deferral takes at level ``number``, or None.

    Of the ``LEAST_SERVED`` lanes with the smallest ``s`` (ties: the lane created first;
    without fair share each job is its own lane: by arrival, then seq) that offer the
    search's worker a job, the one whose offer the ranking puts first (its key, then
    ``s``, then its tie seq). A lane offers as in the ranking: its affinity job for the
    worker's resident model (with the bonus) when it has an eligible one within the
    window, else its first eligible job. Amortised O(K log n) for K = ``LEAST_SERVED``
    plus the lanes skipped (that offer the worker nothing).
    """
    level = d.lanes.levels[number]
    resident = search.resident
    bonus = d.affinity(resident) if resident is not None else 0.0
    div = d.divisor
    if every:
        return least_served_fast(d, level, resident, bonus)
    found: list[tuple[tuple[float, float, int], _Lane, _Entry, float]] = []

    def offer(lane: _Lane) -> None:
        if search.at_cap(lane):
            return
        if bonus > 0.0:
            assert resident is not None
            chosen = search.affinity_job(lane, resident, d.window)
            if chosen is not None:
                first = lane.first_for(resident)
                assert first is not None
                key = lane.level + lane.head().job.tier_bonus + bonus - lane.s / div
                found.append(((-key, lane.s, first.job.seq), lane, chosen, bonus))
                return
        chosen = search.first(lane)
        if chosen is not None:
            head = lane.head()
            key = lane.level + head.job.tier_bonus + 0.0 - lane.s / div
            found.append(((-key, lane.s, head.job.seq), lane, chosen, 0.0))

    with closing(_by_service(d, level)) as lanes:
        for lane in lanes:
            offer(lane)
            if len(found) >= LEAST_SERVED:
                break
    if not found:
        return None
    _, lane, entry, aff = min(found, key=lambda row: row[0])
    return lane, entry, aff


def least_served_fast(
    d: Core, level: Level, resident: str | None, bonus: float
) -> tuple[_Lane, _Entry, float] | None:
    """``_least_served`` for a worker that may take every job (the fast path)."""
    # With fair share, at most the level's backlogged lanes (the scan stops there).
    want = min(LEAST_SERVED, level.lanes) if d.config.fair_share else LEAST_SERVED
    with closing(_by_service(d, level)) as found:
        lanes = list(islice(found, want))
    div = d.divisor
    ranking = d.lanes.ranking
    best: tuple[float, float, int] | None = None
    won: tuple[_Lane, _Entry, float] | None = None
    for lane in lanes:
        head = lane.head()
        s = lane.s
        chosen = None
        if bonus > 0.0:
            assert resident is not None
            chosen = ranking.candidate(lane, resident)
        if chosen is not None:
            key = lane.level + head.job.tier_bonus + bonus - s / div
            order = (-key, s, chosen.job.seq)
            offer = (lane, chosen, bonus)
        else:
            key = lane.level + head.job.tier_bonus + 0.0 - s / div
            order = (-key, s, head.job.seq)
            offer = (lane, head, 0.0)
        if best is None or order < best:
            best, won = order, offer
    return won


def _by_service(d: Core, level: Level) -> Generator[_Lane, None, None]:
    """The level's backlogged lanes, least served first, each once (for ``least_served``).

    With fair share: by ``s`` (ties: the lane created first), read from the level's backlog
    heap; without it each queued job is its own lane: by arrival, then seq. Items are popped
    as the lanes are yielded and the live ones filed back when the iteration is closed
    (``contextlib.closing``); stale ones are dropped, and an item below its lane's ``s`` (a
    grant raised it) is re-filed first.
    """
    if d.config.fair_share:
        backlog = level.backlog
        scratch: list[Backlog] = []
        seen: set[int] = set()
        try:
            while backlog:
                s, ident, lane = backlog[0]
                if not lane.live or s > lane.s:
                    _heappop(backlog)  # gone, or a duplicate of a re-filed item
                    continue
                if s < lane.s:
                    _heapreplace(backlog, new_item(Backlog, (lane.s, ident, lane)))
                    continue
                scratch.append(_heappop(backlog))
                if ident not in seen:
                    seen.add(ident)
                    yield lane
        finally:
            for filed in scratch:
                _heappush(backlog, filed)
        return
    arrivals = level.arrivals
    taken: list[Arrival] = []
    try:
        while arrivals:
            queued = _heappop(arrivals)
            if queued.entry.state == QUEUED:
                taken.append(queued)
                yield queued.entry.lane
    finally:
        for kept in taken:
            _heappush(arrivals, kept)
