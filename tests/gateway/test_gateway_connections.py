"""Connection hygiene (issue 21, item 10): huge headers fail fast, idle sockets cannot lock out.

Every test talks to real servers on loopback, with bounded timeouts; none asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from prioqueue._service.serving import ConnectionLimits
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

from .gateway_helpers import CHAT, StackFactory, chat, run, wait_for


def _connect(url: str, timeout: float = 10) -> socket.socket:
    address = urlsplit(url)
    assert address.port is not None
    return socket.create_connection((address.hostname, address.port), timeout=timeout)


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except ConnectionResetError:
        return data


def test_a_header_that_never_ends_is_431_as_soon_as_it_is_too_big(
    make_stack: StackFactory,
) -> None:
    # The header is never finished: a parser that waits for it to end answers nothing and the
    # connection dies silently at header_timeout. Counting bytes as they arrive answers 431.
    stack = make_stack({"limits": {"header_timeout": 3}})
    with _connect(stack.url) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:
            while sent < 4 * 1024 * 1024:
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError:
            pass  # the gateway closed the connection: it had seen enough
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert stack.fake.requests == 0


def test_headers_within_the_limits_still_pass_with_a_body_in_the_same_read(
    make_stack: StackFactory,
) -> None:
    # Head and a large body arrive together: only the head's bytes count against the cap.
    stack = make_stack()
    body = json.dumps({**chat(), "pad": "x" * 500_000}).encode()
    extra = "".join(f"X-H{i}: {'b' * 300}\r\n" for i in range(90))  # ~28 KiB of headers
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    ).encode()
    with _connect(stack.url) as sock:
        sock.sendall(head + body)
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:80]


def test_the_oldest_idle_connections_are_closed_for_new_ones(make_stack: StackFactory) -> None:
    stack = make_stack({"limits": {"header_timeout": 60, "max_idle_connections": 5}})
    idle = [_connect(stack.url) for _ in range(10)]
    try:
        with httpx.Client(base_url=stack.url, timeout=10) as client:
            assert client.post(CHAT, json=chat()).status_code == 200
        for sock in idle[:5]:
            sock.settimeout(10)
            assert _read_all(sock) == b""  # closed by the gateway, without a word
        for sock in idle[-4:]:
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)  # still open (nothing to read, not closed)
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_over_max_connections_is_503_when_none_is_idle(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(
        {"limits": {"max_connections": 4, "max_idle_connections": 10, "header_timeout": 60}}
    )

    async def main() -> bytes:
        async with httpx.AsyncClient(
            base_url=stack.url, timeout=30, limits=httpx.Limits(max_connections=10)
        ) as client:
            busy = [
                asyncio.ensure_future(client.post(CHAT, json=chat(hold="go"))) for _ in range(4)
            ]
            await wait_for(lambda: len(stack.gateway.dispatcher) == 3)  # one runs, three wait
            with _connect(stack.url) as sock:
                answer = await asyncio.to_thread(_read_all, sock)
            stack.fake.release("go")
            assert [r.status_code for r in await asyncio.gather(*busy)] == [200] * 4
            return answer

    answer = run(main())
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:80]
    assert b"retry-after: 5" in answer


def test_connection_limits_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="max_connections must be an int >= 1"):
        ConnectionLimits(max_connections=0)
    with pytest.raises(ValueError, match="header_timeout must be a number > 0"):
        ConnectionLimits(header_timeout=-1)
    assert ConnectionLimits(max_connections=10).connection_caps() == (10, 5)


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_idle_sockets_past_the_file_limit_do_not_lock_legitimate_clients_out(
    tmp_path: Path,
) -> None:
    # The case: the open-file limit is small and more idle sockets than it arrive
    # than the header timeout would close in time. Without caps accept() fails (EMFILE) and
    # a legitimate request waits for header_timeout (60 s here); with them it is served.
    import resource

    fake = FakeLlamaSwap()
    with ServerThread(fake) as upstream:
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'upstream = "{upstream.url}"\nallow_anonymous = true\n[limits]\nheader_timeout = 60\n'
        )

        def small_file_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
        command = [sys.executable, "-m", "prioqueue", "gateway", "--config", str(config)]
        command += ["--listen", "127.0.0.1:0", "--no-access-log", "--log-level", "error"]
        process = subprocess.Popen(
            command,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            preexec_fn=small_file_limit,  # noqa: PLW1509 - only sets the child's limit
        )
        sockets: list[socket.socket] = []
        try:
            assert process.stderr is not None
            line = process.stderr.readline().decode()
            found = re.search(r"listening on (http://[\d.:]+)", line)
            assert found, line
            url = found.group(1)
            for _ in range(300):
                sockets.append(_connect(url))
            with httpx.Client(base_url=url, timeout=8) as client:
                response = client.post(CHAT, json=chat())
            assert response.status_code == 200
        finally:
            for sock in sockets:
                sock.close()
            process.terminate()
            process.wait(60)
            if process.stderr is not None:
                process.stderr.close()


@pytest.mark.parametrize("path", [CHAT, "/v1/models"])  # gated and pass-through
def test_a_forwarded_response_has_one_date_and_one_server_header(
    make_stack: StackFactory, path: str
) -> None:
    stack = make_stack()
    body = json.dumps(chat()).encode()
    method = "POST" if path == CHAT else "GET"
    with _connect(stack.url) as sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        answer = _read_all(sock)
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower().split("\r\n")
    assert head[0].startswith("http/1.1 200")
    names = [line.split(":", 1)[0] for line in head[1:]]
    assert names.count("date") == 1, head
    assert names.count("server") == 1, head
