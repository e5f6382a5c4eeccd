"""SizeOneDispatcher against the brute-force reference model, step by random step.

One algorithm, one reference model: ``SizeOneDispatcher`` is a fleet of one worker, and
``ReferenceDispatcher`` is ``ReferenceFleet`` (the model of ``docs/design/fleet.md``) with one
worker behind the size-one API, so this machine checks the fleet model at ``N = 1``.

A Hypothesis state machine submits, dispatches, completes, cancels, expires, changes the
resident model and moves a manual clock, calling both dispatchers with the same arguments. After
every step it checks that they agree on every answer (same winner, same score breakdown, same
exception type for a bad call, same statistics), that no job is granted twice in one attempt or
lost, that the statistics match the history the test recorded itself, and the real dispatcher's
own ``_check()``. Subclasses rerun it without fair share and with other charge models.

Times, runtimes and estimates are dyadic (see ``strategies``), so both sides compute exactly
the same floats and any difference in a decision is a difference in the rules.
"""

from __future__ import annotations

import math
import os
from typing import Any, ClassVar

import attrs
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from prioqueue.dispatcher import ChargeModel, SizeOneDispatcher
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.records import Completed, Expired, Grant, Job, Stats, Ticket
from prioqueue.scoring import Scorer
from prioqueue.testing import ManualClock, ReferenceDispatcher
from strategies import (
    dispatcher_job_specs,
    dispatcher_models,
    dispatcher_runtimes,
    dispatcher_scorers,
    time_steps,
)

#: Examples per state machine; set PRIOQUEUE_STATEFUL_EXAMPLES for a longer hunt.
EXAMPLES = int(os.environ.get("PRIOQUEUE_STATEFUL_EXAMPLES", "60"))

SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

TERMINAL = ("done", "cancelled", "failed", "expired")

BACKOFFS = (None, Backoff(), Backoff(kind="exponential", base=16.0, max=64.0, jitter=True))
BUDGETS = (
    None,
    {0: LevelBudget(max_queued=2)},
    {0: LevelBudget(ttl=600.0), 100: LevelBudget(max_wait=60.0, ttl=120.0)},
)


def _lease_for(job: Job) -> float:
    """Leases long enough to finish most jobs, short enough that the clock passes some."""
    return 480.0 if job.estimate is None else 2.0 * job.estimate


def _half_runtime(job: Job, runtime: float) -> float:
    return runtime / 2 + (1.0 if job.model is None else 0.0)


def _norm(value: Any) -> Any:
    """Forget submission sequence numbers (their origin is an implementation detail)."""
    if isinstance(value, Job):
        return attrs.evolve(value, seq=0)
    if isinstance(value, (Grant, Ticket, Completed, Expired)):
        return attrs.evolve(value, job=_norm(value.job))
    if isinstance(value, list):
        return [_norm(item) for item in value]
    return value


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


@attrs.define
class _Submission:
    job_id: str
    member: str
    status: str = "queued"
    level: int | None = None
    attempts: int = 0
    deadline: float | None = None  # its ttl: past it, a queued job is "lapsed" until reported


class DispatcherComparison(RuleBasedStateMachine):
    """Fair share on, runtime charges, leases sometimes."""

    fair_share: ClassVar[bool] = True
    max_queued: ClassVar[int | None] = None
    max_queued_per_member: ClassVar[int | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000.0)
        self.real = SizeOneDispatcher()
        self.ref = ReferenceDispatcher()
        self.subs: list[_Submission] = []
        self.live: dict[str, _Submission] = {}  # id -> its queued or running submission
        self.next_id = 0
        self.latest = -math.inf  # the largest now of a call that succeeded
        self.grants: list[Grant] = []
        self.counts = {
            "completed": 0, "cancelled": 0, "expired": 0, "failed": 0, "ttl_expired": 0,
            "retried": 0,
        }  # fmt: skip
        self.fired = -math.inf  # the latest now at which both dispatchers fired their timers
        self.ready = False
        self.window = 0.0

    # -- set-up and helpers ----------------------------------------------------------------

    @initialize(
        scorer=dispatcher_scorers(),
        max_attempts=st.integers(1, 3),
        leases=st.booleans(),
        specs=st.lists(dispatcher_job_specs(), max_size=8),
        backoff=st.sampled_from(BACKOFFS),
        budgets=st.sampled_from(BUDGETS),
    )
    def build(
        self,
        scorer: Scorer,
        max_attempts: int,
        leases: bool,
        specs: list[dict[str, Any]],
        backoff: Backoff | None,
        budgets: dict[int, LevelBudget] | None,
    ) -> None:
        options: dict[str, Any] = {
            "charge": self.charge_model(),
            "lease_for": _lease_for if leases else None,
            "max_queued": self.max_queued,
            "max_queued_per_member": self.max_queued_per_member,
            "max_attempts": max_attempts,
            "fair_share": self.fair_share,
            "backoff": backoff,
            "budgets": budgets,
        }
        self.window = scorer.config.max_affinity * scorer.config.aging_divisor
        self.real = SizeOneDispatcher(scorer, **options)
        self.ref = ReferenceDispatcher(scorer, **options)
        self.ready = True
        for spec in specs:
            self.submit_one(spec)

    def charge_model(self) -> ChargeModel:
        """The charge model both dispatchers use (subclasses override it)."""
        return "runtime"

    def both(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
        """Call ``name`` on both dispatchers; check they agree; return the reference's answer."""
        now = kwargs.get("now", args[0] if name in ("dispatch", "expire") and args else None)
        if isinstance(now, float) and now >= self.fired:
            self._mark(now)  # both fire their timers first thing
        answers: list[tuple[Any, BaseException | None]] = []
        for target in (self.real, self.ref):
            try:
                answers.append((getattr(target, name)(*args, **kwargs), None))
            except Exception as error:  # compared below
                answers.append((None, error))
        (real, real_error), (ref, ref_error) = answers
        call = f"{name}(*{args!r}, **{kwargs!r})"
        note(f"{call} -> real {real!r} / {real_error!r}; reference {ref!r} / {ref_error!r}")
        assert type(real_error) is type(ref_error), (
            f"{call}: real raised {real_error!r}, reference raised {ref_error!r}"
        )
        assert _norm(real) == _norm(ref), f"{call}: real {real!r} != reference {ref!r}"
        if ref_error is None and "now" in kwargs:
            self.latest = max(self.latest, kwargs["now"])
        if ref_error is None and args and name in ("dispatch", "expire"):
            self.latest = max(self.latest, args[0])
        return ref, ref_error

    def _mark(self, now: float) -> None:
        """Timers due at ``now`` fired: a queued job past its deadline is gone, unreported."""
        self.fired = max(self.fired, now)
        for sub in self.live.values():
            if sub.status == "queued" and sub.deadline is not None and sub.deadline <= now:
                sub.status = "lapsed"
                self.counts["ttl_expired"] += 1  # counted when it leaves, reported later

    def _known(self) -> list[str]:
        """The ids the dispatchers know (queued, delayed or running; not lapsed)."""
        return sorted(job_id for job_id, sub in self.live.items() if sub.status != "lapsed")

    def _status(self, status: str) -> list[_Submission]:
        return [sub for sub in self.live.values() if sub.status == status]

    def _eligible(self) -> list[_Submission]:
        """The queued jobs in a lane (not delayed)."""
        return [s for s in self._status("queued") if self.real.not_before(s.job_id) is None]

    def _end(self, sub: _Submission, status: str) -> None:
        sub.status = status
        del self.live[sub.job_id]

    # -- rules: submitting -----------------------------------------------------------------

    def submit_one(self, spec: dict[str, Any], *, reuse: bool = False) -> None:
        """Submit one job to both (a fresh id, or the id of a finished job when ``reuse``)."""
        finished = [s.job_id for s in self.subs if s.status in TERMINAL]
        finished = [job_id for job_id in finished if job_id not in self.live]
        if reuse and finished:
            job_id = finished[0]  # an id whose job is gone may be used again
        else:
            job_id = f"j{self.next_id}"
            self.next_id += 1
        payload = {"n": self.next_id}
        ticket, error = self.both("submit", job_id, payload=payload, now=self.clock(), **spec)
        if error is None:
            job = ticket.job
            sub = _Submission(job_id, spec["member"], level=job.priority, deadline=job.deadline)
            self.subs.append(sub)
            self.live[job_id] = sub

    @precondition(lambda self: self.ready)
    @rule(spec=dispatcher_job_specs(), reuse=st.booleans())
    def submit(self, spec: dict[str, Any], reuse: bool) -> None:
        self.submit_one(spec, reuse=reuse)

    @precondition(lambda self: self.ready)
    @rule(specs=st.lists(dispatcher_job_specs(), min_size=2, max_size=8))
    def submit_burst(self, specs: list[dict[str, Any]]) -> None:
        for spec in specs:
            self.submit_one(spec)

    @precondition(lambda self: self.ready and self._status("queued"))
    @rule(data=st.data(), model=dispatcher_models(), past_the_edge=st.booleans())
    def submit_at_window_edge(
        self, data: st.DataObject, model: str | None, past_the_edge: bool
    ) -> None:
        """Add a job to a backlogged lane exactly at (or just past) its affinity window."""
        subs = sorted(self._status("queued"), key=lambda s: s.job_id)
        sub = data.draw(st.sampled_from(subs))
        assert sub.level is not None
        lane = self.ref.lane_jobs(sub.member, sub.level)
        if not lane:  # a delayed job: in no lane yet
            return
        head = lane[0]
        edge = head.arrival + self.window + (0.25 if past_the_edge else 0.0)
        if edge < self.clock():
            return
        self.clock.jump_to(edge)
        spec = {"member": head.member, "priority": head.priority, "tier": head.tier}
        self.submit_one({**spec, "model": model or self.ref.resident_model, "estimate": None})

    @precondition(lambda self: self.ready)
    @rule(
        spec=dispatcher_job_specs(),
        ttl=st.sampled_from([None, 0.5, 60.0, 600.0]),
        delay=st.sampled_from([None, 0.0, 30.0, 900.0]),
        max_attempts=st.sampled_from([None, 1, 3]),
        backoff=st.sampled_from(BACKOFFS),
    )
    def submit_with_a_lifecycle(
        self,
        spec: dict[str, Any],
        ttl: float | None,
        delay: float | None,
        max_attempts: int | None,
        backoff: Backoff | None,
    ) -> None:
        not_before = None if delay is None else self.clock() + delay
        extra = {"ttl": ttl, "not_before": not_before, "max_attempts": max_attempts}
        self.submit_one({**spec, **extra, "backoff": backoff})

    @precondition(lambda self: self.ready and self.live)
    @rule(data=st.data(), retry=st.booleans())
    def fail(self, data: st.DataObject, retry: bool) -> None:
        """The running job failed (retried while attempts remain), or a queued one is failed."""
        sub = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda s: s.job_id)))
        was = sub.status
        _, error = self.both("fail", sub.job_id, now=self.clock(), retry=retry)
        if error is not None:
            return
        if sub.job_id in self.real:
            assert retry
            assert was == "running"
            assert self.real.not_before(sub.job_id) == self.ref.not_before(sub.job_id)
            self.counts["retried"] += 1
            sub.status = "queued"
        else:
            self.counts["failed"] += 1
            self._end(sub, "failed")

    @precondition(lambda self: self.ready and self._known())
    @rule(data=st.data())
    def submit_duplicate(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._known()))
        _, error = self.both("submit", job_id, member="ann", now=self.clock())
        assert error is not None

    @precondition(lambda self: self.ready)
    @rule(bad=st.sampled_from(["tier", "member", "estimate", "priority"]))
    def submit_bad_argument(self, bad: str) -> None:
        kwargs: dict[str, Any] = {"member": "ann", "now": self.clock()}
        if bad == "tier":
            kwargs["tier"] = "platinum"
        elif bad == "member":
            kwargs["member"] = ""
        elif bad == "estimate":
            kwargs["estimate"] = -1.0
        else:
            kwargs["priority"] = 1.5
        _, error = self.both("submit", f"bad{self.next_id}", **kwargs)
        assert error is not None

    # -- rules: running --------------------------------------------------------------------

    @precondition(lambda self: self.ready)
    @rule()
    def dispatch(self) -> None:
        self.dispatch_both()

    def dispatch_both(self) -> None:
        """Dispatch on both and check the grant against the recorded history."""
        grant, _ = self.both("dispatch", self.clock())
        if grant is None:
            assert self._status("running") or not self._eligible(), "idle but no grant"
            return
        sub = self.live[grant.job.id]
        assert sub.status == "queued", f"granted a {sub.status} job"
        assert not self._status("running"), "granted while a job runs"
        assert grant.attempt == sub.attempts + 1, "a job granted twice in one attempt"
        sub.attempts = grant.attempt
        sub.status = "running"
        self.grants.append(grant)

    @precondition(lambda self: self.ready)
    @rule(step=time_steps(), runtime=dispatcher_runtimes())
    def serve(self, step: float, runtime: float | None) -> None:
        """What an adapter's loop does: time passes, leases expire, the job ends, next one."""
        self.clock.advance(step)
        self.expire()
        if self.ref.running is not None:
            self.complete(runtime)
        self.dispatch_both()

    @precondition(lambda self: self.ready and self.ref.running is not None)
    @rule(runtime=dispatcher_runtimes())
    def complete(self, runtime: float | None) -> None:
        sub = self._status("running")[0]
        done, error = self.both("complete", sub.job_id, now=self.clock(), runtime=runtime)
        if error is None:
            assert done.job.id == sub.job_id
            self.counts["completed"] += 1
            self._end(sub, "done")

    @precondition(lambda self: self.ready)
    @rule(data=st.data())
    def complete_not_running(self, data: st.DataObject) -> None:
        ids = [s.job_id for s in self._status("queued")] + ["nobody"]
        ids += [s.job_id for s in self.subs if s.job_id not in self.live]
        _, error = self.both("complete", data.draw(st.sampled_from(ids)), now=self.clock())
        assert error is not None

    @precondition(lambda self: self.ready and self.live)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        sub = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda s: s.job_id)))
        _, error = self.both("cancel", sub.job_id, now=self.clock())
        if error is None:
            self.counts["cancelled"] += 1
            self._end(sub, "cancelled")

    @precondition(lambda self: self.ready)
    @rule()
    def cancel_unknown(self) -> None:
        _, error = self.both("cancel", "nobody", now=self.clock())
        assert error is not None

    @precondition(lambda self: self.ready)
    @rule()
    def expire(self) -> None:
        now = self.clock()
        expired, _ = self.both("expire", now)
        assert len([e for e in expired if e.cause != "ttl"]) <= 1
        for record in expired:
            sub = self.live[record.job.id]
            if record.cause == "ttl":
                assert sub.status in ("queued", "lapsed")  # queued: requeued in this call
                assert record.deadline == sub.deadline
                assert record.deadline <= now
                assert record.attempt == sub.attempts + 1
                self.counts["ttl_expired"] += sub.status == "queued"
                self._end(sub, "expired")
                continue
            assert sub.status == "running"
            assert record.attempt == sub.attempts
            self.counts["expired"] += 1
            if record.requeued:
                sub.status = "queued"
            else:
                self.counts["failed"] += 1
                self._end(sub, "failed")

    # -- rules: the world ------------------------------------------------------------------

    @precondition(lambda self: self.ready)
    @rule(model=dispatcher_models())
    def set_resident_model(self, model: str | None) -> None:
        self.both("set_resident_model", model)

    @precondition(lambda self: self.ready)
    @rule(step=time_steps())
    def advance(self, step: float) -> None:
        self.clock.advance(step)

    @precondition(lambda self: self.ready and self.latest > -math.inf)
    @rule(call=st.sampled_from(["submit", "dispatch", "expire"]))
    def time_goes_backwards(self, call: str) -> None:
        before = self.latest - 0.5
        if call == "submit":
            _, error = self.both("submit", "late", member="ann", now=before)
        else:
            _, error = self.both(call, before)
        assert isinstance(error, ValueError)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def real_invariants_hold(self) -> None:
        if self.ready:
            self.real._check()

    @invariant()
    def same_state(self) -> None:
        if not self.ready:
            return
        assert len(self.real) == len(self.ref) == len(self._status("queued"))
        assert _norm(self.real.running) == _norm(self.ref.running)
        assert self.real.resident_model == self.ref.resident_model
        assert self.real.next_deadline() == self.ref.next_deadline()
        for job_id, sub in self.live.items():  # nothing lost: every live job is where we think
            if sub.status == "lapsed":  # gone at its deadline, until expire reports it
                assert job_id not in self.real
                assert job_id not in self.ref
                continue
            assert job_id in self.real
            assert self.real.state(job_id) == self.ref.state(job_id) == sub.status
        for sub in self.subs:
            if sub.job_id not in self.live:
                assert sub.job_id not in self.real
                assert sub.status in TERMINAL
        statuses = [sub.status for sub in self.subs]
        kinds = ("queued", "running", "lapsed", *TERMINAL)
        assert len(statuses) == sum(statuses.count(s) for s in kinds)

    @invariant()
    def same_stats(self) -> None:
        if not self.ready:
            return
        now = self.clock()
        real, ref = self.real.stats(now=now), self.ref.stats(now=now)
        self._mark(now)
        _compare_stats(real, ref)
        # ... and both agree with the history this test recorded.
        assert ref.dispatched == len(self.grants)
        assert ref.swaps == sum(grant.swap for grant in self.grants)
        for name, count in self.counts.items():
            assert getattr(ref, name) == count, name
        assert ref.queued == len(self._status("queued"))
        assert (ref.running is None) == (not self._status("running"))
        for level, stats in ref.levels.items():
            assert stats.dispatched == sum(g.job.priority == level for g in self.grants)
            assert stats.queued == sum(s.level == level for s in self._eligible())
        for member, member_stats in ref.members.items():
            assert member_stats.dispatched == sum(g.job.member == member for g in self.grants)
            queued = self._eligible()
            assert member_stats.queued == sum(s.member == member for s in queued)


def _compare_stats(real: Stats, ref: Stats) -> None:
    exact = (
        "now", "queued", "dispatched", "completed", "cancelled", "expired", "failed", "swaps",
        "ttl_expired", "refused", "retried", "delayed",
    )  # fmt: skip
    for name in exact:
        assert getattr(real, name) == getattr(ref, name), name
    assert real.resident_model == ref.resident_model
    assert _norm(real.running) == _norm(ref.running)
    assert list(real.levels) == list(ref.levels), "levels (highest first)"
    for level, a in real.levels.items():
        b = ref.levels[level]
        assert (a.level, a.queued, a.dispatched) == (b.level, b.queued, b.dispatched), level
        assert (a.ttl_expired, a.refused, a.delayed) == (b.ttl_expired, b.refused, b.delayed)
        assert a.reorders == b.reorders, (level, a.reorders, b.reorders)
        assert a.wait_buckets == b.wait_buckets, level
        for name in ("oldest_wait", "mean_wait", "total_wait"):
            assert _close(getattr(a, name), getattr(b, name)), (level, name)
    assert sorted(real.members) == sorted(ref.members)
    for member, m in real.members.items():
        n = ref.members[member]
        assert (m.queued, m.dispatched, m.completed) == (n.queued, n.dispatched, n.completed)
        assert _close(m.gpu_seconds, n.gpu_seconds), member


class WithoutFairShare(DispatcherComparison):
    """Every job its own lane aging from its arrival (the ablation)."""

    fair_share = False


class CountCharge(DispatcherComparison):
    """Count-based fairness: every finished job costs its lane the same 60 s."""

    def charge_model(self) -> ChargeModel:
        return 60.0


class EstimateChargeWithLimits(DispatcherComparison):
    """Charges from estimates, and both queue limits in force."""

    max_queued = 6
    max_queued_per_member = 3

    def charge_model(self) -> ChargeModel:
        return "estimate"


class CallableCharge(DispatcherComparison):
    """A charge callable (half the runtime, plus a second for jobs without a model)."""

    def charge_model(self) -> ChargeModel:
        return _half_runtime


TestFairShare = DispatcherComparison.TestCase
TestFairShare.settings = SETTINGS
TestWithoutFairShare = WithoutFairShare.TestCase
TestWithoutFairShare.settings = SETTINGS
TestCountCharge = CountCharge.TestCase
TestCountCharge.settings = SETTINGS
TestEstimateChargeWithLimits = EstimateChargeWithLimits.TestCase
TestEstimateChargeWithLimits.settings = SETTINGS
TestCallableCharge = CallableCharge.TestCase
TestCallableCharge.settings = SETTINGS
