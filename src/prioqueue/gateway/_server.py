"""Serving the gateway: its ``[limits]`` mapped onto the services' hardened uvicorn protocol.

Theory of operation
-------------------
The connection limits (header deadline, header size counted as the bytes arrive, header
count, caps on idle and on all connections) live in :mod:`prioqueue._service.serving`, shared
with the broker; :func:`uvicorn_config` maps the gateway's ``[limits]`` onto them
(``Limits.connection_limits``). The body's own timeout is the application's
(``limits.body_timeout``). Binding the socket first is :func:`prioqueue._service.server.bind`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prioqueue._service import serving as _serving

if TYPE_CHECKING:
    from prioqueue.gateway.settings import Limits

__all__ = ["uvicorn_config"]


def uvicorn_config(app: Any, limits: Limits, **options: Any) -> Any:
    """Return a ``uvicorn.Config`` serving ``app`` with the gateway's connection limits.

    Args:
        app: The ASGI application.
        limits: The limits (header timeout and sizes, connection caps, shutdown grace).
        **options: More ``uvicorn.Config`` options (log level, access log...).

    Returns:
        The configuration (``lifespan="on"``, the hardened protocol when available).
    """
    return _serving.uvicorn_config(
        app,
        limits.connection_limits(),
        shutdown_grace_seconds=limits.shutdown_grace_seconds,
        **options,
    )
