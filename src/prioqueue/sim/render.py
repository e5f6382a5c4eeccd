"""The report for people: tables rendered with rich on a terminal, or as plain text.

The tables are built once as plain data (:func:`tables`) and then drawn either way, so the
rich and the plain outputs always show the same numbers. ``rich`` is imported only inside
:func:`render_rich`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import IO, Any

import attrs

from prioqueue.priority import DEFAULT_ALIASES

__all__ = ["Table", "duration", "render_plain", "render_rich", "tables"]

_LEVEL_NAMES = {value: name for name, value in DEFAULT_ALIASES.items()}
_MAX_MEMBERS = 20


@attrs.frozen
class Table:
    """One table of the report.

    Attributes:
        title: The heading.
        headers: The column names.
        rows: The cells, as text; ``None`` draws a separator before the row that follows.
        note: A line printed under the table, or empty.
        left: How many leading columns are text (left-aligned); the rest are numbers.
    """

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...] | None, ...]
    note: str = ""
    left: int = 1


_YEAR = 365 * 86_400.0


def duration(seconds: float | None) -> str:
    """Format seconds for people: ``12.3s``, ``4.2m`` or ``3.1h`` (``-`` for None).

    Durations of a year or more (e.g. the fairness bound of the ``no-aging`` ablation, whose
    divisor is 1e9) read ``unbounded``: no run lasts that long, so the number means nothing.

    Args:
        seconds: A duration, or None.

    Returns:
        The text.
    """
    if seconds is None:
        return "-"
    if abs(seconds) >= _YEAR:
        return "unbounded"
    if abs(seconds) < 90:
        return f"{seconds:.1f}s"
    if abs(seconds) < 90 * 60:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _level(key: str) -> str:
    name = _LEVEL_NAMES.get(int(key))
    return f"{key} {name}" if name else key


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _levels(policies: Mapping[str, Any]) -> list[str]:
    keys = {key for section in policies.values() for key in section["levels"]}
    return sorted(keys, key=int, reverse=True)


def tables(report: Mapping[str, Any]) -> list[Table]:
    """Build the report's tables.

    Args:
        report: What :func:`prioqueue.sim.report.build_report` returned.

    Returns:
        Waits by level, fair share by level, GPU use, reorders by cause, GPU share by member.
    """
    policies: Mapping[str, Any] = report["policies"]
    levels = _levels(policies)
    waits: list[tuple[str, ...] | None] = []
    fair: list[tuple[str, ...] | None] = []
    for level in levels:
        if waits:
            waits.append(None)
            fair.append(None)
        for name, section in policies.items():
            row = section["levels"].get(level)
            if row is None:
                continue
            waits.append(
                (
                    _level(level),
                    name,
                    str(row["jobs"]),
                    str(row["completed"]),
                    duration(row["wait_p50"]),
                    duration(row["wait_p95"]),
                    duration(row["wait_p99"]),
                    duration(row["wait_max"]),
                    _number(row["slowdown_mean"], 1),
                )
            )
            gap = row["service_gap"]
            within = "-" if gap is None else ("yes" if gap <= row["gap_bound"] else "NO")
            pair = row["service_gap_members"]
            fair.append(
                (
                    _level(level),
                    name,
                    _number(row["jain"], 3),
                    duration(gap),
                    "-" if pair is None else " / ".join(pair),
                    duration(row["gap_bound"]),
                    within,
                )
            )
    gpu = tuple(
        (
            name,
            str(s["swaps"]),
            duration(s["load_seconds"]),
            duration(s["idle_waiting_seconds"]),
            duration(s["lost_seconds"]),
            duration(s["busy_seconds"]),
            duration(s["makespan"]),
            f"{s['completed']}/{s['cancelled']}/{s['failed']}",
        )
        for name, s in policies.items()
    )
    causes = ("aging", "affinity", "tier", "fair_share")
    reorders = tuple(
        (name, *(str(s["reorders"].get(c, 0)) if s["params"] is not None else "-" for c in causes))
        for name, s in policies.items()
    )
    names = list(policies)
    members: dict[str, float] = {}
    for section in policies.values():
        for member, row in section["members"].items():
            members[member] = max(members.get(member, 0.0), row["gpu_seconds"] or 0.0)
    shown = sorted(members, key=lambda m: (-members[m], m))[:_MAX_MEMBERS]
    share_rows = tuple(
        (
            member,
            *(
                _percent(policies[name]["members"].get(member, {}).get("gpu_share"))
                for name in names
            ),
        )
        for member in sorted(shown)
    )
    hidden = len(members) - len(shown)
    return [
        Table(
            "Waits by level (arrival to start)",
            ("level", "policy", "jobs", "done", "p50", "p95", "p99", "max", "slowdown"),
            tuple(waits),
            left=2,
        ),
        Table(
            "Fair share by level",
            ("level", "policy", "Jain", "max gap", "between", "bound", "within"),
            tuple(fair),
            "gap: largest drift in service between two members backlogged at the same level; "
            "bound: 2*C + (T + A)*d",
            left=2,
        ),
        Table(
            "GPU",
            (
                "policy",
                "swaps",
                "loading",
                "idle+waiting",
                "hung",
                "busy",
                "makespan",
                "done/cxl/fail",
            ),
            gpu,
        ),
        Table("Reorders by cause (dispatcher stats)", ("policy", *causes), reorders),
        Table(
            "GPU share by member",
            ("member", *names),
            share_rows,
            f"{hidden} more members not shown" if hidden > 0 else "",
        ),
    ]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _header(report: Mapping[str, Any]) -> str:
    scenario = report["scenario"]
    params = scenario.get("params", {})
    seed = params.get("seed")
    parts = [f"scenario {scenario['name']}", f"{scenario['jobs']} jobs"]
    if seed is not None:
        parts.append(f"seed {seed}")
    parts.append(f"work {duration(scenario['work_seconds'])}")
    return ", ".join(parts)


def render_plain(report: Mapping[str, Any]) -> str:
    """Render the report as aligned plain text (for pipes and files).

    Args:
        report: The report.

    Returns:
        The text, ending with a newline.
    """
    out = [_header(report)]
    for table in tables(report):
        out.append("")
        out.append(table.title)
        widths = [len(h) for h in table.headers]
        for cells in table.rows:
            if cells is not None:
                widths = [max(w, len(cell)) for w, cell in zip(widths, cells, strict=True)]
        out.append(_line(table.headers, widths, table.left))
        out.append("  ".join("-" * w for w in widths))
        for cells in table.rows:
            out.append("" if cells is None else _line(cells, widths, table.left))
        if table.note:
            out.append(table.note)
    return "\n".join(out) + "\n"


def _line(cells: Sequence[str], widths: Sequence[int], left: int) -> str:
    parts = [
        cell.ljust(width) if k < left else cell.rjust(width)
        for k, (cell, width) in enumerate(zip(cells, widths, strict=True))
    ]
    return "  ".join(parts).rstrip()


def render_rich(report: Mapping[str, Any], file: IO[str] | None = None) -> None:
    """Print the report as rich tables.

    Args:
        report: The report.
        file: Where to print (default stdout).

    Raises:
        ImportError: rich is not installed.
    """
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console(file=file)
    console.print(f"[bold]{_header(report)}[/bold]")
    for table in tables(report):
        grid = RichTable(title=table.title, title_justify="left", caption=table.note or None)
        for k, header in enumerate(table.headers):
            if k < table.left:
                grid.add_column(header, justify="left", no_wrap=True)
            else:
                grid.add_column(header, justify="right")
        section = False
        for cells in table.rows:
            if cells is None:
                section = True
                continue
            if section:
                grid.add_section()
                section = False
            grid.add_row(*cells, style="bold red" if cells[-1] == "NO" else None)
        console.print(grid)
