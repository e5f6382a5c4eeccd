"""Issue 17's promises on a few cells of the matrix that ``benchmarks/check_policy.py`` runs.

Slow (a minute or more): ``nox -s slow`` runs it; the full matrix (every scenario on one GPU
and on 4 workers, both Azure traces, seeds 1-5) is ``python benchmarks/check_policy.py``.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from sim_helpers import load_benchmark


def _check_policy() -> ModuleType:
    return load_benchmark("check_policy")


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
