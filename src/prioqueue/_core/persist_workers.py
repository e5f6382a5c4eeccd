"""The workers' part of a fleet snapshot, and the checks the loaders share (private).

Split from :mod:`prioqueue._core.persist`: each worker's settings (models, resident, slots,
slow flag, declared capabilities, timed-out state, last word), and the job a held multi-model
grant carries (its chosen model). O(workers) to dump or load.
"""

from __future__ import annotations

from typing import Any

import attrs

from prioqueue._core.core import Core
from prioqueue._validate import checked_name, finite, flag
from prioqueue._workers import _Worker
from prioqueue.capabilities import checked_capabilities
from prioqueue.records import Job

__all__: list[str] = []  # private module


def dump_workers(d: Core) -> list[dict[str, Any]]:
    """Every worker's settings and state, as JSON data. O(workers)."""
    return [
        {
            "name": w.name,
            "models": None if w.models is None else sorted(w.models),
            "resident": w.resident,
            "slots": w.slots,
            "slow": w.slow,
            "capabilities": None if w.capabilities is None else w.capabilities.as_dict(),
            "timed_out": w.timed_out,
            "last_seen": w.last_seen,
        }
        for w in d.workers.by_name.values()
    ]


def _int(name: str, value: object, low: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}")
    return value


def load_workers(d: Core, records: Any, shift: float) -> None:
    for record in records:
        name = checked_name("worker name", record["name"])
        if name in d.workers.by_name:
            raise ValueError(f"worker {name!r} appears twice")
        seen = record.get("last_seen")
        last_seen = (
            d.now if seen is None else finite("last_seen", finite("last_seen", seen) + shift)
        )
        if last_seen > d.now:
            raise ValueError(f"worker {name!r} was last seen after the snapshot was taken")
        worker = _Worker(name, last_seen)
        models = record["models"]
        if models is not None and not isinstance(models, (list, tuple, set, frozenset)):
            raise ValueError(
                f"worker {name!r}: models must be a list of names or None, got {models!r}"
            )
        served = None if models is None else frozenset(checked_name("model", m) for m in models)
        slots = _int("slots", record["slots"], 1)
        slow = flag("slow", record["slow"])
        worker.configure(
            served, slots, slow, None, checked_capabilities(record.get("capabilities"))
        )
        resident = record["resident"]
        if resident is not None:
            worker.load(checked_name("resident", resident))
        # A timed-out worker stays out of the capacity until it speaks again.
        worker.set_timed_out(flag("timed_out", record.get("timed_out", False)))
        d.workers.restore(worker)


def granted_as(job: Job, model: object) -> Job:
    """The job as a grant chose its model (a multi-model job, ``prioqueue.capabilities``)."""
    name = checked_name("granted_model", model)
    if job.needs is None or name not in job.needs.models:
        raise ValueError(f"held job {job.id!r}: granted_model {name!r} is not one it accepts")
    return attrs.evolve(job, model=name)
