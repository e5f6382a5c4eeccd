"""Forwarding to the upstream: headers in both directions and one streaming httpx client.

Theory of operation
-------------------
The gateway is a reverse proxy. Requests go to the upstream with the client's method, path,
query, headers and body, minus the hop-by-hop headers of RFC 9110 section 7.6.1 (those only
mean something on one connection) and ``Host`` (the upstream's own is used). Responses come
back with the upstream's status and headers, minus the hop-by-hop ones, and with the body
passed through as raw bytes (``aiter_raw``: no decompression, no re-encoding, so
``Content-Length`` and ``Content-Encoding`` stay right). Nothing buffers a whole response:
every chunk read from the upstream is sent to the client before the next is read, which is
what server-sent events need.

The httpx client is made without its default headers, so the upstream sees what the client
sent (in particular no ``Accept-Encoding`` the client did not ask for).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

__all__ = [
    "HOP_BY_HOP",
    "make_client",
    "request_headers",
    "response_headers",
]

HOP_BY_HOP: frozenset[bytes] = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""Header names (lower-case) that apply to one connection and are never forwarded."""

_SKIP_REQUEST: frozenset[bytes] = HOP_BY_HOP | {b"host"}


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Return the header names listed in ``Connection`` (also hop-by-hop), lower-case."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b","))
    return frozenset(tokens)


def request_headers(
    headers: Iterable[tuple[bytes, bytes]],
    *,
    extra: Iterable[tuple[bytes, bytes]] = (),
    drop: frozenset[bytes] = frozenset(),
    authorization: bytes | None = None,
) -> list[tuple[bytes, bytes]]:
    """Return the headers to send upstream for a client request.

    Args:
        headers: The client's headers (ASGI: lower-case names).
        extra: Headers to add (e.g. the job id).
        drop: More lower-case names to remove.
        authorization: When given, replaces the client's ``Authorization`` value.

    Returns:
        The forwarded headers.

    Complexity: O(number of headers).
    """
    headers = list(headers)
    skip = _SKIP_REQUEST | drop
    tokens = _connection_tokens(headers)
    if tokens:
        skip = skip | tokens
    if authorization is not None:
        skip = skip | {b"authorization"}
    out = [(name, value) for name, value in headers if name not in skip]
    if authorization is not None:
        out.append((b"authorization", authorization))
    out.extend(extra)
    return out


def response_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Return the upstream's response headers fit for the client (lower-case names).

    Args:
        raw: The upstream's headers as received (any case).

    Returns:
        The headers without hop-by-hop ones.

    Complexity: O(number of headers).
    """
    raw = list(raw)
    skip = HOP_BY_HOP | _connection_tokens(raw)
    out = []
    for name, value in raw:
        lower = name.lower()
        if lower not in skip:
            out.append((lower, value))
    return out


def make_client(*, connect_timeout: float, max_connections: int | None = None) -> httpx.AsyncClient:
    """Make the upstream client: no default headers, no redirects, no environment proxies.

    Args:
        connect_timeout: Seconds to establish a connection (and to wait for a pooled one).
        max_connections: The pool's size (None: unbounded; the gate bounds the gated calls).

    Returns:
        The client. Reads and writes have no timeout: the lease bounds a gated call.
    """
    import httpx

    client = httpx.AsyncClient(
        timeout=httpx.Timeout(connect=connect_timeout, read=None, write=None, pool=None),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
        follow_redirects=False,
        trust_env=False,
    )
    for name in list(client.headers):
        del client.headers[name]
    return client
