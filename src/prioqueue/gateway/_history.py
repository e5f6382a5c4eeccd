"""The gateway's record of finished jobs (``GET /prioqueue/jobs/{id}`` after the end).

One owner, :class:`JobHistory`: an insertion-ordered map of job id to record, bounded in
count (``job_history``) and in estimated bytes (``job_history_bytes``); the oldest records go
first. Readers get ``get``, ``values`` and ``len``; only ``keep`` adds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import ValuesView
from typing import Any

__all__ = ["JobHistory"]


class JobHistory:
    """The finished jobs' records, oldest first, bounded in count and (estimated) bytes.

    A mapping of job id to record for readers (``get``, ``values``, ``len``); only
    :meth:`keep` adds, and it drops the oldest records past either bound. O(1) amortised.
    """

    __slots__ = ("_bytes", "_records", "_sizes")

    def __init__(self) -> None:
        self._records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._bytes = 0

    def keep(
        self, job_id: str, record: dict[str, Any], size: int, *, most: int, most_bytes: int
    ) -> None:
        """Add ``record`` (``size`` bytes, estimated); drop the oldest past the bounds."""
        records, sizes = self._records, self._sizes
        if job_id in records:
            self._bytes -= sizes.pop(job_id)
            del records[job_id]
        records[job_id] = record
        sizes[job_id] = size
        self._bytes += size
        while len(records) > most or self._bytes > most_bytes:
            old, _ = records.popitem(last=False)
            self._bytes -= sizes.pop(old)

    @property
    def bytes(self) -> int:
        """The estimated bytes of the records kept."""
        return self._bytes

    def get(self, job_id: str) -> dict[str, Any] | None:
        """The record of a finished job, or None. O(1)."""
        return self._records.get(job_id)

    def values(self) -> ValuesView[dict[str, Any]]:
        """The records, oldest first."""
        return self._records.values()

    def __len__(self) -> int:
        return len(self._records)
