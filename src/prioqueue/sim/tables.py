"""The report's tables as plain data: one :class:`Table` per view of a scenario's report.

:mod:`prioqueue.sim.render` draws them (rich on a terminal, or plain text), so both outputs
always show the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from prioqueue.priority import DEFAULT_ALIASES

__all__ = ["Row", "Table", "duration", "number", "percent", "tables"]

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


def number(value: float | None, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals (``-`` for None)."""
    return "-" if value is None else f"{value:.{digits}f}"


def _levels(policies: Mapping[str, Any]) -> list[str]:
    keys = {key for section in policies.values() for key in section["levels"]}
    return sorted(keys, key=int, reverse=True)


def percent(value: float | None) -> str:
    """A fraction as a percentage with one decimal (``-`` for None)."""
    return "-" if value is None else f"{100 * value:.1f}%"


def _censored(value: float | None, floor: float | None) -> str:
    if value is not None and floor is not None and value >= floor:
        return "≥" + duration(value)
    return duration(value)


def tables(report: Mapping[str, Any]) -> list[Table]:
    """Build the report's tables.

    Args:
        report: What :func:`prioqueue.sim.report.build_report` returned.

    Returns:
        Waits by level, (queue budgets by level,) fair share by level, GPU use, reorders by
        cause, GPU share by member (, workers on a fleet, groups when jobs carry one).
    """
    policies: Mapping[str, Any] = report["policies"]
    levels = _levels(policies)
    fleet = any("workers" in section for section in policies.values())
    found = [
        _waits_table(policies, levels),
        _fair_table(policies, levels, fleet),
        _gpu_table(policies),
        _reorders_table(policies),
        _shares_table(policies),
    ]
    if any("refused" in section for section in policies.values()):
        found.insert(1, _budgets_table(policies, levels))
    if fleet:
        found.append(_workers_table(policies))
    if any("groups" in section for section in policies.values()):
        found.append(_groups_table(policies))
    return found


Row = tuple[str, ...]
"""A table's row of cells."""
_Cells = Callable[[str, str, Mapping[str, Any], Mapping[str, Any]], Row]


def _by_level(
    policies: Mapping[str, Any], levels: list[str], cells: _Cells
) -> tuple[Row | None, ...]:
    """One row per level and policy (``cells(level, policy, section, its row)``) by level."""
    rows: list[Row | None] = []
    for level in levels:
        if rows:
            rows.append(None)
        for name, section in policies.items():
            row = section["levels"].get(level)
            if row is not None:
                rows.append(cells(level, name, section, row))
    return tuple(rows)


def _wait_cells(level: str, name: str, section: Mapping[str, Any], row: Mapping[str, Any]) -> Row:
    floor = row["censored_from"]
    return (
        _level(level),
        name,
        str(row["jobs"]),
        str(row["completed"]),
        str(row["unfinished"]),
        _censored(row["wait_p50"], floor),
        _censored(row["wait_p95"], floor),
        _censored(row["wait_p99"], floor),
        _censored(row["wait_max"], floor),
        number(row["slowdown_mean"], 1),
    )


def _waits_table(policies: Mapping[str, Any], levels: list[str]) -> Table:
    return Table(
        "Waits by level (arrival to start)",
        ("level", "policy", "jobs", "done", "unfinished", "p50", "p95", "p99", "max", "slowdown"),
        _by_level(policies, levels, _wait_cells),
        "unfinished: queued when the horizon stopped the clock; their waits count as "
        "censored (>=: a lower bound)",
        left=2,
    )


def _fair_cells(level: str, name: str, section: Mapping[str, Any], row: Mapping[str, Any]) -> Row:
    gap = row["service_gap"]
    within = "-" if gap is None else ("yes" if gap <= row["gap_bound"] else "NO")
    pair = row["service_gap_members"]
    share = row["fair_share"]
    return (
        _level(level),
        name,
        duration(gap),
        "-" if pair is None else " / ".join(pair),
        duration(row["gap_bound"]),
        number(share["worst"], 2)
        + ("" if share["worst_member"] is None else f" {share['worst_member']}"),
        number(row["jain"], 3),
        within,
    )


def _fair_table(policies: Mapping[str, Any], levels: list[str], fleet: bool) -> Table:
    bound = "2*N*(T + A)*d + 10*K*C (N workers, K slots)" if fleet else "2*(T + A)*d + 10*C"
    return Table(
        "Fair share by level (members compared only while both are backlogged)",
        ("level", "policy", "max gap", "between", "bound", "min share", "Jain", "within"),
        _by_level(policies, levels, _fair_cells),
        f"gap: largest drift in service between two backlogged members, bound {bound}; "
        "min share: the worst member's GPU time over its max-min fair share (1 = fair); "
        "Jain (secondary): over contended service, low when members ask for different "
        "amounts",
        left=2,
    )


_Column = tuple[str, str, Callable[[Any], str]]
"""A figure's column: ``(header, key in the report's section, format)``."""
_SWAPS: _Column = ("swaps", "swaps", str)
_LOADING: _Column = ("loading", "load_seconds", duration)
_BUSY: _Column = ("busy", "busy_seconds", duration)
_GPU_COLUMNS: tuple[_Column, ...] = (
    _SWAPS,
    _LOADING,
    ("idle+waiting", "idle_waiting_seconds", duration),
    ("hung", "lost_seconds", duration),
    _BUSY,
    ("makespan", "makespan", duration),
)
_WORKER_COLUMNS: tuple[_Column, ...] = (
    ("runs", "jobs", str),
    _SWAPS,
    _LOADING,
    _BUSY,
    ("utilisation", "utilisation", percent),
)


def _headers(columns: tuple[_Column, ...]) -> Row:
    return tuple(header for header, _, _ in columns)


def _figures(row: Mapping[str, Any], columns: tuple[_Column, ...]) -> Row:
    """``row``'s figures under ``columns``, each through its format."""
    return tuple(form(row[key]) for _, key, form in columns)


def _gpu_table(policies: Mapping[str, Any]) -> Table:
    rows = tuple(
        (name, *_figures(s, _GPU_COLUMNS), f"{s['completed']}/{s['cancelled']}/{s['failed']}")
        for name, s in policies.items()
    )
    return Table("GPU", ("policy", *_headers(_GPU_COLUMNS), "done/cxl/fail"), rows)


def _reorders_table(policies: Mapping[str, Any]) -> Table:
    causes = ("aging", "affinity", "tier", "fair_share", "deferred_crossings")
    rows = tuple(
        (name, *(str(s["reorders"].get(c, 0)) if s["params"] is not None else "-" for c in causes))
        for name, s in policies.items()
    )
    return Table("Reorders by cause (dispatcher stats)", ("policy", *causes), rows)


def _shares_table(policies: Mapping[str, Any]) -> Table:
    names = list(policies)
    members: dict[str, float] = {}
    for section in policies.values():
        for member, row in section["members"].items():
            members[member] = max(members.get(member, 0.0), row["gpu_seconds"] or 0.0)
    shown = sorted(members, key=lambda m: (-members[m], m))[:_MAX_MEMBERS]
    rows = tuple(
        (
            member,
            *(
                percent(policies[name]["members"].get(member, {}).get("gpu_share"))
                for name in names
            ),
        )
        for member in sorted(shown)
    )
    hidden = len(members) - len(shown)
    return Table(
        "GPU share by member",
        ("member", *names),
        rows,
        f"{hidden} more members not shown" if hidden > 0 else "",
    )


def _budgets_table(policies: Mapping[str, Any], levels: list[str]) -> Table:
    """Refused and ttl-expired jobs by level (only when a policy ran with queue budgets)."""

    def cells(level: str, name: str, section: Mapping[str, Any], row: Mapping[str, Any]) -> Row:
        budget = (section["params"] or {}).get("budgets", {}).get(level)
        return (
            _level(level),
            name,
            ", ".join(f"{k}={v:g}" for k, v in budget.items()) if budget else "-",
            str(row["jobs"]),
            str(row.get("refused", 0)),
            str(row.get("ttl_expired", 0)),
            str(row["completed"]),
        )

    return Table(
        "Queue budgets by level",
        ("level", "policy", "budget", "jobs", "refused", "ttl expired", "done"),
        _by_level(policies, levels, cells),
        "refused: submits a level's max_queued or max_wait turned away; ttl expired: left the "
        "queue at their deadline, never granted; neither has a wait (baselines run "
        "unprotected)",
        left=3,
    )


def _by_policy(
    policies: Mapping[str, Any], key: str, cells: _Cells, *, separate: bool
) -> tuple[Row | None, ...]:
    """One row per entry of each policy's ``key`` section, through ``cells``.

    ``cells(entry, policy, section, its row)``; a separator between policies when ``separate``.
    """
    rows: list[Row | None] = []
    for name, section in policies.items():
        if separate and rows:
            rows.append(None)
        for entry, row in section.get(key, {}).items():
            rows.append(cells(entry, name, section, row))
    return tuple(rows)


def _worker_cells(worker: str, name: str, _: Mapping[str, Any], row: Mapping[str, Any]) -> Row:
    return (name, worker, *_figures(row, _WORKER_COLUMNS))


def _workers_table(policies: Mapping[str, Any]) -> Table:
    return Table(
        "Workers",
        ("policy", "worker", *_headers(_WORKER_COLUMNS)),
        _by_policy(policies, "workers", _worker_cells, separate=True),
        "utilisation: busy seconds (loads and hung attempts included) over the run's clock",
        left=2,
    )


def _group_cells(group: str, name: str, _: Mapping[str, Any], row: Mapping[str, Any]) -> Row:
    forecast = row.get("forecast") or {}
    return (
        group,
        name,
        "all" if row["depth"] is None else str(row["depth"]),
        f"{row['completed']}/{row['jobs']}",
        duration(row["finish"]),
        duration(forecast.get("mean_abs_error")),
        percent(forecast.get("mean_relative")),
    )


def _groups_table(policies: Mapping[str, Any]) -> Table:
    return Table(
        "Groups (films)",
        ("group", "policy", "depth", "done", "finish", "forecast error", "relative"),
        _by_policy(policies, "groups", _group_cells, separate=False),
        "finish: when its last job left; forecast error: mean |forecast - finish| over the "
        "forecasts taken at the start and at each tenth done (relative: over the time left)",
        left=2,
    )
