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
"""

from __future__ import annotations

import math
import os
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
from prioqueue.fleet import FleetDispatcher
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.records import Completed, Expired, Grant, Job, Stats, Ticket, WorkerInfo
from prioqueue.scoring import Scorer
from prioqueue.testing import ManualClock, ReferenceFleet
from strategies import (
    DISPATCHER_MODELS,
    dispatcher_job_specs,
    dispatcher_runtimes,
    dispatcher_scorers,
    time_steps,
)

#: Examples per state machine; set PRIOQUEUE_STATEFUL_EXAMPLES for a longer hunt.
EXAMPLES = int(os.environ.get("PRIOQUEUE_STATEFUL_EXAMPLES", "100"))

SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

TERMINAL = ("done", "cancelled", "failed", "expired")

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


def _half_runtime(job: Job, runtime: float) -> float:
    return runtime / 2 + (1.0 if job.model is None else 0.0)


def _norm(value: Any) -> Any:
    """Forget submission sequence numbers (their origin is an implementation detail)."""
    if isinstance(value, Job):
        return attrs.evolve(value, seq=0)
    if isinstance(value, (Grant, Ticket, Completed, Expired)):
        return attrs.evolve(value, job=_norm(value.job))
    if isinstance(value, (list, tuple)):
        return [_norm(item) for item in value]
    return value


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


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
        }
    )


@attrs.define
class _Submission:
    job_id: str
    member: str
    status: str = "queued"
    level: int | None = None
    attempts: int = 0
    holder: str | None = None
    lost_by: list[str] = attrs.field(factory=list)  # workers that held it and lost it
    deadline: float | None = None  # its ttl: past it, a queued job is "lapsed" until reported


class FleetComparison(RuleBasedStateMachine):
    """Fair share on, runtime charges; leases, caps, timeouts and warm holds sometimes."""

    fair_share: ClassVar[bool] = True
    max_queued: ClassVar[int | None] = None
    max_queued_per_member: ClassVar[int | None] = None
    one_argument_lease: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000.0)
        self.real = FleetDispatcher()
        self.ref = ReferenceFleet()
        self.subs: list[_Submission] = []
        self.live: dict[str, _Submission] = {}  # id -> its queued or held submission
        self.slots: dict[str, int] = {}  # worker -> slots it joined with
        self.next_id = 0
        self.latest = -math.inf
        self.grants: list[Grant] = []
        self.counts = {
            "completed": 0, "cancelled": 0, "expired": 0, "failed": 0, "ttl_expired": 0,
            "retried": 0,
        }  # fmt: skip
        self.fired = -math.inf  # the latest now at which both dispatchers fired their timers
        self.cap: int | None = None
        self.warm_hold = 0.0
        self.ready = False

    # -- set-up and helpers ----------------------------------------------------------------

    @initialize(
        scorer=dispatcher_scorers(),
        max_attempts=st.integers(1, 3),
        leases=st.booleans(),
        cap=st.sampled_from([None, None, 1, 2]),
        worker_timeout=st.sampled_from([None, 300.0, 1800.0]),
        warm_hold=st.sampled_from([0.0, 0.0, 30.0, 600.0]),
        workers=st.lists(worker_specs(), min_size=1, max_size=MAX_WORKERS),
        specs=st.lists(dispatcher_job_specs(), max_size=8),
        backoff=st.sampled_from(BACKOFFS),
        budgets=st.sampled_from(BUDGETS),
    )
    def build(
        self,
        scorer: Scorer,
        max_attempts: int,
        leases: bool,
        cap: int | None,
        worker_timeout: float | None,
        warm_hold: float,
        workers: list[dict[str, Any]],
        specs: list[dict[str, Any]],
        backoff: Backoff | None,
        budgets: dict[int, LevelBudget] | None,
    ) -> None:
        lease_for = _lease_for_job if self.one_argument_lease else _lease_for
        options: dict[str, Any] = {
            "charge": self.charge_model(),
            "lease_for": lease_for if leases else None,
            "max_queued": self.max_queued,
            "max_queued_per_member": self.max_queued_per_member,
            "max_running_per_member": cap,
            "max_attempts": max_attempts,
            "worker_timeout": worker_timeout,
            "warm_hold": warm_hold,
            "fair_share": self.fair_share,
            "backoff": backoff,
            "budgets": budgets,
        }
        self.cap = cap
        self.warm_hold = warm_hold
        self.real = FleetDispatcher(scorer, **options)
        self.ref = ReferenceFleet(scorer, **options)
        self.ready = True
        for name, spec in zip(NAMES, workers):
            self.join_one(name, spec)
        for spec in specs:
            self.submit_one(spec)

    def charge_model(self) -> ChargeModel:
        """The charge model both dispatchers use (subclasses override it)."""
        return "runtime"

    def both(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
        """Call ``name`` on both dispatchers; check they agree; return the reference's answer."""
        now = kwargs.get("now", args[0] if name == "expire" and args else None)
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
        if ref_error is None and args and name == "expire":
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

    def _status(self, status: str) -> list[_Submission]:
        return sorted(
            (sub for sub in self.live.values() if sub.status == status), key=lambda s: s.job_id
        )

    def _held_by(self, worker: str) -> list[_Submission]:
        return [sub for sub in self._status("running") if sub.holder == worker]

    def _end(self, sub: _Submission, status: str) -> None:
        sub.status = status
        sub.holder = None
        del self.live[sub.job_id]

    def _lose(self, sub: _Submission) -> None:
        """The job went back to the queue: its holder lost it."""
        assert sub.holder is not None
        sub.lost_by.append(sub.holder)
        sub.holder = None
        sub.status = "queued"

    def _observable(self) -> Any:
        """Everything a caller can see of the real fleet (to check a refused call changed
        nothing)."""
        now = self.latest = self.clock()
        return (
            len(self.real),
            _norm(self.real.stats(now=now)),
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

    # -- rules: submitting -----------------------------------------------------------------

    def submit_one(self, spec: dict[str, Any], *, reuse: bool = False) -> None:
        """Submit one job to both (a fresh id, or the id of a finished job when ``reuse``)."""
        finished = [s.job_id for s in self.subs if s.status in TERMINAL]
        finished = [job_id for job_id in finished if job_id not in self.live]
        if reuse and finished:
            job_id = finished[0]
        else:
            job_id = f"j{self.next_id}"
            self.next_id += 1
        ticket, error = self.both("submit", job_id, now=self.clock(), **spec)
        if error is None:
            level, deadline = ticket.job.priority, ticket.job.deadline
            sub = _Submission(job_id, spec["member"], level=level, deadline=deadline)
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
        max_attempts=st.sampled_from([None, 1, 2, 4]),
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
    @rule(data=st.data(), retry=st.booleans(), named=st.booleans())
    def fail(self, data: st.DataObject, retry: bool, named: bool) -> None:
        """A worker reports a failed run (retried while attempts remain), or a client fails a
        queued job."""
        sub = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda s: s.job_id)))
        kwargs = {"worker": sub.holder} if named and sub.holder is not None else {}
        holder = sub.holder
        _, error = self.both("fail", sub.job_id, now=self.clock(), retry=retry, **kwargs)
        if error is not None:
            return
        if sub.job_id in self.real:
            assert retry
            assert holder is not None
            assert self.real.not_before(sub.job_id) == self.ref.not_before(sub.job_id)
            self.counts["retried"] += 1
            sub.lost_by.append(holder)
            sub.holder = None
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

    # -- rules: pulling and finishing ------------------------------------------------------

    def pop_one(self, name: str) -> Grant | None:
        """Pop for ``name`` on both and check the grant against the recorded history."""
        before = self.ref.worker(name)
        grant, error = self.both("pop", name, now=self.clock())
        assert error is None, f"pop({name!r}) raised {error!r}"
        if grant is None:
            return None
        sub = self.live[grant.job.id]
        assert grant.worker == name
        assert sub.status == "queued", f"granted a {sub.status} job (held by {sub.holder})"
        assert grant.attempt == sub.attempts + 1, "a job granted twice in one attempt"
        assert len(before.held) < before.slots, f"{name} popped past its {before.slots} slots"
        if self.cap is not None:
            mine = [s for s in self._status("running") if s.member == sub.member]
            assert len(mine) < self.cap, f"{sub.member} got past the cap of {self.cap}"
        sub.attempts = grant.attempt
        sub.status = "running"
        sub.holder = name
        self.grants.append(grant)
        assert isinstance(grant, Grant)
        return grant

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
                self.complete_one(self.live[held[0]], runtime)
            self.pop_one(name)

    def complete_one(self, sub: _Submission, runtime: float | None) -> None:
        done, error = self.both(
            "complete", sub.job_id, now=self.clock(), runtime=runtime, worker=sub.holder
        )
        if error is None:
            assert done.job.id == sub.job_id
            self.counts["completed"] += 1
            self._end(sub, "done")

    @precondition(lambda self: self.ready and self._status("running"))
    @rule(data=st.data(), runtime=dispatcher_runtimes(), named=st.booleans())
    def complete(self, data: st.DataObject, runtime: float | None, named: bool) -> None:
        sub = data.draw(st.sampled_from(self._status("running")))
        if named:
            self.complete_one(sub, runtime)
            return
        done, error = self.both("complete", sub.job_id, now=self.clock(), runtime=runtime)
        if error is None:
            assert done.job.id == sub.job_id
            self.counts["completed"] += 1
            self._end(sub, "done")

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
        sub = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda s: s.job_id)))
        kwargs = {"worker": sub.holder} if named and sub.holder is not None else {}
        _, error = self.both("cancel", sub.job_id, now=self.clock(), **kwargs)
        if error is None:
            self.counts["cancelled"] += 1
            self._end(sub, "cancelled")

    @precondition(lambda self: self.ready)
    @rule()
    def expire(self) -> None:
        now = self.clock()
        expired, _ = self.both("expire", now)
        taken = [e for e in expired if e.cause != "ttl"]
        assert [e.job.seq for e in taken] == sorted(e.job.seq for e in taken)
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
                sub.lost_by.append(record.worker)
                self._end(sub, "failed")

    # -- rules: the world ------------------------------------------------------------------

    @precondition(lambda self: self.ready)
    @rule(step=time_steps())
    def advance(self, step: float) -> None:
        self.clock.advance(step)

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

    @precondition(lambda self: self.ready and self.latest > -math.inf and self.slots)
    @rule(call=st.sampled_from(["submit", "pop", "expire", "heartbeat"]))
    def time_goes_backwards(self, call: str) -> None:
        before = self.latest - 0.5
        name = sorted(self.slots)[0]
        if call == "submit":
            _, error = self.both("submit", "late", member="ann", now=before)
        elif call == "expire":
            _, error = self.both("expire", before)
        else:
            _, error = self.both(call, name, now=before)
        assert isinstance(error, ValueError)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def real_invariants_hold(self) -> None:
        check = getattr(self.real, "_check", None)
        if self.ready and check is not None:
            check()

    @invariant()
    def nothing_lost_or_doubled(self) -> None:
        if not self.ready:
            return
        assert len(self.real) == len(self.ref) == len(self._status("queued"))
        assert self.real.next_deadline() == self.ref.next_deadline()
        self.latest = self.clock()  # stats() moves both dispatchers' clocks too
        real_workers = {info.name: info for info in self.real.workers()}
        assert self.real.workers() == self.ref.workers()
        assert _norm(self.real.held) == _norm(self.ref.held)
        assert sorted(real_workers) == sorted(self.slots)
        held_ids = [job_id for info in real_workers.values() for job_id in info.held]
        assert len(held_ids) == len(set(held_ids)), "a job held by two workers"
        for name, info in real_workers.items():
            assert info == self.ref.worker(name)
            assert sorted(info.held) == sorted(s.job_id for s in self._held_by(name))
        for job_id, sub in self.live.items():
            if sub.status == "lapsed":  # gone at its deadline, until expire reports it
                assert job_id not in self.real
                assert job_id not in self.ref
                continue
            assert job_id in self.real
            assert self.real.state(job_id) == self.ref.state(job_id) == sub.status
            assert self.real.holder(job_id) == self.ref.holder(job_id) == sub.holder
        for sub in self.subs:
            if sub.job_id not in self.live:
                assert sub.job_id not in self.real
                assert sub.status in TERMINAL

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

    @invariant()
    def same_stats(self) -> None:
        if not self.ready:
            return
        now = self.latest = self.clock()
        real, ref = self.real.stats(now=now), self.ref.stats(now=now)
        self._mark(now)
        _compare_stats(real, ref)
        assert ref.dispatched == len(self.grants)
        assert ref.swaps == sum(grant.swap for grant in self.grants)
        for name, count in self.counts.items():
            assert getattr(ref, name) == count, name
        assert ref.queued == len(self._status("queued"))
        assert [job.id for job in ref.held] == self._held_in_grant_order()
        for member, member_stats in ref.members.items():
            assert member_stats.dispatched == sum(g.job.member == member for g in self.grants)
            running = self._status("running")
            assert member_stats.running == sum(s.member == member for s in running)

    def _held_in_grant_order(self) -> list[str]:
        """The ids of the held jobs, by the time of their current grants (then ``seq``)."""
        held = {s.job_id for s in self._status("running")}
        latest = {g.job.id: (g.granted_at, g.job.seq) for g in self.grants if g.job.id in held}
        return sorted(latest, key=latest.__getitem__)


def _compare_stats(real: Stats, ref: Stats) -> None:
    exact = (
        "now", "queued", "dispatched", "completed", "cancelled", "expired", "failed", "swaps",
        "ttl_expired", "refused", "retried", "delayed",
    )  # fmt: skip
    for name in exact:
        assert getattr(real, name) == getattr(ref, name), name
    assert _norm(real.running) == _norm(ref.running)
    assert _norm(real.held) == _norm(ref.held)
    assert real.workers == ref.workers
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
        assert (m.queued, m.dispatched, m.completed, m.running) == (
            n.queued,
            n.dispatched,
            n.completed,
            n.running,
        ), member
        assert _close(m.gpu_seconds, n.gpu_seconds), member


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
        return _half_runtime


TestFleet = FleetComparison.TestCase
TestFleet.settings = SETTINGS
TestFleetWithoutFairShare = WithoutFairShare.TestCase
TestFleetWithoutFairShare.settings = SETTINGS
TestFleetCountChargeWithLimits = CountChargeWithLimits.TestCase
TestFleetCountChargeWithLimits.settings = SETTINGS
TestFleetCallableChargeOneArgumentLease = CallableChargeOneArgumentLease.TestCase
TestFleetCallableChargeOneArgumentLease.settings = SETTINGS


@pytest.mark.slow
def test_fleet_long_hunt() -> None:
    """A longer run of the main machine (``-m slow``)."""
    run_state_machine_as_test(
        FleetComparison,
        settings=settings(SETTINGS, max_examples=500, stateful_step_count=60),
    )
