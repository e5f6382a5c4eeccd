"""End to end: random calls through DurableDispatcher on a SQLite file, with restarts.

A reference dispatcher gets the same calls at the same times, directly. At random points the
durable one "crashes" (its store is closed without a final snapshot) and is recovered from the
file; its state must equal the reference's, and every result after must too. This covers the
JSON round trip, the skipped no-op calls, snapshots with pruning and replay together.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manual_time import ManualClock
from prioqueue import SizeOneDispatcher
from prioqueue.records import Job
from prioqueue.store import DurableDispatcher, Snapshot, SQLiteStore, dispatcher_factory
from strategies import dispatcher_job_specs, dispatcher_models, dispatcher_runtimes, time_steps

from .replay import fleet_tail_calls, join_calls, outcome_of

JOB_IDS = [f"j{i}" for i in range(6)]


def lease_50(job: Job) -> float:
    return 50.0


specs = dispatcher_job_specs().filter(lambda s: not isinstance(s["priority"], bytes))
calls = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(JOB_IDS), specs),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("complete"), st.booleans(), st.sampled_from(JOB_IDS), dispatcher_runtimes()),
    st.tuples(st.just("cancel"), st.sampled_from(JOB_IDS)),
    st.tuples(st.just("expire")),
    st.tuples(st.just("set_resident_model"), dispatcher_models()),
    st.tuples(st.just("restart")),
)


def kwargs_of(call: tuple[Any, ...], running: str | None) -> tuple[str, dict[str, Any]]:
    op = call[0]
    if op == "submit":
        return op, {"job_id": call[1], **call[2]}
    if op == "complete":
        job_id = running if call[1] and running is not None else call[2]
        return op, {"job_id": job_id, "runtime": call[3]}
    if op == "cancel":
        return op, {"job_id": call[1]}
    if op == "set_resident_model":
        return op, {"model": call[1]}
    return op, {}


async def aoutcome(coro: Any) -> tuple[Any, ...]:
    try:
        return ("ok", await coro)
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


def recovery_examples(
    calls: st.SearchStrategy[Any],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Run a recovery property on 40 examples: ``steps`` (up to 40 ``(time step, call)``,
    restarts among the calls), ``snapshot_every`` (1 to 6) and ``fair_share`` (both)."""

    def wrap(test: Callable[..., None]) -> Callable[..., None]:
        return settings(max_examples=40)(
            given(
                steps=st.lists(st.tuples(time_steps(), calls), min_size=1, max_size=40),
                snapshot_every=st.integers(min_value=1, max_value=6),
                fair_share=st.booleans(),
            )(test)
        )

    return wrap


Expect = Callable[[tuple[Any, ...], float], tuple[str, dict[str, Any], tuple[Any, ...]]]


def check_with_restarts(
    reference: Any,
    factory: Any,
    steps: list[tuple[float, tuple[Any, ...]]],
    snapshot_every: int,
    expect: Expect,
    same_running: bool = False,
) -> None:
    """Drive ``steps`` through a durable dispatcher (restarting it at each ``restart``) and
    through ``reference`` directly: after each restart the states are equal, and so is every
    result. ``expect(call, now)`` applies a call to the reference: ``(op, kwargs, outcome)``.
    """
    clock = ManualClock()
    written: list[Snapshot] = []

    def spied(store: SQLiteStore) -> SQLiteStore:
        append = store.append

        def spy(events: Any, *, epoch: int, snapshot: Snapshot | None = None) -> None:
            append(events, epoch=epoch, snapshot=snapshot)
            if snapshot is not None:
                written.append(snapshot)

        store.append = spy  # type: ignore[method-assign]
        return store

    def check_written() -> None:
        # Each snapshot comes from the writer's replica (issue 30): it is the state the
        # reference had after the same calls, at the snapshot's time.
        for snap in written:
            expected = json.loads(json.dumps(reference.snapshot(now=snap.taken_at)))
            assert json.loads(json.dumps(snap.state)) == expected
        written.clear()

    async def main(path: Path) -> None:
        store = spied(SQLiteStore(path, synchronous="normal"))
        durable = await DurableDispatcher.open(
            store, factory, clock=clock, snapshot_every=snapshot_every
        )
        for step, call in steps:
            clock.t += step
            if call[0] == "restart":
                await durable.aclose(snapshot=False)
                store.close()
                store = spied(SQLiteStore(path, synchronous="normal"))
                durable = await DurableDispatcher.open(
                    store, factory, clock=clock, snapshot_every=snapshot_every
                )
                assert durable.dispatcher.snapshot(now=clock.t) == reference.snapshot(now=clock.t)
                if same_running:
                    assert durable.dispatcher.running == reference.running
                continue
            op, kwargs, expected = expect(call, clock.t)
            got = await aoutcome(durable.call(op, **kwargs))
            assert got == expected, (op, kwargs)
            check_written()
        await durable.aclose(snapshot=False)
        store.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp) / "s.db"))


@recovery_examples(calls)
def test_recovered_state_equals_the_uninterrupted_one(
    steps: list[tuple[float, tuple[Any, ...]]], snapshot_every: int, fair_share: bool
) -> None:
    factory = dispatcher_factory(
        SizeOneDispatcher, lease_for=lease_50, max_queued=4, fair_share=fair_share
    )
    reference = SizeOneDispatcher(lease_for=lease_50, max_queued=4, fair_share=fair_share)

    def expect(call: tuple[Any, ...], now: float) -> tuple[str, dict[str, Any], tuple[Any, ...]]:
        running = reference.running
        op, kwargs = kwargs_of(call, None if running is None else running.job.id)
        if op == "set_resident_model":
            return op, kwargs, outcome_of(partial(reference.set_resident_model, **kwargs))
        return op, kwargs, outcome_of(partial(getattr(reference, op), now=now, **kwargs))

    check_with_restarts(reference, factory, steps, snapshot_every, expect, same_running=True)


WORKERS = ["w0", "w1"]

fleet_calls = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(JOB_IDS), specs),
    join_calls(WORKERS),
    st.tuples(st.just("pop"), st.sampled_from(WORKERS)),
    *fleet_tail_calls(JOB_IDS, WORKERS),
    st.tuples(st.just("restart")),
)


def fleet_kwargs(call: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
    op = call[0]
    if op == "submit":
        return op, {"job_id": call[1], **call[2]}
    if op == "join":
        _, name, models, resident, slots = call
        return op, {"name": name, "models": models, "resident": resident, "slots": slots}
    if op in ("pop", "heartbeat", "leave"):
        return op, {"name": call[1]}
    if op == "complete":
        return op, {"job_id": call[1], "runtime": call[2]}
    if op == "cancel":
        return op, {"job_id": call[1]}
    return op, {}


@recovery_examples(fleet_calls)
def test_a_recovered_fleet_equals_the_uninterrupted_one(
    steps: list[tuple[float, tuple[Any, ...]]], snapshot_every: int, fair_share: bool
) -> None:
    fleet = pytest.importorskip(
        "prioqueue.fleet", reason="FleetDispatcher is not in this tree yet (issue 9)"
    ).FleetDispatcher
    options: dict[str, Any] = {
        "lease_for": lease_50,
        "worker_timeout": 45.0,
        "fair_share": fair_share,
    }
    factory = dispatcher_factory(fleet, **options)
    reference = fleet(**options)

    def expect(call: tuple[Any, ...], now: float) -> tuple[str, dict[str, Any], tuple[Any, ...]]:
        op, kwargs = fleet_kwargs(call)
        if op == "expire":
            return op, kwargs, outcome_of(partial(reference.expire, now))
        return op, kwargs, outcome_of(partial(getattr(reference, op), now=now, **kwargs))

    check_with_restarts(reference, factory, steps, snapshot_every, expect)
