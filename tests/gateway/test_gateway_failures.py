"""Every failure the issue lists, each against real servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Iterator
from pathlib import Path

import httpx

from prioqueue.gateway.fake_upstream import bind_loopback

from .gateway_helpers import CHAT, StackFactory, chat, queued, raw_post, run, status, wait_for


async def _hold(client: httpx.AsyncClient, gate: str = "gpu") -> asyncio.Task[httpx.Response]:
    """Start a request that holds the GPU at the fake's gate; return once it runs."""
    task = asyncio.ensure_future(client.post(CHAT, json=chat(hold=gate, tag="holder")))

    async def running() -> bool:
        return (await status(client))["running"] is not None

    await wait_for(running)
    return task


def test_queue_full_is_429_with_retry_after(make_stack: StackFactory) -> None:
    stack = make_stack({"limits": {"max_queued": 2}})

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            holder = await _hold(client)
            waiting = [asyncio.ensure_future(client.post(CHAT, json=chat())) for _ in range(2)]
            await wait_for(lambda: _eq(queued(client), 2))
            full = await client.post(CHAT, json=chat())
            assert full.status_code == 429
            assert int(full.headers["retry-after"]) >= 1
            assert full.json()["error"]["type"] == "queue_full"
            stack.fake.release("gpu")
            assert [r.status_code for r in [await holder, *await asyncio.gather(*waiting)]] == [
                200
            ] * 3

    run(go())


async def _eq(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


def test_waiting_past_the_level_limit_is_503(make_stack: StackFactory) -> None:
    stack = make_stack(
        {
            "anonymous_max_priority": 100,
            "limits": {"max_wait_seconds": {"interactive": 0.2, "default": 0}},
        }
    )

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            holder = await _hold(client)
            patient = asyncio.ensure_future(client.post(CHAT, json=chat(tag="patient")))
            # level 0 is not listed and "default" is 0 (no limit): it waits as long as needed
            await wait_for(lambda: _eq(queued(client), 1))
            # An interactive request queued after it times out at its level's 0.2 s: by its
            # answer the patient one has waited longer than that, and still waits.
            urgent = {"x-llamaswap-priority": "interactive"}
            hurried = await client.post(CHAT, json=chat(tag="hurried"), headers=urgent)
            assert hurried.status_code == 503
            assert await queued(client) == 1
            assert not patient.done()
            stack.fake.release("gpu")
            assert (await holder).status_code == 200
            assert (await patient).status_code == 200

    run(go())
    limited = make_stack({"limits": {"max_wait_seconds": 0.2, "retry_after_seconds": 7}})

    async def go_limited() -> None:
        async with httpx.AsyncClient(base_url=limited.url, timeout=10) as client:
            holder = await _hold(client)
            late = await client.post(CHAT, json=chat(tag="late"))
            assert late.status_code == 503
            assert late.headers["retry-after"] == "7"
            job = (await client.get("/prioqueue/jobs/" + late.headers["x-prioqueue-job"])).json()
            assert job["outcome"] == "timed out in the queue"
            limited.fake.release("gpu")
            assert (await holder).status_code == 200

    run(go_limited())
    assert "late" not in limited.fake.order()


def test_disconnect_while_queued_removes_the_job(make_stack: StackFactory) -> None:
    stack = make_stack()
    port = int(stack.url.rsplit(":", 1)[1])

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            holder = await _hold(client)
            _, writer = await raw_post(f"http://127.0.0.1:{port}", chat(tag="gone"))
            await wait_for(lambda: _eq(queued(client), 1))
            writer.close()
            await wait_for(lambda: _eq(queued(client), 0))
            stack.fake.release("gpu")
            assert (await holder).status_code == 200
            after = await client.post(CHAT, json=chat(tag="after"))
            assert after.status_code == 200

    run(go())
    assert stack.fake.order() == ["holder", "after"]


def test_disconnect_while_streaming_cancels_upstream_and_frees_gpu(
    make_stack: StackFactory,
) -> None:
    # llama-server behind llama-swap stops a request whose connection closes: `aborts`.
    stack = make_stack({"aborts": True}, token_seconds=0.05, aborts=True)
    port = int(stack.url.rsplit(":", 1)[1])

    async def go() -> None:
        reader, writer = await raw_post(
            f"http://127.0.0.1:{port}", {**chat(tag="streamer", tokens=200), "stream": True}
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert b"data: " in await reader.readuntil(b"\n\n")  # streaming has begun
        writer.close()
        await wait_for(
            lambda: bool(stack.fake.served) and stack.fake.served[0].finished is not None
        )
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            nxt = await client.post(CHAT, json=chat(tag="next"))
            assert nxt.status_code == 200
            state = await status(client)
            assert state["running"] is None
            assert state["cancelled"] == 1

    run(go())
    assert stack.fake.served[0].cancelled
    assert stack.fake.max_active == 1


def test_upstream_unreachable_is_502_and_frees_gpu(make_stack: StackFactory) -> None:
    sock = bind_loopback()  # a port nobody accepts on: listening closed at once
    port = sock.getsockname()[1]
    sock.close()
    stack = make_stack(upstream=f"http://127.0.0.1:{port}")

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            for _ in range(2):  # the second one proves the GPU was freed
                response = await client.post(CHAT, json=chat())
                assert response.status_code == 502
                assert "x-prioqueue-job" in response.headers
            assert (await client.get("/v1/models")).status_code == 502
            assert (await status(client))["running"] is None

    run(go())


def test_upstream_5xx_is_502_and_frees_gpu(make_stack: StackFactory) -> None:
    stack = make_stack()
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        response = client.post(CHAT, json=chat(status=500))
        assert response.status_code == 502
        assert response.headers["x-prioqueue-upstream-status"] == "500"
        assert "fake error 500" in response.json()["error"]["message"]
        assert client.post(CHAT, json=chat(status=404)).status_code == 404  # kept
        assert client.post(CHAT, json=chat()).status_code == 200


def test_running_past_the_lease_is_504_and_frees_gpu(make_stack: StackFactory) -> None:
    # The lease is every request's: 2 s, so that the next one (granted when the slow one is
    # cut) is answered inside its own on a busy machine; the slow one would take 30 s.
    stack = make_stack({"aborts": True, "limits": {"lease_seconds": 2.0}}, aborts=True)

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
            slow = asyncio.ensure_future(client.post(CHAT, json=chat(tag="slow", seconds=30)))
            await wait_for(lambda: _eq(_running(client), 1))
            waiting = asyncio.ensure_future(client.post(CHAT, json=chat(tag="next")))
            response = await slow
            assert response.status_code == 504
            assert (await waiting).status_code == 200
            job = (
                await client.get("/prioqueue/jobs/" + response.headers["x-prioqueue-job"])
            ).json()
            assert job["outcome"] == "lease expired"
            assert (await status(client))["expired"] == 1

    run(go())
    assert stack.fake.served[0].cancelled
    # No max_active check here: an expired lease frees the GPU at its deadline, and the
    # upstream learns of the aborted request asynchronously (it reads the closed connection),
    # so it may still count the aborted request for a moment while the next one arrives. A
    # real model server behaves the same; the lease is the bound, by design.


async def _running(client: httpx.AsyncClient) -> int:
    return 0 if (await status(client))["running"] is None else 1


@contextlib.contextmanager
def _gateway_process(
    upstream: str, tmp_path: Path, limits: str, module: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, list[str]]]:
    """Run ``python -m <module> gateway`` on a free port in front of ``upstream``.

    Yields the process, its URL and a list that receives its output once it ended; the
    block must make it exit (SIGTERM), with status 0.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "gw.toml"
    config.write_text(
        f'upstream = "{upstream}"\nlisten = "127.0.0.1:{port}"\nallow_anonymous = true\n'
        f"[limits]\n{limits}",
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", module, "gateway", "--config", str(config),
         "--log-level", "warning"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    output: list[str] = []
    try:
        yield process, f"http://127.0.0.1:{port}", output
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        output.append(process.stdout.read().decode())
        process.stdout.close()


async def _started(client: httpx.AsyncClient) -> None:
    """Wait until a gateway process answers (its start is slow on a busy machine)."""

    async def up() -> bool:
        try:
            await client.get("/prioqueue/status")
        except httpx.TransportError:
            return False
        return True

    await wait_for(up, timeout=60)


def test_sigterm_fails_queued_requests_and_exits_cleanly(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack = make_stack()  # only its fake upstream is used here
    limits = "shutdown_grace_seconds = 5\nretry_after_seconds = 2\n"

    async def go(url: str, process: subprocess.Popen[bytes]) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            await _started(client)
            holder = await _hold(client)
            waiting = [
                asyncio.ensure_future(client.post(CHAT, json=chat(tag=f"q{i}"))) for i in range(3)
            ]
            await wait_for(lambda: _eq(queued(client), 3))
            process.send_signal(signal.SIGTERM)
            for response in await asyncio.gather(*waiting):
                assert response.status_code == 503
                assert response.headers["retry-after"] == "2"
            stack.fake.release("gpu")  # the running one may finish within the grace period
            assert (await holder).status_code == 200

    with _gateway_process(stack.upstream, tmp_path, limits, "prioqueue.cli") as (process, url, _):
        run(go(url, process), timeout=90)
    assert stack.fake.order() == ["holder"]


def test_command_runs_in_process_until_sigterm(make_stack: StackFactory) -> None:
    import threading
    import time

    from prioqueue.cli import main

    stack = make_stack()
    sock = bind_loopback()
    port = sock.getsockname()[1]
    sock.close()
    seen: list[int] = []

    def client() -> None:
        deadline = time.monotonic() + 60  # "hung", not "slow"
        while time.monotonic() < deadline:
            try:
                response = httpx.post(f"http://127.0.0.1:{port}{CHAT}", json=chat(), timeout=5)
                seen.append(response.status_code)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=client)
    thread.start()
    code = main(["gateway", "--upstream", stack.upstream, "--listen", f"127.0.0.1:{port}",
                 "--log-level", "warning", "--no-access-log"])  # fmt: skip
    thread.join(10)
    assert code == 0
    assert seen == [200]


def test_a_request_past_the_shutdown_grace_gets_a_clear_503(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack = make_stack()  # only its fake upstream is used here

    async def go(url: str, process: subprocess.Popen[bytes]) -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            await _started(client)
            holder = await _hold(client, gate="forever")
            process.send_signal(signal.SIGTERM)
            return await holder

    limits = "shutdown_grace_seconds = 1\n"
    with _gateway_process(stack.upstream, tmp_path, limits, "prioqueue") as (process, url, out):
        response = run(go(url, process), timeout=90)
    (output,) = out
    assert response.status_code == 503
    assert "shut down before this request could finish" in response.json()["error"]["message"]
    assert "Traceback" not in output
