"""The policies of a simulated fleet, under the names the fleet engine used (compatibility).

One GPU and a fleet now run the same engine and the same queue protocol: the pull baselines
live in :mod:`prioqueue.sim.baselines`, the protocol and the queue builder in
:mod:`prioqueue.sim.queues`. This module keeps the fleet names importable:
``FleetQueue`` is :class:`~prioqueue.sim.queues.SimQueue` and ``build_fleet_queue`` is
:func:`~prioqueue.sim.queues.build_queue`.
"""

from __future__ import annotations

from prioqueue.sim.baselines import (
    FleetFifo,
    FleetStrict,
    LeaseRule,
    WarmFirst,
    build_pull_baseline,
)
from prioqueue.sim.policies import DEFAULT_FLEET_POLICIES
from prioqueue.sim.queues import SimQueue as FleetQueue
from prioqueue.sim.queues import build_queue as build_fleet_queue

__all__ = [
    "DEFAULT_FLEET_POLICIES",
    "FleetFifo",
    "FleetQueue",
    "FleetStrict",
    "LeaseRule",
    "WarmFirst",
    "build_fleet_queue",
    "build_pull_baseline",
]
