"""Where a gated request goes, and what happens when it cannot get there.

Theory of operation
-------------------
:class:`Routes` is the part of :class:`~prioqueue.gateway.app.Gateway` that knows about
upstreams: which upstream a grant names (``Grant.worker`` in a fleet), taking a failing
upstream out of the fleet and trying a request again elsewhere (at most ``max_attempts``
upstreams, only while nothing of the response has reached the client), the single upstream's
resident-model poll, and the 504 (or the ``event: error``) of a request cut by its lease.
It also sends requests upstream: the forwarded headers (what the client must not decide
stripped), pass-through requests, and what a cancelled gated request still answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from prioqueue._driver import Driver, Turn
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.gateway import _upstreams
from prioqueue.gateway._fleetgate import FleetGate
from prioqueue.gateway._forward import (
    Flight,
    Receive,
    Request,
    Send,
    UpstreamFailed,
    UpstreamTimeout,
    error_body,
    forward,
    respond,
    sse_error,
    uncancel,
    upstream_url,
)
from prioqueue.gateway._gating import PRIORITY_HEADER
from prioqueue.gateway._health import Breaker, HttpStats
from prioqueue.gateway.proxy import request_headers
from prioqueue.gateway.settings import GatewayConfig, Identity
from prioqueue.records import Grant, Job, WorkerInfo

if TYPE_CHECKING:
    import aiohttp

__all__ = ["Routes"]

log = logging.getLogger("prioqueue.gateway")

Scope = MutableMapping[str, Any]
_CLIENT_DECIDES = frozenset({b"authorization", PRIORITY_HEADER})
"""Request headers never forwarded as the client sent them (``x-prioqueue-*`` neither)."""


class Routes:
    """Upstream routing and failure handling, mixed into the gateway."""

    config: GatewayConfig
    upstreams: dict[str, _upstreams.Upstream]
    fleet_gate: FleetGate | None
    dispatcher: SizeOneDispatcher | FleetDispatcher
    gate: Driver[SizeOneDispatcher | FleetDispatcher]
    client: aiohttp.ClientSession | None
    _upstream: str
    _upstream_origin: str
    _upstream_path: str
    _authorization: bytes | None
    _closing: bool
    breaker: Breaker
    http_stats: HttpStats

    def _fleet_lease(self, job: Job, worker: WorkerInfo) -> float:
        lease = self.config.limits.lease_for(str(job.payload))
        return lease * 3 if worker.slow else lease

    def take_out(self, upstream: _upstreams.Upstream, why: str) -> None:
        """Take an upstream out of the fleet: it pulls no job until it is back (fleet only).

        The jobs it holds keep counting on it until their requests end (see
        :meth:`FleetGate.take_out`).

        Args:
            upstream: The upstream.
            why: What failed (shown in status and logged).
        """
        if upstream.up:
            upstream.up = False
            upstream.outages += 1
            upstream.last_error = why
            log.warning("upstream %s is out of the fleet: %s", upstream.name, why)
        if self.fleet_gate is not None:
            self.fleet_gate.take_out(upstream.name)

    def _busy(self) -> bool:
        return self.gate.holding() > 0

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
            self.gate.set_resident("", models[0] if models else None)

    def _origin(self, grant: Grant | None) -> tuple[str, str, _upstreams.Upstream | None]:
        """Where a request goes: its grant's upstream, or the first live one (pass-through)."""
        if not self.upstreams:
            return self._upstream_origin, self._upstream_path, None
        name = None if grant is None else grant.worker
        upstream = self.upstreams.get(name) if name is not None else None
        if upstream is None:
            live = [u for u in self.upstreams.values() if u.up] or list(self.upstreams.values())
            upstream = live[0]
        return upstream.origin, upstream.path, upstream

    async def _requeue(
        self,
        turn: Turn,
        upstream: _upstreams.Upstream | None,
        exc: UpstreamFailed,
        flight: Flight,
    ) -> Grant:
        """After a connection failure, take the upstream out and wait for another grant.

        Re-raises ``exc`` (502) when the request cannot be tried again: a single upstream,
        a response already begun, ``max_attempts`` reached, or no upstream left up.
        """
        if upstream is None or flight.started or turn.attempts >= self.config.max_attempts:
            raise exc
        self.take_out(upstream, f"request failed: {exc}")
        gate = self.fleet_gate
        if gate is None or not gate.requeue(turn) or not gate.live:
            raise exc  # a requeued job is cancelled when its holder leaves the block
        log.warning("job %s: %s; trying another upstream", turn.job_id, exc)
        return await turn.regrant()

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

    async def _cancelled(
        self,
        send: Send,
        flight: Flight,
        job_id: str,
        who: Identity,
        path: str,
        ours: list[tuple[bytes, bytes]],
    ) -> tuple[int | None, str] | None:
        """A gated request's task was cancelled: answer what can be; None to re-raise.

        A request cut by its lease gets 504 before its response began; a streamed one an
        ``event: error`` naming the lease (the same at shutdown, past the grace period).

        Returns:
            The status answered (None: unchanged) and the outcome, or None when the
            cancellation is not the gateway's doing.
        """
        if flight.disconnected:
            uncancel(flight.task)
            return None, "client disconnected"
        if not flight.lease_expired and not self._closing:
            return None
        uncancel(flight.task)
        if flight.lease_expired:
            lease = f"{self.config.limits.lease_for(path):g}"
            log.warning(
                "job %s (%s %s): its lease of %s s ran out; the response was cut and the GPU freed",
                job_id,
                who.member,
                path,
                lease,
            )
            status: int | None = 504
            outcome = "lease expired"
            early = error_body(f"the request ran past its lease of {lease} s", "lease_expired")
            late = sse_error(
                f"the response was cut: its lease of {lease} s ran out", "lease_expired"
            )
        else:
            status, outcome = None, "shutdown: past the grace period"
            early = b""
            late = sse_error("the gateway shut down before the response ended", "shutdown")
        if not flight.started:
            if flight.lease_expired:
                return await respond(send, 504, early, ours), outcome
            return await self._shutdown_503(send), outcome
        if flight.sse:
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": late})
        return status, outcome
