"""The policies the simulator compares: two baselines and the dispatcher's configurations.

Theory of operation
-------------------
Every policy runs on a queue that the engine drives through one protocol
(:class:`~prioqueue.sim.queues.SimQueue`, built by :func:`~prioqueue.sim.queues.build_queue`).
The full policy and its ablations are the real dispatchers configured differently
(``SizeOneDispatcher`` on one GPU, ``FleetDispatcher`` on a fleet); the baselines are small
pull queues that live in :mod:`prioqueue.sim.baselines`, never in the core:

* ``fifo``: arrival order, as llama-swap serves requests today.
* ``strict``: priority levels only, FIFO inside a level (no tiers, aging, affinity or fair
  share).
* ``warm-first``: the oldest job for the loaded model, else the oldest job (Ray Serve's
  model-multiplexing rule).
* ``prioqueue``: the full policy (bands, tiers, affinity, aging and per-member fair share).
* ``no-aging``: a divisor so large that aging never matters (1e9 seconds per point).
* ``no-affinity``: ``max_affinity = 0``.
* ``no-fair-share``: ``fair_share=False`` (every job ages from its own arrival).

A :class:`PolicySpec` names a policy and its parameters; ``parse_spec("prioqueue:divisor=30")``
makes a variant, so several divisors can run side by side on the same arrivals.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import attrs

from prioqueue.dispatcher import DEFAULT_CROSSING_SHARE
from prioqueue.errors import ConfigError
from prioqueue.lifecycle import LevelBudget
from prioqueue.priority import DEFAULT_ALIASES
from prioqueue.scoring import DEFAULT_TIER_BONUSES, ScoringConfig
from prioqueue.sim.baselines import FifoQueue, StrictQueue

__all__ = [
    "ABLATIONS",
    "BASELINES",
    "DEFAULT_FLEET_POLICIES",
    "DEFAULT_POLICIES",
    "NO_AGING_DIVISOR",
    "POLICY_KINDS",
    "FifoQueue",
    "PolicyParams",
    "PolicySpec",
    "StrictQueue",
    "parse_spec",
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
DEFAULT_FLEET_POLICIES = ("fifo", "strict", "warm-first", "prioqueue")
"""What a fleet report compares unless told otherwise: three pull baselines and prioqueue."""
ABLATIONS = ("no-aging", "no-affinity", "no-fair-share")
"""The full policy with one term switched off each (``--ablations``)."""

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
