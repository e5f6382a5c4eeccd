"""PgQueuer's side of ``bench_broker.py``: the same figures on the same PostgreSQL.

Run by ``bench_broker.py`` as a subprocess (``python _pgqueuer_side.py URL SCHEMA``), so
PgQueuer and its dependencies never load into the broker's process; it prints one JSON object:

* ``latency``: seconds from just before ``enqueue`` to the consumer (a ``QueueManager``
  woken by LISTEN/NOTIFY, in this process) holding the job, one job at a time;
* ``batch``: jobs/s enqueued in batches of ``BATCH`` (one ``enqueue`` call each);
* ``concurrent``: jobs/s enqueued one per call by ``PRODUCERS`` concurrent producers, each
  on its own connection.

Needs ``pgqueuer`` and ``asyncpg`` (its fast driver, LISTEN/NOTIFY served at once); the bench
session of ``noxfile.py`` installs both.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import time
from typing import Any

SAMPLES = 500  # as _broker_clients.SAMPLES: the p99 is the fifth largest sample
BATCH = 1000
BATCHES = 20
PRODUCERS = 20
SECONDS = 3.0


async def _connect(url: str, schema: str) -> Any:
    asyncpg: Any = importlib.import_module("asyncpg")  # not installed for the type checker
    return await asyncpg.connect(url, server_settings={"search_path": schema})


async def main(url: str, schema: str) -> dict[str, Any]:
    pgq: Any = importlib.import_module("pgqueuer")
    AsyncpgDriver, Queries, QueueManager = pgq.AsyncpgDriver, pgq.Queries, pgq.QueueManager  # noqa: N806

    admin = await _connect(url, "public")
    await admin.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    conn = await _connect(url, schema)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    out: dict[str, Any] = {}
    try:
        # Latency: one consumer waiting on LISTEN/NOTIFY; one job at a time.
        consumer_conn = await _connect(url, schema)
        qm = QueueManager(Queries(AsyncpgDriver(consumer_conn)))
        got: asyncio.Queue[float] = asyncio.Queue()

        async def bench(job: Any) -> None:
            got.put_nowait(time.perf_counter())

        qm.entrypoint("bench")(bench)

        runner = asyncio.create_task(qm.run(batch_size=1))
        await asyncio.sleep(1.0)
        latencies = []
        for _ in range(SAMPLES):
            start = time.perf_counter()
            await queries.enqueue("bench", b"x")
            latencies.append(await asyncio.wait_for(got.get(), 30) - start)
            await asyncio.sleep(0.05)  # the consumer settles (as a waiting worker would)
        qm.shutdown.set()
        await asyncio.wait_for(runner, 30)
        await consumer_conn.close()
        out["latency"] = latencies
        # Batched enqueue.
        start = time.perf_counter()
        for _ in range(BATCHES):
            await queries.enqueue(["batch"] * BATCH, [b"x"] * BATCH, [0] * BATCH)
        out["batch"] = BATCHES * BATCH / (time.perf_counter() - start)
        # Concurrent single enqueues.
        conns = [await _connect(url, schema) for _ in range(PRODUCERS)]
        count = 0
        stop = time.perf_counter() + SECONDS

        async def producer(c: Any) -> None:
            nonlocal count
            q = Queries(AsyncpgDriver(c))
            while time.perf_counter() < stop:
                await q.enqueue("single", b"x")
                count += 1

        start = time.perf_counter()
        await asyncio.gather(*(producer(c) for c in conns))
        out["concurrent"] = count / (time.perf_counter() - start)
        for c in conns:
            await c.close()
    finally:
        await conn.close()
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()
    return out


if __name__ == "__main__":
    os.environ.setdefault("PGQUEUER_DB_SCHEMA", sys.argv[2])
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
