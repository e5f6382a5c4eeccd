"""Submitting a workload's arrivals to a policy, and recording the jobs that leave.

The engine (:mod:`prioqueue.sim.engine`) owns the clock; the :class:`Feeder` owns what the
workload says about each job: when it arrives, which chain holds it back, which group's
finish forecast it moves, and when a caller cancels it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import attrs

from prioqueue.clock import perf_counter
from prioqueue.errors import QueueFull
from prioqueue.sim.groups import ChainFeed, ForecastLog
from prioqueue.sim.queues import reorder_counts
from prioqueue.sim.results import JobState
from prioqueue.sim.workload import Workload

__all__ = ["FeedTotals", "Feeder"]


@attrs.frozen
class FeedTotals:
    """What the feeder reports of a run at its end (fields of :class:`RunResult`)."""

    makespan: float
    horizon: float | None
    submitted: list[float]
    forecasts: dict[str, list[tuple[float, float, float | None]]]
    events: int
    reorders: dict[int, dict[str, int]]
    wall_seconds: float


class Feeder:
    """Submits the arrivals to a policy and records the jobs that leave.

    Args:
        workload: The workload (its arrivals, groups and chains).
        queue: The policy's queue (a :class:`~prioqueue.sim.queues.SimQueue`).
        status: Each job's status, set to ``JobState.QUEUED`` on submission.
        submitted: Each job's submission time, set on submission.
        end: Each job's leaving time, set by :meth:`left`.
        cancels: The engine's heap of ``(cancel time, job)``; a submission pushes onto it.
        began: ``prioqueue.clock.perf_counter()`` when the run began (for its wall time).
        progress: The run's progress callback, told the final count in :meth:`close`.
        wakes: The engine's heap of warm-hold expiries, or None (no warm hold).
        hold: Warm hold seconds: when ``hold > 0``, submitting a job with a model pushes
            its submission time plus ``hold`` onto ``wakes``.
        policy: The object behind ``queue`` that may have ``group_status`` and ``stats``
            (the dispatcher; default ``queue`` itself).

    Attributes:
        events: The calls into the policy made here (its submissions).
        finished: The jobs that have left for good.
        forecasts: The group forecast log.
        submitted: Each job's submission time (the list given).

    Complexity: every call is O(log n) plus the chain's jobs it submits.
    """

    __slots__ = (
        "_arrivals",
        "_began",
        "_cancels",
        "_chained",
        "_end",
        "_feed",
        "_grouped",
        "_hold",
        "_policy",
        "_progress",
        "_queue",
        "_status",
        "_wakes",
        "events",
        "finished",
        "forecasts",
        "submitted",
    )

    def __init__(
        self,
        workload: Workload,
        queue: Any,
        status: list[int],
        submitted: list[float],
        end: list[float],
        cancels: list[tuple[float, int]],
        *,
        began: float,
        progress: Callable[[int], None] | None = None,
        wakes: list[float] | None = None,
        hold: float = 0.0,
        policy: object | None = None,
    ) -> None:
        self._began = began
        self._progress = progress
        self._arrivals = workload.arrivals
        self._queue = queue
        self._policy = queue if policy is None else policy
        self._status = status
        self.submitted = submitted
        self._end = end
        self._cancels = cancels
        self._wakes: list[float] = [] if wakes is None else wakes
        self._hold = hold
        self._feed = ChainFeed(workload)
        self.forecasts = ForecastLog(workload, self._policy, self._feed)
        self._grouped = self.forecasts.active
        self._chained = bool(workload.chains)
        self.events = 0
        self.finished = 0

    def arrive(self, j: int, t: float) -> None:
        """Job ``j`` arrived at ``t``: submit it, or what its chain lets through."""
        if self._chained and self._feed.chained(j):
            for k in self._feed.arrive(j):
                self.submit(k, t)
        else:
            self.submit(j, t)

    def arrivals_until(self, i: int, now: float) -> int:
        """Submit the arrivals from index ``i`` on that are due by ``now``; log forecasts.

        Returns:
            The index of the first arrival still to come.
        """
        arrivals = self._arrivals
        n = len(arrivals)
        while i < n and arrivals[i].arrival <= now:
            self.arrive(i, now)
            i += 1
        if self._grouped:
            self.forecasts.flush(now)
        return i

    def submit(self, j: int, t: float) -> None:
        """Submit job ``j`` to the policy at ``t``."""
        a = self._arrivals[j]
        grouped = self._grouped
        extra = {"group": a.group} if grouped and a.group is not None else {}
        try:
            self._queue.submit(
                str(j),
                member=a.member,
                priority=a.priority,
                tier=a.tier,
                model=a.model,
                estimate=a.estimate,
                now=t,
                **extra,
            )
        except QueueFull:  # a level's budget refused it (only with PolicyParams.budgets)
            self.events += 1
            self._status[j] = JobState.REFUSED
            self.submitted[j] = t
            self.left(j, t, forecast=False)
            return
        self.events += 1
        self._status[j] = JobState.QUEUED
        self.submitted[j] = t
        if a.cancel_after is not None:
            heapq.heappush(self._cancels, (t + a.cancel_after, j))
        if self._hold > 0 and a.model is not None:
            heapq.heappush(self._wakes, t + self._hold)
        if grouped and a.group is not None:
            self.forecasts.started(a.group)

    def left(self, j: int, t: float, *, forecast: bool = True) -> None:
        """Job ``j`` left for good at ``t``: count it, feed its chain, log its group.

        ``forecast=False`` (a refused job, never queued) skips the group's forecast log.
        """
        self._end[j] = t
        self.finished += 1
        group = self._arrivals[j].group
        if group is None:
            return
        if self._chained and self._feed.chained(j):
            for k in self._feed.left(j):
                self.submit(k, t)
        if self._grouped and forecast:
            self.forecasts.finished(group, t)

    def close(self, *, now: float, events: int, horizon: float | None) -> FeedTotals:
        """What every run reports at the end of a run: clock, counts, forecasts. O(n).

        Args:
            now: The engine's clock when the loop stopped.
            events: The policy calls the engine made itself (the feeder's are added).
            horizon: The horizon when the run stopped there with work left, else None.
        """
        makespan = now
        if horizon is not None:
            makespan = max((e for e in self._end if not math.isnan(e)), default=0.0)
        totals = FeedTotals(
            makespan=makespan,
            horizon=horizon,
            submitted=self.submitted,
            forecasts=self.forecasts.points if self._grouped else {},
            events=events + self.events,
            reorders=reorder_counts(self._policy, now),
            wall_seconds=perf_counter() - self._began,
        )
        if self._progress is not None:
            self._progress(self.finished)
        return totals
