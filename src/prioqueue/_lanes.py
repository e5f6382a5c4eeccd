"""Lanes and the rankings that order them: the data structures behind the dispatcher.

Theory of operation (see docs/design/dispatcher.md for the model):

* An ``_Entry`` is one grant attempt of one job: its state goes QUEUED -> RUNNING -> GONE, and
  never back. A requeued job gets a *new* entry, so a stale reference to the old one (left
  behind by lazy deletion) can never come back to life.
* A ``_Lane`` holds one member's entries at one level in FIFO order, plus one FIFO per model.
  Both deques use lazy deletion: dead entries are dropped when they reach the front.
* A lane's *version* changes whenever anything its ranking keys depend on changes (its head,
  its affinity candidates, its virtual start ``s``). Heap entries carry the version they were
  computed for; an entry whose version is not the lane's current one is stale and is skipped.
* A ``_Ranking`` orders backlogged lanes by one key function: a main heap (no affinity) and one
  heap per model holding the lanes eligible for that model's affinity bonus, keyed with the
  bonus included. The dispatcher keeps one ranking for the real score and, for its reorder
  statistics, one per counterfactual score (without aging, without tier, without fair share).

Every heap item is ``(neg_key, tie, seq, version, lane)``: the highest key first, then the
smaller tie (the lane's ``s``, or the job's arrival), then the smaller submission sequence.
The version makes items unique per lane, so two lanes are never compared.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prioqueue.records import Job

__all__: list[str] = []  # private module

QUEUED = 0
RUNNING = 1
GONE = 2

# (neg_key, tie, seq, version, lane)
_Item = tuple[float, float, int, int, "_Lane"]
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

    def __init__(self, member: str, level: int, s: float, ident: int = 0) -> None:
        self.member = member
        self.owner: Any = None  # the dispatcher's statistics of ``member`` (set on creation)
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
        self.version = 0
        self.s_log: deque[tuple[float, float]] = deque()

    def set_s(self) -> None:
        """Recompute ``s = settled + held`` (exactly ``settled`` when nothing is held)."""
        self.s = self.settled + self.held if self.holding else self.settled

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


_BONUS_CACHE = 4096  # models whose affinity bonus is memoised


class _BonusCache(dict[str, float]):
    """``model -> affinity bonus``, memoised (private).

    The scorer is immutable and the bonus is read for every model of every lane touched. At
    most ``_BONUS_CACHE`` models are kept.
    """

    __slots__ = ("_bonus",)

    def __init__(self, bonus: Callable[[str], float]) -> None:
        super().__init__()
        self._bonus = bonus

    def __missing__(self, model: str) -> float:
        value = self._bonus(model)
        if len(self) < _BONUS_CACHE:
            self[model] = value
        return value


#: The rankings: the real score, and the score without one of its terms.
REAL = 0
NO_AGING = 1
NO_TIER = 2
NO_FAIR = 3


class _Ranking:
    """Backlogged lanes ordered by one score (``REAL`` or a counterfactual), with affinity.

    Args:
        kind: The score, with its key and tie-breaker:

            * ``REAL``: ``level + tier + affinity - s / d``, ties by ``s``.
            * ``NO_AGING``: ``level + tier + affinity``, ties by ``s``.
            * ``NO_TIER``: ``level + affinity - s / d``, ties by ``s``.
            * ``NO_FAIR`` (per-job aging): ``level + tier + affinity - arrival / d``, ties by
              the offered job's arrival.

            ``tier`` is the lane head's bonus. The expressions are evaluated exactly as the
            reference model writes them, so float rounding cannot make the two disagree.
        divisor: The aging divisor.
        affinity: ``model -> bonus``.
        window: The affinity window in seconds, or None for "any job of the model".
    """

    __slots__ = ("affinity", "divisor", "kind", "main", "models", "pushed", "window")

    def __init__(
        self, kind: int, divisor: float, affinity: Callable[[str], float], window: float | None
    ) -> None:
        self.kind = kind
        self.divisor = divisor
        self.affinity = affinity
        self.window = window
        self.main: list[_Item] = []
        self.models: dict[str, list[_Item]] = {}
        self.pushed = 0  # items pushed since the last compaction

    def candidate(self, lane: _Lane, model: str) -> _Entry | None:
        """Return the lane's affinity job for ``model`` under this ranking, or None."""
        entry = lane.first_for(model)
        if entry is None:
            return None
        window = self.window
        if window is not None and entry.job.arrival > lane.head().job.arrival + window:
            return None
        return entry

    def push(self, lane: _Lane, head: _Entry, candidates: list[_Candidate]) -> None:
        """Push the lane's main item and one item per affinity candidate. O(M log n).

        The keys are computed inline: this is the dispatcher's hottest loop.
        """
        version = lane.version
        kind = self.kind
        level = lane.level
        s = lane.s
        d = self.divisor
        seq = head.job.seq
        if kind == REAL:
            base = level + head.job.tier_bonus
            heappush(self.main, (-(base + 0.0 - s / d), s, seq, version, lane))
        elif kind == NO_AGING:
            base = level + head.job.tier_bonus
            heappush(self.main, (-(base + 0.0), s, seq, version, lane))
        elif kind == NO_TIER:
            base = level
            heappush(self.main, (-(level + 0.0 - s / d), s, seq, version, lane))
        else:
            base = level + head.job.tier_bonus
            arrival = head.job.arrival
            heappush(self.main, (-(base + 0.0 - arrival / d), arrival, seq, version, lane))
        self.pushed += 1 + len(candidates)
        models = self.models
        for model, aff, entry in candidates:
            if kind in (REAL, NO_TIER):
                item = (-(base + aff - s / d), s, entry.job.seq, version, lane)
            elif kind == NO_AGING:
                item = (-(base + aff), s, entry.job.seq, version, lane)
            else:
                arrival = entry.job.arrival
                item = (-(base + aff - arrival / d), arrival, entry.job.seq, version, lane)
            heap = models.get(model)
            if heap is None:
                models[model] = heap = []
            heappush(heap, item)

    def best(self, resident: str | None) -> tuple[_Lane, _Entry, float] | None:
        """Return ``(lane, entry, affinity)`` of the winner, or None when nothing is queued.

        Every backlogged lane offers its head (the main heap) and, for each model it is
        eligible for, its affinity job with the bonus (that model's heap); the winner is the
        best offer for the resident model. A lane's own affinity offer beats its head offer
        whenever the bonus adds to the same lane key, so taking the better of the two tops is
        exact. Amortised O(log n).
        """
        main = self.main
        while main:
            top = main[0]
            _, _, _, version, lane = top
            if version == lane.version and lane.live:
                break
            heappop(main)
        else:
            return None
        if resident is not None:
            heap = self.models.get(resident)
            while heap:
                other = heap[0]
                _, _, _, version, other_lane = other
                if version == other_lane.version and other_lane.live:
                    if other[:3] < top[:3]:
                        found = self.candidate(other_lane, resident)
                        assert found is not None  # a current item: the lane is eligible
                        return other_lane, found, self.affinity(resident)
                    break
                heappop(heap)
        return lane, lane.head(), 0.0

    def compact(self, live_lanes: int) -> None:
        """Drop stale items when they outnumber live ones. Amortised O(1) per push.

        Each heap holds at most one current item per lane, so once more items were pushed
        since the last compaction than four times the live lanes, most items are stale.
        """
        limit = 4 * live_lanes + 64
        if self.pushed <= limit:
            return
        self.pushed = 0
        if len(self.main) > limit:
            self.main = self._valid(self.main)
        for model, heap in list(self.models.items()):
            if len(heap) > limit:
                kept = self._valid(heap)
                if kept:
                    self.models[model] = kept
                else:
                    del self.models[model]

    @staticmethod
    def _valid(heap: list[_Item]) -> list[_Item]:
        kept = [item for item in heap if item[3] == item[4].version and item[4].live]
        heapify(kept)
        return kept


def rankings(
    divisor: float, affinity: Callable[[str], float], window: float, *, track: bool
) -> tuple[_Ranking, tuple[_Ranking, ...]]:
    """The real ranking, and the counterfactual ones behind the reorder counts when ``track``.

    The counterfactuals: without aging, without the tier bonus, without fair share (the real
    ranking without affinity is its main heap).
    """
    real = _Ranking(REAL, divisor, affinity, window)
    if not track:
        return real, ()
    return real, (
        _Ranking(NO_AGING, divisor, affinity, window),
        _Ranking(NO_TIER, divisor, affinity, window),
        _Ranking(NO_FAIR, divisor, affinity, None),
    )
