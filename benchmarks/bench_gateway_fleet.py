"""The gateway over several upstreams: swaps under warm routing, and gated requests/s.

Processes, all on 127.0.0.1 and all started (and stopped, by pid) by this script: four fake
llama-swaps (``python -m prioqueue.gateway.fake_upstream``), the gateway in front of them
(``python -m prioqueue gateway`` with ``[[upstreams]]``), and the clients, in a process of
their own (``bench_gateway_fleet.py --client ...``, the keep-alive client of
``bench_gateway.py``).

1. **Swaps per 1,000 requests.** 1,000 chat completions of 10 ms each over 8 models with a
   skewed popularity (weights 1/rank: two hot models, a long tail), sent by 16 connections
   back to back, through the gateway with ``routing = "warm"`` (resident models and
   ``warm_hold``), then ``"round-robin"`` and ``"least-busy"`` (the same queue and fair share,
   blind to which model is loaded). A swap is a request that needed another model than the
   one loaded on its upstream (the gateway's per-upstream ``swaps``). Goal: warm routing at
   most half of least-busy's.
2. **Gated requests/s, 4 upstreams vs 1.** 64 connections sending 2 ms jobs back to back for
   a fixed window, through a gateway over one upstream, then over four. Goal: >= 3x.

Run: ``python benchmarks/bench_gateway_fleet.py`` (``nox -s bench -- bench_gateway_fleet``);
about a minute on two cores. Bounded: every phase has a deadline, the whole run an alarm;
needs the gateway extra.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_gateway as base
from _harness import section

PATH = "/v1/chat/completions"
MODELS = tuple(f"model-{i}" for i in range(8))
WEIGHTS = tuple(1 / (rank + 1) for rank in range(len(MODELS)))
SWAP_REQUESTS = 1000
SWAP_CONNECTIONS = 16
SWAP_JOB_SECONDS = 0.010
RATE_CONNECTIONS = 64
RATE_JOB_SECONDS = 0.002
RUN_DEADLINE = 400  # seconds: the whole run is killed past this (signal.alarm)


def _request(port: int, model: str, seconds: float) -> bytes:
    return base.chat_request(port, model, seconds)


# -- the client process ----------------------------------------------------------------------


async def _fixed(port: int, connections: int, total: int, seed: int) -> dict[str, Any]:
    """Send ``total`` requests (models drawn with ``seed``) over ``connections``."""
    rng = random.Random(seed)
    models = rng.choices(MODELS, weights=WEIGHTS, k=total)
    queue = list(reversed(models))
    done = errors = 0

    async def one() -> None:
        nonlocal done, errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while queue:
                writer.write(_request(port, queue.pop(), SWAP_JOB_SECONDS))
                status, _ = await base._read_response(reader)
                if 200 <= status < 300:
                    done += 1
                else:
                    errors += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(connections))), 300)
    return {"done": done, "errors": errors, "seconds": time.perf_counter() - started}


async def _window(port: int, connections: int, seconds: float) -> dict[str, Any]:
    """Send 2 ms jobs back to back; count the completions inside a window of ``seconds``."""
    done = errors = 0
    measuring = False
    stop = asyncio.Event()

    async def one(index: int) -> None:
        nonlocal done, errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = _request(port, MODELS[index % 2], RATE_JOB_SECONDS)
        try:
            while not stop.is_set():
                writer.write(request)
                status, _ = await base._read_response(reader)
                if measuring and not stop.is_set():
                    if 200 <= status < 300:
                        done += 1
                    else:
                        errors += 1
        except (OSError, asyncio.IncompleteReadError, ValueError):
            if not stop.is_set():
                errors += 1
        finally:
            writer.close()

    tasks = [asyncio.ensure_future(one(i)) for i in range(connections)]
    await asyncio.sleep(1.0)  # warm up: every connection has a request out
    measuring = True
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - started
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"rps": done / elapsed, "done": done, "errors": errors}


def _client_main(argv: list[str]) -> None:
    kind, port = argv[0], int(argv[1])
    if kind == "fixed":
        result = asyncio.run(_fixed(port, int(argv[2]), int(argv[3]), int(argv[4])))
    else:
        result = asyncio.run(_window(port, int(argv[2]), float(argv[3])))
    print(json.dumps(result))


def _clients(*args: object) -> dict[str, Any]:
    return base.client_process(__file__, [str(a) for a in args], 330)


# -- the driver ------------------------------------------------------------------------------


def _gateway(
    tmp: Path, fakes: list[int], *, routing: str = "warm", models: tuple[str, ...] = MODELS
) -> tuple[subprocess.Popen[bytes], int]:
    port = base._free_port()
    lines = [
        f'listen = "127.0.0.1:{port}"',
        "allow_anonymous = true",
        "anonymous_observer = true",
        f'routing = "{routing}"',
        "[limits]",
        "max_queued = 100000",
        "max_queued_per_member = 100000",
    ]
    for index, fake in enumerate(fakes):
        lines += [
            "[[upstreams]]",
            f'url = "http://127.0.0.1:{fake}"',
            f'name = "gpu{index}"',
            f"models = {json.dumps(list(models))}",
        ]
    config = tmp / f"gw-{port}.toml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["-m", "prioqueue", "gateway", "--config", str(config), "--no-access-log"]
    return base._start([*args, "--log-level", "warning"], port), port


def _unload(fakes: list[int]) -> None:
    for fake in fakes:
        with contextlib.suppress(OSError):
            _post(fake, "/unload")


def _post(port: int, path: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n"
        sock.sendall(head.encode() + b"\r\n")
        while sock.recv(65536):
            pass


def _fleet_status(port: int) -> list[dict[str, Any]]:
    status, body = base._get(port, "/prioqueue/status?limit=0")
    if status != 200:
        raise RuntimeError(f"status answered {status}")
    fleet: list[dict[str, Any]] = json.loads(body)["fleet"]
    return fleet


def _swaps(tmp: Path, fakes: list[int], seed: int) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for routing in ("warm", "round-robin", "least-busy"):
        _unload(fakes)
        gateway, port = _gateway(tmp, fakes, routing=routing)
        try:
            time.sleep(0.5)  # the first health polls
            run = _clients("fixed", port, SWAP_CONNECTIONS, SWAP_REQUESTS, seed)
            fleet = _fleet_status(port)
        finally:
            base._stop(gateway)
        swaps = sum(u["swaps"] for u in fleet)
        run["swaps_per_1000"] = 1000 * swaps / max(1, run["done"])
        run["spread"] = [u["granted"] for u in fleet]
        results[routing] = run
    return results


def _rate(tmp: Path, fakes: list[int], seconds: float) -> dict[int, dict[str, Any]]:
    results: dict[int, dict[str, Any]] = {}
    for count in (1, len(fakes)):
        gateway, port = _gateway(tmp, fakes[:count], models=MODELS[:2])
        try:
            time.sleep(0.5)
            results[count] = _clients("window", port, RATE_CONNECTIONS, seconds)
        finally:
            base._stop(gateway)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--client", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=4.0, help="rate window (default 4)")
    parser.add_argument("--seed", type=int, default=1, help="model draw seed (default 1)")
    args = parser.parse_args()
    if args.client:
        _client_main(args.client)
        return 0
    signal.alarm(RUN_DEADLINE)
    base._raise_nofile()
    fakes: list[subprocess.Popen[bytes]] = []
    ports = [base._free_port() for _ in range(4)]
    try:
        for port in ports:
            command = ["-m", "prioqueue.gateway.fake_upstream", "--quiet"]
            fakes.append(base._start([*command, "--listen", f"127.0.0.1:{port}"], port))
        with tempfile.TemporaryDirectory() as directory:
            tmp = Path(directory)
            swaps = _swaps(tmp, ports, args.seed)
            rate = _rate(tmp, ports, args.seconds)
    finally:
        for process in fakes:
            base._stop(process)
    section(
        f"Swaps per 1,000 requests: 4 upstreams, {len(MODELS)} models (weights 1/rank), "
        f"{SWAP_CONNECTIONS} connections, {SWAP_JOB_SECONDS * 1000:g} ms jobs"
    )
    least = swaps["least-busy"]["swaps_per_1000"]
    for routing, run in swaps.items():
        print(
            f"{routing:12} {run['swaps_per_1000']:7.1f} swaps/1000  "
            f"({run['swaps_per_1000'] / least:4.2f}x least-busy)  errors {run['errors']}  "
            f"{run['seconds']:5.1f} s  requests per upstream {run['spread']}"
        )
    print("goal: warm <= 0.5x least-busy")
    section(
        f"Gated requests/s: {RATE_CONNECTIONS} connections, {RATE_JOB_SECONDS * 1000:g} ms jobs"
    )
    one = rate[1]["rps"]
    for count, run in rate.items():
        print(
            f"{count} upstream{'s' if count > 1 else ' '}  {run['rps']:7.1f} req/s  "
            f"({run['rps'] / one:4.2f}x one upstream)  errors {run['errors']}"
        )
    print("goal: 4 upstreams >= 3x one")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
