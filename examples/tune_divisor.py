"""Tune the aging divisor: replay one overloaded workload under several divisors.

The aging divisor (seconds of waiting per point) is the one knob that trades interactive
latency against batch starvation. A small divisor lets waiting batch work overtake interactive
traffic sooner: batch waits shrink, interactive waits grow. A large one protects interactive
latency and lets batch work wait longer. This script measures the trade-off instead of guessing
it: it builds the simulator's ``overload`` scenario (arrivals at 130 % of capacity at all three
levels for four hours), runs it through the real dispatcher once per divisor on the same
arrivals, and prints the waits per level next to the overtake horizon each divisor implies.

The same comparison from the command line::

    prioqueue simulate --scenario overload --policy no-aging \\
        --policy prioqueue:divisor=240 --policy prioqueue:divisor=60 --policy prioqueue:divisor=15

Run it: ``python examples/tune_divisor.py`` (core only; the simulator needs no extra for this).
"""

from __future__ import annotations

from typing import Any

from prioqueue import Scorer, ScoringConfig
from prioqueue.sim import build, build_report, parse_spec, simulate

DIVISORS = (240.0, 120.0, 60.0, 30.0, 15.0)
NAMES = {"100": "interactive", "0": "normal", "-100": "batch"}


def minutes(seconds: float | None) -> str:
    """Format seconds as minutes for the table."""
    return "-" if seconds is None else f"{seconds / 60:.0f} min"


def main() -> None:
    """Run the comparison and print the table."""
    workload = build("overload", seed=1)
    labels = ["no-aging", *(f"prioqueue:divisor={d:g}" for d in DIVISORS)]
    results = [simulate(workload, parse_spec(label)) for label in labels]
    report: dict[str, Any] = build_report(workload, results)
    print(
        f"workload: {report['scenario']['name']}, {report['scenario']['jobs']} jobs, "
        f"{report['scenario']['work_seconds'] / 3600:.1f} GPU-hours of work\n"
    )

    columns = (("100", "wait_p95"), ("100", "wait_max"), ("0", "wait_p95"), ("-100", "wait_max"))
    header = f"{'policy':<24} {'horizon':>9}"
    for level, statistic in columns:
        header += f" {NAMES[level] + (' p95' if statistic == 'wait_p95' else ' max'):>16}"
    print(header)
    print("-" * len(header))
    worst: dict[str, dict[str, float]] = {}
    for label in labels:
        policy = report["policies"][label]
        divisor = policy["params"]["aging_divisor"]
        horizon = Scorer(ScoringConfig(aging_divisor=divisor)).overtake_horizon(200)
        row = f"{label:<24} {minutes(horizon) if label != 'no-aging' else 'never':>9}"
        for level, statistic in columns:
            row += f" {minutes(policy['levels'][level][statistic]):>16}"
        print(row)
        worst[label] = {level: policy["levels"][level]["wait_max"] for level in NAMES}

    # The trade-off, stated as checks: aging bounds batch waits, at interactive latency's cost.
    fast, slow = "prioqueue:divisor=15", "prioqueue:divisor=240"
    assert worst[fast]["-100"] < worst[slow]["-100"] < worst["no-aging"]["-100"]
    assert worst[fast]["100"] > worst[slow]["100"]
    print(
        f"\nFrom divisor 240 to 15, the longest batch wait falls from "
        f"{minutes(worst[slow]['-100'])} to {minutes(worst[fast]['-100'])},\n"
        f"while the longest interactive wait grows from {minutes(worst[slow]['100'])} to "
        f"{minutes(worst[fast]['100'])}.\n"
        "horizon: the extra wait after which a batch job outranks any fresh interactive one,\n"
        "(200 + 12) x divisor seconds."
    )


if __name__ == "__main__":
    main()
