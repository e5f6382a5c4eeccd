"""Check the policy on the wider benchmark of issue 26: overloaded fleets, bursts, real traces.

Families (each cell: one workload on one fleet, seeded):

* ``overload``: the ``overload`` scenario at 0.5, 0.8, 1.1, 1.5 and 2.0 times the capacity of
  each worker, on 1, 2, 4 and 8 workers (the arrivals scale with the workers);
* ``fleet-night``: the ``fleet-night`` scenario on 1 to 8 workers (the same arrivals);
* ``bursty``: the ``bursty`` scenario (heavy-tailed 4 s-16 min jobs, Zipf-skewed members,
  bursts of 10-40 jobs, a few hung jobs) at 0.8 and 1.5 per worker on 1 and 4 workers; its
  parameters can be changed with ``--bursty key=value`` (repeatable);
* ``azure``: both Azure LLM traces (``../shared/traces``) on one GPU at target loads 0.9
  and 1.3.

Each cell runs ``strict``, ``fifo``, ``warm-first``, ``no-fair-share`` and the policy under
test (``--policy``, default ``prioqueue``) on the same arrivals and checks the issue's
"Must show" list, with ``C`` the longest job of the workload (warm runtime plus cold load):

* interactive p99 wait <= strict's + C wherever the interactive work alone fits the GPUs
  (its warm seconds at most the workers' seconds over the arrivals' span);
* normal p99 <= strict's + C wherever strict finishes every normal job; elsewhere no more
  normal jobs starved than strict;
* no interactive job starved where strict starves none; starved batch jobs <= strict's;
* on fleets, swaps <= strict's and <= 1.25 x the fewest swaps of a baseline (fifo, strict,
  warm-first) that itself meets the interactive bound;
* inverted pairs (``prioqueue.sim.fairness.inverted_pairs``: half the demand or less, a mean
  wait longer by more than C) <= no-fair-share's at
  every level, and 0 at the interactive level.

It also prints each level's worst service gap as a multiple of C beside no-fair-share's, and
beside each failing cell the other simulated policies that pass every check of it (each judged
as the policy under test; the reference meets the inverted-pairs check by definition) or that
none does. The summary gives every simulated policy's pass count on the same checks, each
failed check with the number of cells it failed in, and how many failing cells no simulated
policy passes.
Seeds 1-5 are the tuning seeds, 6-20 the validation seeds: the pass counts are printed per
family and per seed range apart. With one process the ``--json`` and ``--markdown`` files are
rewritten after every cell, so a run stopped part way keeps what it ran.

Run: ``python benchmarks/check_wide.py [--seeds 1-5] [--family overload,bursty]
[--sample 0.25] [--jobs 1] [--policy SPEC] [--bursty key=value] [--json FILE]
[--ablate NAME=0|1] [--prototype NAME[:key=value,...]] [--markdown FILE]``; the exit status
is 1 when a check fails. ``--prototype`` patches in a rule measured and not taken
(``benchmarks/prototypes``). The whole matrix (36 cells x 20 seeds x 5 policies) takes tens
of minutes on one core; ``nox -s slow`` runs a sample.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from prioqueue.sim import build, build_report, parse_spec, read_trace, simulate
from prioqueue.sim.engine import QUEUED, RunResult
from prioqueue.sim.fairness import inverted_pairs
from prioqueue.sim.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import prototypes  # noqa: E402
from check_policy import fmt_seconds, longest_runtime, oldest_queued, trace_dir  # noqa: E402

FAMILIES = ("overload", "fleet-night", "bursty", "azure")
OVERLOAD_LOADS = (0.5, 0.8, 1.1, 1.5, 2.0)
OVERLOAD_WORKERS = (1, 2, 4, 8)
FLEET_WORKERS = tuple(range(1, 9))
BURSTY_LOADS = (0.8, 1.5)
BURSTY_WORKERS = (1, 4)
AZURE = ("azure-llm-2023-conv.csv", "azure-llm-2023-code.csv")
AZURE_LOADS = (0.9, 1.3)
BASELINES = ("fifo", "strict", "warm-first")
REFERENCE = "no-fair-share"
TUNING = range(1, 6)
LEVELS = (("100", "interactive"), ("0", "normal"), ("-100", "batch"))

Cell = tuple[str, str, float, int, int]  # (family, source, load, workers, seed)


def parse_seeds(text: str) -> list[int]:
    """``"1-5"``, ``"6-20"``, ``"3"`` or ``"1,4,7-9"`` to a sorted list of seeds."""
    seeds: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        first = int(low)
        seeds.update(range(first, int(high or first) + 1))
    if not seeds or min(seeds) < 1:
        raise SystemExit(f"--seeds: expected seeds >= 1 like 1-5 or 1,4,7-9, got {text!r}")
    return sorted(seeds)


def cells(seeds: Iterable[int], families: Sequence[str]) -> list[Cell]:
    """Every cell of the wider matrix for ``seeds`` and ``families``."""
    out: list[Cell] = []
    for seed in seeds:
        if "overload" in families:
            for workers in OVERLOAD_WORKERS:
                out += [("overload", "overload", ld, workers, seed) for ld in OVERLOAD_LOADS]
        if "fleet-night" in families:
            out += [("fleet-night", "fleet-night", 0.0, w, seed) for w in FLEET_WORKERS]
        if "bursty" in families:
            for workers in BURSTY_WORKERS:
                out += [("bursty", "bursty", ld, workers, seed) for ld in BURSTY_LOADS]
        if "azure" in families:
            out += [("azure", trace, ld, 1, seed) for trace in AZURE for ld in AZURE_LOADS]
    return out


def workload(cell: Cell, bursty: dict[str, str]) -> Workload:
    """The arrivals of one cell (the load is per worker)."""
    family, source, load, workers, seed = cell
    if family == "overload":
        return build("overload", seed=seed, load=load * workers)
    if family == "fleet-night":
        return build("fleet-night", seed=seed, gpus=workers)
    if family == "bursty":
        params: dict[str, Any] = {"load": load, "gpus": workers, **bursty}
        return build("bursty", seed=seed, **params)
    return read_trace(trace_dir() / source, seed=seed, params={"target_load": load})


def level_waits(result: RunResult, level: int) -> list[tuple[str, str, float, float]]:
    """``(member, tier, demand, mean wait)`` of each member at ``level`` (for inversions)."""
    clock = result.clock_end
    submitted = result.submitted
    demand: dict[str, float] = defaultdict(float)
    waits: dict[str, list[float]] = defaultdict(list)
    tiers: dict[str, str] = {}
    for i, job in enumerate(result.workload.arrivals):
        if job.priority != level:
            continue
        came = submitted[i] if submitted else job.arrival
        demand[job.member] += job.duration
        tiers[job.member] = job.tier
        start = result.start[i]
        if not math.isnan(start):
            waits[job.member].append(start - came)
        elif result.status[i] == QUEUED:
            waits[job.member].append(clock - came)
    return [(m, tiers[m], demand[m], sum(w) / len(w)) for m, w in sorted(waits.items()) if w]


def run_cell(cell: Cell, policy: str, bursty: dict[str, str]) -> dict[str, Any]:
    """Run one cell's policies and return its figures (see :func:`verdicts`)."""
    family, source, load, workers, seed = cell
    work = workload(cell, bursty)
    labels = [*BASELINES, REFERENCE, policy]
    fleet = None if workers == 1 and family != "fleet-night" else workers
    results = [
        simulate(work, parse_spec(label), horizon=work.horizon, workers=fleet) for label in labels
    ]
    report = build_report(work, results)["policies"]
    longest = longest_runtime(work)
    arrivals = work.arrivals
    span = work.horizon or (arrivals[-1].arrival - arrivals[0].arrival if arrivals else 0.0)
    interactive = sum(a.duration for a in arrivals if a.priority == 100)
    figures: dict[str, Any] = {}
    for label, result in zip(labels, results, strict=True):
        section = report[label]
        levels = {}
        for level, row in section["levels"].items():
            rows = level_waits(result, int(level))
            levels[level] = {
                "p99": row["wait_p99"],
                "unfinished": row["unfinished"],
                "starved": row["starved"],
                "gap_c": None if row["service_gap"] is None else row["service_gap"] / longest,
                "inverted": inverted_pairs(rows, longest),
            }
        figures[label] = {
            "levels": levels,
            "swaps": section["swaps"],
            "oldest": oldest_queued(result),
        }
    return {
        "family": family,
        "source": source,
        "load": load,
        "workers": workers,
        "seed": seed,
        "longest": longest,
        "fits": interactive <= workers * span,
        "policy": policy,
        "figures": figures,
    }


def _p99(fig: dict[str, Any], level: str) -> float:
    return float(fig["levels"].get(level, {}).get("p99") or 0.0)


def _starved(fig: dict[str, Any], level: str) -> int:
    return int(fig["levels"].get(level, {}).get("starved") or 0)


def verdicts(cell: dict[str, Any]) -> list[str]:
    """The failed checks of one cell (empty: every check passed)."""
    figs = cell["figures"]
    mine, strict, ref = figs[cell["policy"]], figs["strict"], figs[REFERENCE]
    slack = cell["longest"] + 1e-6
    failed: list[str] = []
    if cell["fits"] and _p99(mine, "100") > _p99(strict, "100") + slack:
        failed.append(f"interactive p99 {_p99(mine, '100'):.0f}s > strict + C")
    normal = strict["levels"].get("0")
    if normal is not None:
        if normal["unfinished"] == 0:
            if _p99(mine, "0") > _p99(strict, "0") + slack:
                failed.append(f"normal p99 {_p99(mine, '0'):.0f}s > strict + C")
        elif _starved(mine, "0") > _starved(strict, "0"):
            failed.append(f"{_starved(mine, '0')} normal starved > strict {_starved(strict, '0')}")
    if _starved(strict, "100") == 0 and _starved(mine, "100"):
        failed.append(f"{_starved(mine, '100')} interactive starved (strict 0)")
    if _starved(mine, "-100") > _starved(strict, "-100"):
        failed.append(f"{_starved(mine, '-100')} batch starved > strict {_starved(strict, '-100')}")
    if cell["workers"] > 1:
        fewest = min(
            (
                figs[b]["swaps"]
                for b in BASELINES
                if _p99(figs[b], "100") <= _p99(strict, "100") + slack
            ),
            default=None,
        )
        if mine["swaps"] > strict["swaps"]:
            failed.append(f"swaps {mine['swaps']} > strict {strict['swaps']}")
        if fewest is not None and mine["swaps"] > 1.25 * fewest:
            failed.append(f"swaps {mine['swaps']} > 1.25 x {fewest}")
    for level, name in LEVELS:
        ours = mine["levels"].get(level, {}).get("inverted", 0)
        theirs = ref["levels"].get(level, {}).get("inverted", 0)
        if ours > theirs or (level == "100" and ours):
            failed.append(f"{ours} inverted {name} pairs (no-fair-share {theirs})")
    return failed


def passers(cell: dict[str, Any]) -> list[str]:
    """The other simulated policies that pass every check of the cell.

    Each is judged as if it were the policy under test, on the same arrivals. The reference
    (``no-fair-share``) meets the inverted-pairs check by definition, so only its other checks
    count. A cell no simulated policy passes asks for more than any of them gives.
    """
    return [
        name
        for name in cell["figures"]
        if name != cell["policy"] and not verdicts({**cell, "policy": name})
    ]


def label(cell: dict[str, Any]) -> str:
    """A cell's name: family, source, load and workers."""
    load = f" load {cell['load']}" if cell["load"] else ""
    source = "" if cell["source"] == cell["family"] else f" {cell['source'][15:19]}"
    return f"{cell['family']}{source}{load} x{cell['workers']}"


def line(cell: dict[str, Any], failed: list[str]) -> str:
    """One cell's printed line: the figures the checks read, and the verdict."""
    figs = cell["figures"]
    mine, strict, ref = figs[cell["policy"]], figs["strict"], figs[REFERENCE]
    gaps = " ".join(
        f"{lv}:{_ratio(mine, lv)}/{_ratio(ref, lv)}" for lv, _ in LEVELS if lv in mine["levels"]
    )
    inv = "/".join(str(mine["levels"].get(lv, {}).get("inverted", 0)) for lv, _ in LEVELS)
    starved = "/".join(str(_starved(mine, lv)) for lv, _ in LEVELS)
    sstarved = "/".join(str(_starved(strict, lv)) for lv, _ in LEVELS)
    return (
        f"{label(cell):<28} seed {cell['seed']:>2}: int p99 {fmt_seconds(_p99(mine, '100'))} "
        f"(strict {fmt_seconds(_p99(strict, '100'))}), normal p99 {fmt_seconds(_p99(mine, '0'))} "
        f"(strict {fmt_seconds(_p99(strict, '0'))}), starved {starved} (strict {sstarved}), "
        f"swaps {mine['swaps']} (strict {strict['swaps']}), inverted {inv}, "
        f"gap/C {gaps}, C {fmt_seconds(cell['longest'])}: "
        + ("ok" if not failed else "FAIL " + "; ".join(failed) + _passed_by(cell))
    )


def _passed_by(cell: dict[str, Any]) -> str:
    others = passers(cell)
    return f" (passed by {', '.join(others)})" if others else " (no simulated policy passes)"


def _ratio(fig: dict[str, Any], level: str) -> str:
    value = fig["levels"].get(level, {}).get("gap_c")
    return "-" if value is None else f"{value:.1f}"


def tally(results: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[int]]:
    """``(family, "tuning"|"validation") -> [passed, cells]``."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for cell in results:
        where = "tuning" if cell["seed"] in TUNING else "validation"
        row = counts[cell["family"], where]
        row[0] += not verdicts(cell)
        row[1] += 1
    return counts


def check_of(failure: str) -> str:
    """The check a failure message of :func:`verdicts` is about, without its figures.

    ``"3 inverted normal pairs (no-fair-share 2)"`` -> ``"inverted normal pairs"``,
    ``"swaps 30 > 1.25 x 20"`` -> ``"swaps > 1.25 x fewest"``, ``"4 batch starved > strict
    2"`` -> ``"batch starved"``, ``"interactive p99 900s > strict + C"`` -> ``"interactive
    p99"``.
    """
    words = failure.split()
    if "inverted" in words:
        return " ".join(words[1:4])
    if "starved" in words:
        return " ".join(words[1:3])
    if words[0] == "swaps":
        return "swaps > strict" if words[-2] == "strict" else "swaps > 1.25 x fewest"
    return " ".join(words[:2])


def summary(results: Sequence[dict[str, Any]]) -> str:
    """Every simulated policy's pass count on the same checks, the checks that failed (in how
    many cells each) and the failures none passes.

    The reference passes its own inverted-pairs check by definition; its count shows what the
    other checks alone ask of a policy without fair share.
    """
    names = list(results[0]["figures"])
    passed = dict.fromkeys(names, 0)
    for cell in results:
        for name in names:
            passed[name] += not verdicts({**cell, "policy": name})
    failing = [(cell, found) for cell in results if (found := verdicts(cell))]
    alone = sum(1 for cell, _ in failing if not passers(cell))
    each = ", ".join(f"{name} {count}/{len(results)}" for name, count in passed.items())
    checks: dict[str, int] = defaultdict(int)
    for _, failures in failing:
        for check in {check_of(failure) for failure in failures}:
            checks[check] += 1
    ranked = sorted(checks.items(), key=lambda kv: (-kv[1], kv[0]))  # most cells, then name
    failed = ", ".join(f"{check} {count}" for check, count in ranked)
    return (
        f"every policy on the same checks: {each}\n"
        f"checks failed (cells): {failed or 'none'}\n"
        f"failing cells that no simulated policy passes: {alone}/{len(failing)}"
    )


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """The pass counts per family and seed range as a Markdown table (docs/simulator.md)."""
    counts = tally(results)
    lines = ["| family | tuning (seeds 1-5) | validation (seeds 6-20) |", "|---|---:|---:|"]
    for family in FAMILIES:
        cols = []
        for where in ("tuning", "validation"):
            passed, total = counts.get((family, where), [0, 0])
            cols.append(f"{passed}/{total}" if total else "-")
        lines.append(f"| {family} | {cols[0]} | {cols[1]} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1-5", help="e.g. 1-5 (tuning), 6-20 (validation)")
    parser.add_argument("--family", default=",".join(FAMILIES), help="comma-separated")
    parser.add_argument("--sample", type=float, default=1.0, help="fraction of cells (seeded)")
    parser.add_argument("--only", help="run only cells whose label contains this")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--policy", default="prioqueue")
    parser.add_argument("--bursty", action="append", default=[], help="key=value")
    parser.add_argument("--json", help="write every cell's figures to this file")
    parser.add_argument(
        "--affinity-price", type=float, help="sweep: override the core's AFFINITY_PRICE (k)"
    )
    parser.add_argument(
        "--ablate",
        action="append",
        default=[],
        help="an ablation: NAME=0|1 for a rule switch of the core (STARVING_FIRST, "
        "SHARE_GATE, WARM_OVERDUE, EARLY_TOP, ONE_WORKER_WARM, RETURN_LOAD); repeatable",
    )
    parser.add_argument("--markdown", help="write the pass-count table to this file")
    prototypes.add_option(parser)
    args = parser.parse_args()
    prototypes.install_option(args)
    families = [f.strip() for f in args.family.split(",") if f.strip()]
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise SystemExit(f"--family: unknown {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    bursty = dict(item.split("=", 1) for item in args.bursty)
    if args.affinity_price is not None:
        import prioqueue._core.config as core_config  # a sweep knob only

        core_config.AFFINITY_PRICE = args.affinity_price
    if args.ablate:
        import prioqueue._core.choose as core_choose  # ablation switches only
        import prioqueue._core.starving as core_starving

        homes = {
            "STARVING_FIRST": core_starving,
            "SHARE_GATE": core_starving,
            "EARLY_TOP": core_starving,
            "ONE_WORKER_WARM": core_starving,
            "RETURN_LOAD": core_starving,
            "WARM_OVERDUE": core_choose,
        }
        for item in args.ablate:
            name, _, value = item.partition("=")
            if name not in homes or value not in ("0", "1"):
                raise SystemExit(f"--ablate: expected NAME=0|1, NAME in {sorted(homes)}: {item!r}")
            setattr(homes[name], name, value == "1")
    todo = cells(parse_seeds(args.seeds), families)
    if args.sample < 1.0:
        todo = sorted(random.Random(26).sample(todo, max(1, round(args.sample * len(todo)))))
    if args.only:
        todo = [
            c
            for c in todo
            if args.only in label({"family": c[0], "source": c[1], "load": c[2], "workers": c[3]})
        ]
    if args.jobs > 1:
        with ProcessPoolExecutor(
            max_workers=args.jobs, initializer=prototypes.install, initargs=(args.prototype,)
        ) as pool:
            futures = [pool.submit(run_cell, c, args.policy, bursty) for c in todo]
            results = [f.result() for f in futures]
    else:
        results = []
        for c in todo:
            results.append(run_cell(c, args.policy, bursty))
            print(line(results[-1], verdicts(results[-1])), flush=True)
            save(results, args.json, args.markdown)  # an interrupted run keeps what it ran
    if args.jobs > 1:
        for cell in results:
            print(line(cell, verdicts(cell)))
    for (family, where), (passed, total) in sorted(tally(results).items()):
        print(f"{family:<12} {where:<10} {passed}/{total} cells pass")
    bad = sum(1 for cell in results if verdicts(cell))
    print(f"{len(results) - bad}/{len(results)} cells pass")
    if results:
        print(summary(results))
    save(results, args.json, args.markdown)
    return 1 if bad else 0


def save(results: Sequence[dict[str, Any]], figures: str | None, table: str | None) -> None:
    """Write the figures (``--json``) and the pass-count table (``--markdown``) so far."""
    if figures:
        Path(figures).write_text(json.dumps(results, indent=1))
    if table:
        Path(table).write_text(markdown(results))


if __name__ == "__main__":
    sys.exit(main())
