"""The engine is a deterministic state machine: replaying its journal gives the same state.

Hypothesis drives random operation sequences (submits with idempotency keys, pops by workers
with model subsets and slots, completes and fails by the right and the wrong worker, cancels,
heartbeats, ticks after leases and retention ran out). At a random point the engine is
snapshotted through JSON and restored; the rest is applied to both. The two must agree on
every result and on the final snapshot, and replaying the whole journal into a fresh engine
must give the same snapshot too. Invariants are checked after every step.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prioqueue.broker import BrokerEngine, Rejected, parse_config
from prioqueue.broker._fleet import group_key
from prioqueue.broker._groups import group_status
from prioqueue.broker.engine import FINISHED, JobRecord
from prioqueue.broker.jobbook import JobBook
from prioqueue.broker.workerbook import WorkerSettings

CONFIG = parse_config(
    {
        "store": "memory://",
        "default_lease_seconds": 30,
        "result_ttl_seconds": 50,
        "max_attempts": 2,
        "worker_timeout_seconds": 40,
        "max_queued_per_member": 6,
    }
)
MODELS = ["sdxl", "flux", None]
WORKERS = ["w1", "w2", "w3"]

op = st.one_of(
    st.tuples(
        st.just("submit"),
        st.fixed_dictionaries(
            {
                "member": st.sampled_from(["alice", "bob"]),
                "tier": st.just("free"),
                "priority": st.sampled_from([-100, 0, 100]),
                "model": st.sampled_from(MODELS),
                "idempotency_key": st.one_of(st.none(), st.sampled_from(["k1", "k2"])),
                "image": st.one_of(st.none(), st.just({"width": 512, "height": 512})),
                "group": st.sampled_from([None, "film", "film", "other"]),
            }
        ),
    ),
    st.tuples(
        st.just("pop"),
        st.fixed_dictionaries(
            {
                "worker": st.sampled_from(WORKERS),
                "models": st.one_of(st.none(), st.just(["sdxl"]), st.just(["flux", "sdxl"])),
                "slots": st.integers(1, 2),
                "slow": st.booleans(),
            }
        ),
    ),
    st.tuples(
        st.sampled_from(["complete", "fail"]),
        st.tuples(st.integers(1, 12), st.sampled_from(WORKERS), st.integers(1, 2)),
    ),
    st.tuples(st.just("cancel"), st.tuples(st.integers(1, 12), st.sampled_from(["alice", "bob"]))),
    st.tuples(st.just("heartbeat"), st.sampled_from(WORKERS)),
    st.tuples(
        st.just("cancel_group"),
        st.tuples(
            st.sampled_from(["alice", "bob"]),
            st.sampled_from(["film", "other", "none"]),
            st.sampled_from(["keep", "cancel", "bad"]),
        ),
    ),
    st.tuples(st.just("group_status"), st.sampled_from(["film", "other", "none"])),
    st.tuples(st.just("wait"), st.sampled_from([1.0, 10.0, 35.0])),
)


def _args(name: str, raw: Any) -> tuple[str, dict[str, Any]]:
    if name in ("complete", "fail"):
        n, worker, attempt = raw
        return name, {
            "job_id": f"job-{n}",
            "worker": worker,
            "attempt": attempt,
            "result": {"n": n},
        }
    if name == "cancel":
        n, member = raw
        return name, {"job_id": f"job-{n}", "member": member}
    if name == "heartbeat":
        return name, {"worker": raw}
    if name == "group_status":
        return name, {"group": raw}
    if name == "cancel_group":
        member, group, running = raw
        return name, {"group": group, "member": member, "running": running}
    return name, dict(raw)


def _outcome(engine: BrokerEngine, name: str, args: dict[str, Any], now: float) -> Any:
    result: Any
    try:
        if name == "group_status":  # a read: it must change nothing
            before = engine.snapshot()
            result = group_status(engine, args["group"], "alice")
            assert engine.snapshot() == before
        else:
            result = engine.apply(name, args, now)
    except Rejected as exc:
        return ("rejected", exc.status)
    if isinstance(result, tuple):
        return (attrs.asdict(result[0]), result[1])
    if hasattr(result, "record"):
        return (None if result.record is None else attrs.asdict(result.record), dict(result.idle))
    if attrs.has(type(result)):
        return attrs.asdict(result)
    return result


def _check(engine: BrokerEngine) -> None:
    engine.check()  # the owners' own rules: the job book's, the worker book's
    held: dict[str, list[str]] = {}
    for record in engine.jobs.values():
        in_fleet = record.id in engine.fleet
        assert in_fleet == (record.state not in FINISHED), record
        if record.state == "running":
            assert record.worker is not None
            assert engine.fleet.holder(record.id) == record.worker
            held.setdefault(record.worker, []).append(record.id)
        if record.state == "queued":
            assert engine.fleet.holder(record.id) is None
    for worker, jobs in held.items():
        assert len(jobs) <= 2, (worker, jobs)
    for (member, key), (ids, _digest) in engine.jobs.idempotency.items():
        for job_id in ids:  # a key names the jobs of one request, all kept
            assert engine.jobs[job_id].member == member
            assert engine.jobs[job_id].idempotency_key == key
    _check_groups(engine)


def _check_groups(engine: BrokerEngine) -> None:
    """The core's group counts agree with the broker's records (a brute-force tally)."""
    tally: dict[tuple[str, str], dict[str, int]] = {}
    for record in engine.jobs.values():
        if record.group is not None:
            states = tally.setdefault((record.member, record.group), {})
            states[record.state] = states.get(record.state, 0) + 1
    kept = {group_key(m, g): sum(c.values()) for (m, g), c in tally.items()}
    assert engine.jobs.group_kept == kept
    for (member, label), states in tally.items():
        status = group_status(engine, label, member)
        assert status.members == (member,)
        for state in ("queued", "running"):  # live jobs: exactly the records
            assert getattr(status, state) == states.get(state, 0), (label, state)
        for state in FINISHED - {"expired"}:  # finished: records may be gone, never more
            assert getattr(status, state) >= states.get(state, 0), (label, state)
        # A job whose ttl ran out counts as failed in its group.
        assert status.failed >= states.get("failed", 0) + states.get("expired", 0)


@settings(max_examples=60)
@given(ops=st.lists(op, min_size=1, max_size=40), cut=st.integers(0, 40))
def test_snapshot_restore_and_replay_agree_with_the_live_engine(
    ops: list[tuple[str, Any]], cut: int
) -> None:
    live = BrokerEngine(CONFIG)
    journal: list[tuple[str, dict[str, Any], float]] = []
    restored: BrokerEngine | None = None
    now = 1_000_000.0
    for i, (name, raw) in enumerate(ops):
        if i == cut:
            restored = BrokerEngine.restore(json.loads(json.dumps(live.snapshot())), CONFIG)
        if name == "wait":
            now += raw
            continue
        if live.due(now):
            journal.append(("tick", {}, now))
            expected_tick = _outcome(live, "tick", {}, now)
            if restored is not None:
                assert _outcome(restored, "tick", {}, now) == expected_tick
        op_name, args = _args(name, raw)
        args = json.loads(json.dumps(args))
        expected = _outcome(live, op_name, args, now)
        refused = isinstance(expected, tuple) and expected and expected[0] == "rejected"
        if not refused and op_name != "group_status":
            journal.append((op_name, args, now))
        if restored is not None:
            assert _outcome(restored, op_name, args, now) == expected
        _check(live)
    final = live.snapshot()
    if restored is not None:
        assert restored.snapshot() == final
    replayed = BrokerEngine(CONFIG)
    for op_name, args, at in journal:
        replayed.apply(op_name, args, at)
    assert replayed.snapshot() == final


def test_rejected_operations_change_nothing() -> None:
    engine = BrokerEngine(CONFIG)
    now = 1_000_000.0
    engine.apply("submit", {"member": "alice", "tier": "free", "priority": 0}, now)
    engine.apply("pop", {"worker": "w1"}, now)
    before = engine.snapshot()
    rejected: list[tuple[str, dict[str, Any]]] = [
        ("complete", {"job_id": "job-1", "worker": "w2", "attempt": 1}),
        ("fail", {"job_id": "job-1", "worker": "w1", "attempt": 2}),
        ("complete", {"job_id": "job-9", "worker": "w1", "attempt": 1}),
        ("cancel", {"job_id": "job-1", "member": "bob"}),
        ("heartbeat", {"worker": "nobody"}),
    ]
    for name, args in rejected:
        try:
            engine.apply(name, args, now + 1)
        except Rejected:
            pass
        else:  # pragma: no cover - the assertion message says which
            raise AssertionError(f"{name} {args} was accepted")
        assert engine.snapshot() == before


def test_a_restored_fleet_charges_a_grant_as_the_live_one_did() -> None:
    config = parse_config({"store": "memory://"})  # charge = "runtime": the recent means count
    live = BrokerEngine(config)
    now = 1_000_000.0
    job: dict[str, Any] = {"tier": "free", "priority": -100, "model": "sdxl"}
    live.apply("submit", {"member": "bob", **job}, now)
    live.apply("submit", {"member": "alice", **job}, now)
    live.apply("pop", {"worker": "w1"}, now)
    live.apply("submit", {"member": "alice", **job}, now)
    live.apply("cancel", {"job_id": "job-1", "member": "bob"}, now)
    restored = BrokerEngine.restore(json.loads(json.dumps(live.snapshot())), config)
    for engine in (live, restored):
        engine.apply("pop", {"worker": "w1"}, now)
    assert restored.snapshot() == live.snapshot()


def test_groups_of_a_snapshot_without_core_groups_are_unknown_not_fatal() -> None:
    # A snapshot from before the broker passed groups to the dispatcher: records carry a
    # group the core never saw. Reads and cancels answer 404; retention forgets quietly.
    engine = BrokerEngine(CONFIG)
    now = 1_000_000.0
    engine.apply("submit", {"member": "alice", "tier": "free", "priority": 0, "group": "f"}, now)
    state = json.loads(json.dumps(engine.snapshot()))
    assert "5:alice/f" in state["fleet"]["groups"]
    state["fleet"]["groups"] = {}
    old = BrokerEngine.restore(state, CONFIG)
    assert old.jobs.group_kept == {"5:alice/f": 1}
    with pytest.raises(Rejected, match="no group 'f' of member 'alice'") as read:
        group_status(old, "f", "alice")
    with pytest.raises(Rejected, match="no group 'f' of member 'alice'") as cancel:
        old.apply("cancel_group", {"group": "f", "member": "alice"}, now)
    assert (read.value.status, cancel.value.status) == (404, 404)
    old.apply("cancel", {"job_id": "job-1", "member": "alice"}, now)
    old.apply("tick", {}, now + CONFIG.result_ttl_seconds)
    assert old.jobs == {}
    assert old.jobs.group_kept == {}


def test_the_journaled_operations_are_the_declared_ones() -> None:
    from prioqueue._journaled import journaled_ops
    from prioqueue.broker.service import BROKER_OPS, SKIPPED_OPS

    declared = journaled_ops(BrokerEngine)
    assert BROKER_OPS == set(declared) >= {"submit", "pop", "try_pop", "tick", "submit_many"}
    assert {"try_pop"} == SKIPPED_OPS
    engine = BrokerEngine(CONFIG)
    with pytest.raises(ValueError, match="unknown broker operation 'snapshot'"):
        engine.apply("snapshot", {}, 1.0)
    with pytest.raises(TypeError, match="unexpected keyword arguments for a pop: slot"):
        engine.apply("pop", {"worker": "w1", "slot": 2}, 1.0)
    assert engine.version == 1  # counted, like any operation that raises half way


def test_submit_and_batch_refusals_change_nothing() -> None:
    engine = BrokerEngine(parse_config({"store": "memory://", "max_queued_per_member": 1}))
    job = {"member": "alice", "tier": "free", "priority": 0}
    bad_backoff = {**job, "backoff": {"kind": "nope"}}
    before = engine.snapshot(now=1.0)
    refused: list[tuple[str, dict[str, Any], str]] = [
        ("submit", bad_backoff, "backoff"),
        ("submit_many", {"jobs": []}, "at least one job"),
        ("submit_many", {"jobs": [bad_backoff]}, "backoff"),
        ("submit_many", {"jobs": [job, job]}, "max_queued_per_member=1"),
    ]
    for op, args, message in refused:
        with pytest.raises(Rejected, match=message):
            engine.apply(op, args, 1.0)
        assert engine.snapshot(now=1.0) == before
    engine.apply("submit", job, 2.0)
    with pytest.raises(Rejected, match="time went backwards"):
        engine.apply("try_pop", {"worker": "w1"}, 1.0)


def test_a_snapshot_from_before_capabilities_and_seen_restores_as_it_was_taken() -> None:
    # Workers' settings without ``capabilities`` and no ``seen`` (older snapshots): they are
    # written back as read, and a worker's next pop re-joins it with its full settings.
    engine = BrokerEngine(CONFIG)
    now = 1_000_000.0
    engine.apply("submit", {"member": "alice", "tier": "free", "priority": 0}, now)
    engine.apply("pop", {"worker": "w1", "resident": "m"}, now)
    engine.apply("pop", {"worker": "w2"}, now + 1)
    state = json.loads(json.dumps(engine.snapshot()))
    for settings_ in state["workers"].values():
        del settings_["capabilities"]
    del state["seen"]
    old = BrokerEngine.restore(state, CONFIG)
    again = old.snapshot()
    assert again["workers"] == state["workers"]
    assert again["seen"] == [["w1", now], ["w2", now + 1]]  # as the fleet last saw them
    old.apply("heartbeat", {"worker": "w1", "resident": "n"}, now + 2)
    assert old.snapshot()["workers"]["w1"] == {
        "models": None, "resident": "n", "slots": 1, "slow": False,
    }  # fmt: skip
    old.apply("pop", {"worker": "w2"}, now + 3)  # settings now stated in full: a re-join
    assert old.snapshot()["workers"]["w2"]["capabilities"] is None
    assert old.workers["w2"] == WorkerSettings()
    old.check()


def test_the_job_book_keeps_its_rules() -> None:
    book = JobBook(result_ttl=10.0)
    record = JobRecord(
        id="job-1", member="alice", priority=0, model=None, estimate=None, group="g",
        image=None, payload={"x": 1}, submitted_at=0.0, idempotency_key="k",
    )  # fmt: skip
    with pytest.raises(ValueError, match="the next job is 'job-1', not 'job-2'"):
        book.add(attrs.evolve(record, id="job-2"), 7)
    book.add(record, 7, "digest")
    book.check()
    assert (book.counter, book.total_bytes, dict(book.group_kept)) == (1, 7, {"5:alice/g": 1})
    assert book.idempotency == {("alice", "k"): (("job-1",), "digest")}
    book.finish("job-1", "done", {"ok": True}, 5.0)
    book.check()
    assert (book["job-1"].payload, book.total_bytes, book.counts["done"]) == (None, 0, 1)
    assert book.retention_due() == 15.0
    assert book.retire_due(14.0) == []
    assert book.retire_due(15.0) == ["5:alice/g"]  # the group's last record went
    assert (len(book), dict(book.idempotency), dict(book.group_kept)) == (0, {}, {})
    book.check()
