"""The checks of a :class:`~prioqueue.lease.LeaseCalculator`'s constants, and exact numbers.

Part of :mod:`prioqueue.lease`, which re-exports :data:`Number`; import it from there. Every
check raises :class:`~prioqueue.ConfigError` naming the field (``LeaseCalculator.max_loras``)
and its rule. :func:`exact` reads any :data:`Number` as a :class:`~fractions.Fraction` (a
float as its shortest repr), so the calculator's arithmetic is exact whatever the type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import attrs

from prioqueue.errors import ConfigError

__all__ = [
    "ABOVE_0",
    "AT_LEAST_0",
    "AT_LEAST_1",
    "Number",
    "check_multipliers",
    "check_strict",
    "check_units_table",
    "config_int",
    "exact",
    "fraction_pair",
    "read_only",
]

Number = int | float | Fraction | Decimal
"""A calculator constant: exact types are kept exact; a float is read as its shortest repr."""


def exact(value: Number) -> Fraction:
    """Return ``value`` as an exact Fraction; a float is read as its shortest decimal repr."""
    if isinstance(value, float):
        return Fraction(repr(value))
    return Fraction(value)


def _config_number(minimum: int, *, inclusive: bool = True) -> Any:
    """Build an attrs validator: a finite real number ``>= minimum`` (or ``> minimum``)."""
    rule = f"a finite number {'>=' if inclusive else '>'} {minimum}"

    def validate(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        _config_value(f"LeaseCalculator.{attribute.name}", value, minimum, inclusive, rule)

    return validate


def _config_value(name: str, value: object, minimum: int, inclusive: bool, rule: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction | Decimal):
        raise ConfigError(f"{name} must be {rule}, got {value!r} ({type(value).__name__})")
    if isinstance(value, Decimal):
        finite = value.is_finite()
    else:
        finite = not isinstance(value, float) or math.isfinite(value)
    if not finite or value < minimum or (not inclusive and value == minimum):
        raise ConfigError(f"{name} must be {rule}, got {value!r}")


AT_LEAST_0 = _config_number(0)
AT_LEAST_1 = _config_number(1)
ABOVE_0 = _config_number(0, inclusive=False)


def config_int(minimum: int) -> Any:
    """Build an attrs validator: an int (not a bool) ``>= minimum``."""

    def validate(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(
                f"LeaseCalculator.{attribute.name} must be an int >= {minimum}, got {value!r}"
            )

    return validate


def read_only(value: object) -> object:
    """Convert for attrs: a private read-only copy of a mapping (anything else is validated)."""
    return MappingProxyType(dict(value)) if isinstance(value, Mapping) else value


def _check_table(
    attribute: attrs.Attribute[Any], value: object, what: str, keys: str,
    check_entry: Callable[[str, object], None],
) -> None:  # fmt: skip
    """Validate a mapping of non-empty str names (``keys``) -> values ``check_entry`` accepts."""
    name = f"LeaseCalculator.{attribute.name}"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a mapping of {what}, got {value!r}")
    for key, entry in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{name} keys must be non-empty str {keys}, got {key!r}")
        check_entry(f"{name}[{key!r}]", entry)


def _units(name: str, units: object) -> None:
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {units!r}")


def _multiplier(name: str, multiplier: object) -> None:
    _config_value(name, multiplier, 1, True, "a finite number >= 1")


def check_units_table(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate a sampler table: non-empty str names -> ints >= 1."""
    _check_table(attribute, value, "sampler name -> units", "sampler names", _units)


def check_multipliers(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate a baseline table: non-empty str names -> finite numbers >= 1."""
    _check_table(attribute, value, "baseline -> multiplier", "baselines", _multiplier)


def check_strict(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate a flag: a bool."""
    if not isinstance(value, bool):
        raise ConfigError(f"LeaseCalculator.{attribute.name} must be a bool, got {value!r}")


def fraction_pair(value: Number) -> tuple[int, int]:
    """``(numerator, denominator)`` of ``value`` read exactly (see :func:`exact`)."""
    fraction = exact(value)
    return fraction.numerator, fraction.denominator
