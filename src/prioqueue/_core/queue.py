"""The queue side's transitions: submit, and the lifecycle's timers and budgets (private).

Theory of operation (the model is docs/design/lifecycle.md):

* ``submit`` files a validated ``JobSpec``: refused (``QueueFull``, ``Overloaded``) before
  anything changes, then queued in its lane (``State.enqueue``) or, with a future
  ``not_before``, delayed (``State.park``: known and ``"queued"``, in no lane).
* ``fire`` runs every timer due at ``t`` in order, each *at its own time*: a release enqueues
  exactly as a submit at that time would; a lapse takes the job out and buffers its
  ``Expired(cause="ttl")`` for the next ``expire``. Every call taking ``now`` fires first, so
  expiry wins a tie with a grant, and where a timer fires never changes the state it leaves.
* ``check_budget`` applies a level's ``LevelBudget`` (``max_queued``, ``max_wait`` from
  ``forecast_wait``).

Costs: a timer is pushed and popped once, O(log T); a call with no due timer pays one
comparison.
"""

from __future__ import annotations

import math

from prioqueue._core.config import DEFAULT_EXPECTED_RUNTIME
from prioqueue._core.items import LAPSE, PARKED
from prioqueue._core.state import State
from prioqueue._errors import DuplicateJob, Overloaded, QueueFull
from prioqueue._lanes import QUEUED, RUNNING, _Entry
from prioqueue._spec import JobSpec
from prioqueue._validate import TIME_LIMIT
from prioqueue.records import Job, Ticket

__all__: list[str] = []  # private module


def fire(d: State, now: object) -> None:
    """Fire the lifecycle's timers due at ``now`` (see the module doc).

    The first thing every call taking ``now`` does, before any check but ``now``'s own (a
    bad ``now`` fires nothing): where a timer fires never depends on what the call then
    does. O(1) when nothing is due.
    """
    if (
        (now.__class__ is float or now.__class__ is int)
        and d.timers.next <= now <= TIME_LIMIT  # type: ignore[operator,unused-ignore]
        and now >= d.now  # type: ignore[operator,unused-ignore]
    ):
        fire_due(d, float(now))  # type: ignore[arg-type,unused-ignore]


def fire_due(d: State, t: float) -> None:
    """Run every timer due at ``t``, in order, each at its own time."""
    timers = d.timers
    while (timer := timers.due(t)) is not None:
        at, kind, _, _, entry = timer
        d.now = max(d.now, at)
        if kind == LAPSE:
            if entry.state == QUEUED:
                d.drop_queued(entry)
                d.lapsed(entry, at)
            elif entry.state == PARKED:
                d.unpark(entry)
                d.lapsed(entry, at)
        elif entry.state == PARKED:
            d.unpark(entry)
            released = d.enqueue(entry.job, attempt=entry.attempt, now=at, requeue=False)
            released.queued_at = at  # a retry's warm hold counts from its release


def submit(d: State, job_id: str, spec: JobSpec, now: float) -> Ticket:
    """File a validated job (``FleetDispatcher.submit``'s body, after ``fire``)."""
    t = d.tick(now)
    if job_id in d.entries:
        state = "running" if d.entries[job_id].state == RUNNING else "queued"
        raise DuplicateJob(f"job {job_id!r} is already {state}")
    queued = len(d)
    limit = d.config.max_queued
    if limit is not None and queued >= limit:
        raise QueueFull(
            f"the queue holds {queued} jobs, its limit (max_queued={limit})",
            retry_after=d.retry_after(),
            limit=limit,
            scope="queue",
        )
    not_before = spec.not_before
    delayed = not_before is not None and not_before > t
    ttl = spec.ttl
    if d.budgets:
        budget = d.budgets.get(spec.level)
        if budget is not None:
            check_budget(d, spec.level, delayed)
            if ttl is None:
                ttl = budget.ttl
    member = spec.member
    member_stats = d.member(member)
    cap = d.config.max_member
    if cap is not None and member_stats.queued >= cap:
        raise QueueFull(
            f"member {member!r} has {member_stats.queued} jobs queued, its limit "
            f"(max_queued_per_member={cap})",
            retry_after=d.retry_after(),
            limit=cap,
            scope="member",
        )
    eligible = not_before if delayed and not_before is not None else t
    d.seq += 1
    # Positional on purpose (the hot path; keywords cost about 20 % of the construction), in
    # Job's field order: id, member, priority, tier, tier_bonus, model, estimate, arrival,
    # seq, payload, deadline, not_before, max_attempts, backoff, needs.
    job = Job(
        job_id, member, spec.level, spec.tier, spec.tier_bonus, spec.model, spec.estimate,
        eligible, d.seq, spec.payload, None if ttl is None else eligible + ttl,
        not_before if delayed else None, spec.max_attempts, spec.backoff, spec.needs,
    )  # fmt: skip
    if delayed:
        d.park(job, 1, eligible)
    else:
        d.enqueue(job, attempt=1, now=t, requeue=False)
    if spec.group is not None:
        d.groups.add(job_id, spec.group, member)
    return Ticket(job=job, queued=queued + 1)


def remove_waiting(d: State, entry: _Entry) -> None:
    """A queued or delayed job leaves for good (cancelled or failed before any grant)."""
    if entry.state == PARKED:
        d.unpark(entry)
    else:
        d.drop_queued(entry)


def check_budget(d: State, level: int, delayed: bool) -> None:
    """Refuse a submit at ``level`` over its ``LevelBudget`` (nothing changes but a counter).

    Raises:
        QueueFull: ``max_queued`` (scope ``"level"``).
        Overloaded: the forecast wait is over ``max_wait``.
    """
    budget = d.budgets.get(level)
    if budget is None:
        return
    if budget.max_queued is not None:
        stats = d.levels.get(level)
        queued = (0 if stats is None else stats.queued) + d.timers.parked.get(level, 0)
        if queued >= budget.max_queued:
            d.refused(level)
            raise QueueFull(
                f"level {level} holds {queued} queued or delayed jobs, its limit "
                f"(max_queued={budget.max_queued})",
                retry_after=d.retry_after(),
                limit=budget.max_queued,
                scope="level",
            )
    if budget.max_wait is not None and not delayed:
        wait = forecast_wait(d, level)
        if wait > budget.max_wait:
            d.refused(level)
            raise Overloaded(
                f"level {level}: the forecast wait is {wait:.0f} s, over its budget "
                f"(max_wait={budget.max_wait:g} s); the job was not queued",
                retry_after=float(max(1, math.ceil(wait - budget.max_wait))),
                forecast_wait=wait,
                max_wait=budget.max_wait,
                level=level,
            )


def forecast_wait(d: State, level: int) -> float:
    """The forecast wait of a job submitted now at ``level``: O(levels).

    The queued jobs at its level and above, each at the recent mean runtime of its level (60 s
    when none is known), over the fleet's capacity (docs/design/lifecycle.md).
    """
    ahead = 0.0
    for number in sorted(d.levels, reverse=True):  # a fixed order: the same sum on replay
        stats = d.levels[number]
        if number >= level and stats.queued:
            recent = d.recent_level.get(number)
            mean = sum(recent) / len(recent) if recent else DEFAULT_EXPECTED_RUNTIME
            ahead += stats.queued * mean
    return ahead / max(1, d.live)
