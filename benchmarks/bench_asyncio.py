"""What one ``turn()`` of the asyncio adapter costs, beside bare asyncio futures.

Run: ``python benchmarks/bench_asyncio.py``. Every figure is a ratio to a baseline measured in
the same run (see ``_harness``):

* an uncontended turn (submit, immediate grant, complete) against one bare
  ``loop.create_future()`` + ``set_result``, and against the same three core calls made
  directly (the adapter's own share is the difference);
* a turn with N waiters queued, measured by draining the queue: each completion dispatches the
  next job and wakes its task, so the figure includes one task wake-up per turn. Its baseline
  is the same hand-off done with bare futures (N tasks, each woken by the previous one), so
  the ratio is the adapter's own overhead on top of asyncio's scheduling.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine
from typing import Any

from _harness import per_call, report, section

from prioqueue.asyncio import AsyncDispatcher
from prioqueue.dispatcher import SizeOneDispatcher

SIZES = (100, 1_000, 10_000)
ROUNDS = 5


class FrozenClock:
    """A constant clock: the dispatcher's arithmetic stays the same in every round."""

    def __call__(self) -> float:
        return 1000.0


def core_cycle_cost() -> float:
    """The core calls one uncontended turn makes, without the adapter."""
    d = SizeOneDispatcher()
    counter = iter(range(10**9))

    def one() -> None:
        job_id = f"j{next(counter)}"
        d.submit(job_id, member="m", now=1000.0)
        d.dispatch(1000.0)
        d.complete(job_id, now=1000.0, runtime=0.0)

    return per_call(one)


def bare_future_cost() -> float:
    loop = asyncio.new_event_loop()
    try:

        def one() -> None:
            loop.create_future().set_result(None)

        return per_call(one)
    finally:
        loop.close()


async def uncontended(cycles: int) -> float:
    gate = AsyncDispatcher(clock=FrozenClock())
    ids = [f"j{i}" for i in range(cycles)]
    started = time.perf_counter()
    for job_id in ids:
        async with gate.turn(job_id, member="m"):
            pass
    return (time.perf_counter() - started) / cycles


async def drain(n: int) -> float:
    """Per-turn seconds to serve n queued waiters one after another."""
    gate = AsyncDispatcher(clock=FrozenClock())
    release = asyncio.Event()
    priorities = (-100, 0, 100)

    async def hold() -> None:
        async with gate.turn("blocker", member="blocker"):
            await release.wait()

    async def waiter(i: int) -> None:
        async with gate.turn(f"j{i}", member=f"m{i % 50}", priority=priorities[i % 3]):
            pass

    blocker = asyncio.ensure_future(hold())
    await asyncio.sleep(0)
    tasks = [asyncio.ensure_future(waiter(i)) for i in range(n)]
    await asyncio.sleep(0)
    assert len(gate.dispatcher) == n
    started = time.perf_counter()
    release.set()
    await asyncio.gather(blocker, *tasks)
    return (time.perf_counter() - started) / n


async def bare_drain(n: int) -> float:
    """The same hand-off with bare futures: each task wakes the next one when it ends."""
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(n + 1)]

    async def waiter(i: int) -> None:
        await futures[i]
        futures[i + 1].set_result(None)

    tasks = [asyncio.ensure_future(waiter(i)) for i in range(n)]
    await asyncio.sleep(0)
    started = time.perf_counter()
    futures[0].set_result(None)
    await asyncio.gather(*tasks)
    return (time.perf_counter() - started) / n


def best(make: Callable[[int], Coroutine[Any, Any, float]], n: int) -> float:
    results = []
    for _ in range(ROUNDS):
        gc.collect()
        gc.disable()
        try:
            results.append(asyncio.run(make(n)))
        finally:
            gc.enable()
    return min(results)


def main() -> None:
    section("asyncio adapter: one turn (submit, grant, complete)")
    future = bare_future_cost()
    core = core_cycle_cost()
    turn = best(uncontended, 2_000)
    report("turn(), uncontended", turn, "Future create+set_result", future)
    report("turn(), uncontended", turn, "core submit+dispatch+complete", core)
    section("asyncio adapter: turn with N waiters queued (drain, one task wake per turn)")
    for n in SIZES:
        turn = best(drain, n)
        bare = best(bare_drain, n)
        report(f"turn(), {n:>6} waiters", turn, "bare future hand-off", bare)
        report(f"turn(), {n:>6} waiters", turn, "Future create+set_result", future)


if __name__ == "__main__":
    main()
