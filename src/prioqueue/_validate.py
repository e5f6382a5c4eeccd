"""Argument checks shared by the library's modules (private).

It imports only :mod:`prioqueue.errors`, so any module may use it without an import circle.
Each returns the checked value or raises the documented exception with a message that names
the argument and what is allowed.
"""

from __future__ import annotations

import math

from prioqueue.errors import ConfigError

__all__: list[str] = []  # private module

#: The largest magnitude a time or a duration may have (seconds, about 31.7 million years).
#: Beyond it, adding seconds to a time loses the float resolution that aging needs.
TIME_LIMIT = 1e15


def finite(name: str, value: object) -> float:
    """Return ``value`` as a float.

    Raises:
        ValueError: Unless it is a real number (not bool) with ``|value| <= TIME_LIMIT``.
    """
    if value.__class__ is float and -TIME_LIMIT <= value <= TIME_LIMIT:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if -TIME_LIMIT <= number <= TIME_LIMIT:
            return number
    shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
    raise ValueError(
        f"{name} must be a finite number of seconds, got {shown} (at most 1e15 in magnitude)"
    )


def positive_or_none(name: str, value: object) -> float | None:
    """Return None or a finite number > 0; ValueError otherwise."""
    if value is None:
        return None
    number = finite(name, value)
    if number <= 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return number


def count(name: str, value: object) -> int:
    """Return an int >= 0 (bools refused); ValueError naming ``name`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def flag(name: str, value: object) -> bool:
    """Return a bool (ints refused); ValueError naming ``name`` otherwise."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def count_or_none(name: str, value: object) -> int | None:
    """Return None or an int >= 0 (bools refused); ValueError naming ``name`` otherwise."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
    return value


def limit(name: str, value: object) -> int | None:
    """Return None or an int >= 1; ConfigError otherwise."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive int or None, got {value!r}")
    return value


def checked_name(field: str, value: object) -> str:
    """Return a non-empty str; ValueError otherwise."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field} must be a non-empty str, got {value!r}")
    return value
