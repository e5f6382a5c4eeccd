"""Simulator throughput: simulated events per second through the real dispatcher.

Run: ``python benchmarks/bench_sim.py [--jobs N]`` (default 200,000 jobs; the target is one
million jobs through the ``prioqueue`` policy in under 60 s, which ``--jobs 1000000`` checks
directly; the default run extrapolates linearly). The ``fifo`` baseline runs the same
workload in the same process, so the ratio shows what the full policy costs over a plain queue.

The fleet section runs ``fleet-night`` stretched to ``--fleet-jobs`` jobs (default 50,000) on
its 4 workers: the ``FleetDispatcher`` (``prioqueue``) and the ``warm-first`` baseline beside
the global-FIFO pull baseline on the same arrivals. The default scenario's wall time (its
default policies, report included) is printed last.
"""

from __future__ import annotations

import argparse
import time

from _harness import section

from prioqueue.sim import Workload, build, build_report, parse_spec, simulate
from prioqueue.sim.engine import RunResult
from prioqueue.sim.policies import DEFAULT_POLICIES

TARGET_JOBS = 1_000_000
TARGET_SECONDS = 60.0


def _film_night(jobs: int) -> Workload:
    """The default scenario with its crowd stream stretched to about ``jobs`` jobs."""
    probe = build("film-night", hours=100.0)
    per_hour = (len(probe.arrivals) - 174) / 100.0
    return build("film-night", hours=max(1.0, (jobs - 174) / per_hour))


def _fleet_night(jobs: int) -> Workload:
    """``fleet-night`` with its crowd and tail stretched to about ``jobs`` jobs."""
    probe = build("fleet-night", hours=100.0, shots=0)
    per_hour = len(probe.arrivals) / 100.0
    films = 2 * int(build("fleet-night", hours=0.0).params["shots"])
    return build("fleet-night", hours=max(1.0, (jobs - films) / per_hour))


def _line(name: str, result: RunResult, jobs: int) -> None:
    rate = result.events / result.wall_seconds
    print(
        f"{name:<10} {result.events:>10,} events  {result.wall_seconds:>7.2f} s  "
        f"{rate:>10,.0f} events/s  {1e6 * result.wall_seconds / jobs:>6.1f} us/job"
    )


def fleet(jobs: int) -> None:
    """The fleet engine: FleetDispatcher and warm-first beside the global FIFO pull."""
    section(f"Fleet: fleet-night on 4 workers, stretched to ~{jobs:,} jobs")
    workload = _fleet_night(jobs)
    count = len(workload.arrivals)
    runs = {name: simulate(workload, parse_spec(name)) for name in ("fifo", "warm-first")}
    runs["prioqueue"] = simulate(workload, parse_spec("prioqueue:warm_hold=15"))
    for name, result in runs.items():
        _line(name, result, count)
    base = runs["fifo"].wall_seconds
    for name in ("warm-first", "prioqueue"):
        print(f"{name} / fifo pull wall time: {runs[name].wall_seconds / base:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--fleet-jobs", type=int, default=50_000)
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

    fleet(args.fleet_jobs)

    section(f"Default scenario (film-night; {', '.join(DEFAULT_POLICIES)}; report included)")
    began = time.perf_counter()
    default = build()
    results = [simulate(default, parse_spec(name)) for name in DEFAULT_POLICIES]
    build_report(default, results)
    wall = time.perf_counter() - began
    print(f"film-night: {len(default.arrivals)} jobs, {len(results)} policies: {wall:.2f} s")


if __name__ == "__main__":
    main()
