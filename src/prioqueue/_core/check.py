"""The state's invariants, asserted (for tests; private).

``check`` asserts every invariant of docs/design/dispatcher.md, docs/design/fleet.md and
docs/design/state.md against the state's read API; it changes nothing. O(n).
"""

from __future__ import annotations

from prioqueue._core.state import State
from prioqueue._lanes import PARKED, QUEUED, RUNNING

__all__: list[str] = []  # private module


def check(d: State) -> None:
    """Assert every internal invariant (for tests; O(n))."""
    queued = [e for e in d.entries.values() if e.state == QUEUED]
    held = [e for e in d.entries.values() if e.state == RUNNING]
    d.workers.check(held)
    parked = [e for e in d.entries.values() if e.state == PARKED]
    assert len(queued) + len(parked) == len(d)
    d.timers.check(parked, queued)
    backlogged = 0
    running: dict[str, int] = {}
    for entry in held:
        running[entry.job.member] = running.get(entry.job.member, 0) + 1
    for name, member in d.members.items():
        assert member.running == running.get(name, 0), name
    holding: dict[int, int] = {}
    for entry in held:
        holding[id(entry.lane)] = holding.get(id(entry.lane), 0) + 1
    now = d.now if d.fair_share else None
    for lane in d.lanes.values():
        lane.check(d.entries, holding.get(id(lane), 0), now)
        backlogged += lane.live > 0
    assert backlogged == d.backlogged
    assert all(e.state == RUNNING and e in held for e in d.crossings)
    assert sum(level.queued for level in d.levels.values()) == len(queued)
    assert sum(m.queued for m in d.members.values()) == len(queued)
    for entry in queued:
        assert entry.lane.live > 0
    d.groups.check(d.entries)
