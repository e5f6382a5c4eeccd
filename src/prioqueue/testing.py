"""Helpers for testing code that uses prioqueue: a manual clock and reference dispatchers.

Theory of operation
-------------------
:class:`ManualClock` is time you control: it only moves when a test calls :meth:`~ManualClock.
advance` or :meth:`~ManualClock.jump_to`, never backwards, so tests of waits and leases take no
real time. It is a zero-argument callable returning a float, so it can stand wherever a
``clock`` callable is expected (the asyncio adapter's, for one).

:class:`ReferenceFleet` (defined in ``prioqueue._reference_fleet``) is a brute-force model of
:class:`~prioqueue.fleet.FleetDispatcher` written straight from the design note
(``docs/design/fleet.md``). It keeps plain lists and recomputes every lane's offer and key from
scratch at every pop: no heaps, no lazy deletion, no cached keys. It is slow (every pop is O(n)
in the queued jobs) and meant to be obviously right, so that random tests can drive both
dispatchers side by side and compare every decision.

:class:`ReferenceDispatcher` is the same model seen through
:class:`~prioqueue.dispatcher.SizeOneDispatcher`'s API: a ``ReferenceFleet`` of one worker
(one slot, every model, no timeout, no warm hold) that is never removed, exactly as
``SizeOneDispatcher`` is a ``FleetDispatcher`` of one (one algorithm, one reference model).
``dispatch`` is that worker's ``pop``; its grants and expiries name no worker.

Only the decisions and the statistics are modelled; ``explain``, ``forecast`` and snapshots are
not. Argument validation is minimal, but every error the tests compare (unknown ids, wrong
states, expired leases, duplicates, full queues, time going backwards) raises the same
exception type as the real dispatchers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from prioqueue._core import DEFAULT_CROSSING_SHARE
from prioqueue._reference_fleet import ReferenceFleet
from prioqueue.dispatcher import DEFAULT_WAIT_BUCKETS, ChargeModel
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Completed, Expired, Grant, Job, JobState, Stats, Ticket
from prioqueue.scoring import Scorer

__all__ = ["ManualClock", "ReferenceDispatcher", "ReferenceFleet"]


class ManualClock:
    """A monotonic clock that moves only when told to.

    Example:
        >>> clock = ManualClock(start=100.0)
        >>> clock.advance(2.5)
        102.5
        >>> clock()
        102.5

    Args:
        start: The initial reading in seconds (default 0.0); finite.

    Raises:
        ValueError: ``start`` is not finite.
    """

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = _finite("start", start)

    def now(self) -> float:
        """Return the current reading in seconds. O(1)."""
        return self._now

    def __call__(self) -> float:
        """Return the current reading: the clock is a zero-argument callable. O(1)."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward.

        Args:
            seconds: How far to move; finite and >= 0.

        Returns:
            The new reading.

        Raises:
            ValueError: ``seconds`` is negative or not finite.
        """
        step = _finite("seconds", seconds)
        if step < 0:
            raise ValueError(f"a clock never goes backwards: advance({seconds!r})")
        self._now += step
        return self._now

    def jump_to(self, t: float) -> float:
        """Set the clock to ``t``, which must not be earlier than the current reading.

        Args:
            t: The new reading; finite and >= :meth:`now`.

        Returns:
            The new reading.

        Raises:
            ValueError: ``t`` is earlier than the current reading, or not finite.
        """
        target = _finite("t", t)
        if target < self._now:
            raise ValueError(f"a clock never goes backwards: jump_to({t!r}) at {self._now!r}")
        self._now = target
        return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


class ReferenceDispatcher:
    """A brute-force model of ``SizeOneDispatcher``: a :class:`ReferenceFleet` of one worker.

    Same calls, same answers as ``SizeOneDispatcher``; every decision is the fleet model's
    (``docs/design/fleet.md``, "SizeOneDispatcher = a fleet of one worker").

    Args:
        scorer: The scoring weights (default ``Scorer()``).
        policy: Resolves priority numbers and aliases (default ``PriorityPolicy()``).
        charge: ``"runtime"``, ``"estimate"``, a constant number of seconds, or a callable
            ``(job, runtime) -> seconds`` (also called at the grant with the expected runtime).
        lease_for: ``job -> seconds`` for each grant's lease, or None for no leases.
        max_queued: The most queued jobs, or None.
        max_queued_per_member: The most queued jobs of one member, or None.
        max_attempts: Grants a job gets before an expired lease fails it.
        fair_share: False makes every job its own lane with ``s = arrival`` and no charge.
        track_reorders: False leaves the reorder counts at zero.
        crossing_share: The share of GPU time crossings may take (1: never deferred).
        wait_buckets: Upper bounds of the grant-wait histogram (``inf`` is appended).
        budgets: ``{level: LevelBudget}`` (docs/design/lifecycle.md).
        backoff: The retry delays of ``fail(retry=True)`` for jobs without their own.
    """

    _WORKER = "default"

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
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
        budgets: Mapping[int, LevelBudget] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self._fleet = ReferenceFleet(
            scorer,
            policy=policy,
            charge=charge,
            lease_for=lease_for,
            max_queued=max_queued,
            max_queued_per_member=max_queued_per_member,
            max_attempts=max_attempts,
            fair_share=fair_share,
            track_reorders=track_reorders,
            crossing_share=crossing_share,
            wait_buckets=wait_buckets,
            budgets=budgets,
            backoff=backoff,
        )
        self._fleet._add_fixed_worker(self._WORKER)

    @property
    def fleet(self) -> ReferenceFleet:
        """The one-worker fleet behind it."""
        return self._fleet

    @property
    def scorer(self) -> Scorer:
        """The scorer."""
        return self._fleet.scorer

    @property
    def policy(self) -> PriorityPolicy:
        """The priority policy."""
        return self._fleet.policy

    @property
    def resident_model(self) -> str | None:
        """The model believed loaded (the worker's resident model), or None."""
        return self._fleet.worker(self._WORKER).resident

    @property
    def running(self) -> Grant | None:
        """The grant of the job holding the resource, or None."""
        held = self._fleet.held
        return attrs.evolve(held[0], worker=None) if held else None

    def __len__(self) -> int:
        return len(self._fleet)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._fleet

    def job(self, job_id: str) -> Job:
        """Return a queued or running job (``UnknownJob`` otherwise)."""
        return self._fleet.job(job_id)

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"`` (``UnknownJob`` otherwise)."""
        return self._fleet.state(job_id)

    def next_deadline(self) -> float | None:
        """Return the running job's lease deadline, or None."""
        return self._fleet.next_deadline()

    def set_resident_model(self, model: str | None) -> None:
        """Say which model is loaded (None: nothing is)."""
        self._fleet._set_resident(self._WORKER, model)

    def submit(
        self,
        job_id: str,
        *,
        member: str,
        priority: int | str | bytes | None = 0,
        tier: str = "free",
        model: str | None = None,
        estimate: float | None = None,
        payload: Any = None,
        now: float,
        ttl: float | None = None,
        not_before: float | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
    ) -> Ticket:
        """Queue a job (see :meth:`ReferenceFleet.submit`)."""
        return self._fleet.submit(
            job_id,
            member=member,
            priority=priority,
            tier=tier,
            model=model,
            estimate=estimate,
            payload=payload,
            now=now,
            ttl=ttl,
            not_before=not_before,
            max_attempts=max_attempts,
            backoff=backoff,
        )

    def fail(self, job_id: str, *, now: float, retry: bool = False) -> Job:
        """Fail a job, or retry the running one (see :meth:`ReferenceFleet.fail`)."""
        return self._fleet.fail(job_id, now=now, retry=retry)

    def not_before(self, job_id: str) -> float | None:
        """When a delayed job becomes eligible, else None (``UnknownJob`` if unknown)."""
        return self._fleet.not_before(job_id)

    def dispatch(self, now: float) -> Grant | None:
        """Grant the best-scoring queued job when nothing runs: the one worker's pop."""
        grant = self._fleet.pop(self._WORKER, now=now)
        return None if grant is None else attrs.evolve(grant, worker=None)

    def complete(self, job_id: str, *, now: float, runtime: float | None = None) -> Completed:
        """Finish the running job (see :meth:`ReferenceFleet.complete`)."""
        return self._fleet.complete(job_id, now=now, runtime=runtime)

    def cancel(self, job_id: str, *, now: float) -> Job:
        """Drop a queued job or stop the running one (see :meth:`ReferenceFleet.cancel`)."""
        return self._fleet.cancel(job_id, now=now)

    def expire(self, now: float) -> list[Expired]:
        """Take the resource back from a job past its lease (at most one record)."""
        return [attrs.evolve(e, worker=None) for e in self._fleet.expire(now)]

    def stats(self, *, now: float) -> Stats:
        """Return the statistics (no workers listed, as ``SizeOneDispatcher``'s)."""
        return attrs.evolve(self._fleet.stats(now=now), workers=())

    def lane_jobs(self, member: str, level: int) -> tuple[Job, ...]:
        """Return the queued jobs of a lane in lane order (the head first)."""
        return self._fleet.lane_jobs(member, level)

    def lane_start(self, member: str, level: int) -> float:
        """Return the virtual start ``s`` of a lane (``-inf`` for a lane never seen)."""
        return self._fleet.lane_start(member, level)
