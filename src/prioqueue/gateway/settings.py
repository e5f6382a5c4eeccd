"""The gateway's settings: what is gated, who may see what, and the limits, as frozen values.

Theory of operation
-------------------
:class:`GatewayConfig` holds everything; :mod:`prioqueue.gateway.config` builds it from TOML.
Three path sets decide how a request is routed (on its *normalised* path: ``//`` collapsed,
``.`` and ``..`` removed, so ``/x/../v1/chat/completions`` is ``/v1/chat/completions``):

* ``passthrough_paths``: never queued, whatever the method (llama-swap's own read-only and
  management routes). Checked first: an operator who lists a path here does so on purpose.
* ``gated_paths``: queued for every method (``/upstream/*`` reaches a model's own server and
  loads it, even with GET; ``/props``, ``/v1/audio/voices``, ``/sdapi/v1/loras`` and
  ``/comfyui/`` load a model on GET).
* ``gated_methods``: every other request with one of these methods is queued (by default
  every POST, PUT, PATCH and DELETE: anything that may make llama-swap run a model).

``admin_paths`` (``/unload``, ``/logs``, ``/api/*`` by default) answer 403 unless the
caller's key has ``admin = true``; ``observer_paths`` (``/running``, which names every loaded
model and its full ``cmd`` line) unless it is an observer (or admin), as
``/prioqueue/status`` hides the loaded model from others. A pattern ending in ``*`` matches
any suffix; any other pattern matches exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal

import attrs

from prioqueue._service.serving import ConnectionLimits, ConnectionSettings
from prioqueue.lifecycle import LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.scoring import ScoringConfig

__all__ = [
    "DEFAULT_ADMIN_PATHS",
    "DEFAULT_GATED_METHODS",
    "DEFAULT_GATED_PATHS",
    "DEFAULT_LISTEN",
    "DEFAULT_OBSERVER_PATHS",
    "DEFAULT_PASSTHROUGH_PATHS",
    "DEFAULT_UPSTREAM",
    "ApiKey",
    "GatewayConfig",
    "Identity",
    "Limits",
    "PathSet",
    "TrustedHeader",
    "UpstreamConfig",
    "api_key",
    "bearer",
]

DEFAULT_UPSTREAM: Final = "http://127.0.0.1:8080"
"""llama-swap's default address."""
DEFAULT_LISTEN: Final = "127.0.0.1:8090"
"""Where the gateway listens unless told otherwise (loopback only)."""
DEFAULT_GATED_METHODS: Final[tuple[str, ...]] = ("POST", "PUT", "PATCH", "DELETE")
"""Methods whose requests are queued on any path not in ``passthrough_paths``."""
DEFAULT_GATED_PATHS: Final[tuple[str, ...]] = (
    "/upstream/*",
    "/comfyui/",
    "/props",
    "/v1/audio/voices",
    "/sdapi/v1/loras",
)
"""Paths queued for every method: llama-swap loads a model for these even on GET."""
DEFAULT_PASSTHROUGH_PATHS: Final[tuple[str, ...]] = (
    "/v1/models",
    "/models",
    "/running",
    "/health",
    "/wol-health",
    "/logs",
    "/logs/*",
    "/unload",
    "/api/*",
    "/ui/*",
    "/favicon.ico",
    "/upstream",
)
"""Paths that never wait in the queue (read-only or management routes of llama-swap)."""
DEFAULT_ADMIN_PATHS: Final[tuple[str, ...]] = ("/unload", "/logs", "/logs/*", "/api/*")
"""llama-swap's management routes: only keys with ``admin = true`` may call them."""
DEFAULT_OBSERVER_PATHS: Final[tuple[str, ...]] = ("/running",)
"""llama-swap's routes that show what runs (models, ``cmd`` lines): observers and admins only."""

_MAX_BODY: Final = 16 * 1024 * 1024


@attrs.frozen
class PathSet:
    """A set of path patterns: exact paths, and prefixes written with a trailing ``*``.

    Attributes:
        patterns: The patterns as written.
    """

    patterns: tuple[str, ...]
    _exact: frozenset[str] = attrs.field(init=False, repr=False, eq=False)
    _prefixes: tuple[str, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        exact = frozenset(p for p in self.patterns if not p.endswith("*"))
        prefixes = tuple(p[:-1] for p in self.patterns if p.endswith("*"))
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_prefixes", prefixes)

    @classmethod
    def of(cls, patterns: Iterable[str]) -> PathSet:
        """Build a set from patterns."""
        return cls(tuple(patterns))

    def __contains__(self, path: object) -> bool:
        """Whether ``path`` matches a pattern. O(1) for exact paths + O(prefixes)."""
        if not isinstance(path, str):
            return False
        return path in self._exact or path.startswith(self._prefixes)


@attrs.frozen
class ApiKey:
    """Who an API key belongs to, how high it may ask, and what it may see.

    Attributes:
        member: The member the key's jobs are charged to (fair share is per member).
        tier: The member's tier (a name from the ``[tiers]`` table).
        max_priority: The highest priority the key may use; higher headers are capped.
        observer: May see every member's jobs in status, explanations and ``/metrics``.
        admin: May call llama-swap's management routes (``admin_paths``); implies observer.
    """

    member: str
    tier: str
    max_priority: int
    observer: bool = False
    admin: bool = False


@attrs.frozen
class TrustedHeader:
    """Identity taken from headers set by an authenticating proxy in front of the gateway.

    Attributes:
        member: The (lower-case) header naming the member.
        tier: The (lower-case) header naming the tier, or None to use ``default_tier``.
        default_tier: The tier when the tier header is absent or names no known tier.
        max_priority: The priority ceiling of every member identified this way.
    """

    member: str
    tier: str | None
    default_tier: str
    max_priority: int


@attrs.frozen
class Limits(ConnectionSettings):
    """Sizes and times that bound what one request, one connection or the queue may cost.

    Attributes:
        max_queued: Most requests waiting at once (429 beyond), or None.
        max_queued_per_member: Most requests one member may have waiting, or None.
        max_body_bytes: Largest body of a gated request the gateway reads (413 beyond).
        max_queued_body_bytes: Most bytes of bodies held by queued requests together (429
            beyond).
        lease_seconds: Longest time a request may hold the GPU (504, or a cut stream, after).
        lease_seconds_by_path: Per-path overrides of ``lease_seconds`` (normalised paths;
            a trailing ``*`` matches any suffix).
        max_wait_seconds: Longest wait in the queue, for levels not in ``max_wait_by_level``
            (503 after it), or None for no limit.
        max_wait_by_level: Per priority level overrides of ``max_wait_seconds``.
        retry_after_seconds: The ``Retry-After`` of a 503 after a queue timeout or shutdown.
        connect_timeout: Seconds to connect to the upstream (502 after it).
        first_byte_timeout: Seconds the upstream may take to start its response (504 after
            it; the GPU is freed).
        drain_seconds: Longest time one write to a client may wait for the client to read;
            a slower reader is cut and frees the GPU.
        shutdown_grace_seconds: How long running requests may finish at shutdown.
        header_timeout: Seconds a connection may take to send a request's headers (and an
            idle new connection may wait before sending anything); closed after it.
        body_timeout: Seconds a client may take to send a gated request's whole body (408).
        max_header_bytes: Largest single header line, name and value (431 beyond).
        max_headers_bytes: Largest request line plus all headers together (431 beyond).
        max_header_count: Most headers in one request (431 beyond).
        breaker_failures: Consecutive upstream failures (unreachable, no first byte) that
            open the circuit breaker.
        breaker_cooldown_seconds: How long an open breaker answers 503 at once.
        max_connections: Most open client connections: a new one beyond closes the oldest
            idle connection, or is answered 503 when none is idle. None: the open-file limit
            minus 128 (see :mod:`prioqueue._service.serving`).
        max_idle_connections: Most connections that have not sent a complete request head
            (new or kept alive); a new connection beyond closes the oldest idle one. None:
            half of ``max_connections``.
    """

    max_queued: int | None = None
    max_queued_per_member: int | None = None
    max_body_bytes: int = _MAX_BODY
    max_queued_body_bytes: int = 256 * 1024 * 1024
    lease_seconds: float = 900.0
    lease_seconds_by_path: Mapping[str, float] = attrs.field(factory=dict)
    max_wait_seconds: float | None = None
    max_wait_by_level: Mapping[int, float | None] = attrs.field(factory=dict)
    retry_after_seconds: float = 5.0
    connect_timeout: float = 5.0
    first_byte_timeout: float = 300.0
    drain_seconds: float = 10.0
    breaker_failures: int = 5
    breaker_cooldown_seconds: float = 10.0

    def connection_limits(self) -> ConnectionLimits:
        """The connection limits the HTTP server enforces (:mod:`prioqueue._service.serving`)."""
        return self.limits_with(self.retry_after_seconds)

    def lease_for(self, path: str) -> float:
        """Return the lease (seconds) of a request to a normalised ``path``.

        Complexity: O(1) for an exact path, O(patterns) otherwise.
        """
        by_path = self.lease_seconds_by_path
        if path in by_path:
            return by_path[path]
        for pattern, seconds in by_path.items():
            if pattern.endswith("*") and path.startswith(pattern[:-1]):
                return seconds
        return self.lease_seconds

    def max_wait_for(self, level: int) -> float | None:
        """Return the queue-wait limit (seconds) of a priority level, or None. O(1)."""
        if level in self.max_wait_by_level:
            return self.max_wait_by_level[level]
        return self.max_wait_seconds


@attrs.frozen
class UpstreamConfig:
    """One upstream of a fleet (a ``[[upstreams]]`` entry): one llama-swap, one worker.

    Attributes:
        url: Its base URL, ``http://`` or ``https://``.
        name: Its name in status, metrics and job records (default: ``host:port``).
        models: The models it serves, or None to read them from its ``/v1/models`` (at start,
            whenever it comes back, and every ``models_refresh_seconds``).
        slots: Requests it may run at once (1: one at a time).
        slow: Whether it is slow (its leases are three times as long).
        aborts: Whether it stops a request when the gateway closes its connection (llama-server
            behind llama-swap does). False (the default): a request the gateway closed early
            (client gone, slow reader, time-out) still counts against its slots until its
            idle report says it is idle, or ``busy_timeout`` passes.
        busy_timeout: Longest that such a request counts (seconds).
        idle_path: Where it reports its activity (a path under its URL, or a URL); None: the
            gateway's ``resident_path`` (llama-swap's ``/running``). See
            :func:`prioqueue.gateway._idle.busy_count` for the reports understood.
        api_key: Sent as ``Authorization: Bearer`` on every request to it, forwarded or the
            gateway's own polls (its ``upstream_api_key``; default: the top level's).
    """

    url: str
    name: str
    models: tuple[str, ...] | None = None
    slots: int = 1
    slow: bool = False
    aborts: bool = False
    busy_timeout: float = 300.0
    idle_path: str | None = None
    api_key: str | None = attrs.field(default=None, repr=False)


@attrs.frozen
class GatewayConfig:
    """The whole gateway configuration (see ``examples/gateway.toml``).

    Attributes:
        upstream: The upstream base URL (llama-swap), ``http://`` or ``https://``.
        host: The address to listen on.
        port: The port to listen on (0: any free port).
        allow_anonymous: Whether requests without a known key are served (as ``anonymous``).
        anonymous_member: The member of anonymous requests.
        anonymous_tier: The tier of anonymous requests.
        anonymous_max_priority: The priority ceiling of anonymous requests.
        anonymous_observer: Whether anonymous callers see every member's jobs.
        keys: API key -> who it is.
        trusted_header: Identity from an auth proxy's headers, or None (disabled).
        gated_paths: Paths queued whatever the method.
        gated_methods: Methods queued on any path not in ``passthrough_paths``.
        passthrough_paths: Paths never queued.
        admin_paths: Paths only admin keys may call (403 otherwise).
        observer_paths: Paths only observer (or admin) keys may call (403 otherwise).
        metrics_key: A key that may read ``/metrics`` (and nothing else), or None.
        policy: How ``X-LlamaSwap-Priority`` values become numbers.
        scoring: The score's weights (tier bonuses included).
        limits: Sizes and times.
        charge: Fair-share charge model: ``"runtime"``, ``"estimate"`` or seconds per job.
        fair_share: Whether fair share inside a level is on.
        estimate_seconds: Runtime estimate given to every request (for forecasts), or None.
        resident_poll_seconds: Poll the upstream's model status every so many seconds
            (0: never).
        resident_path: The upstream path that lists loaded models (llama-swap: ``/running``).
        resident_persistent: Models that stay loaded beside the swapped one (llama-swap's
            ``persistent`` groups): never taken for the resident model, never counted as
            evicted by a swap. Others are learnt (see ``_loaded``).
        upstream_api_key: Sent as ``Authorization: Bearer`` to the upstream when set. The
            client's own ``Authorization`` (its gateway key) is never forwarded.
        job_history: Finished jobs remembered for ``GET /prioqueue/jobs/{id}``.
        job_history_bytes: The most bytes (estimated) those records may take together.
        upstreams: Several upstreams (``[[upstreams]]``), one fleet worker each; empty: the
            single ``upstream``.
        warm_hold: Seconds a queued request is kept for an upstream that has its model loaded
            and a free slot before a cold one may take it (fleet only; 0: off).
        max_attempts: Upstreams a request may be tried on when its upstream cannot be
            reached before the response began (fleet only).
        health_seconds: Seconds between two health polls of each upstream (fleet only).
        routing: ``"warm"`` (resident models and ``warm_hold`` steer requests), or the blind
            ``"round-robin"`` and ``"least-busy"`` (for comparison; fleet only).
        aborts: Whether the (single) upstream stops a request when the gateway closes its
            connection; the default of each ``[[upstreams]]`` entry (see
            :class:`UpstreamConfig`).
        busy_timeout: Longest a request closed early keeps the upstream busy (seconds).
        idle_path: Where the upstream reports its activity; None: ``resident_path``.
        budgets: Overload protection per level (``[budgets.<level>]``): ``max_queued`` (429),
            ``max_wait`` (a forecast wait over it: 503 with ``Retry-After``) and ``ttl`` (a
            request still queued that long is answered 503); none by default
            (docs/design/lifecycle.md).
        load_seconds: Each model's cold-load time in seconds (``[load_seconds]``), handed to
            the dispatcher: on several upstreams it prices a model's affinity (a cold request
            is not held for more than the swap it saves), on one it weighs a crossing against
            the loads it costs; also the known load of ``--record-load``. Empty: none known.
    """

    upstream: str = DEFAULT_UPSTREAM
    host: str = "127.0.0.1"
    port: int = 8090
    allow_anonymous: bool = True
    anonymous_member: str = "anonymous"
    anonymous_tier: str = "free"
    anonymous_max_priority: int = 0
    anonymous_observer: bool = False
    keys: Mapping[str, ApiKey] = attrs.field(factory=dict)
    trusted_header: TrustedHeader | None = None
    gated_paths: tuple[str, ...] = DEFAULT_GATED_PATHS
    gated_methods: tuple[str, ...] = DEFAULT_GATED_METHODS
    passthrough_paths: tuple[str, ...] = DEFAULT_PASSTHROUGH_PATHS
    admin_paths: tuple[str, ...] = DEFAULT_ADMIN_PATHS
    observer_paths: tuple[str, ...] = DEFAULT_OBSERVER_PATHS
    metrics_key: str | None = None
    policy: PriorityPolicy = attrs.field(factory=PriorityPolicy)
    scoring: ScoringConfig = attrs.field(factory=ScoringConfig)
    limits: Limits = attrs.field(factory=Limits)
    charge: str | float = "runtime"
    fair_share: bool = True
    estimate_seconds: float | None = None
    resident_poll_seconds: float = 0.0
    resident_path: str = "/running"
    resident_persistent: frozenset[str] = frozenset()
    upstream_api_key: str | None = None
    job_history: int = 1000
    job_history_bytes: int = 16 * 1024 * 1024
    upstreams: tuple[UpstreamConfig, ...] = ()
    warm_hold: float = 15.0
    max_attempts: int = 2
    health_seconds: float = 1.0
    routing: Literal["warm", "round-robin", "least-busy"] = "warm"
    aborts: bool = False
    busy_timeout: float = 300.0
    idle_path: str | None = None
    budgets: Mapping[int, LevelBudget] = attrs.field(factory=dict)
    load_seconds: Mapping[str, float] = attrs.field(factory=dict)
    _gated: PathSet = attrs.field(init=False, repr=False, eq=False)
    _passthrough: PathSet = attrs.field(init=False, repr=False, eq=False)
    _admin: PathSet = attrs.field(init=False, repr=False, eq=False)
    _observer: PathSet = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_gated", PathSet.of(self.gated_paths))
        object.__setattr__(self, "_passthrough", PathSet.of(self.passthrough_paths))
        object.__setattr__(self, "_admin", PathSet.of(self.admin_paths))
        object.__setattr__(self, "_observer", PathSet.of(self.observer_paths))

    @property
    def listen(self) -> str:
        """``host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def is_gated(self, method: str, path: str) -> bool:
        """Return whether a request to a normalised ``path`` waits for the GPU.

        Not when the path is a pass-through path; yes when it is a gated path or the method
        is a gated method.

        Complexity: O(patterns).
        """
        if path in self._passthrough:
            return False
        return method in self.gated_methods or path in self._gated

    def is_admin(self, path: str) -> bool:
        """Return whether a normalised ``path`` is a management route (admin keys only)."""
        return path in self._admin

    def is_observer_path(self, path: str) -> bool:
        """Return whether a normalised ``path`` shows what runs (observer keys only)."""
        return path in self._observer

    def poll_headers(self, upstream: UpstreamConfig | None = None) -> dict[str, str]:
        """Headers of the gateway's own requests to an upstream (None: the single one).

        ``Authorization: Bearer`` with its ``upstream_api_key`` when one is set, else none.
        """
        key = self.upstream_api_key if upstream is None else upstream.api_key
        return {} if key is None else {"authorization": f"Bearer {key}"}

    def recording_loads(self, overrides: Mapping[str, float] | None = None) -> dict[str, float]:
        """The recording's known cold loads: ``load_seconds``, ``overrides`` over them.

        ``overrides`` are ``--record-load``'s, which win for the recording only (the
        dispatcher keeps ``load_seconds``). O(models).
        """
        return {**self.load_seconds, **(overrides or {})}

    @property
    def known_models(self) -> frozenset[str]:
        """The models named in ``[[upstreams]]`` ``models`` lists (empty when none are)."""
        return frozenset(m for u in self.upstreams for m in (u.models or ()))


@attrs.frozen
class Identity:
    """Who a request comes from: member, tier, priority ceiling and what it may see.

    Attributes:
        member: The member its jobs are charged to.
        tier: Its tier.
        ceiling: The highest priority it may use.
        observer: Sees every member's jobs (ids, members, models, paths).
        admin: May call the management routes (``admin_paths``).
    """

    member: str
    tier: str
    ceiling: int
    observer: bool = False
    admin: bool = False


def bearer(value: bytes) -> bytes | None:
    """Return the token of an ``Authorization: Bearer`` value (scheme in any case). O(len)."""
    scheme, _, token = value.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return token.strip() or None


def api_key(value: bytes) -> bytes | None:
    """Return the key an ``Authorization`` value carries, as llama-swap reads one.

    ``Bearer KEY``, or ``Basic`` with the key as the password (any user name: what a browser
    sends for llama-swap's own UI). Schemes in any case. O(len).
    """
    token = bearer(value)
    if token is not None:
        return token
    scheme, _, encoded = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    import base64
    import binascii

    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return decoded.partition(b":")[2] or None
