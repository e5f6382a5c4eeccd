"""The request limits that hold whichever ASGI server runs the broker (private).

See :class:`BodyLimit`; ``prioqueue broker`` refuses most of these earlier, in its HTTP
protocol, and adds the header timeouts.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import Any

from prioqueue.broker._content import Message, Receive, Send
from prioqueue.broker._http import error_response
from prioqueue.broker.config import BrokerConfig
from prioqueue.clock import loop_time

__all__ = ["BodyLimit"]


class BodyLimit:
    """ASGI middleware: the request limits that hold whichever server runs the app.

    Its limits are the broker configuration's: a request body over ``max_body_bytes`` is
    answered 413 unread, and one that does not arrive within ``connections.body_timeout``
    seconds 408; headers over ``connections``' size or count limits are 431, and a request past
    ``connections.max_connections`` requests in flight is 503 with ``Retry-After``
    (``retry_after_seconds``). ``prioqueue broker`` refuses those earlier, in its HTTP
    protocol; under another server these still apply, though the header timeouts are that
    server's.
    """

    def __init__(self, app: Any, config: BrokerConfig) -> None:
        self.app = app
        self.limit = config.max_body_bytes
        self.connections = limits = config.connections
        self.timeout = limits.body_timeout
        self.retry_after = str(max(1, math.ceil(config.retry_after_seconds)))
        self.in_flight = 0

    def _header_problem(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        limits = self.connections
        if len(headers) > limits.max_header_count:
            return f"{len(headers)} headers, over max_header_count={limits.max_header_count}"
        total = 0
        for name, value in headers:
            size = len(name) + len(value)
            total += size
            if size > limits.max_header_bytes:
                return f"a header of {size} bytes, over max_header_bytes={limits.max_header_bytes}"
        if total > limits.max_headers_bytes:
            return f"{total} bytes of headers, over max_headers_bytes={limits.max_headers_bytes}"
        return None

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self._header_problem(scope["headers"])
        if problem is not None:
            await error_response(431, f"request header fields too large: {problem}", "headers")(
                scope, receive, send
            )
            return
        cap = self.connections.max_connections
        if cap is not None and self.in_flight >= cap:
            message = f"over max_connections={cap} requests in flight; retry later"
            await error_response(503, message, None, **{"Retry-After": self.retry_after})(
                scope, receive, send
            )
            return
        self.in_flight += 1
        try:
            await self._limited(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _limited(self, scope: Message, receive: Receive, send: Send) -> None:
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                await self._too_large()(scope, receive, send)
                return
        # Read the body here, up to the limit and within the timeout, then replay it.
        chunks: list[bytes] = []
        seen = 0
        loop = asyncio.get_running_loop()
        deadline = loop_time(loop) + self.timeout
        while True:
            try:
                message = await _within(receive(), deadline)
            except (TimeoutError, asyncio.TimeoutError):
                late = f"the request body did not arrive within body_timeout={self.timeout:g} s"
                await error_response(408, late, "body", Connection="close")(scope, receive, send)
                return
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                await self._too_large()(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    def _too_large(self) -> Any:
        return error_response(413, f"the body is over max_body_bytes={self.limit}", "body")


async def _within(awaitable: Awaitable[Message], deadline: float) -> Message:
    """``await awaitable``, or TimeoutError at ``deadline`` (the loop's clock).

    ``asyncio.timeout_at`` where there is one (3.11+: a timer, no task per call; the body
    of most requests has arrived with their headers), else ``asyncio.wait_for``.
    """
    timeout_at = getattr(asyncio, "timeout_at", None)
    if timeout_at is None:  # pragma: no cover - Python 3.10
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(awaitable, max(0.0, deadline - loop_time(loop)))
    async with timeout_at(deadline):
        return await awaitable
