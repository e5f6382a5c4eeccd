"""Helpers for the broker tests: the app in memory (httpx over ASGI), a controllable clock,
PostgreSQL discovery, and a broker subprocess on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx

from prioqueue.broker import Broker, BrokerEngine, MemoryJournal, create_app, parse_config
from store.pg import drop_schema, need_postgres

SUBMITTER = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
WORKER = {"Authorization": "Bearer wk-1"}
OPS = {"Authorization": "Bearer sk-ops"}
KEYS: dict[str, Any] = {
    "sk-alice": {"role": "submitter", "member": "alice", "tier": "pro", "max_priority": 100},
    "sk-bob": {"role": "submitter", "member": "bob", "max_priority": 0},
    "wk-1": {"role": "worker", "workers_prefix": ""},  # any worker id (most tests use many)
    "sk-ops": {"role": "submitter", "member": "ops", "observer": True},  # reads /metrics
}
IMAGE = {"width": 1024, "height": 1024, "steps": 50, "sampler": "k_euler"}  # lease 430 s


def run(coro: Awaitable[Any], timeout: float = 180.0) -> Any:
    """Run a coroutine with a bound on its time that means "hung", never "slow" (generous:
    a busy machine, a load of 4-7 on two cores under coverage, must not fail a test)."""

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

    async def status(self) -> Any:
        """``GET /v1/status`` (any key may read it), as JSON."""
        return (await self.client.get("/v1/status", headers=WORKER)).json()

    async def queued(self) -> int:
        """How many jobs ``/v1/status`` says are queued."""
        count: int = (await self.status())["jobs"]["queued"]
        return count

    async def totals(self, *names: str) -> tuple[int, ...]:
        """The ``/v1/status`` totals named, in that order."""
        totals = (await self.status())["totals"]
        return tuple(totals[name] for name in names)

    async def worker_post(self, worker: str, op: str) -> httpx.Response:
        """``POST /v1/workers/{worker}/{op}`` (``heartbeat``, ``leave``) with the worker key."""
        return await self.client.post(f"/v1/workers/{worker}/{op}", headers=WORKER)

    def replays(self) -> bool:
        """Whether a fresh engine fed the journal (through JSON) ends in the live state."""
        live = self.broker.engine
        assert live is not None
        replayed = BrokerEngine(live.config)
        for entry in self.journal.entries:
            replayed.apply(entry.op, json.loads(json.dumps(entry.args)), entry.now)
        return replayed.snapshot() == live.snapshot()


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


@contextlib.contextmanager
def postgres_schema() -> Iterator[str]:
    """A fresh schema for one test (skipped, or failed under PRIOQUEUE_REQUIRE_POSTGRES=1,
    when PostgreSQL is unreachable), dropped afterwards."""
    need_postgres()
    schema = f"pq_broker_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        drop_schema(schema)


def write_config(
    path: Path, port: int, store: str, schema: str | None = None, **extra: Any
) -> Path:
    """A broker.toml for a subprocess broker with the test keys."""
    lines = [f'listen = "127.0.0.1:{port}"', f'store = "{store}"']
    if schema is not None:
        lines.append(f'store_schema = "{schema}"')
    for key, value in extra.items():
        lines.append(f"{key} = {json.dumps(value)}")
    for name, entry in KEYS.items():
        lines.append(f'[keys."{name}"]')
        lines.extend(f"{k} = {json.dumps(v)}" for k, v in entry.items())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


_MAIN = "import sys; from prioqueue.cli import main; sys.exit(main(sys.argv[1:]))"


class BrokerProcess:
    """``prioqueue broker --config FILE`` as a subprocess; killed only by its own pid."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config = config
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BrokerProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _MAIN, "broker", "--config", str(self.config),
                 "--log-level", "warning", "--no-access-log"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    async def wait_serving(self, client: httpx.AsyncClient, timeout: float = 60.0) -> float:
        """Wait until it answers 200 on /v1/status; return the seconds waited.

        ``timeout`` means "hung" (generous); the time it returns is for messages, never for
        a bound on speed (the failover time is benchmarks/bench_broker.py's).
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        while loop.time() - start < timeout:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the broker exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                r = await client.get(f"{self.url}/v1/status", headers=WORKER, timeout=1.0)
                if r.status_code == 200:
                    return loop.time() - start
            await asyncio.sleep(0.05)
        raise AssertionError(
            f"the broker did not serve in {timeout} s: {self.log.read_text()[-2000:]}"
        )


def configured_broker(
    folder: Path, name: str, store: str, schema: str | None = None, **extra: Any
) -> BrokerProcess:
    """A broker (not started yet) on a free port, its config ``folder/<name>.toml`` written
    by ``write_config(..., store, schema, **extra)`` and its log in ``folder/<name>.log``."""
    port = free_port()
    config = write_config(folder / f"{name}.toml", port, store, schema, **extra)
    return BrokerProcess(config, port, folder / f"{name}.log")
