"""The records of :class:`~prioqueue.testing.ReferenceFleet` and the model's numbers (private).

Plain mutable records (queued entries, lanes, held jobs, workers, offers, counters), each
changed only through its own methods, and the design notes' numbers the model keeps its own
copy of. The owners that keep these records live in ``_lanes``, ``_workers``, ``_stats`` and
``_lifecycle``; the rules that read them in ``_rules``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, Literal

import attrs

from prioqueue._batch import Narrowable
from prioqueue.capabilities import FEATURES, Capabilities
from prioqueue.lease import LeaseCalculator
from prioqueue.records import REORDER_CAUSES, Grant, Job

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
class Entry:
    """A queued job: the job, when it entered the queue, and its grants so far."""

    job: Job
    queued_at: float
    grants: int = 0


@attrs.define(eq=False)
class Lane:
    """A lane: ``s = settled + held`` while it has held jobs, else ``s = settled``."""

    member: str
    level: int
    settled: float = -math.inf
    held: float = 0.0
    holding: int = 0
    jobs: list[Entry] = attrs.field(factory=list)

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

    def lift(self, at: float, floor: float) -> None:
        """The lift of an idle lane that gets a job at ``at``: ``settled = max(settled, min)``."""
        self.settled = max(self.settled, min(at, floor))

    def settle(self, charge: float, n: int, now: float) -> None:
        """A completion's correction: ``settled = min(settled + charge / n, now)``."""
        self.settled = min(self.settled + charge / n, now)

    def anchor(self, now: float) -> None:
        """Re-anchor the lane at ``now`` (it is alone at its level)."""
        self.settled = now

    def append(self, entry: Entry) -> None:
        """Queue ``entry`` at the lane's tail."""
        self.jobs.append(entry)

    def put_first(self, entry: Entry) -> None:
        """Queue ``entry`` at the lane's head (a job taken back)."""
        self.jobs.insert(0, entry)

    def remove(self, entry: Entry) -> None:
        """Take ``entry`` out of the lane (granted, or lapsed)."""
        self.jobs.remove(entry)

    def drop(self, job: Job) -> None:
        """Take ``job``'s entry out of the lane (cancelled or failed while queued)."""
        self.jobs = [entry for entry in self.jobs if entry.job is not job]


@attrs.define(eq=False)
class Held:
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
class Worker(Narrowable):
    """A joined worker: what it serves, what it has loaded, what it holds, when it was seen."""

    name: str
    models: frozenset[str] | None
    resident: str | None
    slots: int
    slow: bool
    accepts: Callable[[Job], bool] | None
    last_seen: float
    timed_out: bool = False
    held: list[Held] = attrs.field(factory=list)
    capabilities: Capabilities | None = None

    def succeed(self, before: Worker) -> None:
        """This record replaces ``before`` (a known worker joins again, revived).

        It keeps the jobs ``before`` holds, and its resident model when this join names none.
        """
        self.held = before.held
        if self.resident is None:
            self.resident = before.resident

    def revive(self, now: float) -> None:
        """Word from the worker: seen at ``now``, live again."""
        self.last_seen = now
        self.timed_out = False

    def seen_at(self, now: float) -> None:
        """Set when the worker was last heard from (nothing else)."""
        self.last_seen = now

    def time_out(self) -> None:
        """The worker was silent too long: it is no longer live."""
        self.timed_out = True

    def load(self, model: str | None) -> None:
        """Set the model the worker has loaded (None: nothing)."""
        self.resident = model

    def take(self, held: Held) -> None:
        """The worker holds a newly granted job."""
        self.held.append(held)

    def give_up(self, held: Held) -> None:
        """The worker no longer holds ``held`` (finished or taken back)."""
        self.held.remove(held)

    def serves(self, model: str | None) -> bool:
        """Whether the worker runs ``model`` (None: any worker does)."""
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
class Offer:
    """One lane's offer to a worker: the job it gives up, the terms of its key, its tie seq.

    The tie seq is the lane's own job's, whichever job the lane offers: its head's for a plain
    offer, its first job for the resident model's for an affinity offer.
    """

    level: int
    s: float
    head: Job
    entry: Entry
    tier: float
    affinity: float
    lane: Lane | None  # None without fair share
    tie: int


@attrs.define
class LevelCounters:
    """A level's grant counters: grants, their total wait, each wait, the reorder counts."""

    dispatched: int = 0
    total_wait: float = 0.0
    waits: list[float] = attrs.field(factory=list)
    reorders: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(REORDER_CAUSES, 0))

    def granted(self, waited: float) -> None:
        """A grant at the level, of a job that waited ``waited``."""
        self.dispatched += 1
        self.total_wait += waited
        self.waits.append(waited)

    def reordered(self, cause: str) -> None:
        """One more reorder of ``cause`` at the level."""
        self.reorders[cause] += 1


@attrs.define
class MemberCounters:
    """A member's counters: grants, completions and GPU seconds charged."""

    dispatched: int = 0
    completed: int = 0
    gpu_seconds: float = 0.0

    def granted(self) -> None:
        """One more grant of the member's."""
        self.dispatched += 1

    def completed_one(self) -> None:
        """One more completion of the member's."""
        self.completed += 1

    def charged(self, charge: float) -> None:
        """The member's GPU seconds grow by a finished run's charge."""
        self.gpu_seconds += charge


#: The default share of GPU time crossings may take (docs/design/dispatcher.md, "Share and
#: credit"). The model keeps its own copy of the note's numbers rather than importing the
#: engine's: a change in the engine then shows up as a disagreement.
DEFAULT_CROSSING_SHARE = 0.05

#: How many least-served lanes a crossing or a deferral chooses among (the same note).
LEAST_SERVED = 8

#: The largest magnitude of a time or duration (the note: larger ones lose aging's resolution).
MAX_MAGNITUDE = 1e15


def finite(name: str, value: object) -> float:
    """``value`` as a float: a number (not a bool), finite, at most ``MAX_MAGNITUDE`` in size."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and abs(value) <= MAX_MAGNITUDE):
        raise ValueError(f"{name} must be finite and at most {MAX_MAGNITUDE} in size: {value!r}")
    return float(value)


def takes_worker(fn: Callable[..., Any]) -> bool:
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


def takes(job: Job, model: str | None) -> bool:
    """Whether ``job`` runs on ``model``: its model, or one of several it accepts."""
    if job.model is not None:
        return job.model == model
    return job.needs is not None and model in job.needs.models
