"""The dispatchers' diagnostics: statistics, forecasts and explanations (private).

These read the dispatcher's state and never change it (``stats`` prunes stale heap items,
which changes nothing observable). See ``_forecast`` for the dry run behind forecasts.

A fleet is forecast as its capacity of identical workers serving every model: the dry run
picks lanes exactly as one worker would, with runtimes shared among the workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import attrs

from prioqueue._core.config import OVERDUE_SLACK
from prioqueue._core.core import Core
from prioqueue._core.forecast import (
    OverdueRule,
    Predicted,
    ahead_jobs,
    forecast_order,
    lane_s_at,
    overtakes,
)
from prioqueue._core.starving import aging_exemption
from prioqueue._groups import checked_group
from prioqueue._lanes import PARKED, RUNNING, _Entry, _Lane
from prioqueue._validate import count_or_none
from prioqueue.records import (
    AheadJob,
    Explanation,
    Job,
    LevelStats,
    Reorders,
    Stats,
)
from prioqueue.scoring import ScoreBreakdown
from prioqueue.views import GroupStatus

__all__: list[str] = []  # private module


def single_resident(d: Core) -> str | None:
    """The resident model a forecast assumes: the one worker's, else None (a fleet)."""
    workers = d.workers.by_name
    if len(workers) == 1:
        return next(iter(workers.values())).resident
    return None


def runtime_estimator(d: Core) -> Callable[[Job], float | None]:
    """Return ``job -> expected runtime`` (its estimate, else a recent mean, else None).

    The recent mean is that of the job's model, else of all jobs; the means are computed once
    here, not once per job. O(64).
    """
    sums: dict[str | None, list[float]] = {}
    for _, runtime, model in d.lifecycle.runtimes.recent:
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


def _busy_until(d: Core, now: float, estimate: Callable[[Job], float | None]) -> float | None:
    """When the first worker is expected to be free: ``now`` when one has a free slot."""
    workers = [w for w in d.workers.by_name.values() if not w.timed_out]
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


def lane_score(d: Core, lane: _Lane, now: float) -> float:
    """A backlogged lane's current score (its affinity as the ranking would give it)."""
    aff = 0.0
    resident = single_resident(d)
    if resident is not None and d.lanes.ranking.candidate(lane, resident) is not None:
        aff = d.affinity(resident)
    return lane.level + lane.head().job.tier_bonus + aff + (now - lane.s) / d.divisor


def predict(d: Core, now: float, *, stop_at: _Entry | None, limit: int | None) -> list[Predicted]:
    backlogged = [lane for lane in d.lanes.by_key.values() if lane.live]
    estimate = runtime_estimator(d)
    capacity = max(1, d.workers.live)
    pending = []
    for worker in d.workers.by_name.values():
        for held in worker.held:
            expected = estimate(held.job)
            elapsed = max(0.0, now - held.granted_at)
            runtime = elapsed if expected is None else max(expected, elapsed)
            pending.append((held.lane, float(d.config.charge(held.job, runtime)) / held.capacity))
    return forecast_order(
        backlogged,
        now=now,
        busy_until=_busy_until(d, now, estimate),
        pending=pending,
        resident=single_resident(d),
        divisor=d.divisor,
        affinity=d.affinity,
        runtime=estimate,
        charge=d.config.charge,
        fair_share=d.config.fair_share,
        stop_at=stop_at,
        limit=limit,
        parallel=capacity,
        overdue=_overdue_rule(d),
    )


def _overdue_rule(d: Core) -> OverdueRule | None:
    """The overdue rule's constants for a forecast (None without fair share: no rule)."""
    if not d.config.fair_share:
        return None
    named = d.config.policy.aliases.values()
    top = max(named) if named else -(2**62)
    spread = aging_exemption(d)
    return OverdueRule(top, d.divisor, spread, OVERDUE_SLACK * spread, d.window)


def forecast(d: Core, t: float, limit: int | None) -> list[AheadJob]:
    """The body of ``Core.forecast``."""
    count_or_none("limit", limit)
    predicted = predict(d, t, stop_at=None, limit=limit)
    return list(ahead_jobs(predicted, lane_score=lambda lane: lane_score(d, lane, t)))


def _since(d: Core, entry: _Entry, limit: int | None) -> list[Any]:
    """The remembered grants since ``entry`` was queued, oldest first.

    Reads the history from its newest end: all of it back to the entry's mark, or, with a
    ``limit``, at most ``4 * limit`` records and ``limit`` of them by later submissions.
    """
    job = entry.job
    found: list[Any] = []
    later = 0
    budget = None if limit is None else 4 * limit
    for record in reversed(d.history.records):
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
    d: Core, job_id: str, now: float, ahead_limit: int | None, overtakes_limit: int | None
) -> Explanation:
    """The body of ``FleetDispatcher.explain`` (after ``fire``)."""
    entry = d.entry(job_id)
    count_or_none("ahead_limit", ahead_limit)
    count_or_none("overtakes_limit", overtakes_limit)
    t = d.tick(now)
    job = entry.job
    limit = job.max_attempts or d.config.max_attempts
    if entry.state == PARKED:
        return Explanation(
            job=job,
            state="queued",
            now=t,
            waited=max(0.0, t - job.arrival),
            score=ScoreBreakdown(job.priority, job.tier_bonus, 0.0, 0.0),
            lane_start=entry.queued_at,
            position=0,
            ahead=(),
            estimated_start=entry.queued_at,
            overtaken_by=(),
            not_before=entry.queued_at,
            deadline=job.deadline,
            attempt=entry.attempt,
            max_attempts=limit,
        )
    explanation = _explain(d, entry, t, ahead_limit, overtakes_limit)
    unfit: dict[str, str] = {}
    if entry.state != RUNNING and d.config.name_in_grants:  # a fleet's workers that skip the job
        for worker in d.workers.by_name.values():
            cause = None if worker.timed_out else worker.unfit(job)
            if cause is not None:
                unfit[worker.name] = cause
    return attrs.evolve(
        explanation, deadline=job.deadline, attempt=entry.attempt, max_attempts=limit, unfit=unfit
    )


def _explain(
    d: Core,
    entry: _Entry,
    t: float,
    ahead_limit: int | None = None,
    overtakes_limit: int | None = None,
) -> Explanation:
    """The body of ``explain`` (see ``FleetDispatcher.explain`` for the limits)."""
    job = entry.job
    lane = entry.lane
    overtaken = overtakes(
        job,
        until=entry.granted_at if entry.state == RUNNING else t,
        history=_since(d, entry, overtakes_limit),
        tier_bonus=lane.head().job.tier_bonus if lane.live else job.tier_bonus,
        s_at=(lambda at: lane_s_at(lane, at)) if d.config.fair_share else (lambda at: job.arrival),
        divisor=d.divisor,
        affinity=d.affinity,
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
    if resident is not None and d.lanes.ranking.candidate(lane, resident) is not None:
        aff = d.affinity(resident)
    score = ScoreBreakdown(
        band=job.priority,
        tier_bonus=lane.head().job.tier_bonus,
        swap_affinity=aff,
        aging=max(0.0, (t - lane.s) / d.divisor),
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


def stats(d: Core, t: float) -> Stats:
    """The body of ``FleetDispatcher.stats`` (after ``fire``)."""
    return _with_lifecycle(d, _stats(d, t))


def _stats(d: Core, t: float) -> Stats:
    levels = {}
    for number, level in sorted(d.lanes.levels.items(), reverse=True):
        first = level.oldest()
        oldest = t - first.arrival if first is not None else 0.0
        mean = t - level.sum_arrival / level.queued if level.queued else 0.0
        cumulative, buckets = 0, []
        for bound, count in zip((*d.config.buckets, math.inf), level.buckets):
            cumulative += count
            buckets.append((bound, cumulative))
        levels[number] = LevelStats(
            level=number,
            queued=level.queued,
            oldest_wait=max(0.0, oldest),
            mean_wait=max(0.0, mean),
            dispatched=level.dispatched,
            total_wait=level.total_wait,
            reorders=Reorders(**level.reorders),
            wait_buckets=tuple(buckets),
        )
    members = {name: m.frozen(name) for name, m in sorted(d.lanes.members.items())}
    held = d.workers.held_entries()
    return Stats(
        now=t,
        levels=levels,
        members=members,
        running=held[0].job if held else None,
        resident_model=single_resident(d),
        queued=len(d),
        dispatched=d.totals["dispatched"],
        completed=d.totals["completed"],
        cancelled=d.totals["cancelled"],
        expired=d.totals["expired"],
        failed=d.totals["failed"],
        swaps=d.swaps,
        held=tuple(e.job for e in held),
        workers=(
            tuple(d.workers.by_name[name].info() for name in sorted(d.workers.by_name))
            if d.config.name_in_grants
            else ()
        ),
    )


def _with_lifecycle(d: Core, stats: Stats) -> Stats:
    """``stats`` with the lifecycle's counts (ttl expiries, refusals, delayed jobs, groups)."""
    levels = stats.levels
    timers = d.lifecycle.timers
    if timers.levels or timers.parked:
        levels = dict(levels)
        for number, level in levels.items():
            expired, refused = timers.levels.get(number, (0, 0))
            levels[number] = attrs.evolve(
                level, ttl_expired=expired, refused=refused, delayed=timers.parked.get(number, 0)
            )
    totals = d.totals
    return attrs.evolve(
        stats,
        levels=levels,
        groups=d.groups.active,
        ttl_expired=totals["ttl_expired"],
        refused=totals["refused"],
        retried=totals["retried"],
        delayed=sum(timers.parked.values()),
    )


def group_status(d: Core, group: str, now: float) -> GroupStatus:
    """The body of ``FleetDispatcher.group_status`` (after ``fire``)."""
    group = checked_group(group)
    live = d.groups.live(group)
    t = d.tick(now)
    finish = forecast_finish(d, t, [job_id for job_id, _ in live])
    return d.groups.status(group, now=t, finish=finish)


def forecast_finish(d: Core, now: float, jobs: Collection[str]) -> float | None:
    """Predict when the last of ``jobs`` (queued or held) finishes.

    It reads the dry run behind ``forecast()`` (the current load, no new arrivals, runtimes
    from estimates or recent means): the latest of the held jobs' expected ends (never before
    ``now``) and the queued jobs' predicted starts plus expected runtimes.

    Returns:
        The predicted finish, or None when ``jobs`` is empty or a runtime on the way is
        unknown.

    Complexity: O(L log L + n log L) for L backlogged lanes and n queued jobs.
    """
    if not jobs:
        return None
    expected = runtime_estimator(d)
    wanted = set(jobs)
    finish: float | None = None
    for worker in d.workers.by_name.values():
        for entry in worker.held:
            if entry.job.id in wanted:
                runtime = expected(entry.job)
                if runtime is None:
                    return None
                end = max(now, entry.granted_at + runtime)
                finish = end if finish is None else max(finish, end)
                wanted.discard(entry.job.id)
    if not wanted:
        return finish
    for step in predict(d, now, stop_at=None, limit=None):
        job = step.entry.job
        if job.id not in wanted:
            continue
        runtime = expected(job)
        if step.start is None or runtime is None:
            return None
        end = step.start + runtime
        finish = end if finish is None else max(finish, end)
        wanted.discard(job.id)
        if not wanted:
            break
    return finish
