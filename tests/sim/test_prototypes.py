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
from prioqueue.sim.workload import Arrival, Workload

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import prototypes  # noqa: E402

from affinity_support import film_passed_by_newcomers  # noqa: E402

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
        (
            "nothing",
            "unknown prototype 'nothing'; known: affinity_hold, affinity_payment, lift_refund, "
            "warm_charge",
        ),
        ("affinity_payment:share", "expected key=value, got 'share'"),
        ("affinity_payment:cap=1,cap=2", "'cap' is given twice"),
        ("affinity_payment:share=0", r"share must be a number in \(0, 1\], got '0'"),
        ("affinity_payment:share=x", r"share must be a number in \(0, 1\], got 'x'"),
        ("affinity_payment:cap=-1", "cap must be a finite number >= 0 or 'none', got '-1'"),
        ("affinity_payment:mode=later", "mode must be one of period, debt, got 'later'"),
        ("affinity_hold:budget=0", "budget must be a finite number > 0, got '0'"),
        ("affinity_hold:budget=inf", "budget must be a finite number > 0, got 'inf'"),
        ("warm_charge:service=all", "service must be one of core, both, got 'all'"),
    ],
)
def test_bad_specs_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prototypes.install(spec)


def test_an_unknown_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown parameter 'size'; it takes share, cap, mode"):
        prototypes.install("affinity_payment:size=1")


def cold_then_warm() -> Workload:
    """``a.1`` loads ``sd`` (100 s) and runs 10 s; ``a.2`` runs 10 s warm behind it."""
    return Workload(
        name="cold-then-warm",
        arrivals=(
            Arrival(arrival=0.0, member="a", priority=0, model="sd", duration=10.0),
            Arrival(arrival=0.0, member="a", priority=0, model="sd", duration=10.0),
        ),
        load_seconds={"sd": 100.0},
    )


def reported_runtimes(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the runtimes the simulator reports to the dispatcher's ``complete``."""
    seen: list[float] = []
    original = SizeOneDispatcher.complete

    def complete(self: SizeOneDispatcher, job_id: str, **kwargs: Any) -> Any:
        seen.append(kwargs["runtime"])
        return original(self, job_id, **kwargs)

    monkeypatch.setattr(SizeOneDispatcher, "complete", complete)
    simulate(cold_then_warm(), parse_spec("prioqueue"))
    return seen


def test_without_a_prototype_the_cold_job_pays_its_load(monkeypatch: pytest.MonkeyPatch) -> None:
    assert reported_runtimes(monkeypatch) == [pytest.approx(110.0), pytest.approx(10.0)]


def test_the_warm_charge_leaves_the_load_out(
    installed: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    installed.append(prototypes.install("warm_charge"))
    assert reported_runtimes(monkeypatch) == [pytest.approx(10.0), pytest.approx(10.0)]


def _gap_bound() -> float:
    """The level's gap bound: it grows with the largest charge the report counted."""
    work = cold_then_warm()
    report = build_report(work, [simulate(work, parse_spec("prioqueue"))])
    (row,) = report["policies"]["prioqueue"]["levels"].values()
    return float(row["gap_bound"])


def test_the_warm_service_is_what_the_report_counts_with_service_both(
    installed: list[Any],
) -> None:
    before = _gap_bound()
    undo = prototypes.install("warm_charge")
    assert _gap_bound() == before  # service=core: the report counts the load still
    undo()
    installed.append(prototypes.install("warm_charge:service=both"))
    assert _gap_bound() == pytest.approx(before - 10 * 100.0)  # 10 C, C without the load


def held_order() -> list[str]:
    """The grants while ``a``'s jobs for the resident ``sd`` pass ``b.1`` (``flux``) by affinity.

    A divisor of 1 and an affinity of 10: the window ``A * d`` is 10 s. ``a.2`` and ``a.3``
    (4 s each) rank higher with the affinity only; ``b.1`` is the less served lane.
    """
    d = SizeOneDispatcher(scorer=Scorer(CONFIG))
    d.submit("a.1", member="a", model="sd", estimate=2.0, now=0.0)
    assert d.dispatch(now=0.0) is not None
    d.submit("b.1", member="b", model="flux", estimate=4.0, now=1.0)
    d.submit("a.2", member="a", model="sd", estimate=4.0, now=1.0)
    d.submit("a.3", member="a", model="sd", estimate=4.0, now=1.0)
    d.complete("a.1", now=2.0)
    order = []
    now = 2.0
    for _ in range(3):
        grant = d.dispatch(now=now)
        assert grant is not None
        order.append(grant.job.id)
        now += 4.0
        d.complete(grant.job.id, now=now)
    return order


def test_without_a_prototype_the_affinity_holds_the_model() -> None:
    assert held_order() == ["a.2", "a.3", "b.1"]


def test_the_hold_ends_when_its_budget_is_spent(installed: list[Any]) -> None:
    installed.append(prototypes.install("affinity_hold:budget=0.5"))  # 5 s: one 4 s job
    assert held_order() == ["a.2", "b.1", "a.3"]


def test_a_budget_that_covers_the_jobs_changes_nothing(installed: list[Any]) -> None:
    installed.append(prototypes.install("affinity_hold:budget=1"))  # 10 s: both jobs
    assert held_order() == ["a.2", "a.3", "b.1"]


def test_without_a_prototype_newcomers_pass_until_the_film_is_overdue() -> None:
    assert film_passed_by_newcomers(SizeOneDispatcher()) == 5280.0


def test_the_lift_refund_keeps_the_affinity_window(installed: list[Any]) -> None:
    installed.append(prototypes.install("lift_refund"))
    assert film_passed_by_newcomers(SizeOneDispatcher()) == 600.0


def test_the_lift_refund_gives_the_gap_back_when_the_model_leaves(installed: list[Any]) -> None:
    """``b`` is lifted 10 s later than ``a`` for the resident ``sd`` (divisor 1, affinity 10):
    their keys tie and ``a`` (the smaller ``s``) goes, swapping ``sd`` out of the only worker,
    so ``b`` gets its 10 s back and starts level with ``a``."""
    installed.append(prototypes.install("lift_refund"))
    d = SizeOneDispatcher(scorer=Scorer(CONFIG))
    d.set_resident_model("sd")
    d.submit("a.1", member="a", model="flux", estimate=5.0, now=0.0)
    d.submit("a.2", member="a", model="flux", estimate=5.0, now=0.0)
    d.submit("b.1", member="b", model="sd", estimate=5.0, now=20.0)
    assert s_of(d, "b", 20.0) == 10.0
    grant = d.dispatch(now=20.0)
    assert grant is not None
    assert (grant.job.id, grant.swap) == ("a.1", True)
    assert s_of(d, "b", 20.0) == 0.0
