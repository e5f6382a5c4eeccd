"""How long a popped image job may run before it counts as lost: the prefetch lease.

Theory of operation. The lease is a conservative, deterministic pop-to-submit deadline (AI
Horde's "image job TTL as a conservative prefetch lease"). It is fixed at pop time from the
request alone, never from worker-reported speed or queue internals, and it is generous on
purpose: a worker may keep one comparable job prefetched while it runs the current one. The
rules this file keeps:

1. ``W`` is the estimated sampler work: ``steps`` times the sampler's units per step (1, 2 or
   3; see :data:`SAMPLER_UNITS`), or a flat estimate whatever the steps for adaptive samplers
   (:data:`FLAT_WORK_SAMPLERS`). Sampler names match case-sensitively, as AI Horde's do
   (``"DDIM"`` and ``"ddim"`` are separate entries). An unknown name counts 1 unit per step,
   for compatibility, unless the calculator is strict, when it raises ``ValueError``.
2. ``P = width * height / 512**2`` is the pixel ratio.
3. ``base = 30 + 2 * W * P`` seconds.
4. ControlNet multiplies by 2.
5. A slow baseline (Flux, Qwen Image, Z-Image Turbo, ...) multiplies by its multiplier (3).
6. The 150 s minimum applies: ``max(value, 150)``.
7. Each LoRA adds ``400 MB * 8 / 30 Mbps = 106.666...`` s (at most 5 LoRAs). It comes after
   the minimum, so short jobs are not swallowed by the floor, and it does not scale with pixels.
8. An extra-slow worker multiplies by 3.
9. The result rounds up to whole seconds.

The order is the policy: moving a multiplier across the minimum changes short-job leases.
Every step is exact (integers and :class:`fractions.Fraction`), so a mathematically whole value
is never rounded up by float error, and every lease is a positive ``int``. The scalable term is
0.131072 megapixel-work units per second: about 3.8 times isolated compute time at the 0.5 MPS
normal-speed classification, about 1.9 times with one equally expensive job prefetched.

Every constant is a field of :class:`LeaseCalculator`, validated when it is made. A calculation
is O(1): a few integer operations and two dictionary look-ups.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import attrs

from prioqueue._lease_checks import (
    ABOVE_0,
    AT_LEAST_0,
    AT_LEAST_1,
    Number,
    check_multipliers,
    check_strict,
    check_units_table,
    config_int,
    exact,
    fraction_pair,
    read_only,
)
from prioqueue._samplers import FLAT_WORK_SAMPLERS, SAMPLER_UNITS, _work, sampler_work
from prioqueue.errors import ConfigError
from prioqueue.lease_values import (
    ImageRequest,
    Lease,
    LeaseExplanation,
    _check_baseline,
    _check_bool,
    _check_loras,
    _check_positive_int,
    _check_sampler,
    _request_kwargs,
)

__all__ = [
    "DEFAULT_CALCULATOR",
    "FLAT_WORK_SAMPLERS",
    "SAMPLER_UNITS",
    "SLOW_BASELINE_MULTIPLIERS",
    "ImageRequest",
    "Lease",
    "LeaseCalculator",
    "LeaseExplanation",
    "Number",
    "explain",
    "lease_seconds",
    "sampler_work",
]

_SLOW_BASELINES = ("flux_1", "flux_schnell", "flux_dev", "qwen_image", "z_image_turbo")
SLOW_BASELINE_MULTIPLIERS: Mapping[str, Number] = MappingProxyType(
    dict.fromkeys((*_SLOW_BASELINES, "krea2_turbo", "anima"), 3)
)
"""Lease multiplier of each slow model baseline (read-only, case-sensitive)."""

_BOOL: type = bool  # typed loosely, so mypy does not call the fast path's bool check unreachable


@attrs.frozen(kw_only=True)
class LeaseCalculator:
    """The lease policy, every constant a field with the ADR's default.

    Numeric constants accept ``int``, ``Fraction``, ``Decimal`` or ``float`` (read as its
    shortest repr, so ``0.1`` means one tenth); the arithmetic is exact whatever the type.

    Args:
        fixed_seconds: The fixed term of the base, >= 0 (30).
        seconds_per_work_pixel_unit: Seconds per unit of ``W * P``, > 0 (2).
        reference_side: The side of the reference square in ``P``, an int >= 1 (512).
        controlnet_multiplier: Factor for ControlNet, >= 1 (2).
        slow_baseline_multipliers: Baseline name -> factor (each >= 1); stored read-only.
        minimum_seconds: The floor applied after the multipliers, > 0 (150).
        lora_file_megabytes: Largest permitted LoRA file in MB, >= 0 (400).
        lora_bandwidth_mbps: Assumed download bandwidth in Mbps, > 0 (30).
        max_loras: Most LoRAs one request may name, an int >= 0 (5).
        extra_slow_multiplier: Factor for an extra-slow worker, >= 1 (3).
        strict_samplers: If true, an unknown sampler raises instead of counting 1 unit/step.
        sampler_units: Sampler name -> units per step (ints >= 1); stored read-only.
        flat_work_samplers: Sampler name -> flat work whatever the steps; stored read-only.
        normal_speed_mps: The normal-speed classification in megapixel-steps per second, > 0
            (0.5); used only by the documented headroom properties.

    Raises:
        ConfigError: A constant breaks its rule (the message names the field and the rule).
    """

    fixed_seconds: Number = attrs.field(default=30, validator=AT_LEAST_0)
    seconds_per_work_pixel_unit: Number = attrs.field(default=2, validator=ABOVE_0)
    reference_side: int = attrs.field(default=512, validator=config_int(1))
    controlnet_multiplier: Number = attrs.field(default=2, validator=AT_LEAST_1)
    slow_baseline_multipliers: Mapping[str, Number] = attrs.field(
        default=SLOW_BASELINE_MULTIPLIERS, converter=read_only, validator=check_multipliers,
        hash=False,
    )  # fmt: skip
    minimum_seconds: Number = attrs.field(default=150, validator=ABOVE_0)
    lora_file_megabytes: Number = attrs.field(default=400, validator=AT_LEAST_0)
    lora_bandwidth_mbps: Number = attrs.field(default=30, validator=ABOVE_0)
    max_loras: int = attrs.field(default=5, validator=config_int(0))
    extra_slow_multiplier: Number = attrs.field(default=3, validator=AT_LEAST_1)
    strict_samplers: bool = attrs.field(default=False, validator=check_strict)
    sampler_units: Mapping[str, int] = attrs.field(
        default=SAMPLER_UNITS, converter=read_only, validator=check_units_table, hash=False
    )
    flat_work_samplers: Mapping[str, int] = attrs.field(
        default=FLAT_WORK_SAMPLERS, converter=read_only, validator=check_units_table, hash=False
    )
    normal_speed_mps: Number = attrs.field(default=Fraction(1, 2), validator=ABOVE_0)

    # Precomputed integer form of the policy (the fast path), set in __attrs_post_init__.
    _units: dict[str, int] = attrs.field(init=False, repr=False, eq=False)
    _flat: dict[str, int] = attrs.field(init=False, repr=False, eq=False)
    _slow: dict[str, tuple[int, int]] = attrs.field(init=False, repr=False, eq=False)
    _plan: tuple[int, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        both = sorted(set(self.sampler_units) & set(self.flat_work_samplers))
        if both:
            raise ConfigError(
                f"LeaseCalculator.sampler_units and flat_work_samplers must not share names, "
                f"both have {both!r}"
            )
        fn, fd = fraction_pair(self.fixed_seconds)
        kn, kd = fraction_pair(self.seconds_per_work_pixel_unit)
        area = self.reference_side**2
        # base = fixed + k * W * pixels / area = (A + B * W * pixels) / D
        plan = (
            fn * kd * area, kn * fd, fd * kd * area,
            *fraction_pair(self.controlnet_multiplier),
            *fraction_pair(self.minimum_seconds),
            *fraction_pair(self.lora_seconds),
            *fraction_pair(self.extra_slow_multiplier),
        )  # fmt: skip
        object.__setattr__(self, "_units", dict(self.sampler_units))
        object.__setattr__(self, "_flat", dict(self.flat_work_samplers))
        slow = {name: fraction_pair(m) for name, m in self.slow_baseline_multipliers.items()}
        object.__setattr__(self, "_slow", slow)
        object.__setattr__(self, "_plan", plan)

    @property
    def lora_seconds(self) -> Fraction:
        """The allowance per LoRA: ``megabytes * 8 / Mbps`` (320/3 s by default). O(1)."""
        return exact(self.lora_file_megabytes) * 8 / exact(self.lora_bandwidth_mbps)

    @property
    def megapixel_work_per_second(self) -> Fraction:
        """Throughput the scalable term assumes, in megapixel-work units per second. O(1).

        ``reference_side**2 / 1e6 / seconds_per_work_pixel_unit``: 0.131072 by default.
        """
        return Fraction(self.reference_side**2, 10**6) / exact(self.seconds_per_work_pixel_unit)

    @property
    def isolated_compute_factor(self) -> Fraction:
        """Scalable time over isolated compute time at ``normal_speed_mps`` (~3.81x). O(1)."""
        return exact(self.normal_speed_mps) / self.megapixel_work_per_second

    @property
    def prefetch_headroom_factor(self) -> Fraction:
        """The same with one equally expensive job prefetched ahead (~1.91x). O(1)."""
        return self.isolated_compute_factor / 2

    def work(self, sampler: str, steps: int) -> int:
        """Estimated sampler work ``W`` under this calculator's tables. O(1).

        Args:
            sampler: Sampler name (case-sensitive).
            steps: Requested steps, a positive int.

        Returns:
            ``units * steps``, the flat estimate for adaptive samplers, or ``steps`` for an
            unknown sampler.

        Raises:
            TypeError: Wrong argument types.
            ValueError: ``steps`` < 1, or an unknown sampler in strict mode.
        """
        _check_sampler(sampler)
        _check_positive_int("steps", steps)
        return _work(self._units, self._flat, self.strict_samplers, sampler, steps)

    def seconds(
        self,
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
        """The lease in whole seconds for one request. O(1), exact integer arithmetic.

        Args:
            width: Image width in pixels, a positive int.
            height: Image height in pixels, a positive int.
            steps: Trajectory steps, a positive int.
            sampler: Sampler name (case-sensitive).
            controlnet: Whether ControlNet is used.
            baseline: The selected model's baseline, or None.
            loras: Number of LoRAs, ``0 <= loras <= max_loras`` (5 by default).
            extra_slow_worker: Whether the worker is marked extra slow.

        Returns:
            A positive int, at least ``ceil(minimum_seconds)`` (150 by default).

        Raises:
            TypeError: An argument has the wrong type (``bool`` is not an int here).
            ValueError: An argument is out of range, or an unknown sampler in strict mode.
        """
        if type(width) is not int or width <= 0:
            _check_positive_int("width", width)
        if type(height) is not int or height <= 0:
            _check_positive_int("height", height)
        if type(steps) is not int or steps <= 0:
            _check_positive_int("steps", steps)
        if type(controlnet) is not _BOOL:
            _check_bool("controlnet", controlnet)
        if type(extra_slow_worker) is not _BOOL:
            _check_bool("extra_slow_worker", extra_slow_worker)
        if type(loras) is not int or not 0 <= loras <= self.max_loras:
            _check_loras(loras, self.max_loras)
        if type(sampler) is not str:
            _check_sampler(sampler)
        if baseline is not None and type(baseline) is not str:
            _check_baseline(baseline)
        return self._lease(
            width, height, steps, sampler, controlnet, baseline, loras, extra_slow_worker
        )

    def _lease(  # positional on purpose: this is the hot path
        self,
        width: int,
        height: int,
        steps: int,
        sampler: str,
        controlnet: bool,
        baseline: str | None,
        loras: int,
        extra_slow_worker: bool,
    ) -> int:
        """The exact integer computation, for arguments already validated."""
        per_step = self._units.get(sampler)
        if per_step is not None:
            work = per_step * steps
        else:
            work = _work(self._units, self._flat, self.strict_samplers, sampler, steps)
        a, b, den, cn, cd, mn, md, ln, ld, xn, xd = self._plan
        num = a + b * work * width * height
        if controlnet:
            num *= cn
            den *= cd
        if baseline is not None:
            slow = self._slow.get(baseline)
            if slow is not None:
                num *= slow[0]
                den *= slow[1]
        if num * md < mn * den:
            num, den = mn, md
        if loras:
            num = num * ld + loras * ln * den
            den *= ld
        if extra_slow_worker:
            num *= xn
            den *= xd
        return -(-num // den)

    def for_request(self, request: ImageRequest) -> int:
        """The lease in whole seconds for an :class:`ImageRequest`. O(1).

        Args:
            request: The request.

        Returns:
            A positive int, as :meth:`seconds`.

        Raises:
            TypeError: ``request`` is not an ImageRequest.
            ValueError: Too many LoRAs for this calculator, or an unknown sampler in strict mode.
        """
        if not isinstance(request, ImageRequest):
            raise TypeError(f"request must be an ImageRequest, got {type(request).__name__}")
        r = request  # validated when it was made; only the calculator's own bounds remain
        if r.loras > self.max_loras:
            _check_loras(r.loras, self.max_loras)
        return self._lease(
            r.width, r.height, r.steps, r.sampler, r.controlnet, r.baseline, r.loras,
            r.extra_slow_worker,
        )  # fmt: skip

    def __call__(self, job: object) -> int:
        """The lease for a request, so a calculator can serve as a dispatcher's ``lease_for``.

        O(1) (plus O(k) in the keys of a mapping).

        Args:
            job: An :class:`ImageRequest`, a mapping of :meth:`seconds`' keyword arguments
                (no other keys), or an object whose ``payload`` attribute holds one of those.
                An exact ``ImageRequest`` or ``dict`` is preferred, the job before its
                payload; then subclasses and other mappings, the job before its payload.

        Returns:
            A positive int, as :meth:`seconds`.

        Raises:
            TypeError: ``job`` is none of those, or a key or value is wrong.
            ValueError: A value is out of range.
        """
        source = _request_source(job)
        if isinstance(source, ImageRequest):
            return self.for_request(source)
        return self.seconds(**_request_kwargs(source))

    def explain(self, job: object) -> LeaseExplanation:
        """Every step of the calculation for ``job``, as exact Fractions. O(1).

        This is the plain Fraction form of the policy (the reference the integer fast path is
        tested against); its ``seconds`` equals what :meth:`__call__` returns for ``job``.

        Args:
            job: Anything :meth:`__call__` accepts.

        Returns:
            The explanation; ``str()`` of it is a small table.

        Raises:
            TypeError: ``job`` is not a request (see :meth:`__call__`).
            ValueError: A value is out of range, or an unknown sampler in strict mode.
        """
        source = _request_source(job)
        request = source if isinstance(source, ImageRequest) else ImageRequest.from_mapping(source)
        if request.loras > self.max_loras:
            _check_loras(request.loras, self.max_loras)
        one = Fraction(1)
        work = self.work(request.sampler, request.steps)
        ratio = Fraction(request.width * request.height, self.reference_side**2)
        base = exact(self.fixed_seconds) + exact(self.seconds_per_work_pixel_unit) * work * ratio
        cn = exact(self.controlnet_multiplier) if request.controlnet else one
        slow_table, baseline = self.slow_baseline_multipliers, request.baseline
        slow = (
            exact(slow_table[baseline]) if baseline is not None and baseline in slow_table else one
        )
        extra = exact(self.extra_slow_multiplier) if request.extra_slow_worker else one
        after_cn = base * cn
        after_slow = after_cn * slow
        after_min = max(after_slow, exact(self.minimum_seconds))
        after_loras = after_min + self.lora_seconds * request.loras
        after_extra = after_loras * extra
        return LeaseExplanation(
            request=request, work=work, pixel_ratio=ratio, base=base,
            controlnet_multiplier=cn, after_controlnet=after_cn,
            slow_model_multiplier=slow, after_slow_model=after_slow,
            minimum_seconds=exact(self.minimum_seconds), after_minimum=after_min,
            lora_seconds=self.lora_seconds * request.loras, after_loras=after_loras,
            extra_slow_multiplier=extra, after_extra_slow=after_extra,
            seconds=math.ceil(after_extra),
        )  # fmt: skip


_MISSING = object()


def _request_source(job: object) -> ImageRequest | Mapping[Any, Any]:
    """Return ``job`` or its ``payload``, whichever is an ImageRequest or a mapping.

    Exact ``ImageRequest`` and ``dict`` are tried first (cheap type checks; an ABC check
    costs several hundred ns), the job before its payload; then subclasses and other mappings.
    """
    if type(job) in _EXACT_SOURCES:
        return job  # type: ignore[return-value]
    payload = getattr(job, "payload", _MISSING)
    if type(payload) in _EXACT_SOURCES:
        return payload  # type: ignore[return-value]
    for candidate in (job, payload):
        if isinstance(candidate, ImageRequest | Mapping):
            return candidate
    where = "" if payload is _MISSING else f" (its payload is a {type(payload).__name__})"
    raise TypeError(
        "a lease needs an ImageRequest, a mapping of lease arguments, or an object whose "
        f"payload is one of those; got {type(job).__name__}{where}"
    )


_EXACT_SOURCES = (ImageRequest, dict)


DEFAULT_CALCULATOR = LeaseCalculator()
"""The calculator with the ADR's constants, used by the module functions."""


def lease_seconds(
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
    """The lease in whole seconds under the ADR's defaults. O(1).

    The default calculator's :meth:`LeaseCalculator.seconds`, as a function of its own, so an
    error names ``lease_seconds()`` (an AI Horde ``control_type`` is ``controlnet=True`` here).

    Args:
        width: Image width in pixels, a positive int.
        height: Image height in pixels, a positive int.
        steps: Trajectory steps, a positive int.
        sampler: Sampler name (case-sensitive).
        controlnet: Whether ControlNet is used.
        baseline: The selected model's baseline, or None.
        loras: Number of LoRAs, ``0 <= loras <= 5``.
        extra_slow_worker: Whether the worker is marked extra slow.

    Returns:
        A positive int, at least 150.

    Raises:
        TypeError: An argument has the wrong type, or a keyword this function does not take.
        ValueError: An argument is out of range, or a sampler name that differs from a known
            one only by case.
    """
    return DEFAULT_CALCULATOR.seconds(**locals())  # its keyword arguments, as given


explain = DEFAULT_CALCULATOR.explain
"""Every step of a lease under the ADR's defaults (see :meth:`LeaseCalculator.explain`)."""
