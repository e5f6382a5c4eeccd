"""The state of :class:`~prioqueue.testing.ReferenceFleet` and its bookkeeping (private).

Plain mutable records (entries, lanes, held jobs, workers, offers, counters) and ``_Book``,
the base class that finds jobs and workers in them by scanning: nothing here is indexed, so
nothing can be out of date. The rules live in ``_rules``, the public calls in
``_fleet``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import attrs

from prioqueue._errors import InvalidState, UnknownJob, UnknownWorker
from prioqueue._readonly import ReadOnly
from prioqueue._worker_info import worker_info
from prioqueue.capabilities import FEATURES, Capabilities
from prioqueue.dispatcher import ChargeModel
from prioqueue.lease import LeaseCalculator
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Grant, Job, JobState, WorkerInfo
from prioqueue.scoring import Scorer

__all__: list[str] = []  # private module

#: The expected runtime of a job with no estimate and no recent runtime of its model or level.
DEFAULT_EXPECTED_RUNTIME = 60.0

#: Finished jobs' runtimes kept per model and per level for the expected charge.
RECENT_RUNTIMES = 8

#: The causes ``idle_reasons`` reports, in the order they are tested.
IDLE_CAUSES = (
    "slots_full", "member_cap", "model", "undeclared", "max_pixels", "max_steps", "img2img",
    "inpainting", "controlnet", "lora", "post_processing", "nsfw", "blacklist", "accepts",
    "warm_hold",
)  # fmt: skip

CauseName = Literal["lease", "worker_timeout"]


@attrs.define(eq=False)
class _Entry:
    """A queued job: the job, when it entered the queue, and its grants so far."""

    job: Job
    queued_at: float
    grants: int = 0


@attrs.define(eq=False)
class _Lane:
    """A lane: ``s = settled + held`` while it has held jobs, else ``s = settled``."""

    member: str
    level: int
    settled: float = -math.inf
    held: float = 0.0
    holding: int = 0
    jobs: list[_Entry] = attrs.field(factory=list)

    @property
    def s(self) -> float:
        return self.settled + self.held if self.holding else self.settled

    def hold(self, c: float) -> None:
        """A grant: the up-front charge ``c`` joins ``held`` (no clamp)."""
        self.holding += 1
        self.held += c

    def release(self, c: float) -> None:
        """A held job leaves (finished or taken back): its up-front charge leaves ``held``."""
        self.holding -= 1
        self.held = self.held - c if self.holding else 0.0


@attrs.define(eq=False)
class _Held:
    """A job a worker holds: its grant, the up-front charge ``c``, the capacity ``n``...

    ... its expected runtime at the grant (the warm hold reads when its worker should be
    free), and ``weight``: how its grant moved the crossing credit (by ``weight *
    expected_runtime``: ``-(1 - share)`` for a crossing, ``share`` for a grant that deferred
    one, else 0).
    """

    grant: Grant
    worker: str
    grants: int
    c: float
    n: int
    expected_runtime: float = 0.0
    weight: float = 0.0
    queued: Job | None = None
    """The job as it was queued, when the grant carries another (its chosen model)."""

    @property
    def job(self) -> Job:
        """The job as queued (a take-back requeues it, a completion reports it)."""
        return self.grant.job if self.queued is None else self.queued


@attrs.define(eq=False)
class _Worker:
    name: str
    models: frozenset[str] | None
    resident: str | None
    slots: int
    slow: bool
    accepts: Callable[[Job], bool] | None
    last_seen: float
    timed_out: bool = False
    held: list[_Held] = attrs.field(factory=list)
    capabilities: Capabilities | None = None

    def serves(self, model: str | None) -> bool:
        return model is None or self.models is None or model in self.models

    def misfit(self, job: Job) -> str | None:
        """The first reason (docs/design/capabilities.md's order) the job does not fit, or None.

        Written from the note, by brute force: the job's model, then its accepted models,
        then each declared limit and feature in turn.
        """
        if not self.serves(job.model):
            return "model"
        needs = job.needs
        caps = self.capabilities
        if needs is None:
            return "undeclared" if caps is not None and caps.declared_only else None
        if needs.models and not any(self.serves(model) for model in needs.models):
            return "model"
        if caps is None:
            return None
        checks = [
            ("max_pixels", caps.max_pixels is not None and needs.pixels > caps.max_pixels),
            ("max_steps", caps.max_steps is not None and needs.steps > caps.max_steps),
            *((f, f in needs.features and f not in caps.features) for f in FEATURES),
            ("nsfw", needs.nsfw and not caps.nsfw),
            ("blacklist", any(word in needs.text.lower() for word in caps.blacklist)),
        ]
        return next((cause for cause, failed in checks if failed), None)

    def chosen(self, job: Job) -> Job:
        """The job as granted here: a multi-model job with the resident, else first served."""
        needs = job.needs
        if job.model is not None or needs is None or not needs.models:
            return job
        served = [model for model in needs.models if self.serves(model)]
        model = self.resident if self.resident in served else served[0]
        return attrs.evolve(job, model=model)

    def free_warm_for(self, model: str | None) -> bool:
        """Live, ``model`` loaded and served, and a free slot (the note's case 1)."""
        return self._warm(model) and len(self.held) < self.slots

    def busy_warm_for(self, model: str | None, now: float, hold: float) -> bool:
        """Live, ``model`` loaded and served, all slots held, and expected free in time.

        The first of its jobs expected to end does so within ``hold`` of ``now``, either way
        (the note's case 2).
        """
        if not self._warm(model) or len(self.held) < self.slots:
            return False
        ends = [h.grant.granted_at + h.expected_runtime for h in self.held]
        return now - hold < min(ends) <= now + hold

    def _warm(self, model: str | None) -> bool:
        return (
            not self.timed_out
            and model is not None
            and self.resident == model
            and self.serves(model)
        )


@attrs.frozen
class _Offer:
    """One lane's offer to a worker: the job it gives up, the terms of its key, its tie seq.

    The tie seq is the lane's own job's, whichever job the lane offers: its head's for a plain
    offer, its first job for the resident model's for an affinity offer.
    """

    level: int
    s: float
    head: Job
    entry: _Entry
    tier: float
    affinity: float
    lane: _Lane | None  # None without fair share
    tie: int


@attrs.define
class _LevelCounters:
    dispatched: int = 0
    total_wait: float = 0.0
    waits: list[float] = attrs.field(factory=list)
    reorders: dict[str, int] = attrs.field(
        factory=lambda: {
            "aging": 0,
            "affinity": 0,
            "tier": 0,
            "fair_share": 0,
            "deferred_crossings": 0,
        }
    )


@attrs.define
class _MemberCounters:
    dispatched: int = 0
    completed: int = 0
    gpu_seconds: float = 0.0


#: The default share of GPU time crossings may take (docs/design/dispatcher.md, "Share and
#: credit"). The model keeps its own copy of the note's numbers rather than importing the
#: engine's: a change in the engine then shows up as a disagreement.
DEFAULT_CROSSING_SHARE = 0.05

#: How many least-served lanes a crossing or a deferral chooses among (the same note).
LEAST_SERVED = 8

#: The largest magnitude of a time or duration (the note: larger ones lose aging's resolution).
MAX_MAGNITUDE = 1e15


def _finite(name: str, value: object) -> float:
    """``value`` as a float: a number (not a bool), finite, at most ``MAX_MAGNITUDE`` in size."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and abs(value) <= MAX_MAGNITUDE):
        raise ValueError(f"{name} must be finite and at most {MAX_MAGNITUDE} in size: {value!r}")
    return float(value)


def _takes_worker(fn: Callable[..., Any]) -> bool:
    """Whether ``lease_for`` takes ``(job, worker)`` rather than ``(job)``."""
    if isinstance(fn, LeaseCalculator):
        return False
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
    return varargs or len(positional) >= 2


class _Book:
    """Finding jobs, lanes and workers in the state, and the clock rule."""

    # The state (set by ReferenceFleet.__init__).
    _scorer: Scorer
    _policy: PriorityPolicy
    _divisor: float
    _charge: ChargeModel
    _lease_for: Callable[..., float] | None
    _lease_takes_worker: bool
    _max_queued: int | None
    _max_per_member: int | None
    _max_running: int | None
    _max_attempts: int
    _worker_timeout: float | None
    _warm_hold: float
    _load_seconds: dict[str, float]
    _fair_share: bool
    _track_reorders: bool
    _share: float
    _credit: float
    _buckets: tuple[float, ...]
    _lanes: dict[tuple[str, int], _Lane]
    _workers: dict[str, _Worker]
    _latest: float
    _seq: int
    _levels: dict[int, _LevelCounters]
    _members: dict[str, _MemberCounters]
    _runtimes: list[float]
    _recent_by_model: dict[str, list[float]]
    _recent_by_level: dict[int, list[float]]
    _counts: dict[str, int]

    # -- reading -----------------------------------------------------------------------------

    scorer = ReadOnly[Scorer]("_scorer", "The scorer.")
    policy = ReadOnly[PriorityPolicy]("_policy", "The priority policy.")

    @property
    def held(self) -> list[Grant]:
        """The grants of every held job, by grant time (then ``seq``)."""
        return [held.grant for held in self._held()]

    def workers(self) -> list[WorkerInfo]:
        """Every known worker's info (timed-out ones included), sorted by name."""
        return [self._info(self._workers[name]) for name in sorted(self._workers)]

    @property
    def capacity(self) -> int:
        """``N = max(1, live workers)``."""
        return max(1, sum(1 for w in self._workers.values() if not w.timed_out))

    def __len__(self) -> int:
        return len(self._queued())

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self._find(job_id) is not None

    def job(self, job_id: str) -> Job:
        """Return a queued or held job.

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        return self._found(job_id)[0]

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"`` (held by a worker).

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        return self._found(job_id)[1]

    def holder(self, job_id: str) -> str | None:
        """Return the name of the worker holding ``job_id``, or None when it is queued.

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        self._found(job_id)
        held = self._held_by_id(job_id)
        return None if held is None else held.worker

    def worker(self, name: str) -> WorkerInfo:
        """Return a known worker's info.

        Raises:
            UnknownWorker: The name was never joined, or has left.
        """
        return self._info(self._worker(name))

    def next_deadline(self) -> float | None:
        """The earliest held lease deadline or live worker's timeout, or None."""
        times = [h.grant.lease.deadline for h in self._held() if h.grant.lease is not None]
        if self._worker_timeout is not None:
            times += [
                w.last_seen + self._worker_timeout
                for w in self._workers.values()
                if not w.timed_out
            ]
        return min(times, default=None)

    def lane_jobs(self, member: str, level: int) -> tuple[Job, ...]:
        """Return the queued jobs of a lane in lane order (the head first).

        Args:
            member: The lane's member.
            level: The lane's level.

        Returns:
            The jobs; empty for a lane that is not backlogged.
        """
        lane = self._lanes.get((member, level))
        return () if lane is None else tuple(entry.job for entry in lane.jobs)

    def lane_start(self, member: str, level: int) -> float:
        """Return the virtual start ``s`` of a lane (``-inf`` for a lane never seen).

        Args:
            member: The lane's member.
            level: The lane's level.

        Returns:
            The lane's ``s`` (including the up-front charges of its held jobs); ``-inf``
            without fair share.
        """
        lane = self._lanes.get((member, level))
        return -math.inf if lane is None or not self._fair_share else lane.s

    def lane_held(self, member: str, level: int) -> float:
        """Return the up-front charges of a lane's held jobs (``held``; 0 for no lane).

        Args:
            member: The lane's member.
            level: The lane's level.

        Returns:
            The lane's ``held``.
        """
        lane = self._lanes.get((member, level))
        return 0.0 if lane is None else lane.held

    def _info(self, worker: _Worker) -> WorkerInfo:
        return worker_info(worker, tuple(held.job.id for held in worker.held))

    def _worker(self, name: str) -> _Worker:
        worker = self._workers.get(name)
        if worker is None:
            raise UnknownWorker(f"unknown worker {name!r}")
        return worker

    def _time(self, now: float) -> float:
        """Check ``now``: finite and not earlier than the latest call that succeeded."""
        value = _finite("now", now)
        if value < self._latest:
            raise ValueError(f"time went backwards: now={now!r} < {self._latest!r}")
        return value

    @contextmanager
    def _at(self, now: float) -> Iterator[float]:
        """Check ``now`` (``_time``); it becomes the latest time when the block succeeds.

        A call that raises, in the check or in the block, leaves the latest time as it was.
        """
        checked = self._time(now)
        yield checked
        self._latest = checked

    def _queued(self) -> list[_Entry]:
        return [entry for lane in self._lanes.values() for entry in lane.jobs]

    def _held(self) -> list[_Held]:
        held = [h for worker in self._workers.values() for h in worker.held]
        return sorted(held, key=lambda h: (h.grant.granted_at, h.job.seq))

    def _held_by_id(self, job_id: str) -> _Held | None:
        return next((h for h in self._held() if h.job.id == job_id), None)

    def _find(self, job_id: str) -> tuple[Job, JobState] | None:
        held = self._held_by_id(job_id)
        if held is not None:
            return held.job, "running"
        for entry in self._queued():
            if entry.job.id == job_id:
                return entry.job, "queued"
        return None

    def _found(self, job_id: str) -> tuple[Job, JobState]:
        """``_find``, or ``UnknownJob`` when the id is neither queued nor held."""
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return found

    def _held_for(self, job_id: str, worker: str | None) -> _Held:
        """The held job ``job_id``, reported by ``worker`` (None: whoever holds it)."""
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        held = self._held_by_id(job_id)
        if held is None:
            raise InvalidState(f"job {job_id!r} is queued, not held by a worker")
        if worker is not None and worker != held.worker:
            raise InvalidState(f"job {job_id!r} is held by {held.worker!r}, not {worker!r}")
        return held

    def _lane_of(self, job: Job) -> _Lane:
        return self._lanes[(job.member, job.priority)]

    def _retry_after(self) -> float:
        recent = self._runtimes[-64:]
        return max(1.0, math.fsum(recent) / len(recent)) if recent else 30.0
