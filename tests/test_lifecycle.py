"""The job lifecycle: ttl expiry, delayed jobs, retries with backoff, per-level budgets.

The model is docs/design/lifecycle.md; these tests pin each transition and invariant.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prioqueue import (
    Backoff,
    ConfigError,
    FleetDispatcher,
    InvalidState,
    LevelBudget,
    Overloaded,
    QueueFull,
    SizeOneDispatcher,
    UnknownJob,
)


def fleet(**options: object) -> FleetDispatcher:
    d = FleetDispatcher(**options)  # type: ignore[arg-type]
    d.join("w", now=0.0)
    return d


# ---------------------------------------------------------------- ttl


def test_a_queued_job_past_its_ttl_expires_and_is_reported_once() -> None:
    d = fleet()
    d.submit("a", member="m", ttl=10.0, now=0.0)
    assert d.next_deadline() == 10.0  # the driver wakes at the deadline
    assert d.expire(9.999) == []
    [gone] = d.expire(10.0)
    assert (gone.job.id, gone.cause, gone.requeued, gone.deadline) == ("a", "ttl", False, 10.0)
    assert "a" not in d
    assert d.expire(20.0) == []
    stats = d.stats(now=20.0)
    assert stats.ttl_expired == 1
    assert stats.levels[0].ttl_expired == 1
    assert stats.expired == 0  # lease expiries are counted apart
    d._check()


def test_expiry_wins_a_tie_with_a_grant_at_the_same_now() -> None:
    d = fleet()
    d.submit("a", member="m", ttl=5.0, now=0.0)
    assert d.pop("w", now=5.0) is None  # at its deadline the job is gone, never granted
    [gone] = d.expire(5.0)  # reported by the next expire, though a pop removed it
    assert gone.job.id == "a"
    d._check()


def test_a_job_granted_before_its_deadline_never_expires_by_ttl() -> None:
    d = fleet()
    d.submit("a", member="m", ttl=5.0, now=0.0)
    grant = d.pop("w", now=4.0)
    assert grant is not None
    assert d.expire(100.0) == []
    d.complete("a", now=100.0)
    assert d.stats(now=100.0).ttl_expired == 0


def test_a_job_requeued_past_its_deadline_expires() -> None:
    d = fleet(lease_for=lambda job: 10.0)
    d.submit("a", member="m", ttl=5.0, now=0.0)
    assert d.pop("w", now=1.0) is not None
    records = d.expire(11.0)  # the lease runs out after the ttl deadline
    assert [(r.job.id, r.cause, r.requeued) for r in records] == [
        ("a", "lease", True),
        ("a", "ttl", False),
    ]
    assert "a" not in d
    d._check()


def test_cancel_at_the_deadline_finds_the_job_expired() -> None:
    d = fleet()
    d.submit("a", member="m", ttl=5.0, now=0.0)
    with pytest.raises(UnknownJob):
        d.cancel("a", now=5.0)
    assert [r.job.id for r in d.expire(5.0)] == ["a"]
    d._check()


def test_ttl_is_validated() -> None:
    d = fleet()
    for bad in (0, -1.0, math.nan, math.inf, "10"):
        with pytest.raises(ValueError, match="ttl"):
            d.submit("a", member="m", ttl=bad, now=0.0)  # type: ignore[arg-type]
    assert len(d) == 0


# ---------------------------------------------------------------- not_before


def test_a_delayed_job_is_queued_but_not_eligible_until_its_time() -> None:
    d = fleet()
    ticket = d.submit("later", member="m", not_before=100.0, now=0.0)
    assert ticket.job.arrival == 100.0
    assert ticket.job.not_before == 100.0
    assert d.state("later") == "queued"
    assert d.not_before("later") == 100.0
    assert len(d) == 1
    assert d.next_deadline() == 100.0
    assert d.pop("w", now=99.0) is None
    explanation = d.explain("later", now=99.0)
    assert explanation.not_before == 100.0
    assert "delayed until 100.0" in str(explanation)
    assert d.stats(now=99.0).delayed == 1
    grant = d.pop("w", now=100.0)
    assert grant is not None
    assert grant.job.id == "later"
    assert grant.waited == 0.0  # the wait counts from when it became eligible
    d._check()


def test_a_not_before_in_the_past_is_an_ordinary_submit() -> None:
    d = fleet()
    ticket = d.submit("a", member="m", not_before=-5.0, now=0.0)
    assert ticket.job.not_before is None
    assert d.not_before("a") is None
    assert d.pop("w", now=0.0) is not None


def test_a_delayed_job_can_be_cancelled() -> None:
    d = fleet()
    d.submit("a", member="m", not_before=50.0, group="film", now=0.0)
    d.cancel("a", now=1.0)
    assert "a" not in d
    assert d.pop("w", now=60.0) is None
    assert d.group_status("film", now=60.0).cancelled == 1
    d._check()


def test_a_delayed_job_with_ttl_counts_its_ttl_from_not_before() -> None:
    d = fleet()
    d.submit("a", member="m", not_before=100.0, ttl=10.0, now=0.0)
    assert d.job("a").deadline == 110.0
    assert d.expire(105.0) == []
    assert [r.job.id for r in d.expire(110.0)] == ["a"]


def test_release_enters_the_lane_as_a_submit_at_that_time() -> None:
    # A delayed job released while the call comes later ranks exactly as a job submitted
    # at its release time: the same order as without the delay, whatever call fires it.
    def order(delay: bool) -> list[str]:
        d = fleet()
        d.submit("x", member="a", now=0.0)
        if delay:
            d.submit("y", member="b", not_before=10.0, now=0.0)
        d.submit("z", member="a", now=5.0)
        if not delay:
            d.submit("y", member="b", now=10.0)
        got = []
        for t in (20.0, 21.0, 22.0):
            grant = d.pop("w", now=t)
            assert grant is not None
            got.append(grant.job.id)
            d.complete(grant.job.id, now=t + 0.5)
        return got

    assert order(True) == order(False)


# ---------------------------------------------------------------- retries


def test_fail_with_retry_requeues_after_the_backoff_until_attempts_run_out() -> None:
    d = fleet(backoff=Backoff(kind="exponential", base=10.0, max=100.0), max_attempts=3)
    d.submit("a", member="m", now=0.0)
    g1 = d.pop("w", now=0.0)
    assert g1 is not None
    assert g1.attempt == 1
    d.fail("a", now=1.0, retry=True)
    assert d.state("a") == "queued"
    assert d.not_before("a") == 11.0  # 1 + base
    assert d.pop("w", now=10.0) is None
    g2 = d.pop("w", now=11.0)
    assert g2 is not None
    assert g2.attempt == 2
    d.fail("a", now=12.0, retry=True)
    assert d.not_before("a") == 32.0  # 12 + 2 * base
    g3 = d.pop("w", now=32.0)
    assert g3 is not None
    assert g3.attempt == 3
    d.fail("a", now=33.0, retry=True)  # the last attempt: final
    assert "a" not in d
    stats = d.stats(now=33.0)
    assert (stats.retried, stats.failed) == (2, 1)
    d._check()


def test_a_job_can_carry_its_own_attempts_and_backoff() -> None:
    d = fleet(max_attempts=1)
    d.submit("a", member="m", max_attempts=2, backoff=Backoff(base=0.0), now=0.0)
    assert d.pop("w", now=0.0) is not None
    d.fail("a", now=1.0, retry=True)
    assert d.not_before("a") is None  # no delay: queued at once
    grant = d.pop("w", now=1.0)
    assert grant is not None
    assert grant.attempt == 2


def test_lease_expiries_use_the_jobs_own_max_attempts() -> None:
    d = fleet(lease_for=lambda job: 1.0, max_attempts=5)
    d.submit("a", member="m", max_attempts=1, now=0.0)
    assert d.pop("w", now=0.0) is not None
    [record] = d.expire(1.0)
    assert record.requeued is False


def test_retry_of_a_queued_job_is_a_plain_fail() -> None:
    d = fleet()
    d.submit("a", member="m", now=0.0)
    d.fail("a", now=0.0, retry=True)
    assert "a" not in d
    with pytest.raises(ValueError, match="retry"):
        d.fail("x", now=0.0, retry="yes")  # type: ignore[arg-type]


def test_a_failed_attempt_is_charged_the_time_it_was_held() -> None:
    d = fleet()
    d.submit("a", member="m", now=0.0)
    d.pop("w", now=0.0)
    d.fail("a", now=30.0, retry=True)
    assert d.stats(now=30.0).members["m"].gpu_seconds == 30.0


@given(
    kind=st.sampled_from(["constant", "linear", "exponential"]),
    base=st.floats(0, 1e6),
    cap=st.floats(0, 1e6),
    jitter=st.booleans(),
    attempt=st.integers(1, 2000),
    job_id=st.text(min_size=1, max_size=20),
)
def test_backoff_delay_is_bounded_and_deterministic(
    kind: str, base: float, cap: float, jitter: bool, attempt: int, job_id: str
) -> None:
    b = Backoff(kind=kind, base=base, max=cap, jitter=jitter)  # type: ignore[arg-type]
    delay = b.delay(job_id, attempt)
    assert 0.0 <= delay <= cap
    assert delay == Backoff(kind=kind, base=base, max=cap, jitter=jitter).delay(  # type: ignore[arg-type]
        job_id, attempt
    )
    plain = Backoff(kind=kind, base=base, max=cap).delay(job_id, attempt)  # type: ignore[arg-type]
    if jitter:
        assert plain * 0.5 <= delay <= plain
    else:
        assert delay == plain


def test_jitter_spreads_delays_between_jobs() -> None:
    b = Backoff(kind="constant", base=10.0, jitter=True)
    delays = {b.delay(f"job-{i}", 1) for i in range(50)}
    assert len(delays) > 40
    assert all(5.0 <= x < 10.0 for x in delays)


def test_backoff_and_budget_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"backoff\.kind"):
        Backoff(kind="random")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"retry\.base"):
        Backoff.from_mapping({"base": -1}, where="retry")
    with pytest.raises(ConfigError, match="unknown key 'steps'"):
        Backoff.from_mapping({"steps": 3})
    with pytest.raises(ConfigError, match=r"levels\.interactive\.max_wait"):
        LevelBudget.from_mapping({"max_wait": 0}, where="levels.interactive")
    with pytest.raises(ConfigError, match="max_queued"):
        LevelBudget(max_queued=0)
    with pytest.raises(ConfigError, match="budgets"):
        FleetDispatcher(budgets={"interactive": LevelBudget(max_queued=1)})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="backoff"):
        FleetDispatcher(backoff={"base": 1})  # type: ignore[arg-type]


# ---------------------------------------------------------------- budgets


def test_a_level_over_max_queued_refuses_with_queue_full() -> None:
    d = fleet(budgets={10: LevelBudget(max_queued=2)})
    d.submit("a", member="m", priority=10, now=0.0)
    d.submit("b", member="m", priority=10, not_before=50.0, now=0.0)  # delayed jobs count
    with pytest.raises(QueueFull) as info:
        d.submit("c", member="m", priority=10, now=0.0)
    assert info.value.scope == "level"
    assert info.value.limit == 2
    assert info.value.retry_after >= 1
    assert not isinstance(info.value, Overloaded)
    d.submit("d", member="m", priority=0, now=0.0)  # other levels are not limited
    stats = d.stats(now=0.0)
    assert stats.refused == 1
    assert stats.levels[10].refused == 1
    assert "c" not in d


def test_a_submit_whose_forecast_wait_is_over_max_wait_is_overloaded() -> None:
    d = fleet(budgets={0: LevelBudget(max_wait=100.0)})
    d.submit("a", member="m", now=0.0)  # 60 s expected (no runtime known yet)
    d.submit("b0", member="m", now=0.0)  # 60 s ahead: admitted (not over 100 s)
    with pytest.raises(Overloaded) as info:
        d.submit("b1", member="m", now=0.0)
    error = info.value
    assert error.scope == "wait"
    assert error.forecast_wait == 120.0
    assert error.retry_after == 20.0  # ceil(120 - 100)
    assert isinstance(error, QueueFull)
    assert len(d) == 2
    # Higher levels count ahead of a lower one; lower ones do not.
    d.submit("low", member="m", priority=-5, now=0.0)
    d.join("w2", now=0.0)  # twice the capacity halves the forecast
    d.submit("c", member="m", now=0.0)
    d._check()


def test_a_level_budget_gives_its_jobs_a_default_ttl() -> None:
    d = fleet(budgets={0: LevelBudget(ttl=30.0)})
    assert d.submit("a", member="m", now=0.0).job.deadline == 30.0
    assert d.submit("b", member="m", ttl=5.0, now=0.0).job.deadline == 5.0
    assert d.submit("c", member="m", priority=1, now=0.0).job.deadline is None


def test_budgets_are_off_by_default() -> None:
    d = fleet()
    for i in range(200):
        d.submit(f"j{i}", member="m", now=0.0)
    assert d.stats(now=0.0).refused == 0


# ---------------------------------------------------------------- snapshot


def test_snapshot_carries_delays_deadlines_attempts_and_unreported_expiries() -> None:
    d = fleet(backoff=Backoff(kind="linear", base=5.0, jitter=True))
    d.submit("delayed", member="m", not_before=50.0, ttl=20.0, now=0.0)
    d.submit("ttl", member="m", ttl=10.0, now=0.0)
    d.submit("gone", member="m", ttl=1.0, now=0.0)
    d.submit("retry", member="m", max_attempts=4, backoff=Backoff(base=7.0), now=0.0)
    d.pop("w", now=0.0)  # "ttl" (first submitted eligible job)... whichever wins
    held = [g.job.id for g in d.held]
    assert d.pop("w", now=2.0) is None  # the pop fires "gone"'s deadline first
    for job_id in held:
        d.fail(job_id, now=2.0, retry=True)
    state = json.loads(json.dumps(d.snapshot(now=2.0)))
    copy = FleetDispatcher.restore(state, backoff=Backoff(kind="linear", base=5.0, jitter=True))
    copy._check()
    for job_id in ("delayed", "ttl", "retry"):
        if job_id in d:
            assert copy.not_before(job_id) == d.not_before(job_id)
            assert copy.job(job_id) == d.job(job_id)
    assert [r.job.id for r in copy.expire(2.0)] == [r.job.id for r in d.expire(2.0)]
    for t in (10.0, 20.0, 50.0, 70.0, 80.0):
        assert [(r.job.id, r.cause) for r in copy.expire(t)] == [
            (r.job.id, r.cause) for r in d.expire(t)
        ]
        a, b = d.pop("w", now=t), copy.pop("w", now=t)
        assert (a and (a.job.id, a.attempt)) == (b and (b.job.id, b.attempt))
        if a is not None and b is not None:
            d.complete(a.job.id, now=t)
            copy.complete(b.job.id, now=t)
    copy._check()


def test_size_one_dispatcher_has_the_lifecycle_too() -> None:
    d = SizeOneDispatcher(budgets={0: LevelBudget(max_queued=1)})
    d.submit("a", member="m", ttl=1.0, now=0.0)
    assert d.dispatch(1.0) is None
    assert [r.cause for r in d.expire(1.0)] == ["ttl"]
    d.submit("b", member="m", not_before=5.0, now=1.0)
    assert d.dispatch(4.0) is None
    grant = d.dispatch(5.0)
    assert grant is not None
    assert grant.job.id == "b"
    d._check()


# ---------------------------------------------------------------- invariants


@settings(max_examples=150)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["submit", "pop", "complete", "fail", "retry", "expire", "cancel"]),
            st.integers(0, 5),
            st.floats(0, 20),
            st.one_of(st.none(), st.floats(0.5, 30)),
            st.one_of(st.none(), st.floats(0, 30)),
        ),
        max_size=60,
    )
)
def test_no_job_dropped_or_granted_twice_or_granted_past_its_deadline(
    ops: list[tuple[str, int, float, float | None, float | None]],
) -> None:
    d = FleetDispatcher(
        lease_for=lambda job: 15.0, max_attempts=2, backoff=Backoff(kind="linear", base=3.0)
    )
    d.join("w1", now=0.0)
    d.join("w2", now=0.0, slots=2)
    now = 0.0
    live: set[str] = set()
    running: dict[str, str] = {}
    ended: set[str] = set()
    counter = 0
    for op, pick, step, ttl, delay in ops:
        now += step
        for record in d.expire(now):
            assert record.job.id in live
            running.pop(record.job.id, None)
            if not record.requeued:
                live.discard(record.job.id)
                ended.add(record.job.id)
        if op == "submit":
            counter += 1
            job_id = f"j{counter}"
            d.submit(job_id, member=f"m{pick % 2}", ttl=ttl,
                     not_before=None if delay is None else now + delay, now=now)  # fmt: skip
            live.add(job_id)
        elif op == "pop":
            worker = "w1" if pick % 2 else "w2"
            grant = d.pop(worker, now=now)
            if grant is not None:
                job = grant.job
                assert job.id in live
                assert job.id not in running
                assert job.deadline is None or now < job.deadline
                assert job.arrival <= now
                running[job.id] = worker
        elif running and op in ("complete", "fail", "retry"):
            job_id = sorted(running)[pick % len(running)]
            del running[job_id]
            if op == "complete":
                d.complete(job_id, now=now)
            else:
                d.fail(job_id, now=now, retry=op == "retry")
            if job_id not in d:
                live.discard(job_id)
                ended.add(job_id)
        elif op == "cancel" and live - set(running):
            job_id = sorted(live - set(running))[pick % len(live - set(running))]
            try:
                d.cancel(job_id, now=now)
            except UnknownJob:  # its ttl ran out at this now: reported by the next expire
                continue
            live.discard(job_id)
            ended.add(job_id)
        d._check()
    # No job dropped: every job still live is known, every other one ended with one report.
    for record in d.expire(now):
        assert record.job.id in live
        if not record.requeued:
            live.discard(record.job.id)
    assert live == set(d.job_ids())
    assert not live & ended


def test_a_retry_without_fair_share_gets_a_fresh_lane_that_ranks() -> None:
    # Without fair share a job is its own lane, dropped when it leaves: the retry makes it
    # again, and its heap items must not tie with the old lane's stale ones.
    d = fleet(fair_share=False)
    d.submit("a", member="m", now=0.0)
    d.submit("b", member="m", now=0.0)
    d.cancel("a", now=0.0)
    grant = d.pop("w", now=0.0)
    assert grant is not None
    d.fail("b", now=0.0, retry=True)
    again = d.pop("w", now=0.0)
    assert again is not None
    assert (again.job.id, again.attempt) == ("b", 2)
    d._check()


def test_next_deadline_counts_a_requeued_job_past_its_deadline_beside_buffered_expiries() -> None:
    d = fleet()
    d.join("w2", now=0.0)
    d.submit("a", member="m", ttl=10.0, now=0.0)
    d.submit("b", member="m", ttl=20.0, now=0.0)
    assert d.pop("w", now=0.0) is not None  # "a" runs past its deadline
    assert d.pop("w2", now=20.0) is None  # "b" expired at 20 (buffered, unreported)
    d.fail("a", now=20.0, retry=True)  # "a" is queued again, past its deadline 10
    assert d.next_deadline() == 10.0
    assert [(r.job.id, r.deadline) for r in d.expire(20.0)] == [("b", 20.0), ("a", 10.0)]
    assert d.next_deadline() is None


def test_requeue_refuses_a_delayed_job() -> None:
    d = fleet()
    d.submit("later", member="m", not_before=50.0, now=0.0)
    with pytest.raises(InvalidState):
        d.requeue("later", now=1.0)
    d._check()


def test_admit_reads_whether_a_batch_would_be_queued_whole() -> None:
    """``admit``: the first job ``submit`` would refuse, the jobs before it counted; a read."""
    d = fleet(max_queued_per_member=2, budgets={0: LevelBudget(max_queued=3)})
    d.submit("a", member="ann", now=1.0)
    before = d.snapshot(now=2.0)
    assert d.admit([{"member": "bob"}, {"member": "bob", "not_before": 50.0}], now=2.0) is None
    refused = d.admit([{"member": "bob"}, {"member": "bob"}, {"member": "bob"}], now=2.0)
    assert refused is not None
    assert (refused.index, refused.error.scope) == (2, "level")  # 1 + 2 queued: the 3rd is over
    late = d.admit([{"member": "ann"}, {"member": "ann"}], now=2.0)
    assert late is not None
    assert (late.index, late.error.scope) == (1, "member")
    assert d.snapshot(now=2.0) == before  # nothing changed, the refusal counter included
    assert d.stats(now=2.0).refused == 0
    with pytest.raises(ValueError, match=r"jobs\[1\]: .*tier"):
        d.admit([{"member": "bob"}, {"member": "bob", "tier": "gold"}], now=2.0)
    with pytest.raises(TypeError, match=r"jobs\[0\]: admit\(\) got unexpected"):
        d.admit([{"member": "bob", "prio": 1}], now=2.0)
    with pytest.raises(ValueError, match="earlier than a time already seen"):
        d.admit([{"member": "bob"}], now=0.5)
    slow = fleet(budgets={0: LevelBudget(max_wait=100.0)})
    slow.submit("a", member="ann", now=1.0)  # 60 s ahead of the next
    wait = slow.admit(
        [{"member": "bob"}, {"member": "bob", "not_before": 9.0}, {"member": "cy"}], now=2.0
    )
    assert wait is not None
    assert wait.index == 2  # the delayed one is not in the forecast
    assert isinstance(wait.error, Overloaded)
    assert wait.error.forecast_wait == 120.0
