"""The submitters' routes: jobs and groups (private; the batch is in ``_client_routes``).

``POST /v1/jobs``, ``GET``/``DELETE /v1/jobs/{id}`` and ``GET``/``DELETE /v1/groups/{id}``
over a :class:`~prioqueue.broker.service.Broker`; see :mod:`prioqueue.broker.app` for the
table of routes and :mod:`prioqueue.broker._http` for keys and errors.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Response

from prioqueue.broker._groups import group_status
from prioqueue.broker._http import (
    ID,
    MEMBER,
    WAIT,
    Submitter,
    Submitting,
    job_view,
    whose,
)
from prioqueue.broker._submit_route import submit_job
from prioqueue.broker._waiters import wait_job
from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.engine import BrokerEngine
from prioqueue.broker.models import GroupCancelled, GroupView, JobCreated, JobView, SubmitRequest
from prioqueue.broker.records import JobRecord
from prioqueue.broker.service import Broker

__all__ = ["submitter_router"]


def submitter_router(broker: Broker, config: BrokerConfig) -> APIRouter:
    """The routes of this module, bound to ``broker``: jobs first, then groups."""
    router = APIRouter()
    _job_routes(router, broker, config)
    _group_routes(router, broker)
    return router


def _job_routes(router: APIRouter, broker: Broker, config: BrokerConfig) -> None:
    @router.post("/v1/jobs", status_code=201, response_model=JobCreated, tags=["submitters"])
    async def submit(body: SubmitRequest, headers: Submitting, response: Response) -> JobCreated:
        """Queue a job for the fleet."""
        # Served by SubmitRoute unless create_app(lean_submit=False): same steps, same answers.
        job_id, created = await submit_job(
            broker, config, headers.key, body, headers.priority, headers.idempotency_key
        )
        if not created:
            response.status_code = 200
        return JobCreated(id=job_id)

    @router.get("/v1/jobs/{job_id}", response_model=JobView, tags=["submitters"])
    async def get_job(job_id: ID, key: Submitter, wait: WAIT = 0.0) -> JobView:
        """A job's state, place in line, explanation and result (``?wait=S``: long-poll)."""

        def render(engine: BrokerEngine, record: JobRecord) -> JobView:
            return job_view(record, *engine.position(record, key.may_read), engine)

        return await wait_job(broker, job_id, key.member, wait, render)

    @router.delete("/v1/jobs/{job_id}", response_model=JobView, tags=["submitters"])
    async def cancel(job_id: ID, key: Submitter) -> JobView:
        """Cancel a queued or running job."""
        record = await broker.run("cancel", {"job_id": job_id, "member": key.member})
        return job_view(record, None, None)


def _group_routes(router: APIRouter, broker: Broker) -> None:
    @router.get("/v1/groups/{group}", response_model=GroupView, tags=["submitters"])
    async def get_group(group: ID, key: Submitter, member: MEMBER = None) -> GroupView:
        """A group's jobs by state, GPU-seconds, mean runtime and forecast finish."""
        owner = whose(key, member, cancel=False)
        status = await broker.query(lambda engine: group_status(engine, group, owner))
        now = broker.now()
        finish = status.forecast_finish
        left = None if finish is None else max(0.0, finish - now)
        return GroupView(
            group=group, member=owner, queued=status.queued, running=status.running,
            done=status.done, failed=status.failed, cancelled=status.cancelled,
            gpu_seconds=status.gpu_seconds, mean_runtime=status.mean_runtime,
            forecast_finish=finish, forecast_seconds=left, now=now,
        )  # fmt: skip

    @router.delete("/v1/groups/{group}", response_model=GroupCancelled, tags=["submitters"])
    async def cancel_group(
        group: ID,
        key: Submitter,
        running: Literal["keep", "cancel"] = "keep",
        member: MEMBER = None,
    ) -> GroupCancelled:
        """Cancel a group's queued jobs (``?running=cancel``: its running ones too)."""
        owner = whose(key, member, cancel=True)
        args = {"group": group, "member": owner, "running": running}
        cancelled = await broker.run("cancel_group", args)
        return GroupCancelled(group=group, member=owner, cancelled=cancelled)
