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

It patches ``prioqueue.sim._loop.Loop.ran`` (the runtime the loop reports) and, with
``service=both``, the report's ``_Tally.charge`` (the service it counts), in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prioqueue.sim import report
from prioqueue.sim._loop import Loop

__all__ = ["install"]

SERVICES = ("core", "both")


def install(service: str = "core") -> Callable[[], None]:
    """Patch this process with the rule (see the module's docstring); return the undo.

    Raises:
        ValueError: ``service`` is neither ``core`` nor ``both``.
    """
    if service not in SERVICES:
        raise ValueError(
            f"warm_charge: service must be one of {', '.join(SERVICES)}, got {service!r}"
        )
    old_ran, old_charge = Loop.ran, report._Tally.charge

    def ran(self: Loop, j: int) -> float:
        return max(0.0, old_ran(self, j) - self.load[j])

    def charge(self: Any, i: int, job: Any, runtime: float) -> float:
        return old_charge(self, i, job, max(0.0, runtime - self.result.load[i]))

    setattr(Loop, "ran", ran)  # noqa: B010 (mypy refuses a method assignment)
    if service == "both":
        setattr(report._Tally, "charge", charge)  # noqa: B010

    def undo() -> None:
        setattr(Loop, "ran", old_ran)  # noqa: B010
        setattr(report._Tally, "charge", old_charge)  # noqa: B010

    return undo
