"""The grant side of both dispatchers: pops, charges, leases, completions and take-backs (private).

Theory of operation (the model is docs/design/fleet.md):

* ``_pop`` finds the winner for one worker (the size-1 fast path when the worker serves every
  model with no filter, else ``_workers.best_for``), sizes its lease and its expected charge
  *before* changing anything, then hands the job to the worker and charges its lane up front:
  ``held += expected / N`` for the fleet's capacity ``N``.
* ``_finish`` (complete, or cancel of a held job) corrects the lane: the up-front charge leaves
  ``held`` and the settled part advances by ``final / N`` (clamped at ``now``), so the lane ends
  exactly where charging at completion would have put it.
* ``_take_back`` (lease expiry, worker timeout, leave) refunds exactly the up-front charge and
  requeues the job at the head of its lane, or reports it failed after ``max_attempts``.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Mapping
from heapq import heappop as _heappop
from heapq import heappush as _heappush
from heapq import heapreplace as _heapreplace
from types import MappingProxyType
from typing import Literal, NamedTuple

from prioqueue import _lifecycle
from prioqueue._core import _RECENT_PER_KEY, DEFERRED, _Level
from prioqueue._errors import InvalidState, LeaseError, LeaseExpired, UnknownWorker
from prioqueue._groups import GroupMethods
from prioqueue._journaled import journaled
from prioqueue._lanes import GONE, QUEUED, RUNNING, _Entry, _Lane
from prioqueue._reporting import _Reporting
from prioqueue._validate import checked_name, finite
from prioqueue._workers import Search, _Worker, best_for
from prioqueue.lease import Lease
from prioqueue.records import (
    Completed,
    Expired,
    Grant,
    Job,
)
from prioqueue.scoring import ScoreBreakdown

__all__: list[str] = []  # private module

_RECORD_BYTES = 200  # the fixed part of a history record's estimated size

#: How many of a level's least-served lanes a crossing or a deferral chooses among (by the
#: ranking's order): enough to find the worker's resident model among them, few enough to keep
#: a grant O(log n).
LEAST_SERVED = 8


class DispatchRecord(NamedTuple):
    """One remembered grant (private; compact: never the payload)."""

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
    deferred: bool  # the grant deferred a crossing (a lower level's job had the best score)
    size: int  # estimated bytes, for the history's byte budget


_new_record = tuple.__new__  # builds a DispatchRecord without its Python-level __new__


class _Engine(_Reporting, GroupMethods):
    """Grants, completions and take-backs over the workers in ``_workers`` (private)."""

    #: Cold-load seconds per model (``FleetDispatcher(load_seconds=...)``): caps the warm hold.
    _load_seconds: Mapping[str, float] = MappingProxyType({})

    # ------------------------------------------------------------------ workers

    def _worker_of(self, name: object) -> _Worker:
        worker = self._workers.get(name) if isinstance(name, str) else None
        if worker is None:
            raise UnknownWorker(f"worker {name!r} has not joined (or it left); join() it first")
        return worker

    def _seen(self, worker: _Worker, t: float) -> None:
        """Mark the worker heard from at ``t``, reviving it when it had timed out."""
        worker.last_seen = t
        if worker.timed_out:
            worker.timed_out = False
            self._live += 1
            if worker.resident is not None:
                self._residents[worker.resident] = self._residents.get(worker.resident, 0) + 1

    def _aging_exemption(self) -> float:
        """``(T + A) * d``: the offsets' spread in seconds (the aging bound's constant)."""
        config = self._scorer.config
        bonuses = list(config.tier_bonuses.values())
        spread = max(bonuses) - min(bonuses) if bonuses else 0.0
        return (spread + config.max_affinity) * self._divisor

    def _search(self, worker: _Worker, t: float) -> Search:
        """The pop's eligibility view, with the warm hold's workers (the design note's rule).

        With ``warm_hold = h > 0``, each other live worker that has a model resident and
        serves it is *warm* for it: free now (a free slot), or busy (``slots`` jobs held) and
        expected to free a slot at ``e`` with ``t - h < e <= t + h`` (``free_at`` lists the
        busy ones' ``e`` per model). O(workers x slots).
        """
        hold = self._warm_hold
        if not hold > 0:
            return Search(worker, self._max_running)
        low = t - hold
        high = t + hold
        free: set[str] = set()
        free_at: dict[str, list[float]] = {}
        for other in self._workers.values():
            resident = other.resident
            if other is worker or resident is None or other.timed_out or not other.serves(resident):
                continue
            if len(other.held) < other.slots:
                free.add(resident)
                continue
            at = other.expected_free()
            if not low < at <= high:
                continue
            times = free_at.get(resident)
            if times is None:
                free_at[resident] = [at]
            else:
                times.append(at)
        return Search(
            worker,
            self._max_running,
            frozenset(free),
            free_at,
            self._lanes.values(),
            self._expected_runtime,
            self._load_seconds,
            hold,
            t,
            max((level for level, counts in self._levels.items() if counts.queued), default=0),
            self._aging_exemption(),
            self._divisor,
        )

    # ------------------------------------------------------------------ pop

    def _pop(self, worker: _Worker, t: float) -> Grant | None:
        """Grant the worker its best eligible job (see the design note).

        Nothing changes on any error.
        """
        if len(worker.held) >= worker.slots:
            return None
        self._flush()
        resident = worker.resident
        search: Search | None = None
        fast = worker.models is None and worker.accepts is None
        if fast and self._warm_hold > 0:
            search = self._search(worker, t)
            fast = not search.warm
        best = self._ranking.best(resident) if fast else None
        cap = self._max_running
        if cap is not None and best is not None and best[0].owner.running >= cap:
            fast = False
        if not fast:
            if search is None:
                search = self._search(worker, t)
            best = best_for(self._ranking, search, self._window)
            if best is None:
                # The longer hold applies only while the worker has something else to run.
                relaxed = search.relaxed()
                if relaxed is not None:
                    best = best_for(self._ranking, relaxed, self._window)
        if best is None:
            return None
        lane, entry, aff = best
        winner = entry.job  # the score's winner (the reorder counts compare against it)
        # Bounded crossings (docs/design/dispatcher.md): a winner below the top eligible level
        # crosses it; it is granted while the credit is not negative, else deferred.
        deferred: _Entry | None = None
        weight = 0.0
        share = self._share
        if share < 1.0:
            top = self._top_level()
            if top is not None and lane.level < top:
                if search is None:
                    search = self._search(worker, t)
                every = fast and cap is None  # every queued job is eligible: B is top
                higher = None if every else self._above(search, lane.level, top, every)
                if every or higher is not None:
                    if self._credit >= 0.0:
                        # The crossing goes to the level whose oldest job has waited
                        # longest for its band, to that level's least-served choice.
                        weight = share - 1.0
                        b = top if higher is None else higher[0].level
                        starving = self._oldest_below(b).job.priority
                        if starving != lane.level:
                            offer = self._least_served(starving, search, every)
                            if offer is not None:
                                lane, entry, aff = offer
                    else:
                        if higher is None:
                            higher = self._above(search, lane.level, top, every)
                        assert higher is not None
                        deferred = entry
                        lane, entry, aff = higher
                        weight = share
        job = entry.job
        lease = None if self._lease_for is None else self._lease(job, worker, t)
        charged = 0.0
        capacity = self._live or 1
        expected = runtime = self._expected_runtime(job)
        if self._fair_share:
            if not self._plain_charge:
                expected = self._checked_charge(job, expected, "expected charge")
            charged = expected / capacity
        # The reported term is never negative; the ranking uses s itself (a lane charged up
        # front for jobs still running may be ahead of the clock).
        aging = (t - lane.s) / self._divisor
        aging = aging if aging >= 0.0 else 0.0  # max(aging, 0.0) without the call
        # Positional arguments: band, tier_bonus, swap_affinity, aging (the hot path).
        score = ScoreBreakdown(job.priority, lane.head().job.tier_bonus, aff, aging)
        level = self._levels[job.priority]
        if self._track and fast:
            self._count_reorders(
                level if winner is job else self._levels[winner.priority], winner, resident
            )
        swap = job.model is not None and job.model != resident
        name = worker.name if self._name_in_grants else None
        # Positional: job, score, lease, granted_at, attempt, waited, swap, worker.
        wait = t - job.arrival
        grant = Grant(job, score, lease, t, entry.attempt, wait, swap, name)
        self._dispatches += 1
        model = job.model
        limit = self._history_limit
        if limit:
            # Remember the grant for ``explain``, within ``history`` entries and bytes. O(1).
            history = self._history
            size = _RECORD_BYTES + len(job.id) + len(job.member) + (len(model) if model else 0)
            history.append(
                _new_record(
                    DispatchRecord,
                    (t, self._dispatches, job.id, job.member, job.priority, job.seq, model,
                     score, resident, name, deferred is not None, size),
                )
            )  # fmt: skip
            total = self._history_size + size
            while len(history) > limit or total > self._history_bytes:
                total -= history.popleft().size
            self._history_size = total
        # State changes start here; nothing below can fail.
        entry.state = RUNNING
        entry.granted_at = t
        entry.worker = worker
        entry.charged = charged
        entry.expected_end = t + runtime
        entry.capacity = capacity
        entry.grant = grant
        if weight:
            self._crossings[entry] = (weight, runtime)
            self._credit += weight * runtime
            if deferred is not None:
                self._levels[deferred.job.priority].reorders[DEFERRED] += 1
        self._dequeue(entry)
        self._held += 1
        worker.held.append(entry)
        worker.last_seen = t
        lane.holding += 1
        owner = lane.owner
        owner.running += 1
        owner.dispatched += 1
        if charged:
            lane.held += charged
            lane.s = lane.settled + lane.held
            # s only grew: the lift's minimum re-files the lane when its old item surfaces
            # (``_lift_floor``), and ``s_log``, for explain, follows the settled part.
        if lease is not None:
            _heappush(self._deadlines, (lease.deadline, job.seq, id(entry), entry))
        if model is not None and model != resident:  # that is, ``swap``
            # _set_resident inlined (the hot path; the popping worker is live).
            residents = self._residents
            if resident is not None:
                left = residents[resident] - 1
                if left:
                    residents[resident] = left
                else:
                    del residents[resident]
            residents[model] = residents.get(model, 0) + 1
            worker.resident = model
            self._swaps += 1
        level.dispatched += 1
        level.total_wait += wait
        level.buckets[bisect.bisect_left(self._buckets, wait)] += 1
        self._totals["dispatched"] += 1
        self._groups.move(job.id, "running")
        return grant

    def _oldest_below(self, top: int) -> _Entry:
        """The queued job below level ``top`` that waited longest for its band.

        That is the highest ``level - arrival / d`` (band plus the aging of its own wait);
        ties by arrival, then seq. There is one: the caller found a backlogged lane below
        ``top``. O(levels).
        """
        best: tuple[tuple[float, float, int], _Entry] | None = None
        d = self._divisor
        levels = self._levels
        for number in self._level_order:
            if number >= top:
                continue
            level = levels[number]
            if not level.queued:
                continue
            arrivals = level.arrivals
            while arrivals[0][3].state != QUEUED:
                _heappop(arrivals)
            arrival, seq, _, entry = arrivals[0]
            key = (-(number - arrival / d), arrival, seq)
            if best is None or key < best[0]:
                best = (key, entry)
        assert best is not None
        return best[1]

    def _above(
        self, search: Search, level: int, top: int, every: bool
    ) -> tuple[_Lane, _Entry, float] | None:
        """The least-served lane's offer at the highest level above ``level`` with one.

        None when the worker has no eligible job above ``level``; ``top`` is the highest
        backlogged level. With ``every`` (the fast path, no member cap) every job is
        eligible, so that level is ``top``: amortised O(log n). Otherwise the levels are
        tried from ``top`` down (see ``_least_served``).
        """
        if every:
            return self._least_served(top, search, True)
        for number in self._level_order:
            if number <= level:
                break
            if number > top or not self._levels[number].lanes:
                continue
            offer = self._least_served(number, search, False)
            if offer is not None:
                return offer
        return None

    def _least_served(
        self, number: int, search: Search, every: bool
    ) -> tuple[_Lane, _Entry, float] | None:
        """The offer a crossing or a deferral takes at level ``number``, or None.

        Of the ``LEAST_SERVED`` lanes with the smallest ``s`` (ties: the lane created first;
        without fair share each job is its own lane: by arrival, then seq) that offer the
        search's worker a job, the one whose offer the ranking puts first (its key, then
        ``s``, then its tie seq). A lane offers as in the ranking: its affinity job for the
        worker's resident model (with the bonus) when it has an eligible one within the
        window, else its first eligible job. Amortised O(K log n) for K = ``LEAST_SERVED``
        plus the lanes skipped (that offer the worker nothing).
        """
        level = self._levels[number]
        resident = search.resident
        bonus = self._affinity(resident) if resident is not None else 0.0
        d = self._divisor
        if every:
            return self._least_served_fast(level, resident, bonus)
        found: list[tuple[tuple[float, float, int], _Lane, _Entry, float]] = []

        def offer(lane: _Lane) -> None:
            if search.at_cap(lane):
                return
            if bonus > 0.0:
                assert resident is not None
                chosen = search.affinity_job(lane, resident, self._window)
                if chosen is not None:
                    first = lane.first_for(resident)
                    assert first is not None
                    key = lane.level + lane.head().job.tier_bonus + bonus - lane.s / d
                    found.append(((-key, lane.s, first.job.seq), lane, chosen, bonus))
                    return
            chosen = search.first(lane)
            if chosen is not None:
                head = lane.head()
                key = lane.level + head.job.tier_bonus + 0.0 - lane.s / d
                found.append(((-key, lane.s, head.job.seq), lane, chosen, 0.0))

        if self._fair_share:
            backlog = level.backlog
            scratch: list[tuple[float, int, _Lane]] = []
            seen: set[int] = set()
            while backlog and len(found) < LEAST_SERVED:
                s, ident, lane = backlog[0]
                if not lane.live or s > lane.s:
                    _heappop(backlog)  # gone, or a duplicate of a re-filed item
                    continue
                if s < lane.s:
                    _heapreplace(backlog, (lane.s, ident, lane))  # a grant raised s
                    continue
                scratch.append(_heappop(backlog))
                if ident not in seen:
                    seen.add(ident)
                    offer(lane)
            for filed in scratch:
                _heappush(backlog, filed)
        else:
            arrivals = level.arrivals
            taken: list[tuple[float, int, int, _Entry]] = []
            while arrivals and len(found) < LEAST_SERVED:
                queued = _heappop(arrivals)
                if queued[3].state != QUEUED:
                    continue
                taken.append(queued)
                offer(queued[3].lane)
            for kept in taken:
                _heappush(arrivals, kept)
        if not found:
            return None
        _, lane, entry, aff = min(found, key=lambda row: row[0])
        return lane, entry, aff

    def _least_served_fast(
        self, level: _Level, resident: str | None, bonus: float
    ) -> tuple[_Lane, _Entry, float] | None:
        """``_least_served`` for a worker that may take every job (the fast path)."""
        lanes: list[_Lane] = []
        if self._fair_share:
            backlog = level.backlog
            want = LEAST_SERVED if level.lanes > LEAST_SERVED else level.lanes
            scratch: list[tuple[float, int, _Lane]] = []
            while backlog and len(lanes) < want:
                s, ident, lane = backlog[0]
                if not lane.live or s > lane.s:
                    _heappop(backlog)  # gone, or a duplicate of a re-filed item
                    continue
                if s < lane.s:
                    _heapreplace(backlog, (lane.s, ident, lane))  # a grant raised s
                    continue
                scratch.append(_heappop(backlog))
                if lane not in lanes:
                    lanes.append(lane)
            for filed in scratch:
                _heappush(backlog, filed)
        else:
            arrivals = level.arrivals
            taken: list[tuple[float, int, int, _Entry]] = []
            while arrivals and len(lanes) < LEAST_SERVED:
                queued = _heappop(arrivals)
                if queued[3].state == QUEUED:
                    taken.append(queued)
                    lanes.append(queued[3].lane)
            for kept in taken:
                _heappush(arrivals, kept)
        d = self._divisor
        ranking = self._ranking
        best: tuple[float, float, int] | None = None
        won: tuple[_Lane, _Entry, float] | None = None
        for lane in lanes:
            head = lane.head()
            s = lane.s
            chosen = None
            if bonus > 0.0:
                assert resident is not None
                chosen = ranking.candidate(lane, resident)
            if chosen is not None:
                key = lane.level + head.job.tier_bonus + bonus - s / d
                order = (-key, s, chosen.job.seq)
                offer = (lane, chosen, bonus)
            else:
                key = lane.level + head.job.tier_bonus + 0.0 - s / d
                order = (-key, s, head.job.seq)
                offer = (lane, head, 0.0)
            if best is None or order < best:
                best, won = order, offer
        return won

    def _lease(self, job: Job, worker: _Worker, t: float) -> Lease:
        """Size the winner's lease; any failure becomes a ``LeaseError`` naming the job."""
        assert self._lease_for is not None
        try:
            seconds = self._lease_for(job, worker)
        except Exception as exc:
            raise LeaseError(
                f"lease_for raised for job {job.id!r}: {exc!r}; the job is still queued",
                job_id=job.id,
            ) from exc
        if (
            not isinstance(seconds, (int, float))
            or isinstance(seconds, bool)
            or not 0 < seconds < math.inf
        ):
            raise LeaseError(
                f"lease_for returned {seconds!r} for job {job.id!r}; a lease must be a finite "
                "number of seconds > 0; the job is still queued",
                job_id=job.id,
            )
        return Lease(granted_at=t, seconds=seconds)

    def _count_reorders(self, level: _Level, job: Job, resident: str | None) -> None:
        counts = level.reorders
        # Without affinity: the real ranking's main heap, each lane offering its head.
        if resident is not None:
            plain = self._ranking.best(None)
            if plain is not None and plain[1].job is not job:
                counts[1] += 1
        for index, ranking in zip((0, 2, 3), self._counterfactuals):
            other = ranking.best(resident)
            if other is not None and other[1].job is not job:
                counts[index] += 1

    # ------------------------------------------------------------------ finish

    def _release(self, entry: _Entry) -> None:
        """Take a held entry off its worker and its lane's ``held`` (no state check)."""
        entry.state = GONE
        del self._entries[entry.job.id]
        self._held -= 1
        worker = entry.worker
        worker.held.remove(entry)
        lane = entry.lane
        lane.owner.running -= 1
        lane.holding -= 1
        lane.held = lane.held - entry.charged if lane.holding else 0.0

    def _finish(self, entry: _Entry, runtime: float, now: float, final: float) -> None:
        """Free a held entry and correct its lane with its final charge."""
        job = entry.job
        lane = entry.lane
        self._release(entry)
        moved = self._crossings.pop(entry, None)
        if moved is not None:  # the crossing credit moves by the measured, not expected, time
            self._credit += moved[0] * (runtime - moved[1])
        lane.owner.gpu_seconds += final
        if self._fair_share:
            settled = lane.settled + final / entry.capacity
            if settled > now or (lane.live and self._levels[lane.level].lanes == 1):
                # Clamped at now; and alone at its level, the lane is re-anchored at now,
                # exactly as a producer that resubmits one job at a time would be lifted: lag
                # accrued while other levels used the GPU is not fair-share debt.
                settled = now
            lane.settled = settled
            lane.s = settled + lane.held if lane.holding else settled  # set_s, inlined
            if lane.live:
                lane.log_s(now)
                self._note_s(lane)
                self._touch(lane)
        elif not lane.live and not lane.holding:
            del self._lanes[job.id]
        # The recent runtimes: for the retry-after estimate and, per model and per level,
        # for the expected charge.
        model = job.model
        self._recent.append((now, runtime, model))
        if model is not None:
            recent = self._recent_model.get(model)
            if recent is None:
                recent = self._recent_model[model] = deque(maxlen=_RECENT_PER_KEY)
            recent.append(runtime)
        by_level = self._recent_level.get(job.priority)
        if by_level is None:
            by_level = self._recent_level[job.priority] = deque(maxlen=_RECENT_PER_KEY)
        by_level.append(runtime)

    def _take_back(
        self, entries: Iterable[_Entry], now: float, *, always: bool
    ) -> list[tuple[_Entry, bool]]:
        """Refund and requeue (or fail) held entries; returns ``(entry, requeued)`` by seq."""
        done = []
        for entry in sorted(entries, key=lambda e: e.job.seq, reverse=True):
            job = entry.job
            lane = entry.lane
            self._release(entry)
            moved = self._crossings.pop(entry, None)
            if moved is not None:  # a take-back refunds the crossing credit exactly
                self._credit -= moved[0] * moved[1]
            if self._fair_share:
                lane.set_s()
                if lane.live:
                    lane.log_s(now)
                    self._note_s(lane)
                    self._touch(lane)
            requeued = always or entry.attempt < (job.max_attempts or self._max_attempts)
            held = max(0.0, now - entry.granted_at)
            if requeued:
                self._enqueue(job, attempt=entry.attempt + 1, now=now, requeue=True)
                self._groups.move(job.id, "queued", used=held)
            else:
                self._groups.move(job.id, "failed", used=held)
                self._totals["failed"] += 1
                if not self._fair_share and not lane.live and not lane.holding:
                    del self._lanes[job.id]
            done.append((entry, requeued))
        done.reverse()
        return done

    def _held_entry(self, job_id: str, worker: object, action: str) -> _Entry:
        entry = self._entry(job_id)
        if worker is not None:
            name = checked_name("worker", worker)
            holder = entry.worker.name if entry.state == RUNNING else None
            if holder != name:
                where = "queued" if holder is None else f"held by worker {holder!r}"
                raise InvalidState(
                    f"job {job_id!r} is {where}, not by worker {name!r}: a worker that lost "
                    f"the job cannot {action} it; nothing changed"
                )
        return entry

    @journaled
    def complete(
        self,
        job_id: str,
        *,
        now: float,
        runtime: float | None = None,
        worker: str | None = None,
        charge: float | None = None,
    ) -> Completed:
        """Mark a held job done and free its worker's slot.

        Args:
            job_id: A job a worker holds.
            now: The current monotonic time.
            runtime: Seconds it ran (>= 0); None measures ``now - granted_at``.
            worker: The worker reporting, when known: a worker that no longer holds the job
                (it lost it to ``expire``, and it may have been granted again) is refused.
            charge: Overrides the charge model for this completion (seconds >= 0).

        Returns:
            The job, its runtime and its final charge.

        Raises:
            UnknownJob: The id is not queued or held.
            InvalidState: The job is queued, or ``worker`` does not hold it.
            LeaseExpired: ``now`` is at or past the job's lease deadline; ``expire`` owns it.
            ValueError: ``now``, ``runtime`` or ``charge`` is out of range.
            ChargeError: The charge model returned no finite number >= 0 (a ``ValueError``).
                Nothing changes on any error.

        Complexity: amortised O(log n + M + slots).
        """
        self._fire(now)
        t = finite("now", now)
        entry = (
            self._entry(job_id) if worker is None else self._held_entry(job_id, worker, "complete")
        )
        if entry.state != RUNNING:
            raise InvalidState(f"job {job_id!r} is queued, not running; cancel() removes it")
        grant = entry.grant
        if grant.lease is not None and grant.lease.expired(t):
            raise LeaseExpired(
                f"job {job_id!r} finished at {t!r}, at or after its lease deadline "
                f"{grant.lease.deadline!r}; call expire() to requeue or fail it"
            )
        if runtime is None:
            measured = t - entry.granted_at
        else:
            measured = finite("runtime", runtime)
            if measured < 0:
                raise ValueError(f"runtime must be >= 0 seconds, got {runtime!r}")
        measured = measured if measured >= 0.0 else 0.0  # max(measured, 0.0), no call
        if charge is None and self._plain_charge:
            final = measured
        else:
            final = self._final_charge(entry.job, measured, charge)
        self._tick(t)
        entry.worker.last_seen = t
        self._finish(entry, measured, t, final)
        self._groups.move(job_id, "done", used=measured)
        entry.lane.owner.completed += 1
        self._totals["completed"] += 1
        return Completed(job=entry.job, runtime=measured, charge=final)

    def _final_charge(self, job: Job, runtime: float, charge: object) -> float:
        if charge is None:
            return self._checked_charge(job, runtime, "at completion")
        value = finite("charge", charge)
        if value < 0:
            raise ValueError(f"charge must be >= 0 seconds, got {charge!r}")
        return value

    @journaled
    def cancel(
        self,
        job_id: str,
        *,
        now: float,
        worker: str | None = None,
        charge: float | None = None,
    ) -> Job:
        """Remove a queued job, or stop a held one (charged for the time it was held).

        Args:
            job_id: A queued or held job.
            now: The current monotonic time.
            worker: For a held job, the worker asking, when known (see ``complete``).
            charge: For a held job, overrides the charge model (seconds >= 0).

        Returns:
            The removed job.

        Raises:
            UnknownJob: The id is not queued or held.
            InvalidState: ``worker`` is given and does not hold the job.
            ValueError: ``now`` or ``charge`` is out of range.
            ChargeError: The charge model returned no finite number >= 0 for a held job
                (a ``ValueError``; nothing changes).

        Complexity: amortised O(log n + M + slots).
        """
        self._fire(now)
        job = self._remove(job_id, now, worker, charge, "cancelled")
        self._totals["cancelled"] += 1
        return job

    @journaled
    def fail(
        self,
        job_id: str,
        *,
        now: float,
        worker: str | None = None,
        charge: float | None = None,
        retry: bool = False,
    ) -> Job:
        """Remove a job whose work failed: ``cancel``, but counted as failed; or retry it.

        A worker that reports a failed run calls this instead of ``complete``: a held job is
        charged for the time it was held, as by ``cancel``; ``Stats.failed`` and the job's
        group count it as failed, not cancelled (a ``Chain`` applies its failure policy).

        With ``retry=True`` a held job whose attempts are not used up (its ``max_attempts``,
        else the dispatcher's) is not failed: it is charged the same way, then delayed by its
        backoff (``Backoff.delay(job id, attempt)``, deterministic) and queued again as its
        next attempt (``state`` says ``"queued"``, ``not_before`` until when); with no delay
        it is queued at once. ``Stats.retried`` counts it. Without attempts left, or for a
        queued job, ``retry`` changes nothing: the job fails.

        Args:
            job_id: A queued or held job.
            now: The current monotonic time.
            worker: For a held job, the worker reporting, when known (see ``complete``).
            charge: For a held job, overrides the charge model (seconds >= 0).
            retry: Requeue a held job after its backoff while attempts remain (see above).

        Returns:
            The removed (or retried) job.

        Raises:
            UnknownJob: The id is not queued or held.
            InvalidState: ``worker`` is given and does not hold the job.
            ValueError: ``now`` or ``charge`` is out of range, or ``retry`` is not a bool.
            ChargeError: The charge model returned no finite number >= 0 for a held job
                (a ``ValueError``; nothing changes).

        Complexity: amortised O(log n + M + slots).
        """
        self._fire(now)
        if not isinstance(retry, bool):
            raise ValueError(f"retry must be a bool, got {retry!r}")
        job = self._remove(job_id, now, worker, charge, "failed", retry=retry)
        if job.id in self._entries:
            self._totals["retried"] += 1
        else:
            self._totals["failed"] += 1
        return job

    def _remove(
        self,
        job_id: str,
        now: float,
        worker: str | None,
        charge: float | None,
        outcome: Literal["cancelled", "failed"],
        retry: bool = False,
    ) -> Job:
        """The body of ``cancel`` and ``fail``: nothing changes on any error.

        (The caller fired the timers due at ``now``: a job whose ttl ran out is gone.)
        """
        t = finite("now", now)
        entry = self._held_entry(job_id, worker, "cancel" if outcome == "cancelled" else "fail")
        if t < self._now:
            self._tick(t)  # raises: time went backwards
        if entry.state == RUNNING:
            runtime = max(0.0, t - entry.granted_at)
            final = self._final_charge(entry.job, runtime, charge)
            self._tick(t)
            if worker is not None:
                entry.worker.last_seen = t  # the worker spoke (a client's cancel does not)
            self._finish(entry, runtime, t, final)
            job = entry.job
            if retry and entry.attempt < (job.max_attempts or self._max_attempts):
                self._groups.move(job_id, "queued", used=runtime)
                backoff = job.backoff or self._backoff
                delay = backoff.delay(job.id, entry.attempt)
                if delay > 0:
                    _lifecycle.park(self, job, entry.attempt + 1, t + delay)
                else:
                    again = self._enqueue(job, attempt=entry.attempt + 1, now=t, requeue=False)
                    again.queued_at = t
            else:
                self._groups.move(job_id, outcome, used=runtime)
        elif entry.state == _lifecycle.PARKED:
            self._tick(t)
            _lifecycle.unpark(self, entry)
            self._groups.move(job_id, outcome)
        else:
            self._tick(t)
            entry.state = GONE
            del self._entries[entry.job.id]
            self._dequeue(entry)
            lane = entry.lane
            if not self._fair_share and not lane.live and not lane.holding:
                del self._lanes[entry.job.id]
            self._groups.move(job_id, outcome)
        return entry.job

    @journaled
    def expire(self, now: float) -> list[Expired]:
        """Take back every held job past its lease, and every job of a silent worker.

        A worker silent for ``worker_timeout`` (no pop, heartbeat or completion) times out:
        all its jobs are taken back and it no longer counts; its next pop or heartbeat revives
        it. Each job taken back gets its up-front charge refunded and goes back to the head of
        its lane, or, after ``max_attempts`` grants, is reported as failed and forgotten.

        It also fires the lifecycle's timers (docs/design/lifecycle.md): delayed jobs whose
        time has come enter their lanes, and every queued or delayed job whose ttl ran out
        leaves, reported here with ``cause="ttl"`` and ``requeued=False`` (after the take-backs).

        Args:
            now: The current monotonic time.

        Returns:
            One ``Expired`` per job taken back, by submission order, then one per job whose
            ttl ran out, by deadline.

        Raises:
            ValueError: ``now`` is out of range.

        Complexity: O(workers + k log n) for k jobs taken back or expired (amortised).
        """
        self._fire(now)
        t = self._tick(now)
        lapsed = self._drain_lapsed(t)
        taken: dict[int, tuple[_Entry, float, str]] = {}
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= t:
            deadline, _, key, entry = _heappop(deadlines)
            if entry.state == RUNNING:
                taken[key] = (entry, deadline, "lease")
        timeout = self._worker_timeout
        if timeout is not None:
            for worker in self._workers.values():
                if not worker.timed_out and worker.last_seen + timeout <= t:
                    worker.timed_out = True
                    self._live -= 1
                    self._drop_resident(worker)
                    for entry in worker.held:
                        if id(entry) not in taken:
                            lease = entry.grant.lease
                            due = worker.last_seen + timeout if lease is None else lease.deadline
                            taken[id(entry)] = (entry, due, "worker_timeout")
        if not taken:
            return lapsed
        details = {id(entry): (due, cause) for entry, due, cause in taken.values()}
        self._totals["expired"] += len(taken)
        result = []
        for entry, requeued in self._take_back(
            [entry for entry, _, _ in taken.values()], t, always=False
        ):
            due, cause = details[id(entry)]
            worker = entry.worker
            result.append(
                Expired(
                    job=entry.job,
                    attempt=entry.attempt,
                    deadline=due,
                    requeued=requeued,
                    worker=worker.name if self._name_in_grants else None,
                    cause=cause,  # type: ignore[arg-type]
                )
            )
        result.extend(lapsed)
        result.extend(self._drain_lapsed(t))  # jobs requeued past their deadline
        return result

    def _drain_lapsed(self, t: float) -> list[Expired]:
        """Fire the due timers and hand over the buffered ``cause="ttl"`` reports."""
        if t >= self._next_timer:
            _lifecycle.fire(self, t)
        lapsed = self._lapsed
        if not lapsed:
            return []
        self._lapsed = []
        return lapsed

    def next_deadline(self) -> float | None:
        """When ``expire`` next has work: a lease deadline, worker timeout or lifecycle timer.

        The lifecycle's timers are a delayed job's release and a queued job's ttl deadline
        (docs/design/lifecycle.md): a driver that sleeps until this time and then calls
        ``expire`` (and grants) wakes for them too.

        Returns None when no job holds a lease, there is no ``worker_timeout`` and no timer.

        Complexity: O(workers) amortised.
        """
        deadlines = self._deadlines
        while deadlines and deadlines[0][3].state != RUNNING:
            _heappop(deadlines)
        best = deadlines[0][0] if deadlines else None
        timer = _lifecycle.next_timer(self)
        if timer is not None and (best is None or timer < best):
            best = timer
        timeout = self._worker_timeout
        if timeout is not None:
            for worker in self._workers.values():
                if not worker.timed_out:
                    due = worker.last_seen + timeout
                    if best is None or due < best:
                        best = due
        return best

    def _entries_in_state(self, state: int) -> list[_Entry]:
        return [e for e in self._entries.values() if e.state == state]

    def _first_held(self) -> _Entry | None:
        best = None
        for worker in self._workers.values():
            for entry in worker.held:
                if best is None or entry.granted_at < best.granted_at:
                    best = entry
        return best
