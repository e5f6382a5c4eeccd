"""The broker routes the clients added (issue 18): batch submit and a worker leaving.

=========================================  =========  =========================================
route                                      role       answer
=========================================  =========  =========================================
``POST /v1/jobs/batch``                    submitter  201 ``{"ids"}`` (200: idempotent replay)
``POST /v1/workers/{id}/leave``            worker     ``{"requeued"}``: the jobs it handed back
=========================================  =========  =========================================

A batch is one journaled operation (``submit_many``): every job is queued or none is; one
admission check (``_submit.admit``) serves it and a single submit, so a batch over any budget
is refused whole with the status its first refused job would get alone. Its
``Idempotency-Key`` names the whole request (a digest of every job under the key, in the key
space of single submits): a retried batch answers the same ids (200); the key reused with
other jobs, fewer or more included, or for a single submit, is a 422.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from prioqueue.broker._http import ID, Submitting, WorkerKey, submit_args
from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.models import SubmitRequest
from prioqueue.broker.records import Rejected
from prioqueue.broker.service import Broker

__all__ = ["BatchCreated", "BatchRequest", "Left", "client_router"]

MAX_BATCH = 10_000
"""The most jobs in one batch."""


class BatchRequest(BaseModel):
    """``POST /v1/jobs/batch``: jobs submitted all together, or none."""

    model_config = {"extra": "forbid"}

    jobs: list[SubmitRequest] = Field(
        min_length=1, max_length=MAX_BATCH, description="Each a POST /v1/jobs body."
    )


class BatchCreated(BaseModel):
    """``201``/``200`` of a batch: the ids, in the order of the request's jobs."""

    ids: list[str]


class Left(BaseModel):
    """``POST /v1/workers/{id}/leave``: the jobs the worker held, now queued again."""

    requeued: list[str]


def client_router(broker: Broker, config: BrokerConfig) -> APIRouter:
    """The routes of this module, bound to ``broker``.

    Args:
        broker: The broker.
        config: Its configuration.

    Returns:
        The router to include in the app.
    """
    router = APIRouter()

    @router.post(
        "/v1/jobs/batch", status_code=201, response_model=BatchCreated, tags=["submitters"]
    )
    async def submit_batch(
        body: BatchRequest, headers: Submitting, response: Response
    ) -> BatchCreated:
        """Queue every job of the batch as one journaled operation, or none of them."""
        engine = broker.serving_engine()  # the image check reads its config, not its state
        jobs = []
        for index, job in enumerate(body.jobs):
            try:
                args = submit_args(job, headers.key, config, headers.priority, engine.check_image)
            except Rejected as exc:
                raise Rejected(
                    exc.status, f"jobs[{index}]: {exc}", field=f"jobs.{index}.{exc.field}"
                ) from None
            jobs.append(args)
        batch: dict[str, Any] = {"jobs": jobs}
        if headers.idempotency_key is not None:
            batch["idempotency_key"] = headers.idempotency_key
        results = await broker.run("submit_many", batch)
        if not any(created for _, created in results):
            response.status_code = 200
        return BatchCreated(ids=[record.id for record, _ in results])

    @router.post("/v1/workers/{worker}/leave", response_model=Left, tags=["workers"])
    async def leave(worker: ID, _key: WorkerKey) -> Left:
        """The worker leaves the fleet; the jobs it holds are queued again at once."""
        requeued = await broker.run("leave", {"worker": worker})
        return Left(requeued=requeued)

    return router
