"""``worker_info``: a worker's public record, from any object that keeps a worker (private).

The fleet's ``_Worker`` (``prioqueue._workers``) and the reference fleet's worker record
(``prioqueue.testing``) keep the same fields under the same names; both report a worker
through this one function, so ``WorkerInfo`` is filled in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prioqueue.capabilities import Capabilities
from prioqueue.records import Job, WorkerInfo

__all__: list[str] = []  # private module


class WorkerRecord(Protocol):
    """What ``worker_info`` reads from a worker."""

    name: str
    models: frozenset[str] | None
    resident: str | None
    slots: int
    slow: bool
    last_seen: float
    timed_out: bool
    accepts: Callable[[Job], bool] | None
    capabilities: Capabilities | None


#: The fields of ``WorkerInfo`` that a worker record keeps under the same name, copied as is.
COPIED = ("name", "models", "resident", "slots", "slow", "last_seen", "timed_out")


def worker_info(worker: WorkerRecord, held: tuple[str, ...]) -> WorkerInfo:
    """The public record of ``worker``, holding the jobs ``held`` (ids, in grant order). O(1)."""
    copied = {name: getattr(worker, name) for name in COPIED}
    return WorkerInfo(
        **copied,
        held=held,
        filtered=worker.accepts is not None,
        capabilities=worker.capabilities,
    )
