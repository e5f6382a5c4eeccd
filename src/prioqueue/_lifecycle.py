"""Deadlines, delays and retries inside the dispatcher: the timers (private).

Theory of operation (the model is docs/design/lifecycle.md):

* A **delayed** job (``submit(not_before=r)`` with ``r > now``, or a retry waiting out its
  backoff) is an ``_Entry`` in state ``PARKED``: in ``_entries`` (so it is known, counted in
  ``len`` and reported ``"queued"``) but in no lane, so no ranking can offer it.
* **Timers** are ``(time, kind, seq, n, entry)`` items of one heap: a ``LAPSE`` at a job's
  deadline (one per queued or parked entry of a job with a ttl) and a ``RELEASE`` at a parked
  entry's release time. An item whose entry has moved on is stale and skipped.
* ``fire(d, t)`` runs every timer due at ``t`` in order, each *at its own time*: a release
  enqueues exactly as a submit at that time would; a lapse takes the job out and buffers its
  ``Expired(cause="ttl")`` for the next ``expire``. The core calls it from ``_tick``, so the
  first call at or past a timer fires it before doing anything else: expiry wins a tie with a
  grant, and where a timer fires never changes the state it leaves.

Costs: a timer is pushed and popped once, O(log T) for T pending timers; the fast path of a
call with no due timer is one comparison.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush
from typing import TYPE_CHECKING

from prioqueue._errors import Overloaded, QueueFull
from prioqueue._lanes import GONE, QUEUED, _Entry
from prioqueue.records import Expired, Job

if TYPE_CHECKING:
    from prioqueue._core import _Core

__all__: list[str] = []  # private module

#: The entry state of a delayed job (``_lanes`` has QUEUED 0, RUNNING 1, GONE 2).
PARKED = 3

LAPSE = 0  # before RELEASE at the same time: a job that expires at r never enters at r
RELEASE = 1


def push(d: _Core, at: float, kind: int, entry: _Entry) -> None:
    """Add a timer. O(log T)."""
    d._timer_count += 1
    heappush(d._timers, (at, kind, entry.job.seq, d._timer_count, entry))
    d._next_timer = min(d._next_timer, at)


def park(d: _Core, job: Job, attempt: int, release_at: float) -> _Entry:
    """File a delayed job: known and ``"queued"``, in no lane until ``release_at``. O(log T)."""
    entry = _Entry(job, None, attempt, release_at, d._dispatches)  # type: ignore[arg-type]
    entry.state = PARKED
    d._entries[job.id] = entry
    d._level(job.priority)  # a level is known from its first job on, delayed or not
    d._parked[job.priority] = d._parked.get(job.priority, 0) + 1
    push(d, release_at, RELEASE, entry)
    if job.deadline is not None:
        push(d, job.deadline, LAPSE, entry)
    return entry


def unpark(d: _Core, entry: _Entry) -> None:
    """Take a parked entry out (released, lapsed, cancelled or failed). O(1)."""
    entry.state = GONE
    del d._entries[entry.job.id]
    level = entry.job.priority
    left = d._parked[level] - 1
    if left:
        d._parked[level] = left
    else:
        del d._parked[level]


def fire(d: _Core, t: float) -> None:
    """Run every timer due at ``t``, in order, each at its own time (see the module doc)."""
    timers = d._timers
    while timers and timers[0][0] <= t:
        at, kind, _, _, entry = heappop(timers)
        d._now = max(d._now, at)
        if kind == LAPSE:
            if entry.state == QUEUED:
                lapse(d, entry, at)
            elif entry.state == PARKED:
                unpark(d, entry)
                lapsed(d, entry, at)
        elif entry.state == PARKED:
            unpark(d, entry)
            released = d._enqueue(entry.job, attempt=entry.attempt, now=at, requeue=False)
            released.queued_at = at  # a retry's warm hold counts from its release
    d._next_timer = timers[0][0] if timers else math.inf


def lapse(d: _Core, entry: _Entry, at: float) -> None:
    """A queued entry's deadline passed: it leaves its lane as expired."""
    job = entry.job
    entry.state = GONE
    del d._entries[job.id]
    d._dequeue(entry)
    lane = entry.lane
    if not d._fair_share and not lane.live and not lane.holding:
        del d._lanes[job.id]
    lapsed(d, entry, at)


def lapsed(d: _Core, entry: _Entry, at: float) -> None:
    """Count an expired job and buffer its report for ``expire``."""
    job = entry.job
    d._groups.move(job.id, "failed")
    d._totals["ttl_expired"] += 1
    counts = d._level_life.setdefault(job.priority, [0, 0])
    counts[0] += 1
    deadline = job.deadline if job.deadline is not None else at
    d._lapsed.append(
        Expired(job=job, attempt=entry.attempt, deadline=deadline, requeued=False, cause="ttl")
    )


def next_timer(d: _Core) -> float | None:
    """The earliest live timer (stale items at the top are dropped), or None. Amortised O(log T)."""
    best = min((e.deadline for e in d._lapsed), default=None)  # due now: expire reports them
    timers = d._timers
    while timers:
        at, kind, _, _, entry = timers[0]
        if entry.state == PARKED or (kind == LAPSE and entry.state == QUEUED):
            # (a job requeued past its deadline has a timer earlier than the buffered ones)
            return at if best is None or at < best else best
        heappop(timers)
    d._next_timer = math.inf
    return best


def check_budget(d: _Core, level: int, delayed: bool) -> None:
    """Refuse a submit at ``level`` over its ``LevelBudget`` (nothing changes but a counter).

    Raises:
        QueueFull: ``max_queued`` (scope ``"level"``).
        Overloaded: the forecast wait is over ``max_wait``.
    """
    budget = d._budgets.get(level)
    if budget is None:
        return
    if budget.max_queued is not None:
        stats = d._levels.get(level)
        queued = (0 if stats is None else stats.queued) + d._parked.get(level, 0)
        if queued >= budget.max_queued:
            refused(d, level)
            raise QueueFull(
                f"level {level} holds {queued} queued or delayed jobs, its limit "
                f"(max_queued={budget.max_queued})",
                retry_after=d._retry_after(),
                limit=budget.max_queued,
                scope="level",
            )
    if budget.max_wait is not None and not delayed:
        wait = forecast_wait(d, level)
        if wait > budget.max_wait:
            refused(d, level)
            raise Overloaded(
                f"level {level}: the forecast wait is {wait:.0f} s, over its budget "
                f"(max_wait={budget.max_wait:g} s); the job was not queued",
                retry_after=float(max(1, math.ceil(wait - budget.max_wait))),
                forecast_wait=wait,
                max_wait=budget.max_wait,
                level=level,
            )


def refused(d: _Core, level: int) -> None:
    d._totals["refused"] += 1
    d._level_life.setdefault(level, [0, 0])[1] += 1


def forecast_wait(d: _Core, level: int) -> float:
    """The forecast wait of a job submitted now at ``level``: O(levels).

    The queued jobs at its level and above, each at the recent mean runtime of its level (60 s
    when none is known), over the fleet's capacity (docs/design/lifecycle.md).
    """
    from prioqueue._core import DEFAULT_EXPECTED_RUNTIME

    ahead = 0.0
    for number in sorted(d._levels, reverse=True):  # a fixed order: the same sum on replay
        stats = d._levels[number]
        if number >= level and stats.queued:
            recent = d._recent_level.get(number)
            mean = sum(recent) / len(recent) if recent else DEFAULT_EXPECTED_RUNTIME
            ahead += stats.queued * mean
    return ahead / max(1, d._live)
