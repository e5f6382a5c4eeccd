"""Measure what FleetDispatcher's ``warm_hold`` does to swaps and waits on a 4-GPU fleet.

Runs the ``fleet-night`` scenario (4 workers, two films, an interactive crowd and a long tail
of rarely used models) over five seeds for each ``warm_hold`` and prints medians (min-max over
the seeds). Two ways of pulling work are measured:

* ``poll 0``: a free worker asks at once whenever anything changes (a gateway that pops for
  its free upstreams itself);
* ``poll 10``: remote workers that ask for work every 10 s when idle (and at once when a job
  ends), so a warm worker may be free but not asking yet.

and one or two slots per worker (two: run one, prefetch one). docs/simulator.md quotes this
output ("Several workers"); the gateway's default ``warm_hold`` comes from it.

Run: ``python examples/warm_hold.py`` (about 15 s).
"""

from __future__ import annotations

import statistics

from prioqueue.sim import build, build_report, parse_spec, simulate
from prioqueue.sim.workers import WorkerSpec

HOLDS = (0, 15, 30, 120)
SEEDS = range(1, 6)


def _cell(values: list[float], digits: int = 0, unit: str = "") -> str:
    mid = statistics.median(values)
    return f"{mid:.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def measure(poll: float, slots: int) -> list[tuple[str, ...]]:
    """One row per warm_hold: swaps, interactive p50 and p99, fleet utilisation."""
    rows: list[tuple[str, ...]] = []
    fleet = [WorkerSpec(f"gpu-{k}", slots=slots) for k in range(4)]
    workloads = [build("fleet-night", seed=seed) for seed in SEEDS]
    for hold in HOLDS:
        spec = parse_spec(f"prioqueue:warm_hold={hold}")
        swaps, p50, p99, busy = [], [], [], []
        for workload in workloads:
            result = simulate(workload, spec, workers=fleet, poll=poll)
            section = build_report(workload, [result])["policies"][spec.label]
            top = section["levels"]["100"]
            swaps.append(float(result.swaps))
            p50.append(top["wait_p50"])
            p99.append(top["wait_p99"])
            workers = section["workers"].values()
            busy.append(100 * statistics.fmean(w["utilisation"] for w in workers))
        rows.append(
            (
                f"{poll:g}",
                str(slots),
                str(hold),
                _cell(swaps),
                _cell(p50, 1, " s"),
                _cell(p99, 0, " s"),
                _cell(busy, 1, " %"),
            )
        )
    return rows


def main() -> None:
    """Print the table."""
    jobs = statistics.median(len(build("fleet-night", seed=s).arrivals) for s in SEEDS)
    print(f"fleet-night on 4 workers, prioqueue, seeds 1-5 (about {jobs:.0f} jobs each):")
    print("median (min-max) over the seeds\n")
    headers = ("poll", "slots", "warm_hold", "swaps", "interactive p50", "interactive p99", "busy")
    rows = [row for poll in (0.0, 10.0) for slots in (1, 2) for row in measure(poll, slots)]
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for k, row in enumerate(rows):
        if k and k % len(HOLDS) == 0:
            print()
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    print("\nbusy: the workers' mean utilisation (cold loads included)")


if __name__ == "__main__":
    main()
