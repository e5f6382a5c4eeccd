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
            floor = row["censored_from"]
            waits.append(
                (
                    _level(level),
                    name,
                    str(row["jobs"]),
                    str(row["completed"]),
                    str(row["unfinished"]),
                    _censored(row["wait_p50"], floor),
                    _censored(row["wait_p95"], floor),
                    _censored(row["wait_p99"], floor),
                    _censored(row["wait_max"], floor),
                    _number(row["slowdown_mean"], 1),
                )
            )
            gap = row["service_gap"]
            within = "-" if gap is None else ("yes" if gap <= row["gap_bound"] else "NO")
            pair = row["service_gap_members"]
            share = row["fair_share"]
            fair.append(
                (
                    _level(level),
                    name,
                    duration(gap),
                    "-" if pair is None else " / ".join(pair),
                    duration(row["gap_bound"]),
                    _number(share["worst"], 2)
                    + ("" if share["worst_member"] is None else f" {share['worst_member']}"),
                    _number(row["jain"], 3),
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
    causes = ("aging", "affinity", "tier", "fair_share", "deferred_crossings")
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
    fleet = any("workers" in section for section in policies.values())
    bound = "2*N*(T + A)*d + 10*K*C (N workers, K slots)" if fleet else "2*(T + A)*d + 10*C"
    found = [
        Table(
            "Waits by level (arrival to start)",
            (
                "level",
                "policy",
                "jobs",
                "done",
                "unfinished",
                "p50",
                "p95",
                "p99",
                "max",
                "slowdown",
            ),
            tuple(waits),
            "unfinished: queued when the horizon stopped the clock; their waits count as "
            "censored (>=: a lower bound)",
            left=2,
        ),
        Table(
            "Fair share by level (members compared only while both are backlogged)",
            ("level", "policy", "max gap", "between", "bound", "min share", "Jain", "within"),
            tuple(fair),
            f"gap: largest drift in service between two backlogged members, bound {bound}; "
            "min share: the worst member's GPU time over its max-min fair share (1 = fair); "
            "Jain (secondary): over contended service, low when members ask for different "
            "amounts",
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
    if any("refused" in section for section in policies.values()):
        found.insert(1, _budgets_table(policies, levels))
    if fleet:
        found.append(_workers_table(policies))
    if any("groups" in section for section in policies.values()):
        found.append(_groups_table(policies))
    return found


def _budgets_table(policies: Mapping[str, Any], levels: list[str]) -> Table:
    """Refused and ttl-expired jobs by level (only when a policy ran with queue budgets)."""
    rows: list[tuple[str, ...] | None] = []
    for level in levels:
        if rows:
            rows.append(None)
        for name, section in policies.items():
            row = section["levels"].get(level)
            if row is None:
                continue
            budget = (section["params"] or {}).get("budgets", {}).get(level)
            rows.append(
                (
                    _level(level),
                    name,
                    ", ".join(f"{k}={v:g}" for k, v in budget.items()) if budget else "-",
                    str(row["jobs"]),
                    str(row.get("refused", 0)),
                    str(row.get("ttl_expired", 0)),
                    str(row["completed"]),
                )
            )
    return Table(
        "Queue budgets by level",
        ("level", "policy", "budget", "jobs", "refused", "ttl expired", "done"),
        tuple(rows),
        "refused: submits a level's max_queued or max_wait turned away; ttl expired: left the "
        "queue at their deadline, never granted; neither has a wait (baselines run "
        "unprotected)",
        left=3,
    )


def _workers_table(policies: Mapping[str, Any]) -> Table:
    rows: list[tuple[str, ...] | None] = []
    for name, section in policies.items():
        if rows:
            rows.append(None)
        for worker, row in section.get("workers", {}).items():
            rows.append(
                (
                    name,
                    worker,
                    str(row["jobs"]),
                    str(row["swaps"]),
                    duration(row["load_seconds"]),
                    duration(row["busy_seconds"]),
                    _percent(row["utilisation"]),
                )
            )
    return Table(
        "Workers",
        ("policy", "worker", "runs", "swaps", "loading", "busy", "utilisation"),
        tuple(rows),
        "utilisation: busy seconds (loads and hung attempts included) over the run's clock",
        left=2,
    )


def _groups_table(policies: Mapping[str, Any]) -> Table:
    rows: list[tuple[str, ...] | None] = []
    for name, section in policies.items():
        for group, row in section.get("groups", {}).items():
            forecast = row.get("forecast") or {}
            rows.append(
                (
                    group,
                    name,
                    "all" if row["depth"] is None else str(row["depth"]),
                    f"{row['completed']}/{row['jobs']}",
                    duration(row["finish"]),
                    duration(forecast.get("mean_abs_error")),
                    _percent(forecast.get("mean_relative")),
                )
            )
    return Table(
        "Groups (films)",
        ("group", "policy", "depth", "done", "finish", "forecast error", "relative"),
        tuple(rows),
        "finish: when its last job left; forecast error: mean |forecast - finish| over the "
        "forecasts taken at the start and at each tenth done (relative: over the time left)",
        left=2,
    )


def _censored(value: float | None, floor: float | None) -> str:
    if value is not None and floor is not None and value >= floor:
        return "≥" + duration(value)
    return duration(value)


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
                    _number(row["fairness"]["worst_share"], 2),
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
