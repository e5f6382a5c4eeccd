"""The broker's dashboard: ``GET /ui`` (the page) and ``GET /v1/dashboard`` (what it polls).

Theory of operation
-------------------
The page is static (package data of :mod:`prioqueue.ui`): loading it needs no key and tells
nothing. Everything it shows comes from ``GET /v1/dashboard``, authorised exactly like
``GET /v1/status`` (any key; none or an unknown one is 401) and cut to what that key may read
through the rest of the API:

* **observer / admin** submitter keys: everything (every member's lanes, jobs and groups,
  the workers' resident models and swaps); admin keys may also cancel any group.
* **plain submitter** keys: the per-level aggregates (as ``/v1/status`` counts), their own
  member's lanes, jobs and groups; the workers' rows without resident model, models or swaps
  (they tell what others run) and with others' jobs as ``{"hidden": true}``.
* **worker** keys: the per-level aggregates and the workers' rows with the jobs held by the
  worker ids the key may act as (id, attempt, lease: what ``heartbeat`` tells it); other
  workers' jobs are ``{"hidden": true}``; no member, lane or group.

``?job=ID`` adds the job panel: the job's record and ``explain()`` (score terms, jobs ahead,
overtakes, forecast start), for a submitter key that may read it (its own member's job, any
job for an observer or admin key); others' jobs in the explanation lose id and member.

Cost: one read of the engine, ``stats()`` and the bounded walks of :mod:`prioqueue.ui.model`:
O(levels + lanes + workers + groups) plus fixed bounds, never O(queued jobs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from prioqueue.broker._http import AnyKey
from prioqueue.broker.config import BrokerKey
from prioqueue.broker.records import FINISHED, Rejected
from prioqueue.jobfields import names_in
from prioqueue.ui import CSP, asset
from prioqueue.ui import model as _model

__all__ = ["DashboardView", "router"]

EXPLAIN_AHEAD = 100
"""The most jobs ahead (and overtakes) the job panel lists."""

router = APIRouter()
_T = TypeVar("_T")


class DashboardView(BaseModel):
    """What ``GET /v1/dashboard`` answers (see docs/broker.md, "Dashboard")."""

    service: str = Field(description='"broker"')
    role: str = Field(description='The key\'s role: "submitter" or "worker".')
    member: str | None = Field(description="The key's member (None for a worker key).")
    scope: str = Field(
        description='What the key sees: "all" (observer/admin), "member" (its own member\'s '
        'jobs and groups) or "worker" (the jobs workers hold).'
    )
    admin: bool = Field(description="Whether the key may cancel any member's groups.")
    now: float = Field(description="The broker's wall-clock time (seconds since the epoch).")
    queued: int = Field(description="Jobs queued now (all members).")
    running: int = Field(description="Jobs held by workers now (all members).")
    totals: dict[str, int] = Field(description="Counts since the first start, by outcome.")
    level_names: dict[str, str] = Field(
        description="The policy's name of each level an alias names (level, as a string, to "
        'name: "100": "interactive" by default); the page shows it beside the number.'
    )
    levels: list[dict[str, Any]] = Field(
        description="Per priority level, highest first: queued, oldest_wait, mean_wait, "
        "dispatched, recent_grants, grants_per_minute, wait_p50 and wait_p95 (upper bounds of "
        "the wait histogram's buckets over window_seconds; wait_open: beyond the last bound), "
        "reorders (causes, deferred_crossings included where the core counts it)."
    )
    lanes: list[dict[str, Any]] = Field(
        description="Per member and level with jobs queued or running: queued, running, "
        "recent_grants, service (share of the level's recent grants), fair_share, and jobs "
        "(its 3 oldest queued; the running ones are in workers)."
    )
    workers: list[dict[str, Any]] = Field(
        description="Per worker: resident, models, slots, slow, timed_out, unhealthy, "
        "last_seen_ago, running (with lease_remaining), prefetched, swaps (recent: ago, from, "
        "to)."
    )
    groups: list[dict[str, Any]] = Field(
        description="At most 50 groups (active first): group, member, queued, running, done, "
        "failed, cancelled, gpu_seconds, mean_runtime, forecast_in (seconds), "
        "forecast_beyond, can_cancel."
    )
    job: dict[str, Any] | None = Field(
        default=None,
        description="With ?job=ID: the job (state, priority, model, group, labels, attempt, "
        "worker) and explain (score terms, position, ahead, overtaken_by, forecast_start_in), "
        "or error.",
    )
    limits: dict[str, float] = Field(description="The bounds behind the lists.")


_VIEWED = names_in("view")  # prioqueue.jobfields


def _scope(key: BrokerKey) -> str:
    if key.role != "submitter":
        return "worker"
    return "all" if key.observer or key.admin else "member"


def _job_panel(engine: Any, job_id: str, key: BrokerKey, now: float) -> dict[str, Any]:
    if key.role != "submitter":
        return {"id": job_id, "error": "a worker key reads no job panel"}
    everyone = key.observer or key.admin
    try:
        record = engine.owned(job_id, None if everyone else key.member)
    except Rejected as exc:
        return {"id": job_id, "error": str(exc)}
    data: dict[str, Any] = {
        "id": record.id,
        "member": record.member,
        "state": record.state,
        **{name: getattr(record, name) for name in _VIEWED},  # the job view's own fields
        "attempt": record.attempt,
        "worker": record.worker,
        "waited": None if record.state != "queued" else round(now - record.submitted_at, 3),
        "finished_ago": (
            None if record.finished_at is None else round(now - record.finished_at, 3)
        ),
        "lease_remaining": (
            None if record.deadline is None else round(max(0.0, record.deadline - now), 3)
        ),
        "explain": None,
    }
    if record.state not in FINISHED:
        explained = engine.fleet.explain(
            record.id, now=engine.now, ahead_limit=EXPLAIN_AHEAD, overtakes_limit=EXPLAIN_AHEAD
        )
        visible = (lambda _m: True) if everyone else (lambda m: m == key.member)
        data["explain"] = _model.explanation(explained, now, visible)
    return data


@router.get("/v1/dashboard", response_model=DashboardView, tags=["operators"])
async def dashboard(
    request: Request,
    key: AnyKey,
    job: Annotated[
        str | None,
        Query(min_length=1, max_length=200, description="Add this job's panel (explain)."),
    ] = None,
) -> JSONResponse:
    """Everything the dashboard page shows, cut to what this key may read; poll every 2 s."""
    state = request.app.state
    broker = state.broker
    recent = _state(state, "dashboard_recent", _model.Recent)
    forecasts = _state(state, "dashboard_forecast", _model.ForecastCache)
    names = _model.level_names(broker.config.policy.aliases)

    def build(engine: Any) -> dict[str, Any]:
        # Runs inside the broker's query: it sees applied state and writers never wait for it
        # (the answer is released once what it saw is committed).
        wall = max(broker.now(), engine.now)
        scope = _scope(key)
        member = key.member

        def visible(who: str) -> bool:
            return scope == "all" or (scope == "member" and who == member)

        fleet = engine.fleet
        # Read at the engine's time (the fleet has seen it); before the first operation the
        # fleet is empty and any time will do.
        at = engine.now if math.isfinite(engine.now) else wall
        stats = fleet.stats(now=at)
        history = _model.history(fleet, wall)
        workers = _model.workers(fleet, wall, visible, history)
        for row in workers:
            if scope != "all":
                row.update(resident=None, models=None, swaps=[])
        if scope == "worker":
            _worker_jobs(engine, fleet, workers, wall, key)
        lanes = [] if scope == "worker" else _model.lanes(fleet, wall, visible, history)
        groups = (
            []
            if scope == "worker"
            else _model.groups(
                fleet, at, wall, visible,
                known=engine.jobs.has_group,
                may_cancel=lambda m: m == member or key.admin,
                cache=forecasts,
            )
        )  # fmt: skip
        return {
            "service": "broker",
            "role": key.role,
            "member": member,
            "scope": scope,
            "admin": key.admin,
            "now": wall,
            "queued": stats.queued,
            "running": len(stats.held),
            "totals": dict(engine.jobs.counts),
            "level_names": names,
            "levels": recent.levels(stats, wall),
            "lanes": lanes,
            "workers": workers,
            "groups": groups,
            "job": None if job is None else _job_panel(engine, job, key, wall),
            "limits": {
                "window_seconds": _model.WINDOW, "lane_heads": _model.LANE_HEADS,
                "groups": _model.GROUP_LIMIT, "forecast_jobs": _model.FORECAST_LIMIT,
                "poll_seconds": 2.0,
            },
        }  # fmt: skip

    data = await broker.query(build)
    # The model documents the answer (OpenAPI); the dict goes out as it is (no validation
    # pass over a few hundred rows per poll).
    return JSONResponse(data)


def _state(state: Any, name: str, make: Callable[[], _T]) -> _T:
    """The app's dashboard state object ``name`` (made on first use)."""
    found = getattr(state, name, None)
    if found is None:
        found = make()
        setattr(state, name, found)
    return found


def _worker_jobs(
    engine: Any, fleet: Any, workers: list[dict[str, Any]], now: float, key: BrokerKey
) -> None:
    """A worker key sees its own workers' jobs as ``heartbeat`` tells them: no member."""
    for row in workers:
        shown: list[dict[str, Any]] = []
        for job_id in fleet.worker(row["name"]).held:  # ids, in grant order
            record = engine.jobs.get(job_id)
            if not key.may_act_as(row["name"]):  # another key's worker (issue 21 item 4)
                shown.append({"hidden": True})
                continue
            shown.append(
                {
                    "id": job_id,
                    "state": "running",
                    "attempt": None if record is None else record.attempt,
                    "lease_remaining": (
                        None
                        if record is None or record.deadline is None
                        else round(max(0.0, record.deadline - now), 3)
                    ),
                }
            )
        row["running"] = shown[0] if shown else None
        row["prefetched"] = shown[1:]


def _page(name: str) -> Response:
    found = asset(name, service="broker", base="/ui")
    if found is None:
        return Response(b"no such file", status_code=404, media_type="text/plain")
    body, kind = found
    headers = {
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return Response(body, media_type=kind, headers=headers)


@router.get("/ui", include_in_schema=False)
async def page() -> Response:
    """The dashboard page (static; it asks for a key and polls ``/v1/dashboard``)."""
    return _page("")


@router.get("/ui/{name}", include_in_schema=False)
async def page_file(name: str) -> Response:
    """The page's script and style sheet."""
    return _page(name)
