"""``/prioqueue/status``, ``/prioqueue/jobs/{id}``, ``/metrics`` and the resident model."""

from __future__ import annotations

import asyncio

import httpx

from .gateway_helpers import CHAT, StackFactory, chat, queued, run, status, wait_for


async def _eq_queued(client: httpx.AsyncClient, n: int) -> bool:
    return await queued(client) == n


def test_status_and_explanations(make_stack: StackFactory) -> None:
    keys = {
        "k-high": {"member": "ui", "tier": "max", "max_priority": 100},
        "k-low": {"member": "film", "tier": "free", "max_priority": 0},
    }
    stack = make_stack({"keys": keys, "estimate_seconds": 2.0})

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            holder = asyncio.ensure_future(
                client.post(
                    CHAT,
                    json=chat(hold="gpu", tag="holder"),
                    headers={"Authorization": "Bearer k-low"},
                )
            )
            await wait_for(lambda: _running(client))
            batch = asyncio.ensure_future(
                client.post(
                    CHAT,
                    json=chat(tag="b"),
                    headers={"Authorization": "Bearer k-low", "X-LlamaSwap-Priority": "batch"},
                )
            )
            await wait_for(lambda: _eq_queued(client, 1))
            urgent = asyncio.ensure_future(
                client.post(
                    CHAT,
                    json=chat("model-b", tag="u"),
                    headers={
                        "Authorization": "Bearer k-high",
                        "X-LlamaSwap-Priority": "interactive",
                    },
                )
            )
            await wait_for(lambda: _eq_queued(client, 2))
            state = await status(client)
            assert state["running"]["member"] == "film"
            assert state["running"]["lease_remaining"] > 0
            assert list(state["levels"]) == ["100", "0", "-100"]
            (top,) = state["levels"]["100"]["jobs"]
            (low,) = state["levels"]["-100"]["jobs"]
            assert (top["member"], top["position"], top["model"]) == ("ui", 1, "model-b")
            assert low["position"] == 2
            assert low["estimated_start_in"] > top["estimated_start_in"] >= 0
            explained = (await client.get(f"/prioqueue/jobs/{low['id']}")).json()
            assert explained["state"] == "queued"
            assert explained["position"] == 2
            assert explained["ahead"][0]["job_id"] == top["id"]
            assert "position 2" in explained["text"]
            assert explained["score"]["band"] == -100
            stack.clock.jump(1.0)  # the batch job has now waited long enough to be explained
            stack.fake.release("gpu")
            done = [await holder, await urgent, await batch]
            assert [r.status_code for r in done] == [200, 200, 200]
            finished = (
                await client.get("/prioqueue/jobs/" + done[2].headers["x-prioqueue-job"])
            ).json()
            assert finished["state"] == "finished"
            assert finished["outcome"] == "done"
            assert finished["status"] == 200
            assert finished["waited"] >= 1.0
            assert finished["score"]["band"] == -100
            (overtake,) = finished["overtaken_by"]  # built on request from the recent grants
            assert (overtake["member"], overtake["priority"]) == ("ui", 100)
            assert (await client.get("/prioqueue/jobs/nope")).status_code == 404
            assert (await client.post("/prioqueue/status")).status_code == 405
            assert (await client.get("/prioqueue/other")).status_code == 404
            metrics = await client.get("/metrics")
            assert metrics.status_code == 200
            assert 'prioqueue_dispatched_total{level="100"} 1.0' in metrics.text

    run(go())
    assert stack.fake.order() == ["holder", "u", "b"]


async def _running(client: httpx.AsyncClient) -> bool:
    return (await status(client))["running"] is not None


def test_resident_model_follows_the_upstream(make_stack: StackFactory) -> None:
    stack = make_stack({"resident": {"poll_seconds": 0.05}})

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            assert (await client.post(CHAT, json=chat("model-b"))).status_code == 200
            assert (await status(client))["resident_model"] == "model-b"
            await client.post(stack.upstream + "/unload")  # llama-swap unloaded on idle

            async def unloaded() -> bool:
                return (await status(client))["resident_model"] is None

            await wait_for(unloaded)

    run(go())


def test_history_is_bounded(make_stack: StackFactory) -> None:
    stack = make_stack({"job_history": 2})
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        ids = [client.post(CHAT, json=chat()).headers["x-prioqueue-job"] for _ in range(3)]
        assert client.get(f"/prioqueue/jobs/{ids[0]}").status_code == 404
        assert client.get(f"/prioqueue/jobs/{ids[2]}").status_code == 200
