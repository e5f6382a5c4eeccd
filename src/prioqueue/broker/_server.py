"""Serving the broker: the gateway's hardened HTTP protocol plus a cap on connections.

Theory of operation
-------------------
The broker runs under uvicorn with the gateway's connection hygiene
(:mod:`prioqueue.gateway._server`, reused as is): the headers of each request must arrive
within ``connections.header_timeout`` (an idle or slow-header connection is closed), one
header over ``max_header_bytes``, all of them over ``max_headers_bytes`` or more than
``max_header_count`` of them is a 431 and the connection is closed; an idle keep-alive
connection is closed after ``idle_timeout``; the body's deadline (408) is the app's
(``broker.app``).

On top, :func:`capped_protocol` bounds the connections open at once: the one past
``max_connections`` is answered ``503`` with ``Retry-After`` and closed as soon as it is
accepted, so a flood of idle sockets costs at most ``max_connections`` file descriptors
and never the ones the store and the logs need. When ``max_connections`` is not set it is
the open-file limit (raised to its hard limit first, as the gateway does) less
:data:`FD_RESERVE`.

Complexity: O(1) per connection and per header.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, cast

if TYPE_CHECKING:
    from prioqueue.broker.config import Connections

__all__ = ["FD_RESERVE", "capped_protocol", "connection_cap", "uvicorn_config"]

FD_RESERVE: Final = 64
"""File descriptors kept free of client connections (store, journal, logs, listening socket)."""


def connection_cap(limits: Connections) -> int:
    """The most connections at once: ``max_connections``, else from the open-file limit.

    Without ``max_connections`` the soft ``RLIMIT_NOFILE`` is first raised to the hard limit
    (at most 65,536), then the cap is that less :data:`FD_RESERVE` (at least 16).

    Args:
        limits: The broker's connection limits.

    Returns:
        The cap.
    """
    if limits.max_connections is not None:
        return limits.max_connections
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return 1024 - FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # pragma: no cover - a container may refuse
            pass
    limit = 65536 if soft == resource.RLIM_INFINITY else soft
    return max(16, limit - FD_RESERVE)


def capped_protocol(limits: Connections, cap: int, retry_after: float) -> type[Any] | None:
    """The gateway's hardened httptools protocol, refusing the connection past ``cap``.

    Args:
        limits: The header limits and timeout.
        cap: The most connections open at once.
        retry_after: The ``Retry-After`` (seconds) of the 503.

    Returns:
        The protocol class, or None without httptools (uvicorn's h11 then serves, with
        ``limit_concurrency`` as the cap).
    """
    from prioqueue.gateway._server import hardened_protocol

    base = hardened_protocol(cast(Any, limits))  # the same attribute names as Limits
    if base is None:  # pragma: no cover - httptools comes with uvicorn[standard]
        return None
    body = f"over max_connections={cap} connections; retry later".encode()
    refusal = (
        b"HTTP/1.1 503 Service Unavailable\r\n"
        b"content-type: text/plain; charset=utf-8\r\n"
        b"retry-after: " + str(max(1, math.ceil(retry_after))).encode() + b"\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )

    class CappedProtocol(base):  # type: ignore[valid-type,misc]
        """The hardened protocol; the connection past the cap is refused at once."""

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > cap:
                transport.write(refusal)
                transport.close()

    return CappedProtocol


def uvicorn_config(app: Any, limits: Connections, retry_after: float, **options: Any) -> Any:
    """A ``uvicorn.Config`` serving the broker with its connection limits.

    Args:
        app: The ASGI application.
        limits: The connection limits.
        retry_after: The ``Retry-After`` of a refused connection.
        **options: More ``uvicorn.Config`` options (log level, access log...).

    Returns:
        The configuration.
    """
    from prioqueue.gateway._server import uvicorn_config as hardened_config

    cap = connection_cap(limits)
    protocol = capped_protocol(limits, cap, retry_after)
    settings: dict[str, Any] = {"timeout_keep_alive": max(1, math.ceil(limits.idle_timeout))}
    if protocol is None:  # pragma: no cover - see capped_protocol
        settings["limit_concurrency"] = cap
    else:
        settings["http"] = protocol
    settings.update(options)
    return hardened_config(app, cast(Any, limits), **settings)
