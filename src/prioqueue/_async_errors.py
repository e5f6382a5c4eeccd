"""The exceptions of :mod:`prioqueue.asyncio` (private: import them from there).

They live apart from the adapter so that the adapter module stays one concept; their
``__module__`` is ``prioqueue.asyncio``, where they are documented.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prioqueue._errors import PrioqueueError

if TYPE_CHECKING:
    from prioqueue.records import Expired

__all__ = ["DispatcherClosed", "JobCancelled", "QueueTimeout"]


class QueueTimeout(PrioqueueError, TimeoutError):
    """A job waited in the queue longer than its ``timeout``; it was removed from the queue.

    Attributes:
        job_id: The job that timed out.
        timeout: The timeout it was given, in seconds.
    """

    __module__ = "prioqueue.asyncio"  # documented there, where it is re-exported

    def __init__(self, message: str, *, job_id: str, timeout: float) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.timeout = timeout


def ttl_timeout(record: Expired) -> QueueTimeout:
    """The error of a waiter whose job's ttl ran out in the queue (``cause="ttl"``)."""
    job = record.job
    ttl = record.deadline - job.arrival
    return QueueTimeout(
        f"job {job.id!r} was still queued at its deadline (ttl {ttl:g} s); it expired",
        job_id=job.id,
        timeout=ttl,
    )


class DispatcherClosed(PrioqueueError, RuntimeError):
    """The :class:`AsyncDispatcher` was closed: no new turns, and queued waiters are failed."""

    __module__ = "prioqueue.asyncio"  # documented there, where it is re-exported


class JobCancelled(PrioqueueError, RuntimeError):
    """The job was cancelled through :meth:`AsyncDispatcher.cancel` while its owner waited."""

    __module__ = "prioqueue.asyncio"  # documented there, where it is re-exported
