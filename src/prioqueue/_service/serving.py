"""Connection hygiene for the HTTP services (gateway, broker) under uvicorn: one reusable place.

Theory of operation
-------------------
uvicorn's HTTP/1.1 protocol (httptools) waits for a request's headers for as long as the
client likes, accepts any number of them, of any size, and any number of connections.
:class:`ConnectionLimits` holds the bounds, :func:`hardened_protocol` returns a subclass of
uvicorn's protocol that enforces them per server, and :func:`uvicorn_config` builds a
``uvicorn.Config`` that uses it. A service only maps its own settings onto a
:class:`ConnectionLimits` (the gateway's ``[limits]`` do, see ``Limits.connection_limits``).

Per connection:

* **Header deadline.** A timer (``header_timeout``) is armed when the connection opens and
  when a request begins; the request's headers must be complete before it fires, or the
  connection is closed (an idle or slow-header client, "slowloris", cannot hold a socket).
* **Header size, counted as the bytes arrive.** While a request's headers are incomplete,
  every received byte up to the end of the headers is counted *before* it is given to the
  parser; past :meth:`ConnectionLimits.raw_header_cap` the connection is answered ``431``, so
  a 64 MiB header is not parsed. The parser's callbacks then check the exact limits
  (``max_header_bytes`` for one header, ``max_headers_bytes`` in all, ``max_header_count``):
  ``431`` too. After a 431 the connection half-closes and drops, unparsed, what the client
  still sends, for at most ``LINGER_SECONDS`` (2 s) or until the client closes (a lingering
  close: closed at once with the client's bytes unread, the kernel would answer them with a
  reset that can destroy the 431 before the client reads it).

Per server (all connections of one ``uvicorn.Server``):

* **Idle connections.** A connection is idle while it has not sent a complete request head
  (a new connection, or a kept-alive one between requests). When a new connection would make
  more than ``max_idle_connections`` idle ones, the oldest idle one is closed first, so
  thousands of silent sockets cannot keep legitimate clients out for ``header_timeout``.
* **All connections.** A new connection beyond ``max_connections`` closes the oldest idle one
  if there is one; otherwise it is answered ``503`` (``Retry-After``) and closed at once.
  Both defaults follow the process's open-file limit (``RLIMIT_NOFILE``), read when the
  protocol is built: ``max_connections`` = the soft limit minus a reserve of 128 (upstream
  connections, files), at least 64; ``max_idle_connections`` = half of that.

The bookkeeping is O(1) per connection event (an ordered dict of idle connections and a
count). Idle keep-alive connections are also closed by uvicorn itself (``timeout_keep_alive``,
which :func:`uvicorn_config` sets to at most ``header_timeout``).

Use from a service::

    from prioqueue._service.serving import ConnectionLimits, uvicorn_config
    config = uvicorn_config(app, ConnectionLimits(header_timeout=5.0), log_level="info")
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

__all__ = [
    "FILE_RESERVE",
    "GC_THRESHOLDS",
    "ConnectionLimits",
    "ConnectionSettings",
    "default_max_connections",
    "hardened_protocol",
    "tune_collector",
    "uvicorn_config",
]

GC_THRESHOLDS = (10_000, 10, 10)
"""The cyclic garbage collector's thresholds in a serving process (Python's are 700, 10, 10).

Every request allocates tasks, futures, scopes and frames, and a broker keeps its queued
jobs: with 2,000 connections in flight the collector ran 110 middle and 10 full collections
in one 8 s run (2.3 s of collector time, 23 % of the run, against 7 % under 50 connections;
issue 21). A first generation of 10,000 allocations makes every generation's collections
about 14 times rarer (1.1 s in a run of the same load, the longest pause 100 ms); cycles are still
collected, within about a million allocations."""

FILE_RESERVE = 128
"""File descriptors kept free for everything but client connections (upstreams, files, logs)."""


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{attribute.name} must be a number > 0, got {value!r}")


def _count(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None and attribute.name in ("max_connections", "max_idle_connections"):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


@attrs.frozen
class ConnectionLimits:
    """What one client connection may cost a server, and how many connections it keeps.

    Attributes:
        header_timeout: Seconds a connection may take to send a request's headers (and a new
            or kept-alive connection may stay silent); closed after it.
        max_header_bytes: Largest single header, name and value (431 beyond).
        max_headers_bytes: Largest request line plus all headers together (431 beyond).
        max_header_count: Most headers in one request (431 beyond).
        max_connections: Most open client connections; a new one beyond closes the oldest
            idle one, or is answered 503 when none is idle. None: from the open-file limit
            (see :func:`default_max_connections`).
        max_idle_connections: Most idle connections (no complete request head yet); a new
            connection beyond closes the oldest idle one. None: half of ``max_connections``.
        retry_after_seconds: The ``Retry-After`` of a 503 for a connection over the limit.

    Raises:
        ValueError: A value is out of range (names the field and what is allowed).
    """

    header_timeout: float = attrs.field(default=10.0, validator=_positive)
    max_header_bytes: int = attrs.field(default=8192, validator=_count)
    max_headers_bytes: int = attrs.field(default=32768, validator=_count)
    max_header_count: int = attrs.field(default=100, validator=_count)
    max_connections: int | None = attrs.field(default=None, validator=_count)
    max_idle_connections: int | None = attrs.field(default=None, validator=_count)
    retry_after_seconds: float = attrs.field(default=5.0, validator=_positive)

    def raw_header_cap(self) -> int:
        """Bytes a request head may take on the wire before it is refused (431). O(1).

        The exact limits count the request target and header names and values; on the wire
        a head also has the method, the version, ``": "`` and CRLF per header and the blank
        line. This cap allows all of those plus 1 KiB of slack, so no request within the
        exact limits is refused by it.
        """
        return self.max_headers_bytes + 4 * self.max_header_count + 1024

    def connection_caps(self) -> tuple[int, int]:
        """``(max_connections, max_idle_connections)`` with the defaults resolved now. O(1)."""
        total = self.max_connections
        if total is None:
            total = default_max_connections()
        idle = self.max_idle_connections
        if idle is None:
            idle = max(1, total // 2)
        return total, idle


_SHARED_LIMITS = (
    "header_timeout",
    "max_header_bytes",
    "max_headers_bytes",
    "max_header_count",
    "max_connections",
    "max_idle_connections",
)
"""The :class:`ConnectionLimits` fields a :class:`ConnectionSettings` names the same way."""


@attrs.frozen
class ConnectionSettings:
    """The connection settings both services' configurations hold (the gateway's names).

    The gateway's ``[limits]`` (``prioqueue.gateway.settings.Limits``) and the broker's
    ``[connections]`` (``prioqueue.broker.config.Connections``) extend it. Values are checked
    when the TOML is read, and again by :class:`ConnectionLimits` when a server starts.

    Attributes:
        header_timeout: Seconds a connection may take to send a request's headers (and an
            idle new connection may wait before sending anything); closed after it.
        body_timeout: Seconds a client may take to send a request's whole body (408).
        max_header_bytes: Largest single header line, name and value (431 beyond).
        max_headers_bytes: Largest request line plus all headers together (431 beyond).
        max_header_count: Most headers in one request (431 beyond).
        max_connections: Most open client connections: a new one beyond closes the oldest
            idle connection, or is answered 503 when none is idle. None: the open-file limit
            minus :data:`FILE_RESERVE`.
        max_idle_connections: Most connections that have not sent a complete request head
            (new or kept alive); a new connection beyond closes the oldest idle one. None:
            half of ``max_connections``.
        shutdown_grace_seconds: How long requests in flight may finish at shutdown.
    """

    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_header_bytes: int = 8192
    max_headers_bytes: int = 32768
    max_header_count: int = 100
    max_connections: int | None = None
    max_idle_connections: int | None = None
    shutdown_grace_seconds: float = 30.0

    def limits_with(self, retry_after_seconds: float) -> ConnectionLimits:
        """The limits the HTTP server enforces, refusing with ``retry_after_seconds``. O(1).

        Raises:
            ValueError: A value is out of range (see :class:`ConnectionLimits`).
        """
        shared = {name: getattr(self, name) for name in _SHARED_LIMITS}
        return ConnectionLimits(retry_after_seconds=retry_after_seconds, **shared)


def default_max_connections() -> int:
    """The open-file soft limit minus :data:`FILE_RESERVE`, at least 64 (65,536 if unlimited)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return 65536
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(64, soft - FILE_RESERVE)


def tune_collector(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> Callable[[], None]:
    """Collect, freeze what exists now and set ``thresholds`` (call once the service is built).

    The one helper both services use (``prioqueue broker`` once it recovered its state,
    ``prioqueue gateway`` once its app is built; issue 30). ``gc.freeze()`` moves every
    object alive at that moment (modules, the app, the state recovered from a store) out of
    the collector's scans for good; they are still freed by reference counting, and cycles
    made later are still collected. O(objects alive), once.

    Args:
        thresholds: The collector's three thresholds (default :data:`GC_THRESHOLDS`).

    Returns:
        A callable that puts the collector back as it was (unfreezes, previous thresholds),
        for a service run in-process (a test).
    """
    import gc

    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)

    def restore() -> None:
        gc.unfreeze()
        gc.set_threshold(*previous)

    return restore


def hardened_protocol(limits: ConnectionLimits) -> type[Any] | None:
    """Return uvicorn's httptools protocol enforcing ``limits`` (one class per server).

    The class is :class:`prioqueue._service.protocol.HardenedHttpToolsProtocol` with this
    server's own bookkeeping.

    Args:
        limits: The connection limits (defaults resolved now, see :class:`ConnectionLimits`).

    Returns:
        The protocol class, or None when httptools is not installed (uvicorn then uses h11,
        whose own limit on incomplete headers applies; the connection caps do not).
    """
    try:
        from prioqueue._service.protocol import protocol_for
    except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
        return None
    return protocol_for(limits)


def uvicorn_config(
    app: Any, limits: ConnectionLimits, *, shutdown_grace_seconds: float = 30.0, **options: Any
) -> Any:
    """Return a ``uvicorn.Config`` serving ``app`` with ``limits``.

    Args:
        app: The ASGI application.
        limits: The connection limits.
        shutdown_grace_seconds: How long running requests may finish at shutdown.
        **options: More ``uvicorn.Config`` options (log level, access log...); they win.

    Returns:
        The configuration (``lifespan="on"``, the hardened protocol when available).
    """
    import uvicorn

    protocol = hardened_protocol(limits)
    settings: dict[str, Any] = {
        "lifespan": "on",
        "timeout_graceful_shutdown": math.ceil(shutdown_grace_seconds),
        "timeout_keep_alive": max(1, min(5, math.ceil(limits.header_timeout))),
        "h11_max_incomplete_event_size": limits.max_headers_bytes,
        "backlog": 4096,
    }
    if protocol is not None:
        settings["http"] = protocol
    settings.update(options)
    return uvicorn.Config(app, **settings)
