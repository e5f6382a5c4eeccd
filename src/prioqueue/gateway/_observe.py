"""The gateway's own endpoints: ``/prioqueue/status``, ``/prioqueue/jobs/{id}``, ``/metrics``.

Times in the answers are relative (seconds waited, seconds until an estimated start), never
the dispatcher's monotonic clock, which means nothing outside the process.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue._errors import UnknownJob

if TYPE_CHECKING:
    from prioqueue.gateway.app import Gateway

__all__ = ["explain", "metrics_renderer", "serve", "status"]

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_STATUS_LIMIT = 1000
"""Most queued jobs listed by ``/prioqueue/status`` (the counts are always complete)."""


def _relative(when: float | None, now: float) -> float | None:
    return None if when is None else round(max(0.0, when - now), 3)


def status(gateway: Gateway, *, limit: int = _STATUS_LIMIT) -> dict[str, Any]:
    """Return the queue as JSON-ready data: the running job, then each level's queue.

    Args:
        gateway: The gateway.
        limit: Most queued jobs to list (in predicted dispatch order).

    Returns:
        ``{"running": ..., "resident_model": ..., "queued": n, "levels": {level: {...}}}``;
        each level lists its jobs with their overall position and estimated start.

    Complexity: O(L log L + k log L) for L lanes and k listed jobs (the forecast).
    """
    dispatcher = gateway.dispatcher
    now = gateway.gate.now()
    stats = dispatcher.stats(now=now)
    running: dict[str, Any] | None = None
    grant = dispatcher.running
    if grant is not None:
        job = grant.job
        running = {
            "id": job.id,
            "member": job.member,
            "priority": job.priority,
            "tier": job.tier,
            "model": job.model,
            "path": job.payload,
            "waited": round(grant.waited, 3),
            "running_for": round(max(0.0, now - grant.granted_at), 3),
            "lease_remaining": None
            if grant.lease is None
            else round(grant.lease.remaining(now), 3),
        }
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
    return {
        "running": running,
        "resident_model": dispatcher.resident_model,
        "queued": len(dispatcher),
        "dispatched": stats.dispatched,
        "completed": stats.completed,
        "cancelled": stats.cancelled,
        "expired": stats.expired,
        "swaps": stats.swaps,
        "closing": gateway.gate.closed,
        "levels": levels,
    }


def explain(gateway: Gateway, job_id: str) -> dict[str, Any]:
    """Return why a job waits (queued or running), or its record once finished.

    Args:
        gateway: The gateway.
        job_id: The id from the ``X-Prioqueue-Job`` header.

    Returns:
        For a live job, the dispatcher's explanation (``text`` reads like ``sprio``); for a
        finished one, the gateway's record of it (outcome, status, wait, runtime, the score
        at its grant, and the explanation captured at its grant when it waited long).

    Raises:
        UnknownJob: The job is neither live nor remembered.
    """
    if job_id in gateway.dispatcher:
        explanation = gateway.gate.explain(job_id)
        now = explanation.now
        data = attrs.asdict(explanation)
        data["text"] = str(explanation)
        data["estimated_start_in"] = _relative(explanation.estimated_start, now)
        for entry in data["ahead"]:
            entry["estimated_start_in"] = _relative(entry.pop("estimated_start"), now)
        for entry in data["overtaken_by"]:
            entry["seconds_ago"] = round(max(0.0, now - entry.pop("at")), 3)
        for key in ("now", "estimated_start", "lane_start"):
            data.pop(key, None)
        data["job"].pop("arrival", None)
        data["job"].pop("seq", None)
        return data
    record = gateway.history.get(job_id)
    if record is None:
        raise UnknownJob(f"job {job_id!r} is not queued, running or remembered")
    return {"state": "finished", **record}


def capture(gateway: Gateway, job_id: str) -> dict[str, Any] | None:
    """Return the explanation of a job that just got the GPU (kept for after it finishes)."""
    try:
        return explain(gateway, job_id)
    except UnknownJob:  # pragma: no cover - defensive: called while the job runs
        return None


def metrics_renderer(gateway: Gateway) -> Callable[[], bytes] | None:
    """Return a function rendering the Prometheus text exposition, or None without the extra."""
    try:
        from prometheus_client import CollectorRegistry

        from prioqueue import prometheus
    except ImportError:  # pragma: no cover - exercised only without the extra
        return None
    registry = CollectorRegistry()  # one per gateway: several can live in one process
    prometheus.register(gateway.gate, registry=registry)
    return lambda: prometheus.render(registry)


async def _json(send: Send, status_code: int, value: object) -> None:
    body = json.dumps(value, indent=1, default=str).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve(gateway: Gateway, scope: MutableMapping[str, Any], send: Send) -> None:
    """Answer a request to one of the gateway's own paths (only GET is allowed)."""
    path: str = scope["path"]
    if scope["method"] not in ("GET", "HEAD"):
        await _json(send, 405, {"error": {"message": "only GET is allowed here"}})
    elif path == "/metrics":
        render = gateway.metrics
        if render is None:
            await _json(send, 404, {"error": {"message": "install prioqueue-lanes[prometheus]"}})
            return
        body = render()
        headers = [
            (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif path == "/prioqueue/status":
        await _json(send, 200, status(gateway))
    elif path.startswith("/prioqueue/jobs/"):
        job_id = path[len("/prioqueue/jobs/") :]
        try:
            await _json(send, 200, explain(gateway, job_id))
        except UnknownJob as exc:
            await _json(send, 404, {"error": {"message": str(exc)}})
    else:
        await _json(send, 404, {"error": {"message": f"no such path {path}"}})
