"""The design's scenarios, run on SizeOneDispatcher and on the brute-force ReferenceDispatcher.

Each scenario checks a promise of ``docs/design/dispatcher.md`` and then runs a baseline with
fair share off (or with the relevant term of the score off) to show that the same check fails
there: a test that cannot fail proves nothing. The scenarios run on a small discrete-event
simulator (:func:`simulate`): arrivals at given times, one job at a time on the resource, each
job running for a runtime the test decides, the dispatcher asked for the next job whenever the
resource frees up.

The file ends with direct unit tests of :class:`ManualClock` and of the reference model.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affinity_support import film_passed_by_newcomers
from prioqueue import DuplicateJob, InvalidState, LeaseExpired, QueueFull, UnknownJob
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.records import Grant, Job
from prioqueue.scoring import Scorer, ScoringConfig
from prioqueue.testing import ManualClock, ReferenceDispatcher
from strategies import overdue_slack_seconds, two_tiers

Dispatcher = SizeOneDispatcher | ReferenceDispatcher
Factory = type[SizeOneDispatcher] | type[ReferenceDispatcher]

IMPLEMENTATIONS = pytest.mark.parametrize(
    "make", [SizeOneDispatcher, ReferenceDispatcher], ids=["real", "reference"]
)

SHOT = 240.0  # a film shot: about four minutes of H3 generation
FILM = 174  # shots in the 12-hour film of steve/mort#1567


# --- a small simulator ------------------------------------------------------------------------


@attrs.frozen
class Arrival:
    """A job submitted at ``at`` with ``submit(**spec)``."""

    at: float
    job_id: str
    spec: dict[str, Any]


@attrs.define
class Run:
    """What happened in a simulation: every grant, and every completion with its runtime."""

    grants: list[Grant] = attrs.field(factory=list)
    completions: list[tuple[float, Job, float]] = attrs.field(factory=list)

    def grant_of(self, job_id: str) -> Grant:
        return next(grant for grant in self.grants if grant.job.id == job_id)

    def waits(self, prefix: str) -> list[float]:
        return [grant.waited for grant in self.grants if grant.job.id.startswith(prefix)]


def simulate(
    dispatcher: Dispatcher,
    arrivals: Iterable[Arrival],
    runtime: Callable[[Job], float],
    *,
    on_complete: Callable[[Job, float], Iterable[Arrival]] = lambda job, t: (),
    check: Callable[[Run, float], None] = lambda run, t: None,
) -> Run:
    """Run the resource until every job is done.

    At each moment, in this order: the running job completes (``on_complete`` may add arrivals,
    ``check`` is called after it), the arrivals due are submitted, and an idle resource
    dispatches.
    """
    pending = [(a.at, n, a) for n, a in enumerate(arrivals)]
    heapq.heapify(pending)
    order = len(pending)
    run = Run()
    running: tuple[float, Grant] | None = None
    while pending or running is not None:
        t = min([pending[0][0]] if pending else [], default=math.inf)
        if running is not None:
            t = min(t, running[0])
        if running is not None and running[0] == t:
            job = running[1].job
            ran = t - running[1].granted_at
            dispatcher.complete(job.id, now=t, runtime=ran)
            run.completions.append((t, job, ran))
            running = None
            for arrival in on_complete(job, t):
                heapq.heappush(pending, (arrival.at, order, arrival))
                order += 1
            check(run, t)
        while pending and pending[0][0] <= t:
            arrival = heapq.heappop(pending)[2]
            dispatcher.submit(arrival.job_id, now=t, **arrival.spec)
        if running is None:
            grant = dispatcher.dispatch(t)
            if grant is not None:
                run.grants.append(grant)
                running = (t + runtime(grant.job), grant)
    assert len(dispatcher) == 0
    return run


def _shot_runtime(job: Job) -> float:
    return SHOT if job.id.startswith("shot") else 30.0


# --- 1. the film against interactive images --------------------------------------------------


def _film_run(
    make: Factory,
    *,
    fair_share: bool,
    one_at_a_time: bool,
    image_every: float,
    image_runtime: float,
    crossing_share: float | None = None,
) -> Run:
    """174 batch shots (all at once, or one per completion) and images arriving all along.

    ``crossing_share=1.0`` turns off bounded crossings (the policy before issue 17).
    """
    film = {"member": "steve", "priority": "batch", "tier": "max"}
    arrivals = [Arrival(0.0, "shot0", film)]
    if not one_at_a_time:
        arrivals += [Arrival(0.0, f"shot{k}", film) for k in range(1, FILM)]
    images = int(FILM * SHOT * 1.6 / image_every)
    arrivals += [
        Arrival(image_every * (k + 1) - 7.0, f"img{k}", {"member": f"u{k % 3}", "priority": 100})
        for k in range(images)
    ]
    shots = iter(range(1, FILM))

    def resubmit(job: Job, t: float) -> list[Arrival]:
        if one_at_a_time and job.id.startswith("shot"):
            k = next(shots, None)
            return [] if k is None else [Arrival(t, f"shot{k}", film)]
        return []

    options: dict[str, Any] = {} if crossing_share is None else {"crossing_share": crossing_share}
    dispatcher = make(fair_share=fair_share, **options)
    return simulate(
        dispatcher,
        arrivals,
        lambda job: SHOT if job.id.startswith("shot") else image_runtime,
        on_complete=resubmit,
    )


@IMPLEMENTATIONS
def test_film_shots_delay_an_interactive_image_by_at_most_one_shot(make: Factory) -> None:
    run = _film_run(make, fair_share=True, one_at_a_time=False, image_every=420, image_runtime=30)
    assert len(run.waits("shot")) == FILM
    assert max(run.waits("img")) <= SHOT
    # Baseline: per-job aging without bounded crossings (before issue 17). After ~3.3 hours
    # the whole remaining film outranks fresh images.
    baseline = _film_run(
        make,
        fair_share=False,
        one_at_a_time=False,
        image_every=420,
        image_runtime=30,
        crossing_share=1.0,
    )
    assert max(baseline.waits("img")) > 10 * SHOT
    # Issue 17: bounded crossings alone keep per-job aging from handing the film the GPU.
    # An image waits for the shot that runs, and at most one crossing shot more.
    bounded = _film_run(
        make, fair_share=False, one_at_a_time=False, image_every=420, image_runtime=30
    )
    assert len(bounded.waits("shot")) == FILM
    assert max(bounded.waits("img")) <= 2 * SHOT


# --- 2. 200 shots from one member against one job from another ---------------------------


@IMPLEMENTATIONS
@pytest.mark.parametrize("level", [-100, 0])
@pytest.mark.parametrize("other_arrives", [0.0, 10.0, 1000.0, 5000.0])
def test_one_job_waits_for_at_most_one_of_200_shots(
    make: Factory, level: int, other_arrives: float
) -> None:
    def shots_before_the_other(fair_share: bool) -> int:
        arrivals = [
            Arrival(0.0, f"shot{k}", {"member": "ann", "priority": level}) for k in range(200)
        ]
        arrivals.append(Arrival(other_arrives, "other", {"member": "bob", "priority": level}))
        run = simulate(make(fair_share=fair_share), arrivals, _shot_runtime)
        granted = run.grant_of("other").granted_at
        # Shots that were running or started while the other job waited.
        return sum(
            1
            for g in run.grants
            if g.job.id.startswith("shot")
            and g.granted_at + SHOT > other_arrives
            and g.granted_at <= granted
            and g.job.id != "other"
        )

    assert shots_before_the_other(True) <= 2  # the running one, plus at most one more
    without = shots_before_the_other(False)
    assert without >= 200 - int(other_arrives // SHOT)  # it waits for every remaining shot


# --- 3. tiers inside a band ------------------------------------------------------------------


def _order_after_blocker(
    dispatcher: Dispatcher, jobs: list[tuple[str, dict[str, Any]]], *, at: float = 0.0
) -> list[str]:
    """Submit the jobs at ``at`` while a blocker runs, then drain: the dispatch order."""
    dispatcher.submit("blocker", member="ops", priority=10_000, now=at)
    assert dispatcher.dispatch(at) is not None
    for job_id, spec in jobs:
        dispatcher.submit(job_id, now=at, **spec)
    t = at + 60.0
    dispatcher.complete("blocker", now=t)
    order = []
    while (grant := dispatcher.dispatch(t)) is not None:
        order.append(grant.job.id)
        dispatcher.complete(grant.job.id, now=t, runtime=0.0)
    return order


TIERED = [
    ("free", {"member": "fay", "priority": 0, "tier": "free"}),
    ("pro", {"member": "pat", "priority": 0, "tier": "pro"}),
    ("max", {"member": "max", "priority": 0, "tier": "max"}),
]


@IMPLEMENTATIONS
@pytest.mark.parametrize("fair_share", [True, False])
def test_max_beats_pro_beats_free_at_equal_waits(make: Factory, fair_share: bool) -> None:
    assert _order_after_blocker(make(fair_share=fair_share), TIERED) == ["max", "pro", "free"]
    # Baseline: without tier bonuses the order is arrival order.
    flat = Scorer(ScoringConfig(tier_bonuses={"free": 0, "pro": 0, "max": 0}))
    assert _order_after_blocker(make(flat, fair_share=fair_share), TIERED) == [
        "free",
        "pro",
        "max",
    ]


@IMPLEMENTATIONS
def test_tier_never_crosses_a_band(make: Factory) -> None:
    jobs = [
        ("max-batch", {"member": "max", "priority": "batch", "tier": "max"}),
        ("free-normal", {"member": "fay", "priority": "normal", "tier": "free"}),
        ("max-normal", {"member": "mo", "priority": "normal", "tier": "max"}),
        ("free-interactive", {"member": "fi", "priority": "interactive", "tier": "free"}),
    ]
    order = _order_after_blocker(make(), jobs)
    assert order == ["free-interactive", "max-normal", "free-normal", "max-batch"]
    # Baseline: levels closer together than the largest offset do let tiers cross them.
    close = [
        ("free-1", {"member": "fay", "priority": 1, "tier": "free"}),
        ("max-0", {"member": "max", "priority": 0, "tier": "max"}),
    ]
    assert _order_after_blocker(make(), close) == ["max-0", "free-1"]


# --- 4. swap affinity ------------------------------------------------------------------------


def _winner_with_resident(
    dispatcher: Dispatcher,
    jobs: list[tuple[float, str, dict[str, Any]]],
    now: float,
    blocker: dict[str, Any] | None = None,
) -> str:
    """Load ``m1`` with a blocker, submit the jobs at their times, and return the next grant."""
    spec = {"member": "ops", "priority": 10_000, "model": "m1"} if blocker is None else blocker
    dispatcher.submit("blocker", now=0.0, **spec)
    assert dispatcher.dispatch(0.0) is not None
    for at, job_id, spec in jobs:
        dispatcher.submit(job_id, now=at, **spec)
    dispatcher.complete("blocker", now=now)
    assert dispatcher.resident_model == "m1"
    grant = dispatcher.dispatch(now)
    assert grant is not None
    return grant.job.id


NEAR_TIES = [(60.0, "warm"), (599.0, "warm"), (600.0, "cold"), (601.0, "cold"), (1800.0, "cold")]


def _check_near_tie(
    make: Factory,
    winner: str,
    *,
    warm_at: float,
    now: float,
    blocker: dict[str, Any] | None = None,
    **options: Any,
) -> None:
    """A cold job (ann, m2) at 0 and a warm one (bob, m1) at ``warm_at``, granted at ``now``
    after a blocker that loads m1 (see ``_winner_with_resident``): a ``make(**options)``
    dispatcher grants ``winner``; where the warm job wins, the baseline without affinity
    (``max_affinity=0``) grants the cold one."""
    jobs = [
        (0.0, "cold", {"member": "ann", "model": "m2"}),
        (warm_at, "warm", {"member": "bob", "model": "m1"}),
    ]
    assert _winner_with_resident(make(**options), jobs, now=now, blocker=blocker) == winner
    if winner == "warm":
        no_affinity = Scorer(ScoringConfig(max_affinity=0))
        baseline = _winner_with_resident(make(no_affinity, **options), jobs, now, blocker)
        assert baseline == "cold"


@IMPLEMENTATIONS
@pytest.mark.parametrize(("behind", "winner"), NEAR_TIES)
def test_affinity_breaks_near_ties_between_lanes(make: Factory, behind: float, winner: str) -> None:
    """A warm lane up to 10 points (600 s of charges) behind a cold one still wins; at exactly
    10 points they tie and the lane with the smaller ``s`` (the cold one) wins. Baseline:
    without affinity the lane that paid less wins."""
    blocker = {"member": "bob", "priority": 0, "model": "m1"}  # bob's lane pays `behind`
    _check_near_tie(make, winner, warm_at=0.0, now=behind, blocker=blocker)


@IMPLEMENTATIONS
@pytest.mark.parametrize(("later_by", "winner"), NEAR_TIES)
def test_affinity_breaks_near_ties_between_jobs(
    make: Factory, later_by: float, winner: str
) -> None:
    """Per-job aging (fair share off): a warm job up to 600 s younger beats a cold one.
    Baseline: without affinity the older job always wins."""
    _check_near_tie(make, winner, warm_at=later_by, now=2000.0, fair_share=False)


@IMPLEMENTATIONS
def test_affinity_never_crosses_a_band(make: Factory) -> None:
    jobs = [
        (0.0, "warm-batch", {"member": "ann", "priority": "batch", "model": "m1", "tier": "max"}),
        (1000.0, "cold-normal", {"member": "bob", "priority": "normal", "model": "m2"}),
    ]
    assert _winner_with_resident(make(), jobs, now=1000.0) == "cold-normal"
    # Baseline: levels closer than the affinity bound are crossed by it.
    close = [
        (0.0, "warm", {"member": "ann", "priority": -5, "model": "m1"}),
        (0.0, "cold", {"member": "bob", "priority": 0, "model": "m2"}),
    ]
    assert _winner_with_resident(make(), close, now=1000.0) == "warm"


@IMPLEMENTATIONS
def test_a_start_lifted_while_a_model_was_resident_does_not_outlast_it(make: Factory) -> None:
    """Issue 26, twelfth round: the lift counts the tier, not the affinity.

    Heavy ``h`` queues 30 one-minute jobs for ``x`` at 0; ``y`` is resident. Light ``l``
    sends one job for ``y`` at 100, so it is lifted level with ``h`` (``s`` = 0). Then ``x``
    is loaded, and ``h``, eligible for it, wins by the affinity bonus (10 points, 600 s of
    charges) until its ``s`` has moved 600 s: 10 jobs, and ``l`` wins the tie. Had the lift
    started ``l`` 600 s later for the bonus its job had when it arrived, ``h`` would run 20.
    """
    d = make()
    d.set_resident_model("y")
    for i in range(30):
        d.submit(f"h{i}", member="h", model="x", estimate=60.0, now=0.0)
    d.submit("l", member="l", model="y", estimate=60.0, now=100.0)
    d.set_resident_model("x")
    now, order = 1000.0, []
    while (grant := d.dispatch(now)) is not None and grant.job.id != "l":
        order.append(grant.job.id)
        now += 60.0
        d.complete(grant.job.id, now=now)
    assert grant is not None
    assert grant.job.id == "l"
    assert order == [f"h{i}" for i in range(10)]


@IMPLEMENTATIONS
def test_newcomers_for_the_resident_model_pass_the_oldest_lane_until_it_is_overdue(
    make: Factory,
) -> None:
    """The price of the tier-only lift: a stream of one-off members, each with a job for the
    resident model, each lifted level with the film's lane and winning by the affinity bonus,
    passes the film's job for another model until that job is overdue (``OVERDUE_BAND * (B -
    L) * d + (T + A) * d`` = 0.75 * 100 * 60 + 720 = 5,220 s at the normal level), and no
    longer. (With the affinity in the lift the job went at 600 s, the affinity window.)
    """
    assert film_passed_by_newcomers(make()) == 5280.0  # the first pop after 5,220 s


@IMPLEMENTATIONS
@pytest.mark.parametrize(("gap", "given"), [(600.0, "warm"), (601.0, "head")])
def test_lane_gives_its_affinity_job_only_within_the_window(
    make: Factory, gap: float, given: str
) -> None:
    """Inside one lane a warm job may pass the head only if it arrived within W = A * d."""
    jobs = [
        (0.0, "head", {"member": "ann", "model": "m2"}),
        (gap, "warm", {"member": "ann", "model": "m1"}),
    ]
    assert _winner_with_resident(make(), jobs, now=2000.0) == given


# --- 5. aging crosses a band after the overtake horizon --------------------------------------


def _lower_overtakes(make: Factory, scorer: Scorer, extra_wait: float) -> bool:
    """The worst case across one band: a bare batch job against a max-tier warm normal job."""
    jobs = [
        (0.0, "low", {"member": "ann", "priority": "batch", "tier": "free", "model": "m2"}),
        (extra_wait, "high", {"member": "bob", "priority": "normal", "tier": "max", "model": "m1"}),
    ]
    return _winner_with_resident(make(scorer), jobs, now=extra_wait + 1.0) == "low"


@IMPLEMENTATIONS
def test_aging_crosses_a_band_after_the_horizon_and_not_a_second_earlier(make: Factory) -> None:
    scorer = Scorer()
    horizon = scorer.overtake_horizon(100)
    assert horizon == (100 + 12) * 60
    assert not _lower_overtakes(make, scorer, horizon - 1.0)
    assert _lower_overtakes(make, scorer, horizon)  # a tie: the older lane (smaller s) wins
    assert _lower_overtakes(make, scorer, horizon + 1.0)
    # Baseline: with (practically) no aging a batch job never crosses the band.
    frozen = Scorer(ScoringConfig(aging_divisor=1e12))
    assert not _lower_overtakes(make, frozen, 10 * horizon)


# --- 6. the fairness bound -------------------------------------------------------------------


def _gpu_gap_run(
    make: Factory,
    jobs_a: list[tuple[float, str | None]],
    jobs_b: list[tuple[float, str | None]],
    *,
    fair_share: bool,
    tiers: tuple[str, str],
) -> list[float]:
    """Both members submit all their jobs at t=0 at level 0; return |gpu_a - gpu_b| at every
    completion while both stay backlogged."""
    runtimes: dict[str, float] = {}
    arrivals = []
    for member, jobs, tier in (("a", jobs_a, tiers[0]), ("b", jobs_b, tiers[1])):
        for k, (runtime, model) in enumerate(jobs):
            job_id = f"{member}{k}"
            runtimes[job_id] = runtime
            spec = {"member": member, "priority": 0, "tier": tier, "model": model}
            arrivals.append(Arrival(0.0, job_id, spec))
    dispatcher = make(fair_share=fair_share)
    gaps: list[float] = []
    remaining = {"a": len(jobs_a), "b": len(jobs_b)}

    def check(run: Run, t: float) -> None:
        job = run.completions[-1][1]
        remaining[job.member] -= 1
        if min(remaining.values()) > 0:  # both still backlogged (or running)
            gpu = {"a": 0.0, "b": 0.0}
            for _, done, ran in run.completions:
                gpu[done.member] += ran
            gaps.append(abs(gpu["a"] - gpu["b"]))

    simulate(dispatcher, arrivals, lambda job: runtimes[job.id], check=check)
    return gaps


_C = 300.0
_jobs = st.lists(
    st.tuples(st.sampled_from([1.0, 30.0, 90.0, 240.0, _C]), st.sampled_from([None, "m1", "m2"])),
    min_size=10,
    max_size=25,
)


@IMPLEMENTATIONS
@settings(max_examples=40)
@given(jobs_a=_jobs, jobs_b=_jobs, different_tiers=st.booleans())
def test_two_backlogged_members_stay_within_the_fairness_bound(
    make: Factory,
    jobs_a: list[tuple[float, str | None]],
    jobs_b: list[tuple[float, str | None]],
    different_tiers: bool,
) -> None:
    config = ScoringConfig()
    tiers, spread = two_tiers(different_tiers)
    largest = max(runtime for runtime, _ in jobs_a + jobs_b)
    offsets = (spread + config.max_affinity) * config.aging_divisor
    bound = 2 * largest + max(offsets, overdue_slack_seconds(config))
    gaps = _gpu_gap_run(make, jobs_a, jobs_b, fair_share=True, tiers=tiers)
    assert all(gap <= bound for gap in gaps), (max(gaps), bound)


@IMPLEMENTATIONS
def test_without_fair_share_the_fairness_bound_breaks(make: Factory) -> None:
    jobs: list[tuple[float, str | None]] = [(_C, "m1")] * 20
    bound = 2 * _C + overdue_slack_seconds()  # the size-1 bound, 2C + max((T + A) d, k Δ)
    assert max(_gpu_gap_run(make, jobs, jobs, fair_share=True, tiers=("pro", "pro"))) <= bound
    assert max(_gpu_gap_run(make, jobs, jobs, fair_share=False, tiers=("pro", "pro"))) > bound


# --- 7. bulk submission against a one-at-a-time producer ------------------------------------


@IMPLEMENTATIONS
def test_bulk_submission_does_not_outrank_interactive_sooner_than_one_at_a_time(
    make: Factory,
) -> None:
    """Film shots submitted at once or one per completion give images the same waits."""
    kwargs: dict[str, Any] = {"image_every": 420.0, "image_runtime": 30.0}
    bulk = _film_run(make, fair_share=True, one_at_a_time=False, **kwargs)
    trickle = _film_run(make, fair_share=True, one_at_a_time=True, **kwargs)
    assert max(bulk.waits("img")) <= max(trickle.waits("img"))
    assert bulk.waits("img") == trickle.waits("img")
    # Baseline: per-job aging (without bounded crossings, as before issue 17) lets the bulk
    # backlog outrank images once it is 3.3 hours old.
    bulk_off = _film_run(make, fair_share=False, one_at_a_time=False, crossing_share=1.0, **kwargs)
    trickle_off = _film_run(
        make, fair_share=False, one_at_a_time=True, crossing_share=1.0, **kwargs
    )
    assert max(bulk_off.waits("img")) > 10 * max(trickle_off.waits("img"))


@IMPLEMENTATIONS
def test_bulk_submission_under_heavy_interactive_load(make: Factory) -> None:
    """Heavy interactive load: a lane alone at its level is re-anchored after each charge."""
    kwargs: dict[str, Any] = {"image_every": 150.0, "image_runtime": 100.0}
    bulk = _film_run(make, fair_share=True, one_at_a_time=False, **kwargs)
    trickle = _film_run(make, fair_share=True, one_at_a_time=True, **kwargs)
    assert max(bulk.waits("img")) <= max(trickle.waits("img"))


# --- unit tests of the testing helpers ------------------------------------------------------


def test_manual_clock() -> None:
    clock = ManualClock()
    assert clock() == clock.now() == 0.0
    assert clock.advance(1.5) == 1.5
    assert clock.jump_to(10) == 10.0
    assert clock.jump_to(10) == 10.0
    assert isinstance(clock(), float)
    with pytest.raises(ValueError, match="backwards"):
        clock.jump_to(9.0)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="finite"):
        clock.advance(math.inf)
    with pytest.raises(TypeError):
        ManualClock("0")  # type: ignore[arg-type]
    assert repr(ManualClock(start=5.0)) == "ManualClock(5.0)"


def test_reference_lift_charge_and_fifo() -> None:
    ref = ReferenceDispatcher()
    ref.submit("a1", member="ann", now=0.0)
    ref.submit("a2", member="ann", now=0.0)
    assert ref.lane_start("ann", 0) == 0.0
    grant = ref.dispatch(0.0)
    assert grant is not None
    assert grant.job.id == "a1"
    # The grant charges ann's lane its expected charge up front: no estimate and no runtime
    # seen yet, so the default expected runtime (60 s) on a fleet of one.
    assert ref.lane_start("ann", 0) == 60.0
    ref.submit("b1", member="bob", now=100.0)  # lifted to min(now, s of ann) = 60
    assert ref.lane_start("bob", 0) == 60.0
    done = ref.complete("a1", now=240.0)
    assert (done.runtime, done.charge) == (240.0, 240.0)
    assert ref.lane_start("ann", 0) == 240.0  # corrected to the real charge at completion
    grant = ref.dispatch(240.0)
    assert grant is not None
    assert grant.job.id == "b1"
    assert grant.score.aging == 3.0  # (240 - 60) / 60
    assert grant.waited == 140.0
    ref.complete("b1", now=10_000.0, runtime=5.0)
    assert ref.lane_start("bob", 0) == 65.0
    ref.cancel("a2", now=10_000.0)  # ann's lane goes idle and keeps its s
    ref.submit("a3", member="ann", now=20_000.0)  # alone at its level: lifted to now
    assert ref.lane_start("ann", 0) == 20_000.0
    assert ref.lane_start("nobody", 0) == -math.inf


def test_reference_charge_is_clamped_to_now() -> None:
    ref = ReferenceDispatcher(charge="estimate")
    ref.submit("a", member="ann", estimate=900.0, now=0.0)
    ref.dispatch(0.0)
    assert ref.complete("a", now=10.0).charge == 900.0
    assert ref.lane_start("ann", 0) == 10.0


def test_reference_errors() -> None:
    ref = ReferenceDispatcher(lease_for=lambda job: 100.0, max_attempts=2, max_queued=2)
    ref.submit("a", member="ann", now=0.0)
    with pytest.raises(DuplicateJob):
        ref.submit("a", member="bob", now=0.0)
    with pytest.raises(InvalidState):
        ref.complete("a", now=0.0)
    with pytest.raises(UnknownJob):
        ref.cancel("zz", now=0.0)
    ref.submit("b", member="bob", now=0.0)
    with pytest.raises(QueueFull) as full:
        ref.submit("c", member="cyd", now=0.0)
    assert full.value.scope == "queue"
    assert full.value.retry_after >= 1
    assert ref.dispatch(1.0) is not None
    assert ref.next_deadline() == 101.0
    with pytest.raises(LeaseExpired):
        ref.complete("a", now=101.0)
    assert ref.state("a") == "running"
    with pytest.raises(ValueError, match="backwards"):
        ref.dispatch(0.5)
    assert ref.expire(100.5) == []
    (first,) = ref.expire(101.0)
    assert first.requeued
    assert first.attempt == 1
    assert ref.job("a").id == "a"
    assert ref.state("a") == "queued"
    assert len(ref) == 2
    grant = ref.dispatch(101.0)  # requeued at its lane's head, with its age kept
    assert grant is not None
    assert grant.job.id == "a"
    assert grant.attempt == 2
    (second,) = ref.expire(500.0)
    assert not second.requeued
    assert "a" not in ref
    stats = ref.stats(now=500.0)
    assert (stats.expired, stats.failed, stats.dispatched, stats.queued) == (2, 1, 2, 1)
    with pytest.raises(UnknownJob):
        ref.state("a")


def test_reference_affinity_job_and_swaps() -> None:
    ref = ReferenceDispatcher()
    ref.set_resident_model("m1")
    ref.submit("x", member="ann", model="m2", now=0.0)
    ref.submit("y", member="ann", model="m1", now=30.0)
    ref.submit("z", member="ann", now=40.0)
    grant = ref.dispatch(50.0)
    assert grant is not None
    assert grant.job.id == "y"
    assert not grant.swap
    assert grant.score.swap_affinity == 10
    ref.complete("y", now=60.0)
    grant = ref.dispatch(60.0)
    assert grant is not None
    assert grant.job.id == "x"
    assert grant.swap
    assert ref.resident_model == "m2"
    ref.complete("x", now=70.0)
    grant = ref.dispatch(70.0)  # no model: no swap, the resident model stays
    assert grant is not None
    assert grant.job.id == "z"
    assert not grant.swap
    assert ref.resident_model == "m2"
    assert ref.stats(now=70.0).swaps == 1


def test_reference_counts_reorders_by_cause() -> None:
    ref = ReferenceDispatcher()
    ref.set_resident_model("m1")
    ref.submit("old", member="ann", model="m2", now=0.0)
    ref.submit("warm", member="bob", model="m1", now=60.0)
    grant = ref.dispatch(60.0)
    assert grant is not None
    assert grant.job.id == "warm"
    reorders = ref.stats(now=60.0).levels[0].reorders
    assert reorders.affinity == 1
    assert reorders.aging == 0
    assert reorders.tier == 0
    off = ReferenceDispatcher(track_reorders=False)
    off.set_resident_model("m1")
    off.submit("old", member="ann", model="m2", now=0.0)
    off.submit("warm", member="bob", model="m1", now=60.0)
    off.dispatch(60.0)
    assert off.stats(now=60.0).levels[0].reorders.affinity == 0


def test_reference_without_fair_share_is_per_job_aging() -> None:
    ref = ReferenceDispatcher(fair_share=False)
    for k in range(3):
        ref.submit(f"a{k}", member="ann", now=0.0)
    ref.submit("b", member="bob", now=1.0)
    order = []
    while (grant := ref.dispatch(10.0)) is not None:
        order.append(grant.job.id)
        assert ref.complete(grant.job.id, now=10.0, runtime=5.0).charge == 5.0  # not applied
    assert order == ["a0", "a1", "a2", "b"]
    assert ref.lane_start("ann", 0) == -math.inf
