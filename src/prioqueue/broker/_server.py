"""Serving the broker with the shared connection hygiene of :mod:`prioqueue._service.serving`.

Theory of operation
-------------------
The broker maps its ``[connections]`` table onto
:class:`prioqueue._service.serving.ConnectionLimits` (the gateway does the same with its
``[limits]``) and serves with the same hardened uvicorn
protocol: the headers of each request must arrive within ``header_timeout`` (an idle or
slow-header connection is closed), header bytes are counted as they arrive and one header over
``max_header_bytes``, all of them over ``max_headers_bytes`` or more than
``max_header_count`` of them is a 431 and the connection is closed; a new connection past
``max_idle_connections`` idle ones closes the oldest idle one, and one past
``max_connections`` closes the oldest idle one or, with none idle, is answered 503 with
``Retry-After`` and closed at once. An idle keep-alive connection is closed after
``idle_timeout``; the body's deadline (408) is the app's (``broker.app``).

Without ``max_connections`` the cap follows the open-file limit, which is first raised to its
hard limit (at most 65,536), as the gateway does.

Complexity: O(1) per connection and per header.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

from prioqueue._service import serving as _serving

if TYPE_CHECKING:
    from prioqueue.broker.config import Connections

__all__ = ["raise_file_limit", "serving_limits", "uvicorn_config"]


def raise_file_limit() -> None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (at most 65,536), if allowed."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # a container may refuse
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def serving_limits(connections: Connections, retry_after: float) -> _serving.ConnectionLimits:
    """The shared limits for the broker's ``[connections]``. O(1).

    Args:
        connections: The broker's connection settings.
        retry_after: The ``Retry-After`` (seconds) of a refused connection.

    Returns:
        The limits the hardened protocol enforces.
    """
    return connections.limits_with(retry_after)


def uvicorn_config(app: Any, connections: Connections, retry_after: float, **options: Any) -> Any:
    """A ``uvicorn.Config`` serving the broker with its connection limits.

    Args:
        app: The ASGI application.
        connections: The broker's connection settings.
        retry_after: The ``Retry-After`` of a refused connection.
        **options: More ``uvicorn.Config`` options (log level, access log...).

    Returns:
        The configuration.
    """
    if connections.max_connections is None:
        raise_file_limit()
    settings: dict[str, Any] = {"timeout_keep_alive": max(1, math.ceil(connections.idle_timeout))}
    settings.update(options)
    return _serving.uvicorn_config(
        app,
        serving_limits(connections, retry_after),
        shutdown_grace_seconds=connections.shutdown_grace_seconds,
        **settings,
    )
