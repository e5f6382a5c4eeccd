"""The broker's worker operations: pops, grants, reports, liveness and leaving (private).

Functions over the engine's parts (:class:`~prioqueue.broker._state.EngineParts`), called by
the journaled methods of :class:`~prioqueue.broker.engine.BrokerEngine` (which keep time and
count the operation); they change the workers through the
:class:`~prioqueue.broker.workerbook.WorkerBook` and the records through the
:class:`~prioqueue.broker.jobbook.JobBook`. Each refuses
(:class:`~prioqueue.broker.records.Rejected`) before it changes anything. Complexity: the fleet
dispatcher's O(log n + M) per call, plus O(size of a result) to measure it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from prioqueue._batch import MAX_AMOUNT
from prioqueue.broker import _groups
from prioqueue.broker._state import EngineParts
from prioqueue.broker.records import JobRecord, PopResult, Rejected, check_types, now_past
from prioqueue.broker.workerbook import WorkerSettings
from prioqueue.capabilities import Capabilities
from prioqueue.errors import InvalidState, UnknownWorker
from prioqueue.views import WorkerLoad

__all__ = [
    "checked_amount",
    "complete",
    "fail",
    "forget_silent",
    "fresh_worker",
    "heartbeat",
    "leave",
    "liveness_due",
    "pop",
    "quiet_pop",
    "refresh",
    "release",
    "slots_full",
    "tick",
    "would_grant",
]


def join(state: EngineParts, now: float, worker: str, settings: WorkerSettings) -> None:
    """The worker joins the fleet with ``settings``, or (unchanged) says it is alive. O(log n)."""
    if state.workers.get(worker) != settings:
        state.fleet.join(worker, now=now, **settings.join_args())
        state.workers.join(worker, settings)
    else:
        state.fleet.heartbeat(worker, now=now)


def granted(state: EngineParts, worker: str, grant: Any, now: float) -> JobRecord:
    """Record the fleet's grant on the job's record; returns a copy of the record."""
    job = grant.job  # a job that accepts several models: its model is the one chosen
    record = state.jobs.grant(job.id, worker, grant.attempt, job.model, grant.lease, now)
    return attrs.evolve(record)


def _grants(state: EngineParts, worker: str, amount: int, now: float) -> list[Any]:
    """The fleet's grants for one pop: ``amount > 1`` adds the first job's siblings."""
    if amount == 1:
        grant = state.fleet.pop(worker, now=now)
        return [] if grant is None else [grant]
    return list(state.fleet.pop_many(worker, amount=amount, now=now, siblings=True))


def _result(state: EngineParts, worker: str, grants: list[Any], now: float) -> PopResult:
    first, *more = (granted(state, worker, grant, now) for grant in grants)
    return PopResult(first, {}, tuple(more))


def checked_amount(amount: object) -> int:
    """A pop's ``amount``; Rejected 422 unless an int in ``1..100``."""
    if not isinstance(amount, int) or isinstance(amount, bool) or not 1 <= amount <= MAX_AMOUNT:
        raise Rejected(422, f"amount must be an int in 1..{MAX_AMOUNT}, got {amount!r}",
                       field="amount")  # fmt: skip
    return amount


def pop(
    state: EngineParts, now: float, worker: str, spec: dict[str, Any], amount: int = 1
) -> PopResult:
    """``BrokerEngine.pop``: join or refresh the worker, then grant it its next job(s)."""
    check_types(
        "pop", worker=(worker, str), models=(spec["models"], (list, type(None))),
        resident=(spec["resident"], (str, type(None))), slots=(spec["slots"], int),
        slow=(spec["slow"], (bool,)), capabilities=(spec["capabilities"], (dict, type(None))),
    )  # fmt: skip
    if spec["capabilities"] is not None:
        try:
            Capabilities.from_mapping(spec["capabilities"])
        except ValueError as exc:
            raise Rejected(422, f"capabilities: {exc}", field="capabilities") from None
    checked_amount(amount)
    join(state, now, worker, WorkerSettings.from_mapping(spec))
    state.workers.touch(worker, now)
    grants = _grants(state, worker, amount, now)
    if not grants:
        reasons = state.fleet.idle_reasons(worker, now=now)
        return PopResult(None, {str(k): int(v) for k, v in reasons.items() if v})
    return _result(state, worker, grants, now)


def _known(state: EngineParts, worker: str) -> WorkerLoad | None:
    """The fleet's ``worker_load`` of ``worker`` (a copy), or None when it has not joined. O(1)."""
    try:
        load: WorkerLoad = state.fleet.worker_load(worker)
    except UnknownWorker:
        return None
    return load


def fresh_worker(
    state: EngineParts, worker: str, spec: Mapping[str, Any], now: float
) -> WorkerLoad | None:
    """The fleet's ``worker_load`` when a pop need not refresh or update the worker, else None.

    Complexity: O(1).
    """
    if state.workers.get(worker) != WorkerSettings.from_mapping(spec):
        return None
    known = _known(state, worker)
    timeout = state.config.worker_timeout_seconds
    if known is None or known.timed_out:
        return None
    if timeout is not None and now - known.last_seen >= timeout / 2:
        return None
    return known


def would_grant(state: EngineParts, now: float, worker: str, fresh: WorkerLoad) -> bool | None:
    """Whether a fresh worker's pop at ``now`` would grant a job: a read, nothing changes.

    The fleet's side-effect-free preview (``FleetDispatcher.would_pop``). None: it cannot
    tell without a change, as a lifecycle timer is due at ``now`` (the caller pops, journaled,
    which fires it). O(1) when the worker's slots are full or nothing is queued, else a pop's.

    Args:
        state: The engine.
        now: The time (not before the engine's).
        worker: The worker's name.
        fresh: Its record in the fleet (:func:`fresh_worker`).
    """
    if fresh.held >= fresh.slots or len(state.fleet) == 0:
        return False
    try:
        return state.fleet.would_pop(worker, now=now) is not None
    except InvalidState:  # a timer is due at now (the tick ran at an earlier now)
        return None


def quiet_pop(state: EngineParts, now: float, worker: str, amount: int = 1) -> PopResult:
    """A fresh worker's pop that :func:`would_grant` said grants: the grant(s), no refresh.

    Args:
        state: The engine.
        now: The time (not before the engine's).
        worker: The worker's name.
        amount: Most jobs to grant (checked by the caller): the first, then its siblings.
    """
    grants = _grants(state, worker, amount, now)
    state.advance_to(now)
    return _result(state, worker, grants, now)


def slots_full(state: EngineParts, worker: str) -> bool:
    """Whether ``worker`` is known and holds as many jobs as it has slots. O(1)."""
    known = _known(state, worker)
    return known is not None and known.held >= known.slots


def liveness_due(state: EngineParts, worker: str) -> float | None:
    """When a waiting ``worker``'s liveness must next be journaled (None: never). O(1)."""
    timeout = state.config.worker_timeout_seconds
    known = _known(state, worker)
    if timeout is None or known is None:
        return None
    return float(known.last_seen) + timeout / 2


def _held(state: EngineParts, op: str, job_id: str, worker: str, attempt: int) -> JobRecord:
    """The record of the job ``worker`` holds at ``attempt``, or why it does not (404, 409)."""
    check_types(op, job_id=(job_id, str), worker=(worker, str), attempt=(attempt, int))
    record = state.jobs.get(job_id)
    if record is None:
        raise Rejected(404, f"no job {job_id!r}", field="id")
    if record.state != "running":
        raise Rejected(
            409, f"job {job_id!r} is {record.state}, not running on {worker!r}", field="id"
        )
    if record.worker != worker or record.attempt != attempt:
        raise Rejected(
            409,
            f"job {job_id!r} is held by another grant (worker/attempt do not match the "
            "current one); this worker lost it",
            field="worker" if record.worker != worker else "attempt",
        )
    if record.deadline is not None and now_past(state.now, record.deadline):
        raise Rejected(409, f"job {job_id!r}: the lease ran out; it is being requeued")
    return record


def _check_result(state: EngineParts, result: Any) -> None:
    size = len(json.dumps(result, separators=(",", ":")).encode())
    if size > state.config.result_max_bytes:
        raise Rejected(
            413,
            f"result is {size} bytes, over result_max_bytes={state.config.result_max_bytes}",
            field="result",
        )


def complete(
    state: EngineParts, now: float, job_id: str, worker: str, attempt: int, result: Any
) -> JobRecord:
    """``BrokerEngine.complete``: the holder finished the job."""
    record = _held(state, "complete", job_id, worker, attempt)
    _check_result(state, result)
    state.fleet.complete(job_id, now=now, worker=worker)
    state.workers.touch(worker, now)
    state.finish(record, "done", result, now)
    return attrs.evolve(record)


def fail(
    state: EngineParts,
    now: float,
    job_id: str,
    worker: str,
    attempt: int,
    result: Any,
    retry: bool,
) -> JobRecord:
    """``BrokerEngine.fail``: the holder gave up on the job (``retry``: queue it again)."""
    record = _held(state, "fail", job_id, worker, attempt)
    _check_result(state, result)
    state.fleet.fail(job_id, now=now, worker=worker, retry=retry)  # its group counts it
    state.workers.touch(worker, now)
    if job_id in state.fleet:  # requeued: still unfinished, its bytes stay counted
        state.jobs.count("retried")
        state.requeued(record)
        state.jobs.note_result(job_id, result)
        return attrs.evolve(record)
    state.finish(record, "failed", result, now)
    return attrs.evolve(record)


def release(state: EngineParts, now: float, job_id: str, worker: str, attempt: int) -> JobRecord:
    """``BrokerEngine.release``: a grant that never reached its worker goes back."""
    record = _held(state, "release", job_id, worker, attempt)
    state.fleet.requeue(job_id, now=now)
    state.requeued(record)
    return attrs.evolve(record)


def tick(state: EngineParts, now: float) -> list[str]:
    """``BrokerEngine.tick``: expired leases, retention, silent workers."""
    taken: list[str] = []
    for expired in state.fleet.expire(now):
        record = state.jobs[expired.job.id]
        if expired.cause == "ttl":  # still queued at its deadline
            state.finish(record, "expired", None, now)
            continue
        state.jobs.count("expired")
        taken.append(record.id)
        if expired.requeued:
            state.requeued(record)
        else:
            state.finish(record, "failed", {"error": "lease expired on every attempt"}, now)
    _groups.forget(state, state.jobs.retire_due(now))
    forget_silent(state, now)
    return taken


def heartbeat(
    state: EngineParts, now: float, worker: str, resident: str | None
) -> list[dict[str, Any]]:
    """``BrokerEngine.heartbeat``: the worker is alive; the jobs it holds."""
    settings = state.workers.get(worker)
    if settings is None:
        raise Rejected(404, f"no worker {worker!r} (pop once to join)", field="worker")
    if resident is not None and settings.resident != resident:
        join(state, now, worker, settings.with_resident(resident))
    else:
        state.fleet.heartbeat(worker, now=now)
    state.workers.touch(worker, now)
    held = [r for r in state.jobs.values() if r.worker == worker and r.state == "running"]
    held.sort(key=lambda r: int(r.id.rpartition("-")[2]))
    return [{"id": r.id, "attempt": r.attempt, "deadline": r.deadline} for r in held]


def refresh(state: EngineParts, now: float, workers: list[str]) -> int:
    """``BrokerEngine.refresh``: waiting workers are alive; how many were known."""
    count = 0
    for name in workers:
        if name in state.workers:
            state.fleet.heartbeat(name, now=now)
            count += 1
    return count


def leave(state: EngineParts, now: float, worker: str) -> list[str]:
    """``BrokerEngine.leave``: the worker's jobs go back to the heads of their lanes."""
    if worker not in state.workers:
        raise Rejected(404, f"no worker {worker!r} (pop once to join)", field="worker")
    requeued = [job.id for job in state.fleet.leave(worker, now=now)]
    for job_id in requeued:
        state.requeued(state.jobs[job_id])
    state.workers.leave(worker)
    return requeued


def forget_silent(state: EngineParts, now: float) -> None:
    """Forget workers silent for ``forget_workers_seconds`` (one holding a job is kept).

    Complexity: O(f log n) for f workers forgotten or looked at.
    """
    horizon = now - state.config.forget_workers_seconds
    while (oldest := state.workers.oldest_seen()) is not None:
        worker, seen = oldest
        if seen > horizon:
            return
        if worker in state.workers and state.fleet.worker(worker).held:
            state.workers.touch(worker, now)
            continue
        if state.workers.forget(worker):
            state.fleet.leave(worker, now=now)
