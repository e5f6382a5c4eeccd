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
from prioqueue.broker._records import FINISHED, SNAPSHOT_FORMAT, JobRecord
from prioqueue.broker._state import EngineState

__all__ = ["dump", "load"]


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
    if "seen" in data:
        state.seen = {str(w): float(t) for w, t in data["seen"]}
    else:  # a snapshot from before workers were forgotten: as the fleet last saw them
        infos = sorted(state.fleet.workers(), key=lambda info: (info.last_seen, info.name))
        state.seen = {info.name: float(info.last_seen) for info in infos}
    for member, key, ids, digest in data["idempotency"]:
        state.idempotency[(member, key)] = ((ids,) if isinstance(ids, str) else tuple(ids), digest)
    state._retention = [(float(t), str(i)) for t, i in data["retention"]]
    heapq.heapify(state._retention)
