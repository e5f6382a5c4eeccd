"""Request bodies are JSON whatever their ``Content-Type`` says (issue 18, item 5).

The broker has no form or text routes, so a body sent without ``Content-Type`` (``curl -d``
with no ``-H``, sending ``application/x-www-form-urlencoded``) or as ``text/plain`` is read as
JSON: the headers are rewritten to ``application/json`` before FastAPI parses it. A body of
any other declared type (``multipart/form-data``, ``application/xml``...) is refused with 415
and a message that says what to send.
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
        declared = b""
        for name, value in headers:
            if name == b"content-type":
                declared = value.split(b";", 1)[0].strip().lower()
                break
        if declared == b"application/json" or declared.endswith(b"+json"):
            await self.app(scope, receive, send)
            return
        if declared not in _AS_JSON:
            response = JSONResponse(
                {
                    "error": f"Content-Type {declared.decode('latin-1')!r} is not accepted: "
                    "send the body as JSON (Content-Type: application/json, or none)",
                    "field": "Content-Type",
                },
                status_code=415,
            )
            await response(scope, receive, send)
            return
        rewritten = [(n, v) for n, v in headers if n != b"content-type"]
        rewritten.append((b"content-type", b"application/json"))
        await self.app({**scope, "headers": rewritten}, receive, send)
