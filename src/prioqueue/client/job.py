"""``Job``: a job granted to a worker, with its lease measured on the worker's clock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from prioqueue.client.errors import JobLost

__all__ = ["Job", "Reporter"]


class Reporter(Protocol):
    """What a :class:`Job` needs of its worker: a clock and a way to report."""

    clock: Callable[[], float]
    """Monotonic seconds (the worker's own clock, injectable for tests)."""

    def _finish(self, job: Job, op: str, extra: dict[str, Any]) -> None: ...


class Job:
    """A job granted to this worker, with its lease.

    Attributes:
        id: The job's id.
        payload: The submitter's JSON payload.
        image: The lease inputs, if any.
        model: The model it needs, if any.
        attempt: Which grant this is (1 for the first); sent back for you.
        lease_seconds: The lease's length.
        deadline: Unix time (the broker's clock) at which the lease runs out: for display
            and for the command's environment only, since the broker's clock may differ
            from this host's.
        expires_at: When the lease runs out on the worker's own clock (its ``clock``,
            monotonic by default): the moment the answer was received plus
            ``lease_seconds``. Work must stop by then, whatever the broker's clock says.

    Args:
        worker: The worker that took it (reports go through it).
        data: The pop's answer.
        received_at: When the answer was received on ``worker.clock`` (default: now).
    """

    def __init__(
        self, worker: Reporter, data: dict[str, Any], *, received_at: float | None = None
    ) -> None:
        self._worker = worker
        self.id: str = data["id"]
        self.payload: Any = data.get("payload")
        self.image: dict[str, Any] | None = data.get("image")
        self.model: str | None = data.get("model")
        self.attempt: int = int(data["attempt"])
        self.lease_seconds: float = float(data["lease_seconds"])
        self.deadline: float = float(data["deadline"])
        received = worker.clock() if received_at is None else received_at
        self.expires_at: float = received + self.lease_seconds
        self._lost = threading.Event()
        self.finished = False
        """True once ``complete`` or ``fail`` was accepted."""

    def taken_back(self) -> None:
        """Mark the job lost: the broker took it back (the worker that holds it calls this)."""
        self._lost.set()

    def accepted(self) -> None:
        """Mark the job finished: its ``complete`` or ``fail`` was accepted (the worker's)."""
        self.finished = True

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, attempt={self.attempt}, model={self.model!r})"

    def remaining(self) -> float:
        """Seconds left on the lease by the worker's own clock (negative once it ran out)."""
        return self.expires_at - self._worker.clock()

    @property
    def lost(self) -> bool:
        """Whether the broker took the job back from this worker (stop working on it)."""
        return self._lost.is_set()

    def check(self) -> None:
        """Raise :class:`JobLost` if the job was taken back. O(1).

        Raises:
            JobLost: It was.
        """
        if self.lost:
            raise JobLost(409, f"job {self.id!r} (attempt {self.attempt}) was taken back")

    def complete(self, result: Any = None) -> None:
        """Report the job done with its ``result`` (JSON; at most ``result_max_bytes``).

        Raises:
            JobLost: The job was taken back (nothing was recorded).
            BrokerError: The broker refused the result (413 too large).
            BrokerUnavailable: No broker answered in time.
        """
        self._worker._finish(self, "complete", {"result": result})

    def fail(self, reason: str, *, retry: bool = False, result: Any = None) -> None:
        """Report the job failed: ``result`` (default ``{"error": reason}``) is kept.

        Args:
            reason: Why, for the submitter.
            retry: Ask the broker to requeue it after its backoff while attempts remain.
            result: The report to keep instead of ``{"error": reason}``.

        Raises:
            JobLost: The job was taken back.
            BrokerError: The broker refused the report.
            BrokerUnavailable: No broker answered in time.
        """
        body: dict[str, Any] = {"result": {"error": reason} if result is None else result}
        if retry:
            body["retry"] = True
        self._worker._finish(self, "fail", body)
