"""Queued bytes: the payload bytes a member (and everyone) may hold in unfinished jobs.

Theory of operation
-------------------
A job's *size* is the length of its JSON-encoded ``payload`` plus that of its ``image``
(compact separators, as the journal stores them). The engine keeps, in a
:class:`QueuedBytes` (derived state, rebuilt on restore), the size of each unfinished
(queued or running) job, the sum per member and the total. A submit is refused before
anything changes when:

* the job alone is over ``max_queued_bytes_per_member`` or ``max_queued_bytes``: **413**
  (waiting will not help);
* the member's unfinished jobs plus this one would be over ``max_queued_bytes_per_member``,
  or everyone's over ``max_queued_bytes``: **429** with ``Retry-After`` (it frees as jobs
  finish).

A job gives its bytes back when it finishes (done, failed, cancelled, or any later final
state), never when it is requeued; its payload is dropped then (no answer returns a finished
job's payload), so the payload bytes the broker holds are always those counted here, within
``max_queued_bytes``, and not a day's worth of finished ones outside it (issue 30). Every
message names the limit. Complexity: O(size of the payload) to measure a submit, O(1) to
account it.
"""

from __future__ import annotations

import json
from typing import Any

from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.records import JobRecord, Rejected

__all__ = ["QueuedBytes", "size_of"]


def size_of(payload: Any, image: Any) -> int:
    """The bytes a job holds: its JSON ``payload`` plus its JSON ``image``. O(size)."""
    size = 0
    for value in (payload, image):
        if value is not None:
            size += len(json.dumps(value, separators=(",", ":")).encode())
    return size


class QueuedBytes:
    """The bytes of unfinished jobs: per job, per member and in all (derived, not snapshotted)."""

    def __init__(self) -> None:
        self.job: dict[str, int] = {}
        self.member: dict[str, int] = {}
        self.total = 0

    def admit(
        self, config: BrokerConfig, member: str, size: int, before: tuple[int, int] = (0, 0)
    ) -> None:
        """Refuse a job of ``size`` bytes for ``member`` if it breaks a budget. O(1).

        ``before``: the bytes of the same batch's jobs before it, the member's and everyone's
        (a batch is admitted as its jobs submitted one by one would be).

        Raises:
            Rejected: 413 the job alone is over a limit; 429 the member or everyone is.
        """
        mine, everyone = before
        limits = (
            ("max_queued_bytes_per_member", config.max_queued_bytes_per_member,
             self.member.get(member, 0) + mine, mine, f"member {member!r}'s unfinished jobs hold"),
            ("max_queued_bytes", config.max_queued_bytes, self.total + everyone, everyone,
             "unfinished jobs hold"),
        )  # fmt: skip
        for name, limit, _used, _own, _whose in limits:
            if limit is not None and size > limit:
                raise Rejected(
                    413, f"payload and image are {size} bytes, over {name}={limit}", field="payload"
                )
        for name, limit, used, own, whose in limits:
            if limit is not None and used + size > limit:
                hint = (  # the batch alone is over: retrying it cannot help
                    f"the batch's jobs so far alone hold {own + size} bytes: split the batch"
                    if own + size > limit
                    else "retry once some finish"
                )
                raise Rejected(
                    429,
                    f"{whose} {used} bytes{' (the batch included)' if any(before) else ''}; "
                    f"this job's {size} would pass {name}={limit} ({hint})",
                    field="payload",
                    retry_after=config.retry_after_seconds,
                )

    def held(self, record: JobRecord, size: int | None = None) -> None:
        """Count an unfinished job's bytes (``size``: already measured). O(1) or O(size)."""
        if size is None:
            size = size_of(record.payload, record.image)
        if not size:
            return
        self.job[record.id] = size
        self.member[record.member] = self.member.get(record.member, 0) + size
        self.total += size

    def released(self, record: JobRecord) -> None:
        """A job finished: give its bytes back. O(1)."""
        size = self.job.pop(record.id, 0)
        if not size:
            return
        left = self.member[record.member] - size
        if left:
            self.member[record.member] = left
        else:
            del self.member[record.member]
        self.total -= size
