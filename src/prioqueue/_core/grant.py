"""The grant side's transitions: pops, completions, cancels, failures and take-backs (private).

Theory of operation (the model is docs/design/fleet.md):

* ``pop`` grants what ``choose.pick`` chose: it sizes the lease and the expected charge
  *before* changing anything, then hands the job to the worker and charges its lane up front:
  ``held += expected / N`` for the fleet's capacity ``N``.
* ``finish`` (complete, or cancel of a held job) corrects the lane: the up-front charge leaves
  ``held`` and the settled part advances by ``final / N`` (clamped at ``now``), so the lane ends
  exactly where charging at completion would have put it.
* ``take_back`` (lease expiry, worker timeout, leave) refunds exactly the up-front charge and
  requeues the job at the head of its lane, or reports it failed after ``max_attempts``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from typing import Literal

from prioqueue._core.choose import pick
from prioqueue._core.core import Core
from prioqueue._core.items import DispatchRecord, new_item
from prioqueue._core.queue import fire, fire_due, remove_waiting
from prioqueue._core.starving import return_load
from prioqueue._groups import checked_group, checked_running
from prioqueue._lanes import RUNNING, _Entry
from prioqueue._validate import checked_name, finite
from prioqueue._workers import _Worker
from prioqueue.errors import ChargeError, InvalidState, LeaseError, LeaseExpired
from prioqueue.lease import Lease
from prioqueue.records import Completed, Expired, Grant, Job
from prioqueue.scoring import ScoreBreakdown

__all__: list[str] = []  # private module

_RECORD_BYTES = 200  # the fixed part of a history record's estimated size


def pop(d: Core, worker: _Worker, t: float, preview: bool = False) -> Grant | None:
    """Grant the worker what ``choose.pick`` chose, or None (slots full, nothing eligible).

    The lease and the expected charge are computed before the first change: nothing
    changes on any error. With ``preview`` the grant is returned before that first change
    (``FleetDispatcher.would_pop``): the same computation, so the same answer. A timed-out
    worker counts in the capacity as the pop's revival would make it count.
    """
    if len(worker.held) >= worker.slots:
        return None
    picked = pick(d, worker, t)
    if picked is None:
        return None
    lane, entry, aff, winner, fast, deferred, weight, rule = picked
    resident = worker.resident
    job = worker.granted(entry.job)  # a multi-model job: with the model the grant chose
    lease = None if d.config.lease_for is None else lease_of(d, job, worker, t)
    charged = 0.0
    capacity = (d.workers.live + worker.timed_out) or 1  # a pop revived it: timed_out is False
    expected = runtime = d.expected_runtime(job)
    # A crossing on one worker that evicts the model a higher level waits for is charged
    # the load back too (issue 26, eighth round): what it really costs that level.
    back = return_load(d, capacity, resident, job) if weight < 0.0 else 0.0
    if d.config.fair_share:
        if not d.config.plain_charge:
            expected = checked_charge(d, job, expected, "expected charge")
        charged = expected / capacity
    # The reported term is never negative; the ranking uses s itself (a lane charged up
    # front for jobs still running may be ahead of the clock).
    aging = (t - lane.s) / d.divisor
    aging = aging if aging >= 0.0 else 0.0  # max(aging, 0.0) without the call
    # Positional arguments: band, tier_bonus, swap_affinity, aging (the hot path).
    score = ScoreBreakdown(job.priority, lane.head().job.tier_bonus, aff, aging)
    model = job.model
    name = worker.name if d.config.name_in_grants else None
    # Positional: job, score, lease, granted_at, attempt, waited, swap, worker.
    wait = t - job.arrival
    grant = Grant(
        job, score, lease, t, entry.attempt, wait, model is not None and model != resident, name
    )
    if preview:
        return grant
    # Core changes start here; nothing below can fail.
    levels = d.lanes.levels
    level = levels[job.priority]
    if d.config.track and fast:
        d.lanes.count_reorders(
            level if winner is job else levels[winner.priority], winner, resident
        )
    number = d.dispatched()
    if d.history.limit:
        # Remember the grant for ``explain``, within ``history`` entries and bytes. O(1).
        size = _RECORD_BYTES + len(job.id) + len(job.member) + (len(model) if model else 0)
        d.history.add(
            new_item(
                DispatchRecord,
                (t, number, job.id, job.member, job.priority, job.seq, model,
                 score, resident, name, rule, size),
            )
        )  # fmt: skip
    entry.hand_to(worker, t, charged, t + runtime, capacity, grant)
    if weight:
        d.lanes.cross(entry, weight, runtime, back)
    if deferred is not None:  # past the credit, or by the share gate (which earns nothing)
        levels[deferred.job.priority].reordered("deferred_crossings")
    d.hand_over(entry, worker, t, charged)
    level.granted(wait, bisect.bisect_left(d.config.buckets, wait), t, runtime)
    d.totals["dispatched"] += 1
    d.groups.move(job.id, "running")
    return grant


def lease_of(d: Core, job: Job, worker: _Worker, t: float) -> Lease:
    """Size the winner's lease; any failure becomes a ``LeaseError`` naming the job."""
    assert d.config.lease_for is not None
    try:
        seconds = d.config.lease_for(job, worker)
    except Exception as exc:
        raise LeaseError(
            f"lease_for raised for job {job.id!r}: {exc!r}; the job is still queued",
            job_id=job.id,
        ) from exc
    if (
        not isinstance(seconds, (int, float))
        or isinstance(seconds, bool)
        or not 0 < seconds < math.inf
    ):
        raise LeaseError(
            f"lease_for returned {seconds!r} for job {job.id!r}; a lease must be a finite "
            "number of seconds > 0; the job is still queued",
            job_id=job.id,
        )
    return Lease(granted_at=t, seconds=seconds)


def finish(d: Core, entry: _Entry, runtime: float, now: float, final: float) -> None:
    """Free a held entry and correct its lane with its final charge."""
    job = entry.job
    lane = entry.lane
    d.release(entry)
    lanes = d.lanes
    lanes.uncross(entry, runtime)  # the credit moves by the measured, not expected, time
    lane.owner.used(final)
    if d.config.fair_share:
        settled = lane.settled + final / entry.capacity
        if settled > now or (lane.live and lanes.levels[lane.level].lanes == 1):
            # Clamped at now; and alone at its level, the lane is re-anchored at now,
            # exactly as a producer that resubmits one job at a time would be lifted: lag
            # accrued while other levels used the GPU is not fair-share debt.
            settled = now
        lane.settle(settled)
        lanes.refile(lane, now)
    else:
        lanes.drop_lane(lane, job.id)
    # The recent runtimes: for the retry-after estimate and, per model and per level,
    # for the expected charge.
    d.lifecycle.finished(now, runtime, job.model, job.priority)


def take_back(
    d: Core, entries: Iterable[_Entry], now: float, *, always: bool
) -> list[tuple[_Entry, bool]]:
    """Refund and requeue (or fail) held entries; returns ``(entry, requeued)`` by seq."""
    done = []
    for entry in sorted(entries, key=lambda e: e.job.seq, reverse=True):
        job = entry.job
        lane = entry.lane
        d.release(entry)
        held = max(0.0, now - entry.granted_at)
        d.lanes.uncross(entry, held)  # the credit counts the GPU time really held (issue 26)
        if d.config.fair_share:
            lane.set_s()
            d.lanes.refile(lane, now)
        requeued = always or entry.attempt < (job.max_attempts or d.config.max_attempts)
        if requeued:
            d.enqueue(job, attempt=entry.attempt + 1, now=now, requeue=True)
            d.groups.move(job.id, "queued", used=held)
        else:
            d.groups.move(job.id, "failed", used=held)
            d.totals["failed"] += 1
            d.lanes.drop_lane(lane, job.id)
        done.append((entry, requeued))
    done.reverse()
    return done


def held_entry(d: Core, job_id: str, worker: object, action: str) -> _Entry:
    entry = d.entry(job_id)
    if worker is not None:
        name = checked_name("worker", worker)
        holder = entry.worker.name if entry.state == RUNNING else None
        if holder != name:
            where = "queued" if holder is None else f"held by worker {holder!r}"
            raise InvalidState(
                f"job {job_id!r} is {where}, not by worker {name!r}: a worker that lost "
                f"the job cannot {action} it; nothing changed"
            )
    return entry


def complete(
    d: Core,
    job_id: str,
    now: float,
    runtime: float | None,
    worker: str | None,
    charge: float | None,
) -> Completed:
    """The body of ``complete`` (see ``FleetDispatcher.complete``)."""
    fire(d, now)
    t = finite("now", now)
    entry = d.entry(job_id) if worker is None else held_entry(d, job_id, worker, "complete")
    if entry.state != RUNNING:
        raise InvalidState(f"job {job_id!r} is queued, not running; cancel() removes it")
    grant = entry.grant
    if grant.lease is not None and grant.lease.expired(t):
        raise LeaseExpired(
            f"job {job_id!r} finished at {t!r}, at or after its lease deadline "
            f"{grant.lease.deadline!r}; call expire() to requeue or fail it"
        )
    if runtime is None:
        measured = t - entry.granted_at
    else:
        measured = finite("runtime", runtime)
        if measured < 0:
            raise ValueError(f"runtime must be >= 0 seconds, got {runtime!r}")
    measured = measured if measured >= 0.0 else 0.0  # max(measured, 0.0), no call
    if charge is None and d.config.plain_charge:
        final = measured
    else:
        final = final_charge(d, entry.job, measured, charge)
    d.tick(t)
    entry.worker.heard(t)
    finish(d, entry, measured, t, final)
    d.groups.move(job_id, "done", used=measured)
    entry.lane.owner.done()
    d.totals["completed"] += 1
    return Completed(job=entry.job, runtime=measured, charge=final)


def cancel_group(d: Core, group: str, now: float, running: str) -> list[Job]:
    """The body of ``cancel_group`` (after ``fire``): ``cancel`` each chosen job in turn."""
    group = checked_group(group)
    mode = checked_running(running)
    live = d.groups.live(group)
    t = d.tick(now)
    return [
        cancel(d, job_id, t, None, None)
        for job_id, job_state in live
        if job_state == "queued" or mode == "cancel"
    ]


def checked_charge(d: Core, job: Job, runtime: float, what: str) -> float:
    """The charge model's value, checked: finite and ``>= 0``, else ``ChargeError``."""
    value = d.config.charge(job, runtime)
    charge = value if isinstance(value, (int, float)) and not isinstance(value, bool) else -1
    if not 0 <= charge < math.inf:
        raise ChargeError(
            f"the charge model returned {value!r} for job {job.id!r} ({what}); a charge "
            "must be a finite number of seconds >= 0; nothing changed",
            job_id=job.id,
        )
    return float(charge)


def final_charge(d: Core, job: Job, runtime: float, charge: object) -> float:
    if charge is None:
        return checked_charge(d, job, runtime, "at completion")
    value = finite("charge", charge)
    if value < 0:
        raise ValueError(f"charge must be >= 0 seconds, got {charge!r}")
    return value


def cancel(d: Core, job_id: str, now: float, worker: str | None, charge: float | None) -> Job:
    """The body of ``cancel``."""
    fire(d, now)
    job = remove(d, job_id, now, worker, charge, "cancelled")
    d.totals["cancelled"] += 1
    return job


def fail(
    d: Core, job_id: str, now: float, worker: str | None, charge: float | None, retry: bool
) -> Job:
    """The body of ``fail``."""
    fire(d, now)
    if not isinstance(retry, bool):
        raise ValueError(f"retry must be a bool, got {retry!r}")
    job = remove(d, job_id, now, worker, charge, "failed", retry=retry)
    if job.id in d.entries:
        d.totals["retried"] += 1
    else:
        d.totals["failed"] += 1
    return job


def remove(
    d: Core,
    job_id: str,
    now: float,
    worker: str | None,
    charge: float | None,
    outcome: Literal["cancelled", "failed"],
    retry: bool = False,
) -> Job:
    """The body of ``cancel`` and ``fail``: nothing changes on any error.

    (The caller fired the timers due at ``now``: a job whose ttl ran out is gone.)
    """
    t = finite("now", now)
    entry = held_entry(d, job_id, worker, "cancel" if outcome == "cancelled" else "fail")
    if t < d.now:
        d.tick(t)  # raises: time went backwards
    if entry.state == RUNNING:
        runtime = max(0.0, t - entry.granted_at)
        final = final_charge(d, entry.job, runtime, charge)
        d.tick(t)
        if worker is not None:
            entry.worker.heard(t)  # the worker spoke (a client's cancel does not)
        finish(d, entry, runtime, t, final)
        job = entry.job
        if retry and entry.attempt < (job.max_attempts or d.config.max_attempts):
            d.groups.move(job_id, "queued", used=runtime)
            backoff = job.backoff or d.config.backoff
            delay = backoff.delay(job.id, entry.attempt)
            if delay > 0:
                d.park(job, entry.attempt + 1, t + delay)
            else:
                again = d.enqueue(job, attempt=entry.attempt + 1, now=t, requeue=False)
                again.requeued(t)
        else:
            d.groups.move(job_id, outcome, used=runtime)
    else:
        d.tick(t)
        remove_waiting(d, entry)
        d.groups.move(job_id, outcome)
    return entry.job


def expire(d: Core, now: float) -> list[Expired]:
    """The body of ``expire`` (see ``FleetDispatcher.expire``)."""
    fire(d, now)
    t = d.tick(now)
    lapsed = drain_lapsed(d, t)
    taken: dict[int, tuple[_Entry, float, str]] = {}
    for deadline, key, entry in d.workers.due_leases(t):
        taken[key] = (entry, deadline, "lease")
    timeout = d.config.worker_timeout
    if timeout is not None:
        for worker in d.workers.time_out_silent(t, timeout):
            for entry in worker.held:
                if id(entry) not in taken:
                    lease = entry.grant.lease
                    due = worker.last_seen + timeout if lease is None else lease.deadline
                    taken[id(entry)] = (entry, due, "worker_timeout")
    if not taken:
        return lapsed
    details = {id(entry): (due, cause) for entry, due, cause in taken.values()}
    d.totals["expired"] += len(taken)
    result = []
    for entry, requeued in take_back(d, [entry for entry, _, _ in taken.values()], t, always=False):
        due, cause = details[id(entry)]
        worker = entry.worker
        result.append(
            Expired(
                job=entry.job,
                attempt=entry.attempt,
                deadline=due,
                requeued=requeued,
                worker=worker.name if d.config.name_in_grants else None,
                cause=cause,  # type: ignore[arg-type]
            )
        )
    result.extend(lapsed)
    result.extend(drain_lapsed(d, t))  # jobs requeued past their deadline
    return result


def drain_lapsed(d: Core, t: float) -> list[Expired]:
    """Fire the due timers and hand over the buffered ``cause="ttl"`` reports."""
    if t >= d.lifecycle.timers.next:
        fire_due(d, t)
    return d.lifecycle.drain()


def next_deadline(d: Core) -> float | None:
    """The body of ``next_deadline`` (see ``FleetDispatcher.next_deadline``)."""
    best = d.workers.next_lease()
    timer = d.lifecycle.timers.earliest()
    if timer is not None and (best is None or timer < best):
        best = timer
    timeout = d.config.worker_timeout
    if timeout is not None:
        oldest = d.workers.oldest_seen()  # amortised O(log n), not a scan
        if oldest is not None and (best is None or oldest + timeout < best):
            best = oldest + timeout
    return best
