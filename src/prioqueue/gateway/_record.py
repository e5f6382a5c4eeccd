"""Recording the gateway's traffic as a replayable trace (``prioqueue gateway --record FILE``).

Theory of operation
-------------------
With a recorder (any object with the :class:`Recorder` protocol; the command line uses the
simulator's ``prioqueue.sim.recorder.TraceRecorder``), every gated request that entered the
queue is written once when it leaves: its arrival (the gate's monotonic clock), member, tier,
priority, model and the runtime estimate, and

* for a request that ran: the seconds it held the GPU (``runtime``) and whether its grant
  swapped models (``swap``). The gateway cannot tell a cold load from the inference that
  follows it, except for a streamed response, whose time to first byte is mostly the load:
  then that time is recorded as ``load`` and the rest as ``runtime``. For any other swap, a
  load the operator gave (``--record-load MODEL=SECONDS``, also written into the trace's
  header) is recorded as ``load`` and taken out of ``runtime``; without one the load stays
  inside ``runtime``, and the header's ``default_load`` (0 unless
  ``--record-default-load`` says otherwise) keeps a replay from charging it a second time;
* for a request whose client left or that timed out in the queue: ``cancel_after``, the
  seconds from its arrival to that moment (and what it ran, if it had started).

Requests refused before they queued (429, 400, 401...) are not recorded. A failing recorder
(disk full, a value it refuses) never fails a request: the error is logged once.
``prioqueue simulate --trace FILE`` replays the file under other settings.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from prioqueue.records import Grant

__all__ = ["Recorder", "record_finished"]

log = logging.getLogger("prioqueue.gateway")

_CANCELLED = frozenset({"client disconnected", "timed out in the queue"})


class Recorder(Protocol):
    """What the gateway needs of a trace recorder."""

    def record(self, **fields: Any) -> None:
        """Write one finished request."""

    def close(self) -> None:
        """Flush and close."""


_warned: set[int] = set()


def record_finished(
    recorder: Recorder,
    *,
    arrival: float,
    now: float,
    member: str,
    tier: str,
    priority: int,
    model: str | None,
    estimate: float | None,
    outcome: str,
    grant: Grant | None,
    first_byte: float | None,
    streamed: bool,
    known_load: float | None = None,
    swap: bool | None = None,
) -> None:
    """Write one finished gated request (see the module's docstring). O(1) plus the write.

    ``swap``: whether the gateway counted its grant as a swap (its upstream had not loaded
    the model, see ``_loaded``); None: the dispatcher's ``grant.swap``.
    """
    fields: dict[str, Any] = {
        "arrival": arrival,
        "member": member,
        "tier": tier,
        "priority": priority,
        "model": model,
        "estimate": estimate,
    }
    if outcome in _CANCELLED:
        fields["cancel_after"] = max(0.0, now - arrival)
    if grant is None:
        if "cancel_after" not in fields:
            return  # refused or shut down before it ran: not part of the workload
        fields["runtime"] = 0.0
    else:
        held = max(0.0, now - grant.granted_at)
        fields["swap"] = (grant.swap if swap is None else swap) and model is not None
        if fields["swap"] and streamed and first_byte is not None and first_byte <= held:
            fields["load"] = first_byte
            held -= first_byte
        elif fields["swap"] and known_load is not None:
            fields["load"] = min(known_load, held)
            held -= fields["load"]
        fields["runtime"] = held
    try:
        recorder.record(**fields)
    except Exception as exc:  # a recorder must never fail a request
        if id(recorder) not in _warned:
            _warned.add(id(recorder))
            log.warning("recording the trace failed (further failures not logged): %s", exc)
