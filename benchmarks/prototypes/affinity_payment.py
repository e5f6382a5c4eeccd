"""Prototype: an affinity win on one worker pays a share of its jump into fair share.

Tried in issue 26's tenth round (uncapped) and eleventh round (bounded), and not taken;
docs/design/dispatcher.md, "Tried in the eleventh round, not taken", gives the tables.

**Rule.** On one live worker, take a grant that the ranking chose itself (no crossing, deferral
or overdue rule named it) with the affinity term. Suppose another backlogged lane of its level,
among its ``_affinity_win.SCAN`` least-served lanes, has a higher key without affinity. Then the
winner's lane pays ``share`` times the points it jumped, times the divisor ``d``. The points
jumped are that key minus the winner's own key without affinity. The payment goes into the
settled part of the lane's ``s``, clamped so that it stays at most ``now``. With
``Δ = (T + A) * d``, the cap bounds the payments:

* ``mode=period``: at most ``cap * Δ`` between the lane becoming backlogged (its lift) and its
  next lift. The service gap is measured only while both members are backlogged, so within
  one backlog period payments move a lane's ``s`` at most that far ahead of its service.
* ``mode=debt``: an outstanding debt of at most ``cap * Δ``. The lane's later final charges
  repay it before they move ``s``, and a lift above the lane's settled part forgives what it
  covers. What a lane owes is at most ``cap * Δ`` at any time, so its ``s`` is never more
  than that ahead of its service either.
* ``cap=none``: no cap and no bound (the tenth round's rule).

With a cap, in either mode, the simulator's ``gap_bound`` on one GPU widens by ``cap * Δ``
(for the policy under test; the baselines' bounds are left as they are).

Parameters (strings, as ``--prototype affinity_payment:share=0.5,cap=1,mode=period`` gives
them): ``share`` in (0, 1] (default 0.5), ``cap`` >= 0 or ``none`` (default 1), ``mode``
``period`` or ``debt`` (default ``period``).

It patches ``prioqueue._core.grant`` (``pick``, ``pop``, ``finish``), ``_Lane.lift`` and the
simulator's report in this process. It keeps no state in the library's snapshot, so a
restored dispatcher forgets its lanes' payments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from prioqueue._core import choose, grant
from prioqueue._core.core import Core
from prioqueue._core.starving import aging_exemption
from prioqueue._lanes import _Entry, _Lane
from prioqueue._workers import _Worker
from prioqueue.records import Grant
from prioqueue.sim import report
from prototypes._affinity_win import passed_lane

__all__ = ["install"]

MODES = ("period", "debt")


def _number(text: str) -> float:
    """``text`` as a float, NaN when it is not a number (every range check refuses NaN)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _share(text: str) -> float:
    value = _number(text)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"affinity_payment: share must be a number in (0, 1], got {text!r}")
    return value


def _cap(text: str) -> float:
    if text == "none":
        return math.inf
    value = _number(text)
    if not 0.0 <= value < math.inf:
        raise ValueError(
            f"affinity_payment: cap must be a finite number >= 0 or 'none', got {text!r}"
        )
    return value


class _Payments:
    """The rule's state and its patches (one per ``install``)."""

    def __init__(self, share: float, widths: float, repay: bool) -> None:
        self.share = share
        self.widths = widths  # the cap, in offset widths (inf: none)
        self.repay = repay
        # id(lane) -> (lane, paid or owed): the lane is kept alive, so its id is not reused.
        self.owed: dict[int, tuple[_Lane, float]] = {}
        self.pending: tuple[_Lane, float] | None = None
        self.old_pick = choose.pick  # grant's own name for it
        self.old_pop = grant.pop
        self.old_finish = grant.finish
        self.old_lift = _Lane.lift
        self.old_level = report._Tally.level

    def balance(self, lane: _Lane) -> float:
        row = self.owed.get(id(lane))
        return row[1] if row is not None and row[0] is lane else 0.0

    def pick(self, d: Core, worker: _Worker, t: float) -> choose.Pick | None:
        picked = self.old_pick(d, worker, t)
        self.pending = None
        if picked is not None and (passed := passed_lane(d, worker, picked)) is not None:
            self.pending = (picked[0], passed[1] * d.divisor)
        return picked

    def pop(self, d: Core, worker: _Worker, t: float, preview: bool = False) -> Grant | None:
        granted = self.old_pop(d, worker, t, preview)
        jumped, self.pending = self.pending, None
        if granted is None or preview or jumped is None:
            return granted
        lane, seconds = jumped
        paid = self.balance(lane)
        cap = self.widths * aging_exemption(d) - paid
        pay = min(self.share * seconds, cap, t - lane.settled)
        if pay > 0.0:
            lane.settled += pay
            lane.set_s()
            self.owed[id(lane)] = (lane, paid + pay)
            d.lanes.refile(lane, t)
        return granted

    def finish(self, d: Core, entry: _Entry, runtime: float, now: float, final: float) -> None:
        lane = entry.lane
        debt = self.balance(lane)
        if self.repay and debt > 0.0 and final > 0.0:
            back = min(debt, final / entry.capacity)
            self.owed[id(lane)] = (lane, debt - back)
            final -= back * entry.capacity
        self.old_finish(d, entry, runtime, now, final)

    def lift(self, lane: _Lane, floor: float) -> None:
        if not self.repay:
            self.owed.pop(id(lane), None)  # a new backlog period: the cap starts again
        elif floor > lane.settled and (debt := self.balance(lane)) > 0.0:
            self.owed[id(lane)] = (lane, max(0.0, debt - (floor - lane.settled)))
        self.old_lift(lane, floor)

    def level(
        self, tally: Any, number: int, top: int, timeline: list[tuple[float, float]] | None
    ) -> dict[str, Any]:
        row: dict[str, Any] = self.old_level(tally, number, top, timeline)
        result, params = tally.result, tally.params
        if self.widths < math.inf and not result.spec.is_baseline and len(result.workers) <= 1:
            every = list(params.tier_bonuses.values()) or [0.0]
            delta = (max(every) - min(every) + params.max_affinity) * params.aging_divisor
            row["gap_bound"] = round(row["gap_bound"] + self.widths * delta, 6)
        return row

    def patch(self) -> None:
        payments = self
        setattr(grant, "pick", self.pick)  # noqa: B010 (grant imports it by name)
        grant.pop = self.pop
        grant.finish = self.finish

        def lift(lane: _Lane, floor: float) -> None:
            payments.lift(lane, floor)

        def level(
            tally: Any, number: int, top: int, timeline: list[tuple[float, float]] | None
        ) -> dict[str, Any]:
            return payments.level(tally, number, top, timeline)

        setattr(_Lane, "lift", lift)  # noqa: B010 (mypy refuses a method assignment)
        setattr(report._Tally, "level", level)  # noqa: B010

    def undo(self) -> None:
        setattr(grant, "pick", self.old_pick)  # noqa: B010
        grant.pop = self.old_pop
        grant.finish = self.old_finish
        setattr(_Lane, "lift", self.old_lift)  # noqa: B010
        setattr(report._Tally, "level", self.old_level)  # noqa: B010
        self.owed.clear()


def install(share: str = "0.5", cap: str = "1", mode: str = "period") -> Callable[[], None]:
    """Patch this process with the rule (see the module's docstring); return the undo.

    Raises:
        ValueError: a parameter out of its range (the message names it and what is allowed).
    """
    f = _share(share)
    widths = _cap(cap)
    if mode not in MODES:
        raise ValueError(f"affinity_payment: mode must be one of {', '.join(MODES)}, got {mode!r}")
    payments = _Payments(f, widths, repay=mode == "debt")
    payments.patch()
    return payments.undo
