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


def test_a_lease_runs_out_after_a_restart_from_a_run_ten_years_ahead(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'b.db'}"
    wall, mono = Clock(1_000_000.0 + YEARS_10), Clock(0.0)

    async def scenario() -> Any:
        async with served(store, WallClock(source=wall, monotonic=mono, horizon=60.0)) as c:
            job = (await c.post("/v1/jobs", json={}, headers=SUBMITTER)).json()["id"]
            grant = (await c.post("/v1/workers/gpu-1/pop", json={}, headers=WORKER)).json()
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
