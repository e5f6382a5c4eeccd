"""The simulator's metrics: waits per level, fair share, GPU use and reorders, as plain data.

Definitions (documented in ``docs/simulator.md``):

* **wait**: seconds from a job's arrival to the grant of the attempt that ran it to the end
  (completed jobs only). Percentiles interpolate linearly between closest ranks (numpy's
  default).
* **slowdown**: response time (arrival to completion) over the job's warm duration (at least
  one second), averaged over the completed jobs.
* **GPU seconds** of a member: every second the GPU held one of its jobs, cold loads and hung
  attempts included.
* **service gap**: for every pair of members backlogged (holding a queued job) at the same level
  over an interval, how far apart the service charged to them in that interval drifts; the
  largest over all pairs and intervals. Service is credited when a job leaves the GPU, in the
  policy's charge units (GPU seconds with the default ``runtime`` charge). The analytic bound is
  ``2 * C + (T + A) * d``: ``C`` the largest charge at the level, ``T`` the spread of the tier
  bonuses at the level, ``A`` the largest affinity and ``d`` the aging divisor (the baselines
  are measured against the default policy's bound).
* **Jain's index** at a level: ``(sum x)^2 / (n * sum x^2)`` over the members that were backlogged
  while another member also was, ``x`` being the service each received during such contended
  time (1: equal shares; 1/n: one member got everything).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prioqueue.sim.engine import CANCELLED, DONE, FAILED, RunResult
from prioqueue.sim.policies import PolicyParams
from prioqueue.sim.workload import Workload

__all__ = ["build_report", "jain_index", "percentile", "service_gaps", "summarize"]

_SERVICE, _OFF, _ON = 0, 1, 2


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the ``q``-th percentile of sorted ``values`` (linear interpolation).

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


def jain_index(values: Iterable[float]) -> float | None:
    """Return Jain's fairness index of ``values`` (None when empty or all zero).

    Args:
        values: Non-negative allocations.

    Returns:
        ``(sum x)^2 / (n * sum x^2)``, within ``[1/n, 1]``.
    """
    xs = list(values)
    square = math.fsum(x * x for x in xs)
    if not xs or square == 0:
        return None
    return math.fsum(xs) ** 2 / (len(xs) * square)


def _charge(
    params: PolicyParams, is_baseline: bool, estimate: float | None, runtime: float
) -> float:
    if is_baseline or params.charge == "runtime":
        return runtime
    if params.charge == "estimate":
        return runtime if estimate is None else estimate
    return float(params.charge)


def service_gaps(
    events: list[tuple[float, int, str, float]],
) -> tuple[float, tuple[str, str] | None, dict[str, float]]:
    """Sweep one level's events and measure the largest service gap and contended service.

    Args:
        events: ``(time, kind, member, amount)`` with kind 0 (service of ``amount``
            credited), 1 (one queued job fewer) or 2 (one queued job more). At one instant,
            services come first, then departures, then arrivals.

    Returns:
        The largest gap, the pair of members it was between (None when no two members were
        ever backlogged together), and each member's service received while it and another
        member were backlogged.
    """
    events.sort(key=lambda e: (e[0], e[1]))
    queued: dict[str, int] = defaultdict(int)
    active: set[str] = set()
    # pair (a, b) with a < b -> [S_a - S_b, max, min]
    pairs: dict[tuple[str, str], list[float]] = {}
    contended: dict[str, float] = {}
    best = 0.0
    best_pair: tuple[str, str] | None = None

    def close(pair: tuple[str, str], track: list[float]) -> None:
        nonlocal best, best_pair
        gap = track[1] - track[2]
        if best_pair is None or gap > best:
            best, best_pair = gap, pair

    for _, kind, member, amount in events:
        if kind == _SERVICE:
            if member not in active:
                continue
            if len(active) > 1:
                contended[member] = contended.get(member, 0.0) + amount
            for other in active:
                if other == member:
                    continue
                if member < other:
                    track = pairs[member, other]
                    track[0] += amount
                else:
                    track = pairs[other, member]
                    track[0] -= amount
                if track[0] > track[1]:
                    track[1] = track[0]
                elif track[0] < track[2]:
                    track[2] = track[0]
        elif kind == _OFF:
            queued[member] -= 1
            if queued[member] == 0:
                active.discard(member)
                for other in active:
                    pair = (member, other) if member < other else (other, member)
                    close(pair, pairs.pop(pair))
        else:
            queued[member] += 1
            if queued[member] == 1:
                for other in active:
                    pair = (member, other) if member < other else (other, member)
                    pairs[pair] = [0.0, 0.0, 0.0]
                    contended.setdefault(member, 0.0)
                    contended.setdefault(other, 0.0)
                active.add(member)
    for pair, track in pairs.items():
        close(pair, track)
    return best, best_pair, contended


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarize(result: RunResult, base: PolicyParams) -> dict[str, Any]:
    """Return one policy's section of the report (see ``docs/simulator.md`` for the schema).

    Args:
        result: The run.
        base: The parameters whose analytic bound the baselines are measured against.

    Returns:
        A JSON-serialisable mapping.
    """
    workload = result.workload
    arrivals = workload.arrivals
    spec = result.spec
    params = base if spec.is_baseline else spec.params
    tiers = params.tier_bonuses
    status, start, end = result.status, result.start, result.end

    waits: dict[int, list[float]] = defaultdict(list)
    slowdown: dict[int, list[float]] = defaultdict(list)
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # jobs, done, cancel, fail
    level_events: dict[int, list[tuple[float, int, str, float]]] = defaultdict(list)
    largest_charge: dict[int, float] = defaultdict(float)
    level_tiers: dict[int, set[str]] = defaultdict(set)
    gpu: dict[str, float] = defaultdict(float)
    member_jobs: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])  # jobs, done, wait
    requeued_from: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for j, granted, expired, _ in result.retries:
        requeued_from[j].append((granted, expired))
        gpu[arrivals[j].member] += expired - granted

    for i, job in enumerate(arrivals):
        level = job.priority
        member = job.member
        row = counts[level]
        row[0] += 1
        member_jobs[member][0] += 1
        level_tiers[level].add(job.tier)
        events = level_events[level]
        queued_from = job.arrival
        for granted, expired in requeued_from.get(i, ()):
            events.append((queued_from, _ON, member, 0.0))
            events.append((granted, _OFF, member, 0.0))
            queued_from = expired
        st = status[i]
        ran = not math.isnan(start[i])
        if st == FAILED:
            row[3] += 1
        else:
            events.append((queued_from, _ON, member, 0.0))
            events.append((start[i] if ran else end[i], _OFF, member, 0.0))
        if ran:
            runtime = end[i] - start[i]
            gpu[member] += runtime
            charge = _charge(params, spec.is_baseline, job.estimate, runtime)
            events.append((end[i], _SERVICE, member, charge))
            largest_charge[level] = max(largest_charge[level], charge)
        if st == DONE:
            row[1] += 1
            wait = start[i] - job.arrival
            waits[level].append(wait)
            slowdown[level].append((end[i] - job.arrival) / max(job.duration, 1.0))
            member_jobs[member][1] += 1
            member_jobs[member][2] += wait
        elif st == CANCELLED:
            row[2] += 1

    levels: dict[str, Any] = {}
    for level in sorted(counts, reverse=True):
        jobs, done, cancelled, failed = counts[level]
        ws = sorted(waits[level])
        gap, pair, contended = service_gaps(level_events[level])
        bonuses = [tiers.get(t, 0.0) for t in level_tiers[level]]
        spread = max(bonuses) - min(bonuses) if bonuses else 0.0
        bound = 2 * largest_charge[level] + (spread + params.max_affinity) * params.aging_divisor
        levels[str(level)] = {
            "jobs": jobs,
            "completed": done,
            "cancelled": cancelled,
            "failed": failed,
            "wait_p50": _round(percentile(ws, 50)),
            "wait_p95": _round(percentile(ws, 95)),
            "wait_p99": _round(percentile(ws, 99)),
            "wait_max": _round(ws[-1] if ws else None),
            "wait_mean": _round(math.fsum(ws) / len(ws) if ws else None),
            "slowdown_mean": _round(
                math.fsum(slowdown[level]) / len(slowdown[level]) if slowdown[level] else None
            ),
            "jain": _round(jain_index(contended.values()), 4),
            "service_gap": _round(gap if pair is not None else None),
            "service_gap_members": list(pair) if pair is not None else None,
            "gap_bound": _round(bound),
            "reorders": result.reorders.get(level, {}),
        }

    busy = math.fsum(gpu.values())
    members = {
        member: {
            "jobs": int(row[0]),
            "completed": int(row[1]),
            "gpu_seconds": _round(gpu.get(member, 0.0)),
            "gpu_share": _round(gpu.get(member, 0.0) / busy if busy else 0.0, 4),
            "wait_mean": _round(row[2] / row[1] if row[1] else None),
        }
        for member, row in sorted(member_jobs.items())
    }
    totals: dict[str, int] = defaultdict(int)
    for per_level in result.reorders.values():
        for cause, count in per_level.items():
            totals[cause] += count
    wall = result.wall_seconds
    return {
        "kind": spec.kind,
        "params": None if spec.is_baseline else spec.params.as_dict(),
        "levels": levels,
        "members": members,
        "jobs": len(arrivals),
        "completed": sum(c[1] for c in counts.values()),
        "cancelled": sum(c[2] for c in counts.values()),
        "failed": sum(c[3] for c in counts.values()),
        "expired": len(result.retries),
        "swaps": result.swaps,
        "load_seconds": _round(result.load_seconds),
        "busy_seconds": _round(busy),
        "idle_seconds": _round(result.idle_seconds),
        "idle_waiting_seconds": _round(result.idle_waiting_seconds),
        "lost_seconds": _round(result.lost_seconds),
        "makespan": _round(result.makespan),
        "events": result.events,
        "reorders": dict(totals),
        "timing": {
            "wall_seconds": round(wall, 4),
            "events_per_second": round(result.events / wall) if wall > 0 else None,
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
        ``{"scenario": {...}, "policies": {label: {...}}}``, JSON-serialisable.
    """
    base = base if base is not None else PolicyParams()
    params: Mapping[str, Any] = workload.params
    return {
        "scenario": {
            "name": workload.name,
            "source": source or "built-in",
            "params": dict(params),
            "jobs": len(workload.arrivals),
            "work_seconds": round(workload.work_seconds(), 3),
            "load_seconds": dict(workload.load_seconds),
        },
        "policies": {r.spec.label: summarize(r, base) for r in results},
    }
