"""The report for people: tables rendered with rich on a terminal, or as plain text.

The tables are built once as plain data (:func:`~prioqueue.sim.tables.tables`, the verdict and
a sweep's table here) and then drawn either way, so the rich and the plain outputs always show
the same numbers. ``rich`` is imported only inside :func:`render_rich`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import IO, Any

from prioqueue.sim.tables import Table, duration, number, tables

__all__ = [
    "Table",
    "duration",
    "render_plain",
    "render_rich",
    "render_sweep",
    "reports_of",
    "sweep_table",
    "tables",
    "verdict_lines",
    "verdict_table",
]


def reports_of(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the scenario reports of a report: itself, or each of a suite's.

    Args:
        report: One scenario's report, or ``{"scenarios": [report, ...]}``.

    Returns:
        The scenario reports, in order.
    """
    if "scenarios" in report:
        return list(report["scenarios"])
    return [report]


def _batch_cell(row: Mapping[str, Any]) -> str:
    worst = duration(row["batch_worst"])
    if row["batch_starved"]:
        return f"starved: {row['batch_starved']} never ran (≥{worst})"
    if row["batch_unfinished"]:
        return f"≥{worst} ({row['batch_unfinished']} queued at end)"
    return worst


def _fair_cell(fair: Mapping[str, Any]) -> str:
    if fair["gap"] is None:
        return "-"
    mark = "ok" if fair["within"] else "OVER"
    return f"{duration(fair['gap'])} / {duration(fair['bound'])} {mark}"


def verdict_table(report: Mapping[str, Any]) -> Table:
    """Build the verdict: one row per scenario and policy (the summary's numbers).

    Args:
        report: One scenario's report or a suite.

    Returns:
        The table; its note holds each scenario's trade-off sentence.
    """
    rows: list[tuple[str, ...] | None] = []
    notes = []
    for one in reports_of(report):
        if rows:
            rows.append(None)
        first = True
        for label, row in one["summary"]["policies"].items():
            p99 = duration(row["interactive_p99"])
            rows.append(
                (
                    one["scenario"]["name"] if first else "",
                    label,
                    ("≥" + p99) if row["interactive_censored"] else p99,
                    _batch_cell(row),
                    _fair_cell(row["fairness"]),
                    number(row["fairness"]["worst_share"], 2),
                    str(row["swaps"]),
                )
            )
            first = False
        if one["summary"]["trade_off"]:
            notes.append(f"{one['scenario']['name']}: {one['summary']['trade_off']}")
    found = {one["scenario"]["params"].get("seed") for one in reports_of(report)}
    seeds = sorted(str(seed) for seed in found if seed is not None)
    where = f"seed {', '.join(seeds)}; " if seeds else ""
    kinds = {
        row["kind"] for one in reports_of(report) for row in one["summary"]["policies"].values()
    }
    against = "fifo, strict and warm-first" if "warm-first" in kinds else "fifo and strict"
    return Table(
        f"Verdict: prioqueue against {against} ({where}details and definitions below)",
        (
            "scenario",
            "policy",
            "interactive p99",
            "batch worst wait",
            "worst gap / bound",
            "min share",
            "swaps",
        ),
        tuple(rows),
        "\n".join(notes),
        left=2,
    )


def verdict_lines(report: Mapping[str, Any]) -> list[str]:
    """Return the verdict as plain-text lines (the table, then the trade-off sentences).

    Args:
        report: One scenario's report or a suite.

    Returns:
        The lines, without newlines.
    """
    return _plain_table(verdict_table(report))


def _header(report: Mapping[str, Any]) -> str:
    scenario = report["scenario"]
    params = scenario.get("params", {})
    seed = params.get("seed")
    parts = [f"scenario {scenario['name']}", f"{scenario['jobs']} jobs"]
    if seed is not None:
        parts.append(f"seed {seed}")
    parts.append(f"work {duration(scenario['work_seconds'])}")
    horizon = scenario.get("horizon")
    parts.append("until every job left" if horizon is None else f"horizon {duration(horizon)}")
    return ", ".join(parts)


def render_plain(report: Mapping[str, Any]) -> str:
    """Render the report as aligned plain text (for pipes and files).

    Args:
        report: The report.

    Returns:
        The text, ending with a newline.
    """
    out = verdict_lines(report)
    for one in reports_of(report):
        out.append("")
        out.append("=" * 8 + " " + _header(one))
        for table in tables(one):
            out.append("")
            out.extend(_plain_table(table))
    return "\n".join(out) + "\n"


def _plain_table(table: Table) -> list[str]:
    out = [table.title]
    widths = [len(h) for h in table.headers]
    for cells in table.rows:
        if cells is not None:
            widths = [max(w, len(cell)) for w, cell in zip(widths, cells, strict=True)]
    out.append(_line(table.headers, widths, table.left))
    out.append("  ".join("-" * w for w in widths))
    for cells in table.rows:
        out.append("" if cells is None else _line(cells, widths, table.left))
    if table.note:
        out.extend(table.note.split("\n"))
    return out


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
    _rich_table(console, RichTable, verdict_table(report))
    for one in reports_of(report):
        console.print(f"[bold]{_header(one)}[/bold]")
        for table in tables(one):
            _rich_table(console, RichTable, table)


def _rich_table(console: Any, rich_table: Any, table: Table) -> None:
    grid = rich_table(
        title=table.title,
        title_justify="left",
        caption=table.note or None,
        caption_justify="left",
    )
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
        bad = cells[-1] == "NO" or any(c.endswith("OVER") for c in cells)
        grid.add_row(*cells, style="bold red" if bad else None)
    console.print(grid)


def _spread_cell(figure: Mapping[str, float | None], kind: str) -> str:
    if figure["median"] is None:
        return "-"
    if kind == "duration":
        return f"{duration(figure['median'])} ({duration(figure['min'])}-{duration(figure['max'])})"
    if kind == "ratio":
        return f"{figure['median']:.2f} ({figure['min']:.2f}-{figure['max']:.2f})"
    return f"{figure['median']:g} ({figure['min']:g}-{figure['max']:g})"


def sweep_table(sweep: Mapping[str, Any]) -> Table:
    """Build a sweep's table: medians over the seeds, (min-max) beside each.

    Args:
        sweep: What ``prioqueue.sim.sweep.run_sweep`` returned, plus ``scenario``.

    Returns:
        One row per value; the note names the frontier.
    """
    front = set(sweep["frontier"])
    twins = sweep.get("ties", {})
    rows = tuple(
        (
            f"{sweep['key']}={row['value']}",
            _spread_cell(row["figures"]["interactive_p99"], "duration"),
            _spread_cell(row["figures"]["batch_worst"], "duration"),
            _spread_cell(row["figures"]["gap_over_bound"], "ratio"),
            _spread_cell(row["figures"]["swaps"], "count"),
            "*"
            if row["value"] in front
            else (f"= {sweep['key']}={twins[row['value']]}" if row["value"] in twins else ""),
        )
        for row in sweep["values"]
    )
    seeds = sweep["seeds"]
    return Table(
        f"Sweep of {sweep['policy']} on {sweep['scenario']}, seeds {seeds[0]}-{seeds[-1]}: "
        "median (min-max)",
        ("value", "interactive p99", "batch worst wait", "gap / bound", "swaps", "frontier"),
        rows,
        "frontier (*): no other value is as good on every column and better on one (medians); "
        "'= X': the same medians as X, which stands for both; pick among the * by what your "
        "batch users can accept",
    )


def render_sweep(sweep: Mapping[str, Any]) -> str:
    """Render a sweep as plain text.

    Args:
        sweep: What ``prioqueue.sim.sweep.run_sweep`` returned, plus ``scenario``.

    Returns:
        The text, ending with a newline.
    """
    return "\n".join(_plain_table(sweep_table(sweep))) + "\n"
