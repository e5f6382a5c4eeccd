"""A tiny harness shared by the benchmark scripts.

Every figure is printed beside a baseline measured in the same run, as a ratio, because the
machines that run benchmarks are noisy: absolute numbers move between runs, ratios much less.
"""

from __future__ import annotations

import gc
import heapq
import random
import time
import timeit
from collections.abc import Callable

__all__ = ["heapq_pair", "per_call", "report", "section"]


def per_call(fn: Callable[[], object], *, repeat: int = 5, min_time: float = 0.2) -> float:
    """Return the best per-call time of ``fn`` in seconds (minimum over ``repeat`` rounds).

    The number of calls per round is chosen so that one round lasts about ``min_time``.
    """
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    number = max(1, int(number * min_time / 0.2))
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        best = min(timer.repeat(repeat=repeat, number=number))
    finally:
        if gc_was_enabled:
            gc.enable()
    return best / number


def section(title: str) -> None:
    """Print a section heading."""
    print()
    print(title)
    print("-" * len(title))


def report(name: str, seconds: float, baseline_name: str, baseline_seconds: float) -> None:
    """Print one figure beside its baseline and their ratio."""
    ratio = seconds / baseline_seconds if baseline_seconds > 0 else float("inf")
    print(
        f"{name:<44} {seconds * 1e9:>10.0f} ns/call   "
        f"{baseline_name:<28} {baseline_seconds * 1e9:>8.0f} ns   ratio {ratio:>7.1f}x"
    )


def heapq_pair(n: int, cycles: int, rng: random.Random) -> float:
    """Seconds per ``heappush`` + ``heappop`` pair on a heap of ``n`` tuples: the floor baseline.

    A scheduling cycle cannot beat one push and one pop on a binary heap of the same size, so
    the dispatcher benchmarks print their cycle time as a ratio to this.
    """
    heap = [(rng.random(), i) for i in range(n)]
    heapq.heapify(heap)
    values = [rng.random() for _ in range(cycles)]
    t0 = time.perf_counter()
    for i, value in enumerate(values):
        heapq.heappush(heap, (value, i))
        heapq.heappop(heap)
    return (time.perf_counter() - t0) / cycles
