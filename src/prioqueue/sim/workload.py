"""The simulator's input: a workload of job arrivals, built by a scenario or read from a trace.

A workload is a list of :class:`Arrival` records sorted by arrival time, plus the cold-load
time of each model. Everything the engine needs to know about a job is here: who sends it, at
which priority and tier, for which model, how long it really runs, what the caller estimated,
and whether the caller cancels it or it hangs (a lost worker whose lease must expire).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

__all__ = ["Arrival", "Workload"]


@attrs.frozen
class Arrival:
    """One job of a workload.

    Attributes:
        arrival: Seconds from the start of the simulation at which the job is submitted.
        member: Who sends it (fair share is per member inside a level).
        priority: The priority number (its level).
        tier: The member's tier name.
        model: The model the job needs loaded, or None.
        duration: Seconds the job runs once its model is loaded (warm runtime).
        estimate: The caller's runtime estimate in seconds, or None.
        cancel_after: Seconds after arrival at which the caller cancels the job (queued or
            running), or None when it never does.
        hangs: How many of its first grants hang (a lost worker): the lease must expire
            before the job is requeued. 0 for a healthy job.
        group: The group the job belongs to (a film), or None. With a depth in
            ``Workload.chains`` the group's jobs are submitted as a chain.
    """

    arrival: float
    member: str
    priority: int
    tier: str = "free"
    model: str | None = None
    duration: float = 0.0
    estimate: float | None = None
    cancel_after: float | None = None
    hangs: int = 0
    group: str | None = None


def _freeze(value: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(value))


def _freeze_chains(value: Mapping[str, int]) -> Mapping[str, int]:
    for group, depth in value.items():
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"chain {group!r}: depth must be an int >= 1, got {depth!r}")
    return MappingProxyType(dict(value))


def _freeze_params(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@attrs.frozen
class Workload:
    """A named, sorted list of arrivals and the cold-load time of each model.

    Attributes:
        name: The scenario name (or ``"trace:<path>"``).
        arrivals: The jobs, sorted by arrival time (stable: equal times keep their order).
        load_seconds: Seconds a cold load of each model takes; models not listed load in
            ``default_load``.
        default_load: The cold-load time of a model missing from ``load_seconds``.
        params: The parameters the workload was built from (for the report).
        horizon: Seconds after which the simulation stops the clock (jobs still queued then
            are unfinished), or None to run until every job has left.
        chains: Group to depth: the groups whose jobs are submitted as a ``Chain`` of that
            depth (at most that many submitted at once; see :mod:`prioqueue.sim.groups`).
        workers: How many workers the scenario is meant for (None: one GPU); the engine
            uses it when no fleet is given.
    """

    name: str
    arrivals: Sequence[Arrival]
    load_seconds: Mapping[str, float] = attrs.field(factory=dict, converter=_freeze)
    default_load: float = 0.0
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_freeze_params)
    horizon: float | None = None
    chains: Mapping[str, int] = attrs.field(factory=dict, converter=_freeze_chains)
    workers: int | None = None

    def load_time(self, model: str | None) -> float:
        """Return the seconds a cold load of ``model`` takes (0 for ``None``).

        Args:
            model: The model name, or None for a job that needs none.

        Returns:
            The cold-load time in seconds.
        """
        if model is None:
            return 0.0
        return self.load_seconds.get(model, self.default_load)

    def work_seconds(self) -> float:
        """Return the total warm runtime of the workload's jobs, in seconds."""
        return math.fsum(a.duration for a in self.arrivals)

    def span(self) -> float:
        """Return the seconds between the first and the last arrival (0 when empty)."""
        if not self.arrivals:
            return 0.0
        return self.arrivals[-1].arrival - self.arrivals[0].arrival
