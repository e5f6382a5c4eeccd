"""The simulator: replay workloads through the real dispatcher and compare policies.

``prioqueue simulate`` is its command line (see :mod:`prioqueue.sim.cli` and
``docs/simulator.md``). From Python::

    from prioqueue.sim import build, parse_spec, simulate, build_report

    workload = build("two-films", shots=30)
    results = [simulate(workload, parse_spec(p)) for p in ("strict", "prioqueue")]
    report = build_report(workload, results)

Baselines (``fifo``, ``strict``) live here, never in the core.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prioqueue.sim.engine import RunResult, simulate
    from prioqueue.sim.policies import PolicyParams, PolicySpec, parse_spec
    from prioqueue.sim.report import build_report
    from prioqueue.sim.scenarios import SCENARIOS, build
    from prioqueue.sim.traces import TraceError, read_trace
    from prioqueue.sim.workload import Arrival, Workload

# Imported on first use, so that ``prioqueue --help`` (which imports prioqueue.sim.cli) stays
# fast.
_LAZY = {
    "RunResult": "engine",
    "simulate": "engine",
    "PolicyParams": "policies",
    "PolicySpec": "policies",
    "parse_spec": "policies",
    "build_report": "report",
    "SCENARIOS": "scenarios",
    "build": "scenarios",
    "TraceError": "traces",
    "read_trace": "traces",
    "Arrival": "workload",
    "Workload": "workload",
}

__all__ = [
    "SCENARIOS",
    "Arrival",
    "PolicyParams",
    "PolicySpec",
    "RunResult",
    "TraceError",
    "Workload",
    "build",
    "build_report",
    "parse_spec",
    "read_trace",
    "simulate",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'prioqueue.sim' has no attribute {name!r}")
    return getattr(import_module(f"prioqueue.sim.{module}"), name)
