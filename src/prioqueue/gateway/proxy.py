"""Forwarding to the upstream: headers in both directions and one streaming aiohttp client.

Theory of operation
-------------------
The gateway is a reverse proxy. Requests go to the upstream with the client's method, path,
query, headers and body, minus the hop-by-hop headers of RFC 9110 section 7.6.1 (those only
mean something on one connection) and ``Host`` (the upstream's own is used). Responses come
back with the upstream's status and headers, minus the hop-by-hop ones, and with the body
passed through as raw bytes (``auto_decompress=False``: no decompression, no re-encoding, so
``Content-Length`` and ``Content-Encoding`` stay right). Nothing buffers a whole response:
every chunk read from the upstream is sent to the client before the next is read, which is
what server-sent events need.

The client is :class:`aiohttp.ClientSession` (its HTTP parser is C-accelerated, and it costs
far less per request than a client built on anyio). It is made so that the upstream sees what
the client sent: no ``Accept``, ``Accept-Encoding``, ``User-Agent`` or ``Content-Type`` of its
own, no cookie jar, no redirects, no environment proxies. Connections are kept alive in a
pool; a response that is not read to its end (client gone, lease expired) closes its
connection, which is how the upstream learns that the request was abandoned.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "HOP_BY_HOP",
    "KEEPALIVE_SECONDS",
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

KEEPALIVE_SECONDS = 4.0
"""How long an idle upstream connection is kept for reuse (under uvicorn's 5 s default, so
the client gives a connection up before a server with that default closes it)."""

_SKIP_REQUEST: frozenset[bytes] = HOP_BY_HOP | {b"host"}
_SKIP_RESPONSE: frozenset[bytes] = HOP_BY_HOP | {b"date", b"server"}
"""Response headers never copied from the upstream: hop-by-hop ones, and ``date`` and
``server``, which the gateway's HTTP server sends itself (a client would get both twice)."""
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


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
    drop_prefix: bytes | None = None,
    authorization: bytes | None = None,
) -> list[tuple[str, str]]:
    """Return the headers to send upstream for a client request.

    Args:
        headers: The client's headers (ASGI: lower-case names).
        extra: Headers to add (e.g. the job id).
        drop: More lower-case names to remove.
        drop_prefix: Remove the headers whose (lower-case) name starts with this.
        authorization: When given, sent as ``Authorization`` (after ``drop``, so a client's
            own value never survives when ``drop`` names it).

    Returns:
        The forwarded headers, decoded as Latin-1 (what the client library takes).

    Complexity: O(number of headers).
    """
    skip = _SKIP_REQUEST | drop if drop else _SKIP_REQUEST
    tokens: frozenset[bytes] = frozenset()
    out: list[tuple[str, str]] = []
    for name, value in headers:
        if name == b"connection":
            tokens = tokens | _connection_tokens(((name, value),))
        elif name not in skip and (drop_prefix is None or not name.startswith(drop_prefix)):
            out.append((name.decode("latin-1"), value.decode("latin-1")))
    if tokens:
        named = {token.decode("latin-1") for token in tokens}
        out = [(name, value) for name, value in out if name not in named]
    if authorization is not None:
        if b"authorization" not in skip:
            out = [(name, value) for name, value in out if name != "authorization"]
        out.append(("authorization", authorization.decode("latin-1")))
    out.extend((name.decode("latin-1"), value.decode("latin-1")) for name, value in extra)
    return out


def response_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Return the upstream's response headers fit for the client (lower-case names).

    Args:
        raw: The upstream's headers as received (any case).

    Returns:
        The headers without hop-by-hop ones, ``date`` and ``server`` (the gateway's own
        HTTP server sends those).

    Complexity: O(number of headers).
    """
    out = []
    tokens: frozenset[bytes] = frozenset()
    for name, value in raw:
        lower = name.lower()
        if lower == b"connection":
            tokens = tokens | _connection_tokens(((lower, value),))
        elif lower not in _SKIP_RESPONSE:
            out.append((lower, value))
    if tokens:
        out = [(name, value) for name, value in out if name not in tokens]
    return out


def make_client(
    *, connect_timeout: float, max_connections: int | None = None
) -> aiohttp.ClientSession:
    """Make the upstream client: no default headers, no redirects, no environment proxies.

    Call it on the event loop that will use the client.

    Args:
        connect_timeout: Seconds to establish a connection.
        max_connections: The pool's size (None: unbounded; the gate bounds the gated calls).

    Returns:
        The client. Reads and writes have no timeout: the lease bounds a gated call.
    """
    import aiohttp

    connector = aiohttp.TCPConnector(
        limit=max_connections or 0,
        limit_per_host=0,
        keepalive_timeout=KEEPALIVE_SECONDS,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=connect_timeout, sock_read=None
        ),
        auto_decompress=False,
        skip_auto_headers=_NO_AUTO_HEADERS,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        raise_for_status=False,
    )
