"""The small records the state is built from: per-level and per-member counts, heap items (private).

Every heap of the state holds NamedTuple items, compared as the tuples they are (so the heap
order is that of their fields, in order) and read by field name. Items on hot paths are built
with ``tuple.__new__`` (``new_item``), which skips the NamedTuple's Python-level ``__new__``.
"""

from __future__ import annotations

import math
from collections import deque
from heapq import heapify, heappop, heappush, heapreplace
from operator import attrgetter
from typing import Any, NamedTuple

from prioqueue._lanes import PARKED, QUEUED, _Entry, _Lane
from prioqueue.records import REORDER_CAUSES, Expired, Job
from prioqueue.scoring import ScoreBreakdown

__all__: list[str] = []  # private module

new_item = tuple.__new__  # builds a NamedTuple item without its Python-level __new__


def read_only(field: str, doc: str) -> Any:
    """A read-only attribute of an owner that returns ``self.<field>`` (no setter).

    A ``property`` whose getter is ``operator.attrgetter``: no Python frame per read (the
    owners' reads are on the hot paths), one line per read instead of a ``@property`` block.
    Annotate the class attribute with the type it reads as.
    """
    return property(attrgetter(field), doc=doc)


class Arrival(NamedTuple):
    """A queued entry in its level's arrival heap (lazy deletion: its entry may be gone)."""

    arrival: float
    seq: int
    attempt: int  # keeps a requeued job's new entry apart from its old, dead one
    entry: _Entry


class Backlog(NamedTuple):
    """A backlogged lane's ``s`` in its level's heap (the lift's minimum; lazy deletion)."""

    s: float
    ident: int
    lane: _Lane


class Deadline(NamedTuple):
    """A held entry's lease deadline (lazy deletion: the entry may no longer be held)."""

    deadline: float
    seq: int
    key: int  # id(entry)
    entry: _Entry


class Timer(NamedTuple):
    """A lifecycle timer (docs/design/lifecycle.md): a lapse or a release of ``entry``."""

    at: float
    kind: int
    seq: int
    number: int
    entry: _Entry


class DispatchRecord(NamedTuple):
    """One remembered grant (compact: never the payload)."""

    at: float
    number: int
    job_id: str
    member: str
    priority: int
    seq: int
    model: str | None
    score: ScoreBreakdown
    resident: str | None
    worker: str | None
    # The rule that chose the grant instead of the score's winner: "crossing deferred",
    # "least served" (a crossing's least-served choice), "overdue", or None (the ranking).
    rule: str | None
    size: int  # estimated bytes, for the history's byte budget


#: The window of a level's recent service (seconds; the share gate of bounded crossings,
#: docs/design/dispatcher.md, "The share gate"): a grant's weight in it decays by ``e`` per
#: window. Chosen by the issue-26 sweep on the tuning seeds (1800-7200 s: a plateau).
SHARE_WINDOW = 3600.0


class Level:
    """Per-level bookkeeping."""

    __slots__ = (
        "arrivals",
        "backlog",
        "buckets",
        "by_model",
        "dispatched",
        "lanes",
        "queued",
        "reorders",
        "served",
        "served_at",
        "sum_arrival",
        "total_wait",
    )

    def __init__(self, buckets: int) -> None:
        self.queued = 0
        self.lanes = 0  # backlogged lanes
        self.sum_arrival = 0.0
        self.dispatched = 0
        self.total_wait = 0.0
        # Grants at this level that the winner changed without one term of the score, and
        # the crossings deferred (counted at the level of the job that would cross), by cause.
        self.reorders = dict.fromkeys(REORDER_CAUSES, 0)
        self.buckets = [0] * (buckets + 1)
        self.arrivals: list[Arrival] = []
        # The same items per model (a multi-model job under each model it accepts): the
        # overdue rule's warm choice (``choose.overdue_offer``). Model-less jobs are not filed.
        self.by_model: dict[str, list[Arrival]] = {}
        self.backlog: list[Backlog] = []
        # The level's recent service (the share gate, docs/design/dispatcher.md): GPU-s
        # granted (expected runtimes), decayed by ``exp(-age / SHARE_WINDOW)``, as of
        # ``served_at``.
        self.served = 0.0
        self.served_at = 0.0

    def add(self, item: Arrival) -> None:
        """A queued entry joins the level: counted and filed (``file``). O(k log n)."""
        self.queued += 1
        self.sum_arrival += item.arrival
        self.file(item)
        if len(self.arrivals) > 2 * self.queued + 64:
            self.compact()

    def remove(self, arrival: float, emptied: bool) -> None:
        """A queued entry leaves (the heaps drop it lazily); ``emptied``: its lane with it."""
        self.queued -= 1
        self.sum_arrival -= arrival
        if self.queued == 0:
            self.sum_arrival = 0.0  # no float drift left behind
        if emptied:
            self.lanes -= 1

    def backlogged(self) -> None:
        """One more lane of the level is backlogged."""
        self.lanes += 1

    def reordered(self, cause: str) -> None:
        """One more grant at this level reordered by ``cause`` (see ``REORDER_CAUSES``)."""
        self.reorders[cause] += 1

    def granted(self, wait: float, bucket: int, t: float, runtime: float) -> None:
        """Count a grant at ``t``: its wait and its expected ``runtime``.

        The wait goes in the wait histogram's ``bucket``; the runtime in the level's recent
        service (``recent_gpu_seconds``). O(1).
        """
        self.dispatched += 1
        self.total_wait += wait
        self.buckets[bucket] += 1
        self.served = self.recent_gpu_seconds(t) + runtime
        self.served_at = t

    def recent_gpu_seconds(self, t: float) -> float:
        """The level's recent service at ``t``, in GPU-seconds.

        The expected runtimes of its grants, each weighted ``exp(-age / SHARE_WINDOW)``;
        divided by ``SHARE_WINDOW`` it is the GPUs the level has been using (its rate). O(1).
        """
        served = self.served
        if not served:
            return 0.0
        return served * math.exp((self.served_at - t) / SHARE_WINDOW)

    def restore_service(self, served: float, served_at: float) -> None:
        """A restored level's recent service (``served_at`` already on the new clock)."""
        self.served = served
        self.served_at = served_at

    def note_s(self, lane: _Lane, live: int) -> None:
        """Record a backlogged lane's current ``s`` for the lift's minimum.

        The heap is rebuilt when its stale items outnumber the ``live`` backlogged lanes (of
        every level).
        """
        backlog = self.backlog
        heappush(backlog, new_item(Backlog, (lane.s, lane.ident, lane)))
        if len(backlog) > 2 * live + 64:
            current = {item.lane.ident: item.lane for item in backlog if item.lane.live}
            self.backlog = [Backlog(lane.s, key, lane) for key, lane in current.items()]
            heapify(self.backlog)

    def lift_floor(self, job: Job, divisor: float) -> float:
        """Where a lane that becomes backlogged with ``job`` may start, before ``min(now, .)``.

        The most-starved backlogged lane at the level (smallest ``s``; on a tie, the lane
        created first) sets the floor: the newcomer starts level with it, later by the seconds
        its tier bonus exceeds that lane's head's, so a tier alone can never carry a newcomer
        past the lane that has waited longest. The affinity bonus is not counted: it lasts
        only while a model stays resident, and a start it delayed would outlast it (issue 26,
        twelfth round). ``inf`` when no lane is backlogged. O(log n).
        """
        backlog = self.backlog
        while backlog:
            s, ident, lane = backlog[0]
            if lane.live and s < lane.s:
                # A grant raised s (up-front charge) without re-filing the lane: do it now.
                # (Every decrease of s re-files the lane at once, so no item is ever above.)
                heapreplace(backlog, new_item(Backlog, (lane.s, ident, lane)))
                continue
            if s == lane.s and lane.live:
                gap = job.tier_bonus - lane.head().job.tier_bonus
                return s + gap * divisor if gap > 0.0 else s
            heappop(backlog)
        return math.inf

    def file(self, item: Arrival) -> None:
        """File a queued entry's item in the arrival heap and its models' heaps. O(k log n)."""
        heappush(self.arrivals, item)
        job = item.entry.job
        model = job.model
        if model is not None:
            heap = self.by_model.get(model)
            if heap is None:
                self.by_model[model] = [item]
            else:
                heappush(heap, item)
        elif job.needs is not None:
            for model in job.needs.models:
                heappush(self.by_model.setdefault(model, []), item)

    def compact(self) -> None:
        """Drop the stale items of every heap (when they outnumber the queued). O(n)."""
        self.arrivals = [a for a in self.arrivals if a.entry.state == QUEUED]
        heapify(self.arrivals)
        for name, heap in list(self.by_model.items()):
            kept = [a for a in heap if a.entry.state == QUEUED]
            if kept:
                heapify(kept)
                self.by_model[name] = kept
            else:
                del self.by_model[name]

    def oldest_for(self, model: str) -> Arrival | None:
        """The queued entry for ``model`` that arrived first, or None. Amortised O(log n)."""
        heap = self.by_model.get(model)
        if heap is None:
            return None
        while heap and heap[0].entry.state != QUEUED:
            heappop(heap)
        if not heap:
            del self.by_model[model]
            return None
        return heap[0]

    def oldest(self) -> Arrival | None:
        """The queued entry that arrived first (stale items at the top dropped). Amortised."""
        arrivals = self.arrivals
        while arrivals and arrivals[0].entry.state != QUEUED:
            heappop(arrivals)
        return arrivals[0] if arrivals else None


class History:
    """The remembered grants for ``explain``, within a count and an estimated byte budget."""

    __slots__ = ("bytes", "limit", "records", "size")

    def __init__(self, limit: int, budget: int) -> None:
        self.limit = limit
        self.bytes = budget
        self.records: deque[DispatchRecord] = deque()
        self.size = 0

    def add(self, record: DispatchRecord) -> None:
        """Remember a grant, dropping the oldest beyond the budgets. O(1) amortised."""
        records = self.records
        records.append(record)
        total = self.size + record.size
        while len(records) > self.limit or total > self.bytes:
            total -= records.popleft().size
        self.size = total


LAPSE = 0  # before RELEASE at the same time: a job that expires at r never enters at r
RELEASE = 1


class Timers:
    """The lifecycle's timers and counts (docs/design/lifecycle.md).

    ``heap`` holds a ``Timer`` per deadline of a queued or delayed job with a ttl (``LAPSE``)
    and per release of a delayed one (``RELEASE``); an item whose entry moved on is stale.
    ``next`` is the earliest item's time (maybe stale): the calls' one comparison.
    """

    __slots__ = ("count", "heap", "lapsed", "levels", "next", "parked")

    def __init__(self) -> None:
        self.heap: list[Timer] = []
        self.count = 0
        self.next = math.inf
        self.parked: dict[int, int] = {}  # level -> delayed jobs
        self.lapsed: list[Expired] = []  # Expired(cause="ttl") not yet reported by expire()
        self.levels: dict[int, list[int]] = {}  # level -> [ttl expired, refused]

    def push(self, at: float, kind: int, entry: _Entry) -> None:
        """Add a timer. O(log T)."""
        self.count += 1
        heappush(self.heap, Timer(at, kind, entry.job.seq, self.count, entry))
        self.next = min(self.next, at)

    def park(self, entry: _Entry) -> None:
        """Count a delayed entry and set its timers (release, and lapse with a ttl)."""
        job = entry.job
        self.parked[job.priority] = self.parked.get(job.priority, 0) + 1
        self.push(entry.queued_at, RELEASE, entry)
        if job.deadline is not None:
            self.push(job.deadline, LAPSE, entry)

    def unpark(self, level: int) -> None:
        """Uncount a delayed entry of ``level``."""
        left = self.parked[level] - 1
        if left:
            self.parked[level] = left
        else:
            del self.parked[level]

    def report(self, expired: Expired) -> None:
        """Buffer a ``cause="ttl"`` report for the next ``expire``."""
        self.lapsed.append(expired)

    def life(self, level: int) -> list[int]:
        """The level's ``[ttl expired, refused]`` counts, made on first use."""
        return self.levels.setdefault(level, [0, 0])

    def due(self, t: float) -> Timer | None:
        """Pop the earliest timer due at ``t`` (stale or not), or None (and reset ``next``)."""
        heap = self.heap
        if heap and heap[0].at <= t:
            return heappop(heap)
        self.next = heap[0].at if heap else math.inf
        return None

    def any_due(self, t: float) -> bool:
        """Whether a live timer is due at ``t`` (a read: nothing is popped). O(k) for k due."""
        heap = self.heap
        stack = [0]
        while stack:
            i = stack.pop()
            if i >= len(heap) or heap[i].at > t:
                continue
            _, kind, _, _, entry = heap[i]
            if entry.state == PARKED or (kind == LAPSE and entry.state == QUEUED):
                return True
            stack += (2 * i + 1, 2 * i + 2)
        return False

    def earliest(self) -> float | None:
        """The earliest live timer or buffered report (stale items dropped), or None."""
        best = min((e.deadline for e in self.lapsed), default=None)  # due now: expire reports
        heap = self.heap
        while heap:
            at, kind, _, _, entry = heap[0]
            if entry.state == PARKED or (kind == LAPSE and entry.state == QUEUED):
                # (a job requeued past its deadline has a timer earlier than the buffered ones)
                return at if best is None or at < best else best
            heappop(heap)
        self.next = math.inf
        return best

    def check(self, parked: list[_Entry], queued: list[_Entry]) -> None:
        """Assert the timers' invariants against the delayed and queued entries (for tests).

        Every delayed job has its release timer and every queued job with a ttl its lapse
        timer; the delayed counts are those of ``parked``; ``next`` is never late. O(T + n).
        """
        assert sum(self.parked.values()) == len(parked)
        assert all(v > 0 for v in self.parked.values())
        timers = {id(item.entry) for item in self.heap}
        for entry in parked:
            assert id(entry) in timers
            assert entry.job.deadline is None or entry.queued_at < math.inf
        for entry in queued:
            if entry.job.deadline is not None:
                assert id(entry) in timers
        if self.heap:
            assert self.next <= min(item.at for item in self.heap)

    def drain(self) -> list[Expired]:
        """Hand over the buffered ``cause="ttl"`` reports."""
        lapsed = self.lapsed
        if not lapsed:
            return []
        self.lapsed = []
        return lapsed
