"""The queue side's transitions: submit, and the lifecycle's timers and budgets (private).

Theory of operation (the model is docs/design/lifecycle.md):

* ``submit`` files a validated ``JobSpec``: refused (``QueueFull``, ``Overloaded``) before
  anything changes, then queued in its lane (``Core.enqueue``) or, with a future
  ``not_before``, delayed (``Core.park``: known and ``"queued"``, in no lane).
* ``fire`` runs every timer due at ``t`` in order, each *at its own time*: a release enqueues
  exactly as a submit at that time would; a lapse takes the job out and buffers its
  ``Expired(cause="ttl")`` for the next ``expire``. Every call taking ``now`` fires first, so
  expiry wins a tie with a grant, and where a timer fires never changes the state it leaves.
* ``refusal`` is the one admission rule (``Lifecycle.refusal``: ``max_queued``, a level's
  ``LevelBudget``: ``max_queued`` and ``max_wait`` from ``forecast_wait``,
  ``max_queued_per_member``), for one job and for a batch: ``submit`` and
  ``FleetDispatcher.admit`` both call it.

Costs: a timer is pushed and popped once, O(log T); a call with no due timer pays one
comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prioqueue._core.core import Core
from prioqueue._core.items import LAPSE
from prioqueue._lanes import PARKED, QUEUED, RUNNING, _Entry
from prioqueue._spec import JobSpec, check_options
from prioqueue._validate import TIME_LIMIT
from prioqueue.errors import DuplicateJob
from prioqueue.records import Job, Refusal, Ticket

__all__: list[str] = []  # private module


def fire(d: Core, now: object) -> None:
    """Fire the lifecycle's timers due at ``now`` (see the module doc).

    The first thing every call taking ``now`` does, before any check but ``now``'s own (a
    bad ``now`` fires nothing): where a timer fires never depends on what the call then
    does. O(1) when nothing is due.
    """
    if (
        (now.__class__ is float or now.__class__ is int)
        and d.lifecycle.timers.next <= now <= TIME_LIMIT  # type: ignore[operator,unused-ignore]
        and now >= d.now  # type: ignore[operator,unused-ignore]
    ):
        fire_due(d, float(now))  # type: ignore[arg-type,unused-ignore]


def fire_due(d: Core, t: float) -> None:
    """Run every timer due at ``t``, in order, each at its own time."""
    lifecycle = d.lifecycle
    while (timer := lifecycle.due(t)) is not None:
        at, kind, _, _, entry = timer
        d.advance(at)
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
            released.requeued(at)  # a retry's warm hold counts from its release


def submit(d: Core, job_id: str, spec: JobSpec, now: float) -> Ticket:
    """File a validated job (``FleetDispatcher.submit``'s body, after ``fire``)."""
    t = d.tick(now)
    if job_id in d.entries:
        state = "running" if d.entries[job_id].state == RUNNING else "queued"
        raise DuplicateJob(f"job {job_id!r} is already {state}")
    not_before = spec.not_before
    delayed = not_before is not None and not_before > t
    refused = refusal(d, (spec,), t) if d.limited else None  # no call without a limit
    if refused is not None:
        if refused.error.scope in ("level", "wait"):
            d.refused(spec.level)
        raise refused.error
    ttl = d.lifecycle.ttl(spec.level, spec.ttl) if d.limited else spec.ttl
    queued = len(d)
    member = spec.member
    d.lanes.member(member)  # a member is known from its first submit (a delayed one included)
    eligible = not_before if delayed and not_before is not None else t
    # Positional on purpose (the hot path; keywords cost about 20 % of the construction), in
    # Job's field order: id, member, priority, tier, tier_bonus, model, estimate, arrival,
    # seq, payload, deadline, not_before, max_attempts, backoff, needs.
    job = Job(
        job_id, member, spec.level, spec.tier, spec.tier_bonus, spec.model, spec.estimate,
        eligible, d.next_seq(), spec.payload, None if ttl is None else eligible + ttl,
        not_before if delayed else None, spec.max_attempts, spec.backoff, spec.needs,
    )  # fmt: skip
    if delayed:
        d.park(job, 1, eligible)
    else:
        d.enqueue(job, attempt=1, now=t, requeue=False)
    if spec.group is not None:
        d.groups.add(job_id, spec.group, member)
    return Ticket(job=job, queued=queued + 1)


def remove_waiting(d: Core, entry: _Entry) -> None:
    """A queued or delayed job leaves for good (cancelled or failed before any grant)."""
    if entry.state == PARKED:
        d.unpark(entry)
    else:
        d.drop_queued(entry)


def admit(d: Core, jobs: Sequence[Mapping[str, Any]], now: object) -> Refusal | None:
    """``Facade.admit``: fire due timers, validate each job as ``submit`` does, ``refusal``.

    Firing changes nothing a later call would not (a timer fires at its own time, wherever it
    fires), so the answer is exact: the jobs, submitted one by one now, meet this state.
    """
    fire(d, now)
    t = d.tick(now)
    specs = []
    for index, job in enumerate(jobs):
        options = dict(job)
        member = options.pop("member", None)
        try:
            check_options(options, call="admit()", named="member")
            specs.append(JobSpec.checked(d.config.policy, d.config.scorer, "-", member, **options))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"jobs[{index}]: {exc}") from None
    return refusal(d, specs, t)


def refusal(d: Core, specs: Sequence[JobSpec], t: float) -> Refusal | None:
    """The first of ``specs`` that submitting them one by one at ``t`` would refuse: a read.

    ``Lifecycle.refusal`` over this core's counts (see there). O(b x levels) for b jobs.
    """
    return d.lifecycle.refusal(specs, t, d)
