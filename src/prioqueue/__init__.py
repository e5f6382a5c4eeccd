"""prioqueue: which waiting job goes next on a GPU that runs one job at a time, and for how long.

The core is sans-IO: every call that depends on time takes ``now`` (monotonic seconds) and
nothing here sleeps, spawns or reads a clock. Adapters (asyncio, HTTP gateway, Prometheus,
simulator) live in their own modules and import the core, never the other way round.
"""

from __future__ import annotations

from typing import Any

from prioqueue._errors import (
    ConfigError,
    DuplicateJob,
    InvalidState,
    LeaseExpired,
    PrioqueueError,
    QueueFull,
    UnknownJob,
)

__all__ = [
    "ConfigError",
    "DuplicateJob",
    "InvalidState",
    "LeaseExpired",
    "PrioqueueError",
    "QueueFull",
    "UnknownJob",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("prioqueue-lanes")
    raise AttributeError(f"module 'prioqueue' has no attribute {name!r}")
