"""The lanes of :class:`~prioqueue.testing.ReferenceFleet`: its queue (private).

``ReferenceLanes`` owns every lane ``(member, level)`` ever made, in the order they were made,
and each lane's queued jobs in lane order: the queue is the lanes' jobs, found by scanning. It
queues (tail, an idle lane lifted), requeues (head), removes, holds and releases charges and
settles a completion (``docs/design/fleet.md``); which job goes next is ``_rules``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prioqueue._readonly import ReadOnly
from prioqueue.records import Job
from prioqueue.testing._records import Entry, Lane

__all__: list[str] = []  # private module

#: A lane as the rules rank it: ``(level, s, entries, lane)`` (``lane`` None without fair share).
Backlogged = tuple[int, float, list[Entry], Lane | None]


class ReferenceLanes:
    """The lanes and their queued jobs.

    Args:
        fair_share: False makes every job its own lane with ``s = arrival`` and no charge.
    """

    fair_share = ReadOnly[bool]("_fair_share", "Whether lanes are charged (fair share).")

    def __init__(self, fair_share: bool) -> None:
        self._fair_share = fair_share
        self._lanes: dict[tuple[str, int], Lane] = {}

    # -- reading -----------------------------------------------------------------------------

    def queued(self) -> list[Entry]:
        """Every queued entry, lane by lane (lanes in creation order), each lane in order."""
        return [entry for lane in self._lanes.values() for entry in lane.jobs]

    def lanes(self) -> list[Lane]:
        """Every lane ever made, in creation order."""
        return list(self._lanes.values())

    def lane_of(self, job: Job) -> Lane:
        """The lane of a job that was queued (it exists)."""
        return self._lanes[(job.member, job.priority)]

    def backlogged(self) -> list[Backlogged]:
        """``(level, s, entries, lane)`` of each backlogged lane (each job without fair share)."""
        if self._fair_share:
            return [
                (lane.level, lane.s, lane.jobs, lane) for lane in self._lanes.values() if lane.jobs
            ]
        return [
            (entry.job.priority, entry.job.arrival, [entry], None)
            for lane in self._lanes.values()
            for entry in lane.jobs
        ]

    def lane_jobs(self, member: str, level: int) -> tuple[Job, ...]:
        """The queued jobs of a lane in lane order (empty for a lane that is not backlogged)."""
        lane = self._lanes.get((member, level))
        return () if lane is None else tuple(entry.job for entry in lane.jobs)

    def lane_start(self, member: str, level: int) -> float:
        """A lane's ``s`` with its held charges (``-inf``: never seen, or no fair share)."""
        lane = self._lanes.get((member, level))
        return -math.inf if lane is None or not self._fair_share else lane.s

    def lane_held(self, member: str, level: int) -> float:
        """The up-front charges of a lane's held jobs (``held``; 0 for no lane)."""
        lane = self._lanes.get((member, level))
        return 0.0 if lane is None else lane.held

    # -- changing ----------------------------------------------------------------------------

    def queue(self, job: Job, at: float, grants: int, floor: Callable[[Job], float]) -> None:
        """Queue ``job`` at ``at`` at its lane's tail; an idle lane is lifted to ``floor(job)``.

        The lift is of the settled part (``settled = max(settled, min(at, floor))``), with fair
        share only.
        """
        lane = self._lanes.setdefault((job.member, job.priority), Lane(job.member, job.priority))
        if self._fair_share and not lane.jobs:  # the lift, of the settled part
            lane.lift(at, floor(job))
        lane.append(Entry(job, at, grants))

    def requeue(self, job: Job, at: float, grants: int) -> None:
        """Queue a job taken back at its lane's head."""
        self.lane_of(job).put_first(Entry(job, at, grants))

    def remove(self, job: Job, entry: Entry) -> None:
        """Take a queued entry of ``job``'s lane out (granted, or lapsed)."""
        self.lane_of(job).remove(entry)

    def drop(self, job: Job) -> None:
        """Take a queued job out of its lane (cancelled or failed)."""
        self.lane_of(job).drop(job)

    def hold(self, job: Job, c: float) -> None:
        """A grant of ``job``: its up-front charge ``c`` joins its lane's ``held``."""
        self.lane_of(job).hold(c)

    def release(self, job: Job, c: float) -> None:
        """``job`` taken back: its up-front charge ``c`` leaves ``held`` (the refund)."""
        self.lane_of(job).release(c)

    def settle(self, job: Job, c: float, charge: float, n: int, now: float) -> None:
        """``job`` finished: ``c`` leaves ``held``, ``settled = min(settled + charge / n, now)``.

        The lane is then re-anchored at ``now`` when it is the only backlogged one at its level.
        """
        lane = self.lane_of(job)
        lane.release(c)
        lane.settle(charge, n, now)
        others = [m for m in self._lanes.values() if m.level == lane.level and m.jobs]
        if lane.jobs and others == [lane]:
            lane.anchor(now)  # alone at its level: re-anchored
