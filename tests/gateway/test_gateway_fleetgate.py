"""``FleetGate``, the gateway's asyncio gate over a ``FleetDispatcher``, without HTTP."""

from __future__ import annotations

import asyncio

import pytest

from prioqueue.asyncio import DispatcherClosed, QueueTimeout, Turn
from prioqueue.fleet import FleetDispatcher
from prioqueue.gateway._fleetgate import FleetGate
from prioqueue.records import Grant


def _gate(*, hold: float = 0.0, routing: str = "warm", lease: float | None = None) -> FleetGate:
    fleet = FleetDispatcher(
        warm_hold=hold, max_attempts=1, lease_for=None if lease is None else (lambda job: lease)
    )
    gate = FleetGate(fleet, routing=routing, warm_hold=hold)  # type: ignore[arg-type]
    _put_back(gate, "a", resident="model-a")
    _put_back(gate, "b")
    return gate


def _put_back(gate: FleetGate, name: str, resident: str | None = None) -> None:
    """Put upstream ``name`` (back) in the fleet: one slot, any model, not slow."""
    gate.put_back(name, models=None, slots=1, slow=False, resident=resident)


def _only_a() -> FleetGate:
    """A ``_gate()`` with upstream b taken out."""
    gate = _gate()
    gate.take_out("b")
    return gate


def _queued(turn: Turn) -> asyncio.Future[Grant]:
    """Submit ``turn`` (queued at once: nothing to wait for) and wait for its grant."""
    turn.submit()
    return asyncio.ensure_future(turn.__aenter__())


@pytest.mark.parametrize(("hold", "expected"), [(15.0, "a"), (0.0, "b")])
def test_the_warm_hold_decides_when_the_cold_upstream_pulls_first(
    hold: float, expected: str
) -> None:
    async def main() -> str | None:
        gate = _gate(hold=hold)
        gate._pull._next = 1  # the next pump lets b pull first (rotation: b, a)
        async with gate.turn("j", member="m", model="model-a") as grant:
            return grant.worker

    assert asyncio.run(main()) == expected


@pytest.mark.parametrize("routing", ["round-robin", "least-busy"])
def test_blind_routings_never_show_the_fleet_a_resident_model(routing: str) -> None:
    async def main() -> None:
        gate = _gate(routing=routing)
        for index in range(4):
            async with gate.turn(f"j{index}", member="m", model="model-a"):
                pass
        assert [w.resident for w in gate.workers()] == [None, None]
        assert sum(gate.grants.values()) == 4

    asyncio.run(main())


def test_a_job_that_could_not_reach_its_upstream_is_requeued_to_another() -> None:
    async def main() -> None:
        gate = _gate()
        turn = gate.turn("j", member="m", model="model-a")
        async with turn as grant:
            assert grant.worker == "a"
            assert gate.take_out("a") == ["j"]  # still held on a: its request may be running
            before = turn.requeued  # (a local: mypy would narrow the property for good)
            assert not before
            assert gate.requeue(turn)  # it never reached a: give it back
            assert turn.requeued
            again = await turn.regrant()
            assert again.worker == "b"
            assert gate.live == ("b",)
            assert gate.take_out("a") == []  # already out: nothing
        assert len(gate.dispatcher) == 0
        assert [w.name for w in gate.workers()] == ["b"]  # a left once it held nothing
        _put_back(gate, "a")
        assert sorted(gate.live) == ["a", "b"]
        with pytest.raises(RuntimeError, match="not waiting for a new grant"):
            await turn.regrant()

    asyncio.run(main())


def test_a_taken_out_upstream_keeps_its_slot_taken_until_its_request_ends() -> None:
    # Issue 21, item 1: out of the fleet and back, its request in flight still counts.
    async def main() -> None:
        gate = _only_a()
        first = gate.turn("first", member="m")
        async with first as grant:
            assert grant.worker == "a"
            gate.take_out("a")
            second = gate.turn("second", member="m")
            waiting = _queued(second)
            _put_back(gate, "a")
            assert second.grant is None  # a still runs the first
            assert gate.holding("a") == 1
        assert (await waiting).worker == "a"
        await second.__aexit__(None, None, None)
        assert len(gate.dispatcher) == 0

    asyncio.run(main())


def test_work_an_upstream_reports_counts_against_its_slots() -> None:
    async def main() -> None:
        gate = _only_a()
        gate.set_reported("a", 1)  # a runs a job the gate does not hold
        turn = gate.turn("j", member="m")
        waiting = _queued(turn)
        assert turn.grant is None
        gate.set_reported("a", 0)
        assert (await waiting).worker == "a"
        await turn.__aexit__(None, None, None)

    asyncio.run(main())


def test_a_requeued_job_waits_while_no_upstream_is_up_and_its_waiter_can_leave() -> None:
    async def main() -> None:
        gate = _only_a()
        turn = gate.turn("j", member="m")
        async with turn:
            gate.take_out("a")
            assert gate.requeue(turn)
            assert gate.live == ()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(turn.regrant(), 0.05)
        assert len(gate.dispatcher) == 0  # the cancelled wait removed the job

    asyncio.run(main())


def test_timeouts_leases_and_close() -> None:
    async def main() -> None:
        gate = _gate(lease=0.05)
        holder = gate.turn("h1", member="m")
        other = gate.turn("h2", member="m")
        async with holder, other:
            waiter = gate.turn("w", member="m", timeout=0.01)
            with pytest.raises(QueueTimeout):
                async with waiter:
                    pass
            await asyncio.wait_for(holder.revoked.wait(), 60)  # "hung", not "slow"
            assert holder.expired is not None
        queued = [gate.turn(f"q{i}", member="m") for i in range(3)]
        gate.take_out("a")
        gate.take_out("b")
        for turn in queued:
            turn.submit()  # queued at once: nothing to wait for
        tasks = [asyncio.ensure_future(t.__aenter__()) for t in queued]
        await gate.aclose()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, DispatcherClosed) for r in results)
        assert len(gate.dispatcher) == 0

    asyncio.run(main())
