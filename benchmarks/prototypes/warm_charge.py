"""Prototype: fair share charges a job its warm runtime, not the cold load its grant paid.

Tried in issue 26's twelfth round; docs/design/dispatcher.md gives the tables.

**Rule.** The simulator's loop reports to ``complete`` (and to a running job's ``cancel``) the
seconds the job ran *after* its model was loaded: ``now - start - load``. Today it reports
``now - start``, so the member whose job the order happened to make cold pays the whole
swap (on the Azure code trace a 1 s job then costs its lane 16 s), while the members whose
jobs run warm behind it pay nothing for the load. The inverted-pairs check measures demand
as the warm durations, so the charge and the check then disagree by the loads.

Parameters: ``service`` ``core`` (default: only the dispatcher's charge changes; the report
measures service as before, the cold load included) or ``both`` (the report's service, and so
the service gap, counts the warm runtime too). The dispatcher's recent runtimes (the expected
charge of a job without an estimate, which the crossing credit counts) then leave the load
out as well: the prototype changes what ``complete`` hears, not one rule.

It patches ``prioqueue.sim._loop.Loop`` (``_complete_due``, ``_cancel_due``) and, with
``service=both``, the report's tally, in this process.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

from prioqueue.sim import report
from prioqueue.sim._loop import Loop
from prioqueue.sim.fairness import SERVICE
from prioqueue.sim.results import JobState

__all__ = ["install"]

SERVICES = ("core", "both")


def _complete_due(self: Any) -> None:
    """``Loop._complete_due`` reporting the runtime without the job's cold load."""
    ends, fleet, now = self.ends, self.fleet, self.now
    while ends and ends[0][0] <= now:
        done_at, k, j = heapq.heappop(ends)
        w = fleet[k]
        if w.running != j or w.run_end != done_at:
            continue
        warm = max(0.0, now - self.start[j] - self.load[j])
        self.queue.complete(str(j), now=now, runtime=warm, worker=w.name)
        self.events += 1
        self.status[j] = JobState.DONE
        self._stop_running(w, j)
        self.feeder.left(j, now)


def _cancel_due(self: Any) -> None:
    """``Loop._cancel_due`` charging a running job the seconds it ran without its load."""
    cancels, holder, now, status = self.cancels, self.holder, self.now, self.status
    while cancels and cancels[0][0] <= now:
        j = heapq.heappop(cancels)[1]
        if status[j] != JobState.QUEUED and status[j] != JobState.RUNNING:
            continue
        charge = None
        if j in holder and self.by_runtime:
            ran = holder[j].running == j
            charge = max(0.0, now - self.start[j] - self.load[j]) if ran else 0.0
        self.queue.cancel(str(j), now=now, charge=charge)
        self.events += 1
        if j in holder:
            self._stop_running(holder[j], j)
        status[j] = JobState.CANCELLED
        self.feeder.left(j, now)


def install(service: str = "core") -> Callable[[], None]:
    """Patch this process with the rule (see the module's docstring); return the undo.

    Raises:
        ValueError: ``service`` is neither ``core`` nor ``both``.
    """
    if service not in SERVICES:
        raise ValueError(
            f"warm_charge: service must be one of {', '.join(SERVICES)}, got {service!r}"
        )
    old = (Loop._complete_due, Loop._cancel_due, report._Tally._ran)
    Loop._complete_due = _complete_due  # type: ignore[method-assign]
    Loop._cancel_due = _cancel_due  # type: ignore[method-assign]
    if service == "both":
        report._Tally._ran = _ran_warm  # type: ignore[method-assign]

    def undo() -> None:
        Loop._complete_due, Loop._cancel_due, report._Tally._ran = old  # type: ignore[method-assign]

    return undo


def _ran_warm(self: Any, i: int, job: Any, came: float) -> None:
    """The report's ``_ran`` with the job's charge counted without its cold load."""
    result = self.result
    level, member = job.priority, job.member
    start, end = result.start[i], result.end[i]
    finished = not math.isnan(end)
    stop = end if finished else self.clock
    runtime = stop - start
    self.gpu[member] += runtime
    self.runs[level].append((start, stop, member))
    self.longest_run[level] = max(self.longest_run[level], runtime)
    if finished:
        warm = max(0.0, runtime - result.load[i])
        charge = report._charge(self.params, result.spec.is_baseline, job.estimate, warm)
        self.events[level].append((end, SERVICE, member, charge))
        self.largest_charge[level] = max(self.largest_charge[level], charge)
    if result.status[i] != JobState.CANCELLED:
        self.waits[level].append(start - came)
