"""Example-based tests of SizeOneDispatcher's public API, one behaviour at a time.

Every dispatcher here is a ``Checked`` one: it runs ``_check()`` (the design note's invariants)
after every public call, whether the call succeeded or raised. The stateful comparison with the
reference model lives in test_dispatcher_stateful.py; the design's scenarios in
test_dispatcher_scenarios.py.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import attrs
import pytest

from prioqueue._spec import SUBMIT_OPTIONS, JobSpec
from prioqueue.dispatcher import DEFAULT_RETRY_AFTER, DEFAULT_WAIT_BUCKETS, SizeOneDispatcher
from prioqueue.errors import (
    ConfigError,
    DuplicateJob,
    InvalidState,
    LeaseError,
    LeaseExpired,
    PrioqueueError,
    QueueFull,
    UnknownJob,
)
from prioqueue.fleet import FleetDispatcher
from prioqueue.lease import ImageRequest, Lease, LeaseCalculator
from prioqueue.priority import PriorityPolicy
from prioqueue.records import (
    AheadJob,
    Completed,
    Expired,
    Grant,
    Job,
    LevelStats,
    MemberStats,
    Overtake,
    Reorders,
    Stats,
    Ticket,
)
from prioqueue.scoring import ScoreBreakdown, Scorer, ScoringConfig

NAN = float("nan")
INF = float("inf")
D = 60.0  # the default aging divisor


F = TypeVar("F", bound=Callable[..., Any])


def _checked(method: F) -> F:
    """``method``, then the dispatcher's ``_check()``, whether the call succeeded or raised."""

    @functools.wraps(method)
    def checked(self: SizeOneDispatcher, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            self._check()

    return cast(F, checked)


class Checked(SizeOneDispatcher):
    """A dispatcher that asserts its invariants after every public call, even a failing one."""

    submit = _checked(SizeOneDispatcher.submit)
    dispatch = _checked(SizeOneDispatcher.dispatch)
    complete = _checked(SizeOneDispatcher.complete)
    cancel = _checked(SizeOneDispatcher.cancel)
    expire = _checked(SizeOneDispatcher.expire)
    set_resident_model = _checked(SizeOneDispatcher.set_resident_model)
    forecast = _checked(SizeOneDispatcher.forecast)
    explain = _checked(SizeOneDispatcher.explain)
    stats = _checked(SizeOneDispatcher.stats)
    snapshot = _checked(SizeOneDispatcher.snapshot)

    @classmethod
    def restore(cls, *args: Any, **kwargs: Any) -> Checked:
        restored = super().restore(*args, **kwargs)
        restored._check()
        return cast(Checked, restored)


def make(scorer: Scorer | None = None, **options: Any) -> Checked:
    return Checked(scorer, **options)


def grant_of(d: Checked, now: float) -> Grant:
    grant = d.dispatch(now)
    assert grant is not None
    return grant


def queued_ids(d: SizeOneDispatcher, now: float) -> list[str]:
    return [ahead.job_id for ahead in d.forecast(now=now)]


def drain(d: Checked, now: float, runtime: float = 10.0) -> list[str]:
    """Dispatch and complete everything, ``runtime`` seconds each; return the order."""
    order = []
    t = now
    while (grant := d.dispatch(t)) is not None:
        order.append(grant.job.id)
        t += runtime
        d.complete(grant.job.id, now=t, runtime=runtime)
    return order


def image(steps: int = 50) -> ImageRequest:
    return ImageRequest(width=1024, height=1024, steps=steps, sampler="k_euler")


# =========================================================================== constructor


def test_defaults() -> None:
    d = make()
    assert d.scorer == Scorer()
    assert d.policy == PriorityPolicy()
    assert d.fair_share is True
    assert len(d) == 0
    assert d.running is None
    assert d.resident_model is None
    assert d.next_deadline() is None
    assert d.dispatch(0.0) is None
    stats = d.stats(now=0.0)
    assert stats == Stats(
        now=0.0,
        levels={},
        members={},
        running=None,
        resident_model=None,
        queued=0,
        dispatched=0,
        completed=0,
        cancelled=0,
        expired=0,
        failed=0,
        swaps=0,
    )
    assert d.forecast(now=0.0) == []


def test_scorer_and_policy_are_kept() -> None:
    scorer = Scorer(ScoringConfig(aging_divisor=30.0))
    policy = PriorityPolicy(minimum=-100, maximum=100)
    d = make(scorer, policy=policy)
    assert d.scorer is scorer
    assert d.policy is policy


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"scorer": "fast"}, "scorer must be a Scorer, got str"),
        ({"scorer": ScoringConfig()}, "scorer must be a Scorer, got ScoringConfig"),
        ({"policy": 100}, "policy must be a PriorityPolicy, got int"),
        ({"policy": {"interactive": 100}}, "policy must be a PriorityPolicy, got dict"),
    ],
)
def test_constructor_type_errors(options: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        SizeOneDispatcher(**options)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"charge": "wallclock"}, "charge must be 'runtime', 'estimate', a number"),
        ({"charge": None}, "charge must be 'runtime', 'estimate', a number"),
        ({"charge": True}, "charge must be 'runtime', 'estimate', a number"),
        ({"charge": [1.0]}, "charge must be 'runtime', 'estimate', a number"),
        ({"charge": 0}, "a constant charge must be a finite number > 0, got 0"),
        ({"charge": -5.0}, "a constant charge must be a finite number > 0, got -5.0"),
        ({"charge": NAN}, "a constant charge must be a finite number > 0, got nan"),
        ({"charge": INF}, "a constant charge must be a finite number > 0, got inf"),
        ({"lease_for": 430}, "lease_for must be a callable job -> seconds, got 430"),
        ({"lease_for": "k_euler"}, "lease_for must be a callable"),
        ({"max_queued": 0}, r"max_queued must be a positive int or None, got 0"),
        ({"max_queued": -1}, r"max_queued must be a positive int or None, got -1"),
        ({"max_queued": 2.0}, r"max_queued must be a positive int or None, got 2.0"),
        ({"max_queued": True}, r"max_queued must be a positive int or None, got True"),
        ({"max_queued_per_member": 0}, "max_queued_per_member must be a positive int or None"),
        ({"max_queued_per_member": "3"}, "max_queued_per_member must be a positive int or None"),
        ({"max_queued_per_member": False}, "max_queued_per_member must be a positive int"),
        ({"max_attempts": 0}, "max_attempts must be an int >= 1, got 0"),
        ({"max_attempts": True}, "max_attempts must be an int >= 1, got True"),
        ({"max_attempts": 2.0}, "max_attempts must be an int >= 1, got 2.0"),
        ({"history": -1}, "history must be an int >= 0, got -1"),
        ({"history": True}, "history must be an int >= 0, got True"),
        ({"history": 1.5}, "history must be an int >= 0, got 1.5"),
        ({"wait_buckets": ()}, "wait_buckets must be finite positive bounds in increasing"),
        ({"wait_buckets": (0.0, 1.0)}, "wait_buckets must be finite positive bounds"),
        ({"wait_buckets": (-1.0,)}, "wait_buckets must be finite positive bounds"),
        ({"wait_buckets": (1.0, INF)}, "wait_buckets must be finite positive bounds"),
        ({"wait_buckets": (NAN,)}, "wait_buckets must be finite positive bounds"),
        ({"wait_buckets": (5.0, 5.0)}, "wait_buckets must be finite positive bounds"),
        ({"wait_buckets": (10.0, 5.0)}, "wait_buckets must be finite positive bounds"),
    ],
)
def test_constructor_config_errors(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        SizeOneDispatcher(**options)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, PrioqueueError)


@pytest.mark.parametrize("buckets", [("ten",), 5, (None,)])
def test_non_numeric_wait_buckets_raise_config_error(buckets: Any) -> None:
    with pytest.raises(ConfigError, match="wait_buckets"):
        SizeOneDispatcher(wait_buckets=buckets)


@pytest.mark.parametrize(
    "options",
    [
        {"charge": "runtime"},
        {"charge": "estimate"},
        {"charge": 1},
        {"charge": 0.5},
        {"charge": lambda job, runtime: runtime},
        {"lease_for": LeaseCalculator()},
        {"max_queued": 1, "max_queued_per_member": 1},
        {"max_queued": None, "max_queued_per_member": None},
        {"max_attempts": 1},
        {"history": 0},
        {"wait_buckets": [0.5]},
        {"fair_share": False, "track_reorders": False},
    ],
)
def test_constructor_accepts_valid_options(options: dict[str, Any]) -> None:
    d = make(**options)
    d.submit("j", member="m", payload=image(), now=0.0)
    assert grant_of(d, 1.0).job.id == "j"


# =========================================================================== submit


def test_submit_returns_ticket_with_the_stored_job() -> None:
    d = make()
    ticket = d.submit(
        "j1",
        member="alice",
        priority="interactive",
        tier="pro",
        model="sdxl",
        estimate=12,
        payload={"width": 512},
        now=5,
    )
    assert ticket == Ticket(
        job=Job(
            id="j1",
            member="alice",
            priority=100,
            tier="pro",
            tier_bonus=1,
            model="sdxl",
            estimate=12.0,
            arrival=5.0,
            seq=1,
            payload={"width": 512},
        ),
        queued=1,
    )
    assert isinstance(ticket.job.arrival, float)
    assert isinstance(ticket.job.estimate, float)
    second = d.submit("j2", member="bob", now=6.0)
    assert second.queued == 2
    assert second.job.seq == 2
    assert second.job.priority == 0
    assert second.job.tier == "free"
    assert second.job.tier_bonus == 0
    assert second.job.model is None
    assert second.job.estimate is None
    assert second.job.payload is None
    assert len(d) == 2
    assert d.job("j1") is ticket.job
    assert d.state("j1") == "queued"
    assert "j1" in d
    assert "j3" not in d


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"job_id": ""}, "job_id must be a non-empty str, got ''"),
        ({"job_id": 7}, "job_id must be a non-empty str, got 7"),
        ({"job_id": None}, "job_id must be a non-empty str, got None"),
        ({"member": ""}, "member must be a non-empty str, got ''"),
        ({"member": None}, "member must be a non-empty str, got None"),
        ({"member": b"alice"}, "member must be a non-empty str"),
        ({"tier": "gold"}, "unknown tier 'gold'; known tiers: 'free', 'pro', 'max'"),
        ({"tier": "Pro"}, "unknown tier 'Pro'; known tiers: 'free', 'pro', 'max'"),
        ({"tier": ["pro"]}, "unknown tier"),
        ({"model": ""}, "model must be a non-empty str, got ''"),
        ({"model": 3}, "model must be a non-empty str, got 3"),
        ({"estimate": 0}, "estimate must be a positive number of seconds or None, got 0"),
        ({"estimate": -1.0}, "estimate must be a positive number of seconds or None"),
        ({"estimate": NAN}, "estimate must be a finite number of seconds, got nan"),
        ({"estimate": INF}, "estimate must be a finite number of seconds, got inf"),
        ({"estimate": "10"}, "estimate must be a finite number of seconds, got '10'"),
        ({"estimate": True}, "estimate must be a finite number of seconds, got True"),
        ({"now": NAN}, "now must be a finite number of seconds, got nan"),
        ({"now": INF}, "now must be a finite number of seconds, got inf"),
        ({"now": -INF}, "now must be a finite number of seconds, got -inf"),
        ({"now": True}, "now must be a finite number of seconds, got True"),
        ({"now": "20"}, "now must be a finite number of seconds, got '20'"),
        ({"now": None}, "now must be a finite number of seconds, got None"),
        ({"now": 5.0}, r"now \(5.0\) is earlier than a time already seen \(10.0\); pass "),
    ],
)
def test_submit_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    d = make()
    d.submit("first", member="m", now=10.0)
    before = d.stats(now=10.0)
    arguments: dict[str, Any] = {"job_id": "j", "member": "m", "now": 20.0, **kwargs}
    job_id = arguments.pop("job_id")
    with pytest.raises(ValueError, match=match) as info:
        d.submit(job_id, **arguments)
    assert not isinstance(info.value, (DuplicateJob, ConfigError))
    assert len(d) == 1
    assert "j" not in d
    # Nothing changed, not even the clock: a submit at 10 is still accepted.
    assert d.stats(now=10.0) == before
    assert d.submit("j", member="m", now=10.0).queued == 2


def test_submit_with_a_custom_scorer_names_its_tiers() -> None:
    scorer = Scorer(ScoringConfig(tier_bonuses={"basic": 0, "gold": 5}))
    d = make(scorer)
    assert d.submit("g", member="m", tier="gold", now=0).job.tier_bonus == 5
    with pytest.raises(ValueError, match="unknown tier 'free'; known tiers: 'basic', 'gold'"):
        d.submit("f", member="m", now=0)


class Seconds(float):
    pass


def test_times_may_be_float_subclasses() -> None:
    d = make()
    job = d.submit("j", member="m", estimate=Seconds(2.5), now=Seconds(3.0)).job
    assert (job.arrival, job.estimate) == (3.0, 2.5)
    assert type(job.arrival) is float
    with pytest.raises(ValueError, match="now must be a finite number of seconds, got inf"):
        d.submit("k", member="m", now=Seconds("inf"))


def test_an_integral_now_is_stored_as_float() -> None:
    d = make()
    job = d.submit("j", member="m", now=3).job
    assert job.arrival == 3.0
    assert type(job.arrival) is float


@pytest.mark.parametrize(
    ("priority", "level"),
    [
        (0, 0),
        (100, 100),
        (-7, -7),
        (None, 0),
        ("interactive", 100),
        ("Interactive", 100),
        ("BATCH", -100),
        ("normal", 0),
        (b"-100", -100),
        (b"interactive", 100),
        (" +7\t", 7),
        ("007", 7),
        ("garbage", 0),
        ("1.5", 0),
        ("", 0),
        (b"\xff\xfe", 0),
        ("9" * 40, 0),  # longer than MAX_HEADER_LENGTH: unparseable
    ],
)
def test_priority_is_resolved_by_the_default_policy(priority: Any, level: int) -> None:
    d = make()
    assert d.submit("j", member="m", priority=priority, now=0).job.priority == level
    assert d.stats(now=0).levels[level].queued == 1


@pytest.mark.parametrize(
    ("policy", "priority", "level"),
    [
        (PriorityPolicy(minimum=-100, maximum=100), 1000, 100),
        (PriorityPolicy(minimum=-100, maximum=100), "1000000", 100),
        (PriorityPolicy(minimum=-100, maximum=100), b"-5000", -100),
        (PriorityPolicy(minimum=-100, maximum=100), "batch", -100),
        (PriorityPolicy(default=-100), "garbage", -100),
        (PriorityPolicy(default=-100), None, -100),
        (PriorityPolicy(default=-100), 0, 0),
        (PriorityPolicy().with_aliases(vip=50), "VIP", 50),
        (PriorityPolicy(aliases={"urgent": 500}, maximum=200), "urgent", 200),
        (PriorityPolicy(aliases={"urgent": 500}), "interactive", 0),  # aliases replaced
    ],
)
def test_priority_is_resolved_and_clamped_by_the_policy(
    policy: PriorityPolicy, priority: Any, level: int
) -> None:
    d = make(policy=policy)
    assert d.submit("j", member="m", priority=priority, now=0).job.priority == level


@pytest.mark.parametrize("priority", [1.5, True, False, [100], 100.0])
def test_priority_of_an_unsupported_type_raises_type_error(priority: Any) -> None:
    d = make()
    with pytest.raises(TypeError, match="a priority header value must be str, bytes, None"):
        d.submit("j", member="m", priority=priority, now=0)
    assert len(d) == 0
    assert d.stats(now=0).levels == {}


def test_duplicate_job_queued_and_running() -> None:
    d = make()
    d.submit("j1", member="m", now=0)
    d.submit("j2", member="m", now=0)
    with pytest.raises(DuplicateJob, match="job 'j1' is already queued") as info:
        d.submit("j1", member="other", priority=100, now=1)
    assert isinstance(info.value, ValueError)
    assert grant_of(d, 2).job.id == "j1"
    with pytest.raises(DuplicateJob, match="job 'j1' is already running"):
        d.submit("j1", member="m", now=3)
    assert len(d) == 1
    assert d.stats(now=3).members.keys() == {"m"}
    d.complete("j1", now=4)
    # Once finished, the id may be reused.
    assert d.submit("j1", member="m", now=5).job.seq == 3


def test_queue_full_global_limit() -> None:
    d = make(max_queued=2)
    d.submit("a", member="x", now=0)
    d.submit("b", member="y", now=0)
    before = d.stats(now=1)
    with pytest.raises(QueueFull, match=r"the queue holds 2 jobs, its limit \(max_queued=2\)") as e:
        d.submit("c", member="z", now=1)
    assert e.value.retry_after == DEFAULT_RETRY_AFTER == 30.0
    assert e.value.limit == 2
    assert e.value.scope == "queue"
    assert isinstance(e.value, PrioqueueError)
    assert not isinstance(e.value, ValueError)
    assert "c" not in d
    assert len(d) == 2
    assert d.stats(now=1) == before  # no member 'z' appears, no level counted
    # The running job does not count against the queue limit.
    grant_of(d, 2)
    assert d.submit("c", member="z", now=2).queued == 2
    with pytest.raises(QueueFull):
        d.submit("d", member="z", now=2)
    d.cancel("b", now=3)
    assert d.submit("d", member="z", now=3).queued == 2


def test_queue_full_per_member_limit() -> None:
    d = make(max_queued_per_member=2)
    d.submit("a1", member="alice", now=0)
    d.submit("a2", member="alice", priority="batch", now=0)
    before = d.stats(now=1)
    with pytest.raises(QueueFull, match=r"member 'alice' has 2 jobs queued, its limit") as e:
        d.submit("a3", member="alice", priority=100, now=1)
    assert "max_queued_per_member=2" in str(e.value)
    assert e.value.scope == "member"
    assert e.value.limit == 2
    assert e.value.retry_after == 30.0
    assert d.stats(now=1) == before
    # Another member is not affected; alice's running job does not count.
    assert d.submit("b1", member="bob", now=1).queued == 3
    assert grant_of(d, 2).job.id == "a1"
    assert d.submit("a3", member="alice", now=2).job.id == "a3"


def test_global_limit_is_checked_before_the_member_limit() -> None:
    d = make(max_queued=1, max_queued_per_member=1)
    d.submit("a1", member="alice", now=0)
    with pytest.raises(QueueFull) as e:
        d.submit("a2", member="alice", now=0)
    assert e.value.scope == "queue"


@pytest.mark.parametrize(
    ("completions", "retry_after"),
    [
        ([], 30.0),
        ([(100.0, 42.5)], 43.0),  # one completion: its runtime, rounded up
        ([(100.0, 0.2)], 1.0),  # never below 1 s
        ([(100.0, 0.0)], 1.0),
        ([(100.0, 30.0), (160.0, 5.0)], 60.0),  # the mean interval between completions
        ([(100.0, 30.0), (130.0, 5.0), (190.5, 5.0)], 46.0),  # 90.5 / 2 -> 46
        ([(100.0, 30.0), (100.0, 7.5)], 8.0),  # no span: the last runtime
        ([(100.0, 1.0), (100.25, 1.0)], 1.0),  # a span under a second: at least 1
    ],
)
def test_queue_full_retry_after_follows_recent_completions(
    completions: list[tuple[float, float]], retry_after: float
) -> None:
    d = make(max_queued=1)
    for index, (at, runtime) in enumerate(completions):
        d.submit(f"done{index}", member="m", now=at)
        grant_of(d, at)
        d.complete(f"done{index}", now=at, runtime=runtime)
    d.submit("waiting", member="m", now=200)
    with pytest.raises(QueueFull) as e:
        d.submit("refused", member="n", now=200)
    assert e.value.retry_after == retry_after
    assert math.isfinite(e.value.retry_after)


def test_retry_after_counts_a_cancelled_running_job_as_a_completion() -> None:
    d = make(max_queued_per_member=1)
    d.submit("a", member="m", now=0)
    grant_of(d, 0)
    d.cancel("a", now=17.5)
    d.submit("b", member="m", now=20)
    with pytest.raises(QueueFull) as e:
        d.submit("c", member="m", now=20)
    assert e.value.retry_after == 18.0


# =========================================================================== dispatch


def test_dispatch_on_an_empty_queue_returns_none() -> None:
    d = make()
    assert d.dispatch(0) is None
    assert d.dispatch(10) is None
    assert d.stats(now=10).dispatched == 0
    with pytest.raises(ValueError, match="earlier than a time already seen"):
        d.dispatch(5)


def test_dispatch_is_non_preemptive() -> None:
    d = make()
    d.submit("low", member="a", priority="batch", now=0)
    first = grant_of(d, 1)
    assert first.job.id == "low"
    d.submit("high", member="b", priority="interactive", now=2)
    assert d.dispatch(3) is None
    assert d.running is first
    assert d.state("high") == "queued"
    assert d.stats(now=3).dispatched == 1
    d.complete("low", now=4)
    assert d.dispatch(4) is not None
    assert d.state("high") == "running"


def test_grant_fields() -> None:
    d = make()
    d.submit("a", member="alice", tier="max", model="sdxl", estimate=30, now=100)
    grant = grant_of(d, 130)
    assert grant == Grant(
        job=d.job("a"),
        score=ScoreBreakdown(band=0, tier_bonus=2, swap_affinity=0.0, aging=30 / D),
        lease=None,
        granted_at=130.0,
        attempt=1,
        waited=30.0,
        swap=True,  # nothing was resident: a cold load
    )
    assert grant.score.effective == 2.5
    assert d.running is grant
    assert d.state("a") == "running"
    assert "a" in d
    assert len(d) == 0
    assert d.resident_model == "sdxl"
    assert d.next_deadline() is None


def test_grant_with_a_lease_from_a_lease_calculator() -> None:
    d = make(lease_for=LeaseCalculator())
    d.submit("img", member="m", payload=image(), now=0)
    grant = grant_of(d, 10)
    assert grant.lease == Lease(granted_at=10.0, seconds=430)
    assert grant.lease.deadline == 440.0
    assert d.next_deadline() == 440.0
    d.complete("img", now=439.5)
    assert d.next_deadline() is None


def test_grant_lease_from_a_mapping_payload() -> None:
    d = make(lease_for=LeaseCalculator())
    d.submit("img", member="m", payload={"width": 512, "height": 512, "steps": 30}, now=0)
    grant = grant_of(d, 0)
    assert grant.lease is not None
    assert grant.lease.seconds == 150  # 30 + 2 * 30 = 90, raised to the 150 s minimum


def test_swaps_and_the_resident_model() -> None:
    d = make()
    d.submit("m1-a", member="a", model="m1", now=0)
    d.submit("m1-b", member="a", model="m1", now=1)
    d.submit("none", member="a", now=2)
    d.submit("m2", member="a", model="m2", now=3)
    swaps = []
    residents = []
    t = 10.0
    while (grant := d.dispatch(t)) is not None:
        swaps.append((grant.job.id, grant.swap))
        residents.append(d.resident_model)
        t += 1
        d.complete(grant.job.id, now=t)
    assert swaps == [("m1-a", True), ("m1-b", False), ("none", False), ("m2", True)]
    assert residents == ["m1", "m1", "m1", "m2"]
    assert d.stats(now=t).swaps == 2


def test_a_job_without_model_never_swaps_or_changes_the_resident_model() -> None:
    d = make()
    d.set_resident_model("flux")
    d.submit("plain", member="m", now=0)
    grant = grant_of(d, 0)
    assert grant.swap is False
    assert grant.score.swap_affinity == 0.0
    assert d.resident_model == "flux"
    d.set_resident_model(None)
    d.complete("plain", now=1)
    d.submit("plain2", member="m", now=1)
    assert grant_of(d, 1).swap is False
    stats = d.stats(now=1)
    assert stats.resident_model is None
    assert stats.swaps == 0


def affinity_pair(d: Checked) -> None:
    """Two members at the same level; b's job is for the model about to be resident."""
    d.submit("a1", member="a", model="m1", now=0)
    d.submit("b1", member="b", model="m2", now=1)


def test_resident_model_gives_the_affinity_bonus() -> None:
    d = make()
    affinity_pair(d)
    d.set_resident_model("m2")
    assert d.resident_model == "m2"
    grant = grant_of(d, 2)
    assert grant.job.id == "b1"
    assert grant.swap is False
    assert grant.score == ScoreBreakdown(band=0, tier_bonus=0, swap_affinity=10, aging=2 / D)


def test_set_resident_model_none_removes_the_affinity_bonus() -> None:
    d = make()
    affinity_pair(d)
    d.set_resident_model("m2")
    d.set_resident_model(None)
    assert d.resident_model is None
    grant = grant_of(d, 2)
    assert grant.job.id == "a1"  # the older job: same level, same s, FIFO
    assert grant.swap is True
    assert grant.score.swap_affinity == 0.0


def test_affinity_bonus_is_graded_per_model() -> None:
    scorer = Scorer(ScoringConfig(affinity_by_model={"m2": 4.0}))
    d = make(scorer)
    affinity_pair(d)
    d.set_resident_model("m2")
    assert grant_of(d, 2).score.swap_affinity == 4.0


def test_a_model_with_zero_affinity_gets_no_bonus() -> None:
    scorer = Scorer(ScoringConfig(affinity_by_model={"m2": 0.0}))
    d = make(scorer)
    affinity_pair(d)
    d.set_resident_model("m2")
    assert queued_ids(d, 2) == ["a1", "b1"]
    grant = grant_of(d, 2)
    assert grant.job.id == "a1"
    assert d.stats(now=2).levels[0].reorders == Reorders()


@pytest.mark.parametrize("model", ["", 5, b"m1"])
def test_set_resident_model_rejects_bad_names(model: Any) -> None:
    d = make()
    d.set_resident_model("m1")
    with pytest.raises(ValueError, match="model must be a non-empty str"):
        d.set_resident_model(model)
    assert d.resident_model == "m1"


def test_affinity_job_inside_the_lane_window_is_pulled_forward() -> None:
    d = make()
    d.set_resident_model("m2")
    d.submit("head", member="a", model="m1", now=0)
    d.submit("near", member="a", model="m2", now=600)  # exactly W = 10 * 60 after the head
    grant = grant_of(d, 700)
    assert grant.job.id == "near"
    assert grant.score.swap_affinity == 10
    assert grant.swap is False


def test_affinity_job_outside_the_lane_window_is_not_pulled_forward() -> None:
    d = make()
    d.set_resident_model("m2")
    d.submit("head", member="a", model="m1", now=0)
    d.submit("far", member="a", model="m2", now=600.5)
    grant = grant_of(d, 700)
    assert grant.job.id == "head"
    assert grant.score.swap_affinity == 0.0


def test_lease_for_that_raises_leaves_the_dispatcher_unchanged() -> None:
    calls: list[str] = []

    def flaky(job: Job) -> float:
        calls.append(job.id)
        if len(calls) == 1:
            raise RuntimeError("lease service down")
        return 100.0

    d = make(lease_for=flaky)
    d.submit("j", member="m", model="sdxl", now=0)
    before = d.stats(now=5)
    with pytest.raises(LeaseError, match="lease_for raised for job 'j'") as info:
        d.dispatch(5)
    assert info.value.job_id == "j"
    assert isinstance(info.value.__cause__, RuntimeError)
    assert calls == ["j"]
    assert d.state("j") == "queued"
    assert d.running is None
    assert d.resident_model is None
    assert len(d) == 1
    assert d.stats(now=5) == before
    assert d.explain("j", now=5).overtaken_by == ()
    grant = grant_of(d, 6)
    assert grant.job.id == "j"
    assert grant.attempt == 1
    assert grant.lease == Lease(granted_at=6.0, seconds=100.0)
    assert d.stats(now=6).dispatched == 1
    assert d.stats(now=6).swaps == 1


@pytest.mark.parametrize("bad", [0.0, -5, INF, NAN, None, True, "60"])
def test_lease_for_returning_an_invalid_length_leaves_the_dispatcher_unchanged(bad: Any) -> None:
    d = make(lease_for=lambda job: bad)
    d.submit("j", member="m", now=0)
    with pytest.raises(LeaseError, match=r"lease_for returned .* for job 'j'; a lease must be"):
        d.dispatch(1)
    assert d.state("j") == "queued"
    assert d.stats(now=1).dispatched == 0


# =========================================================================== complete


def test_complete_unknown_and_queued_jobs() -> None:
    d = make()
    with pytest.raises(UnknownJob, match="job 'nope' is not queued or running") as info:
        d.complete("nope", now=0)
    assert isinstance(info.value, LookupError)
    assert str(info.value) == "job 'nope' is not queued or running"
    with pytest.raises(UnknownJob):
        d.complete(cast(Any, 42), now=0)
    d.submit("q", member="m", now=0)
    with pytest.raises(InvalidState, match="job 'q' is queued, not running; cancel"):
        d.complete("q", now=1)
    assert d.state("q") == "queued"
    grant_of(d, 2)
    d.complete("q", now=3)
    with pytest.raises(UnknownJob):
        d.complete("q", now=4)


@pytest.mark.parametrize("late", [0.0, 0.5, 1000.0])
def test_complete_at_or_after_the_lease_deadline_raises_and_changes_nothing(late: float) -> None:
    d = make(lease_for=lambda job: 100.0)
    d.submit("j", member="m", now=0)
    d.submit("k", member="m", now=0)
    grant = grant_of(d, 10)
    before = d.stats(now=10)
    start = d.explain("k", now=10).lane_start
    assert start == 60.0  # j's expected charge (no estimate, no history: 60 s), up front
    with pytest.raises(LeaseExpired, match=r"job 'j' finished at .*lease deadline 110\.0") as e:
        d.complete("j", now=110 + late)
    assert isinstance(e.value, InvalidState)
    assert d.running is grant
    assert d.state("j") == "running"
    assert d.stats(now=10) == before  # the clock did not move either
    assert d.explain("k", now=10).lane_start == start
    expired = d.expire(110 + late)
    assert expired == [Expired(job=grant.job, attempt=1, deadline=110.0, requeued=True)]
    assert d.explain("k", now=110 + late).lane_start == 0.0  # the up-front charge refunded


def test_complete_just_before_the_deadline_succeeds() -> None:
    d = make(lease_for=lambda job: 100.0)
    d.submit("j", member="m", now=0)
    grant_of(d, 10)
    assert d.complete("j", now=109.999).runtime == pytest.approx(99.999)


@pytest.mark.parametrize(
    ("runtime", "match"),
    [
        (-1.0, r"runtime must be >= 0 seconds, got -1.0"),
        (NAN, "runtime must be a finite number of seconds, got nan"),
        (INF, "runtime must be a finite number of seconds, got inf"),
        ("5", "runtime must be a finite number of seconds, got '5'"),
        (True, "runtime must be a finite number of seconds, got True"),
    ],
)
def test_complete_rejects_a_bad_runtime(runtime: Any, match: str) -> None:
    d = make()
    d.submit("j", member="m", now=0)
    grant_of(d, 0)
    with pytest.raises(ValueError, match=match):
        d.complete("j", now=10, runtime=runtime)
    assert d.state("j") == "running"
    assert d.complete("j", now=5).runtime == 5.0  # the clock did not move


@pytest.mark.parametrize("now", [NAN, INF, "10", None])
def test_complete_rejects_a_bad_now(now: Any) -> None:
    d = make()
    d.submit("j", member="m", now=0)
    grant_of(d, 0)
    with pytest.raises(ValueError, match="now must be a finite number of seconds"):
        d.complete("j", now=now)
    assert d.state("j") == "running"


def test_complete_rejects_time_going_backwards() -> None:
    d = make()
    d.submit("j", member="m", now=0)
    grant_of(d, 10)
    with pytest.raises(ValueError, match=r"now \(5.0\) is earlier than a time already seen"):
        d.complete("j", now=5)
    assert d.state("j") == "running"


def test_complete_measures_the_runtime_when_none_is_given() -> None:
    d = make()
    d.submit("j", member="alice", now=0)
    grant_of(d, 20)
    done = d.complete("j", now=65.5)
    assert done == Completed(job=done.job, runtime=45.5, charge=45.5)
    assert done.job.id == "j"
    assert d.running is None
    assert "j" not in d
    with pytest.raises(UnknownJob):
        d.state("j")
    stats = d.stats(now=70)
    assert stats.completed == 1
    assert stats.members["alice"] == MemberStats(
        member="alice", queued=0, dispatched=1, completed=1, gpu_seconds=45.5
    )


def test_complete_with_a_reported_runtime() -> None:
    d = make()
    d.submit("j", member="alice", now=0)
    grant_of(d, 0)
    done = d.complete("j", now=100, runtime=12.25)
    assert (done.runtime, done.charge) == (12.25, 12.25)
    d.submit("k", member="alice", now=100)
    grant_of(d, 100)
    zero = d.complete("k", now=100, runtime=0)
    assert (zero.runtime, zero.charge) == (0.0, 0.0)
    assert d.stats(now=100).members["alice"].gpu_seconds == 12.25


def _double(job: Job, runtime: float) -> float:
    return 2 * runtime


def _by_model(job: Job, runtime: float) -> float:
    return 500.0 if job.model == "big" else 1.0


@pytest.mark.parametrize(
    ("charge", "estimate", "model", "expected_charge", "expected_s"),
    [
        ("runtime", None, None, 40.0, 40.0),
        ("runtime", 25.0, None, 40.0, 40.0),
        ("estimate", 25.0, None, 25.0, 25.0),
        ("estimate", None, None, 40.0, 40.0),  # no estimate: the runtime
        (7, 25.0, None, 7.0, 7.0),
        (0.5, None, None, 0.5, 0.5),
        (_double, None, None, 80.0, 80.0),
        (_by_model, None, "small", 1.0, 1.0),
        (_by_model, None, "big", 500.0, 100.0),  # s is clamped to now
    ],
)
def test_charge_models_advance_the_lane_virtual_start(
    charge: Any,
    estimate: float | None,
    model: str | None,
    expected_charge: float,
    expected_s: float,
) -> None:
    d = make(charge=charge)
    d.submit("j1", member="alice", estimate=estimate, model=model, now=0)
    d.submit("j2", member="alice", now=0)
    # Bob keeps the level shared: a lane alone at its level is re-anchored at now instead.
    d.submit("b1", member="bob", now=0)
    assert d.explain("j2", now=0).lane_start == 0.0
    grant_of(d, 0)
    done = d.complete("j1", now=100, runtime=40)
    assert done.runtime == 40.0
    assert done.charge == expected_charge
    explanation = d.explain("j2", now=100)
    assert explanation.lane_start == expected_s
    assert explanation.score.aging == (100 - expected_s) / D
    assert d.stats(now=100).members["alice"].gpu_seconds == expected_charge


def test_virtual_start_never_exceeds_now() -> None:
    d = make()
    d.submit("j1", member="alice", now=0)
    d.submit("j2", member="alice", now=0)
    grant_of(d, 0)
    done = d.complete("j1", now=100, runtime=1000)
    assert done.charge == 1000.0
    explanation = d.explain("j2", now=100)
    assert explanation.lane_start == 100.0
    assert explanation.score.aging == 0.0


@pytest.mark.parametrize("bad", [-1.0, NAN, INF, None, "5", True])
def test_a_bad_charge_from_a_callable_raises_and_keeps_the_job_running(bad: Any) -> None:
    # Good for the expected runtime at the grant (60 s), bad for the real one.
    d = make(charge=lambda job, runtime: bad if runtime == 10.0 else runtime)
    d.submit("j", member="m", now=0)
    grant_of(d, 0)
    with pytest.raises(
        ValueError, match=r"the charge model returned .* for job 'j' \(at completion\); a charge"
    ):
        d.complete("j", now=10)
    assert d.state("j") == "running"
    assert d.stats(now=10).completed == 0
    assert d.complete("j", now=10, charge=0.0).charge == 0.0  # an explicit charge overrides


@pytest.mark.parametrize("bad", [-1.0, NAN, INF, None, "5", True])
def test_a_bad_expected_charge_raises_at_the_grant_and_keeps_the_job_queued(bad: Any) -> None:
    d = make(charge=lambda job, runtime: bad)
    d.submit("j", member="m", now=0)
    with pytest.raises(
        ValueError, match=r"the charge model returned .* for job 'j' \(expected charge\)"
    ):
        d.dispatch(0)
    assert d.state("j") == "queued"
    assert d.running is None
    assert d.stats(now=0).dispatched == 0


# =========================================================================== cancel


def test_cancel_a_queued_job() -> None:
    d = make()
    d.submit("a1", member="alice", model="m1", now=0)
    d.submit("a2", member="alice", model="m1", now=1)
    d.submit("b1", member="bob", priority="batch", now=2)
    job = d.cancel("a1", now=3)
    assert job.id == "a1"
    assert job.model == "m1"
    assert "a1" not in d
    assert len(d) == 2
    with pytest.raises(UnknownJob):
        d.job("a1")
    with pytest.raises(UnknownJob, match="job 'a1' is not queued or running"):
        d.cancel("a1", now=3)
    stats = d.stats(now=3)
    assert stats.cancelled == 1
    assert stats.levels[0].queued == 1
    assert stats.levels[0].oldest_wait == 2.0  # a2, not the cancelled a1
    assert stats.members["alice"].queued == 1
    assert stats.completed == 0
    assert drain(d, 3) == ["a2", "b1"]
    assert d.stats(now=100).dispatched == 2


def test_cancel_the_only_job_of_a_lane() -> None:
    d = make()
    d.submit("a", member="alice", now=0)
    d.cancel("a", now=1)
    assert len(d) == 0
    assert d.dispatch(2) is None
    assert d.stats(now=2).levels[0].queued == 0


def test_cancel_a_running_job_frees_the_resource_and_charges_the_time_it_ran() -> None:
    d = make()
    d.submit("a1", member="alice", now=0)
    d.submit("a2", member="alice", now=0)
    # Bob shares the level: alice's lane is charged, not re-anchored.
    d.submit("b1", member="bob", now=0)
    grant_of(d, 10)
    job = d.cancel("a1", now=45)
    assert job.id == "a1"
    assert d.running is None
    assert "a1" not in d
    assert d.explain("a2", now=45).lane_start == 35.0
    stats = d.stats(now=45)
    assert stats.cancelled == 1
    assert stats.completed == 0
    assert stats.running is None
    assert stats.members["alice"].gpu_seconds == 35.0
    assert stats.members["alice"].completed == 0
    assert grant_of(d, 45).job.id == "b1"  # bob's lane (s = 0) is older than alice's (35)


@pytest.mark.parametrize("method", ["cancel", "explain"])
def test_unknown_jobs_and_bad_times(method: str) -> None:
    """``cancel`` and ``explain`` refuse an unknown job, time going backwards and a NaN."""
    d = make()
    call = getattr(d, method)
    with pytest.raises(UnknownJob, match="job 'ghost' is not queued or running"):
        call("ghost", now=0)
    d.submit("j", member="m", now=10)
    with pytest.raises(ValueError, match="earlier than a time already seen"):
        call("j", now=5)
    with pytest.raises(ValueError, match="now must be a finite number"):
        call("j", now=NAN)
    assert d.state("j") == "queued"
    assert d.stats(now=10).cancelled == 0


# =========================================================================== expire


def test_expire_without_a_running_job_or_a_lease() -> None:
    d = make()
    assert d.expire(0) == []
    d.submit("j", member="m", now=0)
    grant_of(d, 0)
    assert d.next_deadline() is None
    assert d.expire(1e9) == []
    assert d.state("j") == "running"
    assert d.stats(now=1e9).expired == 0


def test_expire_before_the_deadline_does_nothing() -> None:
    d = make(lease_for=lambda job: 100.0)
    d.submit("j", member="m", now=0)
    grant_of(d, 0)
    assert d.next_deadline() == 100.0
    assert d.expire(99.999) == []
    assert d.state("j") == "running"
    with pytest.raises(ValueError, match="earlier than a time already seen"):
        d.expire(50)


def test_expire_requeues_at_the_head_of_its_lane_keeping_its_age() -> None:
    d = make(lease_for=lambda job: 100.0)
    d.submit("a1", member="alice", model="m1", now=0)
    grant = grant_of(d, 20)
    d.submit("b1", member="bob", now=40)
    expired = d.expire(120)
    assert expired == [Expired(job=grant.job, attempt=1, deadline=120.0, requeued=True)]
    assert d.running is None
    assert d.next_deadline() is None
    assert d.state("a1") == "queued"
    assert d.job("a1") == grant.job  # the same job: same arrival, same seq
    explanation = d.explain("a1", now=120)
    assert explanation.lane_start == 0.0  # no lift: the lane keeps its age
    assert explanation.waited == 120.0
    assert explanation.position == 1
    stats = d.stats(now=120)
    assert stats.expired == 1
    assert stats.failed == 0
    assert stats.levels[0].queued == 2
    assert stats.levels[0].oldest_wait == 120.0
    again = grant_of(d, 120)
    assert again.job.id == "a1"
    assert again.attempt == 2
    assert again.waited == 120.0
    assert again.lease == Lease(granted_at=120.0, seconds=100.0)
    assert again.swap is False  # m1 stayed resident


def test_expire_requeues_ahead_of_the_rest_of_its_lane() -> None:
    d = make(lease_for=lambda job: 50.0)
    d.submit("a1", member="alice", model="m1", now=0)
    d.submit("a2", member="alice", model="m1", now=1)
    grant_of(d, 2)
    d.set_resident_model(None)
    d.expire(52)
    assert queued_ids(d, 52) == ["a1", "a2"]
    assert d.explain("a1", now=52).lane_start == 0.0
    # It is also the first of its lane for its model: the affinity job.
    d.set_resident_model("m1")
    grant = grant_of(d, 52)
    assert (grant.job.id, grant.attempt, grant.score.swap_affinity) == ("a1", 2, 10)


def test_expire_after_max_attempts_reports_the_job_as_failed() -> None:
    d = make(lease_for=lambda job: 10.0, max_attempts=2)
    d.submit("j", member="m", now=0)
    d.submit("k", member="n", now=0)
    first = grant_of(d, 0)
    assert first.job.id == "j"
    assert d.expire(10) == [Expired(job=first.job, attempt=1, deadline=10.0, requeued=True)]
    second = grant_of(d, 10)
    assert second.job.id == "j"  # its lane kept s = 0 and its head seq is older than k's
    assert second.attempt == 2
    assert d.expire(25) == [Expired(job=first.job, attempt=2, deadline=20.0, requeued=False)]
    assert "j" not in d
    with pytest.raises(UnknownJob):
        d.state("j")
    assert d.running is None
    assert len(d) == 1
    stats = d.stats(now=25)
    assert (stats.expired, stats.failed, stats.dispatched, stats.completed) == (2, 1, 2, 0)
    assert stats.levels[0].dispatched == 2
    assert stats.members["m"].queued == 0
    assert grant_of(d, 25).job.id == "k"


def test_max_attempts_one_fails_on_the_first_expiry() -> None:
    d = make(lease_for=lambda job: 10.0, max_attempts=1)
    d.submit("j", member="m", now=0)
    job = grant_of(d, 0).job
    assert d.expire(10) == [Expired(job=job, attempt=1, deadline=10.0, requeued=False)]
    assert len(d) == 0
    assert d.stats(now=10).failed == 1


# =========================================================================== explain / forecast


def test_explain_a_running_job() -> None:
    d = make()
    d.submit("j", member="m", tier="pro", now=0)
    grant = grant_of(d, 30)
    explanation = d.explain("j", now=90)
    assert explanation.state == "running"
    assert explanation.job == grant.job
    assert explanation.now == 90.0
    assert explanation.waited == 30.0
    assert explanation.score == grant.score
    assert explanation.lane_start == 60.0  # charged its expected 60 s up front
    assert explanation.position == 0
    assert explanation.ahead == ()
    assert explanation.estimated_start == 30.0
    assert explanation.estimated_wait == 0.0
    assert explanation.overtaken_by == ()
    text = str(explanation)
    assert "job j (member m, priority 0, tier pro, model None): running, waited 30.0 s" in text
    assert "position" not in text


def test_explain_a_queued_job() -> None:
    d = make()
    d.set_resident_model("m1")
    d.submit("a", member="alice", tier="max", model="m1", estimate=50, now=0)
    d.submit("b", member="bob", priority="batch", estimate=20, now=10)
    explanation = d.explain("b", now=60)
    assert explanation.state == "queued"
    assert explanation.job == d.job("b")
    assert explanation.waited == 50.0
    assert explanation.score == ScoreBreakdown(
        band=-100, tier_bonus=0, swap_affinity=0, aging=50 / D
    )
    assert explanation.lane_start == 10.0
    assert explanation.position == 2
    assert explanation.ahead == (
        AheadJob(
            job_id="a",
            member="alice",
            priority=0,
            score=0 + 2 + 10 + 60 / D,
            estimated_start=60.0,
        ),
    )
    assert explanation.estimated_start == 110.0
    assert explanation.estimated_wait == 50.0
    mine = d.explain("a", now=60)
    assert mine.score == ScoreBreakdown(band=0, tier_bonus=2, swap_affinity=10, aging=1)
    assert mine.position == 1
    assert mine.ahead == ()
    assert mine.estimated_start == 60.0
    assert mine.estimated_wait == 0.0


def test_estimated_start_accounts_for_the_running_job() -> None:
    d = make()
    d.submit("run", member="a", estimate=100, now=0)
    grant_of(d, 0)
    d.submit("next", member="b", estimate=50, now=10)
    d.submit("last", member="b", estimate=5, now=10)
    explanation = d.explain("last", now=20)
    assert [a.job_id for a in explanation.ahead] == ["next"]
    assert explanation.ahead[0].estimated_start == 100.0
    assert explanation.estimated_start == 150.0
    assert explanation.estimated_wait == 130.0
    # A running job that overruns its estimate: the queue starts now.
    assert d.explain("next", now=400).estimated_start == 400.0


def test_estimated_start_is_unknown_without_estimates_or_history() -> None:
    d = make()
    d.submit("run", member="a", now=0)
    grant_of(d, 0)
    d.submit("next", member="b", now=1)
    explanation = d.explain("next", now=2)
    assert explanation.estimated_start is None
    assert explanation.estimated_wait is None
    assert "start unknown" in str(explanation)
    assert [a.estimated_start for a in d.forecast(now=2)] == [None]


def test_estimated_start_uses_the_recent_mean_runtime() -> None:
    d = make()
    for index, runtime in enumerate((10.0, 30.0)):
        d.submit(f"old{index}", member="a", model="m1", now=0)
        grant_of(d, 0)
        d.complete(f"old{index}", now=0, runtime=runtime)
    d.submit("other", member="a", model="m9", now=0)
    grant_of(d, 0)
    d.complete("other", now=0, runtime=100.0)
    # Same model: mean of its runtimes (20); unknown model: mean of all (140 / 3).
    d.submit("m1-job", member="b", model="m1", now=0)
    d.submit("new-model", member="c", model="m5", now=0)
    d.submit("tail", member="d", estimate=1, now=0)
    starts = {a.job_id: a.estimated_start for a in d.forecast(now=0)}
    assert queued_ids(d, 0) == ["m1-job", "new-model", "tail"]
    assert starts == {"m1-job": 0.0, "new-model": 20.0, "tail": 20.0 + 140.0 / 3}


def test_forecast_and_explain_agree_with_the_actual_dispatch_order() -> None:
    d = make()
    submissions: list[tuple[str, str, Any, str, float]] = [
        ("a1", "alice", 0, "free", 40),
        ("a2", "alice", 0, "free", 40),
        ("a3", "alice", 0, "free", 40),
        ("b1", "bob", 0, "pro", 30),
        ("b2", "bob", 0, "pro", 30),
        ("c1", "carol", "batch", "max", 20),
        ("c2", "carol", "batch", "max", 20),
        ("i1", "dave", "interactive", "free", 10),
        ("e1", "erin", 0, "max", 25),
        ("f1", "frank", -99, "free", 15),
    ]
    for index, (job_id, member, priority, tier, estimate) in enumerate(submissions):
        d.submit(
            job_id, member=member, priority=priority, tier=tier, estimate=estimate, now=index * 7
        )
    now = 100.0
    forecast = d.forecast(now=now)
    predicted = [a.job_id for a in forecast]
    assert sorted(predicted) == sorted(s[0] for s in submissions)
    for position, ahead in enumerate(forecast, start=1):
        explanation = d.explain(ahead.job_id, now=now)
        assert explanation.position == position
        assert [a.job_id for a in explanation.ahead] == predicted[: position - 1]
        assert explanation.estimated_start == ahead.estimated_start
        assert explanation.score.effective == pytest.approx(ahead.score)
    assert d.forecast(now=now, limit=3) == forecast[:3]
    # Run everything exactly as forecast: each job for its estimate.
    actual, starts = [], []
    t = now
    while (grant := d.dispatch(t)) is not None:
        actual.append(grant.job.id)
        starts.append(t)
        runtime = grant.job.estimate
        assert runtime is not None
        t += runtime
        d.complete(grant.job.id, now=t)
    assert actual == predicted
    assert starts == [a.estimated_start for a in forecast]
    # Interactive first; at level 0 the max and pro tiers, then alice (whose lane is charged
    # 40 s per job); carol's max-tier batch lane beats frank's later -99 job once, then, alone
    # at its level, is re-anchored at now, and frank's job (waiting since t=63) goes first.
    assert predicted == ["i1", "e1", "b1", "b2", "a1", "a2", "a3", "c1", "f1", "c2"]


def test_forecast_charges_the_running_jobs_lane() -> None:
    d = make()
    d.submit("a1", member="a", estimate=100, now=0)
    d.submit("a2", member="a", estimate=10, now=0)
    d.submit("b1", member="b", estimate=10, now=0)
    assert grant_of(d, 0).job.id == "a1"
    predicted = [(a.job_id, a.estimated_start) for a in d.forecast(now=0)]
    position = d.explain("a2", now=0).position
    d.complete("a1", now=100)  # exactly as estimated; nothing else happens
    assert drain(d, 100) == ["b1", "a2"]
    assert predicted == [("b1", 100.0), ("a2", 110.0)]
    assert position == 2


def test_forecast_follows_the_resident_model_at_lane_heads() -> None:
    d = make()
    d.set_resident_model("m2")
    d.submit("a1", member="a", model="m1", estimate=10, now=0)
    d.submit("b1", member="b", model="m2", estimate=10, now=1)
    d.submit("b2", member="b", model="m2", estimate=10, now=2)
    assert queued_ids(d, 3) == ["b1", "b2", "a1"]
    assert drain(d, 3) == ["b1", "b2", "a1"]


@pytest.mark.parametrize("limit", [-1, 1.5, "2"])
def test_forecast_rejects_a_bad_limit(limit: Any) -> None:
    d = make()
    d.submit("j", member="m", now=0)
    with pytest.raises(ValueError, match="limit must be an int >= 0 or None, got"):
        d.forecast(now=0, limit=limit)


def test_forecast_limits() -> None:
    d = make()
    for index in range(4):
        d.submit(f"j{index}", member=f"m{index}", now=index)
    assert d.forecast(now=10, limit=0) == []
    assert [a.job_id for a in d.forecast(now=10, limit=2)] == ["j0", "j1"]
    assert len(d.forecast(now=10, limit=10)) == 4
    assert len(d.forecast(now=10, limit=None)) == 4


def test_forecast_excludes_the_running_job() -> None:
    d = make()
    d.submit("run", member="a", now=0)
    d.submit("wait", member="b", now=0)
    grant_of(d, 0)
    assert queued_ids(d, 1) == ["wait"]


def overtaken_by_priority(d: Checked) -> tuple[str, float, float]:
    d.submit("victim", member="a", priority="batch", now=0)
    d.submit("winner", member="b", priority="interactive", now=1)
    grant_of(d, 2)
    return "priority", 200 + (2 - 1) / D - 2 / D, 2.0


def overtaken_by_tier(d: Checked) -> tuple[str, float, float]:
    d.submit("victim", member="a", now=0)
    # The lift floor is a's s + 60 s (one tier point), so b starts at its arrival, s = 1.
    d.submit("winner", member="b", tier="pro", now=1)
    grant_of(d, 2)
    return "tier", 1.0 - 1 / D, 2.0


def overtaken_by_fair_share(d: Checked) -> tuple[str, float, float]:
    d.submit("first", member="a", now=0)
    d.submit("victim", member="a", now=0)
    grant_of(d, 0)
    # a's s = 60: first's expected charge, up front (docs/design/fleet.md).
    d.submit("winner", member="b", now=50)  # lifted to s = min(now, a's s) = 50
    d.complete("first", now=100)  # a's s = 100
    grant_of(d, 100)
    return "fair share", 50 / D, 100.0


def overtaken_by_affinity(d: Checked) -> tuple[str, float, float]:
    d.set_resident_model("m2")
    d.submit("victim", member="a", model="m1", now=0)
    # s = 0: lifted level with the victim's lane (the lift counts no affinity), so the
    # affinity bonus is the whole margin.
    d.submit("winner", member="b", model="m2", now=1)
    grant_of(d, 2)
    return "affinity", 10.0, 2.0


@pytest.mark.parametrize(
    "scenario",
    [overtaken_by_priority, overtaken_by_tier, overtaken_by_fair_share, overtaken_by_affinity],
)
def test_explain_names_what_overtook_a_job(
    scenario: Callable[[Checked], tuple[str, float, float]],
) -> None:
    d = make()
    cause, margin, at = scenario(d)
    explanation = d.explain("victim", now=at + 5)
    (overtake,) = explanation.overtaken_by
    assert overtake == Overtake(
        job_id="winner",
        member="b",
        priority=d.job("winner").priority,
        at=at,
        cause=cast(Any, cause),
        margin=overtake.margin,
    )
    assert overtake.margin == pytest.approx(margin)
    text = str(explanation)
    assert f"  overtaken at {at:.1f} by winner (member b, priority " in text
    assert f"): {cause}, by {margin:.2f} points" in text


def test_overtakes_of_a_queued_job_exclude_earlier_submissions() -> None:
    d = make()
    d.submit("early", member="b", priority="interactive", now=0)
    d.submit("victim", member="a", now=1)
    d.submit("late", member="c", priority="interactive", now=2)
    for t in (3.0, 8.0):
        grant = grant_of(d, t)
        d.complete(grant.job.id, now=t + 5)
    overtakes = d.explain("victim", now=13).overtaken_by
    assert [(o.job_id, o.at, o.cause) for o in overtakes] == [("late", 8.0, "priority")]


def test_explain_of_a_running_job_lists_what_overtook_it_before_its_grant() -> None:
    d = make()
    d.submit("victim", member="a", now=0)
    d.submit("winner", member="b", tier="max", now=1)
    assert grant_of(d, 2).job.id == "winner"
    d.complete("winner", now=3)
    grant_of(d, 3)
    d.submit("after", member="c", priority="interactive", now=4)
    explanation = d.explain("victim", now=5)
    assert explanation.state == "running"
    assert [(o.job_id, o.cause) for o in explanation.overtaken_by] == [("winner", "tier")]


def test_an_exact_tie_is_reported_as_fair_share() -> None:
    def after_first(winner_at: float, **options: Any) -> tuple[Checked, Grant]:
        """a submits "first" and "victim" at 0, b "winner" at ``winner_at``; "first" runs and
        completes at ``winner_at`` in no time: the dispatcher and its next grant."""
        d = make(**options)
        d.submit("first", member="a", now=0)
        d.submit("victim", member="a", now=0)
        d.submit("winner", member="b", now=winner_at)
        grant_of(d, winner_at)
        d.complete("first", now=winner_at, runtime=0)
        return d, grant_of(d, winner_at)

    # a's s stays 0: the lanes tie, b's head is older.
    assert after_first(0)[1].job.id == "victim"
    # a's s = min(0 + 1, 1) = 1 = b's... b lifted to 0.
    d, grant = after_first(1, charge=1)
    assert grant.job.id == "winner"
    overtake = d.explain("victim", now=1).overtaken_by
    assert [(o.job_id, o.cause) for o in overtake] == [("winner", "fair share")]


def test_overtake_cause_uses_the_lane_tier_like_the_score() -> None:
    d = make()
    d.submit("a1", member="a", now=0)
    d.submit("victim", member="a", tier="pro", now=0)  # the lane keeps its head's tier
    d.submit("winner", member="b", tier="pro", now=0)
    assert grant_of(d, 0).job.id == "winner"
    assert d.stats(now=0).levels[0].reorders == Reorders(tier=1)
    explanation = d.explain("victim", now=0)
    assert explanation.score.tier_bonus == 0
    (overtake,) = explanation.overtaken_by
    assert (overtake.cause, overtake.margin) == ("tier", 1.0)


def test_explain_gives_no_affinity_outside_the_window() -> None:
    d = make()
    d.set_resident_model("m2")
    d.submit("head", member="a", model="m1", now=0)
    d.submit("far", member="a", model="m2", now=600.5)
    far = d.explain("far", now=700)
    assert far.position == 2
    assert far.score.swap_affinity == 0.0
    assert grant_of(d, 700).score.swap_affinity == 0.0


def test_history_zero_remembers_no_overtakes() -> None:
    d = make(history=0)
    overtaken_by_tier(d)
    assert d.explain("victim", now=2).overtaken_by == ()


def test_history_keeps_only_the_latest_dispatches() -> None:
    d = make(history=1)
    d.submit("victim", member="a", priority="batch", now=0)
    for index in range(3):
        d.submit(f"w{index}", member="b", priority=100, now=index + 1)
    drain(d, 10)
    d2 = make(history=1)
    d2.submit("victim", member="a", priority="batch", now=0)
    for index in range(3):
        d2.submit(f"w{index}", member="b", priority=100, now=index + 1)
    t = 10.0
    for _ in range(3):
        grant = grant_of(d2, t)
        t += 1
        d2.complete(grant.job.id, now=t)
    assert [o.job_id for o in d2.explain("victim", now=t).overtaken_by] == ["w2"]


def test_explanation_text_reads_like_sprio() -> None:
    d = make()
    d.submit("me", member="zed", priority="batch", estimate=10, now=0)
    for index in range(12):
        d.submit(f"ahead{index:02}", member=f"m{index}", estimate=10, now=1)
    d.submit("winner", member="b", priority="interactive", model="m1", now=1)
    grant_of(d, 1)
    text = str(d.explain("me", now=60))
    lines = text.splitlines()
    assert lines[0] == (
        "job me (member zed, priority -100, tier free, model None): queued, waited 60.0 s"
    )
    assert lines[1] == "  score: effective -99 = band -100 + tier 0 + affinity 0 + aging 1"
    assert lines[2] == "  position 13, 12 ahead, start unknown"
    assert lines[3] == "    ahead: ahead00 (member m0, priority 0, score 0.98)"
    assert len([line for line in lines if line.startswith("    ahead: ")]) == 10
    assert "    ... and 2 more" in lines
    assert lines[-1].startswith("  overtaken at 1.0 by winner (member b, priority 100): priority")
    d.complete("winner", now=61, runtime=10)
    text = str(d.explain("me", now=61))
    assert "  position 13, 12 ahead, start in ~120 s" in text


# =========================================================================== stats


def test_stats_levels_are_sorted_highest_first_and_keep_used_levels() -> None:
    d = make()
    jobs: list[tuple[str, int | str]] = [("n", 0), ("b", "batch"), ("i", "interactive"), ("x", 7)]
    for job_id, priority in jobs:
        d.submit(job_id, member="m", priority=priority, now=0)
    stats = d.stats(now=0)
    assert list(stats.levels) == [100, 7, 0, -100]
    assert all(level == stats.levels[level].level for level in stats.levels)
    drain(d, 0)
    assert list(d.stats(now=100).levels) == [100, 7, 0, -100]


def test_stats_queue_waits() -> None:
    d = make()
    d.submit("a", member="alice", now=0)
    d.submit("b", member="bob", now=10)
    d.submit("c", member="alice", priority="batch", now=20)
    stats = d.stats(now=30)
    assert stats.now == 30.0
    assert stats.queued == 3
    level = stats.levels[0]
    assert (level.queued, level.oldest_wait, level.mean_wait) == (2, 30.0, 25.0)
    assert (level.dispatched, level.total_wait) == (0, 0.0)
    batch = stats.levels[-100]
    assert (batch.queued, batch.oldest_wait, batch.mean_wait) == (1, 10.0, 10.0)
    assert list(stats.members) == ["alice", "bob"]
    assert stats.members["alice"] == MemberStats(
        member="alice", queued=2, dispatched=0, completed=0, gpu_seconds=0.0
    )
    grant_of(d, 30)
    stats = d.stats(now=40)
    assert stats.running == d.job("a")
    level = stats.levels[0]
    assert (level.queued, level.oldest_wait, level.mean_wait) == (1, 30.0, 30.0)
    assert (level.dispatched, level.total_wait) == (1, 30.0)
    d.complete("a", now=40)
    grant_of(d, 40)
    level = d.stats(now=50).levels[0]
    assert (level.queued, level.oldest_wait, level.mean_wait) == (0, 0.0, 0.0)
    assert (level.dispatched, level.total_wait) == (2, 60.0)


def test_stats_wait_buckets_are_cumulative_and_end_with_inf() -> None:
    d = make(wait_buckets=(10, 100))
    waits = [0.0, 10.0, 10.5, 100.0, 500.0]
    t = 0.0
    for index, wait in enumerate(waits):
        d.submit(f"j{index}", member="m", now=t)
        t += wait
        assert grant_of(d, t).waited == wait
        d.complete(f"j{index}", now=t)
    level = d.stats(now=t).levels[0]
    assert level.wait_buckets == ((10.0, 2), (100.0, 4), (INF, 5))
    assert level.dispatched == 5
    assert level.total_wait == sum(waits)


def test_stats_default_wait_buckets() -> None:
    d = make()
    d.submit("j", member="m", now=0)
    grant_of(d, 61)
    buckets = d.stats(now=61).levels[0].wait_buckets
    assert [bound for bound, _ in buckets] == [*DEFAULT_WAIT_BUCKETS, INF]
    assert [count for _, count in buckets] == [0] * 5 + [1] * 9
    assert dict(buckets)[60.0] == 0
    assert dict(buckets)[120.0] == 1


def test_stats_members_and_totals() -> None:
    d = make(lease_for=lambda job: 100.0)
    d.submit("a1", member="alice", now=0)
    d.submit("a2", member="alice", now=0)
    d.submit("b1", member="bob", model="m1", now=0)
    d.submit("b2", member="bob", now=0)
    grant_of(d, 0)  # a1
    d.complete("a1", now=12)
    grant_of(d, 12)  # b1
    d.cancel("b1", now=20)
    grant_of(d, 20)  # b2: bob's s 8 < alice's 12
    d.expire(120)
    stats = d.stats(now=120)
    assert stats.members == {
        "alice": MemberStats(member="alice", queued=1, dispatched=1, completed=1, gpu_seconds=12),
        "bob": MemberStats(member="bob", queued=1, dispatched=2, completed=0, gpu_seconds=8),
    }
    assert (stats.dispatched, stats.completed, stats.cancelled, stats.expired) == (3, 1, 1, 1)
    assert (stats.failed, stats.swaps, stats.queued) == (0, 1, 2)
    assert stats.resident_model == "m1"
    assert stats.running is None


def reorder_by_tier(d: Checked) -> int:
    d.submit("a", member="a", now=0)
    d.submit("p", member="p", tier="pro", now=1)
    assert grant_of(d, 2).job.id == "p"
    return 0


def reorder_by_affinity(d: Checked) -> int:
    d.set_resident_model("m2")
    d.submit("a1", member="a", model="m1", now=0)
    d.submit("b1", member="b", model="m2", now=1)
    assert grant_of(d, 2).job.id == "b1"
    return 0


def reorder_by_aging(d: Checked) -> int:
    d.submit("old", member="a", priority="batch", now=0)
    d.submit("new", member="b", now=7000)
    assert grant_of(d, 7000).job.id == "old"
    return -100


def reorder_by_fair_share(d: Checked) -> int:
    d.submit("a1", member="a", now=0)
    d.submit("a2", member="a", now=0)
    grant_of(d, 0)
    d.submit("b1", member="b", now=50)
    d.complete("a1", now=100)
    assert grant_of(d, 100).job.id == "b1"
    return 0


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        (reorder_by_tier, Reorders(tier=1)),
        (reorder_by_affinity, Reorders(affinity=1)),
        (reorder_by_aging, Reorders(aging=1)),
        (reorder_by_fair_share, Reorders(fair_share=1)),
    ],
)
def test_reorders_count_the_term_that_changed_the_winner(
    scenario: Callable[[Checked], int], expected: Reorders
) -> None:
    d = make()
    level = scenario(d)
    stats = d.stats(now=10_000)
    assert stats.levels[level].reorders == expected
    for other, level_stats in stats.levels.items():
        if other != level:
            assert level_stats.reorders == Reorders()
    # Without tracking, the same dispatches count nothing.
    untracked = make(track_reorders=False)
    assert scenario(untracked) == level
    assert all(s.reorders == Reorders() for s in untracked.stats(now=10_000).levels.values())


def test_reorders_accumulate_and_as_dict() -> None:
    d = make()
    d.submit("a1", member="a", now=0)
    d.submit("a2", member="a", now=0)
    d.submit("p1", member="p", tier="pro", now=0)
    d.submit("p2", member="p", tier="pro", now=0)
    # p (pro) runs first; then each lane is charged 10 s per job.
    assert drain(d, 0) == ["p1", "p2", "a1", "a2"]
    reorders = d.stats(now=100).levels[0].reorders
    # p1 won by tier (tie otherwise, a1 older); p2 won by tier too (s 0 + 10 = 10 vs a's 0:
    # key p = 1 - 10/60 > a = 0); a1, a2 alone.
    assert reorders == Reorders(tier=2)
    assert reorders.as_dict() == {
        "aging": 0,
        "affinity": 0,
        "tier": 2,
        "fair_share": 0,
        "deferred_crossings": 0,
    }


def test_a_lone_job_is_never_a_reorder() -> None:
    d = make()
    d.submit("j", member="m", tier="max", model="m1", now=0)
    d.set_resident_model("m1")
    grant_of(d, 10)
    assert d.stats(now=10).levels[0].reorders == Reorders()


# =========================================================================== snapshot / restore


def request(steps: int = 50) -> dict[str, Any]:
    """A JSON-friendly lease payload (a mapping of ImageRequest's arguments)."""
    return {"width": 1024, "height": 1024, "steps": steps, "sampler": "k_euler"}


def busy_dispatcher() -> Checked:
    """Queued jobs in several lanes and levels, models, a requeued head, a running job."""
    d = make(lease_for=LeaseCalculator())
    d.submit("a1", member="alice", model="m1", payload=request(), estimate=40, now=0)
    d.submit("a2", member="alice", model="m2", payload={"width": 512, "height": 512}, now=5)
    d.submit("b1", member="bob", tier="pro", model="m1", payload=request(20), now=10)
    d.submit("b2", member="bob", priority="batch", payload=request(10), estimate=30, now=15)
    d.submit("c1", member="carol", tier="max", priority="interactive", payload=request(), now=20)
    d.submit("c2", member="carol", model="m2", payload=request(30), now=25)
    d.submit("d1", member="dave", payload=request(5), now=30)
    assert grant_of(d, 30).job.id == "c1"
    d.complete("c1", now=90)
    first = grant_of(d, 90)
    assert first.lease is not None
    expired = d.expire(first.lease.deadline)  # back to the head of its lane, attempt 2
    assert [e.requeued for e in expired] == [True]
    second = grant_of(d, 600)
    d.complete(second.job.id, now=650)
    grant_of(d, 700)  # this one stays running
    d.submit("e1", member="erin", model="m3", payload=request(), now=710)
    return d


def comparable(d: SizeOneDispatcher, now: float) -> dict[str, Any]:
    order = queued_ids(d, now)
    ids = [*order] if d.running is None else [*order, d.running.job.id]
    explanations = {job_id: d.explain(job_id, now=now) for job_id in ids}
    return {
        "order": order,
        "jobs": {job_id: d.job(job_id) for job_id in ids},
        "states": {job_id: d.state(job_id) for job_id in ids},
        "explained": {
            job_id: (e.lane_start, e.waited, e.score, e.position)
            for job_id, e in explanations.items()
        },
        "resident": d.resident_model,
        "running": d.running,
        "deadline": d.next_deadline(),
        "len": len(d),
    }


def test_snapshot_round_trips_through_json() -> None:
    d = busy_dispatcher()
    snap = d.snapshot(now=720)
    data = json.loads(json.dumps(snap))
    assert data == snap
    assert data["format"] == "prioqueue.dispatcher/1"
    assert data["taken_at"] == 720.0
    assert data["fair_share"] is True
    assert data["resident_model"] == d.resident_model
    running = d.running
    assert running is not None
    assert data["running"]["id"] == running.job.id
    r = Checked.restore(data, lease_for=LeaseCalculator())
    assert comparable(r, 720) == comparable(d, 720)
    assert r.running == d.running
    assert r.resident_model == d.resident_model
    assert r.fair_share is True
    for job_id in queued_ids(d, 720):
        assert r.explain(job_id, now=720).lane_start == d.explain(job_id, now=720).lane_start
        assert r.state(job_id) == "queued"
    assert r.state(running.job.id) == "running"
    # Counters restart at zero, the queue does not.
    stats = r.stats(now=720)
    assert (stats.dispatched, stats.completed, stats.queued) == (0, 0, len(d))
    assert stats.levels[0].queued == d.stats(now=720).levels[0].queued


def test_snapshot_keeps_a_requeued_job_at_the_head_with_its_attempt() -> None:
    d = make(lease_for=lambda job: 10.0)
    d.submit("a1", member="a", now=0)
    d.submit("a2", member="a", now=1)
    grant_of(d, 2)
    d.expire(12)
    data = json.loads(json.dumps(d.snapshot(now=12)))
    assert [(job["id"], job["attempt"]) for job in data["queued"]] == [("a1", 2), ("a2", 1)]
    r = Checked.restore(data, lease_for=lambda job: 10.0)
    grant = grant_of(r, 12)
    assert (grant.job.id, grant.attempt) == ("a1", 2)


def test_restore_dispatches_in_the_same_order_as_the_original() -> None:
    d = busy_dispatcher()
    data = json.loads(json.dumps(d.snapshot(now=720)))
    r = Checked.restore(data, lease_for=LeaseCalculator())
    running = d.running
    assert running is not None
    t = 720.0
    d.complete(running.job.id, now=t, runtime=20)
    r.complete(running.job.id, now=t, runtime=20)
    order = []
    while True:
        original, restored = d.dispatch(t), r.dispatch(t)
        assert restored == original
        if original is None:
            break
        order.append(original.job.id)
        t += 17
        assert r.complete(original.job.id, now=t) == d.complete(original.job.id, now=t)
    assert order == ["c2", "a2", "d1", "e1", "b2"]
    assert len(d) == len(r) == 0


def test_restore_with_now_shifts_every_time() -> None:
    d = busy_dispatcher()
    running = d.running
    assert running is not None
    assert running.lease is not None
    remaining = running.lease.remaining(720)
    before = {job_id: d.explain(job_id, now=720) for job_id in queued_ids(d, 720)}
    data = json.loads(json.dumps(d.snapshot(now=720)))
    r = Checked.restore(data, lease_for=LeaseCalculator(), now=10_720)
    shift = 10_000.0
    restored_running = r.running
    assert restored_running is not None
    assert restored_running.lease is not None
    assert restored_running.granted_at == running.granted_at + shift
    assert restored_running.waited == running.waited
    assert restored_running.lease.remaining(10_720) == remaining
    assert r.next_deadline() == running.lease.deadline + shift
    for job_id, explanation in before.items():
        after = r.explain(job_id, now=10_720)
        assert after.waited == explanation.waited  # the downtime is not counted
        assert after.lane_start == explanation.lane_start + shift
        assert after.score == explanation.score
        assert r.job(job_id).arrival == d.job(job_id).arrival + shift
    assert queued_ids(r, 10_720) == queued_ids(d, 720)
    # Times before the new now are refused: the clock starts at the restore time.
    with pytest.raises(ValueError, match="earlier than a time already seen"):
        r.dispatch(720)
    # The lease keeps running from where it stopped.
    assert r.expire(10_720 + remaining - 0.5) == []
    assert len(r.expire(10_720 + remaining)) == 1


def test_restore_to_an_earlier_clock() -> None:
    d = make()
    d.submit("j", member="m", now=5000)
    data = d.snapshot(now=5060)
    r = Checked.restore(data, now=60)
    explanation = r.explain("j", now=60)
    assert (explanation.waited, explanation.lane_start) == (60.0, 0.0)


def test_restore_of_an_idle_dispatcher_with_a_lease_less_running_job() -> None:
    d = make()
    d.set_resident_model("flux")
    d.submit("j", member="m", now=0)
    grant = grant_of(d, 1)
    data = json.loads(json.dumps(d.snapshot(now=2)))
    assert data["running"]["lease_seconds"] is None
    assert data["queued"] == []
    r = Checked.restore(data)
    assert r.running == grant
    assert r.next_deadline() is None
    assert r.resident_model == "flux"
    assert r.complete("j", now=3).runtime == 2.0


def test_restore_keeps_the_submission_counter() -> None:
    d = make()
    d.submit("a", member="m", now=0)
    d.submit("b", member="m", now=0)
    r = Checked.restore(json.loads(json.dumps(d.snapshot(now=0))))
    assert r.submit("c", member="m", now=1).job.seq == 3
    with pytest.raises(DuplicateJob):
        r.submit("a", member="m", now=1)


def test_restore_keeps_idle_lanes_virtual_start() -> None:
    d = make()
    d.submit("a1", member="a", now=0)
    d.submit("b1", member="b", now=0)
    d.submit("b2", member="b", now=0)
    d.submit("c1", member="c", now=0)  # keeps the level shared while b is charged
    grant_of(d, 0)
    d.complete("a1", now=100)  # a is idle with s = 100; b and c are backlogged with s = 0
    grant_of(d, 100)
    d.complete("b1", now=110)  # b: s = 10
    r = Checked.restore(json.loads(json.dumps(d.snapshot(now=110))))
    for x in (d, r):
        x.submit("a2", member="a", now=120)  # lift: max(100, min(120, 0)) = 100
        assert x.explain("a2", now=120).lane_start == 100.0
        assert drain(x, 120) == ["c1", "b2", "a2"]


def test_restore_payload_round_trip() -> None:
    d = make()
    payload = {"prompt": "a cat", "size": [512, 512], "nested": {"x": None}}
    d.submit("j", member="m", payload=payload, now=0)
    d.submit("s", member="m", payload="text", now=0)
    r = Checked.restore(json.loads(json.dumps(d.snapshot(now=0))))
    assert r.job("j").payload == payload
    assert r.job("s").payload == "text"


@pytest.mark.parametrize(
    "payload", [object(), {1, 2}, {"x": object()}, b"bytes", ImageRequest(width=8, height=8)]
)
def test_snapshot_of_a_non_json_payload_names_the_job(payload: Any) -> None:
    d = make()
    d.submit("fine", member="m", payload={"ok": 1}, now=0)
    d.submit("bad-job", member="m", payload=payload, now=0)
    with pytest.raises(TypeError, match="job 'bad-job' has a payload that is not JSON-serialis"):
        d.snapshot(now=1)
    assert len(d) == 2


def test_snapshot_of_a_running_job_with_a_non_json_payload() -> None:
    d = make()
    d.submit("run", member="m", payload=object(), now=0)
    grant_of(d, 0)
    with pytest.raises(TypeError, match="job 'run' has a payload"):
        d.snapshot(now=1)


def test_snapshot_rejects_time_going_backwards() -> None:
    d = make()
    d.submit("j", member="m", now=10)
    with pytest.raises(ValueError, match="earlier than a time already seen"):
        d.snapshot(now=5)


def _valid_snapshot() -> dict[str, Any]:
    d = make()
    d.submit("a", member="m", tier="pro", model="m1", estimate=3, now=0)
    d.submit("b", member="n", now=1)
    grant_of(d, 2)
    return cast(dict[str, Any], json.loads(json.dumps(d.snapshot(now=3))))


def _edit(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], Any]:
    def edit(state: dict[str, Any]) -> Any:
        target = state
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return state

    return edit


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_edit(("format",), "prioqueue.dispatcher/0"), "format is 'prioqueue.dispatcher/0', exp"),
        (_edit(("format",), KeyError), "format is None, expected 'prioqueue.dispatcher/1'"),
        (_edit(("queued",), KeyError), "KeyError"),
        (_edit(("lanes",), KeyError), "KeyError"),
        (_edit(("running",), KeyError), "KeyError"),
        (_edit(("seq",), KeyError), "KeyError"),
        (_edit(("taken_at",), KeyError), "KeyError"),
        (_edit(("taken_at",), "noon"), "taken_at must be a finite number"),
        (_edit(("queued", 0, "tier"), KeyError), "KeyError"),
        (_edit(("queued", 0, "arrival"), None), "arrival must be a finite number"),
        (_edit(("queued", 0, "id"), ""), "job id must be a non-empty str"),
        (_edit(("queued", 0, "id"), "a"), "job 'a' appears twice"),
        (_edit(("queued", 0, "estimate"), -1), "estimate must be a positive number"),
        (_edit(("queued", 0, "tier"), "gold"), "unknown tier 'gold'"),
        (_edit(("queued", 0, "priority"), "high"), "level must be an int, got 'high'"),
        (_edit(("lanes", 0, "s"), "early"), "lane s must be a finite number"),
        (_edit(("running", "granted_at"), KeyError), "KeyError"),
        (_edit(("running", "score"), {"band": 0}), "TypeError"),
        (_edit(("running", "lease_seconds"), -5), "seconds must be > 0"),
        (_edit(("queued",), None), "TypeError"),
        (lambda state: [state], "expected a mapping"),
    ],
)
def test_restore_rejects_an_invalid_snapshot(
    edit: Callable[[dict[str, Any]], Any], match: str
) -> None:
    state = edit(_valid_snapshot())
    with pytest.raises(ValueError, match=r"^invalid snapshot: .*" + match):
        Checked.restore(state)


def test_restore_with_a_scorer_that_lacks_a_tier() -> None:
    state = _valid_snapshot()  # the running job 'a' is a pro member's
    scorer = Scorer(ScoringConfig(tier_bonuses={"free": 0}))
    with pytest.raises(ValueError, match=r"^invalid snapshot: unknown tier 'pro'; known tiers"):
        Checked.restore(state, scorer=scorer)
    restored = Checked.restore(
        state, scorer=Scorer(ScoringConfig(tier_bonuses={"free": 0, "pro": 5}))
    )
    running = restored.running
    assert running is not None
    assert running.job.tier_bonus == 5  # looked up again with the new scorer


def test_restore_reports_a_bad_option_as_the_constructor_does() -> None:
    state = _valid_snapshot()
    with pytest.raises(ConfigError, match=r"^max_attempts must be an int >= 1"):
        Checked.restore(state, max_attempts=0)
    with pytest.raises(TypeError, match=r"^scorer must be a Scorer"):
        Checked.restore(state, scorer=cast(Any, "fast"))


def test_fair_share_off_snapshot_round_trip() -> None:
    d = make(fair_share=False)
    d.submit("a1", member="a", now=0)
    d.submit("a2", member="a", now=5)
    d.submit("b1", member="b", now=6)
    grant_of(d, 7)
    data = json.loads(json.dumps(d.snapshot(now=10)))
    assert data["fair_share"] is False
    assert data["lanes"] == []
    r = Checked.restore(data)
    assert r.fair_share is False
    assert r.running == d.running
    for x in (d, r):
        x.complete("a1", now=10)
        assert x.explain("a2", now=10).lane_start == 5.0
    assert drain(r, 10) == drain(d, 10) == ["a2", "b1"]


def test_restore_a_fair_share_off_snapshot_with_fair_share_on() -> None:
    d = make(fair_share=False)
    d.submit("a1", member="a", now=0)
    d.submit("a2", member="a", now=5)
    data = json.loads(json.dumps(d.snapshot(now=10)))
    r = Checked.restore(data, fair_share=True)
    assert r.fair_share is True
    assert math.isfinite(r.explain("a1", now=10).lane_start)
    assert drain(r, 10) == ["a1", "a2"]


def test_restore_a_snapshot_missing_a_lane_record() -> None:
    state = _valid_snapshot()
    state["lanes"] = [lane for lane in state["lanes"] if lane["member"] != "n"]
    with pytest.raises(ValueError, match=r"^invalid snapshot: "):
        Checked.restore(state)


# =========================================================================== fair share off


def test_fair_share_off_ages_each_job_from_its_arrival() -> None:
    d = make(fair_share=False)
    assert d.fair_share is False
    d.submit("a1", member="a", now=0)
    d.submit("a2", member="a", now=1)
    d.submit("a3", member="a", now=2)
    d.submit("b1", member="b", now=3)
    explanation = d.explain("a2", now=60)
    assert explanation.lane_start == 1.0
    assert explanation.score.aging == 59 / D
    grant_of(d, 60)
    d.complete("a1", now=1000)  # no charge: a2 still ages from its arrival
    assert d.explain("a2", now=1000).lane_start == 1.0
    assert d.explain("b1", now=1000).lane_start == 3.0
    assert drain(d, 1000) == ["a2", "a3", "b1"]


def test_fair_share_on_lets_another_member_overtake_a_backlog() -> None:
    # The counterpart of the test above: with fair share, b1 overtakes a's backlog.
    d = make()
    d.submit("a1", member="a", now=0)
    d.submit("a2", member="a", now=1)
    d.submit("a3", member="a", now=2)
    d.submit("b1", member="b", now=3)
    grant_of(d, 60)
    d.complete("a1", now=1000)
    assert drain(d, 1000) == ["b1", "a2", "a3"]


def test_fair_share_off_never_lets_a_later_job_overtake_at_equal_terms() -> None:
    d = make(fair_share=False)
    jobs = [(f"j{index}", f"m{index % 3}") for index in range(9)]
    for index, (job_id, member) in enumerate(jobs):
        d.submit(job_id, member=member, now=index)
    order = []
    t = 10.0
    while (grant := d.dispatch(t)) is not None:
        order.append(grant.job.id)
        t += 100 * (len(order) % 3 + 1)
        d.complete(grant.job.id, now=t)
    assert order == [job_id for job_id, _ in jobs]
    assert d.stats(now=t).levels[0].reorders == Reorders()


def test_fair_share_off_cancel_expire_and_tier() -> None:
    d = make(fair_share=False, lease_for=lambda job: 10.0, max_attempts=2)
    d.submit("a1", member="a", now=0)
    d.submit("a2", member="a", now=1)
    d.submit("p1", member="p", tier="pro", now=61)  # 1 point = 60 s of age
    d.cancel("a2", now=62)
    assert grant_of(d, 62).job.id == "a1"  # 0 - 0/60 > 1 - 61/60
    d.expire(72)
    assert d.explain("a1", now=72).lane_start == 0.0
    assert grant_of(d, 72).attempt == 2
    assert d.expire(82)[0].requeued is False
    assert grant_of(d, 82).job.id == "p1"
    d.cancel("p1", now=83)
    assert len(d) == 0
    assert d.dispatch(84) is None
    stats = d.stats(now=84)
    assert (stats.cancelled, stats.expired, stats.failed) == (2, 2, 1)
    assert stats.members["p"].gpu_seconds == 1.0


# =========================================================================== accessors


def test_len_contains_job_state_and_running() -> None:
    d = make()
    assert len(d) == 0
    assert 5 not in d
    assert None not in d
    d.submit("a", member="m", now=0)
    d.submit("b", member="m", now=0)
    assert (len(d), "a" in d, "b" in d) == (2, True, True)
    grant = grant_of(d, 0)
    assert len(d) == 1
    assert "a" in d
    assert d.running is grant
    assert d.state("a") == "running"
    assert d.state("b") == "queued"
    assert d.job("a") is grant.job
    for bad in ("zzz", 7, None):
        with pytest.raises(UnknownJob, match="is not queued or running"):
            d.job(cast(Any, bad))
        with pytest.raises(UnknownJob, match="is not queued or running"):
            d.state(cast(Any, bad))
    d.complete("a", now=1)
    assert "a" not in d
    assert d.running is None


def test_values_are_frozen() -> None:
    d = make()
    ticket = d.submit("a", member="m", now=0)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ticket.job.priority = 100  # type: ignore[misc]
    assert isinstance(d.stats(now=0).levels[0], LevelStats)


# =========================================================================== heavy use


def test_many_cycles_keep_every_structure_consistent() -> None:
    """Enough churn that the lazily deleted heaps and deques are compacted."""
    d = make(max_queued=500)
    d.set_resident_model("m0")
    t = 0.0
    order = []
    for index in range(150):
        model = f"m{index % 3}" if index % 4 else None
        d.submit(f"j{index}", member=f"u{index % 2}", model=model, estimate=5, now=t)
        if index % 5 == 0:
            d.submit(f"x{index}", member="canceller", model="m9", now=t)
            d.cancel(f"x{index}", now=t)
        grant = grant_of(d, t)
        order.append(grant.job.id)
        t += 1
        d.complete(grant.job.id, now=t, runtime=1)
    assert len(order) == 150
    assert len(d) == 0
    stats = d.stats(now=t)
    assert stats.dispatched == 150
    assert stats.cancelled == 30
    assert stats.levels[0].queued == 0
    assert stats.levels[0].oldest_wait == 0.0


def test_many_lanes_with_affinity_candidates() -> None:
    d = make()
    t = 0.0
    for index in range(120):
        d.submit(f"a{index}", member=f"u{index % 40}", model=f"m{index % 4}", now=t)
        t += 0.5
    for index in range(0, 120, 3):
        d.cancel(f"a{index}", now=t)
    grants = []
    resident = None
    while (grant := d.dispatch(t)) is not None:
        assert grant.swap == (grant.job.model != resident)
        resident = grant.job.model
        grants.append(grant)
        t += 2
        d.complete(grant.job.id, now=t)
    assert len(grants) == 80
    assert len({g.job.id for g in grants}) == 80
    assert d.stats(now=t).swaps == sum(g.swap for g in grants)


def test_submitting_a_new_model_into_a_backlogged_lane_makes_it_eligible() -> None:
    d = make()
    d.submit("a1", member="a", now=0)
    d.submit("b1", member="b", tier="max", now=0)
    d.submit("c1", member="c", tier="pro", now=0)  # c is the top lane without affinity
    assert grant_of(d, 0).job.id == "b1"  # every lane is ranked and up to date now
    d.submit("a2", member="a", model="m1", now=1)  # a's lane gets a candidate for m1
    d.submit("a3", member="a", model="m1", now=2)  # not the oldest for m1
    d.complete("b1", now=3)
    d.set_resident_model("m1")
    grant = grant_of(d, 3)
    assert (grant.job.id, grant.score.swap_affinity) == ("a2", 10)
    d.complete("a2", now=13)
    # a's lane (s = 10) still holds a3 for m1 within the window of its head a1.
    assert drain(d, 13) == ["a3", "c1", "a1"]


def test_lazy_deletion_heaps_are_compacted() -> None:
    """Stale heap items below the top are dropped once they outnumber live ones."""
    d = make()
    for index in range(150):
        d.submit(f"top{index}", member="boss", priority="interactive", now=0)
    d.submit("l0", member="lane", model="m1", now=0)
    t = 0.0
    for index in range(1, 150):
        d.cancel(f"l{index - 1}", now=t)
        # The lane is re-ranked at every dispatch; from the 70th on it asks for another model.
        d.submit(f"l{index}", member="lane", model="m1" if index < 70 else "m2", now=t)
        grant = grant_of(d, t)
        assert grant.job.id == f"top{index - 1}"
        t += 1
        d.complete(grant.job.id, now=t)
    live_lanes = 2
    bound = 2 * (4 * live_lanes + 64)  # rebuilt when stale items outnumber live ones
    for ranking in (d._core.lanes.ranking, *d._core.lanes.counterfactuals):
        assert len(ranking.main) < bound
        assert all(len(heap) < bound for heap in ranking.models.values())
    assert d.stats(now=t).cancelled == 149
    assert drain(d, t) == ["top149", "l149"]


def test_a_model_heap_whose_lanes_all_left_is_dropped() -> None:
    d = make()
    for index in range(80):
        d.submit(f"u{index}", member=f"u{index}", model="m1", now=0)
    first = grant_of(d, 0)  # every lane is ranked, each with a candidate for m1
    assert first.job.id == "u0"
    d.complete("u0", now=1)
    for index in range(1, 80):
        d.cancel(f"u{index}", now=1)
    d.submit("z", member="z", now=1)
    grant = grant_of(d, 1)
    assert (grant.job.id, grant.swap, d.resident_model) == ("z", False, "m1")
    d.complete("z", now=2)
    d.submit("y", member="y", now=2)
    d.submit("m", member="m", model="m1", now=3)
    grant = grant_of(d, 3)
    assert (grant.job.id, grant.score.swap_affinity) == ("m", 10)


def test_submit_refuses_an_unknown_option_by_name() -> None:
    """``submit(**options)`` names what ``SubmitOptions`` does not know (``check_options``)."""
    for d in (SizeOneDispatcher(), FleetDispatcher()):
        with pytest.raises(TypeError, match="'priorty'"):
            d.submit("a", member="m", now=0.0, priorty=5)  # type: ignore[call-arg]
        assert len(d) == 0


def test_jobspec_takes_exactly_the_submit_options() -> None:
    """``JobSpec.checked`` binds by keyword what ``SubmitOptions`` declares, no more, no less."""
    parameters = inspect.signature(JobSpec.checked).parameters.values()
    keywords = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == SUBMIT_OPTIONS
