"""The AI Horde compatible routes, ``/api/v2/``: the Horde's clients and workers on our queue.

Private; the table of routes and what is supported is docs/horde.md. The routes sit beside
``/v1/`` on the same broker: the same queue, fair share, journal and leases.

* **Keys.** The Horde's ``apikey`` header names a configured key (any length, so the Horde's
  22-character keys work): a submitter key for ``generate/async``, a worker key (acting as the
  pop's ``name``) for ``generate/pop`` and ``generate/submit``. The anonymous key
  ``0000000000`` submits as ``[horde] anonymous_member`` when one is configured, else 401.
  ``check`` and ``status`` need no key, as on the Horde: the request id is the secret (64
  random bits).
* **A request of n images is n jobs** of one group, submitted in one operation
  (``submit_many``): all or none. Each job carries its :class:`~prioqueue.capabilities.Needs`
  and its lease inputs (with the baseline of each accepted model, from
  ``[horde.model_baselines]``), so a worker only gets what it declared it can run, and its
  ``ttl`` is ``lease_seconds()`` for the payload and the model the grant chose.
* **Answers** have the Horde's shapes (horde-sdk validates them); errors are
  ``{"message", "rc"}`` (400 with ``errors`` for an invalid body). Kudos are always 0.

Complexity: a request costs the broker operations it makes (``submit_many``: O(n (log N +
M))); ``check``/``status`` read the request's n records and one forecast.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from prioqueue.broker import _horde_view as view
from prioqueue.broker._horde_blobs import Blobs, blob_key, blobs_for
from prioqueue.broker._horde_config import ANONYMOUS_KEY
from prioqueue.broker._horde_models import (
    AsyncRequest,
    PopRequest,
    SubmitRequest,
    group_label,
    job_id_of,
    request_jobs,
    request_uuid,
)
from prioqueue.broker._http import Forbidden, acts_as, key_for, resolve_priority
from prioqueue.broker._waiters import long_pop
from prioqueue.broker.config import BrokerConfig, BrokerKey
from prioqueue.broker.records import Rejected
from prioqueue.broker.service import Broker, Standby

__all__ = ["horde_router"]

_M = TypeVar("_M", bound=BaseModel)
_RC = {400: "BadRequest", 401: "InvalidAPIKey", 403: "Forbidden", 404: "RequestNotFound",
       409: "Conflict", 413: "TooLarge", 422: "BadRequest", 429: "TooManyPrompts",
       503: "Unavailable"}  # fmt: skip


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"message": message, "rc": _RC.get(status, "Error"), **extra}, status)


def _horde_errors(
    handler: Callable[..., Awaitable[Any]],
) -> Callable[..., Awaitable[Any]]:
    """Answer the broker's refusals in the Horde's error shape."""

    @functools.wraps(handler)
    async def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return await handler(*args, **kwargs)
        except _Answer as exc:
            return exc.response
        except (Rejected, Forbidden) as exc:
            return _error(exc.status, str(exc))
        except Standby as exc:
            return _error(503, str(exc))

    return run


async def _body(request: Request, model: type[_M]) -> _M:
    """The request body as ``model``, or a 400 in the Horde's shape (raised as Rejected)."""
    try:
        data = await request.json()
    except ValueError:
        raise Rejected(400, "the body is not JSON") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = {".".join(map(str, e["loc"])) or "body": e["msg"] for e in exc.errors()}
        response = _error(400, "Input payload validation failed", errors=errors)
        raise _Answer(response) from None


def _key(request: Request, config: BrokerConfig, role: str) -> BrokerKey:
    """The configured key the ``apikey`` header names (the anonymous key if allowed)."""
    apikey = request.headers.get("apikey")
    horde = config.horde
    if apikey in (None, ANONYMOUS_KEY) and role == "submitter":
        if horde.anonymous_member is not None:
            return BrokerKey(role="submitter", member=horde.anonymous_member,
                             tier=horde.anonymous_tier)  # fmt: skip
        raise Forbidden(401, "anonymous requests are off: send your API key in 'apikey'")
    if apikey is None:
        raise Forbidden(401, "missing the 'apikey' header")
    return key_for(config.keys, f"Bearer {apikey}", role)


def horde_router(broker: Broker, config: BrokerConfig) -> APIRouter:
    """The ``/api/v2/`` routes, bound to ``broker``."""
    router = APIRouter(prefix="/api/v2", tags=["horde"])
    horde = config.horde
    blobs = blobs_for(config)

    @router.post("/generate/async", status_code=202)
    @_horde_errors
    async def generate_async(request: Request) -> Any:
        """Queue a request of ``params.n`` images (one job each); 202 ``{id, kudos: 0}``."""
        await _sweep(broker, config, blobs)
        return await _queue_request(broker, config, request)

    async def request_view(request_id: str, generations: bool) -> Any:
        return await _request_view(broker, blobs, request_id, generations)

    @router.get("/generate/check/{request_id}")
    @_horde_errors
    async def generate_check(request_id: str) -> Any:
        """The request's counts and forecast (no images); no key needed: the id is secret."""
        return await request_view(request_id, False)

    @router.get("/generate/status/{request_id}")
    @_horde_errors
    async def generate_status(request_id: str) -> Any:
        """The counts and the finished images."""
        return await request_view(request_id, True)

    @router.delete("/generate/status/{request_id}")
    @_horde_errors
    async def generate_cancel(request_id: str) -> Any:
        """Cancel what is not finished (running images too); answer the status."""
        found = request_jobs(request_id)
        if found is None:
            raise Rejected(404, f"no request {request_id!r} (not a request id)")
        label, ids = found
        member = await broker.query(lambda engine: view.owner(engine, label, ids))
        await broker.run("cancel_group", {"group": label, "member": member, "running": "cancel"})
        return await request_view(request_id, True)

    @router.post("/generate/pop")
    @_horde_errors
    async def generate_pop(request: Request) -> Any:
        """Give the worker the best job it can run, or say why none (``skipped``)."""
        body = await _body(request, PopRequest)
        key = _key(request, config, "worker")
        acts_as(key, body.name)
        popped = await long_pop(broker, body.name, body.spec(horde), 0.0, amount=body.amount)
        record, idle, siblings = popped
        if record is None:
            return view.no_job(idle)
        return view.granted(record, body, siblings)

    @router.post("/generate/submit")
    @_horde_errors
    async def generate_submit(request: Request) -> Any:
        """The worker's image: the job is done (``faulted``: failed); ``{reward: 0}``."""
        await _sweep(broker, config, blobs)
        return await _submit_image(broker, config, request, blobs)

    @router.get("/status/models")
    async def status_models(
        type: str = "image", min_count: int = 0, max_count: int | None = None
    ) -> Any:
        """Per model: its live workers and queued images (horde-sdk's models list)."""
        return await broker.query(lambda e: view.models(e, type, min_count, max_count))

    @router.get("/status/heartbeat")
    async def heartbeat() -> Any:
        """Whether the broker answers (horde-sdk's clients call it first)."""
        return {"message": "OK", "version": view.version()}

    return router


class _Answer(Rejected):
    """A ready answer raised through the handler (an invalid body's 400 with ``errors``)."""

    def __init__(self, response: JSONResponse) -> None:
        super().__init__(response.status_code, "invalid body")
        self.response = response


async def _queue_request(broker: Broker, config: BrokerConfig, request: Request) -> Any:
    """``POST generate/async``: ``params.n`` jobs of one group, in one operation."""
    body = await _body(request, AsyncRequest)
    key = _key(request, config, "submitter")
    horde = config.horde
    view.check_request(body, config)
    if body.dry_run:
        return JSONResponse({"kudos": 0.0}, 200)
    secret = 0
    while secret in (0, view.JOB_TAG):
        secret = secrets.randbits(64)
    n = body.params.n
    common = {
        "member": key.member, "tier": key.tier,
        "priority": resolve_priority(horde.priority, None, key, config),
        "model": body.models[0] if len(body.models) == 1 else None,
        "group": group_label(secret), "image": body.image(horde),
        "needs": body.needs().as_dict(),
    }  # fmt: skip
    jobs = [{**common, "payload": {"horde": body.payload(i)}} for i in range(n)]
    results = await broker.run("submit_many", {"jobs": jobs})
    first = results[0][0].id
    return JSONResponse(
        {"id": request_uuid(secret, first, n), "kudos": 0.0, "warnings": [],
         "message": f"{n} image(s) queued; kudos are not used by this broker (0)"},
        202,
    )  # fmt: skip


async def _submit_image(
    broker: Broker, config: BrokerConfig, request: Request, blobs: Blobs
) -> Any:
    """``POST generate/submit``: complete the job (``faulted``: fail it) as its holder."""
    body = await _body(request, SubmitRequest)
    key = _key(request, config, "worker")
    job_id = job_id_of(body.id)
    if job_id is None:
        raise Rejected(404, f"no job {body.id!r} (not a job id)")
    limit = config.horde.max_generation_bytes
    if len(body.generation) > limit:
        raise Rejected(
            413,
            f"generation is {len(body.generation)} characters, over [horde] "
            f"max_generation_bytes={limit}",
        )
    worker, attempt = await broker.query(lambda engine: view.holder(engine, job_id))
    acts_as(key, worker)
    op = "fail" if body.state == "faulted" else "complete"
    blob = None
    if len(body.generation) > config.horde.inline_max_bytes:  # kept outside the journal
        blob = blob_key(job_id, attempt, body.generation)
        await blobs.put(blob, body.generation)
    result = view.result(body, blob)
    args = {"job_id": job_id, "worker": worker, "attempt": attempt, "result": result}
    await broker.run(op, args)
    return {"reward": 0.0}


async def _sweep(broker: Broker, config: BrokerConfig, blobs: Blobs) -> None:
    """Delete the images of jobs past their retention (at most every ``sweep_every``)."""
    now = blobs.sweep_due(config.horde.sweep_every)
    if now is None:
        return
    referenced = await broker.query(view.referenced_blobs)
    await blobs.sweep(referenced, now)


async def _request_view(
    broker: Broker, blobs: Blobs, request_id: str, generations: bool
) -> dict[str, Any]:
    """A request's check (``generations``: its status, images read from ``blobs``)."""
    found = request_jobs(request_id)
    if found is None:
        raise Rejected(404, f"no request {request_id!r} (not a request id)")
    label, ids = found
    answer = await broker.query(lambda engine: view.request(engine, label, ids, generations))
    for generation in answer.get("generations", ()):
        key = generation.pop("img_blob", None)
        if key is not None:
            generation["img"] = await blobs.get(key) or ""
    return answer
