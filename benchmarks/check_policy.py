"""Check the policy's promises (issue 17, "Must show") over the simulator's matrix.

For every built-in scenario (on one GPU and with 4 workers) and both Azure traces (one GPU),
seeds 1..5, at the defaults, it runs ``strict`` and ``prioqueue`` (and, for the table, ``fifo``
and ``warm-first``) and checks, against strict on the same arrivals:

* interactive p99 wait <= strict's + the longest job runtime of the workload (its warm runtime
  plus its model's cold load: the one-job limit of non-preemption);
* normal p99 wait <= strict's + that runtime, wherever strict runs every normal job;
* no interactive or normal job starved (as the report counts it), no more starved batch jobs
  than strict (fewer when strict starves any), and the oldest job still queued at the horizon
  younger than strict's oldest (when strict leaves one);
* the worst service gap within its bound at every level.

Run: ``python benchmarks/check_policy.py [--seeds 5] [--jobs 2] [--policy SPEC]
[--prototype NAME[:key=value,...]] [--markdown FILE]``; the exit status is 1 when a check
fails. ``--prototype`` patches in a rule measured and not taken (``benchmarks/prototypes``).
It prints the pass count per family (scenario, ``/4`` on 4 workers; ``azure`` for the
traces) and per seed range, the tuning seeds 1-5 and the validation seeds 6 and up apart.
Slow (minutes): the test suite runs one cell of it (``tests/sim/test_policy_matrix.py``,
marked slow).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import prototypes

from prioqueue.sim import SCENARIOS, build, build_report, parse_spec, read_trace, simulate
from prioqueue.sim.engine import QUEUED, RunResult
from prioqueue.sim.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
TRACES = ("azure-llm-2023-conv.csv", "azure-llm-2023-code.csv")
TABLE_POLICIES = ("fifo", "strict", "warm-first")
#: The scenarios of the issue-17 matrix (``bursty``, added by issue 26, is in check_wide.py).
MATRIX = ("film-night", "two-films", "swap-storm", "overload", "fleet-night")
LEVEL_NAMES = {"100": "interactive", "0": "normal", "-100": "batch"}


def trace_dir() -> Path:
    """The shared traces (``../shared/traces`` beside the worktree, else ``shared/traces``)."""
    for candidate in (ROOT.parent / "shared" / "traces", ROOT / "shared" / "traces"):
        if candidate.is_dir():
            return candidate
    return ROOT.parent / "shared" / "traces"


def workload(source: str, seed: int) -> Workload:
    """A scenario by name, or a trace file name under :func:`trace_dir`."""
    if source in SCENARIOS:
        return build(source, seed=seed)
    return read_trace(trace_dir() / source, seed=seed)


def longest_runtime(load: Workload) -> float:
    """The longest time one job can hold a GPU: warm runtime plus its model's cold load."""
    return max(
        (a.duration + load.load_time(a.model) for a in load.arrivals),
        default=0.0,
    )


def run_cell(
    source: str, seed: int, workers: int | None, policy: str, table: bool
) -> dict[str, Any]:
    """Run one cell (workload, fleet, seed) and return its figures and verdicts."""
    load = workload(source, seed)
    labels = ["strict", policy, *([p for p in TABLE_POLICIES if p != "strict"] if table else [])]
    specs = [parse_spec(label) for label in labels]
    results = [simulate(load, spec, horizon=load.horizon, workers=workers) for spec in specs]
    report = build_report(load, results)
    pols = report["policies"]
    oldest = {label: oldest_queued(result) for label, result in zip(labels, results, strict=True)}
    return {
        "source": source,
        "seed": seed,
        "workers": workers or 1,
        "longest": longest_runtime(load),
        "figures": {label: figures(pols[label], oldest[label]) for label in labels},
        "policy": policy,
    }


def oldest_queued(result: RunResult) -> float | None:
    """How long the oldest job still queued when the clock stopped had waited (None: none)."""
    clock = result.clock_end
    arrivals = result.workload.arrivals
    submitted = result.submitted
    waits = [
        clock - (submitted[i] if submitted else arrivals[i].arrival)
        for i, status in enumerate(result.status)
        if status == QUEUED
    ]
    return max(waits, default=None)


def figures(section: dict[str, Any], oldest: float | None) -> dict[str, Any]:
    """The figures the checks read from one policy's report section."""
    levels = section["levels"]
    out: dict[str, Any] = {"levels": {}}
    for level, row in levels.items():
        out["levels"][level] = {
            "p99": row["wait_p99"],
            "unfinished": row["unfinished"],
            "starved": row["starved"],
            "gap": row["service_gap"],
            "bound": row["gap_bound"],
            "max": row["wait_max"],
        }
    out["oldest_queued"] = oldest
    out["swaps"] = section.get("gpu", {}).get("swaps", section.get("swaps"))
    return out


def verdicts(cell: dict[str, Any]) -> list[str]:
    """The failed checks of one cell (empty: all passed)."""
    failed = []
    strict = cell["figures"]["strict"]
    mine = cell["figures"][cell["policy"]]
    slack = cell["longest"] + 1e-6
    for level, name in (("100", "interactive"), ("0", "normal")):
        ours, theirs = mine["levels"].get(level), strict["levels"].get(level)
        if ours is None or theirs is None:
            continue
        applies = level == "100" or theirs["unfinished"] == 0
        if applies and (ours["p99"] or 0.0) > (theirs["p99"] or 0.0) + slack:
            failed.append(
                f"{name} p99 {ours['p99']:.0f}s > strict {theirs['p99']:.0f}s + {slack:.0f}s"
            )
        if ours["starved"]:
            failed.append(f"{ours['starved']} {name} jobs starved")
    batch_ours = mine["levels"].get("-100", {}).get("starved", 0)
    batch_strict = strict["levels"].get("-100", {}).get("starved", 0)
    if batch_ours > batch_strict or (batch_strict and batch_ours >= batch_strict):
        failed.append(f"{batch_ours} batch jobs starved, strict {batch_strict}")
    theirs, ours = strict["oldest_queued"], mine["oldest_queued"]
    if theirs is not None and ours is not None and ours >= theirs:
        failed.append(f"oldest queued {ours:.0f}s >= strict's {theirs:.0f}s")
    for level, row in mine["levels"].items():
        if row["gap"] is not None and row["bound"] is not None and row["gap"] > row["bound"] + 1e-6:
            failed.append(f"level {level} gap {row['gap']:.0f}s > bound {row['bound']:.0f}s")
    return failed


def cells(seeds: int) -> list[tuple[str, int, int | None]]:
    """Every (source, seed, workers) of the matrix."""
    out: list[tuple[str, int, int | None]] = []
    for seed in range(1, seeds + 1):
        for name in MATRIX:
            out.append((name, seed, None if name != "fleet-night" else 4))
            if name != "fleet-night":
                out.append((name, seed, 4))
        for trace in TRACES:
            out.append((trace, seed, None))
    return out


#: The seeds any constant was chosen on (issue 26: tune on 1-5, validate on 6 and up).
TUNING_SEEDS = range(1, 6)


def family(cell: dict[str, Any]) -> str:
    """A cell's family: its scenario, ``azure`` for a trace; ``/4`` on 4 workers."""
    source = "azure" if cell["source"].endswith(".csv") else cell["source"]
    return f"{source}/{cell['workers']}" if cell["workers"] > 1 else source


def tally(results: Sequence[dict[str, Any]]) -> list[str]:
    """The pass count per family and per seed range (tuning 1-5, validation 6+ apart)."""
    counts: dict[tuple[str, str], list[int]] = {}
    for cell in results:
        where = "tuning" if cell["seed"] in TUNING_SEEDS else "validation"
        row = counts.setdefault((family(cell), where), [0, 0])
        row[0] += not verdicts(cell)
        row[1] += 1
    return [
        f"{name:<20} {where:<10} {passed}/{total} cells pass"
        for (name, where), (passed, total) in sorted(counts.items())
    ]


def fmt_seconds(value: float | None) -> str:
    """Seconds as the report prints them: '-', '42s', '3.5m' or '1.2h'."""
    if value is None:
        return "-"
    if value >= 3600:
        return f"{value / 3600:.1f}h"
    if value >= 60:
        return f"{value / 60:.1f}m"
    return f"{value:.0f}s"


def _p99(levels: dict[str, Any], level: str) -> str:
    return fmt_seconds(levels.get(level, {}).get("p99"))


def markdown(results: Sequence[dict[str, Any]], policy: str) -> str:
    """The seed-1 table for docs/simulator.md: figures per scenario and policy."""
    lines = [
        "| workload | GPUs | policy | interactive p99 | normal p99 | starved (i/n/b) | "
        "oldest queued | worst gap / bound |",
        "|---|---:|---|---:|---:|---|---:|---|",
    ]
    for cell in results:
        if cell["seed"] != 1:
            continue
        for label in (*TABLE_POLICIES, policy):
            fig = cell["figures"].get(label)
            if fig is None:
                continue
            lv = fig["levels"]
            starved = "/".join(str(lv.get(k, {}).get("starved", 0)) for k in ("100", "0", "-100"))
            worst = max(
                (r for r in lv.values() if r["gap"] is not None and r["bound"]),
                key=lambda r: r["gap"] / r["bound"],
                default=None,
            )
            gap = (
                "-"
                if worst is None
                else f"{fmt_seconds(worst['gap'])} / {fmt_seconds(worst['bound'])}"
            )
            lines.append(
                f"| {cell['source']} | {cell['workers']} | {label} | "
                f"{fmt_seconds(lv.get('100', {}).get('p99'))} | "
                f"{fmt_seconds(lv.get('0', {}).get('p99'))} | "
                f"{starved} | {fmt_seconds(fig['oldest_queued'])} | {gap} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--policy", default="prioqueue")
    parser.add_argument("--only", help="run only sources whose name contains this")
    parser.add_argument("--markdown", help="write the seed-1 table to this file")
    prototypes.add_option(parser)

    args = parser.parse_args()
    prototypes.install_option(args)
    todo = [c for c in cells(args.seeds) if args.only is None or args.only in c[0]]
    with ProcessPoolExecutor(
        max_workers=args.jobs, initializer=prototypes.install, initargs=(args.prototype,)
    ) as pool:
        futures = [
            pool.submit(
                run_cell,
                source,
                seed,
                workers,
                args.policy,
                args.markdown is not None and seed == 1,
            )
            for source, seed, workers in todo
        ]
        results = [f.result() for f in futures]
    bad = 0
    for cell in results:
        failed = verdicts(cell)
        bad += bool(failed)
        mine = cell["figures"][cell["policy"]]["levels"]
        strict = cell["figures"]["strict"]["levels"]
        print(
            f"{cell['source']:<26} seed {cell['seed']} gpus {cell['workers']}: "
            f"int p99 {_p99(mine, '100')} (strict {_p99(strict, '100')}), "
            f"normal p99 {_p99(mine, '0')} (strict {_p99(strict, '0')}), "
            f"longest {fmt_seconds(cell['longest'])}: "
            + ("ok" if not failed else "FAIL " + "; ".join(failed))
        )
    for row in tally(results):
        print(row)
    print(f"{len(results) - bad}/{len(results)} cells pass")
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, args.policy))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
