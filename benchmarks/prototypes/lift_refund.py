"""Prototype: the lift counts the affinity again, and refunds it when the model leaves.

Measured after issue 26's twelfth round; docs/design/dispatcher.md ("What it costs") gives
the table.

**Why.** The twelfth round's lift counts the tier gap only: a newcomer whose job is for a
resident model starts level with the most-starved lane ``M`` and wins by its bonus, so a stream
of one-off members for that model passes ``M`` until ``M``'s job is overdue (5,220 s at the
normal level) instead of for the affinity window (600 s). The affinity in the lift had kept
that promise but outlasted the bonus it stood for: a newcomer lifted ``A * d`` later kept that
start after its model was swapped out.

**Rule.** The floor counts the affinity as before issue 26's twelfth round (the new job's
bonus when its model is resident on a live worker, against the largest bonus ``M`` is eligible
for). The seconds the lane started later than the tier gap alone would have started it are
remembered with the job's model; when a grant swaps that model off the last live worker that
had it, every backlogged lane holding such a gap for it gets the gap back (its settled part
lowered by it, the lane re-ranked). A lane that empties forgets its gap. Only a grant's swap
refunds (the simulator's way of changing models); ``set_resident_model`` does not.

Parameters: none.

It patches ``prioqueue._core.core.Core.enqueue``, ``prioqueue._core.lanes.Lanes.file`` and
``prioqueue._core.grant.pop`` in this process. It keeps no state in the library's snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from prioqueue._core import grant
from prioqueue._core.core import Core
from prioqueue._core.lanes import Lanes
from prioqueue._lanes import _Entry, _Lane
from prioqueue._workers import _Worker
from prioqueue.records import Grant, Job

__all__ = ["install"]


def _residents(d: Core) -> set[str]:
    return {
        w.resident for w in d.workers.by_name.values() if not w.timed_out and w.resident is not None
    }


class _Refund:
    """The rule's state and its patches (one per ``install``)."""

    def __init__(self) -> None:
        self.core: Core | None = None  # the core whose enqueue is filing now
        # id(lane) -> (lane, model, gap): a lane lifted later for a resident model.
        self.gaps: dict[int, tuple[_Lane, str, float]] = {}
        self.old_enqueue = Core.enqueue
        self.old_file = Lanes.file
        self.old_pop = grant.pop

    def floors(self, lanes: Any, job: Job, residents: set[str]) -> tuple[float, float]:
        """The lift's floor today (the tier gap) and before the twelfth round (the affinity
        counted too: the new job's bonus when its model is resident, against the largest bonus
        the most-starved lane is eligible for; a multi-model job counts none here)."""
        level = lanes._levels[job.priority]
        plain = level.lift_floor(job, lanes._divisor)  # also drops stale heap items
        if plain == math.inf:
            return plain, plain
        s, _, lane = level.backlog[0]  # the most-starved lane, which set ``plain``
        affinity = lanes._affinity
        mine = job.tier_bonus
        if job.model is not None and job.model in residents:
            mine += affinity(job.model)
        theirs = lane.head().job.tier_bonus
        best = 0.0
        for resident in residents:
            bonus = affinity(resident)
            if bonus > best and lanes._ranking.candidate(lane, resident) is not None:
                best = bonus
        theirs += best
        return plain, float(s + max(0.0, mine - theirs) * lanes._divisor)

    def file(self, lanes: Lanes, entry: _Entry, now: float, *, requeue: bool, lift: bool) -> None:
        lane, job, d = entry.lane, entry.job, self.core
        if lane.live > 0 or requeue or not lift or d is None or not d.config.fair_share:
            self.old_file(lanes, entry, now, requeue=requeue, lift=lift)
            return
        self.gaps.pop(id(lane), None)  # a new backlog: an old gap is forgotten
        plain, raised = self.floors(lanes, job, _residents(d))
        by_tier = max(lane.settled, min(now, plain))  # where today's lift would start it
        lane.lift(min(now, raised))
        gap = lane.settled - by_tier
        if gap > 0.0 and job.model is not None:
            self.gaps[id(lane)] = (lane, job.model, gap)
        self.old_file(lanes, entry, now, requeue=requeue, lift=False)

    def enqueue(self, d: Core, job: Job, **kwargs: Any) -> _Entry:
        self.core = d
        try:
            return self.old_enqueue(d, job, **kwargs)
        finally:
            self.core = None

    def pop(self, d: Core, worker: _Worker, t: float, preview: bool = False) -> Grant | None:
        was = worker.resident
        granted = self.old_pop(d, worker, t, preview)
        if granted is None or preview or was is None or worker.resident == was:
            return granted
        if was in _residents(d):
            return granted
        for key, (lane, model, gap) in list(self.gaps.items()):
            if model != was:
                continue
            del self.gaps[key]
            if lane.live:
                lane.settled -= gap
                lane.set_s()
                d.lanes.refile(lane, t)
        return granted

    def patch(self) -> None:
        refund = self

        def enqueue(d: Core, job: Job, **kwargs: Any) -> _Entry:
            return refund.enqueue(d, job, **kwargs)

        def file(lanes: Lanes, entry: _Entry, now: float, *, requeue: bool, lift: bool) -> None:
            refund.file(lanes, entry, now, requeue=requeue, lift=lift)

        setattr(Core, "enqueue", enqueue)  # noqa: B010 (mypy refuses a method assignment)
        setattr(Lanes, "file", file)  # noqa: B010
        grant.pop = self.pop

    def undo(self) -> None:
        setattr(Core, "enqueue", self.old_enqueue)  # noqa: B010
        setattr(Lanes, "file", self.old_file)  # noqa: B010
        grant.pop = self.old_pop
        self.gaps.clear()


def install() -> Callable[[], None]:
    """Patch this process with the rule (see the module's docstring); return the undo."""
    refund = _Refund()
    refund.patch()
    return refund.undo
