"""A converter for the Azure LLM inference trace 2023.

The trace (``TIMESTAMP, ContextTokens, GeneratedTokens``) is mapped reproducibly from a seed:
arrivals are the timestamps, rescaled so the offered load is ``target_load``; members are
drawn with Zipf weights, each with a fixed tier; levels and models are drawn with fixed
weights; the duration is ``ContextTokens / prefill_tps + GeneratedTokens / decode_tps``. The
files are read from the path the user gives and never copied.
:func:`prioqueue.sim.traces.read_trace` calls :func:`convert_azure` for ``--trace-format
azure`` (or ``auto`` on an Azure header).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from prioqueue.errors import ConfigError
from prioqueue.sim.errors import TraceError
from prioqueue.sim.scenarios import convert_param
from prioqueue.sim.workload import Arrival, Workload

__all__ = ["AZURE_ATTRIBUTION", "AZURE_DEFAULTS", "AZURE_HEADER", "convert_azure"]

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The first three columns of an Azure LLM inference 2023 CSV (``--trace-format auto``)."""

AZURE_ATTRIBUTION = (
    "Azure LLM inference trace 2023, (c) Microsoft Corporation (Azure Public Dataset, "
    "https://github.com/Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_{code,conv}.csv "
    "at commit b469a113cedca53ddc3bdea71a143dc4b7d8700c), licensed under CC BY 4.0 "
    '(https://creativecommons.org/licenses/by/4.0/). Provided "as is" without warranties. '
    "Modified: arrivals rescaled and members, priorities, tiers, models and durations "
    "synthesised by prioqueue's converter. Cite: Patel et al., \"Splitwise: Efficient "
    'generative LLM inference using phase splitting", ISCA 2024.'
)

AZURE_DEFAULTS: dict[str, Any] = {
    "members": 20,
    "target_load": 0.9,
    "prefill_tps": 4000.0,
    "decode_tps": 40.0,
    "interactive_share": 0.5,
    "normal_share": 0.35,
    "batch_share": 0.15,
    "model_load": 15.0,
}
_AZURE_MODELS = (("llm-small", 0.6), ("llm-medium", 0.3), ("llm-large", 0.1))


def _settings(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """:data:`AZURE_DEFAULTS` with ``params`` applied.

    Raises:
        ConfigError: An unknown parameter, or a rate or load that is not > 0.
    """
    settings = dict(AZURE_DEFAULTS)
    for key, value in (params or {}).items():
        norm = key.strip().replace("-", "_")
        if norm not in settings:
            known = ", ".join(settings)
            raise ConfigError(f"the azure converter has no parameter {key!r}; it has: {known}")
        settings[norm] = convert_param("azure", norm, settings[norm], value)
    for key in ("target_load", "prefill_tps", "decode_tps"):
        if not settings[key] > 0:
            raise ConfigError(f"azure converter: {key} must be > 0")
    return settings


def _read(name: str, handle: TextIO, settings: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The trace's ``(timestamp, duration)`` rows.

    Raises:
        TraceError: Not the Azure header, a malformed row, or no row at all.
    """
    rows: list[tuple[float, float]] = []
    reader = csv.reader(handle)
    header = [h.strip() for h in next(reader, [])]
    expected = list(AZURE_HEADER)
    if header[:3] != expected:
        raise TraceError(name, 1, None, f"expected the header {expected}, got {header}")
    for values in reader:
        line = reader.line_num
        if not values:
            continue
        if len(values) < 3:
            raise TraceError(name, line, None, f"expected 3 fields, got {len(values)}")
        stamp = _azure_time(name, line, values[0])
        tokens = []
        for k, column in ((1, "ContextTokens"), (2, "GeneratedTokens")):
            text = values[k].strip()
            if not text.isdigit():
                raise TraceError(
                    name, line, f"{column!r} (#{k + 1})", f"expected a count, got {text!r}"
                )
            tokens.append(int(text))
        duration = tokens[0] / settings["prefill_tps"] + tokens[1] / settings["decode_tps"]
        rows.append((stamp, duration))
    if not rows:
        raise TraceError(name, 1, None, "the trace has no rows")
    return rows


def _azure_time(name: str, line: int, text: str) -> float:
    value = text.strip()
    base, _, fraction = value.partition(".")
    try:
        stamp = dt.datetime.strptime(base, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)
        if fraction and not fraction.isdigit():
            raise ValueError(fraction)
    except ValueError:
        raise TraceError(
            name, line, "'TIMESTAMP' (#1)", f"expected YYYY-MM-DD HH:MM:SS.fffffff, got {text!r}"
        ) from None
    return stamp.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def convert_azure(
    path: str | Path,
    *,
    seed: int = 1,
    params: Mapping[str, Any] | None = None,
    load_seconds: Mapping[str, float] | None = None,
) -> Workload:
    """Map an Azure LLM inference trace (2023) onto members, levels, models and durations.

    The same file, seed and parameters always give the same workload. See the module
    docstring for the mapping and :data:`AZURE_ATTRIBUTION` for the licence notice, which
    must accompany anything shared from the result.

    Args:
        path: ``AzureLLMInferenceTrace_code.csv`` or ``..._conv.csv`` (or a copy).
        seed: The mapping's seed.
        params: Overrides of :data:`AZURE_DEFAULTS`.
        load_seconds: Cold-load seconds per model (default ``model_load`` for each).

    Returns:
        The workload.

    Raises:
        TraceError: A malformed row.
        ConfigError: An unknown or bad parameter.
        OSError: The file cannot be read.
    """
    path = Path(path)
    name = str(path)
    settings = _settings(params)
    members = max(1, int(settings["members"]))
    with path.open(newline="", encoding="utf-8") as handle:
        rows = _read(name, handle, settings)
    rng = random.Random(f"azure:{seed}")
    names = [f"u{k:03d}" for k in range(1, members + 1)]
    weights = [1.0 / k for k in range(1, members + 1)]
    tiers = {member: ("free", "pro", "max")[rng.randrange(3)] for member in names}
    levels = (100, 0, -100)
    level_weights = [settings[f"{lv}_share"] for lv in ("interactive", "normal", "batch")]
    models = [m for m, _ in _AZURE_MODELS]
    model_weights = [w for _, w in _AZURE_MODELS]
    origin = min(stamp for stamp, _ in rows)
    span = max(stamp for stamp, _ in rows) - origin
    work = math.fsum(duration for _, duration in rows)
    scale = work / (settings["target_load"] * span) if span > 0 else 1.0
    jobs = []
    for stamp, duration in rows:
        member = rng.choices(names, weights)[0]
        jobs.append(
            Arrival(
                arrival=round((stamp - origin) * scale, 6),
                member=member,
                priority=rng.choices(levels, level_weights)[0],
                tier=tiers[member],
                model=rng.choices(models, model_weights)[0],
                duration=round(duration, 6),
                estimate=round(duration * rng.lognormvariate(0.0, 0.2), 6),
            )
        )
    jobs.sort(key=lambda job: job.arrival)
    loads = {model: float(settings["model_load"]) for model in models}
    loads.update(load_seconds or {})
    return Workload(
        name=f"azure:{path.name}",
        arrivals=jobs,
        load_seconds=loads,
        default_load=float(settings["model_load"]),
        params={"path": name, "format": "azure", "seed": seed, "time_scale": scale, **settings},
    )
