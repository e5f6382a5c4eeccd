"""Prototype: the affinity may hold a worker's model for a bounded service, per swap, not per lane.

Tried in issue 26's twelfth round; docs/design/dispatcher.md gives the tables.

**Why.** On one worker the affinity bonus lets each lane eligible for the resident model run
up to ``A * d`` ahead of a lane that needs a swap. With ``K`` such lanes, that lane's job
waits for up to ``K * A * d`` of their service, while without fair share (every job its own
lane) a job waits at most for the resident model's jobs that arrived within ``A * d`` after
it. A deep member nearly always holds a job for the resident model, so the bonus would pay
the deep members while the light members' single jobs wait: the first explanation of the
Azure code trace's inverted pairs. (What made them, the same round found, was the lift, which
counted the affinity; it counts the tier only now.)

**Rule.** On one live worker, with fair share: a grant that the ranking chose itself (no
crossing, deferral or overdue rule named it) with the affinity term, while another lane of its
level among its least-served lanes (``_affinity_win.SCAN`` of them) ranks higher without the
affinity, *holds* the model for that lane. The level counts the expected runtime of every such
grant since the worker's resident model last changed. Once the next one would bring the count
past ``budget * A * d`` seconds, the best lane without the affinity goes instead (its head,
which needs a swap or no model) and the count starts again (so it does at every change of the
resident model). Such a grant is named ``"least served"``.

The grant that replaces the affinity winner is the level's best lane without the affinity,
so every grant is still the ranking's choice at some offsets within ``[0, A]``: the fairness
bound's argument holds unchanged, and ``s`` moves only by charges.

Parameters: ``budget`` > 0, in units of the affinity window ``A * d`` (default 1).

It patches ``prioqueue._core.grant`` (``pick``, ``pop``) in this process. It keeps no state in
the library's snapshot, so a restored dispatcher starts its counts again.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prioqueue._core import choose, grant
from prioqueue._core.core import Core
from prioqueue._workers import _Worker
from prioqueue.records import Grant
from prototypes._affinity_win import passed_lane

__all__ = ["install"]


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value < math.inf:
        raise ValueError(f"affinity_hold: budget must be a finite number > 0, got {text!r}")
    return value


class _Hold:
    """The rule's state and its patches (one per ``install``)."""

    def __init__(self, windows: float) -> None:
        self.windows = windows
        # The core counted for (one simulation at a time in a process), its resident model
        # when counted, and the seconds held per level since that model became resident.
        self.core: Core | None = None
        self.resident: str | None = None
        self.held: dict[int, float] = {}
        self.pending: tuple[int, float] | None = None
        self.old_pick = choose.pick  # grant's own name for it
        self.old_pop = grant.pop

    def pick(self, d: Core, worker: _Worker, t: float) -> choose.Pick | None:
        picked = self.old_pick(d, worker, t)
        self.pending = None
        if picked is None or not picked[4]:  # not fast: the passed lane's head may not be eligible
            return picked
        passed = passed_lane(d, worker, picked)
        if passed is None:
            return picked
        if self.core is not d or self.resident != worker.resident:
            self.core, self.resident = d, worker.resident
            self.held.clear()
        lane, entry, _aff, winner, fast, deferred, weight, _rule = picked
        spent = self.held.get(lane.level, 0.0) + d.expected_runtime(entry.job)
        if spent <= self.windows * d.window:
            self.pending = (lane.level, spent)
            return picked
        self.pending = (lane.level, 0.0)
        best = passed[0]
        return best, best.head(), 0.0, winner, fast, deferred, weight, "least served"

    def pop(self, d: Core, worker: _Worker, t: float, preview: bool = False) -> Grant | None:
        granted = self.old_pop(d, worker, t, preview)
        counted, self.pending = self.pending, None
        if granted is not None and not preview and counted is not None:
            self.held[counted[0]] = counted[1]
        return granted

    def patch(self) -> None:
        setattr(grant, "pick", self.pick)  # noqa: B010 (grant imports it by name)
        grant.pop = self.pop

    def undo(self) -> None:
        setattr(grant, "pick", self.old_pick)  # noqa: B010
        grant.pop = self.old_pop
        self.held.clear()
        self.core = self.resident = None


def install(budget: str = "1") -> Callable[[], None]:
    """Patch this process with the rule (see the module's docstring); return the undo.

    Raises:
        ValueError: ``budget`` is not a finite number > 0.
    """
    hold = _Hold(_budget(budget))
    hold.patch()
    return hold.undo
