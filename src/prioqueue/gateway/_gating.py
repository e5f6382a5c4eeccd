"""The steps of a gated request that need no more than their arguments (private).

:func:`read_gated` reads and checks what the request asks for (body, model, group, priority)
before it may queue; :func:`refusal` maps an error of the queue or the upstream to the
status and outcome the client sees; :class:`Held` is the ``async with`` of a turn whose
release may wait for its upstream to be idle (see ``_idle``). ``app.Gateway._gated`` strings
them together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

import attrs

from prioqueue.errors import DispatcherClosed, JobCancelled, Overloaded, QueueFull, QueueTimeout
from prioqueue.gateway._forward import (
    Flight,
    LoadTimeout,
    Receive,
    Send,
    UpstreamFailed,
    UpstreamTimeout,
    error_body,
    respond,
)
from prioqueue.gateway._observe import group_key
from prioqueue.gateway.body import (
    BadRequest,
    BodyTimeout,
    TooLarge,
    extract_model,
    model_from_url,
    read_body,
)

if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from typing import Any

    from prioqueue.gateway._host import Upstream
    from prioqueue.gateway.settings import GatewayConfig, Identity
    from prioqueue.records import Grant
    from prioqueue.turn import Turn

__all__ = [
    "MAX_GROUP_LABEL",
    "PRIORITY_HEADER",
    "REFUSALS",
    "Asked",
    "Held",
    "read_gated",
    "refusal",
]

PRIORITY_HEADER = b"x-llamaswap-priority"
GROUP_HEADER = b"x-prioqueue-group"
MAX_GROUP_LABEL = 200
"""Longest ``X-Prioqueue-Group`` value accepted (characters)."""

REFUSALS = (
    Overloaded,
    QueueFull,
    QueueTimeout,
    DispatcherClosed,
    JobCancelled,
    UpstreamFailed,
    UpstreamTimeout,
)
"""The errors :func:`refusal` answers."""

ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
Linger = Callable[["Turn | None", "Upstream | None", ExcInfo], bool]


@attrs.frozen
class Asked:
    """What a gated request asks for, once read and checked."""

    body: bytes
    model: str | None
    group: str | None
    priority: int


def _retry_after(seconds: float) -> list[tuple[bytes, bytes]]:
    return [(b"retry-after", str(math.ceil(seconds)).encode())]


async def read_gated(
    scope: MutableMapping[str, Any],
    receive: Receive,
    send: Send,
    config: GatewayConfig,
    who: Identity,
    path: str,
    queued_bytes: int,
) -> Asked | int:
    """Read a gated request's body and headers; answer it at once when it cannot queue.

    Returns:
        What it asks for, or the status it was answered with (413, 408, 400, 429, or 499
        when the client left before sending its body).
    """
    limits = config.limits
    limit = limits.max_body_bytes
    priority_value: bytes | None = None
    group_value: bytes | None = None
    content_type = b""
    too_large = error_body(f"body over {limit} bytes", "too_large")
    for name, value in scope["headers"]:
        if name == PRIORITY_HEADER:
            priority_value = value
        elif name == GROUP_HEADER:
            group_value = value
        elif name == b"content-type":
            content_type = value
        elif name == b"content-length" and value.isdigit() and int(value) > limit:
            return await respond(send, 413, too_large)
    try:
        body = await read_body(receive, limit, limits.body_timeout)
        if body is None:
            return 499  # the client left before sending its body (nginx's number)
        query = scope.get("query_string", b"")
        if path.startswith("/upstream/"):
            # llama-swap pins the path's model and never reads the body (issue 27).
            model = model_from_url(path, query, known=config.known_models)
        else:
            model = extract_model(body, content_type) or model_from_url(path, query)
    except TooLarge:
        return await respond(send, 413, too_large)
    except BodyTimeout:
        message = f"the request body did not arrive within {limits.body_timeout:g} s"
        return await respond(send, 408, error_body(message, "timeout"))
    except BadRequest as exc:
        return await respond(send, 400, error_body(str(exc), "invalid_request_error"))
    group = None
    if group_value is not None:
        label = group_value.decode("latin-1")
        if not label or len(label) > MAX_GROUP_LABEL or not label.isprintable():
            message = (
                f"X-Prioqueue-Group must be 1 to {MAX_GROUP_LABEL} printable characters, "
                f"got {label[:40]!r}"
            )
            return await respond(send, 400, error_body(message, "invalid_request_error"))
        group = group_key(who.member, label)
    if queued_bytes + len(body) > limits.max_queued_body_bytes:
        message = (
            f"queued requests already hold {queued_bytes} bytes of bodies "
            f"(limit {limits.max_queued_body_bytes})"
        )
        retry = _retry_after(limits.retry_after_seconds)
        return await respond(send, 429, error_body(message, "queue_full"), retry)
    priority = min(config.policy.parse(priority_value, who.ceiling), who.ceiling)
    return Asked(body, model, group, priority)


async def refusal(
    exc: Exception, send: Send, ours: list[tuple[bytes, bytes]], retry_seconds: float
) -> tuple[int, str]:
    """Answer a request the queue or the upstream refused; return its status and outcome.

    Raises:
        Exception: ``exc`` itself when it is none of the refusals mapped here.
    """
    if isinstance(exc, Overloaded):  # the forecast wait is over the level's max_wait
        retry = _retry_after(exc.retry_after)
        await respond(send, 503, error_body(str(exc), "overloaded"), ours + retry)
        return 503, "rejected: overloaded"
    if isinstance(exc, QueueFull):
        retry = _retry_after(exc.retry_after)
        await respond(send, 429, error_body(str(exc), "queue_full"), ours + retry)
        return 429, "rejected: queue full"
    if isinstance(exc, (QueueTimeout, DispatcherClosed, JobCancelled)):
        # JobCancelled: the grant was revoked (its lease ran out) before this request
        # could start; nothing reached the upstream, so the client may simply retry.
        outcome = (
            "timed out in the queue"
            if isinstance(exc, QueueTimeout)
            else "shutdown"
            if isinstance(exc, DispatcherClosed)
            else "revoked before it started"
        )
        retry = _retry_after(retry_seconds)
        await respond(send, 503, error_body(str(exc), "unavailable"), ours + retry)
        return 503, outcome
    if isinstance(exc, UpstreamFailed):
        await respond(send, 502, error_body(str(exc), "upstream_error"), ours)
        return 502, "upstream unreachable"
    if isinstance(exc, LoadTimeout):  # the stream had begun: it ended with an event: error
        return 200, "the model did not load in time"
    if isinstance(exc, UpstreamTimeout):
        await respond(send, 504, error_body(str(exc), "upstream_timeout"), ours)
        return 504, "upstream sent no response in time"
    raise exc


class Held:
    """``async with`` a turn, whose release may wait for its upstream to be idle.

    It waits when the request was sent and closed before its response ended (see ``_idle``):
    ``linger(turn, upstream, exc_info)`` keeps the turn and returns True, or returns False
    when the upstream aborts such requests.
    """

    __slots__ = ("flight", "linger", "turn", "upstream")

    def __init__(self, turn: Turn, flight: Flight, linger: Linger) -> None:
        self.turn = turn
        self.flight = flight
        self.linger = linger
        self.upstream: Upstream | None = None

    def sent_to(self, upstream: Upstream | None) -> None:
        """Note the upstream the request is forwarded to (the one its release waits for)."""
        self.upstream = upstream

    async def __aenter__(self) -> Grant:
        return await self.turn.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        flight = self.flight
        flight.exited.set()
        if exc_type is not None and flight.sent and not flight.done:
            # Only the type travels on: the turn needs no more, and a traceback kept for
            # busy_timeout would keep the request's frames (its body) alive.
            ended: ExcInfo = (exc_type, None, None)
            if flight.lease_expired:
                # The dispatcher has given the GPU away already; over several upstreams the
                # fleet gate counts the cut job, with one the next request waits (settled).
                if self.upstream is None:
                    self.linger(None, None, ended)
            elif self.linger(self.turn, self.upstream, ended):
                return
        await self.turn.__aexit__(exc_type, exc, tb)
