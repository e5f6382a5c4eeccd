"""The verdict that opens every report: a few figures per policy and the trade-off in words.

For each policy: the interactive p99 wait, the batch worst wait (with the count of batch jobs
that never ran when a horizon stopped the clock), the fairness figure (the worst service gap
against its bound, over the levels, and the worst share of the max-min fair share) and the
swaps. The numbers are copied from the report's own sections, never recomputed, so the
summary, the tables and the JSON always agree. The sentence compares ``prioqueue`` (the first
non-baseline policy) with ``strict`` and ``fifo`` when they ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prioqueue.priority import BATCH, INTERACTIVE
from prioqueue.sim.policies import BASELINES
from prioqueue.sim.tables import duration as _dur

__all__ = ["summarize_report", "trade_off", "versus"]

_TOP, _BOTTOM = str(INTERACTIVE), str(BATCH)


def _fairness(section: Mapping[str, Any]) -> dict[str, Any]:
    """The level whose service gap is largest against its bound, and the worst share."""
    worst: dict[str, Any] = {"level": None, "gap": None, "bound": None, "within": None}
    ratio = -1.0
    share: float | None = None
    for level, row in section["levels"].items():
        gap, bound = row["service_gap"], row["gap_bound"]
        if gap is not None and bound and gap / bound > ratio:
            ratio = gap / bound
            worst = {"level": int(level), "gap": gap, "bound": bound, "within": gap <= bound}
        rated = row["fair_share"]["worst"]
        if rated is not None and (share is None or rated < share):
            share = rated
    worst["worst_share"] = share
    return worst


def _policy(section: Mapping[str, Any]) -> dict[str, Any]:
    levels = section["levels"]
    top = levels.get(_TOP)
    bottom = levels.get(_BOTTOM)
    return {
        "kind": section["kind"],
        "interactive_p99": None if top is None else top["wait_p99"],
        "interactive_censored": top is not None
        and top["censored_from"] is not None
        and top["wait_p99"] is not None
        and top["wait_p99"] >= top["censored_from"],
        "batch_worst": None if bottom is None else bottom["wait_max"],
        "batch_censored": bottom is not None and bottom["unfinished"] > 0,
        "batch_unfinished": 0 if bottom is None else bottom["unfinished"],
        "batch_starved": 0 if bottom is None else bottom["starved"],
        "unfinished": section["unfinished"],
        "fairness": _fairness(section),
        "swaps": section["swaps"],
    }


def summarize_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """Return the verdict of one scenario's report.

    Args:
        report: What :func:`prioqueue.sim.report.build_report` returned (without a summary).

    Returns:
        ``{"policies": {label: {...}}, "trade_off": str}``, JSON-serialisable.
    """
    policies = {label: _policy(section) for label, section in report["policies"].items()}
    return {"policies": policies, "trade_off": trade_off(policies)}


def _find(policies: Mapping[str, Mapping[str, Any]], kind: str) -> tuple[str, Any] | None:
    for label, row in policies.items():
        if row["kind"] == kind:
            return label, row
    return None


def _batch(label: str, row: Mapping[str, Any]) -> str:
    if row["batch_starved"]:
        count = row["batch_starved"]
        return (
            f"{label} starved {count} batch job{'s' if count != 1 else ''} "
            f"(never ran, oldest waited >= {_dur(row['batch_worst'])})"
        )
    if row["batch_unfinished"]:
        return (
            f"{label}'s worst batch wait is >= {_dur(row['batch_worst'])} "
            f"({row['batch_unfinished']} still queued at the horizon)"
        )
    return f"{label} ran every batch job, worst wait {_dur(row['batch_worst'])}"


Side = tuple[str, float, bool]
"""``(label, seconds, censored)``: one policy's figure; censored: a lower bound (``>=``)."""


def versus(what: str, mine: Side, other: Side) -> str:
    """Compare two policies' waits in words, whichever is lower (issue 17 item 5).

    Within ``max(1 s, 1 %)`` of the larger figure the two are *within* each other; otherwise
    the lower one is named *faster than* the other, by the difference. A censored figure is
    a lower bound: a censored *faster* side makes the comparison open ("so far"), a censored
    *slower* side makes the difference a lower bound ("at least"). O(1).

    Args:
        what: The figure's name (``"interactive p99"``).
        mine: The policy the sentence is about.
        other: The one it is compared with.

    Returns:
        A clause without a final full stop.
    """
    label, value, censored = mine
    o_label, o_value, o_censored = other
    diff = abs(value - o_value)
    mark = ">= " if censored else ""
    o_mark = ">= " if o_censored else ""
    if diff <= max(1.0, 0.01 * max(value, o_value)):
        return (
            f"{label}'s {what} ({mark}{_dur(value)}) is within {_dur(diff)} of {o_label}'s "
            f"({o_mark}{_dur(o_value)})"
        )
    fast, slow = (mine, other) if value < o_value else (other, mine)
    if fast[2]:  # the lower figure is only a lower bound: nothing is settled
        return (
            f"{fast[0]}'s {what} is >= {_dur(fast[1])} so far, {slow[0]}'s "
            f"{'>= ' if slow[2] else ''}{_dur(slow[1])} (jobs still queued at the horizon)"
        )
    least = "at least " if slow[2] else ""
    return (
        f"{fast[0]} is {least}{_dur(diff)} faster than {slow[0]} at {what} "
        f"({_dur(fast[1])} against {'>= ' if slow[2] else ''}{_dur(slow[1])})"
    )


def trade_off(policies: Mapping[str, Mapping[str, Any]]) -> str:
    """Name the trade-off between ``prioqueue`` and the baselines in one sentence.

    Args:
        policies: The verdict's rows by label (see :func:`summarize_report`).

    Returns:
        The sentence (empty when no non-baseline policy ran).
    """
    ours = next(((k, v) for k, v in policies.items() if v["kind"] not in BASELINES), None)
    if ours is None:
        return ""
    name, mine = ours
    parts: list[str] = []
    strict = _find(policies, "strict")
    if strict is not None and mine["interactive_p99"] is not None:
        s_label, s_row = strict
        if s_row["interactive_p99"] is not None:
            parts.append(
                versus(
                    "interactive p99",
                    (name, mine["interactive_p99"], mine["interactive_censored"]),
                    (s_label, s_row["interactive_p99"], s_row["interactive_censored"]),
                )
            )
    if strict is not None and mine["batch_worst"] is not None:
        s_label, s_row = strict
        if s_row["batch_starved"] or s_row["batch_worst"] != mine["batch_worst"]:
            parts.append(_batch(s_label, s_row))
        parts.append(_batch(name, mine))
    fair = mine["fairness"]
    if fair["gap"] is not None:
        verdict = "within" if fair["within"] else "OVER"
        text = f"{name}'s worst service gap {_dur(fair['gap'])} is {verdict} its bound"
        others = [
            label
            for label, row in policies.items()
            if row["kind"] in BASELINES and row["fairness"]["within"] is False
        ]
        if others:
            text += f" ({' and '.join(others)} exceed{'s' if len(others) == 1 else ''} it)"
        parts.append(text)
    mine_share = fair["worst_share"]
    starved_shares = [
        (label, row["fairness"]["worst_share"])
        for label, row in policies.items()
        if row["kind"] in BASELINES
        and row["fairness"]["worst_share"] is not None
        and row["fairness"]["worst_share"] < 0.5
    ]
    if starved_shares and mine_share is not None and mine_share >= 0.8:
        share = min(item[1] for item in starved_shares)
        labels = " and ".join(label for label, value in starved_shares if value == share)
        parts.append(
            f"{labels} gave one member {share:.2f} of its max-min fair share, {name} "
            f"at least {mine_share:.2f}"
        )
    warm = _find(policies, "warm-first")
    if warm is not None:
        w_label, w_row = warm
        ours_, theirs = mine["swaps"], w_row["swaps"]
        if ours_ == theirs:
            parts.append(f"{name} swaps {ours_} times, as many as {w_label}")
        else:
            fewer = "fewer" if ours_ < theirs else "more"
            parts.append(
                f"{name} swaps {ours_} times, {abs(ours_ - theirs)} {fewer} than {w_label} "
                f"({theirs})"
            )
    fifo = _find(policies, "fifo")
    if fifo is not None and fifo[1]["interactive_p99"] is not None:
        parts.append(f"fifo makes interactive p99 wait {_dur(fifo[1]['interactive_p99'])}")
    return "; ".join(parts) + "." if parts else ""
