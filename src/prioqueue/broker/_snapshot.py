"""The broker engine's snapshot: its whole state as JSON data, and back (private).

:meth:`~prioqueue.broker.engine.BrokerEngine.snapshot` and ``restore`` (which checks the
format) call these. Derived state (group counts, queued bytes) is rebuilt on load, not
stored. Complexity: O(jobs + workers) both ways, plus the fleet's own snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from prioqueue.broker import _groups
from prioqueue.broker._fleet import restore_fleet
from prioqueue.broker._state import EngineState
from prioqueue.broker.records import FINISHED, SNAPSHOT_FORMAT, JobRecord, Rejected

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
        "retention": state.retention_entries(),
        "seen": [[worker, seen] for worker, seen in state.seen.items()],
    }


def load(state: EngineState, data: Mapping[str, Any]) -> None:
    """Fill a fresh ``state`` from :func:`dump` data (its format already checked)."""
    state.counts.update(data["counts"])
    state.load_parts(
        now=float(data["now"]),
        counter=int(data["counter"]),
        workers=dict(data["workers"]),
        fleet=restore_fleet(data["fleet"], state.config, state.lease_for),
        # absent: a snapshot from before workers were forgotten (as the fleet last saw them)
        seen={str(w): float(t) for w, t in data["seen"]} if "seen" in data else None,
        retention=[(float(t), str(i)) for t, i in data["retention"]],
    )
    for fields in data["jobs"]:
        record = JobRecord(**fields)
        state.jobs[record.id] = record
        _groups.kept(state, record)
        if record.state not in FINISHED:
            state.queued_bytes.held(record)
        else:  # a snapshot from before issue 30 kept finished payloads: they go now
            record.drop_payload()
    for member, key, ids, digest in data["idempotency"]:
        state.idempotency[(member, key)] = ((ids,) if isinstance(ids, str) else tuple(ids), digest)


def rebase(state: EngineState, now: float, by: float) -> None:
    """``BrokerEngine.rebase_time``: every time ``state`` holds moves ``by`` seconds earlier.

    The fleet is rebuilt from its snapshot with the same shift; records, retention and the
    workers' last word shift in place (the retention heap keeps its order). A saved forward
    clock step is undone this way while time on the shifted axis never goes backwards
    (:meth:`~prioqueue.broker._state.EngineState.shift_times`).

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
    state.shift_times(now, by)
