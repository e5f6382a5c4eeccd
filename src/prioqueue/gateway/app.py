"""The gateway as a raw ASGI application: authenticate, gate, forward, explain.

Theory of operation
-------------------
Every HTTP request goes through :meth:`Gateway.__call__`:

1. **Who.** The caller is identified by a trusted header (when the operator enabled one), an
   ``Authorization: Bearer`` key from the ``[keys]`` table, or as the anonymous member (when
   allowed). Otherwise: 401. The identity gives a member, a tier and a priority ceiling.
2. **Observability** paths (``/prioqueue/status``, ``/prioqueue/jobs/{id}``, ``/metrics``)
   are answered by the gateway itself.
3. **Pass-through.** A request that is not a POST to a gated path is forwarded untouched,
   body streamed in both directions.
4. **Gated.** The body is read (at most ``limits.max_body_bytes``: 413 beyond), the model is
   taken from its JSON ``model`` field (invalid JSON: 400, the GPU is never involved), the
   priority from ``X-LlamaSwap-Priority`` under the caller's ceiling. The request then waits
   for its turn in the :class:`~prioqueue.asyncio.AsyncDispatcher`, is forwarded, and its
   response is streamed back chunk by chunk. The GPU is released when the upstream's
   response ends, fails, or the lease runs out.

Failures map to statuses: queue full 429 (``Retry-After``), waited past the level's limit or
shutting down 503 (``Retry-After``), upstream unreachable or 5xx 502, lease ran out 504. A
client that disconnects is noticed by a watcher task reading ``http.disconnect``: it cancels
the request's task, which removes the queued job, or closes the upstream request and frees
the GPU.

Each gated response carries ``X-Prioqueue-Job`` (the job id, for ``/prioqueue/jobs/{id}``),
``X-Prioqueue-Priority`` (the priority it ran at, after the ceiling) and
``X-Prioqueue-Queue-Wait`` (seconds spent queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs

from prioqueue._errors import QueueFull
from prioqueue.asyncio import (
    AsyncDispatcher,
    DispatcherClosed,
    JobCancelled,
    QueueTimeout,
    Turn,
)
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.gateway import _observe
from prioqueue.gateway.config import GatewayConfig
from prioqueue.gateway.proxy import make_client, request_headers, response_headers
from prioqueue.records import Grant, Job
from prioqueue.scoring import Scorer

if TYPE_CHECKING:
    import aiohttp
    from yarl import URL

__all__ = ["BadRequest", "Gateway", "Identity", "extract_model"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("prioqueue.gateway")

_PRIORITY_HEADER = b"x-llamaswap-priority"
_JSON = (b"content-type", b"application/json")
_EXPLAIN_AFTER = 1.0
"""A request that waited this many seconds keeps its explanation for after it finishes."""
_QUERY_UNSAFE = re.compile(rb"[^\x21\x24-\x3b\x3d\x3f-\x7e]")
"""Bytes percent-encoded in a forwarded query: controls, space, non-ASCII, ``"#<>``."""
_PATH_UNSAFE = re.compile(rb"[^\x21\x24-\x3b\x3d\x40-\x5f\x61-\x7a\x7c\x7e]")
"""Bytes percent-encoded in a forwarded path: those of a query and ``?`{}``."""


def _percent(match: re.Match[bytes]) -> bytes:
    return b"%%%02X" % match.group()[0]


_SLASHES = re.compile(r"/{2,}")


def _remove_dot_segments(path: str) -> str:
    """Drop ``.`` and ``..`` segments from a URL path (RFC 3986 section 5.2.4)."""
    segments = path.split("/")
    if "." not in segments and ".." not in segments:
        return path
    out: list[str] = []
    for segment in segments:
        if segment == "..":
            if out and out != [""]:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return "/".join(out)


class BadRequest(Exception):
    """A gated request's body cannot be read for its model (answered with 400)."""


@attrs.frozen
class Identity:
    """Who a request comes from: member, tier and priority ceiling."""

    member: str
    tier: str
    ceiling: int


@attrs.define
class _Flight:
    """The mutable state of one gated request, shared with its watcher and lease timer."""

    task: asyncio.Task[Any] | None
    done: bool = False
    disconnected: bool = False
    lease_expired: bool = False
    started: bool = False


def extract_model(body: bytes, content_type: bytes) -> str | None:
    """Return the ``model`` of a gated request's body.

    Args:
        body: The request body: JSON, or ``multipart/form-data`` (audio transcriptions).
        content_type: The ``Content-Type`` header value (may be empty).

    Returns:
        The model, or None when the body names none.

    Raises:
        BadRequest: The body is not a JSON object (or a multipart form), or ``model`` is
            not a string.

    Complexity: O(len(body)).
    """
    if content_type[:19].lower() == b"multipart/form-data":
        return _multipart_model(body, content_type)
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("the request body must be a JSON object")
    model = value.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    return model


def _multipart_model(body: bytes, content_type: bytes) -> str | None:
    _, _, rest = content_type.partition(b"boundary=")
    boundary = rest.split(b";")[0].strip().strip(b'"')
    if not boundary:
        raise BadRequest("multipart/form-data without a boundary")
    for part in body.split(b"--" + boundary):
        head, sep, value = part.partition(b"\r\n\r\n")
        if sep and b' name="model"' in head.replace(b";name=", b"; name="):
            try:
                return value.rstrip(b"\r\n").decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest("the 'model' form field is not UTF-8") from None
    return None


def _error_body(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": None}}).encode()


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    all_headers = [_JSON, (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


class Gateway:
    """The ASGI application. One instance serves one upstream with one dispatcher.

    Args:
        config: The configuration.
        clock: Monotonic seconds for the dispatcher (tests may inject one).
    """

    def __init__(self, config: GatewayConfig, *, clock: Callable[[], float] = time.monotonic):
        self.config = config
        limits = config.limits
        self.dispatcher = SizeOneDispatcher(
            Scorer(config.scoring),
            policy=config.policy,
            charge=config.charge,  # type: ignore[arg-type]
            lease_for=self._lease_for,
            max_queued=limits.max_queued,
            max_queued_per_member=limits.max_queued_per_member,
            max_attempts=1,
            fair_share=config.fair_share,
        )
        self.gate = AsyncDispatcher(self.dispatcher, clock=clock)
        self.client: aiohttp.ClientSession | None = None
        self.history: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.metrics: Callable[[], bytes] | None = _observe.metrics_renderer(self)
        self._poller: asyncio.Task[None] | None = None
        self._closing = False
        self._closer: asyncio.Future[None] | None = None
        self._upstream = config.upstream
        parts = urlsplit(config.upstream)
        self._upstream_origin = f"{parts.scheme}://{parts.netloc}"
        self._upstream_path = parts.path
        key = config.upstream_api_key
        self._authorization = None if key is None else b"Bearer " + key.encode("latin-1")
        self._anonymous = (
            Identity(config.anonymous_member, config.anonymous_tier, config.anonymous_max_priority)
            if config.allow_anonymous
            else None
        )
        self._keys = {
            f"Bearer {key}".encode("latin-1"): Identity(e.member, e.tier, e.max_priority)
            for key, e in config.keys.items()
        }

    def _lease_for(self, job: Job) -> float:
        return self.config.limits.lease_for(str(job.payload))

    # -- lifecycle -------------------------------------------------------------------------

    async def startup(self) -> None:
        """Open the upstream client and start the resident-model poller (if configured)."""
        if self.client is None:
            self.client = make_client(connect_timeout=self.config.limits.connect_timeout)
        if self.config.resident_poll_seconds > 0 and self._poller is None:
            self._poller = asyncio.ensure_future(self._poll_resident())

    def begin_shutdown(self) -> None:
        """Fail every queued request with 503 and refuse new gated ones (call on the loop)."""
        if not self._closing:
            self._closing = True
            self._closer = asyncio.ensure_future(self.gate.aclose())

    async def aclose(self) -> None:
        """Shut down: fail queued requests, stop the poller, close the upstream client."""
        self._closing = True
        await self.gate.aclose()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self.client is not None:
            client, self.client = self.client, None
            await client.close()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _busy(self) -> bool:
        return self.dispatcher.running is not None

    async def _poll_resident(self) -> None:
        """Refresh the resident model from the upstream's status endpoint, while idle."""
        url = self._upstream + self.config.resident_path
        while True:
            await asyncio.sleep(self.config.resident_poll_seconds)
            if self.client is None or self._busy():
                continue
            try:
                async with self.client.get(url, allow_redirects=False) as response:
                    running = json.loads(await response.read()).get("running", [])
            except Exception as exc:
                log.debug("resident-model poll failed: %s", exc)
                continue
            if self._busy():
                continue  # a dispatch happened meanwhile and set it
            models = [
                entry.get("model")
                for entry in running
                if isinstance(entry, dict) and entry.get("state", "ready") == "ready"
            ]
            self.gate.set_resident_model(models[0] if models else None)

    # -- requests --------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope (``http`` or ``lifespan``)."""
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    def identify(self, headers: list[tuple[bytes, bytes]]) -> Identity | None:
        """Return the caller's identity, or None when it must be refused (401).

        Args:
            headers: The request headers (ASGI, lower-case names).

        Returns:
            The identity: trusted header first (when enabled), then the API key, then the
            anonymous member (when allowed).
        """
        trusted = self.config.trusted_header
        authorization = None
        if trusted is not None:
            found = {name.decode("latin-1"): value for name, value in headers}
            member = found.get(trusted.member)
            if member:
                tier = trusted.default_tier
                if trusted.tier is not None:
                    named = found.get(trusted.tier, b"").decode("latin-1")
                    if named in self.config.scoring.tier_bonuses:
                        tier = named
                return Identity(member.decode("latin-1"), tier, trusted.max_priority)
            authorization = found.get("authorization")
        else:
            for name, value in headers:
                if name == b"authorization":
                    authorization = value
                    break
        if authorization is not None:
            known = self._keys.get(authorization.strip())
            if known is not None:
                return known
        return self._anonymous

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        identity = self.identify(headers)
        if identity is None:
            body = _error_body("a valid API key is required", "invalid_api_key")
            await _respond(send, 401, body, [(b"www-authenticate", b"Bearer")])
            return
        # Route on the normalised path, the one the upstream will act on: otherwise
        # "/x/../v1/chat/completions" or "//v1/chat/completions" would bypass the gate.
        path = _remove_dot_segments(_SLASHES.sub("/", scope["path"]))
        if path.startswith("/prioqueue/") or path == "/metrics":
            await _observe.serve(self, scope, send)
        elif self.config.is_gated(scope["method"], path):
            await self._gated(scope, receive, send, identity)
        else:
            await self._passthrough(scope, receive, send)

    def _url(self, scope: Scope) -> URL:
        """Return the upstream URL of a request: its raw path and query, kept encoded.

        Bytes a URL may not hold are percent-encoded and ``.``/``..`` segments removed (as
        common HTTP clients do); everything else goes out as the client sent it.
        """
        from yarl import URL  # with aiohttp; imported when used, like the client

        raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        raw = raw.partition(b"?")[0]
        if _PATH_UNSAFE.search(raw) is not None:
            raw = _PATH_UNSAFE.sub(_percent, raw)
        path = self._upstream_path + raw.decode("ascii")
        if "." in path:
            path = _remove_dot_segments(path)
        query: bytes = scope.get("query_string", b"")
        if query:
            if _QUERY_UNSAFE.search(query) is not None:
                query = _QUERY_UNSAFE.sub(_percent, query)
            return URL(f"{self._upstream_origin}{path}?{query.decode('ascii')}", encoded=True)
        return URL(self._upstream_origin + path, encoded=True)

    async def _passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = self.client
        assert client is not None, "the gateway was not started (lifespan)"
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        has_body = any(name in (b"content-length", b"transfer-encoding") for name, _ in headers)

        async def body() -> Any:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    return

        forwarded = request_headers(headers, authorization=self._authorization)
        request = (scope["method"], self._url(scope), forwarded, body() if has_body else None)
        flight = _Flight(task=None)
        try:
            await self._forward(request, send, flight, [])
        except _UpstreamFailed as exc:
            await _respond(send, 502, _error_body(str(exc), "upstream_error"))

    async def _forward(
        self,
        request: _Request,
        send: Send,
        flight: _Flight,
        extra: list[tuple[bytes, bytes]],
    ) -> int:
        """Send ``request`` upstream and stream the response to the client; return its status.

        A response read to its end gives its connection back to the pool; any other end
        (an error, a cancellation: the client left or the lease ran out) closes it, so the
        upstream sees the request abandoned.

        Raises:
            _UpstreamFailed: The upstream could not be reached (before any response byte).
        """
        import aiohttp

        client = self.client
        assert client is not None, "the gateway was not started (lifespan)"
        method, url, forwarded, data = request
        try:
            response = await client.request(
                method, url, headers=forwarded, data=data, allow_redirects=False
            )
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _UpstreamFailed(f"upstream unreachable: {exc!r}") from None
        complete = False
        try:
            status = response.status
            headers = response_headers(response.raw_headers)
            if status >= 500 and extra:
                headers.append((b"x-prioqueue-upstream-status", str(status).encode()))
                status = 502
            headers.extend(extra)
            flight.started = True
            await send({"type": "http.response.start", "status": status, "headers": headers})
            # With a Content-Length, the last chunk ends the body (one message fewer); without
            # one (SSE, chunked), every chunk goes out as it comes and an empty one ends it.
            length = response.headers.get("content-length", "")
            left = int(length) if length.isdigit() else -1
            content = response.content
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                left -= len(chunk)
                if left == 0:
                    complete = True
                    flight.done = True
                    await send({"type": "http.response.body", "body": chunk})
                    return status
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            complete = True
            flight.done = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if complete:
                response.release()
            else:
                response.close()
        return status

    async def _read_body(self, receive: Receive, limit: int) -> bytes | None:
        """Read the whole request body; None when the client left. Raises _TooLarge."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _gated(self, scope: Scope, receive: Receive, send: Send, who: Identity) -> None:
        config = self.config
        limit = config.limits.max_body_bytes
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        priority_value: bytes | None = None
        content_type = b""
        for name, value in headers:
            if name == _PRIORITY_HEADER:
                priority_value = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length" and value.isdigit() and int(value) > limit:
                await _respond(send, 413, _error_body(f"body over {limit} bytes", "too_large"))
                return
        try:
            body = await self._read_body(receive, limit)
            if body is None:
                return
            model = extract_model(body, content_type)
        except _TooLarge:
            await _respond(send, 413, _error_body(f"body over {limit} bytes", "too_large"))
            return
        except BadRequest as exc:
            await _respond(send, 400, _error_body(str(exc), "invalid_request_error"))
            return
        priority = config.policy.parse(priority_value, who.ceiling)
        job_id = uuid.uuid4().hex
        path: str = scope["path"]
        turn = self.gate.turn(
            job_id,
            member=who.member,
            priority=priority,
            tier=who.tier,
            model=model,
            estimate=config.estimate_seconds,
            payload=path,
            timeout=config.limits.max_wait_for(priority),
        )
        ours = [
            (b"x-prioqueue-job", job_id.encode()),
            (b"x-prioqueue-priority", str(priority).encode()),
        ]
        record: dict[str, Any] = {
            "id": job_id,
            "member": who.member,
            "tier": who.tier,
            "priority": priority,
            "model": model,
            "path": path,
            "outcome": "queued",
        }
        loop = asyncio.get_running_loop()
        flight = _Flight(task=asyncio.current_task())
        watcher = loop.create_task(_watch(receive, flight))
        lease_watch: asyncio.Task[None] | None = None
        status = 0
        try:
            async with turn as grant:
                record["waited"] = grant.waited
                record["score"] = attrs.asdict(grant.score)
                ours.append((b"x-prioqueue-queue-wait", f"{grant.waited:.3f}".encode()))
                if grant.waited >= _EXPLAIN_AFTER:
                    record["explanation"] = _observe.capture(self, job_id)
                if grant.lease is not None:
                    # The adapter owns the one lease timer; it revokes the turn on expiry.
                    lease_watch = loop.create_task(_watch_lease(turn, flight))
                request = self._build(scope, headers, body, job_id)
                status = await self._forward(request, send, flight, ours)
                record["outcome"] = "done"
        except QueueFull as exc:
            status, record["outcome"] = 429, "rejected: queue full"
            retry = [(b"retry-after", str(math.ceil(exc.retry_after)).encode())]
            await _respond(send, 429, _error_body(str(exc), "queue_full"), ours + retry)
        except (QueueTimeout, DispatcherClosed, JobCancelled) as exc:
            # JobCancelled: the grant was revoked (its lease ran out) before this request
            # could start; nothing reached the upstream, so the client may simply retry.
            status = 503
            record["outcome"] = (
                "timed out in the queue"
                if isinstance(exc, QueueTimeout)
                else "shutdown"
                if isinstance(exc, DispatcherClosed)
                else "revoked before it started"
            )
            retry = [(b"retry-after", str(math.ceil(config.limits.retry_after_seconds)).encode())]
            await _respond(send, 503, _error_body(str(exc), "unavailable"), ours + retry)
        except _UpstreamFailed as exc:
            status, record["outcome"] = 502, "upstream unreachable"
            await _respond(send, 502, _error_body(str(exc), "upstream_error"), ours)
        except asyncio.CancelledError:
            if flight.disconnected:
                record["outcome"] = "client disconnected"
                _uncancel(flight.task)
            elif flight.lease_expired:
                record["outcome"] = "lease expired"
                _uncancel(flight.task)
                if not flight.started:
                    status = 504
                    message = _error_body("the request ran past its lease", "lease_expired")
                    await _respond(send, 504, message, ours)
            else:
                raise
        finally:
            flight.done = True
            watcher.cancel()
            if lease_watch is not None:
                lease_watch.cancel()
            record["status"] = status
            self._remember(record, turn.grant)

    def _build(
        self, scope: Scope, headers: list[tuple[bytes, bytes]], body: bytes, job_id: str
    ) -> _Request:
        forwarded = request_headers(
            headers,
            extra=[(b"x-prioqueue-job", job_id.encode())],
            authorization=self._authorization,
        )
        return scope["method"], self._url(scope), forwarded, body

    def _remember(self, record: dict[str, Any], grant: Grant | None) -> None:
        limit = self.config.job_history
        if limit <= 0:
            return
        if grant is not None:
            record["runtime"] = max(0.0, self.gate.now() - grant.granted_at)
        history = self.history
        history[record["id"]] = record
        if len(history) > limit:
            history.popitem(last=False)

    def explain(self, job_id: str) -> dict[str, Any]:
        """Return what is known of a job: the dispatcher's explanation, or its history record.

        Raises:
            UnknownJob: The job is neither queued, running nor remembered.
        """
        return _observe.explain(self, job_id)


_Request = tuple[str, "URL", list[tuple[str, str]], Any]
"""What :meth:`Gateway._forward` sends: method, URL, headers and body (bytes, an async
iterator of bytes, or None)."""


class _TooLarge(Exception):
    pass


class _UpstreamFailed(Exception):
    pass


async def _watch(receive: Receive, flight: _Flight) -> None:
    """Cancel the request's task when its client disconnects before the response ends."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not flight.done and flight.task is not None:
                flight.disconnected = True
                flight.task.cancel()
            return


async def _watch_lease(turn: Turn, flight: _Flight) -> None:
    """Stop a request that held the GPU past its lease, once the adapter has expired it."""
    await turn.revoked.wait()
    if turn.expired is not None and not flight.done and flight.task is not None:
        flight.lease_expired = True
        flight.task.cancel()


def _uncancel(task: asyncio.Task[Any] | None) -> None:
    """Forget a cancellation the gateway itself requested (Python 3.11+)."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()
