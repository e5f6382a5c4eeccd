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

from prioqueue._driver import Driver
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
from prioqueue.gateway._loaded import Loaded, loaded_models
from prioqueue.gateway.proxy import request_headers
from prioqueue.gateway.settings import GatewayConfig, Identity
from prioqueue.records import Grant, Job, WorkerInfo
from prioqueue.turn import Turn

if TYPE_CHECKING:
    import aiohttp

__all__ = ["Routes"]

log = logging.getLogger("prioqueue.gateway")

Scope = MutableMapping[str, Any]
_CLIENT_DECIDES = frozenset({b"authorization", b"x-api-key", PRIORITY_HEADER})
"""Request headers never forwarded as the client sent them (``x-prioqueue-*`` neither): the
client's gateway key (``Authorization`` or llama-swap's ``X-API-Key``) and its priority."""


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
    loaded: Loaded
    poll_error: str | None
    _side_tasks: dict[asyncio.Task[None], str]
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
        before = upstream.last_error
        if upstream.went_down(why):
            log.warning("upstream %s is out of the fleet: %s", upstream.name, why)
        elif why != before:  # never up yet, or failing another way: say why
            log.warning("upstream %s is not up: %s", upstream.name, why)
        if self.fleet_gate is not None:
            self.fleet_gate.take_out(upstream.name)

    def _busy(self) -> bool:
        return self.gate.holding() > 0

    def upstream_key(self, upstream: _upstreams.Upstream | None) -> str | None:
        """The ``upstream_api_key`` sent to an upstream (None: the single one's, or none)."""
        return self.config.upstream_api_key if upstream is None else upstream.config.api_key

    async def _read_running(self, upstream: _upstreams.Upstream | None) -> list[str]:
        """GET the upstream's ``/running``: its loaded models.

        Raises:
            ValueError: It answered >= 400 or no ``/running`` report (the message says which).
            aiohttp.ClientError, asyncio.TimeoutError: It could not be read.
        """
        import aiohttp

        client = self.client
        assert client is not None, "the gateway was not started (lifespan)"
        base = self._upstream if upstream is None else upstream.origin + upstream.path
        url = base + self.config.resident_path
        total = self.config.limits.connect_timeout + self.config.health_seconds
        async with client.get(
            url,
            allow_redirects=False,
            headers=self.config.poll_headers(None if upstream is None else upstream.config),
            timeout=aiohttp.ClientTimeout(total=total),
        ) as response:
            body = await response.read()
            if response.status >= 400:
                raise ValueError(_upstreams.refused(url, response.status, body))
        models = loaded_models(json.loads(body))
        if models is None:
            raise ValueError(f"{url} answered no {{'running': [...]}} report")
        return models

    async def _poll_resident(self) -> None:
        """Refresh the resident model from the upstream's status endpoint, while idle.

        A poll that fails (unreachable, 4xx such as a wrong ``upstream_api_key``, another
        shape) changes nothing: it is logged once and shown in ``/prioqueue/status``.
        """
        while True:
            await asyncio.sleep(self.config.resident_poll_seconds)
            if self.client is None or self._busy():
                continue
            grants = self.loaded.grants
            try:
                models = await self._read_running(None)
            except Exception as exc:
                error = f"resident-model poll failed: {str(exc) or type(exc).__name__}"
                if error != self.poll_error:
                    log.warning("%s", error)
                self.poll_error = error
                continue
            self.poll_error = None
            if self._busy() or grants != self.loaded.grants:
                continue  # a dispatch happened meanwhile and set it
            self.gate.set_resident("", self.loaded.polled(models))

    def _granted(self, grant: Grant, upstream: _upstreams.Upstream | None) -> bool:
        """Count a grant on its upstream's loaded models; return whether it is a swap.

        A grant of a model loaded beside the primary one (a persistent group's) leaves the
        dispatcher's resident model at the primary one.
        """
        if upstream is not None:
            return upstream.granted(grant)
        model = grant.job.model
        swap = self.loaded.granted(model)
        primary = self.loaded.primary
        if model is not None and primary is not None and primary != model:
            self.gate.set_resident("", primary)
        return swap

    def _after_swap(self, upstream: _upstreams.Upstream | None) -> None:
        """Read ``/running`` once a swap's model answers: what stayed loaded beside it.

        Runs in the background: the response is not delayed; the next request forwarded to
        that upstream waits for it first (:meth:`_reads_settled`), so the answer cannot
        predate that request's own swap.
        """
        tracker = self.loaded if upstream is None else upstream.tracker
        grants = tracker.grants

        async def read() -> None:
            try:
                models = await self._read_running(upstream)
            except Exception as exc:  # the regular polls will say it
                log.debug("reading the loaded models after a swap failed: %s", exc)
                return
            if tracker.grants == grants:
                primary = tracker.polled(models)
                if upstream is not None:
                    upstream.loaded = primary

        task = asyncio.get_running_loop().create_task(read())
        self._side_tasks[task] = "" if upstream is None else upstream.name
        task.add_done_callback(self._side_tasks.pop)

    async def _reads_settled(self, upstream: _upstreams.Upstream | None) -> None:
        """Wait for the reads of an upstream's ``/running`` after a swap.

        Each is bounded by its time-out; a caller cancelled meanwhile leaves them running.
        """
        name = "" if upstream is None else upstream.name
        reads = [task for task, where in self._side_tasks.items() if where == name]
        if reads:
            await asyncio.wait(reads)

    def _with_key(
        self, headers: list[tuple[str, str]], upstream: _upstreams.Upstream | None
    ) -> list[tuple[str, str]]:
        key = self.upstream_key(upstream)
        return headers if key is None else [*headers, ("authorization", f"Bearer {key}")]

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
        self,
        headers: list[tuple[bytes, bytes]],
        extra: list[tuple[bytes, bytes]],
        *,
        key: bool = True,
    ) -> list[tuple[str, str]]:
        """The forwarded headers; ``key``: with the single upstream's ``upstream_api_key``."""
        return request_headers(
            headers,
            extra=extra,
            drop=_CLIENT_DECIDES,
            drop_prefix=b"x-prioqueue-",
            authorization=self._authorization if key else None,
        )

    def _first_byte(self, seconds: float) -> None:
        self.breaker.success()
        self.http_stats.upstream_latency(seconds)

    async def _send_upstream(
        self,
        request: Request,
        send: Send,
        flight: Flight,
        extra: list[tuple[bytes, bytes]],
        *,
        swap: bool = False,
        upstream: _upstreams.Upstream | None = None,
    ) -> int:
        """Forward a request (see :func:`._forward.forward`).

        After a ``swap`` on ``upstream`` its ``/running`` is read again once the new model
        answers (:meth:`_after_swap`).
        """
        client = self.client
        assert client is not None, "the gateway was not started (lifespan)"
        limits = self.config.limits
        on_first_byte = self._first_byte
        # The single upstream's /running is read only when the operator asked for polls.
        if swap and (upstream is not None or self.config.resident_poll_seconds > 0):

            def on_first_byte(seconds: float) -> None:
                self._first_byte(seconds)
                self._after_swap(upstream)

        try:
            return await forward(
                client,
                request,
                send,
                flight,
                extra,
                first_byte_timeout=limits.first_byte_timeout,
                drain_seconds=limits.drain_seconds if extra else None,
                on_first_byte=on_first_byte,
            )
        except (UpstreamFailed, UpstreamTimeout) as exc:
            if not self.upstreams:  # a fleet takes failing upstreams out instead
                self.breaker.failure(str(exc))
            raise

    async def _passthrough(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        to: tuple[str, str, _upstreams.Upstream | None] | None = None,
    ) -> int:
        """Forward a request that does not wait (to ``to``: origin, prefix, upstream)."""
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

        origin, prefix, upstream = self._origin(None) if to is None else to
        url = upstream_url(scope, origin, prefix)
        forwarded = self._with_key(self._request_headers(headers, [], key=False), upstream)
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
