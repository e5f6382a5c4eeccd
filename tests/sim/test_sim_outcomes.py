"""Scenario outcomes, asserted from the report (what the simulator is for)."""

from __future__ import annotations

from typing import Any

import pytest

from prioqueue.sim import build_report, parse_spec, scenarios, simulate


def _report(name: str, policies: tuple[str, ...], **params: Any) -> dict[str, Any]:
    workload = scenarios.build(name, **params)
    return build_report(workload, [simulate(workload, parse_spec(p)) for p in policies])


def test_film_night_interactive_waits() -> None:
    report = _report(
        "film-night", ("fifo", "prioqueue", "no-fair-share:crossing_share=1", "no-fair-share")
    )
    longest_job = 960 + 60  # the longest interactive video, cold
    interactive = {name: p["levels"]["100"] for name, p in report["policies"].items()}
    assert interactive["prioqueue"]["wait_p99"] <= 1.25 * longest_job
    assert interactive["fifo"]["wait_p99"] >= 3 * 3600  # hours behind the film
    # Without fair share (and without bounded crossings, as before issue 17), each film shot
    # ages from its own arrival and overtakes everyone.
    assert interactive["no-fair-share:crossing_share=1"]["wait_p99"] >= 3600
    # Bounded crossings alone keep that to about one job (issue 17).
    assert interactive["no-fair-share"]["wait_p99"] <= 1.25 * longest_job
    film = report["policies"]["prioqueue"]["members"]["director"]
    batch = report["policies"]["prioqueue"]["levels"]["-100"]
    assert film["jobs"] == 174
    assert batch["completed"] + batch["cancelled"] == 174


def test_two_films_fair_share_within_bound() -> None:
    report = _report("two-films", ("strict", "prioqueue", "no-fair-share"), shots=30)
    batch = {name: p["levels"]["-100"] for name, p in report["policies"].items()}
    assert batch["prioqueue"]["service_gap"] <= batch["prioqueue"]["gap_bound"]
    assert batch["prioqueue"]["jain"] > 0.95
    for unfair in ("strict", "no-fair-share"):
        assert batch[unfair]["service_gap"] > batch[unfair]["gap_bound"]
        assert batch[unfair]["jain"] == pytest.approx(0.5, abs=0.05)
    assert report["policies"]["prioqueue"]["reorders"]["fair_share"] > 0


def test_swap_storm_affinity_saves_loads() -> None:
    report = _report("swap-storm", ("fifo", "prioqueue", "no-affinity"), hours=1.0)
    swaps = {name: p["swaps"] for name, p in report["policies"].items()}
    assert swaps["prioqueue"] < 0.8 * swaps["no-affinity"]
    assert swaps["prioqueue"] < 0.8 * swaps["fifo"]
    assert report["policies"]["prioqueue"]["reorders"]["affinity"] > 0


def test_overload_aging_bounds_batch_waits() -> None:
    unbounded = "prioqueue:crossing_share=1"  # the policy before issue 17
    report = _report("overload", ("strict", "prioqueue", unbounded, "no-aging"))
    batch = {name: p["levels"]["-100"]["wait_max"] for name, p in report["policies"].items()}
    assert batch[unbounded] < batch["strict"]
    assert batch[unbounded] < batch["no-aging"]
    assert report["policies"][unbounded]["reorders"]["aging"] > 0
    assert report["policies"][unbounded]["expired"] > 0
    # Issue 17: with bounded crossings, batch gets the crossing share, not the GPU: fewer
    # batch jobs starve than under strict, and interactive keeps strict's p99 plus one job.
    levels = {name: p["levels"] for name, p in report["policies"].items()}
    ours, theirs = levels["prioqueue"]["-100"]["starved"], levels["strict"]["-100"]["starved"]
    assert ours < theirs or ours == theirs == 0
    longest = 360.0 + 60.0  # the longest video and its cold load
    assert levels["prioqueue"]["100"]["wait_p99"] <= levels["strict"]["100"]["wait_p99"] + longest
    assert report["policies"]["prioqueue"]["reorders"]["deferred_crossings"] > 0


def test_same_seed_same_report() -> None:
    first = _report("overload", ("fifo", "prioqueue"), hours=1.0, cancel_fraction=0.1)
    again = _report("overload", ("fifo", "prioqueue"), hours=1.0, cancel_fraction=0.1)
    for report in (first, again):
        for section in report["policies"].values():
            section.pop("timing")
    assert first == again
