"""What a Chain's depth does to a film night, and how good the film's finish forecast is.

Part 1 runs ``film-night`` (one GPU, a 174-shot film against an interactive crowd) with the
film submitted all at once (``film_depth=0``) and as a ``Chain`` keeping one or two shots
submitted (``film_depth=1``, ``2``), under ``fifo``, ``strict`` and ``prioqueue``, over three
seeds, and prints medians of the interactive waits, the normal-level p99, the film's finish
and the swaps.

Part 2 measures the error of ``group_status(...).forecast_finish`` (for a chain, plus the
estimates of the shots not yet submitted, as ``Chain.forecast_finish`` does): the simulator
takes a forecast at the start and each time another tenth of the film is done, and compares
each with the actual finish. With the crowd, and with the film alone (no other arrivals: the
only error left is the estimates' noise, about 20 % per shot).

Part 3 repeats both on ``fleet-night`` (4 workers, two 80-shot films), where the depth is
also how many workers a film can use at once.

docs/simulator.md quotes this output.
Run: ``python examples/film_depth.py`` (a few seconds).
"""

from __future__ import annotations

import statistics
from typing import Any

from prioqueue.sim import build, build_report, parse_spec, simulate

SEEDS = (1, 2, 3)
DEPTHS = (0, 1, 2)


def _run(policy: str, seed: int, **params: Any) -> dict[str, Any]:
    workload = build("film-night", seed=seed, **params)
    result = simulate(workload, parse_spec(policy))
    section: dict[str, Any] = build_report(workload, [result])["policies"][policy]
    return section


def _median(values: list[float]) -> float:
    return statistics.median(values)


def depth_table() -> None:
    """Part 1: waits and the film's finish by depth and policy."""
    print("film-night, one GPU, seeds 1-3: medians over the seeds\n")
    headers = ("depth", "policy", "inter. p50", "inter. p99", "normal p99", "film done", "swaps")
    rows: list[tuple[str, ...]] = []
    for depth in DEPTHS:
        for policy in ("fifo", "strict", "prioqueue"):
            runs = [_run(policy, seed, film_depth=depth) for seed in SEEDS]
            rows.append(
                (
                    "all" if depth == 0 else str(depth),
                    policy,
                    f"{_median([r['levels']['100']['wait_p50'] for r in runs]):.0f} s",
                    f"{_median([r['levels']['100']['wait_p99'] for r in runs]):.0f} s",
                    f"{_median([r['levels']['0']['wait_p99'] for r in runs]):.0f} s",
                    f"{_median([r['groups']['film']['finish'] for r in runs]) / 3600:.2f} h",
                    f"{_median([float(r['swaps']) for r in runs]):.0f}",
                )
            )
    _print(headers, rows)


def forecast_table() -> None:
    """Part 2: the forecast's error against the actual finish (prioqueue)."""
    print("\nfilm finish forecast under prioqueue, seeds 1-3 (error = forecast - actual)\n")
    headers = ("workload", "depth", "mean |error|", "max |error|", "|error| / time left")
    rows: list[tuple[str, ...]] = []
    cases: tuple[tuple[str, dict[str, Any]], ...] = (
        ("with the crowd", {}),
        ("film alone", {"members": 0}),
    )
    for name, params in cases:
        for depth in (0, 1):
            runs = [_run("prioqueue", seed, film_depth=depth, **params) for seed in SEEDS]
            forecasts = [r["groups"]["film"]["forecast"] for r in runs]
            rows.append(
                (
                    name,
                    "all" if depth == 0 else str(depth),
                    f"{_median([f['mean_abs_error'] for f in forecasts]) / 60:.0f} min",
                    f"{_median([f['max_abs_error'] for f in forecasts]) / 60:.0f} min",
                    f"{100 * _median([f['mean_relative'] for f in forecasts]):.1f} %",
                )
            )
    _print(headers, rows)
    points = _run("prioqueue", 1, film_depth=1)["groups"]["film"]["forecast"]["points"]
    print("\nseed 1, depth 1, with the crowd: the forecasts one by one")
    for point in points:
        print(
            f"  at {point['at'] / 3600:5.2f} h ({100 * point['done']:3.0f} % done): "
            f"finish {point['forecast'] / 3600:5.2f} h, error {point['error'] / 60:+5.0f} min"
        )


def _print(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def fleet_table() -> None:
    """Part 3: the same on a fleet (``fleet-night``: 4 workers, two films)."""
    print("\nfleet-night, 4 workers, prioqueue:warm_hold=15, seeds 1-3: medians over the seeds\n")
    headers = ("depth", "inter. p99", "normal p99", "films done", "|error| / time left")
    rows: list[tuple[str, ...]] = []
    spec = parse_spec("prioqueue:warm_hold=15")
    for depth in DEPTHS:
        p99, normal, done, error = [], [], [], []
        for seed in SEEDS:
            workload = build("fleet-night", seed=seed, film_depth=depth)
            section = build_report(workload, [simulate(workload, spec)])["policies"][spec.label]
            p99.append(section["levels"]["100"]["wait_p99"])
            normal.append(section["levels"]["0"]["wait_p99"])
            films = section["groups"].values()
            done.append(max(film["finish"] for film in films))
            error.append(statistics.fmean(f["forecast"]["mean_relative"] for f in films))
        rows.append(
            (
                "all" if depth == 0 else str(depth),
                f"{_median(p99):.0f} s",
                f"{_median(normal):.0f} s",
                f"{_median(done) / 3600:.2f} h",
                f"{100 * _median(error):.1f} %",
            )
        )
    _print(headers, rows)


if __name__ == "__main__":
    depth_table()
    forecast_table()
    fleet_table()
