"""The broker's job records and what is derived from them: one owner (issue 29, item 3).

Theory of operation
-------------------
:class:`JobBook` keeps every job record the broker knows beside the fleet dispatcher: the
records by id (oldest submission first), the idempotency keys, the id counter, the counts
by outcome, the kept records per group, the payload bytes of unfinished jobs and the
retention heap of finished ones. Its fields are private. It reads as a
``Mapping[str, JobRecord]``; every change is one of its methods, which the engine's operation
modules (:mod:`prioqueue.broker._submit`, :mod:`prioqueue.broker._workers`,
:mod:`prioqueue.broker._groups`, :mod:`prioqueue.broker._snapshot`) call, so a reader of this
file and of :class:`~prioqueue.broker.records.JobRecord` sees every way a record changes.

The rules it keeps (:meth:`JobBook.check` asserts them):

1. The counts of kept records per group are those of the records.
2. The queued bytes are those of the unfinished records, per job, per member and in all;
   finished records hold no payload.
3. Every idempotency key names records that are kept, of the key's member.
4. Every finished record has its retention entry; the ids never pass the counter.

Complexity: each change is O(1) or O(log retention); :meth:`JobBook.check` is O(records).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any

from prioqueue._readonly import ReadOnly
from prioqueue.broker._budget import QueuedBytes, size_of
from prioqueue.broker._fleet import group_key
from prioqueue.broker._mapping import OwnedMapping
from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.records import FINISHED, JobRecord, JobStatus

__all__ = ["IdempotencyEntry", "JobBook"]

IdempotencyEntry = tuple[tuple[str, ...], str]
"""What an idempotency key names: the ids of the jobs its request queued, and the request's
digest (one key space for single and batch submits)."""

_COUNTS = ("submitted", "done", "failed", "cancelled", "expired", "ttl_expired", "retried")


class JobBook(OwnedMapping[str, JobRecord]):
    """The job records by id, with their keys, counts, groups, bytes and retention.

    A read-only mapping of job id -> record, oldest submission first; changed only through
    its methods. The records it hands out are its own: read them, and change them through
    this book.

    Args:
        result_ttl: How long a finished record is kept (seconds).
    """

    def __init__(self, result_ttl: float) -> None:
        self._ttl = result_ttl
        self._entries: dict[str, JobRecord] = {}
        self._keys: dict[tuple[str, str], IdempotencyEntry] = {}
        self._counter = 0
        self._counts = dict.fromkeys(_COUNTS, 0)
        self._group_kept: dict[str, int] = {}
        self._bytes = QueuedBytes()
        self._retention: list[tuple[float, str]] = []

    # ------------------------------------------------------------------ reads

    counter = ReadOnly[int]("_counter", "The number of the last id handed out (``job-<n>``).")
    counts = ReadOnly[Mapping[str, int]](
        "_counts", "Totals by outcome since the start (``submitted``, ``done``... ``retried``)."
    )
    idempotency = ReadOnly[Mapping[tuple[str, str], IdempotencyEntry]](
        "_keys", "``(member, key)`` -> :data:`IdempotencyEntry`."
    )
    group_kept = ReadOnly[Mapping[str, int]](
        "_group_kept", "Kept records per dispatcher group (``group_key``); derived."
    )
    job_bytes = ReadOnly[Mapping[str, int]]("_bytes.job", "Payload bytes per unfinished job.")
    member_bytes = ReadOnly[Mapping[str, int]](
        "_bytes.member", "Payload bytes of each member's unfinished jobs."
    )
    total_bytes = ReadOnly[int]("_bytes.total", "Payload bytes of every unfinished job.")

    def has_group(self, key: str) -> bool:
        """Whether a record of the dispatcher group ``key`` is kept. O(1)."""
        return key in self._group_kept

    def next_id(self) -> str:
        """The id the next accepted job gets. O(1)."""
        return f"job-{self._counter + 1}"

    def retention_due(self) -> float | None:
        """When the next finished record may be forgotten, or None. O(1)."""
        return self._retention[0][0] if self._retention else None

    def retention_entries(self) -> list[list[float | str]]:
        """The retention heap as JSON data (``[expires, job id]`` each). O(records)."""
        return [list(entry) for entry in self._retention]

    def admit_bytes(
        self, config: BrokerConfig, member: str, size: int, before: tuple[int, int] = (0, 0)
    ) -> None:
        """Refuse a job of ``size`` bytes for ``member`` if it breaks a byte budget. O(1).

        ``before``: the bytes of the same batch's jobs before it, the member's and everyone's.

        Raises:
            Rejected: 413 the job alone is over a limit; 429 the member or everyone is.
        """
        self._bytes.admit(config, member, size, before)

    # ------------------------------------------------------------------ changes

    def add(self, record: JobRecord, size: int, digest: str | None = None) -> None:
        """Keep a new job's ``record`` (id: :meth:`next_id`): counted, its bytes held.

        Args:
            record: The record, queued; its ``idempotency_key`` (its own or its batch's).
            size: Its payload bytes (``_budget.size_of``, already measured).
            digest: With the job's own key, its request's digest: the key names this job.
                None for a job without a key of its own (a batch's key is named by
                :meth:`remember` once the whole batch is queued).

        Raises:
            ValueError: ``record.id`` is not :meth:`next_id`.

        Complexity: O(1).
        """
        if record.id != self.next_id():
            raise ValueError(f"the next job is {self.next_id()!r}, not {record.id!r}")
        self._counter += 1
        self._counts["submitted"] += 1
        self._entries[record.id] = record
        self._count_group(record)
        self._bytes.held(record, size)
        if digest is not None and record.idempotency_key is not None:
            self._keys[(record.member, record.idempotency_key)] = ((record.id,), digest)

    def remember(self, member: str, key: str, ids: Iterable[str], digest: str) -> None:
        """``member``'s ``key`` names the jobs ``ids`` (a batch) with the request's ``digest``.

        O(len(ids)).
        """
        self._keys[(member, key)] = (tuple(ids), digest)

    def grant(
        self, job_id: str, worker: str, attempt: int, model: str | None, lease: Any, now: float
    ) -> JobRecord:
        """The job was granted to ``worker`` (:meth:`JobRecord.grant`); its record. O(1).

        Raises:
            KeyError: No such record.
        """
        record = self._entries[job_id]
        record.grant(worker, attempt, model, lease, now)
        return record

    def requeue(self, job_id: str) -> JobRecord:
        """The running job went back to the queue; its bytes stay held. O(1).

        Raises:
            KeyError: No such record.
        """
        record = self._entries[job_id]
        record.requeue()
        return record

    def note_result(self, job_id: str, result: Any) -> None:
        """Keep a failed and requeued attempt's report as the job's result. O(1).

        Raises:
            KeyError: No such record.
        """
        self._entries[job_id].note_result(result)

    def count(self, outcome: str) -> None:
        """One more of ``outcome`` that is not a record's end (``retried``, ``expired``). O(1).

        Raises:
            KeyError: ``outcome`` is not a count.
        """
        self._counts[outcome] += 1

    def finish(self, job_id: str, state: JobStatus, result: Any, now: float) -> JobRecord:
        """The job ended in ``state``: counted, its bytes released, its retention started.

        Its payload goes (:meth:`JobRecord.finish`): the payloads held are exactly those of
        unfinished jobs (issue 30). An ``expired`` record counts as ``ttl_expired`` (the
        ``expired`` count is of leases that ran out). O(log retention).

        Raises:
            KeyError: No such record.
        """
        record = self._entries[job_id]
        self._counts["ttl_expired" if state == "expired" else state] += 1
        self._bytes.released(record)
        record.finish(state, result, now)
        heapq.heappush(self._retention, (now + self._ttl, job_id))
        return record

    def retire_due(self, now: float) -> list[str]:
        """Forget the records whose retention ran out by ``now``; their keys go too.

        Returns:
            The dispatcher groups (``group_key``) whose last kept record went, in the order
            they went: the caller forgets them in the fleet.

        Complexity: O(r log n) for r records forgotten.
        """
        emptied: list[str] = []
        retention = self._retention
        while retention and retention[0][0] <= now:
            _, job_id = heapq.heappop(retention)
            record = self._entries.pop(job_id, None)
            if record is None:
                continue
            if record.idempotency_key is not None:
                self._forget_key(record)
            if record.group is not None:
                key = group_key(record.member, record.group)
                left = self._group_kept[key] - 1
                if left:
                    self._group_kept[key] = left
                else:
                    del self._group_kept[key]
                    emptied.append(key)
        return emptied

    def shift(self, by: float) -> None:
        """Every time held moves ``by`` seconds earlier (a rebase); the heap keeps its order.

        O(records).
        """
        for record in self._entries.values():
            record.shift(by)
        self._retention = [(t - by, job_id) for t, job_id in self._retention]

    def load(
        self,
        counter: int,
        counts: Mapping[str, int],
        records: Iterable[JobRecord],
        keys: Iterable[tuple[str, str, tuple[str, ...], str]],
        retention: Iterable[tuple[float, str]],
    ) -> None:
        """Take a snapshot's records into this fresh book; the derived parts are rebuilt.

        A finished record loaded with a payload (a snapshot from before issue 30) drops it.

        Args:
            counter: The id counter.
            counts: The totals by outcome (unknown ones are kept too).
            records: The records, oldest submission first.
            keys: ``(member, key, ids, digest)`` per idempotency key.
            retention: ``(expires, job id)`` of the finished records.

        Raises:
            ValueError: The book is not empty.

        Complexity: O(records + keys).
        """
        if self._entries or self._counter:
            raise ValueError("a job book is loaded once, while empty")
        self._counter = counter
        self._counts.update(counts)
        for record in records:
            self._entries[record.id] = record
            self._count_group(record)
            if record.state not in FINISHED:
                self._bytes.held(record)
            else:
                record.drop_payload()
        for member, key, ids, digest in keys:
            self._keys[(member, key)] = (ids, digest)
        self._retention = list(retention)
        heapq.heapify(self._retention)

    def check(self) -> None:
        """Assert the rules of the module docstring (for the tests). O(records + keys).

        Raises:
            AssertionError: A rule does not hold.
        """
        groups: dict[str, int] = {}
        unfinished: dict[str, int] = {}
        for job_id, record in self._entries.items():
            assert record.id == job_id
            assert int(job_id.rpartition("-")[2]) <= self._counter, job_id
            if record.group is not None:
                key = group_key(record.member, record.group)
                groups[key] = groups.get(key, 0) + 1
            if record.state in FINISHED:
                assert record.payload is None, f"{job_id} is finished but holds its payload"
            else:
                size = size_of(record.payload, record.image)
                if size:
                    unfinished[job_id] = size
        assert self._group_kept == groups, (self._group_kept, groups)
        assert self._bytes.job == unfinished, (self._bytes.job, unfinished)
        members: dict[str, int] = {}
        for job_id, size in unfinished.items():
            member = self._entries[job_id].member
            members[member] = members.get(member, 0) + size
        assert self._bytes.member == members, (self._bytes.member, members)
        assert self._bytes.total == sum(unfinished.values())
        for (member, key), (ids, _digest) in self._keys.items():
            for job_id in ids:
                named = self._entries.get(job_id)
                assert named is not None, f"key {key!r} names {job_id}, which is gone"
                assert named.member == member, (key, job_id)
        retained = {job_id for _, job_id in self._retention}
        for job_id, record in self._entries.items():
            assert record.state not in FINISHED or job_id in retained, f"{job_id} is never retired"

    # ------------------------------------------------------------------ own

    def _count_group(self, record: JobRecord) -> None:
        if record.group is not None:
            key = group_key(record.member, record.group)
            self._group_kept[key] = self._group_kept.get(key, 0) + 1

    def _forget_key(self, gone: JobRecord) -> None:
        """A record with a key is gone: its request's key is free again, if it still names it.

        A batch's first record gone frees it; the key may since name another request.
        O(jobs of its request).
        """
        whose = (gone.member, str(gone.idempotency_key))
        known = self._keys.get(whose)
        if known is not None and gone.id in known[0]:
            del self._keys[whose]
