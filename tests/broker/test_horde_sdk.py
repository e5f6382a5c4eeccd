"""horde-sdk itself, unmodified, against a real ``prioqueue broker`` on 127.0.0.1 (issue 28).

* The client is horde-sdk's ``AIHordeAPIManualClient`` in a subprocess whose ``AI_HORDE_URL``
  points at the broker (horde-sdk reads it once, at import): it submits n=3, checks, reads the
  status and cancels.
* The worker loop builds its bodies with horde-sdk's ``ImageGenerateJobPopRequest`` and
  ``ImageGenerationJobSubmitRequest`` (serialised as horde-sdk serialises them) and validates
  the answers with its response models: its ``ttl`` is ``lease_seconds()`` for the payload
  and the model the grant chose.
* Capabilities and multi-model grants survive a SIGKILL and the replay, on SQLite and
  PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from prioqueue.lease import lease_seconds
from store.pg import POSTGRES_URL

from .broker_helpers import BrokerProcess, free_port, postgres_schema, run

os.environ.setdefault("TESTS_ONGOING", "1")  # horde-sdk's models refuse unknown fields
apimodels = pytest.importorskip("horde_sdk.ai_horde_api.apimodels", reason="needs horde-sdk")

CLIENT_KEY = "Cl1entKey-0123456789ab"  # 22 characters, as the Horde's keys
WORKER_KEY = "W0rkerKey-0123456789ab"
assert len(CLIENT_KEY) == len(WORKER_KEY) == 22
SCRIPT = Path(__file__).with_name("horde_client.py")
IMG = "aW1hZ2UgYnl0ZXM="  # a base64 "image"


def _config(folder: Path, store: str, schema: str | None = None) -> BrokerProcess:
    port = free_port()
    lines = [
        f'listen = "127.0.0.1:{port}"', f'store = "{store}"',
        "result_max_bytes = 4194304", "max_body_bytes = 8388608",
        *([f'store_schema = "{schema}"'] if schema else []),
        f'[keys."{CLIENT_KEY}"]', 'role = "submitter"', 'member = "alice"', 'tier = "pro"',
        f'[keys."{WORKER_KEY}"]', 'role = "worker"', 'workers_prefix = "horde-"',
        '[keys."wk-status"]', 'role = "worker"', 'workers_prefix = "status-"',
        "[horde]", "inline_max_bytes = 8",  # the images go outside the journal rows
    ]  # fmt: skip
    path = folder / "broker.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return BrokerProcess(path, port, folder / "broker.log")


def _client(url: str, *args: str) -> dict[str, Any]:
    """Run horde-sdk's client as a user would, with AI_HORDE_URL set."""
    env = {**os.environ, "AI_HORDE_URL": f"{url}/api/"}
    env.pop("AI_HORDE_DEV_URL", None)
    env.pop("AI_HORDE_DEV_APIKEY", None)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), CLIENT_KEY, *args],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def _pop_body(**fields: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """A pop's body and headers, from horde-sdk's request model, serialised as it does."""
    request = apimodels.ImageGenerateJobPopRequest(apikey=WORKER_KEY, **fields)
    body = request.model_dump(by_alias=True, exclude_none=True, exclude_unset=True)
    return {k: v for k, v in body.items() if k != "apikey"}, {"apikey": request.apikey}


async def _pop(client: httpx.AsyncClient, url: str, **fields: Any) -> Any:
    body, headers = _pop_body(**fields)
    r = await client.post(f"{url}/api/v2/generate/pop", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return apimodels.ImageGenerateJobPopResponse.model_validate(r.json())


async def _submit(client: httpx.AsyncClient, url: str, job: Any, seed: int) -> int:
    request = apimodels.ImageGenerationJobSubmitRequest(
        apikey=WORKER_KEY, id=job, generation=IMG, state="ok", seed=seed
    )
    body = request.model_dump(by_alias=True, exclude_none=True, exclude={"apikey"})
    r = await client.post(
        f"{url}/api/v2/generate/submit", json=body, headers={"apikey": WORKER_KEY}
    )
    if r.status_code == 200:
        assert apimodels.JobSubmitResponse.model_validate(r.json()).reward == 0
    return r.status_code


def test_horde_sdk_client_and_worker_round_trip(tmp_path: Path) -> None:
    broker = _config(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}").start()

    async def worker_loop(url: str) -> list[str]:
        popped: list[str] = []
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.get(f"{url}/api/v2/status/heartbeat")
            assert r.json()["message"] == "OK"
            for _ in range(3):
                job = await _pop(client, url, name="horde-flux", models=["flux_1"],
                                 max_pixels=1024 * 1024, threads=3)  # fmt: skip
                assert job.model == "flux_1"  # the one it serves of [sdxl, flux_1]
                payload = job.payload
                assert job.ttl == lease_seconds(
                    width=payload.width, height=payload.height, steps=payload.ddim_steps,
                    sampler=str(payload.sampler_name), baseline="flux_1",
                )  # fmt: skip
                popped.append(str(job.id_))
            idle = await _pop(client, url, name="horde-flux", models=["flux_1"],
                              max_pixels=1024 * 1024, threads=3)  # fmt: skip
            assert idle.id_ is None
            for seed, job_id in enumerate(popped):
                assert await _submit(client, url, job_id, seed + 1) == 200
        return popped

    async def main() -> None:
        async with httpx.AsyncClient() as client:
            await _wait(broker, client)
        submitted = _client(broker.url, "submit", "3")
        assert submitted["kudos"] == 0
        assert submitted["check"]["waiting"] == 3
        assert not submitted["check"]["done"]
        popped = await worker_loop(broker.url)
        status = _client(broker.url, "status", submitted["id"])
        assert status["done"]
        assert status["finished"] == 3
        assert sorted(g["id"] for g in status["generations"]) == sorted(popped)
        assert {(g["img"], g["model"], g["worker"]) for g in status["generations"]} == {
            (IMG, "flux_1", "horde-flux")
        }
        other = _client(broker.url, "submit", "2")
        cancelled = _client(broker.url, "cancel", other["id"])
        assert cancelled["done"]
        assert cancelled["finished"] == 0

    try:
        run(main(), timeout=240)
    finally:
        broker.kill()


async def _wait(broker: BrokerProcess, client: httpx.AsyncClient) -> None:
    """Until the broker serves (a PostgreSQL broker may first be a standby for a while)."""
    for _ in range(400):
        assert broker.proc is not None
        if broker.proc.poll() is not None:
            raise AssertionError(broker.log.read_text()[-2000:])
        try:
            r = await client.get(
                f"{broker.url}/v1/status", headers={"Authorization": "Bearer wk-status"}
            )
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"the broker did not serve: {broker.log.read_text()[-2000:]}")


async def _capabilities_survive_a_kill(folder: Path, store: str, schema: str | None) -> None:
    broker = _config(folder, store, schema).start()
    client_headers = {"apikey": CLIENT_KEY}
    big = {"prompt": "a castle", "models": ["sdxl", "flux_1"],
           "params": {"width": 2048, "height": 2048, "steps": 20}}  # fmt: skip
    lora = {"prompt": "a lora", "params": {"loras": [{"name": "x"}]}}
    small = {"name": "horde-small", "models": ["sdxl", "flux_1"], "max_pixels": 1024 * 1024}
    large = {"name": "horde-large", "models": ["flux_1"], "max_pixels": 2048 * 2048}
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            await _wait(broker, client)
            ids = []
            for body in (big, lora):
                r = await client.post(
                    f"{broker.url}/api/v2/generate/async", json=body, headers=client_headers
                )
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            idle = await _pop(client, broker.url, **small)
            assert (idle.id_, idle.skipped.max_pixels, idle.skipped.lora) == (None, 1, 1)
            held = await _pop(client, broker.url, **large)
            assert held.model == "flux_1"
            ttl = held.ttl
            broker.signal(signal.SIGKILL)
            assert broker.proc is not None
            broker.proc.wait(timeout=10)
            broker.start()
            await _wait(broker, client)
            # The restored fleet still knows each worker's capabilities (journaled): the
            # lora job's explanation says the small worker may not run it.
            r = await client.get(f"{broker.url}/v1/jobs/job-2",
                                 headers={"Authorization": f"Bearer {CLIENT_KEY}"})  # fmt: skip
            assert (
                "does not fit: horde-large (lora), horde-small (lora)" in r.json()["explanation"]
            ), r.json()
            again = await _pop(client, broker.url, **small)
            assert (again.id_, again.skipped.lora, again.skipped.max_pixels) == (None, 1, 0)
            assert await _submit(client, broker.url, str(held.id_), 7) == 200
            broker.signal(signal.SIGKILL)  # the image is outside the journal: still there
            broker.proc.wait(timeout=10)
            broker.start()
            await _wait(broker, client)
            r = await client.get(f"{broker.url}/api/v2/generate/status/{ids[0]}")
            status = apimodels.ImageGenerateStatusResponse.model_validate(r.json())
            assert [(g.model, g.worker_name, g.img) for g in status.generations] == [
                ("flux_1", "horde-large", IMG)
            ]
            assert ttl == lease_seconds(
                width=2048, height=2048, steps=20, sampler="k_euler_a", baseline="flux_1"
            )
    finally:
        broker.kill()


def test_capabilities_and_grants_survive_a_kill_sqlite(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'broker.db'}"
    run(_capabilities_survive_a_kill(tmp_path, store, None), timeout=120)
    (blob,) = (tmp_path / "broker.db.blobs").iterdir()  # beside the database
    assert blob.read_text(encoding="ascii") == IMG


def test_capabilities_and_grants_survive_a_kill_postgresql(tmp_path: Path) -> None:
    with postgres_schema() as schema:
        run(_capabilities_survive_a_kill(tmp_path, POSTGRES_URL, schema), timeout=120)


def test_postgresql_keeps_images_in_a_table_and_sweeps_them() -> None:
    from prioqueue.broker._horde_blobs import GRACE_SECONDS, PostgresBlobs

    async def main(schema: str) -> None:
        blobs = PostgresBlobs(POSTGRES_URL, schema)
        await blobs.put("kept", "a")
        await blobs.put("gone", "b")
        await blobs.put("gone", "b")  # a retried write changes nothing
        later = time.time() + GRACE_SECONDS + 1
        assert await blobs.sweep({"kept"}, later) == 1
        assert (await blobs.get("kept"), await blobs.get("gone")) == ("a", None)

    with postgres_schema() as schema:
        import psycopg

        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        run(main(schema), timeout=60)


def test_horde_sdk_simple_client_waits_for_a_worker(tmp_path: Path) -> None:
    """``AIHordeAPISimpleClient.image_generate_request``: submit, poll, read, as users do."""
    broker = _config(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}").start()

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            await _wait(broker, client)
            env = {**os.environ, "AI_HORDE_URL": f"{broker.url}/api/"}
            user = subprocess.Popen(
                [sys.executable, str(SCRIPT), CLIENT_KEY, "generate", "2"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )  # fmt: skip
            try:
                served = 0
                for _ in range(600):  # until both images are served (the client imports first)
                    job = await _pop(client, broker.url, name="horde-sdxl", models=["sdxl"],
                                     max_pixels=1024 * 1024)  # fmt: skip
                    if job.id_ is None:
                        await asyncio.sleep(0.1)
                        continue
                    assert await _submit(client, broker.url, str(job.id_), 1) == 200
                    served += 1
                    if served == 2:
                        break
                out, err = await asyncio.to_thread(user.communicate, timeout=120)
            finally:
                if user.poll() is None:
                    user.kill()
            assert user.returncode == 0, err[-3000:]
            answer = json.loads(out.strip().splitlines()[-1])
            assert answer["models"] == ["sdxl", "sdxl"]

    try:
        run(main(), timeout=200)
    finally:
        broker.kill()
