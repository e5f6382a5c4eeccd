"""The queue protocol the engine drives, and the queue a policy runs on.

Theory of operation
-------------------
The engine (:mod:`prioqueue.sim.engine`) drives one protocol, :class:`SimQueue`, for one
GPU and for a fleet alike: workers **pull** (``pop(worker, now=)``), report what ended
(``complete``, ``cancel``), and the engine asks ``expire`` at ``next_deadline``. The queues:

* on a fleet: the real :class:`~prioqueue.fleet.FleetDispatcher` (one ``join`` per worker,
  the policy's ``warm_hold``) or a pull baseline (:mod:`prioqueue.sim.baselines`);
* on one GPU: the real :class:`~prioqueue.dispatcher.SizeOneDispatcher` behind
  :class:`OneGpu` (its ``dispatch(now)`` is the one worker's ``pop``), or a pull baseline
  with one worker.

The full policy and its ablations are the dispatchers configured from
:class:`~prioqueue.sim.policies.PolicyParams`; only their public API is used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prioqueue.scoring import Scorer
from prioqueue.sim.baselines import MAX_ATTEMPTS, LeaseRule, build_pull_baseline
from prioqueue.sim.policies import PolicyParams, PolicySpec
from prioqueue.sim.workers import WorkerSpec

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._spec import SubmitOptions

__all__ = [
    "DispatchQueue",
    "OneGpu",
    "SimQueue",
    "build_queue",
    "reorder_counts",
]


class JobLike(Protocol):
    """What the engine reads from a granted job."""

    @property
    def id(self) -> str: ...

    @property
    def model(self) -> str | None: ...


class GrantLike(Protocol):
    """What the engine reads from a grant."""

    @property
    def job(self) -> JobLike: ...

    @property
    def attempt(self) -> int: ...


class ExpiredLike(Protocol):
    """What the engine reads from an expired lease (or, with a ``cause``, a ttl lapse)."""

    @property
    def job(self) -> JobLike: ...

    @property
    def requeued(self) -> bool: ...


class _Submits(Protocol):
    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[SubmitOptions]
    ) -> object: ...

    def expire(self, now: float) -> Sequence[ExpiredLike]: ...

    def next_deadline(self) -> float | None: ...

    def __len__(self) -> int: ...


class SimQueue(_Submits, Protocol):
    """The queue the engine drives: ``FleetDispatcher``'s pull API (one GPU: a fleet of one)."""

    def pop(self, name: str, *, now: float) -> GrantLike | None: ...  # noqa: D102

    def complete(  # noqa: D102
        self, job_id: str, *, now: float, runtime: float | None = None, worker: str | None = None
    ) -> object: ...

    def cancel(  # noqa: D102
        self, job_id: str, *, now: float, charge: float | None = None
    ) -> object: ...


class DispatchQueue(_Submits, Protocol):
    """``SizeOneDispatcher``'s API: ``dispatch(now)`` grants the one resource."""

    def dispatch(self, now: float) -> GrantLike | None: ...  # noqa: D102

    def complete(  # noqa: D102
        self, job_id: str, *, now: float, runtime: float | None = None
    ) -> object: ...

    def cancel(self, job_id: str, *, now: float) -> object: ...  # noqa: D102


class OneGpu:
    """One GPU's queue (``dispatch``) as a :class:`SimQueue` with one worker.

    ``pop`` is ``dispatch``; ``complete`` and ``cancel`` drop the worker and the charge (the
    dispatcher charges a cancelled running job itself). Every call is the queue's own cost.

    Args:
        queue: The one-GPU queue (a ``SizeOneDispatcher``).

    Attributes:
        policy: ``queue`` (the engine reads its ``stats`` and ``group_status``).
    """

    __slots__ = ("policy",)

    def __init__(self, queue: DispatchQueue) -> None:
        self.policy = queue

    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[SubmitOptions]
    ) -> object:
        """Submit a job to the queue (see ``FleetDispatcher.submit``)."""
        return self.policy.submit(job_id, member=member, now=now, **options)

    def pop(self, name: str, *, now: float) -> GrantLike | None:
        """Grant the one worker its next job: the queue's ``dispatch``."""
        return self.policy.dispatch(now)

    def complete(
        self, job_id: str, *, now: float, runtime: float | None = None, worker: str | None = None
    ) -> object:
        """Finish the running job."""
        return self.policy.complete(job_id, now=now, runtime=runtime)

    def cancel(self, job_id: str, *, now: float, charge: float | None = None) -> object:
        """Drop a queued or running job (the queue decides the charge)."""
        return self.policy.cancel(job_id, now=now)

    def expire(self, now: float) -> Sequence[ExpiredLike]:
        """Take back the running job past its lease, and queued jobs past their ttl."""
        return self.policy.expire(now)

    def next_deadline(self) -> float | None:
        """When ``expire`` next has work, or None."""
        return self.policy.next_deadline()

    def __len__(self) -> int:
        return len(self.policy)


def _options(params: PolicyParams, lease_for: Callable[..., float] | None) -> dict[str, Any]:
    """The keyword arguments both dispatchers take from the policy's parameters."""
    return {
        "charge": params.charge,
        "lease_for": lease_for,
        "fair_share": params.fair_share,
        "crossing_share": params.crossing_share,
        "max_attempts": MAX_ATTEMPTS,
        "budgets": params.budgets or None,
    }


def build_queue(
    spec: PolicySpec,
    workers: Sequence[WorkerSpec],
    lease_for: LeaseRule | None = None,
    load_seconds: Mapping[str, float] | None = None,
    *,
    one_gpu: bool = False,
) -> SimQueue:
    """Make a fresh queue for ``spec``, every worker joined at time 0.

    Args:
        spec: The policy.
        workers: The fleet (one worker when ``one_gpu``).
        lease_for: ``(job, worker name) -> seconds``, or None for no leases.
        load_seconds: The models' cold-load seconds (the dispatcher's ``load_seconds``).
        one_gpu: Run the dispatcher's policies on a ``SizeOneDispatcher`` (behind
            :class:`OneGpu`) rather than a ``FleetDispatcher``.

    Returns:
        A pull baseline, or a dispatcher configured from ``spec.params``.

    Raises:
        ConfigError: An empty fleet or a bad parameter.
    """
    if spec.is_baseline:
        return build_pull_baseline(spec.kind, workers, lease_for)
    scorer = Scorer(spec.params.scoring_config())
    rule: Callable[..., float] | None = None
    if one_gpu:
        from prioqueue.dispatcher import SizeOneDispatcher

        if lease_for is not None:
            one, name = lease_for, workers[0].name

            def rule(job: Any) -> float:
                return one(job, name)

        one_gpu_options = _options(spec.params, rule)
        return OneGpu(SizeOneDispatcher(scorer, load_seconds=load_seconds, **one_gpu_options))
    from prioqueue.fleet import FleetDispatcher

    if lease_for is not None:
        sized = lease_for

        def rule(job: Any, info: Any) -> float:
            return sized(job, info.name)

    options = _options(spec.params, rule)
    fleet = FleetDispatcher(
        scorer, warm_hold=spec.params.warm_hold, load_seconds=load_seconds, **options
    )
    for w in workers:
        fleet.join(w.name, models=w.models, resident=w.resident, slots=w.slots, now=0.0)
    return fleet


def reorder_counts(queue: object, now: float) -> dict[int, dict[str, int]]:
    """Return the dispatcher's reorders by level and cause (empty for the baselines).

    Args:
        queue: The queue after the run (a baseline, or a dispatcher with ``stats``).
        now: The end of the run.

    Returns:
        ``{level: {cause: count}}`` with the causes of ``REORDER_CAUSES``.
    """
    stats_of = getattr(queue, "stats", None)
    if stats_of is None:  # a baseline
        return {}
    stats = stats_of(now=now)
    return {level: dict(s.reorders.as_dict()) for level, s in stats.levels.items()}
