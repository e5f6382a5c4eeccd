"""Helpers of the built-in scenarios: one seeded RNG's jobs and Poisson streams (private)."""

from __future__ import annotations

import random
from typing import Any

from prioqueue.sim.workload import Arrival

__all__: list[str] = []  # private module

_TIERS = ("free", "pro", "max")

Params = dict[str, Any]


class _Gen:
    """Small helpers around one seeded RNG."""

    def __init__(self, rng: random.Random, params: Params) -> None:
        self.rng = rng
        self.cancel_fraction = float(params.get("cancel_fraction", 0.0))
        self.lost_fraction = float(params.get("lost_fraction", 0.0))

    def estimate(self, duration: float) -> float:
        """A caller's estimate: the duration with about 20 % log-normal noise."""
        return round(duration * self.rng.lognormvariate(0.0, 0.2), 3)

    def job(
        self, at: float, member: str, priority: int, tier: str, model: str, duration: float
    ) -> Arrival:
        rng = self.rng
        cancel = None
        if self.cancel_fraction and rng.random() < self.cancel_fraction:
            cancel = round(rng.uniform(5.0, 1800.0), 3)
        hangs = 1 if self.lost_fraction and rng.random() < self.lost_fraction else 0
        duration = round(duration, 3)
        return Arrival(
            arrival=round(at, 3),
            member=member,
            priority=priority,
            tier=tier,
            model=model,
            duration=duration,
            estimate=self.estimate(duration),
            cancel_after=cancel,
            hangs=hangs,
        )

    def poisson(self, per_hour: float, hours: float) -> list[float]:
        """Arrival times of a Poisson stream of ``per_hour`` jobs an hour over ``hours``."""
        times: list[float] = []
        if per_hour <= 0:
            return times
        rate = per_hour / 3600.0
        end = hours * 3600.0
        t = self.rng.expovariate(rate)
        while t < end:
            times.append(t)
            t += self.rng.expovariate(rate)
        return times


def _crowd(members: int) -> list[tuple[str, str]]:
    width = len(str(members))
    return [(f"m{k:0{width}d}", _TIERS[k % 3]) for k in range(1, members + 1)]
