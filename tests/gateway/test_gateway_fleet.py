"""Several upstreams (``[[upstreams]]``): fake llama-swaps as real HTTP servers, one per GPU.

Each fake records its own concurrency (``max_active``), residency (``loaded``, ``loads``) and
order (``served``); the gateway drives one fleet worker per fake.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import attrs
import httpx
import openai
import pytest

from prioqueue.gateway import Gateway, parse_config
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

from .gateway_helpers import CHAT, chat, wait_for


@attrs.define
class Fleet:
    fakes: dict[str, FakeLlamaSwap]
    servers: dict[str, ServerThread]
    gateway: Gateway
    url: str

    def kill(self, name: str) -> None:
        """Stop an upstream as a crash does: at one instant it stops listening and every
        open connection is reset, then it exits.

        One callback on the upstream's loop does both, so no health poll can be answered
        after the first failure (the upstream would otherwise come back for a moment, and
        its outage be counted twice).
        """
        server = self.servers[name]
        uvicorn_server = server.server
        crashed = threading.Event()

        def crash() -> None:
            for listener in uvicorn_server.servers:
                listener.close()
            for connection in list(uvicorn_server.server_state.connections):
                connection.transport.abort()
            crashed.set()

        assert server.loop is not None
        server.loop.call_soon_threadsafe(crash)
        assert crashed.wait(10)
        uvicorn_server.force_exit = True
        server.stop()


@pytest.fixture
def make_fleet() -> Iterator[Any]:
    started: list[ServerThread] = []

    def make(models: dict[str, tuple[str, ...]], config: dict[str, Any] | None = None) -> Fleet:
        fakes = {name: FakeLlamaSwap(models=served) for name, served in models.items()}
        servers = {name: ServerThread(fake).start() for name, fake in fakes.items()}
        started.extend(servers.values())
        data: dict[str, Any] = {
            "allow_anonymous": True,
            "anonymous_observer": True,
            "health_seconds": 0.1,
            "upstreams": [{"url": s.url, "name": name} for name, s in servers.items()],
            **(config or {}),
        }
        gateway = Gateway(parse_config(data))
        front = ServerThread(gateway, limits=gateway.config.limits).start()
        started.append(front)
        return Fleet(fakes, servers, gateway, front.url)

    yield make
    for server in reversed(started):
        if server.thread.is_alive():
            server.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _release_and_all_served(fleet: Fleet, *requests: asyncio.Future[Any]) -> None:
    """Release every fake's ``go`` hold; every one of ``requests`` then answers 200."""
    for fake in fleet.fakes.values():
        fake.release("go")
    responses = await asyncio.gather(*requests)
    assert [r.status_code for r in responses] == [200] * len(requests)


async def _post(client: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> httpx.Response:
    return await client.post(CHAT, json=body, headers=headers)


def test_one_request_per_upstream_and_models_only_where_served(make_fleet: Any) -> None:
    fleet = make_fleet({"a": ("model-a",), "b": ("model-b",), "c": ("model-a", "model-b")})

    async def main() -> list[int]:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:
            bodies = [chat("model-a" if i % 3 else "model-b", seconds=0.02) for i in range(30)]
            responses = await asyncio.gather(*(_post(client, body) for body in bodies))
            return [r.status_code for r in responses]

    assert run(main()) == [200] * 30
    for name, fake in fleet.fakes.items():
        assert fake.max_active == 1, name  # slots = 1: never two at once on one upstream
        assert {entry.model for entry in fake.served} <= set(fake.models), name
    assert sum(len(f.served) for f in fleet.fakes.values()) == 30
    assert fleet.fakes["a"].served
    assert fleet.fakes["b"].served


def test_a_burst_stays_on_the_warm_upstream(make_fleet: Any) -> None:
    fleet = make_fleet({"a": ("model-a", "model-b"), "b": ("model-a", "model-b")})
    fleet.fakes["a"].loaded = "model-a"
    fleet.fakes["b"].loaded = "model-b"
    gateway = fleet.gateway

    async def main() -> None:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:

            async def resident() -> bool:
                ups = (await client.get("/prioqueue/status")).json()["fleet"]
                return [u["resident_model"] for u in ups] == ["model-a", "model-b"]

            await wait_for(resident)
            # Both upstreams busy with their own model while the two bursts arrive, mixed.
            blockers = [
                asyncio.ensure_future(_post(client, chat(model, hold="go", tag=f"block-{model}")))
                for model in ("model-a", "model-b")
            ]
            await wait_for(lambda: all(f.active for f in fleet.fakes.values()))
            bodies = [chat(m, seconds=0.05) for _ in range(6) for m in ("model-a", "model-b")]
            burst = [asyncio.ensure_future(_post(client, body)) for body in bodies]
            await wait_for(lambda: len(gateway.dispatcher) == 12)
            await _release_and_all_served(fleet, *blockers, *burst)

    run(main())
    a, b = ([e.model for e in fleet.fakes[name].served] for name in ("a", "b"))
    assert a[:7] == ["model-a"] * 7  # its blocker, then the whole model-a burst
    # The model-b burst stays on b; at most its last request may go to a once a ran dry.
    assert b[:6] == ["model-b"] * 6
    assert len(b) >= 6
    assert fleet.fakes["a"].loads + fleet.fakes["b"].loads <= 1


def test_a_killed_upstream_has_its_job_requeued_to_a_live_one(make_fleet: Any) -> None:
    fleet = make_fleet({"a": ("model-a",), "b": ("model-a",)})

    async def main() -> None:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:
            request = asyncio.ensure_future(_post(client, chat(hold="h1")))
            await wait_for(lambda: any(f.active for f in fleet.fakes.values()))
            victim = next(name for name, f in fleet.fakes.items() if f.active)
            other = "b" if victim == "a" else "a"
            fleet.fakes[other].release("h1")
            fleet.kill(victim)
            response = await asyncio.wait_for(request, 20)
            assert response.status_code == 200, response.text
            assert [e.tag for e in fleet.fakes[other].served] == [
                response.headers["x-prioqueue-job"]
            ]
            job = (
                await client.get(f"/prioqueue/jobs/{response.headers['x-prioqueue-job']}")
            ).json()
            assert job["upstream"] == other
            ups = {u["name"]: u for u in (await client.get("/prioqueue/status")).json()["fleet"]}
            assert ups[victim]["state"] == "down"
            assert ups[victim]["outages"] == 1
            assert ups[other]["state"] == "up"
            # With the victim gone the rest keeps working.
            assert (await _post(client, chat())).status_code == 200

    run(main())


def test_every_upstream_down_is_a_clean_error_not_a_hang(make_fleet: Any) -> None:
    fleet = make_fleet({"a": ("model-a",)}, {"max_attempts": 3})

    async def main() -> None:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:
            request = asyncio.ensure_future(_post(client, chat(hold="h1")))
            await wait_for(lambda: fleet.fakes["a"].active == 1)
            fleet.kill("a")
            response = await asyncio.wait_for(request, 20)
            assert response.status_code in (502, 504), response.text
            assert (await _post(client, chat())).status_code == 503  # none up: fail fast

    run(main())


def test_an_upstream_comes_back_when_healthy(make_fleet: Any) -> None:
    fleet = make_fleet({"a": ("model-a",), "b": ("model-a",)})
    gateway = fleet.gateway

    async def main() -> None:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:
            fleet.kill("a")

            async def state(wanted: str) -> bool:
                ups = (await client.get("/prioqueue/status")).json()["fleet"]
                return bool(ups[0]["state"] == wanted)

            await wait_for(lambda: state("down"))
            port = fleet.servers["a"].port
            fleet.servers["a"] = ServerThread(fleet.fakes["a"], port=port).start()
            await wait_for(lambda: state("up"))
            assert gateway.fleet_gate is not None
            assert gateway.fleet_gate.live == ("a", "b")

    run(main())
    fleet.kill("a")


def test_fair_share_holds_across_upstreams(make_fleet: Any) -> None:
    # No affinity, no tier spread: the fleet bound is N (T + A) d + 2 K C = 2 K C.
    scoring = {"max_affinity": 0, "aging_divisor": 0.01}
    fleet = make_fleet(
        {"a": ("model-a",), "b": ("model-a",)},
        {"warm_hold": 0, "scoring": scoring, "keys": _keys()},
    )
    gateway = fleet.gateway

    async def main() -> None:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:
            blockers = [
                asyncio.ensure_future(_post(client, chat(hold="go"), authorization="Bearer k-c"))
                for _ in range(2)
            ]
            await wait_for(lambda: sum(f.active for f in fleet.fakes.values()) == 2)
            jobs = [
                asyncio.ensure_future(
                    _post(client, chat(seconds=0.03), authorization=f"Bearer k-{who}")
                )
                for who in ("a", "b")
                for _ in range(10)
            ]
            await wait_for(lambda: len(gateway.dispatcher) == 20)
            await _release_and_all_served(fleet, *blockers, *jobs)

    run(main())
    records = [r for r in gateway.history.values() if r["member"] in ("alice", "bob")]
    grants = sorted((r["_grant"].granted_at, r["member"], r["runtime"]) for r in records)
    last = {member: max(t for t, m, _ in grants if m == member) for member in ("alice", "bob")}
    t1 = min(last.values())  # both lanes backlogged until the first one's last grant
    window = [(m, runtime) for t, m, runtime in grants if t < t1]
    spent = {m: sum(r for who, r in window if who == m) for m in ("alice", "bob")}
    charge = max(runtime for _, _, runtime in grants)
    assert abs(spent["alice"] - spent["bob"]) <= 2 * 2 * charge, (spent, charge)
    # FIFO would have run all of alice's ten first.
    assert spent["bob"] > 0


def _keys() -> dict[str, Any]:
    return {
        "k-a": {"member": "alice"},
        "k-b": {"member": "bob"},
        "k-c": {"member": "carol"},
    }


def test_openai_client_streams_through_the_fleet(make_fleet: Any) -> None:
    fleet = make_fleet({"a": ("model-a",), "b": ("model-b",)})
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key="anything", max_retries=0)
    try:
        for model in ("model-a", "model-b"):
            stream = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_body={"fake": {"tokens": 3}},
            )
            text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
            assert text == "tok0 tok1 tok2 "
    finally:
        client.close()
    assert [e.model for e in fleet.fakes["a"].served] == ["model-a"]
    assert [e.model for e in fleet.fakes["b"].served] == ["model-b"]


def test_metrics_show_each_upstream(make_fleet: Any) -> None:
    pytest.importorskip("prometheus_client")
    fleet = make_fleet({"a": ("model-a",), "b": ("model-b",)})
    with httpx.Client(base_url=fleet.url, timeout=30) as client:
        assert client.post(CHAT, json=chat("model-b")).status_code == 200
        text = client.get("/metrics").text
    assert 'prioqueue_gateway_fleet_up{upstream="a"} 1.0' in text
    assert 'prioqueue_gateway_fleet_grants_total{upstream="b"} 1.0' in text
    assert 'prioqueue_gateway_fleet_swaps_total{upstream="b"}' in text
    assert 'prioqueue_gateway_fleet_resident{model="model-b",upstream="b"} 1.0' in text


def test_groups_over_the_fleet(make_fleet: Any) -> None:
    fleet = make_fleet({"a": ("model-a",)})
    gateway = fleet.gateway
    group = {"x-prioqueue-group": "film"}

    async def main() -> None:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:
            first = asyncio.ensure_future(_post(client, chat(hold="go"), **group))
            await wait_for(lambda: fleet.fakes["a"].active == 1)
            queued = [asyncio.ensure_future(_post(client, chat(), **group)) for _ in range(3)]
            await wait_for(lambda: len(gateway.dispatcher) == 3)
            status = (await client.get("/prioqueue/groups/film")).json()
            assert (status["running"], status["queued"]) == (1, 3)
            cancel = await client.delete("/prioqueue/groups/film")
            assert len(cancel.json()["cancelled"]) == 3
            fleet.fakes["a"].release("go")
            responses = await asyncio.gather(first, *queued)
            assert [r.status_code for r in responses] == [200, 503, 503, 503]
            status = (await client.get("/prioqueue/groups/film")).json()
            assert (status["done"], status["cancelled"], status["queued"]) == (1, 3, 0)

    run(main())
    assert len(fleet.fakes["a"].served) == 1
