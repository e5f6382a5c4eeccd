"""PNG charts of a comparison (the ``plot`` extra): waits, a GPU timeline and service.

``matplotlib`` is imported when this module is imported, so import it only when charts are
asked for. Figures are drawn with the object API (no pyplot, no GUI backend).

* ``waits.png``: the wait distribution per level and policy (box plots, log scale).
* ``timeline.png``: what the GPU ran, per policy, coloured by level (cold loads in black).
* ``service.png``: cumulative GPU seconds per member over time, per policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from prioqueue.sim.engine import DONE, RunResult

__all__ = ["write_charts"]

_COLOURS = {100: "tab:red", 0: "tab:blue", -100: "tab:gray"}
_MAX_SEGMENTS = 20_000
_MAX_MEMBERS = 8


def _colour(level: int) -> str:
    return _COLOURS.get(level, "tab:green" if level > 0 else "tab:olive")


def _waits(results: Sequence[RunResult], path: Path) -> None:
    levels = sorted({a.priority for a in results[0].workload.arrivals}, reverse=True)
    fig = Figure(figsize=(4 + 1.2 * len(results), 3 * len(levels)), layout="constrained")
    axes = fig.subplots(len(levels), 1, squeeze=False)[:, 0]
    for ax, level in zip(axes, levels, strict=True):
        data = []
        for result in results:
            arrivals = result.workload.arrivals
            data.append(
                [
                    max(result.start[i] - a.arrival, 0.1)
                    for i, a in enumerate(arrivals)
                    if a.priority == level and result.status[i] == DONE
                ]
                or [math.nan]
            )
        ax.boxplot(data, whis=(1, 99), showfliers=False)
        ax.set_xticks(range(1, len(results) + 1), [r.spec.label for r in results], rotation=20)
        ax.set_yscale("log")
        ax.set_ylabel("wait (s)")
        ax.set_title(f"level {level}: wait, p1-p99 whiskers")
    fig.savefig(path, dpi=100)


def _timeline(results: Sequence[RunResult], path: Path) -> None:
    fig = Figure(figsize=(12, 0.8 + 0.7 * len(results)), layout="constrained")
    ax = fig.subplots()
    for row, result in enumerate(results):
        arrivals = result.workload.arrivals
        order = sorted(
            (i for i in range(len(arrivals)) if not math.isnan(result.start[i])),
            key=lambda i: result.start[i],
        )[:_MAX_SEGMENTS]
        by_level: dict[int, list[tuple[float, float]]] = {}
        loads = []
        for i in order:
            start, end = result.start[i] / 3600, result.end[i] / 3600
            by_level.setdefault(arrivals[i].priority, []).append((start, end - start))
            if result.load[i]:
                loads.append((start, result.load[i] / 3600))
        for level, spans in by_level.items():
            ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=_colour(level))
        ax.broken_barh(loads, (row - 0.35, 0.2), facecolors="black")
    ax.set_yticks(range(len(results)), [r.spec.label for r in results])
    ax.set_xlabel("hours")
    ax.set_title("GPU timeline by level (red interactive, blue normal, grey batch; black: loads)")
    fig.savefig(path, dpi=100)


def _service(results: Sequence[RunResult], report: Mapping[str, Any], path: Path) -> None:
    fig = Figure(figsize=(12, 2.6 * len(results)), layout="constrained")
    axes = fig.subplots(len(results), 1, squeeze=False)[:, 0]
    for ax, result in zip(axes, results, strict=True):
        members = report["policies"][result.spec.label]["members"]
        top = sorted(members, key=lambda m: -members[m]["gpu_seconds"])[:_MAX_MEMBERS]
        arrivals = result.workload.arrivals
        for member in top:
            ends = sorted(
                (result.end[i], result.end[i] - result.start[i])
                for i, a in enumerate(arrivals)
                if a.member == member and not math.isnan(result.start[i])
            )
            total = 0.0
            xs, ys = [0.0], [0.0]
            for end, runtime in ends:
                total += runtime
                xs.append(end / 3600)
                ys.append(total / 3600)
            ax.step(xs, ys, where="post", label=member)
        ax.set_title(f"{result.spec.label}: cumulative GPU hours per member")
        ax.set_xlabel("hours")
        ax.legend(fontsize="small", ncol=2, loc="upper left")
    fig.savefig(path, dpi=100)


def write_charts(
    results: Sequence[RunResult], report: Mapping[str, Any], directory: Path
) -> list[Path]:
    """Write the charts of a comparison as PNG files.

    Args:
        results: The runs (one per policy, same workload).
        report: Their report (for member totals).
        directory: Where to write; created when missing.

    Returns:
        The files written.

    Raises:
        OSError: The directory cannot be created or written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "waits.png", directory / "timeline.png", directory / "service.png"]
    _waits(results, paths[0])
    _timeline(results, paths[1])
    _service(results, report, paths[2])
    return paths
