"""PNG charts of a comparison or a sweep (the ``plot`` extra).

``matplotlib`` is imported when this module is imported, so import it only when charts are
asked for (``prioqueue simulate --plot`` imports it before simulating, to fail fast). Figures
are drawn with the object API (no pyplot, no GUI backend) at a small size and resolution.

* ``waits.png``: the wait CDF per level, one line per policy. Each curve is normalised by
  every job of the level that arrived, so jobs that never ran keep it below 1.
* ``timeline.png``: what the GPU ran, per policy, coloured by level; a black tick marks each
  swap (a grant that paid a cold load).
* ``service_gap.png``: per level, the largest service gap between two backlogged members over
  time, per policy, against the level's bound (dashed).
* ``frontier.png`` (a sweep): median interactive p99 against median batch worst wait for each
  value, bars from the smallest to the largest seed, the frontier joined.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from prioqueue.sim.policies import PolicyParams
from prioqueue.sim.report import summarize
from prioqueue.sim.results import JobState, RunResult

__all__ = ["write_charts", "write_frontier"]

_LEVEL_COLOURS = {100: "tab:red", 0: "tab:blue", -100: "tab:gray"}
_LEVEL_NAMES = {100: "interactive", 0: "normal", -100: "batch"}
_MAX_SEGMENTS = 20_000
_DPI = 72


def _colour(level: int) -> str:
    return _LEVEL_COLOURS.get(level, "tab:green" if level > 0 else "tab:olive")


def _name(level: int) -> str:
    name = _LEVEL_NAMES.get(level)
    return f"{level} {name}" if name else str(level)


def _levels(results: Sequence[RunResult]) -> list[int]:
    return sorted({a.priority for a in results[0].workload.arrivals}, reverse=True)


def _waits(results: Sequence[RunResult], path: Path) -> None:
    levels = _levels(results)
    fig = Figure(figsize=(4.2 * len(levels), 3.2), layout="constrained")
    axes = fig.subplots(1, len(levels), squeeze=False)[0]
    for ax, level in zip(axes, levels, strict=True):
        for result in results:
            arrivals = result.workload.arrivals
            arrived = 0
            waits = []
            for i, a in enumerate(arrivals):
                if a.priority != level or result.status[i] == 0:  # PENDING: after the horizon
                    continue
                arrived += 1
                if result.status[i] in (JobState.DONE, JobState.RUNNING) and not math.isnan(
                    result.start[i]
                ):
                    waits.append(max(result.start[i] - a.arrival, 0.1))
            if not waits:
                continue
            waits.sort()
            xs = [w / 60 for w in waits]
            ys = [(k + 1) / arrived for k in range(len(waits))]
            ax.step(xs, ys, where="post", label=result.spec.label)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("wait (minutes, log)")
        ax.set_title(_name(level))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of jobs started")
    axes[0].legend(fontsize="small", loc="lower right")
    fig.suptitle(f"{results[0].workload.name}: wait CDF (below 1: jobs that never ran)")
    fig.savefig(path, dpi=_DPI)


def _rows(result: RunResult) -> list[tuple[str, list[tuple[int, float, float]]]]:
    """The timeline's rows of one run: ``(label, [(job, start, end)])``, one per worker."""
    arrivals = result.workload.arrivals
    stop = result.clock_end
    if result.workers:
        rows: list[tuple[str, list[tuple[int, float, float]]]] = [
            (f"{result.spec.label} {w.name}", []) for w in result.workers
        ]
        for k, j, start, end in result.runs[: _MAX_SEGMENTS * len(rows)]:
            rows[k][1].append((j, start, end))
        return rows
    order = sorted(
        (i for i in range(len(arrivals)) if not math.isnan(result.start[i])),
        key=lambda i: result.start[i],
    )[:_MAX_SEGMENTS]
    spans = [
        (i, result.start[i], stop if math.isnan(result.end[i]) else result.end[i]) for i in order
    ]
    return [(result.spec.label, spans)]


def _timeline(results: Sequence[RunResult], path: Path) -> None:
    rows = [(result, label, spans) for result in results for label, spans in _rows(result)]
    fig = Figure(figsize=(10, 0.9 + 0.6 * len(rows)), layout="constrained")
    ax = fig.subplots()
    seen: set[int] = set()
    for row, (result, _, spans) in enumerate(rows):
        arrivals = result.workload.arrivals
        by_level: dict[int, list[tuple[float, float]]] = {}
        swaps = []
        for i, begin, end in spans:
            start = begin / 3600
            by_level.setdefault(arrivals[i].priority, []).append((start, end / 3600 - start))
            if result.load[i] and begin == result.start[i]:
                swaps.append(start)
        for level, bars in sorted(by_level.items(), reverse=True):
            label = None if level in seen else _name(level)
            seen.add(level)
            ax.broken_barh(bars, (row - 0.3, 0.6), facecolors=_colour(level), label=label)
        ax.plot(swaps, [row + 0.38] * len(swaps), "|", color="black", markersize=5)
    ax.set_yticks(range(len(rows)), [label for _, label, _ in rows])
    ax.set_ylim(-0.6, len(rows) - 0.3)
    ax.set_xlabel("hours")
    fleet = any(r.workers for r in results)
    if fleet:  # many rows: keep the legend just above the axes
        ax.legend(fontsize="small", ncol=3, loc="lower right", bbox_to_anchor=(1, 1.0))
    else:
        ax.legend(fontsize="small", ncol=3, loc="upper right", bbox_to_anchor=(1, 1.25))
    what = "worker" if fleet else "GPU"
    ax.set_title(
        f"{results[0].workload.name}: {what} timeline by level (| marks a swap)", loc="left"
    )
    fig.savefig(path, dpi=_DPI)


def _service_gap(
    results: Sequence[RunResult], report: Mapping[str, Any], base: PolicyParams, path: Path
) -> None:
    levels = _levels(results)
    fig = Figure(figsize=(4.2 * len(levels), 3.2), layout="constrained")
    axes = fig.subplots(1, len(levels), squeeze=False)[0]
    for result in results:
        timelines: dict[int, list[tuple[float, float]]] = {}
        summarize(result, base, gap_timelines=timelines)
        for ax, level in zip(axes, levels, strict=True):
            points = timelines.get(level, [])
            line = ax.step(
                [t / 3600 for t, _ in points],
                [g / 60 for _, g in points],
                where="post",
                label=result.spec.label,
            )
            bound = report["policies"][result.spec.label]["levels"][str(level)]["gap_bound"]
            if bound is not None and bound < 365 * 86_400:
                ax.axhline(bound / 60, linestyle="--", linewidth=0.8, color=line[0].get_color())
    for ax, level in zip(axes, levels, strict=True):
        ax.set_title(_name(level))
        ax.set_xlabel("hours")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("largest gap now (minutes)")
    axes[0].legend(fontsize="small", loc="upper left")
    fig.suptitle(
        f"{results[0].workload.name}: service gap between backlogged members (dashed: bound)"
    )
    fig.savefig(path, dpi=_DPI)


def write_charts(
    results: Sequence[RunResult],
    report: Mapping[str, Any],
    directory: Path,
    *,
    base: PolicyParams | None = None,
) -> list[Path]:
    """Write the charts of a comparison as PNG files.

    Args:
        results: The runs (one per policy, same workload; at least one).
        report: Their report (for the bounds).
        directory: Where to write; created when missing.
        base: The parameters the baselines' bounds use (default ``PolicyParams()``).

    Returns:
        The files written: ``waits.png``, ``timeline.png``, ``service_gap.png``.

    Raises:
        ValueError: ``results`` is empty.
        OSError: The directory cannot be created or written.
    """
    if not results:
        raise ValueError("write_charts needs at least one run")
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "waits.png", directory / "timeline.png", directory / "service_gap.png"]
    _waits(results, paths[0])
    _timeline(results, paths[1])
    _service_gap(results, report, base or PolicyParams(), paths[2])
    return paths


def write_frontier(sweep: Mapping[str, Any], directory: Path) -> Path:
    """Draw a sweep's frontier: interactive p99 against batch worst wait, one point per value.

    Each point is labelled with its value and its median swaps (the frontier is over all the
    sweep's columns, swaps and the gap included); a value tied with another names it.

    Args:
        sweep: What :func:`prioqueue.sim.sweep.run_sweep` returned (plus ``scenario``).
        directory: Where to write ``frontier.png``; created when missing.

    Returns:
        The file written.

    Raises:
        OSError: The directory cannot be created or written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(5.5, 4), layout="constrained")
    ax = fig.subplots()
    front = []
    for k, row in enumerate(sweep["values"]):
        x, y = row["figures"]["interactive_p99"], row["figures"]["batch_worst"]
        if x["median"] is None or y["median"] is None:
            continue
        xm, ym = x["median"] / 60, y["median"] / 3600
        ax.errorbar(
            [xm],
            [ym],
            xerr=[[xm - x["min"] / 60], [x["max"] / 60 - xm]],
            yerr=[[ym - y["min"] / 3600], [y["max"] / 3600 - ym]],
            fmt="o",
            capsize=3,
            color="tab:red" if row["value"] in sweep["frontier"] else "tab:gray",
        )
        swaps = row["figures"]["swaps"]["median"]
        twin = sweep.get("ties", {}).get(row["value"])
        ax.annotate(
            f"{sweep['key']}={row['value']}"
            + ("" if swaps is None else f", {swaps:g} swaps")
            + ("" if twin is None else f" (= {twin})"),
            (xm, ym),
            fontsize="small",
            xytext=(4, 4 - 10 * (k % 3)),  # staggered: close points keep readable labels
            textcoords="offset points",
        )
        if row["value"] in sweep["frontier"]:
            front.append((xm, ym))
    front.sort()
    ax.plot([p[0] for p in front], [p[1] for p in front], color="tab:red", linewidth=0.8)
    ax.set_xlabel("interactive p99 wait (minutes)")
    ax.set_ylabel("batch worst wait (hours)")
    seeds = sweep["seeds"]
    ax.set_title(
        f"{sweep['scenario']}: {sweep['policy']} over {sweep['key']}, "
        f"median of seeds {seeds[0]}-{seeds[-1]} (bars: min-max)",
        fontsize="medium",
    )
    ax.grid(alpha=0.3)
    path = directory / "frontier.png"
    fig.savefig(path, dpi=_DPI)
    return path
