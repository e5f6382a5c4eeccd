from __future__ import annotations

import enum
import math
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioqueue.errors import ConfigError
from prioqueue.priority import BATCH, INTERACTIVE, NORMAL
from prioqueue.scoring import DEFAULT_TIER_BONUSES, ScoreBreakdown, Scorer, ScoringConfig
from strategies import (
    affinities,
    invalid_spacing_configs,
    priorities,
    scoring_configs,
    tier_bonuses,
    waits,
)

NAN = float("nan")
INF = float("inf")


class Level(enum.IntEnum):
    HIGH = 50


# --------------------------------------------------------------------------- ScoringConfig


def test_config_defaults() -> None:
    config = ScoringConfig()
    assert config.band_spacing == 100
    assert dict(config.tier_bonuses) == {"free": 0, "pro": 1, "max": 2}
    assert config.max_affinity == 10
    assert config.aging_divisor == 60.0
    assert dict(config.affinity_by_model) == {}
    assert config.max_tier_bonus == 2
    assert config.max_offset == 12
    assert config == ScoringConfig()
    assert hash(config) == hash(ScoringConfig())
    assert "tier_bonuses={'free': 0, 'pro': 1, 'max': 2}" in repr(config)
    assert dict(DEFAULT_TIER_BONUSES) == {"free": 0, "pro": 1, "max": 2}


def test_config_mappings_are_read_only_copies() -> None:
    tiers = {"gold": 3.0}
    graded = {"flux": 4.0}
    config = ScoringConfig(tier_bonuses=tiers, affinity_by_model=graded)
    tiers["gold"] = 99.0
    graded["flux"] = 99.0
    assert config.tier_bonuses["gold"] == 3.0
    assert config.affinity_by_model["flux"] == 4.0
    with pytest.raises(TypeError):
        config.tier_bonuses["gold"] = 5  # type: ignore[index]
    with pytest.raises(TypeError):
        config.affinity_by_model["flux"] = 5  # type: ignore[index]
    with pytest.raises(TypeError):
        DEFAULT_TIER_BONUSES["free"] = 5  # type: ignore[index]


def test_band_spacing_invariant_message() -> None:
    with pytest.raises(ConfigError) as caught:
        ScoringConfig(band_spacing=12)
    assert str(caught.value) == (
        "band_spacing (12) must be greater than the largest tier bonus (2) + max_affinity (10)"
        " = 12, so bounded offsets can never cross a band"
    )
    ScoringConfig(band_spacing=12.5)  # just above the offsets is allowed


def test_band_spacing_invariant_message_with_fractions() -> None:
    with pytest.raises(ConfigError, match=r"\(10\.5\).*\(0\.5\).*\(10\) = 10\.5"):
        ScoringConfig(band_spacing=10.5, tier_bonuses={"a": 0.5})


@given(invalid_spacing_configs())
def test_configs_breaking_the_invariant_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="so bounded offsets can never cross a band"):
        ScoringConfig(**kwargs)


@given(scoring_configs())
def test_valid_configs_keep_the_invariant(config: ScoringConfig) -> None:
    assert config.band_spacing > config.max_offset
    assert config.max_offset == config.max_tier_bonus + config.max_affinity


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"band_spacing": 0}, "band_spacing must be a finite number > 0, got 0"),
        ({"band_spacing": -100}, "band_spacing must be a finite number > 0"),
        ({"band_spacing": NAN}, "band_spacing must be a finite number > 0, got nan"),
        ({"band_spacing": INF}, "band_spacing must be a finite number > 0, got inf"),
        ({"band_spacing": True}, "band_spacing must be a finite number > 0, got True"),
        ({"band_spacing": "100"}, "band_spacing must be a finite number > 0"),
        ({"band_spacing": 10**400}, "band_spacing must be a finite number > 0"),
        ({"aging_divisor": 0}, "aging_divisor must be a finite number > 0"),
        ({"aging_divisor": -60}, "aging_divisor must be a finite number > 0"),
        ({"aging_divisor": NAN}, "aging_divisor must be a finite number > 0"),
        ({"aging_divisor": INF}, "aging_divisor must be a finite number > 0"),
        ({"aging_divisor": False}, "aging_divisor must be a finite number > 0"),
        ({"max_affinity": -1}, "max_affinity must be a finite number >= 0"),
        ({"max_affinity": NAN}, "max_affinity must be a finite number >= 0"),
        ({"max_affinity": INF}, "max_affinity must be a finite number >= 0"),
        ({"max_affinity": "10"}, "max_affinity must be a finite number >= 0"),
        ({"tier_bonuses": {"": 1}}, "tier_bonuses: name '' must be a non-empty string"),
        ({"tier_bonuses": {"  ": 1}}, "tier_bonuses: name '  ' must be a non-empty string"),
        ({"tier_bonuses": {5: 1}}, "tier_bonuses: name 5 must be a non-empty string"),
        ({"tier_bonuses": {"pro": -1}}, "tier_bonuses: value of 'pro' must be a finite"),
        ({"tier_bonuses": {"pro": NAN}}, "tier_bonuses: value of 'pro' must be a finite"),
        ({"tier_bonuses": {"pro": INF}}, "tier_bonuses: value of 'pro' must be a finite"),
        ({"tier_bonuses": {"pro": True}}, "tier_bonuses: value of 'pro' must be a finite"),
        ({"tier_bonuses": {"pro": "1"}}, "tier_bonuses: value of 'pro' must be a finite"),
        ({"tier_bonuses": [("pro", 1)]}, "tier_bonuses must be a mapping"),
        ({"affinity_by_model": {"": 1}}, "affinity_by_model: name '' must be a non-empty"),
        ({"affinity_by_model": {"m": -1}}, "affinity_by_model: value of 'm' must be a finite"),
        ({"affinity_by_model": {"m": NAN}}, "affinity_by_model: value of 'm' must be a finite"),
        ({"affinity_by_model": {"m": 10.5}}, r"value of 'm' \(10.5\) must not exceed max_aff"),
        ({"affinity_by_model": "m"}, "affinity_by_model must be a mapping"),
    ],
)
def test_bad_config_values_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ScoringConfig(**kwargs)


def test_config_edge_values_are_allowed() -> None:
    no_tiers = ScoringConfig(tier_bonuses={}, max_affinity=0, band_spacing=1e-9)
    assert no_tiers.max_tier_bonus == 0
    assert no_tiers.max_offset == 0
    graded = ScoringConfig(affinity_by_model={"flux": 10, "sdxl": 0})
    assert dict(graded.affinity_by_model) == {"flux": 10, "sdxl": 0}


# --------------------------------------------------------------------------- the design's examples


def test_tier_orders_jobs_inside_a_band_but_never_across() -> None:
    scorer = Scorer()
    max_batch = scorer.score(BATCH, scorer.tier_bonus("max"), 0, 0)
    pro_batch = scorer.score(BATCH, scorer.tier_bonus("pro"), 0, 0)
    free_batch = scorer.score(BATCH, scorer.tier_bonus("free"), 0, 0)
    free_normal = scorer.score(NORMAL, scorer.tier_bonus("free"), 0, 0)
    assert (max_batch, pro_batch, free_batch, free_normal) == (-98, -99, -100, 0)
    assert free_batch < pro_batch < max_batch < free_normal
    # Even with the full swap affinity, a max batch job stays below a normal one.
    assert scorer.score(BATCH, 2, 10, 0) == -88 < free_normal


def test_max_batch_overtakes_free_interactive_after_198_minutes_and_not_earlier() -> None:
    # "Overtake" = a strictly greater score; equal scores tie and are broken elsewhere.
    scorer = Scorer()  # aging_divisor 60: one point a minute
    interactive = scorer.score(INTERACTIVE, 0, 0, 0)
    assert interactive == 100
    assert 198 * 60 == 11_880
    assert scorer.score(BATCH, 2, 0, 11_879) < interactive  # one second earlier: behind
    assert scorer.score(BATCH, 2, 0, 11_880) == interactive  # exactly 198 minutes: a tie
    assert scorer.score(BATCH, 2, 0, 11_880.001) > interactive  # just past: it overtakes
    assert scorer.score(BATCH, 2, 0, 11_881) > interactive
    # The same holds when both have waited: only the difference in waits counts.
    assert scorer.score(BATCH, 2, 0, 600 + 11_880) == scorer.score(INTERACTIVE, 0, 0, 600)
    assert scorer.score(BATCH, 2, 0, 600 + 11_879) < scorer.score(INTERACTIVE, 0, 0, 600)


def test_overtake_horizon_of_the_default_bands() -> None:
    scorer = Scorer()
    horizon = scorer.overtake_horizon(INTERACTIVE - BATCH)
    assert horizon == (200 + 12) * 60 == 12_720
    assert scorer.overtake_horizon(0) == 12 * 60
    # The worst case is tight: a fresh max interactive job with full affinity (112) ...
    top = scorer.score(INTERACTIVE, 2, 10, 0)
    assert top == 112
    # ... ties a bare free batch job that has waited exactly the horizon longer, and loses
    # to one that has waited any longer.
    assert scorer.score(BATCH, 0, 0, horizon) == top
    assert scorer.score(BATCH, 0, 0, horizon - 1) < top
    assert scorer.score(BATCH, 0, 0, horizon + 1) > top
    assert Scorer(ScoringConfig(aging_divisor=1)).overtake_horizon(100.5) == 112.5


@pytest.mark.parametrize("delta", [-1, -0.001, NAN, INF])
def test_overtake_horizon_refuses_bad_deltas(delta: float) -> None:
    with pytest.raises(ValueError, match="delta_band must be a finite number >= 0"):
        Scorer().overtake_horizon(delta)


# --------------------------------------------------------------------------- properties


@given(st.data())
def test_a_higher_band_always_wins_with_equal_waits(data: st.DataObject) -> None:
    config = data.draw(scoring_configs(), label="config")
    scorer = Scorer(config)
    low = data.draw(priorities(max_value=10**6 - 10**4), label="low")
    gap = math.ceil(config.band_spacing) + data.draw(st.integers(0, 5), label="extra")
    high = low + gap
    assert high - low >= config.band_spacing
    wait = data.draw(waits(), label="wait")
    # The lower job gets the largest offsets, the higher one the smallest: it still loses.
    low_score = scorer.score(
        low, data.draw(tier_bonuses(config)), data.draw(affinities(config)), wait
    )
    high_score = scorer.score(
        high, data.draw(tier_bonuses(config)), data.draw(affinities(config)), wait
    )
    assert high_score > low_score
    worst_low = scorer.score(low, config.max_tier_bonus, config.max_affinity, wait)
    best_high = scorer.score(high, 0, 0, wait)
    assert best_high > worst_low


@given(st.data())
def test_waiting_past_the_horizon_always_overtakes(data: st.DataObject) -> None:
    config = data.draw(scoring_configs(), label="config")
    scorer = Scorer(config)
    low = data.draw(priorities(), label="low")
    delta = data.draw(st.integers(0, 10**4), label="delta")
    wait = data.draw(waits(), label="higher job's wait")
    extra = data.draw(st.floats(min_value=1, max_value=10**6), label="seconds past horizon")
    high_score = scorer.score(
        low + delta, data.draw(tier_bonuses(config)), data.draw(affinities(config)), wait
    )
    low_score = scorer.score(
        low,
        data.draw(tier_bonuses(config)),
        data.draw(affinities(config)),
        wait + scorer.overtake_horizon(delta) + extra,
    )
    assert low_score > high_score


@given(st.data())
def test_breakdown_sums_to_the_score(data: st.DataObject) -> None:
    config = data.draw(scoring_configs(), label="config")
    scorer = Scorer(config)
    args = (
        data.draw(priorities()),
        data.draw(tier_bonuses(config)),
        data.draw(affinities(config)),
        data.draw(waits()),
    )
    breakdown = scorer.breakdown(*args)
    assert breakdown.effective == scorer.score(*args)
    assert breakdown.effective == (
        breakdown.band + breakdown.tier_bonus + breakdown.swap_affinity + breakdown.aging
    )
    assert breakdown.aging == scorer.aging(args[3])
    assert (breakdown.band, breakdown.tier_bonus, breakdown.swap_affinity) == args[:3]


@given(scoring_configs(), priorities(), waits(), waits())
def test_longer_waits_never_score_lower(
    config: ScoringConfig, priority: int, first: float, second: float
) -> None:
    scorer = Scorer(config)
    shorter, longer = sorted((first, second))
    assert scorer.score(priority, 0, 0, longer) >= scorer.score(priority, 0, 0, shorter)


# --------------------------------------------------------------------------- Scorer


def test_scorer_lookups() -> None:
    scorer = Scorer(ScoringConfig(affinity_by_model={"flux": 4}))
    assert [scorer.tier_bonus(t) for t in ("free", "pro", "max")] == [0, 1, 2]
    assert scorer.affinity("flux") == 4
    assert scorer.affinity("sdxl") == 10
    assert scorer.affinity(None) == 10
    assert scorer.aging(0) == 0
    assert scorer.aging(90) == 1.5
    assert scorer == Scorer(ScoringConfig(affinity_by_model={"flux": 4}))
    assert scorer != Scorer()
    assert Scorer().config == ScoringConfig()
    assert repr(Scorer()).startswith("Scorer(config=ScoringConfig(")


@pytest.mark.parametrize("tier", ["gold", "Pro", "", ["pro"]])
def test_unknown_tier_lists_the_known_ones(tier: Any) -> None:
    with pytest.raises(ValueError, match=r"known tiers: 'free', 'pro', 'max'$"):
        Scorer().tier_bonus(tier)


def test_unknown_tier_without_tiers() -> None:
    scorer = Scorer(ScoringConfig(tier_bonuses={}))
    with pytest.raises(ValueError, match="unknown tier 'free'; known tiers: none"):
        scorer.tier_bonus("free")
    assert scorer.score(0, 0, 0, 0) == 0


def test_scorer_refuses_a_non_config() -> None:
    with pytest.raises(TypeError, match="config must be a ScoringConfig, got dict"):
        Scorer({"band_spacing": 100})  # type: ignore[arg-type]


def test_score_accepts_int_subclasses_and_ints_for_floats() -> None:
    scorer = Scorer()
    assert scorer.score(Level.HIGH, 1, 5, 60) == 57
    assert scorer.score(0, 2.0, 10.0, 0.0) == 12


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1.5, 0, 0, 0), "priority must be an int"),
        ((True, 0, 0, 0), "priority must be an int"),
        (("100", 0, 0, 0), "priority must be an int"),
        ((None, 0, 0, 0), "priority must be an int"),
        ((0, -0.1, 0, 0), r"tier_bonus must be a number within \[0, 2\], got -0.1"),
        ((0, 2.5, 0, 0), r"tier_bonus must be a number within \[0, 2\], got 2.5"),
        ((0, NAN, 0, 0), r"tier_bonus must be a number within \[0, 2\], got nan"),
        ((0, 0, -1, 0), r"affinity must be a number within \[0, 10\], got -1"),
        ((0, 0, 10.001, 0), r"affinity must be a number within \[0, 10\], got 10.001"),
        ((0, 0, NAN, 0), r"affinity must be a number within \[0, 10\], got nan"),
        ((0, 0, 0, -1), "waited_seconds must be a finite number >= 0, got -1"),
        ((0, 0, 0, INF), "waited_seconds must be a finite number >= 0, got inf"),
        ((0, 0, 0, NAN), "waited_seconds must be a finite number >= 0, got nan"),
    ],
)
def test_score_refuses_out_of_range_arguments(args: tuple[Any, ...], message: str) -> None:
    scorer = Scorer()
    with pytest.raises(ValueError, match=message):
        scorer.score(*args)
    with pytest.raises(ValueError, match=message):
        scorer.breakdown(*args)


def test_score_refuses_non_numbers_with_a_type_error() -> None:
    with pytest.raises(TypeError):
        Scorer().score(0, "2", 0, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("wait", [-1, -1e-9, INF, NAN])
def test_aging_refuses_bad_waits(wait: float) -> None:
    with pytest.raises(ValueError, match="waited_seconds must be a finite number >= 0"):
        Scorer().aging(wait)


def test_tier_bound_follows_the_config() -> None:
    scorer = Scorer(ScoringConfig(tier_bonuses={"gold": 5.5}, band_spacing=20))
    assert scorer.score(0, 5.5, 10, 0) == 15.5
    with pytest.raises(ValueError, match=r"within \[0, 5.5\]"):
        scorer.score(0, 5.6, 0, 0)
    assert scorer.overtake_horizon(0) == 15.5 * 60


# --------------------------------------------------------------------------- ScoreBreakdown


def test_breakdown_reads_like_sprio() -> None:
    breakdown = Scorer().breakdown(0, 2, 10, 30)
    assert str(breakdown) == "effective 12.5 = band 0 + tier 2 + affinity 10 + aging 0.5"
    assert breakdown.effective == 12.5
    behind = Scorer().breakdown(BATCH, 2, 0, 11_879)
    assert str(behind) == "effective 99.983 = band -100 + tier 2 + affinity 0 + aging 197.983"
    tiny = Scorer().breakdown(0, 0, 0, 1e-6)
    assert str(tiny) == "effective 0 = band 0 + tier 0 + affinity 0 + aging 0"


def test_breakdown_is_a_validated_value() -> None:
    breakdown = ScoreBreakdown(band=-100, tier_bonus=2, swap_affinity=0, aging=198)
    assert breakdown.effective == 100
    assert breakdown == ScoreBreakdown(band=-100, tier_bonus=2, swap_affinity=0, aging=198)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        breakdown.band = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        ScoreBreakdown(band=0, tier_bonus=0, swap_affinity=0, aging=0, effective=5)  # type: ignore[call-arg]
    # effective is derived, not stored: a breakdown round-trips through attrs.asdict (and JSON).
    assert attrs.asdict(breakdown) == {
        "band": -100,
        "tier_bonus": 2,
        "swap_affinity": 0,
        "aging": 198,
    }
    assert ScoreBreakdown(**attrs.asdict(breakdown)) == breakdown


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"band": 1.5}, TypeError, "band must be an int"),
        ({"band": True}, TypeError, "band must be an int"),
        ({"tier_bonus": -1}, ValueError, "tier_bonus must be a finite number >= 0"),
        ({"swap_affinity": NAN}, ValueError, "swap_affinity must be a finite number >= 0"),
        ({"aging": INF}, ValueError, "aging must be a finite number >= 0"),
        ({"aging": "1"}, ValueError, "aging must be a finite number >= 0"),
    ],
)
def test_breakdown_refuses_bad_terms(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    fields: dict[str, Any] = {"band": 0, "tier_bonus": 0, "swap_affinity": 0, "aging": 0}
    with pytest.raises(error, match=message):
        ScoreBreakdown(**{**fields, **kwargs})
