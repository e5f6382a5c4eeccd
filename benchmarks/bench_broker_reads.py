"""The broker's reads at depth: ``GET /v1/status`` and a job's ``GET`` at 5,000 queued.

Run: ``python benchmarks/bench_broker_reads.py [--jobs N]``.

A SQLite store is filled with N submits (written straight into the journal, from 50 members at
three priorities and seven models), then the broker app starts on it in this process and the
reads go through its ASGI interface (httpx, no sockets), one at a time, on an idle broker.
Each figure is the median of many calls, beside the same route on an empty broker (the
baseline, same run). The job read is timed for the job at the back of the queue, once with
the forecast bounded as it is now (``AHEAD_LIMIT``) and once with the 1,000-job bound the
broker had before (issue 21: 19-35 ms at 3,000 queued). Goal: under 5 ms at 5,000 queued.

Last, the snapshot's encoding: 200 x 1 MiB payloads encoded in a thread, as the store's writer
does, while the event loop ticks every millisecond; the longest stall of the loop with one
``json.dumps`` call (before; the C encoder holds the GIL throughout) beside the store's
piecewise encoding (now).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _harness import section

KEYS: dict[str, dict[str, Any]] = {
    "sk": {"role": "submitter", "member": "member-0", "max_priority": 100},
    "wk": {"role": "worker"},
}
SUB = {"Authorization": "Bearer sk"}
WRK = {"Authorization": "Bearer wk"}
GOAL_MS = 5.0


def _fill(path: Path, jobs: int) -> str:
    """Write ``jobs`` submits into a new SQLite store; return the id of the last one."""
    from prioqueue.store import Event, open_store

    store = open_store(f"sqlite:///{path}", synchronous="normal")
    try:
        epoch = store.claim()
        start = time.time() - 3600
        batch = []
        for i in range(1, jobs + 1):
            now = start + i * 1e-3
            args = {
                "now": now, "member": f"member-{i % 50}", "tier": "free",
                "priority": (0, 100, -100)[i % 3], "model": f"model-{i % 7}",
                "payload": {"prompt": i},
            }  # fmt: skip
            batch.append(Event(seq=i, op="submit", args=args, now=now))
        if batch:
            store.append(batch, epoch=epoch)
    finally:
        store.close()
    return f"job-{jobs}"


async def _median_ms(client: httpx.AsyncClient, path: str, headers: dict[str, str]) -> float:
    times: list[float] = []
    for _ in range(5):  # warm up
        r = await client.get(path, headers=headers)
        assert r.status_code == 200, r.text
    deadline = time.perf_counter() + 1.5
    while time.perf_counter() < deadline or len(times) < 20:
        t0 = time.perf_counter()
        await client.get(path, headers=headers)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


async def _measure(store: str, job_id: str | None) -> dict[str, float]:
    import prioqueue.broker.engine as engine_module
    from prioqueue.broker import create_app, parse_config

    app = create_app(parse_config({"keys": KEYS, "store": store}))
    out: dict[str, float] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
            out["status"] = await _median_ms(client, "/v1/status", WRK)
            if job_id is None:  # the baseline: a job alone in the queue
                r = await client.post("/v1/jobs", json={"payload": 1}, headers=SUB)
                job_id = r.json()["id"]
            out["job"] = await _median_ms(client, f"/v1/jobs/{job_id}", SUB)
            bound = engine_module.AHEAD_LIMIT
            engine_module.AHEAD_LIMIT = 1000  # type: ignore[misc]
            try:
                out["job_1000"] = await _median_ms(client, f"/v1/jobs/{job_id}", SUB)
            finally:
                engine_module.AHEAD_LIMIT = bound  # type: ignore[misc]
    return out


async def _loop_stall(encode: Any, state: Any) -> tuple[float, float]:
    """(longest event-loop stall, encoding seconds) while a thread encodes ``state``."""
    stop = False
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    await asyncio.to_thread(encode, state)
    took = time.perf_counter() - t0
    stop = True
    await task
    return worst, took


def _snapshot_stall(megabytes: int) -> None:
    import json

    from prioqueue.store.base import encode_in_pieces

    blob = "x" * (1 << 20)
    state = {
        "format": "prioqueue.broker/1",
        "jobs": [{"id": f"job-{i}", "payload": {"prompt": blob}} for i in range(megabytes)],
    }

    def whole(value: Any) -> str:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))

    section(f"a snapshot of {megabytes} x 1 MiB payloads encoded in the writer thread")
    base_stall, base_took = asyncio.run(_loop_stall(whole, state))
    stall, took = asyncio.run(_loop_stall(encode_in_pieces, state))
    print(f"{'encoding':<40} {'longest loop stall':>20} {'encode time':>12}")
    print(f"{'one json.dumps call (before, baseline)':<40} {base_stall * 1e3:>17.1f} ms "
          f"{base_took:>10.2f} s")  # fmt: skip
    print(f"{'encoded in pieces (now)':<40} {stall * 1e3:>17.1f} ms {took:>10.2f} s   "
          f"stall ratio {stall / base_stall:>5.3f}x")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="queued jobs")
    parser.add_argument("--snapshot-mib", type=int, default=200, help="payload MiB to encode")
    args = parser.parse_args()
    from prioqueue.broker.engine import AHEAD_LIMIT

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        empty = asyncio.run(_measure(f"sqlite:///{directory / 'empty.db'}", None))
        last = _fill(directory / "full.db", args.jobs)
        full = asyncio.run(_measure(f"sqlite:///{directory / 'full.db'}", last))
    section(f"reads on an idle broker (SQLite, in process), {args.jobs:,} queued")
    print(f"{'route':<52} {'queued':>10} {'empty (baseline)':>18}   ratio")
    rows = (
        ("GET /v1/status", "status"),
        (f"GET /v1/jobs/{{id}}, last job (ahead {AHEAD_LIMIT})", "job"),
        ("GET /v1/jobs/{id}, last job (ahead 1,000, before)", "job_1000"),
    )
    for label, key in rows:
        ratio = full[key] / empty[key] if empty[key] else float("inf")
        print(f"{label:<52} {full[key]:>7.2f} ms {empty[key]:>15.2f} ms   {ratio:>5.1f}x")
    _snapshot_stall(args.snapshot_mib)
    missed = [key for key in ("status", "job") if full[key] >= GOAL_MS]
    if missed:
        print(f"GOAL MISSED: {', '.join(missed)} at or over {GOAL_MS} ms")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
