"""Known core defects the store tests detect, checked at import so fixes switch tests back on.

``LANE_ORDER_KEPT`` is False while ``restore()`` rebuilds a running job's lane after the queued
ones when ``fair_share=False`` (the lane order, and so the order of ``snapshot()["queued"]``,
changes once that job is requeued). Reported on the board for the core's owner; while it holds,
the random snapshot/replay tests draw ``fair_share=True`` only and
``test_restore_keeps_the_lane_order_of_a_running_job`` is an expected failure.
"""

from __future__ import annotations

import json
from typing import Any

from prioqueue import SizeOneDispatcher
from prioqueue.records import Job


def lease_100(job: Job) -> float:
    return 100.0


def lane_order_scenario() -> tuple[Any, Any]:
    """Return (uninterrupted, restored) snapshots after a running job is requeued."""
    options: dict[str, Any] = {"lease_for": lease_100, "fair_share": False}
    d = SizeOneDispatcher(**options)
    d.submit("j0", member="ann", now=1000.0)
    d.submit("j1", member="bob", now=1000.0)
    d.dispatch(1000.0)
    restored = SizeOneDispatcher.restore(json.loads(json.dumps(d.snapshot(now=1000.0))), **options)
    d.expire(1200.0)
    restored.expire(1200.0)
    return d.snapshot(now=1200.0), restored.snapshot(now=1200.0)


_live, _restored = lane_order_scenario()
LANE_ORDER_KEPT = _live == _restored
