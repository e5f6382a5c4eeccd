"""Snapshot and restore: the dispatcher's state as plain JSON data (private).

``dump`` writes every queued job in lane order, each lane's virtual start, the running job with
its lease and the resident model; ``load`` rebuilds them into a new dispatcher without lifting
or charging anything, so no queued job, lane age or lease is lost. Counters and the dispatch
history are not kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue._errors import DuplicateJob
from prioqueue._lanes import RUNNING, _Entry
from prioqueue._validate import checked_name, finite, positive_or_none
from prioqueue.lease import Lease
from prioqueue.records import Grant, Job
from prioqueue.scoring import ScoreBreakdown

if TYPE_CHECKING:
    from prioqueue.dispatcher import SizeOneDispatcher

__all__: list[str] = []  # private module

SNAPSHOT_FORMAT = "prioqueue.dispatcher/1"


def dump(d: SizeOneDispatcher, t: float) -> dict[str, Any]:
    """Return ``d``'s state at time ``t`` as JSON-serialisable data. O(n)."""
    lanes = []
    queued = []
    for lane in d._lanes.values():
        if d._fair_share:
            lanes.append({"member": lane.member, "level": lane.level, "s": lane.s})
        for entry in lane.queued():
            queued.append(_job_record(entry))
    running = None
    current, grant = d._running, d._grant
    if current is not None and grant is not None:
        running = _job_record(current)
        running["granted_at"] = grant.granted_at
        running["lease_seconds"] = None if grant.lease is None else grant.lease.seconds
        running["score"] = attrs.asdict(grant.score)
        running["swap"] = grant.swap
    return {
        "format": SNAPSHOT_FORMAT,
        "taken_at": t,
        "seq": d._seq,
        "fair_share": d._fair_share,
        "resident_model": d._resident,
        "lanes": lanes,
        "queued": queued,
        "running": running,
    }


def load(d: SizeOneDispatcher, state: Mapping[str, Any], now: float | None) -> None:
    """Fill the new dispatcher ``d`` from ``state`` (see ``SizeOneDispatcher.restore``).

    Raises:
        ValueError: The state is not a valid snapshot; the message says what is wrong.
    """
    try:
        if state.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"format is {state.get('format')!r}, expected {SNAPSHOT_FORMAT!r}")
        taken_at = finite("taken_at", state["taken_at"])
        shift = 0.0 if now is None else finite("now", now) - taken_at
        snapshot_fair = bool(state["fair_share"])
        d._seq = int(state["seq"])
        d._now = taken_at + shift
        if d._fair_share:
            for record in state["lanes"]:
                member, level = str(record["member"]), int(record["level"])
                s = finite("lane s", record["s"]) + shift
                d._lanes[(member, level)] = d._new_lane(member, level, s)
                d._level(level)
        for record in state["queued"]:
            job = _job_from_record(d, record, shift)
            if snapshot_fair and d._fair_share and (job.member, job.priority) not in d._lanes:
                raise ValueError(f"job {job.id!r} has no lane record")
            # From a snapshot without fair share, a new lane starts at its oldest job's
            # arrival (an enqueue without a lift does that).
            d._enqueue(
                job,
                attempt=int(record["attempt"]),
                now=d._now,
                requeue=False,
                lift=False,
            )
        running = state["running"]
        if running is not None:
            _restore_running(d, running, shift)
        resident = state["resident_model"]
        d._resident = None if resident is None else str(resident)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"invalid snapshot: {exc!r}") from exc
    except ValueError as exc:
        raise ValueError(f"invalid snapshot: {exc}") from exc


def _job_from_record(d: SizeOneDispatcher, record: Mapping[str, Any], shift: float) -> Job:
    tier = str(record["tier"])
    model = record["model"]
    estimate = record["estimate"]
    job_id = checked_name("job id", record["id"])
    if job_id in d._entries:
        raise DuplicateJob(f"job {job_id!r} appears twice")
    return Job(
        id=job_id,
        member=checked_name("member", record["member"]),
        priority=int(record["priority"]),
        tier=tier,
        tier_bonus=d._scorer.tier_bonus(tier),
        model=None if model is None else checked_name("model", model),
        estimate=positive_or_none("estimate", estimate),
        arrival=finite("arrival", record["arrival"]) + shift,
        seq=int(record["seq"]),
        payload=record.get("payload"),
    )


def _restore_running(d: SizeOneDispatcher, record: Mapping[str, Any], shift: float) -> None:
    job = _job_from_record(d, record, shift)
    key: tuple[str, int] | str = (job.member, job.priority) if d._fair_share else job.id
    lane = d._lanes.get(key)
    if lane is None:
        lane = d._lanes[key] = d._new_lane(job.member, job.priority, job.arrival)
    d._level(job.priority)
    entry = _Entry(job, lane, int(record["attempt"]))
    entry.state = RUNNING
    entry.granted_at = finite("granted_at", record["granted_at"]) + shift
    seconds = record["lease_seconds"]
    lease = None if seconds is None else Lease(granted_at=entry.granted_at, seconds=seconds)
    d._entries[job.id] = entry
    d._running = entry
    d._grant = Grant(
        job=job,
        score=ScoreBreakdown(**record["score"]),
        lease=lease,
        granted_at=entry.granted_at,
        attempt=entry.attempt,
        waited=entry.granted_at - job.arrival,
        swap=bool(record["swap"]),
    )


def _job_record(entry: _Entry) -> dict[str, Any]:
    job = entry.job
    payload = job.payload
    if payload is not None and not isinstance(payload, (str, int, float, bool)):
        try:
            json.dumps(payload)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"job {job.id!r} has a payload that is not JSON-serialisable: {exc}"
            ) from None
    return {
        "id": job.id,
        "member": job.member,
        "priority": job.priority,
        "tier": job.tier,
        "model": job.model,
        "estimate": job.estimate,
        "arrival": job.arrival,
        "seq": job.seq,
        "payload": payload,
        "attempt": entry.attempt,
    }
