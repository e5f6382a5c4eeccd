"""The broker's request path under load (issue 21, High 2 and Medium 12), on real stores.

No timing here (speed is in benchmarks/bench_broker_load.py and bench_broker_reads.py): these
check the mechanisms, deterministically. A submit applies without waiting for the commit of
other callers' operations; a read never holds operations back; a job's forecast is bounded;
the status counts are not rebuilt while nothing changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import httpx

from prioqueue.broker import create_app, parse_config
from prioqueue.broker.engine import AHEAD_LIMIT, BrokerEngine
from prioqueue.broker.jobbook import JobBook
from prioqueue.store import Event, Snapshot, Store
from store.pg import POSTGRES_URL

from .broker_helpers import IMAGE, KEYS, SUBMITTER, WORKER, api, postgres_schema, run


class Gate:
    """Holds every append of a real store until opened."""

    def __init__(self, store: Store) -> None:
        self.event = threading.Event()
        self._append = store.append
        store.append = self.append  # type: ignore[method-assign]

    def append(
        self, events: Sequence[Event], *, epoch: int, snapshot: Snapshot | None = None
    ) -> None:
        self.event.wait(60)  # a test that forgets to open it fails instead of hanging
        self._append(events, epoch=epoch, snapshot=snapshot)


@contextlib.asynccontextmanager
async def served(store: str, **config: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    app = create_app(parse_config({"keys": KEYS, "store": store, **config}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
            yield client, app.state.broker


async def _until(predicate: Any, turns: int = 500, hung: float = 60.0) -> bool:
    """Whether ``predicate`` became true: ``turns`` loop turns, then short sleeps (the commit
    thread may need the GIL on a busy machine) until ``hung`` seconds of loop time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + hung
    turn = 0
    while not predicate():
        if loop.time() > deadline:
            return False
        turn += 1
        await asyncio.sleep(0 if turn < turns else 0.01)
    return True


async def _no_barrier(store: str, **config: Any) -> None:
    async with served(store, **config) as (client, broker):
        for _ in range(1200):  # PostgreSQL: the elector wins first (60 s: "hung")
            if broker.serving:
                break
            await asyncio.sleep(0.05)
        r = await client.post("/v1/jobs", json={}, headers=SUBMITTER)
        assert r.json() == {"id": "job-1"}
        engine: BrokerEngine = broker.engine
        gate = Gate(broker._backend.durable.store)
        first = asyncio.ensure_future(client.post("/v1/jobs", json={}, headers=SUBMITTER))
        assert await _until(lambda: engine.jobs.counter == 2)  # applied; its commit is held
        reader = asyncio.ensure_future(client.get("/v1/status", headers=WORKER))
        second = asyncio.ensure_future(
            client.post("/v1/jobs", json={"image": IMAGE}, headers=SUBMITTER)
        )
        # Before issue 21 the submit first awaited a read barrier: everything applied had to
        # be committed (and a waiting reader held every new operation back).
        assert await _until(lambda: engine.jobs.counter == 3)
        assert not first.done()
        assert not second.done()
        assert not reader.done()
        gate.event.set()
        assert (await first).status_code == 201
        assert (await second).json() == {"id": "job-3"}
        status = (await reader).json()
        assert status["jobs"]["queued"] >= 2  # what was applied when it read, now committed


def test_a_submit_does_not_wait_for_other_callers_commits_sqlite(tmp_path: Path) -> None:
    run(_no_barrier(f"sqlite:///{tmp_path / 'b.db'}"))


def test_a_submit_does_not_wait_for_other_callers_commits_postgresql() -> None:
    with postgres_schema() as schema:
        run(_no_barrier(POSTGRES_URL, store_schema=schema))


def test_a_submit_with_bad_lease_inputs_is_still_refused_without_a_read() -> None:
    async def scenario() -> None:
        async with api() as a:
            r = await a.client.post(
                "/v1/jobs", json={"image": {**IMAGE, "width": -3}}, headers=SUBMITTER
            )
            assert r.status_code == 422, r.text
            assert r.json()["field"] == "image"

    run(scenario())


def test_a_jobs_forecast_is_bounded() -> None:
    async def scenario() -> None:
        async with api() as a:
            ids = [await a.submit(payload=i) for i in range(AHEAD_LIMIT + 30)]
            near = (await a.job(ids[AHEAD_LIMIT - 1])).json()
            assert near["position"] == AHEAD_LIMIT
            far = (await a.job(ids[-1])).json()
            assert far["position"] is None
            assert far["explanation"].startswith(f"more than {AHEAD_LIMIT} jobs ahead")

    assert AHEAD_LIMIT <= 100  # issue 21: a 1,000-job forecast made a read cost 20-35 ms
    run(scenario())


def test_status_is_not_rebuilt_while_nothing_changed() -> None:
    config = parse_config({"keys": KEYS})
    engine = BrokerEngine(config)
    for i in range(20):
        engine.submit(float(i), member="alice", tier="pro", priority=0)
    walks = [0]
    values = JobBook.values

    def counting(book: JobBook) -> Any:
        walks[0] += 1
        return values(book)

    with mock.patch.object(JobBook, "values", counting):
        first = engine.status()
        assert engine.status() == first
        assert walks == [1]
        engine.pop(30.0, worker="gpu-1")
        after = engine.status()
        assert walks == [2]
    assert (after["jobs"]["queued"], after["jobs"]["running"]) == (19, 1)
    after["jobs"]["queued"] = -1  # a caller's copy: the cache is not touched
    assert engine.status()["jobs"]["queued"] == 19


def test_group_and_job_reads_go_through_the_non_blocking_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(f"sqlite:///{tmp_path / 'g.db'}") as (client, broker):
            r = await client.post("/v1/jobs", json={"group": "g"}, headers=SUBMITTER)
            job_id = r.json()["id"]
            assert (await client.get("/v1/groups/g", headers=SUBMITTER)).json()["queued"] == 1
            view = (await client.get(f"/v1/jobs/{job_id}", headers=SUBMITTER)).json()
            assert view["position"] == 1
            assert (await client.get("/v1/jobs/job-99", headers=SUBMITTER)).status_code == 404
            assert broker.serving

    run(scenario())
