from __future__ import annotations

import math

import pytest

from prioqueue.dispatcher import OVERDUE_SLACK
from prioqueue.errors import ConfigError, InvalidState, UnknownJob
from prioqueue.sim import engine, policies, report, scenarios
from prioqueue.sim.policies import FifoQueue, PolicyParams, StrictQueue, parse_spec
from prioqueue.sim.workload import Arrival, Workload


def _workload(*jobs: Arrival, loads: dict[str, float] | None = None) -> Workload:
    return Workload("test", list(jobs), load_seconds=loads or {}, default_load=5.0)


@pytest.mark.parametrize("kind", ["fifo", "strict", "prioqueue"])
def test_simple_run(kind: str) -> None:
    workload = _workload(
        Arrival(0, "a", -100, model="m", duration=10),
        Arrival(0, "b", 100, model="m", duration=10),
        Arrival(1, "c", 100, model="n", duration=10),
    )
    result = engine.simulate(workload, parse_spec(kind))
    assert result.status == [engine.DONE] * 3
    order = sorted(range(3), key=lambda i: result.start[i])
    expected = [0, 1, 2] if kind == "fifo" else [1, 2, 0]
    assert order == expected
    assert result.swaps == (2 if kind == "fifo" else 3)
    assert result.load_seconds == 5 * result.swaps
    assert result.makespan == pytest.approx(30 + result.load_seconds)
    assert result.idle_waiting_seconds == 0
    assert result.events == 9


def test_cancel_queued_and_running() -> None:
    workload = _workload(
        Arrival(0, "a", 0, duration=100, cancel_after=50),  # cancelled while running
        Arrival(0, "b", 0, duration=10, cancel_after=20),  # cancelled while queued
        Arrival(0, "c", 0, duration=10, cancel_after=500),  # done before its cancel
    )
    for kind in ("fifo", "prioqueue"):
        result = engine.simulate(workload, parse_spec(kind), lease_factor=None)
        assert result.status == [engine.CANCELLED, engine.CANCELLED, engine.DONE]
        assert result.start[0] == 0
        assert math.isnan(result.start[1])
        assert result.end[2] == 60
        summary = report.summarize(result, PolicyParams())
        assert summary["cancelled"] == 2
        assert summary["members"]["a"]["gpu_seconds"] == 50


@pytest.mark.parametrize("kind", ["fifo", "strict", "prioqueue"])
def test_hanging_job_expires_and_fails(kind: str) -> None:
    workload = _workload(
        Arrival(0, "a", 0, duration=10, hangs=1),
        Arrival(0, "b", 0, duration=10, hangs=5),
    )
    result = engine.simulate(workload, parse_spec(kind), lease_factor=2)
    lease = 2 * 10 + 5 + 1
    assert result.status == [engine.DONE, engine.FAILED]
    assert len(result.retries) == 4
    assert result.lost_seconds == pytest.approx(4 * lease)
    summary = report.summarize(result, PolicyParams())
    assert summary["failed"] == 1
    assert summary["expired"] == 4


def test_progress_and_lease_factor() -> None:
    workload = _workload(*(Arrival(float(i), "a", 0, duration=1) for i in range(5000)))
    seen: list[int] = []
    engine.simulate(workload, parse_spec("fifo"), progress=seen.append)
    assert seen[-1] == 5000
    with pytest.raises(ValueError, match="lease_factor"):
        engine.simulate(workload, parse_spec("fifo"), lease_factor=0.5)


def test_baseline_errors() -> None:
    queue = FifoQueue()
    with pytest.raises(TypeError):
        queue.submit("a", member="a", priority="batch", now=0)
    with pytest.raises(UnknownJob):
        queue.cancel("a", now=0)
    with pytest.raises(InvalidState):
        queue.complete("a", now=0)
    assert queue.dispatch(0) is None
    assert queue.expire(0) == []
    assert queue.next_deadline() is None
    strict = StrictQueue()
    strict.submit("x", member="a", priority=1, now=0)
    assert len(strict) == 1


def test_parse_spec() -> None:
    spec = parse_spec("prioqueue:divisor=30,affinity=5,spacing=50,charge=estimate,fair_share=no")
    assert spec.params.aging_divisor == 30
    assert spec.params.max_affinity == 5
    assert spec.params.band_spacing == 50
    assert spec.params.charge == "estimate"
    assert spec.params.fair_share is False
    assert parse_spec("no-aging:d=30").params.aging_divisor == policies.NO_AGING_DIVISOR
    assert parse_spec("no-affinity").params.max_affinity == 0
    assert parse_spec("prioqueue:charge=2").params.charge == 2
    assert parse_spec("fifo").is_baseline
    for bad, message in [
        ("lottery", "unknown policy"),
        ("prioqueue:x=1", "unknown parameter"),
        ("prioqueue:divisor", "expected key=value"),
        ("prioqueue:divisor=abc", "must be a number"),
        ("prioqueue:fair_share=maybe", "true or false"),
        ("prioqueue:spacing=5", "band_spacing"),
        ("prioqueue:charge=-1", "numeric charge"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_spec(bad)


def test_percentile_and_jain() -> None:
    assert report.percentile([], 50) is None
    assert report.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert report.percentile([1.0, 2.0], 100) == 2.0
    assert report.jain_index([]) is None
    assert report.jain_index([0, 0]) is None
    assert report.jain_index([1, 1, 1]) == 1
    assert report.jain_index([1, 0]) == 0.5


def test_charge_models_in_report() -> None:
    workload = scenarios.build("two-films", shots=4)
    for charge, expected in (("estimate", None), (3.0, 3.0)):
        spec = parse_spec(f"prioqueue:charge={charge}")
        summary = report.summarize(engine.simulate(workload, spec), PolicyParams())
        bound = summary["levels"]["-100"]["gap_bound"]
        if expected is not None:
            # Theorem 2 of docs/design/fleet.md (issue 17): k Δ + (T + A) d + 10 C on one GPU
            # (Δ with every tier counted: 2 + 10 points; T the level's own: one tier).
            assert bound == OVERDUE_SLACK * (2 + 10) * 60 + (0 + 10) * 60 + 10 * expected


def test_one_gpu_baselines_are_pull_queues_of_one_worker() -> None:
    # FifoQueue / StrictQueue are the fleet baselines with one worker: dispatch is its pop,
    # and the one-GPU lease rule (job -> seconds) is asked for that worker.
    for queue in (FifoQueue(lambda job: 5.0), StrictQueue(lambda job: 5.0)):
        queue.submit("a", member="m", priority=1, now=0)
        grant = queue.dispatch(1.0)
        assert grant is not None
        assert grant.job.id == "a"
        assert queue.next_deadline() == 6.0
        assert queue.dispatch(1.0) is None  # its one slot is held
        with pytest.raises(TypeError, match="unexpected keyword"):
            queue.submit("b", member="m", colour="red", now=1)  # type: ignore[call-arg]
