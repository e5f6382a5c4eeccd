"""The constructor options of the reference models, as ``TypedDict`` s (private).

``ReferenceFleet`` takes ``**options: Unpack[FleetOptions]`` and ``ReferenceDispatcher``
``**options: Unpack[SizeOneOptions]``: the real dispatchers' keyword arguments (less the
history sizes, which only ``explain`` reads), written out once. Each option left out takes the
real dispatchers' default, from ``DEFAULTS`` (the model's own copy: ``tests/test_testing.py``
checks that it matches the dispatchers' signatures).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypedDict

from prioqueue.capabilities import Capabilities
from prioqueue.dispatcher import DEFAULT_WAIT_BUCKETS, ChargeModel
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Job
from prioqueue.testing._records import DEFAULT_CROSSING_SHARE

__all__: list[str] = []  # private module


class _CommonOptions(TypedDict, total=False):
    """What both reference models take (``SizeOneDispatcher``'s options but ``lease_for``)."""

    policy: PriorityPolicy | None
    charge: ChargeModel
    max_queued: int | None
    max_queued_per_member: int | None
    max_attempts: int
    fair_share: bool
    track_reorders: bool
    crossing_share: float
    wait_buckets: Sequence[float]
    budgets: Mapping[int, LevelBudget] | None
    backoff: Backoff | None
    load_seconds: Mapping[str, float] | None


class SizeOneOptions(_CommonOptions, total=False):
    """The keyword arguments ``ReferenceDispatcher`` takes: ``SizeOneDispatcher``'s."""

    lease_for: Callable[[Job], float] | None


class FleetOptions(_CommonOptions, total=False):
    """The keyword arguments ``ReferenceFleet`` takes: ``FleetDispatcher``'s."""

    lease_for: Callable[..., float] | None
    max_running_per_member: int | None
    worker_timeout: float | None
    warm_hold: float


class WorkerSettings(TypedDict, total=False):
    """What ``ReferenceFleet.join`` takes but the name and ``now``: ``FleetDispatcher.join``'s."""

    models: Iterable[str] | None
    resident: str | None
    slots: int
    slow: bool
    accepts: Callable[[Job], bool] | None
    capabilities: Capabilities | Mapping[str, Any] | None


#: Every option's default (``FleetDispatcher``'s and ``SizeOneDispatcher``'s).
DEFAULTS: FleetOptions = {
    "policy": None,
    "charge": "runtime",
    "lease_for": None,
    "max_queued": None,
    "max_queued_per_member": None,
    "max_running_per_member": None,
    "max_attempts": 3,
    "worker_timeout": None,
    "warm_hold": 0.0,
    "load_seconds": None,
    "fair_share": True,
    "track_reorders": True,
    "crossing_share": DEFAULT_CROSSING_SHARE,
    "wait_buckets": DEFAULT_WAIT_BUCKETS,
    "budgets": None,
    "backoff": None,
}
