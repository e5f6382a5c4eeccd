"""The gateway as a raw ASGI application: authenticate, gate, forward, explain.

Theory of operation
-------------------
Every HTTP request goes through :meth:`Gateway.__call__`:

1. **Where.** The path is normalised (``//`` collapsed, ``.``/``..`` removed): routing,
   gating and lease lookups all use the path the upstream will act on.
2. **Who.** The caller is identified by a trusted header (when the operator enabled one), an
   ``Authorization: Bearer`` key from the ``[keys]`` table (the scheme in any case), or as
   the anonymous member (when allowed). Otherwise: 401. The identity gives a member, a tier,
   a priority ceiling and two flags: ``observer`` (sees every member's jobs) and ``admin``
   (may call ``admin_paths``: 403 otherwise). ``/metrics`` also accepts ``metrics_key``.
3. **Observability** paths (``/prioqueue/status``, ``/prioqueue/jobs/{id}``, ``/metrics``)
   are answered by the gateway itself, redacted for callers that are not observers.
4. **Fail fast.** While the upstream circuit breaker is open (the upstream failed
   ``limits.breaker_failures`` times in a row), requests get 503 at once.
5. **Pass-through.** A request that is not gated (see
   :meth:`~prioqueue.gateway.settings.GatewayConfig.is_gated`) is forwarded, body streamed
   in both directions.
6. **Gated.** The body is read (bounded in size and time), the model taken from it (see
   :mod:`prioqueue.gateway._body`; a bad body is 400 and never involves the GPU), the
   priority from ``X-LlamaSwap-Priority`` under the caller's ceiling. The request then waits
   for its turn in the :class:`~prioqueue.asyncio.AsyncDispatcher` (its body counted in
   ``limits.max_queued_body_bytes``), is forwarded and its response streamed back. The GPU
   is released when the response ends, fails, the lease runs out, or the client reads too
   slowly.

What the client must not decide upstream is stripped from forwarded requests: its
``Authorization`` (replaced by ``upstream_api_key`` when set), its ``X-LlamaSwap-Priority``
(a gated request carries the effective number instead) and any ``X-Prioqueue-*`` header.

Failures map to statuses: queue full or too many queued body bytes 429 (``Retry-After``),
waited past the level's limit, shutting down or breaker open 503 (``Retry-After``), upstream
unreachable or 5xx 502, no first byte in time or lease ran out before the response began 504.
A streamed (SSE) response cut by its lease ends with an ``event: error`` naming the lease.

Each gated response carries ``X-Prioqueue-Job`` (the job id, for ``/prioqueue/jobs/{id}``),
``X-Prioqueue-Priority`` (the priority it ran at, after the ceiling) and
``X-Prioqueue-Queue-Wait`` (seconds spent queued).

Explanations cost nothing per grant: the grant object is kept in the job's record and in a
bounded ring of recent grants; a finished job's explanation is built from them on request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prioqueue._driver import Driver, Turn
from prioqueue._errors import Overloaded, QueueFull
from prioqueue.asyncio import AsyncDispatcher, DispatcherClosed, JobCancelled, QueueTimeout
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.gateway import _dashboard, _metrics, _observe, _paths, _upstreams
from prioqueue.gateway._body import (
    BadRequest,
    BodyTimeout,
    TooLarge,
    extract_model,
    model_from_url,
    read_body,
)
from prioqueue.gateway._fleetgate import FleetGate
from prioqueue.gateway._forward import (
    Flight,
    Request,
    SlowReader,
    UpstreamFailed,
    UpstreamTimeout,
    error_body,
    forward,
    normalise_path,
    respond,
    sse_error,
    uncancel,
    upstream_url,
    watch_disconnect,
    watch_lease,
)
from prioqueue.gateway._health import Breaker, HttpStats
from prioqueue.gateway._idle import Lingering, idle_url
from prioqueue.gateway._record import Recorder, record_finished
from prioqueue.gateway._route import Routes
from prioqueue.gateway.proxy import make_client, request_headers
from prioqueue.gateway.settings import GatewayConfig, Identity, bearer
from prioqueue.records import Grant, Job
from prioqueue.scoring import Scorer

if TYPE_CHECKING:
    import aiohttp

__all__ = ["BadRequest", "Gateway", "Identity", "extract_model"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("prioqueue.gateway")

_PRIORITY_HEADER = b"x-llamaswap-priority"
_GROUP_HEADER = b"x-prioqueue-group"
MAX_GROUP_LABEL = 200
"""Longest ``X-Prioqueue-Group`` value accepted (characters)."""
_CLIENT_DECIDES = frozenset({b"authorization", _PRIORITY_HEADER})
"""Request headers never forwarded as the client sent them (``x-prioqueue-*`` neither)."""
GRANT_RING = 10_000
"""Recent grants kept for explaining finished jobs (what overtook them)."""


class _Held:
    """``async with`` a turn, whose release may wait for its upstream to be idle.

    It waits when the request was sent and closed before its response ended (see ``_idle``).
    """

    __slots__ = ("flight", "gateway", "turn", "upstream")

    def __init__(self, gateway: Gateway, turn: Turn, flight: Flight) -> None:
        self.gateway = gateway
        self.turn = turn
        self.flight = flight
        self.upstream: _upstreams.Upstream | None = None

    async def __aenter__(self) -> Grant:
        return await self.turn.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        flight = self.flight
        flight.exited.set()
        if exc_type is not None and flight.sent and not flight.done:
            # Only the type travels on: the turn needs no more, and a traceback kept for
            # busy_timeout would keep the request's frames (its body) alive.
            ended = (exc_type, None, None)
            if flight.lease_expired:
                # The dispatcher has given the GPU away already; over several upstreams the
                # fleet gate counts the cut job, with one the next request waits (settled).
                if self.upstream is None:
                    self.gateway._linger(None, None, ended)
            elif self.gateway._linger(self.turn, self.upstream, ended):
                return
        await self.turn.__aexit__(exc_type, exc, tb)


class Gateway(Routes):
    """The ASGI application: one queue in front of one upstream, or of a fleet of them.

    With ``[[upstreams]]`` the gate is a :class:`~prioqueue.gateway._fleetgate.FleetGate`
    over a :class:`~prioqueue.fleet.FleetDispatcher`, one worker per upstream (see
    :mod:`prioqueue.gateway._upstreams`); otherwise an
    :class:`~prioqueue.asyncio.AsyncDispatcher` over a ``SizeOneDispatcher``.

    Args:
        config: The configuration.
        clock: Monotonic seconds for the dispatcher (tests may inject one).
        recorder: Writes every queued request once it leaves, as a replayable trace (see
            :mod:`prioqueue.gateway._record`), or None.
        record_loads: Known cold-load seconds per model, taken out of the recorded duration
            of a swap whose load cannot be measured (``--record-load``).
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        recorder: Recorder | None = None,
        record_loads: Mapping[str, float] | None = None,
    ):
        self.config = config
        self.recorder = recorder
        self.record_loads: Mapping[str, float] = dict(record_loads or {})
        limits = config.limits
        self.upstreams = {u.name: _upstreams.Upstream.of(u) for u in config.upstreams}
        self.fleet_gate: FleetGate | None = None
        self.dispatcher: SizeOneDispatcher | FleetDispatcher
        self.gate: Driver[SizeOneDispatcher | FleetDispatcher]
        options: dict[str, Any] = {
            "policy": config.policy,
            "charge": config.charge,
            "max_queued": limits.max_queued,
            "max_queued_per_member": limits.max_queued_per_member,
            "max_attempts": 1,
            "fair_share": config.fair_share,
            "budgets": config.budgets,
        }
        if self.upstreams:
            hold = config.warm_hold if config.routing == "warm" else 0.0
            fleet = FleetDispatcher(
                Scorer(config.scoring), lease_for=self._fleet_lease, warm_hold=hold, **options
            )
            self.dispatcher = fleet
            self.fleet_gate = FleetGate(fleet, clock=clock, routing=config.routing, warm_hold=hold)
            self.gate = self.fleet_gate
        else:
            self.dispatcher = SizeOneDispatcher(
                Scorer(config.scoring), lease_for=self._lease_for, **options
            )
            self.gate = AsyncDispatcher(self.dispatcher, clock=clock)
        self.started_at = clock()
        self._watchers: list[asyncio.Task[None]] = []
        self.client: aiohttp.ClientSession | None = None
        self.history: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.history_bytes = 0
        self.grants: collections.deque[Grant] = collections.deque(maxlen=GRANT_RING)
        self.http_stats = HttpStats()
        self.breaker = Breaker(limits.breaker_failures, limits.breaker_cooldown_seconds, clock)
        self.queued_body_bytes = 0
        self.metrics: Callable[[], bytes] | None = _metrics.metrics_renderer(self)
        self._poller: asyncio.Task[None] | None = None
        self.lingering = Lingering(self)
        self._last_flight: Flight | None = None
        self._closing = False
        self._closer: asyncio.Future[None] | None = None
        self._upstream = config.upstream
        parts = urlsplit(config.upstream)
        self._upstream_origin = f"{parts.scheme}://{parts.netloc}"
        self._upstream_path = parts.path
        key = config.upstream_api_key
        self._authorization = None if key is None else b"Bearer " + key.encode("latin-1")
        self._anonymous = (
            Identity(
                config.anonymous_member,
                config.anonymous_tier,
                config.anonymous_max_priority,
                observer=config.anonymous_observer,
            )
            if config.allow_anonymous
            else None
        )
        self._keys = {
            key.encode("latin-1"): Identity(
                e.member, e.tier, e.max_priority, observer=e.observer or e.admin, admin=e.admin
            )
            for key, e in config.keys.items()
        }
        self._metrics_key = None if config.metrics_key is None else config.metrics_key.encode()

    def _lease_for(self, job: Job) -> float:
        return self.config.limits.lease_for(str(job.payload))

    # -- lifecycle -------------------------------------------------------------------------

    async def startup(self) -> None:
        """Open the upstream client and start the resident-model poller (if configured)."""
        if self.client is None:
            self.client = make_client(connect_timeout=self.config.limits.connect_timeout)
        if self.upstreams and not self._watchers:
            ups = list(self.upstreams.values())
            await asyncio.gather(*(_upstreams.check(self, up) for up in ups))
            loop = asyncio.get_running_loop()
            self._watchers = [loop.create_task(_upstreams.watch(self, up)) for up in ups]
        elif self.config.resident_poll_seconds > 0 and self._poller is None:
            self._poller = asyncio.ensure_future(self._poll_resident())

    def begin_shutdown(self) -> None:
        """Fail every queued request with 503 and refuse new gated ones (call on the loop)."""
        if not self._closing:
            self._closing = True
            self._closer = asyncio.ensure_future(self.gate.aclose())

    async def aclose(self) -> None:
        """Shut down: fail queued requests, stop the poller, close the upstream client."""
        self._closing = True
        await self.lingering.aclose()
        await self.gate.aclose()
        watchers, self._watchers = self._watchers, []
        for task in watchers:
            task.cancel()
        for task in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
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
            The identity: trusted header first (when enabled), then the API key (``Bearer``
            in any case), then the anonymous member (when allowed).
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
            token = bearer(authorization)
            known = None if token is None else self._keys.get(token)
            if known is not None:
                return known
        return self._anonymous

    def _metrics_token(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"authorization":
                return bearer(value) == self._metrics_key
        return False

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        # Route on the normalised path, the one the upstream will act on: otherwise
        # "/x/../v1/chat/completions" or "//v1/chat/completions" would bypass the gate.
        path = normalise_path(scope["path"])
        stats = self.http_stats
        if path == "/metrics" and self._metrics_key is not None and self._metrics_token(headers):
            stats.answered("observe", await _metrics.serve_metrics(self, scope, send))
            return
        if path == _dashboard.PAGE or path.startswith(_dashboard.PAGE + "/"):  # no key needed
            stats.answered("observe", await _dashboard.serve_page(send, path))
            return
        identity = self.identify(headers)
        if identity is None:
            body = error_body("a valid API key is required", "invalid_api_key")
            await respond(send, 401, body, [(b"www-authenticate", b"Bearer")])
            stats.answered("refused", 401)
            return
        if path.startswith("/prioqueue/") or path == "/metrics":
            stats.answered("observe", await _paths.serve(self, scope, send, identity, path))
            return
        config = self.config
        if config.is_admin(path) and not identity.admin:
            body = error_body(f"{path} needs an admin key", "permission_denied")
            stats.answered("refused", await respond(send, 403, body))
            return
        retry_in = self.breaker.retry_in()
        gated = config.is_gated(scope["method"], path)
        route = "admin" if config.is_admin(path) else "gated" if gated else "passthrough"
        if self.fleet_gate is not None and not self.fleet_gate.live:
            retry_in = config.health_seconds
            errors = "; ".join(f"{u.name}: {u.last_error}" for u in self.upstreams.values())
            message = f"no upstream is up ({errors}); retry in {retry_in:g} s"
        elif retry_in > 0:
            message = (
                f"the upstream is failing ({self.breaker.last_error}); failing fast for "
                f"{retry_in:.1f} s more"
            )
        if retry_in > 0:
            retry = [(b"retry-after", str(math.ceil(retry_in)).encode())]
            status = await respond(send, 503, error_body(message, "upstream_down"), retry)
        elif gated:
            status = await self._gated(scope, receive, send, identity, path)
        else:
            status = await self._passthrough(scope, receive, send)
        stats.answered(route, status)

    def _request_headers(
        self, headers: list[tuple[bytes, bytes]], extra: list[tuple[bytes, bytes]]
    ) -> list[tuple[str, str]]:
        return request_headers(
            headers,
            extra=extra,
            drop=_CLIENT_DECIDES,
            drop_prefix=b"x-prioqueue-",
            authorization=self._authorization,
        )

    def _first_byte(self, seconds: float) -> None:
        self.breaker.success()
        self.http_stats.upstream_latency(seconds)

    async def _send_upstream(
        self, request: Request, send: Send, flight: Flight, extra: list[tuple[bytes, bytes]]
    ) -> int:
        client = self.client
        assert client is not None, "the gateway was not started (lifespan)"
        limits = self.config.limits
        try:
            return await forward(
                client,
                request,
                send,
                flight,
                extra,
                first_byte_timeout=limits.first_byte_timeout,
                drain_seconds=limits.drain_seconds if extra else None,
                on_first_byte=self._first_byte,
            )
        except (UpstreamFailed, UpstreamTimeout) as exc:
            if not self.upstreams:  # a fleet takes failing upstreams out instead
                self.breaker.failure(str(exc))
            raise

    async def _passthrough(self, scope: Scope, receive: Receive, send: Send) -> int:
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

        origin, prefix, _ = self._origin(None)
        url = upstream_url(scope, origin, prefix)
        forwarded = self._request_headers(headers, [])
        request = (scope["method"], url, forwarded, body() if has_body else None)
        flight = Flight(task=asyncio.current_task())
        try:
            return await self._send_upstream(request, send, flight, [])
        except UpstreamFailed as exc:
            return await respond(send, 502, error_body(str(exc), "upstream_error"))
        except UpstreamTimeout as exc:
            return await respond(send, 504, error_body(str(exc), "upstream_timeout"))
        except asyncio.CancelledError:
            if not self._closing or flight.started:
                raise
            uncancel(flight.task)
            return await self._shutdown_503(send)

    async def _shutdown_503(self, send: Send) -> int:
        message = "the gateway shut down before this request could finish; retry later"
        retry = [(b"retry-after", str(math.ceil(self.config.limits.retry_after_seconds)).encode())]
        return await respond(send, 503, error_body(message, "shutdown"), retry)

    async def _gated(
        self, scope: Scope, receive: Receive, send: Send, who: Identity, path: str
    ) -> int:
        config = self.config
        limits = config.limits
        limit = limits.max_body_bytes
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        priority_value: bytes | None = None
        group_value: bytes | None = None
        content_type = b""
        for name, value in headers:
            if name == _PRIORITY_HEADER:
                priority_value = value
            elif name == _GROUP_HEADER:
                group_value = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length" and value.isdigit() and int(value) > limit:
                return await respond(send, 413, error_body(f"body over {limit} bytes", "too_large"))
        try:
            body = await read_body(receive, limit, limits.body_timeout)
            if body is None:
                return 499  # the client left before sending its body (nginx's number)
            model = extract_model(body, content_type) or model_from_url(
                path, scope.get("query_string", b"")
            )
        except TooLarge:
            return await respond(send, 413, error_body(f"body over {limit} bytes", "too_large"))
        except BodyTimeout:
            message = f"the request body did not arrive within {limits.body_timeout:g} s"
            return await respond(send, 408, error_body(message, "timeout"))
        except BadRequest as exc:
            return await respond(send, 400, error_body(str(exc), "invalid_request_error"))
        group = None
        if group_value is not None:
            label = group_value.decode("latin-1")
            if not label or len(label) > MAX_GROUP_LABEL or not label.isprintable():
                message = (
                    f"X-Prioqueue-Group must be 1 to {MAX_GROUP_LABEL} printable characters, "
                    f"got {label[:40]!r}"
                )
                return await respond(send, 400, error_body(message, "invalid_request_error"))
            group = _observe.group_key(who.member, label)
        size = len(body)
        if self.queued_body_bytes + size > limits.max_queued_body_bytes:
            message = (
                f"queued requests already hold {self.queued_body_bytes} bytes of bodies "
                f"(limit {limits.max_queued_body_bytes})"
            )
            retry = [(b"retry-after", str(math.ceil(limits.retry_after_seconds)).encode())]
            return await respond(send, 429, error_body(message, "queue_full"), retry)
        priority = min(config.policy.parse(priority_value, who.ceiling), who.ceiling)
        job_id = uuid.uuid4().hex
        arrival = self.gate.now()
        turn = self.gate.turn(
            job_id,
            member=who.member,
            priority=priority,
            tier=who.tier,
            model=model,
            estimate=config.estimate_seconds,
            payload=path,
            timeout=limits.max_wait_for(priority),
            group=group,
            ceiling=who.ceiling,  # kept even below the policy's minimum (issue 21)
        )
        ours = [
            (b"x-prioqueue-job", job_id.encode()),
            (b"x-prioqueue-priority", str(priority).encode()),
        ]
        loop = asyncio.get_running_loop()
        flight = Flight(task=asyncio.current_task())
        watcher = loop.create_task(watch_disconnect(receive, flight))
        lease_watch: asyncio.Task[None] | None = None
        status = 0
        outcome = "queued"
        self.queued_body_bytes += size
        held = size
        held_turn = _Held(self, turn, flight)
        try:
            async with held_turn as first:
                grant = first
                self.queued_body_bytes -= held
                held = 0
                self.grants.append(grant)
                ours.append((b"x-prioqueue-queue-wait", f"{grant.waited:.3f}".encode()))
                extra = [(_PRIORITY_HEADER, str(priority).encode()), ours[0]]
                forwarded = self._request_headers(headers, extra)
                if not self.upstreams:
                    # One upstream: the previous request may have been cut by its lease a
                    # moment ago (the GPU given to this one at its deadline) and still run.
                    previous, self._last_flight = self._last_flight, flight
                    if previous is not None:
                        await previous.exited.wait()
                    await self.lingering.settled("")
                while True:
                    if grant.lease is not None:
                        # The adapter owns the one lease timer; it revokes the turn on expiry.
                        lease_watch = loop.create_task(watch_lease(turn, flight))
                    origin, prefix, upstream = self._origin(grant)
                    held_turn.upstream = upstream
                    if upstream is not None:
                        upstream.granted(grant)
                    url = upstream_url(scope, origin, prefix)
                    try:
                        status = await self._send_upstream(
                            (scope["method"], url, forwarded, body), send, flight, ours
                        )
                        break
                    except UpstreamFailed as exc:
                        if lease_watch is not None:
                            lease_watch.cancel()
                            lease_watch = None
                        grant = await self._requeue(turn, upstream, exc, flight)
                outcome = "done"
        except Overloaded as exc:  # the forecast wait is over the level's max_wait
            status, outcome = 503, "rejected: overloaded"
            retry = [(b"retry-after", str(math.ceil(exc.retry_after)).encode())]
            await respond(send, 503, error_body(str(exc), "overloaded"), ours + retry)
        except QueueFull as exc:
            status, outcome = 429, "rejected: queue full"
            retry = [(b"retry-after", str(math.ceil(exc.retry_after)).encode())]
            await respond(send, 429, error_body(str(exc), "queue_full"), ours + retry)
        except (QueueTimeout, DispatcherClosed, JobCancelled) as exc:
            # JobCancelled: the grant was revoked (its lease ran out) before this request
            # could start; nothing reached the upstream, so the client may simply retry.
            status = 503
            outcome = (
                "timed out in the queue"
                if isinstance(exc, QueueTimeout)
                else "shutdown"
                if isinstance(exc, DispatcherClosed)
                else "revoked before it started"
            )
            retry = [(b"retry-after", str(math.ceil(limits.retry_after_seconds)).encode())]
            await respond(send, 503, error_body(str(exc), "unavailable"), ours + retry)
        except UpstreamFailed as exc:
            status, outcome = 502, "upstream unreachable"
            await respond(send, 502, error_body(str(exc), "upstream_error"), ours)
        except UpstreamTimeout as exc:
            status, outcome = 504, "upstream sent no response in time"
            await respond(send, 504, error_body(str(exc), "upstream_timeout"), ours)
        except SlowReader:
            outcome = f"cut: the client took nothing for {limits.drain_seconds:g} s"
            log.warning(
                "job %s (%s %s): %s; the GPU is free again", job_id, who.member, path, outcome
            )
        except asyncio.CancelledError:
            if flight.disconnected:
                outcome = "client disconnected"
                uncancel(flight.task)
            elif flight.lease_expired:
                outcome = "lease expired"
                uncancel(flight.task)
                status = await self._lease_cut(send, flight, job_id, who, path, ours)
            elif self._closing:
                outcome = "shutdown: past the grace period"
                uncancel(flight.task)
                if not flight.started:
                    status = await self._shutdown_503(send)
                elif flight.sse:
                    end = sse_error("the gateway shut down before the response ended", "shutdown")
                    with contextlib.suppress(Exception):
                        await send({"type": "http.response.body", "body": end})
            else:
                raise
        finally:
            self.queued_body_bytes -= held
            flight.done = True
            watcher.cancel()
            if lease_watch is not None:
                lease_watch.cancel()
            _observe.remember(self, job_id, who, model, path, priority, outcome, status, turn.grant)
            if self.recorder is not None:
                record_finished(
                    self.recorder,
                    arrival=arrival,
                    now=self.gate.now(),
                    member=who.member,
                    tier=who.tier,
                    priority=priority,
                    model=model,
                    estimate=config.estimate_seconds,
                    outcome=outcome,
                    grant=turn.grant,
                    first_byte=flight.first_byte,
                    streamed=flight.sse,
                    known_load=None if model is None else self.record_loads.get(model),
                )
        return status

    def _held_by(self, upstream: _upstreams.Upstream | None) -> int:
        """How many of the gateway's requests an upstream holds now (lingering ones too)."""
        return self.gate.holding("" if upstream is None else upstream.name)

    def _linger(
        self,
        turn: Turn | None,
        upstream: _upstreams.Upstream | None,
        exc_info: tuple[type[BaseException] | None, BaseException | None, TracebackType | None],
    ) -> bool:
        """Keep a turn closed early until its upstream is idle; False when it aborts.

        With ``turn`` None (a request cut by its lease) nothing is held: the upstream only
        counts as busy for the next request on it (``Lingering.settled``).
        """
        config = self.config
        if upstream is None:
            aborts, timeout, path = config.aborts, config.busy_timeout, config.idle_path
            base, name = self._upstream, ""
        else:
            own = upstream.config
            aborts, timeout, path = own.aborts, own.busy_timeout, own.idle_path
            base, name = upstream.origin + upstream.path, upstream.name
        if aborts:
            return False
        self.lingering.hold(
            None if turn is None else turn.__aexit__,
            exc_info,
            upstream=name,
            url=idle_url(base, path or config.resident_path),
            timeout=timeout,
            ours=lambda: 0 if turn is None else self._held_by(upstream),
            job_id="(cut by its lease)" if turn is None else turn.job_id,
        )
        return True

    def explain(self, job_id: str, who: Identity | None = None) -> dict[str, Any]:
        """Return what is known of a job: the dispatcher's explanation, or its history record.

        Args:
            job_id: The job id.
            who: The caller (None: an observer); others' jobs are unknown to non-observers.

        Raises:
            UnknownJob: The job is neither queued, running nor remembered (or not the
                caller's to see).
        """
        return _observe.explain(self, job_id, who)
