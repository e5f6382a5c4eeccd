"""The gateway's own paths: ``/prioqueue/...`` and ``/metrics`` (private).

:func:`serve` answers a request to one of them once the caller is identified: ``/metrics``
(:mod:`._metrics`), ``/prioqueue/dashboard`` (:mod:`._dashboard`), ``/prioqueue/status``,
``/prioqueue/jobs/{id}`` and ``/prioqueue/groups/{label}`` (:mod:`._observe`, whose notes
say what each caller sees).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import attrs

from prioqueue.errors import UnknownGroup, UnknownJob
from prioqueue.gateway import _dashboard
from prioqueue.gateway._forward import Send, send_json
from prioqueue.gateway._metrics import serve_metrics
from prioqueue.gateway._observe import (
    STATUS_LIMIT,
    STATUS_MAX,
    _relative,
    explain,
    group_key,
    status,
)

if TYPE_CHECKING:
    from prioqueue.gateway._host import Host as Gateway
    from prioqueue.gateway.settings import Identity

__all__ = ["serve"]


def _limit(scope: MutableMapping[str, Any]) -> int:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("limit")
    if not values or not values[0].isdigit():
        return STATUS_LIMIT
    return min(int(values[0]), STATUS_MAX)


async def serve(
    gateway: Gateway, scope: MutableMapping[str, Any], send: Send, who: Identity, path: str
) -> int:
    """Answer a request to one of the gateway's own paths (only GET); return the status."""
    if scope["method"] not in ("GET", "HEAD") and not (
        scope["method"] == "DELETE" and path.startswith("/prioqueue/groups/")
    ):
        return await send_json(send, 405, {"error": {"message": "only GET is allowed here"}})
    if path == "/metrics":
        if not who.observer:
            message = "/metrics needs an observer or admin key, or the metrics_key"
            return await send_json(send, 403, {"error": {"message": message}})
        return await serve_metrics(gateway, scope, send)
    if path == "/prioqueue/dashboard":  # the dashboard page's one endpoint (issue 19)
        return await _dashboard.serve(gateway, scope, send, who)
    if path == "/prioqueue/status":
        return await send_json(send, 200, status(gateway, who, limit=_limit(scope)))
    if path.startswith("/prioqueue/groups/"):
        return await _serve_group(gateway, scope, send, who, path[len("/prioqueue/groups/") :])
    if path.startswith("/prioqueue/jobs/"):
        job_id = path[len("/prioqueue/jobs/") :]
        try:
            return await send_json(send, 200, explain(gateway, job_id, who))
        except UnknownJob as exc:
            return await send_json(send, 404, {"error": {"message": str(exc)}})
    return await send_json(send, 404, {"error": {"message": f"no such path {path}"}})


async def _serve_group(
    gateway: Gateway, scope: MutableMapping[str, Any], send: Send, who: Identity, label: str
) -> int:
    """``GET`` (status) or ``DELETE`` (cancel) one of the caller's groups; see the module."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    member = query.get("member", [who.member])[0]
    deleting = scope["method"] == "DELETE"
    if member != who.member and not (who.admin if deleting else who.observer):
        # Another member's group does not exist for this caller (as with jobs).
        return await send_json(send, 404, {"error": {"message": f"no group {label!r}"}})
    group = group_key(member, label)
    try:
        if deleting:
            running = query.get("running", ["keep"])[0]
            if running not in ("keep", "cancel"):
                message = f"running must be keep or cancel, got {running!r}"
                return await send_json(send, 400, {"error": {"message": message}})
            jobs = gateway.gate.cancel_group(group, running=running)  # type: ignore[arg-type,unused-ignore]
            return await send_json(send, 200, {"group": label, "cancelled": [j.id for j in jobs]})
        status = gateway.gate.group_status(group)
    except UnknownGroup:
        return await send_json(send, 404, {"error": {"message": f"no group {label!r}"}})
    data = attrs.asdict(status)
    data.pop("group", None)
    now = data.pop("now")
    data["forecast_finish_in"] = _relative(data.pop("forecast_finish"), now)
    return await send_json(send, 200, {"group": label, "member": member, **data})
