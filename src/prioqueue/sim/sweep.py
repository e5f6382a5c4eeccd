"""Parameter sweeps: one policy parameter over several values and seeds, medians and spread.

``prioqueue simulate --sweep divisor=30,60,120,240 --seeds 5`` builds the scenario once per seed,
runs the policy once per value on each seed's arrivals, and reports for each value the median
and the spread (min and max over the seeds) of: interactive p99 wait, batch worst wait
(censored waits included), the worst service gap over its bound, and swaps. The **frontier**
is the set of values that no other value **dominates** on the medians of all four columns (at
least as good on every column, better on one; lower is better): the candidates an operator
chooses between. Values with the same medians on every column are **ties**: the first listed
stands for them on the frontier and the others name it (``ties``), so a sweep whose values all
tie shows one candidate, not all. Everything but the timings is deterministic for given seeds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from prioqueue.errors import ConfigError
from prioqueue.sim.engine import simulate
from prioqueue.sim.policies import PolicyParams, parse_spec
from prioqueue.sim.report import build_report
from prioqueue.sim.workers import WorkerSpec
from prioqueue.sim.workload import Workload

__all__ = ["METRICS", "frontier", "parse_sweep", "run_sweep", "ties"]

METRICS = ("interactive_p99", "batch_worst", "gap_over_bound", "swaps")
"""The figures a sweep reports for each value."""


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """Parse ``KEY=V1,V2,...`` (a policy parameter and at least one value).

    Args:
        text: The option's value.

    Returns:
        The key and the values, as written.

    Raises:
        ConfigError: No ``=``, no key, no value, or a value given twice.
    """
    key, sep, rest = text.partition("=")
    values = [v.strip() for v in rest.split(",") if v.strip()]
    if not sep or not key.strip() or not values:
        raise ConfigError(f"--sweep expects KEY=V1,V2,... (e.g. divisor=30,60,120), got {text!r}")
    if len(set(values)) != len(values):
        raise ConfigError(f"--sweep {text!r}: a value is given twice")
    return key.strip(), values


def _figures(section: dict[str, Any], summary: dict[str, Any]) -> dict[str, float | None]:
    fair = summary["fairness"]
    ratio = None if fair["gap"] is None or not fair["bound"] else fair["gap"] / fair["bound"]
    return {
        "interactive_p99": summary["interactive_p99"],
        "batch_worst": summary["batch_worst"],
        "gap_over_bound": None if ratio is None else round(ratio, 4),
        "swaps": float(section["swaps"]),
    }


def _spread(values: Sequence[float | None]) -> dict[str, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {
        "median": round(statistics.median(known), 3),
        "min": round(min(known), 3),
        "max": round(max(known), 3),
    }


Point = tuple[Any, ...]
"""``(label, figure, figure, ...)``: one value's medians, lower is better (None: unknown)."""


def _columns(points: Sequence[Point]) -> list[int]:
    """The figure columns known for every point (a column with a None anywhere is dropped)."""
    width = min((len(p) - 1 for p in points), default=0)
    return [c for c in range(1, width + 1) if all(p[c] is not None for p in points)]


def ties(points: Sequence[Point]) -> dict[str, str]:
    """Map each point that ties an earlier one on every known column to the first of them.

    O(n^2 c) for ``n`` points and ``c`` columns.

    Args:
        points: ``(label, figure, ...)``, in the order the values were given.

    Returns:
        ``{label: the label that stands for it}``; points with no earlier twin are absent.
    """
    columns = _columns(points)
    found: dict[str, str] = {}
    for k, point in enumerate(points):
        for first in points[:k]:
            if first[0] not in found and all(first[c] == point[c] for c in columns):
                found[str(point[0])] = str(first[0])
                break
    return found


def frontier(points: Sequence[Point]) -> list[str]:
    """Return the labels of the points that no other point dominates (lower is better).

    ``a`` dominates ``b`` when it is at least as good on every column known for all points
    and better on one. Of points tied on every column only the first stands (see
    :func:`ties`). O(n^2 c) for ``n`` points and ``c`` columns.

    Args:
        points: ``(label, figure, ...)`` (e.g. interactive p99, batch worst wait,
            gap / bound, swaps), in the order the values were given.

    Returns:
        The labels on the frontier, in the order given.
    """
    columns = _columns(points)
    twins = ties(points)

    def dominates(a: Point, b: Point) -> bool:
        return all(a[c] <= b[c] for c in columns) and any(a[c] < b[c] for c in columns)

    return [
        str(point[0])
        for point in points
        if str(point[0]) not in twins
        and not any(dominates(other, point) for other in points if other is not point)
    ]


def run_sweep(
    make_workload: Callable[[int], Workload],
    policy: str,
    key: str,
    values: Sequence[str],
    seeds: Sequence[int],
    *,
    base: PolicyParams | None = None,
    lease_factor: float = 3.0,
    horizon: Callable[[Workload], float | None] = lambda w: w.horizon,
    workers: Sequence[WorkerSpec] | int | None = None,
    poll: float = 0.0,
) -> dict[str, Any]:
    """Run ``policy`` with ``key`` set to each value on each seed's workload.

    Args:
        make_workload: Builds the workload of a seed.
        policy: The policy kind (e.g. ``"prioqueue"``); must not be a baseline.
        key: The parameter (``divisor``, ``affinity``, ``spacing``, ``charge``, ...).
        values: The values, as written.
        seeds: The seeds (at least one).
        base: The parameters the values apply to.
        lease_factor: As for :func:`~prioqueue.sim.engine.simulate`.
        horizon: The horizon of a workload (default: the workload's own).
        workers: The fleet (None: the workload's own, else one GPU); see ``simulate``.
        poll: A fleet's poll interval; see ``simulate``.

    Returns:
        ``{"policy", "key", "seeds", "values": [{"value", "label", "figures": {metric:
        {"median", "min", "max"}}, "per_seed": [...]}], "frontier": [value, ...], "ties":
        {value: the value that stands for it}}``.

    Raises:
        ConfigError: A baseline policy, no seeds, or a bad parameter or value.
    """
    if not seeds:
        raise ConfigError("--sweep needs at least one seed")
    specs = [parse_spec(f"{policy}:{key}={value}", base) for value in values]
    if specs[0].is_baseline:
        raise ConfigError(f"--sweep varies a dispatcher parameter; {policy!r} takes none")
    per_value: list[list[dict[str, float | None]]] = [[] for _ in specs]
    for seed in seeds:
        workload = make_workload(seed)
        results = [
            simulate(
                workload,
                spec,
                lease_factor=lease_factor,
                horizon=horizon(workload),
                workers=workers,
                poll=poll,
            )
            for spec in specs
        ]
        report = build_report(workload, results, base=base)
        for k, spec in enumerate(specs):
            section = report["policies"][spec.label]
            per_value[k].append(_figures(section, report["summary"]["policies"][spec.label]))
    rows: list[dict[str, Any]] = []
    for value, spec, runs in zip(values, specs, per_value, strict=True):
        rows.append(
            {
                "value": value,
                "label": spec.label,
                "figures": {m: _spread([run[m] for run in runs]) for m in METRICS},
                "per_seed": runs,
            }
        )
    points = [(row["value"], *(row["figures"][m]["median"] for m in METRICS)) for row in rows]
    return {
        "policy": policy,
        "key": key,
        "seeds": list(seeds),
        "values": rows,
        "frontier": frontier(points),
        "ties": ties(points),
    }
