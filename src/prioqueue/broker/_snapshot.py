"""The broker engine's snapshot: its whole state as JSON data, and back (private).

:meth:`~prioqueue.broker.engine.BrokerEngine.snapshot` and ``restore`` (which checks the
format) call these: each owner gives its part and loads it back (the job book, the worker
book, the fleet). Derived state (group counts, queued bytes) is rebuilt on load, not stored.
Complexity: O(jobs + workers) both ways, plus the fleet's own snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from prioqueue.broker._state import EngineParts
from prioqueue.broker.records import SNAPSHOT_FORMAT, JobRecord, Rejected

__all__ = ["Loadable", "Rebasable", "dump", "load", "rebase"]


def dump(engine: EngineParts, now: float | None) -> dict[str, Any]:
    """The state as JSON data (``now``: used only before the first operation)."""
    at = engine.now if math.isfinite(engine.now) else (0.0 if now is None else now)
    jobs = engine.jobs
    return {
        "format": SNAPSHOT_FORMAT,
        "now": at,
        "counter": jobs.counter,
        "counts": dict(jobs.counts),
        "workers": {name: settings.as_dict() for name, settings in engine.workers.items()},
        "fleet": engine.fleet.snapshot(now=at),
        # Shallow: payloads and results are shared, not copied (they are never changed
        # in place), so a snapshot costs O(jobs) on the loop, not O(bytes) (issue 21);
        # the store encodes them in its writer thread.
        "jobs": [attrs.asdict(r, recurse=False) for r in jobs.values()],
        "idempotency": [  # a single submit's one id as before, a batch's ids as a list
            [m, k, j[0] if len(j) == 1 else list(j), d]
            for (m, k), (j, d) in jobs.idempotency.items()
        ],
        "retention": jobs.retention_entries(),
        "seen": [[worker, seen] for worker, seen in engine.workers.seen.items()],
    }


def load(engine: Loadable, data: Mapping[str, Any]) -> None:
    """Fill a fresh ``engine`` from :func:`dump` data (its format already checked)."""
    engine.load_parts(float(data["now"]), data["fleet"])
    if "seen" in data:
        seen = {str(w): float(t) for w, t in data["seen"]}
    else:  # a snapshot from before workers were forgotten: as the fleet last saw them
        infos = sorted(engine.fleet.workers(), key=lambda info: (info.last_seen, info.name))
        seen = {info.name: float(info.last_seen) for info in infos}
    engine.workers.load(dict(data["workers"]), seen)
    engine.jobs.load(
        counter=int(data["counter"]),
        counts=data["counts"],
        # a finished record of a snapshot from before issue 30 drops its payload on load
        records=(JobRecord(**fields) for fields in data["jobs"]),
        keys=(
            (member, key, (ids,) if isinstance(ids, str) else tuple(ids), digest)
            for member, key, ids, digest in data["idempotency"]
        ),
        retention=[(float(t), str(i)) for t, i in data["retention"]],
    )


class Loadable(EngineParts, Protocol):
    """A fresh engine that :func:`load` fills: its parts, and its time and fleet to take."""

    def load_parts(self, now: float, fleet: Mapping[str, Any]) -> None:
        """Take a snapshot's time and fleet."""


class Rebasable(EngineParts, Protocol):
    """An engine that :func:`rebase` shifts."""

    def shift_times(self, now: float, by: float) -> None:
        """Every time held moves ``by`` seconds earlier; then the time is ``now``."""


def rebase(engine: Rebasable, now: float, by: float) -> None:
    """``BrokerEngine.rebase_time``: every time ``engine`` holds moves ``by`` seconds earlier.

    The fleet is rebuilt from its snapshot with the same shift; records, retention and the
    workers' last word shift in place (the retention heap keeps its order). A saved forward
    clock step is undone this way while time on the shifted axis never goes backwards
    (:meth:`~prioqueue.broker.engine.BrokerEngine.shift_times`).

    Raises:
        Rejected: 422 a bad ``by``; 409 ``now`` before the shifted last time.

    Complexity: O(jobs + workers).
    """
    if isinstance(by, bool) or not isinstance(by, (int, float)) or not 0 < by < math.inf:
        raise Rejected(422, f"by must be a positive number of seconds, got {by!r}", field="by")
    by = float(by)
    shifted = engine.now - by
    if not now >= shifted:
        raise Rejected(409, f"time went backwards: {now!r} after {shifted!r} (rebased)")
    engine.shift_times(now, by)
