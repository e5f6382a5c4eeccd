"""The constructor options of the reference models, as ``TypedDict`` s (private).

``ReferenceFleet`` takes ``**options: Unpack[FleetOptions]`` and ``ReferenceDispatcher``
``**options: Unpack[SizeOneOptions]``: the real dispatchers' keyword arguments (less the
history sizes, which only ``explain`` reads), written out once. Each option left out takes the
real dispatchers' default; the reference fleet applies them (``ReferenceFleet.__init__``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from prioqueue.dispatcher import ChargeModel
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Job

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


class SizeOneOptions(_CommonOptions, total=False):
    """The keyword arguments ``ReferenceDispatcher`` takes: ``SizeOneDispatcher``'s."""

    lease_for: Callable[[Job], float] | None


class FleetOptions(_CommonOptions, total=False):
    """The keyword arguments ``ReferenceFleet`` takes: ``FleetDispatcher``'s."""

    lease_for: Callable[..., float] | None
    max_running_per_member: int | None
    worker_timeout: float | None
    warm_hold: float
    load_seconds: Mapping[str, float] | None


def known_options(caller: str, options: Mapping[str, Any], allowed: type[Any]) -> None:
    """Refuse an option the ``TypedDict`` ``allowed`` does not name, as Python would.

    Raises:
        TypeError: ``caller() got unexpected keyword argument(s) [...]``.
    """
    unknown = sorted(set(options) - set(allowed.__annotations__))
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword argument(s) {unknown}")
