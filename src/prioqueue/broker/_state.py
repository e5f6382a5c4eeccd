"""The broker engine's state and the small mutations every operation shares (private).

:class:`EngineState` holds what the broker knows beside the fleet dispatcher: the job
records, idempotency keys, workers, retention heap and counters. The operations are
functions over it, by role (:mod:`prioqueue.broker._submit`, :mod:`prioqueue.broker._workers`,
:mod:`prioqueue.broker._groups`); :class:`~prioqueue.broker.engine.BrokerEngine` extends it
with the journaled operations, the reads and the snapshot. It owns its fields: the operation
modules change them through its methods (a worker spoke, a record finished or went back, a
snapshot restored, a rebase), and each record changes through
:class:`~prioqueue.broker.records.JobRecord`'s own (issue 29).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from typing import Any

from prioqueue.broker._budget import QueuedBytes
from prioqueue.broker._fleet import make_fleet, restore_fleet
from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.records import MAX_IMAGE_LEASE, JobRecord, JobStatus, Rejected
from prioqueue.lease import ImageRequest
from prioqueue.records import Job

__all__ = ["Changed", "EngineState"]


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


class EngineState:
    """The broker's jobs, workers and leases, without the operations (see ``engine``).

    Args:
        config: The broker configuration (dispatcher options, leases, retention).
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.fleet: Any = make_fleet(config, self.lease_for)
        self.jobs: dict[str, JobRecord] = {}
        self.idempotency: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {}
        """``(member, key)`` -> the ids of the jobs its request queued, and the request's
        digest: one key space for single and batch submits."""
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
        self.on_change: Callable[[Changed], None] | None = None
        """Called after each applied operation with what it changed (the driver wakes the
        long polls it concerns); not state. Notes are taken only while it is set."""
        self.changed = Changed()
        """The notes of the operation running now (see :class:`Changed`); not state."""

    def forget_key(self, gone: JobRecord) -> None:
        """A record with an idempotency key is gone: its request's key is free again.

        Only if the key still names that record's request (a batch's first record gone
        frees it; the key may since name another request). O(jobs of its request).
        """
        whose = (gone.member, str(gone.idempotency_key))
        known = self.idempotency.get(whose)
        if known is not None and gone.id in known[0]:
            del self.idempotency[whose]

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

    def lease_for(self, job: Job, worker: Any) -> float:
        """The fleet's ``lease_for(job, worker)``: the image lease, x3 on a slow worker."""
        image = job.payload.get("image") if isinstance(job.payload, dict) else None
        slow = bool(getattr(worker, "slow", False))
        if image is None:
            base = self.config.default_lease_seconds
            return base * float(self.config.lease.extra_slow_multiplier) if slow else base
        if "baselines" in image:  # per accepted model (the Horde routes): the chosen one's
            image = {k: v for k, v in image.items() if k != "baselines"}
            image["baseline"] = job.payload["image"]["baselines"].get(job.model)
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

    def touch(self, worker: str, now: float) -> None:
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

    def _parked(self) -> int:
        """Delayed jobs in the fleet (waiting for ``not_before`` or a backoff). O(levels)."""
        parked: int = self.fleet.delayed_count()
        return parked

    def note_queued(self, record: JobRecord) -> None:
        """``record`` is queued now: note its model unless it is delayed. O(1)."""
        if self.on_change is not None and self.fleet.not_before(record.id) is None:
            self.changed.queued.append(record.model)

    def requeued(self, record: JobRecord) -> None:
        """A running job went back to the queue (a retry, a worker left, a lease ran out)."""
        if self.on_change is not None and record.worker is not None:
            self.changed.freed.append((record.worker, record.member))
        record.requeue()
        self.note_queued(record)

    def finish(self, record: JobRecord, state: JobStatus, result: Any, now: float) -> None:
        """``record`` ended in ``state``: counted, its bytes released, its retention started.

        Its payload goes (:meth:`JobRecord.finish`): the payloads held are exactly those of
        unfinished jobs, within ``max_queued_bytes`` (issue 30). O(log retention).
        """
        if self.on_change is not None:
            self.changed.finished.append(record.id)
            if record.state == "running" and record.worker is not None:
                self.changed.freed.append((record.worker, record.member))
        # "expired" in the counts is leases that ran out (kept as it was); ttl expiries apart.
        self.counts["ttl_expired" if state == "expired" else state] += 1
        self.queued_bytes.released(record)
        record.finish(state, result, now)
        heapq.heappush(self._retention, (now + self.config.result_ttl_seconds, record.id))

    def retire_due(self, now: float) -> list[JobRecord]:
        """Forget the records whose retention ran out by ``now``; the records gone.

        Their idempotency keys are freed; the caller forgets their groups. O(r log n).
        """
        gone: list[JobRecord] = []
        retention = self._retention
        while retention and retention[0][0] <= now:
            _, job_id = heapq.heappop(retention)
            record = self.jobs.pop(job_id, None)
            if record is not None:
                if record.idempotency_key is not None:
                    self.forget_key(record)
                gone.append(record)
        return gone

    # ------------------------------------------------------------------ the engine's own

    def watch(self, on_change: Callable[[Changed], None] | None) -> None:
        """Call ``on_change`` after each applied operation (None: stop). O(1)."""
        self.on_change = on_change

    def advance_to(self, now: float) -> None:
        """The engine's time is ``now`` (a pop that keeps time itself). O(1)."""
        self.now = now

    def count_submit(self) -> None:
        """A job was accepted: the id counter and the ``submitted`` count move on. O(1)."""
        self.counter += 1
        self.counts["submitted"] += 1

    def retention_entries(self) -> list[list[float | str]]:
        """The retention heap as JSON data (``[expires, job id]`` each). O(records)."""
        return [list(entry) for entry in self._retention]

    def load_parts(
        self,
        now: float,
        counter: int,
        workers: dict[str, dict[str, Any]],
        fleet: Any,
        seen: dict[str, float] | None,
        retention: list[tuple[float, str]],
    ) -> None:
        """Take the scalar parts of a snapshot (the caller fills records and keys).

        Args:
            now: The engine's time.
            counter: The id counter.
            workers: Each worker's pop settings.
            fleet: The restored fleet dispatcher.
            seen: Worker -> when it last spoke, oldest first (None: as the fleet saw them).
            retention: ``(expires, job id)`` of the finished records.

        Complexity: O(workers + records).
        """
        self.now = now
        self.counter = counter
        self.workers = workers
        self.fleet = fleet
        if seen is None:  # a snapshot from before workers were forgotten
            infos = sorted(fleet.workers(), key=lambda info: (info.last_seen, info.name))
            seen = {info.name: float(info.last_seen) for info in infos}
        self.seen = seen
        self._retention = retention
        heapq.heapify(self._retention)

    def shift_times(self, now: float, by: float) -> None:
        """Every time held moves ``by`` seconds earlier; then the time is ``now`` (a rebase).

        The fleet is rebuilt from its snapshot with the same shift; records, retention and
        the workers' last word shift in place (the heap keeps its order). Every waiter is
        told (``released``): each wait moved. O(jobs + workers).
        """
        self.version += 1
        at = self.now if math.isfinite(self.now) else 0.0
        self.fleet = restore_fleet(
            self.fleet.snapshot(now=at), self.config, self.lease_for, now=at - by
        )
        for record in self.jobs.values():
            record.shift(by)
        self._retention = [(t - by, job_id) for t, job_id in self._retention]
        self.seen = {worker: t - by for worker, t in self.seen.items()}
        self._status = None
        self.now = now
        if self.on_change is not None:
            changed = self.changed
            changed.clear()
            changed.note_released()
            self.on_change(changed)
            changed.clear()
