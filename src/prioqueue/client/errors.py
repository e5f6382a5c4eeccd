"""The client's exceptions: one per outcome a caller handles differently."""

from __future__ import annotations

from typing import Any

__all__ = [
    "BrokerError",
    "BrokerUnavailable",
    "JobCancelled",
    "JobEnded",
    "JobExpired",
    "JobFailed",
    "JobLost",
    "WaitTimeout",
]


class BrokerError(Exception):
    """The broker refused a request (a 4xx): ``status``, its ``error`` text and ``field``.

    Also raised, with the answer's status (0 for none), for an answer this client cannot read
    (not JSON, not the shape the call expects, a broken content encoding): the client lets
    no ``ValueError``, ``KeyError``, ``TypeError`` or httpx error through.

    Attributes:
        status: The HTTP status.
        field: The request field at fault, when the broker named one.
        body: The decoded JSON error body (or None).
    """

    def __init__(self, status: int, message: str, *, field: str | None = None, body: Any = None):
        super().__init__(f"{status}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.field = field
        self.body = body


class BrokerUnavailable(BrokerError):
    """No broker answered (transport errors, 503 or 429) within the client's retry budget."""


class JobLost(BrokerError):
    """The job was taken back from this worker: stop working on it.

    A 409: its lease ran out, it was cancelled, or another grant holds it; its result would
    be refused.
    """


class JobEnded(Exception):
    """A waited-for job ended without a result: the base of the three below.

    Attributes:
        job: The job as the broker reported it (``id``, ``state``, ``result``, ...).
    """

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(f"job {job.get('id')!r} is {job.get('state')}: {job.get('result')!r}")
        self.job = job


class JobFailed(JobEnded):
    """The job ended ``failed`` (the worker's report is ``job["result"]``)."""


class JobCancelled(JobEnded):
    """The job was cancelled."""


class JobExpired(JobEnded):
    """The job expired before a worker took it (its ``ttl`` ran out)."""


class WaitTimeout(TimeoutError):
    """``wait`` ran out of time before the job ended.

    Attributes:
        job: The job as last read.
    """

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(f"job {job.get('id')!r} is still {job.get('state')}")
        self.job = job
