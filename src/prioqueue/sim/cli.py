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
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prioqueue.errors import ConfigError
from prioqueue.sim import _options as options
from prioqueue.sim._options import UsageError

if TYPE_CHECKING:
    from prioqueue.sim.engine import RunResult
    from prioqueue.sim.policies import PolicySpec
    from prioqueue.sim.workers import WorkerSpec
    from prioqueue.sim.workload import Workload

__all__ = ["add_arguments", "run"]

_PROG = "prioqueue simulate"


class ArgumentGroup(Protocol):
    """What options are added to: a parser or a group (argparse's group type is private)."""

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``simulate`` options to ``parser``.

    Args:
        parser: The subcommand's parser.
    """
    parser.epilog = (
        "Without --scenario or --trace, runs film-night, two-films and overload and opens with "
        "a verdict. policies: fifo, strict, prioqueue (default) and the ablations no-aging, "
        "no-affinity, no-fair-share (--ablations); a policy can take parameters: "
        "--policy prioqueue:divisor=30. Sweep a parameter: --sweep divisor=30,60,120,240 "
        "--seeds 5. Several workers: --workers 4 (or a TOML file of [[workers]]) compares "
        "fifo, strict, warm-first and prioqueue on a fleet; --scenario fleet-night is one. "
        "See docs/simulator.md for the trace format and the JSON schema."
    )
    _workload_arguments(parser)
    _fleet_arguments(parser)
    _parameter_arguments(_policy_arguments(parser))
    _output_arguments(parser)


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_argument_group("workload")
    source.add_argument(
        "--scenario",
        help="built-in scenario (default: the film-night, two-films, overload suite; "
        "see --list-scenarios)",
    )
    source.add_argument("--list-scenarios", action="store_true", help="list scenarios and exit")
    source.add_argument("--seed", type=int, help="RNG seed of the scenario or converter (1)")
    _repeatable(
        source,
        "--param",
        "KEY=VALUE",
        "scenario (or azure converter) parameter, e.g. hours=6; repeatable",
    )
    source.add_argument("--trace", metavar="PATH", help="replay a trace file instead")
    source.add_argument(
        "--trace-format",
        choices=("auto", "csv", "jsonl", "azure"),
        default="auto",
        help="trace format (auto: by suffix and header, recognising the Azure LLM inference "
        "2023 CSV; azure: force that converter)",
    )
    source.add_argument(
        "--horizon",
        type=float,
        metavar="HOURS",
        help="stop the clock after HOURS (0: run until every job has left); jobs still queued "
        "count as unfinished (default: the scenario's, none for traces)",
    )
    _repeatable(source, "--load-seconds", "MODEL=SECONDS", "cold-load time of a model; repeatable")
    source.add_argument(
        "--lease-factor",
        type=float,
        help="leases last FACTOR x duration + the slowest load (3); only hung jobs expire",
    )


def _fleet_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--workers",
        metavar="SPEC",
        help="run on a fleet: a count (4) or a TOML file of [[workers]] with name, models, "
        "slots, speed, resident (default: one GPU; fleet-night: its gpus parameter)",
    )
    fleet.add_argument(
        "--poll",
        type=float,
        metavar="SECONDS",
        help="idle workers ask for work every SECONDS; a worker whose job ends asks at once "
        "(default 0: at every instant)",
    )


def _policy_arguments(parser: argparse.ArgumentParser) -> ArgumentGroup:
    policy = parser.add_argument_group("policies")
    _repeatable(
        policy,
        "--policy",
        "SPEC",
        "policy to compare, KIND[:key=value,...]; repeatable (default: fifo, strict, prioqueue)",
    )
    policy.add_argument(
        "--ablations",
        action="store_true",
        help="add no-aging, no-affinity and no-fair-share to the policies",
    )
    policy.add_argument(
        "--sweep",
        metavar="KEY=V1,V2,...",
        help="run prioqueue (or the one --policy given) once per value of a scoring or "
        "dispatcher parameter (divisor, spacing, affinity, charge, fair_share, warm_hold, "
        "crossing_share, "
        "tier.NAME, affinity.MODEL) over --seeds seeds",
    )
    policy.add_argument(
        "--seeds", type=int, metavar="N", help="seeds of a sweep: --seed, --seed+1, ... (5)"
    )
    return policy


def _parameter_arguments(policy: ArgumentGroup) -> None:
    policy.add_argument("--config", metavar="FILE", help="TOML file of settings (see docs)")
    policy.add_argument("--aging-divisor", type=float, help="seconds per aging point (60)")
    policy.add_argument("--band-spacing", type=float, help="distance between levels (100)")
    policy.add_argument("--max-affinity", type=float, help="largest swap-affinity bonus (10)")
    _repeatable(
        policy,
        "--tier-bonus",
        "TIER=BONUS",
        "tier bonus (replaces the default free=0 pro=1 max=2 when given); repeatable",
    )
    _repeatable(policy, "--affinity", "MODEL=BONUS", "per-model affinity bonus; repeatable")
    policy.add_argument("--charge", help="fair-share charge: runtime, estimate or SECONDS")
    _repeatable(
        policy,
        "--budget",
        "LEVEL:KEY=VALUE,...",
        "queue budget of one level for the dispatcher's policies (max_wait=SECONDS, "
        "max_queued=N, ttl=SECONDS), e.g. --budget interactive:max_wait=300 (LEVEL: a number "
        "or interactive, normal, batch); repeatable; off by default",
    )


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    output = parser.add_argument_group("output")
    output.add_argument("--json", metavar="FILE", help="write the report as JSON ('-': stdout)")
    output.add_argument(
        "--plot",
        metavar="DIR",
        help="write PNG charts: wait CDFs, GPU timeline, service gap; a sweep's frontier "
        "(needs the plot extra)",
    )
    output.add_argument("--plain", action="store_true", help="plain text even on a terminal")
    output.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (shown on stderr, on a terminal)",
    )


def _run_all(
    workload: Workload,
    specs: Sequence[PolicySpec],
    lease_factor: float,
    show: bool,
    fleet: tuple[tuple[WorkerSpec, ...] | None, float] = (None, 0.0),
) -> list[RunResult]:
    from prioqueue.sim.engine import simulate

    horizon = workload.horizon
    workers, poll = fleet
    run = partial(simulate, lease_factor=lease_factor, horizon=horizon, workers=workers, poll=poll)
    if not show:
        return [run(workload, spec) for spec in specs]
    from rich.console import Console
    from rich.progress import Progress

    total = len(workload.arrivals)
    results = []
    with Progress(console=Console(stderr=True), transient=True) as bar:
        for spec in specs:
            task = bar.add_task(f"{workload.name}: {spec.label}", total=total)

            def advance(done: int, task: Any = task) -> None:
                bar.update(task, completed=done)

            results.append(run(workload, spec, progress=advance))
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
    """Run ``step``, turning the expected failures into ``_Failure`` or ``UsageError``."""
    from prioqueue.sim.traces import TraceError

    try:
        return step()
    except TraceError as exc:
        raise _Failure(str(exc)) from None
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise _Failure(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")) from None


def _repeatable(group: ArgumentGroup, flag: str, metavar: str, text: str) -> None:
    """Add an option that may be given several times (its values collect in a list)."""
    group.add_argument(flag, action="append", default=[], metavar=metavar, help=text)


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
    except UsageError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except _Failure as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 1


def _list_scenarios() -> None:
    from prioqueue.sim import scenarios

    for scenario in scenarios.SCENARIOS.values():
        print(f"{scenario.name}: {scenario.summary}")
        for key, value in scenario.defaults.items():
            unit = scenarios.UNITS.get(key, "")
            print(f"    {key}={value:g}  ({unit})" if unit else f"    {key}={value:g}")


def _plot_module() -> Any:
    """Import the chart module now, before any simulation, or fail with the install hint."""
    try:
        from prioqueue.sim import plot
    except ImportError as exc:
        hint = "pip install '.[plot]' from a clone (prioqueue-lanes[plot] once released)"
        raise _Failure(f"--plot needs the optional extra 'plot': {hint} ({exc})") from None
    return plot


def _run(args: argparse.Namespace) -> int:
    from prioqueue.sim import report as metrics

    if args.list_scenarios:
        _list_scenarios()
        return 0
    plot = _plot_module() if args.plot else None
    config = options.load_toml(args.config) if args.config else {}
    lease = args.lease_factor if args.lease_factor is not None else config.get("lease_factor", 3.0)
    if not isinstance(lease, (int, float)) or not lease >= 1:
        raise UsageError(f"--lease-factor must be a number >= 1, got {lease!r}")
    if args.sweep:
        return _run_sweep(args, config, float(lease), plot)
    fleet = _guard(lambda: options.fleet(args, config))
    found: list[tuple[Workload, str]] = _guard(lambda: options.workloads(args, config))
    is_fleet = fleet[0] is not None or any(w.workers is not None for w, _ in found)
    specs: list[PolicySpec] = _guard(lambda: options.specs(args, config, fleet=is_fleet))
    base = options.base_params(args, config)
    show = _show_progress(args)
    reports: list[dict[str, Any]] = []
    runs: list[list[RunResult]] = []
    for workload, source in found:
        _guard(partial(options.check_tiers, workload, specs))
        if not workload.arrivals:
            raise _Failure(f"{workload.name}: the workload has no jobs")
        results = _guard(partial(_run_all, workload, specs, float(lease), show, fleet))
        runs.append(results)
        reports.append(metrics.build_report(workload, results, base=base, source=source))
    report: dict[str, Any] = reports[0] if len(reports) == 1 else {"scenarios": reports}
    _emit(report, args)
    if plot is not None:
        written: list[Path] = []
        for results, one in zip(runs, reports, strict=True):
            target = Path(args.plot)
            if len(reports) > 1:
                target = target / one["scenario"]["name"]
            written += _guard(partial(plot.write_charts, results, one, target, base=base))
        print(f"wrote {len(written)} charts to {args.plot}", file=sys.stderr)
    return 0


def _emit(report: Mapping[str, Any], args: argparse.Namespace) -> None:
    if args.json == "-":
        _write_json(report, "-")
    else:
        _print_report(report, args)
        if args.json:
            _guard(lambda: _write_json(report, args.json))


def _run_sweep(args: argparse.Namespace, config: Mapping[str, Any], lease: float, plot: Any) -> int:
    from prioqueue.sim import render, sweep

    key, values = _guard(lambda: sweep.parse_sweep(args.sweep))
    if len(args.policy) > 1:
        raise UsageError("--sweep varies one policy: give at most one --policy KIND")
    policy = args.policy[0] if args.policy else "prioqueue"
    seeds_n = 5 if args.seeds is None else args.seeds
    if seeds_n < 1:
        raise UsageError(f"--seeds must be >= 1, got {seeds_n}")
    first = args.seed if args.seed is not None else int(config.get("seed", 1))
    seeds = list(range(first, first + seeds_n))
    if args.trace:
        raise UsageError("--sweep runs a scenario over several seeds; it takes no --trace")
    if not (args.scenario or config.get("scenario")):
        args = argparse.Namespace(**{**vars(args), "scenario": "overload"})
    base = options.base_params(args, config)

    def make(seed: int) -> Workload:
        local = argparse.Namespace(**{**vars(args), "seed": seed})
        workload, _ = options.workloads(local, config)[0]
        return workload

    workload = _guard(lambda: make(seeds[0]))
    workers, poll = _guard(lambda: options.fleet(args, config))
    result = _guard(
        lambda: sweep.run_sweep(
            make,
            policy,
            key,
            values,
            seeds,
            base=base,
            lease_factor=lease,
            workers=workers,
            poll=poll,
        )
    )
    out = {"scenario": workload.name, "params": dict(workload.params), **result}
    if workers is not None or workload.workers is not None:
        out["workers"] = len(workers) if workers is not None else workload.workers
        out["poll"] = poll
    if args.json == "-":
        _write_json(out, "-")
    else:
        sys.stdout.write(render.render_sweep(out))
        if args.json:
            _guard(lambda: _write_json(out, args.json))
    if plot is not None:
        path = _guard(lambda: plot.write_frontier(out, Path(args.plot)))
        print(f"wrote {path}", file=sys.stderr)
    return 0
