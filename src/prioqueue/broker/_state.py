"""What the broker engine's operation modules share: its parts, its notes, its leases (private).

:class:`~prioqueue.broker.engine.BrokerEngine` composes owners (issue 29, item 3): the fleet
dispatcher (``_fleet``), the :class:`~prioqueue.broker.jobbook.JobBook` of job records, the
:class:`~prioqueue.broker.workerbook.WorkerBook` of workers, the :class:`Leases` policy, its
clock fields (``now``, ``version``) and the :class:`Changed` notes of the operation running
now. The operation modules (:mod:`prioqueue.broker._submit`, :mod:`prioqueue.broker._workers`,
:mod:`prioqueue.broker._groups`, :mod:`prioqueue.broker._snapshot`) take the engine as an
:class:`EngineParts` (this protocol, so that they need not import the engine, which imports
them) and change its state only through the owners' methods and the engine's shared steps
(``finish``, ``requeued``, ``note_queued``), which keep the notes with the change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.jobbook import JobBook
from prioqueue.broker.records import MAX_IMAGE_LEASE, JobRecord, JobStatus, Rejected
from prioqueue.broker.workerbook import WorkerBook
from prioqueue.lease import ImageRequest
from prioqueue.records import Job

__all__ = ["Changed", "EngineParts", "Leases"]


class Changed:
    """What one operation changed that waiting requests care about (not state).

    Filled by the engine while an operation runs, handed to ``on_change`` after it, then
    emptied. The long-poll hub (:mod:`prioqueue.broker._changes`) wakes only the waiters these
    concern. O(1) per note.
    """

    __slots__ = ("finished", "freed", "queued", "released")

    def __init__(self) -> None:
        self.finished: list[str] = []
        """Jobs that finished (done, failed, cancelled, expired)."""
        self.queued: list[str | None] = []
        """The model of each job that became takeable now (a submit, a requeue)."""
        self.freed: list[tuple[str, str]] = []
        """``(worker, member)`` of each running job that ended or was taken back."""
        self.released = False
        """Delayed jobs left their wait (released, or cancelled): which ones is not noted."""

    def note_released(self) -> None:
        """Some delayed jobs left their wait (or every wait moved, a rebase). O(1)."""
        self.released = True

    def clear(self) -> None:
        """Forget every note (after ``on_change`` saw them). O(notes)."""
        self.finished.clear()
        self.queued.clear()
        self.freed.clear()
        self.released = False


class Leases:
    """The broker's lease policy: each grant's lease, and the image inputs a submit may state.

    Args:
        config: The broker configuration (``default_lease_seconds``, ``lease``).
    """

    def __init__(self, config: BrokerConfig) -> None:
        self._config = config

    def lease_for(self, job: Job, worker: Any) -> float:
        """The fleet's ``lease_for(job, worker)``: the image lease, x3 on a slow worker."""
        image = job.payload.get("image") if isinstance(job.payload, dict) else None
        slow = bool(getattr(worker, "slow", False))
        if image is None:
            base = self._config.default_lease_seconds
            return base * float(self._config.lease.extra_slow_multiplier) if slow else base
        if "baselines" in image:  # per accepted model (the Horde routes): the chosen one's
            image = {k: v for k, v in image.items() if k != "baselines"}
            image["baseline"] = job.payload["image"]["baselines"].get(job.model)
        request = ImageRequest.from_mapping({**image, "extra_slow_worker": slow})
        return float(self._config.lease.for_request(request))

    def check_image(self, image: Mapping[str, Any]) -> dict[str, Any]:
        """Validate lease inputs at submit time, so a pop never fails on them.

        Args:
            image: The ``image`` object of a submit.

        Returns:
            A plain dict of the inputs.

        Raises:
            Rejected: 422 naming the field that is wrong, or when the inputs give a lease
                over :data:`MAX_IMAGE_LEASE` seconds on a slow worker.
        """
        if "extra_slow_worker" in image:
            raise Rejected(
                422, "image.extra_slow_worker is set by the worker's 'slow' flag, not the job",
                field="image.extra_slow_worker",
            )  # fmt: skip
        try:
            request = ImageRequest.from_mapping(image)
            self._config.lease.for_request(request)
            slow = ImageRequest.from_mapping({**image, "extra_slow_worker": True})
            longest = self._config.lease.for_request(slow)  # an int: never overflows here
        except (TypeError, ValueError) as exc:
            raise Rejected(422, f"image: {exc}", field="image") from None
        if longest > MAX_IMAGE_LEASE:
            raise Rejected(
                422,
                f"image: these inputs give a lease over {MAX_IMAGE_LEASE:.0e} seconds on a slow "
                "worker; check width, height and steps",
                field="image",
            )
        return dict(image)


class EngineParts(Protocol):
    """The engine as its operation modules see it: its owners and its shared steps.

    :class:`~prioqueue.broker.engine.BrokerEngine` is the one implementation.
    """

    @property
    def config(self) -> BrokerConfig:
        """The broker configuration."""

    @property
    def fleet(self) -> Any:
        """The fleet dispatcher (``FleetDispatcher``, built by ``_fleet``)."""

    @property
    def jobs(self) -> JobBook:
        """The job records' owner."""

    @property
    def workers(self) -> WorkerBook:
        """The workers' owner."""

    @property
    def now(self) -> float:
        """The time of the last operation (``-inf`` before the first)."""

    def note_queued(self, record: JobRecord) -> None:
        """``record`` is queued now: note its model unless it is delayed."""

    def requeued(self, record: JobRecord) -> None:
        """A running job went back to the queue: its record requeued, the change noted."""

    def finish(self, record: JobRecord, state: JobStatus, result: Any, now: float) -> None:
        """``record`` ended in ``state``: finished in the job book, the change noted."""

    def advance_to(self, now: float) -> None:
        """The engine's time is ``now`` (a pop that keeps time itself)."""
