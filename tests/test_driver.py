"""The one asyncio driver: its one-worker case and its fleet case keep the same rules.

``AsyncDispatcher`` (over a ``SizeOneDispatcher``) and the gateway's ``FleetGate`` (over a
``FleetDispatcher``) are one class, ``prioqueue._driver.Driver``; these tests run the same
scenario on both. They run on a loop whose time they control (``virtual_loop``), with the
driver given the loop's clock, so leases run out without waiting on the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from prioqueue._driver import Driver
from prioqueue.asyncio import AsyncDispatcher, JobCancelled
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.gateway._fleetgate import FleetGate
from prioqueue.records import Expired
from virtual_loop import run_virtual

Make = Callable[[float], Driver[Any]]


def _one(lease: float) -> Driver[Any]:
    clock = asyncio.get_running_loop().time
    return AsyncDispatcher(SizeOneDispatcher(lease_for=lambda job: lease), clock=clock)


def _fleet(lease: float) -> Driver[Any]:
    fleet = FleetDispatcher(max_attempts=1, lease_for=lambda job: lease)
    gate = FleetGate(fleet, clock=asyncio.get_running_loop().time)
    gate.put_back("w", models=None, slots=1, slow=False, resident=None)
    return gate


CASES = pytest.mark.parametrize("make", [_one, _fleet], ids=["one-worker", "fleet"])


@CASES
def test_a_lease_that_runs_out_revokes_the_holder_and_calls_every_callback(make: Make) -> None:
    async def main() -> None:
        gate = make(0.05)
        seen: list[Expired] = []
        remove = gate.on_expire(seen.append)
        turn = gate.turn("slow", member="s")
        nxt = gate.turn("next", member="n")
        async with turn:
            waiter = asyncio.ensure_future(nxt.__aenter__())
            await asyncio.wait_for(turn.revoked.wait(), timeout=1.0)  # loop time
            assert turn.expired is not None
            assert turn.expired.job.id == "slow"
            assert (await waiter).job.id == "next"  # the resource moved on at the deadline
            assert [grant.job.id for grant in gate.held()] == ["next"]
        await nxt.__aexit__(None, None, None)
        assert [record.job.id for record in seen] == ["slow"]
        remove()
        assert gate.holding(gate.holder("next") or "") == 0
        stats = gate.stats()
        assert (stats.expired, stats.completed) == (1, 1)
        assert "slow" not in gate.dispatcher  # one attempt per turn: not requeued

    run_virtual(main)


@CASES
def test_cancel_fails_a_queued_waiter_and_revokes_a_holder(make: Make) -> None:
    async def main() -> None:
        gate = make(60.0)
        holder = gate.turn("run", member="r")
        async with holder as grant:
            assert gate.holder("run") == grant.worker
            waiting = gate.turn("q", member="q")
            waiting.submit()  # queued now, synchronously: no need to let a task run first
            queued = asyncio.ensure_future(waiting.__aenter__())
            gate.cancel("q")  # its waiter fails
            gate.cancel("run")  # its holder is told; the lease did not run out
            assert (holder.revoked.is_set(), holder.expired) == (True, None)
        with pytest.raises(JobCancelled):
            await queued
        assert len(gate.dispatcher) == 0
        assert gate.stats().cancelled == 2
        await gate.aclose()

    run_virtual(main)
