"""Tests of the prefetch lease policy (prioqueue.lease), against the ADR's worked numbers."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any, ClassVar

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import prioqueue.lease as lease_mod
from prioqueue.errors import ConfigError
from prioqueue.lease import (
    DEFAULT_CALCULATOR,
    FLAT_WORK_SAMPLERS,
    SAMPLER_UNITS,
    SLOW_BASELINE_MULTIPLIERS,
    ImageRequest,
    Lease,
    LeaseCalculator,
    LeaseExplanation,
    explain,
    lease_seconds,
    sampler_work,
)

SLOW = ("flux_1", "flux_schnell", "flux_dev", "qwen_image", "z_image_turbo", "krea2_turbo", "anima")
TWO_UNIT = (
    "k_heun", "k_dpm_2", "k_dpm_2_a", "k_dpmpp_2s_a", "k_dpmpp_sde", "exp_heun_2_x0",
    "exp_heun_2_x0_sde", "dpmpp_2s_ancestral_cfg_pp", "seeds_2", "sa_solver_pece",
)  # fmt: skip
THREE_UNIT = ("heunpp2", "seeds_3")
ONE_UNIT = (
    "k_euler", "k_euler_a", "k_lms", "k_dpm_fast", "k_dpmpp_2m", "k_dpmpp_2m_sde",
    "dpmpp_2m_sde", "dpmpp_3m_sde", "lcm", "DDIM", "ddim", "uni_pc",
)  # fmt: skip


def reference(
    *,
    width: int,
    height: int,
    steps: int = 30,
    sampler: str = "k_euler_a",
    controlnet: bool = False,
    baseline: str | None = None,
    loras: int = 0,
    extra_slow_worker: bool = False,
) -> int:
    """The ADR's formula written out plainly with Fractions, independent of the module."""
    if sampler == "k_dpm_adaptive":
        work = 40
    elif sampler in THREE_UNIT:
        work = 3 * steps
    elif sampler in TWO_UNIT:
        work = 2 * steps
    else:
        work = steps
    value = 30 + 2 * work * Fraction(width * height, 512 * 512)
    if controlnet:
        value *= 2
    if baseline in SLOW:
        value *= 3
    value = max(value, Fraction(150))
    value += loras * Fraction(400 * 8, 30)
    if extra_slow_worker:
        value *= 3
    return math.ceil(value)


# --- the ADR's worked numbers ------------------------------------------------------------------


def test_scalable_term_is_0_131072_megapixel_work_units_per_second() -> None:
    calc = LeaseCalculator()
    assert calc.megapixel_work_per_second == Fraction("0.131072")
    # The same figure measured from leases: 100 more work units at P = 4 buy 800 s.
    slower = lease_seconds(width=1024, height=1024, steps=150, sampler="k_euler")
    faster = lease_seconds(width=1024, height=1024, steps=50, sampler="k_euler")
    megapixel_work = Fraction(100 * 1024 * 1024, 10**6)
    assert megapixel_work / (slower - faster) == Fraction("0.131072")


def test_headroom_factors_match_the_adr() -> None:
    calc = LeaseCalculator()
    assert calc.isolated_compute_factor == Fraction(15625, 4096)  # 3.814697...
    assert calc.prefetch_headroom_factor == Fraction(15625, 8192)  # 1.907348...
    assert round(float(calc.isolated_compute_factor), 1) == 3.8
    assert round(float(calc.prefetch_headroom_factor), 1) == 1.9
    assert LeaseCalculator(normal_speed_mps=1).isolated_compute_factor == Fraction(15625, 2048)


def test_1024_square_50_steps_k_euler_is_430() -> None:
    assert lease_seconds(width=1024, height=1024, steps=50, sampler="k_euler") == 430


def test_one_step_512_job_gets_the_150_second_minimum() -> None:
    assert lease_seconds(width=512, height=512, steps=1, sampler="k_euler") == 150


def test_lora_allowance_is_exactly_320_thirds() -> None:
    assert LeaseCalculator().lora_seconds == Fraction(320, 3)


def test_five_loras_on_a_minimum_job_is_684() -> None:
    assert lease_seconds(width=512, height=512, steps=1, loras=5) == 684  # 150 + 533.33


@pytest.mark.parametrize(
    ("kwargs", "expected", "wrong_order"),
    [
        # ControlNet before the minimum: 32 * 2 = 64 -> 150 (after it would be 300).
        ({"controlnet": True}, 150, 300),
        # Slow baseline before the minimum: 32 * 3 = 96 -> 150 (after it would be 450).
        ({"baseline": "flux_1"}, 150, 450),
        # Both compound before the minimum: 32 * 6 = 192.
        ({"controlnet": True, "baseline": "qwen_image"}, 192, 900),
        # The extra-slow factor comes after the minimum: 150 * 3 (before it would be 150).
        ({"extra_slow_worker": True}, 450, 150),
        # LoRAs after the minimum: 150 + 106.67 (before it: max(138.67, 150) = 150).
        ({"loras": 1}, 257, 150),
        # LoRAs are not multiplied by ControlNet/slow: 192 + 106.67 (not 138.67 * 6 = 832).
        ({"controlnet": True, "baseline": "anima", "loras": 1}, 299, 832),
        # Extra slow multiplies the LoRA allowance too: (150 + 106.67) * 3 = 770 exactly.
        ({"loras": 1, "extra_slow_worker": True}, 770, 557),
    ],
)
def test_modifier_order_is_the_policy(
    kwargs: dict[str, Any], expected: int, wrong_order: int
) -> None:
    got = lease_seconds(width=512, height=512, steps=1, sampler="k_euler", **kwargs)
    assert got == expected
    assert got != wrong_order


def test_multipliers_above_the_minimum() -> None:
    # 1024^2, 50 k_euler: base 430; x2 x3 = 2580; + 2 LoRAs (213.33) = 2793.33; x3 = 8380.
    got = lease_seconds(
        width=1024, height=1024, steps=50, sampler="k_euler", controlnet=True,
        baseline="z_image_turbo", loras=2, extra_slow_worker=True,
    )  # fmt: skip
    assert got == 8380


@pytest.mark.parametrize("steps", [1, 10, 30, 500])
def test_adaptive_is_40_units_whatever_the_steps(steps: int) -> None:
    assert sampler_work("k_dpm_adaptive", steps) == 40
    # 30 + 2 * 40 * 4 = 350 at 1024^2.
    assert lease_seconds(width=1024, height=1024, steps=steps, sampler="k_dpm_adaptive") == 350


@pytest.mark.parametrize("sampler", TWO_UNIT)
def test_two_unit_samplers(sampler: str) -> None:
    assert sampler_work(sampler, 10) == 20
    assert lease_seconds(width=1024, height=1024, steps=50, sampler=sampler) == 830


@pytest.mark.parametrize("sampler", THREE_UNIT)
def test_three_unit_samplers(sampler: str) -> None:
    assert sampler_work(sampler, 10) == 30
    assert lease_seconds(width=1024, height=1024, steps=50, sampler=sampler) == 1230


@pytest.mark.parametrize("sampler", ONE_UNIT)
def test_known_one_unit_samplers(sampler: str) -> None:
    assert SAMPLER_UNITS[sampler] == 1
    assert sampler_work(sampler, 10, strict=True) == 10


def test_tables_are_read_only_and_disjoint() -> None:
    with pytest.raises(TypeError):
        SAMPLER_UNITS["k_euler"] = 2  # type: ignore[index]
    assert FLAT_WORK_SAMPLERS == {"k_dpm_adaptive": 40}
    assert not set(SAMPLER_UNITS) & set(FLAT_WORK_SAMPLERS)
    assert dict(SLOW_BASELINE_MULTIPLIERS) == dict.fromkeys(SLOW, 3)


def test_unknown_sampler_counts_one_unit_and_names_are_case_sensitive() -> None:
    assert sampler_work("my_new_sampler", 25) == 25
    assert lease_seconds(width=1024, height=1024, steps=50, sampler="nope") == 430
    # A known name in another case is a typo, not a new one-unit sampler: it used to count
    # "K_HEUN" (2 units a step) as 1 unit a step without a word.
    with pytest.raises(ValueError, match=r"'K_HEUN' is not known; .* did you mean 'k_heun'\?"):
        sampler_work("K_HEUN", 10)
    with pytest.raises(ValueError, match=r"did you mean 'k_euler'\?"):
        lease_seconds(width=512, height=512, sampler="K_EULER")
    with pytest.raises(ValueError, match=r"did you mean 'k_dpm_adaptive'\?"):
        LeaseCalculator()({"width": 64, "height": 64, "sampler": "K_DPM_ADAPTIVE"})
    # Both spellings AI Horde knows ("DDIM", "ddim") stay exact matches.
    assert sampler_work("DDIM", 10) == sampler_work("ddim", 10) == 10


def test_lease_seconds_names_itself_in_errors() -> None:
    # It was the default calculator's bound method, so a wrong keyword named
    # "LeaseCalculator.seconds()", which the caller never called.
    with pytest.raises(
        TypeError, match=r"^lease_seconds\(\) got an unexpected keyword .*'control_type'"
    ):
        lease_seconds(width=512, height=512, control_type="canny")  # type: ignore[call-arg]


def test_strict_mode_rejects_unknown_samplers() -> None:
    strict = LeaseCalculator(strict_samplers=True)
    with pytest.raises(ValueError, match=r"sampler 'K_HEUN' is not a known sampler"):
        strict.seconds(width=512, height=512, sampler="K_HEUN")
    with pytest.raises(ValueError, match="strict"):
        sampler_work("nope", 3, strict=True)
    with pytest.raises(ValueError, match="nope"):
        strict.explain({"width": 64, "height": 64, "sampler": "nope"})
    assert strict.seconds(width=1024, height=1024, steps=50, sampler="k_heun") == 830
    assert strict.work("k_dpm_adaptive", 7) == 40


def test_whole_values_are_not_rounded_up() -> None:
    # (150 + 4 * 320/3) * 3 = 1730 exactly; naive float arithmetic gives 1730.0000000000002.
    naive = (150 + 4 * (400 * 8 / 30)) * 3
    assert math.ceil(naive) == 1731
    assert lease_seconds(width=64, height=64, steps=1, loras=4, extra_slow_worker=True) == 1730
    assert lease_seconds(width=512, height=512, steps=1, loras=3) == 470  # 150 + 320


def test_non_whole_values_round_up() -> None:
    # 30 + 2 * 100 * 1.001953125 = 230.390625 -> 231.
    assert lease_seconds(width=513, height=512, steps=100, sampler="k_euler") == 231


# --- properties --------------------------------------------------------------------------------

requests = st.fixed_dictionaries(
    {
        "width": st.integers(1, 4096),
        "height": st.integers(1, 4096),
        "steps": st.integers(1, 200),
        "sampler": st.sampled_from([*ONE_UNIT, *TWO_UNIT, *THREE_UNIT, "k_dpm_adaptive", "x"]),
        "controlnet": st.booleans(),
        "baseline": st.sampled_from([None, "stable_diffusion_xl", *SLOW]),
        "loras": st.integers(0, 5),
        "extra_slow_worker": st.booleans(),
    }
)


@given(requests)
def test_lease_matches_the_reference_formula(kwargs: dict[str, Any]) -> None:
    got = lease_seconds(**kwargs)
    assert type(got) is int
    assert got >= 150
    assert got == reference(**kwargs)
    assert explain(kwargs).seconds == got
    assert DEFAULT_CALCULATOR(ImageRequest(**kwargs)) == got


@given(requests, st.sampled_from(["width", "height", "steps", "loras"]), st.integers(1, 500))
def test_lease_is_monotone_in_sizes_steps_and_loras(
    kwargs: dict[str, Any], field: str, bump: int
) -> None:
    bigger = dict(kwargs)
    bigger[field] = min(kwargs[field] + bump, 5) if field == "loras" else kwargs[field] + bump
    assert lease_seconds(**bigger) >= lease_seconds(**kwargs)


@given(requests, st.sampled_from(["controlnet", "extra_slow_worker", "baseline"]))
def test_flags_never_decrease_the_lease(kwargs: dict[str, Any], flag: str) -> None:
    off = {**kwargs, flag: None if flag == "baseline" else False}
    on = {**kwargs, flag: "flux_dev" if flag == "baseline" else True}
    assert lease_seconds(**on) >= lease_seconds(**off)


@given(
    requests,
    st.fractions(min_value=0, max_value=100, max_denominator=50),
    st.fractions(min_value=1, max_value=5, max_denominator=7),
    st.fractions(min_value=Fraction(1, 3), max_value=200, max_denominator=11),
)
def test_custom_exact_constants_agree_with_explain(
    kwargs: dict[str, Any], fixed: Fraction, mult: Fraction, minimum: Fraction
) -> None:
    calc = LeaseCalculator(
        fixed_seconds=fixed, controlnet_multiplier=mult, extra_slow_multiplier=mult,
        minimum_seconds=minimum, slow_baseline_multipliers=dict.fromkeys(SLOW, mult),
        lora_bandwidth_mbps=Fraction(7, 3),
    )  # fmt: skip
    got = calc.seconds(**kwargs)
    assert got == calc.explain(kwargs).seconds
    assert got >= max(1, math.ceil(minimum))


# --- validation --------------------------------------------------------------------------------

BAD_INPUTS = [
    ("width", 0, ValueError),
    ("width", -512, ValueError),
    ("width", True, TypeError),
    ("width", 512.0, TypeError),
    ("width", float("nan"), TypeError),
    ("width", "512", TypeError),
    ("height", 0, ValueError),
    ("height", None, TypeError),
    ("steps", 0, ValueError),
    ("steps", -3, ValueError),
    ("steps", True, TypeError),
    ("steps", 2.5, TypeError),
    ("sampler", 3, TypeError),
    ("sampler", None, TypeError),
    ("controlnet", 1, TypeError),
    ("controlnet", "yes", TypeError),
    ("baseline", 3, TypeError),
    ("loras", -1, ValueError),
    ("loras", 6, ValueError),
    ("loras", True, TypeError),
    ("loras", 1.0, TypeError),
    ("extra_slow_worker", None, TypeError),
]


@pytest.mark.parametrize(("field", "value", "error"), BAD_INPUTS)
def test_bad_inputs_name_the_field(field: str, value: object, error: type[Exception]) -> None:
    kwargs: dict[str, Any] = {"width": 512, "height": 512, field: value}
    with pytest.raises(error, match=field):
        lease_seconds(**kwargs)
    with pytest.raises(error, match=field):
        DEFAULT_CALCULATOR(kwargs)
    if (field, value) != ("loras", 6):  # the bound belongs to the calculator
        with pytest.raises(error, match=field):
            ImageRequest(**kwargs)


def test_too_many_loras_is_the_calculators_rule() -> None:
    request = ImageRequest(width=512, height=512, loras=6)
    for call in (DEFAULT_CALCULATOR, DEFAULT_CALCULATOR.for_request, explain):
        with pytest.raises(ValueError, match=r"loras must be at most max_loras=5, got 6"):
            call(request)
    assert LeaseCalculator(max_loras=6)(request) == reference(width=512, height=512, loras=6)


def test_int_and_str_subclasses_are_accepted() -> None:
    class Pixels(int):
        pass

    class Name(str):
        pass

    got = lease_seconds(
        width=Pixels(1024), height=1024, steps=Pixels(50), sampler=Name("k_euler"),
        baseline=Name("other"), loras=Pixels(0),
    )  # fmt: skip
    assert got == 430
    assert lease_seconds(width=512, height=512, steps=1, loras=Pixels(3)) == 470


BAD_CONFIG = [
    ("fixed_seconds", -1),
    ("fixed_seconds", float("nan")),
    ("fixed_seconds", float("inf")),
    ("fixed_seconds", Decimal("NaN")),
    ("fixed_seconds", "30"),
    ("fixed_seconds", True),
    ("seconds_per_work_pixel_unit", 0),
    ("reference_side", 0),
    ("reference_side", 512.0),
    ("reference_side", True),
    ("controlnet_multiplier", Fraction(1, 2)),
    ("slow_baseline_multipliers", [("flux_1", 3)]),
    ("slow_baseline_multipliers", {"": 3}),
    ("slow_baseline_multipliers", {3: 3}),
    ("slow_baseline_multipliers", {"flux_1": 0.5}),
    ("slow_baseline_multipliers", {"flux_1": Decimal("Infinity")}),
    ("minimum_seconds", 0),
    ("lora_file_megabytes", -0.5),
    ("lora_bandwidth_mbps", 0),
    ("max_loras", -1),
    ("max_loras", 1.5),
    ("extra_slow_multiplier", 0.99),
    ("strict_samplers", "yes"),
    ("sampler_units", None),
    ("sampler_units", {"": 1}),
    ("sampler_units", {"k_euler": 0}),
    ("sampler_units", {"k_euler": True}),
    ("flat_work_samplers", {"k_dpm_adaptive": 1.5}),
    ("normal_speed_mps", 0),
]


@pytest.mark.parametrize(("field", "value"), BAD_CONFIG)
def test_bad_config_raises_config_error_naming_the_field(field: str, value: object) -> None:
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(ConfigError, match=f"LeaseCalculator.{field}"):
        LeaseCalculator(**kwargs)


def test_config_error_is_a_value_error_and_tables_must_be_disjoint() -> None:
    with pytest.raises(ValueError, match=r"must not share names.*k_euler"):
        LeaseCalculator(flat_work_samplers={"k_euler": 40})


def test_config_numbers_are_exact_whatever_their_type() -> None:
    # 0.1 as a float means one tenth: base = 1/10 + 2 * 30 * 1 = 60.1 -> above minimum 60.
    calc = LeaseCalculator(fixed_seconds=0.1, minimum_seconds=Decimal("60"))
    assert calc.explain({"width": 512, "height": 512}).base == Fraction(601, 10)
    assert calc.seconds(width=512, height=512) == 61
    assert LeaseCalculator(lora_bandwidth_mbps=Decimal("32")).lora_seconds == 100


def test_config_mappings_are_copied_read_only() -> None:
    table = {"my_sampler": 4}
    calc = LeaseCalculator(sampler_units=table, slow_baseline_multipliers={"sd3": 2})
    table["my_sampler"] = 1
    assert calc.work("my_sampler", 10) == 40
    assert calc.work("k_euler", 10) == 10  # not in this table: unknown, one unit
    with pytest.raises(TypeError):
        calc.sampler_units["x"] = 1  # type: ignore[index]
    # 30 + 2 * 40 = 110, x2 (sd3) = 220.
    assert (
        calc.seconds(width=512, height=512, steps=10, sampler="my_sampler", baseline="sd3") == 220
    )
    assert calc.seconds(width=512, height=512, steps=10, baseline="flux_1") == 150


def test_calculator_is_a_frozen_hashable_value() -> None:
    assert LeaseCalculator() == DEFAULT_CALCULATOR
    assert hash(LeaseCalculator()) == hash(DEFAULT_CALCULATOR)
    assert LeaseCalculator(max_loras=3) != DEFAULT_CALCULATOR
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        DEFAULT_CALCULATOR.minimum_seconds = 1  # type: ignore[misc]
    assert attrs.evolve(DEFAULT_CALCULATOR, minimum_seconds=10).seconds(width=8, height=8) == 31


def test_sampler_work_validates_its_arguments() -> None:
    with pytest.raises(TypeError, match="sampler"):
        sampler_work(None, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        sampler_work("k_euler", 0)
    with pytest.raises(TypeError, match="steps"):
        DEFAULT_CALCULATOR.work("k_euler", True)


# --- __call__, explain -------------------------------------------------------------------------


@attrs.frozen
class Job:
    payload: object


def test_call_accepts_requests_mappings_and_payload_objects() -> None:
    kwargs: dict[str, Any] = {"width": 1024, "height": 1024, "steps": 50, "sampler": "k_euler"}
    request = ImageRequest(**kwargs)
    assert DEFAULT_CALCULATOR(request) == 430
    assert DEFAULT_CALCULATOR(kwargs) == 430
    assert DEFAULT_CALCULATOR(Job(kwargs)) == 430
    assert DEFAULT_CALCULATOR(Job(request)) == 430
    assert DEFAULT_CALCULATOR.for_request(request) == 430
    assert ImageRequest.from_mapping(kwargs) == request
    # Other mappings (and subclasses) take the general path.
    assert DEFAULT_CALCULATOR(MappingProxyType(kwargs)) == 430
    assert DEFAULT_CALCULATOR(Job(MappingProxyType(kwargs))) == 430
    assert explain(Job(MappingProxyType(kwargs))).seconds == 430


def test_call_prefers_exact_types_then_the_job_before_its_payload() -> None:
    class MappingJob(dict[str, Any]):
        payload: ClassVar[dict[str, int]] = {"width": 64, "height": 64}

    # An exact dict (the payload) beats a dict subclass (the job): the documented precedence.
    job = MappingJob(width=1024, height=1024, steps=50, sampler="k_euler")
    assert DEFAULT_CALCULATOR(job) == 150
    assert DEFAULT_CALCULATOR(Job(MappingJob(width=2048, height=2048))) == 990


@pytest.mark.parametrize(
    ("job", "match"),
    [
        (42, "got int"),
        (object(), "got object"),
        (Job(42), r"got Job \(its payload is a int\)"),
        (Job(Job({"width": 1, "height": 1})), "its payload is a Job"),
        ({"width": 512, "height": 512, "prompt": "cat"}, r"unknown lease argument.*prompt"),
        ({"height": 512}, r"missing required lease argument.*width"),
        (Job({"width": 512}), r"missing.*height"),
    ],
)
def test_call_rejects_what_is_not_a_request(job: object, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        DEFAULT_CALCULATOR(job)
    with pytest.raises(TypeError, match=match):
        explain(job)


def test_for_request_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="request must be an ImageRequest, got dict"):
        DEFAULT_CALCULATOR.for_request({"width": 1, "height": 1})  # type: ignore[arg-type]


def test_explain_shows_every_step_in_order() -> None:
    job = Job(
        ImageRequest(
            width=1024, height=1024, steps=50, sampler="k_heun", controlnet=True,
            baseline="flux_1", loras=1, extra_slow_worker=True,
        )
    )  # fmt: skip
    why = explain(job)
    assert isinstance(why, LeaseExplanation)
    steps: tuple[object, ...] = (
        why.work, why.pixel_ratio, why.base, why.after_controlnet, why.after_slow_model,
        why.after_minimum, why.after_loras, why.after_extra_slow, why.seconds,
    )  # fmt: skip
    third = Fraction(1, 3)
    assert steps == (100, 4, 830, 1660, 4980, 4980, 4980 + 320 * third, 15260, 15260)
    factors: tuple[object, ...] = (
        why.controlnet_multiplier, why.slow_model_multiplier, why.extra_slow_multiplier,
        why.minimum_seconds, why.lora_seconds,
    )  # fmt: skip
    assert factors == (2, 3, 3, 150, 320 * third)
    assert why.seconds == DEFAULT_CALCULATOR(job)
    text = str(why)
    lines = text.splitlines()
    assert lines[0].startswith("step")
    assert len(lines) == 10
    assert "k_heun, 50 steps" in lines[1]
    assert lines[7].endswith("5086.667 (15260/3)")
    assert lines[9].endswith("15260")


def test_explain_plain_job_multipliers_are_one() -> None:
    why = DEFAULT_CALCULATOR.explain({"width": 512, "height": 512, "steps": 1})
    values: tuple[object, ...] = (
        why.controlnet_multiplier, why.slow_model_multiplier, why.extra_slow_multiplier,
        why.base, why.after_minimum, why.seconds,
    )  # fmt: skip
    assert values == (1, 1, 1, 32, 150, 150)  # base = 30 + 2 * 1 * 1
    assert "max(., minimum 150)" in str(why)


# --- Lease -------------------------------------------------------------------------------------


def test_lease_deadline_remaining_expired() -> None:
    lease = Lease(granted_at=100.0, seconds=430)
    assert lease.deadline == 530.0
    assert lease.remaining(100.0) == 430.0
    assert lease.remaining(529.5) == 0.5
    assert lease.remaining(10_000.0) == 0.0
    assert not lease.expired(529.999)
    assert lease.expired(530.0)
    assert lease.expired(531)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        lease.seconds = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"granted_at": float("nan"), "seconds": 1}, ValueError, "granted_at"),
        ({"granted_at": float("-inf"), "seconds": 1}, ValueError, "granted_at"),
        ({"granted_at": "0", "seconds": 1}, TypeError, "granted_at"),
        ({"granted_at": True, "seconds": 1}, TypeError, "granted_at"),
        ({"granted_at": 0, "seconds": 0}, ValueError, r"seconds must be > 0"),
        ({"granted_at": 0, "seconds": -5.0}, ValueError, "seconds"),
        ({"granted_at": 0, "seconds": float("inf")}, ValueError, "seconds"),
        ({"granted_at": 0, "seconds": None}, TypeError, "seconds"),
    ],
)
def test_lease_validation(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Lease(**kwargs)


@pytest.mark.parametrize(
    ("now", "error"), [(float("nan"), ValueError), (float("inf"), ValueError), ("1", TypeError)]
)
def test_lease_now_must_be_finite(now: Any, error: type[Exception]) -> None:
    lease = Lease(0.0, 150.0)
    with pytest.raises(error, match="now"):
        lease.remaining(now)
    with pytest.raises(error, match="now"):
        lease.expired(now)


def test_public_names() -> None:
    assert set(lease_mod.__all__) == {
        "DEFAULT_CALCULATOR", "FLAT_WORK_SAMPLERS", "SAMPLER_UNITS", "SLOW_BASELINE_MULTIPLIERS",
        "ImageRequest", "Lease", "LeaseCalculator", "LeaseExplanation", "Number", "explain",
        "lease_seconds", "sampler_work",
    }  # fmt: skip
    for name in lease_mod.__all__:
        assert getattr(lease_mod, name) is not None
