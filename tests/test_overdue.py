"""Overdue jobs and the crossing credit's refill (issue 17: no starvation where it can be avoided).

The rules are in docs/design/dispatcher.md, "Overdue jobs" and "Share and credit". Each is
checked on the real dispatcher and on the brute-force reference (which implements it on its
own): a level's oldest job that waited past its aging bound goes before the fair-share choice
when its lane is within the overdue slack ``k * (T + A) * d`` of the level's least-served lane
(``k`` = ``OVERDUE_SLACK``), and not otherwise; a grant at the highest level refills a
negative crossing credit while a lower level waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from prioqueue._core import config as core_config
from prioqueue.dispatcher import OVERDUE_SLACK, SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.scoring import Scorer, ScoringConfig
from prioqueue.testing import ReferenceDispatcher, ReferenceFleet
from prioqueue.testing import _overdue as reference_overdue
from prioqueue.testing import _rules as reference_rules

FAST = Scorer(ScoringConfig(aging_divisor=1.0))  # a point of aging per second
IMPLEMENTATIONS = pytest.mark.parametrize(
    "make", [SizeOneDispatcher, ReferenceDispatcher], ids=["real", "reference"]
)
Factory = Callable[..., Any]
OFFSETS = (2 + 10) * 1.0  # (T + A) * d with the default tiers (0..2) and max_affinity 10
NORMAL_BOUND = 0.75 * 100 * 1.0 + OFFSETS  # normal's overdue bound: B = 100 (interactive)
SLACK = OVERDUE_SLACK * OFFSETS  # how far ahead of the least-served lane an overdue lane may be


def test_the_reference_writes_the_cores_constants_down_on_its_own_and_they_agree() -> None:
    # The reference is written from the note and never imports the core; its constants are
    # its own, so a change to one side alone must fail here, not only in a long stateful run.
    from prioqueue._core import items as core_items
    from prioqueue._core import starving as core_starving

    assert reference_overdue.OVERDUE_SLACK == core_config.OVERDUE_SLACK == OVERDUE_SLACK
    assert reference_rules.SHARE_WINDOW == core_items.SHARE_WINDOW
    assert reference_rules.SHORT_OF_SHARE == core_starving.SHORT_OF_SHARE
    assert reference_overdue.OVERDUE_BAND == core_starving.OVERDUE_BAND
    assert reference_overdue.TOP_OVERDUE == core_starving.TOP_OVERDUE


def _overdue_pair(make: Factory, runtime: float, dispatch_at: float, b_at: float = 1.0) -> str:
    """Member a's two jobs at 0 (a0 runs first), member b's one at ``b_at``; the next grant's.

    a0 runs ``runtime`` seconds up front-charged, so a's lane is at ``s = runtime`` and b's,
    lifted while a0 ran, at ``s = b_at``: fair share picks b0, while a1 is the level's oldest
    job. b0 is overdue itself at ``dispatch_at`` when it has waited past ``NORMAL_BOUND``.
    """
    d = make(FAST)
    d.submit("a0", member="a", priority=0, estimate=runtime, now=0.0)
    d.submit("a1", member="a", priority=0, estimate=runtime, now=0.0)
    grant = d.dispatch(now=0.0)
    assert grant is not None
    assert grant.job.id == "a0"
    assert b_at < runtime
    d.submit("b0", member="b", priority=0, estimate=runtime, now=b_at)
    d.complete("a0", now=runtime)
    grant = d.dispatch(now=dispatch_at)
    assert grant is not None
    return str(grant.job.id)


@IMPLEMENTATIONS
def test_an_overdue_job_goes_first_within_fair_shares_slack(make: Factory) -> None:
    # s(a) = 10 is within OFFSETS of s(b) = 1, and a1 waited 100 s > NORMAL_BOUND (87 s): a1
    # goes first although fair share would pick b0 (overdue too: it waited 99 s).
    assert _overdue_pair(make, 10.0, 100.0) == "a1"


@IMPLEMENTATIONS
@pytest.mark.parametrize("runtime", [30.0, 20.0 + SLACK])
def test_an_overdue_job_passes_a_fresh_one_within_k_offsets(make: Factory, runtime: float) -> None:
    # b0 came at 20: at 100 it waited 80 s, not overdue. Past it a1 may go while s(a) is within
    # SLACK (k offsets, 48 s) of s(b) = 20 (issue 26, fifth round).
    assert _overdue_pair(make, runtime, 100.0, b_at=20.0) == "a1"


@IMPLEMENTATIONS
def test_past_an_overdue_job_the_slack_stays_one_offsets(make: Factory) -> None:
    # s(a) = 30 is within SLACK but more than OFFSETS above s(b) = 1, and b0 is overdue too
    # (it waited 99 s): between two overdue jobs fair share keeps its own width, b0 goes.
    assert _overdue_pair(make, 30.0, 100.0) == "b0"


@IMPLEMENTATIONS
def test_a_job_not_yet_overdue_waits_its_fair_share_turn(make: Factory) -> None:
    # Same lanes, but a1 has waited only 80 s (<= NORMAL_BOUND): fair share picks b0.
    assert _overdue_pair(make, 10.0, 80.0) == "b0"


@IMPLEMENTATIONS
def test_fair_share_wins_over_an_overdue_job_of_a_lane_far_ahead(make: Factory) -> None:
    # s(a) = 69 is more than SLACK above s(b) = 20: the fairness bound's invariant would
    # break, so b0 goes although a1 (waited 100 s) is overdue and b0 (80 s) is not.
    assert _overdue_pair(make, 21.0 + SLACK, 100.0, b_at=20.0) == "b0"


def _top_burst(make: Factory, dispatch_at: float) -> str:
    """Member a's burst of two at the top level (a0 runs 5 s), b's one job at 1 s; who next.

    Fair share picks b0 (a's lane is 5 s ahead); a1 is the level's oldest job.
    """
    d = make(FAST)
    for job in ("a0", "a1"):
        d.submit(job, member="a", priority=100, estimate=5.0, now=0.0)
    grant = d.dispatch(now=0.0)
    assert grant is not None
    assert grant.job.id == "a0"
    d.submit("b0", member="b", priority=100, estimate=5.0, now=1.0)
    d.complete("a0", now=5.0)
    grant = d.dispatch(now=dispatch_at)
    assert grant is not None
    return str(grant.job.id)


@IMPLEMENTATIONS
@pytest.mark.parametrize(("at", "expected"), [(5.5, "b0"), (6.5, "a1"), (11.5, "a1")])
def test_at_the_top_a_burst_is_overdue_half_way_to_its_aging_bound(
    make: Factory, at: float, expected: str
) -> None:
    # Issue 26, sixth round: the top level has no band term, so its overdue wait leaves a
    # share of the aging bound itself: TOP_OVERDUE * OFFSETS = 6 s, not OFFSETS (12 s), after
    # which one member's burst drains FIFO before the report would count it starved.
    assert _top_burst(make, at) == expected


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet], ids=["real", "reference"])
@pytest.mark.parametrize(
    ("top", "at", "expected"),
    [(None, 160.0, "b0"), (None, 170.0, "a1"), (300, 300.0, "b0"), (300, 320.0, "a1")],
)
def test_the_band_term_sets_when_a_job_is_overdue(
    make: Factory, top: int | None, at: float, expected: str
) -> None:
    # Batch lanes as in _overdue_pair (s(a) = 10, s(b) = 1) on a worker that runs only the
    # LLM. The batch level's bound is 0.75 * (B + 100) * d + OFFSETS with B the highest of
    # the policy's named levels (100) and the queued levels: 162 s, or 312 s while a job at
    # level 300 (for a model the worker cannot run) is queued.
    d = make(FAST, warm_hold=0.0)
    d.join("w", models=["llm"], now=0.0)
    if top is not None:
        d.submit("top", member="u", priority=top, model="sd", estimate=10.0, now=0.0)
    for job in ("a0", "a1"):
        d.submit(job, member="a", priority=-100, model="llm", estimate=10.0, now=0.0)
    grant = d.pop("w", now=0.0)
    assert grant is not None
    assert grant.job.id == "a0"
    d.submit("b0", member="b", priority=-100, model="llm", estimate=10.0, now=1.0)
    d.complete("a0", now=10.0)
    grant = d.pop("w", now=at)
    assert grant is not None
    assert grant.job.id == expected


@IMPLEMENTATIONS
def test_without_fair_share_or_inside_a_lane_nothing_is_overdue(make: Factory) -> None:
    # Per-job aging (fair share off): the warm job 60 s younger still wins after an hour.
    d = make(FAST, fair_share=False)
    d.submit("cold", member="a", priority=0, model="m2", estimate=10.0, now=0.0)
    d.submit("warm", member="b", priority=0, model="m1", estimate=10.0, now=6.0)
    d.set_resident_model("m1")
    assert d.dispatch(now=3600.0).job.id == "warm"
    # Inside one lane the affinity job passes the overdue head (within the window).
    d = make(FAST)
    d.submit("head", member="a", priority=0, model="m2", estimate=10.0, now=0.0)
    d.submit("warm", member="a", priority=0, model="m1", estimate=10.0, now=6.0)
    d.set_resident_model("m1")
    assert d.dispatch(now=3600.0).job.id == "warm"


def _film_then_images(make: Factory) -> list[str]:
    """One film (2 shots at 0, batch) against six images (interactive, at 300 s), 100 s each.

    Share 0.5: the first shot crosses (credit -50); the film's lane is then re-anchored and
    young, so the images win by score; the next crossing comes when the images' lane has
    been charged past the film's by the band gap.
    """
    d = make(FAST, crossing_share=0.5)
    d.submit("f.0", member="f", priority="batch", estimate=100.0, now=0.0)
    d.submit("f.1", member="f", priority="batch", estimate=100.0, now=0.0)
    t = 300.0
    for k in range(6):
        d.submit(f"img{k}", member="u", priority="interactive", estimate=100.0, now=t)
    order = []
    while (grant := d.dispatch(now=t)) is not None:
        order.append(str(grant.job.id))
        t += 100.0
        d.complete(grant.job.id, now=t)
    return order


@IMPLEMENTATIONS
def test_a_top_level_grant_refills_the_credit_while_a_lower_level_waits(make: Factory) -> None:
    order = _film_then_images(make)
    # img0 is no deferral (the images win by score: the film's lane was re-anchored) and
    # refills the credit from -50 to 0 while the film waits, so when the film's lane crosses
    # again (after img1) the crossing goes ahead. Refilled by deferrals alone, the credit
    # would still be -50 there and f.1 would be deferred once more, for img2.
    assert order == ["f.0", "img0", "img1", "f.1", "img2", "img3", "img4", "img5"]


def _warm_overdue(make: Factory, warm_at: float) -> str:
    """Top level, resident m1: a1 (m2, at 1) is overdue at 50 s; c1 (m1) came at ``warm_at``.

    x0 (m1) runs first and leaves m1 loaded; the top level's overdue wait is ``OFFSETS``
    (12 s) and the affinity window ``A * d`` is 10 s.
    """
    d = make(FAST)
    d.submit("x0", member="x", priority=100, model="m1", estimate=50.0, now=0.0)
    grant = d.dispatch(now=0.0)
    assert grant is not None
    assert grant.job.id == "x0"
    d.submit("a1", member="a", priority=100, model="m2", estimate=10.0, now=1.0)
    d.submit("b1", member="b", priority=100, model="m3", estimate=10.0, now=2.0)
    d.submit("c1", member="c", priority=100, model="m1", estimate=10.0, now=warm_at)
    d.complete("x0", now=50.0)
    grant = d.dispatch(now=50.0)
    assert grant is not None
    return str(grant.job.id)


@IMPLEMENTATIONS
def test_an_overdue_grant_takes_the_resident_models_job_within_the_window(
    make: Factory,
) -> None:
    # Issue 26: FIFO among overdue jobs would swap m1 out for a1 at every grant (the Azure code
    # trace's thrash); c1 for the resident model came 4 s after a1 (within the 10 s window),
    # so c1 goes, as an affinity job may pass its own lane's head within the window.
    assert _warm_overdue(make, 5.0) == "c1"
    # c1 came 19 s after a1: past the window, the overdue a1 goes first.
    assert _warm_overdue(make, 20.0) == "a1"


def _crossing(make: Factory, normal_at: float) -> str:
    """A batch job (at 0), a normal one (at ``normal_at``), a fresh interactive one at 270 s.

    The batch job wins by score (aged 270 points) and crosses; the credit is 0, so the
    crossing goes ahead, to a level chosen by ``crossing_level``.
    """
    d = make(FAST)
    d.submit("batch", member="b", priority=-100, estimate=10.0, now=0.0)
    d.submit("normal", member="n", priority=0, estimate=10.0, now=normal_at)
    d.submit("inter", member="i", priority=100, estimate=10.0, now=270.0)
    grant = d.dispatch(now=270.0)
    assert grant is not None
    return str(grant.job.id)


@IMPLEMENTATIONS
def test_a_crossing_serves_the_highest_starving_level_first(make: Factory) -> None:
    # The normal job waited 120 s, past its aging bound (100 + 12 s): the highest level with
    # a starving job takes the crossing, although the batch job waited longer for its band.
    assert _crossing(make, 150.0) == "normal"
    # Waited 70 s: nothing starves above batch, so the oldest for its band (batch) goes.
    assert _crossing(make, 200.0) == "batch"


@pytest.mark.parametrize("make", [FleetDispatcher, ReferenceFleet], ids=["real", "reference"])
def test_an_overdue_job_that_accepts_the_resident_model_gets_its_affinity(make: Factory) -> None:
    # Found by the fleet's long hunt: an overdue grant of a job that accepts several models,
    # the worker's resident among them, reported affinity 0 (the real one read job.model).
    scorer = Scorer(ScoringConfig(max_affinity=3, aging_divisor=0.5, affinity_by_model={"m2": 1.5}))
    d = make(scorer)
    d.join("gpu-a", slots=2, now=1000.0)
    d.join("gpu-b", resident="m2", now=1000.0)
    d.submit("a0", member="a", priority=100, now=1000.0)
    d.submit("a1", member="a", priority=100, now=1000.0)
    assert d.pop("gpu-b", now=1240.0).job.id == "a0"
    d.submit("b0", member="b", priority=100, needs={"models": ["m1", "m2"]}, now=1240.0)
    d.submit("a2", member="a", priority=100, now=1240.0)
    assert d.pop("gpu-a", now=1240.0).job.id == "a1"
    d.complete("a0", now=1240.0)
    grant = d.pop("gpu-b", now=1244.0)  # b0 waited 4 s, past (T + A) * d = 2.5 s: overdue
    assert grant is not None
    assert (grant.job.id, grant.job.model) == ("b0", "m2")
    assert grant.score.swap_affinity == 1.5


@pytest.mark.parametrize("warm_at", [5.0, 20.0])
def test_the_forecast_predicts_the_warm_overdue_grant(warm_at: float) -> None:
    # The forecast replays the dispatcher's own rules, the warm overdue grant included: the
    # predicted order is the order the dispatches then take (exact estimates, no arrivals).
    d = SizeOneDispatcher(FAST)
    d.submit("x0", member="x", priority=100, model="m1", estimate=50.0, now=0.0)
    assert d.dispatch(now=0.0) is not None
    d.submit("a1", member="a", priority=100, model="m2", estimate=10.0, now=1.0)
    d.submit("b1", member="b", priority=100, model="m3", estimate=10.0, now=2.0)
    d.submit("c1", member="c", priority=100, model="m1", estimate=10.0, now=warm_at)
    predicted = [ahead.job_id for ahead in d.forecast(now=warm_at)]
    order, t = [], 50.0
    d.complete("x0", now=t)
    while (grant := d.dispatch(now=t)) is not None:
        order.append(grant.job.id)
        t += 10.0
        d.complete(grant.job.id, now=t)
    assert predicted == order
    assert order[0] == ("c1" if warm_at == 5.0 else "a1")
