"""Reading a gated request's body and finding its model, refusing what llama-swap would misread.

Theory of operation
-------------------
The gateway reads a gated request's whole body before it queues (the body is replayed to the
upstream when the turn comes), bounded in size (``limits.max_body_bytes``: 413) and in time
(``limits.body_timeout``: 408). The model is then taken from the body the way llama-swap
takes it, so that the job is queued for the model that will actually run:

* JSON: the top-level ``model`` string. A body that is not JSON, nests deeper than the
  parser's recursion limit, has ``"model": ""`` or names ``model`` twice is refused with 400
  (llama-swap reads the *first* ``model`` key, Python's parser the last: a client could
  queue as one model and run another).
* ``multipart/form-data`` (audio transcriptions, image edits): the ``model`` form field.
* ``application/x-www-form-urlencoded``: the ``model`` field.
* No ``Content-Type``: JSON when the body starts with ``{`` or ``[``, else opaque.
* Any other content type (or an empty body): no model; the request is still queued.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

__all__ = [
    "BadRequest",
    "BodyTimeout",
    "TooLarge",
    "extract_model",
    "model_from_url",
    "read_body",
]

_MODEL_KEY = re.compile(rb'"model"')

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class BadRequest(Exception):
    """A gated request's body cannot be read for its model (answered with 400)."""


class TooLarge(Exception):
    """The body is over ``max_body_bytes`` (answered with 413)."""


class BodyTimeout(Exception):
    """The client did not send its whole body within ``body_timeout`` (answered with 408)."""


def _no_duplicate_model(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses a second ``model`` key in any object."""
    seen = False
    for key, _ in pairs:
        if key == "model":
            if seen:
                raise BadRequest("the request body names 'model' more than once")
            seen = True
    return dict(pairs)


def extract_model(body: bytes, content_type: bytes) -> str | None:
    """Return the ``model`` of a gated request's body.

    Args:
        body: The request body.
        content_type: The ``Content-Type`` header value (may be empty).

    Returns:
        The model, or None when the body names none (or is not a form or JSON).

    Raises:
        BadRequest: A JSON body is not a JSON object, is nested too deep, names ``model``
            twice, or its ``model`` is not a non-empty string; a form has no boundary or a
            non-UTF-8 model.

    Complexity: O(len(body)).
    """
    kind = content_type.partition(b";")[0].strip().lower()
    if kind == b"multipart/form-data":
        return _multipart_model(body, content_type)
    if kind == b"application/x-www-form-urlencoded":
        try:
            values = parse_qs(body.decode("utf-8"), keep_blank_values=True).get("model")
        except UnicodeDecodeError:
            raise BadRequest("the form body is not UTF-8") from None
        return _checked(values[0] if values else None)
    if not body:
        return None
    if kind:
        if kind != b"application/json" and not kind.endswith(b"+json"):
            return None
    elif body.lstrip()[:1] not in (b"{", b"["):
        return None  # no Content-Type and not JSON-looking: an opaque body
    # A second "model" key is rare; only then pay for the parser hook that finds it.
    hook = _no_duplicate_model if len(_MODEL_KEY.findall(body, 0, len(body))) > 1 else None
    try:
        value = json.loads(body, object_pairs_hook=hook)
    except RecursionError:
        raise BadRequest("the request body is nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("the request body must be a JSON object")
    return _checked(value.get("model"))


def model_from_url(path: str, query: bytes, *, known: Iterable[str] = ()) -> str | None:
    """Return the model a request names in its URL, as llama-swap reads it.

    ``/upstream/{model}/...`` names it in the path (llama-swap then ignores the body): the
    longest leading run of segments that is a ``known`` model (names may hold ``/``), else
    the first segment. Model GET routes (``/props``...) name it in the ``model`` query
    parameter.

    Complexity: O(len(path) * segments + len(query)).
    """
    if path.startswith("/upstream/"):
        rest = path[len("/upstream/") :]
        found = rest.partition("/")[0] or None
        names = set(known)
        if names:
            parts = [p for p in rest.split("/") if p]
            for end in range(1, len(parts) + 1):
                if "/".join(parts[:end]) in names:
                    found = "/".join(parts[:end])
        return found
    if b"model=" in query:
        values = parse_qs(query.decode("latin-1")).get("model")
        return values[0] if values and values[0] else None
    return None


def _checked(model: object) -> str | None:
    if model is None:
        return None
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if not model:
        raise BadRequest("'model' must not be empty")
    return model


def _multipart_model(body: bytes, content_type: bytes) -> str | None:
    _, _, rest = content_type.partition(b"boundary=")
    boundary = rest.split(b";")[0].strip().strip(b'"')
    if not boundary:
        raise BadRequest("multipart/form-data without a boundary")
    for part in body.split(b"--" + boundary):
        head, sep, value = part.partition(b"\r\n\r\n")
        if sep and b' name="model"' in head.replace(b";name=", b"; name="):
            try:
                return _checked(value.rstrip(b"\r\n").decode("utf-8"))
            except UnicodeDecodeError:
                raise BadRequest("the 'model' form field is not UTF-8") from None
    return None


async def read_body(receive: Receive, limit: int, timeout: float) -> bytes | None:
    """Read a request's whole body; None when the client left.

    Args:
        receive: The ASGI receive callable.
        limit: The most bytes accepted.
        timeout: Seconds the whole body may take.

    Returns:
        The body, or None when the client disconnected.

    Raises:
        TooLarge: The body is over ``limit`` bytes.
        BodyTimeout: The body did not arrive within ``timeout`` seconds.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    expired = False

    def expire() -> None:  # a timer, not wait_for: no task per receive
        nonlocal expired
        expired = True
        if task is not None:
            task.cancel()

    timer = loop.call_later(timeout, expire)
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except asyncio.CancelledError:
        if not expired:
            raise
        uncancel = getattr(task, "uncancel", None)
        if uncancel is not None:
            uncancel()
        raise BodyTimeout from None
    finally:
        timer.cancel()
