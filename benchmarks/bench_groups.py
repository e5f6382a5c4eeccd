"""What groups and chains cost: each figure beside the same work without them, in one run.

* A submit + dispatch + complete cycle with every job in one of 100 groups, beside the same
  cycle without groups (the hooks are one dictionary lookup per state change).
* A film's shot through a ``Chain`` (``completed`` then the chain's own submit), beside the
  producer loop written by hand (``submit`` of the next shot).
* ``group_status`` (counts plus the forecast's dry run) beside ``forecast()`` on the same queue.

Run: ``python benchmarks/bench_groups.py [--queued 10000] [--cycles 10000]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from _harness import per_call, report, section

from prioqueue.chain import Chain
from prioqueue.dispatcher import SizeOneDispatcher

LEVELS = (100, 0, -100)


def _filled(n: int, *, groups: bool, seed: int = 1) -> SizeOneDispatcher:
    rng = random.Random(seed)
    d = SizeOneDispatcher()
    for i in range(n):
        d.submit(
            f"j{i}",
            member=f"m{rng.randrange(100)}",
            priority=LEVELS[i % 3],
            estimate=30.0,
            group=f"g{i % 100}" if groups else None,
            now=0.0,
        )
    return d


def _cycles(d: SizeOneDispatcher, start: int, cycles: int, *, groups: bool) -> float:
    now = 1.0
    t0 = time.perf_counter()
    for i in range(start, start + cycles):
        d.submit(
            f"j{i}",
            member=f"m{i % 100}",
            priority=LEVELS[i % 3],
            group=f"g{i % 100}" if groups else None,
            now=now,
        )
        grant = d.dispatch(now)
        assert grant is not None
        now += 1.0
        d.complete(grant.job.id, now=now, runtime=1.0)
    return (time.perf_counter() - t0) / cycles


def _film(cycles: int, *, chain: bool) -> float:
    d = SizeOneDispatcher()
    specs = [{"job_id": f"s{i}", "member": "dora", "priority": "batch"} for i in range(cycles)]
    now = 0.0
    t0 = time.perf_counter()
    if chain:
        film = Chain(d, specs, group="film")
        film.start(now=now)
        for spec in specs:
            d.dispatch(now)
            now += 1.0
            d.complete(spec["job_id"], now=now, runtime=1.0)
            film.completed(spec["job_id"], now=now)
    else:
        d.submit("s0", member="dora", priority="batch", group="film", now=now)
        for i in range(cycles):
            d.dispatch(now)
            now += 1.0
            d.complete(f"s{i}", now=now, runtime=1.0)
            if i + 1 < cycles:
                d.submit(f"s{i + 1}", member="dora", priority="batch", group="film", now=now)
    return (time.perf_counter() - t0) / cycles


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=10_000)
    args = parser.parse_args()

    section(f"submit + dispatch + complete, {args.queued} jobs queued, 100 members")
    gc.disable()
    try:
        # Alternate the two sides and keep each one's best of three: the machine is shared.
        grouped = plain = chained = by_hand = float("inf")
        for _ in range(3):
            d = _filled(args.queued, groups=True)
            grouped = min(grouped, _cycles(d, args.queued, args.cycles, groups=True))
            d = _filled(args.queued, groups=False)
            plain = min(plain, _cycles(d, args.queued, args.cycles, groups=False))
            chained = min(chained, _film(args.cycles, chain=True))
            by_hand = min(by_hand, _film(args.cycles, chain=False))
        report("cycle, every job in one of 100 groups", grouped, "cycle without groups", plain)

        section("a film of one-at-a-time shots")
        report("shot through a Chain (depth 1)", chained, "hand-written producer loop", by_hand)
    finally:
        gc.enable()

    section(f"diagnostics on {min(args.queued, 2_000)} queued jobs")
    d = _filled(min(args.queued, 2_000), groups=True)
    status = per_call(lambda: d.group_status("g7", now=1.0), repeat=3, min_time=0.1)
    forecast = per_call(lambda: d.forecast(now=1.0), repeat=3, min_time=0.1)
    report("group_status (counts + forecast)", status, "forecast()", forecast)


if __name__ == "__main__":
    main()
