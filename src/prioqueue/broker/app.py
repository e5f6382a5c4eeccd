"""The broker's HTTP/JSON API: FastAPI routes over :class:`~prioqueue.broker.service.Broker`.

Routes (every one but the OpenAPI pages needs ``Authorization: Bearer KEY``, and so does
``/metrics`` unless ``metrics_public = true``; no or an unknown key is 401, a key of the
wrong role 403):

=========================================  =========  =========================================
route                                      role       answer
=========================================  =========  =========================================
``POST /v1/jobs``                          submitter  201 ``{"id"}`` (200: idempotent replay)
``GET /v1/jobs/{id}``                      submitter  the job (its member's only; others 404)
``DELETE /v1/jobs/{id}``                   submitter  the cancelled job
``GET /v1/groups/{id}``                    submitter  the group's counts, GPU time, forecast
``DELETE /v1/groups/{id}``                 submitter  cancels its queued (running) jobs
``POST /v1/jobs/batch``                    submitter  201 ``{"ids"}``: all or none (one operation)
``POST /v1/workers/{id}/pop``              worker     200 the job and its lease; 204 idle
``POST /v1/workers/{id}/leave``            worker     ``{"requeued"}``: its jobs, queued again
``POST /v1/jobs/{id}/complete`` / ``fail`` worker     the finished job; 409 stale grant
``POST /v1/workers/{id}/heartbeat``        worker     the jobs it holds
``GET /v1/status``                         any        counts, role and leader
``GET /metrics``                           observer   Prometheus text (``metrics_public``: none)
``/api/v2/generate/...`` (the AI Horde's)  apikey     the Horde's answers (docs/horde.md)
=========================================  =========  =========================================

Errors are JSON ``{"error": message, "field": name}``. A standby answers 503 with
``Retry-After`` and the leader's address (``X-Prioqueue-Leader`` and the body's ``leader``).
The idle reasons of a 204 are in ``X-Prioqueue-Idle`` (``model=3, slots_full=1``).
``?wait=S`` (0..60) on the pop and on ``GET /v1/jobs/{id}`` long-polls (see
:mod:`prioqueue.broker._waiters`). Bodies are JSON whatever their ``Content-Type`` says
(:mod:`prioqueue.broker._content`).
A group is its member's own: ``?member=`` names another member's group, for a key with
``observer = true`` (read) or ``admin = true`` (read and cancel); else 403.

A worker key acts only as the worker ids its ``workers``/``workers_prefix`` allow: a pop,
heartbeat, complete or fail naming another id is 403 (the message quotes the rule). A job's
explanation names other members' jobs only to an observer or admin key; to anyone else they
keep their priority and score but read ``(hidden)`` and ``(another member)``.

A request's body must arrive within ``connections.body_timeout`` (else 408) and be at most
``max_body_bytes`` (else 413); headers over the ``[connections]`` size or count limits are 431
and the request past ``max_connections`` in flight 503, under any ASGI server (``prioqueue
broker`` refuses those earlier, in its HTTP protocol, and adds the header timeouts).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Request, Response

from prioqueue.broker._client_routes import client_router
from prioqueue.broker._content import JsonBodies
from prioqueue.broker._dashboard import router as dashboard_router
from prioqueue.broker._horde_routes import horde_router
from prioqueue.broker._http import ERRORS, AnyKey, Forbidden, api_key, install_handlers
from prioqueue.broker._job_routes import submitter_router
from prioqueue.broker._limits import BodyLimit
from prioqueue.broker._submit_route import SubmitRoute
from prioqueue.broker._worker_routes import worker_router
from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.journal import MemoryJournal
from prioqueue.broker.models import StatusView
from prioqueue.broker.service import Broker

__all__ = ["create_app"]


def create_app(
    config: BrokerConfig,
    journal: MemoryJournal | None = None,
    *,
    clock: Any = None,
    lean_submit: bool = True,
) -> FastAPI:
    """Build the broker's ASGI application.

    Args:
        config: The configuration.
        journal: Keep the state in memory with this journal, whatever ``config.store``
            says (tests, demos).
        clock: A store's :class:`prioqueue.store.WallClock` (tests; see ``Broker``).
        lean_submit: Serve ``POST /v1/jobs`` with :class:`~prioqueue.broker._submit_route.
            SubmitRoute`, outside FastAPI's routing (the default: the same answers, a
            fraction of the work); False: through its FastAPI route like every other route
            (the reference the tests compare it with).

    Returns:
        The FastAPI app; ``app.state.broker`` is its :class:`Broker`. The broker starts
        (recovers, or waits as a standby) in the app's lifespan.
    """
    broker = Broker(config, journal, clock=clock)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            if not app.state.broker_started:  # `prioqueue broker` starts it before uvicorn
                await broker.start()
        except Exception as exc:  # a corrupt or locked store, a newer schema: say so plainly
            print(f"prioqueue broker: cannot start: {exc}", file=sys.stderr, flush=True)
            raise
        try:
            yield
        finally:
            await broker.stop()

    app = FastAPI(
        title="prioqueue broker",
        version="1",
        summary="Priority, fair-share job broker for a fleet of GPU workers.",
        lifespan=lifespan,
        responses=ERRORS,
    )
    app.state.broker = broker
    app.state.config = config
    app.state.broker_started = False

    retry = str(math.ceil(config.retry_after_seconds))
    install_handlers(app, retry)
    # The route groups, in the order of the OpenAPI document.
    app.include_router(submitter_router(broker, config))
    app.include_router(worker_router(broker))
    app.include_router(_operator_router(broker, config))
    app.include_router(dashboard_router)  # GET /ui and /v1/dashboard (issue 19)
    app.include_router(client_router(broker, config))  # batch, leave (issue 18)
    app.include_router(horde_router(broker, config))  # /api/v2/: the AI Horde's (issue 28)
    if lean_submit:  # innermost: inside the body limits and the Content-Type rule
        app.add_middleware(SubmitRoute, broker=broker, config=config, retry=retry)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, config=config)
    return app


def _operator_router(broker: Broker, config: BrokerConfig) -> APIRouter:
    """``GET /v1/status`` and ``GET /metrics``."""
    router = APIRouter()

    @router.get("/v1/status", response_model=StatusView, tags=["operators"])
    async def status(_key: AnyKey) -> StatusView:
        """Counts by state, workers, totals, and who leads."""
        counts = await broker.query(lambda engine: engine.status())
        return StatusView(role="leader", leader=broker.leader, **counts)

    @router.get("/metrics", tags=["operators"], response_class=Response)
    async def metrics(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        """Prometheus metrics (needs the ``prometheus`` extra).

        It needs an observer or admin key unless ``metrics_public = true`` (its labels name
        members).
        """
        from prioqueue.broker._metrics import render

        if not config.metrics_public:
            key = api_key(request, authorization, "any")
            if not (key.observer or key.admin):
                raise Forbidden(
                    403,
                    "/metrics names members: it needs a key with observer = true or "
                    "admin = true (or metrics_public = true in the configuration)",
                )

        body, content_type = render(broker)
        return Response(body, media_type=content_type)

    return router
