"""Issue 26's promises on a sample of the wider benchmark (``benchmarks/check_wide.py``).

Slow: ``nox -s slow`` runs it; the whole benchmark (36 cells a seed, tuning seeds 1-5 and
validation seeds 6-20 apart) is ``python benchmarks/check_wide.py --seeds 1-20``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

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


def _figures(p99: float, inverted: int, swaps: int = 10) -> dict[str, Any]:
    """One policy's figures in a cell: every level finished, nothing starved."""
    level = {"p99": p99, "unfinished": 0, "starved": 0, "gap_c": 1.0}
    return {
        "levels": {
            "100": {**level, "inverted": 0},
            "0": {**level, "inverted": inverted},
            "-100": {**level, "inverted": 0},
        },
        "swaps": swaps,
        "oldest": None,
    }


def _cell(**figures: dict[str, Any]) -> dict[str, Any]:
    return {
        "family": "overload",
        "source": "overload",
        "load": 1.1,
        "workers": 1,
        "seed": 7,
        "longest": 60.0,
        "fits": True,
        "policy": "prioqueue",
        "figures": figures,
    }


def test_a_failing_cell_names_the_policies_that_pass_it() -> None:
    check = _check_wide()
    cell = _cell(
        fifo=_figures(p99=900.0, inverted=0),  # the interactive p99 past strict's + C
        strict=_figures(p99=100.0, inverted=1),
        **{"warm-first": _figures(p99=100.0, inverted=3)},  # more inverted pairs
        **{"no-fair-share": _figures(p99=120.0, inverted=2)},
        prioqueue=_figures(p99=110.0, inverted=3),
    )
    assert check.verdicts(cell) == ["3 inverted normal pairs (no-fair-share 2)"]
    assert check.passers(cell) == ["strict", "no-fair-share"]
    assert check.line(cell, check.verdicts(cell)).endswith(
        "(no-fair-share 2) (passed by strict, no-fair-share)"
    )
    passing = {**cell, "policy": "strict"}
    assert check.verdicts(passing) == []
    assert check.line(passing, []).endswith(": ok")
    summary = check.summary([cell, passing])
    assert "fifo 0/2, strict 2/2, warm-first 0/2, no-fair-share 2/2, prioqueue 0/2" in summary
    assert "\nchecks failed (cells): inverted normal pairs 1\n" in summary
    assert summary.endswith("failing cells that no simulated policy passes: 0/1")


def test_a_cell_no_simulated_policy_passes_says_so() -> None:
    check = _check_wide()
    slow = _figures(p99=900.0, inverted=0)
    cell = _cell(
        fifo=slow,
        strict=_figures(p99=100.0, inverted=1),
        **{"warm-first": slow},
        **{"no-fair-share": slow},
        prioqueue=_figures(p99=100.0, inverted=2),
    )
    assert check.passers(cell) == []
    assert check.line(cell, check.verdicts(cell)).endswith("(no simulated policy passes)")
    assert check.summary([cell]).endswith("no simulated policy passes: 1/1")


def test_the_summary_counts_each_failed_check_once_a_cell() -> None:
    check = _check_wide()
    cell = {
        **_cell(
            fifo=_figures(p99=100.0, inverted=0, swaps=16),
            strict=_figures(p99=100.0, inverted=0, swaps=10),
            **{"warm-first": _figures(p99=100.0, inverted=0, swaps=12)},
            **{"no-fair-share": _figures(p99=100.0, inverted=2)},
            prioqueue=_figures(p99=900.0, inverted=3, swaps=20),
        ),
        "workers": 2,
    }
    failures = check.verdicts(cell)
    assert [check.check_of(failure) for failure in failures] == [
        "interactive p99",
        "normal p99",
        "swaps > strict",
        "swaps > 1.25 x fewest",
        "inverted normal pairs",
    ]
    quiet = {**cell, "seed": 8, "figures": {**cell["figures"], "prioqueue": _figures(100.0, 0)}}
    assert check.verdicts(quiet) == []
    other = {**cell, "seed": 9, "figures": {**cell["figures"], "prioqueue": _figures(100.0, 3)}}
    line = check.summary([cell, other, quiet]).splitlines()[1]
    assert line == (  # most cells first, then by name
        "checks failed (cells): inverted normal pairs 2, interactive p99 1, normal p99 1, "
        "swaps > 1.25 x fewest 1, swaps > strict 1"
    )
    assert check.summary([quiet]).splitlines()[1] == "checks failed (cells): none"


@pytest.mark.parametrize(
    ("failure", "name"),
    [
        ("4 normal starved > strict 2", "normal starved"),
        ("1 interactive starved (strict 0)", "interactive starved"),
        ("3 batch starved > strict 1", "batch starved"),
        ("normal p99 5434s > strict + C", "normal p99"),
        ("2 inverted interactive pairs (no-fair-share 0)", "inverted interactive pairs"),
    ],
)
def test_each_failure_names_its_check(failure: str, name: str) -> None:
    assert _check_wide().check_of(failure) == name
