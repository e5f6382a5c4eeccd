"""``prioqueue simulate``: replay a workload through several policies and compare them.

Only the standard library and the core are imported at module level; the simulator's modules,
``rich`` (the ``sim`` extra) and ``matplotlib`` (the ``plot`` extra) are imported when the
command runs, so ``prioqueue --help`` stays fast and works without the extras.

Exit status: 0 on success, 1 when the run failed (a bad trace row, an unreadable file, a
missing extra for ``--plot``), 2 on bad usage (an unknown scenario, policy or parameter).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prioqueue._errors import ConfigError

if TYPE_CHECKING:
    from prioqueue.sim.engine import RunResult
    from prioqueue.sim.policies import PolicyParams, PolicySpec
    from prioqueue.sim.workload import Workload

__all__ = ["add_arguments", "run"]

_PROG = "prioqueue simulate"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``simulate`` options to ``parser``.

    Args:
        parser: The subcommand's parser.
    """
    parser.epilog = (
        "policies: fifo, strict, prioqueue, no-aging, no-affinity, no-fair-share; a policy can "
        "take parameters: --policy prioqueue:divisor=30 --policy prioqueue:divisor=120. "
        "See docs/simulator.md for the trace format and the JSON schema."
    )
    source = parser.add_argument_group("workload")
    source.add_argument(
        "--scenario", help="built-in scenario (default film-night; see --list-scenarios)"
    )
    source.add_argument("--list-scenarios", action="store_true", help="list scenarios and exit")
    source.add_argument("--seed", type=int, help="RNG seed of the scenario or converter (1)")
    source.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="scenario (or azure converter) parameter, e.g. hours=6; repeatable",
    )
    source.add_argument("--trace", metavar="PATH", help="replay a trace file instead")
    source.add_argument(
        "--trace-format",
        choices=("auto", "csv", "jsonl", "azure"),
        default="auto",
        help="trace format (auto: by suffix; azure: an Azure LLM inference 2023 CSV)",
    )
    source.add_argument(
        "--load-seconds",
        action="append",
        default=[],
        metavar="MODEL=SECONDS",
        help="cold-load time of a model; repeatable",
    )
    source.add_argument(
        "--lease-factor",
        type=float,
        help="leases last FACTOR x duration + the slowest load (3); only hung jobs expire",
    )
    policy = parser.add_argument_group("policies")
    policy.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="SPEC",
        help="policy to compare, KIND[:key=value,...]; repeatable (default: all six)",
    )
    policy.add_argument("--config", metavar="FILE", help="TOML file of settings (see docs)")
    policy.add_argument("--aging-divisor", type=float, help="seconds per aging point (60)")
    policy.add_argument("--band-spacing", type=float, help="distance between levels (100)")
    policy.add_argument("--max-affinity", type=float, help="largest swap-affinity bonus (10)")
    policy.add_argument(
        "--tier-bonus",
        action="append",
        default=[],
        metavar="TIER=BONUS",
        help="tier bonus (replaces the default free=0 pro=1 max=2 when given); repeatable",
    )
    policy.add_argument(
        "--affinity",
        action="append",
        default=[],
        metavar="MODEL=BONUS",
        help="per-model affinity bonus; repeatable",
    )
    policy.add_argument("--charge", help="fair-share charge: runtime, estimate or SECONDS")
    output = parser.add_argument_group("output")
    output.add_argument("--json", metavar="FILE", help="write the report as JSON ('-': stdout)")
    output.add_argument("--plot", metavar="DIR", help="write PNG charts (needs the plot extra)")
    output.add_argument("--plain", action="store_true", help="plain text even on a terminal")
    output.add_argument("--no-progress", action="store_true", help="no progress bar")


class _UsageError(Exception):
    """Bad usage: exit status 2."""


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _UsageError(f"{flag} expects KEY=VALUE, got {item!r}")
        result[key.strip()] = value.strip()
    return result


def _numbers(items: Mapping[str, Any], what: str) -> dict[str, float]:
    result: dict[str, float] = {}
    for key, value in items.items():
        try:
            result[key] = float(value)
        except (TypeError, ValueError):
            raise _UsageError(f"{what} {key!r}: expected a number, got {value!r}") from None
    return result


def _load_toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise _UsageError("--config needs tomli on Python 3.10: pip install tomli") from None
    try:
        with open(path, "rb") as handle:
            data: dict[str, Any] = tomllib.load(handle)
    except OSError as exc:
        raise _UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise _UsageError(f"{path}: invalid TOML: {exc}") from None
    known = {"scenario", "seed", "policies", "lease_factor", "params", "policy", "load_seconds"}
    unknown = set(data) - known
    if unknown:
        raise _UsageError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    return data


def _base_params(args: argparse.Namespace, config: Mapping[str, Any]) -> PolicyParams:
    import attrs

    from prioqueue.sim.policies import PolicyParams

    table = dict(config.get("policy", {}))
    allowed = set(attrs.fields_dict(PolicyParams))
    unknown = set(table) - allowed
    if unknown:
        raise _UsageError(f"[policy]: unknown keys {sorted(unknown)}; known: {sorted(allowed)}")
    for flag in ("aging_divisor", "band_spacing", "max_affinity"):
        value = getattr(args, flag)
        if value is not None:
            table[flag] = value
    if args.tier_bonus:
        table["tier_bonuses"] = _numbers(_pairs(args.tier_bonus, "--tier-bonus"), "tier")
    if args.affinity:
        table["affinity_by_model"] = _numbers(_pairs(args.affinity, "--affinity"), "model")
    if args.charge is not None:
        charge: Any = args.charge
        if charge not in ("runtime", "estimate"):
            charge = _numbers({"--charge": charge}, "option")["--charge"]
        table["charge"] = charge
    try:
        return PolicyParams(**table)
    except (TypeError, ValueError) as exc:
        raise _UsageError(f"[policy]: {exc}") from None


def _specs(args: argparse.Namespace, config: Mapping[str, Any]) -> list[PolicySpec]:
    from prioqueue.sim.policies import DEFAULT_POLICIES, parse_spec

    base = _base_params(args, config)
    written = args.policy or config.get("policies") or list(DEFAULT_POLICIES)
    if not isinstance(written, list) or not all(isinstance(s, str) for s in written):
        raise _UsageError("policies must be a list of strings")
    specs = [parse_spec(spec, base) for spec in written]
    labels = [spec.label for spec in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise _UsageError(f"policy given twice: {', '.join(duplicates)}")
    return specs


def _workload(args: argparse.Namespace, config: Mapping[str, Any]) -> tuple[Workload, str]:
    from prioqueue.sim import scenarios, traces

    params: dict[str, Any] = dict(config.get("params", {}))
    params.update(_pairs(args.param, "--param"))
    seed = args.seed if args.seed is not None else int(config.get("seed", 1))
    loads = _numbers(dict(config.get("load_seconds", {})), "load_seconds")
    loads.update(_numbers(_pairs(args.load_seconds, "--load-seconds"), "model"))
    if args.trace:
        if args.scenario:
            raise _UsageError("give either --scenario or --trace, not both")
        workload = traces.read_trace(
            args.trace, fmt=args.trace_format, seed=seed, load_seconds=loads, params=params
        )
        if args.trace_format == "azure" or workload.params.get("format") == "azure":
            print(f"trace data: {traces.AZURE_ATTRIBUTION}", file=sys.stderr)
        return workload, args.trace
    name = args.scenario or config.get("scenario") or scenarios.DEFAULT_SCENARIO
    workload = scenarios.build(str(name), seed=seed, **params)
    if loads:
        import attrs

        workload = attrs.evolve(workload, load_seconds={**workload.load_seconds, **loads})
    return workload, "built-in"


def _check_tiers(workload: Workload, specs: Sequence[PolicySpec]) -> None:
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


def _run_all(
    workload: Workload, specs: Sequence[PolicySpec], lease_factor: float, show: bool
) -> list[RunResult]:
    from prioqueue.sim.engine import simulate

    if not show:
        return [simulate(workload, spec, lease_factor=lease_factor) for spec in specs]
    from rich.progress import Progress

    total = len(workload.arrivals)
    results = []
    with Progress(transient=True) as bar:
        for spec in specs:
            task = bar.add_task(spec.label, total=total)

            def advance(done: int, task: Any = task) -> None:
                bar.update(task, completed=done)

            results.append(simulate(workload, spec, lease_factor=lease_factor, progress=advance))
    return results


def _show_progress(args: argparse.Namespace) -> bool:
    if args.no_progress or not sys.stderr.isatty():
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _print_report(report: Mapping[str, Any], args: argparse.Namespace) -> None:
    from prioqueue.sim import render

    use_rich = not args.plain and sys.stdout.isatty()
    if use_rich:
        try:
            render.render_rich(report)
        except ImportError:
            use_rich = False
    if not use_rich:
        sys.stdout.write(render.render_plain(report))


def _write_json(report: Mapping[str, Any], target: str) -> None:
    text = json.dumps(report, indent=2, allow_nan=False) + "\n"
    if target == "-":
        sys.stdout.write(text)
    else:
        Path(target).write_text(text, encoding="utf-8")


def _guard(step: Callable[[], Any]) -> Any:
    """Run ``step``, turning the expected failures into ``_Failure`` or ``_UsageError``."""
    from prioqueue.sim.traces import TraceError

    try:
        return step()
    except TraceError as exc:
        raise _Failure(str(exc)) from None
    except ConfigError as exc:
        raise _UsageError(str(exc)) from None
    except OSError as exc:
        raise _Failure(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")) from None


class _Failure(Exception):
    """The run failed: exit status 1."""


def run(args: argparse.Namespace) -> int:
    """Run ``prioqueue simulate``.

    Args:
        args: The parsed options (see :func:`add_arguments`).

    Returns:
        The exit status: 0 on success, 1 on failure, 2 on bad usage.
    """
    try:
        return _run(args)
    except _UsageError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except _Failure as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from prioqueue.sim import report as metrics
    from prioqueue.sim import scenarios

    if args.list_scenarios:
        for scenario in scenarios.SCENARIOS.values():
            params = " ".join(f"{k}={v}" for k, v in scenario.defaults.items())
            print(f"{scenario.name}: {scenario.summary}\n    {params}")
        return 0
    config = _load_toml(args.config) if args.config else {}
    specs: list[PolicySpec] = _guard(lambda: _specs(args, config))
    workload, source = _guard(lambda: _workload(args, config))
    _guard(lambda: _check_tiers(workload, specs))
    lease = args.lease_factor if args.lease_factor is not None else config.get("lease_factor", 3.0)
    if not isinstance(lease, (int, float)) or not lease >= 1:
        raise _UsageError(f"--lease-factor must be a number >= 1, got {lease!r}")
    if not workload.arrivals:
        raise _Failure("the workload has no jobs")
    results = _run_all(workload, specs, float(lease), _show_progress(args))
    base = _base_params(args, config)
    report = metrics.build_report(workload, results, base=base, source=source)
    if args.json == "-":
        _write_json(report, "-")
    else:
        _print_report(report, args)
        if args.json:
            _guard(lambda: _write_json(report, args.json))
    if args.plot:
        try:
            from prioqueue.sim import plot
        except ImportError as exc:
            hint = "pip install 'prioqueue-lanes[plot]'"
            raise _Failure(f"--plot needs the optional extra 'plot': {hint} ({exc})") from None
        written = _guard(lambda: plot.write_charts(results, report, Path(args.plot)))
        print(f"wrote {len(written)} charts to {args.plot}", file=sys.stderr)
    return 0
