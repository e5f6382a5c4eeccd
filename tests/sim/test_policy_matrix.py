"""Issue 17's promises on a few cells of the matrix that ``benchmarks/check_policy.py`` runs.

Slow (a minute or more): ``nox -s slow`` runs it; the full matrix (every scenario on one GPU
and on 4 workers, both Azure traces, seeds 1-5) is ``python benchmarks/check_policy.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _check_policy() -> ModuleType:
    path = ROOT / "benchmarks" / "check_policy.py"
    spec = importlib.util.spec_from_file_location("check_policy", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_policy"] = module
    spec.loader.exec_module(module)
    return module


CELLS = [
    ("film-night", 1, None),
    ("fleet-night", 1, 4),
    ("overload", 1, 4),
    ("azure-llm-2023-code.csv", 1, None),
]


@pytest.mark.slow
@pytest.mark.parametrize(("source", "seed", "workers"), CELLS)
def test_the_promises_hold(source: str, seed: int, workers: int | None) -> None:
    check = _check_policy()
    if source.endswith(".csv") and not (check.trace_dir() / source).is_file():
        pytest.skip(f"the trace {source} is not in {check.trace_dir()}")
    cell = check.run_cell(source, seed, workers, "prioqueue", False)
    assert check.verdicts(cell) == []


@pytest.mark.slow
def test_the_check_fails_where_the_old_policy_failed() -> None:
    """The check can fail: before issue 17 fleet-night's normal p99 was 1.6 h (strict 6.3 min)."""
    check = _check_policy()
    cell = check.run_cell("fleet-night", 1, 4, "prioqueue:crossing_share=1", False)
    assert any("normal p99" in failure for failure in check.verdicts(cell))
