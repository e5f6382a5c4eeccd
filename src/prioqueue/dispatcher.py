"""``SizeOneDispatcher``: which waiting job goes next on a resource that runs one job at a time.

Theory of operation (the full model, with its invariants, is docs/design/dispatcher.md; since
issue 9 it is a fleet of one worker, docs/design/fleet.md):

* Jobs wait in **lanes**, one per ``(member, level)``; a lane is FIFO. Lanes compete with one
  score, ``level + tier + affinity + (now - s) / divisor``, where ``s`` is the lane's
  **virtual start**: how long the lane has been denied its fair share, not how long each job
  has existed. The winning lane gives up its head (or its oldest job for the resident model,
  when it holds one within the affinity window).
* A grant charges its lane the job's expected charge up front; the completion replaces it with
  the job's real **charge** (its runtime, by default), so the lane ends where charging at
  completion puts it: ``s = min(s + charge, now)``. A lane becoming backlogged is lifted, so a
  member can neither bank credit while idle nor be punished for another member's backlog.
* Non-preemptive: ``dispatch`` grants only while nothing runs. A grant may carry a lease; a
  job past its lease is requeued at the head of its lane by ``expire`` (and reported as failed
  after ``max_attempts`` grants, never silently dropped).
* Sans-IO: every call that depends on time takes ``now`` (monotonic seconds, never going
  backwards); nothing here sleeps, spawns or reads a clock.
* Nothing is lost and nothing runs twice: every call validates its arguments and computes
  everything that can fail (the lease, the expected charge) before it changes any state.
* The class is a facade: it holds one ``prioqueue._core`` state (the fleet's, with one worker)
  and delegates every call to it (docs/design/state.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prioqueue._core import grant, restore
from prioqueue._core.config import (
    DEFAULT_CROSSING_SHARE,
    DEFAULT_HISTORY_BYTES,
    DEFAULT_RETRY_AFTER,
    DEFAULT_WAIT_BUCKETS,
    OVERDUE_SLACK,
    ChargeModel,
    Config,
    constructor_arguments,
)
from prioqueue._core.facade import Facade
from prioqueue._core.queue import fire
from prioqueue._journaled import journaled
from prioqueue._validate import checked_name
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Expired, Grant, Job
from prioqueue.scoring import Scorer

__all__ = [
    "DEFAULT_CROSSING_SHARE",
    "DEFAULT_RETRY_AFTER",
    "DEFAULT_WAIT_BUCKETS",
    "OVERDUE_SLACK",
    "ChargeModel",
    "SizeOneDispatcher",
]

_WORKER = "default"  # the one worker's name (not shown: grants carry worker=None)


class SizeOneDispatcher(Facade):
    """The waiting jobs of one size-1 resource, and which one goes next.

    Args:
        scorer: The score's weights (default ``Scorer()``: band spacing 100, tiers free 0 /
            pro 1 / max 2, affinity up to 10, one aging point per 60 s).
        policy: Turns ``submit(priority=...)`` values (ints, aliases, header strings) into
            priority numbers, clamped to the policy's range (default ``PriorityPolicy()``).
        charge: How a finished job advances its lane's virtual start: ``"runtime"`` (the
            reported or measured runtime), ``"estimate"`` (the job's estimate, else its
            runtime), a number (the same for every job: count-based fairness) or a callable
            ``(job, runtime) -> seconds``. At the grant the same model is applied to the
            expected runtime (the estimate, else the recent mean of the job's model, else of
            its level, else 60 s) and charged up front; the completion corrects it.
        lease_for: ``job -> seconds``, called at dispatch to size the grant's lease (a
            :class:`~prioqueue.lease.LeaseCalculator` works); None for no leases.
        max_queued: Most jobs that may wait at once; None for no limit.
        max_queued_per_member: Most jobs one member may have waiting; None for no limit.
        max_attempts: Grants a job gets before an expired lease fails it for good.
        fair_share: False turns every job into its own lane aging from its arrival (the
            design's plain per-job aging), for comparison.
        track_reorders: Keep the counterfactual rankings behind ``Stats`` reorder counts
            (a constant factor in cost; the counts stay 0 when off).
        crossing_share: The share of GPU time that *crossings* (grants to a job below the
            highest level with eligible work, which only aging can carry there) may take
            from the higher levels while they have work waiting; beyond it a crossing is
            deferred and the higher level's best job is granted instead (see
            ``docs/design/dispatcher.md``, "Bounded crossings"). In ``(0, 1]``; 1 never
            defers (the policy before issue 17). Default 0.05.
        history: Dispatches remembered for ``explain``'s overtakes.
        history_bytes: The history's byte budget (estimated; payloads are never kept).
        wait_buckets: Upper bounds of the grant-wait histogram, increasing.
        budgets: Overload protection per priority level: ``{level: LevelBudget(max_queued=,
            max_wait=, ttl=)}`` (docs/design/lifecycle.md); none by default.
        backoff: The retry delays of ``fail(retry=True)`` for jobs without their own
            (default: retry at once).
        load_seconds: Cold-load seconds per model name (a swap's cost): a crossing past its
            share that runs warm is not deferred for a job of another model while that job,
            once the crossing has run, will have waited less than the two loads a deferral
            costs (docs/design/fleet.md, "Warm crossings"). The affinity bonus stays the
            scorer's (``FleetDispatcher`` also prices it: that serves placement). None (or a
            model missing): every crossing past its share is deferred.

    Attributes:
        scorer: The scorer (read-only).
        policy: The priority policy (read-only).
        fair_share: Whether lanes are per member (True) or per job (False); read-only.

    Raises:
        ConfigError: An option is out of range.
        TypeError: ``scorer`` or ``policy`` has the wrong type.

    Complexity: ``submit``, ``dispatch``, ``complete``, ``cancel`` and ``expire`` are
    amortised O(log n + M) in the number of lanes or queued jobs n and the number of models M
    queued in the lanes they touch; ``stats`` is O(levels + members); ``forecast`` and
    ``explain`` are diagnostic, O(L log L + k log L) for L lanes and k jobs predicted ahead.
    """

    def __init__(
        self,
        scorer: Scorer | None = None,
        *,
        policy: PriorityPolicy | None = None,
        charge: ChargeModel = "runtime",
        lease_for: Callable[[Job], float] | None = None,
        max_queued: int | None = None,
        max_queued_per_member: int | None = None,
        max_attempts: int = 3,
        fair_share: bool = True,
        track_reorders: bool = True,
        crossing_share: float = DEFAULT_CROSSING_SHARE,
        history: int = 10_000,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
        budgets: Mapping[int, LevelBudget] | None = None,
        backoff: Backoff | None = None,
        load_seconds: Mapping[str, float] | None = None,
    ) -> None:
        options = constructor_arguments(locals())
        super().__init__(Config.checked(options, name_in_grants=False, priced=False))
        self._one = self._core.workers.add(_WORKER, self._core.now)

    @property
    def resident_model(self) -> str | None:
        """The model believed loaded: set by every dispatch of a job with a model."""
        return self._one.resident

    @property
    def running(self) -> Grant | None:
        """The grant of the job holding the resource, or None when it is free."""
        held = self._one.held
        return held[0].grant if held else None

    @journaled
    def set_resident_model(self, model: str | None) -> None:
        """Tell the dispatcher which model is loaded (None: nothing, e.g. after an idle unload).

        Raises:
            ValueError: ``model`` is not a non-empty str or None.
        """
        self._core.workers.set_resident(
            self._one, None if model is None else checked_name("model", model)
        )

    @journaled(skip_when_empty=True)
    def expire(self, now: float) -> list[Expired]:
        """Take the resource back from a job past its lease (see ``FleetDispatcher.expire``).

        Declared here again only because a size-1 dispatcher's empty ``expire`` changed
        nothing (it has no worker to time out), so a durable wrapper need not journal it.

        Raises:
            ValueError: ``now`` is out of range.

        Complexity: O(k log n) for k jobs taken back or expired (amortised).
        """
        return super().expire(now)

    @journaled(skip_when_empty=True)
    def dispatch(self, now: float) -> Grant | None:
        """Grant the resource to the best waiting job, when it is free.

        Args:
            now: The current monotonic time.

        Returns:
            The grant, or None when a job is running or none is queued. A running job past its
            lease keeps the resource until ``expire`` reclaims it.

        Raises:
            ValueError: ``now`` is not finite or goes backwards.
            ChargeError: The charge model returned no finite number >= 0 for the expected
                charge (a ``ValueError``; nothing changes, the error names the job).
            LeaseError: ``lease_for`` raised or returned no positive finite number of
                seconds; the dispatcher is unchanged and the error names the job.

        Complexity: amortised O(log n + M) (times 4 with ``track_reorders``).
        """
        state = self._core
        fire(state, now)
        t = state.tick(now)
        if self._one.held:
            return None
        return grant.pop(state, self._one, t)

    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any],
        *,
        scorer: Scorer | None = None,
        now: float | None = None,
        require_lease: bool = False,
        **options: Any,
    ) -> SizeOneDispatcher:
        """Rebuild a dispatcher from ``snapshot()`` data: no queued job, lane age or lease lost.

        Args:
            state: What ``snapshot`` returned (possibly through JSON).
            scorer: The scorer of the new dispatcher (its tiers must know every job's tier).
            now: The new process's monotonic time. When given, every stored time is shifted by
                ``now - taken_at``, so waits, lane ages and the lease resume where they
                stopped (the downtime does not count). When None, times are kept as they are
                (same clock).
            require_lease: Refuse a running job without a lease (the asyncio adapter sets
                it: without a lease nothing would ever free the resource).
            **options: The constructor's other keyword arguments (``fair_share`` defaults to
                the snapshot's).

        Returns:
            The restored dispatcher.

        Raises:
            ValueError: ``state`` is not a valid snapshot (the message says what is wrong), or
                a job's tier is unknown to ``scorer``.

        Complexity: O(n log n) in the jobs.
        """
        return restore.restored(cls, cls._core_of, state, scorer, now, require_lease, options)
