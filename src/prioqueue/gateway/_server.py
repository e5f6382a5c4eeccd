"""Serving the gateway: a hardened HTTP protocol for uvicorn, and binding its socket first.

Theory of operation
-------------------
uvicorn's HTTP/1.1 protocol (httptools) waits for a request's headers for as long as the
client likes and accepts any number of them, of any size. :func:`hardened_protocol` returns
a subclass that, per connection:

* arms a timer (``limits.header_timeout``) when the connection opens and when a request
  begins; the request's headers must be complete before it fires, or the connection is
  closed (an idle or slow-header client, "slowloris", cannot hold a socket for long);
* counts the request line and header bytes and the header count as they are parsed; past
  ``max_header_bytes`` for one header, ``max_headers_bytes`` in all or ``max_header_count``
  headers, it answers ``431 Request Header Fields Too Large`` and closes the connection.

Idle keep-alive connections are closed by uvicorn itself (``timeout_keep_alive``, which the
gateway sets to at most ``header_timeout``). The body's own timeout is the application's
(``limits.body_timeout``).

:func:`bind` opens the listening socket before anything is printed, so "listening" is true
when it is said and a port in use is reported as one line, not a traceback.
"""

from __future__ import annotations

import errno
import math
import socket
from typing import TYPE_CHECKING, Any

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
    """Return uvicorn's httptools protocol with header limits and a header timeout.

    Args:
        limits: The gateway's limits (``header_timeout``, ``max_header_bytes``,
            ``max_headers_bytes``, ``max_header_count``).

    Returns:
        The protocol class, or None when httptools is not installed (uvicorn then uses h11,
        whose own limit on incomplete headers applies).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
        return None

    header_timeout = limits.header_timeout
    one = limits.max_header_bytes
    total = limits.max_headers_bytes
    count = limits.max_header_count

    class HardenedHttpToolsProtocol(HttpToolsProtocol):
        """HttpToolsProtocol with a header deadline and header size and count limits."""

        _header_timer: Any = None
        _header_bytes = 0
        _header_count = 0
        _too_large = False

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_bytes = 0
            self._header_count = 0
            self._arm()

        def on_url(self, url: bytes) -> None:
            self._header_bytes += len(url)
            if self._header_bytes > total:
                self._reject()
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            size = len(name) + len(value)
            self._header_bytes += size
            self._header_count += 1
            if size > one or self._header_bytes > total or self._header_count > count:
                self._reject()
            super().on_header(name, value)

        def _reject(self) -> None:
            self._too_large = True
            raise ValueError("request header fields too large")  # the parser stops here

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._too_large:
                super().send_400_response(msg)
                return
            body = b"request header fields too large"
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: text/plain; charset=utf-8\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n"
                b"connection: close\r\n\r\n" + body
            )
            self.transport.close()

    return HardenedHttpToolsProtocol


def uvicorn_config(app: Any, limits: Limits, **options: Any) -> Any:
    """Return a ``uvicorn.Config`` serving ``app`` with the gateway's connection limits.

    Args:
        app: The ASGI application.
        limits: The limits (header timeout and sizes, shutdown grace).
        **options: More ``uvicorn.Config`` options (log level, access log...).

    Returns:
        The configuration (``lifespan="on"``, the hardened protocol when available).
    """
    import uvicorn

    protocol = hardened_protocol(limits)
    settings: dict[str, Any] = {
        "lifespan": "on",
        "timeout_graceful_shutdown": math.ceil(limits.shutdown_grace_seconds),
        "timeout_keep_alive": max(1, min(5, math.ceil(limits.header_timeout))),
        "h11_max_incomplete_event_size": limits.max_headers_bytes,
        "backlog": 4096,
    }
    if protocol is not None:
        settings["http"] = protocol
    settings.update(options)
    return uvicorn.Config(app, **settings)
