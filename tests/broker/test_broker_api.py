"""Every route of the broker and its error paths, over HTTP against the app in memory."""

from __future__ import annotations

from typing import Any

import pytest

from prioqueue import UnknownGroup

from .broker_helpers import BOB, IMAGE, KEYS, SUBMITTER, WORKER, Api, api, run


def test_auth_401_without_or_with_an_unknown_key_and_403_for_the_wrong_role() -> None:
    async def scenario() -> None:
        async with api() as a:
            c = a.client
            r = await c.post("/v1/jobs", json={})
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["field"] == "Authorization"
            r = await c.post("/v1/jobs", json={}, headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401
            r = await c.post("/v1/jobs", json={}, headers={"Authorization": "Basic sk-alice"})
            assert r.status_code == 401
            r = await c.post("/v1/jobs", json={}, headers=WORKER)
            assert r.status_code == 403
            assert "submitter" in r.json()["error"]
            r = await c.post("/v1/workers/g/pop", json={}, headers=SUBMITTER)
            assert r.status_code == 403
            r = await c.post("/v1/workers/g/heartbeat", headers=SUBMITTER)
            assert r.status_code == 403
            r = await c.post("/v1/jobs/x/complete", json={"worker": "g", "attempt": 1})
            assert r.status_code == 401
            r = await c.get("/v1/status")
            assert r.status_code == 401
            assert (await c.get("/v1/status", headers=WORKER)).status_code == 200
            assert (await c.get("/v1/status", headers=SUBMITTER)).status_code == 200

    run(scenario())


def test_priority_from_body_or_header_capped_at_the_keys_ceiling() -> None:
    async def scenario() -> None:
        async with api() as a:
            ids = [
                await a.submit(priority="interactive"),
                await a.submit(priority=5000),
                await a.submit(BOB, priority="interactive"),
                await a.submit(),
            ]
            header = await a.client.post(
                "/v1/jobs", json={}, headers={**SUBMITTER, "X-LlamaSwap-Priority": "batch"}
            )
            ids.append(header.json()["id"])
            body_wins = await a.client.post(
                "/v1/jobs",
                json={"priority": 7},
                headers={**SUBMITTER, "X-LlamaSwap-Priority": "batch"},
            )
            ids.append(body_wins.json()["id"])
            priorities = []
            for job_id, who in zip(
                ids, [SUBMITTER, SUBMITTER, BOB, SUBMITTER, SUBMITTER, SUBMITTER]
            ):
                priorities.append((await a.job(job_id, who)).json()["priority"])
            assert priorities == [100, 100, 0, 0, -100, 7]

    run(scenario())


def test_idempotency_key_gives_the_same_job_never_two() -> None:
    async def scenario() -> None:
        async with api() as a:
            headers = {**SUBMITTER, "Idempotency-Key": "film-1-shot-3"}
            first = await a.client.post("/v1/jobs", json={"payload": {"n": 1}}, headers=headers)
            again = await a.client.post("/v1/jobs", json={"payload": {"n": 1}}, headers=headers)
            assert first.status_code == 201
            assert again.status_code == 200
            assert first.json() == again.json()
            changed = await a.client.post("/v1/jobs", json={"payload": {"n": 2}}, headers=headers)
            assert changed.status_code == 422
            assert changed.json()["field"] == "Idempotency-Key"
            other = await a.client.post(
                "/v1/jobs",
                json={"payload": {"n": 1}},
                headers={**BOB, "Idempotency-Key": "film-1-shot-3"},
            )
            assert other.status_code == 201
            assert other.json()["id"] != first.json()["id"]
            assert await a.queued() == 2

    run(scenario())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"estimate": -1}, "estimate"),
        ({"estimate": "soon"}, "estimate"),
        ({"priority": [1]}, "priority"),
        ({"priority": -(10**12)}, "priority"),
        ({"priority": True}, "priority"),
        ({"estimate": True}, "estimate"),
        ({"priority": "-99999999999999"}, "priority"),
        ({"model": ""}, "model"),
        ({"model": "x" * 201}, "model"),
        ({"colour": "red"}, "colour"),
        ({"image": {"width": 0, "height": 512}}, "image"),
        ({"image": {"width": 512}}, "image"),
        ({"image": {"width": 512, "height": 512, "loras": 9}}, "image"),
        ({"image": {"width": 512, "height": 512, "speed": 1}}, "image"),
        (
            {"image": {"width": 512, "height": 512, "extra_slow_worker": True}},
            "image.extra_slow_worker",
        ),
        ({"image": [1, 2]}, "image"),
        ({"image": {"width": 10**200, "height": 512}}, "image"),
        ({"image": {"width": 10**12, "height": 10**12, "steps": 10**9}}, "image"),
        ({"group": 5}, "group"),
    ],
)
def test_bad_submit_is_a_422_naming_the_field(body: dict[str, Any], field: str) -> None:
    async def scenario() -> None:
        async with api() as a:
            r = await a.client.post("/v1/jobs", json=body, headers=SUBMITTER)
            assert r.status_code == 422, r.text
            assert r.json()["field"] == field
            assert field.split(".", maxsplit=1)[0] in r.json()["error"]
            assert (await a.status())["totals"]["submitted"] == 0

    run(scenario())


def test_malformed_json_and_oversized_bodies_are_4xx() -> None:
    async def scenario() -> None:
        async with api(max_body_bytes=2048) as a:
            r = await a.client.post(
                "/v1/jobs",
                content=b"{not json",
                headers={**SUBMITTER, "content-type": "application/json"},
            )
            assert r.status_code == 422
            assert r.json()["field"] == "body", r.text  # not the offset of the bad character
            assert "JSON" in r.json()["error"]
            r = await a.client.post("/v1/jobs", json={"payload": "x" * 4096}, headers=SUBMITTER)
            assert r.status_code == 413
            assert r.json()["field"] == "body"

            async def chunks() -> Any:  # no Content-Length: counted while read
                for _ in range(8):
                    yield b" " * 1024

            r = await a.client.post(
                "/v1/jobs",
                content=chunks(),
                headers={**SUBMITTER, "content-type": "application/json"},
            )
            assert r.status_code == 413

    run(scenario())


def test_a_submitter_sees_and_cancels_only_its_members_jobs() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit(payload={"prompt": "a cat"})
            assert (await a.job(job, BOB)).status_code == 404
            assert (await a.client.delete(f"/v1/jobs/{job}", headers=BOB)).status_code == 404
            assert (await a.job("job-999")).status_code == 404
            view = (await a.job(job)).json()
            assert view["state"] == "queued"
            assert view["position"] == 1
            assert "score" in view["explanation"]
            cancelled = await a.client.delete(f"/v1/jobs/{job}", headers=SUBMITTER)
            assert cancelled.status_code == 200
            assert cancelled.json()["state"] == "cancelled"
            again = await a.client.delete(f"/v1/jobs/{job}", headers=SUBMITTER)
            assert again.status_code == 409
            assert (await a.pop()).status_code == 204

    run(scenario())


def test_pop_grants_the_image_lease_and_a_slow_worker_gets_three_times_it() -> None:
    async def scenario() -> None:
        async with api(default_lease_seconds=120) as a:
            first = await a.submit(image=IMAGE, payload={"prompt": "p"}, model="sdxl")
            second = await a.submit(image=IMAGE, model="sdxl")
            plain = await a.submit()
            r = await a.pop("gpu-1")
            assert r.status_code == 200
            grant = r.json()
            assert grant["id"] == first
            assert grant["payload"] == {"prompt": "p"}
            assert grant["image"] == IMAGE
            assert grant["attempt"] == 1
            assert grant["lease_seconds"] == 430
            assert grant["deadline"] == pytest.approx(a.clock.t + 430)
            view = (await a.job(first)).json()
            assert view["state"] == "running"
            assert view["attempt"] == 1
            await a.finish(first, "gpu-1", 1)
            r = await a.pop("gpu-slow", slow=True)
            assert (r.json()["id"], r.json()["lease_seconds"]) == (second, 1290)
            await a.finish(second, "gpu-slow", 1)
            r = await a.pop("gpu-1")
            assert (r.json()["id"], r.json()["lease_seconds"]) == (plain, 120)

    run(scenario())


def test_pop_is_204_with_the_idle_reasons_when_nothing_fits() -> None:
    async def scenario() -> None:
        async with api() as a:
            r = await a.pop()
            assert r.status_code == 204
            assert r.headers["x-prioqueue-idle"] == "empty"
            assert r.content == b""
            await a.submit(model="flux")
            r = await a.pop("gpu-sd", models=["sdxl"])
            assert r.status_code == 204
            assert "model=1" in r.headers["x-prioqueue-idle"]
            r = await a.pop("gpu-flux", models=["flux"])
            assert r.status_code == 200

    run(scenario())


@pytest.mark.parametrize(
    "body",
    [
        {"slots": 0},
        {"slots": 99},
        {"slots": True},
        {"models": "flux"},
        {"slow": "very"},
        {"slow": "yes"},
        {"slow": 1},
        {"gpus": 2},
        {"models": [""]},
    ],
)
def test_bad_pop_is_422(body: dict[str, Any]) -> None:
    async def scenario() -> None:
        async with api() as a:
            r = await a.pop(**body)
            assert r.status_code == 422
            assert r.json()["field"].split(".")[0] in body

    run(scenario())


def test_complete_and_fail_need_the_current_grant_else_409_and_nothing_changes() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit(image=IMAGE)
            await a.pop("gpu-1")
            for worker, attempt in (("gpu-2", 1), ("gpu-1", 2)):
                for op in ("complete", "fail"):
                    r = await a.finish(job, worker, attempt, op, {"bogus": True})
                    assert r.status_code == 409, r.text
            assert (await a.finish("job-77", "gpu-1", 1)).status_code == 404
            view = (await a.job(job)).json()
            assert (view["state"], view["result"]) == ("running", None)
            r = await a.finish(job, "gpu-1", 1, result={"url": "s3://out.png"})
            assert r.status_code == 200
            assert r.json()["state"] == "done"
            view = (await a.job(job)).json()
            assert (view["state"], view["result"]) == ("done", {"url": "s3://out.png"})
            assert (await a.finish(job, "gpu-1", 1)).status_code == 409
            assert (await a.finish(job, "gpu-1", 1, "fail")).status_code == 409
            other = await a.submit()
            await a.pop("gpu-1")
            r = await a.finish(other, "gpu-1", 1, "fail", {"error": "CUDA out of memory"})
            assert r.json()["state"] == "failed"
            assert (await a.job(other)).json()["result"] == {"error": "CUDA out of memory"}

    run(scenario())


@pytest.mark.parametrize(
    "body",
    [
        {"worker": "g", "attempt": 0},
        {"worker": "g", "attempt": True},
        {"worker": "", "attempt": 1},
        {"attempt": 1},
        {"worker": "g"},
    ],
)
def test_bad_finish_is_422(body: dict[str, Any]) -> None:
    async def scenario() -> None:
        async with api() as a:
            r = await a.client.post("/v1/jobs/job-1/complete", json=body, headers=WORKER)
            assert r.status_code == 422
            assert r.json()["field"] in ("worker", "attempt")

    run(scenario())


def test_results_over_the_limit_are_413_and_change_nothing() -> None:
    async def scenario() -> None:
        async with api(result_max_bytes=100) as a:
            job = await a.submit()
            await a.pop()
            r = await a.finish(job, "gpu-1", 1, result={"blob": "x" * 200})
            assert r.status_code == 413
            assert r.json()["field"] == "result"
            assert (await a.job(job)).json()["state"] == "running"
            assert (await a.finish(job, "gpu-1", 1, result="ok")).status_code == 200

    run(scenario())


def test_an_expired_lease_requeues_the_job_and_the_old_holder_gets_409() -> None:
    async def scenario() -> None:
        async with api(max_attempts=2, default_lease_seconds=60) as a:
            job = await a.submit()
            assert (await a.pop("gpu-1")).json()["attempt"] == 1
            a.clock.advance(61)
            r = await a.pop("gpu-2")
            assert (r.json()["id"], r.json()["attempt"]) == (job, 2)
            assert (await a.finish(job, "gpu-1", 1)).status_code == 409
            a.clock.advance(61)
            view = (await a.job(job)).json()
            assert view["state"] == "running"  # nothing ran since: the tick is due
            assert (await a.pop("gpu-3")).status_code == 204
            view = (await a.job(job)).json()
            assert view["state"] == "failed"
            assert "expired" in view["result"]["error"]
            assert (await a.finish(job, "gpu-2", 2)).status_code == 409
            assert await a.totals("expired", "failed") == (2, 1)

    run(scenario())


def test_finished_jobs_are_kept_for_the_retention_then_forgotten() -> None:
    async def scenario() -> None:
        async with api(result_ttl_seconds=100) as a:
            headers = {**SUBMITTER, "Idempotency-Key": "k"}
            job = (await a.client.post("/v1/jobs", json={}, headers=headers)).json()["id"]
            await a.pop()
            await a.finish(job, "gpu-1", 1, result=[1, 2])
            a.clock.advance(99)
            assert (await a.job(job)).json()["result"] == [1, 2]
            again = await a.client.post("/v1/jobs", json={}, headers=headers)
            assert (again.status_code, again.json()["id"]) == (200, job)
            a.clock.advance(2)
            await a.worker_post("gpu-1", "heartbeat")
            assert (await a.job(job)).status_code == 404
            fresh = await a.client.post("/v1/jobs", json={}, headers=headers)
            assert fresh.status_code == 201
            assert fresh.json()["id"] != job

    run(scenario())


def test_heartbeat_lists_the_workers_jobs_and_unknown_workers_are_404() -> None:
    async def scenario() -> None:
        async with api() as a:
            r = await a.worker_post("ghost", "heartbeat")
            assert r.status_code == 404
            job = await a.submit(model="sdxl")
            await a.pop("gpu-1", slots=2)
            r = await a.client.post(
                "/v1/workers/gpu-1/heartbeat", json={"resident": "sdxl"}, headers=WORKER
            )
            assert r.status_code == 200
            held = [{"id": job, "attempt": 1, "deadline": a.clock.t + 900}]
            assert r.json() == {"jobs": held, "waiting": 0}  # no long poll of it waits
            assert r.headers["X-Prioqueue-Waiting"] == "0"
            r = await a.client.post("/v1/workers/gpu-1/heartbeat", json={"x": 1}, headers=WORKER)
            assert r.status_code == 422

    run(scenario())


def test_cancelling_a_running_job_makes_its_completion_409() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit()
            await a.pop()
            r = await a.client.delete(f"/v1/jobs/{job}", headers=SUBMITTER)
            assert r.json()["state"] == "cancelled"
            assert (await a.finish(job, "gpu-1", 1)).status_code == 409
            assert (await a.job(job)).json()["state"] == "cancelled"

    run(scenario())


def test_a_full_queue_is_429_with_retry_after() -> None:
    async def scenario() -> None:
        async with api(max_queued_per_member=1) as a:
            await a.submit()
            r = await a.client.post("/v1/jobs", json={}, headers=SUBMITTER)
            assert r.status_code == 429
            assert int(r.headers["retry-after"]) >= 1
            await a.submit(BOB)

    run(scenario())


def test_status_metrics_and_openapi() -> None:
    async def scenario() -> None:
        async with api(metrics_public=True) as a:
            await a.submit()
            status = await a.status()
            assert status["role"] == "leader"
            assert status["jobs"]["queued"] == 1
            metrics = await a.client.get("/metrics")  # metrics_public: no key needed
            assert metrics.status_code == 200
            assert 'prioqueue_broker_jobs{state="queued"} 1.0' in metrics.text
            assert "prioqueue_broker_leader 1.0" in metrics.text
            spec = (await a.client.get("/openapi.json")).json()
            assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/workers/{worker}/pop"} <= set(
                spec["paths"]
            )
            assert "204" in spec["paths"]["/v1/workers/{worker}/pop"]["post"]["responses"]

    run(scenario())


def test_the_journal_holds_exactly_the_acknowledged_changes() -> None:
    async def scenario() -> None:
        async with api() as a:
            await a.client.post("/v1/jobs", json={"estimate": -1}, headers=SUBMITTER)
            job = await a.submit()
            await a.client.get(f"/v1/jobs/{job}", headers=SUBMITTER)
            await a.pop()
            await a.finish(job, "gpu-2", 1)
            await a.finish(job, "gpu-1", 1)
            # The HTTP pop is the engine's try_pop (journaled only when it changes something).
            assert [e.op for e in a.journal.entries] == ["submit", "try_pop", "complete"]
            assert isinstance(a, Api)

    run(scenario())


def test_groups_status_and_cancel_are_per_member() -> None:
    async def scenario() -> None:
        async with api() as a:
            shots = [await a.submit(group="film-1", estimate=100) for _ in range(4)]
            other = await a.submit(BOB, group="film-1")
            r = await a.client.get("/v1/groups/film-9", headers=SUBMITTER)
            assert (r.status_code, r.json()["field"]) == (404, "group")
            assert "no group 'film-9' of member 'alice'" in r.json()["error"]
            grant = (await a.pop()).json()
            assert grant["id"] == shots[0]
            a.clock.advance(30)
            await a.finish(shots[0], "gpu-1", 1)
            await a.pop()
            view = (await a.client.get("/v1/groups/film-1", headers=SUBMITTER)).json()
            assert {k: view[k] for k in ("queued", "running", "done", "failed", "cancelled")} == {
                "queued": 2, "running": 1, "done": 1, "failed": 0, "cancelled": 0,
            }  # fmt: skip
            assert view["member"] == "alice"
            assert view["gpu_seconds"] == pytest.approx(30)
            assert view["mean_runtime"] == pytest.approx(30)
            # One worker: shot 2 runs now (estimate 100 s), then fair share serves bob's job
            # (no estimate: the recent mean, 30 s), then shots 3 and 4 (100 s each).
            assert view["forecast_finish"] == pytest.approx(a.clock.t + 100 + 30 + 200)
            assert view["forecast_seconds"] == pytest.approx(330)
            assert view["now"] == pytest.approx(a.clock.t)
            a.clock.advance(50)  # no operation since: the same forecast, 50 s closer
            later = (await a.client.get("/v1/groups/film-1", headers=SUBMITTER)).json()
            assert later["forecast_finish"] == pytest.approx(view["forecast_finish"])
            assert later["forecast_seconds"] == pytest.approx(280)
            bobs = (await a.client.get("/v1/groups/film-1", headers=BOB)).json()
            assert (bobs["member"], bobs["queued"], bobs["running"], bobs["done"]) == (
                "bob", 1, 0, 0,
            )  # fmt: skip
            r = await a.client.delete("/v1/groups/film-1", headers=SUBMITTER)
            assert r.json() == {"group": "film-1", "member": "alice", "cancelled": shots[2:]}
            assert (await a.job(shots[1])).json()["state"] == "running"
            assert (await a.job(other, BOB)).json()["state"] == "queued"
            r = await a.client.delete("/v1/groups/film-1?running=cancel", headers=SUBMITTER)
            assert r.json()["cancelled"] == [shots[1]]
            assert (await a.job(shots[1])).json()["state"] == "cancelled"
            r = await a.client.delete("/v1/groups/film-1?running=maybe", headers=SUBMITTER)
            assert (r.status_code, r.json()["field"]) == (422, "query.running")
            done = (await a.client.get("/v1/groups/film-1", headers=SUBMITTER)).json()
            assert (done["queued"], done["running"], done["cancelled"]) == (0, 0, 3)
            assert done["gpu_seconds"] == pytest.approx(30 + 50)  # shot 2 ran 50 s
            assert (done["forecast_finish"], done["forecast_seconds"]) == (None, None)
            assert (await a.client.delete("/v1/groups/film-1", headers=WORKER)).status_code == 403
            r = await a.client.delete("/v1/groups/film-9", headers=SUBMITTER)
            assert (r.status_code, r.json()["field"]) == (404, "group")
            ops = [e.op for e in a.journal.entries]
            assert ops.count("cancel_group") == 2  # one journaled op each; refusals none

    run(scenario())


def test_a_label_that_looks_namespaced_never_reaches_another_members_group() -> None:
    async def scenario() -> None:
        async with api() as a:
            # The core's key is f"{len(member)}:{member}/{label}": "5:alice/x" for alice's
            # "x"; bob's label "x" with a crafted prefix must stay bob's.
            await a.submit(group="x")
            crafted = await a.client.post("/v1/jobs", json={"group": "5:alice/x"}, headers=BOB)
            assert crafted.status_code == 422  # no '/' in a label (issue 21)
            await a.submit(BOB, group="x")
            mine = (await a.client.get("/v1/groups/x", headers=SUBMITTER)).json()
            assert mine["queued"] == 1
            engine = a.broker.engine
            assert engine is not None
            assert engine.fleet.group_status("5:alice/x", now=engine.now).members == ("alice",)
            theirs = (await a.client.get("/v1/groups/x", headers=BOB)).json()
            assert theirs["queued"] == 1

    run(scenario())


def test_observer_and_admin_keys_reach_other_members_groups() -> None:
    keys = {
        **KEYS,
        "sk-ops": {"role": "submitter", "member": "ops", "observer": True},
        "sk-root": {"role": "submitter", "member": "root", "admin": True},
    }
    ops = {"Authorization": "Bearer sk-ops"}
    root = {"Authorization": "Bearer sk-root"}

    async def scenario() -> None:
        async with api(keys=keys) as a:
            jobs = [await a.submit(BOB, group="film") for _ in range(2)]
            r = await a.client.get("/v1/groups/film?member=bob", headers=SUBMITTER)
            assert (r.status_code, r.json()["field"]) == (403, "member")
            assert "observer = true" in r.json()["error"]
            own = await a.client.get("/v1/groups/film?member=alice", headers=SUBMITTER)
            assert own.status_code == 404  # her own (empty) name space: allowed, unknown
            for headers in (ops, root):
                r = await a.client.get("/v1/groups/film?member=bob", headers=headers)
                assert r.status_code == 200, r.text
                assert (r.json()["member"], r.json()["queued"]) == ("bob", 2)
            r = await a.client.get("/v1/groups/film", headers=ops)  # its own member: none
            assert r.status_code == 404
            r = await a.client.get("/v1/groups/film?member=", headers=ops)
            assert (r.status_code, r.json()["field"]) == (422, "query.member")
            r = await a.client.delete("/v1/groups/film?member=bob", headers=ops)
            assert (r.status_code, r.json()["field"]) == (403, "member")
            assert "admin = true" in r.json()["error"]
            r = await a.client.delete("/v1/groups/film?member=bob", headers=SUBMITTER)
            assert r.status_code == 403
            assert [e.op for e in a.journal.entries].count("cancel_group") == 0
            r = await a.client.delete("/v1/groups/film?member=bob", headers=root)
            assert r.json() == {"group": "film", "member": "bob", "cancelled": jobs}
            assert (await a.job(jobs[0], BOB)).json()["state"] == "cancelled"

    run(scenario())


def test_a_workers_fail_counts_as_failed_in_the_group() -> None:
    async def scenario() -> None:
        async with api() as a:
            first = await a.submit(group="film", estimate=10)
            await a.submit(group="film", estimate=10)
            await a.pop()
            a.clock.advance(4)
            r = await a.finish(first, "gpu-1", 1, op="fail", result={"error": "oom"})
            assert r.json()["state"] == "failed"
            view = (await a.client.get("/v1/groups/film", headers=SUBMITTER)).json()
            assert (view["failed"], view["cancelled"], view["queued"]) == (1, 0, 1)
            assert view["gpu_seconds"] == pytest.approx(4)
            assert view["mean_runtime"] is None  # no job done yet
            status = (await a.client.get("/v1/status", headers=SUBMITTER)).json()
            assert status["totals"]["failed"] == 1

    run(scenario())


def test_a_group_is_forgotten_with_its_last_kept_job() -> None:
    async def scenario() -> None:
        async with api(result_ttl_seconds=60) as a:
            job = await a.submit(group="film")
            await a.submit(group="keep")
            a.clock.advance(1)
            await a.client.delete(f"/v1/jobs/{job}", headers=SUBMITTER)
            assert (await a.client.get("/v1/groups/film", headers=SUBMITTER)).status_code == 200
            a.clock.advance(60)
            await a.submit()  # the tick before it drops the record and the group
            assert (await a.job(job)).status_code == 404
            r = await a.client.get("/v1/groups/film", headers=SUBMITTER)
            assert r.status_code == 404
            engine = a.broker.engine
            assert engine is not None
            with pytest.raises(UnknownGroup):
                engine.fleet.group_status("5:alice/film", now=engine.now)
            assert (await a.client.get("/v1/groups/keep", headers=SUBMITTER)).status_code == 200

    run(scenario())


def test_a_position_far_back_is_null_and_bounded() -> None:
    async def scenario() -> None:
        from prioqueue.broker.engine import AHEAD_LIMIT

        async with api() as a:
            engine = a.broker.engine
            assert engine is not None
            for _ in range(AHEAD_LIMIT + 1):  # straight into the engine: the HTTP path is tested
                engine.apply("submit", {"member": "alice", "tier": "pro", "priority": 0}, a.clock.t)
            last = await a.submit()
            view = (await a.job(last)).json()
            assert view["position"] is None
            assert view["explanation"].startswith(f"more than {AHEAD_LIMIT} jobs ahead")
            assert (await a.job("job-1")).json()["position"] == 1

    run(scenario())


def test_payload_and_result_nested_too_deep_are_422_and_nothing_is_granted() -> None:
    """JSON the broker could not serialize back (pydantic stops at 255 levels) is refused on
    the way in: else the pop that grants it, or every read of its result, is a 500."""

    def nested(depth: int) -> Any:
        value: Any = []
        for _ in range(depth - 1):
            value = [value]
        return value

    async def scenario() -> None:
        async with api() as a:
            c = a.client
            r = await c.post("/v1/jobs", json={"payload": nested(300)}, headers=SUBMITTER)
            assert (r.status_code, r.json()["field"]) == (422, "payload"), r.text
            assert "deep" in r.json()["error"]
            assert (await a.pop()).status_code == 204
            job = await a.submit(payload=nested(64))
            granted = await a.pop()
            assert granted.status_code == 200
            assert granted.json()["payload"] == nested(64)
            r = await a.finish(job, "gpu-1", 1, result=nested(300))
            assert (r.status_code, r.json()["field"]) == (422, "result"), r.text
            assert (await a.job(job)).json()["state"] == "running"
            r = await a.finish(job, "gpu-1", 1, result={"deep": nested(63)})
            assert r.status_code == 200, r.text
            assert (await a.job(job)).json()["result"] == {"deep": nested(63)}

    run(scenario())


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("submit", b'{"payload": "\\ud800"}', "payload"),
        ("submit", b'{"payload": {"k\\udfff": 1}}', "payload"),
        ("submit", b'{"image": {"width": 512, "height": 512, "sampler": "\\ud800"}}', "image"),
        ("complete", b'{"worker": "gpu-1", "attempt": 1, "result": ["\\udc00"]}', "result"),
        ("submit", b'{"payload": NaN}', "payload"),
        ("submit", b'{"payload": {"a": [-Infinity]}}', "payload"),
        ("submit", b'{"image": {"width": 512, "height": 512, "baseline": NaN}}', "image"),
        ("complete", b'{"worker": "gpu-1", "attempt": 1, "result": Infinity}', "result"),
    ],
)
def test_json_the_broker_cannot_send_back_or_journal_is_422_naming_the_field(
    route: str, body: bytes, field: str
) -> None:
    """Half a UTF-16 pair (no text the broker could send back) or NaN/Infinity (Python's
    parser takes them; a durable store's journal refuses them, which stops the broker)."""

    async def scenario() -> None:
        async with api() as a:
            job = await a.submit()
            assert (await a.pop()).status_code == 200
            url = "/v1/jobs" if route == "submit" else f"/v1/jobs/{job}/complete"
            headers = {**(SUBMITTER if route == "submit" else WORKER)}
            headers["content-type"] = "application/json"
            r = await a.client.post(url, content=body, headers=headers)
            assert (r.status_code, r.json()["field"]) == (422, field), r.text
            assert "surrogate" in r.json()["error"] or "NaN" in r.json()["error"]
            assert (await a.pop("gpu-2")).status_code == 204  # nothing new was queued
            assert (await a.job(job)).json()["state"] == "running"

    run(scenario())
