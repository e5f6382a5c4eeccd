"""What the broker's route groups share: path and query types, API keys, errors, views.

Private. The route modules (``_job_routes``, ``_worker_routes``, ``_client_routes``,
``_dashboard``) and :mod:`prioqueue.broker.app` import these; none imports the app.

* **Keys.** ``Authorization: Bearer KEY``: no or an unknown key is 401, a key of the wrong
  role 403 (:data:`Submitter`, :data:`WorkerKey`, :data:`AnyKey`); a worker key acts only
  as the worker ids its rule allows (:data:`ActingWorker`, :func:`acts_as`).
* **Errors.** JSON ``{"error": message, "field": name}`` (:func:`install_handlers`); a
  standby answers 503 with ``Retry-After`` and the leader's address.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, get_args

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from prioqueue._spec import LEVEL_LIMIT
from prioqueue.broker._waiters import MAX_WAIT
from prioqueue.broker.config import BrokerConfig, BrokerKey
from prioqueue.broker.engine import BrokerEngine
from prioqueue.broker.models import ErrorBody, JobView, SubmitRequest
from prioqueue.broker.records import JobRecord, Rejected
from prioqueue.broker.service import Standby
from prioqueue.jobfields import fields_in, names_in

__all__ = [
    "ERRORS",
    "ID",
    "IDEMPOTENCY_HEADER",
    "MEMBER",
    "PRIORITY_HEADER",
    "WAIT",
    "ActingWorker",
    "AnyKey",
    "Forbidden",
    "SubmitHeaders",
    "Submitter",
    "Submitting",
    "WorkerKey",
    "acts_as",
    "api_key",
    "error_response",
    "forbidden_response",
    "http_error_response",
    "install_handlers",
    "job_view",
    "key_for",
    "rejected_response",
    "resolve_priority",
    "standby_response",
    "submit_args",
    "validation_response",
    "whose",
]

ID = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f/]+$")]
MEMBER = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=200,
        description="Another member's group (a key with observer = true reads it, one with "
        "admin = true also cancels it); default: the key's own member.",
    ),
]
WAIT = Annotated[
    float,
    Query(
        ge=0,
        le=MAX_WAIT,
        description="Long-poll: seconds (0..60) to wait for a change before answering.",
    ),
]
PRIORITY_HEADER = Annotated[str | None, Header(max_length=64)]
"""``X-LlamaSwap-Priority``: the level when the body gives none (the gateway's header)."""
IDEMPOTENCY_HEADER = Annotated[str | None, Header(min_length=1, max_length=200)]
"""``Idempotency-Key``: names a submit, single or batch (its retry replays the first answer)."""
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 403, 404, 408, 409, 413, 422, 429, 431, 503)
}


# Location parts that name a container or a union member rather than a field.
_LOC_NOISE = frozenset(("body", "path", "int", "str", "float", "bool", "list", "dict", "none"))


class Forbidden(Exception):
    """An authorisation failure (401, 403) or a refused body (413), answered as JSON."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error_response(
    status: int, message: str, field: str | None = None, **headers: str
) -> JSONResponse:
    """The JSON error answer: ``{"error": message, "field": name}`` with ``headers``."""
    return JSONResponse(
        {"error": message, "field": field}, status_code=status, headers=headers or None
    )


def api_key(request: Request, authorization: str | None, role: str) -> BrokerKey:
    """The configured key the ``Authorization`` header names, if it has ``role`` ("any": any).

    Raises:
        Forbidden: 401 no or an unknown key; 403 a key of another role.
    """
    return key_for(request.app.state.config.keys, authorization, role)


def key_for(keys: Mapping[str, BrokerKey], authorization: str | None, role: str) -> BrokerKey:
    """The key of ``keys`` an ``Authorization`` header value names, if it has ``role``. O(1).

    Raises:
        Forbidden: 401 no or an unknown key; 403 a key of another role.
    """
    if authorization is None:
        raise Forbidden(401, "missing Authorization: Bearer <key>")
    scheme, _, token = authorization.partition(" ")
    key: BrokerKey | None = keys.get(token.strip()) if scheme.lower() == "bearer" else None
    if key is None:
        raise Forbidden(401, "unknown API key")
    if role not in ("any", key.role):
        raise Forbidden(403, f"this key's role is {key.role}; this route needs {role}")
    return key


async def _submitter_key(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> BrokerKey:
    return api_key(request, authorization, "submitter")


async def _worker_key(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> BrokerKey:
    key = api_key(request, authorization, "worker")
    worker = request.path_params.get("worker")
    if worker is not None:  # every /v1/workers/{worker}/... route: pop, heartbeat, leave...
        acts_as(key, worker)
    return key


async def _any_key(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> BrokerKey:
    return api_key(request, authorization, "any")


def acts_as(key: BrokerKey, worker: str) -> None:
    """Refuse a worker key naming a worker id its rule does not allow (403)."""
    if not key.may_act_as(worker):
        raise Rejected(
            403,
            f"this worker key may act only as {key.worker_rule()}; not as worker {worker!r}",
            field="worker",
        )


def _acting_worker(worker: ID, key: Annotated[BrokerKey, Depends(_worker_key)]) -> str:
    return worker  # _worker_key checked it


Submitter = Annotated[BrokerKey, Depends(_submitter_key)]
WorkerKey = Annotated[BrokerKey, Depends(_worker_key)]
AnyKey = Annotated[BrokerKey, Depends(_any_key)]
ActingWorker = Annotated[str, Depends(_acting_worker)]
"""The ``{worker}`` of the path, once the worker key may act as it (else 403). Any route with
``{worker}`` in its path and a ``WorkerKey`` gets the same check."""


@dataclass(frozen=True)
class SubmitHeaders:
    """What a submit route (a single job or a batch) reads besides its body.

    Attributes:
        key: The submitter's key (``Authorization``).
        priority: ``X-LlamaSwap-Priority``, or None.
        idempotency_key: ``Idempotency-Key``, or None.
    """

    key: BrokerKey
    priority: str | None
    idempotency_key: str | None


async def _submit_headers(
    key: Submitter,
    x_llamaswap_priority: PRIORITY_HEADER = None,
    idempotency_key: IDEMPOTENCY_HEADER = None,
) -> SubmitHeaders:
    return SubmitHeaders(key, x_llamaswap_priority, idempotency_key)


Submitting = Annotated[SubmitHeaders, Depends(_submit_headers)]
"""The key and headers of a submit, declared once for both submit routes (the key's 401/403
first, then the headers' 422, as for parameters of the route itself)."""


def _nested(name: str) -> bool:
    """Whether ``SubmitRequest``'s field ``name`` holds a model (journaled as its JSON)."""
    info = SubmitRequest.model_fields.get(name)
    types = () if info is None else (info.annotation, *get_args(info.annotation))
    return any(isinstance(t, type) and issubclass(t, BaseModel) for t in types)


_CARRIED = tuple(  # the journaled submit's keywords (prioqueue.jobfields): how each is made
    (f.name, "request" in f.layers, f.sparse, _nested(f.name)) for f in fields_in("engine")
)
_VIEWED = names_in("view")


def submit_args(
    body: SubmitRequest,
    key: BrokerKey,
    config: BrokerConfig,
    header_priority: str | None,
    check_image: Callable[[dict[str, Any]], dict[str, Any]],
    **given: Any,
) -> dict[str, Any]:
    """The journaled ``submit``'s arguments for one body (single and batch submits).

    The key gives ``member`` and ``tier``; ``priority`` is resolved
    (:func:`resolve_priority`) and ``image`` checked (``check_image``, the engine's);
    ``given`` adds what no body holds (``idempotency_key``). Every other declared field
    (``prioqueue.jobfields``) comes from the body as JSON data; a sparse one only when set.
    O(size of the body).

    Raises:
        Rejected: 422 a priority neither an integer nor an alias, or outside the range; what
            ``check_image`` raises.
    """
    given = {
        "member": key.member,
        "tier": key.tier,
        "priority": resolve_priority(body.priority, header_priority, key, config),
        "image": None if body.image is None else check_image(body.image),
        **given,
    }
    args: dict[str, Any] = {}
    for name, in_body, sparse, nested in _CARRIED:
        if name in given:
            value = given[name]
        elif in_body:
            value = getattr(body, name)
            if nested and value is not None:
                value = value.model_dump()
        else:
            continue
        if value is not None or not sparse:
            args[name] = value
    return args


def job_view(
    record: JobRecord,
    position: int | None,
    explanation: str | None,
    engine_now: BrokerEngine | None = None,
) -> JobView:
    """A job's answer (``engine_now``: the engine that says until when it is delayed)."""
    return JobView(
        id=record.id,
        state=record.state,
        position=position,
        explanation=explanation,
        result=record.result,
        attempt=record.attempt,
        submitted_at=record.submitted_at,
        finished_at=record.finished_at,
        expires_at=record.expires_at,
        not_before=None if engine_now is None else engine_now.not_before(record),
        **{name: getattr(record, name) for name in _VIEWED},
    )


def whose(key: BrokerKey, member: str | None, *, cancel: bool) -> str:
    """The member whose group a request names: the key's own, or ``?member=`` if it may (403)."""
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


def resolve_priority(
    stated: str | int | None, header: str | None, key: BrokerKey, config: BrokerConfig
) -> int:
    """A submit's level: the body's ``priority`` (``stated``), else the header; key-capped.

    The header keeps its contract (absent or unparseable: the policy's default); a priority
    the body states must be an integer or one of the policy's aliases.

    Raises:
        Rejected: 422 a body ``priority`` that is neither (the message lists the aliases),
            or a level outside the dispatcher's range.
    """
    if stated is None:
        priority = config.policy.parse(header, ceiling=key.max_priority)
    else:
        try:
            priority = config.policy.parse_stated(stated, ceiling=key.max_priority)
        except ValueError as exc:
            raise Rejected(422, str(exc), field="priority") from None
    if not -LEVEL_LIMIT <= priority <= LEVEL_LIMIT:  # the dispatcher's range, else a 500
        raise Rejected(
            422,
            f"priority must resolve to a level within +-{LEVEL_LIMIT} (the policy's minimum "
            "applies when one is configured)",
            field="priority",
        )
    return priority


def rejected_response(exc: Rejected) -> JSONResponse:
    """The answer to a refusal of the engine (``Retry-After`` on a 429 or 503)."""
    headers = (
        {"Retry-After": str(math.ceil(exc.retry_after))}
        if exc.status in (429, 503) and exc.retry_after > 0
        else {}
    )
    return error_response(exc.status, str(exc), exc.field, **headers)


def forbidden_response(exc: Forbidden) -> JSONResponse:
    """The answer to an auth failure (401 with ``WWW-Authenticate``, 403) or a refused body."""
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    return error_response(
        exc.status, str(exc), "Authorization" if exc.status < 413 else "body", **headers
    )


def standby_response(exc: Standby, retry: str) -> JSONResponse:
    """503 from a replica that does not serve: ``Retry-After`` and the leader's address."""
    headers = {"Retry-After": retry}
    if exc.leader:
        headers["X-Prioqueue-Leader"] = exc.leader
    body = {"error": str(exc), "field": None, "leader": exc.leader}
    return JSONResponse(body, status_code=503, headers=headers)


def http_error_response(
    status: int, detail: str, headers: Mapping[str, str] | None
) -> JSONResponse:
    """The answer to an HTTP error of the framework (400: an unparseable body)."""
    field = "body" if status == 400 else None
    return error_response(status, detail, field, **(headers or {}))


def validation_response(errors: Sequence[Mapping[str, Any]]) -> JSONResponse:
    """422 for pydantic's errors (``loc`` from ``("body", ...)`` or ``("header", name)``).

    The message joins one ``name: problem`` per error; ``field`` names the first.
    """
    problems = []
    first: str | None = None
    for error in errors:
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
    return error_response(422, "; ".join(problems), first)


def install_handlers(app: FastAPI, retry: str) -> None:
    """Answer refusals, auth failures, standbys and invalid requests as JSON errors."""

    @app.exception_handler(Rejected)
    async def rejected(_request: Request, exc: Rejected) -> JSONResponse:
        return rejected_response(exc)

    @app.exception_handler(Forbidden)
    async def forbidden(_request: Request, exc: Forbidden) -> JSONResponse:
        return forbidden_response(exc)

    @app.exception_handler(Standby)
    async def standby(_request: Request, exc: Standby) -> JSONResponse:
        return standby_response(exc, retry)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return http_error_response(exc.status_code, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc.errors())
