"""One score per waiting job: band + tier bonus + swap affinity + aging.

Theory of operation
-------------------
The dispatcher runs one job at a time and, whenever the GPU frees up, picks the waiting job
with the highest *effective* score::

    effective = band + tier_bonus + swap_affinity + aging

* **band** is the job's priority number itself (0 normal, +100 interactive, -100 batch;
  see :mod:`prioqueue.priority`).
* **tier_bonus** (default 0 free / 1 pro / 2 max) orders members *within* a band.
* **swap_affinity** (0 up to ``max_affinity``, default 10) favours a job whose model is
  already resident, so strict priority does not force a cold load on every dispatch. It may
  be graded per model by how much a cold load of that model costs (``affinity_by_model``).
* **aging** = ``waited_seconds / aging_divisor`` is unbounded on purpose: it is the one term
  allowed to cross bands, so a batch job that waits long enough eventually runs.

Bounded offsets express policy, unbounded aging prevents starvation. The two bounded terms
must never promote a job across a band, which is the **band-spacing invariant**, enforced
when a :class:`ScoringConfig` is made::

    band_spacing > max(tier_bonuses) + max_affinity

``band_spacing`` is the smallest distance between priorities that are meant to be distinct
(100 with the built-in levels). With equal waits, a job whose band is at least one spacing
higher always scores strictly higher, whatever the two jobs' tiers and affinities.

"Overtake" means *strictly greater score*: equal scores are a tie, broken elsewhere (by the
dispatcher's fair-share and arrival order), never by this module.

Complexity: every operation is O(1) except building a :class:`ScoringConfig`, which is
linear in the number of tiers and graded models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, TypeGuard

import attrs

from prioqueue.errors import ConfigError

__all__ = ["DEFAULT_TIER_BONUSES", "ScoreBreakdown", "Scorer", "ScoringConfig"]

DEFAULT_TIER_BONUSES: Final[Mapping[str, float]] = MappingProxyType({"free": 0, "pro": 1, "max": 2})
"""The built-in subscription tiers and their bonuses (read-only)."""

_INF: Final = math.inf


def _fmt(value: object) -> str:
    """Format a number for a message: integral values without ``.0``, others by ``repr``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


def _is_real(value: object) -> TypeGuard[float]:
    """Return whether ``value`` is an int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _check_offset(field: str, name: object, value: object) -> None:
    """Check one tier bonus or per-model affinity: a name and a finite number >= 0."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{field}: name {name!r} must be a non-empty string")
    if not _is_real(value) or not _is_finite(value) or value < 0:
        raise ConfigError(f"{field}: value of {name!r} must be a finite number >= 0, got {value!r}")


def _freeze(field: str, value: object) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{field} must be a mapping of name to number, got {type(value).__name__}"
        )
    for name, number in value.items():
        _check_offset(field, name, number)
    return MappingProxyType(dict(value))


def _freeze_tier_bonuses(value: Mapping[str, float]) -> Mapping[str, float]:
    """Attrs converter: validate the tier bonuses and return a read-only copy."""
    return _freeze("tier_bonuses", value)


def _freeze_affinities(value: Mapping[str, float]) -> Mapping[str, float]:
    """Attrs converter: validate the per-model affinities and return a read-only copy."""
    return _freeze("affinity_by_model", value)


def _mapping_repr(mapping: Mapping[str, float]) -> str:
    return repr(dict(mapping))


def _positive_finite(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_real(value) or not _is_finite(value) or value <= 0:
        raise ConfigError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def _non_negative_finite(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_real(value) or not _is_finite(value) or value < 0:
        raise ConfigError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


@attrs.frozen
class ScoringConfig:
    """The weights of the score, checked against the band-spacing invariant when made.

    Example:
        >>> ScoringConfig().max_offset
        12
        >>> ScoringConfig(band_spacing=12)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        prioqueue.errors.ConfigError: band_spacing (12) must be greater than ... = 12, ...

    Attributes:
        band_spacing: The distance between adjacent priority levels that are meant to be
            distinct (default 100). A job's band is its priority number; this says how far
            apart the levels you use are. Finite and > 0.
        tier_bonuses: Tier name to bonus (default ``{"free": 0, "pro": 1, "max": 2}``),
            stored read-only. Names non-empty strings (case-sensitive); bonuses finite and
            >= 0. May be empty (then every tier bonus must be 0).
        max_affinity: The largest swap-affinity bonus (default 10); finite and >= 0.
        aging_divisor: Seconds of waiting per point of aging (default 60: one point a
            minute); finite and > 0.
        affinity_by_model: Optional per-model swap-affinity bonus, graded by the model's
            cold-load cost (default empty). Each value within ``[0, max_affinity]``; models
            not listed get ``max_affinity``. Stored read-only.

    Raises:
        ConfigError: A field breaks the rules above, or the band-spacing invariant
            ``band_spacing > max_tier_bonus + max_affinity`` does not hold. The message
            names the fields, their values and the rule.
    """

    band_spacing: float = attrs.field(default=100, validator=_positive_finite)
    tier_bonuses: Mapping[str, float] = attrs.field(
        default=DEFAULT_TIER_BONUSES,
        converter=_freeze_tier_bonuses,
        hash=False,
        repr=_mapping_repr,
    )
    max_affinity: float = attrs.field(default=10, validator=_non_negative_finite)
    aging_divisor: float = attrs.field(default=60.0, validator=_positive_finite)
    affinity_by_model: Mapping[str, float] = attrs.field(
        factory=dict, converter=_freeze_affinities, hash=False, repr=_mapping_repr
    )

    def __attrs_post_init__(self) -> None:
        for model, value in self.affinity_by_model.items():
            if value > self.max_affinity:
                raise ConfigError(
                    f"affinity_by_model: value of {model!r} ({_fmt(value)}) must not exceed "
                    f"max_affinity ({_fmt(self.max_affinity)})"
                )
        if not self.band_spacing > self.max_offset:
            raise ConfigError(
                f"band_spacing ({_fmt(self.band_spacing)}) must be greater than the largest "
                f"tier bonus ({_fmt(self.max_tier_bonus)}) + max_affinity "
                f"({_fmt(self.max_affinity)}) = {_fmt(self.max_offset)}, so bounded offsets "
                "can never cross a band"
            )

    @property
    def max_tier_bonus(self) -> float:
        """The largest tier bonus (0 when no tiers are configured). O(number of tiers)."""
        return max(self.tier_bonuses.values(), default=0)

    @property
    def max_offset(self) -> float:
        """The largest bounded offset a job can get: ``max_tier_bonus + max_affinity``."""
        return self.max_tier_bonus + self.max_affinity


def _breakdown_term(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    cls = value.__class__
    if (cls is float or cls is int) and 0 <= value < _INF:  # type: ignore[operator]
        return  # the common case, checked first: every dispatch builds one breakdown
    if not _is_real(value) or not 0 <= value < _INF:
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _breakdown_band(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"band must be an int (not bool), got {value!r}")


def _short(value: float) -> str:
    """Format a score term for people: at most three decimals, no trailing zeros."""
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


@attrs.frozen
class ScoreBreakdown:
    """One job's score, term by term (what ``sprio`` shows for a Slurm job).

    ``str()`` reads like ``effective 12.5 = band 0 + tier 2 + affinity 10 + aging 0.5``
    (terms rounded to three decimals for display; the attributes are exact).

    Attributes:
        band: The job's priority number.
        tier_bonus: The member's tier bonus.
        swap_affinity: The swap-affinity bonus (0 when the job's model is not resident).
        aging: ``waited_seconds / aging_divisor``.
        effective: The sum of the four terms, computed in that order; equal to
            :meth:`Scorer.score` for the same arguments. A property, not a field, so
            ``ScoreBreakdown(**attrs.asdict(breakdown))`` round-trips.

    Raises:
        TypeError: ``band`` is not an int (or is a bool).
        ValueError: Another term is not a finite number >= 0.
    """

    band: int = attrs.field(validator=_breakdown_band)
    tier_bonus: float = attrs.field(validator=_breakdown_term)
    swap_affinity: float = attrs.field(validator=_breakdown_term)
    aging: float = attrs.field(validator=_breakdown_term)

    @property
    def effective(self) -> float:
        """The sum of the four terms, in that order (equal to :meth:`Scorer.score`). O(1)."""
        return self.band + self.tier_bonus + self.swap_affinity + self.aging

    def __str__(self) -> str:
        return (
            f"effective {_short(self.effective)} = band {self.band} + tier "
            f"{_short(self.tier_bonus)} + affinity {_short(self.swap_affinity)} + aging "
            f"{_short(self.aging)}"
        )


def _out_of_range(name: str, value: object, high: float) -> ValueError:
    return ValueError(f"{name} must be a number within [0, {_fmt(high)}], got {value!r}")


def _bad_wait(value: object) -> ValueError:
    return ValueError(f"waited_seconds must be a finite number >= 0, got {value!r}")


def _check_priority(priority: object) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an int (not bool), got {priority!r}")


def _is_config(_: object, __: attrs.Attribute[ScoringConfig], value: object) -> None:
    if not isinstance(value, ScoringConfig):
        raise TypeError(f"config must be a ScoringConfig, got {type(value).__name__}")


@attrs.frozen
class Scorer:
    """Computes effective scores under one :class:`ScoringConfig`. Cheap to make and to call.

    ``score = priority + tier_bonus + affinity + waited_seconds / aging_divisor``; the
    highest score is dispatched first, and only a *strictly* greater score overtakes (ties
    are broken elsewhere).

    **Band-spacing invariant.** The config guarantees ``band_spacing > max_offset``
    (``max_offset = max_tier_bonus + max_affinity``). Hence, with equal waits, a job whose
    priority is at least ``band_spacing`` higher always scores strictly higher: offsets only
    break ties inside a band. (In binary floating point this holds whenever the margin
    ``band_spacing - max_offset`` is more than a few rounding units of the scores, e.g.
    any margin above 1e-6 for scores below 1e9.)

    **Overtake horizon.** Aging is the only term that crosses bands. A job Δ points lower
    that has waited longer than a higher job by *more than*
    :meth:`overtake_horizon` ``(Δ) = (Δ + max_offset) * aging_divisor`` seconds outranks it,
    whatever the two jobs' offsets. Equivalently, a job can be overtaken by a job up to Δ
    points above it only if that job arrived less than ``(Δ + max_offset) * aging_divisor``
    seconds after it: later arrivals can never pass it, so nothing starves. With the
    defaults, a max member's batch job (-98) ties a fresh free interactive job (+100) after
    198 minutes (11,880 s) of extra waiting and overtakes it just after; the worst case
    across those bands (Δ = 200, offsets 0 against 12) is 212 minutes (12,720 s).

    Attributes:
        config: The weights (default ``ScoringConfig()``).

    Raises:
        TypeError: ``config`` is not a :class:`ScoringConfig`.
    """

    config: ScoringConfig = attrs.field(factory=ScoringConfig, validator=_is_config)
    # Copied out of the config so that score() reads one slot per bound.
    _max_tier: float = attrs.field(init=False, repr=False, eq=False)
    _max_affinity: float = attrs.field(init=False, repr=False, eq=False)
    _max_offset: float = attrs.field(init=False, repr=False, eq=False)
    _divisor: float = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_max_tier", self.config.max_tier_bonus)
        object.__setattr__(self, "_max_affinity", self.config.max_affinity)
        object.__setattr__(self, "_max_offset", self.config.max_offset)
        object.__setattr__(self, "_divisor", self.config.aging_divisor)

    def score(
        self, priority: int, tier_bonus: float, affinity: float, waited_seconds: float
    ) -> float:
        """Return a job's effective score.

        Args:
            priority: The job's priority number, which is its band (an int, not bool).
            tier_bonus: The member's tier bonus, within ``[0, max_tier_bonus]`` (see
                :meth:`tier_bonus`).
            affinity: The swap-affinity bonus, within ``[0, max_affinity]``: 0 when the
                job's model is not resident, else :meth:`affinity` of the model.
            waited_seconds: How long the job has waited; finite and >= 0.

        Returns:
            ``priority + tier_bonus + affinity + waited_seconds / aging_divisor``.

        Raises:
            ValueError: An argument is out of its range or NaN, or ``priority`` is not an
                int (bools included).
            TypeError: A number argument is not a number at all.
            OverflowError: ``priority`` is too large to add to a float (beyond about 1e308;
                parsed headers never exceed 1e32).

        Complexity: O(1): a few comparisons and additions.
        """
        if priority.__class__ is not int:  # the fast path: a plain int
            _check_priority(priority)
        if not 0 <= tier_bonus <= self._max_tier:  # NaN fails every comparison
            raise _out_of_range("tier_bonus", tier_bonus, self._max_tier)
        if not 0 <= affinity <= self._max_affinity:
            raise _out_of_range("affinity", affinity, self._max_affinity)
        if not 0 <= waited_seconds < _INF:
            raise _bad_wait(waited_seconds)
        return priority + tier_bonus + affinity + waited_seconds / self._divisor

    def breakdown(
        self, priority: int, tier_bonus: float, affinity: float, waited_seconds: float
    ) -> ScoreBreakdown:
        """Return the score term by term; ``effective`` equals :meth:`score` exactly.

        Args:
            priority: As for :meth:`score`.
            tier_bonus: As for :meth:`score`.
            affinity: As for :meth:`score`.
            waited_seconds: As for :meth:`score`.

        Returns:
            The breakdown.

        Raises:
            ValueError: As for :meth:`score`.
            TypeError: As for :meth:`score`.

        Complexity: O(1).
        """
        self.score(priority, tier_bonus, affinity, waited_seconds)
        return ScoreBreakdown(
            band=priority,
            tier_bonus=tier_bonus,
            swap_affinity=affinity,
            aging=waited_seconds / self._divisor,
        )

    def tier_bonus(self, tier: str) -> float:
        """Return the bonus of a subscription tier (names are case-sensitive).

        Args:
            tier: The tier name, e.g. ``"pro"``.

        Returns:
            The configured bonus.

        Raises:
            ValueError: The tier is not configured; the message lists the known tiers.

        Complexity: O(1) (O(number of tiers) to build the error message).
        """
        try:
            return self.config.tier_bonuses[tier]
        except (KeyError, TypeError):  # TypeError: an unhashable tier
            known = ", ".join(repr(name) for name in self.config.tier_bonuses) or "none"
            raise ValueError(f"unknown tier {tier!r}; known tiers: {known}") from None

    def affinity(self, model: str | None) -> float:
        """Return the swap-affinity bonus a job for ``model`` gets while that model is resident.

        The caller decides residency: pass the result to :meth:`score` when the job's model
        is the one loaded, and 0 otherwise.

        Args:
            model: The model name. Models not listed in ``affinity_by_model`` (and ``None``,
                the proxy's default model) get ``max_affinity``.

        Returns:
            A number within ``[0, max_affinity]``.

        Complexity: O(1).
        """
        if model is None:
            return self._max_affinity
        return self.config.affinity_by_model.get(model, self._max_affinity)

    def aging(self, waited_seconds: float) -> float:
        """Return the aging term: ``waited_seconds / aging_divisor``.

        Args:
            waited_seconds: How long the job has waited; finite and >= 0.

        Returns:
            The aging points.

        Raises:
            ValueError: ``waited_seconds`` is negative, infinite or NaN.

        Complexity: O(1).
        """
        if not 0 <= waited_seconds < _INF:
            raise _bad_wait(waited_seconds)
        return waited_seconds / self._divisor

    def overtake_horizon(self, delta_band: float) -> float:
        """Return the longest extra wait a lower job needs to overtake a fresher higher one.

        A job ``delta_band`` points lower that has waited longer than the higher job by
        *more than* the horizon scores strictly higher whatever both jobs' offsets (at
        exactly the horizon, in the worst case, they tie). Equivalently, a job can be
        overtaken by a job up to ``delta_band`` points above it only if that job arrived
        less than the horizon after it.

        Args:
            delta_band: How many points higher the other job's band is; finite and >= 0.

        Returns:
            ``(delta_band + max_offset) * aging_divisor`` seconds.

        Raises:
            ValueError: ``delta_band`` is negative, infinite or NaN.

        Complexity: O(1).
        """
        if not 0 <= delta_band < _INF:
            raise ValueError(f"delta_band must be a finite number >= 0, got {delta_band!r}")
        return (delta_band + self._max_offset) * self._divisor
