"""Binding a service's listening socket first, so "listening" is true when it is said.

:func:`bind` opens the listening socket before anything is printed; a port in use is
reported as one line (:class:`BindError`), not a traceback. ``prioqueue gateway`` and
``prioqueue broker`` both bind with it and hand the socket to uvicorn.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["BindError", "bind"]


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
