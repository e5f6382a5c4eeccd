"""Simulator throughput: simulated events per second through the real dispatcher.

Run: ``python benchmarks/bench_sim.py [--jobs N]`` (default 200,000 jobs; the target is one
million jobs through the ``prioqueue`` policy in under 60 s, which ``--jobs 1000000`` checks
directly; the default run extrapolates linearly). The ``fifo`` baseline runs the same
workload in the same process, so the ratio shows what the full policy costs over a plain queue.
The default scenario's wall time (every policy, report included) is printed last.
"""

from __future__ import annotations

import argparse
import time

from _harness import section

from prioqueue.sim import Workload, build, build_report, parse_spec, simulate
from prioqueue.sim.policies import DEFAULT_POLICIES

TARGET_JOBS = 1_000_000
TARGET_SECONDS = 60.0


def _film_night(jobs: int) -> Workload:
    """The default scenario with its crowd stream stretched to about ``jobs`` jobs."""
    probe = build("film-night", hours=100.0)
    per_hour = (len(probe.arrivals) - 174) / 100.0
    return build("film-night", hours=max(1.0, (jobs - 174) / per_hour))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200_000)
    args = parser.parse_args()

    section(f"Simulator: film-night stretched to ~{args.jobs:,} jobs")
    began = time.perf_counter()
    workload = _film_night(args.jobs)
    jobs = len(workload.arrivals)
    print(f"workload built: {jobs:,} jobs in {time.perf_counter() - began:.1f} s")
    runs = {}
    for name in ("fifo", "prioqueue"):
        result = simulate(workload, parse_spec(name))
        runs[name] = result
        rate = result.events / result.wall_seconds
        print(
            f"{name:<10} {result.events:>10,} events  {result.wall_seconds:>7.2f} s  "
            f"{rate:>10,.0f} events/s  {1e6 * result.wall_seconds / jobs:>6.1f} us/job"
        )
    fifo, full = runs["fifo"], runs["prioqueue"]
    ratio = full.wall_seconds / fifo.wall_seconds
    print(f"prioqueue / fifo wall time: {ratio:.1f}x")
    projected = full.wall_seconds * TARGET_JOBS / jobs
    verdict = "meets" if projected < TARGET_SECONDS else "MISSES"
    print(
        f"1,000,000 jobs through prioqueue: {projected:.1f} s "
        f"({'measured' if jobs >= TARGET_JOBS else 'projected'}); "
        f"{verdict} the {TARGET_SECONDS:.0f} s target"
    )
    began = time.perf_counter()
    build_report(workload, [fifo, full])
    print(f"report of both runs: {time.perf_counter() - began:.2f} s")

    section("Default scenario (film-night, every policy, report included)")
    began = time.perf_counter()
    default = build()
    results = [simulate(default, parse_spec(name)) for name in DEFAULT_POLICIES]
    build_report(default, results)
    wall = time.perf_counter() - began
    print(f"film-night: {len(default.arrivals)} jobs, {len(results)} policies: {wall:.2f} s")


if __name__ == "__main__":
    main()
