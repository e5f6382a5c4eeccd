"""The lease's values and argument checks: ``ImageRequest``, ``Lease``, ``LeaseExplanation``.

Part of :mod:`prioqueue.lease`, which re-exports every public name here; import them from
there. The checks raise ``TypeError`` for a wrong type and ``ValueError`` for a value out of
range, each message naming the argument and what is allowed. They are shared by the values'
validators, :class:`~prioqueue.lease.LeaseCalculator`'s fast path and
:func:`~prioqueue.lease.sampler_work`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import attrs

__all__ = ["ImageRequest", "Lease", "LeaseExplanation"]

_INF = math.inf
_REQUEST_KEYS = frozenset(
    ("width", "height", "steps", "sampler", "controlnet", "baseline", "loras", "extra_slow_worker")
)


# --- validation helpers ------------------------------------------------------------------------


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int (>= 1), got {value!r}")


def _check_loras(value: object, max_loras: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"loras must be an int count, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"loras must be >= 0, got {value!r}")
    if max_loras is not None and value > max_loras:
        raise ValueError(f"loras must be at most max_loras={max_loras}, got {value!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")


def _check_sampler(value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"sampler must be a str, got {value!r} ({type(value).__name__})")


def _check_baseline(value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"baseline must be a str or None, got {value!r} ({type(value).__name__})")


def _check_real(name: str, value: object) -> float:
    if value.__class__ is float and -_INF < value < _INF:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a finite number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


# --- values ------------------------------------------------------------------------------------


def _v_positive_int(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    _check_positive_int(attribute.name, value)


@attrs.frozen(kw_only=True)
class ImageRequest:
    """The inputs of one lease calculation, validated when made.

    Args:
        width: Image width in pixels, a positive int (``bool`` is rejected).
        height: Image height in pixels, a positive int.
        steps: Requested trajectory steps, a positive int (default 30).
        sampler: Sampler name, case-sensitive (default ``"k_euler_a"``).
        controlnet: Whether the request uses ControlNet.
        baseline: The selected model's baseline (e.g. ``"flux_1"``), or None.
        loras: How many LoRAs the request names, an int >= 0 (the calculator checks the
            upper bound, its ``max_loras``).
        extra_slow_worker: Whether the worker is marked extra slow.

    Raises:
        TypeError: A field has the wrong type.
        ValueError: A field is out of range.
    """

    width: int = attrs.field(validator=_v_positive_int)
    height: int = attrs.field(validator=_v_positive_int)
    steps: int = attrs.field(default=30, validator=_v_positive_int)
    sampler: str = attrs.field(default="k_euler_a", validator=lambda _i, _a, v: _check_sampler(v))
    controlnet: bool = attrs.field(default=False, validator=lambda _i, a, v: _check_bool(a.name, v))
    baseline: str | None = attrs.field(default=None, validator=lambda _i, _a, v: _check_baseline(v))
    loras: int = attrs.field(default=0, validator=lambda _i, _a, v: _check_loras(v, None))
    extra_slow_worker: bool = attrs.field(
        default=False, validator=lambda _i, a, v: _check_bool(a.name, v)
    )

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> ImageRequest:
        """Build a request from a mapping of the keyword arguments.

        Args:
            mapping: Keys among the field names; ``width`` and ``height`` are required.

        Returns:
            The validated request.

        Raises:
            TypeError: A key is unknown or missing, or a value has the wrong type.
            ValueError: A value is out of range.
        """
        return cls(**_request_kwargs(mapping))


def _request_kwargs(mapping: Mapping[Any, Any]) -> Mapping[str, Any]:
    if mapping.keys() <= _REQUEST_KEYS and "width" in mapping and "height" in mapping:
        return mapping
    unknown = [key for key in mapping if key not in _REQUEST_KEYS]
    if unknown:
        raise TypeError(
            f"unknown lease argument(s) {unknown!r}; allowed: {', '.join(sorted(_REQUEST_KEYS))}"
        )
    missing = [key for key in ("width", "height") if key not in mapping]
    raise TypeError(f"missing required lease argument(s) {missing!r}")


@attrs.frozen
class Lease:
    """A granted lease: the job belongs to its worker until ``deadline``.

    Args:
        granted_at: When the lease was granted (monotonic seconds), finite.
        seconds: The lease length, finite and > 0.

    Raises:
        TypeError: A field is not a real number.
        ValueError: A field is not finite, or ``seconds`` is not > 0.
    """

    granted_at: float = attrs.field(validator=lambda _i, a, v: _check_real(a.name, v))
    seconds: float = attrs.field()

    @seconds.validator
    def _check_seconds(self, attribute: attrs.Attribute[float], value: object) -> None:
        if _check_real(attribute.name, value) <= 0:
            raise ValueError(f"seconds must be > 0, got {value!r}")

    @property
    def deadline(self) -> float:
        """``granted_at + seconds``: the first instant at which the lease is expired. O(1)."""
        return self.granted_at + self.seconds

    def remaining(self, now: float) -> float:
        """Seconds left at ``now``: ``max(0.0, deadline - now)``, never negative. O(1).

        Args:
            now: The current monotonic time, finite.

        Returns:
            The seconds left.

        Raises:
            TypeError: ``now`` is not a real number.
            ValueError: ``now`` is not finite.
        """
        _check_real("now", now)
        return max(0.0, self.deadline - now)

    def expired(self, now: float) -> bool:
        """Whether the lease has run out at ``now`` (``now >= deadline``). O(1).

        Args:
            now: The current monotonic time, finite.

        Returns:
            True once ``now`` reaches the deadline.

        Raises:
            TypeError: ``now`` is not a real number.
            ValueError: ``now`` is not finite.
        """
        _check_real("now", now)
        return now >= self.deadline


def _fmt(value: Fraction | int) -> str:
    if isinstance(value, int) or value.denominator == 1:
        return str(int(value))
    return f"{float(value):.3f} ({value})"


@attrs.frozen(kw_only=True)
class LeaseExplanation:
    """Each step of one lease calculation, in the policy's order, with exact values.

    ``str()`` renders a small table, so an operator sees why a lease is what it is.
    """

    request: ImageRequest
    work: int
    pixel_ratio: Fraction
    base: Fraction
    controlnet_multiplier: Fraction
    after_controlnet: Fraction
    slow_model_multiplier: Fraction
    after_slow_model: Fraction
    minimum_seconds: Fraction
    after_minimum: Fraction
    lora_seconds: Fraction
    after_loras: Fraction
    extra_slow_multiplier: Fraction
    after_extra_slow: Fraction
    seconds: int

    def __str__(self) -> str:
        r = self.request
        rows: list[tuple[str, Fraction | int]] = [
            (f"sampler work W ({r.sampler}, {r.steps} steps)", self.work),
            (f"pixel ratio P ({r.width}x{r.height} / reference area)", self.pixel_ratio),
            ("base = fixed + k * W * P", self.base),
            (f"x controlnet ({_fmt(self.controlnet_multiplier)})", self.after_controlnet),
            (
                f"x slow model ({r.baseline}: {_fmt(self.slow_model_multiplier)})",
                self.after_slow_model,
            ),
            (f"max(., minimum {_fmt(self.minimum_seconds)})", self.after_minimum),
            (f"+ loras ({r.loras}: {_fmt(self.lora_seconds)})", self.after_loras),
            (f"x extra-slow worker ({_fmt(self.extra_slow_multiplier)})", self.after_extra_slow),
            ("lease seconds (rounded up)", self.seconds),
        ]
        width = max(len(label) for label, _ in rows)
        lines = [f"{'step':<{width}}  value"]
        lines += [f"{label:<{width}}  {_fmt(value)}" for label, value in rows]
        return "\n".join(lines)
