"""The gateway's added latency and throughput, against the fake upstream called directly.

Three processes: the fake llama-swap, the gateway in front of it (``prioqueue gateway``), and
this script as the client. The client is a minimal asyncio HTTP/1.1 client (one write per
request, keep-alive) so that its own cost stays small and the same for both targets.

* Latency: one connection, sequential tiny chat completions, alternating rounds against the
  upstream directly and through the gateway; p50 and p99 of each and the difference.
* Throughput: many connections at once for a fixed time, requests/s of each target. Through
  the gateway every request is gated (one at a time at the upstream), so this is the rate at
  which the gateway can hand the GPU from one request to the next.

Run: ``python benchmarks/bench_gateway.py`` (``nox -s bench``). Needs the gateway extra.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _harness import section

ROOT = Path(__file__).resolve().parent.parent
BODY = b'{"model":"model-a","messages":[{"role":"user","content":"hi"}]}'
PATH = "/v1/chat/completions"
ROUNDS = 10
PER_ROUND = 200
CONNECTIONS = 32
SECONDS = 3.0
TARGET_P50_MS = 2.0
TARGET_RPS = 500.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _request(port: int) -> bytes:
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    )
    return head.encode() + BODY


class Connection:
    """One keep-alive HTTP/1.1 connection that sends a fixed request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int):
        self.reader = reader
        self.writer = writer
        self.request = _request(port)

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, port)

    async def call(self) -> int:
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return status

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _start(args: list[str], port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            if process.poll() is not None:
                error = process.stderr.read().decode() if process.stderr else "died"
                raise RuntimeError(error) from None
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{args} did not start")


async def _latencies(port: int, count: int) -> list[float]:
    connection = await Connection.open(port)
    out = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            status = await connection.call()
            out.append(time.perf_counter() - start)
            assert status == 200, status
    finally:
        await connection.close()
    return out


async def _throughput(port: int, connections: int, seconds: float) -> float:
    clients = [await Connection.open(port) for _ in range(connections)]
    done = 0
    stop = time.perf_counter() + seconds

    async def loop(connection: Connection) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            status = await connection.call()
            assert status == 200, status
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop(c) for c in clients))
    elapsed = time.perf_counter() - start
    for connection in clients:
        await connection.close()
    return done / elapsed


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _main(upstream: int, gateway: int) -> tuple[float, float]:
    await _latencies(upstream, 200)  # warm up both
    await _latencies(gateway, 200)
    direct: list[float] = []
    gated: list[float] = []
    for _ in range(ROUNDS):
        direct += await _latencies(upstream, PER_ROUND)
        gated += await _latencies(gateway, PER_ROUND)
    section(f"Latency: {len(direct)} sequential tiny chat completions each, one connection")
    d50, d99 = statistics.median(direct), _pct(direct, 0.99)
    g50, g99 = statistics.median(gated), _pct(gated, 0.99)
    print(f"{'direct to the fake upstream':<34} p50 {d50 * 1e3:7.3f} ms   p99 {d99 * 1e3:7.3f} ms")
    print(f"{'through the gateway':<34} p50 {g50 * 1e3:7.3f} ms   p99 {g99 * 1e3:7.3f} ms")
    overhead = g50 - d50
    print(
        f"{'added by the gateway':<34} p50 {overhead * 1e3:7.3f} ms   "
        f"p99 {(g99 - d99) * 1e3:7.3f} ms   (target: p50 < {TARGET_P50_MS} ms)"
    )
    section(f"Throughput: {CONNECTIONS} connections for {SECONDS:g} s each")
    direct_rps = await _throughput(upstream, CONNECTIONS, SECONDS)
    gated_rps = await _throughput(gateway, CONNECTIONS, SECONDS)
    print(f"{'direct to the fake upstream':<34} {direct_rps:8.0f} requests/s")
    print(
        f"{'through the gateway (all gated)':<34} {gated_rps:8.0f} requests/s   "
        f"ratio {gated_rps / direct_rps:.2f}   (target: >= {TARGET_RPS:g}/s)"
    )
    return overhead, gated_rps


def main() -> int:
    upstream_port, gateway_port = _free_port(), _free_port()
    upstream = _start(
        [
            "-m",
            "prioqueue.gateway.fake_upstream",
            "--listen",
            f"127.0.0.1:{upstream_port}",
            "--quiet",
        ],
        upstream_port,
    )
    try:
        gateway = _start(
            [
                "-m",
                "prioqueue.cli",
                "gateway",
                "--upstream",
                f"http://127.0.0.1:{upstream_port}",
                "--listen",
                f"127.0.0.1:{gateway_port}",
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            gateway_port,
        )
        try:
            overhead, rps = asyncio.run(_main(upstream_port, gateway_port))
        finally:
            gateway.terminate()
            gateway.wait(10)
    finally:
        upstream.terminate()
        upstream.wait(10)
    ok = overhead * 1e3 < TARGET_P50_MS and rps >= TARGET_RPS
    print()
    print("targets met" if ok else "TARGETS MISSED (noisy machine? rerun)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
