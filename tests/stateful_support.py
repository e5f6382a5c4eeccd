"""The one stateful harness: a real dispatcher beside its brute-force reference, step by step.

``Comparison`` is a Hypothesis state machine that calls a real dispatcher and its reference
model (``prioqueue.testing``) with the same arguments, checks after every call that they agree
(the same answer, the same exception type for a bad call), records the history itself (who was
submitted, granted, finished) and checks both against that history. Its rules and invariants
are the ones every dispatcher shares: submitting (bursts, lifecycles, duplicates, bad
arguments), failing, cancelling, completing what is not held, expiring, moving the clock and
sending time backwards; nothing lost, nothing doubled, the statistics.

Two subclasses drive it: ``tests/test_dispatcher_stateful.py`` (``SizeOneDispatcher`` against
``ReferenceDispatcher``: a fleet of one, granting by ``dispatch``) and
``tests/test_fleet_stateful.py`` (``FleetDispatcher`` against ``ReferenceFleet``: workers join,
pop, leave and time out). A subclass builds both dispatchers in its ``@initialize`` rule and
says how it differs in a few class attributes and hooks (``workers_named``, ``backoffs``,
``call_in_the_past``, ``compare_stats``).

Times, runtimes and estimates are dyadic (see ``strategies``), so both sides compute exactly the
same floats and any difference in a decision is a difference in the rules.
``PRIOQUEUE_STATEFUL_EXAMPLES`` sets the examples per machine (``settings_for``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from prioqueue.dispatcher import ChargeModel
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.records import Completed, Expired, Grant, Job, Stats, Ticket
from prioqueue.scoring import Scorer
from prioqueue.testing import ManualClock
from strategies import dispatcher_job_specs, dispatcher_scorers, time_steps

TERMINAL = ("done", "cancelled", "failed", "expired")
COUNTS = ("completed", "cancelled", "expired", "failed", "ttl_expired", "retried")


def settings_for(examples: int, steps: int) -> settings:
    """A machine's settings: ``examples`` runs (``PRIOQUEUE_STATEFUL_EXAMPLES`` overrides it)
    of up to ``steps`` steps each."""
    return settings(
        max_examples=int(os.environ.get("PRIOQUEUE_STATEFUL_EXAMPLES", str(examples))),
        stateful_step_count=steps,
        suppress_health_check=[HealthCheck.filter_too_much],
    )


def machine_tests(
    *machines: type[RuleBasedStateMachine],
    machine_settings: settings,
    marks: tuple[pytest.MarkDecorator, ...] = (),
) -> Any:
    """A test that runs each of ``machines`` with ``machine_settings``: one parametrised case
    per machine, named after its class, each with ``marks``."""
    cases = [pytest.param(machine, id=machine.__name__, marks=marks) for machine in machines]

    @pytest.mark.parametrize("machine", cases)
    def test_machine(machine: type[RuleBasedStateMachine]) -> None:
        run_state_machine_as_test(machine, settings=machine_settings)

    return test_machine


def long_hunts(*machines: type[RuleBasedStateMachine], examples: int, steps: int) -> Any:
    """A ``slow`` test (``nox -s slow``) that runs each of ``machines`` ``examples`` times.

    The default run of each machine is short (``nox`` stays under ten minutes); this is the long
    hunt for rare sequences, one parametrised case per machine.
    """
    hunt = settings(settings_for(examples, steps), max_examples=examples)
    return machine_tests(*machines, machine_settings=hunt, marks=(pytest.mark.slow,))


def norm(value: Any) -> Any:
    """Forget submission sequence numbers (their origin is an implementation detail)."""
    if isinstance(value, Job):
        return attrs.evolve(value, seq=0)
    if isinstance(value, (Grant, Ticket, Completed, Expired)):
        return attrs.evolve(value, job=norm(value.job))
    if isinstance(value, (list, tuple)):
        return [norm(item) for item in value]
    return value


def close(a: float, b: float) -> bool:
    """Equal up to float rounding (sums of waits and charges)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def half_runtime(job: Job, runtime: float) -> float:
    """A charge callable: half the runtime, plus a second for jobs without a model."""
    return runtime / 2 + (1.0 if job.model is None else 0.0)


@attrs.define
class Submission:
    """What the harness recorded of one accepted submit."""

    job_id: str
    member: str
    status: str = "queued"
    level: int | None = None
    attempts: int = 0
    holder: str | None = None  # the worker holding it (fleets only)
    lost_by: list[str] = attrs.field(factory=list)  # workers that held it and lost it
    deadline: float | None = None  # its ttl: past it, a queued job is "lapsed" until reported


class Comparison(RuleBasedStateMachine):
    """The rules and invariants every dispatcher shares; subclasses build the two sides."""

    fair_share: ClassVar[bool] = True
    max_queued: ClassVar[int | None] = None
    max_queued_per_member: ClassVar[int | None] = None
    #: Calls that take ``now`` as their first positional argument.
    now_positional: ClassVar[tuple[str, ...]] = ("expire",)
    #: Whether grants name a worker (a fleet), so that a held job has a holder.
    workers_named: ClassVar[bool] = False
    #: The most leases one ``expire`` may take back (None: no bound).
    max_taken: ClassVar[int | None] = None
    #: What ``build`` and ``submit_with_a_lifecycle`` draw from.
    backoffs: ClassVar[tuple[Backoff | None, ...]] = (None,)
    budgets: ClassVar[tuple[dict[int, LevelBudget] | None, ...]] = (None,)
    max_attempts: ClassVar[tuple[int | None, ...]] = (None,)
    #: The calls ``time_goes_backwards`` makes (see ``call_in_the_past``).
    backwards_calls: ClassVar[tuple[str, ...]] = ("submit", "expire")

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000.0)
        self.real: Any = None
        self.ref: Any = None
        self.subs: list[Submission] = []
        self.live: dict[str, Submission] = {}  # id -> its queued or held submission
        self.next_id = 0
        self.latest = -math.inf  # the largest now of a call that succeeded
        self.grants: list[Grant] = []
        self.counts = dict.fromkeys(COUNTS, 0)
        self.fired = -math.inf  # the latest now at which both dispatchers fired their timers
        self.ready = False

    # -- set-up ------------------------------------------------------------------------------

    @initialize(
        scorer=dispatcher_scorers(),
        max_attempts=st.integers(1, 3),
        leases=st.booleans(),
        specs=st.lists(dispatcher_job_specs(), max_size=8),
        data=st.data(),
    )
    def build(
        self,
        scorer: Scorer,
        max_attempts: int,
        leases: bool,
        specs: list[dict[str, Any]],
        data: st.DataObject,
    ) -> None:
        """Build both dispatchers with the same options, start them, submit ``specs``."""
        options: dict[str, Any] = {
            "charge": self.charge_model(),
            "lease_for": self.lease_for() if leases else None,
            "max_queued": self.max_queued,
            "max_queued_per_member": self.max_queued_per_member,
            "max_attempts": max_attempts,
            "fair_share": self.fair_share,
            "backoff": data.draw(st.sampled_from(self.backoffs), label="backoff"),
            "budgets": data.draw(st.sampled_from(self.budgets), label="budgets"),
            **self.more_options(data),
        }
        self.real, self.ref = self.make(scorer, options)
        self.ready = True
        self.start(data)
        for spec in specs:
            self.submit_one(spec)

    # -- hooks -------------------------------------------------------------------------------

    def make(self, scorer: Scorer, options: dict[str, Any]) -> tuple[Any, Any]:
        """The real dispatcher and its reference, both built with ``options``."""
        raise NotImplementedError

    def lease_for(self) -> Callable[..., float]:
        """The ``lease_for`` both dispatchers get when the machine draws leases."""
        raise NotImplementedError

    def more_options(self, data: st.DataObject) -> dict[str, Any]:
        """Options only this kind of dispatcher takes (drawn from ``data``)."""
        return {}

    def start(self, data: st.DataObject) -> None:
        """What happens once both are built, before the first jobs arrive."""

    def charge_model(self) -> ChargeModel:
        """The charge model both dispatchers use (subclasses override it)."""
        return "runtime"

    def can_go_back(self) -> bool:
        """Whether ``time_goes_backwards`` has something to call."""
        return True

    def call_in_the_past(self, call: str, before: float) -> BaseException | None:
        """Make ``call`` (one of ``backwards_calls``) at ``before``; return its error."""
        if call == "submit":
            return self.both("submit", "late", member="ann", now=before)[1]
        return self.both(call, before)[1]

    def compare_stats(self, real: Stats, ref: Stats) -> None:
        """Check that the two statistics agree (subclasses add what only they have)."""
        exact = (
            "now", "queued", "dispatched", "completed", "cancelled", "expired", "failed",
            "swaps", "ttl_expired", "refused", "retried", "delayed",
        )  # fmt: skip
        for name in exact:
            assert getattr(real, name) == getattr(ref, name), name
        assert norm(real.running) == norm(ref.running)
        assert list(real.levels) == list(ref.levels), "levels (highest first)"
        for level, a in real.levels.items():
            b = ref.levels[level]
            assert (a.level, a.queued, a.dispatched) == (b.level, b.queued, b.dispatched), level
            assert (a.ttl_expired, a.refused, a.delayed) == (b.ttl_expired, b.refused, b.delayed)
            assert a.reorders == b.reorders, (level, a.reorders, b.reorders)
            assert a.wait_buckets == b.wait_buckets, level
            for name in ("oldest_wait", "mean_wait", "total_wait"):
                assert close(getattr(a, name), getattr(b, name)), (level, name)
        assert sorted(real.members) == sorted(ref.members)
        for member, m in real.members.items():
            n = ref.members[member]
            assert (m.queued, m.dispatched, m.completed) == (n.queued, n.dispatched, n.completed)
            assert close(m.gpu_seconds, n.gpu_seconds), member

    def check_history(self, ref: Stats) -> None:
        """Check the reference's statistics against the recorded history (subclasses add)."""
        assert ref.dispatched == len(self.grants)
        assert ref.swaps == sum(grant.swap for grant in self.grants)
        for name, count in self.counts.items():
            assert getattr(ref, name) == count, name
        assert ref.queued == len(self._status("queued"))
        for member, member_stats in ref.members.items():
            assert member_stats.dispatched == sum(g.job.member == member for g in self.grants)

    # -- helpers -----------------------------------------------------------------------------

    def both(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
        """Call ``name`` on both dispatchers; check they agree; return the reference's answer."""
        now = kwargs.get("now", args[0] if name in self.now_positional and args else None)
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
        assert norm(real) == norm(ref), f"{call}: real {real!r} != reference {ref!r}"
        if ref_error is None and "now" in kwargs:
            self.latest = max(self.latest, kwargs["now"])
        if ref_error is None and args and name in self.now_positional:
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
        """The ids the dispatchers know (queued, delayed or held; not lapsed)."""
        return sorted(job_id for job_id, sub in self.live.items() if sub.status != "lapsed")

    def _status(self, status: str) -> list[Submission]:
        return sorted(
            (sub for sub in self.live.values() if sub.status == status), key=lambda s: s.job_id
        )

    def _live(self) -> list[Submission]:
        return sorted(self.live.values(), key=lambda s: s.job_id)

    def _end(self, sub: Submission, status: str) -> None:
        sub.status = status
        sub.holder = None
        del self.live[sub.job_id]

    def _lose(self, sub: Submission) -> None:
        """The job went back to the queue: its holder (a fleet's worker) lost it."""
        assert sub.status == "running"
        assert (sub.holder is not None) == self.workers_named, sub
        if sub.holder is not None:
            sub.lost_by.append(sub.holder)
        sub.holder = None
        sub.status = "queued"

    def _named(self, sub: Submission, named: bool) -> dict[str, Any]:
        """``worker=`` the holder, for a call that names it (a fleet's worker reporting)."""
        return {"worker": sub.holder} if named and sub.holder is not None else {}

    def record_grant(self, grant: Grant, holder: str | None) -> Submission:
        """Check a grant against the recorded history and record it."""
        sub = self.live[grant.job.id]
        assert sub.status == "queued", f"granted a {sub.status} job (held by {sub.holder})"
        assert grant.attempt == sub.attempts + 1, "a job granted twice in one attempt"
        sub.attempts = grant.attempt
        sub.status = "running"
        sub.holder = holder
        self.grants.append(grant)
        return sub

    # -- rules: submitting -------------------------------------------------------------------

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
            level, deadline = ticket.job.priority, ticket.job.deadline
            sub = Submission(job_id, spec["member"], level=level, deadline=deadline)
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

    @precondition(lambda self: self.ready)
    @rule(
        spec=dispatcher_job_specs(),
        ttl=st.sampled_from([None, 0.5, 60.0, 600.0]),
        delay=st.sampled_from([None, 0.0, 30.0, 900.0]),
        data=st.data(),
    )
    def submit_with_a_lifecycle(
        self, spec: dict[str, Any], ttl: float | None, delay: float | None, data: st.DataObject
    ) -> None:
        max_attempts = data.draw(st.sampled_from(self.max_attempts), label="max_attempts")
        backoff = data.draw(st.sampled_from(self.backoffs), label="backoff")
        not_before = None if delay is None else self.clock() + delay
        extra = {"ttl": ttl, "not_before": not_before, "max_attempts": max_attempts}
        self.submit_one({**spec, **extra, "backoff": backoff})

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

    # -- rules: finishing --------------------------------------------------------------------

    def complete_one(self, sub: Submission, runtime: float | None, *, named: bool) -> None:
        """Complete a held job on both (its holder named when ``named``)."""
        kwargs = self._named(sub, named)
        done, error = self.both("complete", sub.job_id, now=self.clock(), runtime=runtime, **kwargs)
        if error is None:
            assert done.job.id == sub.job_id
            self.counts["completed"] += 1
            self._end(sub, "done")

    @precondition(lambda self: self.ready and self.live)
    @rule(data=st.data(), retry=st.booleans(), named=st.booleans())
    def fail(self, data: st.DataObject, retry: bool, named: bool) -> None:
        """A held job failed (retried while attempts remain), or a queued one is failed."""
        sub = data.draw(st.sampled_from(self._live()))
        was = sub.status
        _, error = self.both(
            "fail", sub.job_id, now=self.clock(), retry=retry, **self._named(sub, named)
        )
        if error is not None:
            return
        if sub.job_id in self.real:
            assert retry
            assert was == "running"
            assert self.real.not_before(sub.job_id) == self.ref.not_before(sub.job_id)
            self.counts["retried"] += 1
            self._lose(sub)
        else:
            self.counts["failed"] += 1
            self._end(sub, "failed")

    @precondition(lambda self: self.ready)
    @rule(data=st.data())
    def complete_not_held(self, data: st.DataObject) -> None:
        ids = [s.job_id for s in self._status("queued")] + ["nobody"]
        ids += [s.job_id for s in self.subs if s.job_id not in self.live]
        _, error = self.both("complete", data.draw(st.sampled_from(ids)), now=self.clock())
        assert error is not None

    @precondition(lambda self: self.ready and self.live)
    @rule(data=st.data(), named=st.booleans())
    def cancel(self, data: st.DataObject, named: bool) -> None:
        sub = data.draw(st.sampled_from(self._live()))
        _, error = self.both("cancel", sub.job_id, now=self.clock(), **self._named(sub, named))
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
        taken = [e for e in expired if e.cause != "ttl"]
        assert [e.job.seq for e in taken] == sorted(e.job.seq for e in taken)
        assert self.max_taken is None or len(taken) <= self.max_taken
        for record in expired:
            sub = self.live[record.job.id]
            if record.cause == "ttl":
                assert sub.status in ("queued", "lapsed")  # queued: requeued in this call
                assert record.deadline == sub.deadline
                assert record.deadline <= now
                assert (record.attempt, record.worker) == (sub.attempts + 1, None)
                self.counts["ttl_expired"] += sub.status == "queued"
                self._end(sub, "expired")
                continue
            assert sub.status == "running"
            assert record.worker == sub.holder
            assert record.attempt == sub.attempts
            self.counts["expired"] += 1
            if record.requeued:
                self._lose(sub)
            else:
                self.counts["failed"] += 1
                if record.worker is not None:
                    sub.lost_by.append(record.worker)
                self._end(sub, "failed")

    # -- rules: time -------------------------------------------------------------------------

    @precondition(lambda self: self.ready)
    @rule(step=time_steps())
    def advance(self, step: float) -> None:
        self.clock.advance(step)

    @precondition(lambda self: self.ready and self.latest > -math.inf and self.can_go_back())
    @rule(data=st.data())
    def time_goes_backwards(self, data: st.DataObject) -> None:
        call = data.draw(st.sampled_from(self.backwards_calls), label="call")
        error = self.call_in_the_past(call, self.latest - 0.5)
        assert isinstance(error, ValueError)

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def real_invariants_hold(self) -> None:
        check = getattr(self.real, "_check", None)
        if self.ready and check is not None:
            check()

    @invariant()
    def nothing_lost(self) -> None:
        """Every live job is where the history says, every finished one is gone."""
        if not self.ready:
            return
        assert len(self.real) == len(self.ref) == len(self._status("queued"))
        assert self.real.next_deadline() == self.ref.next_deadline()
        for job_id, sub in self.live.items():
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
        now = self.latest = self.clock()  # stats() moves both dispatchers' clocks too
        real, ref = self.real.stats(now=now), self.ref.stats(now=now)
        self._mark(now)
        self.compare_stats(real, ref)
        self.check_history(ref)  # ... and both agree with the history this test recorded
