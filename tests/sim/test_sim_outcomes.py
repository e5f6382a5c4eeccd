"""Scenario outcomes, asserted from the report (what the simulator is for)."""

from __future__ import annotations

from typing import Any

import pytest

from prioqueue.sim import build_report, parse_spec, scenarios, simulate


def _report(name: str, policies: tuple[str, ...], **params: Any) -> dict[str, Any]:
    workload = scenarios.build(name, **params)
    return build_report(workload, [simulate(workload, parse_spec(p)) for p in policies])


def test_film_night_interactive_waits() -> None:
    report = _report("film-night", ("fifo", "prioqueue", "no-fair-share"))
    longest_job = 960 + 60  # the longest interactive video, cold
    interactive = {name: p["levels"]["100"] for name, p in report["policies"].items()}
    assert interactive["prioqueue"]["wait_p99"] <= 1.25 * longest_job
    assert interactive["fifo"]["wait_p99"] >= 3 * 3600  # hours behind the film
    # Without fair share, each film shot ages from its own arrival and overtakes everyone.
    assert interactive["no-fair-share"]["wait_p99"] >= 3600
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
    report = _report("overload", ("strict", "prioqueue", "no-aging"))
    batch = {name: p["levels"]["-100"]["wait_max"] for name, p in report["policies"].items()}
    assert batch["prioqueue"] < batch["strict"]
    assert batch["prioqueue"] < batch["no-aging"]
    assert report["policies"]["prioqueue"]["reorders"]["aging"] > 0
    assert report["policies"]["prioqueue"]["expired"] > 0


def test_same_seed_same_report() -> None:
    first = _report("overload", ("fifo", "prioqueue"), hours=1.0, cancel_fraction=0.1)
    again = _report("overload", ("fifo", "prioqueue"), hours=1.0, cancel_fraction=0.1)
    for report in (first, again):
        for section in report["policies"].values():
            section.pop("timing")
    assert first == again
