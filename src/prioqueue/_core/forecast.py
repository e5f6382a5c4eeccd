"""Forecasts and explanations: the diagnostic side of the dispatcher (private).

Theory of operation:

* ``forecast_order`` predicts the dispatch order of the queued jobs by a dry run of the
  dispatcher's own rules on its current state: each step picks the lane with the highest key,
  "runs" its head for the job's estimated runtime (its estimate, else the recent mean runtime of
  its model, else of all jobs), charges the lane as the charge model would, and moves the
  resident model. No new arrivals are assumed, and affinity is applied to lane heads only (a
  lane's affinity job further back is not pulled forward in the forecast). With fair share the
  overdue rule (``choose.overdue``) is applied too, at the predicted start while it is known
  (every runtime on the way known): a level's oldest job goes first once it is overdue, or the
  resident model's oldest lane head within the affinity window after it (the warm overdue
  grant, ``choose.overdue_offer``). The dry run never touches the dispatcher's state.
* ``overtakes`` reads the bounded dispatch history: every dispatch of a job submitted after the
  explained one, while the explained one waited, with the term that gave the winner the biggest
  lead over the explained job at that moment.

Costs: a forecast is O(L log L + k log L) for L backlogged lanes and k predicted dispatches,
plus O(L) for each predicted overdue grant below the highest level or warm overdue grant;
``overtakes`` is O(g) for the g grant records it is given (``explain`` bounds them).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs

from prioqueue._core.starving import overdue_wait
from prioqueue.records import AheadJob, Job, Overtake, OvertakeCause

if TYPE_CHECKING:
    from prioqueue._lanes import _Entry, _Lane

__all__: list[str] = []  # private module


@attrs.frozen
class Predicted:
    """One step of a forecast (private)."""

    entry: _Entry
    start: float | None


class OverdueRule(NamedTuple):
    """The overdue rule's constants for a dry run (``choose.overdue``; private).

    ``named_top``: the highest named level; ``divisor``: the aging divisor ``d``; ``spread``:
    ``(T + A) * d``; ``slack``: how far above its level's least ``s`` an overdue job's lane
    may be when the job it passes is not overdue (``OVERDUE_SLACK * spread``; ``spread`` when
    it is); ``window``: the affinity window ``A * d`` of the warm overdue grant. The overdue
    wait itself is ``starving.overdue_wait``'s, as for the dispatcher.
    """

    named_top: int
    divisor: float
    spread: float
    slack: float
    window: float


class _SimLane:
    __slots__ = ("head", "jobs", "lane", "s", "version")

    def __init__(self, lane: _Lane, jobs: Iterator[_Entry]) -> None:
        self.lane = lane
        self.jobs = jobs
        self.s = lane.settled
        self.version = 0
        self.head: _Entry | None = next(jobs, None)


def forecast_order(
    lanes: Iterable[_Lane],
    *,
    now: float,
    busy_until: float | None,
    resident: str | None,
    divisor: float,
    affinity: Callable[[str], float],
    runtime: Callable[[Job], float | None],
    charge: Callable[[Job, float], float],
    fair_share: bool,
    pending: Iterable[tuple[_Lane, float]] = (),
    stop_at: _Entry | None = None,
    limit: int | None = None,
    parallel: int = 1,
    overdue: OverdueRule | None = None,
) -> list[Predicted]:
    """Predict the dispatch order of the queued jobs (see the module docstring).

    Args:
        lanes: The backlogged lanes.
        now: The current time.
        busy_until: When the running job is expected to finish (None: unknown); ``now`` when
            the resource is free.
        resident: The resident model.
        divisor: The aging divisor.
        affinity: ``model -> bonus``.
        runtime: ``job -> expected seconds`` or None when unknown.
        charge: The dispatcher's charge function.
        fair_share: Whether lanes are charged (False: per-job lanes).
        pending: The held jobs' lanes and the charges (in ``s`` units) they will add when
            they finish; the lanes start from their settled virtual start.
        stop_at: Stop after predicting this entry.
        limit: Stop after this many predictions.
        parallel: The workers running the predicted jobs (runtimes and charges are shared).
        overdue: The overdue rule's constants (None: the rule does not apply); applied while
            the predicted start is known.

    Returns:
        The predicted dispatches in order, each with its predicted start (None once a runtime
        on the way is unknown).
    """
    sims = [_SimLane(lane, lane.queued()) for lane in lanes]
    heaps = _SimHeaps(divisor, affinity)
    clock: float | None = busy_until
    nominal = now if busy_until is None else busy_until
    per_level = _settle(sims, pending, nominal, fair_share)
    oldest = _Oldest(sims)
    for each in sims:
        heaps.push(each)
    out: list[Predicted] = []
    while limit is None or len(out) < limit:
        sim = heaps.best(resident)
        if sim is None:
            break
        if overdue is not None and clock is not None:  # a time rule needs a known time
            old = oldest.overdue(sims, sim, overdue, clock, per_level)
            if old is not sim:
                sim = _warm_overdue(sims, old, overdue, resident, heaps.affinity)
        entry = sim.head
        assert entry is not None
        out.append(Predicted(entry=entry, start=clock))
        if entry is stop_at:
            break
        expected = runtime(entry.job)
        seconds = 1.0 if expected is None else expected
        if clock is not None:
            clock = None if expected is None else clock + seconds / parallel
        nominal += seconds / parallel
        sim.version += 1
        sim.head = next(sim.jobs, None)
        level = sim.lane.level
        if sim.head is None:
            per_level[level] -= 1
        if fair_share:
            sim.s = min(sim.s + charge(entry.job, seconds) / parallel, nominal)
            if sim.head is not None and per_level[level] == 1:
                sim.s = nominal
        if entry.job.model is not None:
            resident = entry.job.model
        heaps.push(sim)
        oldest.push(sim)
    return out


def _warm_overdue(
    sims: list[_SimLane],
    sim: _SimLane,
    rule: OverdueRule,
    resident: str | None,
    affinity: Callable[[str], float],
) -> _SimLane:
    """``sim`` (an overdue grant's lane), or the warm overdue grant that replaces it.

    As ``choose.overdue_offer``: when ``sim``'s head needs another model than the resident
    ``r`` (one with an affinity), the lane whose
    head is the level's oldest job for ``r`` that arrived at most the window after it goes
    instead; lane heads only, as the dry run's affinity. O(L) when a swap is in view, else O(1).
    """
    head = sim.head
    assert head is not None
    if resident is None or head.job.model == resident or not affinity(resident) > 0.0:
        return sim
    level = sim.lane.level
    limit = head.job.arrival + rule.window
    warm = (
        (other.head.job.arrival, other.head.job.seq, other)
        for other in sims
        if other.head is not None
        and other.lane.level == level
        and other.head.job.model == resident
        and other.head.job.arrival <= limit
    )
    return min(warm, key=lambda item: item[:2], default=(0.0, 0, sim))[2]


class _Oldest:
    """Each level's oldest remaining job in the dry run: a heap per level (stale by version)."""

    def __init__(self, sims: Iterable[_SimLane]) -> None:
        self.heaps: dict[int, list[tuple[float, int, int, int, _SimLane]]] = {}
        for sim in sims:
            self.push(sim)

    def push(self, sim: _SimLane) -> None:
        head = sim.head
        if head is not None:
            item = (head.job.arrival, head.job.seq, sim.version, id(sim), sim)
            heapq.heappush(self.heaps.setdefault(sim.lane.level, []), item)

    def overdue(
        self,
        sims: list[_SimLane],
        sim: _SimLane,
        rule: OverdueRule,
        t: float,
        per_level: dict[int, int],
    ) -> _SimLane:
        """``sim``, or the lane of its level's oldest job when that job is overdue at ``t``.

        ``choose.overdue`` on the dry run's lanes. O(log L), plus O(L) when a job below the
        highest level is overdue (the least ``s`` of its level).
        """
        level = sim.lane.level
        heap = self.heaps[level]
        while heap[0][2] != heap[0][4].version:
            heapq.heappop(heap)
        old = heap[0][4]
        if old is sim:
            return sim
        top = max([rule.named_top, *(number for number, count in per_level.items() if count)])
        assert old.head is not None
        wait = t - old.head.job.arrival
        overdue_at = overdue_wait(max(0, top - level), rule.divisor, rule.spread)
        if not wait > overdue_at:
            return sim
        if level >= top:
            return old
        least = min(x.s for x in sims if x.head is not None and x.lane.level == level)
        assert sim.head is not None
        slack = rule.spread if t - sim.head.job.arrival > overdue_at else rule.slack
        return old if old.s <= least + slack else sim


def _settle(
    sims: list[_SimLane],
    pending: Iterable[tuple[_Lane, float]],
    nominal: float,
    fair_share: bool,
) -> dict[int, int]:
    """Apply the held jobs' pending charges; return the backlogged lanes per level.

    A lane alone at its level is re-anchored after a charge (as the dispatcher does).
    """
    per_level: dict[int, int] = {}
    for sim in sims:
        per_level[sim.lane.level] = per_level.get(sim.lane.level, 0) + 1
    by_lane = {id(sim.lane): sim for sim in sims}
    for lane, charged in pending:
        held = by_lane.get(id(lane))
        if held is not None and fair_share:
            held.s = min(held.s + charged, nominal)
            if per_level[held.lane.level] == 1:
                held.s = nominal
    return per_level


class _SimItem(NamedTuple):
    """A simulated lane's offer: ordered by key, then ``s``, then seq (stale by version)."""

    neg_key: float
    s: float
    seq: int
    version: int
    sim: _SimLane


class _SimHeaps:
    """The dry run's ranking: a main heap of lane heads and one per model with the bonus."""

    def __init__(self, divisor: float, affinity: Callable[[str], float]) -> None:
        self.divisor = divisor
        self.affinity = affinity
        self.main: list[_SimItem] = []
        self.models: dict[str, list[_SimItem]] = {}

    def item(self, sim: _SimLane, bonus: float) -> _SimItem:
        head = sim.head
        assert head is not None
        key = sim.lane.level + head.job.tier_bonus + bonus - sim.s / self.divisor
        return _SimItem(-key, sim.s, head.job.seq, sim.version, sim)

    def push(self, sim: _SimLane) -> None:
        head = sim.head
        if head is None:
            return
        heapq.heappush(self.main, self.item(sim, 0.0))
        model = head.job.model
        if model is not None:
            aff = self.affinity(model)
            if aff > 0.0:
                heapq.heappush(self.models.setdefault(model, []), self.item(sim, aff))

    @staticmethod
    def top(heap: list[_SimItem]) -> _SimItem | None:
        while heap and heap[0].version != heap[0].sim.version:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def best(self, resident: str | None) -> _SimLane | None:
        """The lane the dry run grants next for the resident model, or None."""
        best = self.top(self.main)
        if best is None or resident is None:
            return None if best is None else best.sim
        heap = self.models.get(resident)
        other = self.top(heap) if heap is not None else None
        head = best.sim.head
        assert head is not None
        if head.job.model == resident and self.affinity(resident) > 0.0:
            best = self.item(best.sim, self.affinity(resident))
        if other is not None and other[:3] < best[:3]:
            best = other
        return best.sim


def ahead_jobs(
    predicted: list[Predicted], *, lane_score: Callable[[_Lane], float]
) -> tuple[AheadJob, ...]:
    """Turn predictions into public ``AheadJob`` values with each lane's current score."""
    result = []
    for step in predicted:
        job = step.entry.job
        score = lane_score(step.entry.lane)
        result.append(
            AheadJob(
                job_id=job.id,
                member=job.member,
                priority=job.priority,
                score=score,
                estimated_start=step.start,
            )
        )
    return tuple(result)


def lane_s_at(lane: _Lane, at: float) -> float:
    """Return the lane's virtual start at time ``at`` from its log (its oldest value before)."""
    log = lane.s_log
    if not log:
        return lane.s
    index = bisect.bisect_right(log, at, key=lambda item: item[0]) - 1
    return log[max(index, 0)][1]


def overtakes(
    job: Job,
    *,
    until: float,
    history: Iterable[Any],
    tier_bonus: float,
    s_at: Callable[[float], float],
    divisor: float,
    affinity: Callable[[str], float],
) -> tuple[Overtake, ...]:
    """The remembered dispatches of later submissions that ran while ``job`` waited.

    Args:
        job: The explained job.
        until: The end of its wait (its grant, or now).
        history: The grant records (``items.DispatchRecord``), oldest first.
        tier_bonus: The tier bonus the job's lane competes with (its head's).
        s_at: ``time -> the job's lane's virtual start at that time``.
        divisor: The aging divisor.
        affinity: ``model -> bonus``.

    Returns:
        One ``Overtake`` per such dispatch, oldest first.
    """
    result = []
    for record in history:
        if record.seq <= job.seq or record.at > until:
            continue
        at = record.at
        mine_aff = 0.0
        if job.model is not None and job.model == record.resident:
            mine_aff = affinity(job.model)
        mine_aging = (at - s_at(at)) / divisor
        score = record.score
        leads: list[tuple[float, OvertakeCause]] = [
            (score.band - job.priority, "priority"),
            (score.tier_bonus - tier_bonus, "tier"),
            (score.swap_affinity - mine_aff, "affinity"),
            (score.aging - mine_aging, "fair share"),
        ]
        lead, cause = max(leads, key=lambda item: item[0])
        margin = sum(value for value, _ in leads)
        if margin < 0:
            # The job out-scored the grant: a rule decided, not a term (a deferred crossing,
            # a crossing's least-served choice, an overdue job), else the job was not
            # eligible for that worker (model, filter, member cap, warm hold).
            cause = record.rule or "eligibility"
        elif lead <= 0:
            cause = "fair share"  # an exact tie, broken by the older virtual start
        result.append(
            Overtake(
                job_id=record.job_id,
                member=record.member,
                priority=record.priority,
                at=at,
                cause=cause,
                margin=margin if math.isfinite(margin) else 0.0,
            )
        )
    return tuple(result)
