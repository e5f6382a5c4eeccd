"""``pop_many``: several grants in one pull, over a fleet's ``pop`` (private).

Shared by :class:`~prioqueue.fleet.FleetDispatcher` and the reference fleet
(:class:`~prioqueue.testing.ReferenceFleet`): the rule is ``pop`` repeated, so it is written
once, over whichever ``pop`` the class defines.
"""

from __future__ import annotations

from prioqueue._journaled import journaled
from prioqueue.records import Grant

__all__: list[str] = []  # private module

#: The most jobs one ``pop_many`` may ask for (the AI Horde's ``amount`` is at most 20).
MAX_AMOUNT = 100


class BatchPop:
    """``pop_many`` for a class that defines ``pop(name, *, now)``."""

    def pop(self, name: str, *, now: float) -> Grant | None:  # pragma: no cover - overridden
        """Pull the best job this worker may run now (the class defines it)."""
        raise NotImplementedError

    @journaled
    def pop_many(self, name: str, *, amount: int, now: float) -> list[Grant]:
        """Pull up to ``amount`` jobs for this worker in one call (several grants in one pop).

        Each grant is the one ``pop`` would make next, in order, at the same ``now``; it stops
        at the first ``pop`` that grants nothing (the worker's slots are full, or nothing
        queued is eligible for it: ``idle_reasons`` says why).

        Args:
            name: A joined worker.
            amount: Most jobs to grant, an int in ``1..100``.
            now: The current monotonic time.

        Returns:
            The grants, in grant order (empty when the first ``pop`` grants nothing).

        Raises:
            ValueError: ``amount`` is not an int in ``1..100``, or ``now`` is out of range.
            UnknownWorker: The worker has not joined (or left).
            Exception: What the first ``pop`` raises (nothing changed). An error on a later
                grant ends the batch instead: the grants made so far are returned and the
                failing job stays queued, so the next ``pop`` raises it.

        Complexity: ``amount`` times ``pop``'s.
        """
        if not isinstance(amount, int) or isinstance(amount, bool) or not 1 <= amount <= MAX_AMOUNT:
            raise ValueError(f"amount must be an int in 1..{MAX_AMOUNT}, got {amount!r}")
        grants: list[Grant] = []
        while len(grants) < amount:
            try:
                grant = self.pop(name, now=now)
            except Exception:
                if not grants:
                    raise
                break
            if grant is None:
                break
            grants.append(grant)
        return grants
