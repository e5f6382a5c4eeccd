"""What every driver reads: the core's public reads stamped with the driver's clock (private).

:class:`CoreReader` is the reading half of :class:`~prioqueue._driver.Driver`: it holds the
driven core and the clock, and never changes either. The number of workers decides
``holding``, ``held`` and ``holder``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Generic, TypeVar

from prioqueue._driver._core import Clock, DrivenCore

if TYPE_CHECKING:
    from prioqueue.records import Explanation, Grant, Stats
    from prioqueue.views import GroupStatus

__all__ = ["CoreReader"]

D_co = TypeVar("D_co", bound=DrivenCore, covariant=True)


class CoreReader(ABC, Generic[D_co]):
    """The reads of a driven core (see :class:`~prioqueue._driver.Driver`).

    Args:
        core: The driven core.
        clock: Monotonic seconds, the ``now`` of every read.
    """

    def __init__(self, core: D_co, clock: Clock) -> None:
        self._d = core
        self._clock = clock

    # -- reading -------------------------------------------------------------------------

    @property
    def dispatcher(self) -> D_co:
        """The driven dispatcher, for ``stats``, ``explain``, ``forecast`` and ``snapshot``."""
        return self._d

    def now(self) -> float:
        """Return the clock's current time (the ``now`` the driver gives the dispatcher)."""
        return self._clock()

    def stats(self) -> Stats:
        """Return ``dispatcher.stats(now=self.now())`` (e.g. for the Prometheus collector)."""
        return self._d.stats(now=self.now())

    def explain(self, job_id: str) -> Explanation:
        """Return ``dispatcher.explain(job_id, now=self.now())``.

        Raises:
            UnknownJob: The job is neither queued nor running.
        """
        return self._d.explain(job_id, now=self.now())

    def group_status(self, group: str) -> GroupStatus:
        """Return ``dispatcher.group_status(group, now=self.now())``.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
        """
        return self._d.group_status(group, now=self.now())

    @abstractmethod
    def holding(self, worker: str = "") -> int:
        """Return how many jobs a worker holds now (the one resource: ``""``). O(1).

        Args:
            worker: The worker's name (ignored with one resource).
        """
        ...

    @abstractmethod
    def held(self) -> list[Grant]:
        """Return the grants held now, by worker. O(held)."""
        ...

    def holder(self, job_id: str) -> str | None:
        """Return the worker holding a job, or None (queued, unknown, or one resource). O(1)."""
        return None
