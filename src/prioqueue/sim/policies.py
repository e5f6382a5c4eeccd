"""The policies the simulator compares: two baselines and the dispatcher's configurations.

Theory of operation
-------------------
Every policy is a queue with the dispatcher's protocol (:class:`SimQueue`): ``submit``,
``dispatch``, ``complete``, ``cancel``, ``expire``, ``next_deadline``. The full policy and its
ablations are the real :class:`~prioqueue.dispatcher.SizeOneDispatcher` configured
differently; the two baselines are small classes that live here, never in the core:

* ``fifo``: arrival order, as llama-swap serves requests today.
* ``strict``: priority levels only, FIFO inside a level (no tiers, aging, affinity or fair
  share).
* ``warm-first``: the oldest job for the loaded model, else the oldest job (Ray Serve's
  model-multiplexing rule; see :mod:`prioqueue.sim.fleet_policies`, which also holds the
  fleet versions of the baselines).
* ``prioqueue``: the full policy (bands, tiers, affinity, aging and per-member fair share).
* ``no-aging``: a divisor so large that aging never matters (1e9 seconds per point).
* ``no-affinity``: ``max_affinity = 0``.
* ``no-fair-share``: ``fair_share=False`` (every job ages from its own arrival).

A :class:`PolicySpec` names a policy and its parameters; ``parse_spec("prioqueue:divisor=30")``
makes a variant, so several divisors can run side by side on the same arrivals.
"""

from __future__ import annotations

import abc
import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, Protocol

import attrs

from prioqueue._core import DEFAULT_CROSSING_SHARE
from prioqueue._errors import ConfigError, InvalidState, UnknownJob
from prioqueue.lifecycle import LevelBudget
from prioqueue.priority import DEFAULT_ALIASES
from prioqueue.scoring import DEFAULT_TIER_BONUSES, Scorer, ScoringConfig

__all__ = [
    "ABLATIONS",
    "BASELINES",
    "DEFAULT_POLICIES",
    "NO_AGING_DIVISOR",
    "POLICY_KINDS",
    "FifoQueue",
    "PolicyParams",
    "PolicySpec",
    "SimQueue",
    "StrictQueue",
    "build_queue",
    "parse_spec",
    "reorder_counts",
]

NO_AGING_DIVISOR = 1e9
"""The aging divisor of the ``no-aging`` ablation: one point every 31 years."""

BASELINES = ("fifo", "strict", "warm-first")
POLICY_KINDS = (
    "fifo",
    "strict",
    "warm-first",
    "prioqueue",
    "no-aging",
    "no-affinity",
    "no-fair-share",
)
DEFAULT_POLICIES = ("fifo", "strict", "prioqueue")
"""What a report compares unless told otherwise: the two baselines and the full policy."""
ABLATIONS = ("no-aging", "no-affinity", "no-fair-share")
"""The full policy with one term switched off each (``--ablations``)."""

_MAX_ATTEMPTS = 3


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
    """What the engine reads from an expired lease."""

    @property
    def job(self) -> JobLike: ...

    @property
    def requeued(self) -> bool: ...


class SimQueue(Protocol):
    """The part of ``SizeOneDispatcher``'s API the simulator drives."""

    def submit(  # noqa: D102
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
    ) -> object: ...

    def dispatch(self, now: float) -> GrantLike | None: ...  # noqa: D102

    def complete(  # noqa: D102
        self, job_id: str, *, now: float, runtime: float | None = None
    ) -> object: ...

    def cancel(self, job_id: str, *, now: float) -> object: ...  # noqa: D102

    def expire(self, now: float) -> Sequence[ExpiredLike]: ...  # noqa: D102

    def next_deadline(self) -> float | None: ...  # noqa: D102

    def __len__(self) -> int: ...


# --------------------------------------------------------------------------- baselines


class _Job:
    """A baseline's job (one GPU or a fleet; ``worker``/``deadline`` are the fleet's)."""

    __slots__ = (
        "arrival",
        "attempt",
        "deadline",
        "id",
        "member",
        "model",
        "priority",
        "queued",
        "seq",
        "worker",
    )

    def __init__(
        self, job_id: str, member: str, priority: int, model: str | None, arrival: float, seq: int
    ) -> None:
        self.id = job_id
        self.member = member
        self.priority = priority
        self.model = model
        self.arrival = arrival
        self.seq = seq
        self.attempt = 0
        self.queued = True
        self.worker: str | None = None
        self.deadline: float | None = None


class _Grant:
    __slots__ = ("attempt", "job", "worker")

    def __init__(self, job: _Job, attempt: int, worker: str | None = None) -> None:
        self.job = job
        self.attempt = attempt
        self.worker = worker


class _Expired:
    __slots__ = ("job", "requeued")

    def __init__(self, job: _Job, requeued: bool) -> None:
        self.job = job
        self.requeued = requeued


class _JobBook(abc.ABC):
    """What every baseline (one GPU or a fleet) keeps: jobs by id and the queued count.

    Subclasses file a queued job with ``_push`` (at the head of its queue when ``requeue``).
    """

    def __init__(self) -> None:
        self._jobs: dict[str, _Job] = {}
        self._queued = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._queued

    @abc.abstractmethod
    def _push(self, job: _Job, *, requeue: bool) -> None:
        """File a queued job (at the head of its queue when ``requeue``)."""

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
    ) -> object:
        """Queue a job (``priority`` must already be a number). O(log n).

        Raises:
            TypeError: ``priority`` is not an int.
        """
        if not isinstance(priority, int):
            raise TypeError(f"baselines take numeric priorities, got {priority!r}")
        job = _Job(job_id, member, priority, model, now, self._seq)
        self._seq += 1
        self._jobs[job_id] = job
        self._queued += 1
        self._push(job, requeue=False)
        return job

    def _lease_ran_out(self, job: _Job) -> _Expired:
        """Requeue a job whose lease ran out, or fail it after ``_MAX_ATTEMPTS`` grants."""
        if job.attempt >= _MAX_ATTEMPTS:
            del self._jobs[job.id]
            return _Expired(job, False)
        job.queued = True
        self._queued += 1
        self._push(job, requeue=True)
        return _Expired(job, True)


class _Baseline(_JobBook):
    """Shared bookkeeping of the baselines: jobs by id, the running job and its lease.

    Subclasses decide the order: ``_push`` files a job, ``_pop`` takes the next one.
    """

    def __init__(self, lease_for: Callable[[Any], float] | None = None) -> None:
        super().__init__()
        self._running: _Job | None = None
        self._deadline: float | None = None
        self._lease_for = lease_for

    @abc.abstractmethod
    def _pop(self) -> _Job | None:
        """Take the next job to run, or None when none is queued."""

    def dispatch(self, now: float) -> _Grant | None:
        """Grant the next queued job when nothing runs."""
        if self._running is not None or not self._queued:
            return None
        job = self._pop()
        while job is not None and not job.queued:  # lazily deleted (cancelled) entries
            job = self._pop()
        if job is None:  # pragma: no cover - the count says a live job exists
            raise AssertionError("queued count out of step")
        self._queued -= 1
        job.queued = False
        job.attempt += 1
        self._running = job
        self._deadline = None if self._lease_for is None else now + self._lease_for(job)
        return _Grant(job, job.attempt)

    def complete(self, job_id: str, *, now: float, runtime: float | None = None) -> object:
        """Finish the running job."""
        job = self._running
        if job is None or job.id != job_id:
            raise InvalidState(f"job {job_id!r} is not running")
        self._running = None
        self._deadline = None
        del self._jobs[job_id]
        return job

    def cancel(self, job_id: str, *, now: float) -> object:
        """Drop a queued or running job."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        if job is self._running:
            self._running = None
            self._deadline = None
        else:
            job.queued = False
            self._queued -= 1
        return job

    def expire(self, now: float) -> list[_Expired]:
        """Requeue (or fail) the running job when its lease ran out."""
        job = self._running
        if job is None or self._deadline is None or now < self._deadline:
            return []
        self._running = None
        self._deadline = None
        return [self._lease_ran_out(job)]

    def next_deadline(self) -> float | None:
        """The running job's lease deadline, or None."""
        return self._deadline


class FifoQueue(_Baseline):
    """Arrival order, whatever the priority: llama-swap today. A requeued job goes first.

    Args:
        lease_for: Seconds of lease for a granted job, or None for no leases.
    """

    def __init__(self, lease_for: Callable[[Any], float] | None = None) -> None:
        super().__init__(lease_for)
        self._fifo: deque[_Job] = deque()

    def _push(self, job: _Job, *, requeue: bool) -> None:
        if requeue:
            self._fifo.appendleft(job)
        else:
            self._fifo.append(job)

    def _pop(self) -> _Job | None:
        return self._fifo.popleft() if self._fifo else None


class StrictQueue(_Baseline):
    """Highest priority level first, FIFO inside a level; nothing else.

    Args:
        lease_for: Seconds of lease for a granted job, or None for no leases.
    """

    def __init__(self, lease_for: Callable[[Any], float] | None = None) -> None:
        super().__init__(lease_for)
        self._heap: list[tuple[int, int, _Job]] = []

    def _push(self, job: _Job, *, requeue: bool) -> None:
        # A requeued job keeps its submission order, so it is the oldest of its level again.
        heapq.heappush(self._heap, (-job.priority, job.seq, job))

    def _pop(self) -> _Job | None:
        return heapq.heappop(self._heap)[2] if self._heap else None


# --------------------------------------------------------------------------- specs


Charge = Literal["runtime", "estimate"] | float


def _freeze(value: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(value))


def budget_level(key: object, where: str) -> int:
    """Return the level a budget names: an integer or ``interactive``/``normal``/``batch``.

    Raises:
        ConfigError: Neither (the message names ``where``).
    """
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    text = str(key).strip().lower()
    if text in DEFAULT_ALIASES:
        return DEFAULT_ALIASES[text]
    try:
        return int(text)
    except ValueError:
        names = ", ".join(DEFAULT_ALIASES)
        raise ConfigError(f"{where}: level must be an integer or {names}, got {key!r}") from None


def _budgets(value: Mapping[Any, Any]) -> Mapping[int, LevelBudget]:
    """Queue budgets by level: ``LevelBudget`` values or their TOML tables (keys may be text).

    Raises:
        ConfigError: A level is not an integer, or a budget is malformed (names the key).
    """
    out: dict[int, LevelBudget] = {}
    for key, given in dict(value).items():
        level = budget_level(key, "budgets")
        budget = (
            given
            if isinstance(given, LevelBudget)
            else LevelBudget.from_mapping(given, where=f"budgets.{level}")
        )
        if not budget.empty:
            out[level] = budget
    return MappingProxyType(out)


@attrs.frozen
class PolicyParams:
    """The dispatcher parameters a policy runs with (see ``ScoringConfig``).

    Attributes:
        band_spacing: Distance between distinct levels.
        tier_bonuses: Tier name to bonus.
        max_affinity: The largest swap-affinity bonus.
        aging_divisor: Seconds of waiting per point.
        affinity_by_model: Per-model affinity (each at most ``max_affinity``).
        charge: ``"runtime"``, ``"estimate"`` or a number of seconds per job.
        fair_share: Per-member fair share inside a level.
        warm_hold: Placement: seconds a job may be kept for a warm worker (free, or busy and
            expected to start it within that time) before a cold one may take it
            (``FleetDispatcher(warm_hold=...)``; only a fleet uses it, 0 turns it off; 120 s
            from the ``fleet-night`` sweep in docs/simulator.md).
        crossing_share: The share of GPU time crossings may take from a higher level
            (``SizeOneDispatcher(crossing_share=...)``; 1 never defers a crossing).
        budgets: Overload protection per level (``LevelBudget(max_queued=, max_wait=,
            ttl=)``, docs/design/lifecycle.md); none by default. Only the dispatcher's
            policies apply them (the baselines run unprotected).
    """

    band_spacing: float = 100
    tier_bonuses: Mapping[str, float] = attrs.field(
        default=DEFAULT_TIER_BONUSES, converter=_freeze, eq=False
    )
    max_affinity: float = 10
    aging_divisor: float = 60.0
    affinity_by_model: Mapping[str, float] = attrs.field(factory=dict, converter=_freeze, eq=False)
    charge: Charge = "runtime"
    fair_share: bool = True
    warm_hold: float = 120.0
    crossing_share: float = DEFAULT_CROSSING_SHARE
    budgets: Mapping[int, LevelBudget] = attrs.field(factory=dict, converter=_budgets, eq=False)

    def scoring_config(self) -> ScoringConfig:
        """Return the :class:`ScoringConfig` of these parameters.

        Raises:
            ConfigError: The parameters break the scoring rules (band spacing, ranges).
        """
        return ScoringConfig(
            band_spacing=self.band_spacing,
            tier_bonuses=self.tier_bonuses,
            max_affinity=self.max_affinity,
            aging_divisor=self.aging_divisor,
            affinity_by_model=self.affinity_by_model,
        )

    def as_dict(self) -> dict[str, Any]:
        """Return the parameters as JSON-serialisable values (``budgets`` only when set)."""
        out: dict[str, Any] = {
            "band_spacing": self.band_spacing,
            "tier_bonuses": dict(self.tier_bonuses),
            "max_affinity": self.max_affinity,
            "aging_divisor": self.aging_divisor,
            "affinity_by_model": dict(self.affinity_by_model),
            "charge": self.charge,
            "fair_share": self.fair_share,
            "warm_hold": self.warm_hold,
            "crossing_share": self.crossing_share,
        }
        if self.budgets:
            out["budgets"] = {
                str(level): {k: v for k, v in attrs.asdict(b).items() if v is not None}
                for level, b in sorted(self.budgets.items())
            }
        return out


_KEY_ALIASES = {
    "divisor": "aging_divisor",
    "d": "aging_divisor",
    "aging_divisor": "aging_divisor",
    "spacing": "band_spacing",
    "band_spacing": "band_spacing",
    "affinity": "max_affinity",
    "max_affinity": "max_affinity",
    "charge": "charge",
    "fair_share": "fair_share",
    "warm_hold": "warm_hold",
    "hold": "warm_hold",
    "crossing_share": "crossing_share",
    "share": "crossing_share",
}


@attrs.frozen
class PolicySpec:
    """One policy of a comparison: a label, a kind and its parameters.

    Attributes:
        label: The name shown in the report (the spec as written).
        kind: One of :data:`POLICY_KINDS`.
        params: The parameters (the ablation's change already applied).
    """

    label: str
    kind: str
    params: PolicyParams

    @property
    def is_baseline(self) -> bool:
        """True for ``fifo``, ``strict`` and ``warm-first`` (they ignore the parameters)."""
        return self.kind in BASELINES


def _ablate(kind: str, params: PolicyParams) -> PolicyParams:
    if kind == "no-aging":
        return attrs.evolve(params, aging_divisor=NO_AGING_DIVISOR)
    if kind == "no-affinity":
        return attrs.evolve(params, max_affinity=0, affinity_by_model={})
    if kind == "no-fair-share":
        return attrs.evolve(params, fair_share=False)
    return params


BUDGET_KEYS = ("max_queued", "max_wait", "ttl")
"""The fields of a level's queue budget (``max_wait.LEVEL=`` in a spec, ``--budget``)."""


def _budget_override(
    params: PolicyParams, field: str, level_text: str, text: str, spec: str
) -> PolicyParams:
    """Set one field of one level's budget (``max_wait.2=60``)."""
    level = budget_level(level_text, f"policy {spec!r}: {field}.LEVEL")
    try:
        value: float | int = int(text) if field == "max_queued" else float(text)
    except ValueError:
        kind = "an integer" if field == "max_queued" else "a number of seconds"
        raise ConfigError(f"policy {spec!r}: {field} must be {kind}, got {text!r}") from None
    old = params.budgets.get(level, LevelBudget())
    fields: dict[str, Any] = {field: value}
    try:
        budget = attrs.evolve(old, **fields)
    except ConfigError as exc:
        raise ConfigError(f"policy {spec!r}: level {level}: {exc}") from None
    return attrs.evolve(params, budgets={**params.budgets, level: budget})


def _override(params: PolicyParams, key: str, text: str, spec: str) -> PolicyParams:
    prefix, dot, name = key.strip().partition(".")
    if dot and prefix.replace("-", "_") in BUDGET_KEYS:
        return _budget_override(params, prefix.replace("-", "_"), name.strip(), text.strip(), spec)
    if dot and prefix in ("tier", "affinity") and name.strip():
        try:
            number = float(text)
        except ValueError:
            raise ConfigError(f"policy {spec!r}: {key} must be a number, got {text!r}") from None
        if prefix == "tier":
            return attrs.evolve(params, tier_bonuses={**params.tier_bonuses, name.strip(): number})
        return attrs.evolve(
            params, affinity_by_model={**params.affinity_by_model, name.strip(): number}
        )
    field = _KEY_ALIASES.get(key.strip().lower().replace("-", "_"))
    if field is None:
        known = ", ".join(
            [*sorted(_KEY_ALIASES), "tier.NAME", "affinity.MODEL"]
            + [f"{k}.LEVEL" for k in BUDGET_KEYS]
        )
        raise ConfigError(f"policy {spec!r}: unknown parameter {key!r}; known: {known}")
    value: Any
    text = text.strip()
    if field == "fair_share":
        if text.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ConfigError(f"policy {spec!r}: fair_share must be true or false, got {text!r}")
        value = text.lower() in ("true", "1", "yes", "on")
    elif field == "charge" and text in ("runtime", "estimate"):
        value = text
    else:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"policy {spec!r}: {field} must be a number, got {text!r}") from None
    return attrs.evolve(params, **{field: value})


def parse_spec(spec: str, base: PolicyParams | None = None) -> PolicySpec:
    """Parse ``KIND`` or ``KIND:key=value,key=value`` into a :class:`PolicySpec`.

    Keys: ``aging_divisor`` (``divisor``, ``d``), ``band_spacing`` (``spacing``),
    ``max_affinity`` (``affinity``), ``charge``, ``fair_share``, ``warm_hold`` (``hold``,
    fleets only), ``crossing_share`` (``share``), ``tier.NAME`` (one tier's bonus),
    ``affinity.MODEL`` (one model's affinity) and ``max_wait.LEVEL``, ``max_queued.LEVEL``,
    ``ttl.LEVEL`` (that level's queue budget). The ablation's change is
    applied after the overrides (``no-aging:divisor=30`` still does not age).

    Args:
        spec: The policy as written on the command line.
        base: The parameters the overrides apply to (default ``PolicyParams()``).

    Returns:
        The spec, its label being ``spec`` itself.

    Raises:
        ConfigError: An unknown kind or parameter, or a malformed value.
    """
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in POLICY_KINDS:
        raise ConfigError(f"unknown policy {kind!r}; known: {', '.join(POLICY_KINDS)}")
    params = base if base is not None else PolicyParams()
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"policy {spec!r}: expected key=value, got {item!r}")
        params = _override(params, key, value, spec)
    params = _ablate(kind, params)
    if kind not in BASELINES:
        params.scoring_config()  # check the band-spacing invariant now, with a clear message
        _check_charge(params.charge, spec)
        _check_hold(params.warm_hold, spec)
        if not 0 < params.crossing_share <= 1:
            raise ConfigError(
                f"policy {spec!r}: crossing_share must lie in (0, 1], got {params.crossing_share!r}"
            )
    return PolicySpec(label=spec.strip(), kind=kind, params=params)


def _check_charge(charge: Charge, spec: str) -> None:
    if isinstance(charge, str):
        if charge not in ("runtime", "estimate"):
            raise ConfigError(f"policy {spec!r}: charge must be runtime, estimate or a number")
    elif not charge > 0:
        raise ConfigError(f"policy {spec!r}: a numeric charge must be > 0, got {charge!r}")


def _check_hold(hold: float, spec: str) -> None:
    if not 0 <= hold < float("inf"):
        raise ConfigError(f"policy {spec!r}: warm_hold must be seconds >= 0, got {hold!r}")


def build_queue(spec: PolicySpec, lease_for: Callable[[Any], float] | None = None) -> SimQueue:
    """Make a fresh queue for ``spec``.

    Args:
        spec: The policy.
        lease_for: Seconds of lease for a granted job (given the job), or None.

    Returns:
        A baseline queue or a configured ``SizeOneDispatcher``.
    """
    if spec.kind == "fifo":
        return FifoQueue(lease_for)
    if spec.kind == "strict":
        return StrictQueue(lease_for)
    if spec.kind == "warm-first":
        from prioqueue.sim.fleet_policies import build_pull_baseline
        from prioqueue.sim.workers import fleet_of

        rule = None if lease_for is None else (lambda job, _name: lease_for(job))
        return build_pull_baseline("warm-first", fleet_of(1), rule)
    from prioqueue.dispatcher import SizeOneDispatcher

    params = spec.params
    return SizeOneDispatcher(
        Scorer(params.scoring_config()),
        charge=params.charge,
        lease_for=lease_for,
        fair_share=params.fair_share,
        crossing_share=params.crossing_share,
        max_attempts=_MAX_ATTEMPTS,
        budgets=params.budgets or None,
    )


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
