"""Finished jobs' payloads inside the byte budget (issue 30).

Before, a finished job kept its payload for ``result_ttl_seconds`` (a day) outside
``max_queued_bytes``: a day of finished payloads held in memory and in every snapshot. A
payload is dropped when its job finishes (no answer returns it), so the payload bytes held are
those of unfinished jobs, within the budget, whatever the operations.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prioqueue.broker import parse_config
from prioqueue.broker._budget import size_of
from prioqueue.broker.engine import BrokerEngine
from prioqueue.broker.records import FINISHED, Rejected

LIMIT = 2_000

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 3), st.integers(1, 900)),
        st.tuples(st.just("pop"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("complete"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("fail"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("tick"), st.integers(0, 100), st.just(0)),
    ),
    max_size=60,
)


def _held_payload_bytes(engine: BrokerEngine) -> int:
    return sum(size_of(r.payload, None) for r in engine.jobs.values())


def _run(engine: BrokerEngine, now: float, op: tuple[str, int, Any]) -> None:
    kind, n, extra = op
    held = [r for r in engine.jobs.values() if r.state == "running" and r.worker == f"w{n}"]
    if kind == "submit":
        payload = {"text": "x" * extra}
        engine.submit(now, member=f"m{n}", tier="free", priority=0, payload=payload)
    elif kind == "pop":
        engine.pop(now, worker=f"w{n}")
    elif kind in ("complete", "fail") and held:
        record = held[0]
        worker = f"w{n}"
        if kind == "complete":
            engine.complete(
                now, job_id=record.id, worker=worker, attempt=record.attempt, result={"ok": 1}
            )
        else:
            engine.fail(
                now, job_id=record.id, worker=worker, attempt=record.attempt,
                result={"error": "boom"}, retry=extra,
            )  # fmt: skip
    elif kind == "cancel":
        engine.cancel(now, job_id=f"job-{n}", member=None)
    elif kind == "tick":
        engine.tick(now + extra)


@settings(max_examples=60)
@given(_ops)
def test_the_payloads_held_stay_within_the_budget(ops: list[tuple[str, int, Any]]) -> None:
    config = parse_config({"max_queued_bytes": LIMIT, "default_lease_seconds": 30.0})
    engine = BrokerEngine(config)
    now = 1.0
    for op in ops:
        now = max(now, engine.now) + 1.0
        with contextlib.suppress(Rejected):
            _run(engine, now, op)
        for record in engine.jobs.values():
            if record.state in FINISHED:
                assert record.payload is None, record
        unfinished = [r for r in engine.jobs.values() if r.state not in FINISHED]
        assert engine.jobs.total_bytes == sum(size_of(r.payload, r.image) for r in unfinished)
        assert _held_payload_bytes(engine) <= LIMIT  # before: every finished payload too
    again = BrokerEngine.restore(json.loads(json.dumps(engine.snapshot())), config)
    assert again.snapshot() == json.loads(json.dumps(engine.snapshot()))
    assert again.jobs.total_bytes == engine.jobs.total_bytes


def test_a_finished_payload_goes_and_room_comes_back_at_once() -> None:
    config = parse_config({"max_queued_bytes": LIMIT})
    engine = BrokerEngine(config)
    big = {"text": "x" * 1_500}
    record, _ = engine.submit(1.0, member="a", tier="free", priority=0, payload=big)
    granted = engine.pop(2.0, worker="w").record
    assert granted is not None
    assert granted.payload == big  # the worker gets it with its grant
    engine.complete(3.0, job_id=record.id, worker="w", attempt=1, result={"frames": 3})
    kept = engine.jobs[record.id]
    assert (kept.state, kept.result, kept.payload) == ("done", {"frames": 3}, None)
    engine.submit(4.0, member="a", tier="free", priority=0, payload=big)  # fits again
    assert _held_payload_bytes(engine) == size_of(big, None)


def test_a_snapshot_from_before_drops_its_finished_payloads() -> None:
    config = parse_config({})
    engine = BrokerEngine(config)
    record, _ = engine.submit(1.0, member="a", tier="free", priority=0, payload={"p": 1})
    engine.pop(2.0, worker="w")
    engine.complete(3.0, job_id=record.id, worker="w", attempt=1)
    state = json.loads(json.dumps(engine.snapshot()))
    state["jobs"][0]["payload"] = {"p": "x" * 5_000}  # as a round-3 broker saved it
    again = BrokerEngine.restore(state, config)
    assert again.jobs[record.id].payload is None
    assert again.jobs[record.id].state == "done"
