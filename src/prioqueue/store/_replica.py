"""The snapshot replica: a second dispatcher in the writer thread, snapshotted there (private).

Theory of operation
-------------------
A snapshot of the live dispatcher costs O(state) of Python on the event loop (the broker's
at 10^5 queued jobs: about a second), and the loop serves nobody meanwhile. The replica
moves that work off the loop without freezing the live state:

* At open, the recovered snapshot is deep-copied (containers only: strings, the bulk of the
  payload bytes, are shared, being immutable) before the live dispatcher is restored from
  it, so the two never share a mutable object, and the replica is restored from the copy
  then (in the writer thread, before anything is served: a service that freezes what it
  recovered, as ``prioqueue broker`` does, keeps the replica out of the collector's scans).
* Every committed batch is queued for the replica in the writer thread (O(1) per event).
* When a snapshot is due, the writer thread brings the replica up to the batch being
  written, by calling the batch's events again exactly as recovery does
  (:func:`~prioqueue.store._journal.apply_event`, with the arguments decoded afresh from
  the event's JSON text), and takes the replica's ``snapshot(now=)``. Determinism (the
  store's invariant 1) makes that the live state after the same event.

The loop's share is O(1) per snapshot (deciding it is due, reading the clock). The writer
thread's Python work gives the loop the GIL every switch interval, so the loop's longest
stall is about one interval, not the snapshot's length; the encoding, the write and the
release of the snapshot are chunked for the same reason, and the writer pauses the cyclic
collector meanwhile (:mod:`prioqueue.store._encode`, :mod:`prioqueue.store._commit`).

Costs: every journaled call runs twice (once live, once in the replica, lazily, when a
snapshot is due) and the replica holds a second copy of the state (payload strings from the
recovered snapshot shared; those of later events decoded afresh). A replica that fails to
apply an event has diverged: snapshots stop for the life of the process (logged through the
loop's exception handler by the writer); the journal still holds every event.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from prioqueue._journaled import journaled_ops
from prioqueue.store._journal import apply_event, replay
from prioqueue.store.base import Event, Recovery

__all__ = ["Replica"]


class Replica:
    """A copy of the dispatcher that trails the store by the events queued for it.

    Used from the writer thread only.

    Args:
        recovery: What the store held at open (deep-copied here: call before the live
            dispatcher is restored from it).

    Raises:
        CorruptStore: The recovery does not replay (as for the live dispatcher).
        factory: Makes a fresh dispatcher or restores a snapshot (the live one's factory).
    """

    def __init__(
        self, recovery: Recovery, factory: Callable[[Mapping[str, Any] | None], Any]
    ) -> None:
        snapshot = recovery.snapshot
        base = Recovery(
            snapshot=None if snapshot is None else copy.deepcopy(snapshot),
            events=(),
            epoch=recovery.epoch,
        )
        self._backlog: list[Event] = copy.deepcopy(list(recovery.events))
        self._dispatcher: Any = replay(base, factory)
        self._declared = frozenset(journaled_ops(type(self._dispatcher)))
        self.broken: Exception | None = None
        """Why the replica stopped (it diverged or could not snapshot), or None."""

    def committed(self, events: list[Event]) -> None:
        """Queue events that are (or are being) committed, in order. O(len(events))."""
        if self.broken is None:
            self._backlog.extend(events)

    def snapshot(self, now: float) -> Mapping[str, Any]:
        """Apply the queued events and return the replica's ``snapshot(now=now)``.

        Raises:
            CorruptStore: An event does not apply (the replica is broken from then on).
            Exception: Whatever the dispatcher's ``snapshot`` raised (broken too).

        Complexity: O(queued events x their cost + the state).
        """
        if self.broken is not None:
            raise self.broken
        try:
            backlog, self._backlog = self._backlog, []
            for event in backlog:
                # Fresh arguments, as recovery decodes them: the live call's nested values
                # are the live dispatcher's own from then on.
                args = event.args if event.text is None else json.loads(event.text)
                apply_event(self._dispatcher, self._declared, event, args)
            state: Mapping[str, Any] = self._dispatcher.snapshot(now=now)
        except Exception as exc:
            self.broken = exc
            self._backlog = []
            raise
        return state
