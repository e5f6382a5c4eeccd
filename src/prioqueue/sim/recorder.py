"""Record real traffic as a replayable trace: one JSON line per finished request.

A gateway or a job broker calls :meth:`TraceRecorder.record` when a request leaves (completed
or cancelled); ``prioqueue simulate --trace FILE`` then replays the file under other settings.
This module imports only the standard library (no rich, no matplotlib, not the simulator's
engine), so an adapter can use it at no cost.

The file is the simulator's JSON Lines trace format (see ``docs/simulator.md``): a header line
``{"prioqueue_trace": 1, "load_seconds": {...}, "default_load": ...}`` and then one object per
request. Each record carries ``arrival``, ``member``, ``priority``, ``tier``, ``model``,
``duration`` (the measured warm runtime), ``estimate``, ``cancel_after`` and, when the request
paid a cold load, ``swap: true`` and ``load`` (the measured load seconds). The replay takes a
model's cold-load time from the header when given, else the mean of the loads recorded for it.

Records may be written in any order (requests finish out of arrival order); the replay sorts
them by arrival. Arrival times may use any clock (``time.monotonic()`` is fine): the replay
shifts them so the first is 0.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

__all__ = ["TRACE_HEADER_KEY", "TRACE_VERSION", "TraceRecorder", "header_line"]

TRACE_HEADER_KEY = "prioqueue_trace"
TRACE_VERSION = 1


def _finite(name: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        rule = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {rule}, got {value!r}")
    return number


def header_line(
    load_seconds: Mapping[str, float] | None,
    default_load: float | None,
    *,
    origin: float | None = None,
    horizon: float | None = None,
) -> str:
    """Return the JSON header line of a trace (with its newline).

    Args:
        load_seconds: Cold-load seconds per model, or None.
        default_load: Cold-load seconds of a model not listed, or None.
        origin: The time the arrivals count from (None: the first arrival is 0 on replay).
        horizon: Seconds after the origin at which the replay stops the clock, or None.

    Returns:
        ``{"prioqueue_trace": 1, ...}`` followed by a newline.

    Raises:
        ValueError: A load time is negative or not finite.
        TypeError: A load time is not a number.
    """
    header: dict[str, Any] = {TRACE_HEADER_KEY: TRACE_VERSION}
    if load_seconds:
        header["load_seconds"] = {
            str(model): _finite(f"load_seconds[{model!r}]", seconds)
            for model, seconds in sorted(load_seconds.items())
        }
    if default_load is not None:
        header["default_load"] = _finite("default_load", default_load)
    if origin is not None:
        header["origin"] = _finite("origin", origin)
    if horizon is not None:
        header["horizon"] = _finite("horizon", horizon)
    return json.dumps(header, separators=(",", ":")) + "\n"


class TraceRecorder:
    """Write one trace record per finished request (thread-safe, flushed per record).

    Example::

        recorder = TraceRecorder("traffic.jsonl", load_seconds={"image": 30.0})
        recorder.record(arrival=t0, member="alice", tier="pro", priority=100,
                        model="image", runtime=21.5, swap=True, load=28.9)
        recorder.close()

    Args:
        target: A path (the file is created or appended to; the header is written when it is
            empty) or a text handle open for writing (the header is written at once; the
            caller closes it).
        load_seconds: Known cold-load seconds per model, written into the header.
        default_load: Cold-load seconds of models with neither a header entry nor a recorded
            load, written into the header.

    Raises:
        ValueError: A load time is negative or not finite.
        TypeError: ``target`` is neither a path nor a text handle, or a load time is not a
            number.
        OSError: The file cannot be opened.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | TextIO,
        *,
        load_seconds: Mapping[str, float] | None = None,
        default_load: float | None = None,
    ) -> None:
        header = header_line(load_seconds, default_load)
        self._lock = threading.Lock()
        self._count = 0
        self._owned = isinstance(target, (str, os.PathLike))
        if isinstance(target, (str, os.PathLike)):
            path = Path(target)
            empty = not path.exists() or path.stat().st_size == 0
            self._handle: TextIO = path.open("a", encoding="utf-8")
            if empty:
                self._handle.write(header)
                self._handle.flush()
        elif callable(getattr(target, "write", None)):
            self._handle = target
            self._handle.write(header)
            self._handle.flush()
        else:
            raise TypeError(f"target must be a path or a text handle, got {target!r}")
        self._closed = False

    @property
    def records(self) -> int:
        """How many records were written by this recorder."""
        return self._count

    def record(
        self,
        *,
        arrival: float,
        member: str,
        priority: int,
        runtime: float,
        tier: str = "free",
        model: str | None = None,
        swap: bool = False,
        load: float | None = None,
        estimate: float | None = None,
        cancel_after: float | None = None,
    ) -> None:
        """Append one finished request. O(1) plus the write.

        Args:
            arrival: When the request arrived, in seconds on any clock shared by all records.
            member: Who sent it (non-empty).
            priority: Its priority number (100 interactive, 0 normal, -100 batch by default).
            runtime: Measured warm runtime in seconds (without the cold load), >= 0.
            tier: The member's tier.
            model: The model it needed, or None.
            swap: True when its grant paid a cold load of ``model``.
            load: Measured cold-load seconds (only with ``swap``), >= 0.
            estimate: The caller's runtime estimate in seconds (> 0), or None.
            cancel_after: Seconds after arrival at which the caller cancelled it, or None.

        Raises:
            ValueError: A value out of range, an empty member or tier, ``load`` without
                ``swap``, or the recorder is closed.
            TypeError: A value of the wrong type.
        """
        if not isinstance(member, str) or not member.strip():
            raise ValueError(f"member must be a non-empty string, got {member!r}")
        if not isinstance(tier, str) or not tier.strip():
            raise ValueError(f"tier must be a non-empty string, got {tier!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an integer, got {priority!r}")
        if model is not None and (not isinstance(model, str) or not model):
            raise ValueError(f"model must be a non-empty string or None, got {model!r}")
        row: dict[str, Any] = {
            "arrival": _finite("arrival", arrival),
            "member": member.strip(),
            "priority": priority,
            "tier": tier.strip(),
            "model": model,
            "duration": _finite("runtime", runtime),
        }
        if estimate is not None:
            row["estimate"] = _finite("estimate", estimate, positive=True)
        if cancel_after is not None:
            row["cancel_after"] = _finite("cancel_after", cancel_after)
        if swap:
            if model is None:
                raise ValueError("swap=True needs the model that was loaded")
            row["swap"] = True
            if load is not None:
                row["load"] = _finite("load", load)
        elif load is not None:
            raise ValueError("load is the cold-load time of a swap: pass swap=True with it")
        line = json.dumps(row, separators=(",", ":")) + "\n"
        with self._lock:
            if self._closed:
                raise ValueError("the recorder is closed")
            self._handle.write(line)
            self._handle.flush()
            self._count += 1

    def close(self) -> None:
        """Flush, and close the file when the recorder opened it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._handle.flush()
            if self._owned:
                self._handle.close()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
