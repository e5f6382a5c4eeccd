"""The simulator's metrics: waits per level, fairness, GPU use and reorders, as plain data.

Definitions (documented in ``docs/simulator.md``):

* **wait**: seconds from a job's arrival to the grant of the attempt that ran it to the end.
  A job still queued when a horizon stops the clock has a **censored** wait: the time it had
  waited by then, a lower bound; censored waits are counted in the percentiles (so a policy
  cannot look good by never running a job) and ``censored_from`` says from which value on a
  figure is only a lower bound. Percentiles interpolate linearly between closest ranks
  (numpy's default).
* **unfinished**: jobs queued at the horizon; **starved**: those among them that had waited
  longer than the level's aging bound ``(H - L + T + A) * d`` (``H`` the top level, ``L`` the
  job's, ``T`` the tier spread, ``A`` the largest affinity, ``d`` the divisor): past it, aging
  ranks a job above any fresh job, so a policy that ages never leaves one waiting that long
  behind fresh work.
* **refused** and **ttl_expired** (only with queue budgets, ``PolicyParams.budgets``): jobs
  whose submit a level's ``max_queued`` or ``max_wait`` turned away, and jobs that left the
  queue at their ``ttl`` deadline without ever being granted. Neither has a wait (like a job
  cancelled while queued), so they are reported beside the waits, never hidden in them.
* **slowdown**: response time (arrival to completion) over the job's warm duration (at least
  one second), averaged over the completed jobs.
* **GPU seconds** of a member: every second the GPU held one of its jobs, cold loads and hung
  attempts included.
* **service gap**, **share of the max-min fair share** and **Jain's index**: see
  :mod:`prioqueue.sim.fairness`. The gap's analytic bound is ``k * Δ + (T + A) * d + 10 * C``
  on one GPU, and ``N * (k * Δ + (T + A) * d) + 10 * K * C`` on a fleet of ``N`` workers
  holding ``K`` jobs at once in all (their slots), with ``C`` the largest charge at the
  level, ``T`` the spread of its members' tiers and ``k * Δ`` the overdue slack
  (:data:`~prioqueue.dispatcher.OVERDUE_SLACK` times the offsets with every tier counted;
  ``docs/design/fleet.md``, Theorem 2: the gap is measured from the moment both members are
  backlogged, when their virtual starts may differ); the baselines are measured against the
  default policy's.
* **workers** (a fleet only): per worker, the runs it started, its swaps, load seconds, busy
  seconds and **utilisation** (busy seconds over the run's clock).
* **groups** (when jobs carry a group, e.g. a film): its jobs, when its first job was
  submitted and when its last left (**finish**), and the error of the finish forecasts taken
  during the run (:mod:`prioqueue.sim.groups`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from prioqueue.dispatcher import OVERDUE_SLACK
from prioqueue.sim.fairness import OFF as _OFF
from prioqueue.sim.fairness import ON as _ON
from prioqueue.sim.fairness import SERVICE as _SERVICE
from prioqueue.sim.fairness import fair_shares, jain_index, service_gaps
from prioqueue.sim.policies import PolicyParams
from prioqueue.sim.results import JobState, RunResult
from prioqueue.sim.workload import Arrival, Workload

__all__ = ["build_report", "jain_index", "percentile", "service_gaps", "summarize"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the ``q``-th percentile of sorted ``values`` (linear interpolation). O(1).

    Args:
        values: Sorted numbers.
        q: The percentile, within [0, 100].

    Returns:
        The percentile, or None when ``values`` is empty.
    """
    if not values:
        return None
    rank = (len(values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def _charge(
    params: PolicyParams, is_baseline: bool, estimate: float | None, runtime: float
) -> float:
    if is_baseline or params.charge == "runtime":
        return runtime
    if params.charge == "estimate":
        return runtime if estimate is None else estimate
    return float(params.charge)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


class _Counts:
    """One level's jobs by outcome."""

    __slots__ = ("cancelled", "completed", "failed", "jobs", "refused", "ttl_expired")

    def __init__(self) -> None:
        self.jobs = self.completed = self.cancelled = self.failed = 0
        self.ttl_expired = self.refused = 0


class _Member:
    """One member's jobs, completed jobs and the waits of those."""

    __slots__ = ("completed", "jobs", "waited")

    def __init__(self) -> None:
        self.jobs = self.completed = 0
        self.waited = 0.0


class _Tally:
    """What :func:`summarize` reads off a run, per level and per member: one pass, O(n).

    Args:
        result: The run.
        params: The parameters its charges and bounds are measured with.
    """

    def __init__(self, result: RunResult, params: PolicyParams) -> None:
        self.result = result
        self.params = params
        self.clock = result.clock_end
        self.waits: dict[int, list[float]] = defaultdict(list)
        self.censored: dict[int, list[float]] = defaultdict(list)
        self.slowdown: dict[int, list[float]] = defaultdict(list)
        self.counts: dict[int, _Counts] = defaultdict(_Counts)
        self.events: dict[int, list[tuple[float, int, str, float]]] = defaultdict(list)
        self.backlog: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
        self.runs: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
        self.largest_charge: dict[int, float] = defaultdict(float)
        self.longest_run: dict[int, float] = defaultdict(float)
        self.tiers: dict[int, set[str]] = defaultdict(set)
        self.gpu: dict[str, float] = defaultdict(float)
        self.members: dict[str, _Member] = defaultdict(_Member)
        self.requeued_from: dict[int, list[tuple[float, float]]] = defaultdict(list)
        arrivals = result.workload.arrivals
        for j, granted, expired, _ in result.retries:
            self.requeued_from[j].append((granted, expired))
            self.gpu[arrivals[j].member] += expired - granted
            self.runs[arrivals[j].priority].append((granted, expired, arrivals[j].member))
        for i, job in enumerate(arrivals):
            if result.status[i] != JobState.PENDING:  # JobState.PENDING: arrived after the horizon
                self._job(i, job)

    def _job(self, i: int, job: Arrival) -> None:
        """Count job ``i``: its outcome, backlog, run, wait and member."""
        result = self.result
        came = result.submitted[i] if result.submitted else job.arrival
        level, member, st = job.priority, job.member, result.status[i]
        row = self.counts[level]
        row.jobs += 1
        self.members[member].jobs += 1
        self.tiers[level].add(job.tier)
        if st == JobState.REFUSED:  # never queued: no wait, no backlog
            row.refused += 1
            return
        self._queued(i, job, came)
        start, end = result.start[i], result.end[i]
        if not math.isnan(start):
            self._ran(i, job, came)
        elif st == JobState.QUEUED:
            self.censored[level].append(self.clock - came)
        if st == JobState.DONE:
            row.completed += 1
            self.slowdown[level].append((end - came) / max(job.duration, 1.0))
            self.members[member].completed += 1
            self.members[member].waited += start - came
        elif st == JobState.CANCELLED:
            row.cancelled += 1
        elif st == JobState.EXPIRED:
            row.ttl_expired += 1
        elif st == JobState.FAILED:
            row.failed += 1

    def _queued(self, i: int, job: Arrival, came: float) -> None:
        """Job ``i``'s backlog intervals: each attempt's queueing, and the last one's."""
        result = self.result
        level, member = job.priority, job.member
        events, backlog = self.events[level], self.backlog[level]
        queued_from = came
        for granted, expired in self.requeued_from.get(i, ()):
            events.append((queued_from, _ON, member, 0.0))
            events.append((granted, _OFF, member, 0.0))
            backlog.append((queued_from, granted, member))
            queued_from = expired
        st, start = result.status[i], result.start[i]
        if st == JobState.FAILED:
            return
        ran = not math.isnan(start)
        left = start if ran else (self.clock if st == JobState.QUEUED else result.end[i])
        events.append((queued_from, _ON, member, 0.0))
        events.append((left, _OFF, member, 0.0))
        backlog.append((queued_from, left, member))

    def _ran(self, i: int, job: Arrival, came: float) -> None:
        """Job ``i``'s last attempt ran: its GPU time, charge and wait."""
        result = self.result
        level, member = job.priority, job.member
        start, end = result.start[i], result.end[i]
        finished = not math.isnan(end)
        stop = end if finished else self.clock
        runtime = stop - start
        self.gpu[member] += runtime
        self.runs[level].append((start, stop, member))
        self.longest_run[level] = max(self.longest_run[level], runtime)
        if finished:
            charge = self.charge(i, job, runtime)
            self.events[level].append((end, _SERVICE, member, charge))
            self.largest_charge[level] = max(self.largest_charge[level], charge)
        if result.status[i] != JobState.CANCELLED:
            self.waits[level].append(start - came)

    def charge(self, i: int, job: Arrival, runtime: float) -> float:
        """The service job ``i`` counts for its member: the policy's charge for ``runtime``."""
        return _charge(self.params, self.result.spec.is_baseline, job.estimate, runtime)

    def level(
        self, level: int, top: int, timeline: list[tuple[float, float]] | None
    ) -> dict[str, Any]:
        """One level's section of the report (``top``: the highest level)."""
        params, result = self.params, self.result
        row = self.counts[level]
        unfinished = sorted(self.censored[level])
        ws = sorted(self.waits[level] + unfinished)
        gap, pair, contended = service_gaps(self.events[level], timeline)
        bonuses = [params.tier_bonuses.get(t, 0.0) for t in self.tiers[level]]
        spread = max(bonuses) - min(bonuses) if bonuses else 0.0
        offsets = (spread + params.max_affinity) * params.aging_divisor
        # The pairwise bound measured from when both members are backlogged (issue 17 item 3;
        # docs/design/fleet.md, "Fairness bound for N workers", Theorem 2).
        fleet_n = max(1, len(result.workers))
        held_k = max(1, sum(w.slots for w in result.workers))
        # A grant leaves its lane at most the pair's offsets ahead (the ranking) or the
        # overdue slack k * (T + A) * d, every tier counted (an overdue grant): the widest.
        every = list(params.tier_bonuses.values()) or [0.0]
        slack = OVERDUE_SLACK * (max(every) - min(every) + params.max_affinity)
        ahead = max(offsets, slack * params.aging_divisor)
        bound = fleet_n * (ahead + offsets) + 10 * held_k * self.largest_charge[level]
        aging_bound = (top - level) * params.aging_divisor + offsets
        shares = fair_shares(self.backlog[level], self.runs[level])
        slowdown = self.slowdown[level]
        return {
            "jobs": row.jobs,
            "completed": row.completed,
            "cancelled": row.cancelled,
            "failed": row.failed,
            "unfinished": len(unfinished),
            "starved": sum(1 for w in unfinished if w > aging_bound),
            "censored_from": _round(unfinished[0] if unfinished else None),
            "aging_bound": _round(aging_bound),
            "wait_p50": _round(percentile(ws, 50)),
            "wait_p95": _round(percentile(ws, 95)),
            "wait_p99": _round(percentile(ws, 99)),
            "wait_max": _round(ws[-1] if ws else None),
            "wait_mean": _round(math.fsum(ws) / len(ws) if ws else None),
            "slowdown_mean": _round(math.fsum(slowdown) / len(slowdown) if slowdown else None),
            "service_gap": _round(gap if pair is not None else None),
            "service_gap_members": list(pair) if pair is not None else None,
            "gap_bound": _round(bound),
            "fair_share": _share_summary(shares, self.longest_run[level]),
            "jain": _round(jain_index(contended.values()), 4),
            "reorders": result.reorders.get(level, {}),
        }

    def member_rows(self) -> dict[str, Any]:
        """Each member's jobs, GPU seconds, share of the busy time and mean wait."""
        busy = math.fsum(self.gpu.values())
        return {
            member: {
                "jobs": row.jobs,
                "completed": row.completed,
                "gpu_seconds": _round(self.gpu.get(member, 0.0)),
                "gpu_share": _round(self.gpu.get(member, 0.0) / busy if busy else 0.0, 4),
                "wait_mean": _round(row.waited / row.completed if row.completed else None),
            }
            for member, row in sorted(self.members.items())
        }


def summarize(
    result: RunResult,
    base: PolicyParams,
    *,
    gap_timelines: dict[int, list[tuple[float, float]]] | None = None,
) -> dict[str, Any]:
    """Return one policy's section of the report (see ``docs/simulator.md`` for the schema).

    O(n log n) for n jobs (the waits are sorted per level).

    Args:
        result: The run.
        base: The parameters whose analytic bounds the baselines are measured against.
        gap_timelines: When given, filled with each level's service gap over time (see
            :func:`~prioqueue.sim.fairness.service_gaps`), for charts.

    Returns:
        A JSON-serialisable mapping.
    """
    spec = result.spec
    tally = _Tally(result, base if spec.is_baseline else spec.params)
    counts = tally.counts
    budgeted = (not spec.is_baseline and bool(spec.params.budgets)) or any(
        c.ttl_expired or c.refused for c in counts.values()
    )
    top = max(counts, default=0)
    levels: dict[str, Any] = {}
    for level in sorted(counts, reverse=True):
        timeline = None if gap_timelines is None else gap_timelines.setdefault(level, [])
        levels[str(level)] = tally.level(level, top, timeline)
        if budgeted:  # only with queue budgets: every other report stays as it was
            row = counts[level]
            levels[str(level)].update(refused=row.refused, ttl_expired=row.ttl_expired)
    totals: dict[str, int] = defaultdict(int)
    for per_level in result.reorders.values():
        for cause, count in per_level.items():
            totals[cause] += count
    extra: dict[str, Any] = {}
    if result.workers:
        extra["workers"] = _workers(result)
    groups = _groups(result)
    if groups:
        extra["groups"] = groups
    if budgeted:
        extra["refused"] = sum(c.refused for c in counts.values())
        extra["ttl_expired"] = sum(c.ttl_expired for c in counts.values())
    return {
        "kind": spec.kind,
        "params": None if spec.is_baseline else spec.params.as_dict(),
        "levels": levels,
        "members": tally.member_rows(),
        "jobs": sum(c.jobs for c in counts.values()),
        "completed": sum(c.completed for c in counts.values()),
        "cancelled": sum(c.cancelled for c in counts.values()),
        "failed": sum(c.failed for c in counts.values()),
        **_totals(result, math.fsum(tally.gpu.values())),
        "reorders": dict(totals),
        "timing": _timing(result),
        **extra,
    }


def _totals(result: RunResult, busy: float) -> dict[str, Any]:
    """The run's unfinished and expired jobs, GPU totals, clock and policy calls."""
    return {
        "unfinished": sum(1 for st in result.status if st == JobState.QUEUED),
        "expired": len(result.retries),
        "swaps": result.swaps,
        "load_seconds": _round(result.load_seconds),
        "busy_seconds": _round(busy),
        "idle_seconds": _round(result.idle_seconds),
        "idle_waiting_seconds": _round(result.idle_waiting_seconds),
        "lost_seconds": _round(result.lost_seconds),
        "makespan": _round(result.makespan),
        "horizon": _round(result.horizon),
        "events": result.events,
    }


def _timing(result: RunResult) -> dict[str, Any]:
    """The run's wall time and policy calls per second (its only non-deterministic figures)."""
    wall = result.wall_seconds
    return {
        "wall_seconds": round(wall, 4),
        "events_per_second": round(result.events / wall) if wall > 0 else None,
    }


def _workers(result: RunResult) -> dict[str, Any]:
    """Each worker's runs, swaps, loads, busy time and utilisation."""
    clock = result.clock_end
    return {
        w.name: {
            "slots": w.slots,
            "speed": w.speed,
            "models": w.models,
            "jobs": w.jobs,
            "swaps": w.swaps,
            "load_seconds": _round(w.load_seconds),
            "busy_seconds": _round(w.busy_seconds),
            "lost_seconds": _round(w.lost_seconds),
            "utilisation": _round(w.busy_seconds / clock if clock > 0 else 0.0, 4),
        }
        for w in result.workers
    }


def _groups(result: RunResult) -> dict[str, Any]:
    """Each group's jobs, first submission, finish and forecast error."""
    from prioqueue.sim.groups import forecast_errors

    arrivals = result.workload.arrivals
    found: dict[str, list[int]] = defaultdict(list)
    for i, job in enumerate(arrivals):
        if job.group is not None:
            found[job.group].append(i)
    out: dict[str, Any] = {}
    for group, jobs in found.items():
        submitted = [result.submitted[i] for i in jobs if result.submitted]
        known = [t for t in submitted if not math.isnan(t)]
        done = [i for i in jobs if result.status[i] == JobState.DONE]
        ended = [result.end[i] for i in jobs if not math.isnan(result.end[i])]
        complete = len(ended) == len(jobs)
        finish = max(ended) if complete and ended else None
        row: dict[str, Any] = {
            "jobs": len(jobs),
            "completed": len(done),
            "first_submitted": _round(min(known) if known else None),
            "finish": _round(finish),
            "depth": result.workload.chains.get(group),
        }
        points = result.forecasts.get(group)
        if points and finish is not None:
            row["forecast"] = forecast_errors(points, finish)
        out[group] = row
    return out


def _share_summary(shares: Mapping[str, tuple[float, float]], longest: float) -> dict[str, Any]:
    """The level's worst rated share of the max-min fair share, and every member's figures."""
    rated = {m: got / fair for m, (got, fair) in shares.items() if fair > 0 and fair >= longest}
    worst = min(rated, key=lambda m: (rated[m], m)) if rated else None
    return {
        "worst": _round(rated[worst] if worst is not None else None, 4),
        "worst_member": worst,
        "rated": len(rated),
        "members": {
            m: {"received": _round(got), "fair": _round(fair)} for m, (got, fair) in shares.items()
        },
    }


def build_report(
    workload: Workload,
    results: Sequence[RunResult],
    *,
    base: PolicyParams | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """Return the whole report: the scenario and one section per policy.

    Args:
        workload: The workload every policy ran.
        results: One run per policy, in report order.
        base: The parameters of the default policy (for the baselines' bound).
        source: Where the workload came from (``"built-in"`` or a trace path).

    Returns:
        ``{"scenario": {...}, "summary": {...}, "policies": {label: {...}}}``,
        JSON-serialisable; the summary is :func:`prioqueue.sim.summary.summarize_report`'s.
    """
    from prioqueue.sim.summary import summarize_report

    base = base if base is not None else PolicyParams()
    params: Mapping[str, Any] = workload.params
    horizons = {r.horizon for r in results}
    report: dict[str, Any] = {
        "scenario": {
            "name": workload.name,
            "source": source or "built-in",
            "params": dict(params),
            "jobs": len(workload.arrivals),
            "work_seconds": round(workload.work_seconds(), 3),
            "load_seconds": dict(workload.load_seconds),
            "horizon": _round(max((h for h in horizons if h is not None), default=None)),
        },
        "summary": {},
        "policies": {r.spec.label: summarize(r, base) for r in results},
    }
    report["summary"] = summarize_report(report)
    return report
