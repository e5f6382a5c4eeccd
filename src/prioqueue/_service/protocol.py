"""The hardened uvicorn protocol: header limits and deadline, and connection caps (private).

Imported only by :func:`prioqueue._service.serving.hardened_protocol`, when a server starts:
this module imports uvicorn's httptools protocol at its top, so an installation without
httptools fails the import and the service falls back to h11 (see that function).

:class:`ServerBook` is one server's bookkeeping (its limits, resolved once, the idle
connections oldest first and the open count); :class:`HardenedHttpToolsProtocol` reads it
from its class attribute ``book``, and :func:`protocol_for` makes one subclass per server with
its own book. The behaviour is described in :mod:`prioqueue._service.serving`.

Complexity: O(1) per connection event and per header; a read of a request head costs
O(len(data)) to find its end.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, ClassVar, Protocol

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from prioqueue._timers import disarm

__all__ = ["HardenedHttpToolsProtocol", "Limits", "ServerBook", "head_end", "protocol_for"]

TOO_LARGE = b"request header fields too large"

#: After a 431 the connection half-closes and drops what the client still sends for at most
#: this long before it closes: closed at once with the client's bytes unread, the kernel would
#: answer them with a reset that can destroy the 431 before the client reads it (the lingering
#: close of web servers). The client's own close ends it sooner.
LINGER_SECONDS = 2.0


class Limits(Protocol):
    """What the protocol reads of :class:`prioqueue._service.serving.ConnectionLimits`."""

    @property
    def header_timeout(self) -> float: ...
    @property
    def max_header_bytes(self) -> int: ...
    @property
    def max_headers_bytes(self) -> int: ...
    @property
    def max_header_count(self) -> int: ...
    @property
    def retry_after_seconds(self) -> float: ...
    def raw_header_cap(self) -> int: ...
    def connection_caps(self) -> tuple[int, int]: ...


def _close_response(status: bytes, body: bytes, *extra: bytes) -> bytes:
    """A complete ``connection: close`` answer with a plain-text ``body``."""
    return (
        b"HTTP/1.1 " + status + b"\r\n"
        b"content-type: text/plain; charset=utf-8\r\n"
        + b"".join(extra)
        + b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )  # fmt: skip


def head_end(data: bytes) -> int:
    """Index just past the blank line ending a request head in ``data``, or -1."""
    crlf = data.find(b"\r\n\r\n")
    lf = data.find(b"\n\n")
    if crlf < 0 and lf < 0:
        return -1
    if lf < 0 or 0 <= crlf < lf:
        return crlf + 4
    return lf + 2


class ServerBook:
    """One server's limits and its connections: the idle ones (oldest first) and a count.

    Args:
        limits: The connection limits (defaults resolved now).
    """

    def __init__(self, limits: Limits) -> None:
        self.header_timeout = limits.header_timeout
        self.max_header_bytes = limits.max_header_bytes
        self.max_headers_bytes = limits.max_headers_bytes
        self.max_header_count = limits.max_header_count
        self.raw_cap = limits.raw_header_cap()
        self.max_open, self.max_idle = limits.connection_caps()
        retry_after = str(math.ceil(limits.retry_after_seconds)).encode()
        self.refusal = _close_response(
            b"503 Service Unavailable",
            b"too many connections; retry later",
            b"retry-after: " + retry_after + b"\r\n",
        )
        self.idle: OrderedDict[Any, None] = OrderedDict()
        self.open = 0

    def set_idle(self, connection: Any) -> None:
        """Mark ``connection`` idle (the newest idle one). O(1)."""
        self.idle[connection] = None
        self.idle.move_to_end(connection)

    def set_busy(self, connection: Any) -> None:
        """Mark ``connection`` no longer idle. O(1)."""
        self.idle.pop(connection, None)

    def close_oldest_idle(self) -> bool:
        """Close the oldest idle connection still open; whether there was one. O(1) amortised."""
        while self.idle:
            oldest, _ = self.idle.popitem(last=False)
            if not oldest.transport.is_closing():
                oldest.transport.close()
                return True
        return False

    def admit(self) -> bool:
        """Count a new connection; whether it may stay (an idle one closed for it if need be)."""
        self.open += 1
        if len(self.idle) >= self.max_idle:
            self.close_oldest_idle()
        return self.open <= self.max_open or self.close_oldest_idle()


class HardenedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with header limits and deadline, and connection caps.

    Used through a subclass of :func:`protocol_for`, which sets ``book``.
    """

    book: ClassVar[ServerBook]
    _header_timer: Any = None
    _header_bytes = 0
    _header_count = 0
    _raw_bytes = 0
    _raw_tail = b""
    _reading_head = True
    _too_large = False
    _lingering = False
    _counted = False

    # -- connection caps ---------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._counted = True
        if not self.book.admit():
            self.transport.write(self.book.refusal)
            self.transport.close()
            return
        self.book.set_idle(self)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.book.set_busy(self)
        if self._counted:
            self._counted = False
            self.book.open -= 1
        super().connection_lost(exc)

    # -- header deadline ---------------------------------------------------------------

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.book.header_timeout, self._late)

    def _disarm(self) -> None:
        disarm(self._header_timer)
        self._header_timer = None

    def _late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # a request already read starts now: not idle
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._reading_head = True
            self._raw_bytes = 0
            self._raw_tail = b""
            self.book.set_idle(self)

    # -- header size -------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a refused request: dropped until the connection closes
        if self._reading_head and not self._too_large:
            # Count the head's bytes before the parser sees them: the parser would buffer a
            # header of any size before its callback could refuse it.
            window = self._raw_tail + data
            end = head_end(window)
            if end < 0:
                self._raw_bytes += len(data)
                self._raw_tail = window[-3:]
            else:
                self._raw_bytes += end - len(self._raw_tail)
                self._reading_head = False
            if self._raw_bytes > self.book.raw_cap:
                self._too_large = True
                self.send_400_response(TOO_LARGE.decode())
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._header_count = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        if self._header_bytes > self.book.max_headers_bytes:
            self._reject()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        self._header_bytes += size
        self._header_count += 1
        book = self.book
        if (
            size > book.max_header_bytes
            or self._header_bytes > book.max_headers_bytes
            or self._header_count > book.max_header_count
        ):
            self._reject()
        super().on_header(name, value)

    def _reject(self) -> None:
        self._too_large = True
        raise ValueError(TOO_LARGE.decode())  # the parser stops here

    def on_headers_complete(self) -> None:
        self._disarm()
        self.book.set_busy(self)
        self._reading_head = False
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._too_large:
            super().send_400_response(msg)
            return
        self.transport.write(_close_response(b"431 Request Header Fields Too Large", TOO_LARGE))
        self._linger()

    def _linger(self) -> None:
        """Close after a refusal without losing it (the lingering close).

        Half-close now and close ``LINGER_SECONDS`` later, or when the client closes first;
        what it sends meanwhile is dropped unparsed.
        """
        self._lingering = True
        self._disarm()
        transport = self.transport
        if transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._header_timer = self.loop.call_later(LINGER_SECONDS, self._late)


def protocol_for(limits: Limits) -> type[HardenedHttpToolsProtocol]:
    """A subclass of :class:`HardenedHttpToolsProtocol` with its own book (one per server).

    Args:
        limits: The connection limits (defaults resolved now).

    Returns:
        The protocol class to give uvicorn (``http=``).
    """
    return type(
        "HardenedHttpToolsProtocol", (HardenedHttpToolsProtocol,), {"book": ServerBook(limits)}
    )
