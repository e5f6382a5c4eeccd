"""Helpers and fixtures for the gateway tests: a fake llama-swap and the gateway, both real servers.

Both run under uvicorn in background threads on free loopback ports; the tests talk to them
over HTTP. Everything here has bounded timeouts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs
import httpx
import pytest

from prioqueue.gateway import Gateway, parse_config
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

CHAT = "/v1/chat/completions"

KEYS = {
    "k-alice": {"member": "alice"},
    "k-bob": {"member": "bob"},
    "k-watch": {"member": "watch", "observer": True},
    "k-root": {"member": "root", "admin": True},
}
"""API keys of the tests of who sees what: two members, an observer and an admin."""


def as_key(key: str, group: str | None = None) -> dict[str, str]:
    """The headers of a request with API key ``key`` (and ``X-Prioqueue-Group``)."""
    headers = {"authorization": f"Bearer {key}"}
    if group is not None:
        headers["x-prioqueue-group"] = group
    return headers


def keyed_config(**extra: Any) -> dict[str, Any]:
    """A gateway configuration with :data:`KEYS` and no anonymous access."""
    return {"allow_anonymous": False, "anonymous_observer": False, "keys": KEYS, **extra}


async def hold_as(
    client: httpx.AsyncClient, stack: Stack, key: str, group: str | None = None
) -> asyncio.Future[httpx.Response]:
    """Send a request (API key ``key``) that holds the GPU at the fake's gate "go"; return once
    the upstream runs it."""
    first = asyncio.ensure_future(
        client.post(CHAT, json=chat(hold="go"), headers=as_key(key, group))
    )
    await wait_for(lambda: stack.fake.active == 1)
    return first


async def raw_post(url: str, body: dict[str, Any]) -> tuple[Any, Any]:
    """Send a chat request over a bare connection (no client library); return its streams."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(body).encode()
    writer.write(
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    return reader, writer


class JumpClock:
    """The gateway's clock in tests: monotonic time plus the jumps a test asks for.

    It runs like ``time.monotonic`` (the loop's timers and the clock agree) until a test calls
    :meth:`jump`, which moves the gateway's ``now`` forward at once: a queued job then has
    waited that long, without the test sleeping.
    """

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.offset += seconds


@attrs.define
class Stack:
    fake: FakeLlamaSwap
    upstream: str
    gateway: Gateway
    url: str
    clock: JumpClock


StackFactory = Callable[..., Stack]


@pytest.fixture
def make_stack() -> Iterator[StackFactory]:
    servers: list[ServerThread] = []

    def make(
        config: dict[str, Any] | None = None,
        *,
        upstream: str | None = None,
        load_seconds: float = 0.0,
        token_seconds: float = 0.0,
        aborts: bool = False,
    ) -> Stack:
        fake = FakeLlamaSwap(load_seconds=load_seconds, token_seconds=token_seconds, aborts=aborts)
        up = ServerThread(fake).start()
        servers.append(up)
        data = {"allow_anonymous": True, "anonymous_observer": True, **(config or {})}
        clock = JumpClock()
        gateway = Gateway(parse_config(data, upstream=upstream or up.url), clock=clock)
        gw = ServerThread(gateway, limits=gateway.config.limits).start()
        servers.append(gw)
        return Stack(fake, up.url, gateway, gw.url, clock)

    yield make
    for server in reversed(servers):
        server.stop()


def chat(model: str = "model-a", **fake: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if fake:
        body["fake"] = fake
    return body


async def wait_for(
    probe: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout: float = 60.0
) -> None:
    """Poll ``probe`` until it is true (a sync or async callable).

    ``timeout`` means "hung", never "slow": generous, so a busy machine (a load of 4-7 on two
    cores, coverage tracing) does not fail a test that would pass.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = probe()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def status(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/prioqueue/status")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


async def queued(client: httpx.AsyncClient) -> int:
    return int((await status(client))["queued"])


def run(coro: Awaitable[Any], timeout: float = 120.0) -> Any:
    """Run ``coro`` with a bound that means "hung" (generous: see ``wait_for``)."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())
