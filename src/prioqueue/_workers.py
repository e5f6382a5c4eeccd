"""Workers of a fleet and the search for the job a worker may take (private).

Theory of operation (the model is docs/design/fleet.md):

* A ``_Worker`` is one puller: the models it serves, its resident model, its slots, whether it
  is slow, its ``accepts`` filter, the entries it holds and when it was last heard from.
* ``best_for`` finds the winner of a pop for one worker. Each backlogged lane offers the worker
  its oldest *eligible* job (the model is served, ``accepts`` says yes, no warm hold applies),
  or, when it holds an eligible job for the worker's resident model within the affinity window,
  the oldest such job with the affinity bonus. Offers compare by ``(-key, s, tie seq)``, the
  tie seq being that of the lane's head (or of its first job for the resident model): the
  heap items' own order.
* The rankings' heaps are read in order: items are popped into a scratch list until the best
  offer is certain, then pushed back. Stale items met on the way are dropped for good. A lane
  whose member is at its running cap, or that holds no eligible job, is skipped.

Cost of one search: O((k + 1) (log n + F) + a) where k is the number of lanes skipped, F the
models the worker serves that a lane holds (or the jobs read in a lane for a worker that
serves every model but filters) and a the ``accepts`` calls.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from heapq import heapify, heappop, heappush, heapreplace
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue._batch import Narrowable
from prioqueue._lanes import QUEUED, _Entry, _Lane
from prioqueue._rankings import _Item, _Ranking
from prioqueue._worker_info import worker_info
from prioqueue.capabilities import CAPABILITY_CAUSES, Capabilities, chosen_model, unfit
from prioqueue.records import WorkerInfo

if TYPE_CHECKING:
    from prioqueue.records import Job

__all__: list[str] = []  # private module

#: The causes ``idle_reasons`` reports, in the order they are checked: ``model`` and the
#: capability causes (``prioqueue.capabilities.CAPABILITY_CAUSES``) come from one check.
IDLE_CAUSES = ("slots_full", "member_cap", *CAPABILITY_CAUSES, "accepts", "warm_hold")


@attrs.define(eq=False)
class _Worker(Narrowable):
    """One worker of the fleet (mutable, private)."""

    name: str
    last_seen: float
    models: frozenset[str] | None = None
    resident: str | None = None
    slots: int = 1
    slow: bool = False
    accepts: Callable[[Job], bool] | None = None
    capabilities: Capabilities | None = None
    held: list[_Entry] = attrs.field(factory=list)
    timed_out: bool = False

    def configure(
        self,
        models: frozenset[str] | None,
        slots: int,
        slow: bool,
        accepts: Callable[[Job], bool] | None,
        capabilities: Capabilities | None,
    ) -> None:
        """Set what the worker serves and how (a join, or a snapshot's worker)."""
        self.models = models
        self.slots = slots
        self.slow = slow
        self.accepts = accepts
        self.capabilities = capabilities

    def heard(self, t: float) -> None:
        """The worker spoke at ``t`` (its last word, for the worker timeout)."""
        self.last_seen = t

    def take(self, entry: _Entry, t: float) -> None:
        """The worker takes a granted entry at ``t`` (a pop: it spoke then)."""
        self.held.append(entry)
        self.last_seen = t

    def keep(self, entry: _Entry) -> None:
        """The worker holds ``entry`` again (a snapshot's held job)."""
        self.held.append(entry)

    def let_go(self, entry: _Entry) -> None:
        """The worker no longer holds ``entry``."""
        self.held.remove(entry)

    def order_held(self, key: Callable[[_Entry], Any]) -> None:
        """Sort the held entries by ``key`` (a restored snapshot's grant order)."""
        self.held.sort(key=key)

    def set_timed_out(self, timed_out: bool) -> None:
        """Mark the worker timed out (out of the capacity) or back."""
        self.timed_out = timed_out

    def load(self, model: str | None) -> None:
        """The worker's resident model is now ``model``."""
        self.resident = model

    def check(self) -> None:
        """Assert the worker's invariant: it holds only entries granted to it (for tests)."""
        assert all(entry.worker is self for entry in self.held)

    def expected_free(self) -> float:
        """When a worker holding ``slots`` jobs is expected to free one. O(slots).

        The earliest expected end of the jobs it holds (each its grant time plus its expected
        runtime).
        """
        return min(entry.expected_end for entry in self.held)

    def serves(self, model: str | None) -> bool:
        """Whether the worker runs jobs for ``model`` (a job without a model runs anywhere)."""
        return model is None or self.models is None or model in self.models

    def unfit(self, job: Job) -> str | None:
        """Why the job does not fit the worker (``prioqueue.capabilities.unfit``), or None."""
        if not self.serves(job.model):
            return "model"
        return unfit(self.models, self.capabilities, job.needs)

    def granted(self, job: Job) -> Job:
        """The job as granted to this worker: one accepting several models gets the chosen one.

        ``prioqueue.capabilities.chosen_model``: the resident when the job accepts it, else the
        first of its models the worker serves (the lease is sized for it). O(models).
        """
        needs = job.needs
        if needs is None or job.model is not None or not needs.models:
            return job
        return attrs.evolve(job, model=chosen_model(needs.models, self.models, self.resident))

    def info(self) -> WorkerInfo:
        """The public record of the worker. O(slots)."""
        return worker_info(self, tuple(entry.job.id for entry in self.held))


class SeenOrder:
    """The live workers by their last word, for the earliest worker timeout (a lazy heap).

    An entry ``(last_seen, seq, worker)`` is pushed when a worker joins, is restored or
    comes back from a time-out. A worker's ``last_seen`` only grows (a preview of a pop,
    ``FleetDispatcher.would_pop``, leaves it as it is), so its entry is never later than its
    last word: :meth:`oldest` refreshes the stale entries it meets at
    the top and drops those of workers gone or timed out. Each read costs O(log n) per
    change of a worker since the last read, amortised, instead of a scan of the fleet.
    """

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, _Worker]] = []
        self.seq = 0

    def push(self, worker: _Worker) -> None:
        """File ``worker`` at its ``last_seen``. O(log n)."""
        self.seq += 1
        heappush(self.heap, (worker.last_seen, self.seq, worker))

    def oldest(self, workers: Mapping[str, _Worker]) -> float | None:
        """The least recent ``last_seen`` of a live (not timed-out) worker, or None."""
        heap = self.heap
        if len(heap) > 2 * len(workers) + 64:  # mostly stale: rebuild, O(n) now and then
            self.seq += 1
            heap[:] = [(w.last_seen, self.seq, w) for w in workers.values() if not w.timed_out]
            heapify(heap)
        while heap:
            seen, _, worker = heap[0]
            if worker.timed_out or workers.get(worker.name) is not worker:
                heappop(heap)
            elif worker.last_seen != seen:
                self.seq += 1
                heapreplace(heap, (worker.last_seen, self.seq, worker))
            else:
                return seen
        return None


class Search:
    """One pop's view of eligibility for one worker (private).

    Args:
        worker: The popping worker.
        cap: ``max_running_per_member``, or None.
        free_warm: The models resident on *other* live workers that serve them and have a
            free slot (the warm hold keeps a job for them until ``queued_at + hold``).
        warm_free_at: Per model, when the *other* live workers that have it resident, serve
            it and hold ``slots`` jobs are expected to free a slot, for those expected within
            ``hold`` of now, either way (an overdue one counts as free now). The warm hold
            keeps the oldest queued jobs for the model that these workers are expected to
            start within ``hold`` of now.
        lanes: Every lane (read to find a model's queued jobs, once per model).
        expected: ``job -> expected runtime`` (the dispatcher's).
        loads: Cold-load seconds per model: once ``relaxed()`` (the worker would otherwise
            idle), a job is kept only for a warm worker expected to start it within
            ``min(hold, load)`` of now (a model not in it: ``hold``).
        hold: ``warm_hold`` seconds.
        now: The pop's time.
        top: The highest level with queued jobs (for the aging exemption).
        bound: ``(T + A) * d``: a job that waited ``(top - level) * d + bound`` seconds or more
            (aging has carried it past every band: the report's aging bound) is never held.
        divisor: The aging divisor ``d``.
    """

    __slots__ = (
        "accepts",
        "bound",
        "cap",
        "capabilities",
        "capped",
        "divisor",
        "expected",
        "free_warm",
        "hold",
        "lanes",
        "limits",
        "loads",
        "models",
        "now",
        "resident",
        "top",
        "warm",
        "warm_free_at",
    )

    def __init__(
        self,
        worker: _Worker,
        cap: int | None,
        free_warm: frozenset[str] = frozenset(),
        warm_free_at: dict[str, list[float]] | None = None,
        lanes: Iterable[_Lane] = (),
        expected: Callable[[Job], float] | None = None,
        loads: Mapping[str, float] | None = None,
        hold: float = 0.0,
        now: float = 0.0,
        top: int = 0,
        bound: float = 0.0,
        divisor: float = 1.0,
    ) -> None:
        self.models = worker.models
        self.accepts = worker.accepts
        self.capabilities = worker.capabilities
        self.resident = worker.resident
        self.cap = cap
        self.free_warm = free_warm
        self.warm_free_at = {} if warm_free_at is None else warm_free_at
        self.warm = bool(free_warm or self.warm_free_at)  # whether any hold may apply
        self.lanes = lanes
        self.expected = expected
        self.loads = {} if loads is None else loads
        self.capped = False
        self.limits: dict[str, int] = {}
        self.hold = hold
        self.now = now
        self.top = top
        self.bound = bound
        self.divisor = divisor

    def relaxed(self) -> Search | None:
        """The view for a worker that nothing is eligible for: holds capped at load times.

        None when that changes nothing (no hold applies, or no load is known).
        """
        if not self.warm or self.capped or not self.loads:
            return None
        if not any(model in self.loads for model in self.warm_free_at):
            return None
        other = copy.copy(self)
        other.capped = True
        other.limits = {}
        return other

    def at_cap(self, lane: _Lane) -> bool:
        """Whether the lane's member is at its running cap."""
        cap = self.cap
        return cap is not None and lane.owner.running >= cap

    def held_back(self, entry: _Entry) -> bool:
        """Whether the warm hold keeps the entry for another worker."""
        job = entry.job
        model = job.model
        if model is None or model == self.resident:
            return False
        if self.now - job.arrival >= (self.top - job.priority) * self.divisor + self.bound:
            return False  # starving: aging outranks placement
        if model in self.free_warm and self.now < entry.queued_at + self.hold:
            return True
        if model not in self.warm_free_at:
            return False
        limit = self.limits.get(model)
        if limit is None:
            limit = self.limits[model] = self._limit(model)
        return entry.job.seq <= limit

    def _limit(self, model: str) -> int:
        """The largest seq of the queued jobs for ``model`` kept for its warm workers.

        Those the warm workers are expected to start within ``min(hold, load)`` of now, taking
        the jobs by seq, each on the first worker expected free (-1: none). O(lanes + k log k)
        for k such jobs.
        """
        assert self.expected is not None
        jobs = sorted(
            (entry.job for lane in self.lanes for entry in lane.by_model.get(model, ())
             if entry.state == QUEUED and entry.job.model == model),
            key=lambda job: job.seq,
        )  # fmt: skip
        free = list(self.warm_free_at[model])
        heapify(free)
        now = self.now
        load = self.loads.get(model) if self.capped else None
        deadline = now + (self.hold if load is None or load > self.hold else load)
        limit = -1
        for job in jobs:
            start = free[0]
            if start > deadline:
                break
            limit = job.seq
            heapreplace(free, (start if start > now else now) + self.expected(job))
        return limit

    def ok(self, entry: _Entry) -> bool:
        """Whether an entry of a served model may go to the worker (needs, accepts, warm hold)."""
        caps = self.capabilities
        needs = entry.job.needs
        if (needs is not None or caps is not None) and unfit(self.models, caps, needs):
            return False
        accepts = self.accepts
        if accepts is not None and not accepts(entry.job):
            return False
        return not (self.warm and self.held_back(entry))

    def first(self, lane: _Lane) -> _Entry | None:
        """The lane's oldest eligible entry (lane order), or None."""
        models = self.models
        if models is None:
            for entry in lane.jobs:
                if entry.state == QUEUED and self.ok(entry):
                    return entry
            return None
        by_model = lane.by_model
        keys: Any = models if len(models) < len(by_model) else list(by_model)
        best: _Entry | None = None
        for model in (None, *keys):
            if model is not None and model not in models:
                continue
            if model is None and best is not None:
                continue  # None came twice (it is also a key of by_model)
            fifo = by_model.get(model)
            if not fifo:
                continue
            for entry in fifo:
                if best is not None and entry.pos > best.pos:
                    break
                if entry.state == QUEUED and self.ok(entry):
                    best = entry
                    break
        return best

    def affinity_job(self, lane: _Lane, model: str, window: float) -> _Entry | None:
        """The lane's oldest eligible entry for ``model`` within the window, or None."""
        if self.models is not None and model not in self.models:
            return None
        fifo = lane.by_model.get(model)
        if not fifo:
            return None
        limit = lane.head().job.arrival + window
        for entry in fifo:
            if entry.state != QUEUED:
                continue
            if entry.job.arrival > limit:
                return None
            if self.ok(entry):
                return entry
        return None


def best_for(
    ranking: _Ranking, search: Search, window: float
) -> tuple[_Lane, _Entry, float] | None:
    """The winning ``(lane, entry, bonus)`` for the search's worker, or None.

    Offers compare by the heap items themselves (``-key, s, tie seq``: the lane's head, or its
    first job for the resident model), so in each heap the first lane with an eligible job is
    that heap's best; the winner is the better of the two. The heaps are left holding the same
    current items (popped ones are pushed back).
    """
    best: tuple[tuple[float, float, int], _Lane, _Entry, float] | None = None
    resident = search.resident
    heaps: list[tuple[list[_Item], float]] = [(ranking.main, 0.0)]
    if resident is not None:
        heap = ranking.models.get(resident)
        if heap:
            heaps.append((heap, ranking.affinity(resident)))
    for heap, bonus in heaps:
        scratch: list[_Item] = []
        try:
            while heap:
                item = heap[0]
                _, _, _, version, lane = item  # (neg_key, tie, seq, version, lane): see _lanes
                if version != lane.version or not lane.live:
                    heappop(heap)
                    continue
                if best is not None and item[:3] > best[0]:
                    break
                scratch.append(heappop(heap))
                if search.at_cap(lane):
                    continue
                if bonus:
                    assert resident is not None
                    entry = search.affinity_job(lane, resident, window)
                else:
                    entry = search.first(lane)
                if entry is not None:
                    best = (item[:3], lane, entry, bonus)
                    break
        finally:
            for item in scratch:
                heappush(heap, item)
    if best is None:
        return None
    _, lane, entry, bonus = best
    return lane, entry, bonus


def idle_reasons(entries: list[_Entry], worker: _Worker, search: Search) -> dict[str, int]:
    """Count the queued entries the worker may not take, by the first cause. O(n)."""
    counts: dict[str, int] = {}
    full = len(worker.held) >= worker.slots
    for entry in entries:
        if full:
            cause = "slots_full"
        elif search.at_cap(entry.lane):
            cause = "member_cap"
        elif (unfit_cause := worker.unfit(entry.job)) is not None:
            cause = unfit_cause
        elif worker.accepts is not None and not worker.accepts(entry.job):
            cause = "accepts"
        elif search.warm and search.held_back(entry):
            cause = "warm_hold"
        else:
            continue
        counts[cause] = counts.get(cause, 0) + 1
    return counts
