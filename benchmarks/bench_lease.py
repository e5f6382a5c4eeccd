"""What a lease costs per pop, beside the bare float arithmetic of the same formula.

Run: ``python benchmarks/bench_lease.py``. Every figure is a ratio to a baseline measured in
the same run (see ``_harness``). Every call goes through ``functools.partial``, baselines too,
so the calling convention costs the same on both sides.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial
from typing import Any

from _harness import per_call, report, section

from prioqueue.lease import (
    DEFAULT_CALCULATOR,
    FLAT_WORK_SAMPLERS,
    SAMPLER_UNITS,
    SLOW_BASELINE_MULTIPLIERS,
    ImageRequest,
    lease_seconds,
)

TYPICAL: dict[str, Any] = {"width": 1024, "height": 1024, "steps": 30, "sampler": "k_euler_a"}
# Every branch taken: the flat-work sampler look-up, both multipliers, five LoRAs, extra slow.
WORST: dict[str, Any] = {
    "width": 2048, "height": 2048, "steps": 150, "sampler": "k_dpm_adaptive", "controlnet": True,
    "baseline": "flux_dev", "loras": 5, "extra_slow_worker": True,
}  # fmt: skip
UNITS = dict(SAMPLER_UNITS)
FLAT = dict(FLAT_WORK_SAMPLERS)
SLOW = {name: float(m) for name, m in SLOW_BASELINE_MULTIPLIERS.items()}


def float_formula(
    *, width: int, height: int, steps: int = 30, sampler: str = "k_euler_a",
    controlnet: bool = False, baseline: str | None = None, loras: int = 0,
    extra_slow_worker: bool = False,
) -> int:  # fmt: skip
    """The same policy in bare floats: no validation, and inexact (1730.0000000000002 -> 1731)."""
    work = FLAT.get(sampler) or UNITS.get(sampler, 1) * steps
    value = 30.0 + 2.0 * work * (width * height / 262144.0)
    if controlnet:
        value *= 2.0
    if baseline is not None:
        value *= SLOW.get(baseline, 1.0)
    value = max(value, 150.0) + loras * (400 * 8 / 30)
    if extra_slow_worker:
        value *= 3.0
    return math.ceil(value)


def fraction_formula(
    *, width: int, height: int, steps: int = 30, sampler: str = "k_euler_a",
    controlnet: bool = False, baseline: str | None = None, loras: int = 0,
    extra_slow_worker: bool = False,
) -> int:  # fmt: skip
    """The same policy in Fractions (no validation): the alternative to integer arithmetic."""
    work = FLAT.get(sampler) or UNITS.get(sampler, 1) * steps
    value = 30 + 2 * work * Fraction(width * height, 262144)
    if controlnet:
        value *= 2
    if baseline is not None and baseline in SLOW:
        value *= 3
    value = max(value, Fraction(150)) + loras * Fraction(320, 3)
    if extra_slow_worker:
        value *= 3
    return math.ceil(value)


class Job:
    """A stand-in for the dispatcher's job: an opaque ``payload``."""

    __slots__ = ("payload",)

    def __init__(self, payload: object) -> None:
        self.payload = payload


def main() -> None:
    for kwargs, expected in ((TYPICAL, 270), (WORST, 25180)):
        assert float_formula(**kwargs) == fraction_formula(**kwargs) == expected
        assert lease_seconds(**kwargs) == expected
    float_typical = per_call(partial(float_formula, **TYPICAL))
    float_worst = per_call(partial(float_formula, **WORST))
    calc = DEFAULT_CALCULATOR
    cases = (("typical", TYPICAL, float_typical), ("worst case", WORST, float_worst))

    section("lease_seconds() vs the bare float formula (same keyword call)")
    for label, kwargs, baseline in cases:
        cost = per_call(partial(lease_seconds, **kwargs))
        report(f"lease_seconds({label})", cost, "float formula", baseline)

    section("LeaseCalculator.__call__ on a job's payload vs the bare float formula")
    for label, kwargs, baseline in cases:
        mapping_job, request_job = Job(dict(kwargs)), Job(ImageRequest(**kwargs))
        cost = per_call(partial(calc, mapping_job))
        report(f"calc(Job(dict)) {label}", cost, "float formula", baseline)
        cost = per_call(partial(calc, request_job))
        report(f"calc(Job(ImageRequest)) {label}", cost, "float formula", baseline)

    section("Exact arithmetic: integers (the module) vs Fractions, both vs floats")
    for label, kwargs, baseline in cases:
        cost = per_call(partial(fraction_formula, **kwargs))
        report(f"Fraction formula, no checks ({label})", cost, "float formula", baseline)
    cost = per_call(partial(calc.explain, WORST))
    report("explain(worst case)", cost, "float formula", float_worst)


if __name__ == "__main__":
    main()
