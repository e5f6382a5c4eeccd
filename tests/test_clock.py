"""One clock per process (issue 29, item 6): ``prioqueue.clock`` and the clocks adapters take.

Every test here runs on a manual clock or a virtual loop: none waits for real time.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from prioqueue.broker._horde_blobs import GRACE_SECONDS, Blobs
from prioqueue.client import WaitTimeout
from prioqueue.client.broker import LONG_POLL, Deadline
from prioqueue.clock import SYSTEM_CLOCK, Clock, SystemClock, loop_time, perf_counter
from prioqueue.testing import ManualClock
from virtual_loop import VirtualTimeLoop, run_virtual


def test_the_public_names() -> None:
    import prioqueue.clock

    assert prioqueue.clock.__all__ == [
        "SYSTEM_CLOCK",
        "Clock",
        "SystemClock",
        "loop_time",
        "perf_counter",
    ]


def test_the_system_clock_reads_the_real_clocks() -> None:
    assert isinstance(SYSTEM_CLOCK, SystemClock)
    assert isinstance(SYSTEM_CLOCK, Clock)
    first = SYSTEM_CLOCK.monotonic()
    SYSTEM_CLOCK.sleep(0)
    assert SYSTEM_CLOCK.monotonic() >= first
    assert abs(SYSTEM_CLOCK.wall() - time.time()) < 60  # the same clock, on a busy machine
    assert perf_counter() <= time.perf_counter()
    assert repr(SYSTEM_CLOCK) == "SYSTEM_CLOCK"
    assert SYSTEM_CLOCK.monotonic is time.monotonic  # adapters' defaults: the same readings
    with pytest.raises(ValueError, match="non-negative"):
        SYSTEM_CLOCK.sleep(-1)


def test_the_manual_clock_is_a_clock_whose_sleep_jumps() -> None:
    clock = ManualClock(5.0)
    assert isinstance(clock, Clock)
    assert (clock.monotonic(), clock.wall(), clock()) == (5.0, 5.0, 5.0)
    clock.sleep(2.5)  # autojump: no real time passes
    assert clock.monotonic() == 7.5
    with pytest.raises(ValueError, match="never goes backwards"):
        clock.sleep(-1.0)
    with pytest.raises(TypeError, match="must be a number"):
        clock.sleep("1")  # type: ignore[arg-type]
    assert not isinstance(time.monotonic, Clock)  # a bare callable is not a Clock


def test_loop_time_is_the_loops_own_time() -> None:
    async def main() -> tuple[float, float, float]:
        before = loop_time()
        await asyncio.sleep(30.0)  # virtual: the loop's clock jumps
        return before, loop_time(), loop_time(asyncio.get_running_loop())

    before, after, explicit = run_virtual(main)
    assert before == 1000.0
    assert after == explicit == 1030.0
    loop = VirtualTimeLoop(start=7.0)
    try:
        assert loop_time(loop) == 7.0  # a stored loop, read from outside it
    finally:
        loop.close()
    with pytest.raises(RuntimeError):
        loop_time()  # no loop runs here


def test_a_clients_wait_runs_on_its_injected_clock() -> None:
    clock = ManualClock(100.0)
    deadline = Deadline(2 * LONG_POLL, clock)
    assert deadline.next_poll() == LONG_POLL
    assert not deadline.passed()
    clock.advance(1.5 * LONG_POLL)
    assert deadline.next_poll() == pytest.approx(0.5 * LONG_POLL)
    clock.advance(0.5 * LONG_POLL)
    assert deadline.passed()
    assert deadline.next_poll() == 0.0
    with pytest.raises(WaitTimeout):
        deadline.settled({"id": "j", "state": "queued"})
    endless = Deadline(None, clock)
    clock.advance(1e9)
    assert (endless.next_poll(), endless.passed()) == (LONG_POLL, False)


def test_images_are_stamped_and_swept_by_the_blobs_clock() -> None:
    clock = ManualClock(10_000.0)
    blobs = Blobs(clock=clock)

    async def main() -> tuple[int, int, str | None, str | None]:
        await blobs.put("old", "a")
        clock.advance(GRACE_SECONDS + 1)
        await blobs.put("young", "b")
        kept = await blobs.sweep({"old"}, clock.wall())  # referenced: kept however old
        swept = await blobs.sweep(set(), clock.wall())
        return kept, swept, await blobs.get("old"), await blobs.get("young")

    assert asyncio.run(main()) == (0, 1, None, "b")
