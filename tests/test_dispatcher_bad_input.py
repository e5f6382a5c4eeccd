"""Hostile input to the core (issue 11's repros): a clear error, and the state stays usable.

Each test states what happened before the fix: a raw ``OverflowError``, a value accepted that
made every later dispatch raise, a snapshot restored with a poisoned state, or an asyncio gate
that never granted the next turn or held the resource for ever.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from prioqueue import ChargeError, FleetDispatcher, SizeOneDispatcher
from prioqueue.asyncio import AsyncDispatcher


def usable(d: SizeOneDispatcher, now: float = 0.0) -> None:
    """Submit, dispatch and complete one job: the dispatcher still works."""
    d.submit("probe", member="p", now=now)
    grant = d.dispatch(now)
    assert grant is not None
    assert grant.job.id == "probe"
    d.complete("probe", now=now + 1)
    d._check()


@pytest.mark.parametrize("bad", [-math.inf, math.inf, math.nan, 10**400, -(10**400), 1e16])
def test_a_bad_first_now_is_refused_and_changes_nothing(bad: Any) -> None:
    # Before: now=-inf was accepted as the first time; now=10**400 raised OverflowError.
    d = SizeOneDispatcher()
    with pytest.raises(ValueError, match=r"now must be a finite number of seconds, got"):
        d.submit("j", member="m", now=bad)
    assert len(d) == 0
    usable(d)


def test_a_huge_int_now_names_the_argument_briefly() -> None:
    d = SizeOneDispatcher()
    with pytest.raises(ValueError, match="now must be a finite number") as info:
        d.dispatch(10**400)
    assert len(str(info.value)) < 200  # the 400-digit number is cut
    usable(d)


@pytest.mark.parametrize("bad", [10**400, -(10**400), 10**10, "1" + "0" * 30])
def test_an_out_of_range_priority_is_refused(bad: Any) -> None:
    # Before: priority=10**400 was queued, then every dispatch raised OverflowError until
    # that job was cancelled.
    d = SizeOneDispatcher()
    d.submit("ok", member="m", now=0)
    with pytest.raises(ValueError, match=r"priority must resolve to a level within"):
        d.submit("big", member="m", priority=bad, now=0)
    assert "big" not in d
    grant = d.dispatch(0)
    assert grant is not None
    assert grant.job.id == "ok"


def test_a_clamping_policy_keeps_huge_priorities_usable() -> None:
    from prioqueue import PriorityPolicy

    d = SizeOneDispatcher(policy=PriorityPolicy(minimum=-100, maximum=100))
    assert d.submit("big", member="m", priority=10**400, now=0).job.priority == 100


def snapshot_with_running(lease: bool = True) -> dict[str, Any]:
    d = SizeOneDispatcher(lease_for=(lambda job: 100.0) if lease else None)
    d.submit("r", member="a", now=0)
    d.submit("q", member="b", now=1)
    d.submit("q2", member="a", now=2)
    assert d.dispatch(3) is not None
    state: dict[str, Any] = json.loads(json.dumps(d.snapshot(now=4)))
    return state


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("taken_at",), math.inf, "taken_at must be a finite number"),
        (("queued", 0, "arrival"), -math.inf, "arrival must be a finite number"),
        (("queued", 0, "arrival"), 1e300, "arrival must be a finite number"),
        (("lanes", 0, "s"), math.inf, "lane s must be a finite number"),
        (("lanes", 0, "s"), 50.0, "starts at 50.0, after the snapshot was taken"),
        (("queued", 0, "attempt"), -1, "attempt must be >= 1, got -1"),
        (("queued", 0, "attempt"), 0, "attempt must be >= 1, got 0"),
        (("queued", 0, "attempt"), 1.5, "attempt must be an int, got 1.5"),
        (("queued", 0, "seq"), 1, "sequence number 1 appears twice"),
        (("queued", 0, "seq"), 99, "has seq 99, above the snapshot's seq 3"),
        (("queued", 0, "priority"), 10**400, "level must lie within"),
        (("seq",), -1, "seq must be >= 0"),
        (("running", "granted_at"), math.nan, "granted_at must be a finite number"),
        (("running", "lease_seconds"), math.inf, "lease_seconds must be a finite number"),
        (("running", "attempt"), -3, "attempt must be >= 1"),
    ],
)
def test_restore_refuses_a_poisoned_snapshot(path: tuple[Any, ...], value: Any, match: str) -> None:
    # Before: infinities, duplicate sequence numbers, a lane start in the future and negative
    # attempts were restored as they were, breaking the order or every later dispatch.
    state = snapshot_with_running()
    target: Any = state
    for key in path[:-1]:
        target = target[key]
    if path[-1] == "seq" and path[0] == "queued":
        # Make the duplicate: the queued job takes the running job's seq.
        value = state["running"]["seq"] if value == 1 else value
    target[path[-1]] = value
    with pytest.raises(ValueError, match=r"^invalid snapshot: .*" + match):
        SizeOneDispatcher.restore(state, lease_for=lambda job: 100.0)


def test_a_valid_snapshot_still_restores() -> None:
    restored = SizeOneDispatcher.restore(snapshot_with_running(), lease_for=lambda job: 100.0)
    restored._check()
    assert restored.running is not None
    assert restored.running.job.id == "r"
    assert len(restored) == 2


def test_restore_can_require_a_lease_for_the_running_job() -> None:
    state = snapshot_with_running(lease=False)
    with pytest.raises(ValueError, match="running job 'r' has no lease"):
        SizeOneDispatcher.restore(state, require_lease=True)
    assert SizeOneDispatcher.restore(state).running is not None  # allowed when not required


def test_the_gate_refuses_a_running_job_without_a_lease() -> None:
    # Before: the gate took it and the resource stayed held for ever (no turn held the job).
    restored = SizeOneDispatcher.restore(snapshot_with_running(lease=False))
    with pytest.raises(ValueError, match=r"running job 'r' has no lease: no turn holds it"):
        AsyncDispatcher(restored)
    restored.cancel("r", now=10)
    AsyncDispatcher(restored)  # fine once it is gone


def test_the_gate_frees_the_resource_when_the_charge_model_returns_nan() -> None:
    # Before: complete() raised at the end of the first turn, the job stayed running and the
    # second turn was never granted.
    def charge(job: Any, runtime: float) -> float:
        return math.nan if job.id == "first" and runtime < 50 else runtime

    async def main() -> list[str]:
        clock = [1000.0]
        gate = AsyncDispatcher(SizeOneDispatcher(charge=charge), clock=lambda: clock[0])
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        order: list[str] = []

        async def one(job_id: str) -> None:
            async with gate.turn(job_id, member=job_id) as grant:
                order.append(grant.job.id)
                clock[0] += 1

        await asyncio.wait_for(asyncio.gather(one("first"), one("second")), timeout=60)
        assert [type(ctx["exception"]) for ctx in reported] == [ChargeError]
        assert gate.dispatcher.stats(now=clock[0]).completed == 2
        return order

    assert asyncio.run(main()) == ["first", "second"]


def test_the_gate_drops_a_job_whose_expected_charge_is_nan() -> None:
    async def main() -> None:
        d = SizeOneDispatcher(charge=lambda job, runtime: math.nan if job.id == "bad" else 1.0)
        gate = AsyncDispatcher(d, clock=lambda: 1000.0)
        with pytest.raises(ChargeError, match="job 'bad'"):
            async with gate.turn("bad", member="a"):
                pass
        async with gate.turn("good", member="b") as grant:
            assert grant.job.id == "good"

    asyncio.run(main())


@pytest.mark.parametrize("bad", [math.inf, 10**400, -(10**400)])
def test_the_fleet_refuses_bad_times_too(bad: Any) -> None:
    f = FleetDispatcher()
    with pytest.raises(ValueError, match="now must be a finite number of seconds"):
        f.join("w", now=bad)
    f.join("w", now=0)
    f.submit("j", member="m", now=0)
    grant = f.pop("w", now=1)
    assert grant is not None
    assert grant.worker == "w"
