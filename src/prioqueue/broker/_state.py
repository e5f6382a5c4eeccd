"""The broker engine's state and the small mutations every operation shares (private).

:class:`EngineState` holds what the broker knows beside the fleet dispatcher: the job
records, idempotency keys, workers, retention heap and counters. The operations are
functions over it, by role (:mod:`prioqueue.broker._submit`, :mod:`prioqueue.broker._workers`,
:mod:`prioqueue.broker._groups`); :class:`~prioqueue.broker.engine.BrokerEngine` extends it
with the journaled operations, the reads and the snapshot. Its underscore methods are the
package's shared helpers (a worker spoke, a record finished), used by those modules only.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from typing import Any

from prioqueue.broker._budget import QueuedBytes
from prioqueue.broker._fleet import make_fleet
from prioqueue.broker._records import MAX_IMAGE_LEASE, JobRecord, JobStatus, Rejected
from prioqueue.broker.config import BrokerConfig
from prioqueue.lease import ImageRequest
from prioqueue.records import Job

__all__ = ["EngineState"]


class EngineState:
    """The broker's jobs, workers and leases, without the operations (see ``engine``).

    Args:
        config: The broker configuration (dispatcher options, leases, retention).
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.fleet: Any = make_fleet(config, self._lease_for)
        self.jobs: dict[str, JobRecord] = {}
        self.idempotency: dict[tuple[str, str], tuple[str, str]] = {}
        self.counter = 0
        self.now = -math.inf
        self.counts = {
            "submitted": 0, "done": 0, "failed": 0, "cancelled": 0, "expired": 0,
            "ttl_expired": 0, "retried": 0,
        }  # fmt: skip
        self.workers: dict[str, dict[str, Any]] = {}
        self.group_kept: dict[str, int] = {}
        """Kept records per dispatcher group (``group_key``); derived, not snapshotted."""
        self.queued_bytes = QueuedBytes()
        """Payload bytes of unfinished jobs (see ``_budget``); derived, not snapshotted."""
        self.seen: dict[str, float] = {}
        """Worker -> when a pop, heartbeat, complete or fail last named it, oldest first."""
        self._retention: list[tuple[float, str]] = []
        self.version = 0
        """Counts the operations run (refused ones included); keys the read caches."""
        self._status: tuple[int, dict[str, Any]] | None = None
        self.on_change: Callable[[], None] | None = None
        """Called after each applied operation (the driver wakes long polls); not state."""

    @property
    def job_bytes(self) -> dict[str, int]:
        """Payload bytes per unfinished job (derived, not snapshotted)."""
        return self.queued_bytes.job

    @property
    def member_bytes(self) -> dict[str, int]:
        """Payload bytes of each member's unfinished jobs (derived, not snapshotted)."""
        return self.queued_bytes.member

    @property
    def total_bytes(self) -> int:
        """Payload bytes of every unfinished job (derived, not snapshotted)."""
        return self.queued_bytes.total

    # ------------------------------------------------------------------ leases

    def _lease_for(self, job: Job, worker: Any) -> float:
        """The fleet's ``lease_for(job, worker)``: the image lease, x3 on a slow worker."""
        image = job.payload.get("image") if isinstance(job.payload, dict) else None
        slow = bool(getattr(worker, "slow", False))
        if image is None:
            base = self.config.default_lease_seconds
            return base * float(self.config.lease.extra_slow_multiplier) if slow else base
        request = ImageRequest.from_mapping({**image, "extra_slow_worker": slow})
        return float(self.config.lease.for_request(request))

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
            self.config.lease.for_request(request)
            slow = ImageRequest.from_mapping({**image, "extra_slow_worker": True})
            longest = self.config.lease.for_request(slow)  # an int: never overflows here
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

    # ------------------------------------------------------------------ time

    def due(self, now: float) -> bool:
        """Whether a ``tick`` at ``now`` would change anything (a lease or retention ran out).

        Complexity: O(1).
        """
        deadline = self.fleet.next_deadline()
        if deadline is not None and deadline <= now:
            return True
        forget = self._forget_due()
        if forget is not None and forget <= now:
            return True
        return bool(self._retention) and self._retention[0][0] <= now

    def _forget_due(self) -> float | None:
        """When the least recently seen worker may be forgotten, or None. O(1)."""
        for seen in self.seen.values():
            return seen + self.config.forget_workers_seconds
        return None

    def _touch(self, worker: str, now: float) -> None:
        """The worker spoke: it becomes the most recently seen. O(1)."""
        self.seen.pop(worker, None)
        self.seen[worker] = now

    def next_due(self) -> float | None:
        """The earliest time at which :meth:`due` becomes true, or None. O(1)."""
        times = [self.fleet.next_deadline(), self._forget_due()]
        if self._retention:
            times.append(self._retention[0][0])
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # ------------------------------------------------------------------ records

    def owned(self, job_id: str, member: str | None) -> JobRecord:
        """The record of ``job_id`` if ``member`` may see it (None: anyone).

        Raises:
            Rejected: 404 when it is unknown or belongs to another member.
        """
        record = self.jobs.get(job_id)
        if record is None or (member is not None and record.member != member):
            raise Rejected(404, f"no job {job_id!r}", field="id")
        return record

    def _finish(self, record: JobRecord, state: JobStatus, result: Any, now: float) -> None:
        record.state = state
        record.result = result
        record.finished_at = now
        record.deadline = None
        # "expired" in the counts is leases that ran out (kept as it was); ttl expiries apart.
        self.counts["ttl_expired" if state == "expired" else state] += 1
        self.queued_bytes.released(record)
        # No answer returns a finished job's payload (a worker got it with its grant), so it
        # is not kept for the result's 24 h outside the byte budget (issue 30): the payloads
        # held are exactly those of unfinished jobs, within max_queued_bytes.
        record.payload = None
        heapq.heappush(self._retention, (now + self.config.result_ttl_seconds, record.id))
