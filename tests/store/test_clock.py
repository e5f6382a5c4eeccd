"""Time across restarts (issue 21, Medium 7): monotonic in a process, a far-ahead store bounded.

Every clock here is manual (a wall clock and a monotonic clock moved by hand): no sleeps.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from manual_time import ManualClock, run
from prioqueue.store import DurableDispatcher, WallClock

from .test_durable import FACTORY, MakeStore

YEARS_10 = 10 * 365 * 86400.0


def test_a_wall_clock_step_inside_a_process_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    wall, mono = ManualClock(1_000.0), ManualClock(50.0)
    clock = WallClock(source=wall, monotonic=mono, horizon=60.0)
    assert clock() == 1_000.0
    mono.t += 1.0
    wall.t += YEARS_10  # an operator or NTP steps the clock ten years ahead
    with caplog.at_level(logging.WARNING, "prioqueue.store"):
        assert clock() == 1_001.0  # one monotonic second, not ten years
    assert "stepped" in caplog.text
    wall.t = 900.0  # and back, behind where we started
    mono.t += 2.0
    assert clock() == 1_003.0


def test_a_small_gap_behind_the_store_stands_still_until_the_wall_clock_catches_up() -> None:
    wall, mono = ManualClock(1_000.0), ManualClock(0.0)
    clock = WallClock(source=wall, monotonic=mono, horizon=60.0)
    clock.raise_floor(1_030.0)  # the store is 30 s ahead: within the horizon
    assert clock.offset == 0.0
    assert clock() == 1_030.0
    mono.t += 20.0
    assert clock() == 1_030.0  # still standing
    mono.t += 20.0
    assert clock() == 1_040.0  # caught up: the wall clock again


def test_a_store_far_ahead_is_logged_and_time_runs_on(caplog: pytest.LogCaptureFixture) -> None:
    wall, mono = ManualClock(1_000.0), ManualClock(0.0)
    clock = WallClock(source=wall, monotonic=mono, horizon=60.0)
    with caplog.at_level(logging.WARNING, "prioqueue.store"):
        clock.raise_floor(1_000.0 + YEARS_10)
    assert "ahead of this machine's wall clock" in caplog.text
    assert clock() == 1_000.0 + YEARS_10
    mono.t += 5.0
    assert clock() == 1_005.0 + YEARS_10  # it runs; before issue 21 it stood still for years
    assert clock.offset == YEARS_10


def test_wall_clock_options_are_checked() -> None:
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="horizon"):
            WallClock(horizon=bad)
    with pytest.raises(TypeError, match="monotonic"):
        WallClock(monotonic=3.0)
    assert WallClock()() > 0  # the system clocks


def test_leases_expire_after_a_restart_from_a_run_ten_years_ahead(make_store: MakeStore) -> None:
    wall, mono = ManualClock(1_000_000.0 + YEARS_10), ManualClock(0.0)

    async def main() -> None:
        store = make_store()
        clock = WallClock(source=wall, monotonic=mono, horizon=120.0)
        durable = await DurableDispatcher.open(store, FACTORY, clock=clock)
        await durable.call("submit", job_id="a", member="ann")
        grant = await durable.call("dispatch")  # a 60 s lease, ten years ahead
        await durable.aclose(snapshot=False)
        store.close()
        wall.t = 1_000_100.0  # the clock is fixed; the broker restarts
        store = make_store()
        clock = WallClock(source=wall, monotonic=mono, horizon=120.0)
        again = await DurableDispatcher.open(store, FACTORY, clock=clock)
        assert again.now() >= grant.lease.granted_at
        mono.t += 61.0  # a minute passes
        expired = await again.call("expire")
        assert [e.job.id for e in expired] == ["a"]  # before: time stood still for ten years
        await again.aclose()
        store.close()

    run(main)


def leads(elector: Any) -> bool:
    return bool(elector.is_leader)


@pytest.mark.parametrize("kind", ["callable", "Clock"])
def test_the_electors_lease_runs_on_its_injected_clock(pg_schema: str, kind: str) -> None:
    # A zero-argument callable times the lease alone; a prioqueue.clock.Clock (the testing
    # ManualClock) times the lease and the wait for a hung leader's lock too.
    from prioqueue.store import Elector
    from prioqueue.testing import ManualClock as TestingClock

    from .pg import POSTGRES_URL

    clock: Any = ManualClock(100.0) if kind == "callable" else TestingClock(100.0)

    async def main() -> None:
        elector = Elector(
            POSTGRES_URL, schema=pg_schema, lease=2.0, renew_interval=0.5, poll_interval=0.1,
            clock=clock,
        )  # fmt: skip
        await elector.start()
        try:
            epoch = await elector.wait_leader()
            assert leads(elector)
            assert elector.epoch == epoch
            clock.advance(2.5)  # a whole lease without a renewal, by this broker's own clock
            assert not leads(elector)  # before: it waited for 2.5 real seconds
            assert elector.epoch is None
        finally:
            await elector.aclose()

    run(main)


def test_the_elector_refuses_a_clock_that_is_neither() -> None:
    from prioqueue.store import Elector

    with pytest.raises(TypeError, match="clock must be a Clock or a callable"):
        Elector("postgresql://127.0.0.1/test", clock=3.0)  # type: ignore[arg-type]
