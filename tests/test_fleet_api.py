"""FleetDispatcher's API: workers, eligibility, charges, take-backs, errors (docs/design/fleet.md).

Unit tests of each rule and every error path; the brute-force comparison is the stateful test
against ``prioqueue.testing.ReferenceFleet``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from fleet_support import leases
from prioqueue import (
    ConfigError,
    FleetDispatcher,
    InvalidState,
    LeaseCalculator,
    LeaseExpired,
    UnknownJob,
    UnknownWorker,
    WorkerInfo,
)
from prioqueue.records import Grant, Job

D = 60.0  # the default aging divisor


class Checked(FleetDispatcher):
    """A fleet that checks its invariants after every change."""

    def pop(self, name: str, *, now: float) -> Grant | None:
        grant = super().pop(name, now=now)
        self._check()
        return grant

    def expire(self, now: float) -> Any:
        result = super().expire(now)
        self._check()
        return result


def fleet(*names: str, now: float = 0.0, **options: Any) -> Checked:
    f = Checked(**options)
    for name in names:
        f.join(name, now=now)
    return f


def popped(f: FleetDispatcher, name: str, now: float) -> str:
    grant = f.pop(name, now=now)
    assert grant is not None, f"{name} got nothing"
    assert grant.worker == name
    return grant.job.id


def lane_s(f: FleetDispatcher, member: str, level: int = 0) -> float:
    return f._core.lanes.by_key[(member, level)].s


# ============================================================================ construction


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"worker_timeout": 0}, "worker_timeout must be a positive number"),
        ({"worker_timeout": -5}, "worker_timeout must be a positive number"),
        ({"worker_timeout": math.nan}, "worker_timeout must be a finite number"),
        ({"warm_hold": -1}, "warm_hold must be a number of seconds >= 0"),
        ({"warm_hold": math.inf}, "warm_hold must be a finite number"),
        ({"load_seconds": 30}, "load_seconds must be a mapping of model name to seconds"),
        ({"load_seconds": {"m": -1}}, r"load_seconds\['m'\] must be seconds >= 0"),
        ({"load_seconds": {"m": math.nan}}, r"load_seconds\['m'\] must be a finite number"),
        ({"load_seconds": {"": 1}}, "load_seconds model must be a non-empty str"),
        ({"max_running_per_member": 0}, "max_running_per_member must be a positive int"),
        ({"max_running_per_member": True}, "max_running_per_member must be a positive int"),
        ({"history_bytes": -1}, "history_bytes must be an int >= 0"),
        ({"lease_for": 5}, "lease_for must be a callable job -> seconds"),
    ],
)
def test_constructor_rejects_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FleetDispatcher(**options)


# ============================================================================ workers


def test_join_returns_the_worker_and_a_rejoin_updates_it() -> None:
    f = Checked()
    info = f.join("gpu-a", models=["m1", "m2"], resident="m1", slots=2, slow=True, now=5)
    assert info == WorkerInfo(
        name="gpu-a",
        models=frozenset({"m1", "m2"}),
        resident="m1",
        slots=2,
        slow=True,
        held=(),
        last_seen=5.0,
        timed_out=False,
        filtered=False,
    )
    again = f.join("gpu-a", accepts=lambda job: True, now=6)
    assert again.models is None
    assert again.slots == 1
    assert not again.slow
    assert again.resident == "m1"  # kept: resident=None means unchanged on a re-join
    assert again.filtered
    assert f.workers() == [again]
    assert f.worker("gpu-a") == again
    assert f.capacity == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": ""}, "worker name must be a non-empty str"),
        ({"name": 3}, "worker name must be a non-empty str"),
        ({"models": "m1"}, "models must be an iterable of model names"),
        ({"models": 5}, "models must be an iterable of model names, got 5"),
        ({"models": ["m1", ""]}, "model must be a non-empty str"),
        ({"resident": ""}, "resident must be a non-empty str"),
        ({"slots": 0}, "slots must be an int >= 1, got 0"),
        ({"slots": True}, "slots must be an int >= 1, got True"),
        ({"slots": 1.5}, "slots must be an int >= 1, got 1.5"),
        ({"slow": 1}, "slow must be a bool, got 1"),
        ({"accepts": "yes"}, "accepts must be a callable job -> bool or None"),
        ({"now": math.nan}, "now must be a finite number of seconds"),
    ],
)
def test_join_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    f = Checked()
    arguments: dict[str, Any] = {"name": "w", "now": 0.0, **kwargs}
    name = arguments.pop("name")
    with pytest.raises(ValueError, match=match):
        f.join(name, **arguments)
    assert f.workers() == []


def test_unknown_workers_raise_everywhere() -> None:
    f = fleet("a")
    for call in (
        lambda: f.pop("b", now=0),
        lambda: f.heartbeat("b", now=0),
        lambda: f.leave("b", now=0),
        lambda: f.idle_reasons("b", now=0),
        lambda: f.worker("b"),
    ):
        with pytest.raises(UnknownWorker, match=r"worker 'b' has not joined \(or it left\)"):
            call()


def test_heartbeat_sets_the_resident_only_when_given() -> None:
    f = fleet("a")
    assert f.heartbeat("a", now=1, resident="m1").resident == "m1"
    assert f.heartbeat("a", now=2).resident == "m1"
    assert f.heartbeat("a", now=3, resident=None).resident is None
    assert f.worker("a").last_seen == 3.0
    with pytest.raises(ValueError, match="resident must be a non-empty str"):
        f.heartbeat("a", now=4, resident="")


def holding_two(jobs: int) -> tuple[Checked, float]:
    """Workers a (two slots) and b; x submits ``jobs`` jobs and a pops x0 and x1 at 0.

    Returns the fleet and x's lane ``s`` before the pops (which charged it).
    """
    f = fleet("a", "b")
    f.join("a", slots=2, now=0)
    for i in range(jobs):
        f.submit(f"x{i}", member="x", now=0)
    s0 = lane_s(f, "x")
    assert popped(f, "a", 0) == "x0"
    assert popped(f, "a", 0) == "x1"
    assert lane_s(f, "x") > s0
    return f, s0


def test_leave_requeues_held_jobs_at_their_lane_heads_and_refunds_them() -> None:
    f, s0 = holding_two(jobs=4)
    jobs = f.leave("a", now=1)
    assert [job.id for job in jobs] == ["x0", "x1"]
    assert lane_s(f, "x") == s0  # refunded exactly
    assert f.state("x0") == "queued"
    assert [a.job_id for a in f.forecast(now=1)][:2] == ["x0", "x1"]
    assert f.capacity == 1
    with pytest.raises(UnknownWorker):
        f.pop("a", now=1)
    assert popped(f, "b", 1) == "x0"
    f._check()


def test_requeue_gives_one_held_job_back_and_the_worker_keeps_the_others() -> None:
    f, s0 = holding_two(jobs=3)
    job = f.requeue("x0", now=1)
    assert job.id == "x0"
    assert f.state("x0") == "queued"
    assert list(f.worker("a").held) == ["x1"]
    assert next(a.job_id for a in f.forecast(now=1)) == "x0"  # at the head of its lane
    assert popped(f, "b", 1) == "x0"
    f.complete("x1", now=2, runtime=2, worker="a")
    f.complete("x0", now=2, runtime=1, worker="b")
    assert lane_s(f, "x") > s0
    with pytest.raises(InvalidState, match="queued, not held"):
        f.requeue("x2", now=2)
    f._check()


# ============================================================================ pop and eligibility


def test_one_member_cannot_take_every_idle_worker() -> None:
    # The scenario: 200 jobs of x and 1 of y on 4 idle workers; y within two pops.
    f = fleet("a", "b", "c", "d")
    for i in range(200):
        f.submit(f"x{i}", member="x", now=0)
    f.submit("y0", member="y", now=0)
    assert [popped(f, w, 1) for w in "abcd"][:2] == ["x0", "y0"]


def test_a_grant_charges_expected_over_capacity_and_completion_corrects() -> None:
    f = fleet("a", "b", "c", "d")
    f.submit("x0", member="x", estimate=40, now=0)
    f.submit("x1", member="x", now=0)
    f.submit("y0", member="y", now=0)  # x is not alone at its level: no re-anchoring
    assert lane_s(f, "x") == 0.0
    assert popped(f, "a", 0) == "x0"
    assert lane_s(f, "x") == 40 / 4  # charged up front, divided by the 4 live workers
    f.join("e", now=1)  # a later join does not change what the correction does
    done = f.complete("x0", now=20, runtime=16)
    assert done.charge == 16.0
    assert lane_s(f, "x") == 16 / 4  # settled: the final charge over the grant's capacity


def test_the_clamp_acts_on_the_settled_part_only() -> None:
    f = fleet("a", charge="estimate")
    f.submit("x0", member="x", estimate=500, now=0)
    f.submit("x1", member="x", now=0)
    f.submit("y0", member="y", now=0)
    popped(f, "a", 0)
    assert lane_s(f, "x") == 500.0  # s may pass now while the job is held
    f.complete("x0", now=10)
    assert lane_s(f, "x") == 10.0  # settled part clamped at now


def test_a_lane_offers_its_oldest_job_the_worker_serves() -> None:
    f = Checked()
    f.join("m2-only", models=["m2"], now=0)
    f.submit("x1", member="x", model="m1", now=0)
    f.submit("x2", member="x", model="m2", now=1)
    f.submit("x3", member="x", now=2)  # no model: runs anywhere
    assert popped(f, "m2-only", 3) == "x2"
    f.complete("x2", now=4)
    assert popped(f, "m2-only", 4) == "x3"
    f.complete("x3", now=5)
    assert f.pop("m2-only", now=5) is None
    assert f.idle_reasons("m2-only", now=5) == {"model": 1}


def test_accepts_filters_jobs_and_is_reported() -> None:
    f = Checked()
    f.join("picky", accepts=lambda job: job.estimate is not None and job.estimate < 10, now=0)
    f.submit("big", member="x", estimate=100, now=0)
    f.submit("small", member="x", estimate=5, now=0)
    f.submit("unknown", member="y", now=0)
    assert popped(f, "picky", 1) == "small"
    f.join(
        "picky", slots=2, accepts=lambda job: job.estimate is not None and job.estimate < 10, now=1
    )
    assert f.pop("picky", now=1) is None
    assert f.idle_reasons("picky", now=1) == {"accepts": 2}
    f.join("picky", slots=1, accepts=lambda job: True, now=2)
    assert f.idle_reasons("picky", now=2) == {"slots_full": 2}


def test_an_accepts_filter_that_raises_propagates_and_changes_nothing() -> None:
    def refuse(job: Job) -> bool:
        raise RuntimeError(f"cannot judge {job.id}")

    def build() -> Checked:
        f = Checked(max_running_per_member=2, warm_hold=5)
        f.join("picky", models=["m1"], accepts=refuse, now=0)
        f.join("warm", resident="m1", now=0)
        f.submit("a", member="x", model="m1", now=0)
        f.submit("b", member="y", now=0)
        return f

    f, reference = build(), build()
    with pytest.raises(RuntimeError, match="cannot judge"):
        f.pop("picky", now=1)
    with pytest.raises(RuntimeError, match="cannot judge"):
        f.idle_reasons("picky", now=1)
    reference.heartbeat("picky", now=1)  # a pop marks the worker seen, and only that
    assert f.snapshot(now=1) == reference.snapshot(now=1)
    f._check()
    f.join("picky", models=["m1"], now=2)
    assert popped(f, "picky", 2) == "b"  # "a" is held for the warm worker until 5
    assert popped(f, "warm", 2) == "a"


def test_the_member_cap_skips_a_member_and_keeps_its_place() -> None:
    f = fleet("a", "b", "c", max_running_per_member=1)
    for i in range(3):
        f.submit(f"x{i}", member="x", now=0)
    f.submit("y0", member="y", priority="batch", now=0)
    assert popped(f, "a", 1) == "x0"
    assert popped(f, "b", 1) == "y0"  # x is at its cap; y's batch job goes
    assert f.pop("c", now=1) is None
    assert f.idle_reasons("c", now=1) == {"member_cap": 2}
    f.complete("x0", now=2)
    assert popped(f, "c", 2) == "x1"
    assert f.stats(now=2).members["x"].running == 1


def test_slots_let_a_worker_prefetch_and_each_lease_starts_at_its_pop() -> None:
    f = fleet(lease_for=lambda job: 100.0)
    f.join("a", slots=2, now=0)
    for i in range(3):
        f.submit(f"j{i}", member=f"m{i}", now=0)
    first = f.pop("a", now=1)
    second = f.pop("a", now=2)
    assert first is not None
    assert second is not None
    assert (first.lease and first.lease.deadline, second.lease and second.lease.deadline) == (
        101.0,
        102.0,
    )
    assert f.pop("a", now=3) is None
    assert f.worker("a").held == (first.job.id, second.job.id)
    assert f.next_deadline() == 101.0
    assert [g.job.id for g in f.held] == [first.job.id, second.job.id]


def test_affinity_is_the_popping_workers_resident_model() -> None:
    f = Checked()
    f.join("warm-m2", resident="m2", now=0)
    f.join("warm-m1", resident="m1", now=0)
    f.submit("a1", member="a", model="m1", now=0)
    f.submit("b2", member="b", model="m2", now=1)
    assert popped(f, "warm-m2", 2) == "b2"
    assert popped(f, "warm-m1", 2) == "a1"


def test_warm_hold_leaves_a_job_for_a_warm_worker_for_a_while() -> None:
    f = Checked(warm_hold=30)
    f.join("warm", resident="m1", now=0)
    f.join("cold", now=0)
    f.submit("j", member="a", model="m1", now=0)
    assert f.pop("cold", now=10) is None
    assert f.idle_reasons("cold", now=10) == {"warm_hold": 1}
    assert popped(f, "cold", 30) == "j"  # the hold is over
    g = Checked(warm_hold=30)
    g.join("warm", resident="m1", now=0)
    g.join("cold", now=0)
    g.submit("j", member="a", model="m1", now=0)
    assert popped(g, "warm", 1) == "j"
    h = Checked(warm_hold=0)
    h.join("warm", resident="m1", now=0)
    h.join("cold", now=0)
    h.submit("j", member="a", model="m1", now=0)
    assert popped(h, "cold", 1) == "j"  # off: the cold worker takes it at once


def test_a_one_argument_lease_for_still_works_and_two_arguments_get_the_worker() -> None:
    seen: list[WorkerInfo] = []

    def two(job: Job, worker: WorkerInfo) -> float:
        seen.append(worker)
        return 50.0 if worker.slow else 10.0

    f = fleet(lease_for=two)
    f.join("slow", slow=True, now=0)
    f.submit("j", member="m", now=0)
    grant = f.pop("slow", now=0)
    assert grant is not None
    assert grant.lease is not None
    assert grant.lease.seconds == 50.0
    assert seen[0].name == "slow"
    g = fleet("w", lease_for=lambda job: 7.0)
    g.submit("j", member="m", now=0)
    grant = g.pop("w", now=0)
    assert grant is not None
    assert grant.lease is not None
    assert grant.lease.seconds == 7.0


def test_a_slow_worker_gets_three_times_the_calculated_lease() -> None:
    calculator = LeaseCalculator()
    request: dict[str, Any] = {"width": 1024, "height": 1024, "steps": 30}
    fast, slow = leases(fleet, calculator, request)
    assert slow == calculator.seconds(**request, extra_slow_worker=True)
    assert slow == pytest.approx(3 * fast, abs=3)


# ============================================================================ completion


def test_a_late_complete_from_a_worker_that_lost_the_job_raises_and_changes_nothing() -> None:
    f = fleet("a", "b", lease_for=lambda job: 10.0)
    f.submit("j", member="m", now=0)
    assert popped(f, "a", 0) == "j"
    (expired,) = f.expire(10)
    assert (expired.worker, expired.cause, expired.requeued) == ("a", "lease", True)
    with pytest.raises(InvalidState, match=r"job 'j' is queued, not by worker 'a'"):
        f.complete("j", now=11, worker="a")
    assert popped(f, "b", 11) == "j"
    before = f.stats(now=11)
    with pytest.raises(InvalidState, match=r"held by worker 'b', not by worker 'a'"):
        f.complete("j", now=12, worker="a")
    with pytest.raises(InvalidState, match=r"held by worker 'b', not by worker 'a'"):
        f.cancel("j", now=12, worker="a")
    assert f.stats(now=11) == before
    assert f.complete("j", now=12, worker="b").job.id == "j"
    with pytest.raises(UnknownJob):
        f.complete("j", now=13, worker="b")


def test_complete_errors() -> None:
    f = fleet("a", lease_for=lambda job: 10.0)
    f.submit("j", member="m", now=0)
    f.submit("k", member="m", now=0)
    with pytest.raises(InvalidState, match="job 'j' is queued, not running"):
        f.complete("j", now=0)
    popped(f, "a", 0)
    with pytest.raises(ValueError, match="charge must be >= 0 seconds"):
        f.complete("j", now=1, charge=-1)
    with pytest.raises(ValueError, match="runtime must be >= 0 seconds"):
        f.complete("j", now=1, runtime=-1)
    with pytest.raises(ValueError, match="worker must be a non-empty str"):
        f.complete("j", now=1, worker="")
    with pytest.raises(LeaseExpired):
        f.complete("j", now=10)
    assert f.state("j") == "running"


# ============================================================================ vanishing workers


def test_a_silent_worker_times_out_and_its_jobs_come_back() -> None:
    f = fleet("a", "b", worker_timeout=30)
    f.submit("j", member="m", now=0)
    f.submit("k", member="n", now=0)
    assert popped(f, "a", 0) == "j"
    f.heartbeat("b", now=20)
    assert f.next_deadline() == 30.0
    assert f.expire(29) == []
    (expired,) = f.expire(30)
    assert (expired.job.id, expired.worker, expired.cause, expired.requeued) == (
        "j",
        "a",
        "worker_timeout",
        True,
    )
    assert expired.deadline == 30.0
    assert f.worker("a").timed_out
    assert f.capacity == 1
    assert f.next_deadline() == 50.0  # b's timeout
    assert popped(f, "a", 31) == "j"  # a pop revives it; j kept its place at its lane's head
    assert not f.worker("a").timed_out
    assert f.capacity == 2


def test_after_max_attempts_a_job_is_reported_failed_never_dropped() -> None:
    f = fleet("a", lease_for=lambda job: 5.0, max_attempts=2)
    f.submit("j", member="m", now=0)
    popped(f, "a", 0)
    assert [e.requeued for e in f.expire(5)] == [True]
    grant = f.pop("a", now=5)
    assert grant is not None
    assert grant.attempt == 2
    (last,) = f.expire(10)
    assert (last.requeued, last.attempt) == (False, 2)
    assert "j" not in f
    assert f.stats(now=10).failed == 1


def test_leave_requeues_even_after_the_last_attempt() -> None:
    f = fleet("a", max_attempts=1)
    f.submit("j", member="m", now=0)
    popped(f, "a", 0)
    assert [job.id for job in f.leave("a", now=1)] == ["j"]
    assert f.state("j") == "queued"


# ============================================================================ diagnostics


def test_explain_limits_bound_its_work() -> None:
    f = fleet("a")
    f.submit("victim", member="v", priority="batch", now=0)
    for i in range(50):
        f.submit(f"x{i}", member=f"m{i}", now=1)
    for i in range(20):
        job = popped(f, "a", 2 + i)
        f.complete(job, now=2 + i)
    full = f.explain("victim", now=30)
    assert len(full.overtaken_by) == 20
    assert full.ahead_complete
    assert full.position == 31
    short = f.explain("victim", now=30, ahead_limit=5, overtakes_limit=3)
    assert not short.ahead_complete
    assert short.position == 6
    assert len(short.ahead) == 5
    assert short.estimated_start is None
    assert [o.job_id for o in short.overtaken_by] == [o.job_id for o in full.overtaken_by][-3:]
    none = f.explain("victim", now=30, ahead_limit=0, overtakes_limit=0)
    assert none.ahead == ()
    assert none.overtaken_by == ()
    with pytest.raises(ValueError, match="ahead_limit must be an int >= 0 or None"):
        f.explain("victim", now=30, ahead_limit=-1)


def test_the_history_is_bounded_in_bytes() -> None:
    f = fleet("a", history=1000, history_bytes=5000)
    for i in range(100):
        f.submit(f"job-{i}", member="m", now=i)
        popped(f, "a", i)
        f.complete(f"job-{i}", now=i)
    assert 0 < len(f._core.history.records) <= 5000 // 200
    assert f._core.history.size <= 5000
    assert "payload" not in type(f._core.history.records[0])._fields


def test_stats_list_the_workers_and_what_they_hold() -> None:
    f = fleet("a", "b")
    f.submit("j", member="m", now=0)
    popped(f, "b", 1)
    stats = f.stats(now=2)
    assert [w.name for w in stats.workers] == ["a", "b"]
    assert [job.id for job in stats.held] == ["j"]
    assert stats.running is not None
    assert stats.running.id == "j"
    assert f.holder("j") == "b"


# ============================================================================ snapshot


def test_snapshot_and_restore_keep_workers_held_jobs_and_charges() -> None:
    f = fleet("a", "b", lease_for=lambda job: 100.0)
    f.join("a", models=["m1"], resident="m1", slots=2, now=0)
    f.submit("x", member="x", model="m1", now=0)
    f.submit("y", member="y", now=0)
    f.submit("z", member="x", now=0)
    popped(f, "a", 1)
    s_before = lane_s(f, "x")
    state = json.loads(json.dumps(f.snapshot(now=2)))
    restored = FleetDispatcher.restore(state, now=12, lease_for=lambda job: 100.0)
    restored._check()
    assert restored.holder("x") == "a"
    assert lane_s(restored, "x") == s_before + 10
    assert restored.next_deadline() == 111.0
    assert restored.worker("a").models == frozenset({"m1"})
    assert len(restored) == 2


def test_restore_refuses_a_job_held_by_an_unknown_worker() -> None:
    f = fleet("a")
    f.submit("x", member="x", now=0)
    popped(f, "a", 0)
    state = f.snapshot(now=1)
    state["held"][0]["worker"] = "ghost"
    with pytest.raises(ValueError, match="held by unknown worker 'ghost'"):
        FleetDispatcher.restore(state)
    with pytest.raises(ValueError, match=r"format is 'prioqueue\.dispatcher/1'"):
        FleetDispatcher.restore({**state, "format": "prioqueue.dispatcher/1"})


def test_restore_refuses_a_held_job_that_names_no_worker() -> None:
    f = fleet("a")
    f.join("b", models=["m1"], now=0)
    f.submit("x", member="x", now=0)
    popped(f, "b", 0)
    state = f.snapshot(now=1)
    del state["held"][0]["worker"]  # it would have gone to the first worker, "a"
    with pytest.raises(ValueError, match="held job 'x' names no worker"):
        FleetDispatcher.restore(state)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("models", "ab", "models must be a list of names or None, got 'ab'"),
        ("models", 5, "models must be a list of names or None, got 5"),
        ("slow", "no", "slow must be a bool, got 'no'"),
        ("timed_out", 1, "timed_out must be a bool, got 1"),
    ],
)
def test_restore_refuses_a_worker_field_of_the_wrong_type(
    field: str, value: object, match: str
) -> None:
    state = fleet("a").snapshot(now=1)
    state["workers"][0][field] = value
    with pytest.raises(ValueError, match=match):
        FleetDispatcher.restore(state)
    with pytest.raises(ValueError, match="fair_share must be a bool, got 'no'"):
        FleetDispatcher.restore({**fleet("a").snapshot(now=1), "fair_share": "no"})


def test_restore_names_a_missing_key_or_a_field_of_the_wrong_type() -> None:
    f = fleet("a")
    f.submit("x", member="x", now=0)
    state = f.snapshot(now=1)
    del state["workers"][0]["name"]
    with pytest.raises(ValueError, match="invalid snapshot: missing key 'name'"):
        FleetDispatcher.restore(state)
    with pytest.raises(ValueError, match="invalid snapshot: a field has the wrong type"):
        FleetDispatcher.restore({**f.snapshot(now=1), "queued": 5})


def test_a_restored_fleet_replays_exactly() -> None:
    # Determinism across a restart (for a journal replay): last words, timed-out workers and
    # the recent runtimes behind the expected charge all survive the snapshot.
    def script(f: FleetDispatcher, start: float) -> list[Any]:
        out: list[Any] = []
        out.append(f.expire(start + 60))
        grant = f.pop("w2", now=start + 61)
        out.append(grant)
        out.append(f.snapshot(now=start + 61))  # the up-front charges of the held jobs
        out.append(f.next_deadline())
        out.append(f.workers())
        return out

    live = fleet("w0", "w1", "w2", worker_timeout=45, warm_hold=30)
    live.submit("j0", member="a", model="m1", now=0)
    live.submit("j1", member="b", model="m1", now=0)
    live.submit("j2", member="a", model="m2", now=0)
    assert popped(live, "w0", 0) == "j0"
    live.complete("j0", now=20)  # a recent runtime of 20 s for m1
    live.heartbeat("w1", now=30)
    live.heartbeat("w2", now=30)
    state = json.loads(json.dumps(live.snapshot(now=30)))
    restored = FleetDispatcher.restore(state, worker_timeout=45, warm_hold=30)
    assert script(restored, 0) == script(live, 0)
    assert restored.snapshot(now=100) == live.snapshot(now=100)


def test_a_restored_fleet_keeps_the_warm_hold_of_a_busy_worker() -> None:
    # The expected end of a held job survives the snapshot (shifted with the clock): the
    # restored fleet keeps the job for the busy warm worker exactly as the original does.
    live = fleet("cold", "warm", warm_hold=30)
    live.heartbeat("cold", resident="flux", now=0)
    live.heartbeat("warm", resident="sdxl", now=0)
    live.submit("first", member="a", model="sdxl", estimate=40.0, now=0)
    assert popped(live, "warm", 0) == "first"
    live.submit("second", member="b", model="sdxl", now=0)
    state = json.loads(json.dumps(live.snapshot(now=5)))
    assert state["held"][0]["expected_end"] == 40.0
    same = FleetDispatcher.restore(state, warm_hold=30)
    later = FleetDispatcher.restore(state, now=105, warm_hold=30)  # 100 s later
    assert same.next_hold_end() == live.next_hold_end() == 70.0
    assert later.next_hold_end() == 170.0
    assert live.pop("cold", now=10) is None
    assert same.pop("cold", now=10) is None
    assert later.pop("cold", now=110) is None
    assert later.idle_reasons("cold", now=110) == {"warm_hold": 1}
    # A snapshot without the field (an older one) estimates it from the recent runtimes.
    del state["held"][0]["expected_end"]
    older = FleetDispatcher.restore(state, warm_hold=30)
    assert older.next_hold_end() == 40.0 + 30  # the estimate is known: 40 s
