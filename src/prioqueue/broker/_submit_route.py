"""``POST /v1/jobs`` served without FastAPI's routing and dependency solving (private).

Theory of operation
-------------------
A single submit is the broker's hottest request: profiled under 20 concurrent producers on
PostgreSQL, FastAPI's request handling (routing, the dependency graph of the key and the
headers, the body's validation wrapper, the response model's serialisation) took about half
of the event loop's busy time, and the loop shares the GIL with the store's commit thread.
:class:`SubmitRoute` is an ASGI middleware placed innermost (inside the app's body limits and
``Content-Type`` rule, :mod:`prioqueue.broker._limits` and :mod:`prioqueue.broker._content`):
it answers ``POST /v1/jobs`` itself and passes every other request on.

It does what the FastAPI route (:mod:`prioqueue.broker._job_routes`, still declared for the
OpenAPI document) does, in FastAPI's order, with the same answers byte for byte:

1. the body is read; a non-empty body of a JSON content type that is not JSON is 422
   ``body: not valid JSON at character N`` and one that cannot be decoded 400; anything but
   JSON (a ``text/...+json`` type) is handed to validation as bytes;
2. the ``Authorization`` key must be a submitter's (401 / 403);
3. the ``X-LlamaSwap-Priority`` (at most 64 characters) and ``Idempotency-Key`` (1..200)
   headers and the body (:class:`~prioqueue.broker.models.SubmitRequest`) are validated and
   every problem is reported in one 422;
4. :func:`submit_job` queues the job: 201 ``{"id"}``, 200 for an idempotent replay; the
   engine's refusals and a standby are answered by the handlers of
   :mod:`prioqueue.broker._http`; anything else propagates (a 500, as any route).

``tests/broker/test_broker_submit_route.py`` sends the same requests to this route and to the
FastAPI one (``create_app(..., lean_submit=False)``) and compares the answers.

Complexity: O(size of the body) plus the engine's submit.
"""

from __future__ import annotations

import email.message
import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from prioqueue.broker._content import Message, Receive, Send
from prioqueue.broker._http import (
    IDEMPOTENCY_HEADER,
    PRIORITY_HEADER,
    Forbidden,
    error_response,
    forbidden_response,
    key_for,
    rejected_response,
    standby_response,
    submit_args,
    validation_response,
)
from prioqueue.broker.config import BrokerConfig, BrokerKey
from prioqueue.broker.models import SubmitRequest
from prioqueue.broker.records import Rejected
from prioqueue.broker.service import Broker, Standby

__all__ = ["SubmitRoute", "submit_job"]

PATH = "/v1/jobs"

# The headers as the FastAPI route declares them (same constraints, same messages).
_PRIORITY = TypeAdapter(PRIORITY_HEADER)
_IDEMPOTENCY = TypeAdapter(IDEMPOTENCY_HEADER)
_WANTED = {
    b"authorization": "authorization",
    b"content-type": "content-type",
    b"x-llamaswap-priority": "x-llamaswap-priority",
    b"idempotency-key": "idempotency-key",
}
_JSON_TYPE = [(b"content-type", b"application/json")]


async def submit_job(
    broker: Broker,
    config: BrokerConfig,
    key: BrokerKey,
    body: SubmitRequest,
    header_priority: str | None,
    idempotency_key: str | None,
) -> tuple[str, bool]:
    """Queue one job for ``key``: ``(job id, created)`` (False: an idempotent replay).

    Raises:
        Rejected: 422 a body priority neither an integer nor an alias, a level outside the
            range or bad lease inputs; whatever the engine
            refuses (422, 429, 503).
        Standby: This replica does not serve.
    """
    # The lease inputs' check reads only the configuration: no wait for the store here
    # (issue 21: a read barrier per submit collapsed the durable broker under load).
    args = submit_args(
        body,
        key,
        config,
        header_priority,
        lambda image: broker.serving_engine().check_image(image),
        idempotency_key=idempotency_key,
    )
    record, created = await broker.run("submit", args)
    return record.id, created


def route_path(scope: Message) -> str:
    """The request's path below the app's ``root_path`` (as Starlette's router matches it)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path != root and path[len(root)] == "/":
        return path[len(root) :]
    return path


class SubmitRoute:
    """ASGI middleware answering ``POST /v1/jobs`` directly (see the module docstring).

    Args:
        app: The rest of the application (every other request).
        broker: The broker that queues the jobs.
        config: Its configuration (keys, priority policy).
        retry: The ``Retry-After`` of a standby's 503.
    """

    def __init__(self, app: Any, broker: Broker, config: BrokerConfig, retry: str) -> None:
        self.app = app
        self.broker = broker
        self.config = config
        self.retry = retry

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or route_path(scope) != PATH:
            await self.app(scope, receive, send)
            return
        answer = await self._answer(scope, receive)
        if isinstance(answer, tuple):  # the common case: no Response object to build
            status, body = answer
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), *_JSON_TYPE],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await answer(scope, receive, send)

    async def _answer(self, scope: Message, receive: Receive) -> tuple[int, bytes] | Any:
        """``(201, body)``, ``(200, body)`` for an idempotent replay, or an error response."""
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            wanted = _WANTED.get(name)
            if wanted is not None and wanted not in headers:  # the first one, as Starlette
                headers[wanted] = value.decode("latin-1")
        raw = await _read_body(receive)
        try:
            parsed = _decode(raw, headers.get("content-type"))
        except json.JSONDecodeError as exc:
            error = {"type": "json_invalid", "loc": ("body", exc.pos), "ctx": {"error": exc.msg}}
            return validation_response([error])
        except Exception:  # FastAPI answers any other failure to decode with a 400
            return error_response(400, "There was an error parsing the body", "body")
        try:
            key = key_for(self.config.keys, headers.get("authorization"), "submitter")
        except Forbidden as exc:
            return forbidden_response(exc)
        errors: list[Any] = []
        priority = _header(_PRIORITY, headers, "x-llamaswap-priority", errors)
        idempotency = _header(_IDEMPOTENCY, headers, "idempotency-key", errors)
        body = None
        if parsed is _MISSING:
            errors.append({"type": "missing", "loc": ("body",), "msg": "Field required"})
        else:
            try:
                body = SubmitRequest.model_validate(parsed, from_attributes=True)  # as FastAPI
            except ValidationError as exc:
                errors += [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        if errors or body is None:
            return validation_response(errors)
        try:
            job_id, created = await submit_job(
                self.broker, self.config, key, body, priority, idempotency
            )
        except Rejected as exc:
            return rejected_response(exc)
        except Standby as exc:
            return standby_response(exc, self.retry)
        return 201 if created else 200, json.dumps({"id": job_id}, separators=(",", ":")).encode()


_MISSING: Any = object()


async def _read_body(receive: Receive) -> bytes:
    """The whole request body (the body limit middleware has already bounded it)."""
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False) or message["type"] != "http.request":
        return body
    chunks = [body]
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _decode(raw: bytes, content_type: str | None) -> Any:
    """The body as FastAPI reads it: JSON for a JSON type, else the bytes; empty: missing.

    Raises:
        json.JSONDecodeError: Not JSON. UnicodeDecodeError: not text.
    """
    if not raw:
        return _MISSING
    if content_type == "application/json":  # the common case, and what JsonBodies sets
        return json.loads(raw)
    if not content_type:  # FastAPI's strict Content-Type rule: not read as JSON
        return raw
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() == "application":
        subtype = message.get_content_subtype()
        if subtype == "json" or subtype.endswith("+json"):
            return json.loads(raw)
    return raw


def _header(
    adapter: TypeAdapter[Any], headers: dict[str, str], name: str, errors: list[Any]
) -> Any:
    """A header validated like the FastAPI route's parameter; problems go to ``errors``."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        errors += [{**e, "loc": ("header", name, *e["loc"])} for e in exc.errors()]
        return None
