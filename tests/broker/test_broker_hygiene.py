"""Issue 21 item 3 and the broker's start-up lows, against `prioqueue broker` as a process.

Connection hygiene: an idle and a slow-header connection are closed after the header
timeout, oversized or too many headers are a 431, a late body a 408 (in process), the
connection past ``max_connections`` a 503; "listening" is printed once the broker
accepts; a broker that cannot start says so in one line; no configuration, no start.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from .broker_helpers import free_port

_MAIN = "import sys; from prioqueue.cli import main; sys.exit(main(sys.argv[1:]))"
CONFIG = """\
listen = "127.0.0.1:{port}"
store = "{store}"
[connections]
header_timeout = 0.5
body_timeout = 30.0
max_connections = 6
[keys."wk"]
role = "worker"
workers_prefix = "gpu-"
"""


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _MAIN, "broker", "--config", str(config), "--no-access-log"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, text: str) -> None:
    """Wait (bounded) until ``text`` is in the log or the process exits."""
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace") or proc.poll() is not None:
            return
        time.sleep(0.02)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    config = tmp_path / "broker.toml"
    config.write_text(CONFIG.format(port=port, store="memory://"), encoding="utf-8")
    log = tmp_path / "broker.log"
    proc = _start(config, log)
    try:
        _wait_for_line(proc, log, "listening on")
        # Said once it accepts: a connection made right after the line is served.
        with _connect(port) as sock:
            sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: b\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 401"), log.read_text()
        yield port
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)  # far past the 0.5 s limits: only a hung broker reaches it
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the broker sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_idle_and_slow_header_connections_are_closed(broker: int) -> None:
    with _connect(broker) as idle, _connect(broker) as slow:
        slow.sendall(b"GET /v1/status HTTP/1.1\r\nHost: b\r\nX-Slow: ")
        for _ in range(3):
            slow.sendall(b"a")  # a header fed a byte at a time never completes
        assert _answer(idle) == b""
        assert _answer(slow) == b""


def test_oversized_or_too_many_headers_are_431(broker: int) -> None:
    huge = b"GET /v1/status HTTP/1.1\r\nHost: b\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    many = b"GET /v1/status HTTP/1.1\r\nHost: b\r\n" + b"X-H: 1\r\n" * 1000 + b"\r\n"
    for request in (huge, many):
        with _connect(broker) as sock:
            sock.sendall(request)
            assert _answer(sock).startswith(b"HTTP/1.1 431")


def test_a_431_survives_the_rest_of_the_request(broker: int) -> None:
    """A client still sending a huge head when the broker refuses it gets the 431: the broker
    drops the rest instead of closing under it (closed at once, the kernel answers the unread
    bytes with a reset, and the client's send and read fail without the answer)."""
    head = b"GET /v1/status HTTP/1.1\r\nHost: b\r\nX-Big: " + b"a" * 4_000_000 + b"\r\n\r\n"
    with _connect(broker) as sock:
        sock.sendall(head)
        assert _answer(sock).startswith(b"HTTP/1.1 431")


def test_a_late_body_is_408() -> None:
    import asyncio

    import httpx

    from .broker_helpers import SUBMITTER, api, run

    async def scenario() -> None:
        async with api(connections={"body_timeout": 0.2}) as a:
            never = asyncio.Event()

            async def stalled() -> AsyncIterator[bytes]:
                yield b"{"
                await never.wait()

            r = await a.client.post(
                "/v1/jobs",
                content=stalled(),
                headers={**SUBMITTER, "Content-Type": "application/json"},
                timeout=httpx.Timeout(30),
            )
            assert r.status_code == 408
            assert "body_timeout=0.2" in r.json()["error"]

    run(scenario())


_BUSY = (
    b"POST /v1/jobs HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{"
)


def test_the_connection_past_max_connections_is_503_and_closed(broker: int) -> None:
    import contextlib

    with contextlib.ExitStack() as stack:
        for _ in range(6):  # the cap, every one busy: its request waits for its body
            sock = stack.enter_context(_connect(broker))
            sock.sendall(_BUSY)
        with _connect(broker) as extra:
            answer = _answer(extra)
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert b"retry-after: 2" in answer
    assert b"retry later" in answer


def test_a_broker_that_cannot_start_says_so_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    db.write_bytes(b"this is not an SQLite database" * 100)
    config = tmp_path / "broker.toml"
    config.write_text(CONFIG.format(port=free_port(), store=f"sqlite:///{db}"), encoding="utf-8")
    log = tmp_path / "broker.log"
    proc = _start(config, log)
    assert proc.wait(timeout=60) == 1
    text = log.read_text()
    assert "prioqueue broker: cannot start:" in text
    assert "Traceback" not in text
    assert "listening" not in text
    said = [line for line in text.splitlines() if not line.startswith("INFO:")]
    assert len(said) == 1, text  # the one line, nothing after it


def test_no_configuration_no_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _MAIN, "broker"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 2
    assert "no configuration: pass --config FILE" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no prioqueue-broker.db left behind
