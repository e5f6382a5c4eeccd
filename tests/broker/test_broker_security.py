"""Issue 21's broker security findings: ceilings, worker ids, leaks, queued bytes, hygiene."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from prioqueue.broker._http import WorkerKey

from .broker_helpers import BOB, KEYS, OPS, SUBMITTER, WORKER, api, run

LOW = {"Authorization": "Bearer sk-low"}


def test_a_key_ceiling_below_the_policy_minimum_is_kept() -> None:
    """Item 8: a -150 key waits behind another member's -100 batch job, whatever the order."""
    keys: dict[str, Any] = {
        **KEYS,
        "sk-low": {"role": "submitter", "member": "carol", "max_priority": -150},
    }

    async def scenario() -> None:
        async with api(policy={"minimum": -100, "maximum": 100}, keys=keys) as a:
            low = await a.submit(LOW, priority="interactive")
            batch = await a.submit(BOB, priority="batch")
            view = (await a.job(low, LOW)).json()
            assert view["priority"] == -150
            assert "priority -150" in view["explanation"]
            assert view["position"] == 2
            first = (await a.pop()).json()
            assert first["id"] == batch
            await a.finish(batch, "gpu-1", first["attempt"])
            assert (await a.pop()).json()["id"] == low

    run(scenario())


SCOPED: dict[str, Any] = {
    **KEYS,
    "wk-2": {"role": "worker", "workers": ["gpu-b"]},
    "wk-a": {"role": "worker", "workers": ["gpu-a"], "workers_prefix": "a-"},
}
WK2 = {"Authorization": "Bearer wk-2"}
WKA = {"Authorization": "Bearer wk-a"}


def test_a_worker_key_acts_only_as_its_own_worker_ids() -> None:
    """Item 4: wk-2 cannot heartbeat, pop, complete or fail as gpu-a (403 naming the rule)."""

    async def scenario() -> None:
        async with api(keys=SCOPED) as a:
            c = a.client
            job = await a.submit()
            grant = await c.post("/v1/workers/gpu-a/pop", json={}, headers=WKA)
            assert grant.status_code == 200
            attempt = grant.json()["attempt"]
            forged = {"worker": "gpu-a", "attempt": attempt, "result": {"forged": True}}
            for method, path, body in (
                ("POST", "/v1/workers/gpu-a/heartbeat", None),
                ("POST", "/v1/workers/gpu-a/pop", {}),
                ("POST", f"/v1/jobs/{job}/complete", forged),
                ("POST", f"/v1/jobs/{job}/fail", forged),
            ):
                r = await c.request(method, path, json=body, headers=WK2)
                assert r.status_code == 403, (path, r.text)
                assert r.json()["field"] == "worker"
                assert 'workers = ["gpu-b"]' in r.json()["error"]
                assert "wk-2" not in r.text  # the key itself is never echoed
            view = (await a.job(job)).json()
            assert (view["state"], view["result"]) == ("running", None)
            # Its own ids work: the exact name, and the prefix of wk-a.
            assert (await c.post("/v1/workers/gpu-b/pop", json={}, headers=WK2)).status_code == 204
            assert (await c.post("/v1/workers/a-9/pop", json={}, headers=WKA)).status_code == 204
            r = await c.post("/v1/workers/gpu-b/pop", json={}, headers=WKA)
            assert r.status_code == 403
            assert 'workers = ["gpu-a"] or workers_prefix = "a-"' in r.json()["error"]
            done = await c.post(f"/v1/jobs/{job}/complete", json=forged, headers=WKA)
            assert done.status_code == 200

    run(scenario())


def test_metrics_need_an_observer_key_unless_public() -> None:
    """Item 5: /metrics names members; it needs an observer or admin key by default."""

    async def scenario() -> None:
        async with api() as a:
            await a.submit()
            assert (await a.client.get("/metrics")).status_code == 401
            for headers in (SUBMITTER, WORKER):
                r = await a.client.get("/metrics", headers=headers)
                assert r.status_code == 403
                assert "observer = true" in r.json()["error"]
            r = await a.client.get("/metrics", headers=OPS)
            assert r.status_code == 200
            assert 'prioqueue_broker_jobs{state="queued"} 1.0' in r.text
        async with api(metrics_public=True) as a:
            assert (await a.client.get("/metrics")).status_code == 200

    run(scenario())


def test_an_explanation_names_other_members_jobs_only_to_an_observer() -> None:
    """Item 5: alice reads "ahead: (hidden) (member (another member), ...)", not bob's job."""

    async def scenario() -> None:
        async with api() as a:
            bobs = await a.submit(BOB)  # normal, ahead of alice's batch jobs
            mine = await a.submit(priority="batch")
            own = await a.submit(priority="batch")
            text = (await a.job(own)).json()["explanation"]
            assert "bob" not in text
            assert bobs not in text
            assert "ahead: (hidden) (member (another member), priority 0," in text
            assert f"ahead: {mine} (member alice" in text  # her own jobs stay named
            assert (await a.job(own)).json()["position"] == 3
        keys = {**KEYS, "sk-ops": {**KEYS["sk-ops"], "member": "alice"}}
        async with api(keys=keys) as a:  # an observer key of the same member sees names
            bobs = await a.submit(BOB)
            own = await a.submit(priority="batch")
            text = (await a.job(own, OPS)).json()["explanation"]
            assert f"ahead: {bobs} (member bob" in text

    run(scenario())


def test_queued_bytes_are_bounded_per_member_and_in_total() -> None:
    """Item 6: 413 for a payload over a limit, 429 over the member's or the total budget."""
    blob = "x" * 3000  # 3002 bytes as JSON

    async def scenario() -> None:
        async with api(max_queued_bytes=10_000, max_queued_bytes_per_member=7_000) as a:
            c = a.client
            r = await c.post("/v1/jobs", json={"payload": "x" * 7_100}, headers=SUBMITTER)
            assert r.status_code == 413
            assert "max_queued_bytes_per_member=7000" in r.json()["error"]
            first = await a.submit(payload=blob)
            await a.submit(payload=blob)
            r = await c.post("/v1/jobs", json={"payload": blob}, headers=SUBMITTER)
            assert r.status_code == 429
            assert "max_queued_bytes_per_member=7000" in r.json()["error"]
            assert int(r.headers["retry-after"]) >= 1
            await a.submit(BOB, payload=blob)  # 9006 in all
            r = await c.post("/v1/jobs", json={"payload": blob}, headers=BOB)
            assert r.status_code == 429
            assert "max_queued_bytes=10000" in r.json()["error"]
            # A finished job gives its bytes back (a requeue does not).
            grant = (await a.pop()).json()
            assert grant["id"] == first
            await a.finish(first, "gpu-1", grant["attempt"])
            await a.submit(payload=blob)
            engine = a.broker.engine
            assert engine is not None
            jobs = engine.jobs
            assert (jobs.total_bytes, jobs.member_bytes) == (9006, {"alice": 6004, "bob": 3002})
            again = type(engine).restore(engine.snapshot(), engine.config).jobs
            assert (again.total_bytes, again.member_bytes) == (9006, jobs.member_bytes)

    run(scenario())


def test_the_default_bounds_queued_bytes() -> None:
    from prioqueue.broker import parse_config

    assert parse_config({}).max_queued_bytes == 256 * 1024 * 1024
    assert parse_config({"max_queued_bytes": 0}).max_queued_bytes is None


def test_a_group_label_with_a_slash_is_refused_at_submit() -> None:
    """Low: such a label could never be read at /v1/groups/{id}."""

    async def scenario() -> None:
        async with api() as a:
            r = await a.client.post("/v1/jobs", json={"group": "film/1"}, headers=SUBMITTER)
            assert r.status_code == 422
            assert r.json()["field"] == "group"
            assert "may not contain '/'" in r.json()["error"]
            await a.submit(group="film-1")
            assert (await a.client.get("/v1/groups/film-1", headers=SUBMITTER)).status_code == 200

    run(scenario())


def test_idle_workers_are_forgotten_after_a_bound() -> None:
    """Low: 300 workers that popped once are forgotten; a busy one is kept until it is idle."""

    async def scenario() -> None:
        async with api(forget_workers_seconds=600, worker_timeout_seconds=0) as a:
            job = await a.submit()
            held = (await a.pop("busy")).json()
            for n in range(300):
                assert (await a.pop(f"w{n}")).status_code == 204
            engine = a.broker.engine
            assert engine is not None
            assert engine.status()["workers"] == 301
            a.clock.advance(601)
            await a.submit()  # the tick before it (or the timer's) forgets them
            assert engine.status()["workers"] == 1
            assert set(engine.workers) == {"busy"} == set(engine.workers.seen)
            assert [w.name for w in engine.fleet.workers()] == ["busy"]
            r = await a.client.post("/v1/workers/w1/heartbeat", headers=WORKER)
            assert r.status_code == 404  # forgotten: pop again to join
            assert (await a.finish(job, "busy", held["attempt"])).status_code == 200
            a.clock.advance(601)
            await a.submit()
            assert engine.status()["workers"] == 0
            assert (await a.pop("w1")).status_code == 200  # a forgotten worker joins again

    run(scenario())


def test_the_app_keeps_header_and_request_limits_under_any_server() -> None:
    """Item 3, "whichever server runs it": the ASGI app itself refuses oversized or too many
    headers (431) and the request past max_connections in flight (503), not only
    ``prioqueue broker``'s HTTP protocol."""
    import asyncio

    limits = {"max_header_count": 20, "max_header_bytes": 100, "max_connections": 1}

    async def scenario() -> None:
        async with api(connections=limits) as a:
            c = a.client
            many = {f"x-h{i}": "1" for i in range(30)}
            r = await c.get("/v1/status", headers={**WORKER, **many})
            assert r.status_code == 431
            assert "max_header_count=20" in r.json()["error"]
            r = await c.get("/v1/status", headers={**WORKER, "x-big": "a" * 200})
            assert r.status_code == 431
            assert "max_header_bytes=100" in r.json()["error"]
            assert (await c.get("/v1/status", headers=WORKER)).status_code == 200
            gate = asyncio.Event()

            async def slow_body() -> AsyncIterator[bytes]:
                yield b"{"
                await gate.wait()
                yield b"}"

            held = asyncio.ensure_future(
                c.post(
                    "/v1/jobs",
                    content=slow_body(),
                    headers={**SUBMITTER, "Content-Type": "application/json"},
                )
            )
            for _ in range(100):  # until the slow request is in flight (loop turns, no time)
                await asyncio.sleep(0)
                r = await c.get("/v1/status", headers=WORKER)
                if r.status_code == 503:
                    break
            assert r.status_code == 503
            assert "max_connections=1" in r.json()["error"]
            assert r.headers["retry-after"] == "2"
            gate.set()
            assert (await held).status_code == 201
            assert (await c.get("/v1/status", headers=WORKER)).status_code == 200

    run(scenario())


def test_any_route_with_a_worker_in_its_path_checks_the_worker_id() -> None:
    """Item 4: the check lives in the worker-key dependency, so a route added later (leave,
    a long-poll pop) that names ``{worker}`` in its path gets it without saying so."""

    async def scenario() -> None:
        async with api(keys=SCOPED) as a:
            app = a.client._transport.app  # type: ignore[attr-defined]

            @app.post("/v1/workers/{worker}/leave-test")  # type: ignore[untyped-decorator]
            async def leave(worker: str, _key: WorkerKey) -> dict[str, str]:
                return {"left": worker}

            r = await a.client.post("/v1/workers/gpu-a/leave-test", headers=WK2)
            assert r.status_code == 403
            assert 'workers = ["gpu-b"]' in r.json()["error"]
            r = await a.client.post("/v1/workers/gpu-b/leave-test", headers=WK2)
            assert r.json() == {"left": "gpu-b"}

    run(scenario())


def test_the_dashboard_shows_a_worker_key_only_its_own_workers_jobs() -> None:
    """Item 4: /v1/dashboard does not tell wk-2 the job and attempt gpu-a holds."""

    async def scenario() -> None:
        async with api(keys=SCOPED) as a:
            job = await a.submit()
            assert (await a.client.post("/v1/workers/gpu-a/pop", json={}, headers=WKA)).is_success
            rows = {}
            for headers in (WK2, WKA):
                view = (await a.client.get("/v1/dashboard", headers=headers)).json()
                rows[headers["Authorization"]] = {r["name"]: r for r in view["workers"]}
            assert rows[WK2["Authorization"]]["gpu-a"]["running"] == {"hidden": True}
            assert job not in str(rows[WK2["Authorization"]])
            assert rows[WKA["Authorization"]]["gpu-a"]["running"]["id"] == job

    run(scenario())


def test_queued_bytes_follow_the_lifecycle() -> None:
    """Item 6 with issue 17's lifecycle: a retried job keeps its bytes, an expired one frees
    them."""
    blob = "x" * 3000  # 3002 bytes as JSON

    async def scenario() -> None:
        async with api(max_queued_bytes=10_000) as a:
            engine = a.broker.engine
            assert engine is not None
            job = await a.submit(payload=blob)
            grant = (await a.pop()).json()
            r = await a.client.post(
                f"/v1/jobs/{job}/fail",
                json={"worker": "gpu-1", "attempt": grant["attempt"], "retry": True},
                headers=WORKER,
            )
            assert r.json()["state"] == "queued", r.text
            assert engine.jobs.total_bytes == 3002
            await a.submit(payload=blob, ttl=5)
            assert engine.jobs.total_bytes == 6004
            a.clock.advance(6)
            await a.submit()  # the tick before it expires the ttl job
            assert engine.jobs.total_bytes == 3002
            assert engine.jobs.member_bytes == {"alice": 3002}

    run(scenario())
