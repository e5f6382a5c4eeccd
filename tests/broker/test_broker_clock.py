"""The broker's clock across restarts (issue 21, Medium 7), on a real SQLite store.

A run with the wall clock ten years ahead, then a restart with the clock fixed: a 2 s lease
still runs out 2 s later. Manual clocks, no sleeps.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from prioqueue.broker import create_app, parse_config
from prioqueue.store import WallClock

from .broker_helpers import KEYS, SUBMITTER, WORKER, Clock, run

YEARS_10 = 10 * 365 * 86400.0


@contextlib.asynccontextmanager
async def served(store: str, clock: WallClock) -> AsyncIterator[httpx.AsyncClient]:
    config = parse_config({"keys": KEYS, "store": store, "default_lease_seconds": 2.0})
    app = create_app(config, clock=clock)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
            yield client


async def submit_and_pop(c: httpx.AsyncClient) -> tuple[str, dict[str, Any]]:
    """A job submitted, then granted to gpu-1: its id and the grant."""
    job = (await c.post("/v1/jobs", json={}, headers=SUBMITTER)).json()["id"]
    grant = (await c.post("/v1/workers/gpu-1/pop", json={}, headers=WORKER)).json()
    return job, grant


def test_a_lease_runs_out_after_a_restart_from_a_run_ten_years_ahead(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'b.db'}"
    wall, mono = Clock(1_000_000.0 + YEARS_10), Clock(0.0)

    async def scenario() -> Any:
        async with served(store, WallClock(source=wall, monotonic=mono, horizon=60.0)) as c:
            job, grant = await submit_and_pop(c)
            assert (grant["id"], grant["attempt"]) == (job, 1)
        wall.t = 1_000_100.0  # the clock is fixed, the broker restarts
        async with served(store, WallClock(source=wall, monotonic=mono, horizon=60.0)) as c:
            mono.advance(3.0)  # the 2 s lease ran out
            again = await c.post("/v1/workers/gpu-2/pop", json={}, headers=WORKER)
            assert again.status_code == 200, again.text  # before: nothing for ten years
            assert (again.json()["id"], again.json()["attempt"]) == (job, 2)
            status = (await c.get("/v1/status", headers=WORKER)).json()
            assert status["totals"]["expired"] == 1

    run(scenario())


def test_a_saved_forward_clock_step_does_not_stick(tmp_path: Path) -> None:
    """Issue 30: after the restart on a fixed clock, answers carry times near the wall clock.

    Before, the broker's time stayed ten years ahead for good (leases ran, but every
    deadline and submitted_at was ten years ahead). Now the broker rebases every stored time
    by the gap, keeping what is left of each duration; a third start keeps it.
    """
    store = f"sqlite:///{tmp_path / 'b.db'}"
    wall, mono = Clock(1_000_000.0 + YEARS_10), Clock(0.0)

    async def scenario() -> Any:
        async with served(store, WallClock(source=wall, monotonic=mono, horizon=60.0)) as c:
            job, grant = await submit_and_pop(c)
            assert grant["deadline"] == 1_000_002.0 + YEARS_10
            mono.advance(1.0)
            queued = (await c.post("/v1/jobs", json={}, headers=SUBMITTER)).json()["id"]
        wall.t = 1_000_100.0  # the clock is fixed, the broker restarts
        clock = WallClock(source=wall, monotonic=mono, horizon=60.0)
        async with served(store, clock) as c:
            assert clock.offset == 0.0
            view = (await c.get(f"/v1/jobs/{queued}", headers=SUBMITTER)).json()
            assert abs(view["submitted_at"] - wall.t) < 60  # before: ten years ahead
            mono.advance(0.5)  # half a second of the lease's 2 s was left at the restart
            early = await c.post("/v1/workers/gpu-2/pop", json={}, headers=WORKER)
            assert early.json()["id"] == queued  # job's lease still runs: the other job
            mono.advance(1.0)
            again = (await c.post("/v1/workers/gpu-3/pop", json={}, headers=WORKER)).json()
            assert (again["id"], again["attempt"]) == (job, 2)
            assert abs(again["deadline"] - (wall.t + 3.5)) < 1.0  # the wall clock's time
        wall.t += 10.0
        clock = WallClock(source=wall, monotonic=mono, horizon=60.0)
        async with served(store, clock) as c:  # a third start: no gap, nothing moves
            assert clock.offset == 0.0
            view = (await c.get(f"/v1/jobs/{job}", headers=SUBMITTER)).json()
            assert abs(view["submitted_at"] - 1_000_100.0) < 60

    run(scenario())


def test_a_rebase_replays_from_the_journal_without_a_second_shift(tmp_path: Path) -> None:
    """The rebase is one journaled operation: a crash after it (no snapshot) recovers it once."""
    from prioqueue.broker.engine import BrokerEngine
    from prioqueue.store import DurableDispatcher, open_store

    config = parse_config({"keys": KEYS, "default_lease_seconds": 2.0})

    def factory(state: Any) -> BrokerEngine:
        return BrokerEngine(config) if state is None else BrokerEngine.restore(state, config)

    path = tmp_path / "b.db"
    wall, mono = Clock(1_000_000.0 + YEARS_10), Clock(0.0)

    async def life(rebase: bool) -> tuple[float, float, dict[str, Any]]:
        store = open_store(f"sqlite:///{path}")
        clock = WallClock(source=wall, monotonic=mono, horizon=60.0)
        durable: DurableDispatcher[BrokerEngine] = await DurableDispatcher.open(
            store, factory, clock=clock
        )
        gap = clock.offset
        if rebase and gap:
            clock.rebase(gap)
            await durable.call("rebase_time", by=gap)
        if not durable.dispatcher.jobs:
            await durable.call("submit", member="m", tier="free", priority=0)
            await durable.call("pop", worker="gpu-1")
        record = durable.dispatcher.jobs["job-1"]
        assert record.deadline is not None
        out = (gap, record.deadline, durable.dispatcher.snapshot())
        await durable.aclose(snapshot=False)  # as a crash: the journal alone
        store.close()
        return out

    async def scenario() -> None:
        await life(rebase=False)
        wall.t = 1_000_100.0
        gap, deadline, _ = await life(rebase=True)
        assert gap > YEARS_10 - 200
        assert abs(deadline - (1_000_100.0 + 2.0)) < 1.0
        gap, again, state = await life(rebase=True)  # replays the rebase: no gap left
        assert (gap, again) == (0.0, deadline)
        _, _, replayed = await life(rebase=True)
        assert replayed == state

    run(scenario())


def test_a_rebase_is_checked() -> None:
    import pytest

    from prioqueue.broker.engine import BrokerEngine, Rejected

    engine = BrokerEngine(parse_config({}))
    engine.submit(100.0, member="m", tier="free", priority=0)
    bad: tuple[Any, ...] = (0, -1.0, float("inf"), float("nan"), True, "1")
    for by in bad:
        with pytest.raises(Rejected, match="by must be a positive number") as info:
            engine.rebase_time(50.0, by=by)
        assert info.value.status == 422
    with pytest.raises(Rejected, match="time went backwards") as info:
        engine.rebase_time(49.0, by=50.0)  # before the shifted last time (50)
    assert info.value.status == 409
    assert engine.jobs["job-1"].submitted_at == 100.0  # refused: nothing moved
    engine.rebase_time(50.0, by=50.0)
    assert (engine.now, engine.jobs["job-1"].submitted_at) == (50.0, 50.0)
    clock = WallClock(source=Clock(10.0), monotonic=Clock(0.0))
    for by in (0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="by must be a positive number"):
            clock.rebase(by)
