"""Long polls are woken only by what concerns them (issue 30), and a gone client takes nothing.

Behaviour, counted, never timed: ``Changes.woken`` counts the waiters woken. A job waiter wakes
for its own job's end only; a pop waiter for a job it could take (one waiter per job, handed
on), or its own worker's news; joining workers wake nobody. A property test checks the model's
invariants over random fleets: no waiter that could take a queued job is left asleep, and no
job is granted twice. Then a real broker on 127.0.0.1: a long-poll pop whose client closed its
socket grants nothing, and a step-down's 503 does not name the replica that stepped down.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prioqueue.broker import create_app, parse_config
from prioqueue.broker._waiters import long_pop
from store.pg import POSTGRES_URL

from .broker_helpers import (
    KEYS,
    SUBMITTER,
    WORKER,
    Api,
    api,
    configured_broker,
    postgres_schema,
    run,
)


async def _pop(a: Api, worker: str, wait: float = 0, **body: Any) -> httpx.Response:
    return await a.client.post(
        f"/v1/workers/{worker}/pop", params={"wait": wait}, json=body, headers=WORKER
    )


async def _settle(a: Api, asleep: int) -> None:
    """Turn the loop until ``asleep`` requests sleep and nothing moves for a while."""
    changes = a.broker.changes
    for _ in range(200_000):
        if changes.sleeping == asleep:
            break
        await asyncio.sleep(0)
    assert changes.sleeping == asleep, f"{changes.sleeping} asleep, expected {asleep}"
    for _ in range(500):
        await asyncio.sleep(0)


def test_a_submit_wakes_one_waiter_that_could_take_it_and_nobody_else() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit(model="flux")
            watchers = [
                asyncio.create_task(
                    a.client.get(f"/v1/jobs/{job}", params={"wait": 30}, headers=SUBMITTER)
                )
                for _ in range(20)
            ]
            await _pop(a, "gpu-0", models=["flux"])  # takes that job: the watchers wait on
            sdxl = [
                asyncio.create_task(_pop(a, f"sdxl-{i}", 30, models=["sdxl"])) for i in range(30)
            ]
            flux = [
                asyncio.create_task(_pop(a, f"flux-{i}", 30, models=["flux"])) for i in range(30)
            ]
            await _settle(a, 80)
            changes = a.broker.changes
            before = changes.woken
            for _ in range(10):
                await a.submit(model="llama")  # nobody serves it: nobody wakes
            await _settle(a, 80)
            assert changes.woken == before
            await a.submit(model="flux")
            await _settle(a, 79)
            granted = [t for t in flux if t.done()]
            assert len(granted) == 1
            assert (await granted[0]).status_code == 200
            assert not any(t.done() for t in sdxl + watchers)
            # The one it woke, and the one it handed on to (the grant may have been another job).
            assert changes.woken - before <= 2
            a.broker.begin_stop()
            await asyncio.gather(*sdxl, *flux, *watchers)

    run(scenario())


def test_a_job_waiter_wakes_for_its_own_job_only() -> None:
    async def scenario() -> None:
        async with api() as a:
            mine, other = await a.submit(), await a.submit()
            watchers = {
                job: [
                    asyncio.create_task(
                        a.client.get(f"/v1/jobs/{job}", params={"wait": 30}, headers=SUBMITTER)
                    )
                    for _ in range(25)
                ]
                for job in (mine, other)
            }
            await _settle(a, 50)
            changes = a.broker.changes
            before = changes.woken
            grant = (await _pop(a, "gpu-1")).json()
            assert grant["id"] == mine
            await a.submit()
            await _settle(a, 50)
            assert changes.woken == before  # a grant and a submit end no watched job
            await a.finish(mine, "gpu-1", grant["attempt"], result={"ok": 1})
            done = await asyncio.wait_for(asyncio.gather(*watchers[mine]), 10)
            assert {r.json()["state"] for r in done} == {"done"}
            assert changes.woken - before == 25
            assert not any(t.done() for t in watchers[other])
            a.broker.begin_stop()
            await asyncio.gather(*watchers[other])

    run(scenario())


def test_workers_joining_while_others_wait_wake_nobody() -> None:
    async def scenario() -> None:
        async with api() as a:
            await a.submit(model="flux")
            tasks = []
            for i in range(150):  # each joins (a journaled pop) while the others wait
                tasks.append(asyncio.create_task(_pop(a, f"gpu-{i}", 30, models=["sdxl"])))
                await asyncio.sleep(0)
            await _settle(a, 150)
            assert a.broker.changes.woken == 0
            joins = [e for e in a.journal.entries if e.op == "try_pop"]
            assert len(joins) == 150
            a.broker.begin_stop()
            await asyncio.gather(*tasks)

    run(scenario())


SPEC = {"models": None, "resident": None, "slots": 1, "slow": False}
ALICE = {"member": "alice", "tier": "pro", "priority": 0}


def test_a_sleeping_pop_whose_client_goes_leaves_at_once_and_takes_nothing() -> None:
    async def scenario() -> None:
        async with api() as a:
            left = asyncio.Event()
            first = asyncio.create_task(long_pop(a.broker, "gpu-1", SPEC, 30, left.wait))
            await _settle(a, 1)
            left.set()  # its client closed the connection while it slept
            assert await asyncio.wait_for(first, 10) == (None, {}, ())
            assert a.broker.changes.sleeping == 0  # not left in the index
            job = await a.submit()
            assert (await a.job(job)).json()["attempt"] == 0
            assert (await _pop(a, "gpu-2")).json()["attempt"] == 1

    run(scenario())


def test_a_pop_granted_at_once_whose_client_left_during_the_try_gives_the_job_back() -> None:
    # Probes, round 5: on PostgreSQL a worker's first pop (a journaled join) took longer than
    # its client stayed; the job queued meanwhile was granted at once, without a sleep that
    # would have watched the client, and ran nowhere until worker_timeout_seconds.
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit()
            left = asyncio.Event()
            left.set()  # the connection closed while the first try was being journaled
            assert await long_pop(a.broker, "gpu-1", SPEC, 30, left.wait) == (None, {}, ())
            view = (await a.job(job)).json()
            assert view["state"] == "queued", view
            granted = (await _pop(a, "gpu-2")).json()
            assert (granted["id"], granted["attempt"]) == (job, 2)  # given back, journaled
            assert a.broker.changes.sleeping == 0

    run(scenario())


def test_a_heartbeat_says_how_many_polls_of_the_worker_still_wait() -> None:
    # A stopping worker watches its abandoned poll only while the broker still holds one.
    async def scenario() -> None:
        async with api() as a:

            async def waiting() -> Any:
                beat = await a.client.post("/v1/workers/gpu-1/heartbeat", json={}, headers=WORKER)
                assert beat.status_code == 200, beat.text
                return beat.json()["waiting"]

            assert (await _pop(a, "gpu-1")).status_code == 204  # joined, not waiting
            assert await waiting() == 0
            left = asyncio.Event()
            polling = asyncio.create_task(long_pop(a.broker, "gpu-1", SPEC, 30, left.wait))
            await _settle(a, 1)
            assert await waiting() == 1
            left.set()
            assert await asyncio.wait_for(polling, 10) == (None, {}, ())
            assert await waiting() == 0

    run(scenario())


def test_a_woken_waiter_that_goes_away_hands_its_wake_up_on() -> None:
    async def scenario() -> None:
        async with api() as a:
            first = asyncio.create_task(long_pop(a.broker, "gpu-1", SPEC, 30))
            await _settle(a, 1)
            second = asyncio.create_task(long_pop(a.broker, "gpu-2", SPEC, 30))
            await _settle(a, 2)
            record, _ = await a.broker.run("submit", ALICE)  # memory: applied, no loop turn
            assert a.broker.changes.sleeping == 1  # its one wake-up went to gpu-1 (oldest)
            first.cancel()  # ... which goes away before it runs: the wake-up goes on
            granted, _, _ = await asyncio.wait_for(second, 10)
            assert granted is not None
            assert granted.id == record.id
            assert granted.attempt == 1

    run(scenario())


def test_a_grant_made_as_its_client_left_is_given_back_journaled(tmp_path: Path) -> None:
    data = {"store": f"sqlite:///{tmp_path / 'b.db'}", "keys": KEYS}
    app = create_app(parse_config(data))

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            broker = app.state.broker
            left = asyncio.Event()
            popping = asyncio.create_task(long_pop(broker, "gpu-1", SPEC, 30, left.wait))
            while not broker.changes.sleeping:
                await asyncio.sleep(0)
            submit = asyncio.create_task(broker.run("submit", ALICE))
            engine = broker.engine
            while not any(r.state == "running" for r in engine.jobs.values()):
                await asyncio.sleep(0)  # granted in memory, its commit not yet answered
            left.set()
            assert await asyncio.wait_for(popping, 10) == (None, {}, ())
            record, _ = await submit
            assert engine.jobs[record.id].state == "queued"
            again, _, _ = await long_pop(broker, "gpu-2", SPEC, 0)
            assert again is not None
            assert again.id == record.id
            assert again.attempt == 2  # a grant given back counts, as a leave does
            assert broker.engine.jobs.counts["submitted"] == 1

        restarted = create_app(parse_config(data))  # the store holds what was acknowledged
        async with restarted.router.lifespan_context(restarted):
            engine = restarted.state.broker.engine
            (job,) = engine.jobs.values()
            assert (job.state, job.worker, job.attempt) == ("running", "gpu-2", 2)

    run(scenario())


_MODELS = ("a", "b", "c")
_action = st.one_of(
    st.tuples(st.just("wait"), st.sampled_from([None, ("a",), ("b",), ("a", "b"), ("c",)])),
    st.tuples(st.just("submit"), st.sampled_from([None, *_MODELS])),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("leave"), st.integers(0, 50)),
)


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(_action, min_size=1, max_size=30))
def test_no_lost_wake_up_and_no_job_granted_twice(actions: list[Any]) -> None:
    """After every step, once the loop is quiet: no sleeping waiter could take a queued job,
    and every grant went to one waiter (checked against the engine's own records)."""

    async def scenario() -> None:
        async with api(max_running_per_member=2) as a:
            waiting: dict[str, tuple[asyncio.Task[httpx.Response], tuple[str, ...] | None]] = {}
            held: dict[str, tuple[str, int]] = {}  # job -> (worker, attempt)
            granted: list[tuple[str, int]] = []
            members = [SUBMITTER, {"Authorization": "Bearer sk-bob"}]
            for n, (kind, arg) in enumerate(actions):
                if kind == "wait":
                    name = f"w{n}"
                    body = {"models": None if arg is None else list(arg)}
                    waiting[name] = (asyncio.create_task(_pop(a, name, 30, **body)), arg)
                elif kind == "submit":
                    await a.submit(headers=members[n % 2], model=arg)
                elif kind in ("finish", "leave") and held:
                    job = sorted(held)[arg % len(held)]
                    worker, attempt = held.pop(job)
                    if kind == "finish":
                        await a.finish(job, worker, attempt)
                    else:
                        await a.worker_post(worker, "leave")
                await _quiet(a, waiting, held, granted)
                await _check(a, waiting)
            assert len(granted) == len(set(granted))  # (job, attempt): one grant each
            a.broker.begin_stop()
            await asyncio.gather(*(t for t, _ in waiting.values()))

    run(scenario())


async def _quiet(
    a: Api,
    waiting: dict[str, Any],
    held: dict[str, tuple[str, int]],
    granted: list[tuple[str, int]],
) -> None:
    changes = a.broker.changes
    for _ in range(200_000):  # until every waiter is answered or asleep (loop turns, not time)
        done = sum(task.done() for task, _ in waiting.values())
        if done + changes.sleeping == len(waiting):
            break
        await asyncio.sleep(0)
    for _ in range(200):
        await asyncio.sleep(0)
    for name, (task, _) in list(waiting.items()):
        if task.done():
            del waiting[name]
            response = task.result()
            assert response.status_code == 200, response.text
            body = response.json()
            held[body["id"]] = (name, body["attempt"])
            granted.append((body["id"], body["attempt"]))
    # A worker that left drops the jobs it held in the engine: forget them here too.
    engine = a.broker.engine
    assert engine is not None
    for job in list(held):
        if engine.jobs[job].state != "running":
            del held[job]


async def _check(a: Api, waiting: dict[str, Any]) -> None:
    engine = a.broker.engine
    assert engine is not None
    queued = len(engine.fleet)
    for name in waiting:
        # Every queued job is kept from a sleeping waiter for a reason: not its model, or its
        # member at its cap (max_running_per_member=2). Anything else is a lost wake-up.
        reasons = engine.fleet.idle_reasons(name, now=engine.now)
        assert sum(reasons.values()) == queued, (name, dict(reasons), queued)
        assert set(reasons) <= {"member_cap", "model"}, (name, dict(reasons))


def test_a_long_poll_pop_whose_client_closed_its_socket_takes_nothing(tmp_path: Path) -> None:
    broker = configured_broker(tmp_path, "gone", f"sqlite:///{tmp_path / 'gone.db'}")

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=10.0) as client:
            await broker.wait_serving(client)
            body = b'{"models": null}'
            request = (
                f"POST /v1/workers/gpu-gone/pop?wait=30 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: {WORKER['Authorization']}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            with socket.create_connection(("127.0.0.1", broker.port)) as sock:
                sock.sendall(request)
                for _ in range(200):  # until it has joined (its first try is journaled)
                    status = (await client.get(f"{broker.url}/v1/status", headers=WORKER)).json()
                    if status["workers"] == 1:
                        break
                    await asyncio.sleep(0.05)
                assert status["workers"] == 1
            await asyncio.sleep(0.5)  # the close reaches the broker (a hung-test bound only)
            created = await client.post(f"{broker.url}/v1/jobs", json={}, headers=SUBMITTER)
            job = created.json()["id"]
            await asyncio.sleep(0.5)  # the gone waiter is woken and takes nothing
            view = (await client.get(f"{broker.url}/v1/jobs/{job}", headers=SUBMITTER)).json()
            assert view["state"] == "queued", view
            assert view["attempt"] == 0, view
            grant = await client.post(
                f"{broker.url}/v1/workers/gpu-next/pop", params={"wait": 5}, json={}, headers=WORKER
            )
            assert grant.status_code == 200
            assert grant.json()["id"] == job
            assert grant.json()["attempt"] == 1

    broker.start()
    try:
        run(scenario())
    finally:
        broker.kill()


def test_after_a_step_down_the_waiters_503_does_not_name_this_replica() -> None:
    with postgres_schema() as schema:
        own = "http://replica-a.invalid:8091"
        data = {
            "store": POSTGRES_URL, "store_schema": schema, "keys": KEYS, "advertise": own,
            "leader_lease_seconds": 2.0,
        }  # fmt: skip
        app = create_app(parse_config(data))

        async def scenario() -> None:
            async with app.router.lifespan_context(app):
                broker = app.state.broker
                transport = httpx.ASGITransport(app)
                async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
                    for _ in range(400):
                        if broker.serving:
                            break
                        await asyncio.sleep(0.05)
                    assert broker.serving
                    await client.post("/v1/jobs", json={"model": "flux"}, headers=SUBMITTER)
                    waiting = asyncio.create_task(
                        client.post(
                            "/v1/workers/gpu-1/pop",
                            params={"wait": 30},
                            json={"models": ["sdxl"]},
                            headers=WORKER,
                        )
                    )
                    for _ in range(400):
                        if broker.changes.sleeping:
                            break
                        await asyncio.sleep(0.01)
                    broker._fenced.set()  # what a fenced append does: step down
                    response = await asyncio.wait_for(waiting, 10)
                    assert response.status_code == 503
                    assert response.headers.get("X-Prioqueue-Leader") != own
                    assert response.json().get("leader") != own
                    for _ in range(400):  # it campaigns again and wins (the only one): let it
                        if broker.serving:  # finish recovering before the lifespan closes it
                            break
                        await asyncio.sleep(0.05)

        run(scenario(), timeout=60)


def test_a_full_worker_hands_its_wake_up_to_one_that_can_take_the_job() -> None:
    async def scenario() -> None:
        async with api() as a:
            pops = [asyncio.create_task(_pop(a, "gpu-1", 30)) for _ in range(2)]  # one slot
            await _settle(a, 2)
            other = asyncio.create_task(_pop(a, "gpu-2", 30))
            await _settle(a, 3)
            batch = {"jobs": [{"payload": 1}, {"payload": 2}]}  # two wake-ups, one operation
            r = await a.client.post("/v1/jobs/batch", json=batch, headers=SUBMITTER)
            first, second = r.json()["ids"]
            granted = await asyncio.wait_for(other, 10)  # gpu-1's second pop passed it on
            assert granted.json()["id"] == second
            done, waiting = await asyncio.wait(pops, timeout=10, return_when="FIRST_COMPLETED")
            assert [t.result().json()["id"] for t in done] == [first]
            a.broker.begin_stop()
            await asyncio.gather(*waiting)

    run(scenario())


def test_a_job_held_back_for_a_warm_worker_reaches_a_cold_waiter_when_the_hold_lapses() -> None:
    async def scenario() -> None:
        async with api(warm_hold_seconds=0.2) as a:
            assert (await _pop(a, "warm", resident="flux")).status_code == 204  # free, warm
            cold = asyncio.create_task(_pop(a, "cold", 30))
            await _settle(a, 1)
            job = await a.submit(model="flux")
            await _settle(a, 1)  # offered to the cold one, held back for the warm one
            assert not cold.done()
            a.clock.advance(1)  # the hold lapsed (the broker's clock); the re-offer follows
            granted = await asyncio.wait_for(cold, 10)
            assert granted.json()["id"] == job

    run(scenario())
