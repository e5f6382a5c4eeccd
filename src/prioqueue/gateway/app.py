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
   :mod:`prioqueue.gateway.body`; a bad body is 400 and never involves the GPU), the
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
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from prioqueue._driver import Driver
from prioqueue.asyncio import AsyncDispatcher
from prioqueue.clock import SYSTEM_CLOCK
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.gateway import _dashboard, _metrics, _observe, _paths, _upstreams
from prioqueue.gateway._auth import Callers
from prioqueue.gateway._fleetgate import FleetGate
from prioqueue.gateway._forward import (
    Flight,
    SlowReader,
    UpstreamFailed,
    error_body,
    normalise_path,
    respond,
    upstream_url,
    watch_disconnect,
    watch_lease,
)
from prioqueue.gateway._gating import (
    PRIORITY_HEADER,
    REFUSALS,
    Asked,
    Held,
    read_gated,
    refusal,
)
from prioqueue.gateway._health import Breaker, HttpStats
from prioqueue.gateway._history import JobHistory
from prioqueue.gateway._idle import Lingering
from prioqueue.gateway._loaded import Loaded
from prioqueue.gateway._record import Recorder
from prioqueue.gateway._route import Routes
from prioqueue.gateway.body import BadRequest, extract_model
from prioqueue.gateway.proxy import make_client
from prioqueue.gateway.settings import GatewayConfig, Identity
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

_CLIENT_DECIDES = frozenset({b"authorization", PRIORITY_HEADER})
"""Request headers never forwarded as the client sent them (``x-prioqueue-*`` neither)."""
UPSTREAM_METRICS = "/prioqueue/upstream-metrics"
"""llama-swap's own Prometheus ``/metrics`` through the gateway (admin keys only)."""
GRANT_RING = 10_000
"""Recent grants kept for explaining finished jobs (what overtook them)."""


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
            of a swap whose load cannot be measured (``--record-load``); they override the
            configuration's ``load_seconds`` for the recording (not for the dispatcher).
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,
        recorder: Recorder | None = None,
        record_loads: Mapping[str, float] | None = None,
    ):
        self.config = config
        self.recorder = recorder
        self.record_loads: Mapping[str, float] = config.recording_loads(record_loads)
        limits = config.limits
        self.upstreams = {
            u.name: _upstreams.Upstream.of(u, config.resident_persistent) for u in config.upstreams
        }
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
            "load_seconds": config.load_seconds,
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
        self.history = JobHistory()
        self.dashboard_state = _dashboard.memory()
        self.grants: collections.deque[Grant] = collections.deque(maxlen=GRANT_RING)
        self.http_stats = HttpStats()
        self.breaker = Breaker(limits.breaker_failures, limits.breaker_cooldown_seconds, clock)
        self.queued_body_bytes = 0
        self.metrics: Callable[[], bytes] | None = _metrics.metrics_renderer(self)
        self._poller: asyncio.Task[None] | None = None
        self.lingering = Lingering(self)
        self.loaded = Loaded(config.resident_persistent)
        self._side_tasks: dict[asyncio.Task[None], str] = {}
        self.poll_error: str | None = None
        self._last_flight: Flight | None = None
        self._closing = False
        self._closer: asyncio.Future[None] | None = None
        self._upstream = config.upstream
        parts = urlsplit(config.upstream)
        self._upstream_origin = f"{parts.scheme}://{parts.netloc}"
        self._upstream_path = parts.path
        key = config.upstream_api_key
        self._authorization = None if key is None else b"Bearer " + key.encode("latin-1")
        self._callers = Callers(config)

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
        watchers.extend(list(self._side_tasks))
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
        """Return the caller's identity from its headers, or None to refuse it (401).

        The order (trusted header, API key, anonymous member) is :class:`._auth.Callers`'s.
        """
        return self._callers.identify(headers)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        # Route on the normalised path, the one the upstream will act on: otherwise
        # "/x/../v1/chat/completions" or "//v1/chat/completions" would bypass the gate.
        path = normalise_path(scope["path"])
        stats = self.http_stats
        if path == "/metrics" and self._callers.reads_metrics(headers):
            stats.answered("observe", await _metrics.serve_metrics(self, scope, send))
            return
        if path == _dashboard.PAGE or path.startswith(_dashboard.PAGE + "/"):  # no key needed
            stats.answered("observe", await _dashboard.serve_page(send, path))
            return
        identity = self.identify(headers)
        if identity is None:
            body = error_body("a valid API key is required", "invalid_api_key")
            challenge = [(b"www-authenticate", b'Bearer realm="prioqueue"')]
            if not path.startswith("/prioqueue/"):
                # llama-swap's own UI (/ui/, /api/*, /logs) in a browser: a Basic login with
                # the key as password (never on the dashboard's paths: no browser dialog).
                challenge.append((b"www-authenticate", b'Basic realm="prioqueue"'))
            await respond(send, 401, body, challenge)
            stats.answered("refused", 401)
            return
        if path == UPSTREAM_METRICS:
            stats.answered("admin", await self._upstream_metrics(scope, receive, send, identity))
            return
        if path.startswith("/prioqueue/") or path == "/metrics":
            stats.answered("observe", await _paths.serve(self, scope, send, identity, path))
            return
        config = self.config
        if config.is_admin(path) and not identity.admin:
            body = error_body(f"{path} needs an admin key", "permission_denied")
            stats.answered("refused", await respond(send, 403, body))
            return
        if config.is_observer_path(path) and not identity.observer:
            body = error_body(f"{path} needs an observer or admin key", "permission_denied")
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

    async def _gated(
        self, scope: Scope, receive: Receive, send: Send, who: Identity, path: str
    ) -> int:
        config = self.config
        asked = await read_gated(scope, receive, send, config, who, path, self.queued_body_bytes)
        if isinstance(asked, int):
            return asked
        job_id = uuid.uuid4().hex
        arrival = self.gate.now()
        priority = asked.priority
        turn = self.gate.turn(
            job_id,
            timeout=config.limits.max_wait_for(priority),
            member=who.member,
            priority=priority,
            tier=who.tier,
            model=asked.model,
            estimate=config.estimate_seconds,
            payload=path,
            group=asked.group,
            ceiling=who.ceiling,  # kept even below the policy's minimum (issue 21)
        )
        ours = [
            (b"x-prioqueue-job", job_id.encode()),
            (b"x-prioqueue-priority", str(priority).encode()),
        ]
        flight = Flight(task=asyncio.current_task())
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, flight))
        status, outcome = 0, "queued"
        held = len(asked.body)
        self.queued_body_bytes += held
        held_turn = Held(turn, flight, self.lingering.keep)
        try:
            async with held_turn as grant:
                self.queued_body_bytes -= held
                held = 0
                status = await self._forward_granted(held_turn, grant, scope, send, ours, asked)
                outcome = "done"
        except REFUSALS as exc:
            status, outcome = await refusal(exc, send, ours, config.limits.retry_after_seconds)
        except SlowReader:
            outcome = f"cut: the client took nothing for {config.limits.drain_seconds:g} s"
            log.warning(
                "job %s (%s %s): %s; the GPU is free again", job_id, who.member, path, outcome
            )
        except asyncio.CancelledError:
            ended = await self._cancelled(send, flight, job_id, who, path, ours)
            if ended is None:
                raise
            outcome = ended[1]
            status = status if ended[0] is None else ended[0]
        finally:
            self.queued_body_bytes -= held
            flight.finish()
            watcher.cancel()
            asks = (asked.model, asked.priority)
            ran = turn.grant
            _observe.finished(self, job_id, who, path, asks, arrival, ran, flight, outcome, status)
        return status

    async def _forward_granted(
        self,
        held_turn: Held,
        grant: Grant,
        scope: Scope,
        send: Send,
        ours: list[tuple[bytes, bytes]],
        asked: Asked,
    ) -> int:
        """Forward a granted request (to another upstream when one cannot be reached)."""
        turn, flight = held_turn.turn, held_turn.flight
        self.grants.append(grant)
        ours.append((b"x-prioqueue-queue-wait", f"{grant.waited:.3f}".encode()))
        extra = [(PRIORITY_HEADER, str(asked.priority).encode()), ours[0]]
        forwarded = self._request_headers(scope["headers"], extra, key=False)
        if not self.upstreams:
            # One upstream: the previous request may have been cut by its lease a moment
            # ago (the GPU given to this one at its deadline) and still run.
            previous, self._last_flight = self._last_flight, flight
            if previous is not None:
                await previous.exited.wait()
            await self.lingering.settled("")
        lease_watch: asyncio.Task[None] | None = None
        try:
            while True:
                if grant.lease is not None:
                    # The driver owns the one lease timer; it revokes the turn on expiry.
                    lease_watch = asyncio.get_running_loop().create_task(watch_lease(turn, flight))
                origin, prefix, upstream = self._origin(grant)
                held_turn.sent_to(upstream)
                await self._reads_settled(upstream)
                swap = flight.granted(self._granted(grant, upstream))
                url = upstream_url(scope, origin, prefix)
                request = (scope["method"], url, self._with_key(forwarded, upstream))
                try:
                    return await self._send_upstream(
                        (*request, asked.body), send, flight, ours, swap=swap, upstream=upstream
                    )
                except UpstreamFailed as exc:
                    if lease_watch is not None:
                        lease_watch.cancel()
                        lease_watch = None
                    grant = await self._requeue(turn, upstream, exc, flight)
        finally:
            if lease_watch is not None:
                lease_watch.cancel()

    async def _upstream_metrics(
        self, scope: Scope, receive: Receive, send: Send, who: Identity
    ) -> int:
        """``GET /prioqueue/upstream-metrics[?upstream=NAME]``: llama-swap's ``/metrics``.

        Admin keys only (it names the models and the machine's load). Over ``[[upstreams]]``
        ``upstream`` names which (default: the first); it is forwarded like a pass-through
        request, with that upstream's ``upstream_api_key``.
        """
        if not who.admin:
            body = error_body(f"{UPSTREAM_METRICS} needs an admin key", "permission_denied")
            return await respond(send, 403, body)
        if scope["method"] not in ("GET", "HEAD"):
            return await respond(send, 405, error_body("only GET is allowed here", "method"))
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        upstream = None
        if self.upstreams:
            name = query.get("upstream", [next(iter(self.upstreams))])[0]
            upstream = self.upstreams.get(name)
            if upstream is None:
                known = ", ".join(self.upstreams)
                message = f"no upstream {name!r} (known: {known})"
                return await respond(send, 404, error_body(message, "not_found"))
        inner = dict(scope, path="/metrics", raw_path=b"/metrics", query_string=b"")
        to: tuple[str, str, _upstreams.Upstream | None]
        if upstream is None:
            to = (self._upstream_origin, self._upstream_path, None)
        else:
            to = (upstream.origin, upstream.path, upstream)
        return await self._passthrough(inner, receive, send, to)

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
