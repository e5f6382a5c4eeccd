"""Request bodies are JSON whatever their ``Content-Type`` says (issue 18, item 5).

The broker has no form or text routes, so a body sent without ``Content-Type`` (``curl -d``
with no ``-H``, sending ``application/x-www-form-urlencoded``) or as ``text/plain`` is read as
JSON: the headers are rewritten to ``application/json`` before FastAPI parses it. A body of
any other declared type (``multipart/form-data``, ``application/xml``...) is refused with 415
and a message that says what to send. So is a body with a ``Content-Encoding`` (``gzip``,
``br``...; ``identity`` aside): the broker does not decompress bodies, and reading compressed
bytes as JSON would answer an unhelpful 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse

__all__ = ["JsonBodies", "Message", "Receive", "Send"]

Message = MutableMapping[str, Any]
"""An ASGI scope or message."""
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_AS_JSON = (b"", b"application/x-www-form-urlencoded", b"text/plain")


class JsonBodies:
    """ASGI middleware: read every request body as JSON (see the module docstring). O(headers)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        declared = None
        for name, value in headers:
            if name == b"content-type" and declared is None:
                declared = value.split(b";", 1)[0].strip().lower()
            elif name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                await _refuse(
                    f"Content-Encoding {value.decode('latin-1')[:40]!r} is not accepted: send "
                    "the body uncompressed (no Content-Encoding header)",
                    "Content-Encoding",
                )(scope, receive, send)
                return
        declared = declared or b""
        if declared == b"application/json" or declared.endswith(b"+json"):
            await self.app(scope, receive, send)
            return
        if declared not in _AS_JSON:
            message = (
                f"Content-Type {declared.decode('latin-1')!r} is not accepted: "
                "send the body as JSON (Content-Type: application/json, or none)"
            )
            await _refuse(message, "Content-Type")(scope, receive, send)
            return
        rewritten = [(n, v) for n, v in headers if n != b"content-type"]
        rewritten.append((b"content-type", b"application/json"))
        await self.app({**scope, "headers": rewritten}, receive, send)


def _refuse(message: str, field: str) -> JSONResponse:
    """The 415 of a body the broker does not read, naming the header at fault."""
    return JSONResponse({"error": message, "field": field}, status_code=415)
