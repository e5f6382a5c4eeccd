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

import asyncio
import contextlib
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from prioqueue._core import LEVEL_LIMIT
from prioqueue.broker._waiters import MAX_WAIT, long_pop, wait_job
from prioqueue.broker.config import BrokerConfig, BrokerKey, Connections
from prioqueue.broker.engine import BrokerEngine, JobRecord, Rejected
from prioqueue.broker.journal import MemoryJournal
from prioqueue.broker.models import (
    ErrorBody,
    FailRequest,
    FinishRequest,
    Granted,
    GroupCancelled,
    GroupView,
    HeartbeatReply,
    HeartbeatRequest,
    JobCreated,
    JobView,
    PopRequest,
    StatusView,
    SubmitRequest,
)
from prioqueue.broker.service import Broker, Standby

__all__ = ["create_app"]

_ID = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f/]+$")]
_MEMBER = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=200,
        description="Another member's group (a key with observer = true reads it, one with "
        "admin = true also cancels it); default: the key's own member.",
    ),
]
_WAIT = Annotated[
    float,
    Query(
        ge=0,
        le=MAX_WAIT,
        description="Long-poll: seconds (0..60) to wait for a change before answering.",
    ),
]
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 403, 404, 408, 409, 413, 422, 429, 431, 503)
}


# Location parts that name a container or a union member rather than a field.
_LOC_NOISE = frozenset(("body", "path", "int", "str", "float", "bool", "list", "dict", "none"))


class _Forbidden(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str, field: str | None = None, **headers: str) -> JSONResponse:
    return JSONResponse(
        {"error": message, "field": field}, status_code=status, headers=headers or None
    )


class _BodyLimit:
    """ASGI middleware: the request limits that hold whichever server runs the app.

    A request body over ``limit`` bytes is answered 413 unread, and one that does not arrive
    within ``timeout`` seconds 408. With ``connections`` given, headers over its size or count
    limits are 431 and a request past ``max_connections`` requests in flight is 503 with
    ``Retry-After`` (``prioqueue broker`` refuses those earlier, in its HTTP protocol; under
    another server these still apply, though the header timeouts are that server's).
    """

    def __init__(
        self,
        app: Any,
        limit: int,
        timeout: float = 60.0,
        connections: Connections | None = None,
        retry_after: float = 2.0,
    ) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout
        self.connections = connections
        self.retry_after = str(max(1, math.ceil(retry_after)))
        self.in_flight = 0

    def _header_problem(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        limits = self.connections
        if limits is None:
            return None
        if len(headers) > limits.max_header_count:
            return f"{len(headers)} headers, over max_header_count={limits.max_header_count}"
        total = 0
        for name, value in headers:
            size = len(name) + len(value)
            total += size
            if size > limits.max_header_bytes:
                return f"a header of {size} bytes, over max_header_bytes={limits.max_header_bytes}"
        if total > limits.max_headers_bytes:
            return f"{total} bytes of headers, over max_headers_bytes={limits.max_headers_bytes}"
        return None

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self._header_problem(scope["headers"])
        if problem is not None:
            await _error(431, f"request header fields too large: {problem}", "headers")(
                scope, receive, send
            )
            return
        cap = None if self.connections is None else self.connections.max_connections
        if cap is not None and self.in_flight >= cap:
            message = f"over max_connections={cap} requests in flight; retry later"
            await _error(503, message, None, **{"Retry-After": self.retry_after})(
                scope, receive, send
            )
            return
        self.in_flight += 1
        try:
            await self._limited(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _limited(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                await _error(413, f"the body is over max_body_bytes={self.limit}", "body")(
                    scope, receive, send
                )
                return
        # Read the body here, up to the limit and within the timeout, then replay it.
        chunks: list[bytes] = []
        seen = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except (TimeoutError, asyncio.TimeoutError):
                late = f"the request body did not arrive within body_timeout={self.timeout:g} s"
                await _error(408, late, "body", Connection="close")(scope, receive, send)
                return
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                await _error(413, f"the body is over max_body_bytes={self.limit}", "body")(
                    scope, receive, send
                )
                return
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> MutableMapping[str, Any]:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)


def _key(request: Request, authorization: str | None, role: str) -> BrokerKey:
    if authorization is None:
        raise _Forbidden(401, "missing Authorization: Bearer <key>")
    scheme, _, token = authorization.partition(" ")
    keys = request.app.state.config.keys
    key: BrokerKey | None = keys.get(token.strip()) if scheme.lower() == "bearer" else None
    if key is None:
        raise _Forbidden(401, "unknown API key")
    if role not in ("any", key.role):
        raise _Forbidden(403, f"this key's role is {key.role}; this route needs {role}")
    return key


async def _submitter_key(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> BrokerKey:
    return _key(request, authorization, "submitter")


async def _worker_key(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> BrokerKey:
    key = _key(request, authorization, "worker")
    worker = request.path_params.get("worker")
    if worker is not None:  # every /v1/workers/{worker}/... route: pop, heartbeat, leave...
        _acts_as(key, worker)
    return key


async def _any_key(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> BrokerKey:
    return _key(request, authorization, "any")


def _acts_as(key: BrokerKey, worker: str) -> None:
    """Refuse a worker key naming a worker id its rule does not allow (403)."""
    if not key.may_act_as(worker):
        raise Rejected(
            403,
            f"this worker key may act only as {key.worker_rule()}; not as worker {worker!r}",
            field="worker",
        )


def _acting_worker(worker: _ID, key: Annotated[BrokerKey, Depends(_worker_key)]) -> str:
    return worker  # _worker_key checked it


Submitter = Annotated[BrokerKey, Depends(_submitter_key)]
WorkerKey = Annotated[BrokerKey, Depends(_worker_key)]
AnyKey = Annotated[BrokerKey, Depends(_any_key)]
ActingWorker = Annotated[str, Depends(_acting_worker)]
"""The ``{worker}`` of the path, once the worker key may act as it (else 403). Any route with
``{worker}`` in its path and a ``WorkerKey`` gets the same check."""


def _lifecycle_args(body: SubmitRequest) -> dict[str, Any]:
    """The submit's lifecycle fields that are set (unset ones stay out of the journal)."""
    args: dict[str, Any] = {
        "ttl": body.ttl, "not_before": body.not_before, "max_attempts": body.max_attempts,
        "backoff": None if body.backoff is None else body.backoff.model_dump(),
    }  # fmt: skip
    return {key: value for key, value in args.items() if value is not None}


def create_app(
    config: BrokerConfig, journal: MemoryJournal | None = None, *, clock: Any = None
) -> FastAPI:
    """Build the broker's ASGI application.

    Args:
        config: The configuration.
        journal: Keep the state in memory with this journal, whatever ``config.store``
            says (tests, demos).
        clock: A store's :class:`prioqueue.store.WallClock` (tests; see ``Broker``).

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
        responses=_ERRORS,
    )
    app.state.broker = broker
    app.state.config = config
    app.state.broker_started = False
    retry = str(math.ceil(config.retry_after_seconds))

    @app.exception_handler(Rejected)
    async def rejected(_request: Request, exc: Rejected) -> JSONResponse:
        headers = (
            {"Retry-After": str(math.ceil(exc.retry_after))}
            if exc.status in (429, 503) and exc.retry_after > 0
            else {}
        )
        return _error(exc.status, str(exc), exc.field, **headers)

    @app.exception_handler(_Forbidden)
    async def forbidden(_request: Request, exc: _Forbidden) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        return _error(
            exc.status, str(exc), "Authorization" if exc.status < 413 else "body", **headers
        )

    @app.exception_handler(Standby)
    async def standby(_request: Request, exc: Standby) -> JSONResponse:
        headers = {"Retry-After": retry}
        if exc.leader:
            headers["X-Prioqueue-Leader"] = exc.leader
        body = {"error": str(exc), "field": None, "leader": exc.leader}
        return JSONResponse(body, status_code=503, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = "body" if exc.status_code == 400 else None  # 400: an unparseable body
        return _error(exc.status_code, str(exc.detail), field, **(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        first: str | None = None
        for error in exc.errors():
            if error.get("type") == "json_invalid":  # loc is ("body", offset of the fault)
                at = error.get("loc", ())[-1]
                why = (error.get("ctx") or {}).get("error", "")
                first = first or "body"
                problems.append(f"body: not valid JSON at character {at}: {why}".rstrip(": "))
                continue
            loc = [
                str(part)
                for part in error.get("loc", ())
                if part not in _LOC_NOISE and "[" not in str(part)
            ]
            name = ".".join(loc) or "body"
            first = first or name
            problems.append(f"{name}: {error.get('msg', 'invalid')}")
        return _error(422, "; ".join(problems), first)

    @app.post("/v1/jobs", status_code=201, response_model=JobCreated, tags=["submitters"])
    async def submit(
        body: SubmitRequest,
        key: Submitter,
        response: Response,
        x_llamaswap_priority: Annotated[str | None, Header(max_length=64)] = None,
        idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
    ) -> JobCreated:
        """Queue a job for the fleet."""
        raw = body.priority if body.priority is not None else x_llamaswap_priority
        priority = config.policy.parse(raw, ceiling=key.max_priority)
        if not -LEVEL_LIMIT <= priority <= LEVEL_LIMIT:  # the dispatcher's range, else a 500
            raise Rejected(
                422,
                f"priority must resolve to a level within +-{LEVEL_LIMIT} (the policy's minimum "
                "applies when one is configured)",
                field="priority",
            )
        # The lease inputs' check reads only the configuration: no wait for the store here
        # (issue 21: a read barrier per submit collapsed the durable broker under load).
        image = None if body.image is None else broker.serving_engine().check_image(body.image)
        record, created = await broker.run(
            "submit",
            {
                "member": key.member, "tier": key.tier, "priority": priority,
                "model": body.model, "estimate": body.estimate, "group": body.group,
                "image": image, "payload": body.payload, "idempotency_key": idempotency_key,
                **_lifecycle_args(body),
            },
        )  # fmt: skip
        if not created:
            response.status_code = 200
        return JobCreated(id=record.id)

    def view(
        record: JobRecord,
        position: int | None,
        explanation: str | None,
        engine_now: BrokerEngine | None = None,
    ) -> JobView:
        return JobView(
            id=record.id, state=record.state, position=position, explanation=explanation,
            result=record.result, priority=record.priority, model=record.model,
            group=record.group, attempt=record.attempt, submitted_at=record.submitted_at,
            finished_at=record.finished_at, expires_at=record.expires_at,
            not_before=None if engine_now is None else engine_now.not_before(record),
        )  # fmt: skip

    @app.get("/v1/jobs/{job_id}", response_model=JobView, tags=["submitters"])
    async def get_job(job_id: _ID, key: Submitter, wait: _WAIT = 0.0) -> JobView:
        """A job's state, place in line, explanation and result (``?wait=S``: long-poll)."""

        def render(engine: BrokerEngine, record: JobRecord) -> JobView:
            return view(record, *engine.position(record, key.may_read), engine)

        return await wait_job(broker, job_id, key.member, wait, render)

    @app.delete("/v1/jobs/{job_id}", response_model=JobView, tags=["submitters"])
    async def cancel(job_id: _ID, key: Submitter) -> JobView:
        """Cancel a queued or running job."""
        record = await broker.run("cancel", {"job_id": job_id, "member": key.member})
        return view(record, None, None)

    def whose(key: BrokerKey, member: str | None, *, cancel: bool) -> str:
        own = key.member or ""
        if member is None or member == own:
            return own
        if key.may_cancel(member) if cancel else key.may_read(member):
            return member
        flag = "admin = true" if cancel else "observer = true or admin = true"
        verb = "cancels" if cancel else "reads"
        raise Rejected(
            403,
            f"this key {verb} only member {own!r}'s groups; ?member= of another member needs "
            f"{flag} on the key",
            field="member",
        )

    @app.get("/v1/groups/{group}", response_model=GroupView, tags=["submitters"])
    async def get_group(group: _ID, key: Submitter, member: _MEMBER = None) -> GroupView:
        """A group's jobs by state, GPU-seconds, mean runtime and forecast finish."""
        from prioqueue.broker._groups import group_status

        owner = whose(key, member, cancel=False)
        status = await broker.query(lambda engine: group_status(engine, group, owner))
        now = broker.now()
        finish = status.forecast_finish
        left = None if finish is None else max(0.0, finish - now)
        return GroupView(
            group=group, member=owner, queued=status.queued, running=status.running,
            done=status.done, failed=status.failed, cancelled=status.cancelled,
            gpu_seconds=status.gpu_seconds, mean_runtime=status.mean_runtime,
            forecast_finish=finish, forecast_seconds=left, now=now,
        )  # fmt: skip

    @app.delete("/v1/groups/{group}", response_model=GroupCancelled, tags=["submitters"])
    async def cancel_group(
        group: _ID,
        key: Submitter,
        running: Literal["keep", "cancel"] = "keep",
        member: _MEMBER = None,
    ) -> GroupCancelled:
        """Cancel a group's queued jobs (``?running=cancel``: its running ones too)."""
        owner = whose(key, member, cancel=True)
        args = {"group": group, "member": owner, "running": running}
        cancelled = await broker.run("cancel_group", args)
        return GroupCancelled(group=group, member=owner, cancelled=cancelled)

    @app.post(
        "/v1/workers/{worker}/pop",
        response_model=Granted,
        responses={204: {"description": "Nothing fits; X-Prioqueue-Idle says why."}},
        tags=["workers"],
    )
    async def pop(worker: ActingWorker, body: PopRequest, wait: _WAIT = 0.0) -> Any:
        """Take the next job this worker should run, with its lease (``?wait=S``: long-poll)."""
        record, idle_reasons = await long_pop(broker, worker, body.model_dump(), wait)
        if record is None:
            idle = ", ".join(f"{k}={v}" for k, v in sorted(idle_reasons.items())) or "empty"
            return Response(status_code=204, headers={"X-Prioqueue-Idle": idle})
        assert record.lease_seconds is not None  # a grant has its lease
        assert record.deadline is not None
        return Granted(
            id=record.id, payload=record.payload, image=record.image, model=record.model,
            attempt=record.attempt, lease_seconds=record.lease_seconds, deadline=record.deadline,
        )  # fmt: skip

    async def finish(op: str, job_id: str, body: FinishRequest, key: BrokerKey) -> JobView:
        _acts_as(key, body.worker)
        args = {"job_id": job_id, "worker": body.worker, "attempt": body.attempt}
        if isinstance(body, FailRequest) and body.retry:
            args["retry"] = True  # journaled only when set: older journals replay as they were
        record = await broker.run(op, {**args, "result": body.result})
        return await broker.query(lambda engine: view(record, None, None, engine))

    @app.post("/v1/jobs/{job_id}/complete", response_model=JobView, tags=["workers"])
    async def complete(job_id: _ID, body: FinishRequest, key: WorkerKey) -> JobView:
        """Report the job done (only its current holder: worker and attempt must match)."""
        return await finish("complete", job_id, body, key)

    @app.post("/v1/jobs/{job_id}/fail", response_model=JobView, tags=["workers"])
    async def fail(job_id: _ID, body: FailRequest, key: WorkerKey) -> JobView:
        """Report the job failed (only its current holder); ``retry``: queue it again."""
        return await finish("fail", job_id, body, key)

    @app.post("/v1/workers/{worker}/heartbeat", response_model=HeartbeatReply, tags=["workers"])
    async def heartbeat(
        worker: ActingWorker, body: HeartbeatRequest | None = None
    ) -> HeartbeatReply:
        """Say the worker is alive (and which model it has loaded)."""
        resident = None if body is None else body.resident
        jobs = await broker.run("heartbeat", {"worker": worker, "resident": resident})
        return HeartbeatReply.model_validate({"jobs": jobs})

    @app.get("/v1/status", response_model=StatusView, tags=["operators"])
    async def status(_key: AnyKey) -> StatusView:
        """Counts by state, workers, totals, and who leads."""
        counts = await broker.query(lambda engine: engine.status())
        return StatusView(role="leader", leader=broker.leader, **counts)

    @app.get("/metrics", tags=["operators"], response_class=Response)
    async def metrics(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        """Prometheus metrics (needs the ``prometheus`` extra).

        It needs an observer or admin key unless ``metrics_public = true`` (its labels name
        members).
        """
        from prioqueue.broker._metrics import render

        if not config.metrics_public:
            key = _key(request, authorization, "any")
            if not (key.observer or key.admin):
                raise _Forbidden(
                    403,
                    "/metrics names members: it needs a key with observer = true or "
                    "admin = true (or metrics_public = true in the configuration)",
                )

        body, content_type = render(broker)
        return Response(body, media_type=content_type)

    app.include_router(_dashboard_router())  # GET /ui and /v1/dashboard (issue 19)
    from prioqueue.broker._client_routes import client_router

    app.include_router(client_router(broker, config, view))  # batch, leave (issue 18)
    from prioqueue.broker._content import JsonBodies

    app.add_middleware(JsonBodies)
    app.add_middleware(
        _BodyLimit,
        limit=config.max_body_bytes,
        timeout=config.connections.body_timeout,
        connections=config.connections,
        retry_after=config.retry_after_seconds,
    )
    return app


def _dashboard_router() -> Any:
    from prioqueue.broker._dashboard import router

    return router
