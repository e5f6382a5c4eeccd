"""Fairness measures that respect demand: service gap, share of the max-min fair share, Jain.

A member who asked for less must not count as treated unfairly. Both primary measures therefore
compare members only while they are **backlogged at the same level** (holding a queued job):

* **Service gap** (:func:`service_gaps`): for each pair of members, over each interval in
  which both are backlogged, how far the service charged to one drifts ahead of the other's;
  the largest drift over all pairs and intervals. Service is credited when a job leaves the GPU,
  in the policy's charge units, exactly as the dispatcher charges it, so the figure is directly
  comparable with the design's bound ``(k + 1) * (T + A) * d + 10 * C`` (``k`` the overdue
  slack; ``docs/design/fleet.md``).
* **Share of the max-min fair share** (:func:`fair_shares`): time is cut into intervals in
  which the set ``B`` of backlogged members is constant. While ``|B| >= 2``, the GPU time the
  level's jobs of members of ``B`` received is what those members competed for; each member of
  ``B`` is entitled to an equal part of it (every member of ``B`` wants more than that, so the
  max-min fair split is the equal split). Summed over the run, each member has its ``fair``
  seconds and the seconds it ``received``; ``received / fair`` is 1 for a perfectly fair policy.
  A one-GPU, non-preemptive policy cannot split a job, so members whose fair seconds are less
  than the level's longest job are listed but not rated.
* **Jain's index** (:func:`jain_index`) over the service received while contended: kept as a
  secondary figure; it punishes members who simply asked for less.
* **Inverted pairs** (:func:`inverted_pairs`): fair share must never invert demand. Two members
  of the same tier at one level form an inverted pair when the one who asked for at most half
  the GPU time of the other there (the sum of its jobs' warm durations) waited longer on
  average, by more than a slack (the benchmark uses ``C``, the longest job: the one-job limit
  of non-preemption). A job still queued when the clock stopped counts with the wait it had
  then. Demands within a factor of two are not compared: fair share equalises service, not
  waits, and the mean wait of a member's handful of jobs depends on when they arrived (under
  overload every policy, FIFO too, then shows "inversions" of hours between members whose
  demands differ by 10 %).

Worked example (also a test): ``A`` submits three 60-second jobs and ``B`` one, all at 0, at the
same level. ``strict`` (FIFO) runs ``a1, a2, a3, b1``: during ``[0, 120)`` both are backlogged
and ``A`` receives 120 s while each was entitled to 60 s; at 120 ``a3`` starts and ``A`` is no
longer backlogged. ``B`` received 0 of its 60 fair seconds (share 0.0) and the service gap is
120 s. A fair-share policy runs ``a1, b1, ...``: ``B`` is backlogged only during ``[0, 60)``,
fair 30 s each, below one job (not rated), gap 60 s. Jain's index over contended service is
0.5 in both runs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

__all__ = ["OFF", "ON", "SERVICE", "fair_shares", "inverted_pairs", "jain_index", "service_gaps"]

SERVICE, OFF, ON = 0, 1, 2
"""Event kinds of :func:`service_gaps`: service credited, one queued job fewer, one more."""


def jain_index(values: Iterable[float]) -> float | None:
    """Return Jain's fairness index of ``values`` (None when empty or all zero). O(n).

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


def service_gaps(
    events: list[tuple[float, int, str, float]],
    timeline: list[tuple[float, float]] | None = None,
) -> tuple[float, tuple[str, str] | None, dict[str, float]]:
    """Sweep one level's events and measure the largest service gap and contended service.

    O(e log e + e * p) for ``e`` events and ``p`` pairs backlogged together.

    Args:
        events: ``(time, kind, member, amount)`` with kind :data:`SERVICE` (``amount`` of
            service credited), :data:`OFF` (one queued job fewer) or :data:`ON` (one queued
            job more). At one instant, services come first, then departures, then arrivals.
            Sorted in place.
        timeline: When given, ``(time, gap)`` is appended after every event: the largest
            drift, at that moment, between two members backlogged together (for charts).

    Returns:
        The largest gap, the pair of members it was between (the least pair, in name
        order, among equal gaps; None when no two members were ever backlogged together),
        and each member's service received while it and another member were backlogged.
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
        # Equal gaps go to the least pair, so the answer does not depend on the order in
        # which a set of members is iterated (that is, on PYTHONHASHSEED).
        if best_pair is None or gap > best or (gap == best and pair < best_pair):
            best, best_pair = gap, pair

    for when, kind, member, amount in events:
        if kind == SERVICE:
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
        elif kind == OFF:
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
        if timeline is not None:
            now_gap = max((t[1] - t[2] for t in pairs.values()), default=0.0)
            timeline.append((when, now_gap))
    for pair, track in pairs.items():
        close(pair, track)
    return best, best_pair, contended


def fair_shares(
    backlog: Sequence[tuple[float, float, str]],
    runs: Sequence[tuple[float, float, str]],
) -> dict[str, tuple[float, float]]:
    """Each member's GPU seconds received against its max-min fair share, while contended.

    O((b + r) log (b + r) + (b + r) * m) for ``b`` backlog intervals, ``r`` runs and ``m``
    members backlogged at once. Several runs may overlap (several workers).

    Args:
        backlog: ``(from, to, member)``: the member held this queued job over ``[from, to)``.
        runs: ``(start, end, member)``: a job of the level held a GPU over ``[start, end)``.

    Returns:
        ``{member: (received, fair)}`` for every member that was ever backlogged while another
        member was: GPU seconds received while contended, and its equal part of the GPU
        seconds that the contending members received together.
    """
    # Kinds at one instant: runs end (0), backlogs end (1), backlogs start (2), runs start (3),
    # so that an interval [a, b) never counts what happens at b.
    points: list[tuple[float, int, str]] = []
    for start, end, member in backlog:
        if end > start:
            points.append((start, 2, member))
            points.append((end, 1, member))
    for start, end, member in runs:
        if end > start:
            points.append((start, 3, member))
            points.append((end, 0, member))
    points.sort()
    queued: dict[str, int] = defaultdict(int)
    running: dict[str, int] = defaultdict(int)
    received: dict[str, float] = defaultdict(float)
    fair: dict[str, float] = defaultdict(float)
    previous = points[0][0] if points else 0.0
    for when, kind, member in points:
        span = when - previous
        if span > 0:
            backlogged = [m for m, n in queued.items() if n > 0]
            if len(backlogged) > 1:
                served = 0.0
                for m in backlogged:
                    got = running.get(m, 0) * span
                    if got:
                        received[m] += got
                        served += got
                part = served / len(backlogged)
                for m in backlogged:
                    fair[m] += part
        previous = when
        if kind == 0:
            running[member] -= 1
        elif kind == 1:
            queued[member] -= 1
        elif kind == 2:
            queued[member] += 1
        else:
            running[member] += 1
    return {m: (received.get(m, 0.0), fair[m]) for m in sorted(fair)}


def inverted_pairs(
    members: Iterable[tuple[str, str, float, float]], slack: float, ratio: float = 0.5
) -> int:
    """How many pairs of members invert demand: the one who asked for less waited longer.

    O(m^2) for ``m`` members (a level has tens to hundreds).

    Args:
        members: ``(member, tier, demand, mean wait)`` per member of one level: its GPU time
            asked for (seconds) and its jobs' mean wait (seconds).
        slack: Mean waits within ``slack`` seconds of each other count as equal.
        ratio: Only pairs where one member asked for at most ``ratio`` times the other's
            demand are compared.

    Returns:
        The number of pairs of the same tier where the member who asked for at most ``ratio``
        times the other's demand waited more than ``slack`` seconds longer on average.
    """
    by_tier: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _, tier, demand, wait in members:
        by_tier[tier].append((demand, wait))
    count = 0
    for rows in by_tier.values():
        for demand_a, wait_a in rows:
            for demand_b, wait_b in rows:
                if demand_a <= ratio * demand_b and wait_a > wait_b + slack:
                    count += 1
    return count
