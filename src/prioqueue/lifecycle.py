"""Job lifecycle values: retry backoff and per-level queue budgets (issues 17 and 18).

The model (states, transitions, invariants) is docs/design/lifecycle.md. These values are
immutable and validated at construction; the dispatchers take them as ``backoff=`` and
``budgets=`` and each ``submit`` may carry its own ``backoff``, ``max_attempts``, ``ttl`` and
``not_before``.

Example:
    >>> b = Backoff(kind="exponential", base=2.0, max=60.0)
    >>> [b.delay("job-1", attempt) for attempt in (1, 2, 3, 10)]
    [2.0, 4.0, 8.0, 60.0]
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from prioqueue.errors import ConfigError

__all__ = ["BACKOFF_KINDS", "Backoff", "BackoffKind", "LevelBudget"]

BackoffKind = Literal["constant", "linear", "exponential"]

#: The backoff kinds, in documentation order.
BACKOFF_KINDS: tuple[str, ...] = ("constant", "linear", "exponential")

_LIMIT = 1e15  # the largest duration a core time may carry (seconds)


def _check_table(data: object, where: str, allowed: tuple[str, ...]) -> None:
    """Refuse ``data`` unless it is a mapping whose keys are all in ``allowed``.

    Raises:
        ConfigError: Not a mapping, or an unknown key; the message names ``where``.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a table/object, got {data!r}")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")


def _seconds(field: str, value: object, *, positive: bool) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not (value > 0 if positive else value >= 0)
        or value > _LIMIT
    ):
        what = "> 0" if positive else ">= 0"
        raise ConfigError(f"{field} must be a finite number of seconds {what}, got {value!r}")
    return float(value)


@attrs.frozen
class Backoff:
    """How long a job that failed with ``retry=True`` waits before its next attempt.

    The delay after failed attempt ``n`` (1-based) is ``base`` (constant), ``base * n``
    (linear) or ``base * 2 ** (n - 1)`` (exponential), capped at ``max``. With ``jitter`` it is
    multiplied by ``0.5 + u / 2`` where ``u`` in ``[0, 1)`` is derived from the job id and
    the attempt (SHA-256): spread like random jitter, but the same on every replay.

    Attributes:
        kind: ``"constant"``, ``"linear"`` or ``"exponential"``.
        base: Seconds (>= 0).
        max: The longest delay in seconds (>= 0; default one hour).
        jitter: Spread the delays (deterministically, see above).

    Raises:
        ConfigError: A field is out of range (the message names it).
    """

    kind: BackoffKind = "constant"
    base: float = 0.0
    max: float = 3600.0
    jitter: bool = False

    def __attrs_post_init__(self) -> None:
        if self.kind not in BACKOFF_KINDS:
            raise ConfigError(
                f"backoff.kind must be one of {', '.join(BACKOFF_KINDS)}, got {self.kind!r}"
            )
        object.__setattr__(self, "base", _seconds("backoff.base", self.base, positive=False))
        object.__setattr__(self, "max", _seconds("backoff.max", self.max, positive=False))
        if not isinstance(self.jitter, bool):
            raise ConfigError(f"backoff.jitter must be a bool, got {self.jitter!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "backoff") -> Backoff:
        """Build a backoff from JSON or TOML data (``kind``, ``base``, ``max``, ``jitter``).

        Raises:
            ConfigError: An unknown key or a bad value; the message names ``where.key``.
        """
        _check_table(data, where, ("kind", "base", "max", "jitter"))
        try:
            return cls(**dict(data))
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("backoff.", f"{where}.", 1)) from None

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain JSON data (what :meth:`from_mapping` reads)."""
        return {"kind": self.kind, "base": self.base, "max": self.max, "jitter": self.jitter}

    def delay(self, job_id: str, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) of ``job_id``. O(len(id))."""
        n = max(1, attempt)
        if self.kind == "constant":
            raw = self.base
        elif self.kind == "linear":
            raw = self.base * n
        else:
            raw = self.base * 2.0 ** min(n - 1, 1000) if self.base else 0.0
        delay = min(raw, self.max)
        if self.jitter and delay > 0:
            digest = hashlib.sha256(f"{job_id}\x00{attempt}".encode()).digest()
            u = int.from_bytes(digest[:8], "big") / 2.0**64
            delay *= 0.5 + u / 2.0
        return delay


NO_BACKOFF = Backoff()
"""Retry at once (the dispatchers' default)."""


@attrs.frozen
class LevelBudget:
    """Overload protection for one priority level; every field None means no limit.

    Attributes:
        max_queued: Most jobs queued or delayed at the level; a submit over it raises
            ``QueueFull`` with ``scope="level"`` (HTTP 429).
        max_wait: Longest forecast wait (seconds) a submit may face; over it the submit raises
            ``Overloaded`` (HTTP 503), whose ``retry_after`` says when it may fit.
        ttl: The default ``ttl`` of the level's jobs (a submit's own ``ttl`` wins).

    Raises:
        ConfigError: A field is out of range (the message names it).
    """

    max_queued: int | None = None
    max_wait: float | None = None
    ttl: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_queued is not None and (
            not isinstance(self.max_queued, int)
            or isinstance(self.max_queued, bool)
            or self.max_queued < 1
        ):
            raise ConfigError(f"max_queued must be an int >= 1 or None, got {self.max_queued!r}")
        for name in ("max_wait", "ttl"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _seconds(name, value, positive=True))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "budget") -> LevelBudget:
        """Build a budget from TOML or JSON data (``max_queued``, ``max_wait``, ``ttl``).

        Raises:
            ConfigError: An unknown key or a bad value; the message names ``where.key``.
        """
        _check_table(data, where, ("max_queued", "max_wait", "ttl"))
        try:
            return cls(**dict(data))
        except ConfigError as exc:
            raise ConfigError(f"{where}.{exc}") from None

    @property
    def empty(self) -> bool:
        """Whether no field is set."""
        return self.max_queued is None and self.max_wait is None and self.ttl is None
