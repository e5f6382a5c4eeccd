"""The one state of a dispatcher, and every change of it (private).

Theory of operation (the model is docs/design/dispatcher.md and docs/design/fleet.md; the
object itself is docs/design/state.md):

* ``State`` owns the lanes (one per member and level, or per job without fair share), the
  entries (every queued, delayed or held job), the levels and members (the counts behind
  ``stats``), the workers, the rankings (lazy heaps, see ``_lanes``), the lifecycle's timers
  and the group book. Its attributes are the read API: other modules read them and call its
  methods, and no module but this one assigns to the state or its structures' counters.
* ``submit`` files a job in its lane, lifting the lane's virtual start ``s`` when it becomes
  backlogged. ``pop`` asks ``choose.pick`` (which reads and changes nothing) for the winner,
  then hands it to the worker and charges its lane up front (``held += expected / N``).
  ``finish`` corrects the lane with the final charge; ``take_back`` refunds it exactly and
  requeues the job at the head of its lane (or fails it after ``max_attempts``).
* Every call validates what it is given and computes what can fail before it changes
  anything: nothing is lost and nothing runs twice.
* Sans-IO: every time-dependent call takes ``now`` (monotonic seconds, never going
  backwards, within ``+-1e15``); ``fire`` runs the lifecycle's timers first (``timers``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from prioqueue._core.config import Config
from prioqueue._core.items import (
    LAPSE,
    Arrival,
    History,
    Level,
    Timers,
    new_item,
)
from prioqueue._core.runtimes import Runtimes
from prioqueue._core.workers import Workers
from prioqueue._groups import GroupBook
from prioqueue._lanes import Member, _Entry, _Lane
from prioqueue._rankings import _BonusCache, rankings
from prioqueue._validate import TIME_LIMIT, finite
from prioqueue._workers import _Worker
from prioqueue.errors import UnknownJob
from prioqueue.records import Expired, Job

__all__: list[str] = []  # private module


class State:
    """Lanes, entries, levels, members, workers, rankings, timers and groups (private).

    Built from a validated ``Config``; the facades (``FleetDispatcher``...) delegate to it.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.scorer = config.scorer
        self.policy = config.policy
        self.charge = config.charge
        self.plain_charge = config.plain_charge
        self.lease_for = config.lease_for
        self.max_attempts = config.max_attempts
        self.worker_timeout = config.worker_timeout
        self.warm_hold = config.warm_hold
        self.fair_share = config.fair_share
        self.track = config.track
        self.share = config.share
        self.buckets = config.buckets
        self.budgets = config.budgets
        self.name_in_grants = config.name_in_grants
        # Bounded crossings: the credit (GPU-s) deferred crossings earn at ``share``, granted
        # ones spend at ``1 - share``; held entries whose grant moved it: (weight, runtime).
        self.credit = 0.0
        self.crossings: dict[_Entry, tuple[float, float]] = {}
        d = self.divisor = config.scorer.config.aging_divisor
        window = self.window = config.scorer.config.max_affinity * d
        affinity = self.affinity = _BonusCache(config.priced_affinity()).__getitem__
        self.ranking, self.counterfactuals = rankings(d, affinity, window, track=self.track)
        self.all_rankings = (self.ranking, *self.counterfactuals)
        self.dirty: dict[int, _Lane] = {}
        self.idents = 0
        self.lanes: dict[tuple[str, int] | str, _Lane] = {}
        self.entries: dict[str, _Entry] = {}
        self.levels: dict[int, Level] = {}
        self.level_order: list[int] = []  # every level ever used, highest first
        self.members: dict[str, Member] = {}
        self.backlogged = 0
        self.workers = Workers()  # the owner of workers, residents, held jobs, deadlines
        self.seq = 0
        self.now = -TIME_LIMIT
        self.runtimes = Runtimes()
        self.expected_runtime = self.runtimes.expected  # the expected runtime of a job
        self.retry_after = self.runtimes.retry_after  # ``QueueFull.retry_after``
        self.history = History(config.history, config.history_bytes)
        self.dispatches = 0  # grants so far (the history's record numbers)
        totals = ("dispatched", "completed", "cancelled", "expired", "failed", "ttl_expired")
        self.totals = dict.fromkeys((*totals, "refused", "retried"), 0)
        self.swaps = 0
        self.groups = GroupBook()
        self.timers = Timers()

    # ------------------------------------------------------------------ reads

    def __len__(self) -> int:
        """The queued jobs (delayed ones included, held ones not). O(1)."""
        return len(self.entries) - self.workers.held

    def entry(self, job_id: object) -> _Entry:
        """The entry of a queued, delayed or held job; ``UnknownJob`` otherwise. O(1)."""
        entry = self.entries.get(job_id) if isinstance(job_id, str) else None
        if entry is None:
            raise UnknownJob(f"job {job_id!r} is not queued or running")
        return entry

    def top_level(self) -> int | None:
        """The highest level with a backlogged lane, or None. O(levels above it)."""
        levels = self.levels
        for number in self.level_order:
            if levels[number].lanes:
                return number
        return None

    def entries_in(self, state: int) -> list[_Entry]:
        """The entries in ``state`` (``QUEUED``, ``RUNNING`` or ``PARKED``). O(n)."""
        return [e for e in self.entries.values() if e.state == state]

    # ------------------------------------------------------------------ time

    def tick(self, now: object) -> float:
        """Advance the clock to ``now``; ``ValueError`` when it is bad or goes backwards."""
        if now.__class__ is float and self.now <= now <= TIME_LIMIT:  # type: ignore[operator,unused-ignore]
            self.now = now  # type: ignore[assignment,unused-ignore]
            return now  # type: ignore[return-value,unused-ignore]
        self.now = t = self.checked_now(now)
        return t

    def advance(self, at: float) -> None:
        """Move the clock to ``at`` when it is later (a timer fired at its own time)."""
        self.now = max(self.now, at)

    def next_seq(self) -> int:
        """The next submission's sequence number (counted). O(1)."""
        self.seq += 1
        return self.seq

    def checked_now(self, now: object) -> float:
        """``now`` as ``tick`` would take it, the clock left as it is (a preview's). O(1)."""
        t = finite("now", now)
        if t < self.now:
            raise ValueError(
                f"now ({t!r}) is earlier than a time already seen ({self.now!r}); "
                "pass monotonic seconds"
            )
        return t

    # ------------------------------------------------------------------ structure

    def level(self, level: int) -> Level:
        """The level's counts, made (and put in ``level_order``) on first use. O(levels)."""
        stats = self.levels.get(level)
        if stats is None:
            stats = self.levels[level] = Level(len(self.buckets))
            order = self.level_order
            order.insert(bisect.bisect_left(order, -level, key=lambda x: -x), level)
        return stats

    def member(self, member: str) -> Member:
        """The member's counts, made on first use. O(1)."""
        stats = self.members.get(member)
        if stats is None:
            stats = self.members[member] = Member()
        return stats

    def flush(self) -> None:
        """Push the fresh heap items of every lane changed since the last flush."""
        dirty = self.dirty
        if not dirty:
            return
        rankings = self.all_rankings
        window = self.window
        affinity = self.affinity
        for lane in dirty.values():
            if lane.live:
                head = lane.head()
                windowed, anywhere = lane.candidates(head, window, affinity)
                for ranking in rankings:
                    ranking.push(lane, head, windowed if ranking.window is not None else anywhere)
        dirty.clear()
        live = self.backlogged
        for ranking in rankings:
            ranking.compact(live)

    def new_lane(self, member: str, level: int, s: float) -> _Lane:
        """Make a lane (the caller files it under its key) with its member's statistics."""
        self.idents += 1
        # Versions unique across lanes: a job's lane dropped and made again (a retry without
        # fair share) has heap items equal to the old lane's but for the version.
        lane = _Lane(member, level, s, self.idents, self.member(member), self.idents << 32)
        self.level(level)
        return lane

    def note_s(self, lane: _Lane) -> None:
        """Record a backlogged lane's current ``s`` for the lift's minimum (fair share only)."""
        self.levels[lane.level].note_s(lane, self.backlogged)

    def refile(self, lane: _Lane, now: float) -> None:
        """Re-rank a lane whose ``s`` changed at ``now``, when it is backlogged."""
        if lane.live:
            lane.log_s(now)
            self.note_s(lane)
            lane.touch(self.dirty)

    def drop_lane(self, lane: _Lane, job_id: str) -> None:
        """Without fair share, forget a job's own lane once it is empty and holds nothing."""
        if not self.fair_share and not lane.live and not lane.holding:
            del self.lanes[job_id]

    # ------------------------------------------------------------------ queue

    def enqueue(
        self, job: Job, *, attempt: int, now: float, requeue: bool, lift: bool = True
    ) -> _Entry:
        """File a job's entry in its lane (at the head for a requeue), lifting a new lane."""
        key: tuple[str, int] | str = (job.member, job.priority) if self.fair_share else job.id
        lane = self.lanes.get(key)
        level = self.level(job.priority)
        if lane is None:
            # A new lane has no own s: the lift gives it one. Without a lift (restore), a lane
            # starts at its first job's arrival, as it would alone at its level.
            start = -math.inf if self.fair_share and lift else job.arrival
            lane = self.lanes[key] = self.new_lane(job.member, job.priority, start)
        entry = _Entry(job, lane, attempt, now if requeue else job.arrival, self.dispatches)
        self.entries[job.id] = entry
        if job.deadline is not None:
            self.timers.push(job.deadline, LAPSE, entry)
        was_backlogged = lane.live > 0
        if not was_backlogged and self.fair_share and not requeue and lift:
            lane.lift(
                min(
                    now,
                    level.lift_floor(
                        job, self.workers.residents, self.affinity, self.ranking, self.divisor
                    ),
                )
            )
        if requeue:
            lane.appendleft(entry)
        else:
            lane.append(entry)
        level.add(new_item(Arrival, (job.arrival, job.seq, attempt, entry)))
        if not was_backlogged:
            self.backlogged += 1
            level.backlogged()
            lane.s_log.clear()
            lane.log_s(now)
            if self.fair_share:
                self.note_s(lane)
        if not was_backlogged or requeue:
            lane.touch(self.dirty)
        elif lane.leads(entry):
            # The head and s are unchanged, but the lane may now be eligible for this model.
            lane.touch(self.dirty)
        return entry

    def dequeue(self, entry: _Entry) -> None:
        """Take a queued entry out of its lane's accounting (the deques drop it lazily)."""
        job = entry.job
        lane = entry.lane
        emptied = lane.drop()
        self.levels[job.priority].remove(job.arrival, emptied)
        if emptied:
            self.backlogged -= 1
        lane.touch(self.dirty)

    def drop_queued(self, entry: _Entry) -> None:
        """A queued entry leaves for good (cancelled, failed or lapsed)."""
        entry.close()
        del self.entries[entry.job.id]
        self.dequeue(entry)
        self.drop_lane(entry.lane, entry.job.id)

    # ------------------------------------------------------------------ lifecycle

    def park(self, job: Job, attempt: int, release_at: float) -> _Entry:
        """File a delayed job: known and ``"queued"``, in no lane until ``release_at``."""
        entry = _Entry(job, None, attempt, release_at, self.dispatches)  # type: ignore[arg-type]
        entry.park()
        self.entries[job.id] = entry
        self.level(job.priority)  # a level is known from its first job on, delayed or not
        self.timers.park(entry)
        return entry

    def unpark(self, entry: _Entry) -> None:
        """Take a parked entry out (released, lapsed, cancelled or failed). O(1)."""
        entry.close()
        del self.entries[entry.job.id]
        self.timers.unpark(entry.job.priority)

    def lapsed(self, entry: _Entry, at: float) -> None:
        """Count a job whose ttl ran out (queued or delayed) and buffer its report."""
        job = entry.job
        self.groups.move(job.id, "failed")
        self.totals["ttl_expired"] += 1
        self.timers.life(job.priority)[0] += 1
        deadline = job.deadline if job.deadline is not None else at
        self.timers.report(
            Expired(job=job, attempt=entry.attempt, deadline=deadline, requeued=False, cause="ttl")
        )

    def refused(self, level: int) -> None:
        """Count a submit refused by its level's budget."""
        self.totals["refused"] += 1
        self.timers.life(level)[1] += 1

    # ------------------------------------------------------------------ grants

    def dispatched(self) -> int:
        """Count a grant; its number (the history's record number). O(1)."""
        self.dispatches += 1
        return self.dispatches

    def earn(self, credit: float) -> None:
        """Move the crossing credit by ``credit`` GPU-s (negative: spent)."""
        self.credit += credit

    def hand_over(self, entry: _Entry, worker: _Worker, t: float, charged: float) -> None:
        """Move a granted entry to its worker (its model resident there); charge its lane."""
        lane = entry.lane
        self.dequeue(entry)
        if self.workers.take(entry, worker, t):
            self.swaps += 1
        lane.hold(charged)
        # s only grew: the lift's minimum re-files the lane when its old item surfaces
        # (``Level.lift_floor``), and ``s_log``, for explain, follows the settled part.

    def release(self, entry: _Entry) -> None:
        """Take a held entry off its worker and its lane's ``held`` (no state check)."""
        entry.close()
        del self.entries[entry.job.id]
        self.workers.let_go(entry)
        entry.lane.unhold(entry.charged)

    # ------------------------------------------------------------------ restore

    def restore_start(self, seq: int, now: float) -> None:
        """A restored state's sequence number and clock (``persist.load``)."""
        self.seq = seq
        self.now = now

    def restore_recent(
        self, credit: float, models: dict[str, deque[float]], levels: dict[int, deque[float]]
    ) -> None:
        """A restored state's crossing credit and recent runtimes."""
        self.credit = credit
        self.runtimes.restore(models, levels)

    def lane_for(self, key: tuple[str, int] | str, member: str, level: int, s: float) -> _Lane:
        """The lane filed under ``key``, made (starting at ``s``) when there is none."""
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = self.new_lane(member, level, s)
        return lane

    def restore_held(self, entry: _Entry, crossing: tuple[float, float] | None) -> None:
        """File a held entry rebuilt from a snapshot on its worker and its lane."""
        lane = entry.lane
        self.entries[entry.job.id] = entry
        self.workers.keep(entry)
        lane.hold_restored(entry.charged)
        if lane.live:
            self.note_s(lane)
            lane.touch(self.dirty)
        if crossing is not None and crossing[0]:
            self.crossings[entry] = crossing
