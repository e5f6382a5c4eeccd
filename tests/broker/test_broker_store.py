"""The broker on a real store, in process: restart recovery (SQLite) and a standby (PostgreSQL).

The subprocess tests (crash, failover) kill real processes; these run the same code paths in
this process, so a restart is a clean stop and a new app on the same store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prioqueue.broker import create_app, parse_config
from prioqueue.store import StoreLocked, WallClock
from store.pg import POSTGRES_URL

from .broker_helpers import KEYS, OPS, SUBMITTER, WORKER, Clock, postgres_schema, run


@contextlib.asynccontextmanager
async def served(
    *, clock: WallClock | None = None, **config: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    app = create_app(parse_config({"keys": KEYS, **config}), clock=clock)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
            yield client, app.state.broker


async def _state(client: httpx.AsyncClient, ids: list[str]) -> list[Any]:
    views = []
    for job_id in ids:
        r = await client.get(f"/v1/jobs/{job_id}", headers=SUBMITTER)
        view = r.json() if r.status_code == 200 else r.status_code
        if isinstance(view, dict):  # the estimated start is a forecast from the recent service
            view["explanation"] = (view["explanation"] or "").split("start")[0]  # rate: reset
        views.append(view)
    return views


def test_sqlite_restart_recovers_every_acknowledged_change(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'broker.db'}"
    clock = Clock()

    async def scenario() -> None:
        ids: list[str] = []
        options = {"store": store, "snapshot_every": 3, "default_lease_seconds": 0.3}
        async with served(clock=WallClock(source=clock), **options) as (c, broker):
            for i in range(5):
                headers = {**SUBMITTER, "Idempotency-Key": f"k{i}"}
                ids.append(
                    (await c.post("/v1/jobs", json={"payload": i}, headers=headers)).json()["id"]
                )
            grant = (await c.post("/v1/workers/g1/pop", json={"slots": 2}, headers=WORKER)).json()
            await c.post(
                f"/v1/jobs/{grant['id']}/complete",
                json={"worker": "g1", "attempt": 1, "result": {"png": "x"}},
                headers=WORKER,
            )
            lost = (await c.post("/v1/workers/g2/pop", json={}, headers=WORKER)).json()
            await c.delete(f"/v1/jobs/{ids[4]}", headers=SUBMITTER)
            ticked = broker.changes.token()  # fired by the next applied operation
            clock.advance(0.5)  # g2's lease runs out: the timer's tick requeues the job
            await asyncio.wait_for(ticked, 10)
            assert (await c.get(f"/v1/jobs/{lost['id']}", headers=SUBMITTER)).json()[
                "state"
            ] == "queued"
            before = await _state(c, ids)
            status = (await c.get("/v1/status", headers=WORKER)).json()
            assert broker.recovered_entries == 0
        async with served(clock=WallClock(source=clock), store=store) as (c, broker):
            assert broker.recovered_entries > 0
            assert await _state(c, ids) == before
            assert (await c.get("/v1/status", headers=WORKER)).json() == status
            again = await c.post(
                "/v1/jobs", json={"payload": 0}, headers={**SUBMITTER, "Idempotency-Key": "k0"}
            )
            assert (again.status_code, again.json()["id"]) == (200, ids[0])
            retry = await c.post("/v1/workers/g2/pop", json={}, headers=WORKER)
            assert retry.json()["attempt"] == 2
            metrics = (await c.get("/metrics", headers=OPS)).text
            assert "prioqueue_broker_leader 1.0" in metrics

    run(scenario())


def test_a_second_broker_on_one_sqlite_file_refuses_to_start(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'broker.db'}"

    async def scenario() -> None:
        async with served(store=store):
            app = create_app(parse_config({"keys": KEYS, "store": store}))
            with pytest.raises(StoreLocked, match="another process holds this store"):
                async with app.router.lifespan_context(app):
                    pass

    run(scenario())


async def _until_serving(broker: Any, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if broker.serving:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the broker did not start serving")


def test_postgresql_standby_answers_503_then_takes_over(tmp_path: Path) -> None:
    async def scenario(schema: str) -> None:
        common: dict[str, Any] = {
            "store": POSTGRES_URL,
            "store_schema": schema,
            "leader_lease_seconds": 2.0,
        }
        leader_cm = served(advertise="http://leader:1", **common)
        c1, b1 = await leader_cm.__aenter__()
        try:
            await _until_serving(b1)
            job = (await c1.post("/v1/jobs", json={"payload": 1}, headers=SUBMITTER)).json()["id"]
            async with served(advertise="http://standby:2", **common) as (c2, b2):
                for _ in range(1200):  # until its elector has read the leader's row (60 s: hung)
                    r = await c2.get("/v1/status", headers=WORKER)
                    assert r.status_code == 503
                    if "x-prioqueue-leader" in r.headers:
                        break
                    await asyncio.sleep(0.05)
                assert r.headers["x-prioqueue-leader"] == "http://leader:1"
                assert b2.leader == "http://leader:1"
                assert (await c2.get("/metrics", headers=OPS)).text.count(
                    "prioqueue_broker_leader 0.0"
                ) == 1
                await leader_cm.__aexit__(None, None, None)  # a clean stop hands over at once
                await _until_serving(b2)
                view = (await c2.get(f"/v1/jobs/{job}", headers=SUBMITTER)).json()
                assert view["state"] == "queued"
                status = (await c2.get("/v1/status", headers=WORKER)).json()
                assert (status["role"], status["leader"]) == ("leader", "http://standby:2")
        finally:
            with contextlib.suppress(Exception):
                await leader_cm.__aexit__(None, None, None)
        assert b1.engine is None

    with postgres_schema() as schema:
        run(scenario(schema))


def test_a_fenced_leader_acknowledges_nothing_steps_down_and_recovers() -> None:
    """Another writer bumps the epoch under a serving leader: its next append is fenced."""

    async def scenario(schema: str) -> None:
        from prioqueue.store import PostgresStore

        common: dict[str, Any] = {
            "store": POSTGRES_URL,
            "store_schema": schema,
            "leader_lease_seconds": 2.0,
        }
        async with served(advertise="http://a:1", **common) as (client, broker):
            await _until_serving(broker)
            kept = (await client.post("/v1/jobs", json={}, headers=SUBMITTER)).json()["id"]
            usurper = await asyncio.to_thread(PostgresStore, POSTGRES_URL, schema=schema)
            try:
                await asyncio.to_thread(usurper.claim)
            finally:
                await asyncio.to_thread(usurper.close)
            fenced = await client.post("/v1/jobs", json={"payload": "lost"}, headers=SUBMITTER)
            assert fenced.status_code == 503
            # It stepped down, campaigned again, won (nobody else runs) and recovered from the
            # store at a new epoch: the fenced submit is not there, the acknowledged one is.
            for _ in range(1200):  # 60 s: "hung", not "slow"
                r = await client.get(f"/v1/jobs/{kept}", headers=SUBMITTER)
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert r.status_code == 200
            status = (await client.get("/v1/status", headers=WORKER)).json()
            assert status["totals"]["submitted"] == 1

    with postgres_schema() as schema:
        run(scenario(schema))
