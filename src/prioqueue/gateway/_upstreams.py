"""Several upstreams: each one's state, its health poll, and what status and metrics show.

Theory of operation
-------------------
Each ``[[upstreams]]`` entry is an :class:`Upstream`, and while it is healthy one worker of the
gateway's :class:`~prioqueue.gateway._fleetgate.FleetGate`. :func:`watch` polls it every
``health_seconds``: ``GET {url}{resident_path}`` (llama-swap's ``/running``) and, when its
``models`` are not configured, ``GET {url}/v1/models`` when it comes up and every
:data:`MODELS_REFRESH` seconds. A poll that fails (connection error, timeout, a status >= 400,
a body that is not the expected JSON) takes the upstream out of the fleet
(:meth:`~prioqueue.gateway._fleetgate.FleetGate.take_out`: it pulls nothing, and the jobs it
holds keep counting on it until their requests end); so does a connection error while
forwarding a request (that request's job is queued again). The next poll that succeeds puts
it back. Each poll also reads the upstream's activity (:func:`~._idle.busy_count`; its
``idle_path`` when that is another endpoint): work beyond the gateway's own requests there
counts against its slots until the next poll. While the upstream holds no job, the polled
model is fed to the fleet as its resident model.

Swaps are counted by the gateway: a grant whose model differs from the model last known on
that upstream (polled or last granted) is one swap.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from prioqueue.gateway._host import Upstream
from prioqueue.gateway._idle import busy_count, idle_url
from prioqueue.gateway._llamaswap import upstream_reason
from prioqueue.gateway._loaded import loaded_models

if TYPE_CHECKING:
    from prioqueue.gateway._host import Host as Gateway

__all__ = ["MODELS_REFRESH", "Upstream", "check", "refused", "watch"]

log = logging.getLogger("prioqueue.gateway")

MODELS_REFRESH = 60.0
"""Seconds between two reads of an upstream's ``/v1/models`` (when not configured)."""


def refused(url: str, status: int, body: bytes) -> str:
    """Say in one line why a poll of ``url`` was answered ``status`` (>= 400)."""
    reason = upstream_reason(body[:4096], limit=160)
    text = f"{url} answered {status}" + (f" ({reason})" if reason else "")
    if status in (401, 403):
        text += ": check upstream_api_key against llama-swap's apiKeys"
    return text


async def _get_json(gateway: Gateway, url: str, upstream: Upstream) -> Any:
    client = gateway.client
    assert client is not None, "the gateway was not started (lifespan)"
    import aiohttp

    # aiohttp's own timeout, not asyncio.wait_for: on Python 3.11 wait_for may swallow a
    # cancellation that lands as the request completes, and the poller would never stop.
    total = gateway.config.limits.connect_timeout + gateway.config.health_seconds
    timeout = aiohttp.ClientTimeout(total=total)
    headers = gateway.config.poll_headers(upstream.config)
    async with client.get(url, allow_redirects=False, timeout=timeout, headers=headers) as response:
        body = await response.read()
        if response.status >= 400:
            raise ValueError(refused(url, response.status, body))
        return json.loads(body)


async def check(gateway: Gateway, upstream: Upstream) -> None:
    """Poll one upstream once: its health, activity, resident model and (when due) models."""
    gate = gateway.fleet_gate
    assert gate is not None
    base = upstream.origin + upstream.path
    name = upstream.name
    config = gateway.config
    ours = gate.holding(name)
    grants = upstream.tracker.grants
    asked = gate.now()
    try:
        report = await _get_json(gateway, base + config.resident_path, upstream)
        loaded = loaded_models(report) or []
        idle_path = upstream.config.idle_path
        if idle_path is not None and idle_path != config.resident_path:
            report = await _get_json(gateway, idle_url(base, idle_path), upstream)
        busy = busy_count(report)
        models = upstream.models
        now = gate.now()
        if upstream.config.models is None and (
            not upstream.up or now - upstream.models_read_at >= MODELS_REFRESH
        ):
            listing = await _get_json(gateway, base + "/v1/models", upstream)
            data = listing.get("data", []) if isinstance(listing, dict) else []
            models = tuple(
                str(entry["id"]) for entry in data if isinstance(entry, dict) and entry.get("id")
            )
            upstream.read_models(now)
            if not models:
                raise ValueError(f"{base}/v1/models lists no model")
    except Exception as exc:  # any failure of the poll: the upstream is not healthy
        gateway.take_out(upstream, f"health check failed: {str(exc) or type(exc).__name__}")
        return
    # What it has loaded (several models with llama-swap's groups) is read only from a poll
    # asked and answered while the gateway held nothing there: one asked during a request
    # may predate its swap.
    idle = not ours and not gate.holding(name) and grants == upstream.tracker.grants
    resident = upstream.polled(loaded) if idle else upstream.loaded
    # Work it reports beyond the gateway's own requests there (held during the poll) counts
    # against its slots until the next poll: new work only when idle by both counts.
    ours = max(ours, gate.holding(name))
    gate.set_reported(name, 0 if busy is None else busy - ours, since=asked)
    if upstream.came_up(models):
        gate.put_back(
            name,
            models=models,
            slots=upstream.config.slots,
            slow=upstream.config.slow,
            resident=resident,
            aborts=upstream.config.aborts,
        )
        log.info("upstream %s is up (models: %s)", name, ", ".join(models or ()) or "any")
    elif idle:
        gate.set_resident(name, resident)


async def watch(gateway: Gateway, upstream: Upstream) -> None:
    """Poll an upstream every ``health_seconds`` until cancelled."""
    while True:
        await asyncio.sleep(gateway.config.health_seconds)
        await check(gateway, upstream)
