"""The dispatchers' diagnostics: statistics, forecasts and explanations (private).

These read the dispatcher's state and never change it (``stats`` prunes stale heap items,
which changes nothing observable). See ``_forecast`` for the dry run behind forecasts.

A fleet is forecast as its capacity of identical workers serving every model: the dry run
picks lanes exactly as one worker would, with runtimes shared among the workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop
from typing import TYPE_CHECKING, Any

from prioqueue._forecast import Predicted, ahead_jobs, forecast_order, lane_s_at, overtakes
from prioqueue._lanes import QUEUED, RUNNING, _Entry, _Lane
from prioqueue.records import (
    AheadJob,
    Explanation,
    Job,
    LevelStats,
    MemberStats,
    Reorders,
    Stats,
)
from prioqueue.scoring import ScoreBreakdown

if TYPE_CHECKING:
    from prioqueue._core import _Core as SizeOneDispatcher

__all__: list[str] = []  # private module


def single_resident(d: SizeOneDispatcher) -> str | None:
    """The resident model a forecast assumes: the one worker's, else None (a fleet)."""
    workers = d._workers
    if len(workers) == 1:
        return next(iter(workers.values())).resident
    return None


def runtime_estimator(d: SizeOneDispatcher) -> Callable[[Job], float | None]:
    """Return ``job -> expected runtime`` (its estimate, else a recent mean, else None).

    The recent mean is that of the job's model, else of all jobs; the means are computed once
    here, not once per job. O(64).
    """
    sums: dict[str | None, list[float]] = {}
    for _, runtime, model in d._recent:
        total = sums.setdefault(model, [0.0, 0.0])
        total[0] += runtime
        total[1] += 1
    means = {model: total / count for model, (total, count) in sums.items()}
    count = sum(c for _, c in sums.values())
    overall = sum(t for t, _ in sums.values()) / count if count else None

    def expected(job: Job) -> float | None:
        if job.estimate is not None:
            return job.estimate
        return means.get(job.model, overall)

    return expected


def _busy_until(
    d: SizeOneDispatcher, now: float, estimate: Callable[[Job], float | None]
) -> float | None:
    """When the first worker is expected to be free: ``now`` when one has a free slot."""
    workers = [w for w in d._workers.values() if not w.timed_out]
    if not workers or any(len(w.held) < w.slots for w in workers):
        return now
    best: float | None = None
    for worker in workers:
        entry = worker.held[0]
        expected = estimate(entry.job)
        if expected is None:
            return None
        free = max(now, entry.granted_at + expected)
        best = free if best is None else min(best, free)
    return best


def lane_score(d: SizeOneDispatcher, lane: _Lane, now: float) -> float:
    """A backlogged lane's current score (its affinity as the ranking would give it)."""
    aff = 0.0
    resident = single_resident(d)
    if resident is not None and d._ranking.candidate(lane, resident) is not None:
        aff = d._affinity(resident)
    return lane.level + lane.head().job.tier_bonus + aff + (now - lane.s) / d._divisor


def predict(
    d: SizeOneDispatcher, now: float, *, stop_at: _Entry | None, limit: int | None
) -> list[Predicted]:
    backlogged = [lane for lane in d._lanes.values() if lane.live]
    estimate = runtime_estimator(d)
    capacity = max(1, d._live)
    pending = []
    for worker in d._workers.values():
        for held in worker.held:
            expected = estimate(held.job)
            elapsed = max(0.0, now - held.granted_at)
            runtime = elapsed if expected is None else max(expected, elapsed)
            pending.append((held.lane, float(d._charge(held.job, runtime)) / held.capacity))
    return forecast_order(
        backlogged,
        now=now,
        busy_until=_busy_until(d, now, estimate),
        pending=pending,
        resident=single_resident(d),
        divisor=d._divisor,
        affinity=d._affinity,
        runtime=estimate,
        charge=d._charge,
        fair_share=d._fair_share,
        stop_at=stop_at,
        limit=limit,
        parallel=capacity,
    )


def forecast(d: SizeOneDispatcher, t: float, limit: int | None) -> list[AheadJob]:
    """The body of ``SizeOneDispatcher.forecast``."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
    predicted = predict(d, t, stop_at=None, limit=limit)
    return list(ahead_jobs(predicted, lane_score=lambda lane: lane_score(d, lane, t)))


def _since(d: SizeOneDispatcher, entry: _Entry, limit: int | None) -> list[Any]:
    """The remembered grants since ``entry`` was queued, oldest first.

    Reads the history from its newest end: all of it back to the entry's mark, or, with a
    ``limit``, at most ``4 * limit`` records and ``limit`` of them by later submissions.
    """
    job = entry.job
    found: list[Any] = []
    later = 0
    budget = None if limit is None else 4 * limit
    for record in reversed(d._history):
        if record.number <= entry.mark or (budget is not None and budget <= 0):
            break
        if budget is not None:
            budget -= 1
        if record.seq > job.seq:
            if limit is not None and later >= limit:
                break
            later += 1
        found.append(record)
    found.reverse()
    return found


def explain(
    d: SizeOneDispatcher,
    entry: _Entry,
    t: float,
    ahead_limit: int | None = None,
    overtakes_limit: int | None = None,
) -> Explanation:
    """The body of ``explain`` (see ``_Engine.explain`` for the limits)."""
    job = entry.job
    lane = entry.lane
    overtaken = overtakes(
        job,
        until=entry.granted_at if entry.state == RUNNING else t,
        history=_since(d, entry, overtakes_limit),
        tier_bonus=lane.head().job.tier_bonus if lane.live else job.tier_bonus,
        s_at=(lambda at: lane_s_at(lane, at)) if d._fair_share else (lambda at: job.arrival),
        divisor=d._divisor,
        affinity=d._affinity,
    )
    if entry.state == RUNNING:
        grant = entry.grant
        return Explanation(
            job=job,
            state="running",
            now=t,
            waited=grant.waited,
            score=grant.score,
            lane_start=lane.s,
            position=0,
            ahead=(),
            estimated_start=grant.granted_at,
            overtaken_by=overtaken,
        )
    if ahead_limit == 0:
        predicted: list[Predicted] = []
    else:
        limit = None if ahead_limit is None else ahead_limit + 1
        predicted = predict(d, t, stop_at=entry, limit=limit)
    reached = bool(predicted) and predicted[-1].entry is entry
    steps = predicted[:-1] if reached else predicted[:ahead_limit]
    ahead = ahead_jobs(steps, lane_score=lambda other: lane_score(d, other, t))
    aff = 0.0
    resident = single_resident(d)
    if resident is not None and d._ranking.candidate(lane, resident) is not None:
        aff = d._affinity(resident)
    score = ScoreBreakdown(
        band=job.priority,
        tier_bonus=lane.head().job.tier_bonus,
        swap_affinity=aff,
        aging=max(0.0, (t - lane.s) / d._divisor),
    )
    return Explanation(
        job=job,
        state="queued",
        now=t,
        waited=t - job.arrival,
        score=score,
        lane_start=lane.s,
        position=len(ahead) + 1,
        ahead=ahead,
        estimated_start=predicted[-1].start if reached else None,
        overtaken_by=overtaken,
        ahead_complete=reached,
    )


def stats(d: SizeOneDispatcher, t: float) -> Stats:
    """The body of ``SizeOneDispatcher.stats``."""
    levels = {}
    for number in sorted(d._levels, reverse=True):
        level = d._levels[number]
        arrivals = level.arrivals
        while arrivals and arrivals[0][3].state != QUEUED:
            heappop(arrivals)
        oldest = t - arrivals[0][0] if arrivals else 0.0
        mean = t - level.sum_arrival / level.queued if level.queued else 0.0
        cumulative, buckets = 0, []
        for bound, count in zip((*d._buckets, math.inf), level.buckets):
            cumulative += count
            buckets.append((bound, cumulative))
        levels[number] = LevelStats(
            level=number,
            queued=level.queued,
            oldest_wait=max(0.0, oldest),
            mean_wait=max(0.0, mean),
            dispatched=level.dispatched,
            total_wait=level.total_wait,
            reorders=Reorders(*level.reorders),
            wait_buckets=tuple(buckets),
        )
    members = {
        name: MemberStats(
            member=name,
            queued=m.queued,
            dispatched=m.dispatched,
            completed=m.completed,
            gpu_seconds=m.gpu_seconds,
            running=m.running,
        )
        for name, m in sorted(d._members.items())
    }
    held = sorted(
        (e for w in d._workers.values() for e in w.held), key=lambda e: (e.granted_at, e.job.seq)
    )
    return Stats(
        now=t,
        levels=levels,
        members=members,
        running=held[0].job if held else None,
        resident_model=single_resident(d),
        queued=len(d),
        dispatched=d._totals["dispatched"],
        completed=d._totals["completed"],
        cancelled=d._totals["cancelled"],
        expired=d._totals["expired"],
        failed=d._totals["failed"],
        swaps=d._swaps,
        held=tuple(e.job for e in held),
        workers=(
            tuple(d._workers[name].info() for name in sorted(d._workers))
            if d._name_in_grants
            else ()
        ),
    )
