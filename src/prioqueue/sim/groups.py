"""Groups and chains in the simulator: a film submitted a few shots at a time, and its forecast.

A workload's arrival may carry a ``group`` (a film). When the workload lists the group in
``chains`` with a depth ``k``, the engine feeds its jobs as ``prioqueue.chain.Chain(...,
depth=k)`` does: the jobs of the group, in arrival order, are kept at most ``k`` submitted
(queued or held); each one that leaves (completed, cancelled, or failed after its last lease)
submits the next. A job is never submitted before its own arrival time. A group without a
depth is submitted as it arrives (all at once, for a film).

:class:`ChainFeed` is that producer for every policy (the baselines have no groups); the
tests check it submits exactly what a real ``Chain`` submits. :class:`ForecastLog` records,
for a dispatcher that has ``group_status``, the group's finish forecast at the start (once
the arrivals of that instant are all submitted) and each time another tenth of its jobs is
done: ``group_status(...).forecast_finish``, plus, for a chain, the estimates of the shots not
yet submitted (what ``Chain.forecast_finish`` adds).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from prioqueue.sim.workload import Workload

__all__ = ["ChainFeed", "ForecastLog", "forecast_errors"]


class ChainFeed:
    """Keeps at most ``depth`` jobs of each chained group submitted.

    Args:
        workload: The workload (its ``chains`` and the arrivals' groups).

    Complexity: every call is O(1) plus the jobs it returns.
    """

    def __init__(self, workload: Workload) -> None:
        self._depth = dict(workload.chains)
        self._group = [a.group for a in workload.arrivals]
        self._pending: dict[str, deque[int]] = {g: deque() for g in self._depth}
        self._flight: dict[str, int] = dict.fromkeys(self._depth, 0)

    def chained(self, j: int) -> bool:
        """Whether job ``j`` belongs to a chained group."""
        return self._group[j] in self._depth

    def chained_group(self, group: str) -> bool:
        """Whether ``group`` is fed as a chain (it has a depth)."""
        return group in self._depth

    def pending(self, group: str) -> Sequence[int]:
        """The jobs of ``group`` that arrived but are not submitted yet, in order."""
        return self._pending[group]

    def arrive(self, j: int) -> list[int]:
        """Job ``j`` of a chained group arrived; return the jobs to submit now."""
        group = self._group[j]
        assert group is not None
        self._pending[group].append(j)
        return self._fill(group)

    def left(self, j: int) -> list[int]:
        """Job ``j`` of a chained group left for good; return the jobs to submit now."""
        group = self._group[j]
        assert group is not None
        self._flight[group] -= 1
        return self._fill(group)

    def _fill(self, group: str) -> list[int]:
        out = []
        pending = self._pending[group]
        while pending and self._flight[group] < self._depth[group]:
            out.append(pending.popleft())
            self._flight[group] += 1
        return out


class ForecastLog:
    """The finish forecasts of every group, taken at the start and at each tenth done.

    Args:
        workload: The workload.
        queue: The policy's queue; forecasts are taken only when it has ``group_status``.
        feed: The chain producer (its pending shots are added to a chain's forecast).
    """

    def __init__(self, workload: Workload, queue: Any, feed: ChainFeed) -> None:
        status = getattr(queue, "group_status", None)
        self.status: Callable[..., Any] | None = status
        self._feed = feed
        self._arrivals = workload.arrivals
        sizes: dict[str, int] = {}
        for a in workload.arrivals:
            if a.group is not None:
                sizes[a.group] = sizes.get(a.group, 0) + 1
        self._size = sizes
        self._done = dict.fromkeys(sizes, 0)
        self._next = dict.fromkeys(sizes, 0)
        self._due: list[str] = []
        self.points: dict[str, list[tuple[float, float, float | None]]] = {g: [] for g in sizes}
        """Per group: ``(now, fraction done, forecast finish or None)``."""

    @property
    def active(self) -> bool:
        """Whether forecasts are taken (the queue has groups and the workload has some)."""
        return self.status is not None and bool(self._size)

    def started(self, group: str) -> None:
        """A job of the group was submitted: the first time, a forecast is due at ``flush``."""
        if self._next[group] == 0 and group not in self._due:
            self._due.append(group)

    def flush(self, now: float) -> None:
        """Take the start forecasts that are due (after all the instant's arrivals)."""
        for group in self._due:
            self._take(group, now)
        self._due.clear()

    def finished(self, group: str, now: float) -> None:
        """A job of the group left: take a forecast when another tenth is done."""
        self._done[group] += 1
        if self._done[group] < self._size[group] and (
            self._done[group] * 10 >= self._next[group] * self._size[group]
        ):
            self._take(group, now)

    def _take(self, group: str, now: float) -> None:
        assert self.status is not None
        self._next[group] += 1
        fraction = self._done[group] / self._size[group]
        status = self.status(group, now=now)
        forecast = status.forecast_finish
        if forecast is not None and self._feed.chained_group(group):
            for j in self._feed.pending(group):
                estimate = self._arrivals[j].estimate
                if estimate is None:
                    estimate = status.mean_runtime
                if estimate is None:
                    forecast = None
                    break
                forecast += estimate
        self.points[group].append((now, fraction, forecast))


def forecast_errors(
    points: Sequence[tuple[float, float, float | None]], actual: float
) -> dict[str, Any]:
    """Summarise a group's forecasts against its actual finish.

    Args:
        points: ``(now, fraction done, forecast)`` as :class:`ForecastLog` records them.
        actual: When the group's last job left.

    Returns:
        ``{"points": [{"at", "done", "forecast", "error", "relative"}], "mean_abs_error",
        "max_abs_error", "mean_relative"}``: ``error`` is forecast minus actual (negative:
        early), ``relative`` is ``|error|`` over the time that was left.
    """
    rows = []
    errors: list[float] = []
    relative: list[float] = []
    for at, done, forecast in points:
        error = None if forecast is None else forecast - actual
        left = actual - at
        rel = None if error is None or left <= 0 else abs(error) / left
        rows.append(
            {
                "at": round(at, 3),
                "done": round(done, 3),
                "forecast": None if forecast is None else round(forecast, 3),
                "error": None if error is None else round(error, 3),
                "relative": None if rel is None else round(rel, 4),
            }
        )
        if error is not None:
            errors.append(abs(error))
        if rel is not None:
            relative.append(rel)
    return {
        "points": rows,
        "mean_abs_error": round(math.fsum(errors) / len(errors), 3) if errors else None,
        "max_abs_error": round(max(errors), 3) if errors else None,
        "mean_relative": round(math.fsum(relative) / len(relative), 4) if relative else None,
    }
