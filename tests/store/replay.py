"""The snapshot-restore-replay check shared by the determinism properties.

Two dispatchers get the same calls; one is snapshotted after a prefix, the snapshot goes
through JSON (as the store keeps it) and is restored with its times kept; the restored one and
the uninterrupted one must then have equal snapshots and give equal results for every later
call. ``test_determinism`` and ``test_lifecycle_determinism`` differ only in the calls they
make and the options they generate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import dispatcher_models, dispatcher_runtimes, time_steps

Step = tuple[float, tuple[Any, ...]]
Apply = Callable[[Any, float, tuple[Any, ...]], Any]


def join_calls(workers: Sequence[str], *extra: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``("join", name, models, resident, slots, *extra)`` call tuples for ``workers``."""
    return st.tuples(
        st.just("join"),
        st.sampled_from(list(workers)),
        st.sampled_from([None, ["m1"], ["m1", "m2"]]),
        dispatcher_models(),
        st.integers(min_value=1, max_value=2),
        *extra,
    )


def fleet_tail_calls(
    job_ids: Sequence[str], workers: Sequence[str]
) -> list[st.SearchStrategy[Any]]:
    """Complete, cancel, expire, heartbeat and leave calls, as ``fleet_call`` makes them."""
    return [
        st.tuples(st.just("complete"), st.sampled_from(list(job_ids)), dispatcher_runtimes()),
        st.tuples(st.just("cancel"), st.sampled_from(list(job_ids))),
        st.tuples(st.just("expire")),
        st.tuples(st.just("heartbeat"), st.sampled_from(list(workers))),
        st.tuples(st.just("leave"), st.sampled_from(list(workers))),
    ]


def fleet_call(d: Any, now: float, call: tuple[Any, ...]) -> Any:
    """Make a fleet call other than submit: join, pop, heartbeat and leave take a worker's
    name only (a richer join is the caller's), complete a runtime, fail a retry flag."""
    op = call[0]
    if op in ("join", "pop", "heartbeat", "leave"):
        return getattr(d, op)(call[1], now=now)
    if op == "complete":
        return d.complete(call[1], now=now, runtime=call[2])
    if op == "fail":
        return d.fail(call[1], now=now, retry=call[2])
    if op == "cancel":
        return d.cancel(call[1], now=now)
    return d.expire(now)


def outcome_of(fn: Callable[[], Any]) -> tuple[Any, ...]:
    """``("ok", fn())``, or ``("error", type name, message)``: results compared as values."""
    try:
        return ("ok", fn())
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


def replay_examples(
    options: st.SearchStrategy[dict[str, Any]], calls: st.SearchStrategy[Any], max_steps: int
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Run a replay property on 150 examples: ``opts`` from ``options``, ``steps`` (at most
    ``max_steps`` of ``(time step, call)``) and ``cut`` (where to snapshot)."""

    def wrap(test: Callable[..., None]) -> Callable[..., None]:
        return settings(max_examples=150)(
            given(
                opts=options,
                steps=st.lists(st.tuples(time_steps(), calls), min_size=1, max_size=max_steps),
                cut=st.integers(min_value=0, max_value=max_steps),
            )(test)
        )

    return wrap


def check_restore_then_replay(
    cls: Any,
    opts: dict[str, Any],
    apply: Apply,
    steps: list[Step],
    cut: int,
    *,
    check: bool = False,
    prepare: Callable[[Any, float], None] | None = None,
) -> tuple[Any, Any]:
    """Run ``steps[:cut]`` on two ``cls(**opts)`` (each given to ``prepare(d, start)`` first),
    restore the second from its JSON snapshot with ``cls.restore(state, **opts)`` and run the
    rest on the restored one and the first.

    ``apply(d, now, call)`` makes one call and returns its result; results and errors (type
    and message) are compared as values. Asserts equal results call by call, equal snapshots
    at the cut and at the end, and (when ``check``) ``d._check()`` on each dispatcher after
    each call and on the restored one. Returns ``(restored, uninterrupted)`` for more checks.
    """
    cut = min(cut, len(steps))
    t = 1_000.0
    a, b = cls(**opts), cls(**opts)
    if prepare is not None:
        prepare(a, t)
        prepare(b, t)

    def step_both(x: Any, y: Any, part: list[Step]) -> None:
        nonlocal t
        for step, call in part:
            t += step
            got = outcome_of(partial(apply, x, t, call))
            assert got == outcome_of(partial(apply, y, t, call)), (t, call)
            if check:
                x._check()
                y._check()

    step_both(a, b, steps[:cut])
    state = json.loads(json.dumps(b.snapshot(now=t)))
    restored = cls.restore(state, **opts)
    if check:
        restored._check()
    assert restored.snapshot(now=t) == a.snapshot(now=t)
    step_both(restored, a, steps[cut:])
    assert restored.snapshot(now=t) == a.snapshot(now=t)
    return restored, a
