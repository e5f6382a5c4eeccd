"""The dispatchers' read-only views (``prioqueue.views``): copies, never the live state."""

from __future__ import annotations

import attrs
import pytest

from prioqueue import FleetDispatcher, LevelBudget, SizeOneDispatcher, UnknownGroup, UnknownWorker
from prioqueue.lifecycle import Backoff
from prioqueue.views import GroupFinish, WorkerLoad


def _fleet() -> FleetDispatcher:
    fleet = FleetDispatcher(
        lease_for=lambda job: 60.0,
        budgets={100: LevelBudget(max_queued=5)},
        backoff=Backoff(kind="linear", base=2.0, max=60.0),
    )
    fleet.join("w1", resident="m1", now=0.0)
    fleet.join("w2", slots=2, now=0.0)
    for i in range(4):
        fleet.submit(f"a{i}", member="ann", model="m1", estimate=10.0, group="film", now=1.0)
    fleet.submit("b0", member="bob", priority="interactive", estimate=5.0, now=1.0)
    fleet.submit("later", member="bob", not_before=500.0, now=1.0)
    return fleet


def test_views_are_frozen_copies_that_later_calls_do_not_change() -> None:
    fleet = _fleet()
    first = fleet.pop("w1", now=2.0)
    assert first is not None
    lanes = fleet.member_lanes(heads=2)
    workers = fleet.worker_views()
    grants = fleet.recent_grants(since=0.0, limit=10)
    assert first.job.id == "b0"  # interactive first
    assert [(v.member, v.level, v.queued, v.running) for v in lanes] == [
        ("bob", 100, 0, 1),  # held only: still listed
        ("ann", 0, 4, 0),
    ]
    assert [job.id for job in lanes[1].heads] == ["a0", "a1"]
    assert all(len(v.heads) <= 2 for v in lanes)
    assert [w.info.name for w in workers] == ["w1", "w2"]
    assert workers[0].grants == (first,)
    assert workers[0].jobs == (fleet.job(first.job.id),)
    assert [g.job_id for g in grants] == [first.job.id]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        lanes[0].queued = 9  # type: ignore[misc]
    fleet.pop("w2", now=3.0)
    fleet.complete(first.job.id, now=4.0)
    assert workers[0].grants == (first,)  # the old view is unchanged
    assert fleet.worker_views()[0].grants == ()
    assert [g.job_id for g in fleet.recent_grants(since=0.0, limit=1)] != [first.job.id]


def test_counts_ids_and_settings() -> None:
    fleet = _fleet()
    assert fleet.delayed_count() == 1
    assert fleet.job_ids() == ["a0", "a1", "a2", "a3", "b0", "later"]
    assert fleet.budgets == {100: LevelBudget(max_queued=5)}
    fleet.budgets.clear()  # a copy
    assert fleet.budgets == {100: LevelBudget(max_queued=5)}
    assert fleet.backoff == Backoff(kind="linear", base=2.0, max=60.0)
    assert fleet.worker_load("w2") == WorkerLoad(0.0, False, 0, 2)
    with pytest.raises(UnknownWorker):
        fleet.worker_load("nobody")


def test_group_reads_without_and_with_the_dry_run() -> None:
    fleet = _fleet()
    assert fleet.group_listing() == [("film", True)]
    counts = fleet.group_status("film", now=2.0, forecast=False)
    assert (counts.queued, counts.forecast_finish) == (4, None)
    assert fleet.group_status("film", now=2.0).forecast_finish is not None
    finishes = fleet.group_finishes(["film"], now=2.0, limit=100)
    assert finishes == {
        "film": GroupFinish(fleet.group_status("film", now=2.0).forecast_finish, False)
    }
    assert fleet.group_finishes(["film"], now=2.0, limit=1) == {"film": GroupFinish(None, True)}
    with pytest.raises(UnknownGroup):
        fleet.group_finishes(["nothing"], now=2.0, limit=5)


def test_bad_arguments_raise_documented_errors() -> None:
    fleet = _fleet()
    with pytest.raises(ValueError, match="limit must be an int >= 0"):
        fleet.recent_grants(since=0.0, limit=-1)
    with pytest.raises(ValueError, match="since"):
        fleet.recent_grants(since=float("nan"), limit=1)
    with pytest.raises(ValueError, match="heads must be an int >= 0"):
        fleet.member_lanes(heads=True)
    with pytest.raises(ValueError, match="scan must be an int >= 0"):
        fleet.member_lanes(scan=-2)
    with pytest.raises(ValueError, match="limit must be an int >= 0"):
        fleet.group_finishes(["film"], now=2.0, limit=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group"):
        fleet.group_finishes([""], now=2.0, limit=1)
    with pytest.raises(TypeError, match="forecast must be a bool"):
        fleet.group_status("film", now=2.0, forecast=1)  # type: ignore[arg-type]


def test_the_size_one_dispatcher_has_the_same_views_and_no_lanes_without_fair_share() -> None:
    d = SizeOneDispatcher(fair_share=False)
    d.submit("x", member="ann", now=0.0)
    assert d.member_lanes() == []
    assert d.job_ids() == ["x"]
    assert len(d.worker_views()) == 1
