"""Determinism as a guarantee: snapshot mid-way, restore with times kept, replay the rest.

Two dispatchers get the same random calls. One is snapshotted after a random prefix, the
snapshot goes through JSON (as the store keeps it) and is restored with its times kept
(``restore(state)`` without ``now``); the restored one and the uninterrupted one must then have
equal snapshots and give equal results (values and errors) for every later call. This is the
property the journal relies on: recovery = snapshot + replay of the tail.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import strategies as st

from prioqueue import FleetDispatcher, SizeOneDispatcher
from prioqueue.records import Job
from strategies import (
    dispatcher_job_specs,
    dispatcher_models,
    dispatcher_runtimes,
    dispatcher_scorers,
)

from .replay import (
    check_restore_then_replay,
    fleet_call,
    fleet_tail_calls,
    join_calls,
    replay_examples,
)

JOB_IDS = [f"j{i}" for i in range(8)]


def _lease_100(job: Job) -> float:
    return 100.0


def _lease_by_estimate(job: Job) -> float:
    return 2.0 * (job.estimate or 30.0)


calls = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(JOB_IDS), dispatcher_job_specs()),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("complete"), st.booleans(), st.sampled_from(JOB_IDS), dispatcher_runtimes()),
    st.tuples(st.just("cancel"), st.sampled_from(JOB_IDS)),
    st.tuples(st.just("expire")),
    st.tuples(st.just("set_resident_model"), dispatcher_models()),
)

options = st.fixed_dictionaries(
    {
        "scorer": dispatcher_scorers(),
        "lease_for": st.sampled_from([None, _lease_100, _lease_by_estimate]),
        "max_queued": st.sampled_from([None, None, 4]),
        "max_queued_per_member": st.sampled_from([None, None, 2]),
        "max_attempts": st.integers(min_value=1, max_value=3),
        "fair_share": st.booleans(),
        "charge": st.sampled_from(["runtime", "estimate", 2.0]),
    }
)


def apply(d: SizeOneDispatcher, now: float, call: tuple[Any, ...]) -> Any:
    """Make one call and return its result (an error is compared by type and message).

    QueueFull.retry_after comes from the recent completions, which snapshots do not keep
    (documented): comparing the error's type and message compares what it says about the state.
    """
    op = call[0]
    if op == "submit":
        return d.submit(call[1], now=now, **call[2])
    if op == "dispatch":
        return d.dispatch(now)
    if op == "complete":
        running = d.running
        job_id = running.job.id if call[1] and running is not None else call[2]
        return d.complete(job_id, now=now, runtime=call[3])
    if op == "cancel":
        return d.cancel(call[1], now=now)
    if op == "expire":
        return d.expire(now)
    d.set_resident_model(call[1])
    return d.resident_model


@replay_examples(options, calls, max_steps=60)
def test_snapshot_restore_then_replay_is_exact(
    opts: dict[str, Any], steps: list[tuple[float, tuple[Any, ...]]], cut: int
) -> None:
    restored, a = check_restore_then_replay(SizeOneDispatcher, opts, apply, steps, cut, check=True)
    assert len(restored) == len(a)
    assert restored.running == a.running
    assert restored.next_deadline() == a.next_deadline()


def test_restore_with_now_shifts_times_but_without_keeps_them() -> None:
    d = SizeOneDispatcher()
    d.submit("a", member="ann", now=10.0)
    state = json.loads(json.dumps(d.snapshot(now=20.0)))
    kept = SizeOneDispatcher.restore(state)
    shifted = SizeOneDispatcher.restore(state, now=120.0)
    assert kept.job("a").arrival == 10.0
    assert shifted.job("a").arrival == 110.0


# ---------------------------------------------------------------------- FleetDispatcher

WORKERS = ["w0", "w1", "w2"]

fleet_calls = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(JOB_IDS), dispatcher_job_specs()),
    join_calls(WORKERS, st.booleans()),
    st.tuples(st.just("pop"), st.sampled_from(WORKERS)),
    st.tuples(st.just("pop"), st.sampled_from(WORKERS)),
    *fleet_tail_calls(JOB_IDS, WORKERS),
)

fleet_options = st.fixed_dictionaries(
    {
        "lease_for": st.sampled_from([None, _lease_100]),
        "worker_timeout": st.sampled_from([None, 45.0]),
        "warm_hold": st.sampled_from([0.0, 5.0]),
        "max_running_per_member": st.sampled_from([None, 1]),
        "fair_share": st.booleans(),
    }
)


def fleet_apply(d: Any, now: float, call: tuple[Any, ...]) -> Any:
    op = call[0]
    if op == "submit":
        return d.submit(call[1], now=now, **call[2])
    if op == "join":
        _, name, models, resident, slots, slow = call
        return d.join(name, models=models, resident=resident, slots=slots, slow=slow, now=now)
    return fleet_call(d, now, call)


@replay_examples(fleet_options, fleet_calls, max_steps=50)
def test_fleet_snapshot_restore_then_replay_is_exact(
    opts: dict[str, Any], steps: list[tuple[float, tuple[Any, ...]]], cut: int
) -> None:
    check_restore_then_replay(FleetDispatcher, opts, fleet_apply, steps, cut)


@pytest.mark.parametrize("fair_share", [True, False])
def test_restore_keeps_the_lane_order_of_a_running_job(fair_share: bool) -> None:
    # Without fair share, restore() made a running job's lane after every queued one, so the
    # lane order (and snapshot()["queued"]) changed once that job was requeued.
    options: dict[str, Any] = {"lease_for": _lease_100, "fair_share": fair_share}
    d = SizeOneDispatcher(**options)
    d.submit("j0", member="ann", now=1000.0)
    d.submit("j1", member="bob", now=1000.0)
    d.submit("j2", member="cat", now=1000.0)
    d.dispatch(1000.0)
    snapshot = json.loads(json.dumps(d.snapshot(now=1000.0)))
    restored = SizeOneDispatcher.restore(snapshot, **options)
    d.expire(1200.0)
    restored.expire(1200.0)
    assert restored.snapshot(now=1200.0) == d.snapshot(now=1200.0)
    assert [job["id"] for job in d.snapshot(now=1200.0)["queued"]] == ["j0", "j1", "j2"]
    grants = [(g.job.id if (g := x.dispatch(1200.0)) else None) for x in (d, restored)]
    assert grants[0] == grants[1]


def test_restore_keeps_the_lane_order_of_running_jobs_in_a_fleet() -> None:
    # The same with several held jobs between queued ones (each job its own lane).
    options: dict[str, Any] = {"lease_for": lambda job, worker: 100.0, "fair_share": False}
    d = FleetDispatcher(**options)
    for name in ("a", "b"):
        d.join(name, now=0.0)
    for i in range(5):
        d.submit(f"j{i}", member=f"m{i}", now=float(i))
    d.pop("a", now=5.0)
    d.pop("b", now=5.0)
    snapshot = json.loads(json.dumps(d.snapshot(now=5.0)))
    restored = FleetDispatcher.restore(snapshot, **options)
    for x in (d, restored):
        x.expire(200.0)
    assert restored.snapshot(now=200.0) == d.snapshot(now=200.0)


def test_restore_keeps_the_lane_order_of_a_released_job() -> None:
    # Without fair share a delayed job's lane is made at its release, after the lanes of jobs
    # submitted later but eligible at once: restore() made the lanes in seq order instead.
    d = FleetDispatcher(fair_share=False)
    d.submit("j0", member="ann", now=0.0, not_before=10.0)
    d.submit("j1", member="ann", now=0.0)
    d.expire(30.0)
    snapshot = json.loads(json.dumps(d.snapshot(now=30.0)))
    assert [job["id"] for job in snapshot["queued"]] == ["j1", "j0"]
    assert FleetDispatcher.restore(snapshot).snapshot(now=30.0) == d.snapshot(now=30.0)


def test_restore_keeps_each_workers_held_jobs_in_grant_order() -> None:
    # Without fair share restore() gave a worker its held jobs in seq order, not grant order.
    d = FleetDispatcher(fair_share=False)
    d.join("w", slots=2, now=0.0)
    d.submit("j0", member="ann", now=0.0)
    d.submit("j1", member="ann", tier="pro", now=0.0)
    grants = [d.pop("w", now=0.0), d.pop("w", now=0.0)]
    assert [g.job.id for g in grants if g is not None] == ["j1", "j0"]  # the pro tier first
    restored = FleetDispatcher.restore(json.loads(json.dumps(d.snapshot(now=0.0))))
    assert restored.worker("w").held == d.worker("w").held == ("j1", "j0")
    assert restored.snapshot(now=0.0) == d.snapshot(now=0.0)
