"""What a driver needs of the core it drives, and what a chain needs of a driver (private).

Both dispatchers (``SizeOneDispatcher``, ``FleetDispatcher``) have this shape; the driver uses
nothing else of them, so the core may change inside without the drivers noticing. The
protocols live apart from the driver so that the chain module and the driver do not import
each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from prioqueue._spec import SubmitOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._groups import CancelRunning
    from prioqueue.records import Expired, Explanation, Job, Stats, Ticket
    from prioqueue.views import GroupStatus

__all__ = [
    "Clock",
    "DrivenCore",
    "ExpiryCallback",
    "TurnOptions",
]

Clock = Callable[[], float]
"""A zero-argument callable returning monotonic seconds."""
ExpiryCallback = Callable[["Expired"], object]
"""Called with each :class:`~prioqueue.records.Expired` record."""


class TurnOptions(SubmitOptions, total=False):
    """What ``Driver.turn`` takes besides ``job_id`` and ``member``.

    A submit's options and the ``timeout`` in the queue (a chain's specs may carry it too).
    """

    timeout: float | None


class DrivenCore(Protocol):
    """The core's public methods a driver calls (see ``FleetDispatcher`` for each)."""

    def __len__(self) -> int: ...

    def __contains__(self, job_id: object) -> bool: ...

    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[SubmitOptions]
    ) -> Ticket: ...

    def cancel(self, job_id: str, *, now: float, charge: float | None = None) -> Job: ...

    def fail(self, job_id: str, *, now: float, charge: float | None = None) -> Job: ...

    def complete(
        self, job_id: str, *, now: float, runtime: float | None = None, charge: float | None = None
    ) -> Any: ...

    def expire(self, now: float) -> list[Expired]: ...

    def next_deadline(self) -> float | None: ...

    def job(self, job_id: str) -> Job: ...

    def state(self, job_id: str) -> Literal["queued", "running"]: ...

    def stats(self, *, now: float) -> Stats: ...

    def explain(self, job_id: str, *, now: float) -> Explanation: ...

    def group_status(self, group: str, *, now: float) -> GroupStatus: ...

    def cancel_group(
        self, group: str, *, now: float, running: CancelRunning = "keep"
    ) -> list[Job]: ...
