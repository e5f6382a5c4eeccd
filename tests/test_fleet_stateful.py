"""FleetDispatcher against the brute-force ReferenceFleet, step by random step.

A Hypothesis state machine runs a fleet of one to four workers (model subsets, one or two slots,
``accepts`` filters, slow workers), and submits, pops, completes, cancels, expires, joins,
re-joins, heartbeats, leaves and lets workers fall silent, calling both dispatchers with the same
arguments. After every step it checks that they agree on every answer (the same grant for every
pop, the same exception type for a bad call, the same workers and statistics), and it checks the
fleet's promises against the history it recorded itself:

* no job is lost: every job is queued, held by exactly one worker, or finished (done, cancelled,
  failed), and the dispatchers say so;
* no job is held by two workers, and a grant is never a second grant of the same attempt;
* a worker never holds more than its slots (a re-join may lower them; it then pops nothing
  until it is under them), and a member never holds more than ``max_running_per_member``;
* a late ``complete`` from a worker that lost its job raises and changes nothing;
* the job lifecycle (docs/design/lifecycle.md): jobs with a ttl, delayed jobs (``not_before``),
  ``fail`` with and without ``retry`` (per-job ``max_attempts`` and ``backoff``, jitter
  included) and level budgets; a queued job past its deadline is never granted, leaves at
  the first call at or after it and is reported once by ``expire`` (``cause="ttl"``);
* and the real dispatcher's own ``_check()``.

Times, runtimes and estimates are dyadic (see ``strategies``), so sums and differences are exact
and a difference in a decision is a difference in the rules. Subclasses rerun the machine
without fair share, with count-based charges and queue limits, and with a one-argument
``lease_for``. ``PRIOQUEUE_STATEFUL_EXAMPLES`` sets a longer hunt; the ``slow`` test runs one.

The rules every dispatcher shares live in ``stateful_support.Comparison`` (the size-one machine
in ``test_dispatcher_stateful.py`` is its other subclass); this module adds the workers: join,
re-join, heartbeat, leave, pop, late and foreign completes, and the clock moved to the next
deadline or warm-hold edge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from prioqueue.capabilities import FEATURES, Capabilities, Needs, unfit
from prioqueue.dispatcher import ChargeModel
from prioqueue.fleet import FleetDispatcher
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.records import Grant, Job, Stats, WorkerInfo
from prioqueue.scoring import Scorer
from prioqueue.testing import ReferenceFleet
from stateful_support import (
    Comparison,
    Submission,
    half_runtime,
    long_hunts,
    machine_tests,
    norm,
    settings_for,
)
from strategies import (
    DISPATCHER_MODELS,
    dispatcher_job_specs,
    dispatcher_runtimes,
    time_steps,
)

#: Examples per state machine in the default run (``PRIOQUEUE_STATEFUL_EXAMPLES`` changes it);
#: ``test_fleet_long_hunt`` and ``test_long_hunt`` (``-m slow``) run them longer.
SETTINGS = settings_for(examples=25, steps=40)

BACKOFFS = (
    None,
    Backoff(),
    Backoff(kind="linear", base=30.0, max=120.0),
    Backoff(kind="exponential", base=16.0, jitter=True),
)
BUDGETS = (
    None,
    {0: LevelBudget(max_queued=3)},
    {0: LevelBudget(ttl=600.0), 100: LevelBudget(max_wait=120.0, ttl=300.0)},
    {-100: LevelBudget(ttl=1800.0, max_queued=4)},
)

NAMES = ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e")
MAX_WORKERS = 4


def _interactive_only(job: Job) -> bool:
    """An ``accepts`` filter: a worker reserved for work at level 0 and above."""
    return job.priority >= 0


def _no_long_jobs(job: Job) -> bool:
    """An ``accepts`` filter: a small GPU that refuses jobs estimated at 15 minutes or more."""
    return job.estimate is None or job.estimate < 900.0


def _lease_for(job: Job, worker: WorkerInfo) -> float:
    """Leases long enough to finish most jobs, short enough that the clock passes some; a slow
    worker gets three times as long."""
    base = 480.0 if job.estimate is None else 2.0 * job.estimate
    return 3.0 * base if worker.slow else base


def _lease_for_job(job: Job) -> float:
    """The one-argument form (``lease_for(job)``), which keeps working."""
    return 480.0 if job.estimate is None else 2.0 * job.estimate


def capabilities() -> st.SearchStrategy[Capabilities | None]:
    """What a worker declares (docs/design/capabilities.md): None half of the time."""
    declared = st.builds(
        Capabilities,
        max_pixels=st.sampled_from([None, 512 * 512, 1024 * 1024]),
        features=st.sets(st.sampled_from(FEATURES)),
        nsfw=st.booleans(),
        max_steps=st.sampled_from([None, 30, 60]),
        blacklist=st.sampled_from([(), ("castle",)]),
        declared_only=st.booleans(),
    )
    return st.one_of(st.none(), declared)


def needs_specs() -> st.SearchStrategy[dict[str, Any]]:
    """``model`` and ``needs`` of a job that declares what it needs (one or several models)."""
    needs = st.builds(
        Needs,
        models=st.lists(st.sampled_from(DISPATCHER_MODELS), max_size=3, unique=True),
        pixels=st.sampled_from([0, 512 * 512, 1024 * 1024, 2048 * 2048]),
        steps=st.sampled_from([0, 20, 50]),
        features=st.sets(st.sampled_from(FEATURES), max_size=2),
        nsfw=st.booleans(),
        text=st.sampled_from(["", "a castle at dusk", "a lighthouse"]),
    )
    return needs.map(lambda n: {"model": n.models[0] if len(n.models) == 1 else None, "needs": n})


def worker_specs() -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for one ``join`` (all but the name and ``now``)."""
    subsets = st.lists(st.sampled_from(DISPATCHER_MODELS), max_size=3, unique=True).map(sorted)
    return st.fixed_dictionaries(
        {
            "models": st.one_of(st.none(), st.none(), subsets),
            "resident": st.sampled_from((None, *DISPATCHER_MODELS)),
            "slots": st.sampled_from([1, 1, 2]),
            "slow": st.booleans(),
            "accepts": st.sampled_from([None, None, _interactive_only, _no_long_jobs]),
            "capabilities": capabilities(),
        }
    )


class FleetComparison(Comparison):
    """Fair share on, runtime charges; leases, caps, timeouts and warm holds sometimes."""

    one_argument_lease: ClassVar[bool] = False
    workers_named: ClassVar[bool] = True
    backoffs: ClassVar[tuple[Backoff | None, ...]] = BACKOFFS
    budgets: ClassVar[tuple[dict[int, LevelBudget] | None, ...]] = BUDGETS
    max_attempts: ClassVar[tuple[int | None, ...]] = (None, 1, 2, 4)
    backwards_calls: ClassVar[tuple[str, ...]] = ("submit", "pop", "expire", "heartbeat")

    def __init__(self) -> None:
        super().__init__()
        self.real = FleetDispatcher()
        self.ref = ReferenceFleet()
        self.slots: dict[str, int] = {}  # worker -> slots it joined with
        self.cap: int | None = None
        self.warm_hold = 0.0

    # -- set-up and helpers ----------------------------------------------------------------

    def make(self, scorer: Scorer, options: dict[str, Any]) -> tuple[Any, Any]:
        return FleetDispatcher(scorer, **options), ReferenceFleet(scorer, **options)

    def lease_for(self) -> Callable[..., float]:
        return _lease_for_job if self.one_argument_lease else _lease_for

    def more_options(self, data: st.DataObject) -> dict[str, Any]:
        self.cap = data.draw(st.sampled_from([None, None, 1, 2]), label="cap")
        self.warm_hold = data.draw(st.sampled_from([0.0, 0.0, 30.0, 600.0]), label="warm_hold")
        timeout = data.draw(st.sampled_from([None, 300.0, 1800.0]), label="worker_timeout")
        return {
            "max_running_per_member": self.cap,
            "worker_timeout": timeout,
            "warm_hold": self.warm_hold,
        }

    def start(self, data: st.DataObject) -> None:
        """The first workers join."""
        workers = st.lists(worker_specs(), min_size=1, max_size=MAX_WORKERS)
        for name, spec in zip(NAMES, data.draw(workers, label="workers")):
            self.join_one(name, spec)

    def _held_by(self, worker: str) -> list[Submission]:
        return [sub for sub in self._status("running") if sub.holder == worker]

    def _observable(self) -> Any:
        """Everything a caller can see of the real fleet (to check a refused call changed
        nothing)."""
        now = self.latest = self.clock()
        return (
            len(self.real),
            norm(self.real.stats(now=now)),
            {
                s.job_id: self.real.state(s.job_id)
                for s in self.live.values()
                if s.status != "lapsed"
            },
            self.real.next_deadline(),
        )

    # -- rules: workers --------------------------------------------------------------------

    def join_one(self, name: str, spec: dict[str, Any]) -> None:
        info, error = self.both("join", name, now=self.clock(), **spec)
        if error is None:
            assert info.name == name
            assert info.slots == spec["slots"]
            self.slots[name] = max(info.slots, len(info.held))  # a re-join may lower slots

    @precondition(lambda self: self.ready and len(self.slots) < MAX_WORKERS)
    @rule(spec=worker_specs())
    def join(self, spec: dict[str, Any]) -> None:
        name = next(n for n in NAMES if n not in self.slots)
        self.join_one(name, spec)

    @precondition(lambda self: self.ready and self.slots)
    @rule(data=st.data(), spec=worker_specs())
    def rejoin(self, data: st.DataObject, spec: dict[str, Any]) -> None:
        """A known worker joins again with new settings (it keeps the jobs it holds)."""
        name = data.draw(st.sampled_from(sorted(self.slots)))
        self.join_one(name, spec)

    @precondition(lambda self: self.ready and self.slots)
    @rule(data=st.data(), resident=st.sampled_from(["keep", None, *DISPATCHER_MODELS]))
    def heartbeat(self, data: st.DataObject, resident: str | None) -> None:
        name = data.draw(st.sampled_from(sorted(self.slots)))
        if resident == "keep":
            self.both("heartbeat", name, now=self.clock())
        else:
            self.both("heartbeat", name, now=self.clock(), resident=resident)

    @precondition(lambda self: self.ready and self.slots)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.slots)))
        held = self._held_by(name)
        jobs, error = self.both("leave", name, now=self.clock())
        assert error is None
        assert [job.id for job in jobs] == sorted(
            (sub.job_id for sub in held), key=lambda job_id: self.ref.job(job_id).seq
        )
        for sub in held:
            self._lose(sub)
        del self.slots[name]

    @precondition(lambda self: self.ready)
    @rule(call=st.sampled_from(["pop", "heartbeat", "leave", "idle_reasons"]))
    def unknown_worker(self, call: str) -> None:
        _, error = self.both(call, "nobody", now=self.clock())
        assert error is not None

    @precondition(lambda self: self.ready and self.slots)
    @rule(data=st.data())
    def idle_reasons(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.slots)))
        reasons, error = self.both("idle_reasons", name, now=self.clock())
        assert error is None
        assert sum(reasons.values()) <= len(self._status("queued"))
        assert all(count > 0 for count in reasons.values())

    # -- rules: pulling and finishing ------------------------------------------------------

    def pop_one(self, name: str) -> Grant | None:
        """Pop for ``name`` on both and check the grant against the recorded history."""
        before = self.ref.worker(name)
        grant, error = self.both("pop", name, now=self.clock())
        assert error is None, f"pop({name!r}) raised {error!r}"
        if grant is None:
            return None
        return self.check_grant(grant, name, before)

    def check_grant(self, grant: Grant, name: str, before: WorkerInfo) -> Grant:
        """Check a grant to ``name`` (as it was ``before``) and record it."""
        assert grant.worker == name
        assert len(before.held) < before.slots, f"{name} popped past its {before.slots} slots"
        if self.cap is not None:
            member = self.live[grant.job.id].member
            mine = [s for s in self._status("running") if s.member == member]
            assert len(mine) < self.cap, f"{member} got past the cap of {self.cap}"
        needs = grant.job.needs
        if needs is not None:  # it fits: served, within every declared limit
            assert unfit(before.models, before.capabilities, needs) is None, grant
            if needs.models:
                assert grant.job.model in needs.models, "the grant chose no accepted model"
                if before.resident in needs.models and grant.job.model != before.resident:
                    assert before.models is not None
                    assert before.resident not in before.models
        self.record_grant(grant, name)
        assert isinstance(grant, Grant)
        return grant

    @precondition(lambda self: self.ready and self.slots)
    @rule(data=st.data(), amount=st.integers(min_value=1, max_value=3), siblings=st.booleans())
    def pop_many(self, data: st.DataObject, amount: int, siblings: bool) -> None:
        """Several grants in one pop: ``pop`` repeated (``siblings``: in one group), on both."""
        name = data.draw(st.sampled_from(sorted(self.slots)))
        before = self.ref.worker(name)
        now = self.clock()
        grants, error = self.both("pop_many", name, amount=amount, now=now, siblings=siblings)
        assert error is None, f"pop_many({name!r}) raised {error!r}"
        assert len(grants) <= amount
        if siblings and grants:
            group = self.real.group_of(grants[0].job.id)
            assert group is not None or len(grants) == 1, "an ungrouped job is granted alone"
            assert all(self.real.group_of(g.job.id) == group for g in grants), "not siblings"
        for grant in grants:
            self.check_grant(grant, name, before)
            resident = before.resident if grant.job.model is None else grant.job.model
            before = attrs.evolve(before, held=(*before.held, grant.job.id), resident=resident)

    @precondition(lambda self: self.ready)
    @rule(
        spec=dispatcher_job_specs(),
        needs=needs_specs(),
        group=st.sampled_from([None, "r1", "r2"]),
    )
    def submit_with_needs(
        self, spec: dict[str, Any], needs: dict[str, Any], group: str | None
    ) -> None:
        """A job that declares what it needs (pixels, features, models), in a request group."""
        self.submit_one({**spec, **needs, "group": group})

    @precondition(lambda self: self.ready and self.slots)
    @rule(data=st.data())
    def pop(self, data: st.DataObject) -> None:
        self.pop_one(data.draw(st.sampled_from(sorted(self.slots))))

    @precondition(lambda self: self.ready and self.slots)
    @rule()
    def every_worker_pops(self) -> None:
        """The fleet pulls at once: each worker pops until it gets nothing."""
        for name in sorted(self.slots):
            while self.pop_one(name) is not None:
                pass

    @precondition(lambda self: self.ready and self.slots)
    @rule(step=time_steps(), runtime=dispatcher_runtimes(), data=st.data())
    def serve(self, step: float, runtime: float | None, data: st.DataObject) -> None:
        """What a broker's loop does: time passes, leases expire, some workers finish their
        oldest job and pull the next; the others stay silent."""
        self.clock.advance(step)
        self.expire()
        for name in sorted(self.slots):
            if not data.draw(st.booleans(), label=f"{name} speaks"):
                continue
            held = self.ref.worker(name).held
            if held:
                self.complete_one(self.live[held[0]], runtime, named=True)
            self.pop_one(name)

    @precondition(lambda self: self.ready and self._status("running"))
    @rule(data=st.data(), runtime=dispatcher_runtimes(), named=st.booleans())
    def complete(self, data: st.DataObject, runtime: float | None, named: bool) -> None:
        sub = data.draw(st.sampled_from(self._status("running")))
        self.complete_one(sub, runtime, named=named)

    @precondition(lambda self: self.ready and any(s.lost_by for s in self.subs))
    @rule(data=st.data())
    def complete_late(self, data: st.DataObject) -> None:
        """A worker that lost its job reports it anyway: refused, and nothing changes."""
        subs = [s for s in self.subs if s.lost_by]
        sub = data.draw(st.sampled_from(subs))
        worker = data.draw(st.sampled_from(sub.lost_by))
        now_live = self.live.get(sub.job_id)  # the id may have been reused since
        if now_live is not None and now_live.holder == worker:  # it holds that id again
            return
        before = self._observable()
        _, error = self.both("complete", sub.job_id, now=self.clock(), worker=worker)
        assert error is not None, f"a late complete from {worker} was accepted"
        assert self._observable() == before, "a refused complete changed something"

    @precondition(lambda self: self.ready and len(self.slots) >= 2 and self._status("running"))
    @rule(data=st.data())
    def complete_by_another_worker(self, data: st.DataObject) -> None:
        sub = data.draw(st.sampled_from(self._status("running")))
        other = data.draw(st.sampled_from(sorted(set(self.slots) - {sub.holder or ""})))
        before = self._observable()
        _, error = self.both("complete", sub.job_id, now=self.clock(), worker=other)
        assert error is not None
        assert self._observable() == before

    # -- rules: the world ------------------------------------------------------------------

    @precondition(lambda self: self.ready and self.real.next_deadline() is not None)
    @rule()
    def advance_to_the_next_deadline(self) -> None:
        """Exactly to the earliest lease deadline or worker timeout (the broker's timer)."""
        deadline = self.real.next_deadline()
        assert deadline is not None
        self.clock.jump_to(max(deadline, self.clock()))

    @precondition(lambda self: self.ready and self.warm_hold > 0 and self._status("queued"))
    @rule(data=st.data(), past_the_edge=st.booleans())
    def advance_to_a_warm_hold_edge(self, data: st.DataObject, past_the_edge: bool) -> None:
        """Exactly to (or just past) the end of a queued job's warm hold; a cold worker pops."""
        sub = data.draw(st.sampled_from(self._status("queued")))
        job = self.ref.job(sub.job_id)
        edge = job.arrival + self.warm_hold + (0.25 if past_the_edge else 0)
        self.clock.jump_to(max(edge, self.clock()))
        cold = [w.name for w in self.ref.workers() if w.resident != job.model]
        if cold:
            self.pop_one(data.draw(st.sampled_from(cold)))

    def can_go_back(self) -> bool:
        return bool(self.slots)

    def call_in_the_past(self, call: str, before: float) -> BaseException | None:
        if call in ("submit", "expire"):
            return super().call_in_the_past(call, before)
        return self.both(call, sorted(self.slots)[0], now=before)[1]

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def nothing_doubled(self) -> None:
        """The same workers on both sides, each holding what the history says; no job held
        twice."""
        if not self.ready:
            return
        self.latest = self.clock()  # stats() moves both dispatchers' clocks too
        real_workers = {info.name: info for info in self.real.workers()}
        assert self.real.workers() == self.ref.workers()
        assert norm(self.real.held) == norm(self.ref.held)
        assert sorted(real_workers) == sorted(self.slots)
        held_ids = [job_id for info in real_workers.values() for job_id in info.held]
        assert len(held_ids) == len(set(held_ids)), "a job held by two workers"
        for name, info in real_workers.items():
            assert info == self.ref.worker(name)
            assert sorted(info.held) == sorted(s.job_id for s in self._held_by(name))
        for job_id, sub in self.live.items():
            if sub.status != "lapsed":
                assert self.real.holder(job_id) == self.ref.holder(job_id) == sub.holder

    @invariant()
    def same_lane_starts(self) -> None:
        """Every backlogged lane's virtual start (up-front charges included) is the model's."""
        if not self.ready or not self.fair_share:
            return
        now = self.latest = self.clock()
        self.ref.stats(now=now)  # both fire their timers at now (explain does on the real)
        self._mark(now)
        for sub in self._status("queued"):
            if self.real.not_before(sub.job_id) is not None:
                continue  # delayed: in no lane yet
            assert sub.level is not None
            explained = self.real.explain(sub.job_id, now=now, ahead_limit=0, overtakes_limit=0)
            assert explained.lane_start == self.ref.lane_start(sub.member, sub.level), sub

    @invariant()
    def slots_and_caps_hold(self) -> None:
        if not self.ready:
            return
        for name in self.slots:
            info = self.ref.worker(name)
            assert len(info.held) <= max(info.slots, self.slots[name]), name
            self.slots[name] = max(info.slots, len(info.held))
        if self.cap is not None:
            for member in {s.member for s in self._status("running")}:
                mine = [s for s in self._status("running") if s.member == member]
                assert len(mine) <= self.cap, member

    def compare_stats(self, real: Stats, ref: Stats) -> None:
        super().compare_stats(real, ref)
        assert norm(real.held) == norm(ref.held)
        assert real.workers == ref.workers
        for member, m in real.members.items():
            assert m.running == ref.members[member].running, member

    def check_history(self, ref: Stats) -> None:
        super().check_history(ref)
        assert [job.id for job in ref.held] == self._held_in_grant_order()
        for member, member_stats in ref.members.items():
            running = self._status("running")
            assert member_stats.running == sum(s.member == member for s in running)

    def _held_in_grant_order(self) -> list[str]:
        """The ids of the held jobs, by the time of their current grants (then ``seq``)."""
        held = {s.job_id for s in self._status("running")}
        latest = {g.job.id: (g.granted_at, g.job.seq) for g in self.grants if g.job.id in held}
        return sorted(latest, key=latest.__getitem__)


class WithoutFairShare(FleetComparison):
    """Every job its own lane aging from its arrival (the ablation)."""

    fair_share = False


class CountChargeWithLimits(FleetComparison):
    """Count-based fairness (every job costs 60 s) and both queue limits in force."""

    max_queued = 6
    max_queued_per_member = 3

    def charge_model(self) -> ChargeModel:
        return 60.0


class CallableChargeOneArgumentLease(FleetComparison):
    """A charge callable, and a ``lease_for`` that takes the job alone."""

    one_argument_lease = True

    def charge_model(self) -> ChargeModel:
        return half_runtime


#: The machines the long hunt runs (``FleetComparison`` has its own: ``test_fleet_long_hunt``).
HUNTED = (WithoutFairShare, CountChargeWithLimits, CallableChargeOneArgumentLease)

test_machine = machine_tests(FleetComparison, *HUNTED, machine_settings=SETTINGS)
test_long_hunt = long_hunts(*HUNTED, examples=100, steps=40)


@pytest.mark.slow
def test_fleet_long_hunt() -> None:
    """A longer run of the main machine (``-m slow``)."""
    run_state_machine_as_test(
        FleetComparison,
        settings=settings(SETTINGS, max_examples=500, stateful_step_count=60),
    )
