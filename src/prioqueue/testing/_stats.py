"""What :class:`~prioqueue.testing.ReferenceFleet` has seen happen (private).

``Runtimes`` keeps the finished runs' runtimes (every one, and the last ``RECENT_RUNTIMES`` per
model and per level): the expected runtime of a job and the ``retry_after`` of a refusal read
them. ``ReferenceStats`` keeps the counters (per level, per member, and the totals) and builds
``Stats`` from them and the queue's contents.
"""

from __future__ import annotations

import math

from prioqueue.records import Job, LevelStats, MemberStats, Reorders, Stats, WorkerInfo
from prioqueue.testing._records import (
    DEFAULT_EXPECTED_RUNTIME,
    RECENT_RUNTIMES,
    Held,
    LevelCounters,
    MemberCounters,
)

__all__: list[str] = []  # private module


class Runtimes:
    """The runtimes of finished runs."""

    def __init__(self) -> None:
        self._all: list[float] = []
        self._by_model: dict[str, list[float]] = {}
        self._by_level: dict[int, list[float]] = {}

    def remember(self, job: Job, runtime: float) -> None:
        """A run of ``job`` ended after ``runtime`` seconds."""
        self._all.append(runtime)
        if job.model is not None:
            _remember(self._by_model.setdefault(job.model, []), runtime)
        _remember(self._by_level.setdefault(job.priority, []), runtime)

    def expected(self, job: Job) -> float:
        """The expected runtime: the estimate, else the recent mean of its model, then level."""
        if job.estimate is not None:
            return job.estimate
        if job.model is not None and self._by_model.get(job.model):
            recent = self._by_model[job.model]
            return sum(recent) / len(recent)
        return self.level_mean(job.priority)

    def level_mean(self, level: int) -> float:
        """The mean of a level's recent runtimes (``DEFAULT_EXPECTED_RUNTIME`` when none)."""
        recent = self._by_level.get(level, [])
        return sum(recent) / len(recent) if recent else DEFAULT_EXPECTED_RUNTIME

    def retry_after(self) -> float:
        """A refusal's ``retry_after``: the mean of the last 64 runtimes, at least 1 (or 30)."""
        recent = self._all[-64:]
        return max(1.0, math.fsum(recent) / len(recent)) if recent else 30.0


def _remember(recent: list[float], runtime: float) -> None:
    recent.append(runtime)
    del recent[:-RECENT_RUNTIMES]


class ReferenceStats:
    """The counters behind ``stats``.

    Args:
        buckets: Upper bounds of the grant-wait histogram (``inf`` is appended).
    """

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self._buckets = buckets if buckets and buckets[-1] == math.inf else (*buckets, math.inf)
        self._levels: dict[int, LevelCounters] = {}
        self._members: dict[str, MemberCounters] = {}
        self._counts = {"completed": 0, "cancelled": 0, "expired": 0, "failed": 0, "swaps": 0}
        self._counts.update(ttl_expired=0, refused=0, retried=0)
        self._level_counts: dict[int, list[int]] = {}  # level -> [ttl expired, refused]

    def levels(self) -> list[int]:
        """Every level a job was submitted at, highest first."""
        return sorted(self._levels, reverse=True)

    def submitted(self, job: Job) -> None:
        """A job was accepted: its level and member get counters."""
        self._levels.setdefault(job.priority, LevelCounters())
        self._members.setdefault(job.member, MemberCounters())

    def granted(self, job: Job, waited: float) -> None:
        """A grant of ``job``, which waited ``waited``."""
        self._levels[job.priority].granted(waited)
        self._members[job.member].granted()

    def reordered(self, level: int, cause: str) -> None:
        """One more reorder of ``cause`` at ``level``."""
        self._levels[level].reordered(cause)

    def completed(self, member: str) -> None:
        """A completion of ``member``'s."""
        self._counts["completed"] += 1
        self._members[member].completed_one()

    def charged(self, member: str, charge: float) -> None:
        """A finished run of ``member``'s was charged ``charge``."""
        self._members[member].charged(charge)

    def count(self, name: str, by: int = 1) -> None:
        """One more (or ``by`` more) of a total: ``cancelled``, ``failed``, ``swaps``..."""
        self._counts[name] += by

    def lapsed(self, level: int) -> None:
        """A job at ``level`` reached its deadline unserved."""
        self._counts["ttl_expired"] += 1
        self._level_counts.setdefault(level, [0, 0])[0] += 1

    def refused(self, level: int) -> None:
        """A submit at ``level`` was refused by the level's budget."""
        self._counts["refused"] += 1
        self._level_counts.setdefault(level, [0, 0])[1] += 1

    def stats(
        self,
        now: float,
        queued: list[Job],
        delayed: list[Job],
        held: list[Held],
        workers: list[WorkerInfo],
        resident: str | None,
    ) -> Stats:
        """The statistics at ``now`` of these queued, delayed and held jobs and workers.

        ``running`` is the first held job by grant time (None when none is held).
        """
        levels: dict[int, LevelStats] = {}
        for level in sorted(self._levels, reverse=True):
            counters = self._levels[level]
            waits = [now - job.arrival for job in queued if job.priority == level]
            expired, refused = self._level_counts.get(level, (0, 0))
            levels[level] = LevelStats(
                level=level,
                queued=len(waits),
                oldest_wait=max(waits, default=0.0),
                mean_wait=math.fsum(waits) / len(waits) if waits else 0.0,
                dispatched=counters.dispatched,
                total_wait=counters.total_wait,
                reorders=Reorders(**counters.reorders),
                wait_buckets=tuple(
                    (bound, sum(1 for wait in counters.waits if wait <= bound))
                    for bound in self._buckets
                ),
                ttl_expired=expired,
                refused=refused,
                delayed=sum(1 for job in delayed if job.priority == level),
            )
        members = {
            name: MemberStats(
                member=name,
                queued=sum(1 for job in queued if job.member == name),
                dispatched=counters.dispatched,
                completed=counters.completed,
                gpu_seconds=counters.gpu_seconds,
                running=sum(1 for h in held if h.job.member == name),
            )
            for name, counters in self._members.items()
        }
        return Stats(
            now=now,
            levels=levels,
            members=members,
            running=held[0].job if held else None,
            resident_model=resident,
            queued=len(queued) + len(delayed),
            dispatched=sum(counters.dispatched for counters in self._levels.values()),
            **self._counts,
            held=tuple(h.job for h in held),
            workers=tuple(workers),
            delayed=len(delayed),
        )
