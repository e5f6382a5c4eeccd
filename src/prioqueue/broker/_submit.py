"""The broker's submits: one job, or a batch checked whole before any job is queued (private).

Functions over :class:`~prioqueue.broker._state.EngineState`, called by the journaled
``submit`` and ``submit_many`` of :class:`~prioqueue.broker.engine.BrokerEngine`. A submit
is refused (:class:`~prioqueue.broker._records.Rejected`) before anything changes; a batch is
checked for every refusal a submit could make, so it is queued whole or not at all.
Complexity: the fleet's O(log n + M) per job, plus O(size of the arguments).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from prioqueue._core import DEFAULT_EXPECTED_RUNTIME
from prioqueue._core.facade import state_of
from prioqueue._core.queue import forecast_wait
from prioqueue._errors import ConfigError, DuplicateJob, Overloaded, QueueFull
from prioqueue.broker import _groups
from prioqueue.broker._budget import size_of
from prioqueue.broker._fleet import group_key
from prioqueue.broker._records import JobRecord, Rejected, check_types, submit_digest
from prioqueue.broker._state import EngineState
from prioqueue.lifecycle import Backoff

__all__ = ["check_batch", "submit"]


def submit(
    state: EngineState,
    now: float,
    *,
    member: str,
    tier: str,
    priority: int,
    model: str | None = None,
    estimate: float | None = None,
    group: str | None = None,
    image: dict[str, Any] | None = None,
    payload: Any = None,
    idempotency_key: str | None = None,
    ttl: float | None = None,
    not_before: float | None = None,
    max_attempts: int | None = None,
    backoff: dict[str, Any] | None = None,
) -> tuple[JobRecord, bool]:
    """``BrokerEngine.submit``: queue a job, or return the one its idempotency key names."""
    check_types(
        "submit",
        member=(member, str), tier=(tier, str), priority=(priority, int),
        model=(model, (str, type(None))), estimate=(estimate, (int, float, type(None))),
        group=(group, (str, type(None))), image=(image, (dict, type(None))),
        idempotency_key=(idempotency_key, (str, type(None))),
    )  # fmt: skip
    digest = ""
    if idempotency_key is not None:
        digest = submit_digest(
            {"priority": priority, "model": model, "estimate": estimate, "group": group,
             "image": image, "payload": payload, "ttl": ttl, "not_before": not_before,
             "max_attempts": max_attempts, "backoff": backoff}
        )  # fmt: skip
        known = _known(state, member, idempotency_key, digest)
        if known is not None:
            return known, False
    size = size_of(payload, image)
    state.queued_bytes.admit(state.config, member, size)
    job_id = f"job-{state.counter + 1}"
    ticket = _queue(
        state, job_id, now, member=member, priority=priority, tier=tier, model=model,
        estimate=estimate, image=image, group=group, ttl=ttl, not_before=not_before,
        max_attempts=max_attempts, backoff=backoff,
    )  # fmt: skip
    state.counter += 1
    state.counts["submitted"] += 1
    record = JobRecord(
        id=job_id, member=member, priority=priority, model=model, estimate=estimate,
        group=group, image=image, payload=payload, submitted_at=now,
        idempotency_key=idempotency_key, expires_at=ticket.job.deadline,
        max_attempts=max_attempts,
    )  # fmt: skip
    state.jobs[job_id] = record
    _groups.kept(state, record)
    state.queued_bytes.held(record, size)
    if idempotency_key is not None:
        state.idempotency[(member, idempotency_key)] = (job_id, digest)
    state._note_queued(record)
    return attrs.evolve(record), True


def _known(state: EngineState, member: str, key: str, digest: str) -> JobRecord | None:
    """A copy of the job ``member``'s ``key`` already names, or None (422: another body)."""
    known = state.idempotency.get((member, key))
    if known is None:
        return None
    job_id, previous = known
    if previous != digest:
        raise Rejected(
            422,
            "Idempotency-Key was already used with a different request body",
            field="Idempotency-Key",
        )
    return attrs.evolve(state.jobs[job_id])


def _queue(
    state: EngineState,
    job_id: str,
    now: float,
    *,
    member: str,
    priority: int,
    group: str | None,
    image: dict[str, Any] | None,
    backoff: dict[str, Any] | None,
    **options: Any,
) -> Any:
    """Submit to the fleet; its refusals become :class:`Rejected` (422, 429, 503)."""
    try:
        retry = None if backoff is None else Backoff.from_mapping(backoff)
    except ConfigError as exc:
        raise Rejected(422, str(exc), field="backoff") from None
    try:
        return state.fleet.submit(
            job_id,
            member=member,
            priority=priority,
            payload={"image": image},
            group=None if group is None else group_key(member, group),
            ceiling=priority,  # resolved under the key's ceiling: kept below the minimum
            now=now,
            backoff=retry,
            **options,
        )
    except Overloaded as exc:
        raise Rejected(503, str(exc), field="max_wait", retry_after=exc.retry_after) from None
    except QueueFull as exc:
        field = "max_queued" if exc.scope == "level" else None
        raise Rejected(429, str(exc), field=field, retry_after=exc.retry_after) from None
    except DuplicateJob as exc:  # pragma: no cover - ids are never reused
        raise AssertionError(str(exc)) from None


def check_batch(state: EngineState, now: float, jobs: list[dict[str, Any]]) -> None:
    """Refuse a batch (``submit_many``) that any of its submits would refuse.

    Raises:
        Rejected: 422 an empty batch, a reused key or a bad ``backoff``; 429 the batch does
            not fit; 503 a level's forecast wait would pass its ``max_wait``.
    """
    if not jobs:
        raise Rejected(422, "jobs: a batch holds at least one job", field="jobs")
    fresh: dict[str, int] = {}
    new: list[dict[str, Any]] = []
    for args in jobs:
        key = args.get("idempotency_key")
        member = args["member"]
        if key is not None and (member, key) in state.idempotency:
            if state.idempotency[(member, key)][1] != submit_digest(args):
                raise Rejected(
                    422,
                    "Idempotency-Key was already used with a different request body",
                    field="Idempotency-Key",
                )
            continue
        fresh[member] = fresh.get(member, 0) + 1
        if args.get("backoff") is not None:
            try:
                Backoff.from_mapping(args["backoff"])
            except ConfigError as exc:
                raise Rejected(422, str(exc), field="backoff") from None
        new.append(args)
    _check_room(state, fresh)
    _check_budgets(state, new, now)


def _check_budgets(state: EngineState, jobs: list[dict[str, Any]], now: float) -> None:
    """Refuse a batch that a level's budget would refuse half way.

    The core's checks (``max_queued``, ``max_wait``), run over the batch in order without
    changing anything.

    Raises:
        Rejected: 429 a level's ``max_queued``; 503 a level's forecast wait over
            ``max_wait``.

    Complexity: O(b x levels) for b new jobs.
    """
    core = state.fleet
    read = state_of(core)
    budgets = read.budgets
    if not budgets:
        return
    added: dict[int, int] = {}  # queued (not delayed) jobs of the batch so far, per level
    held: dict[int, int] = {}  # queued or delayed, per level
    for args in jobs:
        level = int(core.policy.parse(args["priority"]))
        budget = budgets.get(level)
        not_before = args.get("not_before")
        delayed = not_before is not None and not_before > now
        if budget is not None and budget.max_queued is not None:
            stats = read.levels.get(level)
            queued = (0 if stats is None else stats.queued) + read.timers.parked.get(level, 0)
            if queued + held.get(level, 0) >= budget.max_queued:
                raise Rejected(
                    429,
                    f"the batch does not fit level {level}: it holds {queued} queued or "
                    f"delayed jobs, its limit max_queued={budget.max_queued}",
                    field="max_queued",
                    retry_after=read.retry_after(),
                )
        if budget is not None and budget.max_wait is not None and not delayed:
            extra = 0.0
            for number, count in added.items():
                if number >= level:
                    recent = read.recent_level.get(number)
                    mean = sum(recent) / len(recent) if recent else DEFAULT_EXPECTED_RUNTIME
                    extra += count * mean
            wait = forecast_wait(read, level) + extra / max(1, read.live)
            if wait > budget.max_wait:
                raise Rejected(
                    503,
                    f"the batch does not fit level {level}: the forecast wait would be "
                    f"{wait:.0f} s, over its budget (max_wait={budget.max_wait:g} s)",
                    field="max_wait",
                    retry_after=float(max(1, math.ceil(wait - budget.max_wait))),
                )
        held[level] = held.get(level, 0) + 1
        if not delayed:
            added[level] = added.get(level, 0) + 1


def _check_room(state: EngineState, fresh: Mapping[str, int]) -> None:
    """Refuse (429) a batch that ``max_queued`` or ``max_queued_per_member`` cannot hold."""
    total = sum(fresh.values())
    limit = state.config.max_queued
    if limit is not None and len(state.fleet) + total > limit:
        raise Rejected(
            429,
            f"the batch of {total} new jobs does not fit: the queue holds "
            f"{len(state.fleet)} jobs, its limit max_queued={limit}",
            retry_after=state.config.retry_after_seconds,
        )
    per_member = state.config.max_queued_per_member
    if per_member is None:
        return
    for member, count in fresh.items():
        stats = state_of(state.fleet).members.get(member)  # the core's per-member counts
        queued = 0 if stats is None else int(stats.queued)
        if queued + count > per_member:
            raise Rejected(
                429,
                f"the batch of {count} new jobs of member {member!r} does not fit: it has "
                f"{queued} queued, its limit max_queued_per_member={per_member}",
                retry_after=state.config.retry_after_seconds,
            )
