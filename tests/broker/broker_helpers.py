"""Helpers for the broker tests: the app in memory (httpx over ASGI), a controllable clock,
PostgreSQL discovery, and a broker subprocess on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import attrs
import httpx

from prioqueue.broker import Broker, MemoryJournal, create_app, parse_config

SUBMITTER = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
WORKER = {"Authorization": "Bearer wk-1"}
KEYS: dict[str, Any] = {
    "sk-alice": {"role": "submitter", "member": "alice", "tier": "pro", "max_priority": 100},
    "sk-bob": {"role": "submitter", "member": "bob", "max_priority": 0},
    "wk-1": {"role": "worker"},
}
IMAGE = {"width": 1024, "height": 1024, "steps": 50, "sampler": "k_euler"}  # lease 430 s


def run(coro: Awaitable[Any], timeout: float = 60.0) -> Any:
    """Run a coroutine with a bound on its time."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


@attrs.define
class Clock:
    """A wall clock the test moves by hand."""

    t: float = 1_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@attrs.define
class Api:
    client: httpx.AsyncClient
    broker: Broker
    clock: Clock
    journal: MemoryJournal

    async def submit(self, headers: dict[str, str] = SUBMITTER, **body: Any) -> str:
        response = await self.client.post("/v1/jobs", json=body, headers=headers)
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        return job_id

    async def pop(self, worker: str = "gpu-1", **body: Any) -> httpx.Response:
        return await self.client.post(f"/v1/workers/{worker}/pop", json=body, headers=WORKER)

    async def finish(
        self, job_id: str, worker: str, attempt: int, op: str = "complete", result: Any = None
    ) -> httpx.Response:
        body = {"worker": worker, "attempt": attempt, "result": result}
        return await self.client.post(f"/v1/jobs/{job_id}/{op}", json=body, headers=WORKER)

    async def job(self, job_id: str, headers: dict[str, str] = SUBMITTER) -> httpx.Response:
        return await self.client.get(f"/v1/jobs/{job_id}", headers=headers)


@contextlib.asynccontextmanager
async def api(**config: Any) -> AsyncIterator[Api]:
    """The broker app in memory with a hand-moved clock."""
    clock = Clock()
    journal = MemoryJournal(clock)
    data = {"store": "memory://", "keys": KEYS, **config}
    app = create_app(parse_config(data), journal)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
            yield Api(client, app.state.broker, clock, journal)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


POSTGRES_URL = os.environ.get("PRIOQUEUE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def postgres_reason() -> str | None:
    """None when PostgreSQL answers, else why not (the skip reason)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (the 'postgres' extra)"
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3) as conn:
            conn.execute("select 1")
    except Exception as exc:
        return f"PostgreSQL at {POSTGRES_URL} is unreachable: {exc}"
    return None
