"""The gateway under a huge request header: how long until the 431, and what it costs others.

A client sends ``POST`` with one header of 16 or 64 MiB (issue 21: 64 MiB took 3.5 s of event
loop before the 431). Measured, on loopback, with the gateway and a fake llama-swap in this
process's threads (as the tests run them):

* **time to 431**: from the first byte of the header to the 431 (the client keeps sending
  until the gateway closes the connection);
* **bytes sent**: how much of the header the client could send before the connection was
  closed (the gateway reads about `max_headers_bytes`; the rest fills the socket buffers);
* **a normal request meanwhile**: the slowest of the pass-through requests another client
  sends while the huge header arrives (the event loop's stall), beside the slowest of the
  same requests with no huge header in flight (the baseline, same run).

Run: ``python benchmarks/bench_gateway_headers.py`` (``nox -s bench -- bench_gateway_headers``);
a few seconds; needs the gateway extra.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
from _harness import section

from prioqueue.gateway import Gateway, parse_config
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

SIZES = (16 * 1024 * 1024, 64 * 1024 * 1024)
PROBES = 40


def _huge_header(url: str, size: int) -> tuple[float, int, bytes]:
    """Send a header of ``size`` bytes; return seconds to the answer, bytes sent, answer."""
    parts = urlsplit(url)
    assert parts.port is not None
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    chunk = b"a" * 65536
    sent = 0
    start = time.perf_counter()
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ")
        while sent < size:
            sock.sendall(chunk)
            sent += len(chunk)
        sock.sendall(b"\r\n\r\n")
    except OSError:
        pass  # closed by the gateway: it had seen enough
    answer = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    except OSError:
        pass
    seconds = time.perf_counter() - start
    sock.close()
    return seconds, sent, answer[:40]


def _probe(client: httpx.Client, stop: threading.Event, worst: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        client.get("/v1/models")
        worst.append(time.perf_counter() - start)
        time.sleep(0.005)


def _worst_during(client: httpx.Client, work: Callable[[], object]) -> float:
    stop = threading.Event()
    seen: list[float] = []
    thread = threading.Thread(target=_probe, args=(client, stop, seen))
    thread.start()
    try:
        work()
    finally:
        stop.set()
        thread.join()
    return max(seen) if seen else 0.0


def main() -> None:
    fake = FakeLlamaSwap()
    with ServerThread(fake) as upstream:
        gateway = Gateway(parse_config({"allow_anonymous": True}, upstream=upstream.url))
        with (
            ServerThread(gateway, limits=gateway.config.limits) as front,
            httpx.Client(base_url=front.url, timeout=60) as client,
        ):
            client.get("/v1/models")
            baseline = _worst_during(client, lambda: time.sleep(1.0))
            section("a huge request header (one header, never valid)")
            print(f"{'header':>8} {'to 431':>9} {'bytes sent':>12}  slowest other request")
            for size in SIZES:
                result: list[tuple[float, int, bytes]] = []

                def attack(
                    size: int = size, result: list[tuple[float, int, bytes]] = result
                ) -> None:
                    result.append(_huge_header(front.url, size))

                worst = _worst_during(client, attack)
                seconds, sent, answer = result[0]
                status = answer.split(b"\r\n", 1)[0].decode("latin-1")
                print(
                    f"{size >> 20:>5} MiB {seconds * 1000:>7.1f} ms {sent:>12,}  "
                    f"{worst * 1000:.1f} ms vs {baseline * 1000:.1f} ms with no huge header "
                    f"(ratio {worst / baseline:.1f}x)   [{status}]"
                )


if __name__ == "__main__":
    main()
