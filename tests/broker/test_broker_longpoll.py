"""Long-poll pops and job waits, batch submit, leave and JSON bodies (issue 18), in memory.

Behaviour only (no timing thresholds): a waiting pop is answered by the event that makes a
job eligible, an empty or waiting pop writes nothing to the journal, a worker's liveness is
journaled at most once per ``worker_timeout / 2``, a stopping or deposed broker answers its
waiters, and the journal still replays into exactly the live state.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prioqueue.broker import BrokerEngine, parse_config

from .broker_helpers import KEYS, SUBMITTER, WORKER, Api, api, run


async def _pop(a: Api, worker: str = "gpu-1", wait: float = 0, **body: Any) -> Any:
    return await a.client.post(
        f"/v1/workers/{worker}/pop", params={"wait": wait}, json=body, headers=WORKER
    )


async def _until_waiting(a: Api, count: int = 1) -> None:
    """Let the waiting requests park: turn the loop until ``count`` are asleep, then more.

    They run in this loop (ASGI in memory), so loop turns, not time, bring each to its wait:
    about 500 turns on a quiet machine, many more under a tracer (coverage) on a loaded one.
    Turn until ``count`` have parked (giving up after 60 s of turns: that means "hung", not
    "slow"), then twice as many turns again for any others still on their way.
    """
    deadline = time.monotonic() + 60.0
    turns = 0
    while a.broker.changes.sleeping < count:
        assert time.monotonic() < deadline, (
            f"{a.broker.changes.sleeping} of {count} waiting requests parked in {turns} turns"
        )
        await asyncio.sleep(0)
        turns += 1
    for _ in range(max(2000, 2 * turns)):
        await asyncio.sleep(0)


def test_empty_pops_write_nothing_and_liveness_is_journaled_once_per_half_timeout() -> None:
    async def scenario() -> None:
        async with api(worker_timeout_seconds=60) as a:
            assert (await _pop(a)).status_code == 204  # joins: journaled
            joined = len(a.journal.entries)
            assert joined == 1
            for _ in range(5):
                response = await _pop(a)
                assert response.status_code == 204
                assert response.headers["X-Prioqueue-Idle"] == "empty"
            assert len(a.journal.entries) == joined  # empty pops wrote nothing
            a.clock.advance(29)
            await _pop(a)
            assert len(a.journal.entries) == joined
            a.clock.advance(1)  # 30 s = worker_timeout / 2 since its last journaled word
            await _pop(a)
            assert len(a.journal.entries) == joined + 1
            await _pop(a)
            assert len(a.journal.entries) == joined + 1
            a.clock.advance(200)  # past worker_timeout: a tick times it out; a pop revives it
            await _pop(a)
            assert (await _pop(a, models=["sdxl"])).status_code == 204  # new settings: a join
            assert [e.op for e in a.journal.entries][-1] == "try_pop"
            assert a.replays()

    run(scenario())


def test_a_waiting_pop_is_granted_the_job_submitted_while_it_waits() -> None:
    async def scenario() -> None:
        async with api() as a:
            await _pop(a)  # join
            before = len(a.journal.entries)
            waiting = asyncio.create_task(_pop(a, wait=30))
            await _until_waiting(a)
            assert not waiting.done()
            assert len(a.journal.entries) == before  # waiting wrote nothing
            job = await a.submit(payload={"n": 1})
            response = await asyncio.wait_for(waiting, 60)
            assert response.status_code == 200
            assert response.json()["id"] == job
            assert [e.op for e in a.journal.entries][before:] == ["submit", "try_pop"]
            assert a.replays()

    run(scenario())


def test_waiting_pops_wake_on_a_worker_leaving_and_on_an_expired_lease() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit()
            first = await _pop(a, "gpu-1")
            assert first.json()["id"] == job
            waiting = asyncio.create_task(_pop(a, "gpu-2", wait=30))
            await _until_waiting(a)
            assert not waiting.done()
            left = await a.worker_post("gpu-1", "leave")
            assert left.json() == {"requeued": [job]}
            second = await asyncio.wait_for(waiting, 60)
            assert second.json()["id"] == job
            # The lease runs out: the tick that takes it back wakes the next waiter.
            waiting = asyncio.create_task(_pop(a, "gpu-3", wait=30))
            await _until_waiting(a)
            a.clock.advance(second.json()["lease_seconds"] + 1)
            a.broker._wake.set()  # type: ignore[union-attr]  # the tick loop, now
            third = await asyncio.wait_for(waiting, 60)
            assert third.status_code == 200
            assert third.json()["id"] == job
            assert third.json()["attempt"] == 3  # the third grant
            assert a.replays()

    run(scenario())


def test_waiting_pop_runs_out_with_the_idle_reasons() -> None:
    async def scenario() -> None:
        async with api() as a:
            await a.submit(model="flux")
            response = await _pop(a, wait=0.2, models=["sdxl"])
            assert response.status_code == 204
            assert response.headers["X-Prioqueue-Idle"] == "model=1"
            bad = await _pop(a, wait=61)
            assert bad.status_code == 422
            assert bad.json()["field"] == "query.wait"

    run(scenario())


def test_job_wait_returns_when_the_job_ends_or_the_time_runs_out() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit()
            short = await a.client.get(f"/v1/jobs/{job}", params={"wait": 0.1}, headers=SUBMITTER)
            assert short.json()["state"] == "queued"
            waiting = asyncio.create_task(
                a.client.get(f"/v1/jobs/{job}", params={"wait": 30}, headers=SUBMITTER)
            )
            grant = (await _pop(a)).json()
            await _until_waiting(a)
            assert not waiting.done()  # running is not an end
            await a.finish(job, "gpu-1", grant["attempt"], result={"ok": True})
            done = (await asyncio.wait_for(waiting, 60)).json()
            assert done["state"] == "done"
            assert done["result"] == {"ok": True}
            other = await a.submit()
            waiting = asyncio.create_task(
                a.client.get(f"/v1/jobs/{other}", params={"wait": 30}, headers=SUBMITTER)
            )
            await _until_waiting(a)
            await a.client.delete(f"/v1/jobs/{other}", headers=SUBMITTER)
            assert (await asyncio.wait_for(waiting, 60)).json()["state"] == "cancelled"

    run(scenario())


def test_a_stopping_broker_answers_every_waiter_at_once() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit(model="flux")
            pops = [
                asyncio.create_task(_pop(a, f"gpu-{i}", wait=60, models=["sdxl"]))
                for i in range(20)
            ]
            reads = [
                asyncio.create_task(
                    a.client.get(f"/v1/jobs/{job}", params={"wait": 60}, headers=SUBMITTER)
                )
                for _ in range(20)
            ]
            await _until_waiting(a)
            assert not any(t.done() for t in pops + reads)
            a.broker.begin_stop()
            answered = await asyncio.wait_for(asyncio.gather(*pops, *reads), 60)
            assert {r.status_code for r in answered[:20]} == {503}
            assert "stopping" in answered[0].json()["error"]
            assert {r.json()["state"] for r in answered[20:]} == {"queued"}

    run(scenario())


def test_a_broker_that_stops_serving_answers_its_waiters_503_with_the_leader() -> None:
    async def scenario() -> None:
        async with api() as a:
            await a.submit(model="flux")
            waiting = asyncio.create_task(_pop(a, wait=60, models=["sdxl"]))
            await _until_waiting(a)
            backend = a.broker._backend
            a.broker._backend = None  # what stepping down does, then it fires the changes
            a.broker.changes.fire()
            response = await asyncio.wait_for(waiting, 60)
            a.broker._backend = backend
            assert response.status_code == 503
            assert "Retry-After" in response.headers

    run(scenario())


def test_batch_submit_is_all_or_nothing_with_one_idempotency_key() -> None:
    async def scenario() -> None:
        async with api(max_queued=4) as a:
            key = {**SUBMITTER, "Idempotency-Key": "film-1"}
            batch = {"jobs": [{"payload": i, "group": "film"} for i in range(3)]}
            first = await a.client.post("/v1/jobs/batch", json=batch, headers=key)
            assert first.status_code == 201
            ids = first.json()["ids"]
            assert len(ids) == 3
            again = await a.client.post("/v1/jobs/batch", json=batch, headers=key)
            assert again.status_code == 200
            assert again.json()["ids"] == ids
            other = {"jobs": [{"payload": "x"}, {"payload": 1}]}
            reused = await a.client.post("/v1/jobs/batch", json=other, headers=key)
            assert reused.status_code == 422
            entries = len(a.journal.entries)
            too_many = await a.client.post(
                "/v1/jobs/batch", json={"jobs": [{"payload": i} for i in range(2)]},
                headers=SUBMITTER,
            )  # fmt: skip
            assert too_many.status_code == 429
            assert "max_queued=4" in too_many.json()["error"]
            bad = await a.client.post(
                "/v1/jobs/batch", json={"jobs": [{"payload": 1}, {"estimate": -1}]},
                headers=SUBMITTER,
            )  # fmt: skip
            assert bad.status_code == 422
            empty = await a.client.post("/v1/jobs/batch", json={"jobs": []}, headers=SUBMITTER)
            assert empty.status_code == 422
            assert len(a.journal.entries) == entries  # refused batches changed nothing
            status = (await a.client.get("/v1/status", headers=SUBMITTER)).json()
            assert status["jobs"]["queued"] == 3
            assert a.replays()

    run(scenario())


def test_bodies_are_json_whatever_the_content_type_and_other_types_are_415() -> None:
    async def scenario() -> None:
        async with api() as a:
            body = b'{"payload": {"prompt": "a cat"}}'
            for headers in (
                {},
                {"Content-Type": "application/x-www-form-urlencoded"},  # curl -d's default
                {"Content-Type": "text/plain; charset=utf-8"},
            ):
                response = await a.client.post(
                    "/v1/jobs", content=body, headers={**SUBMITTER, **headers}
                )
                assert response.status_code == 201, response.text
            refused = await a.client.post(
                "/v1/jobs", content=body,
                headers={**SUBMITTER, "Content-Type": "multipart/form-data; boundary=x"},
            )  # fmt: skip
            assert refused.status_code == 415
            assert "application/json" in refused.json()["error"]
            assert refused.json()["field"] == "Content-Type"
            beat = await a.worker_post("gpu-9", "heartbeat")
            assert beat.status_code == 404  # an empty body without a type is still no body

    run(scenario())


def test_leave_of_an_unknown_worker_is_404() -> None:
    async def scenario() -> None:
        async with api() as a:
            response = await a.worker_post("nobody", "leave")
            assert response.status_code == 404
            assert response.json()["field"] == "worker"

    run(scenario())


# Engine level: unjournaled try_pops change nothing a replay would see.
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from([None, "sdxl", "flux"])),
        st.tuples(st.just("pop"), st.sampled_from(["gpu-1", "gpu-2"])),
        st.tuples(st.just("complete"), st.sampled_from(["gpu-1", "gpu-2"])),
        st.tuples(st.just("advance"), st.sampled_from([1.0, 30.0, 100.0, 1000.0])),
        st.tuples(st.just("leave"), st.sampled_from(["gpu-1", "gpu-2"])),
        st.tuples(st.just("tick"), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=60)
@given(_ops)
def test_skipped_try_pops_leave_a_state_the_journal_replays_exactly(ops: list[Any]) -> None:
    config = parse_config(
        {"store": "memory://", "keys": KEYS, "worker_timeout_seconds": 120,
         "default_lease_seconds": 300}
    )  # fmt: skip
    live = BrokerEngine(config)
    journal: list[tuple[str, dict[str, Any], float]] = []
    now = 1000.0
    models = {"gpu-1": ["sdxl"], "gpu-2": None}

    def apply(op: str, args: dict[str, Any]) -> Any:
        try:
            result = live.apply(op, args, now)
        except Exception:  # refused: nothing changed, nothing journaled
            return None
        if not (op == "try_pop" and result is None):
            journal.append((op, args, now))
        return result

    for op, arg in ops:
        if op == "submit":
            apply("submit", {"member": "alice", "tier": "free", "priority": 0, "model": arg})
        elif op == "pop":
            apply("try_pop", {"worker": arg, "models": models[arg]})
        elif op == "complete":
            held = [r for r in live.jobs.values() if r.worker == arg and r.state == "running"]
            if held:
                record = held[0]
                apply("complete", {"job_id": record.id, "worker": arg, "attempt": record.attempt})
        elif op == "advance":
            now += arg
        elif op == "leave":
            apply("leave", {"worker": arg})
        elif live.due(now):
            apply("tick", {})
    replayed = BrokerEngine(config)
    for op, args, at in journal:
        replayed.apply(op, args, at)
    assert replayed.snapshot() == live.snapshot()


def test_a_waiting_fleet_journals_its_liveness_in_one_event_per_half_timeout() -> None:
    async def scenario() -> None:
        async with api(worker_timeout_seconds=60) as a:
            for i in range(5):
                await _pop(a, f"gpu-{i}")  # joins: one event each
            joined = len(a.journal.entries)
            waiting = [asyncio.create_task(_pop(a, f"gpu-{i}", wait=60)) for i in range(5)]
            await _until_waiting(a, 5)
            assert len(a.journal.entries) == joined
            a.clock.advance(31)  # past worker_timeout / 2: liveness is due
            a.broker.changes.fire()  # the waiters re-check now (their own timer is real time)
            await _until_waiting(a, 5)  # all five re-parked: each has seen the refresh
            refreshes = a.journal.entries[joined:]
            assert [e.op for e in refreshes] == ["refresh"]
            assert refreshes[0].args["workers"] == [f"gpu-{i}" for i in range(5)]
            a.clock.advance(31)
            a.broker.changes.fire()
            await _until_waiting(a, 5)
            assert [e.op for e in a.journal.entries[joined:]] == ["refresh", "refresh"]
            a.broker.begin_stop()
            await asyncio.gather(*waiting)
            assert a.replays()

    run(scenario())


def test_reads_after_a_skipped_pop_at_a_later_time_still_answer() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit(model="flux")
            assert (await _pop(a, models=["sdxl"])).status_code == 204  # joins: journaled
            entries = len(a.journal.entries)
            a.clock.advance(1)
            assert (await _pop(a, models=["sdxl"])).status_code == 204  # skipped
            assert len(a.journal.entries) == entries
            response = await a.job(job)  # the engine's time is behind that skipped pop's
            assert response.status_code == 200, response.text
            assert response.json()["position"] == 1
            assert a.replays()

    run(scenario())


def test_a_batch_over_a_level_budget_is_refused_whole() -> None:
    async def scenario() -> None:
        async with api(budgets={"normal": {"max_queued": 3, "max_wait": 150}}) as a:
            await a.submit()  # ahead: 60 s
            entries = len(a.journal.entries)
            three = {"jobs": [{"payload": i} for i in range(3)]}  # the 3rd: over max_queued
            full = await a.client.post("/v1/jobs/batch", json=three, headers=SUBMITTER)
            assert full.status_code == 429
            assert full.json()["field"] == "max_queued"
            two = {"jobs": [{"payload": i} for i in range(2)]}  # the 2nd waits 120 s: fits
            fits = await a.client.post("/v1/jobs/batch", json=two, headers=SUBMITTER)
            assert fits.status_code == 201
            one = await a.client.post(
                "/v1/jobs/batch", json={"jobs": [{"payload": 9}]}, headers=SUBMITTER
            )
            assert one.status_code == 429  # the level holds 3
            bad = {"jobs": [{"payload": 1}, {"backoff": {"kind": "nope", "base": 1}}]}
            refused = await a.client.post("/v1/jobs/batch", json=bad, headers=SUBMITTER)
            assert refused.status_code == 422
            ops = [e.op for e in a.journal.entries[entries:]]
            assert ops == ["submit_many"]  # only the batch that fit
            assert await a.queued() == 3
            assert a.replays()

    run(scenario())


def test_a_batch_over_max_wait_is_503_and_changes_nothing() -> None:
    async def scenario() -> None:
        async with api(budgets={"normal": {"max_wait": 100}}) as a:
            await a.submit()  # ahead: 60 s
            batch = {"jobs": [{"payload": i} for i in range(2)]}  # the 2nd would wait 120 s
            r = await a.client.post("/v1/jobs/batch", json=batch, headers=SUBMITTER)
            assert r.status_code == 503
            assert r.json()["field"] == "max_wait"
            assert await a.queued() == 1

    run(scenario())


def test_a_waiting_pop_gets_a_delayed_job_when_it_becomes_eligible() -> None:
    async def scenario() -> None:
        async with api() as a:
            await _pop(a)  # join
            job = await a.submit(not_before=a.clock.t + 5)
            waiting = asyncio.create_task(_pop(a, wait=30))
            await _until_waiting(a)
            assert not waiting.done()  # not eligible yet
            a.clock.advance(6)
            a.broker._wake.set()  # type: ignore[union-attr]  # the tick loop looks now
            response = await asyncio.wait_for(waiting, 60)
            assert response.status_code == 200
            assert response.json()["id"] == job
            assert a.replays()

    run(scenario())
