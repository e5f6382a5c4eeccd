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
``_metrics.collector`` exposes both (and the bytes held by queued bodies) to Prometheus.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Final

__all__ = ["LATENCY_BUCKETS", "Breaker", "HttpStats"]

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
