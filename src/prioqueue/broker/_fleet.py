"""The broker's dispatcher: a :class:`~prioqueue.FleetDispatcher` built from the configuration.

Times are wall-clock seconds (the store's clock), so a restore keeps them as they are: leases
and waits keep running while the broker is down.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prioqueue._groups import group_key
from prioqueue.broker.config import BrokerConfig
from prioqueue.fleet import FleetDispatcher
from prioqueue.records import Job
from prioqueue.scoring import Scorer

__all__ = ["group_key", "make_fleet", "restore_fleet"]

LeaseFor = Callable[[Job, Any], float]


def _options(config: BrokerConfig, lease_for: LeaseFor) -> dict[str, Any]:
    return {
        "scorer": Scorer(config.scoring),
        "policy": config.policy,
        "charge": config.charge,
        "lease_for": lease_for,
        "max_queued": config.max_queued,
        "max_queued_per_member": config.max_queued_per_member,
        "max_running_per_member": config.max_running_per_member,
        "max_attempts": config.max_attempts,
        "worker_timeout": config.worker_timeout_seconds,
        "warm_hold": config.warm_hold_seconds,
        "load_seconds": config.load_seconds,
        "fair_share": config.fair_share,
        "track_reorders": False,
        "history": 1000,
        "budgets": config.budgets,
        "backoff": config.backoff,
    }


def make_fleet(config: BrokerConfig, lease_for: LeaseFor) -> FleetDispatcher:
    """A fresh fleet dispatcher with the configuration's options.

    Args:
        config: The broker configuration.
        lease_for: ``(job, worker_info) -> seconds``.

    Returns:
        The dispatcher.
    """
    return FleetDispatcher(**_options(config, lease_for))


def restore_fleet(
    state: Mapping[str, Any],
    config: BrokerConfig,
    lease_for: LeaseFor,
    *,
    now: float | None = None,
) -> FleetDispatcher:
    """Rebuild the fleet from its ``snapshot`` with times kept (the clock is wall time).

    Args:
        state: What ``snapshot`` returned.
        config: The broker configuration.
        lease_for: ``(job, worker_info) -> seconds``.
        now: None keeps every time; else they shift by ``now - taken_at`` (a rebase).

    Returns:
        The restored dispatcher.

    Raises:
        ValueError: ``state`` is not a fleet snapshot.
    """
    options = _options(config, lease_for)
    scorer = options.pop("scorer")
    return FleetDispatcher.restore(state, scorer=scorer, now=now, require_lease=True, **options)
