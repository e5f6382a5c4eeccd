"""``amount > 1`` on ``POST /api/v2/generate/pop``: one payload, several ids (issue 28).

The first job is the one a plain pop grants (priority and fair share decide); the further
ones, up to ``amount``, are queued jobs of the *same request* that fit the worker, granted
in the same journaled operation (``FleetDispatcher.pop_many(siblings=True)``), each with its
own lease. The bodies are built with horde-sdk's own pop request model and the answers
validated with its response model.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from prioqueue.lease import lease_seconds

from .broker_helpers import api, run

os.environ.setdefault("TESTS_ONGOING", "1")  # horde-sdk's models refuse unknown fields
sdk = pytest.importorskip("horde_sdk.ai_horde_api.apimodels", reason="horde-sdk is not installed")

ALICE, BOB, WORKER_KEY = "a" * 22, "b" * 22, "w" * 22
KEYS: dict[str, Any] = {
    ALICE: {"role": "submitter", "member": "alice", "tier": "pro"},
    BOB: {"role": "submitter", "member": "bob", "tier": "pro"},
    WORKER_KEY: {"role": "worker", "workers_prefix": "horde-"},
}
LIMITS = {"keys": KEYS, "result_max_bytes": 4 * 1024 * 1024, "max_body_bytes": 8 * 1024 * 1024}
PARAMS = {"width": 1024, "height": 1024, "steps": 30, "sampler_name": "k_euler"}


async def _request(client: httpx.AsyncClient, key: str, n: int, prompt: str = "x") -> str:
    body = {"prompt": prompt, "models": ["sdxl"], "params": {**PARAMS, "n": n}}
    r = await client.post("/api/v2/generate/async", json=body, headers={"apikey": key})
    assert r.status_code == 202, r.text
    return str(sdk.ImageGenerateAsyncResponse.model_validate(r.json()).id_)


async def _pop(client: httpx.AsyncClient, **fields: Any) -> Any:
    """A pop built with horde-sdk's ``ImageGenerateJobPopRequest``, as it serialises it."""
    request = sdk.ImageGenerateJobPopRequest(
        apikey=WORKER_KEY, name="horde-1", models=["sdxl"], max_pixels=2048 * 2048, **fields
    )
    body = request.model_dump(by_alias=True, exclude_none=True, exclude_unset=True)
    body.pop("apikey", None)
    r = await client.post("/api/v2/generate/pop", json=body, headers={"apikey": WORKER_KEY})
    assert r.status_code == 200, r.text
    return sdk.ImageGenerateJobPopResponse.model_validate(r.json())


async def _done(client: httpx.AsyncClient, job: str, seed: int) -> int:
    body = {"id": job, "generation": "aW1n", "state": "ok", "seed": seed}
    r = await client.post("/api/v2/generate/submit", json=body, headers={"apikey": WORKER_KEY})
    return r.status_code


def _group(a: Any, horde_id: str) -> str | None:
    from prioqueue.broker._horde_models import job_id_of

    job_id = job_id_of(horde_id)
    assert job_id is not None
    engine = a.broker.engine
    assert engine is not None
    group: str | None = engine.jobs[job_id].group
    return group


def test_amount_3_on_a_request_of_3_grants_the_3_images_in_one_payload() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            request = await _request(a.client, ALICE, 3)
            popped = await _pop(a.client, amount=3)
            ids = [str(i) for i in popped.ids]
            assert len(ids) == 3
            assert len(set(ids)) == 3
            assert str(popped.id_) == ids[0]
            assert popped.payload.n_iter == 3
            assert popped.ttl == lease_seconds(width=1024, height=1024, steps=30, sampler="k_euler")
            engine = a.broker.engine
            assert engine is not None
            running = [r for r in engine.jobs.values() if r.state == "running"]
            assert len(running) == 3  # each granted job holds its own lease
            assert {r.lease_seconds for r in running} == {popped.ttl}
            idle = await _pop(a.client, amount=3)
            assert idle.id_ is None
            assert not idle.ids
            for seed, job in enumerate(ids):
                assert await _done(a.client, job, seed) == 200
            r = await a.client.get(f"/api/v2/generate/status/{request}")
            status = sdk.ImageGenerateStatusResponse.model_validate(r.json())
            assert (status.done, status.finished) == (True, 3)
            assert sorted(str(g.id_) for g in status.generations) == sorted(ids)
            assert a.replays()

    run(main())


def test_amount_takes_siblings_only_never_another_members_jobs() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            await _request(a.client, BOB, 2, "bob's")
            await _request(a.client, ALICE, 3, "alice's")
            await _request(a.client, BOB, 2, "bob's second")
            first = await _pop(a.client, amount=3, threads=1)
            assert first.payload.prompt == "bob's"  # the plain pop's choice comes first
            assert len(first.ids) == 2  # the request has 2 images: no third from elsewhere
            assert len({_group(a, str(i)) for i in first.ids}) == 1
            for seed, job in enumerate(first.ids):
                assert await _done(a.client, str(job), seed) == 200
            second = await _pop(a.client, amount=3, threads=1)
            assert second.payload.prompt == "alice's"  # fair share: alice's turn
            assert len(second.ids) == 3
            assert len({_group(a, str(i)) for i in second.ids}) == 1
            for seed, job in enumerate(second.ids):
                assert await _done(a.client, str(job), seed) == 200
            third = await _pop(a.client, amount=1)  # amount 1: one job, as before
            assert third.payload.prompt == "bob's second"
            assert len(third.ids) == 1
            assert a.replays()

    run(main())


def test_amount_stops_at_the_workers_slots_and_the_rest_waits() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            request = await _request(a.client, ALICE, 5)
            first = await _pop(a.client, amount=2)
            held = await _pop(a.client, amount=3)  # slots max(threads + prefetch, 3): 1 left
            assert len(held.ids) == 1
            assert await _done(a.client, str(held.id_), 9) == 200
            assert len(first.ids) == 2
            r = await a.client.get(f"/api/v2/generate/check/{request}")
            check = sdk.ImageGenerateCheckResponse.model_validate(r.json())
            assert (check.processing, check.waiting, check.finished) == (2, 2, 1)
            for seed, job in enumerate(first.ids):
                assert await _done(a.client, str(job), seed) == 200
            rest = await _pop(a.client, amount=20)
            assert len(rest.ids) == 2
            assert a.replays()

    run(main())
