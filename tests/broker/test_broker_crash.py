"""Crash test: the real broker as a subprocess, SIGKILLed at seeded random moments, restarted.

Submitters and workers talk to it over HTTP on 127.0.0.1 and keep only what it acknowledged.
From those acknowledgements: every acknowledged submit survives; no job is acknowledged as
completed twice; no job is held by two workers with unexpired leases (grants of one job never
overlap); and in the end every job is done, failed or cancelled. Both stores.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from store.pg import POSTGRES_URL

from .broker_helpers import SUBMITTER, WORKER, configured_broker, postgres_schema, run

KILLS = 20  # the full run (`nox -s slow`); the default suite kills the broker QUICK_KILLS times
QUICK_KILLS = 4
JOBS = 120
WORKERS = 6
LEASE = 2.0  # seconds: grants lost in a crash come back quickly


@attrs.define
class Ledger:
    """What the broker acknowledged to the clients."""

    submitted: dict[str, str] = attrs.field(factory=dict)  # idempotency key -> job id
    grants: dict[str, list[tuple[int, str, float, float]]] = attrs.field(
        factory=lambda: defaultdict(list)
    )  # job -> (attempt, worker, start, deadline)
    completed: dict[str, int] = attrs.field(factory=lambda: defaultdict(int))
    cancelled: set[str] = attrs.field(factory=set)
    errors: list[str] = attrs.field(factory=list)


async def _retrying(
    client: httpx.AsyncClient, method: str, url: str, stop: asyncio.Event, **kwargs: Any
) -> httpx.Response | None:
    """Send until the broker answers (it may be down or restarting); None once stopped."""
    while not stop.is_set():
        try:
            response = await client.request(method, url, **kwargs)
        except httpx.HTTPError:
            await asyncio.sleep(0.05)
            continue
        if response.status_code == 503:
            await asyncio.sleep(0.05)
            continue
        return response
    return None


async def _submitter(
    client: httpx.AsyncClient, url: str, n: int, first: int, ledger: Ledger, rng: random.Random
) -> None:
    never = asyncio.Event()
    for i in range(first, first + n):
        key = f"job-key-{i}"
        body = {"priority": rng.choice(["interactive", "normal", "batch"]), "payload": {"i": i}}
        headers = {**SUBMITTER, "Idempotency-Key": key}
        r = await _retrying(client, "POST", f"{url}/v1/jobs", never, json=body, headers=headers)
        assert r is not None
        if r.status_code not in (200, 201):
            ledger.errors.append(f"submit {key}: {r.status_code} {r.text}")
            continue
        job_id = r.json()["id"]
        if key in ledger.submitted and ledger.submitted[key] != job_id:
            ledger.errors.append(f"{key} acknowledged as {ledger.submitted[key]} then {job_id}")
        ledger.submitted[key] = job_id
        if rng.random() < 0.1:
            r = await _retrying(
                client, "DELETE", f"{url}/v1/jobs/{job_id}", never, headers=SUBMITTER
            )
            if r is not None and r.status_code == 200:
                ledger.cancelled.add(job_id)
        await asyncio.sleep(rng.uniform(0, 0.02))


async def _worker(
    client: httpx.AsyncClient,
    url: str,
    name: str,
    ledger: Ledger,
    rng: random.Random,
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        r = await _retrying(
            client, "POST", f"{url}/v1/workers/{name}/pop", stop, json={}, headers=WORKER
        )
        if r is None:
            return
        if r.status_code == 204:
            await asyncio.sleep(0.05)
            continue
        if r.status_code != 200:
            ledger.errors.append(f"pop {name}: {r.status_code} {r.text}")
            continue
        grant = r.json()
        job_id, attempt = grant["id"], grant["attempt"]
        start = grant["deadline"] - grant["lease_seconds"]
        ledger.grants[job_id].append((attempt, name, start, grant["deadline"]))
        await asyncio.sleep(rng.uniform(0, 0.05))
        op = "fail" if rng.random() < 0.05 else "complete"
        body = {"worker": name, "attempt": attempt, "result": {"by": name}}
        r = await _retrying(
            client, "POST", f"{url}/v1/jobs/{job_id}/{op}", stop, json=body, headers=WORKER
        )
        if r is not None and r.status_code == 200 and op == "complete":
            ledger.completed[job_id] += 1
        elif r is not None and r.status_code not in (200, 409):
            ledger.errors.append(f"{op} {job_id}: {r.status_code} {r.text}")


async def _crash_loop(
    store: str, tmp_path: Path, schema: str | None, seed: int, kills: int
) -> None:
    rng = random.Random(seed)
    broker = configured_broker(
        tmp_path, "broker", store, schema,
        default_lease_seconds=LEASE, worker_timeout_seconds=0, max_attempts=50,
        snapshot_every=200,
    )  # fmt: skip
    ledger = Ledger()
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=50)
    async with httpx.AsyncClient(timeout=5.0, limits=limits) as client:
        broker.start()
        try:
            await broker.wait_serving(client)
            per = JOBS // 3
            submitters = [
                asyncio.create_task(
                    _submitter(client, broker.url, per, k * per, ledger, random.Random(seed + k))
                )
                for k in range(3)
            ]
            workers = [
                asyncio.create_task(
                    _worker(
                        client, broker.url, f"gpu-{w}", ledger, random.Random(seed * 7 + w), stop
                    )
                )
                for w in range(WORKERS)
            ]
            for _ in range(kills):
                await asyncio.sleep(rng.uniform(0.05, 0.4))
                broker.kill()
                broker.start()
                await broker.wait_serving(client)
            await asyncio.wait_for(asyncio.gather(*submitters), 180)  # bounds mean "hung"
            # Let the fleet drain: every acknowledged job must end done, failed or cancelled.
            states: dict[str, str] = {}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while loop.time() < deadline:
                states = {}
                for job_id in ledger.submitted.values():
                    r = await client.get(f"{broker.url}/v1/jobs/{job_id}", headers=SUBMITTER)
                    assert r.status_code == 200, f"acknowledged {job_id} is lost: {r.text}"
                    states[job_id] = r.json()["state"]
                if all(s in ("done", "failed", "cancelled") for s in states.values()):
                    break
                await asyncio.sleep(0.5)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*workers), 60)
        finally:
            stop.set()
            broker.kill()
    assert not ledger.errors, ledger.errors[:5]
    assert len(ledger.submitted) == JOBS // 3 * 3
    assert len(set(ledger.submitted.values())) == len(ledger.submitted)
    unfinished = {j: s for j, s in states.items() if s not in ("done", "failed", "cancelled")}
    assert not unfinished, unfinished
    twice = {j: n for j, n in ledger.completed.items() if n > 1}
    assert not twice, f"jobs acknowledged as completed twice: {twice}"
    for job_id in ledger.completed:
        assert states[job_id] == "done"
    for job_id in ledger.cancelled:
        assert states[job_id] == "cancelled"
    for job_id, grants in ledger.grants.items():
        grants.sort()
        attempts = [g[0] for g in grants]
        assert len(set(attempts)) == len(attempts), f"{job_id} granted twice as one attempt"
        for (_, w1, _, end1), (_, w2, start2, _) in itertools.pairwise(grants):
            assert start2 >= end1, f"{job_id} held by {w1} and {w2} with unexpired leases"
    assert sum(ledger.completed.values()) > JOBS // 3  # the loop did real work


KILL_COUNTS = [
    pytest.param(QUICK_KILLS, id="quick"),
    pytest.param(KILLS, id="full", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("kills", KILL_COUNTS)
def test_crash_loop_sqlite(tmp_path: Path, kills: int) -> None:
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    run(_crash_loop(url, tmp_path, None, seed=10, kills=kills), timeout=300)


@pytest.mark.parametrize("kills", KILL_COUNTS)
def test_crash_loop_postgresql(tmp_path: Path, kills: int) -> None:
    with postgres_schema() as schema:
        run(_crash_loop(POSTGRES_URL, tmp_path, schema, seed=20, kills=kills), timeout=300)
