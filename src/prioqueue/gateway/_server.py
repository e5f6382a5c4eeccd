"""Serving the gateway: a hardened HTTP protocol for uvicorn, and binding its socket first.

Theory of operation
-------------------
The connection limits (header deadline, header size counted as the bytes arrive, header
count, caps on idle and on all connections) live in :mod:`prioqueue._serving`, shared with
the broker; :func:`hardened_protocol` and :func:`uvicorn_config` map the gateway's
``[limits]`` onto them (``Limits.connection_limits``). The body's own timeout is the
application's (``limits.body_timeout``).

:func:`bind` opens the listening socket before anything is printed, so "listening" is true
when it is said and a port in use is reported as one line, not a traceback.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Any

from prioqueue import _serving

if TYPE_CHECKING:
    from prioqueue.gateway.settings import Limits

__all__ = ["BindError", "bind", "hardened_protocol", "uvicorn_config"]


class BindError(Exception):
    """The listening socket cannot be opened (the message is one line for the user)."""


def bind(host: str, port: int, *, backlog: int = 4096) -> socket.socket:
    """Open a listening TCP socket on ``host:port``.

    Args:
        host: The address (IPv4 or IPv6 literal, or a name).
        port: The port (0: any free one).
        backlog: The listen queue's length.

    Returns:
        The listening socket (inheritable, address reuse on).

    Raises:
        BindError: The address is in use, not available, or not permitted.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        reason = (
            "the address is already in use (another gateway or program listens there; "
            "choose another with --listen)"
            if exc.errno == errno.EADDRINUSE
            else exc.strerror or str(exc)
        )
        raise BindError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def hardened_protocol(limits: Limits) -> type[Any] | None:
    """Return uvicorn's httptools protocol with the gateway's connection limits.

    See :func:`prioqueue._serving.hardened_protocol` (the same for every service).

    Args:
        limits: The gateway's limits.

    Returns:
        The protocol class, or None when httptools is not installed.
    """
    return _serving.hardened_protocol(limits.connection_limits())


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
