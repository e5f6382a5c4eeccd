"""The broker over HTTP: acknowledged operations per second, failover time, and clients.

Run: ``python benchmarks/bench_broker.py [--seconds S] [--only submits,latency,...]``
(``--only`` runs some sections: throughput, recovery, failover, latency, idle, submits).
PostgreSQL figures need
``PRIOQUEUE_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``) and are
skipped, saying why, when it is unreachable.

* **Throughput.** ``prioqueue broker`` runs as a subprocess on a loopback port; this process
  runs 10 submitter tasks (keeping about 200 jobs queued) and 100 worker tasks that pop and
  complete, all over HTTP (httpx, keep-alive). An *acknowledged operation* is a submit (201),
  a grant (pop 200) or a completion (200) whose answer reached its client: with a store, after
  its commit. The baseline is the same loop against ``store = "memory://"`` (no journal) in the
  same run; the ratio is baseline / store. Goals (issue 10): >= 1,000/s on SQLite, >= 500/s on
  PostgreSQL, within 3x of the baseline. On a 2-core machine the clients share the CPUs with
  the broker, so absolute figures are a floor.
* **Recovery.** A store holding N queued jobs (default 10^5, written straight into the
  journal), then a broker started on it: the time until it serves (a) replaying the journal,
  (b) after a clean stop wrote a snapshot; the baseline is a cold start on an empty store.
  Goal (issue 10): under 5 s.
* **Clients** (issue 18, ``_broker_clients.py``): submit -> a long-polling worker holds the
  job (p50/p99), the idle cost of 100 waiting workers (transactions/s, journal rows/s),
  batched and concurrent single submits, each beside PgQueuer on the same PostgreSQL in the
  same run (``_pgqueuer_side.py``; the column is skipped, saying why, without pgqueuer).
  Goals (issue 18), each printed on a ``goal`` line: batched submit >= 5,000 jobs/s and
  single submits from 20 concurrent producers >= 0.5x PgQueuer's concurrent enqueue, both
  on PostgreSQL; the script exits 1 when one is missed, so ``nox -s bench`` says so.
* **Failover.** Two brokers on one PostgreSQL schema; SIGKILL the leader and time until the
  standby answers 200 (target: 5 s), beside the time a fresh broker takes to start and serve
  (the baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from _harness import section

POSTGRES_URL = os.environ.get("PRIOQUEUE_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
SUBMITTERS = 10
WORKERS = 100
BACKLOG = 200
KEYS: dict[str, dict[str, Any]] = {
    "sk": {"role": "submitter", "member": "bench", "max_priority": 100},
    "wk": {"role": "worker", "workers_prefix": ""},
}
SUB = {"Authorization": "Bearer sk"}
WRK = {"Authorization": "Bearer wk"}
SECTIONS = ("throughput", "recovery", "failover", "latency", "idle", "submits")
"""What ``--only`` may name (default: all, in this order)."""
BATCH_GOAL = 5_000
"""Issue 18: batched submits per second over HTTP on PostgreSQL, at least."""
CONCURRENT_GOAL = 0.5
"""Issue 18: single submits from concurrent producers, at least this times PgQueuer's."""
MAIN = "import sys; from prioqueue.cli import main; sys.exit(main(sys.argv[1:]))"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Broker:
    def __init__(self, directory: Path, name: str, store: str, **extra: Any) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        lines = [f'listen = "127.0.0.1:{self.port}"', f'store = "{store}"']
        lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
        for key, entry in KEYS.items():
            lines.append(f'[keys."{key}"]')
            lines += [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
        self.config = directory / f"{name}.toml"
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-c", MAIN, "broker", "--config", str(self.config)]
        self.proc = subprocess.Popen(
            [*command, "--log-level", "error", "--no-access-log"], stderr=subprocess.DEVNULL
        )

    async def serving(self, client: httpx.AsyncClient, timeout: float = 30.0) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            with contextlib.suppress(httpx.HTTPError):
                r = await client.get(f"{self.url}/v1/status", headers=WRK, timeout=1.0)
                if r.status_code == 200:
                    return time.perf_counter() - start
            await asyncio.sleep(0.02)
        raise RuntimeError(f"{self.url} did not serve within {timeout} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def _load(url: str, seconds: float) -> tuple[int, float]:
    """Run the submitters and workers for ``seconds``; return (acknowledged ops, elapsed).

    The clients use aiohttp (httpx's connection pool slows down with 100 busy connections and
    would measure the client). An idle worker polls again after 0.1 s, as a real one would.
    """
    import aiohttp

    acked = 0
    queued = 0
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def submitter() -> None:
            nonlocal acked, queued
            while not stop.is_set():
                if queued >= BACKLOG:
                    await asyncio.sleep(0.005)
                    continue
                queued += 1
                async with session.post("/v1/jobs", json={"payload": 1}, headers=SUB) as r:
                    await r.read()
                    if r.status == 201:
                        acked += 1
                    else:
                        queued -= 1

        async def worker(name: str) -> None:
            nonlocal acked, queued
            while not stop.is_set():
                async with session.post(f"/v1/workers/{name}/pop", json={}, headers=WRK) as r:
                    if r.status != 200:
                        await r.read()
                        await asyncio.sleep(0.1)
                        continue
                    grant = await r.json()
                acked += 1
                queued -= 1
                body = {"worker": name, "attempt": grant["attempt"]}
                path = f"/v1/jobs/{grant['id']}/complete"
                async with session.post(path, json=body, headers=WRK) as r:
                    await r.read()
                    if r.status == 200:
                        acked += 1

        tasks = [asyncio.create_task(submitter()) for _ in range(SUBMITTERS)]
        tasks += [asyncio.create_task(worker(f"gpu-{i}")) for i in range(WORKERS)]
        await asyncio.sleep(0.5)  # warm up: connections open, a backlog builds
        start_acked, start = acked, time.perf_counter()
        await asyncio.sleep(seconds)
        done, elapsed = acked - start_acked, time.perf_counter() - start
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return done, elapsed


async def _throughput(
    directory: Path, name: str, store: str, seconds: float, **extra: Any
) -> float:
    broker = _Broker(directory, name, store, **extra)
    broker.start()
    try:
        async with httpx.AsyncClient() as client:
            await broker.serving(client)
        ops, elapsed = await _load(broker.url, seconds)
    finally:
        broker.kill()
    return ops / elapsed


def _fill(path: Path, jobs: int) -> None:
    """Write ``jobs`` submits straight into a new SQLite store's journal."""
    from prioqueue.store import Event, open_store

    store = open_store(f"sqlite:///{path}", synchronous="normal")
    try:
        epoch = store.claim()
        start = time.time() - 3600
        batch = []
        for i in range(1, jobs + 1):
            now = start + i * 1e-3
            args = {
                "now": now, "member": f"member-{i % 1000}", "tier": "free",
                "priority": (0, 100, -100)[i % 3], "model": f"model-{i % 50}",
                "payload": {"prompt": i},
            }  # fmt: skip
            batch.append(Event(seq=i, op="submit", args=args, now=now))
            if len(batch) == 10_000:
                store.append(batch, epoch=epoch)
                batch = []
        if batch:
            store.append(batch, epoch=epoch)
    finally:
        store.close()


async def _recovery(directory: Path, jobs: int) -> tuple[float, float, float]:
    empty = _Broker(directory, "empty", f"sqlite:///{directory / 'recovery-empty.db'}")
    full = _Broker(directory, "full", f"sqlite:///{directory / 'recovery.db'}")
    _fill(directory / "recovery.db", jobs)
    async with httpx.AsyncClient() as client:
        times = []
        for broker in (empty, full):
            broker.start()
            try:
                times.append(await broker.serving(client, timeout=120))
                r = await client.get(f"{broker.url}/v1/status", headers=WRK)
                if broker is full:
                    assert r.json()["jobs"]["queued"] == jobs, r.text
            finally:
                assert broker.proc is not None
                broker.proc.send_signal(signal.SIGTERM)  # a clean stop writes a snapshot
                broker.proc.wait(timeout=120)
        full.start()
        try:
            times.append(await full.serving(client, timeout=120))
        finally:
            full.kill()
    return times[0], times[1], times[2]


def _postgres_reason() -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except Exception as exc:
        return f"PostgreSQL at {POSTGRES_URL} is unreachable: {exc}"
    return None


def _drop(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def _failover(directory: Path) -> tuple[float, float]:
    schema = f"pq_bench_{uuid.uuid4().hex[:10]}"
    extra = {"store_schema": schema}
    a = _Broker(directory, "a", POSTGRES_URL, **extra)
    b = _Broker(directory, "b", POSTGRES_URL, **extra)
    try:
        async with httpx.AsyncClient() as client:
            a.start()
            cold = await a.serving(client)
            b.start()
            await asyncio.sleep(2.0)  # b is up and standing by
            await client.post(f"{a.url}/v1/jobs", json={}, headers=SUB)
            a.kill()
            takeover = await b.serving(client)
    finally:
        a.kill()
        b.kill()
        _drop(schema)
    return takeover, cold


async def _serve(broker: _Broker) -> None:
    async with httpx.AsyncClient() as client:
        await broker.serving(client)


def _client_figures(directory: Path, reason: str | None, seconds: float, only: set[str]) -> bool:
    """Issue 18: long-poll latency, idle cost, batched and concurrent submits (and PgQueuer).

    Returns:
        False when a goal of issue 18 that this run measured is missed.
    """
    import _broker_clients as bc

    pgq: dict[str, Any] | None = None
    why = reason or ""
    if reason is None and only & {"latency", "submits"}:
        pgq, why = bc.pgqueuer(POSTGRES_URL)
        if pgq is None:
            print(f"PgQueuer column skipped: {why}")
    if "latency" in only:
        _latency_figures(directory, reason, pgq)
    if reason is not None:
        print(f"PostgreSQL figures skipped: {reason}")
        return True
    if "idle" in only:
        _idle_figures(directory)
    if "submits" in only:
        return _submit_figures(directory, seconds, pgq)
    return True


def _latency_figures(directory: Path, reason: str | None, pgq: dict[str, Any] | None) -> None:
    import _broker_clients as bc

    section(f"submit -> a waiting worker holds the job, over HTTP ({bc.WAITING} long-polling)")
    stores: list[tuple[str, str, dict[str, Any]]] = [
        ("SQLite", f"sqlite:///{directory / 'latency.db'}", {})
    ]
    schema = f"pq_bench_{uuid.uuid4().hex[:10]}"
    if reason is None:
        stores.append(("PostgreSQL", POSTGRES_URL, {"store_schema": schema}))
    try:
        for label, store, extra in stores:
            broker = _Broker(directory, f"lat-{label}", store, **extra)
            broker.start()
            try:
                asyncio.run(_serve(broker))
                values = asyncio.run(bc.latency(broker.url))
            finally:
                broker.kill()
            base = pgq["latency"] if pgq is not None and label == "PostgreSQL" else None
            bc.report_latency(f"broker on {label}", values, base)
    finally:
        if reason is None:
            _drop(schema)


def _idle_figures(directory: Path) -> None:
    import _broker_clients as bc

    section(f"idle cost: {bc.IDLE_WORKERS} workers waiting in long polls (PostgreSQL)")
    dsn = bc.create_database(POSTGRES_URL)
    try:
        figures = []
        for workers in (0, bc.IDLE_WORKERS):
            schema = f"pq_idle_{uuid.uuid4().hex[:8]}"
            broker = _Broker(directory, f"idle-{workers}", dsn, store_schema=schema)
            broker.start()
            try:
                asyncio.run(_serve(broker))
                figures.append(asyncio.run(bc.idle_cost(broker.url, dsn, schema, workers)))
            finally:
                broker.kill()
        (base_x, base_r), (xacts, rows) = figures
        print(
            f"{'no worker (leader lease renewals), baseline':<44} {base_x:>6.2f} txn/s "
            f"{base_r:>6.2f} journal rows/s"
        )
        print(
            f"{f'{bc.IDLE_WORKERS} waiting workers':<44} {xacts:>6.2f} txn/s "
            f"{rows:>6.2f} journal rows/s   over the baseline {xacts - base_x:+.2f} txn/s"
        )
    finally:
        bc.drop_database(POSTGRES_URL, dsn)


def _submit_figures(directory: Path, seconds: float, pgq: dict[str, Any] | None) -> bool:
    """Batched and concurrent single submits on PostgreSQL, beside PgQueuer; goals checked."""
    import _broker_clients as bc

    section("submits over HTTP (PostgreSQL), jobs/s")
    schema = f"pq_bench_{uuid.uuid4().hex[:10]}"
    broker = _Broker(directory, "submits", POSTGRES_URL, store_schema=schema)
    broker.start()
    try:
        asyncio.run(_serve(broker))
        batch = asyncio.run(bc.batched(broker.url, seconds))
        single = asyncio.run(bc.concurrent(broker.url, seconds))
    finally:
        broker.kill()
        _drop(schema)
    for label, rate, key in (
        (f"batched ({bc.BATCH_CLIENTS} clients x {bc.BATCH} jobs)", batch, "batch"),
        (f"single, {bc.PRODUCERS} concurrent producers", single, "concurrent"),
    ):
        line = f"{label:<44} {rate:>8.0f} jobs/s"
        if pgq is not None:
            line += f"   PgQueuer {pgq[key]:>8.0f} jobs/s   ratio {rate / pgq[key]:>5.2f}x"
        print(line)
    print(f"({bc.environment_note()})")
    ok = batch >= BATCH_GOAL
    print(
        f"goal (issue 18): batched submit >= {BATCH_GOAL:,} jobs/s over HTTP: "
        f"{batch:,.0f} jobs/s, {'met' if ok else 'MISSED'}"
    )
    if pgq is None:
        print("goal (issue 18): single submits >= 0.5x PgQueuer: not measured (no PgQueuer)")
        return ok
    ratio = single / pgq["concurrent"]
    met = ratio >= CONCURRENT_GOAL
    print(
        f"goal (issue 18): single submits from {bc.PRODUCERS} concurrent producers >= "
        f"{CONCURRENT_GOAL}x PgQueuer's concurrent enqueue (same run): {ratio:.2f}x, "
        f"{'met' if met else 'MISSED'}"
    )
    return ok and met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per store")
    parser.add_argument("--jobs", type=int, default=100_000, help="queued jobs to recover")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})",
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        parser.error(f"unknown sections {sorted(only - set(SECTIONS))}; have {SECTIONS}")
    reason = _postgres_reason()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if "throughput" in only:
            _throughput_figures(directory, reason, args.seconds)
        if "recovery" in only:
            _recovery_figures(directory, args.jobs)
        if "failover" in only:
            _failover_figures(directory, reason)
        met = _client_figures(directory, reason, args.seconds, only)
    if not met:
        print("GOAL MISSED (see the goal lines above)")
    return 0 if met else 1


def _throughput_figures(directory: Path, reason: str | None, seconds: float) -> None:
    section(f"acknowledged ops/s over HTTP ({SUBMITTERS} submitters, {WORKERS} workers)")
    base = asyncio.run(_throughput(directory, "memory", "memory://", seconds))
    print(f"{'no store (memory://), the baseline':<44} {base:>8.0f} ops/s")
    runs: list[tuple[str, str, dict[str, Any]]] = [
        ("SQLite (synchronous=full)", f"sqlite:///{directory / 'full.db'}", {}),
        (
            "SQLite (synchronous=normal)",
            f"sqlite:///{directory / 'normal.db'}",
            {"sqlite_synchronous": "normal"},
        ),
    ]
    schema = f"pq_bench_{uuid.uuid4().hex[:10]}"
    if reason is None:
        runs.append(("PostgreSQL", POSTGRES_URL, {"store_schema": schema}))
    try:
        for label, store, extra in runs:
            rate = asyncio.run(_throughput(directory, label[:6], store, seconds, **extra))
            ratio = base / rate if rate else float("inf")
            print(f"{label:<44} {rate:>8.0f} ops/s   baseline / this {ratio:>5.2f}x")
    finally:
        if reason is None:
            _drop(schema)


def _recovery_figures(directory: Path, jobs: int) -> None:
    section(f"recovery of {jobs:,} queued jobs (SQLite): start until serving")
    cold, replayed, snapshot = asyncio.run(_recovery(directory, jobs))
    print(f"{'cold start, empty store (the baseline)':<44} {cold:>8.2f} s")
    for label, seconds in (("replaying the journal", replayed), ("from a snapshot", snapshot)):
        print(f"{label:<44} {seconds:>8.2f} s       ratio {seconds / cold:>5.1f}x")


def _failover_figures(directory: Path, reason: str | None) -> None:
    if reason is not None:
        print(f"PostgreSQL figures skipped: {reason}")
        return
    section("failover (PostgreSQL): SIGKILL the leader")
    takeover, cold = asyncio.run(_failover(directory))
    print(
        f"{'standby serves after the kill':<44} {takeover:>8.2f} s       "
        f"a cold start serving {cold:>5.2f} s   ratio {takeover / cold:>5.2f}x"
    )


if __name__ == "__main__":
    sys.exit(main())
