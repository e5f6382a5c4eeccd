"""The gateway's dashboard: the page at ``/prioqueue/ui`` and ``GET /prioqueue/dashboard``.

The page lives under ``/prioqueue/`` (the gateway's own paths), not at ``/ui``: llama-swap
serves its own UI at ``/ui`` and the gateway passes that through. The page is static and needs
no key (it is answered before the caller is identified); ``/prioqueue/dashboard`` is
authorised exactly like ``/prioqueue/status`` and shows what that caller may see there: an
observer (``observer``/``admin`` key, or ``anonymous_observer``) everything; anyone else the
level aggregates, its own member's lanes, jobs and groups, and the upstreams without resident
model, URL or swaps (others' jobs appear as ``{"hidden": true}``). ``?job=ID`` adds the job
panel (the same rules as ``/prioqueue/jobs/{id}``).

Cost: ``stats()`` plus the bounded walks of :mod:`prioqueue.ui.model`; never O(queued).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from prioqueue.errors import UnknownJob
from prioqueue.gateway import _observe
from prioqueue.gateway._forward import Send, send_json
from prioqueue.ui import CSP, asset
from prioqueue.ui import model as _model

if TYPE_CHECKING:
    from prioqueue.gateway._host import Host as Gateway
    from prioqueue.gateway.settings import Identity

__all__ = ["PAGE", "dashboard", "memory", "serve", "serve_page"]

PAGE = "/prioqueue/ui"
"""Where the gateway serves the dashboard page."""


def memory() -> tuple[_model.Recent, _model.ForecastCache]:
    """What the dashboard keeps between two reads: recent finishes, forecasts' cache."""
    return (_model.Recent(), _model.ForecastCache())


def _panel(gateway: Gateway, job_id: str, who: Identity, now: float) -> dict[str, Any]:
    dispatcher = gateway.dispatcher
    try:
        if job_id in dispatcher:
            job = dispatcher.job(job_id)
            if not _observe.sees(who, job.member):
                raise UnknownJob(f"job {job_id!r} is not queued, running or remembered")
            explained = _observe.explain_live(gateway, job_id)
            worker = gateway.gate.holder(job_id)
            return {
                "id": job_id, "member": job.member, "state": explained.state,
                "priority": job.priority, "model": job.model, "group": None,
                "worker": worker, "path": job.payload,
                "explain": _model.explanation(
                    explained, now, lambda m: _observe.sees(who, m)
                ),
            }  # fmt: skip
        data = _observe.explain(gateway, job_id, who)
    except UnknownJob as exc:
        return {"id": job_id, "error": str(exc)}
    return {**data, "id": job_id, "state": data.get("outcome", "finished"), "explain": None}


def dashboard(gateway: Gateway, who: Identity, job: str | None = None) -> dict[str, Any]:
    """What the page shows, cut to what ``who`` may see (see the module docstring).

    Args:
        gateway: The gateway.
        who: The caller.
        job: A job id for the job panel, or None.

    Returns:
        JSON-ready data in the shape of the broker's ``GET /v1/dashboard``.

    Complexity: O(levels + lanes + workers + groups) plus the fixed bounds of
    :mod:`prioqueue.ui.model`.
    """
    d = gateway.dispatcher
    now = gateway.gate.now()
    everyone = who.observer

    def visible(member: str) -> bool:
        return everyone or member == who.member

    stats = d.stats(now=now)
    recent, cache = gateway.dashboard_state
    history = _model.history(d, now)
    workers = _model.workers(d, now, visible, history)
    if gateway.upstreams:
        rows = {row["name"]: row for row in workers}
        workers = []
        for name, upstream in gateway.upstreams.items():
            row = rows.get(name) or {
                "name": name, "models": None, "resident": None, "slots": upstream.config.slots,
                "slow": upstream.config.slow, "timed_out": False, "last_seen_ago": None,
                "running": None, "prefetched": [], "swaps": [],
            }  # fmt: skip
            row["unhealthy"] = not upstream.up
            row["last_error"] = upstream.last_error if everyone else None
            row["resident"] = upstream.loaded
            workers.append(row)
    else:
        for row in workers:
            row["name"] = "upstream"
            row["unhealthy"] = gateway.breaker.state != "closed"
            row["resident"] = getattr(d, "resident_model", None)
    if not everyone:
        for row in workers:
            row.update(resident=None, models=None, swaps=[], last_error=None)
    return {
        "service": "gateway",
        "role": "submitter",
        "member": who.member,
        "scope": "all" if everyone else "member",
        "admin": who.admin,
        "now": now,
        "queued": stats.queued,
        "running": len(stats.held),
        "totals": {
            "dispatched": stats.dispatched,
            "completed": stats.completed,
            "cancelled": stats.cancelled,
            "expired": stats.expired,
            "failed": stats.failed,
        },
        "level_names": _model.level_names(gateway.config.policy.aliases),
        "levels": recent.levels(stats, now),
        "lanes": _model.lanes(d, now, visible, history),
        "workers": workers,
        "groups": _model.groups(
            d, now, now, visible, may_cancel=lambda m: m == who.member or who.admin, cache=cache
        ),
        "job": None if job is None else _panel(gateway, job, who, now),
        "limits": {
            "window_seconds": _model.WINDOW,
            "lane_heads": _model.LANE_HEADS,
            "groups": _model.GROUP_LIMIT,
            "forecast_jobs": _model.FORECAST_LIMIT,
            "poll_seconds": 2.0,
        },
    }


async def serve(
    gateway: Gateway, scope: MutableMapping[str, Any], send: Send, who: Identity
) -> int:
    """Answer ``GET /prioqueue/dashboard[?job=ID]``; return the status."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    job = query.get("job", [None])[0] or None
    if job is not None and len(job) > 200:
        message = "job: at most 200 characters"
        return await send_json(send, 400, {"error": {"message": message}})
    return await send_json(send, 200, dashboard(gateway, who, job))


async def serve_page(send: Send, path: str) -> int:
    """Answer ``GET /prioqueue/ui`` (the page) and its files; no key needed; the status."""
    name = path[len(PAGE) :].lstrip("/")
    found = asset(name, service="gateway", base=PAGE)
    if found is None:
        return await send_json(send, 404, {"error": {"message": f"no such path {path}"}})
    body, kind = found
    headers = [
        (b"content-type", kind.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-cache"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return 200
