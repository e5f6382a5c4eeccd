"""Record, and compare against, the simulator's JSON for the built-in scenarios.

Run from the repository root, with this checkout's ``src`` first on the path::

    PYTHONPATH=src python tests/sim/json_snapshots.py record DIR
    PYTHONPATH=src python tests/sim/json_snapshots.py compare DIR

``record`` writes one file per case into ``DIR``: the ``--json -`` output of
``prioqueue simulate`` (every built-in scenario on one GPU, ``--workers 1``, ``--workers 4``,
and a few options: ablations, budgets, hangs, chains, horizons, polling, a TOML fleet, sweeps
and traces), the plain-text report drawn from each, and the raw
:class:`~prioqueue.sim.engine.RunResult` fields of every scenario's default policies. Timing
fields (``timing``, ``wall_seconds``) are dropped. ``compare`` runs the same cases and reports
every file that differs (exit status 1 when one does).

It was written to show that the engine's rewrite (issue 20: one loop for 1..N workers)
changed no number: record with the old code, compare with the new. (Before
``service_gaps`` broke ties by name, the report's ``service_gap_members`` hung on
``PYTHONHASHSEED``; code older than that must be recorded and compared with one fixed seed.)
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCENARIO_NAMES = ("film-night", "two-films", "swap-storm", "overload", "fleet-night")

_FLEET_TOML = """\
[[workers]]
name = "fast"
slots = 2
speed = 1.5

[[workers]]
name = "image-only"
models = ["image"]
resident = "image"

[[workers]]
name = "slow"
speed = 0.75
"""


def _cli_cases(tmp: Path) -> Iterator[tuple[str, list[str]]]:
    """``(name, argv)`` of every command-line case."""
    yield "suite", []
    for name in SCENARIO_NAMES:
        yield f"{name}", ["--scenario", name]
        yield f"{name}-w1", ["--scenario", name, "--workers", "1"]
        yield f"{name}-w4", ["--scenario", name, "--workers", "4"]
    yield "film-night-ablations", ["--scenario", "film-night", "--ablations"]
    budgets = ["--budget", "interactive:max_wait=300,ttl=900", "--budget", "batch:max_queued=40"]
    yield "overload-budgets", ["--scenario", "overload", *budgets]
    yield "overload-budgets-w4", ["--scenario", "overload", "--workers", "4", *budgets]
    hangs = ["--scenario", "film-night", "--param", "lost_fraction=0.03"]
    yield "film-night-hangs", hangs
    yield "film-night-hangs-w3", [*hangs, "--workers", "3"]
    yield "film-night-hangs-nolease", [*hangs, "--lease-factor", "1"]
    chains = ["--scenario", "film-night", "--param", "film_depth=3"]
    yield "film-night-chain", chains
    yield "film-night-chain-w2", [*chains, "--workers", "2"]
    yield "film-night-horizon", ["--scenario", "film-night", "--horizon", "3"]
    yield "film-night-horizon-w2", ["--scenario", "film-night", "--horizon", "3", "--workers", "2"]
    every = [f"--policy={p}" for p in ("fifo", "strict", "warm-first", "prioqueue")]
    yield "swap-storm-all", ["--scenario", "swap-storm", *every]
    yield "swap-storm-all-w2", ["--scenario", "swap-storm", "--workers", "2", *every]
    yield "fleet-night-poll", ["--scenario", "fleet-night", "--poll", "10"]
    yield "fleet-night-hold", ["--scenario", "fleet-night", "--policy", "prioqueue:warm_hold=15"]
    toml = tmp / "fleet.toml"
    toml.write_text(_FLEET_TOML, encoding="utf-8")
    yield "two-films-toml", ["--scenario", "swap-storm", "--workers", str(toml), *every]
    yield "sweep-overload", ["--sweep", "divisor=30,120", "--seeds", "2"]
    yield "sweep-fleet", ["--sweep", "warm_hold=0,60", "--seeds", "2", "--scenario", "fleet-night"]
    yield "sweep-w2", ["--sweep", "divisor=30,120", "--seeds", "2", "--workers", "2"]
    trace = tmp / "film.jsonl"
    _write_trace(trace)
    yield "trace", ["--trace", str(trace)]
    yield "trace-w3", ["--trace", str(trace), "--workers", "3"]
    azure = tmp / "azure.csv"
    from sim_helpers import synthetic_azure  # beside this script

    synthetic_azure(azure)
    yield "trace-azure", ["--trace", str(azure), "--trace-format", "azure"]


def _write_trace(path: Path) -> None:
    from prioqueue.sim import build, traces

    workload = build("film-night", hours=4, lost_fraction=0.02, cancel_fraction=0.05)
    with path.open("w", encoding="utf-8") as handle:
        traces.write_trace(workload, handle)


def _untimed(value: Any) -> Any:
    """``value`` without its timing fields (``timing``, ``wall_seconds``)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in ("timing", "wall_seconds")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _run_cli(argv: list[str]) -> Any:
    import argparse

    from prioqueue.sim import cli

    parser = argparse.ArgumentParser(prog="prioqueue simulate")
    cli.add_arguments(parser)
    args = parser.parse_args([*argv, "--json", "-", "--no-progress"])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.run(args)
    if status != 0:
        raise SystemExit(f"{argv}: exit status {status}: {err.getvalue()}")
    return _untimed(json.loads(out.getvalue()))


def _plain(report: Any) -> list[str]:
    """The plain-text report the command prints for ``report`` (timing fields dropped)."""
    from prioqueue.sim import render

    if "frontier" in report:
        return render.render_sweep(report).split("\n")
    return render.render_plain(report).split("\n")


def _number(x: float) -> Any:
    return repr(x) if isinstance(x, float) and not math.isfinite(x) else x


def _result(result: Any) -> dict[str, Any]:
    """A RunResult's fields, JSON-ready (NaN and inf as strings)."""
    import attrs

    out: dict[str, Any] = {}
    for field in attrs.fields(type(result)):
        if field.name in ("spec", "workload", "wall_seconds"):
            continue
        value = getattr(result, field.name)
        if field.name == "workers":
            value = [attrs.asdict(w) for w in value]
        if field.name == "reorders":
            value = {str(k): v for k, v in value.items()}
        if field.name == "forecasts":
            value = {k: [list(map(_number, p)) for p in v] for k, v in value.items()}
        if isinstance(value, list):
            value = [[_number(x) for x in v] if isinstance(v, tuple) else _number(v) for v in value]
        out[field.name] = _number(value)
    return out


def _engine_cases() -> Iterator[tuple[str, Any]]:
    from prioqueue.sim import build, parse_spec, simulate
    from prioqueue.sim.fleet_policies import DEFAULT_FLEET_POLICIES
    from prioqueue.sim.policies import DEFAULT_POLICIES

    for name in SCENARIO_NAMES:
        workload = build(name, lost_fraction=0.02)
        for workers in (None, 1, 3):
            if workers is None and workload.workers is not None:
                continue
            policies = DEFAULT_POLICIES if workers is None else DEFAULT_FLEET_POLICIES
            for policy in policies:
                result = simulate(
                    workload, parse_spec(policy), workers=workers, horizon=workload.horizon
                )
                yield f"engine-{name}-{workers or 'gpu'}-{policy}", _result(result)


def cases() -> Iterator[tuple[str, Any]]:
    """``(name, JSON value)`` of every case."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in _cli_cases(Path(tmp)):
            text = json.dumps(_run_cli(argv)).replace(tmp, "<tmp>")
            report = json.loads(text)
            yield f"cli-{name}", report
            yield f"text-{name}", _plain(report)
    yield from _engine_cases()


def main(argv: list[str]) -> int:
    """``record DIR`` or ``compare DIR``; returns the exit status."""
    if len(argv) != 2 or argv[0] not in ("record", "compare"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, where = argv[0], Path(argv[1])
    where.mkdir(parents=True, exist_ok=True)
    differ = []
    count = 0
    for name, value in cases():
        count += 1
        text = json.dumps(value, indent=1) + "\n"  # keys in the order written
        path = where / f"{name}.json"
        if mode == "record":
            path.write_text(text, encoding="utf-8")
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            differ.append(name)
            path.with_suffix(".new.json").write_text(text, encoding="utf-8")
            print(f"DIFFERS: {name} (new output in {path.with_suffix('.new.json')})")
    print(f"{mode}: {count} cases, {len(differ)} differ", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
