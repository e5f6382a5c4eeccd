"""Helpers the fleet's tests share (``test_fleet_api.py``, ``test_fleet_scenarios.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prioqueue.fleet import FleetDispatcher
from prioqueue.testing import ReferenceFleet

__all__ = ["Fleet", "leases"]

#: Either fleet: the real one or its reference model.
Fleet = FleetDispatcher | ReferenceFleet


def leases(
    make: Callable[..., Fleet], lease_for: Any, request: Mapping[str, Any], *, slow: bool = True
) -> tuple[float, float]:
    """The lease lengths a fast and a ``slow`` worker get for one job of ``request`` each.

    A fleet from ``make(lease_for=lease_for)``; workers "fast" and "slow" join, two members
    submit a job with ``request`` as its payload, and each worker pops one at time 0.
    """
    fleet = make(lease_for=lease_for)
    fleet.join("fast", now=0.0)
    fleet.join("slow", slow=slow, now=0.0)
    fleet.submit("one", member="ann", payload=dict(request), now=0.0)
    fleet.submit("two", member="bob", payload=dict(request), now=0.0)
    fast, slower = fleet.pop("fast", now=0.0), fleet.pop("slow", now=0.0)
    assert fast is not None
    assert slower is not None
    assert fast.lease is not None
    assert slower.lease is not None
    return fast.lease.seconds, slower.lease.seconds
