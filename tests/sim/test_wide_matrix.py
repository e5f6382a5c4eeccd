"""Issue 26's promises on a sample of the wider benchmark (``benchmarks/check_wide.py``).

Slow: ``nox -s slow`` runs it; the whole benchmark (36 cells a seed, tuning seeds 1-5 and
validation seeds 6-20 apart) is ``python benchmarks/check_wide.py --seeds 1-20``.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from sim_helpers import load_benchmark


def _check_wide() -> ModuleType:
    return load_benchmark("check_wide")


CELLS = [
    ("overload", "overload", 1.1, 4, 1),
    ("overload", "overload", 2.0, 8, 1),
    ("fleet-night", "fleet-night", 0.0, 1, 1),
    ("bursty", "bursty", 1.5, 4, 1),
    ("azure", "azure-llm-2023-conv.csv", 1.3, 1, 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{c[1]}-{c[2]}-x{c[3]}")
def test_the_promises_hold(cell: tuple[str, str, float, int, int]) -> None:
    check = _check_wide()
    if cell[1].endswith(".csv") and not (check.trace_dir() / cell[1]).is_file():
        pytest.skip(f"the trace {cell[1]} is not in {check.trace_dir()}")
    result = check.run_cell(cell, "prioqueue", {})
    assert check.verdicts(result) == []


@pytest.mark.slow
def test_the_check_fails_where_fifo_fails() -> None:
    """The check can fail: FIFO on an overloaded fleet keeps interactive work waiting."""
    check = _check_wide()
    result = check.run_cell(("overload", "overload", 1.1, 4, 1), "fifo", {})
    assert any("interactive p99" in failure for failure in check.verdicts(result))


def test_the_matrix_has_every_family_and_seed_range() -> None:
    check = _check_wide()
    cells = check.cells(check.parse_seeds("1-20"), check.FAMILIES)
    assert len(cells) == 36 * 20
    assert check.parse_seeds("1,4,7-9") == [1, 4, 7, 8, 9]
    with pytest.raises(SystemExit, match="seeds >= 1"):
        check.parse_seeds("0-3")
