"""What the gateway's own endpoints tell: status, jobs and groups (see ``_paths.py``).

The paths: ``/prioqueue/status``, ``/prioqueue/jobs/{id}``, ``/prioqueue/groups/{id}`` and
``/metrics``.

Times in the answers are relative (seconds waited, seconds until an estimated start), never
the dispatcher's monotonic clock, which means nothing outside the process.

What a caller sees depends on its key. An *observer* (``observer = true`` or ``admin = true``
on its key, or ``anonymous_observer``) sees everything. Anyone else sees its own member's
jobs in full and every other job only as a count: no ids, members, models or paths (the
resident model neither, since it tells what others run), and ``/metrics`` (labelled by
member) answers it 403; a job of another member is unknown to it (404, as if it did not
exist). ``metrics_key`` reads ``/metrics`` and nothing else.

Groups (``X-Prioqueue-Group``) belong to the member that submitted them: the dispatcher's
group label is the member and the caller's label together (:func:`group_key`), so two members
may use the same label without seeing each other's. ``GET /prioqueue/groups/{label}`` shows
the caller's own group; an observer may add ``?member=NAME`` to read another member's.
``DELETE /prioqueue/groups/{label}`` cancels its queued requests (``?running=cancel`` stops
its running ones too); only an admin may add ``?member=``.

Cost: ``status`` walks the predicted order of at most ``?limit=`` jobs (default
:data:`STATUS_LIMIT`, at most :data:`STATUS_MAX`); explaining a queued job is the
dispatcher's ``explain``; explaining a finished one scans the grants made while it waited,
from a ring of the last :data:`~prioqueue.gateway.app.GRANT_RING` grants. Nothing is
computed per grant.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue._groups import group_key
from prioqueue.errors import UnknownJob
from prioqueue.gateway._record import record_finished

if TYPE_CHECKING:
    from prioqueue.gateway._forward import Flight
    from prioqueue.gateway._host import Host as Gateway
    from prioqueue.gateway.settings import Identity
    from prioqueue.records import Grant

__all__ = [
    "STATUS_LIMIT",
    "STATUS_MAX",
    "explain",
    "finished",
    "group_key",
    "remember",
    "status",
]


STATUS_LIMIT = 100
"""Queued jobs listed by ``/prioqueue/status`` unless ``?limit=`` says otherwise."""
STATUS_MAX = 1000
"""The most queued jobs ``?limit=`` may ask for (the counts are always complete)."""


def _held(gateway: Gateway) -> list[Grant]:
    return gateway.gate.held()


def _running(gateway: Gateway, grant: Grant, who: Identity | None, now: float) -> dict[str, Any]:
    job = grant.job
    if not sees(who, job.member):
        return {"mine": False}
    return {
        "mine": who is not None and who.member == job.member,
        "id": job.id,
        "member": job.member,
        "priority": job.priority,
        "tier": job.tier,
        "model": job.model,
        "path": job.payload,
        "upstream": grant.worker,
        "waited": round(grant.waited, 3),
        "running_for": round(max(0.0, now - grant.granted_at), 3),
        "lease_remaining": None if grant.lease is None else round(grant.lease.remaining(now), 3),
    }


def _relative(when: float | None, now: float) -> float | None:
    return None if when is None else round(max(0.0, when - now), 3)


def sees(who: Identity | None, member: str) -> bool:
    return who is None or who.observer or who.member == member


def status(
    gateway: Gateway, who: Identity | None = None, *, limit: int = STATUS_LIMIT
) -> dict[str, Any]:
    """Return the queue as JSON-ready data: the running job, then each level's queue.

    Args:
        gateway: The gateway.
        who: The caller (None: an observer). Others' jobs are counted, not listed, for a
            caller that is not an observer.
        limit: Most queued jobs to look at (in predicted dispatch order).

    Returns:
        ``{"running": ..., "resident_model": ..., "queued": n, "levels": {level: {...}}}``;
        each level lists its jobs with their overall position and estimated start.

    Complexity: O(L log L + k log L) for L lanes and k listed jobs (the forecast).
    """
    dispatcher = gateway.dispatcher
    now = gateway.gate.now()
    stats = dispatcher.stats(now=now)
    held = [_running(gateway, grant, who, now) for grant in _held(gateway)]
    levels: dict[str, dict[str, Any]] = {}
    for level, level_stats in sorted(stats.levels.items(), reverse=True):
        levels[str(level)] = {
            "queued": level_stats.queued,
            "oldest_wait": round(level_stats.oldest_wait, 3),
            "mean_wait": round(level_stats.mean_wait, 3),
            "dispatched": level_stats.dispatched,
            "reorders": level_stats.reorders.as_dict(),
            "jobs": [],
        }
    for position, ahead in enumerate(dispatcher.forecast(now=now, limit=limit), start=1):
        if not sees(who, ahead.member):
            continue
        entry = levels.setdefault(str(ahead.priority), {"queued": 0, "jobs": []})
        entry["jobs"].append(
            {
                "id": ahead.job_id,
                "member": ahead.member,
                "model": dispatcher.job(ahead.job_id).model,
                "position": position,
                "score": round(ahead.score, 3),
                "estimated_start_in": _relative(ahead.estimated_start, now),
            }
        )
    observer = who is None or who.observer
    mine = None if who is None else stats.members.get(who.member)
    fleet = None
    resident = getattr(dispatcher, "resident_model", None)
    if gateway.upstreams:
        fleet = [u.as_dict(gateway, observer=observer) for u in gateway.upstreams.values()]
        resident = None
    return {
        "running": held if fleet is not None else (held[0] if held else None),
        "resident_model": resident if observer else None,
        "fleet": fleet,
        "routing": gateway.config.routing if fleet is not None else None,
        "queued": len(dispatcher),
        "yours": None if mine is None else {"member": mine.member, "queued": mine.queued},
        "listed_up_to": limit,
        "upstream": _upstream_state(gateway, observer),
        "dispatched": stats.dispatched,
        "completed": stats.completed,
        "cancelled": stats.cancelled,
        "expired": stats.expired,
        "swaps": stats.swaps if fleet is not None else gateway.loaded.swaps,
        "closing": gateway.gate.closed,
        "levels": levels,
    }


def _upstream_state(gateway: Gateway, observer: bool) -> dict[str, Any]:
    """The breaker, and for the single upstream what the gateway last read of it."""
    state = gateway.breaker.as_dict()
    if not gateway.upstreams:
        state["poll_error"] = gateway.poll_error
        loaded = gateway.loaded.models
        state["loaded_models"] = sorted(loaded) if observer else None
    return state


_HIDDEN = ("job_id", "member")


def _redact(entries: list[dict[str, Any]], who: Identity | None) -> None:
    for entry in entries:
        if not sees(who, entry["member"]):
            for key in _HIDDEN:
                entry.pop(key, None)


def explain(gateway: Gateway, job_id: str, who: Identity | None = None) -> dict[str, Any]:
    """Return why a job waits (queued or running), or its record once finished.

    Args:
        gateway: The gateway.
        job_id: The id from the ``X-Prioqueue-Job`` header.
        who: The caller (None: an observer); a job of another member is unknown to a
            caller that is not an observer, and others' jobs in the answer lose their ids
            and members.

    Returns:
        For a live job, the dispatcher's explanation (``text``, for observers, reads like
        ``sprio``); for a finished one, the gateway's record of it (outcome, status, wait,
        runtime, the score at its grant, and the later arrivals granted while it waited).

    Raises:
        UnknownJob: The job is neither live nor remembered (or not the caller's to see).
    """
    unknown = UnknownJob(f"job {job_id!r} is not queued, running or remembered")
    dispatcher = gateway.dispatcher
    if job_id in dispatcher:
        if not sees(who, dispatcher.job(job_id).member):
            raise unknown
        explanation = explain_live(gateway, job_id)
        now = explanation.now
        data = attrs.asdict(explanation)
        if gateway.upstreams:
            data["upstream"] = gateway.gate.holder(job_id)
        if who is None or who.observer:
            data["text"] = str(explanation)
        data["estimated_start_in"] = _relative(explanation.estimated_start, now)
        for entry in data["ahead"]:
            entry["estimated_start_in"] = _relative(entry.pop("estimated_start"), now)
        for entry in data["overtaken_by"]:
            entry["seconds_ago"] = round(max(0.0, now - entry.pop("at")), 3)
        _redact(data["ahead"], who)
        _redact(data["overtaken_by"], who)
        for key in ("now", "estimated_start", "lane_start"):
            data.pop(key, None)
        data["job"].pop("arrival", None)
        data["job"].pop("seq", None)
        return data
    record = gateway.history.get(job_id)
    if record is None or not sees(who, record["member"]):
        raise unknown
    data = {"state": "finished"}
    data.update((key, value) for key, value in record.items() if not key.startswith("_"))
    grant = record["_grant"]
    if grant is not None:
        data["waited"] = round(grant.waited, 3)
        data["score"] = attrs.asdict(grant.score)
        data["swap"] = grant.swap
        data["overtaken_by"] = _overtaken(gateway, grant, who)
    return data


EXPLAIN_AHEAD = 100
"""The most jobs ahead (and overtakes) an explanation lists, when the core can bound them."""


def _takes_limits() -> bool:
    """Whether the core's ``explain`` takes ``ahead_limit``/``overtakes_limit``."""
    from prioqueue.dispatcher import SizeOneDispatcher

    parameters = inspect.signature(SizeOneDispatcher.explain).parameters
    return "ahead_limit" in parameters and "overtakes_limit" in parameters


_BOUNDED_EXPLAIN = _takes_limits()


def explain_live(gateway: Gateway, job_id: str) -> Any:
    """The dispatcher's explanation, with its lists bounded when the core supports it."""
    dispatcher = gateway.dispatcher
    if _BOUNDED_EXPLAIN:
        return dispatcher.explain(  # type: ignore[call-arg, unused-ignore]
            job_id, now=gateway.gate.now(), ahead_limit=EXPLAIN_AHEAD, overtakes_limit=EXPLAIN_AHEAD
        )
    return gateway.gate.explain(job_id)


def _overtaken(gateway: Gateway, grant: Any, who: Identity | None) -> list[dict[str, Any]]:
    """The later arrivals granted while a finished job waited (from the ring of grants).

    Complexity: O(g) for the g grants made since the job arrived (at most the ring's size).
    """
    arrival = grant.job.arrival
    found: list[dict[str, Any]] = []
    for other in reversed(gateway.grants):
        if other.granted_at < arrival:
            break
        if other.granted_at < grant.granted_at and other.job.arrival > arrival:
            entry = {
                "job_id": other.job.id,
                "member": other.job.member,
                "priority": other.job.priority,
                "waited": round(other.waited, 3),
                "score": round(other.score.effective, 3),
            }
            found.append(entry)
    found.reverse()
    _redact(found, who)
    return found


def remember(
    gateway: Gateway,
    job_id: str,
    who: Identity,
    model: str | None,
    path: str,
    priority: int,
    outcome: str,
    status: int,
    grant: Grant | None,
) -> None:
    """Keep a finished job's record: O(1), bounded in entries and (estimated) bytes."""
    config = gateway.config
    if config.job_history <= 0 or config.job_history_bytes <= 0:
        return
    record: dict[str, Any] = {
        "id": job_id,
        "member": who.member,
        "tier": who.tier,
        "priority": priority,
        "model": model,
        "path": path,
        "outcome": outcome,
        "status": status,
        "_grant": grant,
        "upstream": None if grant is None else grant.worker,
    }
    if grant is not None:
        record["runtime"] = max(0.0, gateway.gate.now() - grant.granted_at)
    size = _RECORD_OVERHEAD + len(job_id) + len(who.member) + len(model or "") + len(path)
    gateway.history.keep(
        job_id, record, size, most=config.job_history, most_bytes=config.job_history_bytes
    )


_RECORD_OVERHEAD = 1200
"""Estimated bytes of one history record beyond its strings (dict, grant, floats)."""


def finished(
    gateway: Gateway,
    job_id: str,
    who: Identity,
    path: str,
    asked: tuple[str | None, int],
    arrival: float,
    grant: Grant | None,
    flight: Flight,
    outcome: str,
    status: int,
) -> None:
    """Keep a finished gated request in the history (and in the recorded trace, if any).

    ``asked`` is the request's model and priority.
    """
    model, priority = asked
    remember(gateway, job_id, who, model, path, priority, outcome, status, grant)
    if gateway.recorder is not None:
        record_finished(
            gateway.recorder,
            arrival=arrival,
            now=gateway.gate.now(),
            member=who.member,
            tier=who.tier,
            priority=priority,
            model=model,
            estimate=gateway.config.estimate_seconds,
            outcome=outcome,
            grant=grant,
            first_byte=flight.first_byte,
            streamed=flight.sse,
            known_load=None if model is None else gateway.record_loads.get(model),
            swap=flight.swap,
        )
