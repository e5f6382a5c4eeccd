"""prioqueue: which waiting job goes next on a GPU that runs one job at a time, and for how long.

The core is sans-IO: every call that depends on time takes ``now`` (monotonic seconds) and
nothing here sleeps, spawns or reads a clock. Adapters (``prioqueue.asyncio``,
``prioqueue.gateway``, ``prioqueue.prometheus``, ``prioqueue.sim``) live in their own modules
and import the core, never the other way round.

The public names are re-exported here from the modules that define them:

* :mod:`prioqueue.priority`: ``parse_priority``, ``PriorityPolicy``, the named levels.
* :mod:`prioqueue.scoring`: ``ScoringConfig``, ``Scorer``, ``ScoreBreakdown``.
* :mod:`prioqueue.lease`: ``lease_seconds``, ``LeaseCalculator``, ``Lease`` and friends.
* :mod:`prioqueue.dispatcher`: ``SizeOneDispatcher``; :mod:`prioqueue.fleet`:
  ``FleetDispatcher`` (many workers pulling from one queue); their values live in
  :mod:`prioqueue.records`.
* :mod:`prioqueue.chain`: ``Chain``, a sans-IO producer of job sequences (a film's shots);
  ``GroupStatus`` is a group's status.
* :mod:`prioqueue.testing`: ``ManualClock`` and the brute-force ``ReferenceDispatcher``
  (imported from there, not re-exported).
"""

from __future__ import annotations

from importlib.metadata import version as _version
from typing import Any

from prioqueue._groups import CancelRunning, GroupState
from prioqueue.chain import Chain, ChainProgress, ChainState, ChainStep, FailurePolicy
from prioqueue.dispatcher import (
    DEFAULT_RETRY_AFTER,
    DEFAULT_WAIT_BUCKETS,
    ChargeModel,
    SizeOneDispatcher,
)
from prioqueue.errors import (
    ChargeError,
    ConfigError,
    DuplicateJob,
    InvalidState,
    LeaseError,
    LeaseExpired,
    Overloaded,
    PrioqueueError,
    QueueFull,
    UnknownGroup,
    UnknownJob,
    UnknownWorker,
)
from prioqueue.fleet import FleetDispatcher
from prioqueue.lease import (
    DEFAULT_CALCULATOR,
    FLAT_WORK_SAMPLERS,
    SAMPLER_UNITS,
    SLOW_BASELINE_MULTIPLIERS,
    ImageRequest,
    Lease,
    LeaseCalculator,
    LeaseExplanation,
    lease_seconds,
    sampler_work,
)
from prioqueue.lease import explain as explain_lease
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import (
    BATCH,
    DEFAULT_ALIASES,
    HEADER,
    INTERACTIVE,
    MAX_HEADER_LENGTH,
    NORMAL,
    PriorityPolicy,
    parse_priority,
)
from prioqueue.records import (
    REORDER_CAUSES,
    AheadJob,
    Completed,
    Expired,
    Explanation,
    Grant,
    Job,
    JobState,
    LevelStats,
    MemberStats,
    Overtake,
    OvertakeCause,
    Reorders,
    Stats,
    Ticket,
    WorkerInfo,
)
from prioqueue.scoring import DEFAULT_TIER_BONUSES, ScoreBreakdown, Scorer, ScoringConfig
from prioqueue.views import GroupStatus

__all__ = [
    "BATCH",
    "DEFAULT_ALIASES",
    "DEFAULT_CALCULATOR",
    "DEFAULT_RETRY_AFTER",
    "DEFAULT_TIER_BONUSES",
    "DEFAULT_WAIT_BUCKETS",
    "FLAT_WORK_SAMPLERS",
    "HEADER",
    "INTERACTIVE",
    "MAX_HEADER_LENGTH",
    "NORMAL",
    "REORDER_CAUSES",
    "SAMPLER_UNITS",
    "SLOW_BASELINE_MULTIPLIERS",
    "AheadJob",
    "Backoff",
    "CancelRunning",
    "Chain",
    "ChainProgress",
    "ChainState",
    "ChainStep",
    "ChargeError",
    "ChargeModel",
    "Completed",
    "ConfigError",
    "DuplicateJob",
    "Expired",
    "Explanation",
    "FailurePolicy",
    "FleetDispatcher",
    "Grant",
    "GroupState",
    "GroupStatus",
    "ImageRequest",
    "InvalidState",
    "Job",
    "JobState",
    "Lease",
    "LeaseCalculator",
    "LeaseError",
    "LeaseExpired",
    "LeaseExplanation",
    "LevelBudget",
    "LevelStats",
    "MemberStats",
    "Overloaded",
    "Overtake",
    "OvertakeCause",
    "PrioqueueError",
    "PriorityPolicy",
    "QueueFull",
    "Reorders",
    "ScoreBreakdown",
    "Scorer",
    "ScoringConfig",
    "SizeOneDispatcher",
    "Stats",
    "Ticket",
    "UnknownGroup",
    "UnknownJob",
    "UnknownWorker",
    "WorkerInfo",
    "explain_lease",
    "lease_seconds",
    "parse_priority",
    "sampler_work",
]


def __getattr__(name: str) -> Any:
    """Return ``__version__`` lazily, read from the installed distribution's metadata."""
    if name == "__version__":
        return _version("prioqueue-lanes")
    raise AttributeError(f"module 'prioqueue' has no attribute {name!r}")
