"""The core: one dispatcher state, its transitions, its reads and its facades (private).

Theory of operation (docs/design/state.md describes the object; docs/design/dispatcher.md,
fleet.md and lifecycle.md the rules):

* ``config``: the validated constructor options and the shared constants.
* ``items``: the records the state is built from (levels, members, reorder counts, history,
  timers, NamedTuple heap items).
* ``lanes``: ``Lanes``, the owner of the lanes, levels, members, rankings and the crossing
  credit (private fields, read-only reads, its own ``check``).
* ``lifecycle``: ``Lifecycle``, the owner of the timers, delayed jobs, recent runtimes,
  budgets and the admission rule (``refusal``, for a submit and for ``admit``).
* ``workers``: ``Workers``, the owner of the workers, their resident models, held count and
  lease deadlines (private fields, read-only reads, its own ``check``).
* ``core``: ``Core``, one dispatcher's state: it composes the owners (``lanes``,
  ``workers``, ``lifecycle``, the group book), holds the entries, the clock, ``seq``, the
  totals and the history; its methods are the changes that span owners.
* ``queue`` (submit, the lifecycle's timers and budgets) and ``grant`` (pop, complete, cancel,
  fail, take-backs, expire): the transitions, functions of a ``Core``.
* ``choose``: which job a worker gets (reads only).
* ``observe``, ``forecast``, ``persist``, ``check``: stats, forecasts, explanations,
  snapshots and the invariants, reading the state.
* ``views``: the read-only views the facades hand out (copies; ``prioqueue.views``).
* ``facade``: ``Facade``, what ``SizeOneDispatcher`` and ``FleetDispatcher`` share: it holds a
  ``Core`` and delegates. Only the facades (``dispatcher``, ``fleet``) import this package.

The import order is that list's: no module imports one after it, so the package has no
circle. The facades import the constants from here; other packages read them from
``prioqueue.dispatcher`` (which re-exports the public ones).
"""

from __future__ import annotations

from prioqueue._core.config import (
    DEFAULT_CROSSING_SHARE,
    DEFAULT_EXPECTED_RUNTIME,
    DEFAULT_HISTORY_BYTES,
    DEFAULT_RETRY_AFTER,
    DEFAULT_WAIT_BUCKETS,
    LEAST_SERVED,
    LEVEL_LIMIT,
    ChargeModel,
)

__all__ = [
    "DEFAULT_CROSSING_SHARE",
    "DEFAULT_EXPECTED_RUNTIME",
    "DEFAULT_HISTORY_BYTES",
    "DEFAULT_RETRY_AFTER",
    "DEFAULT_WAIT_BUCKETS",
    "LEAST_SERVED",
    "LEVEL_LIMIT",
    "ChargeModel",
]
