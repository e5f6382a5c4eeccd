"""The fleet gate's pull policy: which upstream pulls when, and what each one holds (private).

:class:`FleetPull` is the :class:`~prioqueue._driver.PullPolicy` of the gateway's
:class:`~prioqueue.gateway._fleetgate.FleetGate`: it owns the upstreams' bookkeeping that the
fleet itself does not keep (which are live, which are taken out but still hold jobs, the work
each reports beyond the gate's own, the rotation, busy seconds and grants per upstream) and
is the only one that changes it. The gate changes it through the methods below; the driver
calls the policy's hooks. See ``docs/design/driver.md`` and ``docs/design/gateway.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from prioqueue.errors import UnknownWorker

if TYPE_CHECKING:
    from prioqueue._driver import Remove
    from prioqueue.fleet import FleetDispatcher
    from prioqueue.records import Expired, Grant

__all__ = ["ROUTINGS", "FleetPull", "Routing"]

Routing = Literal["warm", "round-robin", "least-busy"]
ROUTINGS: tuple[Routing, ...] = ("warm", "round-robin", "least-busy")


class FleetPull:
    """One worker per upstream: live upstreams pull in rotating (or least-busy) order.

    Args:
        fleet: The fleet the gate drives.
        routing: ``"warm"``, ``"round-robin"`` or ``"least-busy"`` (checked by the gate).
    """

    __slots__ = (
        "_bumped",
        "_busy",
        "_extra",
        "_fleet",
        "_goes_on",
        "_grants",
        "_live",
        "_next",
        "_out",
        "routing",
    )

    def __init__(self, fleet: FleetDispatcher, routing: Routing) -> None:
        self._fleet = fleet
        self.routing: Routing = routing
        self._live: list[str] = []
        self._out: set[str] = set()
        self._extra: dict[str, int] = {}
        self._goes_on: set[str] = set()
        self._bumped: dict[str, float] = {}
        self._next = 0
        self._busy: dict[str, float] = {}
        self._grants: dict[str, int] = {}

    # -- reading -------------------------------------------------------------------------

    @property
    def live(self) -> tuple[str, ...]:
        """The upstreams in the fleet now (taken-out ones are not)."""
        return tuple(self._live)

    @property
    def busy_seconds(self) -> Mapping[str, float]:
        """Seconds each upstream held jobs, summed over ended grants."""
        return self._busy

    @property
    def grants(self) -> Mapping[str, int]:
        """Grants each upstream took."""
        return self._grants

    def known(self, name: str) -> bool:
        """Whether an upstream is live or taken out but still holding jobs."""
        return name in self._live or name in self._out

    # -- changing (the gate) -------------------------------------------------------------

    def joined(self, name: str, *, aborts: bool) -> None:
        """An upstream joined the fleet (or was updated): it is live and pulls."""
        self._out.discard(name)
        if aborts:
            self._goes_on.discard(name)
        else:
            self._goes_on.add(name)
        if name not in self._live:
            self._live.append(name)
            self._live.sort()
            self._busy.setdefault(name, 0.0)
            self._grants.setdefault(name, 0)

    def taken_out(self, name: str, *, holding: bool) -> None:
        """Stop a live upstream from pulling.

        Args:
            name: The upstream (live: the gate checks).
            holding: Whether it still holds jobs (it leaves the fleet once it holds none).

        Raises:
            ValueError: The upstream is not live.
        """
        self._live.remove(name)
        if holding:
            self._out.add(name)

    def reported(self, name: str, extra: int, since: float | None) -> bool:
        """Record the work an upstream reports beyond the gate's jobs; True when it fell.

        A report asked for before a lease cut a job there (``since`` earlier than the cut)
        cannot lower the count.
        """
        before = self._extra.get(name, 0)
        bumped = self._bumped.get(name)
        if bumped is not None:
            if since is not None and since < bumped:
                extra = max(extra, before)
            else:
                del self._bumped[name]
        if extra > 0:
            self._extra[name] = extra
        else:
            self._extra.pop(name, None)
        return extra < before

    # -- the PullPolicy hooks (the driver) -----------------------------------------------

    def order(self, now: float) -> Sequence[str]:
        """The live upstreams, rotating or least busy first (taken-out empty ones leave)."""
        if self._out:
            self._settle(now)
        live = self._live
        if not live:
            return []
        if self.routing == "least-busy":
            return sorted(live, key=lambda name: (self._busy.get(name, 0.0), name))
        start = self._next % len(live)
        self._next += 1
        return live[start:] + live[:start]

    def _settle(self, now: float) -> None:
        """Let taken-out workers that hold nothing any more leave the fleet."""
        for name in sorted(self._out):
            try:
                empty = not self._fleet.worker(name).held
            except UnknownWorker:
                self._out.discard(name)
                continue
            if empty:
                self._out.discard(name)
                self._fleet.leave(name, now=now)

    def full(self, worker: str) -> bool:
        """Whether an upstream's held jobs plus the work it reports beyond them fill it."""
        if not self._extra:
            return False
        info = self._fleet.worker(worker)
        return len(info.held) + self._extra.get(worker, 0) >= info.slots

    def pop(self, worker: str, now: float) -> Grant | None:
        """``pop(worker, now)``; blind routing forgets the upstream's residency."""
        grant = self._fleet.pop(worker, now=now)
        if grant is not None and self.routing != "warm":
            self._fleet.heartbeat(worker, now=now, resident=None)
        return grant

    def refused(self, worker: str) -> bool:
        """Whether the upstream that got nothing had a free slot (a warm hold)."""
        info = self._fleet.worker(worker)
        return len(info.held) < info.slots

    def give_back(self, grant: Grant, now: float, remove: Remove) -> None:
        """Cancel the grant with no charge (nothing ran)."""
        remove(grant.job.id, now, 0.0)

    def granted(self, grant: Grant) -> None:
        """Count the grant on its upstream."""
        worker = grant.worker
        assert worker is not None
        self._grants[worker] = self._grants.get(worker, 0) + 1

    def unused(self, grant: Grant) -> None:
        """Nothing to undo: the fleet's residency is the upstream's report."""

    def ended(self, grant: Grant, now: float) -> None:
        """Add the time the grant was held to its upstream's busy seconds."""
        if grant.worker is not None:
            held = max(0.0, now - grant.granted_at)
            self._busy[grant.worker] = self._busy.get(grant.worker, 0.0) + held

    def on_expiry(self, record: Expired, now: float) -> None:
        """An upstream that goes on after a cut counts the job until it reports."""
        worker = record.worker
        if worker is not None and worker in self._goes_on:
            self._extra[worker] = self._extra.get(worker, 0) + 1
            self._bumped[worker] = now
