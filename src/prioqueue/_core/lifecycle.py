"""The lifecycle owner: timers, delayed jobs, recent runtimes, budgets and admission (private).

Theory of operation (docs/design/lifecycle.md; the object is docs/design/state.md, "Owners"):

* ``Lifecycle`` owns the timers (``items.Timers``: the release and lapse heap, the delayed
  counts per level, the buffered ttl reports, the per-level ttl-expiry and refusal counts),
  the recent runtimes (``runtimes.Runtimes``) and the admission limits (``max_queued``,
  ``max_queued_per_member``, the per-level ``LevelBudget``).
* ``refusal`` is the one admission rule, for one job (a submit) and for a batch
  (``FleetDispatcher.admit``): ``max_queued``, a level's budget (``max_queued`` and
  ``max_wait`` from ``forecast_wait``), ``max_queued_per_member``. It reads the queue's
  counts it is given and changes nothing.
* Its fields are private; reads are properties. Every change is one of its methods (which
  call the timers' and runtimes' own); ``check`` asserts its invariant.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from prioqueue._core.items import LAPSE, Level, Timer, Timers, read_only
from prioqueue._core.runtimes import Runtimes
from prioqueue._lanes import _Entry
from prioqueue._spec import JobSpec
from prioqueue.errors import Overloaded, QueueFull
from prioqueue.lifecycle import LevelBudget
from prioqueue.records import Expired, Refusal

if TYPE_CHECKING:
    from prioqueue._core.lanes import Lanes
    from prioqueue._core.workers import Workers

__all__: list[str] = []  # private module


class Queue(Protocol):
    """What the admission rule reads of the core: its queued count, lanes and workers."""

    def __len__(self) -> int: ...

    @property
    def lanes(self) -> Lanes: ...

    @property
    def workers(self) -> Workers: ...


class Lifecycle:
    """Timers, delayed jobs, recent runtimes, budgets and the admission rule (private)."""

    __slots__ = ("_budgets", "_max_member", "_max_queued", "_runtimes", "_timers")

    def __init__(
        self, budgets: Mapping[int, LevelBudget], max_queued: int | None, max_member: int | None
    ) -> None:
        self._budgets = budgets
        self._max_queued = max_queued
        self._max_member = max_member
        self._timers = Timers()
        self._runtimes = Runtimes()

    # ------------------------------------------------------------------ reads

    timers: Timers = read_only(
        "_timers", "The timers, for reads (``next``, ``parked``, ``levels``, ``lapsed``...). O(1)."
    )
    runtimes: Runtimes = read_only(
        "_runtimes", "The recent runtimes, for reads (``expected``, ``retry_after``...). O(1)."
    )
    budgets: Mapping[int, LevelBudget] = read_only(
        "_budgets", "The configured per-level budgets (read-only). O(1)."
    )

    def ttl(self, level: int, ttl: float | None) -> float | None:
        """A job's ttl: its own, else its level's budget's. O(1)."""
        if ttl is None and self._budgets:
            budget = self._budgets.get(level)
            if budget is not None:
                return budget.ttl
        return ttl

    # ------------------------------------------------------------------ timers

    def watch(self, entry: _Entry) -> None:
        """Set a queued entry's lapse timer when its job has a ttl. O(log T)."""
        deadline = entry.job.deadline
        if deadline is not None:
            self._timers.push(deadline, LAPSE, entry)

    def park(self, entry: _Entry) -> None:
        """Count a delayed entry and set its timers (release, and lapse with a ttl)."""
        self._timers.park(entry)

    def unpark(self, entry: _Entry) -> None:
        """Uncount a delayed entry (released, lapsed, cancelled or failed). O(1)."""
        self._timers.unpark(entry.job.priority)

    def due(self, t: float) -> Timer | None:
        """Pop the earliest timer due at ``t`` (stale or not), or None."""
        return self._timers.due(t)

    def lapsed(self, level: int, expired: Expired) -> None:
        """Count a ttl expiry at ``level`` and buffer its report for the next ``expire``."""
        self._timers.life(level)[0] += 1
        self._timers.report(expired)

    def refused(self, level: int) -> None:
        """Count a submit refused by its level's budget."""
        self._timers.life(level)[1] += 1

    def drain(self) -> list[Expired]:
        """Hand over the buffered ``cause="ttl"`` reports."""
        return self._timers.drain()

    def finished(self, now: float, runtime: float, model: str | None, level: int) -> None:
        """Remember a finished job's runtime (the forecasts and the expected charge)."""
        self._runtimes.add(now, runtime, model, level)

    # ------------------------------------------------------------------ restore

    def restore_report(self, expired: Expired) -> None:
        """A snapshot's buffered ttl report."""
        self._timers.report(expired)

    def restore_runtimes(
        self, models: dict[str, deque[float]], levels: dict[int, deque[float]]
    ) -> None:
        """A snapshot's recent runtimes per model and per level."""
        self._runtimes.restore(models, levels)

    # ------------------------------------------------------------------ admission

    def refusal(
        self,
        specs: Sequence[JobSpec],
        t: float,
        queue: Queue,
    ) -> Refusal | None:
        """The first of ``specs`` that submitting them one by one at ``t`` would refuse: a read.

        The one admission rule of a submit, for one job (``submit``) and for a batch
        (``FleetDispatcher.admit``): each job is checked in order as if the jobs before it had
        been queued (delayed ones count where a delayed job counts), against ``max_queued``,
        its level's ``LevelBudget`` (``max_queued``, then ``max_wait`` for a job eligible at
        ``t``) and ``max_queued_per_member``. ``queue``: the core (its queued count, levels,
        members and live workers), read only when a limit is set. Nothing changes, not even
        the refusal counter (``submit`` counts its own refusals).

        Returns:
            None when every job would be queued, else the first refused job's index and error.

        Complexity: O(b x levels) for b jobs with a ``max_wait``, else O(b).
        """
        limit = self._max_queued
        cap = self._max_member
        budgets = self._budgets
        if limit is None and cap is None and not budgets:  # no limit: the common case
            return None
        queued = len(queue)
        levels = queue.lanes.levels
        members = queue.lanes.members
        live = queue.workers.live
        last = len(specs) - 1
        held: dict[int, int] = {}  # the batch's jobs so far per level, delayed or not
        ready: dict[int, int] = {}  # those eligible at t, per level (what a forecast counts)
        batch: dict[str, int] = {}  # those eligible at t, per member (its ``queued``)
        for index, spec in enumerate(specs):
            if limit is not None and queued + index >= limit:
                error: QueueFull = QueueFull(
                    f"the queue holds {queued + index} jobs, its limit (max_queued={limit})",
                    retry_after=self._runtimes.retry_after(),
                    limit=limit,
                    scope="queue",
                )
                return Refusal(index, error)
            level = spec.level
            not_before = spec.not_before
            delayed = not_before is not None and not_before > t
            budget = budgets.get(level) if budgets else None
            if budget is not None:
                over = self._over_budget(
                    budget, level, delayed, held.get(level, 0), ready, levels, live
                )
                if over is not None:
                    return Refusal(index, over)
            member = spec.member
            if cap is not None:
                stats = members.get(member)
                count = (0 if stats is None else stats.queued) + batch.get(member, 0)
                if count >= cap:
                    error = QueueFull(
                        f"member {member!r} has {count} jobs queued, its limit "
                        f"(max_queued_per_member={cap})",
                        retry_after=self._runtimes.retry_after(),
                        limit=cap,
                        scope="member",
                    )
                    return Refusal(index, error)
            if index == last:
                break
            held[level] = held.get(level, 0) + 1
            if not delayed:
                ready[level] = ready.get(level, 0) + 1
                batch[member] = batch.get(member, 0) + 1
        return None

    def _over_budget(
        self,
        budget: LevelBudget,
        level: int,
        delayed: bool,
        held: int,
        ready: Mapping[int, int],
        levels: Mapping[int, Level],
        live: int,
    ) -> QueueFull | None:
        """A level's ``LevelBudget`` refusal of one more job (``held``/``ready``: a batch's)."""
        if budget.max_queued is not None:
            stats = levels.get(level)
            parked = self._timers.parked.get(level, 0)
            queued = (0 if stats is None else stats.queued) + parked + held
            if queued >= budget.max_queued:
                return QueueFull(
                    f"level {level} holds {queued} queued or delayed jobs, its limit "
                    f"(max_queued={budget.max_queued})",
                    retry_after=self._runtimes.retry_after(),
                    limit=budget.max_queued,
                    scope="level",
                )
        if budget.max_wait is not None and not delayed:
            wait = self.forecast_wait(levels, live, level, ready)
            if wait > budget.max_wait:
                return Overloaded(
                    f"level {level}: the forecast wait is {wait:.0f} s, over its budget "
                    f"(max_wait={budget.max_wait:g} s); the job was not queued",
                    retry_after=float(max(1, math.ceil(wait - budget.max_wait))),
                    forecast_wait=wait,
                    max_wait=budget.max_wait,
                    level=level,
                )
        return None

    def forecast_wait(
        self,
        levels: Mapping[int, Level],
        live: int,
        level: int,
        more: Mapping[int, int] | None = None,
    ) -> float:
        """The forecast wait of a job submitted now at ``level``: O(levels).

        The queued jobs at its level and above, each at the recent mean runtime of its level
        (60 s when none is known), over the fleet's capacity (``live`` workers;
        docs/design/lifecycle.md). ``more``: jobs per level not queued yet (a batch's earlier
        jobs), counted as if they were: the sum is the one the state would give once they are.
        """
        numbers = levels.keys() | more.keys() if more else levels
        ahead = 0.0
        for number in sorted(numbers, reverse=True):  # a fixed order: the same sum on replay
            if number < level:
                break
            stats = levels.get(number)
            count = (0 if stats is None else stats.queued) + (more.get(number, 0) if more else 0)
            if count:
                ahead += count * self._runtimes.level_mean(number)
        return ahead / max(1, live)

    # ------------------------------------------------------------------ invariant

    def check(self, parked: list[_Entry], queued: list[_Entry]) -> None:
        """Assert the owner's invariant against the delayed and queued entries (tests; O(n))."""
        self._timers.check(parked, queued)
