"""Forwarding one request upstream and streaming its answer back, within its time limits.

Theory of operation
-------------------
:func:`forward` sends a request with the shared aiohttp client and copies the response to the
client chunk by chunk. Each way a forwarded request can end early has one mechanism: a flag
on the request's :class:`Flight` plus a cancellation of the request's task, set by

* the client disconnecting (a watcher task reading ``http.disconnect``),
* the lease running out (a watcher of the turn's ``revoked`` event),
* the upstream not starting its response within ``first_byte_timeout`` (a timer),
* the client not taking a chunk within ``drain_seconds`` (a timer per write, gated requests
  only: a slow reader must not hold the GPU; uvicorn's write buffer is the bounded buffer
  the rest of a finished response is delivered from).

Timers are loop ``call_later`` handles, not tasks, so they cost next to nothing per request.
A response read to its end gives its upstream connection back to the pool; any other end
closes it, which is how the upstream learns the request was abandoned.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue.clock import loop_time
from prioqueue.gateway._llamaswap import LoadingState, upstream_reason
from prioqueue.gateway.proxy import response_headers

if TYPE_CHECKING:
    import aiohttp
    from yarl import URL

    from prioqueue.turn import Turn

__all__ = [
    "Flight",
    "LoadTimeout",
    "Request",
    "SlowReader",
    "UpstreamFailed",
    "UpstreamTimeout",
    "describe",
    "error_body",
    "forward",
    "normalise_path",
    "respond",
    "sse_error",
    "uncancel",
    "upstream_url",
    "watch_disconnect",
    "watch_lease",
]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Request = tuple[str, "URL", list[tuple[str, str]], Any]
"""What :func:`forward` sends: method, URL, headers and body (bytes, an async iterator of
bytes, or None)."""

_QUERY_UNSAFE = re.compile(rb"[^\x21\x24-\x3b\x3d\x3f-\x7e]")
"""Bytes percent-encoded in a forwarded query: controls, space, non-ASCII, ``"#<>``."""
_PATH_UNSAFE = re.compile(rb"[^\x21\x24-\x3b\x3d\x40-\x5f\x61-\x7a\x7c\x7e]")
"""Bytes percent-encoded in a forwarded path: those of a query and ``?`{}``."""
_SLASHES = re.compile(r"/{2,}")
_ERRNO = re.compile(r"\[Errno (\d+)\]")
_JSON = (b"content-type", b"application/json")


class UpstreamFailed(Exception):
    """The upstream could not be reached (before any response byte): 502."""


class UpstreamTimeout(Exception):
    """The upstream accepted the request but sent no response in time: 504."""


class LoadTimeout(UpstreamTimeout):
    """The model sent nothing within ``first_byte_timeout`` after llama-swap's loading state.

    The stream was ended with an ``event: error`` (its status, 200, was sent already).
    """


class SlowReader(Exception):
    """The client did not take a chunk within ``drain_seconds``; it was cut."""


@attrs.define
class Flight:
    """The mutable state of one forwarded request, shared with its watchers and timers."""

    task: asyncio.Task[Any] | None
    done: bool = False
    sent: bool = False
    disconnected: bool = False
    lease_expired: bool = False
    started: bool = False
    sse: bool = False
    timed_out: bool = False
    first_byte: float | None = None
    swap: bool | None = None
    """Whether its grant was a swap by the gateway's count of loaded models (None: not granted)."""
    exited: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set once the request's handler has left its turn's block (the gateway's own end)."""

    def granted(self, swap: bool) -> bool:
        """Note whether its grant was a swap (by the gateway's count); return ``swap``."""
        self.swap = swap
        return swap

    def finish(self) -> None:
        """Mark the request done (its watchers stop)."""
        self.done = True


def error_body(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": None}}).encode()


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> int:
    all_headers = [_JSON, (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})
    return status


async def send_json(send: Send, status_code: int, value: object) -> int:
    """Answer a JSON value (``str`` for what JSON cannot hold); return the status."""
    body = json.dumps(value, separators=(",", ":"), default=str).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status_code


def sse_error(message: str, kind: str) -> bytes:
    """A last server-sent event saying why a stream ends early."""
    data = json.dumps({"error": {"message": message, "type": kind, "code": None}})
    return f"event: error\ndata: {data}\n\n".encode()


def _percent(match: re.Match[bytes]) -> bytes:
    return b"%%%02X" % match.group()[0]


def _remove_dot_segments(path: str) -> str:
    """Drop ``.`` and ``..`` segments from a URL path (RFC 3986 section 5.2.4)."""
    segments = path.split("/")
    if "." not in segments and ".." not in segments:
        return path
    out: list[str] = []
    for segment in segments:
        if segment == "..":
            if out and out != [""]:
                out.pop()
        elif segment != ".":
            out.append(segment)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/".join(out)


def normalise_path(path: str) -> str:
    """Return the path the upstream acts on: ``//`` collapsed, dot segments removed. O(len)."""
    if "//" in path:
        path = _SLASHES.sub("/", path)
    if "." in path:
        path = _remove_dot_segments(path)
    return path


def upstream_url(scope: MutableMapping[str, Any], origin: str, prefix: str) -> URL:
    """Return the upstream URL of a request: its raw path and query, kept encoded.

    Bytes a URL may not hold are percent-encoded and ``.``/``..`` segments removed (as
    common HTTP clients do); everything else goes out as the client sent it.
    """
    from yarl import URL  # with aiohttp; imported when used, like the client

    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    raw = raw.partition(b"?")[0]
    if _PATH_UNSAFE.search(raw) is not None:
        raw = _PATH_UNSAFE.sub(_percent, raw)
    path = prefix + raw.decode("ascii")
    if "." in path:
        path = _remove_dot_segments(path)
    query: bytes = scope.get("query_string", b"")
    if query:
        if _QUERY_UNSAFE.search(query) is not None:
            query = _QUERY_UNSAFE.sub(_percent, query)
        return URL(f"{origin}{path}?{query.decode('ascii')}", encoded=True)
    return URL(origin + path, encoded=True)


def describe(exc: BaseException) -> str:
    """Describe an upstream failure in one line (no repr, no traceback)."""
    os_error = getattr(exc, "os_error", None)
    host = getattr(getattr(exc, "_conn_key", None), "host", None)
    port = getattr(getattr(exc, "_conn_key", None), "port", None)
    if os_error is not None and host is not None:
        # asyncio's strerror repeats the address ("Connect call failed ('h', p)"): say what
        # the error number means instead; "Multiple exceptions: [Errno 111] ...": the first.
        number = getattr(os_error, "errno", None)
        if number is None:
            found = _ERRNO.search(str(os_error))
            number = int(found.group(1)) if found else None
        reason = os.strerror(number) if number else "connection failed"
        return f"cannot connect to {host}:{port}: {reason}"
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def uncancel(task: asyncio.Task[Any] | None) -> None:
    """Forget a cancellation the gateway itself requested (Python 3.11+)."""
    method = getattr(task, "uncancel", None)
    if method is not None:
        method()


class _Timer:
    """Cancel a task after some seconds unless cancelled first (a loop timer, not a task)."""

    __slots__ = ("_handle", "fired", "flight")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, flight: Flight) -> None:
        self.fired = False
        self.flight = flight
        self._handle = loop.call_later(seconds, self._fire)

    def _fire(self) -> None:
        flight = self.flight
        if flight.task is not None and not flight.disconnected and not flight.lease_expired:
            self.fired = True
            flight.timed_out = True
            flight.task.cancel()

    def cancel(self) -> None:
        self._handle.cancel()


async def _send_within(
    send: Send,
    message: Message,
    flight: Flight,
    loop: asyncio.AbstractEventLoop,
    seconds: float | None,
) -> None:
    """Send one message to the client; past ``seconds`` (None: no limit) it is a slow reader."""
    if seconds is None:
        await send(message)
        return
    timer = _Timer(loop, seconds, flight)
    try:
        await send(message)
    except asyncio.CancelledError:
        if not timer.fired:
            raise
        uncancel(flight.task)
        flight.timed_out = False
        raise SlowReader from None
    finally:
        timer.cancel()


async def forward(
    client: aiohttp.ClientSession,
    request: Request,
    send: Send,
    flight: Flight,
    extra: list[tuple[bytes, bytes]],
    *,
    first_byte_timeout: float,
    drain_seconds: float | None,
    on_first_byte: Callable[[float], None],
) -> int:
    """Send ``request`` upstream and stream the response to the client; return its status.

    Args:
        client: The upstream client.
        request: Method, URL, headers and body.
        send: The ASGI send callable.
        flight: The request's state (its task is cancelled by the timers).
        extra: Headers added to the response; when non-empty (a gated request), an upstream
            5xx is answered 502 with ``X-Prioqueue-Upstream-Status``.
        first_byte_timeout: Seconds the upstream may take to answer.
        drain_seconds: Seconds one write to the client may wait, or None for no limit.
        on_first_byte: Called with the upstream's time to first byte.

    Returns:
        The status sent to the client.

    Raises:
        UpstreamFailed: The upstream could not be reached.
        UpstreamTimeout: The upstream sent no response within ``first_byte_timeout``.
        SlowReader: The client did not read in time (the response is cut).
    """
    import aiohttp

    loop = asyncio.get_running_loop()
    method, url, forwarded, data = request
    started = loop_time(loop)
    timer = _Timer(loop, first_byte_timeout, flight)
    flight.sent = True  # from here the upstream may be working on it
    try:
        response = await client.request(
            method, url, headers=forwarded, data=data, allow_redirects=False
        )
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        flight.sent = False
        raise UpstreamFailed(f"upstream unreachable: {describe(exc)}") from None
    except asyncio.CancelledError:
        if not timer.fired:
            raise
        uncancel(flight.task)
        flight.timed_out = False
        raise UpstreamTimeout(
            f"the upstream sent no response within {first_byte_timeout:g} s"
        ) from None
    finally:
        timer.cancel()
    flight.first_byte = loop_time(loop) - started
    try:
        status = response.status
        if status >= 500 and extra:
            on_first_byte(flight.first_byte)
            flight.done = True
            return await _upstream_error(response, send, flight, extra, loop, drain_seconds)
        headers = response_headers(response.raw_headers)
        headers.extend(extra)
        flight.sse = response.headers.get("content-type", "").startswith("text/event-stream")
        # A gated stream may begin with llama-swap's loading state: the first byte is then
        # the model's first chunk, and first_byte_timeout runs on until it comes.
        loading = LoadingState() if flight.sse and extra else None
        if loading is None:
            on_first_byte(flight.first_byte)
        flight.started = True
        start = {"type": "http.response.start", "status": status, "headers": headers}
        await _send_within(send, start, flight, loop, drain_seconds)
        await _relay(
            response,
            send,
            flight,
            drain_seconds,
            (loading, started, first_byte_timeout, on_first_byte),
        )
    finally:
        # A response read to its end gives its connection back; any other end closes it.
        if flight.done:
            response.release()
        else:
            response.close()
    return status


Loading = tuple["LoadingState | None", float, float, Callable[[float], None]]
"""A stream's loading state, when the request started, ``first_byte_timeout``, the callback."""


async def _relay(
    response: Any, send: Send, flight: Flight, drain_seconds: float | None, load: Loading
) -> None:
    """Copy a response's body to the client (``flight.done`` once all of it was read)."""
    loop = asyncio.get_running_loop()
    loading, started, first_byte_timeout, on_first_byte = load
    # With a Content-Length, the last chunk ends the body (one message fewer); without
    # one (SSE, chunked), every chunk goes out as it comes and an empty one ends it.
    length = response.headers.get("content-length", "")
    left = int(length) if length.isdigit() else -1
    content = response.content
    while True:
        if loading is None:
            chunk = await content.readany()
        else:
            chunk = await _loading_chunk(content, started + first_byte_timeout, loop, send)
            if not chunk or loading.feed(chunk):
                flight.first_byte = loop_time(loop) - started
                on_first_byte(flight.first_byte)
                loading = None
        if not chunk:
            break
        left -= len(chunk)
        message = {"type": "http.response.body", "body": chunk, "more_body": left != 0}
        if left == 0:
            flight.done = True
        await _send_within(send, message, flight, loop, drain_seconds)
        if left == 0:
            return
    flight.done = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _loading_chunk(
    content: Any, deadline: float, loop: asyncio.AbstractEventLoop, send: Send
) -> bytes:
    """Read the next chunk of a stream still in llama-swap's loading state.

    Raises:
        LoadTimeout: Nothing but loading chunks by ``deadline``: the client's stream is
            ended with an ``event: error``.
    """
    try:
        chunk: bytes = await asyncio.wait_for(
            content.readany(), max(0.0, deadline - loop_time(loop))
        )
    except asyncio.TimeoutError:
        message = "the model did not load within first_byte_timeout (llama-swap was loading it)"
        error = sse_error(message, "upstream_timeout")
        await send({"type": "http.response.body", "body": error, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        raise LoadTimeout(message) from None
    return chunk


_REASON_BYTES = 65536
"""The most of an upstream's 5xx body read for its one-line reason."""


async def _upstream_error(
    response: Any,
    send: Send,
    flight: Flight,
    extra: list[tuple[bytes, bytes]],
    loop: asyncio.AbstractEventLoop,
    drain_seconds: float | None,
) -> int:
    """Answer a gated request whose upstream answered 5xx: 502 with a one-line reason."""
    status: int = response.status
    try:
        body = await response.content.read(_REASON_BYTES)
    except Exception:  # the reason is a courtesy; the status says enough
        body = b""
    reason = upstream_reason(body)
    message = f"the upstream answered {status}" + (f": {reason}" if reason else "")
    data = error_body(message, "upstream_error")
    headers = [
        _JSON,
        (b"content-length", str(len(data)).encode()),
        (b"x-prioqueue-upstream-status", str(status).encode()),
        *extra,
    ]
    flight.started = True
    start = {"type": "http.response.start", "status": 502, "headers": headers}
    await _send_within(send, start, flight, loop, drain_seconds)
    await _send_within(send, {"type": "http.response.body", "body": data}, flight, loop, None)
    return 502


async def watch_disconnect(receive: Receive, flight: Flight) -> None:
    """Cancel the request's task when its client disconnects before the response ends."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not flight.done and flight.task is not None:
                flight.disconnected = True
                flight.task.cancel()
            return


async def watch_lease(turn: Turn, flight: Flight) -> None:
    """Stop a request that held the GPU past its lease, once the adapter has expired it."""
    await turn.revoked.wait()
    if turn.expired is not None and not flight.done and flight.task is not None:
        flight.lease_expired = True
        flight.task.cancel()
