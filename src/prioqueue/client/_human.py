"""What ``prioqueue jobs --human`` prints: the broker's answers as a person reads them (private).

Unix times become local ISO-8601 times with their offset and how far they are from now
(``2026-12-02T02:14:03+01:00 (3 min 5 s ago)``), seconds become durations (``14 min 59 s``),
nested JSON (payloads, results) stays compact JSON. A duration is rounded once, to what it
shows, before it is split into units, so it never reads ``14 min 60 s``.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["DURATION_FIELDS", "TIME_FIELDS", "duration", "instant", "render"]

TIME_FIELDS = frozenset(
    {
        "submitted_at",
        "finished_at",
        "not_before",
        "expires_at",
        "forecast_finish",
        "deadline",
        "now",
    }
)
"""Fields that hold a Unix time."""
DURATION_FIELDS = frozenset(
    {"gpu_seconds", "mean_runtime", "forecast_seconds", "lease_seconds", "estimate"}
)
"""Fields that hold seconds."""


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: ``850 ms``, ``4.2 s``, ``14 min 59 s``, ``2 h 5 min``.

    Args:
        seconds: A finite number of seconds (the sign is dropped: say "ago" or "in" around it).

    Raises:
        ValueError: ``seconds`` is not finite.
    """
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, got {seconds!r}")
    left = abs(seconds)
    if left < 0.9995:
        return f"{left * 1000:.0f} ms"
    if left < 59.95:
        return f"{left:.1f} s"
    minutes, secs = divmod(round(left), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def instant(when: float, now: float) -> str:
    """The Unix time ``when`` in local ISO-8601 with how far it is from ``now``.

    Raises:
        ValueError: ``when`` or ``now`` is not finite.
    """
    if not (math.isfinite(when) and math.isfinite(now)):
        raise ValueError(f"times must be finite, got {when!r} and {now!r}")
    stamp = datetime.datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")
    delta = when - now
    if abs(delta) < 0.5:
        return f"{stamp} (now)"
    return f"{stamp} ({duration(delta)} ago)" if delta < 0 else f"{stamp} (in {duration(delta)})"


def _value(name: str, value: Any, now: float) -> str:
    if value is None:
        return "-"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and name in TIME_FIELDS:
        return instant(float(value), now)
    if number and name in DURATION_FIELDS:
        return duration(float(value))
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return ", ".join(value) if value else "-"
    return json.dumps(value, separators=(", ", ": "), sort_keys=True)


def render(answer: Any, now: float) -> str:
    """An answer of the broker (a JSON object) as aligned ``name  value`` lines.

    Args:
        answer: The decoded JSON; anything but an object is printed as JSON.
        now: The Unix time "ago" and "in" count from (a group's answer carries the broker's
            own ``now``, which is used instead).

    Returns:
        The text, without a final newline.
    """
    if not isinstance(answer, Mapping):
        return json.dumps(answer, indent=2, sort_keys=True)
    broker_now = answer.get("now")
    if isinstance(broker_now, (int, float)) and math.isfinite(broker_now):
        now = float(broker_now)  # the broker's clock: no skew between it and this host
    width = max((len(str(name)) for name in answer), default=0)
    return "\n".join(
        f"{name!s:<{width}}  {_value(str(name), value, now)}" for name, value in answer.items()
    )
