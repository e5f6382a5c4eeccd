"""``Chain``: schedules computed by hand for depth 1..3, failure policies, validation, forecast.

``drive`` plays a size-1 GPU on a simulated clock: timed arrivals, one chain, each granted job
running for its estimate. The expected schedules were worked out by hand from the design note's
rules (lift, charge, ties to the smaller virtual start, then the older submission); the
comments walk through them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prioqueue import (
    ConfigError,
    DuplicateJob,
    FleetDispatcher,
    InvalidState,
    SizeOneDispatcher,
    UnknownGroup,
    UnknownJob,
)
from prioqueue.asyncio import AsyncDispatcher, JobCancelled
from prioqueue.chain import Chain, ChainStep, FailurePolicy
from prioqueue.records import Grant
from virtual_loop import run_virtual


def shots(count: int, seconds: float = 100.0, member: str = "dora") -> list[dict[str, Any]]:
    return [
        {"job_id": f"s{i}", "member": member, "priority": "batch", "estimate": seconds}
        for i in range(1, count + 1)
    ]


def drive(
    chain: Chain,
    arrivals: list[tuple[float, str, dict[str, Any]]],
) -> tuple[list[tuple[float, float, str]], dict[str, float]]:
    """Run everything; return ``(start, end, job)`` in dispatch order and submit times."""
    d = chain.dispatcher
    assert isinstance(d, SizeOneDispatcher)
    submitted: dict[str, float] = {}
    schedule: list[tuple[float, float, str]] = []
    pending = sorted(arrivals, key=lambda a: a[0])
    now = 0.0
    for ticket in chain.start(now=now).submitted:
        submitted[ticket.job.id] = now
    for at, job_id, kwargs in [a for a in pending if a[0] <= now]:
        d.submit(job_id, now=at, **kwargs)
    pending = [a for a in pending if a[0] > now]
    running: tuple[str, float] | None = None
    while True:
        if running is None:
            grant = d.dispatch(now)
            if grant is not None:
                end = now + (grant.job.estimate or 0.0)
                running = (grant.job.id, end)
                schedule.append((now, end, grant.job.id))
        if running is None and not pending:
            break
        if running is not None and (not pending or running[1] <= pending[0][0]):
            job_id, now = running
            running = None
            d.complete(job_id, now=now)
            if job_id in chain.progress.in_flight:
                for ticket in chain.completed(job_id, now=now).submitted:
                    submitted[ticket.job.id] = now
        else:
            at, job_id, kwargs = pending.pop(0)
            now = at
            d.submit(job_id, now=at, **kwargs)
    return schedule, submitted


def interactive(job_id: str, at: float, seconds: float = 40.0) -> tuple[float, str, dict[str, Any]]:
    kwargs = {"member": "eve", "priority": "interactive", "estimate": seconds}
    return (at, job_id, kwargs)


def bulk(job_id: str, at: float = 0.0) -> tuple[float, str, dict[str, Any]]:
    return (at, job_id, {"member": "bob", "priority": "batch", "estimate": 100.0})


# Four 100 s shots; images at 50 and 120 s. Interactive work wins whenever it waits, so the
# GPU schedule is the same at every depth; what depth changes is when the shots are queued.
IMAGES_SCHEDULE = [
    (0.0, 100.0, "s1"),
    (100.0, 140.0, "img1"),  # arrived at 50 during s1: waits for that shot only
    (140.0, 180.0, "img2"),
    (180.0, 280.0, "s2"),
    (280.0, 380.0, "s3"),
    (380.0, 480.0, "s4"),
]


@pytest.mark.parametrize(
    ("depth", "submit_times"),
    [
        # depth 1: each shot is queued when the previous one completes.
        (1, {"s1": 0.0, "s2": 100.0, "s3": 280.0, "s4": 380.0}),
        # depth 2: two in flight; s3 follows s1's completion, s4 follows s2's.
        (2, {"s1": 0.0, "s2": 0.0, "s3": 100.0, "s4": 280.0}),
        # depth 3: three in flight; s4 follows s1's completion.
        (3, {"s1": 0.0, "s2": 0.0, "s3": 0.0, "s4": 100.0}),
    ],
)
def test_depth_against_a_hand_computed_schedule_with_interactive_work(
    depth: int, submit_times: dict[str, float]
) -> None:
    chain = Chain(SizeOneDispatcher(), shots(4), depth=depth, group="film")
    schedule, submitted = drive(chain, [interactive("img1", 50.0), interactive("img2", 120.0)])
    assert schedule == IMAGES_SCHEDULE
    assert submitted == submit_times
    assert chain.progress.state == "finished"
    assert chain.progress.done == 4
    status = chain.status(now=480.0)
    assert (status.done, status.queued, status.running, status.gpu_seconds) == (4, 0, 0, 400.0)
    assert status.mean_runtime == 100.0


@pytest.mark.parametrize(
    ("depth", "order"),
    [
        # Bob queues b1, b2 at t=0 right after the chain's first shot(s); all jobs 100 s.
        # depth 1: s1 (seq 1) and b1 tie at s=0, s1 is older: s1 0-100, dora's s -> 100.
        # s2 is queued at 100 into an idle lane: lifted to max(100, min(100, s_bob=0)) = 100.
        # bob (s=0) wins: b1 100-200, bob's s -> 100. Tie at s=100: b2 (seq 3) is older than
        # s2 (seq 4): b2 200-300. Then s2, s3, s4.
        (1, ["s1", "b1", "b2", "s2", "s3", "s4"]),
        # depth 2: s1, s2 (seq 1, 2), b1, b2 (3, 4). s1 0-100 (dora's s 100; s3 queued);
        # b1 100-200 (bob's s 100); tie: s2 (seq 2) beats b2 (seq 4): s2 200-300 (dora's s
        # 200; s4 queued); b2 300-400; s3, s4.
        (2, ["s1", "b1", "s2", "b2", "s3", "s4"]),
        # depth 3: s1-s3 (seq 1-3), b1, b2 (4, 5): the same alternation as depth 2.
        (3, ["s1", "b1", "s2", "b2", "s3", "s4"]),
    ],
)
def test_depth_against_a_hand_computed_schedule_with_a_bulk_member(
    depth: int, order: list[str]
) -> None:
    chain = Chain(SizeOneDispatcher(), shots(4), depth=depth, group="film")
    schedule, _ = drive(chain, [bulk("b1"), bulk("b2")])
    assert [job for _, _, job in schedule] == order
    assert [start for start, _, _ in schedule] == [100.0 * i for i in range(6)]


def test_default_group_is_the_first_job_id_and_jobs_carry_it() -> None:
    d = SizeOneDispatcher()
    chain = Chain(d, shots(2))
    assert chain.group == "s1"
    assert chain.depth == 1
    chain.start(now=0.0)
    assert d.group_of("s1") == "s1"


@settings(max_examples=60)
@given(
    count=st.integers(min_value=1, max_value=8),
    depth=st.integers(min_value=1, max_value=4),
    others=st.lists(st.sampled_from(["interactive", "normal", "batch"]), max_size=6),
)
def test_every_spec_runs_once_in_order(count: int, depth: int, others: list[str]) -> None:
    d = SizeOneDispatcher()
    chain = Chain(d, shots(count), depth=depth, group="film")
    arrivals = [
        (float(10 * i), f"o{i}", {"member": f"m{i}", "priority": level, "estimate": 30.0})
        for i, level in enumerate(others)
    ]
    schedule, submitted = drive(chain, arrivals)
    ran = [job for _, _, job in schedule if job.startswith("s")]
    assert ran == [f"s{i}" for i in range(1, count + 1)]
    assert len(schedule) == count + len(others)
    assert set(submitted) == set(ran)
    # Never more than depth in flight: the k-th shot is queued no earlier than the end of
    # the (k - depth)-th.
    ends = {job: end for _, end, job in schedule}
    for k in range(depth + 1, count + 1):
        assert submitted[f"s{k}"] >= ends[f"s{k - depth}"]
    assert chain.progress.finished


# ---------------------------------------------------------------------------- failures


def _started(
    policy: FailurePolicy, depth: int = 1, count: int = 3
) -> tuple[SizeOneDispatcher, Chain]:
    d = SizeOneDispatcher()
    chain = Chain(d, shots(count), depth=depth, group="film", on_failure=policy)
    chain.start(now=0.0)
    return d, chain


def test_stop_cancels_queued_jobs_and_keeps_the_running_one() -> None:
    d, chain = _started("stop", depth=3)
    assert d.dispatch(0.0) is not None  # s1 runs
    step = chain.failed("s2", now=10.0)  # s2 was queued: failed there, s3 cancelled
    assert [job.id for job in step.cancelled] == ["s3"]
    assert step.submitted == ()
    progress = chain.progress
    assert (progress.state, progress.failed, progress.cancelled) == ("stopped", 1, 1)
    assert progress.in_flight == ("s1",)
    assert not progress.finished
    # The running shot may still complete; nothing more is submitted.
    d.complete("s1", now=100.0)
    assert chain.completed("s1", now=100.0) == ChainStep()
    assert chain.progress.finished
    status = chain.status(now=100.0)
    assert (status.done, status.failed, status.cancelled) == (1, 1, 1)
    assert d.stats(now=100.0).failed == 1


def test_skip_goes_on_with_the_next_spec() -> None:
    d, chain = _started("skip")
    d.dispatch(0.0)
    step = chain.failed("s1", now=30.0)  # still running: the chain fails it in the dispatcher
    assert [t.job.id for t in step.submitted] == ["s2"]
    assert "s1" not in d
    assert chain.status(now=30.0).failed == 1
    assert chain.status(now=30.0).gpu_seconds == 30.0
    d.dispatch(30.0)
    d.complete("s2", now=130.0)
    chain.completed("s2", now=130.0)
    chain.failed("s3", now=130.0)
    progress = chain.progress
    assert (progress.state, progress.done, progress.failed) == ("finished", 1, 2)


def test_retry_resubmits_n_times_then_stops() -> None:
    d, chain = _started(("retry", 2))
    for attempt in range(2):
        step = chain.failed("s1", now=float(attempt))
        assert [t.job.id for t in step.submitted] == ["s1"]
        assert "s1" in d
    assert chain.progress.retries == 2
    step = chain.failed("s1", now=5.0)
    assert step.submitted == ()
    assert chain.progress.state == "stopped"
    assert chain.progress.failed == 1
    assert chain.status(now=5.0).failed == 3  # every submission counted once


def test_failure_after_expiry_is_not_failed_twice() -> None:
    d = SizeOneDispatcher(lease_for=lambda job: 10.0, max_attempts=1)
    chain = Chain(d, shots(2), group="film", on_failure="skip")
    chain.start(now=0.0)
    d.dispatch(0.0)
    [expired] = d.expire(20.0)
    assert not expired.requeued
    step = chain.failed("s1", now=20.0)  # the dispatcher dropped it already
    assert [t.job.id for t in step.submitted] == ["s2"]
    assert chain.status(now=20.0).failed == 1


def test_cancel_stops_the_chain() -> None:
    d, chain = _started("stop", depth=2)
    d.dispatch(0.0)
    step = chain.cancel(now=5.0)
    assert [job.id for job in step.cancelled] == ["s2"]
    assert chain.progress.state == "cancelled"
    assert chain.progress.pending == 0
    step = chain.cancel(now=6.0, running="cancel")
    assert [job.id for job in step.cancelled] == ["s1"]
    assert len(d) == 0
    assert d.running is None
    assert chain.progress.finished
    with pytest.raises(ValueError, match="running must be"):
        chain.cancel(now=6.0, running="all")  # type: ignore[arg-type]


def test_cancel_returns_a_step_holding_the_cancelled_jobs() -> None:
    # Documented as "the cancelled jobs" while it returned a ChainStep: the step is the answer.
    _d, chain = _started("stop", depth=2)
    step = chain.cancel(now=1.0)
    assert isinstance(step, ChainStep)
    assert step.submitted == ()
    assert sorted(job.id for job in step.cancelled) == ["s1", "s2"]
    assert "holds the jobs cancelled" in (Chain.cancel.__doc__ or "")


def test_a_cancel_group_on_the_dispatcher_stops_the_chain_at_its_next_call() -> None:
    # After d.cancel_group(...) the chain still said "running" and went on submitting.
    d = SizeOneDispatcher()
    chain = Chain(d, shots(5), depth=2, group="film")
    chain.start(now=0.0)
    grant = d.dispatch(0.0)
    assert grant is not None
    assert grant.job.id == "s1"
    assert [job.id for job in d.cancel_group("film", now=5.0, running="keep")] == ["s2"]
    assert chain.status(now=6.0).cancelled == 1
    assert chain.progress.state == "cancelled"
    assert chain.progress.pending == 0
    d.complete("s1", now=10.0)
    assert chain.completed("s1", now=10.0).submitted == ()  # nothing more is submitted
    assert len(d) == 0


def test_the_outside_cancel_is_noticed_by_completed_too() -> None:
    d = SizeOneDispatcher()
    chain = Chain(d, shots(4), depth=2, group="film")
    chain.start(now=0.0)
    d.dispatch(0.0)
    d.cancel_group("film", now=1.0, running="keep")
    d.complete("s1", now=2.0)
    assert chain.completed("s1", now=2.0).submitted == ()
    assert chain.progress.state == "cancelled"
    assert chain.progress.done == 1


def test_a_chain_own_stop_is_not_mistaken_for_an_outside_cancel() -> None:
    d = SizeOneDispatcher()
    chain = Chain(d, shots(4), depth=2, group="film", on_failure="skip")
    chain.start(now=0.0)
    d.dispatch(0.0)
    chain.failed("s1", now=1.0)  # skipped: s3 goes in; nothing was cancelled
    assert chain.progress.state == "running"
    assert chain.progress.in_flight == ("s2", "s3")


# ---------------------------------------------------------------------------- full queue


def test_a_full_queue_keeps_the_spec_pending_and_top_up_submits_it() -> None:
    d = SizeOneDispatcher(max_queued=1)
    d.submit("other", member="eve", now=0.0)
    chain = Chain(d, shots(2), group="film")
    step = chain.start(now=0.0)
    assert step.submitted == ()
    assert step.retry_after is not None
    assert step.retry_after >= 1
    assert chain.progress.pending == 2
    d.dispatch(0.0)  # "other" runs: the queue has room
    step = chain.top_up(now=1.0)
    assert [t.job.id for t in step.submitted] == ["s1"]
    assert step.retry_after is None


# ---------------------------------------------------------------------------- forecast


def test_forecast_finish_adds_the_pending_shots() -> None:
    d = SizeOneDispatcher()
    chain = Chain(d, shots(4), group="film")
    assert chain.forecast_finish(now=0.0) is None  # not started
    chain.start(now=0.0)
    d.submit("img", member="eve", priority="interactive", estimate=40.0, now=0.0)
    # img 0-40, then s1 40-140, then s2..s4 back to back: 440.
    assert chain.forecast_finish(now=0.0) == 440.0
    schedule, _ = drive_rest(chain, now=0.0)
    assert schedule[-1][1] == 440.0
    assert chain.forecast_finish(now=440.0) == 440.0  # nothing left: now


def drive_rest(chain: Chain, now: float) -> tuple[list[tuple[float, float, str]], float]:
    d = chain.dispatcher
    assert isinstance(d, SizeOneDispatcher)
    schedule = []
    while (grant := d.dispatch(now)) is not None:
        end = now + (grant.job.estimate or 0.0)
        schedule.append((now, end, grant.job.id))
        d.complete(grant.job.id, now=end)
        now = end
        if grant.job.id in chain.progress.in_flight:
            chain.completed(grant.job.id, now=now)
    return schedule, now


def test_forecast_finish_uses_the_mean_runtime_without_estimates() -> None:
    d = SizeOneDispatcher()
    specs = [{"job_id": f"s{i}", "member": "dora"} for i in range(3)]
    chain = Chain(d, specs, group="film")
    chain.start(now=0.0)
    assert chain.forecast_finish(now=0.0) is None  # no runtime known yet
    d.dispatch(0.0)
    d.complete("s0", now=60.0)
    chain.completed("s0", now=60.0)
    assert chain.forecast_finish(now=60.0) == 180.0  # s1 60-120, s2 120-180


# ---------------------------------------------------------------------------- validation


class NotADispatcher:
    def submit(self) -> None:
        """Only one of the methods a chain needs."""


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((NotADispatcher(), shots(1)), {}, TypeError, "must have a cancel"),
        ((SizeOneDispatcher(), "s1"), {}, TypeError, "iterable of mappings"),
        ((SizeOneDispatcher(), {"job_id": "a"}), {}, TypeError, "iterable of mappings"),
        ((SizeOneDispatcher(), [["job_id", "a"]]), {}, TypeError, "spec 0 must be a mapping"),
        ((SizeOneDispatcher(), []), {}, ValueError, "at least one spec"),
        ((SizeOneDispatcher(), [{"member": "m"}]), {}, ValueError, "needs a job_id"),
        ((SizeOneDispatcher(), [{"job_id": ""}]), {}, ValueError, "needs a job_id"),
        ((SizeOneDispatcher(), shots(1) * 2), {}, ValueError, "appears twice"),
        ((SizeOneDispatcher(), [{"job_id": "a", "now": 1.0}]), {}, ValueError, "may not set 'now'"),
        ((SizeOneDispatcher(), [{"job_id": "a", "group": "g"}]), {}, ValueError, "its group"),
        ((SizeOneDispatcher(), [{"job_id": "a", 1: 2}]), {}, TypeError, "keys must be str"),
        (
            (SizeOneDispatcher(), [{"job_id": "a", "member": "m", "bogus": 1}]),
            {},
            ValueError,
            "'bogus' is not an argument of submit",
        ),
        ((FleetDispatcher(), [{"job_id": "a", "membr": "m"}]), {}, ValueError, "'membr' is not"),
        ((SizeOneDispatcher(), [{"job_id": "a"}]), {}, ValueError, r"needs 'member' \(submit"),
        ((SizeOneDispatcher(), shots(1)), {"depth": 0}, ConfigError, "depth must be an int >= 1"),
        ((SizeOneDispatcher(), shots(1)), {"depth": True}, ConfigError, "depth"),
        ((SizeOneDispatcher(), shots(1)), {"group": ""}, ValueError, "group must be"),
        ((SizeOneDispatcher(), shots(1)), {"on_failure": "ignore"}, ConfigError, "on_failure"),
        ((SizeOneDispatcher(), shots(1)), {"on_failure": ("retry", -1)}, ConfigError, "n >= 0"),
        ((SizeOneDispatcher(), shots(1)), {"on_failure": ("retry", 1.5)}, ConfigError, "n >= 0"),
        ((SizeOneDispatcher(), shots(1)), {"on_failure": ["stop"]}, ConfigError, "on_failure"),
    ],
)
def test_constructor_validation(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Chain(*args, **kwargs)


def test_calls_out_of_order_are_refused_without_changing_anything() -> None:
    d = SizeOneDispatcher()
    chain = Chain(d, shots(2), group="film")
    with pytest.raises(InvalidState, match="not started"):
        chain.top_up(now=0.0)
    with pytest.raises(UnknownGroup):
        chain.status(now=0.0)
    chain.start(now=0.0)
    with pytest.raises(InvalidState, match="already started"):
        chain.start(now=0.0)
    with pytest.raises(UnknownJob, match="not in flight"):
        chain.completed("s2", now=0.0)
    with pytest.raises(UnknownJob, match="not in flight"):
        chain.failed("nope", now=0.0)
    with pytest.raises(InvalidState, match="still queued in the dispatcher"):
        chain.completed("s1", now=0.0)
    with pytest.raises(ValueError, match="now must be a finite number"):
        chain.failed("s1", now=float("nan"))
    assert chain.progress.in_flight == ("s1",)
    assert "s1" in d


def test_a_spec_the_dispatcher_refuses_stays_pending() -> None:
    d = SizeOneDispatcher()
    chain = Chain(d, shots(2), group="film")
    chain.start(now=0.0)
    d.submit("s2", member="eve", priority="batch", now=0.0)  # the chain's next id is taken
    assert d.dispatch(0.0).job.id == "s1"  # type: ignore[union-attr]
    d.complete("s1", now=100.0)
    with pytest.raises(DuplicateJob):
        chain.completed("s1", now=100.0)
    assert chain.progress.done == 1
    assert chain.progress.pending == 1
    d.cancel("s2", now=100.0)
    assert [t.job.id for t in chain.top_up(now=100.0).submitted] == ["s2"]
    bad = Chain(SizeOneDispatcher(), [{"job_id": "x", "member": "m", "tier": "gold"}])
    with pytest.raises(ValueError, match="gold"):
        bad.start(now=0.0)
    assert bad.progress.pending == 1


# ---------------------------------------------------------------------------- asyncio


def _gate(**options: Any) -> AsyncDispatcher:
    return AsyncDispatcher(SizeOneDispatcher(**options))


async def _render(grant: Grant) -> str:
    await asyncio.sleep(0)
    return grant.job.id.upper()


def test_async_chain_yields_each_result_in_order() -> None:
    async def main() -> None:
        gate = _gate()
        seen = []
        async with gate.chain(shots(4), run=_render, depth=2, group="film") as film:
            assert film.group == "film"
            assert film.chain.depth == 2
            async for result in film:
                assert result.ok
                assert result.grant is not None
                seen.append((result.job_id, result.value))
                assert film.status().done == len(seen)
        assert seen == [(f"s{i}", f"S{i}") for i in range(1, 5)]
        assert film.progress.state == "finished"
        assert gate.group_status("film").done == 4
        assert len(gate.dispatcher) == 0

    asyncio.run(main())


def test_async_chain_lets_interactive_work_in_between_shots() -> None:
    async def main() -> None:
        gate = _gate()
        order: list[str] = []

        async def render(grant: Grant) -> None:
            order.append(grant.job.id)
            if grant.job.id == "s1":
                # An image arrives while the first shot runs: it goes next, before s2.
                image = asyncio.ensure_future(image_turn())
                await asyncio.sleep(0)
                images.append(image)

        async def image_turn() -> None:
            async with gate.turn("img", member="eve", priority="interactive") as grant:
                order.append(grant.job.id)

        images: list[asyncio.Future[None]] = []
        results = [r async for r in gate.chain(shots(3), run=render, group="film")]
        await asyncio.gather(*images)
        assert [r.job_id for r in results] == ["s1", "s2", "s3"]
        assert order == ["s1", "img", "s2", "s3"]

    asyncio.run(main())


def test_async_chain_stop_on_failure() -> None:
    async def main() -> None:
        gate = _gate()

        async def render(grant: Grant) -> str:
            if grant.job.id == "s2":
                raise RuntimeError("the GPU fell over")
            return "ok"

        film = gate.chain(shots(5), run=render, depth=3, group="film")
        results = [r async for r in film]
        by_id = {r.job_id: r for r in results}
        assert by_id["s1"].ok
        assert isinstance(by_id["s2"].error, RuntimeError)
        # s3 got the GPU as s2 left it (the gate dispatches at once) and may finish; s4 was
        # queued when the chain heard of the failure: cancelled. s5 was never submitted.
        assert by_id["s3"].ok
        assert isinstance(by_id["s4"].error, JobCancelled)
        assert by_id["s4"].grant is None
        assert "s5" not in by_id
        assert film.progress.state == "stopped"
        status = gate.group_status("film")
        assert (status.done, status.failed, status.cancelled) == (2, 1, 1)
        assert gate.stats().failed == 1

    asyncio.run(main())


def test_async_chain_retries() -> None:
    async def main() -> None:
        gate = _gate()
        attempts: dict[str, int] = {}

        async def render(grant: Grant) -> int:
            attempts[grant.job.id] = attempts.get(grant.job.id, 0) + 1
            if attempts[grant.job.id] < 3:
                raise RuntimeError("flaky")
            return attempts[grant.job.id]

        film = gate.chain(shots(2), run=render, group="film", on_failure=("retry", 2))
        results = [r async for r in film]
        assert [(r.job_id, r.ok) for r in results] == [
            ("s1", False),
            ("s1", False),
            ("s1", True),
            ("s2", False),
            ("s2", False),
            ("s2", True),
        ]
        assert film.progress.retries == 4
        assert gate.group_status("film").failed == 4

    asyncio.run(main())


def test_async_chain_aclose_cancels_what_is_left() -> None:
    async def main() -> None:
        gate = _gate()
        started = asyncio.Event()

        async def render(grant: Grant) -> None:
            started.set()
            await asyncio.sleep(3600)  # a long shot, interrupted by leaving the block

        async with gate.chain(shots(3), run=render, depth=2, group="film") as film:
            iterator = film.__aiter__()
            waiting = asyncio.ensure_future(iterator.__anext__())
            await started.wait()
            waiting.cancel()
        assert film.progress.state == "cancelled"
        assert len(gate.dispatcher) == 0
        assert gate.dispatcher.running is None
        status = gate.group_status("film")
        assert (status.cancelled, status.running, status.queued) == (2, 0, 0)

    asyncio.run(main())


def test_async_chain_raises_what_the_gate_refused() -> None:
    async def main() -> None:
        gate = _gate()
        specs = [*shots(1), {"job_id": "s2", "member": "dora", "tier": "gold"}]
        film = gate.chain(specs, run=_render, group="film")
        first = await film.__anext__()
        assert first.ok
        with pytest.raises(ValueError, match="gold"):
            await film.__anext__()
        with pytest.raises(StopAsyncIteration):
            await film.__anext__()
        bad = gate.chain([{"job_id": "x", "member": "m", "tier": "gold"}], run=_render)
        with pytest.raises(ValueError, match="gold"):
            await bad.__anext__()
        with pytest.raises(TypeError, match="run must be"):
            gate.chain(shots(1), run="render")  # type: ignore[arg-type]

    asyncio.run(main())


def test_async_cancel_group_fails_the_waiters() -> None:
    async def main() -> None:
        gate = _gate()
        holder = gate.turn("a", member="dora", group="g")
        waiter = gate.turn("b", member="dora", group="g")
        async with holder:
            task = asyncio.ensure_future(waiter.__aenter__())
            await asyncio.sleep(0)
            cancelled = gate.cancel_group("g")
            assert [job.id for job in cancelled] == ["b"]
            with pytest.raises(JobCancelled):
                await task
        status = gate.group_status("g")
        assert (status.done, status.cancelled) == (1, 1)

    asyncio.run(main())


def test_async_chain_waits_out_a_full_queue() -> None:
    async def main() -> None:
        now = [1000.0]
        gate = AsyncDispatcher(SizeOneDispatcher(max_queued=1), clock=lambda: now[0])
        for job_id in ("w1", "w2"):  # two completions 0.5 s apart: retry_after becomes 1 s
            async with gate.turn(job_id, member="eve"):
                now[0] += 0.5
        holder = gate.turn("h", member="eve")
        queued = gate.turn("q", member="eve")
        await holder.__aenter__()
        queued.submit()  # the queue (max_queued=1) is full now
        film = gate.chain(shots(1), run=_render, group="film")
        pending = asyncio.ensure_future(film.__anext__())
        await asyncio.sleep(0)
        assert film.progress.pending == 1  # refused for now, retried after retry_after
        await holder.__aexit__(None, None, None)  # q runs: the queue has room again
        async with queued:
            pass
        result = await asyncio.wait_for(pending, timeout=10)
        assert (result.job_id, result.ok) == ("s1", True)

    asyncio.run(main())


def test_async_chain_reports_an_expired_lease_as_a_failure() -> None:
    async def main() -> None:
        clock = asyncio.get_running_loop().time
        gate = AsyncDispatcher(SizeOneDispatcher(lease_for=lambda job: 0.05), clock=clock)

        async def render(grant: Grant) -> str:
            await asyncio.sleep(0.2)  # loop time: longer than the lease
            return "late"

        film = gate.chain(shots(2), run=render, group="film", on_failure="skip")
        results = [r async for r in film]
        assert [type(r.error).__name__ for r in results] == ["LeaseExpired", "LeaseExpired"]
        assert film.progress.failed == 2

    run_virtual(main)


# ---------------------------------------------------------------------------- random drives

ACTIONS = ("dispatch", "complete", "fail_running", "fail_queued", "expire", "cancel")


@settings(max_examples=150)
@given(
    count=st.integers(min_value=1, max_value=6),
    depth=st.integers(min_value=1, max_value=3),
    policy=st.sampled_from(["stop", "skip", ("retry", 0), ("retry", 1), ("retry", 2)]),
    actions=st.lists(st.sampled_from(ACTIONS), max_size=40),
)
def test_chain_counts_agree_with_its_group_under_random_drives(
    count: int, depth: int, policy: FailurePolicy, actions: list[str]
) -> None:
    d = SizeOneDispatcher(lease_for=lambda job: 50.0, max_attempts=1)
    chain = Chain(d, shots(count), depth=depth, group="film", on_failure=policy)
    chain.start(now=0.0)
    now = 0.0
    for action in actions:
        flight = chain.progress.in_flight
        running = d.running.job.id if d.running is not None else None
        queued = [job_id for job_id in flight if job_id != running]
        if action == "dispatch":
            d.dispatch(now)
        elif action == "complete" and running is not None:
            now += 10.0
            d.complete(running, now=now)
            chain.completed(running, now=now)
        elif action == "fail_running" and running is not None:
            now += 5.0
            chain.failed(running, now=now)
        elif action == "fail_queued" and queued:
            chain.failed(queued[0], now=now)
        elif action == "expire":
            now += 60.0
            for item in d.expire(now):
                assert not item.requeued  # max_attempts=1: dropped, reported as failed
                chain.failed(item.job.id, now=now)
        elif action == "cancel" and chain.progress.state == "running":
            chain.cancel(now=now, running="keep" if len(actions) % 2 else "cancel")
        d._check()
        progress = chain.progress
        assert len(progress.in_flight) <= depth
        if progress.state in ("running", "finished"):
            accounted = progress.done + progress.failed + progress.cancelled
            assert accounted + len(progress.in_flight) + progress.pending == count
        status = chain.status(now=now)
        assert status.done == progress.done
        assert status.failed == progress.failed + progress.retries
        assert status.cancelled == progress.cancelled
        assert status.queued + status.running == len(progress.in_flight)
        # The driver reports every finish at once: whatever is in flight is in the dispatcher.
        assert all(job_id in d for job_id in progress.in_flight)


def test_forecast_finish_with_nothing_submitted_after_a_full_queue() -> None:
    d = SizeOneDispatcher(max_queued=1)
    d.submit("other", member="eve", now=0.0)
    chain = Chain(d, shots(2, seconds=50.0), group="film")
    assert chain.start(now=0.0).retry_after is not None
    # Nothing of the chain is in the dispatcher: its shots back to back from now.
    assert chain.forecast_finish(now=10.0) == 110.0
    specs = [{"job_id": "x", "member": "dora"}]
    unknown = Chain(d, specs, group="film-2")
    unknown.start(now=10.0)
    assert unknown.forecast_finish(now=10.0) is None  # no estimate, no history


# ---------------------------------------------------------------------------- the fleet


def drive_fleet(chain: Chain, workers: list[str]) -> list[tuple[float, float, str, str]]:
    """Workers pop the chain's shots, each running for its estimate; ``(start, end, job, w)``."""
    fleet = chain.dispatcher
    assert isinstance(fleet, FleetDispatcher)
    chain.start(now=0.0)
    now = 0.0
    held: dict[str, tuple[str, float]] = {}
    schedule = []
    while True:
        for name in workers:
            if name not in held and (grant := fleet.pop(name, now=now)) is not None:
                end = now + (grant.job.estimate or 0.0)
                held[name] = (grant.job.id, end)
                schedule.append((now, end, grant.job.id, name))
        if not held:
            return schedule
        name = min(held, key=lambda n: (held[n][1], n))
        job_id, now = held.pop(name)
        fleet.complete(job_id, now=now, worker=name)
        chain.completed(job_id, now=now)


@pytest.mark.parametrize(
    ("depth", "schedule"),
    [
        # depth 1: one shot in flight, so the second worker never gets one: 4 x 100 s.
        (1, [(0, 100, "s1", "w1"), (100, 200, "s2", "w1"), (200, 300, "s3", "w1"),
             (300, 400, "s4", "w1")]),
        # depth 2: both workers busy; s3 and s4 are queued as s1 and s2 complete at 100.
        (2, [(0, 100, "s1", "w1"), (0, 100, "s2", "w2"), (100, 200, "s3", "w1"),
             (100, 200, "s4", "w2")]),
        # depth 3: the same on two workers (the third shot waits queued for a free worker).
        (3, [(0, 100, "s1", "w1"), (0, 100, "s2", "w2"), (100, 200, "s3", "w1"),
             (100, 200, "s4", "w2")]),
    ],
)  # fmt: skip
def test_chain_on_a_fleet_against_a_hand_computed_schedule(
    depth: int, schedule: list[tuple[float, float, str, str]]
) -> None:
    fleet = FleetDispatcher()
    fleet.join("w1", now=0.0)
    fleet.join("w2", now=0.0)
    chain = Chain(fleet, shots(4), depth=depth, group="film")
    assert drive_fleet(chain, ["w1", "w2"]) == schedule
    assert chain.progress.state == "finished"
    status = chain.status(now=400.0)
    assert (status.done, status.gpu_seconds) == (4, 400.0)


def test_chain_on_a_fleet_fails_a_held_job_for_its_worker() -> None:
    fleet = FleetDispatcher()
    fleet.join("w1", now=0.0)
    chain = Chain(fleet, shots(2), group="film", on_failure="skip")
    chain.start(now=0.0)
    grant = fleet.pop("w1", now=0.0)
    assert grant is not None
    step = chain.failed(grant.job.id, now=40.0)  # the chain fails it in the fleet
    assert [t.job.id for t in step.submitted] == ["s2"]
    assert fleet.worker("w1").held == ()
    status = chain.status(now=40.0)
    assert (status.failed, status.queued, status.gpu_seconds) == (1, 1, 40.0)
