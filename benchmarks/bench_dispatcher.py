"""Dispatcher cost per submit + dispatch + complete cycle, at several queue sizes.

For each queue size (10^3 .. 10^6 queued jobs) and member count (10, 1,000) the queue is filled,
then held at that size while each cycle submits one job and dispatches and completes one. The
cost per cycle is printed beside, from the same run and at the same size:

* a bare ``heapq`` push + pop (the floor for any priority queue in Python), and
* a brute-force rescan that finds the best lane by scanning every lane (what the dispatcher's
  heaps avoid), and
* the memory per queued job (tracemalloc, the whole dispatcher divided by the jobs).

Run: ``python benchmarks/bench_dispatcher.py [--max-exp 6] [--cycles 20000]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc

from _harness import heapq_pair, section

from prioqueue.dispatcher import SizeOneDispatcher

LEVELS = (100, 0, -100)
MODELS = ("sdxl", "flux_dev", "h3")
TIERS = ("free", "pro", "max")


def _fill(d: SizeOneDispatcher, n: int, members: int, rng: random.Random, now: float) -> int:
    for i in range(n):
        d.submit(
            f"j{i}",
            member=f"m{rng.randrange(members)}",
            priority=LEVELS[i % 3],
            tier=TIERS[i % 3],
            model=MODELS[rng.randrange(3)],
            now=now,
        )
    return n


def _cycles(
    d: SizeOneDispatcher, start: int, cycles: int, members: int, rng: random.Random
) -> float:
    now = 1.0
    next_id = start
    member_names = [f"m{i}" for i in range(members)]
    t0 = time.perf_counter()
    for _ in range(cycles):
        d.submit(
            f"j{next_id}",
            member=member_names[rng.randrange(members)],
            priority=LEVELS[next_id % 3],
            tier=TIERS[next_id % 3],
            model=MODELS[next_id % 3],
            now=now,
        )
        next_id += 1
        grant = d.dispatch(now)
        assert grant is not None
        now += 1.0
        d.complete(grant.job.id, now=now, runtime=1.0)
    return (time.perf_counter() - t0) / cycles


def _rescan(lanes: int, cycles: int, rng: random.Random) -> float:
    keys = [rng.random() for _ in range(lanes)]
    t0 = time.perf_counter()
    for _ in range(cycles):
        best = max(range(lanes), key=keys.__getitem__)
        keys[best] = rng.random()
    return (time.perf_counter() - t0) / cycles


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-exp", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=20_000)
    args = parser.parse_args()
    section("SizeOneDispatcher: submit + dispatch + complete, queue held at n jobs")
    print(
        f"{'n':>9} {'members':>7} {'lanes':>6} {'cycle µs':>9} {'heapq µs':>9} {'ratio':>6} "
        f"{'rescan µs':>10} {'B/job':>6} {'untracked µs':>13}"
    )
    for exp in range(3, args.max_exp + 1):
        n = 10**exp
        for members in (10, 1_000):
            rng = random.Random(exp * 7919 + members)
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            d = SizeOneDispatcher()
            start = _fill(d, n, members, rng, now=0.0)
            per_job = (tracemalloc.get_traced_memory()[0] - before) / n
            tracemalloc.stop()
            gc.collect()
            gc.disable()
            try:
                cycle = _cycles(d, start, args.cycles, members, rng)
                lanes = sum(1 for lane in d.member_lanes(heads=0, scan=0) if lane.queued)
                plain = SizeOneDispatcher(track_reorders=False)
                _fill(plain, n, members, random.Random(1), now=0.0)
                untracked = _cycles(plain, n, args.cycles, members, rng)
                pair = heapq_pair(n, args.cycles, rng)
                rescan = _rescan(lanes, max(10, args.cycles // max(1, lanes // 100)), rng)
            finally:
                gc.enable()
            del d, plain
            print(
                f"{n:>9} {members:>7} {lanes:>6} {cycle * 1e6:>9.2f} {pair * 1e6:>9.3f} "
                f"{cycle / pair:>5.0f}x {rescan * 1e6:>10.1f} {per_job:>6.0f} "
                f"{untracked * 1e6:>13.2f}"
            )


if __name__ == "__main__":
    main()
