"""The broker's dispatcher: ``prioqueue.FleetDispatcher``, or a one-job shim until it exists.

The broker is written against the fleet API of issue 9 (``join``, ``heartbeat``, ``pop``,
``idle_reasons``, ``complete``, ``cancel``, ``expire``, ``explain``, ``stats``, ``snapshot``,
``restore``). When the installed core has no ``FleetDispatcher`` yet, :class:`OneJobFleet`
provides that API over a :class:`~prioqueue.SizeOneDispatcher`: the whole fleet runs one job at
a time (the size-one dispatcher's resource), which keeps every guarantee but none of the
parallelism. It is private and goes away once the fleet lands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

import prioqueue
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.records import Expired, Grant, Job
from prioqueue.scoring import Scorer

__all__ = ["WorkerSpec", "make_fleet", "restore_fleet"]

LeaseFor = Callable[[Job, Any], float]


@attrs.frozen
class WorkerSpec:
    """What a worker says about itself on each pop (the fleet's ``join`` arguments)."""

    name: str
    models: tuple[str, ...] | None
    resident: str | None
    slots: int
    slow: bool


@attrs.define
class _Granted:
    """A grant of the shim, carrying its worker like the fleet's ``Grant``."""

    grant: Grant
    worker: str

    @property
    def job(self) -> Job:
        return self.grant.job

    @property
    def attempt(self) -> int:
        return self.grant.attempt

    @property
    def lease(self) -> Any:
        return self.grant.lease


class OneJobFleet:
    """The fleet API over one :class:`SizeOneDispatcher`: one job runs at a time, fleet-wide.

    Args:
        dispatcher: The size-one dispatcher holding the queue.
        lease_for: ``(job, worker) -> seconds``; the worker is a :class:`WorkerSpec`.
    """

    def __init__(self, dispatcher: SizeOneDispatcher, lease_for: LeaseFor) -> None:
        self._d = dispatcher
        self._lease_for = lease_for
        self._workers: dict[str, WorkerSpec] = {}
        self._popping: WorkerSpec | None = None
        self._holder: str | None = None

    def _lease(self, job: Job) -> float:
        assert self._popping is not None
        return self._lease_for(job, self._popping)

    def join(
        self,
        worker: str,
        *,
        models: Any = None,
        resident: str | None = None,
        slots: int = 1,
        slow: bool = False,
        now: float,
    ) -> WorkerSpec:
        """Record a worker (re-joining updates it). O(1)."""
        spec = WorkerSpec(worker, None if models is None else tuple(models), resident, slots, slow)
        self._workers[worker] = spec
        return spec

    def submit(self, job_id: str, **kwargs: Any) -> Any:
        """Queue a job (see ``SizeOneDispatcher.submit``)."""
        return self._d.submit(job_id, **kwargs)

    def heartbeat(self, worker: str, *, now: float) -> None:
        """Nothing to do: the shim has no worker timeout. O(1)."""

    def _fits(self, spec: WorkerSpec, now: float) -> tuple[bool, dict[str, int]]:
        if self._d.running is not None:
            return False, {"slots_full": len(self._d)}
        ahead = self._d.forecast(now=now, limit=1)
        if not ahead:
            return False, {}
        job = self._d.job(ahead[0].job_id)
        if spec.models is not None and job.model is not None and job.model not in spec.models:
            return False, {"model": 1}
        return True, {}

    def pop(self, worker: str, *, now: float) -> _Granted | None:
        """Grant the next job to ``worker`` when nothing runs and it serves the head's model."""
        spec = self._workers[worker]
        fits, _ = self._fits(spec, now)
        if not fits:
            return None
        self._popping = spec
        grant = self._d.dispatch(now)
        self._popping = None
        if grant is None:
            return None
        self._holder = worker
        return _Granted(grant, worker)

    def idle_reasons(self, worker: str, *, now: float) -> Mapping[str, int]:
        """Why ``worker``'s pop found nothing. O(L log L)."""
        return self._fits(self._workers[worker], now)[1]

    def complete(self, job_id: str, *, now: float, runtime: float | None = None) -> Any:
        """Complete the running job. O(log n)."""
        self._holder = None
        return self._d.complete(job_id, now=now, runtime=runtime)

    def cancel(self, job_id: str, *, now: float) -> Job:
        """Cancel a queued or running job. O(log n)."""
        if self._d.running is not None and self._d.running.job.id == job_id:
            self._holder = None
        return self._d.cancel(job_id, now=now)

    def expire(self, now: float) -> list[Expired]:
        """Take back a job past its lease. O(log n)."""
        expired = self._d.expire(now)
        if expired:
            self._holder = None
        return expired

    def next_deadline(self) -> float | None:
        """The running lease's deadline. O(1)."""
        return self._d.next_deadline()

    def explain(self, job_id: str, *, now: float) -> Any:
        """The dispatcher's explanation. See ``SizeOneDispatcher.explain``."""
        return self._d.explain(job_id, now=now)

    def stats(self, *, now: float) -> Any:
        """The dispatcher's statistics."""
        return self._d.stats(now=now)

    def __len__(self) -> int:
        return len(self._d)

    def snapshot(self, *, now: float) -> dict[str, Any]:
        """The dispatcher's snapshot plus the workers and the holder."""
        return {
            "dispatcher": self._d.snapshot(now=now),
            "holder": self._holder,
            "workers": [attrs.asdict(w) for w in self._workers.values()],
        }


def _dispatcher_options(config: Any) -> dict[str, Any]:
    return {
        "policy": config.policy,
        "charge": config.charge,
        "max_queued": config.max_queued,
        "max_queued_per_member": config.max_queued_per_member,
        "max_attempts": config.max_attempts,
        "fair_share": config.fair_share,
        "track_reorders": False,
        "history": 1000,
    }


def _fleet_options(config: Any) -> dict[str, Any]:
    return {
        **_dispatcher_options(config),
        "max_running_per_member": config.max_running_per_member,
        "worker_timeout": config.worker_timeout_seconds,
        "warm_hold": config.warm_hold_seconds,
    }


def make_fleet(config: Any, lease_for: LeaseFor) -> Any:
    """Build the broker's dispatcher from a :class:`~prioqueue.broker.BrokerConfig`.

    Args:
        config: The broker configuration.
        lease_for: ``(job, worker) -> seconds``.

    Returns:
        A ``FleetDispatcher`` when the core has one, else a :class:`OneJobFleet`.
    """
    scorer = Scorer(config.scoring)
    fleet_class = getattr(prioqueue, "FleetDispatcher", None)
    if fleet_class is not None:
        return fleet_class(scorer, lease_for=lease_for, **_fleet_options(config))
    dispatcher = SizeOneDispatcher(scorer, **_dispatcher_options(config))
    fleet = OneJobFleet(dispatcher, lease_for)
    dispatcher._lease_for = fleet._lease
    return fleet


def restore_fleet(state: Mapping[str, Any], config: Any, lease_for: LeaseFor, now: float) -> Any:
    """Rebuild the dispatcher from its ``snapshot`` (times kept: the broker's clock is wall time).

    Args:
        state: What ``snapshot`` returned.
        config: The broker configuration.
        lease_for: ``(job, worker) -> seconds``.
        now: The current time (unused by the shim; the fleet may check it).

    Returns:
        The restored dispatcher.

    Raises:
        ValueError: ``state`` is not a snapshot of this kind of dispatcher.
    """
    scorer = Scorer(config.scoring)
    fleet_class = getattr(prioqueue, "FleetDispatcher", None)
    if fleet_class is not None:
        return fleet_class.restore(
            state, scorer=scorer, lease_for=lease_for, **_fleet_options(config)
        )
    if "dispatcher" not in state:
        raise ValueError("invalid snapshot: not a one-job fleet snapshot")
    options = _dispatcher_options(config)
    options.pop("fair_share")
    dispatcher = SizeOneDispatcher.restore(state["dispatcher"], scorer=scorer, **options)
    fleet = OneJobFleet(dispatcher, lease_for)
    dispatcher._lease_for = fleet._lease
    for record in state["workers"]:
        models = record["models"]
        fleet._workers[record["name"]] = WorkerSpec(
            record["name"],
            None if models is None else tuple(models),
            record["resident"],
            record["slots"],
            record["slow"],
        )
    fleet._holder = state["holder"]
    return fleet
