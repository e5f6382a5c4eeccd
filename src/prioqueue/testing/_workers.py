"""Joining, heartbeats, leaving and idle reasons in the reference fleet (private).

``_Workers`` is the layer of :class:`~prioqueue.testing.ReferenceFleet` that keeps the worker
table: the rules of ``docs/design/fleet.md`` about who is live, what each worker serves and
why a pop finds nothing. The classes stack in one line, each on the one below:
``_Book`` (``_state``: the state and finding things in it) <- ``_Rules`` (``_rules``: offers,
keys, charges) <- ``_ReferenceLifecycle`` (``_lifecycle``: deadlines, delays, retries, budgets)
<- ``_Workers`` <- ``ReferenceFleet`` (``_fleet``: submit, pop, complete, cancel, expire).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prioqueue._spec import check_options
from prioqueue.capabilities import checked_capabilities
from prioqueue.records import Job, WorkerInfo
from prioqueue.testing._lifecycle import _ReferenceLifecycle
from prioqueue.testing._options import WorkerSettings
from prioqueue.testing._state import IDLE_CAUSES, _Worker

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__: list[str] = []  # private module

_UNCHANGED: Any = object()


class _Workers(_ReferenceLifecycle):
    """The worker calls of ``ReferenceFleet``."""

    _labels: dict[str, str | None]  # job id -> group label (ReferenceFleet fills it)

    def group_of(self, job_id: str) -> str | None:
        """The group label a job was submitted with (None: none)."""
        return self._labels.get(job_id)

    def _filter_holder(self, name: str) -> _Worker:
        return self._worker(name)

    def join(self, name: str, *, now: float, **settings: Unpack[WorkerSettings]) -> WorkerInfo:
        """Add a worker, or update every field of a known one (``resident=None`` keeps it).

        Args:
            name: The worker's name.
            now: The current time.
            **settings: ``FleetDispatcher.join``'s, each with its default: ``models`` (the
                models it serves, or None for every model), ``resident`` (the model it has
                loaded, or None), ``slots`` (how many jobs it holds at once, >= 1), ``slow``
                (whether it is extra slow: its leases are longer), ``accepts`` (a predicate
                over jobs it may take, or None) and ``capabilities`` (what it declared it can
                run, or None).

        Returns:
            The worker's info.

        Raises:
            ValueError: ``now`` went backwards, or a bad argument.
            TypeError: An argument of the wrong type, or a setting ``join`` does not take.
        """
        check_options(
            settings, call="join()", named="name, now", allowed=WorkerSettings.__annotations__
        )
        models, resident = settings.get("models"), settings.get("resident")
        slots, slow = settings.get("slots", 1), settings.get("slow", False)
        accepts = settings.get("accepts")
        caps = checked_capabilities(settings.get("capabilities"))
        with self._at(now) as t:
            if not isinstance(name, str) or not name:
                raise ValueError(f"a worker name must be a non-empty str, got {name!r}")
            if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
                raise ValueError(f"slots must be an int >= 1, got {slots!r}")
            if not isinstance(slow, bool):
                raise ValueError(f"slow must be a bool, got {slow!r}")
            served = None if models is None else frozenset(models)
            if served is not None and not all(isinstance(m, str) and m for m in served):
                raise ValueError(f"models must be non-empty strs, got {models!r}")
            if accepts is not None and not callable(accepts):
                raise ValueError(f"accepts must be callable or None, got {accepts!r}")
            worker = self._workers.get(name)
            if worker is None:
                worker = _Worker(name, served, resident, slots, bool(slow), accepts, t)
                worker.capabilities = caps
                self._workers[name] = worker
            else:
                worker.models = served
                if resident is not None:
                    worker.resident = resident
                worker.slots = slots
                worker.slow = bool(slow)
                worker.accepts = accepts
                worker.capabilities = caps
                worker.last_seen = t
                worker.timed_out = False
            return self._info(worker)

    def heartbeat(self, name: str, *, now: float, resident: str | None = _UNCHANGED) -> WorkerInfo:
        """Mark a worker seen (reviving it), and set its resident model when given.

        Args:
            name: The worker's name.
            now: The current time.
            resident: The model it has loaded (None: nothing); omitted: unchanged.

        Returns:
            The worker's info.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        with self._at(now) as t:
            worker = self._worker(name)
            worker.last_seen = t
            worker.timed_out = False
            if resident is not _UNCHANGED:
                worker.resident = resident
            return self._info(worker)

    def leave(self, name: str, *, now: float) -> list[Job]:
        """Forget a worker; every job it holds is requeued at its lane's head.

        Args:
            name: The worker's name.
            now: The current time.

        Returns:
            The jobs requeued, in ascending ``seq``.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        with self._at(now) as t:
            worker = self._worker(name)
            taken = list(worker.held)
            self._take_back(taken, t, always_requeue=True)
            del self._workers[name]
            return sorted((held.job for held in taken), key=lambda job: job.seq)

    def _add_fixed_worker(self, name: str) -> None:
        """Add a worker with the defaults (one slot, every model) outside time.

        It is the one worker of a size-one dispatcher: there from construction, never leaving.
        """
        self._workers[name] = _Worker(name, None, None, 1, False, None, -math.inf)

    def _set_resident(self, name: str, model: str | None) -> None:
        """Set a worker's resident model without a heartbeat (``set_resident_model``)."""
        self._worker(name).resident = model

    def next_hold_end(self) -> float | None:
        """When a warm hold kept for a busy worker lapses (None: none, or no warm hold).

        The earliest ``expected free + warm_hold`` after the latest ``now`` over the live
        workers that hold ``slots`` jobs and serve their resident model.
        """
        if not self._warm_hold > 0:
            return None
        ends = [
            min(h.grant.granted_at + h.expected_runtime for h in worker.held) + self._warm_hold
            for worker in self._workers.values()
            if not worker.timed_out
            and worker.resident is not None
            and worker.serves(worker.resident)
            and worker.held
            and len(worker.held) >= worker.slots
        ]
        later = [end for end in ends if end > self._latest]
        return min(later) if later else None

    def idle_reasons(self, name: str, *, now: float) -> Mapping[str, int]:
        """Why ``pop(name)`` finds nothing: queued jobs per first cause of ineligibility.

        Args:
            name: The worker's name.
            now: The current time.

        Returns:
            Counts per cause (causes with 0 omitted); empty when a pop would grant a job.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        now = self._time(now)
        worker = self._worker(name)
        counts: dict[str, int] = {}
        queued = self._queued()
        causes = [self._ineligible(worker, entry, now) for entry in queued]
        if all(cause is not None for cause in causes):  # as pop: capped holds
            causes = [self._ineligible(worker, entry, now, True) for entry in queued]
        for cause in causes:
            if cause is not None:
                counts[cause] = counts.get(cause, 0) + 1
        return {cause: counts[cause] for cause in IDLE_CAUSES if cause in counts}
