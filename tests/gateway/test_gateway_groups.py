"""``X-Prioqueue-Group``: a request's group, ``GET``/``DELETE /prioqueue/groups/{id}``."""

from __future__ import annotations

import asyncio

import httpx

from .gateway_helpers import CHAT, StackFactory, as_key, chat, hold_as, keyed_config, wait_for


def test_a_group_counts_its_requests_and_only_its_member_sees_it(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(keyed_config())
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        for _ in range(3):
            response = client.post(CHAT, json=chat(), headers=as_key("k-alice", "film-1"))
            assert response.status_code == 200
        assert "x-prioqueue-group" not in stack.fake.served[0].headers  # never forwarded
        mine = client.get("/prioqueue/groups/film-1", headers=as_key("k-alice"))
        assert mine.status_code == 200
        data = mine.json()
        assert data["group"] == "film-1"
        assert data["member"] == "alice"
        assert (data["done"], data["queued"], data["running"], data["cancelled"]) == (3, 0, 0, 0)
        assert data["gpu_seconds"] >= 0
        # bob's film-1 is another group; alice's does not exist for bob.
        assert client.get("/prioqueue/groups/film-1", headers=as_key("k-bob")).status_code == 404
        spy = client.get("/prioqueue/groups/film-1?member=alice", headers=as_key("k-bob"))
        assert spy.status_code == 404
        seen = client.get("/prioqueue/groups/film-1?member=alice", headers=as_key("k-watch"))
        assert seen.status_code == 200
        assert seen.json()["done"] == 3
        # An observer may look, not cancel.
        cancel = client.delete("/prioqueue/groups/film-1?member=alice", headers=as_key("k-watch"))
        assert cancel.status_code == 404
        assert client.get("/prioqueue/groups/nope", headers=as_key("k-alice")).status_code == 404


def test_bad_group_headers_are_400(make_stack: StackFactory) -> None:
    stack = make_stack(keyed_config())
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        for bad in ("", "x" * 201, "a\tb"):
            response = client.post(CHAT, json=chat(), headers=as_key("k-alice", bad))
            assert response.status_code == 400, bad
            assert "X-Prioqueue-Group" in response.json()["error"]["message"]
    assert stack.fake.served == []


def test_cancelling_a_group_fails_its_queued_requests_and_spares_others(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(keyed_config())
    gateway = stack.gateway

    async def main() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
            first = await hold_as(client, stack, "k-alice", "film")
            queued = [
                asyncio.ensure_future(
                    client.post(CHAT, json=chat(), headers=as_key("k-alice", "film"))
                )
                for _ in range(2)
            ]
            other = asyncio.ensure_future(
                client.post(CHAT, json=chat(), headers=as_key("k-bob", "film"))
            )
            await wait_for(lambda: len(gateway.dispatcher) == 3)
            refused = await client.delete(
                "/prioqueue/groups/film?member=alice", headers=as_key("k-bob")
            )
            assert refused.status_code == 404
            cancel = await client.delete("/prioqueue/groups/film", headers=as_key("k-alice"))
            assert cancel.status_code == 200
            assert len(cancel.json()["cancelled"]) == 2
            stack.fake.release("go")
            responses = await asyncio.gather(first, *queued, other)
            assert [r.status_code for r in responses] == [200, 503, 503, 200]
            status = (await client.get("/prioqueue/groups/film", headers=as_key("k-alice"))).json()
            assert (status["done"], status["cancelled"]) == (1, 2)
            bob = (await client.get("/prioqueue/groups/film", headers=as_key("k-bob"))).json()
            assert (bob["done"], bob["cancelled"]) == (1, 0)

    asyncio.run(main())
    assert len(stack.fake.served) == 2
