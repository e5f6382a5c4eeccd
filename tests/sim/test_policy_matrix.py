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


def test_the_tally_keeps_families_and_seed_ranges_apart() -> None:
    """The pass counts are per family and per seed range (tuning 1-5, validation 6+)."""
    check = _check_policy()

    def cell(source: str, seed: int, workers: int, p99: float) -> dict[str, object]:
        levels = {"100": {"p99": p99, "unfinished": 0, "starved": 0, "gap": None, "bound": None}}
        figures = {"levels": levels, "oldest_queued": None, "swaps": 0}
        strict = {"levels": {"100": {**levels["100"], "p99": 10.0}}, "oldest_queued": None}
        return {
            "source": source,
            "seed": seed,
            "workers": workers,
            "longest": 60.0,
            "policy": "prioqueue",
            "figures": {"strict": strict, "prioqueue": figures},
        }

    rows = check.tally(
        [
            cell("overload", 1, 1, 20.0),
            cell("overload", 2, 1, 500.0),  # fails: past strict + C
            cell("overload", 7, 4, 20.0),
            cell("azure-llm-2023-code.csv", 6, 1, 20.0),
        ]
    )
    assert rows == [
        f"{'azure':<20} {'validation':<10} 1/1 cells pass",
        f"{'overload':<20} {'tuning':<10} 1/2 cells pass",
        f"{'overload/4':<20} {'validation':<10} 1/1 cells pass",
    ]
