"""Workloads from files: the simulator's trace format, and a converter for the Azure LLM traces.

Trace format (CSV with a header row, or JSON Lines with one object per line):

========== ======== =================================================================
column     required meaning
========== ======== =================================================================
arrival    yes      submission time in seconds (any origin; shifted so the first is 0)
member     yes      who sends the job (non-empty)
priority   no       a number or an alias (``interactive``, ``normal``, ``batch``); 0
tier       no       the member's tier name; ``free``
model      no       the model the job needs; empty means none
duration   yes      warm runtime in seconds (>= 0)
estimate   no       the caller's runtime estimate in seconds (> 0); empty means none
cancel_after no     seconds after arrival at which the caller cancels; empty means never
hangs      no       how many of its first grants hang (a lost worker); 0
swap, load no       (JSONL) the recorded request paid a cold load of ``load`` seconds
========== ======== =================================================================

A JSON Lines trace may open with a header line ``{"prioqueue_trace": 1, "load_seconds":
{model: seconds}, "default_load": seconds, "origin": seconds, "horizon": seconds}`` (each
optional; ``origin`` is the time arrivals count from, by default the first arrival; written by
:func:`write_trace` and
:class:`~prioqueue.sim.recorder.TraceRecorder`). A model's cold-load time is, first found:
the caller's ``load_seconds`` (``--load-seconds``), the header's, the mean of the ``load``
values recorded for it, the header's ``default_load``. So a converted trace replays exactly
like its source. Other columns are
ignored. A bad row raises :class:`TraceError` naming the file, the line
(1-based, the CSV header is line 1) and the column.

The Azure LLM inference trace 2023 is read by :mod:`prioqueue.sim.azure` (``--trace-format
azure``, or ``auto`` on its header).
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import attrs

from prioqueue.errors import ConfigError
from prioqueue.priority import DEFAULT_ALIASES
from prioqueue.sim.azure import AZURE_ATTRIBUTION, AZURE_DEFAULTS, AZURE_HEADER, convert_azure
from prioqueue.sim.errors import TraceError
from prioqueue.sim.recorder import TRACE_HEADER_KEY, TraceRecorder, header_line
from prioqueue.sim.workload import Arrival, Workload

__all__ = [
    "AZURE_ATTRIBUTION",
    "AZURE_DEFAULTS",
    "AZURE_HEADER",
    "COLUMNS",
    "TraceError",
    "TraceRecorder",
    "convert_azure",
    "read_trace",
    "write_trace",
]

COLUMNS = (
    "arrival",
    "member",
    "priority",
    "tier",
    "model",
    "duration",
    "estimate",
    "cancel_after",
    "hangs",
)
_REQUIRED = ("arrival", "member", "duration")
_NUMBER = re.compile(r"[+-]?[0-9]+")


def _rows(
    path: Path, handle: TextIO, fmt: str
) -> Iterator[tuple[int, dict[str, Any], dict[str, str]]]:
    """Yield ``(line, row, column labels)`` of a CSV or JSONL trace."""
    name = str(path)
    if fmt == "csv":
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(name, 1, None, "empty file: expected a header row")
        header = [h.strip() for h in header]
        labels = {h: f"{h!r} (#{k})" for k, h in enumerate(header, 1)}
        for column in _REQUIRED:
            if column not in labels:
                raise TraceError(name, 1, repr(column), f"missing; the header has {header}")
        for values in reader:
            line = reader.line_num
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TraceError(
                    name, line, None, f"expected {len(header)} fields, got {len(values)}"
                )
            yield line, dict(zip(header, values, strict=True)), labels
        return
    for line, text in enumerate(handle, 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(
                name, line, None, f"invalid JSON: {exc.msg} (at char {exc.pos})"
            ) from None
        if not isinstance(row, dict):
            raise TraceError(name, line, None, "expected a JSON object")
        if TRACE_HEADER_KEY in row:
            yield line, row, {}
            continue
        yield line, row, {key: repr(key) for key in row}


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _parse_row(name: str, line: int, row: Mapping[str, Any], labels: Mapping[str, str]) -> Arrival:
    def fail(column: str, message: str) -> TraceError:
        return TraceError(name, line, labels.get(column, repr(column)), message)

    def number(column: str, *, required: bool, positive: bool = False) -> float | None:
        value: Any = row.get(column)
        if _empty(value):
            if required:
                raise fail(column, "missing value")
            return None
        if isinstance(value, bool):
            raise fail(column, f"expected a number, got {value!r}")
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise fail(column, f"expected a number, got {value!r}") from None
        if not math.isfinite(result) or result < 0 or (positive and result == 0):
            rule = "> 0" if positive else ">= 0"
            raise fail(column, f"expected a finite number {rule}, got {value!r}")
        return result

    def text(column: str, default: str | None) -> str | None:
        value = row.get(column)
        if _empty(value):
            return default
        if not isinstance(value, str):
            raise fail(column, f"expected a string, got {value!r}")
        return value.strip()

    arrival = number("arrival", required=True)
    duration = number("duration", required=True)
    member = text("member", None)
    if member is None:
        raise fail("member", "missing value")
    raw = row.get("priority")
    priority = 0
    if isinstance(raw, int) and not isinstance(raw, bool):
        priority = raw
    elif not _empty(raw):
        if not isinstance(raw, str):
            raise fail("priority", f"expected a number or an alias, got {raw!r}")
        stripped = raw.strip()
        if _NUMBER.fullmatch(stripped):
            priority = int(stripped)
        elif stripped.lower() in DEFAULT_ALIASES:
            priority = DEFAULT_ALIASES[stripped.lower()]
        else:
            aliases = ", ".join(DEFAULT_ALIASES)
            raise fail("priority", f"expected an integer or one of {aliases}, got {raw!r}")
    if arrival is None or duration is None:  # required above
        raise AssertionError("unreachable")
    hangs = number("hangs", required=False)
    if hangs is not None and hangs != int(hangs):
        raise fail("hangs", f"expected a whole number of grants, got {row.get('hangs')!r}")
    return Arrival(
        arrival=arrival,
        member=member,
        priority=priority,
        tier=text("tier", "free") or "free",
        model=text("model", None),
        duration=duration,
        estimate=number("estimate", required=False, positive=True),
        cancel_after=number("cancel_after", required=False),
        hangs=0 if hangs is None else int(hangs),
    )


def _format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            header = next(csv.reader(handle), [])
        if tuple(h.strip() for h in header[:3]) == AZURE_HEADER:
            return "azure"
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise ConfigError(
        f"{path}: cannot tell the trace format from the suffix {suffix!r}; "
        "use --trace-format csv, jsonl or azure"
    )


def read_trace(
    path: str | Path,
    *,
    fmt: str = "auto",
    seed: int = 1,
    load_seconds: Mapping[str, float] | None = None,
    default_load: float = 30.0,
    params: Mapping[str, Any] | None = None,
) -> Workload:
    """Read a trace into a workload (shifted so that the first arrival is at 0).

    Args:
        path: The file.
        fmt: ``"auto"`` (by suffix: ``.csv``, ``.jsonl``/``.ndjson``/``.json``), ``"csv"``,
            ``"jsonl"`` or ``"azure"`` (see :func:`convert_azure`); ``auto`` recognises an
            Azure CSV by its header.
        seed: The converter's seed (``azure`` only).
        load_seconds: Cold-load seconds per model; they win over the trace's own.
        default_load: Cold-load seconds of models known neither from ``load_seconds`` nor
            from the trace (a JSONL header's ``default_load`` wins over it).
        params: The converter's parameters (``azure`` only; see :data:`AZURE_DEFAULTS`).

    Returns:
        The workload, sorted by arrival time (stable).

    Raises:
        TraceError: A malformed row (the message names file, line and column).
        ConfigError: An unknown format or parameter.
        OSError: The file cannot be read.
    """
    path = Path(path)
    fmt = _format(path, fmt)
    if fmt == "azure":
        return convert_azure(path, seed=seed, params=params, load_seconds=load_seconds)
    if fmt not in ("csv", "jsonl"):
        raise ConfigError(f"unknown trace format {fmt!r}; use auto, csv, jsonl or azure")
    if params:
        raise ConfigError(f"--param does not apply to {fmt} traces (got {', '.join(params)})")
    jobs: list[Arrival] = []
    header: dict[str, Any] = {}
    measured: dict[str, list[float]] = {}
    with path.open(newline="" if fmt == "csv" else None, encoding="utf-8") as handle:
        for line, row, labels in _rows(path, handle, fmt):
            if not labels and TRACE_HEADER_KEY in row:
                if jobs or header:
                    raise TraceError(str(path), line, None, "the header must be the first line")
                header = _header(str(path), line, row)
                continue
            job = _parse_row(str(path), line, row, labels)
            jobs.append(job)
            if row.get("swap") is True and job.model is not None:
                load = row.get("load")
                if isinstance(load, (int, float)) and not isinstance(load, bool) and load >= 0:
                    measured.setdefault(job.model, []).append(float(load))
    if not jobs:
        raise TraceError(str(path), 1, None, "the trace has no jobs")
    jobs.sort(key=lambda job: job.arrival)
    origin = header.get("origin", jobs[0].arrival)
    if origin:
        jobs = [_shift(job, origin) for job in jobs]
    loads = {model: math.fsum(values) / len(values) for model, values in measured.items()}
    loads.update(header.get("load_seconds", {}))
    loads.update(load_seconds or {})
    return Workload(
        name=f"trace:{path.name}",
        arrivals=jobs,
        load_seconds=loads,
        default_load=float(header.get("default_load", default_load)),
        params={"path": str(path), "format": fmt},
        horizon=header.get("horizon"),
    )


def _header(name: str, line: int, row: Mapping[str, Any]) -> dict[str, Any]:
    if row[TRACE_HEADER_KEY] != 1:
        raise TraceError(name, line, None, f"unknown trace version {row[TRACE_HEADER_KEY]!r}")
    loads = row.get("load_seconds", {})
    default = row.get("default_load", 30.0)
    origin, horizon = row.get("origin"), row.get("horizon")
    try:
        header_line(loads, default, origin=origin, horizon=horizon)  # validates
    except (TypeError, ValueError, AttributeError) as exc:
        raise TraceError(name, line, None, f"bad header: {exc}") from None
    header: dict[str, Any] = {"load_seconds": dict(loads), "default_load": float(default)}
    if origin is not None:
        header["origin"] = float(origin)
    if horizon is not None:
        header["horizon"] = float(horizon)
    return header


def _shift(job: Arrival, origin: float) -> Arrival:
    return attrs.evolve(job, arrival=job.arrival - origin)


def write_trace(workload: Workload, handle: TextIO) -> int:
    """Write a workload as a JSON Lines trace (the format :func:`read_trace` reads). O(n).

    The header line carries the models' cold-load times, the time origin (0: the arrivals are
    written as they are) and the horizon, so reading the file back gives a workload that
    replays exactly like this one.

    Args:
        workload: The workload.
        handle: A text file open for writing.

    Returns:
        The number of rows written (the header not counted).
    """
    handle.write(
        header_line(
            workload.load_seconds, workload.default_load, origin=0.0, horizon=workload.horizon
        )
    )
    for job in workload.arrivals:
        row: dict[str, Any] = {
            "arrival": job.arrival,
            "member": job.member,
            "priority": job.priority,
            "tier": job.tier,
            "model": job.model,
            "duration": job.duration,
            "estimate": job.estimate,
        }
        if job.cancel_after is not None:
            row["cancel_after"] = job.cancel_after
        if job.hangs:
            row["hangs"] = job.hangs
        handle.write(json.dumps(row, separators=(",", ":")) + "\n")
    return len(workload.arrivals)
