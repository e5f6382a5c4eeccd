"""The state's invariants, asserted (for tests; private).

``check`` asserts every invariant of docs/design/dispatcher.md, docs/design/fleet.md and
docs/design/state.md against the state's read API; it changes nothing. O(n).
"""

from __future__ import annotations

from prioqueue._core.core import Core
from prioqueue._lanes import PARKED, QUEUED, RUNNING

__all__: list[str] = []  # private module


def check(d: Core) -> None:
    """Assert every internal invariant (for tests; O(n))."""
    queued = [e for e in d.entries.values() if e.state == QUEUED]
    held = [e for e in d.entries.values() if e.state == RUNNING]
    d.workers.check(held)
    parked = [e for e in d.entries.values() if e.state == PARKED]
    assert len(queued) + len(parked) == len(d)
    d.lifecycle.check(parked, queued)
    d.lanes.check(d.entries, queued, held, d.now if d.config.fair_share else None)
    d.groups.check(d.entries)
