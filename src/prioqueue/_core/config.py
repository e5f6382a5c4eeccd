"""The dispatchers' constants and validated constructor options (private).

``Config.checked(...)`` validates what ``FleetDispatcher(...)`` and ``SizeOneDispatcher(...)``
take (the arguments are documented on ``FleetDispatcher``) into one value that ``Core`` reads;
nothing else in the core validates a constructor argument. The constants here are the
defaults every layer shares (other packages import them from ``prioqueue._core``).
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

import attrs

from prioqueue._spec import LEVEL_LIMIT
from prioqueue._validate import checked_name, finite, limit, positive_or_none
from prioqueue._workers import _Worker
from prioqueue.errors import ConfigError
from prioqueue.lease import ImageRequest, LeaseCalculator, _request_source
from prioqueue.lease_values import _request_kwargs
from prioqueue.lifecycle import NO_BACKOFF, Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Job
from prioqueue.scoring import Scorer

__all__ = ["LEVEL_LIMIT"]  # private module; LEVEL_LIMIT is _spec's, re-exported

#: Upper bounds (seconds) of the grant-wait histogram in ``Stats``; the last bucket is +inf.
DEFAULT_WAIT_BUCKETS: tuple[float, ...] = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
)  # fmt: skip

#: ``QueueFull.retry_after`` when no completion has been seen yet (seconds).
DEFAULT_RETRY_AFTER = 30.0

#: The expected runtime of a job with no estimate and no recent runtime of its model or level.
DEFAULT_EXPECTED_RUNTIME = 60.0

#: The default byte budget of the dispatch history kept for ``explain``.
DEFAULT_HISTORY_BYTES = 4 * 1024 * 1024


#: The default share of GPU time that crossings (grants that aging carries across a band)
#: may take from a higher level while it has work waiting (chosen by the simulator's sweep;
#: see docs/design/dispatcher.md, "Bounded crossings").
DEFAULT_CROSSING_SHARE = 0.05

#: The overdue slack ``k`` (issue 26, fifth round; ``choose.overdue``): below the highest
#: level an overdue job goes before a fair-share choice that is not overdue itself while its
#: lane's ``s`` is at most ``k`` offsets ``(T + A) * d`` above its level's least-served lane
#: (one offsets before an overdue choice). A member over its share may run that far ahead of
#: a newcomer while its overdue jobs drain, so the fairness bound's width is
#: ``(k + 1) * N * (T + A) * d + 10 * K * C`` (docs/design/fleet.md, Theorem 2). Chosen by
#: the sweep on the tuning seeds (docs/design/dispatcher.md, "Issue 26, fifth round").
OVERDUE_SLACK = 4.0

#: How many of a level's least-served lanes a crossing or a deferral chooses among (by the
#: ranking's order): enough to find the worker's resident model among them, few enough to keep
#: a grant O(log n).
LEAST_SERVED = 8

#: How a finished job advances its lane's virtual start.
ChargeModel = Literal["runtime", "estimate"] | float | Callable[[Job, float], float]

RECENT = 64  # completions kept for the service rate and the forecasts
RECENT_PER_KEY = 8  # runtimes kept per model and per level for the expected charge


def _int_at_least(name: str, value: object, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def charge_function(charge: object) -> Callable[[Job, float], float]:
    """Turn a charge model into ``(job, runtime) -> seconds``; ConfigError for a bad one."""
    if charge == "runtime":
        return lambda job, runtime: runtime
    if charge == "estimate":
        return lambda job, runtime: runtime if job.estimate is None else job.estimate
    if isinstance(charge, (int, float)) and not isinstance(charge, bool):
        constant = float(charge)
        if not math.isfinite(constant) or constant <= 0:
            raise ConfigError(f"a constant charge must be a finite number > 0, got {charge!r}")
        return lambda job, runtime: constant
    if callable(charge):
        return cast("Callable[[Job, float], float]", charge)
    raise ConfigError(
        f"charge must be 'runtime', 'estimate', a number of seconds or a callable "
        f"(job, runtime) -> seconds, got {charge!r}"
    )


def _wait_buckets(wait_buckets: Sequence[float]) -> tuple[float, ...]:
    try:
        bounds = tuple(finite("wait_buckets", b) for b in wait_buckets)
    except (TypeError, ValueError):
        bounds = ()
    if not bounds or bounds[0] <= 0 or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ConfigError(
            f"wait_buckets must be finite positive bounds in increasing order, got {wait_buckets!r}"
        )
    return bounds


def _crossing_share(crossing_share: object) -> float:
    share = (
        crossing_share
        if isinstance(crossing_share, (int, float)) and not isinstance(crossing_share, bool)
        else math.nan
    )
    if not 0 < share <= 1:
        raise ConfigError(
            f"crossing_share must be a number in (0, 1] (1: crossings are never deferred), "
            f"got {crossing_share!r}"
        )
    return float(share)


def checked_budgets(budgets: object) -> dict[int, LevelBudget]:
    """The per-level budgets as a dict; ``ConfigError`` naming the level that is wrong."""
    if budgets is None:
        return {}
    if not isinstance(budgets, Mapping):
        raise ConfigError(f"budgets must be a mapping level -> LevelBudget, got {budgets!r}")
    checked: dict[int, LevelBudget] = {}
    for level, budget in budgets.items():
        if not isinstance(level, int) or isinstance(level, bool):
            raise ConfigError(f"budgets: a level must be an int, got {level!r}")
        if not isinstance(budget, LevelBudget):
            raise ConfigError(f"budgets[{level}] must be a LevelBudget, got {budget!r}")
        if not budget.empty:
            checked[level] = budget
    return checked


def checked_load_seconds(value: object) -> dict[str, float]:
    """Check ``load_seconds``: None, or a mapping of model names to finite seconds >= 0."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"load_seconds must be a mapping of model name to seconds (or None), got {value!r}"
        )
    loads: dict[str, float] = {}
    for model, seconds in value.items():
        try:
            name = checked_name("load_seconds model", model)
            number = finite(f"load_seconds[{model!r}]", seconds)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if number < 0:
            raise ConfigError(f"load_seconds[{model!r}] must be seconds >= 0, got {seconds!r}")
        loads[name] = number
    return loads


#: ``(job, worker) -> seconds``: the dispatcher's lease function after adaptation.
LeaseFunction = Callable[[Job, _Worker], float]


def lease_function(lease_for: object) -> LeaseFunction | None:
    """Adapt ``lease_for`` to ``(job, worker) -> seconds``; the signature is read once.

    A :class:`~prioqueue.lease.LeaseCalculator` gets ``extra_slow_worker`` from the worker's
    ``slow`` flag; a callable that takes two positional arguments gets ``(job, WorkerInfo)``;
    any other callable gets ``(job)``.

    Raises:
        ConfigError: ``lease_for`` is not callable.
    """
    if lease_for is None:
        return None
    if not callable(lease_for):
        raise ConfigError(
            f"lease_for must be a callable job -> seconds, got {lease_for!r} (a fleet's may "
            "also take (job, worker_info))"
        )
    if isinstance(lease_for, LeaseCalculator):
        calculator = lease_for

        def calculated(job: Job, worker: _Worker) -> float:
            if not worker.slow:
                plain: int = calculator(job)
                return plain
            source = _request_source(job)
            if isinstance(source, ImageRequest):
                return float(calculator.for_request(attrs.evolve(source, extra_slow_worker=True)))
            kwargs = dict(_request_kwargs(source))
            kwargs["extra_slow_worker"] = True
            seconds: int = calculator.seconds(**kwargs)
            return seconds

        return calculated
    function: Callable[..., Any] = lease_for
    try:
        inspect.signature(function).bind(None, None)
    except (TypeError, ValueError):
        return lambda job, worker: function(job)
    return lambda job, worker: function(job, worker.info())


#: ``k``, the price of a swap in waiting (issue 26, docs/design/fleet.md, "Affinity as a priced
#: trade" and "Warm crossings"): on a fleet a model's affinity bonus is worth at most ``k *
#: load_seconds[model]`` seconds of aging, the waiting a job may be asked to pay so that a
#: worker keeps that model loaded (models without a known load time keep the scorer's bonus);
#: on one worker a warm crossing passes over a job only while that job waits less than ``k``
#: times the two loads a deferral costs (``starving.warm_crossing``).
AFFINITY_PRICE = 1.0


def priced_affinity(scorer: Scorer, load_seconds: Mapping[str, float]) -> Callable[[str], float]:
    """``model -> bonus``: the scorer's affinity, at most ``AFFINITY_PRICE * L(m) / d``. O(1)."""
    divisor = scorer.config.aging_divisor
    affinity = scorer.affinity

    def bonus(model: str) -> float:
        aff = affinity(model)
        load = load_seconds.get(model)
        if load is None:
            return aff
        return min(aff, AFFINITY_PRICE * load / divisor)

    return bonus


@attrs.frozen
class Config:
    """The validated constructor options of one dispatcher (private; see the module doc)."""

    scorer: Scorer
    policy: PriorityPolicy
    charge: Callable[[Job, float], float]
    plain_charge: bool  # the default model: expected and measured runtimes need no check
    lease_for: LeaseFunction | None
    max_queued: int | None
    max_member: int | None
    max_running: int | None
    max_attempts: int
    worker_timeout: float | None
    warm_hold: float
    load_seconds: Mapping[str, float]
    fair_share: bool
    track: bool
    share: float
    buckets: tuple[float, ...]
    history: int
    history_bytes: int
    budgets: dict[int, LevelBudget]
    backoff: Backoff
    name_in_grants: bool  # SizeOneDispatcher's grants (and snapshots) carry no worker
    priced: bool  # the load times price the affinity (a fleet's placement), not only warm crossings

    def priced_affinity(self) -> Callable[[str], float]:
        """``model -> bonus``: the scorer's affinity priced by ``load_seconds`` (see above).

        A ``SizeOneDispatcher``'s load times price only its warm crossing (``priced`` False):
        pricing the bonus serves placement, which one worker does not have.
        """
        return priced_affinity(self.scorer, self.load_seconds if self.priced else {})

    @classmethod
    def checked(
        cls, options: Mapping[str, Any], *, name_in_grants: bool = True, priced: bool = True
    ) -> Config:
        """Validate a constructor's arguments (``constructor_arguments(locals())``).

        The names and defaults are the public constructors' (``FleetDispatcher``; a
        ``SizeOneDispatcher`` has no worker options: their defaults apply).

        Raises:
            ConfigError: An option is out of range.
            TypeError: ``scorer`` or ``policy`` has the wrong type.
        """
        scorer = options["scorer"]
        policy = options["policy"]
        max_attempts = options["max_attempts"]
        history = options["history"]
        history_bytes = options["history_bytes"]
        worker_timeout = options.get("worker_timeout")
        warm_hold = options.get("warm_hold", 0.0)
        charge = options["charge"]
        backoff = options["backoff"]
        scorer = Scorer() if scorer is None else scorer
        if not isinstance(scorer, Scorer):
            raise TypeError(f"scorer must be a Scorer, got {type(scorer).__name__}")
        policy = PriorityPolicy() if policy is None else policy
        if not isinstance(policy, PriorityPolicy):
            raise TypeError(f"policy must be a PriorityPolicy, got {type(policy).__name__}")
        _int_at_least("max_attempts", max_attempts, 1)
        _int_at_least("history", history, 0)
        _int_at_least("history_bytes", history_bytes, 0)
        bounds = _wait_buckets(options["wait_buckets"])
        try:
            timeout = positive_or_none("worker_timeout", worker_timeout)
            hold = finite("warm_hold", warm_hold)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if hold < 0:
            raise ConfigError(f"warm_hold must be a number of seconds >= 0, got {warm_hold!r}")
        share = _crossing_share(options["crossing_share"])
        charge_fn = charge_function(charge)
        lease = lease_function(options["lease_for"])
        checked_queued = limit("max_queued", options["max_queued"])
        checked_member = limit("max_queued_per_member", options["max_queued_per_member"])
        checked_running = limit("max_running_per_member", options.get("max_running_per_member"))
        checked = checked_budgets(options["budgets"])
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigError(f"backoff must be a Backoff or None, got {backoff!r}")
        return cls(
            scorer=scorer,
            policy=policy,
            charge=charge_fn,
            plain_charge=isinstance(charge, str) and charge == "runtime",
            lease_for=lease,
            max_queued=checked_queued,
            max_member=checked_member,
            max_running=checked_running,
            max_attempts=max_attempts,
            worker_timeout=timeout,
            warm_hold=hold,
            load_seconds=checked_load_seconds(options.get("load_seconds")),
            fair_share=bool(options["fair_share"]),
            track=bool(options["track_reorders"]),
            share=share,
            buckets=bounds,
            history=history,
            history_bytes=history_bytes,
            budgets=checked,
            backoff=NO_BACKOFF if backoff is None else backoff,
            name_in_grants=name_in_grants,
            priced=priced,
        )


def constructor_arguments(frame: Mapping[str, Any]) -> dict[str, Any]:
    """A constructor's arguments by name: its ``locals()``, taken first, less ``self``."""
    return {name: value for name, value in frame.items() if name not in ("self", "__class__")}


def restored_options(state: Mapping[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The constructor options of ``restore``: ``fair_share`` (and the share) from ``state``.

    Raises:
        ValueError: ``state`` is not a mapping or lacks ``fair_share``.
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"invalid snapshot: expected a mapping, got {type(state).__name__}")
    try:
        options.setdefault("fair_share", bool(state["fair_share"]))
        if "crossing_share" in state:
            options.setdefault("crossing_share", state["crossing_share"])
    except KeyError as exc:
        raise ValueError(f"invalid snapshot: missing {exc}") from None
    return options
