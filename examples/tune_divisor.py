"""Tune the aging divisor: sweep it over several seeds and read the frontier.

The aging divisor (seconds of waiting per point) is the knob that trades interactive latency
against batch starvation. A small divisor lets waiting batch work overtake interactive traffic
sooner: batch waits shrink, interactive waits grow. One seed is noise; this script runs the
simulator's ``overload`` scenario (arrivals at 110 % of capacity for eight hours, the clock
stopped when they stop) on five seeds per divisor, through the real dispatcher, and prints the
median and the spread of the interactive p99 wait and the batch worst wait (waits of jobs still
queued at the end included), then the frontier: the divisors no other divisor beats on both.

The same sweep from the command line::

    prioqueue simulate --sweep divisor=30,60,120,240 --seeds 5

Run it: ``python examples/tune_divisor.py`` (core only; the simulator needs no extra for this).
"""

from __future__ import annotations

from typing import Any

from prioqueue import Scorer, ScoringConfig
from prioqueue.sim import build
from prioqueue.sim.sweep import run_sweep

DIVISORS = ("30", "60", "120", "240")
SEEDS = (1, 2, 3, 4, 5)


def hours(seconds: float | None) -> str:
    """Format seconds as hours for the table."""
    return "-" if seconds is None else f"{seconds / 3600:.1f} h"


def minutes(seconds: float | None) -> str:
    """Format seconds as minutes for the table."""
    return "-" if seconds is None else f"{seconds / 60:.0f} min"


def spread(figure: dict[str, Any], unit: Any) -> str:
    """A median and its (min-max) spread over the seeds."""
    return f"{unit(figure['median'])} ({unit(figure['min'])}-{unit(figure['max'])})"


def main() -> None:
    """Run the sweep and print the trade-off."""
    sweep = run_sweep(
        lambda seed: build("overload", seed=seed), "prioqueue", "divisor", DIVISORS, SEEDS
    )
    print(f"overload, seeds {SEEDS[0]}-{SEEDS[-1]}: median (min-max) over the seeds\n")
    header = (
        f"{'divisor':>7}  {'overtake':>8}  {'interactive p99':>22}  {'batch worst wait':>22}  "
        f"frontier"
    )
    print(header)
    print("-" * len(header))
    medians: dict[str, tuple[float, float]] = {}
    for row in sweep["values"]:
        divisor = float(row["value"])
        overtake = Scorer(ScoringConfig(aging_divisor=divisor)).overtake_horizon(200)
        p99, worst = row["figures"]["interactive_p99"], row["figures"]["batch_worst"]
        medians[row["value"]] = (p99["median"], worst["median"])
        mark = "*" if row["value"] in sweep["frontier"] else ""
        print(
            f"{row['value']:>7}  {hours(overtake):>8}  {spread(p99, minutes):>22}  "
            f"{spread(worst, hours):>22}  {mark}"
        )

    # The trade-off, stated as checks: aging bounds batch waits, at interactive latency's cost.
    fast, slow = medians["30"], medians["240"]
    assert fast[1] < slow[1]
    assert fast[0] > slow[0]
    print(
        f"\nFrom divisor 240 to 30 the median batch worst wait falls from {hours(slow[1])} to "
        f"{hours(fast[1])},\nwhile the median interactive p99 grows from {minutes(slow[0])} to "
        f"{minutes(fast[0])}.\n"
        "overtake: the extra wait after which a batch job outranks any fresh interactive one,\n"
        "(200 + 12) x divisor seconds. frontier (*): no other divisor is better on both."
    )


if __name__ == "__main__":
    main()
