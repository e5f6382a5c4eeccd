"""The state's invariants, asserted (for tests; private).

``check`` asserts every invariant of docs/design/dispatcher.md, docs/design/fleet.md and
docs/design/state.md against the state's read API; it changes nothing. O(n).
"""

from __future__ import annotations

import math

from prioqueue._core.state import State
from prioqueue._lanes import PARKED, QUEUED, RUNNING

__all__: list[str] = []  # private module


def check(d: State) -> None:
    """Assert every internal invariant (for tests; O(n))."""
    queued = [e for e in d.entries.values() if e.state == QUEUED]
    held = [e for e in d.entries.values() if e.state == RUNNING]
    assert len(held) == d.held
    assert sorted(id(e) for e in held) == sorted(id(e) for w in d.workers.values() for e in w.held)
    for worker in d.workers.values():
        assert all(e.worker is worker for e in worker.held)
    assert d.live == sum(not w.timed_out for w in d.workers.values())
    parked = [e for e in d.entries.values() if e.state == PARKED]
    assert len(queued) + len(parked) == len(d)
    assert sum(d.timers.parked.values()) == len(parked)
    assert all(v > 0 for v in d.timers.parked.values())
    timers = {id(item.entry) for item in d.timers.heap}
    for entry in parked:
        assert id(entry) in timers  # every delayed job has its release timer
        assert entry.job.deadline is None or entry.queued_at < math.inf
    for entry in queued:
        if entry.job.deadline is not None:
            assert id(entry) in timers  # every queued job with a ttl has its lapse timer
    if d.timers.heap:
        assert d.timers.next <= min(item.at for item in d.timers.heap)
    backlogged = 0
    running: dict[str, int] = {}
    for entry in held:
        running[entry.job.member] = running.get(entry.job.member, 0) + 1
    for name, member in d.members.items():
        assert member.running == running.get(name, 0), name
    for lane in d.lanes.values():
        live = [e for e in lane.jobs if e.state == QUEUED]
        assert len(live) == lane.live, (lane.member, lane.level)
        assert all(d.entries.get(e.job.id) is e for e in live)
        assert [e.pos for e in live] == sorted(e.pos for e in live)
        for model, fifo in lane.by_model.items():
            assert [e for e in fifo if e.state == QUEUED] == [
                e for e in live if e.job.model == model or (model and e.job.runs_on(model))
            ]
        assert lane.holding == sum(e.lane is lane for e in held)
        backlogged += lane.live > 0
        if d.fair_share:
            assert lane.settled <= d.now
            if not lane.holding:
                assert lane.s == lane.settled
    assert backlogged == d.backlogged
    assert all(e.state == RUNNING and e in held for e in d.crossings)
    assert sum(level.queued for level in d.levels.values()) == len(queued)
    assert sum(m.queued for m in d.members.values()) == len(queued)
    for entry in queued:
        assert entry.lane.live > 0
    d.groups.check(d.entries)
