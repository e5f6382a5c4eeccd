"""Connection limits shared by the HTTP services (gateway and broker).

Theory of operation
-------------------
Both services run under uvicorn with :func:`prioqueue.gateway._server.hardened_protocol`,
which reads a few attributes of a *limits* object: the header deadline, the header size and
count limits and the shutdown grace. :class:`ServerLimits` names exactly those attributes as
a structural protocol, so the gateway passes its ``Limits`` and the broker its
:class:`ConnectionLimits` to the same code. Nothing here imports uvicorn or a service.

What each limit bounds (per connection unless said):

* ``header_timeout``: a new connection must send a request's headers within it, and so must
  each later request once it begins (an idle or 1-byte-per-second client is closed);
* ``max_header_bytes`` / ``max_headers_bytes`` / ``max_header_count``: one header line, the
  request line plus all headers, the number of headers: past any, ``431`` and the
  connection is closed;
* ``idle_timeout``: how long an idle keep-alive connection stays open between requests;
* ``body_timeout``: the whole body must arrive within it (``408``);
* ``max_connections``: open connections at once (for the whole process); one more is
  answered ``503`` with ``Retry-After`` and closed at once, so a flood of idle sockets
  cannot take every file descriptor.
"""

from __future__ import annotations

from typing import Protocol

import attrs

__all__ = ["ConnectionLimits", "ServerLimits"]


class ServerLimits(Protocol):
    """What the hardened HTTP protocol reads from a service's limits (structural)."""

    @property
    def header_timeout(self) -> float: ...

    @property
    def max_header_bytes(self) -> int: ...

    @property
    def max_headers_bytes(self) -> int: ...

    @property
    def max_header_count(self) -> int: ...

    @property
    def shutdown_grace_seconds(self) -> float: ...


@attrs.frozen
class ConnectionLimits:
    """The broker's connection limits (the gateway's ``[limits]`` names and defaults).

    Attributes:
        header_timeout: Seconds a connection may take to send a request's headers (and an
            idle new connection may wait before sending anything); closed after it.
        idle_timeout: Seconds an idle keep-alive connection stays open between requests.
        body_timeout: Seconds a client may take to send a request's whole body (408).
        max_header_bytes: Largest single header line, name and value (431 beyond).
        max_headers_bytes: Largest request line plus all headers together (431 beyond).
        max_header_count: Most headers in one request (431 beyond).
        max_connections: Most connections open at once (503 and closed beyond), or None:
            the open-file limit at start less a reserve of 64 (for the store and logs).
        shutdown_grace_seconds: How long requests in flight may finish at shutdown.
    """

    header_timeout: float = 10.0
    idle_timeout: float = 5.0
    body_timeout: float = 60.0
    max_header_bytes: int = 8192
    max_headers_bytes: int = 32768
    max_header_count: int = 100
    max_connections: int | None = None
    shutdown_grace_seconds: float = 30.0
