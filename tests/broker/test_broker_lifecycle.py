"""The broker's job lifecycle: ttl (expired), not_before, retries with backoff, budgets.

The model is docs/design/lifecycle.md; the HTTP contract is in CONTRACTS.md (lifecycle).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prioqueue import ConfigError
from prioqueue.broker import BrokerEngine, parse_config
from prioqueue.broker.config import load_config

from .broker_helpers import KEYS, SUBMITTER, WORKER, api, run


def test_a_queued_job_past_its_ttl_is_expired_and_get_says_so() -> None:
    async def scenario() -> None:
        async with api() as a:
            job = await a.submit(ttl=30.0)
            view = (await a.job(job)).json()
            assert (view["state"], view["expires_at"]) == ("queued", a.clock.t + 30.0)
            a.clock.advance(30.0)
            assert (await a.pop("gpu-1")).status_code == 204  # the tick first: it expired
            view = (await a.job(job)).json()
            assert view["state"] == "expired"
            assert view["position"] is None
            status = await a.status()
            assert status["jobs"]["expired"] == 1
            assert (status["totals"]["ttl_expired"], status["totals"]["expired"]) == (1, 0)
            r = await a.client.delete(f"/v1/jobs/{job}", headers=SUBMITTER)
            assert r.status_code == 409  # finished: nothing to cancel

    run(scenario())


def test_a_level_budget_ttl_applies_to_jobs_without_their_own() -> None:
    async def scenario() -> None:
        async with api(budgets={"batch": {"ttl": 10.0}}) as a:
            batch = await a.submit(priority="batch")
            normal = await a.submit()
            a.clock.advance(10.0)
            r = await a.pop("gpu-1")
            assert r.json()["id"] == normal
            assert (await a.job(batch)).json()["state"] == "expired"

    run(scenario())


def test_a_level_over_max_queued_gets_429_with_retry_after() -> None:
    async def scenario() -> None:
        async with api(budgets={"interactive": {"max_queued": 1}}) as a:
            await a.submit(priority="interactive")
            r = await a.client.post("/v1/jobs", json={"priority": "interactive"}, headers=SUBMITTER)
            assert r.status_code == 429
            assert int(r.headers["Retry-After"]) >= 1
            assert r.json()["field"] == "max_queued"
            assert "max_queued=1" in r.json()["error"]
            await a.submit(priority="batch")  # another level: no limit

    run(scenario())


def test_a_forecast_wait_over_max_wait_gets_503_with_retry_after_from_the_forecast() -> None:
    async def scenario() -> None:
        async with api(budgets={"normal": {"max_wait": 100}}) as a:
            await a.submit()  # ahead: 60 s (no runtime known yet), one worker's capacity
            await a.submit()  # ahead: 120 s
            r = await a.client.post("/v1/jobs", json={}, headers=SUBMITTER)
            assert r.status_code == 503
            assert r.headers["Retry-After"] == "20"  # ceil(120 - 100)
            body = r.json()
            assert body["field"] == "max_wait"
            assert "max_wait=100" in body["error"]
            assert "X-Prioqueue-Leader" not in r.headers  # an overload, not a standby
            # Not queued, not journaled as a submit.
            assert await a.queued() == 2

    run(scenario())


def test_a_delayed_job_is_queued_with_not_before_and_runs_from_then() -> None:
    async def scenario() -> None:
        async with api() as a:
            start = a.clock.t
            job = await a.submit(not_before=start + 100.0)
            view = (await a.job(job)).json()
            assert (view["state"], view["not_before"]) == ("queued", start + 100.0)
            assert view["position"] is None
            assert "delayed until" in view["explanation"]
            assert (await a.pop("gpu-1")).status_code == 204
            a.clock.advance(100.0)
            r = await a.pop("gpu-1")
            assert r.status_code == 200
            assert r.json()["id"] == job
            assert (await a.job(job)).json()["not_before"] is None

    run(scenario())


def test_fail_with_retry_requeues_after_the_backoff_then_fails_for_good() -> None:
    async def scenario() -> None:
        config = {"max_attempts": 2, "backoff": {"kind": "constant", "base": 30.0}}
        async with api(**config) as a:
            job = await a.submit()
            assert (await a.pop("gpu-1")).json()["attempt"] == 1
            body = {"worker": "gpu-1", "attempt": 1, "result": {"error": "oom"}, "retry": True}
            r = await a.client.post(f"/v1/jobs/{job}/fail", json=body, headers=WORKER)
            assert r.status_code == 200
            view = r.json()
            assert (view["state"], view["not_before"]) == ("queued", a.clock.t + 30.0)
            assert view["result"] == {"error": "oom"}  # the last failure, until one ends it
            assert (await a.pop("gpu-1")).status_code == 204
            a.clock.advance(30.0)
            r = await a.pop("gpu-2")
            assert (r.json()["id"], r.json()["attempt"]) == (job, 2)
            body = {**body, "worker": "gpu-2", "attempt": 2}
            r = await a.client.post(f"/v1/jobs/{job}/fail", json=body, headers=WORKER)
            assert r.json()["state"] == "failed"  # no attempt left
            assert await a.totals("retried", "failed") == (1, 1)

    run(scenario())


def test_a_jobs_own_max_attempts_and_backoff_win() -> None:
    async def scenario() -> None:
        async with api(max_attempts=1) as a:
            backoff = {"kind": "exponential", "base": 10.0, "max": 15.0, "jitter": True}
            job = await a.submit(max_attempts=3, backoff=backoff)
            delays = []
            for attempt in (1, 2):
                r = await a.pop("gpu-1")
                assert r.json()["attempt"] == attempt
                body = {"worker": "gpu-1", "attempt": attempt, "retry": True}
                view = (
                    await a.client.post(f"/v1/jobs/{job}/fail", json=body, headers=WORKER)
                ).json()
                delays.append(view["not_before"] - a.clock.t)
                a.clock.advance(15.0)
            assert 5.0 <= delays[0] < 10.0
            assert 7.5 <= delays[1] < 15.0

    run(scenario())


def test_bad_lifecycle_fields_are_422_naming_the_field() -> None:
    async def scenario() -> None:
        async with api() as a:
            for body, field in (
                ({"ttl": 0}, "ttl"),
                ({"ttl": "10"}, "ttl"),
                ({"not_before": -1}, "not_before"),
                ({"max_attempts": 0}, "max_attempts"),
                ({"backoff": {"kind": "random"}}, "backoff.kind"),
                ({"backoff": {"base": -1}}, "backoff.base"),
                ({"backoff": {"steps": 2}}, "backoff.steps"),
            ):
                r = await a.client.post("/v1/jobs", json=body, headers=SUBMITTER)
                assert r.status_code == 422, body
                assert r.json()["field"] == field, (body, r.json())
            job = await a.submit()
            await a.pop("gpu-1")
            bad: dict[str, Any] = {"worker": "gpu-1", "attempt": 1, "retry": "yes"}
            r = await a.client.post(f"/v1/jobs/{job}/fail", json=bad, headers=WORKER)
            assert (r.status_code, r.json()["field"]) == (422, "retry")
            bad = {"worker": "gpu-1", "attempt": 1, "retry": True}
            r = await a.client.post(f"/v1/jobs/{job}/complete", json=bad, headers=WORKER)
            assert r.status_code == 422  # retry belongs to fail only

    run(scenario())


def _config(**extra: Any) -> dict[str, Any]:
    return {"store": "memory://", "keys": KEYS, **extra}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"budgets": {"urgent": {"ttl": 5}}}, "budgets.urgent: not a priority level"),
        (
            {"budgets": {"interactive": {"max_wait": 0}}},
            "budgets.interactive.max_wait: must be > 0",
        ),
        ({"budgets": {"batch": {"max_queued": 0}}}, "budgets.batch.max_queued: must be >= 1"),
        ({"budgets": {"batch": {"ttl": "1m"}}}, "budgets.batch.ttl: must be a finite number"),
        ({"budgets": {"batch": {"max_jobs": 1}}}, "budgets.batch.max_jobs: unknown key"),
        ({"budgets": {"batch": 3}}, "budgets.batch: must be a table"),
        ({"backoff": {"kind": "random"}}, "backoff.kind: must be one of"),
        ({"backoff": {"base": -1}}, "backoff.base: must be >= 0"),
        ({"backoff": {"jitter": 1}}, "backoff.jitter: must be true or false"),
        ({"backoff": {"factor": 2}}, "backoff.factor: unknown key"),
    ],
)
def test_budget_and_backoff_settings_are_validated_naming_the_key(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config(_config(**extra))


def test_the_toml_settings_reach_the_dispatcher(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        'store = "memory://"\n'
        "[budgets.interactive]\nmax_queued = 5\nmax_wait = 30\nttl = 120\n"
        "[budgets.-50]\nttl = 600\n"
        '[backoff]\nkind = "linear"\nbase = 2\nmax = 60\njitter = true\n',
        encoding="utf-8",
    )
    config = load_config(path)
    engine = BrokerEngine(config)
    budgets = engine.fleet.budgets
    assert (budgets[100].max_queued, budgets[100].max_wait, budgets[100].ttl) == (5, 30.0, 120.0)
    assert budgets[-50].ttl == 600.0
    assert engine.fleet.backoff.as_dict() == {
        "kind": "linear", "base": 2.0, "max": 60.0, "jitter": True,
    }  # fmt: skip


def test_snapshot_and_replay_keep_delays_deadlines_and_retries() -> None:
    config = parse_config(_config(backoff={"kind": "linear", "base": 7.0, "jitter": True}))
    live = BrokerEngine(config)
    journal: list[tuple[str, dict[str, Any], float]] = []

    def apply(op: str, now: float, **args: Any) -> Any:
        if op != "tick" and live.due(now):
            journal.append(("tick", {}, now))
            live.apply("tick", {}, now)
        result = live.apply(op, args, now)
        journal.append((op, args, now))
        return result

    base = {"member": "alice", "tier": "pro", "priority": 0}
    apply("submit", 100.0, **base, ttl=50.0)
    apply("submit", 100.0, **base, not_before=200.0)
    apply("submit", 100.0, **base, max_attempts=3)
    grant = apply("pop", 101.0, worker="w1").record
    apply("fail", 102.0, job_id=grant.id, worker="w1", attempt=1, retry=True)
    cut = len(journal)
    snapshot = live.snapshot()
    apply("pop", 160.0, worker="w1")  # job-1 expired at 150: the tick first
    apply("pop", 210.0, worker="w2")
    states = {r.id: (r.state, r.attempt, r.result) for r in live.jobs.values()}
    assert states["job-1"][0] == "expired"
    # Replayed from scratch, and from the snapshot plus the rest of the journal: the same.
    for start, ops in (
        (BrokerEngine(config), journal),
        (BrokerEngine.restore(snapshot, config), journal[cut:]),
    ):
        for op, args, now in ops:
            start.apply(op, args, now)
        assert {r.id: (r.state, r.attempt, r.result) for r in start.jobs.values()} == states
        assert start.snapshot() == live.snapshot()
