"""Failover on PostgreSQL: two real brokers, one leads; SIGKILL and SIGSTOP the leader.

* SIGKILL the leader: the standby serves (how fast is benchmarks/bench_broker.py's failover
  figure: a wall-clock bound here failed on a busy machine).
* SIGSTOP the leader past its lease: the standby takes over; SIGCONT the old one: a request it
  was holding is not acknowledged (its append is fenced: it appends nothing), it steps down and
  answers 503 naming the new leader. No acknowledged submit is lost on either side.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx

from store.pg import POSTGRES_URL

from .broker_helpers import (
    SUBMITTER,
    WORKER,
    BrokerProcess,
    configured_broker,
    postgres_schema,
    run,
)

LEASE = 2.0


def _pair(tmp_path: Path, schema: str) -> tuple[BrokerProcess, BrokerProcess]:
    a, b = (
        configured_broker(tmp_path, name, POSTGRES_URL, schema, leader_lease_seconds=LEASE)
        for name in ("a", "b")
    )
    return a, b


async def _submit(client: httpx.AsyncClient, broker: BrokerProcess, key: str) -> httpx.Response:
    headers = {**SUBMITTER, "Idempotency-Key": key}
    return await client.post(f"{broker.url}/v1/jobs", json={"payload": key}, headers=headers)


async def _standby_says(client: httpx.AsyncClient, broker: BrokerProcess, leader: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60  # "hung", not "slow"
    while loop.time() < deadline:
        try:
            r = await client.get(f"{broker.url}/v1/status", headers=WORKER, timeout=1.0)
        except httpx.HTTPError:
            await asyncio.sleep(0.1)
            continue
        if r.status_code == 503 and r.headers.get("x-prioqueue-leader") == leader:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["leader"] == leader
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{broker.url} did not become a standby pointing at {leader}")


async def _failover(tmp_path: Path, schema: str) -> None:
    a, b = _pair(tmp_path, schema)
    acked: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=5.0) as client:
        try:
            a.start()
            await a.wait_serving(client)
            b.start()
            await _standby_says(client, b, a.url)
            for i in range(10):
                r = await _submit(client, a, f"k{i}")
                assert r.status_code == 201
                acked[f"k{i}"] = r.json()["id"]
            rejected = await _submit(client, b, "on-standby")
            assert rejected.status_code == 503

            # SIGKILL the leader: the standby serves.
            a.kill()
            await b.wait_serving(client)
            for i in range(10, 20):
                r = await _submit(client, b, f"k{i}")
                assert r.status_code == 201
                acked[f"k{i}"] = r.json()["id"]
            a.start()
            await _standby_says(client, a, b.url)

            # SIGSTOP the leader past its lease: the standby takes over.
            b.signal(signal.SIGSTOP)
            held = asyncio.create_task(_submit(client, b, "while-stopped"))
            await a.wait_serving(client)
            for i in range(20, 30):
                r = await _submit(client, a, f"k{i}")
                assert r.status_code == 201
                acked[f"k{i}"] = r.json()["id"]
            b.signal(signal.SIGCONT)
            try:
                late = await held
            except httpx.HTTPError:
                late = None
            # The old leader resumed: it must not acknowledge what it can no longer journal.
            assert late is None or late.status_code == 503, late.text
            await _standby_says(client, b, a.url)

            # Nothing acknowledged by either side is lost; the fenced request left no job.
            for key, job_id in acked.items():
                r = await client.get(f"{a.url}/v1/jobs/{job_id}", headers=SUBMITTER)
                assert r.status_code == 200, f"{key} -> {job_id} lost"
                again = await _submit(client, a, key)
                assert (again.status_code, again.json()["id"]) == (200, job_id)
            status = (await client.get(f"{a.url}/v1/status", headers=WORKER)).json()
            assert status["totals"]["submitted"] == len(acked)
        finally:
            for broker in (a, b):
                if broker.proc is not None and broker.proc.poll() is None:
                    broker.signal(signal.SIGCONT)
                broker.kill()


def test_failover_sigkill_and_sigstop(tmp_path: Path) -> None:
    with postgres_schema() as schema:
        run(_failover(tmp_path, schema), timeout=300)
