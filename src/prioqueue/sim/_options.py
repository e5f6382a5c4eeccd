"""What ``prioqueue simulate`` reads from its options and ``--config`` file (private).

Kept apart from :mod:`prioqueue.sim.cli` so that the command's module stays short; like it,
this module imports only the standard library and the core at module level, so that
``prioqueue --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prioqueue.errors import ConfigError

if TYPE_CHECKING:
    from prioqueue.sim.policies import PolicyParams, PolicySpec
    from prioqueue.sim.workers import WorkerSpec
    from prioqueue.sim.workload import Workload

__all__ = [
    "UsageError",
    "base_params",
    "check_tiers",
    "fleet",
    "load_toml",
    "specs",
    "workloads",
]


class UsageError(Exception):
    """Bad usage: exit status 2."""


_EXAMPLES = {
    "--param": "hours=6",
    "--load-seconds": "image=30",
    "--tier-bonus": "pro=1",
    "--affinity": "video=10",
    "--budget": "interactive:max_wait=300",
}


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"{flag} expects KEY=VALUE (e.g. {flag} {_EXAMPLES.get(flag, 'key=1')}), "
                f"got {item!r}"
            )
        result[key.strip()] = value.strip()
    return result


def _numbers(items: Mapping[str, Any], what: str) -> dict[str, float]:
    result: dict[str, float] = {}
    for key, value in items.items():
        try:
            result[key] = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"{what} {key!r}: expected a number, got {value!r}") from None
    return result


def load_toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise UsageError("--config needs tomli on Python 3.10: pip install tomli") from None
    try:
        with open(path, "rb") as handle:
            data: dict[str, Any] = tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from None
    known = {
        "scenario",
        "seed",
        "policies",
        "lease_factor",
        "params",
        "policy",
        "load_seconds",
        "workers",
        "poll",
    }
    unknown = set(data) - known
    if unknown:
        raise UsageError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    return data


def _budget_tables(items: Sequence[str], budgets: dict[Any, Any]) -> dict[Any, Any]:
    """Parse ``--budget LEVEL:max_wait=S,max_queued=N,ttl=S`` into TOML-like tables."""
    from prioqueue.sim.policies import BUDGET_KEYS, budget_level

    example = "--budget interactive:max_wait=300,ttl=600"
    budgets = {budget_level(k, "[policy] budgets"): v for k, v in budgets.items()}
    for item in items:
        name, sep, rest = item.partition(":")
        if not sep:
            raise UsageError(f"--budget expects LEVEL:KEY=VALUE,... (e.g. {example}), got {item!r}")
        level = budget_level(name, f"--budget {item!r}")
        table: dict[str, Any] = {}
        for written, value in _pairs([p for p in rest.split(",") if p.strip()], "--budget").items():
            key = written.lower().replace("-", "_")
            if key not in BUDGET_KEYS:
                raise UsageError(
                    f"--budget {item!r}: unknown key {key!r}; known: {', '.join(BUDGET_KEYS)}"
                )
            number = _numbers({key: value}, "--budget")[key]
            if key == "max_queued":
                if not number.is_integer():
                    raise UsageError(f"--budget {item!r}: max_queued must be an integer")
                table[key] = int(number)
            else:
                table[key] = number
        if not table:
            raise UsageError(f"--budget {item!r}: give at least one of {', '.join(BUDGET_KEYS)}")
        old = budgets.get(level, {})
        if not isinstance(old, Mapping):  # pragma: no cover - TOML gives tables
            raise UsageError(f"[policy] budgets.{level} must be a table")
        budgets[level] = {**old, **table}
    return budgets


def base_params(args: argparse.Namespace, config: Mapping[str, Any]) -> PolicyParams:
    import attrs

    from prioqueue.sim.policies import PolicyParams

    table = dict(config.get("policy", {}))
    allowed = set(attrs.fields_dict(PolicyParams))
    unknown = set(table) - allowed
    if unknown:
        raise UsageError(f"[policy]: unknown keys {sorted(unknown)}; known: {sorted(allowed)}")
    for flag in ("aging_divisor", "band_spacing", "max_affinity"):
        value = getattr(args, flag)
        if value is not None:
            table[flag] = value
    if args.tier_bonus:
        table["tier_bonuses"] = _numbers(_pairs(args.tier_bonus, "--tier-bonus"), "tier")
    if args.affinity:
        table["affinity_by_model"] = _numbers(_pairs(args.affinity, "--affinity"), "model")
    if args.budget:
        table["budgets"] = _budget_tables(args.budget, dict(table.get("budgets", {})))
    if args.charge is not None:
        charge: Any = args.charge
        if charge not in ("runtime", "estimate"):
            charge = _numbers({"--charge": charge}, "option")["--charge"]
        table["charge"] = charge
    try:
        return PolicyParams(**table)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"[policy]: {exc}") from None


def specs(
    args: argparse.Namespace, config: Mapping[str, Any], *, fleet: bool = False
) -> list[PolicySpec]:
    from prioqueue.sim.policies import (
        ABLATIONS,
        DEFAULT_FLEET_POLICIES,
        DEFAULT_POLICIES,
        parse_spec,
    )

    base = base_params(args, config)
    defaults = DEFAULT_FLEET_POLICIES if fleet else DEFAULT_POLICIES
    written = args.policy or config.get("policies") or list(defaults)
    if not isinstance(written, list) or not all(isinstance(s, str) for s in written):
        raise UsageError("policies must be a list of strings")
    if args.ablations:
        written = [*written, *(a for a in ABLATIONS if a not in written)]
    specs = [parse_spec(spec, base) for spec in written]
    labels = [spec.label for spec in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise UsageError(f"policy given twice: {', '.join(duplicates)}")
    return specs


def workloads(args: argparse.Namespace, config: Mapping[str, Any]) -> list[tuple[Workload, str]]:
    """The workloads to run: a trace, one scenario, or the default suite."""
    import attrs

    from prioqueue.sim import scenarios, traces

    params: dict[str, Any] = dict(config.get("params", {}))
    params.update(_pairs(args.param, "--param"))
    seed = args.seed if args.seed is not None else int(config.get("seed", 1))
    loads = _numbers(dict(config.get("load_seconds", {})), "load_seconds")
    loads.update(_numbers(_pairs(args.load_seconds, "--load-seconds"), "model"))
    horizon = args.horizon
    if horizon is not None and not (0 <= horizon < float("inf")):
        raise UsageError(f"--horizon must be a number of hours >= 0, got {horizon!r}")
    if args.trace:
        if args.scenario:
            raise UsageError("give either --scenario or --trace, not both")
        workload = traces.read_trace(
            args.trace, fmt=args.trace_format, seed=seed, load_seconds=loads, params=params
        )
        if workload.params.get("format") == "azure":
            print(f"trace data: {traces.AZURE_ATTRIBUTION}", file=sys.stderr)
        found = [(workload, str(args.trace))]
    else:
        name = args.scenario or config.get("scenario")
        names = [str(name)] if name else list(scenarios.DEFAULT_SUITE)
        if params and not name:
            raise UsageError(
                "--param applies to one scenario: give --scenario NAME (see --list-scenarios)"
            )
        found = []
        for one in names:
            workload = scenarios.build(one, seed=seed, **params)
            if loads:
                workload = attrs.evolve(workload, load_seconds={**workload.load_seconds, **loads})
            found.append((workload, "built-in"))
    if horizon is not None:
        found = [
            (attrs.evolve(w, horizon=horizon * 3600.0 if horizon > 0 else None), source)
            for w, source in found
        ]
    return found


def check_tiers(workload: Workload, specs: Sequence[PolicySpec]) -> None:
    tiers = {job.tier for job in workload.arrivals}
    for spec in specs:
        if spec.is_baseline:
            continue
        unknown = sorted(tiers - set(spec.params.tier_bonuses))
        if unknown:
            known = ", ".join(spec.params.tier_bonuses) or "none"
            raise ConfigError(
                f"policy {spec.label}: the workload uses tiers {unknown} that have no bonus "
                f"(known: {known}); add them with --tier-bonus TIER=BONUS"
            )


def fleet(
    args: argparse.Namespace, config: Mapping[str, Any]
) -> tuple[tuple[WorkerSpec, ...] | None, float]:
    """The fleet and the poll interval of a run.

    The fleet is ``--workers``, else the config file's ``workers`` (a count or
    ``[[workers]]`` tables), else None (the workload's own); the poll interval is ``--poll``,
    else the file's ``poll``, else 0.
    """
    from prioqueue.sim.workers import fleet_of, load_workers, parse_workers

    poll = args.poll if args.poll is not None else config.get("poll", 0.0)
    if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0 <= poll < 1e308:
        raise UsageError(f"--poll must be a number of seconds >= 0, got {poll!r}")
    workers = None
    if args.workers is not None:
        workers = parse_workers(args.workers)
    elif "workers" in config:
        table = config["workers"]
        if isinstance(table, int) and not isinstance(table, bool):
            workers = fleet_of(table)
        else:
            workers = load_workers({"workers": table}, "--config")
    return workers, float(poll)
