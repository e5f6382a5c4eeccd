"""The asyncio adapter: turns, score order, cancellation, timeouts, leases and closing.

Each test is a plain function that runs its scenario with ``asyncio.run``, so no plugin is
needed. Most use a frozen manual clock (the dispatcher's ``now``); the tests of the loop's
timers (queue timeouts, the lease timer) run on a loop whose time they control
(``virtual_loop.run_virtual``: time jumps to the next timer when every task waits), with the
driver given the loop's clock, so nothing waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

import prioqueue.asyncio as pa
from manual_time import ManualClock, run, turns
from prioqueue.asyncio import AsyncDispatcher, DispatcherClosed, JobCancelled, QueueTimeout
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.errors import DuplicateJob, LeaseError, PrioqueueError, QueueFull, UnknownJob
from prioqueue.records import Expired, Grant
from virtual_loop import run_virtual

T = TypeVar("T")


class Recorder:
    """Holders that record their grant order and leave at once (or when released)."""

    def __init__(self, gate: AsyncDispatcher) -> None:
        self.gate = gate
        self.order: list[str] = []
        self.grants: dict[str, Grant] = {}

    async def job(self, job_id: str, hold: Awaitable[object] | None = None, **kw: Any) -> None:
        async with self.gate.turn(job_id, **kw) as grant:
            assert grant.job.id == job_id
            assert job_id not in self.grants, "granted twice"
            self.grants[job_id] = grant
            self.order.append(job_id)
            if hold is not None:
                await hold


async def blocked(gate: AsyncDispatcher) -> tuple[Recorder, asyncio.Task[None], asyncio.Event]:
    """A recorder, and its holder "blocker" that keeps the resource until the event is set."""
    rec = Recorder(gate)
    release = asyncio.Event()
    task = asyncio.ensure_future(rec.job("blocker", release.wait(), member="blocker"))
    await turns(5)
    return rec, task, release


def test_module_name_does_not_shadow_the_stdlib() -> None:
    assert vars(pa)["asyncio"] is asyncio
    assert set(pa.__all__) == {
        "AsyncChain",
        "AsyncDispatcher",
        "ChainResult",
        "DispatcherClosed",
        "JobCancelled",
        "QueueTimeout",
        "Turn",
    }
    assert issubclass(QueueTimeout, TimeoutError)
    assert issubclass(QueueTimeout, PrioqueueError)
    assert issubclass(DispatcherClosed, PrioqueueError)


def test_grants_in_score_order_and_completes_with_measured_runtime() -> None:
    clock = ManualClock()

    async def main() -> None:
        gate = AsyncDispatcher(clock=clock)
        rec, task, release = await blocked(gate)
        assert rec.order == ["blocker"]
        jobs = [
            ("batch", -100, "max"),
            ("normal-free", 0, "free"),
            ("interactive", "interactive", "free"),
            ("normal-pro", 0, "pro"),
        ]
        tasks = [
            asyncio.ensure_future(rec.job(j, member=j, priority=p, tier=t)) for j, p, t in jobs
        ]
        await turns(5)
        assert len(gate.dispatcher) == 4
        clock.advance(7.0)
        release.set()
        await asyncio.gather(task, *tasks)
        assert rec.order == ["blocker", "interactive", "normal-pro", "normal-free", "batch"]
        stats = gate.stats()
        assert stats.completed == 5
        assert stats.running is None
        assert stats.members["blocker"].gpu_seconds == pytest.approx(7.0)

    run(main)


def test_ten_thousand_waiters_each_granted_once_in_score_order() -> None:
    n = 10_000
    rng = random.Random(1)
    clock = ManualClock()
    tier_bonus = {"free": 0, "pro": 1, "max": 2}

    async def main() -> None:
        gate = AsyncDispatcher(clock=clock)
        rec, task, release = await blocked(gate)
        specs = [
            (f"j{i}", rng.choice([-100, 0, 100]), rng.choice(["free", "pro", "max"]))
            for i in range(n)
        ]
        tasks = [
            asyncio.ensure_future(rec.job(j, member=j, priority=p, tier=t)) for j, p, t in specs
        ]
        await turns(5)
        assert len(gate.dispatcher) == n
        predicted = [a.job_id for a in gate.dispatcher.forecast(now=clock())]
        release.set()
        await asyncio.gather(task, *tasks)
        expected = [
            j
            for _, _, j in sorted((-(p + tier_bonus[t]), i, j) for i, (j, p, t) in enumerate(specs))
        ]
        assert rec.order[1:] == expected
        assert rec.order[1:] == predicted
        assert len(rec.grants) == n + 1
        assert gate.stats().completed == n + 1
        assert len(gate.dispatcher) == 0

    # Behaviour only: its speed is benchmarks/bench_asyncio.py's (a turn with 10,000 waiters
    # queued, beside bare asyncio futures). A time bound here failed on a busy machine.
    run(main)


def test_cancel_while_waiting_removes_the_job_and_never_dispatches_it() -> None:
    clock = ManualClock()

    async def main() -> None:
        gate = AsyncDispatcher(clock=clock)
        gate.set_resident_model("small")
        rec, task, release = await blocked(gate)
        gone = asyncio.ensure_future(rec.job("gone", member="m", priority=100, model="huge"))
        later = asyncio.ensure_future(rec.job("later", member="n", priority=-100))
        await turns(5)
        assert "gone" in gate.dispatcher
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert "gone" not in gate.dispatcher
        release.set()
        await asyncio.gather(task, later)
        assert rec.order == ["blocker", "later"]
        stats = gate.stats()
        assert stats.cancelled == 1
        assert stats.dispatched == 2
        assert stats.resident_model == "small"  # the disconnected client loaded nothing

    run(main)


def test_exception_in_block_frees_the_resource_and_cancels_the_job() -> None:
    clock = ManualClock()

    async def main() -> None:
        gate = AsyncDispatcher(clock=clock)
        rec = Recorder(gate)
        nxt = asyncio.ensure_future(rec.job("next", member="b"))

        async def boom() -> None:
            async with gate.turn("boom", member="a", priority=100):
                await turns(5)
                assert rec.order == []
                clock.advance(3.0)
                raise KeyError("gpu fell over")

        with pytest.raises(KeyError):
            await boom()
        await nxt
        assert rec.order == ["next"]
        stats = gate.stats()
        assert stats.cancelled == 1
        assert stats.completed == 1
        assert stats.members["a"].gpu_seconds == pytest.approx(3.0)  # charged for its time
        assert stats.members["a"].completed == 0

    run(main)


def test_holder_cancelled_inside_block_frees_the_resource() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(clock=ManualClock())
        rec, task, _release = await blocked(gate)
        other = asyncio.ensure_future(rec.job("other", member="o"))
        await turns(5)
        task.cancel()
        await other
        assert rec.order == ["blocker", "other"]
        assert task.cancelled()

    run(main)


def test_submit_errors_raise_from_aenter_without_waiting() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(SizeOneDispatcher(max_queued=1), clock=ManualClock())
        rec, task, release = await blocked(gate)
        waiting = asyncio.ensure_future(rec.job("w", member="w"))
        await turns(5)
        with pytest.raises(QueueFull):
            async with gate.turn("full", member="x"):
                pytest.fail("entered")  # pragma: no cover
        with pytest.raises(DuplicateJob):
            async with gate.turn("w", member="w"):
                pytest.fail("entered")  # pragma: no cover
        with pytest.raises(ValueError, match="timeout"):
            gate.turn("t", member="x", timeout=-1)
        release.set()
        await asyncio.gather(task, waiting)
        # A finished job's id can be used again.
        async with gate.turn("w", member="w") as grant:
            assert grant.job.seq > rec.grants["w"].job.seq
        assert rec.order == ["blocker", "w"]

    run(main)


def test_submit_first_then_enter() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(clock=ManualClock())
        turn = gate.turn("a", member="m", priority="interactive")
        ticket = turn.submit()
        assert ticket.job.priority == 100
        assert turn.ticket is ticket
        assert gate.dispatcher.state("a") == "running"  # granted at submit
        with pytest.raises(RuntimeError, match="already submitted"):
            turn.submit()
        async with turn as grant:
            assert grant is turn.grant
            with pytest.raises(RuntimeError, match="already entered"):
                await turn.__aenter__()
        assert "a" not in gate.dispatcher
        assert "granted" in repr(turn)

    run(main)


def test_queue_timeout_removes_the_job() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(clock=ManualClock())
        rec, task, release = await blocked(gate)
        for timeout in (0.0, 0.02):
            with pytest.raises(QueueTimeout) as info:
                async with gate.turn("late", member="l", timeout=timeout):
                    pytest.fail("entered")  # pragma: no cover
            assert isinstance(info.value, TimeoutError)
            assert info.value.job_id == "late"
            assert info.value.timeout == timeout
            assert "late" not in gate.dispatcher
        # A grant before the timeout disarms it.
        waiter = asyncio.ensure_future(rec.job("quick", member="q", timeout=0.05))
        await turns(5)
        release.set()
        await asyncio.gather(task, waiter)
        await asyncio.sleep(0.08)  # loop time: past the disarmed timeout
        assert rec.order == ["blocker", "quick"]
        assert gate.stats().cancelled == 2

    run_virtual(main)


def test_lease_expiry_timer_fires_without_polling() -> None:
    expire_calls = 0

    class Counting(SizeOneDispatcher):
        def expire(self, now: float) -> list[Expired]:
            nonlocal expire_calls
            expire_calls += 1
            return super().expire(now)

    async def main() -> None:
        seen: list[Expired] = []
        gate = AsyncDispatcher(
            Counting(lease_for=lambda job: 0.05),
            clock=asyncio.get_running_loop().time,
            on_expired=seen.append,
        )
        rec = Recorder(gate)
        turn = gate.turn("slow", member="s")
        nxt: asyncio.Future[None] | None = None
        async with turn as grant:
            assert grant.lease is not None
            nxt = asyncio.ensure_future(rec.job("next", member="n"))
            await asyncio.wait_for(turn.revoked.wait(), timeout=2.0)
            assert turn.expired is not None
            assert turn.expired.job.id == "slow"
            await turns(5)
            assert rec.order == ["next"]  # the resource moved on while "slow" still held on
        await nxt
        assert [e.job.id for e in seen] == ["slow"]
        assert "slow" not in gate.dispatcher  # one attempt per turn: not requeued
        stats = gate.stats()
        assert stats.expired == 1
        assert stats.completed == 1  # "next" only: leaving after expiry completes nothing
        assert expire_calls <= 3  # one timer, no polling
        assert not gate._alarm.armed  # nothing runs: no timer armed

    run_virtual(main)


def test_expiry_with_a_manual_clock_and_tick() -> None:
    clock = ManualClock()

    async def main() -> None:
        removed: list[str] = []
        gate = AsyncDispatcher(SizeOneDispatcher(lease_for=lambda job: 10.0), clock=clock)
        remove = gate.on_expire(lambda e: removed.append(e.job.id))
        rec = Recorder(gate)
        turn = gate.turn("a", member="a")
        async with turn:
            waiter = asyncio.ensure_future(rec.job("b", member="b"))
            await turns(5)
            clock.advance(5.0)
            assert gate.tick() == []
            assert not turn.revoked.is_set()
            clock.advance(5.0)
            [record] = gate.tick()
            assert record.job.id == "a"
            assert turn.revoked.is_set()
            await waiter
        remove()
        remove()
        assert removed == ["a"]
        assert rec.order == ["b"]

    run(main)


def test_leaving_after_the_deadline_before_the_timer_fired() -> None:
    clock = ManualClock()

    async def main() -> None:
        seen: list[Expired] = []
        gate = AsyncDispatcher(
            SizeOneDispatcher(lease_for=lambda job: 10.0), clock=clock, on_expired=seen.append
        )
        turn = gate.turn("a", member="a")
        async with turn:
            clock.advance(11.0)  # the real-time timer is still ~10 s away
        assert turn.expired is not None
        assert [e.job.id for e in seen] == ["a"]
        stats = gate.stats()
        assert stats.expired == 1
        assert stats.completed == 0
        assert gate.dispatcher.running is None

    run(main)


def test_failing_expiry_callback_is_reported_and_others_still_run() -> None:
    clock = ManualClock()

    async def main() -> None:
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        seen: list[str] = []

        def bad(_e: Expired) -> None:
            raise RuntimeError("callback bug")

        gate = AsyncDispatcher(
            SizeOneDispatcher(lease_for=lambda job: 1.0), clock=clock, on_expired=bad
        )
        gate.on_expire(lambda e: seen.append(e.job.id))
        async with gate.turn("a", member="a"):
            clock.advance(2.0)
            gate.tick()
        assert seen == ["a"]
        assert len(errors) == 1
        assert isinstance(errors[0]["exception"], RuntimeError)

    run(main)


def test_aclose_fails_waiters_and_refuses_new_turns() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(clock=ManualClock())
        rec, task, release = await blocked(gate)
        waiters = [asyncio.ensure_future(rec.job(f"w{i}", member="w")) for i in range(3)]
        await turns(5)
        await gate.aclose()
        assert gate.closed
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, DispatcherClosed) for r in results)
        assert len(gate.dispatcher) == 0
        with pytest.raises(DispatcherClosed):
            async with gate.turn("new", member="n"):
                pytest.fail("entered")  # pragma: no cover
        release.set()
        await task  # the holder leaves normally
        assert gate.stats().completed == 1
        await gate.aclose()

    run(main)


def test_cancel_queued_and_running_jobs() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(clock=ManualClock())
        rec = Recorder(gate)
        holder = gate.turn("run", member="r")
        async with holder:
            queued = asyncio.ensure_future(rec.job("q", member="q"))
            nxt = asyncio.ensure_future(rec.job("n", member="n"))
            await turns(5)
            gate.cancel("q")
            with pytest.raises(JobCancelled):
                await queued
            gate.cancel("run")
            assert holder.revoked.is_set()
            assert holder.expired is None
            await nxt
        with pytest.raises(UnknownJob):
            gate.cancel("nope")
        assert rec.order == ["n"]
        assert gate.stats().cancelled == 2

    run(main)


async def _race(
    after_model: str | None,
) -> tuple[AsyncDispatcher, Recorder, asyncio.Task[None], asyncio.Event, asyncio.Future[None], Any]:
    """A blocked resource ("small" resident) with "racer" (needs "big") and "after" queued."""
    gate = AsyncDispatcher(clock=ManualClock())
    gate.set_resident_model("small")
    rec, task, release = await blocked(gate)
    racer = asyncio.ensure_future(rec.job("racer", member="a", priority=100, model="big"))
    after = asyncio.ensure_future(rec.job("after", member="b", model=after_model))
    await turns(5)
    return gate, rec, task, release, racer, after


def test_race_grant_then_task_cancelled_in_the_same_instant() -> None:
    async def main() -> None:
        gate, rec, task, release, racer, after = await _race("small")
        gate.cancel("blocker")  # grants "racer" synchronously...
        assert gate.dispatcher.state("racer") == "running"
        racer.cancel()  # ...whose task is cancelled before it could run
        with pytest.raises(asyncio.CancelledError):
            await racer
        await after
        release.set()
        await task
        assert rec.order == ["blocker", "after"]
        stats = gate.stats()
        assert stats.completed == 1
        assert stats.running is None
        assert "racer" not in gate.dispatcher

    run(main)


def test_race_task_cancelled_then_granted_in_the_same_instant() -> None:
    async def main() -> None:
        gate, rec, task, release, racer, after = await _race(None)
        racer.cancel()  # its future is cancelled; its task has not run its handler yet
        gate.cancel("blocker")  # the dispatch picks "racer": nobody can take it
        assert gate.dispatcher.state("after") == "running"
        assert gate.dispatcher.resident_model == "small"  # no model load for the racer
        with pytest.raises(asyncio.CancelledError):
            await racer
        release.set()
        await asyncio.gather(after, task)
        assert rec.order == ["blocker", "after"]
        assert gate.stats().running is None

    run(main)


def test_jobs_submitted_behind_the_adapters_back_are_cancelled_when_granted() -> None:
    clock = ManualClock()

    async def main() -> None:
        d = SizeOneDispatcher()
        d.submit("orphan", member="o", priority=100, now=clock())
        gate = AsyncDispatcher(d, clock=clock)
        async with gate.turn("mine", member="m") as grant:
            assert grant.job.id == "mine"
        assert "orphan" not in d
        assert gate.stats().cancelled == 1

    run(main)


def test_explain_and_stats_pass_now() -> None:
    clock = ManualClock()

    async def main() -> None:
        gate = AsyncDispatcher(clock=clock)
        async with gate.turn("a", member="a"):
            assert gate.explain("a").state == "running"
            assert gate.stats().now == clock()

    run(main)


def test_default_dispatcher_and_clock() -> None:
    async def main() -> None:
        gate = AsyncDispatcher()
        assert isinstance(gate.dispatcher, SizeOneDispatcher)
        before = time.monotonic()
        assert gate.now() >= before
        async with gate.turn("a", member="a"):
            pass
        assert gate.stats().completed == 1

    run(main)


def test_reused_on_a_new_loop_when_idle() -> None:
    gate = AsyncDispatcher(clock=ManualClock())

    async def one(job_id: str) -> None:
        async with gate.turn(job_id, member="m"):
            pass

    asyncio.run(one("a"))
    asyncio.run(one("b"))
    assert gate.stats().completed == 2


def test_timeouts_are_disarmed_when_the_waiter_goes_first() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(clock=ManualClock())
        rec, task, release = await blocked(gate)
        by_cancel = asyncio.ensure_future(rec.job("c", member="c", timeout=0.02))
        by_task = asyncio.ensure_future(rec.job("t", member="t", timeout=0.02))
        await turns(5)
        gate.cancel("c")
        by_task.cancel()
        results = await asyncio.gather(by_cancel, by_task, return_exceptions=True)
        assert isinstance(results[0], JobCancelled)
        assert isinstance(results[1], asyncio.CancelledError)
        await asyncio.sleep(0.04)  # loop time: past both timeouts, nothing fires
        assert len(gate.dispatcher) == 0
        release.set()
        await task
        assert gate.stats().cancelled == 2

    run_virtual(main)


def test_expiry_of_the_last_attempt_and_of_a_job_nobody_holds() -> None:
    clock = ManualClock()

    async def main() -> None:
        seen: list[Expired] = []
        d = SizeOneDispatcher(lease_for=lambda job: 1.0, max_attempts=1)
        gate = AsyncDispatcher(d, clock=clock, on_expired=seen.append)
        turn = gate.turn("a", member="a")
        async with turn:
            clock.advance(1.0)
            gate.tick()
        assert turn.expired is not None
        assert not turn.expired.requeued
        assert gate.stats().failed == 1
        # A job granted behind the adapter's back (no holder) expires the same way.
        d.submit("orphan", member="o", now=clock())
        assert d.dispatch(clock()) is not None
        clock.advance(1.0)
        [record] = gate.tick()
        assert record.job.id == "orphan"
        assert [e.job.id for e in seen] == ["a", "orphan"]
        # And one nobody holds can be cancelled through the adapter.
        d.submit("orphan2", member="o", now=clock())
        gate.cancel("orphan2")
        assert "orphan2" not in d

    run(main)


def test_refuses_a_second_loop_while_in_use() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(clock=ManualClock())
        _rec, task, release = await blocked(gate)

        async def elsewhere() -> None:
            async with gate.turn("x", member="x"):
                pytest.fail("entered")  # pragma: no cover

        with pytest.raises(RuntimeError, match="another event loop"):
            await asyncio.to_thread(asyncio.run, elsewhere())
        release.set()
        await task

    run(main)


def test_a_job_whose_lease_cannot_be_computed_fails_its_waiter_only() -> None:
    def lease_for(job: Any) -> float:
        if job.payload == "bad":
            raise ValueError("cannot size this request")
        return 60.0

    async def main() -> None:
        gate = AsyncDispatcher(SizeOneDispatcher(lease_for=lease_for), clock=ManualClock())
        rec, task, release = await blocked(gate)
        bad = asyncio.ensure_future(rec.job("bad", member="b", priority=100, payload="bad"))
        good = asyncio.ensure_future(rec.job("good", member="g"))
        await turns(5)
        release.set()
        results = await asyncio.gather(task, bad, good, return_exceptions=True)
        assert isinstance(results[1], LeaseError)
        assert results[1].job_id == "bad"
        assert isinstance(results[1].__cause__, ValueError)
        assert rec.order == ["blocker", "good"]
        assert "bad" not in gate.dispatcher
        assert not gate._alarm.armed

    run(main)


def test_grant_revoked_before_the_holder_resumed() -> None:
    clock = ManualClock()

    async def main() -> None:
        gate = AsyncDispatcher(SizeOneDispatcher(lease_for=lambda job: 5.0), clock=clock)
        rec, task, release = await blocked(gate)
        first = asyncio.ensure_future(rec.job("first", member="a"))
        second = asyncio.ensure_future(rec.job("second", member="b"))
        await turns(5)
        gate.cancel("blocker")  # grants "first"...
        gate.cancel("first")  # ...and takes it back before its task resumed
        clock.advance(5.0)
        gate.tick()  # "second" was granted and expires before resuming
        release.set()
        results = await asyncio.gather(task, first, second, return_exceptions=True)
        assert isinstance(results[1], JobCancelled)
        assert "cancelled" in str(results[1])
        assert isinstance(results[2], JobCancelled)
        assert "expired" in str(results[2])
        assert rec.order == ["blocker"]

    run(main)
