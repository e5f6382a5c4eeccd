"""The dispatcher's diagnostics: statistics, forecasts and explanations (private).

These read the dispatcher's state and never change it (``stats`` prunes stale heap items,
which changes nothing observable). See ``_forecast`` for the dry run behind forecasts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop
from typing import TYPE_CHECKING

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
    from prioqueue.dispatcher import SizeOneDispatcher

__all__: list[str] = []  # private module


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
    entry = d._running
    if entry is None:
        return now
    expected = estimate(entry.job)
    if expected is None:
        return None
    return max(now, entry.granted_at + expected)


def lane_score(d: SizeOneDispatcher, lane: _Lane, now: float) -> float:
    """A backlogged lane's current score (its affinity as the ranking would give it)."""
    aff = 0.0
    resident = d._resident
    if resident is not None and d._ranking.candidate(lane, resident) is not None:
        aff = d._affinity(resident)
    return lane.level + lane.head().job.tier_bonus + aff + (now - lane.s) / d._divisor


def predict(
    d: SizeOneDispatcher, now: float, *, stop_at: _Entry | None, limit: int | None
) -> list[Predicted]:
    backlogged = [lane for lane in d._lanes.values() if lane.live]
    estimate = runtime_estimator(d)
    pending = None
    running = d._running
    if running is not None:
        expected = estimate(running.job)
        elapsed = max(0.0, now - running.granted_at)
        runtime = elapsed if expected is None else max(expected, elapsed)
        pending = (running.lane, float(d._charge(running.job, runtime)))
    return forecast_order(
        backlogged,
        now=now,
        busy_until=_busy_until(d, now, estimate),
        pending=pending,
        resident=d._resident,
        divisor=d._divisor,
        affinity=d._affinity,
        runtime=estimate,
        charge=d._charge,
        fair_share=d._fair_share,
        stop_at=stop_at,
        limit=limit,
    )


def forecast(d: SizeOneDispatcher, t: float, limit: int | None) -> list[AheadJob]:
    """The body of ``SizeOneDispatcher.forecast``."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
    predicted = predict(d, t, stop_at=None, limit=limit)
    return list(ahead_jobs(predicted, lane_score=lambda lane: lane_score(d, lane, t)))


def explain(d: SizeOneDispatcher, entry: _Entry, t: float) -> Explanation:
    """The body of ``SizeOneDispatcher.explain``."""
    job = entry.job
    lane = entry.lane
    overtaken = overtakes(
        job,
        until=entry.granted_at if entry.state == RUNNING else t,
        history=d._history,
        tier_bonus=lane.head().job.tier_bonus if lane.live else job.tier_bonus,
        s_at=(lambda at: lane_s_at(lane, at)) if d._fair_share else (lambda at: job.arrival),
        divisor=d._divisor,
        affinity=d._affinity,
    )
    if entry.state == RUNNING:
        grant = d._grant
        assert grant is not None
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
    predicted = predict(d, t, stop_at=entry, limit=None)
    ahead = ahead_jobs(predicted[:-1], lane_score=lambda other: lane_score(d, other, t))
    aff = 0.0
    resident = d._resident
    if resident is not None and d._ranking.candidate(lane, resident) is not None:
        aff = d._affinity(resident)
    score = ScoreBreakdown(
        band=job.priority,
        tier_bonus=lane.head().job.tier_bonus,
        swap_affinity=aff,
        aging=(t - lane.s) / d._divisor,
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
        estimated_start=predicted[-1].start,
        overtaken_by=overtaken,
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
        )
        for name, m in sorted(d._members.items())
    }
    return Stats(
        now=t,
        levels=levels,
        members=members,
        running=None if d._running is None else d._running.job,
        resident_model=d._resident,
        queued=len(d),
        dispatched=d._totals["dispatched"],
        completed=d._totals["completed"],
        cancelled=d._totals["cancelled"],
        expired=d._totals["expired"],
        failed=d._failed,
        swaps=d._swaps,
    )
