"""Shared Hypothesis strategies for prioqueue's own types.

Import them in test modules with ``from strategies import ...`` (pytest puts ``tests/`` on
``sys.path``). Strategies here generate *valid* values unless their name says otherwise, and
keep numbers in realistic ranges so that float rounding never blurs the properties under test
(scores stay far below 2**53 and the band-spacing margin stays far above a rounding unit).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from hypothesis import strategies as st

from prioqueue.priority import MAX_HEADER_LENGTH, PriorityPolicy
from prioqueue.scoring import Scorer, ScoringConfig

__all__ = [
    "MAX_WAIT",
    "PRIORITY_RANGE",
    "affinities",
    "header_texts",
    "invalid_spacing_configs",
    "priorities",
    "priority_policies",
    "scoring_configs",
    "tier_bonuses",
    "waits",
]

PRIORITY_RANGE = 10**6
"""Priorities drawn by :func:`priorities` lie within ``[-PRIORITY_RANGE, PRIORITY_RANGE]``."""

MAX_WAIT = 30 * 24 * 3600.0
"""The longest wait :func:`waits` draws: 30 days, in seconds."""

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
_offsets = st.floats(min_value=0, max_value=50, allow_nan=False, allow_infinity=False)


def priorities(
    min_value: int = -PRIORITY_RANGE, max_value: int = PRIORITY_RANGE
) -> st.SearchStrategy[int]:
    """Priority numbers (bands), biased towards the built-in levels -100, 0 and 100."""
    return st.one_of(
        st.sampled_from([-100, 0, 100]).filter(lambda p: min_value <= p <= max_value),
        st.integers(min_value=min_value, max_value=max_value),
    )


def waits(max_value: float = MAX_WAIT) -> st.SearchStrategy[float]:
    """Finite, non-negative waiting times in seconds (integers and fractions)."""
    return st.one_of(
        st.integers(min_value=0, max_value=int(max_value)).map(float),
        st.floats(min_value=0, max_value=max_value, allow_nan=False, allow_infinity=False),
    )


@st.composite
def scoring_configs(draw: st.DrawFn) -> ScoringConfig:
    """Valid :class:`ScoringConfig` objects (the band-spacing invariant holds by at least 0.5).

    Tier bonuses and affinities are within [0, 50], the divisor within [0.5, 86400] seconds
    per point; some models get a graded affinity.
    """
    tier_map = draw(st.dictionaries(_names, _offsets, max_size=5))
    max_affinity = draw(_offsets)
    graded = draw(
        st.dictionaries(
            _names,
            st.floats(min_value=0, max_value=max_affinity, allow_nan=False),
            max_size=3,
        )
    )
    max_offset = max(tier_map.values(), default=0) + max_affinity
    margin = draw(st.floats(min_value=0.5, max_value=1000, allow_nan=False))
    spacing = draw(st.sampled_from([max_offset + margin, float(int(max_offset) + 1) + margin]))
    divisor = draw(st.floats(min_value=0.5, max_value=86400, allow_nan=False))
    return ScoringConfig(
        band_spacing=spacing,
        tier_bonuses=tier_map,
        max_affinity=max_affinity,
        aging_divisor=divisor,
        affinity_by_model=graded,
    )


@st.composite
def invalid_spacing_configs(draw: st.DrawFn) -> dict[str, object]:
    """Keyword arguments for :class:`ScoringConfig` that break *only* the band-spacing rule.

    ``band_spacing`` is positive but at most the largest tier bonus + ``max_affinity``.
    """
    tier_map = draw(st.dictionaries(_names, _offsets, max_size=5))
    max_affinity = draw(_offsets)
    max_offset = max(tier_map.values(), default=0) + max_affinity
    if max_offset == 0:
        max_affinity = max_offset = draw(st.floats(min_value=0.001, max_value=50))
    fraction = draw(st.floats(min_value=0.001, max_value=1))
    return {
        "band_spacing": max_offset * fraction or max_offset,  # never 0: that is another rule
        "tier_bonuses": tier_map,
        "max_affinity": max_affinity,
    }


def _bonuses(maximum: float, graded: Collection[float]) -> st.SearchStrategy[float]:
    """0, ``maximum``, any bonus between, or one of the ``graded`` (configured) ones."""
    strategies = [
        st.just(0.0),
        st.just(maximum),
        st.floats(min_value=0, max_value=maximum, allow_nan=False),
    ]
    if graded:
        strategies.append(st.sampled_from(sorted(graded)))
    return st.one_of(strategies)


def tier_bonuses(config: ScoringConfig) -> st.SearchStrategy[float]:
    """Tier bonuses valid under ``config``: a configured tier's bonus or any in range."""
    return _bonuses(config.max_tier_bonus, config.tier_bonuses.values())


def affinities(config: ScoringConfig) -> st.SearchStrategy[float]:
    """Swap-affinity bonuses valid under ``config``: 0, the maximum, a graded one, any between."""
    return _bonuses(config.max_affinity, config.affinity_by_model.values())


@st.composite
def priority_policies(draw: st.DrawFn) -> PriorityPolicy:
    """Valid :class:`PriorityPolicy` objects with optional bounds (default within them)."""
    bounds = draw(st.lists(priorities(), min_size=3, max_size=3).map(sorted))
    low, default, high = bounds
    minimum = draw(st.sampled_from([low, None]))
    maximum = draw(st.sampled_from([high, None]))
    extra = draw(
        st.dictionaries(
            _names.filter(lambda n: not n.lstrip("+-").isdigit()), priorities(), max_size=3
        )
    )
    return PriorityPolicy(default=default, minimum=minimum, maximum=maximum).with_aliases(extra)


def header_texts() -> st.SearchStrategy[str]:
    """Header-like text: numbers, aliases, near misses, Unicode digits and arbitrary text."""
    near_misses = st.sampled_from(
        [
            *("", " ", "+", "-", "1_000", "1.5", "1e3", "0x10", "1,2", "1\n", "\u00a01"),
            "\u0661\u0662",  # Arabic-Indic digits
            "\uff11\uff12",  # fullwidth digits
            "\uff22\uff21\uff34\uff23\uff28",  # fullwidth BATCH
            "bul\u212a",  # KELVIN SIGN: lower-cases to "k"
        ]
    )
    numbers = st.integers().map(str)
    padded = st.tuples(st.sampled_from(["", " ", "\t", "  "]), priorities().map(str)).map(
        lambda pair: pair[0] + pair[1] + pair[0]
    )
    aliases = st.sampled_from(["interactive", "NORMAL", "Batch", " batch "])
    long_digits = st.integers(min_value=MAX_HEADER_LENGTH - 2, max_value=200).map(lambda n: "9" * n)
    return st.one_of(near_misses, numbers, padded, aliases, long_digits, st.text())


# --- Dispatcher inputs (SizeOneDispatcher / ReferenceDispatcher) ------------------------------
# Times, runtimes and estimates are small dyadic numbers, so sums and differences of them are
# exact floats and two dispatchers that follow the same rules compute bit-identical keys.

__all__ += [
    "DISPATCHER_MEMBERS",
    "DISPATCHER_MODELS",
    "DISPATCHER_TIERS",
    "dispatcher_estimates",
    "dispatcher_job_specs",
    "dispatcher_levels",
    "dispatcher_models",
    "dispatcher_priorities",
    "dispatcher_runtimes",
    "dispatcher_scorers",
    "time_steps",
]

DISPATCHER_MEMBERS = ("ann", "bob", "cyd")
"""The few members random dispatcher tests use (few, so lanes collide)."""

DISPATCHER_MODELS = ("m1", "m2", "m3")
"""The models random dispatcher tests use (``None`` is drawn as well)."""

DISPATCHER_TIERS = ("free", "pro", "max")
"""The built-in tier names."""


def dispatcher_levels() -> st.SearchStrategy[int]:
    """Priority levels: mostly the three built-in bands, sometimes any int nearby."""
    return st.one_of(st.sampled_from([-100, 0, 100]), st.integers(min_value=-250, max_value=250))


def dispatcher_priorities() -> st.SearchStrategy[int | str | bytes | None]:
    """What ``submit(priority=...)`` accepts: numbers, aliases, header text and bytes, None."""
    return st.one_of(
        dispatcher_levels(),
        st.sampled_from(["batch", "interactive", "normal", " 100", "-7", "junk", b"100", None]),
    )


def dispatcher_models() -> st.SearchStrategy[str | None]:
    """A job's model: one of :data:`DISPATCHER_MODELS` or None."""
    return st.sampled_from((None, *DISPATCHER_MODELS))


def dispatcher_estimates() -> st.SearchStrategy[float | None]:
    """Runtime estimates (> 0, dyadic) or None."""
    return st.sampled_from([None, None, 0.5, 1.0, 30.0, 240.0, 900.0])


def dispatcher_runtimes() -> st.SearchStrategy[float | None]:
    """Runtimes reported to ``complete`` (dyadic, >= 0) or None (measured)."""
    return st.sampled_from([None, None, 0.0, 0.5, 3.0, 60.0, 240.0, 1000.0])


def time_steps() -> st.SearchStrategy[float]:
    """Clock advances in seconds (dyadic), from nothing to two hours; 1.5, 4 and 600 are the
    affinity windows of :func:`dispatcher_scorers`, so window edges get hit exactly."""
    return st.sampled_from(
        [0.0, 0.25, 0.5, 1.0, 1.5, 4.0, 5.0, 30.0, 60.0, 120.0, 240.0, 600.0, 1800.0, 7200.0]
    )


def dispatcher_scorers() -> st.SearchStrategy[Scorer]:
    """A few scorers whose windows and aging rates differ by orders of magnitude.

    The default; a fast-aging one (``d = 1``, window 4 s); a very fast one (``d = 0.5``) with
    graded affinities (``m2`` 1.5, ``m3`` 0, so ``m3`` never earns affinity) and a fractional
    tier bonus.
    """
    return st.sampled_from(
        [
            Scorer(),
            Scorer(ScoringConfig(aging_divisor=1.0, max_affinity=4)),
            Scorer(
                ScoringConfig(
                    aging_divisor=0.5,
                    max_affinity=3,
                    tier_bonuses={"free": 0, "pro": 0.5, "max": 2},
                    affinity_by_model={"m2": 1.5, "m3": 0},
                )
            ),
        ]
    )


def dispatcher_job_specs() -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for one ``submit`` (all but the id and ``now``)."""
    return st.fixed_dictionaries(
        {
            "member": st.sampled_from(DISPATCHER_MEMBERS),
            "priority": dispatcher_priorities(),
            "tier": st.sampled_from(DISPATCHER_TIERS),
            "model": dispatcher_models(),
            "estimate": dispatcher_estimates(),
        }
    )


def two_tiers(different: bool) -> tuple[tuple[str, str], float]:
    """Two members' tiers (``free``/``max`` when ``different``, else ``pro``/``pro``) and the
    spread of their bonuses under the default ``ScoringConfig`` (the fairness bounds' term).
    """
    config = ScoringConfig()
    tiers = ("free", "max") if different else ("pro", "pro")
    return tiers, config.tier_bonuses[tiers[1]] - config.tier_bonuses[tiers[0]]


def overdue_slack_seconds(config: ScoringConfig | None = None) -> float:
    """``k * (T + A) * d``: how far ahead of its level's least-served lane an overdue job's
    lane may be granted (``OVERDUE_SLACK`` times the scorer's whole offset spread, every tier
    counted, not only the two members'); the fairness bounds' width, beside the ranking's."""
    from prioqueue.dispatcher import OVERDUE_SLACK

    config = config or ScoringConfig()
    bonuses = list(config.tier_bonuses.values())
    spread = (max(bonuses) - min(bonuses) if bonuses else 0.0) + config.max_affinity
    return OVERDUE_SLACK * spread * config.aging_divisor
