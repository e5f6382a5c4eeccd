"""The simulated fleet: which workers pull jobs, what they serve, how many they hold, how fast.

``prioqueue simulate --workers SPEC`` takes either a count (``4``: four identical workers
``gpu-0`` .. ``gpu-3`` that serve every model, one slot, speed 1) or the path of a TOML file
with one ``[[workers]]`` table per worker::

    [[workers]]
    name = "gpu-a"            # optional (default gpu-<index>)
    models = ["image", "llm"] # optional (default: every model)
    slots = 2                 # optional: jobs held at once, 1 = no prefetch (default 1)
    speed = 1.5               # optional: warm runtimes are divided by it (default 1.0)
    resident = "image"        # optional: the model loaded at the start (default none)

A worker's **speed** divides a job's warm runtime (a speed-2 GPU runs a 60 s job in 30 s); a
cold load takes the model's load time on every worker (it is bound by storage, not compute).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from prioqueue.errors import ConfigError

__all__ = ["MAX_WORKERS", "WorkerSpec", "fleet_of", "load_workers", "parse_workers"]

MAX_WORKERS = 1024
"""The largest fleet the simulator builds (a bound on a typo such as ``--workers 40000``)."""

_KEYS = ("name", "models", "slots", "speed", "resident")


@attrs.frozen
class WorkerSpec:
    """One simulated worker.

    Attributes:
        name: Its name (unique in the fleet).
        models: The models it serves, or None for every model.
        slots: Jobs it holds at once (1: runs one; 2: runs one and prefetches one).
        speed: Warm runtimes on it are divided by this factor (> 0).
        resident: The model loaded on it at the start, or None.
    """

    name: str
    models: frozenset[str] | None = None
    slots: int = 1
    speed: float = 1.0
    resident: str | None = None

    def __attrs_post_init__(self) -> None:
        """Check the fields (a spec built in Python gets the file's checks).

        Raises:
            ConfigError: An empty name, ``slots`` not an int in [1, 64], ``speed`` not a
                finite number > 0, or a ``resident`` model the worker does not serve.
        """
        where = f"worker {self.name!r}"
        _name(self.name, "a worker's name")
        if (
            not isinstance(self.slots, int)
            or isinstance(self.slots, bool)
            or not 1 <= self.slots <= 64
        ):
            raise ConfigError(f"{where}: slots must be an integer in [1, 64], got {self.slots!r}")
        if (
            isinstance(self.speed, bool)
            or not isinstance(self.speed, (int, float))
            or not 0 < self.speed < math.inf
        ):
            raise ConfigError(f"{where}: speed must be a number > 0, got {self.speed!r}")
        if (
            self.resident is not None
            and self.models is not None
            and self.resident not in self.models
        ):
            raise ConfigError(f"{where}: resident {self.resident!r} is not one of its models")


def fleet_of(count: int) -> tuple[WorkerSpec, ...]:
    """Return ``count`` identical workers ``gpu-0`` .. ``gpu-<count-1>``.

    Args:
        count: How many workers, within [1, :data:`MAX_WORKERS`].

    Returns:
        The workers (every model, one slot, speed 1).

    Raises:
        ConfigError: ``count`` is not an int within range.
    """
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_WORKERS:
        raise ConfigError(
            f"--workers: a count must be an integer in [1, {MAX_WORKERS}], got {count!r}"
        )
    return tuple(WorkerSpec(name=f"gpu-{k}") for k in range(count))


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a non-empty string, got {value!r}")
    return value.strip()


def _worker(index: int, table: Any, where: str) -> WorkerSpec:
    what = f"{where}: workers[{index}]"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{what} must be a table, got {table!r}")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{what}: unknown keys {unknown}; known: {list(_KEYS)}")
    name = _name(table.get("name", f"gpu-{index}"), f"{what}.name")
    models: frozenset[str] | None = None
    if "models" in table:
        raw = table["models"]
        if isinstance(raw, str) or not isinstance(raw, Sequence) or not raw:
            raise ConfigError(f"{what}.models must be a non-empty list of model names")
        models = frozenset(_name(m, f"{what}.models[]") for m in raw)
    slots = table.get("slots", 1)
    if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= 64:
        raise ConfigError(f"{what}.slots must be an integer in [1, 64], got {slots!r}")
    speed = table.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not (0 < speed < math.inf):
        raise ConfigError(f"{what}.speed must be a number > 0, got {speed!r}")
    resident = table.get("resident")
    if resident is not None:
        resident = _name(resident, f"{what}.resident")
        if models is not None and resident not in models:
            raise ConfigError(f"{what}.resident {resident!r} is not one of its models")
    return WorkerSpec(name=name, models=models, slots=slots, speed=float(speed), resident=resident)


def load_workers(data: Mapping[str, Any], where: str = "workers") -> tuple[WorkerSpec, ...]:
    """Return the workers of a parsed TOML document (its ``[[workers]]`` tables).

    Args:
        data: The document.
        where: Its name, for messages.

    Returns:
        The workers, in file order.

    Raises:
        ConfigError: No ``workers`` list, a bad entry, or a name given twice.
    """
    tables = data.get("workers")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{where}: expected one or more [[workers]] tables")
    if len(tables) > MAX_WORKERS:
        raise ConfigError(f"{where}: at most {MAX_WORKERS} workers, got {len(tables)}")
    unknown = sorted(set(data) - {"workers"})
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; known: ['workers']")
    fleet = tuple(_worker(k, table, where) for k, table in enumerate(tables))
    names = [w.name for w in fleet]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: worker names given twice: {', '.join(twice)}")
    return fleet


def parse_workers(spec: str) -> tuple[WorkerSpec, ...]:
    """Parse ``--workers``: a count (``"4"``) or the path of a TOML file of workers.

    Args:
        spec: The option's value.

    Returns:
        The workers.

    Raises:
        ConfigError: Not a count in range, and not a readable TOML file of valid workers.
    """
    text = spec.strip()
    if text.isdigit():
        return fleet_of(int(text))
    path = Path(text)
    if not path.is_file():
        raise ConfigError(
            f"--workers expects a count (e.g. 4) or a TOML file of [[workers]], got {spec!r}"
        )
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--workers: cannot read {text}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--workers: {text}: invalid TOML: {exc}") from None
    return load_workers(data, text)
