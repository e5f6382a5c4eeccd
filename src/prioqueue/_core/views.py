"""The read-only views the dispatchers hand out, built from the state as copies (private).

The bodies of the facade's view methods (``recent_grants``, ``member_lanes``,
``worker_views``, ``group_finishes``): each reads the state and changes nothing, and returns
frozen values of :mod:`prioqueue.views` (or of :mod:`prioqueue.records`) that share no
mutable structure with the state (docs/design/state.md, "Previews and views").
"""

from __future__ import annotations

from collections.abc import Collection

from prioqueue._core.core import Core
from prioqueue._core.observe import predict, runtime_estimator
from prioqueue._lanes import QUEUED
from prioqueue.records import Job
from prioqueue.views import GrantRecord, GroupFinish, LaneView, WorkerView

__all__: list[str] = []  # private module


def recent_grants(d: Core, since: float, limit: int) -> list[GrantRecord]:
    """The remembered grants at or after ``since``, newest first, at most ``limit``."""
    found: list[GrantRecord] = []
    for record in reversed(d.history.records):
        if record.at < since or len(found) >= limit:
            break
        found.append(
            GrantRecord(
                at=record.at, job_id=record.job_id, member=record.member,
                priority=record.priority, model=record.model, resident=record.resident,
                worker=record.worker, score=record.score, rule=record.rule,
            )
        )  # fmt: skip
    return found


def member_lanes(d: Core, heads: int, scan: int) -> list[LaneView]:
    """Every member lane with a job queued or held, highest level first, then by member.

    Each lists its first ``heads`` queued jobs among its first ``scan`` entries (lazy deletion
    leaves entries that are no longer queued). Without fair share there are none.
    """
    if not d.config.fair_share:
        return []
    views = []
    for lane in d.lanes.by_key.values():
        if not (lane.live or lane.holding):
            continue
        first: list[Job] = []
        for scanned, entry in enumerate(lane.jobs):
            if scanned >= scan or len(first) >= heads:
                break
            if entry.state == QUEUED:
                first.append(entry.job)
        views.append(LaneView(lane.member, lane.level, lane.live, lane.holding, tuple(first)))
    views.sort(key=lambda view: (-view.level, view.member))
    return views


def worker_views(d: Core) -> list[WorkerView]:
    """Every known worker (timed-out ones included) and what it holds, by name."""
    workers = d.workers.by_name
    return [
        WorkerView(
            workers[name].info(),
            tuple(entry.job for entry in workers[name].held),
            tuple(entry.grant for entry in workers[name].held),
        )
        for name in sorted(workers)
    ]


def group_finishes(
    d: Core, t: float, wanted: Collection[str], limit: int
) -> dict[str, GroupFinish]:
    """Each wanted group's predicted finish from one dry run of at most ``limit`` grants.

    The groups are known ones (the caller checked). A group with queued jobs past the dry
    run's horizon is ``beyond`` (no finish); one with a job of unknown runtime on the way has
    no finish either.
    """
    book = d.groups
    left = {key: book.status(key, now=t, finish=None).queued for key in wanted}
    if not left:
        return {}
    expected = runtime_estimator(d)
    finish: dict[str, float | None] = {}
    unknown: set[str] = set()
    for worker in d.workers.by_name.values():
        for entry in worker.held:
            key = book.group_of(entry.job.id)
            if key in left:
                runtime = expected(entry.job)
                if runtime is None:
                    unknown.add(key)
                    continue
                end = max(t, entry.granted_at + runtime)
                finish[key] = max(end, finish.get(key) or end)
    waiting = sum(left.values())
    if waiting:
        for step in predict(d, t, stop_at=None, limit=limit):
            key = book.group_of(step.entry.job.id)
            if key not in left:
                continue
            left[key] -= 1
            waiting -= 1
            runtime = expected(step.entry.job)
            if step.start is None or runtime is None:
                unknown.add(key)
            else:
                end = step.start + runtime
                finish[key] = max(end, finish.get(key) or end)
            if not waiting:
                break
    answer = {}
    for key, unplaced in left.items():
        beyond = unplaced > 0
        answer[key] = GroupFinish(None if beyond or key in unknown else finish.get(key), beyond)
    return answer
