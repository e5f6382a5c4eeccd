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

The rules every dispatcher shares live in ``stateful_support.Comparison`` (the fleet's machine
in ``test_fleet_stateful.py`` is its other subclass); this module adds what only the size-one
API has: ``dispatch`` (the one worker's pop), ``set_resident_model``, a job at a lane's affinity
window edge, and the checks of ``running`` and the per-level statistics.

Times, runtimes and estimates are dyadic (see ``strategies``), so both sides compute exactly
the same floats and any difference in a decision is a difference in the rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from prioqueue.dispatcher import ChargeModel, SizeOneDispatcher
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.records import Job, Stats
from prioqueue.scoring import Scorer
from prioqueue.testing import ReferenceDispatcher
from stateful_support import (
    Comparison,
    half_runtime,
    long_hunts,
    machine_tests,
    norm,
    settings_for,
)
from strategies import (
    dispatcher_models,
    dispatcher_runtimes,
    time_steps,
)

#: Examples per state machine in the default run (``PRIOQUEUE_STATEFUL_EXAMPLES`` changes it);
#: ``test_long_hunt`` (``-m slow``) runs each machine longer.
SETTINGS = settings_for(examples=20, steps=50)

BACKOFFS = (None, Backoff(), Backoff(kind="exponential", base=16.0, max=64.0, jitter=True))
BUDGETS = (
    None,
    {0: LevelBudget(max_queued=2)},
    {0: LevelBudget(ttl=600.0), 100: LevelBudget(max_wait=60.0, ttl=120.0)},
)


def _lease_for(job: Job) -> float:
    """Leases long enough to finish most jobs, short enough that the clock passes some."""
    return 480.0 if job.estimate is None else 2.0 * job.estimate


class DispatcherComparison(Comparison):
    """Fair share on, runtime charges, leases sometimes."""

    now_positional: ClassVar[tuple[str, ...]] = ("dispatch", "expire")
    max_taken: ClassVar[int | None] = 1
    backoffs: ClassVar[tuple[Backoff | None, ...]] = BACKOFFS
    budgets: ClassVar[tuple[dict[int, LevelBudget] | None, ...]] = BUDGETS
    max_attempts: ClassVar[tuple[int | None, ...]] = (None, 1, 3)
    backwards_calls: ClassVar[tuple[str, ...]] = ("submit", "dispatch", "expire")

    def __init__(self) -> None:
        super().__init__()
        self.real = SizeOneDispatcher()
        self.ref = ReferenceDispatcher()
        self.window = 0.0

    def make(self, scorer: Scorer, options: dict[str, Any]) -> tuple[Any, Any]:
        self.window = scorer.config.max_affinity * scorer.config.aging_divisor
        return SizeOneDispatcher(scorer, **options), ReferenceDispatcher(scorer, **options)

    def lease_for(self) -> Callable[..., float]:
        return _lease_for

    def _eligible(self) -> list[Any]:
        """The queued jobs in a lane (not delayed)."""
        return [s for s in self._status("queued") if self.real.not_before(s.job_id) is None]

    # -- rules: what only the size-one API has ---------------------------------------------

    @precondition(lambda self: self.ready and self._status("queued"))
    @rule(data=st.data(), model=dispatcher_models(), past_the_edge=st.booleans())
    def submit_at_window_edge(
        self, data: st.DataObject, model: str | None, past_the_edge: bool
    ) -> None:
        """Add a job to a backlogged lane exactly at (or just past) its affinity window."""
        sub = data.draw(st.sampled_from(self._status("queued")))
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
    @rule()
    def dispatch(self) -> None:
        self.dispatch_both()

    def dispatch_both(self) -> None:
        """Dispatch on both and check the grant against the recorded history."""
        grant, _ = self.both("dispatch", self.clock())
        if grant is None:
            assert self._status("running") or not self._eligible(), "idle but no grant"
            return
        assert not self._status("running"), "granted while a job runs"
        self.record_grant(grant, None)

    @precondition(lambda self: self.ready)
    @rule(step=time_steps(), runtime=dispatcher_runtimes())
    def serve(self, step: float, runtime: float | None) -> None:
        """What an adapter's loop does: time passes, leases expire, the job ends, next one."""
        self.clock.advance(step)
        self.expire()
        for sub in self._status("running"):
            self.complete_one(sub, runtime, named=False)
        self.dispatch_both()

    @precondition(lambda self: self.ready and self._status("running"))
    @rule(runtime=dispatcher_runtimes())
    def complete(self, runtime: float | None) -> None:
        self.complete_one(self._status("running")[0], runtime, named=False)

    @precondition(lambda self: self.ready)
    @rule(model=dispatcher_models())
    def set_resident_model(self, model: str | None) -> None:
        self.both("set_resident_model", model)

    # -- invariants and statistics ---------------------------------------------------------

    @invariant()
    def same_running(self) -> None:
        if self.ready:
            assert norm(self.real.running) == norm(self.ref.running)
            assert self.real.resident_model == self.ref.resident_model

    def compare_stats(self, real: Stats, ref: Stats) -> None:
        super().compare_stats(real, ref)
        assert real.resident_model == ref.resident_model

    def check_history(self, ref: Stats) -> None:
        super().check_history(ref)
        assert (ref.running is None) == (not self._status("running"))
        for level, stats in ref.levels.items():
            assert stats.dispatched == sum(g.job.priority == level for g in self.grants)
            assert stats.queued == sum(s.level == level for s in self._eligible())
        for member, member_stats in ref.members.items():
            assert member_stats.queued == sum(s.member == member for s in self._eligible())


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
        return half_runtime


class WithLoadTimes(DispatcherComparison):
    """Load times known: every call with the one-worker warm crossing and the load back
    (issue 26, seventh and eighth rounds) possible; ``tests/test_crossings.py`` checks both
    rules against the reference on busier workloads, where they fire."""

    def make(self, scorer: Scorer, options: dict[str, Any]) -> tuple[Any, Any]:
        loads = {"m1": 30.0, "m2": 240.0, "m3": 900.0}
        return super().make(scorer, {**options, "load_seconds": loads})


MACHINES = (
    DispatcherComparison,
    WithLoadTimes,
    WithoutFairShare,
    CountCharge,
    EstimateChargeWithLimits,
    CallableCharge,
)

test_machine = machine_tests(*MACHINES, machine_settings=SETTINGS)
test_long_hunt = long_hunts(*MACHINES, examples=150, steps=50)
