"""Rules that were measured and not taken, kept so that their tables can be run again.

Each module here is a *prototype*: it patches the library's private core (and, where its rule
changes a proven bound, the simulator's report) in the running process. It is not part of the
library and no service uses it. The benchmarks install one with ``--prototype
NAME[:key=value,...]`` (``check_wide.py`` and ``check_policy.py``); a worker process of their
pool installs it again at its start.

A prototype module defines ``install(**params: str) -> Callable[[], None]``. It checks its
parameters, raises ``ValueError`` naming a bad one, patches the process and returns the undo.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

__all__ = ["KNOWN", "install", "parse"]

#: The prototypes, by name, with the design note's section that reports them.
KNOWN = {
    "affinity_payment": 'docs/design/dispatcher.md, "Tried in the eleventh round, not taken"',
}


def parse(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``NAME[:key=value,...]`` into the name and its parameters.

    Raises:
        ValueError: an unknown name, or a parameter that is not ``key=value``.
    """
    name, _, rest = spec.partition(":")
    if name not in KNOWN:
        raise ValueError(f"unknown prototype {name!r}; known: {', '.join(sorted(KNOWN))}")
    params: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"prototype {name!r}: expected key=value, got {item!r}")
        params[key.strip()] = value.strip()
    return name, params


def install(spec: str | None) -> Callable[[], None]:
    """Install the prototype ``spec`` (None: none) in this process; return the undo.

    Raises:
        ValueError: a bad ``spec`` (see :func:`parse`), a parameter the prototype does not
            take, or a value it refuses.
    """
    if spec is None:
        return lambda: None
    name, params = parse(spec)
    module = importlib.import_module(f"prototypes.{name}")
    accepted = list(inspect.signature(module.install).parameters)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"prototype {name!r}: unknown parameter {', '.join(map(repr, unknown))}; "
            f"it takes {', '.join(accepted)}"
        )
    undo: Callable[[], None] = module.install(**params)
    return undo
