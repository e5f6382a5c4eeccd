"""The workers' routes: pop, complete, fail and heartbeat (private; leave is in ``_client_routes``).

Over a :class:`~prioqueue.broker.service.Broker`; see :mod:`prioqueue.broker.app` for the
table of routes and :mod:`prioqueue.broker._http` for keys and errors. A worker key acts
only as the worker ids its rule allows (403 otherwise).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from prioqueue.broker._http import (
    ID,
    WAIT,
    ActingWorker,
    WorkerKey,
    acts_as,
    job_view,
    rejected_response,
)
from prioqueue.broker._waiters import long_pop
from prioqueue.broker.config import BrokerKey
from prioqueue.broker.models import (
    FailRequest,
    FinishRequest,
    Granted,
    HeartbeatReply,
    HeartbeatRequest,
    JobView,
    PopRequest,
)
from prioqueue.broker.records import Rejected
from prioqueue.broker.service import Broker

__all__ = ["WAITING", "worker_router"]

WAITING = "X-Prioqueue-Waiting"
"""The heartbeat's header: the worker's long polls waiting in the broker now."""


def worker_router(broker: Broker) -> APIRouter:
    """The routes of this module, bound to ``broker``."""
    router = APIRouter()

    @router.post(
        "/v1/workers/{worker}/pop",
        response_model=Granted,
        responses={204: {"description": "Nothing fits; X-Prioqueue-Idle says why."}},
        tags=["workers"],
    )
    async def pop(
        request: Request, worker: ActingWorker, body: PopRequest, wait: WAIT = 0.0
    ) -> Any:
        """Take the next job this worker should run, with its lease (``?wait=S``: long-poll).

        A pop whose client has gone (its connection closed) takes nothing.
        """

        async def until_gone() -> None:  # the body was read: the next message is the end
            while (await request.receive())["type"] != "http.disconnect":
                pass

        spec = body.model_dump()
        record, idle_reasons, _ = await long_pop(broker, worker, spec, wait, until_gone)
        if record is None:
            idle = ", ".join(f"{k}={v}" for k, v in sorted(idle_reasons.items())) or "empty"
            return Response(status_code=204, headers={"X-Prioqueue-Idle": idle})
        assert record.lease_seconds is not None  # a grant has its lease
        assert record.deadline is not None
        return Granted(
            id=record.id, payload=record.payload, image=record.image, model=record.model,
            attempt=record.attempt, lease_seconds=record.lease_seconds, deadline=record.deadline,
        )  # fmt: skip

    async def finish(op: str, job_id: str, body: FinishRequest, key: BrokerKey) -> JobView:
        acts_as(key, body.worker)
        args = {"job_id": job_id, "worker": body.worker, "attempt": body.attempt}
        if isinstance(body, FailRequest) and body.retry:
            args["retry"] = True  # journaled only when set: older journals replay as they were
        record = await broker.run(op, {**args, "result": body.result})
        return await broker.query(lambda engine: job_view(record, None, None, engine))

    @router.post("/v1/jobs/{job_id}/complete", response_model=JobView, tags=["workers"])
    async def complete(job_id: ID, body: FinishRequest, key: WorkerKey) -> JobView:
        """Report the job done (only its current holder: worker and attempt must match)."""
        return await finish("complete", job_id, body, key)

    @router.post("/v1/jobs/{job_id}/fail", response_model=JobView, tags=["workers"])
    async def fail(job_id: ID, body: FailRequest, key: WorkerKey) -> JobView:
        """Report the job failed (only its current holder); ``retry``: queue it again."""
        return await finish("fail", job_id, body, key)

    @router.post("/v1/workers/{worker}/heartbeat", response_model=HeartbeatReply, tags=["workers"])
    async def heartbeat(
        response: Response, worker: ActingWorker, body: HeartbeatRequest | None = None
    ) -> Any:
        """Say the worker is alive (and which model it has loaded).

        The answer lists the jobs it holds; ``waiting`` (and the ``X-Prioqueue-Waiting``
        header, also on a 404 for a worker that left) says how many of its long polls still
        wait in the broker: at 0 a stopping worker's abandoned poll can be granted nothing.
        """
        resident = None if body is None else body.resident
        try:
            jobs = await broker.run("heartbeat", {"worker": worker, "resident": resident})
        except Rejected as exc:
            refused = rejected_response(exc)
            refused.headers[WAITING] = str(broker.changes.waiting.get(worker, 0))
            return refused
        waiting = broker.changes.waiting.get(worker, 0)
        response.headers[WAITING] = str(waiting)
        return HeartbeatReply.model_validate({"jobs": jobs, "waiting": waiting})

    return router
