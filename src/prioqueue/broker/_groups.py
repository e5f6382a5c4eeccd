"""Groups in the broker: a label on jobs (a film), watched and cancelled as one (issue 13).

A group changes no score and no lane; it is the ``group`` field of the broker's job records.
A submitter sees and cancels only its own member's groups (another member's group is 404, as
if it did not exist). The status counts the jobs the broker still keeps (finished ones for
``result_ttl_seconds``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prioqueue.broker.engine import FINISHED, JobRecord, Rejected

if TYPE_CHECKING:
    from prioqueue.broker.engine import BrokerEngine

__all__ = ["group_records", "group_status"]


def group_records(engine: BrokerEngine, group: str, member: str) -> list[JobRecord]:
    """The kept records of ``member``'s ``group``, in submission order. O(jobs).

    Raises:
        Rejected: 404 when the member has no kept job in the group.
    """
    records = [r for r in engine.jobs.values() if r.group == group and r.member == member]
    if not records:
        raise Rejected(404, f"no group {group!r}", field="group")
    records.sort(key=lambda r: int(r.id.rpartition("-")[2]))
    return records


def group_status(engine: BrokerEngine, group: str, member: str) -> dict[str, Any]:
    """Counts by state, GPU-seconds, mean runtime and the forecast finish of a group.

    GPU-seconds sum the time from grant to finish of the group's done and failed jobs (and of
    cancelled ones that were running). The forecast is when the group's last queued job should
    finish at the current load: its estimated start from the dispatcher's forecast plus its
    estimate (else the group's mean runtime); None when no runtime is known yet.

    Complexity: O(jobs + L log L + k log L) (the forecast, see ``FleetDispatcher.forecast``).

    Raises:
        Rejected: 404 when the member has no kept job in the group.
    """
    records = group_records(engine, group, member)
    counts = dict.fromkeys(("queued", "running", "done", "failed", "cancelled"), 0)
    runtimes: list[float] = []
    used = 0.0
    for record in records:
        counts[record.state] += 1
        if record.state in FINISHED and record.granted_at is not None:
            ran = max(0.0, (record.finished_at or record.granted_at) - record.granted_at)
            used += ran
            if record.state == "done":
                runtimes.append(ran)
    mean = sum(runtimes) / len(runtimes) if runtimes else None
    queued = {r.id: r for r in records if r.state == "queued"}
    finish: float | None = None
    if queued and engine.jobs:
        last_start: float | None = None
        last: JobRecord | None = None
        for ahead in engine.fleet.forecast(now=engine.now):
            if ahead.job_id in queued:
                last_start, last = ahead.estimated_start, queued[ahead.job_id]
        runtime = None if last is None else (last.estimate or mean)
        if last_start is not None and runtime is not None:
            finish = last_start + runtime
    elif counts["running"] == 0:
        finish = max((r.finished_at or 0.0) for r in records)
    return {
        "group": group,
        **counts,
        "gpu_seconds": used,
        "mean_runtime": mean,
        "forecast_finish": finish,
    }
