"""``pop_many``: several grants in one pull, over a fleet's ``pop`` (private).

Shared by :class:`~prioqueue.fleet.FleetDispatcher` and the reference fleet
(:class:`~prioqueue.testing.ReferenceFleet`): the rule is ``pop`` repeated, so it is written
once, over whichever ``pop`` the class defines.

With ``siblings=True`` (the AI Horde's ``amount``: the images of one request share one
payload), the grants after the first are ``pop`` restricted to the queued jobs of the first
grant's group: the worker's ``accepts`` is narrowed for those pops by a test of the job's group
(its record's ``narrowed``),
so everything else (capabilities, member caps, the ranking inside the group, leases) is
``pop``'s own rule. A first job without a group ends the batch at one grant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from prioqueue._journaled import journaled
from prioqueue.records import Grant, Job

__all__: list[str] = []  # private module


class Narrowable:
    """A worker record whose ``accepts`` filter a ``pop_many(siblings=True)`` narrows.

    The core's and the reference fleet's worker records both derive from it, so the narrowing
    is written once, beside the rule that uses it. It declares no slots (a type checker then
    sees ``accepts`` as assignable): the records' own fields stay slots, and a worker record
    is made once per join, so the unused ``__dict__`` costs nothing on the hot path.
    """

    accepts: Callable[[Job], bool] | None

    @contextmanager
    def narrowed(self, test: Callable[[Job], bool]) -> Iterator[None]:
        """For the ``with`` block, accept only the jobs ``test`` and ``accepts`` both pass.

        The worker's own filter is restored on leaving, whatever happens inside.
        """
        original = self.accepts
        self.accepts = test if original is None else lambda job: test(job) and original(job)
        try:
            yield
        finally:
            self.accepts = original


#: The most jobs one ``pop_many`` may ask for (the AI Horde's ``amount`` is at most 20).
MAX_AMOUNT = 100


class BatchPop:
    """``pop_many`` for a class that defines ``pop``, ``group_of`` and ``_narrowed``."""

    if TYPE_CHECKING:  # defined by the class or a base (a stub here would shadow those)

        def pop(self, name: str, *, now: float) -> Grant | None:
            """Pull the best job this worker may run now."""

        def group_of(self, job_id: str) -> str | None:
            """The group of a queued or held job, or None."""

        def _narrowed(self, name: str, test: Callable[[Job], bool]) -> AbstractContextManager[None]:
            """A joined worker's ``accepts`` narrowed by ``test`` for a ``with`` block."""

    @journaled
    def pop_many(
        self, name: str, *, amount: int, now: float, siblings: bool = False
    ) -> list[Grant]:
        """Pull up to ``amount`` jobs for this worker in one call (several grants in one pop).

        Each grant is the one ``pop`` would make next, in order, at the same ``now``; it stops
        at the first ``pop`` that grants nothing (the worker's slots are full, or nothing
        queued is eligible for it: ``idle_reasons`` says why). With ``siblings``, the grants
        after the first are taken only from the first job's group (the images of one request:
        one payload, several ids); a first job without a group is granted alone.

        Args:
            name: A joined worker.
            amount: Most jobs to grant, an int in ``1..100``.
            now: The current monotonic time.
            siblings: Take the further jobs from the first job's group only.

        Returns:
            The grants, in grant order (empty when the first ``pop`` grants nothing).

        Raises:
            ValueError: ``amount`` is not an int in ``1..100``, or ``now`` is out of range.
            TypeError: ``siblings`` is not a bool.
            UnknownWorker: The worker has not joined (or left).
            Exception: What the first ``pop`` raises (nothing changed). An error on a later
                grant ends the batch instead: the grants made so far are returned and the
                failing job stays queued, so the next ``pop`` raises it.

        Complexity: ``amount`` times ``pop``'s (a sibling's pop takes the filtered path).
        """
        if not isinstance(amount, int) or isinstance(amount, bool) or not 1 <= amount <= MAX_AMOUNT:
            raise ValueError(f"amount must be an int in 1..{MAX_AMOUNT}, got {amount!r}")
        if not isinstance(siblings, bool):
            raise TypeError(f"siblings must be a bool, got {siblings!r}")
        grants: list[Grant] = []
        group: str | None = None
        while len(grants) < amount:
            try:
                grant = self.pop(name, now=now) if not grants else self._next(name, now, group)
            except Exception:
                if not grants:
                    raise
                break
            if grant is None:
                break
            grants.append(grant)
            if siblings and len(grants) == 1:
                group = self.group_of(grant.job.id)
                if group is None:
                    break
        return grants

    def _next(self, name: str, now: float, group: str | None) -> Grant | None:
        """``pop``, restricted to the jobs of ``group`` when one is given."""
        if group is None:
            return self.pop(name, now=now)
        group_of = self.group_of
        with self._narrowed(name, lambda job: group_of(job.id) == group):
            return self.pop(name, now=now)
