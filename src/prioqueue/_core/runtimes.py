"""``Runtimes``: the recent runtimes, one owner (private).

The last ``RECENT`` completions (for ``QueueFull.retry_after`` and the forecasts) and the last
``RECENT_PER_KEY`` runtimes per model and per level (for the expected charge of a job without an
estimate). ``grant.finish`` adds one per finished job; a snapshot restores the per-key ones.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from prioqueue._core.config import (
    DEFAULT_EXPECTED_RUNTIME,
    DEFAULT_RETRY_AFTER,
    RECENT,
    RECENT_PER_KEY,
)
from prioqueue.records import Job

__all__: list[str] = []  # private module


class Runtimes:
    """The recent runtimes: overall (with their times and models), per model, per level."""

    __slots__ = ("by_level", "by_model", "recent")

    def __init__(self) -> None:
        self.recent: deque[tuple[float, float, str | None]] = deque(maxlen=RECENT)
        self.by_model: dict[str, deque[float]] = {}
        self.by_level: dict[int, deque[float]] = {}

    def add(self, now: float, runtime: float, model: str | None, level: int) -> None:
        """Remember a job of ``model`` at ``level`` that finished at ``now`` after ``runtime``."""
        self.recent.append((now, runtime, model))
        if model is not None:
            recent = self.by_model.get(model)
            if recent is None:
                recent = self.by_model[model] = deque(maxlen=RECENT_PER_KEY)
            recent.append(runtime)
        by_level = self.by_level.get(level)
        if by_level is None:
            by_level = self.by_level[level] = deque(maxlen=RECENT_PER_KEY)
        by_level.append(runtime)

    def restore(
        self, models: Mapping[str, deque[float]], levels: Mapping[int, deque[float]]
    ) -> None:
        """Take back a snapshot's runtimes per model and per level."""
        self.by_model.update(models)
        self.by_level.update(levels)

    def level_mean(self, level: int) -> float:
        """The mean of the level's recent runtimes, else 60 s."""
        recent = self.by_level.get(level)
        return sum(recent) / len(recent) if recent else DEFAULT_EXPECTED_RUNTIME

    def expected(self, job: Job) -> float:
        """The job's estimate, else the mean of its model's or level's last 8, else 60 s."""
        if job.estimate is not None:
            return job.estimate
        if job.model is not None:
            recent = self.by_model.get(job.model)
            if recent:
                return sum(recent) / len(recent)
        recent = self.by_level.get(job.priority)
        if recent:
            return sum(recent) / len(recent)
        return DEFAULT_EXPECTED_RUNTIME

    def retry_after(self) -> float:
        """``QueueFull.retry_after``: the recent completion interval (at least 1 s)."""
        recent = self.recent
        if len(recent) >= 2:
            span = recent[-1][0] - recent[0][0]
            if span > 0:
                return max(1.0, math.ceil(span / (len(recent) - 1)))
        if recent:
            return max(1.0, math.ceil(recent[-1][1]))
        return DEFAULT_RETRY_AFTER
