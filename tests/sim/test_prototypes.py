"""The prototypes of ``benchmarks/prototypes``: rules measured and not taken, run again on demand.

They patch the private core, so these tests check that each still applies its rule to today's
core (a refactor that moves what it patches fails here, not in a benchmark run) and that the
undo restores the library.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.scoring import Scorer, ScoringConfig
from prioqueue.sim import build, build_report, parse_spec, simulate

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import prototypes  # noqa: E402

CONFIG = ScoringConfig(aging_divisor=1.0)  # a point of aging per second
#: The offsets' width (T + A) * d of CONFIG, with every tier counted.
DELTA = (
    max(CONFIG.tier_bonuses.values()) - min(CONFIG.tier_bonuses.values()) + CONFIG.max_affinity
) * CONFIG.aging_divisor


@pytest.fixture
def installed() -> Iterator[list[Any]]:
    """Install prototypes through ``undos.append(prototypes.install(spec))``; undone after."""
    undos: list[Any] = []
    yield undos
    for undo in reversed(undos):
        undo()


def s_of(d: SizeOneDispatcher, member: str, now: float) -> float:
    """The settled part of ``member``'s lane, as the snapshot gives it."""
    (s,) = [lane["s"] for lane in d.snapshot(now=now)["lanes"] if lane["member"] == member]
    return float(s)


def affinity_win() -> SizeOneDispatcher:
    """``a.2`` (``sd``, resident) wins by affinity at 100 over ``b.1`` (``flux``, less served).

    ``a.1`` ran 0-10, so lane ``a`` is at 10 and lane ``b`` (lifted at 5) at 5: without the
    affinity ``b`` ranks 5 points higher, so the win jumped 5 points (5 s at a divisor of 1).
    """
    d = SizeOneDispatcher(scorer=Scorer(CONFIG))
    d.submit("a.1", member="a", model="sd", estimate=10.0, now=0.0)
    first = d.dispatch(now=0.0)
    assert first is not None
    assert first.job.id == "a.1"
    d.submit("b.1", member="b", model="flux", estimate=10.0, now=5.0)
    d.submit("a.2", member="a", model="sd", estimate=10.0, now=5.0)
    d.complete("a.1", now=10.0)
    grant = d.dispatch(now=100.0)
    assert grant is not None
    assert grant.job.id == "a.2"
    assert grant.score.swap_affinity > 0
    return d


def test_without_a_prototype_the_win_is_free() -> None:
    d = affinity_win()
    assert s_of(d, "a", 100.0) == 10.0
    d.complete("a.2", now=110.0)
    assert s_of(d, "a", 110.0) == 20.0


def test_the_win_pays_a_share_of_its_jump(installed: list[Any]) -> None:
    installed.append(prototypes.install("affinity_payment:share=0.5,cap=1"))
    d = affinity_win()
    assert s_of(d, "a", 100.0) == pytest.approx(10.0 + 0.5 * 5.0)
    d.complete("a.2", now=110.0)  # a backlog period's payments are never paid back
    assert s_of(d, "a", 110.0) == pytest.approx(22.5)


def test_the_cap_binds(installed: list[Any]) -> None:
    installed.append(prototypes.install("affinity_payment:share=1,cap=0.1"))
    d = affinity_win()
    assert s_of(d, "a", 100.0) == pytest.approx(10.0 + 0.1 * DELTA)


def test_a_debt_is_repaid_by_the_next_charge(installed: list[Any]) -> None:
    installed.append(prototypes.install("affinity_payment:share=0.5,cap=1,mode=debt"))
    d = affinity_win()
    assert s_of(d, "a", 100.0) == pytest.approx(12.5)
    d.complete("a.2", now=110.0)  # the 10 s charge repays the 2.5 s first
    assert s_of(d, "a", 110.0) == pytest.approx(20.0)


def test_the_undo_restores_the_library(installed: list[Any]) -> None:
    undo = prototypes.install("affinity_payment")
    undo()
    assert s_of(affinity_win(), "a", 100.0) == 10.0


def _bounds() -> dict[str, float]:
    """The default policy's gap bound per level on a small one-GPU workload."""
    work = build("swap-storm", seed=1)
    report = build_report(work, [simulate(work, parse_spec("prioqueue"))])
    return {
        level: row["gap_bound"] for level, row in report["policies"]["prioqueue"]["levels"].items()
    }


def test_the_period_cap_widens_the_one_gpu_gap_bound(installed: list[Any]) -> None:
    before = _bounds()
    installed.append(prototypes.install("affinity_payment:cap=2"))
    # The simulator's policy: a divisor of 60 s, tiers 0-2, affinity 10: (T + A) * d = 720 s.
    assert _bounds() == {level: pytest.approx(bound + 2 * 720.0) for level, bound in before.items()}


def test_a_process_holds_one_prototype_once(installed: list[Any]) -> None:
    """A forked pool worker inherits its parent's prototype, then its initializer installs the
    same spec again: that changes nothing (the bound is widened once, not twice)."""
    before = _bounds()
    undo = prototypes.install("affinity_payment:cap=1")
    installed.append(undo)
    assert prototypes.install("affinity_payment:cap=1") is undo
    assert _bounds() == {level: pytest.approx(bound + 720.0) for level, bound in before.items()}
    with pytest.raises(ValueError, match="'affinity_payment:cap=1' is installed; undo it before"):
        prototypes.install("affinity_payment:cap=2")
    undo()
    undo()  # a second undo changes nothing
    assert _bounds() == before
    installed.append(prototypes.install("affinity_payment:cap=2"))
    assert _bounds() == {level: pytest.approx(bound + 1440.0) for level, bound in before.items()}


def test_the_command_line_option_exits_with_the_reason() -> None:
    parser = argparse.ArgumentParser()
    prototypes.add_option(parser)
    args = parser.parse_args(["--prototype", "affinity_payment:cap=x"])
    with pytest.raises(SystemExit, match="--prototype: affinity_payment: cap must be"):
        prototypes.install_option(args)
    prototypes.install_option(parser.parse_args([]))  # none: nothing to install


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nothing", "unknown prototype 'nothing'; known: affinity_payment"),
        ("affinity_payment:share", "expected key=value, got 'share'"),
        ("affinity_payment:cap=1,cap=2", "'cap' is given twice"),
        ("affinity_payment:share=0", r"share must be a number in \(0, 1\], got '0'"),
        ("affinity_payment:share=x", r"share must be a number in \(0, 1\], got 'x'"),
        ("affinity_payment:cap=-1", "cap must be a finite number >= 0 or 'none', got '-1'"),
        ("affinity_payment:mode=later", "mode must be one of period, debt, got 'later'"),
    ],
)
def test_bad_specs_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prototypes.install(spec)


def test_an_unknown_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown parameter 'size'; it takes share, cap, mode"):
        prototypes.install("affinity_payment:size=1")
