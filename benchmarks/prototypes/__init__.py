"""Rules that were measured and not taken, kept so that their tables can be run again.

Each module here is a *prototype*: it patches the library's private core (and, where its rule
changes a proven bound, the simulator's report) in the running process. It is not part of the
library and no service uses it. The benchmarks install one with ``--prototype
NAME[:key=value,...]`` (``check_wide.py`` and ``check_policy.py``, through :func:`add_option`
and :func:`install_option`); a worker process of their pool installs it at its start, unless
it inherited it from its parent (``fork``): a process holds at most one prototype, once.

A prototype module defines ``install(**params: str) -> Callable[[], None]``. It checks its
parameters, raises ``ValueError`` naming a bad one, patches the process and returns the undo.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
from collections.abc import Callable

__all__ = ["add_option", "install", "install_option", "known", "parse"]

#: The prototype installed in this process, spec -> undo (at most one). A forked worker
#: inherits it with the patches, so its pool's initializer installs nothing twice.
_INSTALLED: dict[str, Callable[[], None]] = {}


def known() -> list[str]:
    """The prototypes: the modules of this package, by name (``_name``: a shared helper)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def parse(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``NAME[:key=value,...]`` into the name and its parameters.

    Raises:
        ValueError: an unknown name, a parameter that is not ``key=value``, or a key given
            twice.
    """
    name, _, rest = spec.partition(":")
    if name not in known():
        raise ValueError(f"unknown prototype {name!r}; known: {', '.join(known())}")
    params: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"prototype {name!r}: expected key=value, got {item!r}")
        if key in params:
            raise ValueError(f"prototype {name!r}: {key!r} is given twice")
        params[key] = value.strip()
    return name, params


def install(spec: str | None) -> Callable[[], None]:
    """Install the prototype ``spec`` (None: none) in this process; return the undo.

    Installing the spec that is installed already changes nothing (a forked worker's pool
    initializer) and returns the same undo.

    Raises:
        ValueError: a bad ``spec`` (see :func:`parse`), a parameter the prototype does not
            take, a value it refuses, or another prototype installed already.
    """
    if spec is None:
        return lambda: None
    if spec in _INSTALLED:
        return _INSTALLED[spec]
    if _INSTALLED:
        (other,) = _INSTALLED
        raise ValueError(f"prototype {other!r} is installed; undo it before {spec!r}")
    name, params = parse(spec)
    module = importlib.import_module(f"prototypes.{name}")
    accepted = list(inspect.signature(module.install).parameters)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"prototype {name!r}: unknown parameter {', '.join(map(repr, unknown))}; "
            f"it takes {', '.join(accepted)}"
        )
    patched: Callable[[], None] = module.install(**params)

    def undo() -> None:
        if _INSTALLED.get(spec) is undo:
            patched()
            del _INSTALLED[spec]

    _INSTALLED[spec] = undo
    return undo


def add_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--prototype NAME[:key=value,...]`` to a benchmark's command line."""
    parser.add_argument(
        "--prototype",
        help="a rule measured and not taken, patched in: NAME[:key=value,...] "
        f"(benchmarks/prototypes: {', '.join(known())}; e.g. affinity_payment:cap=1)",
    )


def install_option(args: argparse.Namespace) -> None:
    """Install ``args.prototype`` in this process (the pool's workers install it too).

    Raises:
        SystemExit: the spec is refused (the message says why and what is allowed).
    """
    try:
        install(args.prototype)
    except ValueError as exc:
        raise SystemExit(f"--prototype: {exc}") from None
