"""Groups: a label that changes no decision, counted exactly once per job in exactly one state.

The state machine drives a ``SizeOneDispatcher`` (jobs submitted with random groups) and the
brute-force ``ReferenceDispatcher`` (the same jobs, without groups) side by side: every grant
must be the same, so a group changes no score and no lane. Beside them it keeps its own
brute-force count: every submission as one record whose state it moves by hand. After every
step each group's status must equal the count of those records, through expiry, requeue,
cancel, fail, cancel_group and snapshot/restore.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from prioqueue import (
    CancelRunning,
    FleetDispatcher,
    GroupStatus,
    InvalidState,
    Job,
    SizeOneDispatcher,
    UnknownGroup,
    UnknownJob,
)
from prioqueue.testing import ReferenceDispatcher

GROUPS = ("film-a", "film-b", None)
MEMBERS = ("dora", "eve", "finn")
LEVELS = (-100, 0, 100)

SETTINGS = settings(
    max_examples=80,
    stateful_step_count=40,
    suppress_health_check=[HealthCheck.filter_too_much],
)


def _lease_for(job: Job) -> float:
    return 100.0


@attrs.define
class Record:
    """One submission, as the test counts it."""

    job_id: str
    group: str | None
    member: str = ""
    state: str = "queued"
    used: float = 0.0
    runtime: float | None = None
    granted_at: float = 0.0


class GroupMachine(RuleBasedStateMachine):
    """The real dispatcher, the reference without groups, and a brute-force group count."""

    def __init__(self) -> None:
        super().__init__()
        self.d = SizeOneDispatcher(lease_for=_lease_for, max_attempts=2)
        self.ref = ReferenceDispatcher(lease_for=_lease_for, max_attempts=2)
        self.now = 0.0
        self.records: list[Record] = []
        self.live: dict[str, Record] = {}  # job id -> its current submission
        self.serial = 0

    @initialize()
    def start(self) -> None:
        note("new machine")

    # -------------------------------------------------------------- helpers

    def _running(self) -> Record | None:
        return next((r for r in self.live.values() if r.state == "running"), None)

    def _end(self, record: Record, state: str, used: float) -> None:
        record.state = state
        record.used += used
        del self.live[record.job_id]

    # -------------------------------------------------------------- rules

    @rule(seconds=st.sampled_from([0.0, 1.0, 30.0, 60.0, 150.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(
        group=st.sampled_from(GROUPS),
        member=st.sampled_from(MEMBERS),
        level=st.sampled_from(LEVELS),
        estimate=st.sampled_from([None, 10.0, 60.0]),
        reuse=st.booleans(),
    )
    def submit(
        self, group: str | None, member: str, level: int, estimate: float | None, reuse: bool
    ) -> None:
        # Sometimes reuse the id of a finished job: it is a new job, counted again.
        finished = [r.job_id for r in self.records if r.job_id not in self.live]
        if reuse and finished:
            job_id = finished[0]
        else:
            self.serial += 1
            job_id = f"j{self.serial}"
        kwargs: dict[str, Any] = {"member": member, "priority": level, "estimate": estimate}
        self.d.submit(job_id, group=group, now=self.now, **kwargs)
        self.ref.submit(job_id, now=self.now, **kwargs)
        record = Record(job_id, group, member)
        self.records.append(record)
        self.live[job_id] = record

    @rule()
    def dispatch(self) -> None:
        grant = self.d.dispatch(self.now)
        expected = self.ref.dispatch(self.now)
        assert (grant is None) == (expected is None)
        if grant is None or expected is None:
            return
        assert grant.job.id == expected.job.id  # a group changes no decision
        record = self.live[grant.job.id]
        record.state = "running"
        record.granted_at = self.now

    @rule(exact=st.booleans())
    def complete(self, exact: bool) -> None:
        record = self._running()
        if record is None:
            return
        grant = self.d.running
        assert grant is not None
        assert grant.lease is not None
        if grant.lease.expired(self.now):
            return  # expire() owns it
        runtime = 5.0 if exact else None
        self.d.complete(record.job_id, now=self.now, runtime=runtime)
        self.ref.complete(record.job_id, now=self.now, runtime=runtime)
        used = self.now - record.granted_at if runtime is None else runtime
        record.runtime = used
        self._end(record, "done", used)

    @rule(data=st.data(), fail=st.booleans())
    def remove(self, data: st.DataObject, fail: bool) -> None:
        if not self.live:
            return
        record = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda r: r.job_id)))
        used = self.now - record.granted_at if record.state == "running" else 0.0
        if fail:
            self.d.fail(record.job_id, now=self.now)
        else:
            self.d.cancel(record.job_id, now=self.now)
        self.ref.cancel(record.job_id, now=self.now)
        self._end(record, "failed" if fail else "cancelled", used)

    @rule(fail=st.booleans(), seconds=st.sampled_from([1.0, 7.0]))
    def stop_running(self, fail: bool, seconds: float) -> None:
        # The running job's own rule, so removals while running (charged) come up often.
        record = self._running()
        if record is None:
            return
        self.now += seconds
        if fail:
            self.d.fail(record.job_id, now=self.now)
        else:
            self.d.cancel(record.job_id, now=self.now)
        self.ref.cancel(record.job_id, now=self.now)
        self._end(record, "failed" if fail else "cancelled", self.now - record.granted_at)

    @rule()
    def expire(self) -> None:
        expired = self.d.expire(self.now)
        expected = self.ref.expire(self.now)
        assert [(e.job.id, e.requeued) for e in expired] == [
            (e.job.id, e.requeued) for e in expected
        ]
        for item in expired:
            record = self.live[item.job.id]
            used = self.now - record.granted_at
            if item.requeued:
                record.state = "queued"
                record.used += used
            else:
                self._end(record, "failed", used)

    @rule(group=st.sampled_from(GROUPS[:2]), cancel_running=st.booleans())
    def cancel_group(self, group: str, cancel_running: bool) -> None:
        members = [r for r in self.live.values() if r.group == group]
        if not any(r.group == group for r in self.records):
            with pytest.raises(UnknownGroup):
                self.d.cancel_group(group, now=self.now)
            return
        others = {
            job_id: self.d.state(job_id) for job_id, r in self.live.items() if r.group != group
        }
        mode: CancelRunning = "cancel" if cancel_running else "keep"
        cancelled = self.d.cancel_group(group, now=self.now, running=mode)
        expected = [r for r in members if r.state == "queued" or cancel_running]
        assert [job.id for job in cancelled] == [r.job_id for r in expected]
        for record in expected:
            used = self.now - record.granted_at if record.state == "running" else 0.0
            self.ref.cancel(record.job_id, now=self.now)
            self._end(record, "cancelled", used)
        # Every other job is untouched: still there, in the same state.
        assert {job_id: self.d.state(job_id) for job_id in others} == others

    @rule(shift=st.sampled_from([0.0, 500.0]))
    def snapshot_and_restore(self, shift: float) -> None:
        state = json.loads(json.dumps(self.d.snapshot(now=self.now)))
        if shift:
            restored = SizeOneDispatcher.restore(
                state, now=self.now + shift, lease_for=_lease_for, max_attempts=2
            )
            # Only the counts matter here; keep the shifted one aside and go on unshifted.
            for group in ("film-a", "film-b"):
                if any(r.group == group for r in self.records):
                    before = self.d.group_status(group, now=self.now)
                    after = restored.group_status(group, now=self.now + shift)
                    assert _counts(before) == _counts(after)
                    assert before.members == after.members
            return
        self.d = SizeOneDispatcher.restore(state, lease_for=_lease_for, max_attempts=2)

    # -------------------------------------------------------------- checks

    @invariant()
    def counts_match_the_brute_force_count(self) -> None:
        self.d._check()
        for group in ("film-a", "film-b"):
            mine = [r for r in self.records if r.group == group]
            if not mine:
                with pytest.raises(UnknownGroup):
                    self.d.group_status(group, now=self.now)
                continue
            status = self.d.group_status(group, now=self.now)
            expected = {s: sum(r.state == s for r in mine) for s in _STATES}
            assert _counts(status) == expected
            assert status.submitted == len(mine)
            assert status.members == tuple(sorted({r.member for r in mine}))
            assert math.isclose(status.gpu_seconds, sum(r.used for r in mine), abs_tol=1e-6)
            done = [r.runtime for r in mine if r.state == "done" and r.runtime is not None]
            if done:
                assert status.mean_runtime is not None
                assert math.isclose(status.mean_runtime, sum(done) / len(done), abs_tol=1e-6)
            else:
                assert status.mean_runtime is None
            assert status.active == any(r.state in ("queued", "running") for r in mine)
            if not status.active:
                assert status.forecast_finish is None
        active = {r.group for r in self.live.values() if r.group is not None}
        assert self.d.stats(now=self.now).groups == len(active)
        for job_id, record in self.live.items():
            assert self.d.group_of(job_id) == record.group


_STATES = ("queued", "running", "done", "failed", "cancelled")


def _counts(status: GroupStatus) -> dict[str, int]:
    return {state: getattr(status, state) for state in _STATES}


TestGroupAccounting = GroupMachine.TestCase
TestGroupAccounting.settings = SETTINGS


# ---------------------------------------------------------------------------- forecast


@st.composite
def _workloads(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(min_value=1, max_value=12))
    return [
        {
            "member": draw(st.sampled_from(MEMBERS)),
            "priority": draw(st.sampled_from(LEVELS)),
            "tier": draw(st.sampled_from(["free", "pro", "max"])),
            "estimate": float(draw(st.integers(min_value=1, max_value=600))),
            "group": draw(st.sampled_from(GROUPS)),
            "arrival": float(draw(st.sampled_from([0, 0, 0, 5, 20]))),
        }
        for _ in range(count)
    ]


@settings(max_examples=150)
@given(jobs=_workloads(), dispatch_first=st.booleans())
def test_forecast_is_exact_when_estimates_are_and_nothing_else_arrives(
    jobs: list[dict[str, Any]], dispatch_first: bool
) -> None:
    d = SizeOneDispatcher()
    ordered = sorted(enumerate(jobs), key=lambda item: item[1]["arrival"])
    for index, spec in ordered:
        kwargs = {k: v for k, v in spec.items() if k != "arrival"}
        d.submit(f"j{index}", now=spec["arrival"], **kwargs)
    now = 20.0
    if dispatch_first:
        d.dispatch(now)  # the forecast must count the running job's remaining time too
        now = 25.0
    groups = {spec["group"] for spec in jobs if spec["group"] is not None}
    forecasts = {g: d.group_status(g, now=now).forecast_finish for g in groups}
    # Run everything with runtimes equal to the estimates; nothing else arrives.
    finish: dict[str, float] = {}
    grant = d.running
    while grant is not None or len(d):
        if grant is None:
            grant = d.dispatch(now)
            assert grant is not None
        end = max(now, grant.granted_at + (grant.job.estimate or 0.0))
        d.complete(grant.job.id, now=end, runtime=end - grant.granted_at)
        group = jobs[int(grant.job.id[1:])]["group"]
        if group is not None:
            finish[group] = end
        now = end
        grant = None
    for group in groups:
        assert forecasts[group] == pytest.approx(finish[group], abs=1e-6), group


def test_forecast_counts_other_members_work_ahead() -> None:
    d = SizeOneDispatcher()
    d.submit("img", member="eve", priority="interactive", estimate=40.0, now=0.0)
    for i in range(3):
        d.submit(f"shot-{i}", member="dora", priority="batch", estimate=100.0, group="f", now=0.0)
    status = d.group_status("f", now=0.0)
    assert status.forecast_finish == 340.0
    assert status.remaining == 340.0
    assert (status.queued, status.running, status.done) == (3, 0, 0)
    assert "3 queued" in str(status)
    assert "finishes in ~340 s" in str(status)


def test_forecast_unknown_without_estimates_or_history() -> None:
    d = SizeOneDispatcher()
    d.submit("a", member="dora", group="f", now=0.0)
    assert d.group_status("f", now=0.0).forecast_finish is None
    assert "unknown" in str(d.group_status("f", now=0.0))
    d.dispatch(0.0)
    d.complete("a", now=50.0)
    # Now the recent mean runtime (50 s) stands in for a missing estimate.
    d.submit("b", member="dora", group="f", now=50.0)
    assert d.group_status("f", now=50.0).forecast_finish == 100.0
    assert d.group_status("f", now=50.0).mean_runtime == 50.0


def test_running_only_group_forecasts_its_expected_end() -> None:
    d = SizeOneDispatcher()
    d.submit("a", member="dora", group="f", estimate=30.0, now=0.0)
    d.dispatch(0.0)
    assert d.group_status("f", now=10.0).forecast_finish == 30.0
    # Past its estimate the job is expected to end now, never in the past.
    assert d.group_status("f", now=45.0).forecast_finish == 45.0


# ---------------------------------------------------------------------------- cancel_group


@settings(max_examples=100)
@given(jobs=_workloads(), dispatch_first=st.booleans(), cancel_running=st.booleans())
def test_cancel_group_is_cancel_of_each_member_job_and_touches_nothing_else(
    jobs: list[dict[str, Any]], dispatch_first: bool, cancel_running: bool
) -> None:
    def build() -> SizeOneDispatcher:
        d = SizeOneDispatcher()
        for index, spec in sorted(enumerate(jobs), key=lambda item: item[1]["arrival"]):
            kwargs = {k: v for k, v in spec.items() if k != "arrival"}
            d.submit(f"j{index}", now=spec["arrival"], **kwargs)
        if dispatch_first:
            d.dispatch(20.0)
        return d

    d, twin = build(), build()
    group = "film-a"
    if not any(spec["group"] == group for spec in jobs):
        with pytest.raises(UnknownGroup, match="film-a"):
            d.cancel_group(group, now=30.0)
        return
    others = {f"j{i}": s for i, s in enumerate(jobs) if s["group"] != group}
    before = {job_id: (d.state(job_id), d.job(job_id)) for job_id in others}
    mode: CancelRunning = "cancel" if cancel_running else "keep"
    cancelled = d.cancel_group(group, now=30.0, running=mode)
    # The twin cancels the same jobs one by one: the two dispatchers must end up equal.
    for job in cancelled:
        twin.cancel(job.id, now=30.0)
    snap, twin_snap = d.snapshot(now=30.0), twin.snapshot(now=30.0)
    assert snap == twin_snap
    assert {job_id: (d.state(job_id), d.job(job_id)) for job_id in others} == before
    status = d.group_status(group, now=30.0)
    assert status.queued == 0
    assert status.cancelled == len(cancelled)
    running = d.running
    kept = running is not None and d.group_of(running.job.id) == group
    assert status.running == (1 if kept else 0)
    assert not (kept and cancel_running)
    assert [job.seq for job in cancelled] == sorted(job.seq for job in cancelled)
    d._check()


# ---------------------------------------------------------------------------- validation


def test_group_arguments_are_validated() -> None:
    d = SizeOneDispatcher()
    for bad in ("", 5, b"film"):
        with pytest.raises(ValueError, match="group must be a non-empty str"):
            d.submit("a", member="dora", group=bad, now=0.0)  # type: ignore[arg-type]
    assert len(d) == 0
    with pytest.raises(UnknownGroup, match="no job was ever submitted in group 'nope'"):
        d.group_status("nope", now=0.0)
    with pytest.raises(ValueError, match="group must be a non-empty str"):
        d.group_status("", now=0.0)
    d.submit("a", member="dora", group="film", now=0.0)
    with pytest.raises(ValueError, match="running must be 'keep' or 'cancel'"):
        d.cancel_group("film", now=0.0, running="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="running must be 'keep' or 'cancel'"):
        d.cancel_group("film", now=0.0, running=["keep"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="still has 1 job"):
        d.forget_group("film")
    with pytest.raises(UnknownJob):
        d.group_of("nope")
    assert d.group_of("a") == "film"
    assert len(d) == 1  # nothing above changed anything


def test_forget_group_drops_a_finished_group() -> None:
    d = SizeOneDispatcher()
    d.submit("a", member="dora", group="film", now=0.0)
    d.cancel_group("film", now=1.0)
    assert d.group_status("film", now=1.0).cancelled == 1
    d.forget_group("film")
    with pytest.raises(UnknownGroup):
        d.group_status("film", now=1.0)
    with pytest.raises(UnknownGroup):
        d.forget_group("film")


def test_fail_counts_as_failed_and_charges_a_running_job() -> None:
    d = SizeOneDispatcher()
    d.submit("a", member="dora", group="film", now=0.0)
    d.submit("b", member="dora", group="film", now=0.0)
    d.dispatch(0.0)
    assert d.fail("a", now=30.0).id == "a"
    assert d.fail("b", now=30.0).id == "b"
    status = d.group_status("film", now=30.0)
    assert (status.failed, status.cancelled, status.gpu_seconds) == (2, 0, 30.0)
    stats = d.stats(now=30.0)
    assert (stats.failed, stats.cancelled) == (2, 0)
    assert stats.members["dora"].gpu_seconds == 30.0
    with pytest.raises(UnknownJob):
        d.fail("a", now=30.0)
    d.submit("c", member="dora", group="film", now=31.0)
    with pytest.raises(InvalidState):
        d.complete("c", now=32.0)  # queued, not running: nothing changes
    assert d.group_status("film", now=32.0).queued == 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda g: g.update({"film": 5}), "must be a mapping"),
        (lambda g: g["film"].update({"done": -1}), "done must be an int >= 0"),
        (lambda g: g["film"].update({"jobs": [["a", "running"]]}), "is 'running' in the group"),
        (lambda g: g["film"].update({"jobs": [["zz", "queued"]]}), "'zz' is 'queued'"),
        (lambda g: g["film"].pop("gpu_seconds"), "gpu_seconds"),
        (lambda g: g.update({"": {}}), "group must be a non-empty str"),
        (lambda g: g["film"].update({"members": "dora"}), "members must be a list"),
        (lambda g: g["film"].update({"members": [""]}), "member must be a non-empty str"),
    ],
)
def test_restore_refuses_broken_group_data(mutate: Any, message: str) -> None:
    d = SizeOneDispatcher()
    d.submit("a", member="dora", group="film", now=0.0)
    state = json.loads(json.dumps(d.snapshot(now=1.0)))
    mutate(state["groups"])
    with pytest.raises(ValueError, match=message):
        SizeOneDispatcher.restore(state)


def test_snapshot_without_groups_restores_with_none() -> None:
    d = SizeOneDispatcher()
    d.submit("a", member="dora", now=0.0)
    state = d.snapshot(now=1.0)
    del state["groups"]  # a snapshot from before groups
    restored = SizeOneDispatcher.restore(state)
    assert restored.group_of("a") is None
    assert restored.stats(now=1.0).groups == 0


def test_stats_count_groups_with_work() -> None:
    d = SizeOneDispatcher()
    d.submit("a", member="dora", group="f1", now=0.0)
    d.submit("b", member="eve", group="f2", now=0.0)
    d.submit("c", member="eve", now=0.0)
    assert d.stats(now=0.0).groups == 2
    d.cancel("b", now=1.0)
    assert d.stats(now=1.0).groups == 1


def test_prometheus_exposes_running_groups() -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    from prioqueue.prometheus import PrioqueueCollector, render

    d = SizeOneDispatcher()
    d.submit("a", member="dora", group="f1", now=0.0)
    d.submit("b", member="eve", group="f2", now=0.0)
    registry = CollectorRegistry()
    registry.register(PrioqueueCollector(d, clock=lambda: 1.0))

    def running_groups() -> float:
        families = {f.name: f for f in text_string_to_metric_families(render(registry).decode())}
        [sample] = families["prioqueue_groups_running"].samples
        return sample.value

    assert running_groups() == 2
    d.cancel_group("f2", now=1.0)
    assert running_groups() == 1


# ---------------------------------------------------------------------------- the fleet


def test_fleet_groups_count_pops_take_backs_and_leaves() -> None:
    fleet = FleetDispatcher(lease_for=lambda job: 100.0, max_attempts=2, worker_timeout=50.0)
    fleet.join("w1", now=0.0)
    fleet.join("w2", now=0.0)
    for i in range(4):
        fleet.submit(f"s{i}", member="dora", estimate=30.0, group="film", now=0.0)
    fleet.submit("other", member="eve", now=0.0)
    a = fleet.pop("w1", now=0.0)
    b = fleet.pop("w2", now=0.0)
    assert a is not None
    assert b is not None
    assert {a.job.id, b.job.id} <= {"s0", "s1", "other"}
    status = fleet.group_status("film", now=0.0)
    grouped = [g for g in (a, b) if g.job.id != "other"]
    assert (status.running, status.queued) == (len(grouped), 4 - len(grouped))
    # w2 leaves: its job goes back to the queue, counted queued again, its time counted.
    fleet.leave("w2", now=10.0)
    status = fleet.group_status("film", now=10.0)
    assert status.running == (1 if a.job.id != "other" else 0)
    assert status.gpu_seconds == (10.0 if b.job.id != "other" else 0.0)
    # w1 goes silent: its job is taken back at the worker timeout.
    expired = fleet.expire(50.0)
    assert [e.cause for e in expired] == ["worker_timeout"]
    status = fleet.group_status("film", now=50.0)
    assert (status.running, status.queued, status.submitted) == (0, 4, 4)
    fleet._check()
    # A worker's failed run is counted failed; the group finishes as the rest complete.
    grant = fleet.pop("w1", now=60.0)
    assert grant is not None
    fleet.fail(grant.job.id, now=70.0, worker="w1")
    while (grant := fleet.pop("w1", now=70.0)) is not None:
        fleet.complete(grant.job.id, now=70.0, runtime=0.0, worker="w1")
    status = fleet.group_status("film", now=70.0)
    assert status.done + status.failed == 4
    assert not status.active
    assert fleet.stats(now=70.0).groups == 0
    state = json.loads(json.dumps(fleet.snapshot(now=70.0)))
    restored = FleetDispatcher.restore(state)
    assert _counts(restored.group_status("film", now=70.0)) == _counts(status)


_OVERDUE_AT_THE_TOP = [  # eve's 1 s film-a job is overdue (waited past 720 s) at t = 726
    {"member": "dora", "priority": 100, "tier": "free", "estimate": 1.0, "group": "film-b",
     "arrival": 20.0},
    *[{"member": "dora", "priority": -100, "tier": "free", "estimate": 1.0, "group": "film-b",
       "arrival": 0.0}] * 4,
    {"member": "dora", "priority": 100, "tier": "free", "estimate": 241.0, "group": "film-a",
     "arrival": 0.0},
    {"member": "eve", "priority": 100, "tier": "free", "estimate": 1.0, "group": "film-a",
     "arrival": 5.0},
    {"member": "eve", "priority": 100, "tier": "free", "estimate": 465.0, "group": "film-a",
     "arrival": 0.0},
]  # fmt: skip


@settings(max_examples=100)
@given(jobs=_workloads(), workers=st.integers(min_value=1, max_value=3))
@example(jobs=_OVERDUE_AT_THE_TOP, workers=1)  # the forecast applies the overdue rule too
def test_fleet_group_forecast(jobs: list[dict[str, Any]], workers: int) -> None:
    # The fleet forecast treats the fleet as a fluid of its capacity: each predicted job
    # advances the clock by its runtime / N. With one worker that is the real schedule, so the
    # forecast is exact; with N alike workers and exact estimates it stays within the largest
    # job's runtime of the real finish (checked here on random workloads, not a proven bound).
    fleet = FleetDispatcher()
    names = [f"w{i}" for i in range(workers)]
    for name in names:
        fleet.join(name, now=0.0)
    for index, spec in sorted(enumerate(jobs), key=lambda item: item[1]["arrival"]):
        fleet.submit(
            f"j{index}", now=spec["arrival"], **{k: v for k, v in spec.items() if k != "arrival"}
        )
    now = 20.0
    groups = {spec["group"] for spec in jobs if spec["group"] is not None}
    forecasts = {g: fleet.group_status(g, now=now).forecast_finish for g in groups}
    finish: dict[str, float] = {}
    ends: dict[str, float] = {}  # worker -> when its job ends
    held: dict[str, str] = {}
    while len(fleet) or held:
        for name in names:
            if name not in held and (grant := fleet.pop(name, now=now)) is not None:
                held[name] = grant.job.id
                ends[name] = now + (grant.job.estimate or 0.0)
        name = min(held, key=lambda n: (ends[n], n))
        now = ends[name]
        job_id = held.pop(name)
        fleet.complete(job_id, now=now, worker=name)
        group = jobs[int(job_id[1:])]["group"]
        if group is not None:
            finish[group] = max(finish.get(group, 0.0), now)
    longest = max(spec["estimate"] for spec in jobs)
    for group in groups:
        predicted = forecasts[group]
        assert predicted is not None
        if workers == 1:
            assert predicted == pytest.approx(finish[group], abs=1e-6), group
        else:
            assert finish[group] - longest - 1e-6 <= predicted, group
            assert predicted <= finish[group] + longest + 1e-6, group
