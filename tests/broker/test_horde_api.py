"""The AI Horde compatible routes (/api/v2/) on the broker app in memory (issue 28).

The answers are validated with horde-sdk's own response models (unmodified; strict:
``TESTS_ONGOING`` makes them refuse unknown fields) where horde-sdk is installed. The
round trip against a real ``prioqueue broker`` process is ``test_horde_sdk.py``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from prioqueue.lease import lease_seconds

from .broker_helpers import WORKER, api, run

os.environ.setdefault("TESTS_ONGOING", "1")  # horde-sdk's models refuse unknown fields
sdk = pytest.importorskip("horde_sdk.ai_horde_api.apimodels", reason="horde-sdk is not installed")
generic = pytest.importorskip("horde_sdk.generic_api.apimodels")

CLIENT_KEY = "c" * 22  # the Horde's keys are 22 characters long
OTHER_KEY = "d" * 22
WORKER_KEY = "w" * 22
KEYS: dict[str, Any] = {
    CLIENT_KEY: {"role": "submitter", "member": "alice", "tier": "pro"},
    OTHER_KEY: {"role": "submitter", "member": "bob", "tier": "pro"},
    WORKER_KEY: {"role": "worker", "workers_prefix": "horde-"},
    "sk-alice": {"role": "submitter", "member": "alice", "tier": "pro"},
    "sk-bob": {"role": "submitter", "member": "bob", "tier": "pro"},
    "sk-dave": {"role": "submitter", "member": "dave", "tier": "pro"},
    "wk-1": {"role": "worker", "workers_prefix": ""},
}
CLIENT = {"apikey": CLIENT_KEY}
WORKER_H = {"apikey": WORKER_KEY}
LIMITS = {"keys": KEYS, "result_max_bytes": 4 * 1024 * 1024, "max_body_bytes": 8 * 1024 * 1024}
SDXL_REQUEST = {
    "prompt": "a lighthouse at dusk",
    "models": ["sdxl"],
    "params": {
        "width": 1024, "height": 1024, "steps": 30, "sampler_name": "k_dpmpp_2s_a",
        "control_type": "canny", "loras": [{"name": "a"}, {"name": "b"}], "n": 1,
    },
    "source_image": "aGVsbG8=",
}  # fmt: skip
POP = {
    "name": "horde-big", "models": ["sdxl", "flux_1"], "max_pixels": 2048 * 2048,
    "allow_img2img": True, "allow_controlnet": True, "allow_lora": True, "nsfw": True,
}  # fmt: skip


async def _submit(client: httpx.AsyncClient, body: dict[str, Any], key: str = CLIENT_KEY) -> str:
    r = await client.post("/api/v2/generate/async", json=body, headers={"apikey": key})
    assert r.status_code == 202, r.text
    answer = sdk.ImageGenerateAsyncResponse.model_validate(r.json())
    assert answer.kudos == 0
    return str(answer.id_)


async def _pop(client: httpx.AsyncClient, **body: Any) -> Any:
    r = await client.post("/api/v2/generate/pop", json={**POP, **body}, headers=WORKER_H)
    assert r.status_code == 200, r.text
    return sdk.ImageGenerateJobPopResponse.model_validate(r.json())


def test_the_lease_of_the_issue_example_is_the_ttl_on_sdxl_and_flux() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            for model, expected in (("sdxl", 1234), ("flux_1", 3274)):
                await _submit(a.client, {**SDXL_REQUEST, "models": [model]})
                popped = await _pop(a.client)
                assert popped.model == model
                assert popped.ttl == expected
                assert popped.ttl == lease_seconds(
                    width=1024, height=1024, steps=30, sampler="k_dpmpp_2s_a",
                    controlnet=True, loras=2,
                    baseline="flux_1" if model == "flux_1" else None,
                )  # fmt: skip
                assert popped.payload.ddim_steps == 30
                assert popped.source_image == "aGVsbG8="
                assert a.replays()

    run(main())


def test_a_request_of_n_images_is_a_group_checked_and_read_whole() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            request = await _submit(a.client, {"prompt": "x", "params": {"n": 3}})
            r = await a.client.get(f"/api/v2/generate/check/{request}")
            check = sdk.ImageGenerateCheckResponse.model_validate(r.json())
            assert (check.waiting, check.finished, check.done) == (3, 0, False)
            assert check.queue_position == 1
            ids = []
            for _ in range(3):
                popped = await _pop(a.client, threads=3)
                ids.append(str(popped.id_))
            for seed, job in enumerate(ids):
                body = {"id": job, "generation": "aW1n", "state": "ok", "seed": seed}
                r = await a.client.post("/api/v2/generate/submit", json=body, headers=WORKER_H)
                assert r.status_code == 200, r.text
                assert sdk.JobSubmitResponse.model_validate(r.json()).reward == 0
            r = await a.client.get(f"/api/v2/generate/status/{request}")
            status = sdk.ImageGenerateStatusResponse.model_validate(r.json())
            assert status.done
            assert status.finished == 3
            assert sorted(str(g.id_) for g in status.generations) == sorted(ids)
            assert {g.worker_name for g in status.generations} == {"horde-big"}
            assert a.replays()

    run(main())


def test_a_worker_too_small_or_without_lora_gets_nothing_and_says_why() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            await _submit(a.client, {"prompt": "big", "params": {"width": 2048, "height": 2048}})
            lora = {"prompt": "lora", "params": {"loras": [{"name": "x"}]}}
            await _submit(a.client, lora)
            popped = await _pop(a.client, name="horde-small", max_pixels=1024 * 1024,
                                allow_lora=False)  # fmt: skip
            assert popped.id_ is None
            assert popped.ids == []
            assert popped.skipped.max_pixels == 1
            assert popped.skipped.lora == 1
            popped = await _pop(a.client)
            assert popped.id_ is not None

    run(main())


def test_a_job_for_either_model_goes_to_the_worker_with_one_resident() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            await _submit(a.client, {"prompt": "x", "models": ["sdxl", "flux_1"]})
            idle = await _pop(a.client, name="horde-other", models=["anything_v5"])
            assert idle.id_ is None
            assert idle.skipped.models == 1
            popped = await _pop(a.client, name="horde-flux", models=["flux_1"])
            assert popped.model == "flux_1"
            assert popped.ttl == lease_seconds(
                width=512, height=512, steps=30, sampler="k_euler_a", baseline="flux_1"
            )

    run(main())


def test_keys_and_the_anonymous_key() -> None:
    async def main() -> None:
        body = {"prompt": "x"}
        async with api(**LIMITS) as a:
            for headers in ({}, {"apikey": "0000000000"}, {"apikey": "e" * 22}):
                r = await a.client.post("/api/v2/generate/async", json=body, headers=headers)
                assert r.status_code == 401, r.text
                assert generic.RequestErrorResponse.model_validate(r.json()).rc == "InvalidAPIKey"
            r = await a.client.post("/api/v2/generate/async", json=body, headers=WORKER_H)
            assert r.status_code == 403
            r = await a.client.post("/api/v2/generate/pop", json=POP, headers=CLIENT)
            assert r.status_code == 403
            r = await a.client.post(
                "/api/v2/generate/pop", json={**POP, "name": "gpu-x"}, headers=WORKER_H
            )
            assert r.status_code == 403
        async with api(**LIMITS, horde={"anonymous_member": "anon"}) as a:
            r = await a.client.post(
                "/api/v2/generate/async", json=body, headers={"apikey": "0000000000"}
            )
            assert r.status_code == 202, r.text

    run(main())


def test_bad_bodies_get_the_hordes_validation_answer() -> None:
    async def main() -> None:
        async with api(**LIMITS, horde={"max_image_bytes": 16}) as a:
            r = await a.client.post("/api/v2/generate/async", json={"params": {}}, headers=CLIENT)
            assert r.status_code == 400
            assert "prompt" in r.json()["errors"]
            big = {"prompt": "x", "source_image": "a" * 17}
            r = await a.client.post("/api/v2/generate/async", json=big, headers=CLIENT)
            assert r.status_code == 413
            r = await a.client.get("/api/v2/generate/check/not-a-uuid")
            assert r.status_code == 404
            r = await a.client.get("/api/v2/generate/check/00000000-0000-0000-0000-000000000001")
            assert r.status_code == 404
            dry = {"prompt": "x", "dry_run": True}
            r = await a.client.post("/api/v2/generate/async", json=dry, headers=CLIENT)
            assert r.status_code == 200
            assert r.json() == {"kudos": 0.0}
            assert await a.queued() == 0

    run(main())


def test_delete_cancels_the_rest_and_answers_the_status() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            request = await _submit(a.client, {"prompt": "x", "params": {"n": 2}})
            popped = await _pop(a.client)
            r = await a.client.delete(f"/api/v2/generate/status/{request}")
            assert r.status_code == 200, r.text
            status = sdk.ImageGenerateStatusResponse.model_validate(r.json())
            assert status.done
            assert status.generations == []
            body = {"id": str(popped.id_), "generation": "x", "state": "ok"}
            r = await a.client.post("/api/v2/generate/submit", json=body, headers=WORKER_H)
            assert r.status_code == 409
            assert a.replays()

    run(main())


def test_fair_share_holds_across_the_horde_and_v1_routes() -> None:
    """Alice floods through /api/v2, Bob submits through /v1: one queue, alternating grants."""

    async def main() -> None:
        async with api(**LIMITS) as a:
            await _submit(a.client, {"prompt": "flood", "params": {"n": 6}})
            for _ in range(3):
                await a.submit(headers={"Authorization": "Bearer sk-bob"}, priority=0)
            members = []
            for _ in range(6):
                r = await a.client.post("/v1/workers/gpu-1/pop", json={"slots": 16}, headers=WORKER)
                assert r.status_code == 200
                members.append("bob" if r.json()["payload"] is None else "alice")
            assert members.count("bob") == 3
            assert members.count("alice") == 3

    run(main())


def test_the_horde_table_refuses_bad_values() -> None:
    from prioqueue import ConfigError
    from prioqueue.broker import parse_config

    for horde, message in (
        ({"anonymous_tier": "gold"}, "unknown tier"),
        ({"priority": "high"}, "must be an integer"),
        ({"max_images": 0}, "must be >= 1"),
        ({"model_baselines": {"m": 3}}, "non-empty string"),
        ({"colour": 1}, "colour"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_config({"horde": horde})
    config = parse_config({"horde": {"model_baselines": {"My Flux": "flux_1"}}}).horde
    assert (config.baseline("My Flux"), config.baseline("flux_1"), config.baseline("x")) == (
        "flux_1", "flux_1", None,
    )  # fmt: skip


def test_requests_past_the_limits_are_refused_before_anything_is_queued() -> None:
    async def main() -> None:
        limits = {**LIMITS, "horde": {"max_images": 2, "max_pixels": 1024 * 1024},
                  "lease": {"strict_samplers": True}}  # fmt: skip
        async with api(**limits) as a:
            for body, message in (
                ({"prompt": "x", "params": {"n": 3}}, "max_images=2"),
                ({"prompt": "x", "params": {"width": 2048, "height": 1024}}, "max_pixels"),
                ({"prompt": "x", "params": {"sampler_name": "bogus"}}, "sampler"),
            ):
                r = await a.client.post("/api/v2/generate/async", json=body, headers=CLIENT)
                assert r.status_code == 400, r.text
                assert message in r.json()["message"]
            r = await a.client.post("/api/v2/generate/async", content=b"{", headers=CLIENT)
            assert r.status_code == 400
            r = await a.client.post("/api/v2/generate/pop", json=POP)
            assert r.status_code == 401
            assert await a.queued() == 0

    run(main())


def test_progress_a_fault_and_a_worker_that_fits_nothing() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            big = {"prompt": "x", "params": {"width": 2048, "height": 2048, "n": 3}}
            request = await _submit(a.client, big)
            await _pop(a.client, name="horde-small", max_pixels=512 * 512)
            r = await a.client.get(f"/api/v2/generate/check/{request}")
            assert r.json()["is_possible"] is False  # the only worker is too small
            first = await _pop(a.client)
            a.clock.advance(30.0)
            done = {"id": str(first.id_), "state": "ok", "generation": "aW1n"}
            r = await a.client.post("/api/v2/generate/submit", json=done, headers=WORKER_H)
            assert r.status_code == 200, r.text
            job = await _pop(a.client)
            r = await a.client.get(f"/api/v2/generate/check/{request}")
            check = sdk.ImageGenerateCheckResponse.model_validate(r.json())
            assert (check.finished, check.processing, check.waiting) == (1, 1, 1)
            assert check.is_possible
            assert check.wait_time > 0  # from the runtime measured: 30 s a job
            faulted = {"id": str(job.id_), "state": "faulted", "generation": "Faulted"}
            r = await a.client.post("/api/v2/generate/submit", json=faulted, headers=WORKER_H)
            assert r.status_code == 200, r.text
            r = await a.client.get(f"/api/v2/generate/check/{request}")
            assert r.json()["faulted"] is True
            for job_id, status in (("nope", 404), ("00000000-0000-0000-0000-000000000000", 404),
                                   (str(job.id_), 409)):  # fmt: skip
                body = {"id": job_id, "generation": "x", "state": "ok"}
                r = await a.client.post("/api/v2/generate/submit", json=body, headers=WORKER_H)
                assert r.status_code == status, r.text
            assert a.replays()

    run(main())


def test_a_large_image_is_kept_outside_the_journal() -> None:
    async def main() -> None:
        async with api(**LIMITS, horde={"inline_max_bytes": 8}) as a:
            request = await _submit(a.client, {"prompt": "x", "params": {"n": 2}})
            image = "aW1hZ2UgYnl0ZXM="  # 16 characters: over the threshold
            for generation in (image, "c21hbGw="):  # the second one stays inline
                job = await _pop(a.client)
                body = {"id": str(job.id_), "generation": generation, "state": "ok"}
                r = await a.client.post("/api/v2/generate/submit", json=body, headers=WORKER_H)
                assert r.status_code == 200, r.text
            journal = json.dumps([entry.args for entry in a.journal.entries])
            assert image not in journal
            assert "c21hbGw=" in journal
            r = await a.client.get(f"/api/v2/generate/status/{request}")
            status = sdk.ImageGenerateStatusResponse.model_validate(r.json())
            assert sorted(g.img for g in status.generations) == sorted([image, "c21hbGw="])
            assert a.replays()

    run(main())


def test_a_sweep_removes_only_unreferenced_old_images(tmp_path: Path) -> None:
    from prioqueue.broker._horde_blobs import GRACE_SECONDS, Blobs, FileBlobs

    async def main() -> None:
        for blobs in (Blobs(), FileBlobs(tmp_path / "blobs")):
            assert await blobs.sweep(set(), time.time()) == 0
            await blobs.put("kept", "a")
            await blobs.put("gone", "b")
            assert await blobs.sweep(set(), time.time()) == 0  # within the grace
            later = time.time() + GRACE_SECONDS + 1
            assert await blobs.sweep({"kept"}, later) == 1
            assert (await blobs.get("kept"), await blobs.get("gone")) == ("a", None)

    run(main())


def test_status_models_lists_workers_and_queued_images() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            await _submit(a.client, {"prompt": "x", "models": ["sdxl", "flux_1"],
                                     "params": {"n": 2}})  # fmt: skip
            await _pop(a.client, name="horde-a", models=["flux_1"], max_pixels=64 * 64)
            r = await a.client.get("/api/v2/status/models")
            listed = sdk.HordeStatusModelsAllResponse.model_validate(r.json())
            by_name = {m.name: (m.count, m.jobs) for m in listed}
            assert by_name == {"flux_1": (1, 2.0), "sdxl": (0, 2.0)}
            r = await a.client.get("/api/v2/status/models", params={"min_count": 1})
            assert [m["name"] for m in r.json()] == ["flux_1"]
            r = await a.client.get("/api/v2/status/models", params={"type": "text"})
            assert r.json() == []

    run(main())


def test_a_horde_worker_never_gets_a_v1_job() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            await a.submit(headers={"Authorization": "Bearer sk-bob"}, priority=0)
            idle = await _pop(a.client)
            assert idle.id_ is None  # the /v1/ job's payload is not a Horde request
            await _submit(a.client, {"prompt": "x"})
            popped = await _pop(a.client)
            assert popped.payload.prompt == "x"

    run(main())


def test_two_kinds_of_worker_share_one_fair_queue_across_the_routes() -> None:
    """Alice floods /api/v2 (12 images), Bob asks for 4 there, Dave submits 4 on /v1/; a
    Horde worker (Horde jobs only) and a /v1/ worker serve them: each member gets its share."""
    from prioqueue.broker._horde_models import job_id_of

    async def main() -> None:
        async with api(**LIMITS) as a:
            await _submit(a.client, {"prompt": "flood", "params": {"n": 12}})
            await _submit(a.client, {"prompt": "some", "params": {"n": 4}}, key=OTHER_KEY)
            for _ in range(4):
                await a.submit(headers={"Authorization": "Bearer sk-dave"}, priority=0)
            granted: list[str] = []
            for _ in range(6):
                popped = await _pop(a.client, name="horde-1", max_pixels=1024 * 1024)
                job_id = job_id_of(str(popped.id_))
                assert job_id is not None
                r = await a.client.post("/v1/workers/gpu-1/pop", json={}, headers=WORKER)
                assert r.status_code == 200, r.text
                v1 = r.json()
                a.clock.advance(10.0)
                done = {"id": str(popped.id_), "generation": "aW1n", "state": "ok"}
                r = await a.client.post("/api/v2/generate/submit", json=done, headers=WORKER_H)
                assert r.status_code == 200, r.text
                r = await a.finish(v1["id"], "gpu-1", v1["attempt"])
                assert r.status_code == 200, r.text
                granted += [job_id, v1["id"]]
            engine = a.broker.engine
            assert engine is not None
            members = [engine.jobs[job_id].member for job_id in granted]
            counts = {name: members.count(name) for name in ("alice", "bob", "dave")}
            assert counts == {"alice": 4, "bob": 4, "dave": 4}, members
            assert a.replays()

    run(main())


def test_a_v1_worker_may_declare_capabilities_too() -> None:
    async def main() -> None:
        async with api(**LIMITS) as a:
            await _submit(a.client, {"prompt": "x", "params": {"width": 1024, "height": 1024}})
            small = {"capabilities": {"max_pixels": 512 * 512}}
            r = await a.client.post("/v1/workers/gpu-1/pop", json=small, headers=WORKER)
            assert r.status_code == 204
            assert r.headers["X-Prioqueue-Idle"] == "max_pixels=1"
            bad = {"capabilities": {"max_pixels": 0}}
            r = await a.client.post("/v1/workers/gpu-1/pop", json=bad, headers=WORKER)
            assert r.status_code == 422
            assert "max_pixels" in r.json()["error"]
            r = await a.client.post("/v1/workers/gpu-2/pop", json={}, headers=WORKER)
            assert r.status_code == 200
            assert a.replays()

    run(main())
