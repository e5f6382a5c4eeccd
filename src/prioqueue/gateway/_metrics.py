"""The gateway's ``/metrics``: the dispatcher's series and the gateway's own (private).

:func:`metrics_renderer` registers the driver's ``stats`` (see :mod:`prioqueue.prometheus`)
and :func:`collector` (HTTP counters, first-byte latency, queued body bytes, the breaker, and
per upstream of a fleet: up, resident model, busy seconds, grants, swaps) in one registry
per gateway; :func:`serve_metrics` answers ``GET /metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from prioqueue.gateway._forward import Send, send_json
from prioqueue.gateway._health import LATENCY_BUCKETS

if TYPE_CHECKING:
    from prioqueue.gateway._host import Host as Gateway

__all__ = ["collector", "metrics_renderer", "serve_metrics"]


def collector(gateway: Gateway) -> Any:
    """Return a Prometheus collector of the gateway's HTTP series (needs prometheus-client)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    class GatewayCollector:
        def describe(self) -> Iterator[Any]:
            return self.collect()

        def collect(self) -> Iterator[Any]:
            stats = gateway.http_stats
            requests = CounterMetricFamily(
                "prioqueue_gateway_requests",
                "Answered requests by route class (gated, passthrough, observe, admin, "
                "refused) and HTTP status.",
                labels=["route", "status"],
            )
            for (route, status), count in sorted(stats.requests.items()):
                requests.add_metric([route, str(status)], count)
            yield requests
            buckets = []
            total = 0
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), stats.latency_counts):
                total += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
            yield HistogramMetricFamily(
                "prioqueue_gateway_upstream_first_byte_seconds",
                "Seconds from sending a request upstream to its response's headers.",
                buckets=buckets,
                sum_value=stats.latency_sum,
            )
            yield GaugeMetricFamily(
                "prioqueue_gateway_queued_body_bytes",
                "Bytes of request bodies held by queued requests.",
                value=gateway.queued_body_bytes,
            )
            breaker = gateway.breaker
            yield GaugeMetricFamily(
                "prioqueue_gateway_upstream_breaker_open",
                "1 while the circuit breaker fails requests fast (upstream down), else 0.",
                value=1 if breaker.state == "open" else 0,
            )
            yield CounterMetricFamily(
                "prioqueue_gateway_upstream_breaker_opened",
                "Times the circuit breaker opened.",
                value=breaker.opened,
            )
            if gateway.upstreams:
                yield from _fleet_families(gateway, GaugeMetricFamily, CounterMetricFamily)

    return GatewayCollector()


def _fleet_families(gateway: Gateway, gauge: Any, counter: Any) -> Iterator[Any]:
    """Per-upstream series of a fleet: up, resident model, busy seconds, grants, swaps."""
    up = gauge(
        "prioqueue_gateway_fleet_up", "1 while the upstream is in the fleet.", labels=["upstream"]
    )
    resident = gauge(
        "prioqueue_gateway_fleet_resident",
        "1 for the model the upstream has loaded (as last polled or granted).",
        labels=["upstream", "model"],
    )
    busy = counter(
        "prioqueue_gateway_fleet_busy_seconds",
        "Seconds the upstream held requests (utilisation: its rate).",
        labels=["upstream"],
    )
    grants = counter(
        "prioqueue_gateway_fleet_grants", "Requests granted to the upstream.", labels=["upstream"]
    )
    swaps = counter(
        "prioqueue_gateway_fleet_swaps",
        "Grants that needed another model than the one loaded on the upstream.",
        labels=["upstream"],
    )
    gate = gateway.fleet_gate
    for name, upstream in sorted(gateway.upstreams.items()):
        up.add_metric([name], 1 if upstream.up else 0)
        if upstream.loaded is not None:
            resident.add_metric([name, upstream.loaded], 1)
        busy.add_metric([name], 0.0 if gate is None else gate.busy_seconds.get(name, 0.0))
        grants.add_metric([name], 0 if gate is None else gate.grants.get(name, 0))
        swaps.add_metric([name], upstream.swaps)
    yield from (up, resident, busy, grants, swaps)


def metrics_renderer(gateway: Gateway) -> Callable[[], bytes] | None:
    """Return a function rendering the Prometheus text exposition, or None without the extra."""
    try:
        from prometheus_client import CollectorRegistry

        from prioqueue import prometheus
    except ImportError:  # pragma: no cover - exercised only without the extra
        return None

    registry = CollectorRegistry()  # one per gateway: several can live in one process
    prometheus.register(gateway.gate.stats, registry=registry)
    registry.register(collector(gateway))
    return lambda: prometheus.render(registry)


async def serve_metrics(gateway: Gateway, scope: MutableMapping[str, Any], send: Send) -> int:
    """Answer ``GET /metrics`` (the caller is allowed to read it); return the status."""
    if scope["method"] not in ("GET", "HEAD"):
        return await send_json(send, 405, {"error": {"message": "only GET is allowed here"}})
    render = gateway.metrics
    if render is None:
        message = "metrics need the prometheus extra: pip install '.[gateway,prometheus]'"
        return await send_json(send, 404, {"error": {"message": message}})
    body = render()
    headers = [
        (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return 200
