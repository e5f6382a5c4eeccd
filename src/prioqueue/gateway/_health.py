"""The gateway's own health: HTTP-level counters and the upstream circuit breaker.

Theory of operation
-------------------
:class:`HttpStats` counts every answered request by route class (``gated``,
``passthrough``, ``observe``, ``admin``, ``refused``) and status, and records the upstream's
time to first byte in a fixed-bucket histogram: each update is a dict increment or a short
bucket scan, O(1) on the request path. :class:`Breaker` counts consecutive upstream failures
(unreachable, no first byte in time); at ``limits.breaker_failures`` it opens for
``limits.breaker_cooldown_seconds``, during which requests are answered 503 at once instead
of queueing for an upstream that is down. After the cool-down requests go through again
(half-open): one success closes it, one more failure opens it for another cool-down.
:func:`collector` exposes both (and the bytes held by queued bodies) to Prometheus.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from prioqueue.gateway.app import Gateway

__all__ = ["LATENCY_BUCKETS", "Breaker", "HttpStats", "collector"]

LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
"""Upper bounds (seconds) of the upstream first-byte histogram (``+Inf`` added)."""


class HttpStats:
    """Counters of answered requests and a histogram of upstream first-byte latency."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0

    def answered(self, route: str, status: int) -> None:
        """Count one answered request. O(1)."""
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def upstream_latency(self, seconds: float) -> None:
        """Record one upstream time to first byte. O(log buckets)."""
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds


class Breaker:
    """Fail fast while the upstream is down.

    Args:
        failures: Consecutive failures that open it.
        cooldown: Seconds it stays open.
        clock: Monotonic seconds.
    """

    def __init__(self, failures: int, cooldown: float, clock: Callable[[], float]) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self.clock = clock
        self.consecutive = 0
        self.opened_at: float | None = None
        self.opened = 0
        self.last_error = ""

    def retry_in(self) -> float:
        """Seconds until requests may go through again (0: they may now). O(1)."""
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.opened_at + self.cooldown - self.clock())

    def failure(self, error: str) -> None:
        """Record an upstream failure; opens (or re-opens) the breaker at the threshold."""
        self.consecutive += 1
        self.last_error = error
        if self.consecutive >= self.failures and self.retry_in() == 0.0:
            self.opened_at = self.clock()
            self.opened += 1

    def success(self) -> None:
        """Record an upstream answer: closes the breaker."""
        self.consecutive = 0
        self.opened_at = None

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` (failing fast) or ``"half-open"`` (trying again)."""
        if self.opened_at is None:
            return "closed"
        return "open" if self.retry_in() > 0 else "half-open"

    def as_dict(self) -> dict[str, Any]:
        """The breaker for ``/prioqueue/status``."""
        return {
            "state": self.state,
            "consecutive_failures": self.consecutive,
            "retry_in": round(self.retry_in(), 3),
            "opened": self.opened,
            "last_error": self.last_error or None,
        }


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
