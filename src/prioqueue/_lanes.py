"""Entries and lanes: the data structures behind the dispatcher's queue (private).

Theory of operation (see docs/design/dispatcher.md for the model):

* An ``_Entry`` is one grant attempt of one job: its state goes QUEUED -> RUNNING -> GONE, and
  never back. A requeued job gets a *new* entry, so a stale reference to the old one (left
  behind by lazy deletion) can never come back to life.
* A ``_Lane`` holds one member's entries at one level in FIFO order, plus one FIFO per model.
  Both deques use lazy deletion: dead entries are dropped when they reach the front.
* A lane's *version* changes whenever anything its ranking keys depend on changes (its head,
  its affinity candidates, its virtual start ``s``). Heap entries carry the version they were
  computed for; an entry whose version is not the lane's current one is stale and is skipped.
* The rankings that order the backlogged lanes are ``prioqueue._rankings``'.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue.records import MemberStats

if TYPE_CHECKING:
    from prioqueue.records import Job

__all__: list[str] = []  # private module

QUEUED = 0
RUNNING = 1
GONE = 2
PARKED = 3  # a delayed job: known and "queued", in no lane until its release

# A per-model FIFO: a list while short (a deque costs ~600 bytes even when nearly empty, and
# a lane holds one FIFO per model), a deque once it grows past _SHORT entries.
_Fifo = list["_Entry"] | deque["_Entry"]
_SHORT = 32


def _drop_dead(fifo: _Fifo) -> None:
    """Drop the entries that are no longer queued from the front of a FIFO. Amortised O(1)."""
    if type(fifo) is list:
        dead = 0
        for entry in fifo:
            if entry.state == QUEUED:
                break
            dead += 1
        if dead:
            del fifo[:dead]
    else:
        while fifo and fifo[0].state != QUEUED:
            fifo.popleft()  # type: ignore[union-attr]


@attrs.define(eq=False)
class Member:
    """Per-member counts (its lanes count its queued and running jobs)."""

    queued: int = 0
    running: int = 0
    dispatched: int = 0
    completed: int = 0
    gpu_seconds: float = 0.0

    def used(self, seconds: float) -> None:
        """Charge the member GPU seconds (a finished job's final charge)."""
        self.gpu_seconds += seconds

    def done(self) -> None:
        """One of the member's jobs completed."""
        self.completed += 1

    def frozen(self, member: str) -> MemberStats:
        """The public, frozen counts of ``member`` (the fields are ``MemberStats``')."""
        return MemberStats(member, **attrs.asdict(self, recurse=False))


# (model, affinity bonus, oldest queued entry for the model)
_Candidate = tuple[str, float, "_Entry"]


class _Entry:
    """One grant attempt of one job (mutable, private).

    Attributes:
        job: The job.
        lane: Its lane.
        attempt: 1-based grant attempt.
        state: QUEUED, RUNNING (held by a worker) or GONE.
        granted_at: When it was granted (RUNNING only).
        queued_at: When it entered the queue (its arrival, or the requeue time).
        pos: Its position key in the lane (lane order is ascending ``pos``).
        mark: The dispatch counter when it was queued (``explain`` reads the history after).
        worker: The worker holding it; set at the grant (read it only once granted).
        charged: The up-front charge added to its lane's ``s`` at the grant (same).
        expected_end: ``granted_at`` plus its expected runtime: when its worker is expected
            to free the slot (same; the warm hold reads it).
        capacity: The fleet's capacity at the grant (same).
        grant: Its grant (same).
    """

    __slots__ = (
        "attempt",
        "capacity",
        "charged",
        "expected_end",
        "grant",
        "granted_at",
        "job",
        "lane",
        "mark",
        "pos",
        "queued_at",
        "state",
        "worker",
    )

    worker: Any
    charged: float
    expected_end: float
    capacity: int
    grant: Any

    def __init__(
        self, job: Job, lane: _Lane, attempt: int, queued_at: float, mark: int = 0
    ) -> None:
        # The grant-time attributes (worker, charged, capacity, grant) are set by the grant:
        # leaving them unset here keeps submit cheap.
        self.job = job
        self.lane = lane
        self.attempt = attempt
        self.state = QUEUED
        self.granted_at = 0.0
        self.queued_at = queued_at
        self.pos = 0
        self.mark = mark

    def hand_to(
        self,
        worker: Any,
        granted_at: float,
        charged: float,
        expected_end: float,
        capacity: int,
        grant: Any,
    ) -> None:
        """The entry is granted (or restored held): RUNNING, with its grant-time attributes."""
        self.state = RUNNING
        self.granted_at = granted_at
        self.worker = worker
        self.charged = charged
        self.expected_end = expected_end
        self.capacity = capacity
        self.grant = grant

    def requeued(self, at: float) -> None:
        """Count the entry's warm hold from ``at`` (a release or a retry re-enters it)."""
        self.queued_at = at

    def park(self) -> None:
        """The entry is a delayed job's: ``PARKED`` until its release."""
        self.state = PARKED

    def close(self) -> None:
        """The entry leaves for good (``GONE``): lazy deletion drops it from every heap."""
        self.state = GONE


class _Lane:
    """One member's queue at one level (mutable, private).

    Attributes:
        member: The member.
        level: The priority level.
        s: The virtual start.
        jobs: Entries in FIFO order (lazy deletion).
        by_model: Per model, its entries in FIFO order (lazy deletion; a list while short,
            a deque once long). A job that accepts several models (``model`` None,
            ``needs.models``) is in None's FIFO and in each of its models' (its affinity).
        live: Number of queued entries.
        settled: The settled part of ``s``: ``s = settled + held`` (``settled <= now``).
        held: The up-front charges (in ``s`` units) of its jobs that workers hold.
        holding: How many of its jobs workers hold.
        version: Bumped whenever a ranking key of the lane changes.
        s_log: ``(time, s)`` changes of ``s`` while backlogged (for ``explain``).
        ident: The lane's creation number: the deterministic tie-breaker between lanes.
    """

    __slots__ = (
        "by_model",
        "first",
        "held",
        "holding",
        "ident",
        "jobs",
        "last",
        "level",
        "live",
        "member",
        "owner",
        "s",
        "s_log",
        "settled",
        "version",
    )

    def __init__(
        self,
        member: str,
        level: int,
        s: float,
        ident: int,
        owner: Member,
        version: int = 0,
    ) -> None:
        self.member = member
        self.owner = owner  # the dispatcher's counts of ``member``
        self.level = level
        self.s = s
        self.ident = ident
        self.jobs: deque[_Entry] = deque()
        self.by_model: dict[str | None, _Fifo] = {}
        self.live = 0
        self.held = 0.0
        self.holding = 0
        self.settled = s
        self.first = 0  # pos of the next entry put at the head
        self.last = 0  # pos of the last entry put at the tail
        self.version = version
        self.s_log: deque[tuple[float, float]] = deque()

    def set_s(self) -> None:
        """Recompute ``s = settled + held`` (exactly ``settled`` when nothing is held)."""
        self.s = self.settled + self.held if self.holding else self.settled

    def touch(self, dirty: dict[int, _Lane]) -> None:
        """Mark the lane for re-ranking after any change of its head, candidates or ``s``.

        Its old heap items go stale at once (the version changes); fresh ones are pushed by
        ``Lanes.flush`` (from ``dirty``) just before the next ranking query, so a lane
        changed twice between two grants is re-ranked once.
        """
        self.version += 1
        dirty[id(self)] = self

    def lift(self, floor: float) -> None:
        """Raise the settled part to ``floor`` (a lane that becomes backlogged), then ``s``."""
        self.settled = max(self.settled, floor)
        self.set_s()

    def settle(self, settled: float) -> None:
        """Set the settled part (a final charge, or a re-anchoring), then ``s``."""
        self.settled = settled
        self.s = settled + self.held if self.holding else settled

    def hold(self, charged: float) -> None:
        """A worker takes one of the lane's jobs, charged ``charged`` up front."""
        self.holding += 1
        owner = self.owner
        owner.running += 1
        owner.dispatched += 1
        if charged:
            self.held += charged
            self.s = self.settled + self.held

    def hold_restored(self, charged: float) -> None:
        """A held job of a snapshot comes back on its lane (``s`` recomputed)."""
        self.holding += 1
        self.owner.running += 1
        self.held += charged
        self.set_s()

    def unhold(self, charged: float) -> None:
        """A held job leaves its worker: its up-front charge leaves ``held`` (``s`` kept)."""
        self.holding -= 1
        self.owner.running -= 1
        self.held = self.held - charged if self.holding else 0.0

    def drop(self) -> bool:
        """A queued entry leaves (the deques drop it lazily); whether the lane emptied."""
        self.live -= 1
        self.owner.queued -= 1
        if self.live:
            return False
        self.jobs.clear()
        self.by_model.clear()
        return True

    def head(self) -> _Entry:
        """Return the oldest queued entry. The lane must be backlogged. Amortised O(1)."""
        jobs = self.jobs
        while jobs[0].state != QUEUED:
            jobs.popleft()
        return jobs[0]

    def first_for(self, model: str | None) -> _Entry | None:
        """Return the oldest queued entry for ``model``, or None. Amortised O(1)."""
        fifo = self.by_model.get(model)
        if fifo is None:
            return None
        if fifo[0].state != QUEUED:
            _drop_dead(fifo)
        if not fifo:
            del self.by_model[model]
            return None
        return fifo[0]

    def leads(self, entry: _Entry) -> bool:
        """Whether ``entry`` is the oldest queued of its model (of one of several it takes)."""
        job = entry.job
        if self.first_for(job.model) is entry:
            return True
        needs = job.needs if job.model is None else None
        return needs is not None and any(self.first_for(m) is entry for m in needs.models)

    def append(self, entry: _Entry) -> None:
        """Add a queued entry at the tail."""
        self.jobs.append(entry)
        self.last += 1
        entry.pos = self.last
        model = entry.job.model
        fifo = self.by_model.get(model)
        if fifo is None:
            self.by_model[model] = [entry]
        else:
            fifo.append(entry)
            if len(fifo) > _SHORT and type(fifo) is list:
                self.by_model[model] = deque(fifo)
        if model is None and entry.job.needs is not None:
            self._file_alternates(entry, at_head=False)
        self.live += 1
        self.owner.queued += 1

    def _file_alternates(self, entry: _Entry, *, at_head: bool) -> None:
        """File a job that accepts several models in each of their FIFOs too (besides None's).

        So the lane offers it as its affinity job for any of them (the resident's bonus), as
        a job for that model would be. O(k) for k accepted models; single-model jobs never
        come here.
        """
        needs = entry.job.needs
        assert needs is not None
        for model in needs.models:
            fifo = self.by_model.get(model)
            if fifo is None:
                self.by_model[model] = [entry]
            elif at_head:
                if type(fifo) is list:
                    fifo.insert(0, entry)
                else:
                    fifo.appendleft(entry)  # type: ignore[union-attr]
            else:
                fifo.append(entry)
                if len(fifo) > _SHORT and type(fifo) is list:
                    self.by_model[model] = deque(fifo)

    def appendleft(self, entry: _Entry) -> None:
        """Put a queued entry back at the head (a requeued job)."""
        self.jobs.appendleft(entry)
        entry.pos = self.first
        self.first -= 1
        model = entry.job.model
        fifo = self.by_model.get(model)
        if fifo is None:
            self.by_model[model] = [entry]
        elif type(fifo) is list:
            fifo.insert(0, entry)  # at most _SHORT entries move
        else:
            fifo.appendleft(entry)  # type: ignore[union-attr]
        if model is None and entry.job.needs is not None:
            self._file_alternates(entry, at_head=True)
        self.live += 1
        self.owner.queued += 1

    def candidates(
        self, head: _Entry, window: float, affinity: Callable[[str], float]
    ) -> tuple[list[_Candidate], list[_Candidate]]:
        """Return the lane's affinity candidates: within the window, and anywhere.

        Each candidate is ``(model, bonus, entry)`` with the oldest queued entry of a model
        whose bonus is positive. O(M) amortised.
        """
        windowed: list[_Candidate] = []
        anywhere: list[_Candidate] = []
        limit = head.job.arrival + window
        by_model = self.by_model
        for model in list(by_model):
            fifo = by_model[model]
            if fifo[0].state != QUEUED:
                _drop_dead(fifo)
            if not fifo:
                del by_model[model]
                continue
            if model is None:
                continue
            aff = affinity(model)
            if aff <= 0.0:
                continue
            entry = fifo[0]
            candidate = (model, aff, entry)
            anywhere.append(candidate)
            if entry.job.arrival <= limit:
                windowed.append(candidate)
        return windowed, anywhere

    def check(self, entries: Mapping[str, _Entry], holding: int, now: float | None) -> None:
        """Assert the lane's invariants (for tests; O(its entries)).

        Args:
            entries: The dispatcher's entries by job id (a queued entry is filed there).
            holding: How many of the dispatcher's held entries are the lane's.
            now: The clock, with fair share (a settled start is never later), else None.
        """
        live = [e for e in self.jobs if e.state == QUEUED]
        assert len(live) == self.live, (self.member, self.level)
        assert all(entries.get(e.job.id) is e for e in live)
        assert [e.pos for e in live] == sorted(e.pos for e in live)
        for model, fifo in self.by_model.items():
            assert [e for e in fifo if e.state == QUEUED] == [
                e for e in live if e.job.model == model or (model and e.job.runs_on(model))
            ]
        assert self.holding == holding
        if now is not None:
            assert self.settled <= now
            if not self.holding:
                assert self.s == self.settled

    def queued(self) -> Iterator[_Entry]:
        """Iterate over the queued entries in lane order. O(len(jobs))."""
        return (entry for entry in self.jobs if entry.state == QUEUED)

    def log_s(self, now: float) -> None:
        """Record the current ``s`` for ``explain`` and forget what no queued job needs."""
        log = self.s_log
        log.append((now, self.s))
        if self.live:
            oldest = self.head().job.arrival
            while len(log) >= 2 and log[1][0] <= oldest:
                log.popleft()
