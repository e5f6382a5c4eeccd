"""Properties of the dashboard's reads (``prioqueue.ui.model``) on random dispatcher states.

* What a member may not see never appears: no other member's name or job id anywhere in the
  lanes, workers, groups or an explanation.
* The lists stay within their bounds whatever the queue holds.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prioqueue.fleet import FleetDispatcher
from prioqueue.ui import model as _model

MEMBERS = ("alice", "bob-q7", "carol-z3")
MODELS = ("m-a", "m-b", None)

_step = st.one_of(
    st.tuples(
        st.just("submit"),
        st.sampled_from(MEMBERS),
        st.integers(-1, 2),
        st.sampled_from(MODELS),
        st.sampled_from((None, "film", "reel")),
    ),
    st.tuples(st.just("pop"), st.integers(0, 2)),
    st.tuples(st.just("complete"), st.integers(0, 2)),
)


def _run(steps: list[tuple[Any, ...]]) -> tuple[FleetDispatcher, float]:
    d = FleetDispatcher(lease_for=lambda job: 600.0)
    t = 0.0
    for w in range(3):
        d.join(f"gpu-{w}", slots=2, now=t)
    for n, step in enumerate(steps):
        t += 1.0
        if step[0] == "submit":
            _, member, priority, model, group = step
            d.submit(
                f"job-{member}-{n}", member=member, priority=priority, model=model,
                estimate=5.0, group=None if group is None else f"{len(member)}:{member}/{group}",
                now=t,
            )  # fmt: skip
        elif step[0] == "pop":
            d.pop(f"gpu-{step[1]}", now=t)
        else:
            held = d.worker(f"gpu-{step[1]}").held
            if held:
                d.complete(held[0], now=t, worker=f"gpu-{step[1]}")
    return d, t


@settings(max_examples=60)
@given(steps=st.lists(_step, max_size=40), who=st.sampled_from(MEMBERS))
def test_a_member_sees_nothing_of_the_others(steps: list[tuple[Any, ...]], who: str) -> None:
    d, t = _run(steps)

    def visible(member: str) -> bool:
        return member == who

    history = _model.history(d, t)
    shown: dict[str, Any] = {
        "lanes": _model.lanes(d, t, visible, history),
        "workers": _model.workers(d, t, visible, history),
        "groups": _model.groups(d, t, t, visible),
        "explain": [
            _model.explanation(
                d.explain(job_id, now=t, ahead_limit=50, overtakes_limit=50), t, visible
            )
            for job_id in [j.id for j in d.stats(now=t).held]
            + [f.job_id for f in d.forecast(now=t)]
            if d.job(job_id).member == who
        ],
    }
    text = json.dumps(shown)
    for other in MEMBERS:
        if other != who:
            assert other not in text  # neither its name nor any of its job ids
    for lane in shown["lanes"]:
        assert lane["member"] == who
        assert len(lane["jobs"]) <= _model.LANE_HEADS
    assert len(shown["groups"]) <= _model.GROUP_LIMIT
    for worker in shown["workers"]:
        assert len(worker["swaps"]) <= _model.SWAPS_PER_WORKER
        assert len(worker["prefetched"]) <= 1  # slots = 2: one runs, one waits


def test_level_names_invert_the_aliases_first_name_first() -> None:
    assert _model.level_names({}) == {}
    names = _model.level_names({"interactive": 100, "normal": 0, "default": 0, "batch": -100})
    assert names == {"100": "interactive", "0": "normal", "-100": "batch"}
