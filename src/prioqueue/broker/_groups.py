"""Groups in the broker: a label on jobs (a film), watched and cancelled as one (issue 13).

Theory of operation
-------------------
The dispatcher keeps the groups: a submit with ``group`` passes it to
``FleetDispatcher.submit(group=...)``, and ``GET``/``DELETE /v1/groups/{id}`` read
``group_status`` and run ``cancel_group`` of the core, so the counts, the GPU-seconds and the
forecast are the core's (docs/design/chains.md), through expired leases and requeues.

* **Per member.** The core's label is :func:`~prioqueue.broker._fleet.group_key` of the
  submitting member and the caller's label (the gateway's form), so two members' groups with
  the same label never mix: another member's group is simply unknown (404). A key with
  ``observer = true`` reads, and one with ``admin = true`` reads and cancels, the group of
  the member named by ``?member=`` (the HTTP layer checks that).
* **As long as its jobs.** The job book counts its kept records per group
  (:attr:`JobBook.group_kept <prioqueue.broker.jobbook.JobBook.group_kept>`, rebuilt on
  restore); the ``tick`` that drops a group's last record (its retention ran out) also calls
  ``forget_group`` (:func:`forget`). A group is readable
  exactly as long as one of its jobs is, and the dispatcher's memory stays bounded.
* **One operation.** ``cancel_group`` is one journaled broker operation: it is refused (404,
  422) before anything changes, else the core cancels the jobs and the broker finishes their
  records, in the core's order. Replaying it does the same.

Complexity: :func:`group_status` is that of ``FleetDispatcher.group_status`` (O(1) for an idle
group, else the forecast's dry run); :func:`cancel_group` is O(k (log n + M)) for k jobs.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from prioqueue.broker._fleet import group_key
from prioqueue.broker._state import EngineParts
from prioqueue.broker.records import Rejected
from prioqueue.errors import UnknownGroup

if TYPE_CHECKING:
    from prioqueue.views import GroupStatus

__all__ = ["cancel_group", "forget", "group_status"]


def _unknown(label: str, member: str) -> Rejected:
    return Rejected(404, f"no group {label!r} of member {member!r}", field="group")


def group_status(engine: EngineParts, label: str, member: str) -> GroupStatus:
    """The core's status of ``member``'s group ``label`` as of the engine's last operation.

    Args:
        engine: The engine (read only: the status is taken at ``engine.now``, the time the
            dispatcher has already seen, so the read changes nothing).
        label: The group's label as the member gave it.
        member: Whose group it is.

    Returns:
        The counts, GPU-seconds, mean runtime and forecast finish (broker wall-clock time).

    Raises:
        Rejected: 404 when the member has no such group (never had, or forgotten).
    """
    key = group_key(member, label)
    if not engine.jobs.has_group(key):
        raise _unknown(label, member)
    try:
        status: GroupStatus = engine.fleet.group_status(key, now=engine.now)
    except UnknownGroup:  # restored from a snapshot from before groups reached the core
        raise _unknown(label, member) from None
    return status


def cancel_group(
    engine: EngineParts, now: float, *, label: str, member: str, running: str
) -> list[str]:
    """Cancel ``member``'s group ``label`` in the core and finish the records it cancelled.

    Args:
        engine: The engine.
        now: The operation's time.
        label: The group's label.
        member: Whose group it is.
        running: ``"keep"`` or ``"cancel"`` (the group's running jobs).

    Returns:
        The cancelled jobs' ids, oldest submission first.

    Raises:
        Rejected: 422 a bad ``running``; 404 no such group. Nothing changed.
    """
    if running not in ("keep", "cancel"):
        raise Rejected(422, f'running must be "keep" or "cancel", got {running!r}', field="running")
    key = group_key(member, label)
    if not engine.jobs.has_group(key):
        raise _unknown(label, member)
    try:
        jobs = engine.fleet.cancel_group(key, now=now, running=running)
    except UnknownGroup:  # the same as in group_status (raised before any change)
        raise _unknown(label, member) from None
    cancelled = []
    for job in jobs:
        record = engine.jobs[job.id]
        engine.finish(record, "cancelled", None, now)
        cancelled.append(record.id)
    return cancelled


def forget(engine: EngineParts, keys: list[str]) -> None:
    """The groups ``keys`` lost their last kept record: the fleet forgets them. O(len(keys)).

    ``keys``: what ``JobBook.retire_due`` returned, in its order.
    """
    for key in keys:
        with contextlib.suppress(UnknownGroup):  # the same, see group_status
            engine.fleet.forget_group(key)
