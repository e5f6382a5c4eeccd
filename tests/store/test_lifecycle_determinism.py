"""Determinism of the job lifecycle: snapshot mid-way, restore with times kept, replay the rest.

As ``test_determinism`` but with ttl deadlines, delayed jobs (``not_before``), retries with
(jittered) backoff and level budgets in the calls, every argument JSON data as a journal keeps
it. The restored fleet and the uninterrupted one must give equal results for every later call
and equal snapshots: delayed jobs, deadlines, attempts and unreported expiries survive.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from prioqueue import Backoff, FleetDispatcher, LevelBudget
from strategies import dispatcher_job_specs, dispatcher_runtimes

from .replay import check_restore_then_replay, fleet_call, replay_examples

JOB_IDS = [f"j{i}" for i in range(8)]
WORKERS = ["w1", "w2"]

lifecycles = st.fixed_dictionaries(
    {
        "ttl": st.sampled_from([None, 0.5, 30.0, 600.0]),
        "delay": st.sampled_from([None, 0.0, 10.0, 120.0]),
        "max_attempts": st.sampled_from([None, 1, 3]),
        "backoff": st.sampled_from(
            [
                None,
                {"kind": "linear", "base": 4.0},
                {"kind": "exponential", "base": 2.0, "max": 50.0, "jitter": True},
            ]
        ),
    }
)

calls = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(JOB_IDS), dispatcher_job_specs(), lifecycles),
    st.tuples(st.just("join"), st.sampled_from(WORKERS)),
    st.tuples(st.just("pop"), st.sampled_from(WORKERS)),
    st.tuples(st.just("pop"), st.sampled_from(WORKERS)),
    st.tuples(st.just("complete"), st.sampled_from(JOB_IDS), dispatcher_runtimes()),
    st.tuples(st.just("fail"), st.sampled_from(JOB_IDS), st.booleans()),
    st.tuples(st.just("cancel"), st.sampled_from(JOB_IDS)),
    st.tuples(st.just("expire")),
)

options = st.fixed_dictionaries(
    {
        "lease_for": st.sampled_from([None, lambda job: 100.0]),
        "max_attempts": st.integers(1, 3),
        "backoff": st.sampled_from([None, Backoff(kind="constant", base=7.0, jitter=True)]),
        "budgets": st.sampled_from(
            [None, {0: LevelBudget(max_queued=3, ttl=90.0)}, {0: LevelBudget(max_wait=100.0)}]
        ),
        "fair_share": st.booleans(),
    }
)


def apply(d: FleetDispatcher, now: float, call: tuple[Any, ...]) -> Any:
    op = call[0]
    if op == "submit":
        extra = dict(call[3])
        delay = extra.pop("delay")
        extra["not_before"] = None if delay is None else now + delay
        args = json.loads(json.dumps({**call[2], **extra}))  # as a journal keeps them
        return d.submit(call[1], now=now, **args)
    return fleet_call(d, now, call)


@replay_examples(options, calls, max_steps=50)
def test_lifecycle_snapshot_restore_then_replay_is_exact(
    opts: dict[str, Any], steps: list[tuple[float, tuple[Any, ...]]], cut: int
) -> None:
    restored, a = check_restore_then_replay(
        FleetDispatcher, opts, apply, steps, cut, check=True, prepare=join_w1
    )
    assert restored.next_deadline() == a.next_deadline()


def join_w1(d: FleetDispatcher, now: float) -> None:
    d.join("w1", now=now)
