"""The broker engine's snapshot: its whole state as JSON data, and back (private).

:meth:`~prioqueue.broker.engine.BrokerEngine.snapshot` and ``restore`` (which checks the
format) call these. Derived state (group counts, queued bytes) is rebuilt on load, not
stored. Complexity: O(jobs + workers) both ways, plus the fleet's own snapshot.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import Any

import attrs

from prioqueue.broker import _groups
from prioqueue.broker._fleet import restore_fleet
from prioqueue.broker._records import FINISHED, SNAPSHOT_FORMAT, JobRecord, Rejected
from prioqueue.broker._state import EngineState

__all__ = ["dump", "load", "rebase"]


def dump(state: EngineState, now: float | None) -> dict[str, Any]:
    """The state as JSON data (``now``: used only before the first operation)."""
    at = state.now if math.isfinite(state.now) else (0.0 if now is None else now)
    return {
        "format": SNAPSHOT_FORMAT,
        "now": at,
        "counter": state.counter,
        "counts": dict(state.counts),
        "workers": dict(state.workers),
        "fleet": state.fleet.snapshot(now=at),
        # Shallow: payloads and results are shared, not copied (they are never changed
        # in place), so a snapshot costs O(jobs) on the loop, not O(bytes) (issue 21);
        # the store encodes them in its writer thread.
        "jobs": [attrs.asdict(r, recurse=False) for r in state.jobs.values()],
        "idempotency": [  # a single submit's one id as before, a batch's ids as a list
            [m, k, j[0] if len(j) == 1 else list(j), d]
            for (m, k), (j, d) in state.idempotency.items()
        ],
        "retention": [list(entry) for entry in state._retention],
        "seen": [[worker, seen] for worker, seen in state.seen.items()],
    }


def load(state: EngineState, data: Mapping[str, Any]) -> None:
    """Fill a fresh ``state`` from :func:`dump` data (its format already checked)."""
    state.now = float(data["now"])
    state.counter = int(data["counter"])
    state.counts.update(data["counts"])
    state.workers = dict(data["workers"])
    state.fleet = restore_fleet(data["fleet"], state.config, state._lease_for)
    for fields in data["jobs"]:
        record = JobRecord(**fields)
        state.jobs[record.id] = record
        _groups.kept(state, record)
        if record.state not in FINISHED:
            state.queued_bytes.held(record)
        else:  # a snapshot from before issue 30 kept finished payloads: they go now
            record.payload = None
    if "seen" in data:
        state.seen = {str(w): float(t) for w, t in data["seen"]}
    else:  # a snapshot from before workers were forgotten: as the fleet last saw them
        infos = sorted(state.fleet.workers(), key=lambda info: (info.last_seen, info.name))
        state.seen = {info.name: float(info.last_seen) for info in infos}
    for member, key, ids, digest in data["idempotency"]:
        state.idempotency[(member, key)] = ((ids,) if isinstance(ids, str) else tuple(ids), digest)
    state._retention = [(float(t), str(i)) for t, i in data["retention"]]
    heapq.heapify(state._retention)


_RECORD_TIMES = ("submitted_at", "deadline", "granted_at", "finished_at", "expires_at")


def rebase(state: EngineState, now: float, by: float) -> None:
    """``BrokerEngine.rebase_time``: every time ``state`` holds moves ``by`` seconds earlier.

    The fleet is rebuilt from its snapshot with the same shift; records, retention and the
    workers' last word shift in place (the retention heap keeps its order). A saved forward
    clock step is undone this way while time on the shifted axis never goes backwards.

    Raises:
        Rejected: 422 a bad ``by``; 409 ``now`` before the shifted last time.

    Complexity: O(jobs + workers).
    """
    if isinstance(by, bool) or not isinstance(by, (int, float)) or not 0 < by < math.inf:
        raise Rejected(422, f"by must be a positive number of seconds, got {by!r}", field="by")
    by = float(by)
    shifted = state.now - by
    if not now >= shifted:
        raise Rejected(409, f"time went backwards: {now!r} after {shifted!r} (rebased)")
    state.version += 1
    at = state.now if math.isfinite(state.now) else 0.0
    state.fleet = restore_fleet(
        state.fleet.snapshot(now=at), state.config, state._lease_for, now=at - by
    )
    for record in state.jobs.values():
        for name in _RECORD_TIMES:
            value = getattr(record, name)
            if value is not None:
                setattr(record, name, value - by)
    state._retention = [(t - by, job_id) for t, job_id in state._retention]
    state.seen = {worker: t - by for worker, t in state.seen.items()}
    state._status = None
    state.now = now
    if state.on_change is not None:  # every wait moved: each pop waiter looks again
        changed = state.changed
        changed.clear()
        changed.released = True
        state.on_change(changed)
        changed.clear()
