"""The broker's client figures (issue 18), printed by ``bench_broker.py`` beside PgQueuer's.

* **Submit -> a waiting worker holds the job**, over HTTP: ``WAITING`` workers long-poll
  (``?wait=30``); one submitter submits a job at a time; the latency is from just before
  the submit is sent to the moment a worker has the pop's answer. SQLite and PostgreSQL;
  beside PgQueuer's enqueue -> consumer latency (LISTEN/NOTIFY) on the same PostgreSQL.
* **Idle cost**: 100 workers waiting in long polls for ``IDLE_SECONDS``; transactions per
  second committed in the broker's own database (``pg_stat_database.xact_commit``) and
  journal rows per second; the baseline is the same broker with no worker (its leader
  lease renewals).
* **Batched submit**: ``POST /v1/jobs/batch`` of ``BATCH`` jobs from 4 clients, jobs/s, on
  PostgreSQL; beside PgQueuer's batched ``enqueue``.
* **Concurrent single submits**: 20 producers, one job per request, jobs/s; beside PgQueuer's
  20 concurrent producers.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
WAITING = 10
SAMPLES = 500
"""Submits timed per latency figure: with 100, the p99 was the largest sample (one hiccup of
the shared machine decided it); with 500 it is the fifth largest."""
IDLE_WORKERS = 100
IDLE_SECONDS = 30.0
STATS_FLUSH = 11.0
BATCH = 500
BATCH_CLIENTS = 4
PRODUCERS = 20
SUB = {"Authorization": "Bearer sk"}
WRK = {"Authorization": "Bearer wk"}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(url: str, samples: int = SAMPLES) -> list[float]:
    """Seconds from a submit to a waiting worker holding the job, ``samples`` times."""
    import aiohttp

    got: dict[str, float] = {}
    arrived = asyncio.Event()
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def worker(name: str) -> None:
            while not stop.is_set():
                async with session.post(
                    f"/v1/workers/{name}/pop", params={"wait": "30"}, json={}, headers=WRK
                ) as r:
                    if r.status != 200:
                        await r.read()
                        continue
                    grant = await r.json()
                got[grant["id"]] = time.perf_counter()
                arrived.set()
                body = {"worker": name, "attempt": grant["attempt"]}
                async with session.post(
                    f"/v1/jobs/{grant['id']}/complete", json=body, headers=WRK
                ) as r:
                    await r.read()

        workers = [asyncio.create_task(worker(f"lat-{i}")) for i in range(WAITING)]
        await asyncio.sleep(1.0)  # every worker joined and waits
        out = []
        for _ in range(samples):
            await asyncio.sleep(0.05)  # the last worker is back in its long poll
            start = time.perf_counter()
            async with session.post("/v1/jobs", json={"payload": 1}, headers=SUB) as r:
                job_id = (await r.json())["id"]
            while job_id not in got:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 30)
            out.append(got[job_id] - start)
        stop.set()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return out


async def idle_cost(url: str, dsn: str, schema: str, workers: int) -> tuple[float, float]:
    """(transactions/s in the broker's database, journal rows/s) with ``workers`` waiting."""
    import aiohttp
    import psycopg

    database = dsn.rsplit("/", 1)[1]
    # The transaction count is read from another database, so reading it adds nothing to the
    # broker's; the journal's row count is read in the broker's database by one autocommit
    # SELECT, inside the window at both ends: exactly 2 of the counted transactions are ours.
    maintenance = dsn.rsplit("/", 1)[0] + "/postgres"

    def xacts() -> int:
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
            ).fetchone()
        assert row is not None
        return int(row[0])

    def rows() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT coalesce(max(seq), 0) FROM {schema}.prioqueue_journal"
            ).fetchone()
        assert row is not None
        return int(row[0])

    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def worker(name: str) -> None:
            while not stop.is_set():
                async with session.post(
                    f"/v1/workers/{name}/pop", params={"wait": "60"}, json={}, headers=WRK
                ) as r:
                    await r.read()

        tasks = [asyncio.create_task(worker(f"idle-{i}")) for i in range(workers)]
        await asyncio.sleep(3.0)  # joins are journaled; then they only wait
        await asyncio.sleep(STATS_FLUSH)  # the statistics of the joins are reported
        x0 = await asyncio.to_thread(xacts)
        start = time.perf_counter()
        r0 = await asyncio.to_thread(rows)
        await asyncio.sleep(IDLE_SECONDS)
        r1 = await asyncio.to_thread(rows)
        elapsed = time.perf_counter() - start
        # A backend reports its counts when it goes idle, at most once a second (an idle
        # one within 10 s): wait that out, still waiting, before the second reading.
        await asyncio.sleep(STATS_FLUSH)
        x1 = await asyncio.to_thread(xacts)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # The transactions of the wait for the statistics are counted too, at the same rate: the
    # rate is over the whole window.
    return max(0, x1 - x0 - 2) / (elapsed + STATS_FLUSH), (r1 - r0) / elapsed


async def batched(url: str, seconds: float) -> float:
    """Jobs/s submitted in batches of ``BATCH`` by ``BATCH_CLIENTS`` clients."""
    import aiohttp

    count = 0
    end = time.perf_counter() + seconds
    body = {"jobs": [{"payload": i} for i in range(BATCH)]}
    async with aiohttp.ClientSession(url) as session:

        async def client() -> None:
            nonlocal count
            while time.perf_counter() < end:
                async with session.post("/v1/jobs/batch", json=body, headers=SUB) as r:
                    await r.read()
                    if r.status == 201:
                        count += BATCH

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(BATCH_CLIENTS)))
        return count / (time.perf_counter() - start)


async def concurrent(url: str, seconds: float) -> float:
    """Jobs/s submitted one per request by ``PRODUCERS`` concurrent producers."""
    import aiohttp

    count = 0
    end = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def producer() -> None:
            nonlocal count
            while time.perf_counter() < end:
                async with session.post("/v1/jobs", json={"payload": 1}, headers=SUB) as r:
                    await r.read()
                    if r.status == 201:
                        count += 1

        start = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
        return count / (time.perf_counter() - start)


def pgqueuer(dsn: str) -> tuple[dict[str, Any] | None, str]:
    """PgQueuer's figures on the same PostgreSQL (a subprocess), or None and why not."""
    schema = f"pq_pgq_{uuid.uuid4().hex[:10]}"
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "_pgqueuer_side.py"), dsn, schema],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, "PgQueuer's run did not finish in 600 s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"PgQueuer could not run ({last}); `nox -s bench` installs it"
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures, ""


def report_latency(label: str, values: list[float], base: list[float] | None) -> None:
    p50, p99 = _pct(values, 0.5) * 1e3, _pct(values, 0.99) * 1e3
    line = f"{label:<44} p50 {p50:>6.1f} ms  p99 {p99:>6.1f} ms"
    if base:
        b50, b99 = _pct(base, 0.5) * 1e3, _pct(base, 0.99) * 1e3
        line += f"   PgQueuer p50 {b50:.1f} / p99 {b99:.1f} ms   ratio p50 {p50 / b50:.2f}x"
    print(line)


def mean_ms(values: list[float]) -> float:
    return statistics.fmean(values) * 1e3


def create_database(dsn: str) -> str:
    """A fresh database beside ``dsn``'s (so its transaction count is the broker's alone)."""
    import psycopg

    name = f"pq_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return dsn.rsplit("/", 1)[0] + "/" + name


def drop_database(dsn: str, url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def environment_note() -> str:
    return f"{os.cpu_count()} CPUs shared by the broker, its clients and PostgreSQL"
