"""The lanes owner: lanes, levels, members, rankings and the crossing credit (private).

Theory of operation (docs/design/state.md, "Owners"; the rules are docs/design/dispatcher.md
and fleet.md):

* ``Lanes`` owns the lanes (``_lanes._Lane``, by ``(member, level)``, or by job id without
  fair share), the per-level counts (``items.Level``) and the order of the levels, the
  per-member counts (``_lanes.Member``), the backlogged-lane count, the rankings (lazy heaps,
  ``_rankings``) with the lanes waiting to be re-ranked, and bounded crossings' credit with
  the held entries that moved it.
* Its fields are private; reads are properties returning the live structures as read-only
  types (``Mapping``, ``Sequence``), never copies. Every change is one of its methods (which
  call the lanes' and levels' own); ``check`` asserts its invariant.
* It knows nothing of entries' other homes (the entry map, workers, timers): ``Core`` pairs
  its ``file``/``unfile`` with them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence

from prioqueue._core.config import Config
from prioqueue._core.items import Arrival, Level, new_item, read_only
from prioqueue._lanes import RUNNING, Member, _Entry, _Lane
from prioqueue._rankings import _Ranking, rankings
from prioqueue.records import Job

__all__: list[str] = []  # private module

LaneKey = tuple[str, int] | str


class Lanes:
    """Lanes, levels, members, rankings and the crossing credit (private)."""

    __slots__ = (
        "_affinity",
        "_all_rankings",
        "_backlogged",
        "_buckets",
        "_by_key",
        "_counterfactuals",
        "_credit",
        "_crossings",
        "_dirty",
        "_divisor",
        "_fair_share",
        "_idents",
        "_level_order",
        "_levels",
        "_members",
        "_ranking",
        "_window",
    )

    def __init__(self, config: Config, affinity: Callable[[str], float]) -> None:
        scoring = config.scorer.config
        self._divisor = divisor = scoring.aging_divisor
        self._window = window = scoring.max_affinity * divisor  # the affinity window
        self._affinity = affinity  # the priced affinity bonus of a model (cached)
        self._fair_share = config.fair_share
        self._buckets = len(config.buckets)
        self._ranking, self._counterfactuals = rankings(
            divisor, affinity, window, track=config.track
        )
        self._all_rankings = (self._ranking, *self._counterfactuals)
        self._dirty: dict[int, _Lane] = {}
        self._idents = 0
        self._by_key: dict[LaneKey, _Lane] = {}
        self._levels: dict[int, Level] = {}
        self._level_order: list[int] = []  # every level ever used, highest first
        self._members: dict[str, Member] = {}
        self._backlogged = 0
        # Bounded crossings: the credit (GPU-s) deferred crossings earn at ``share``, granted
        # ones spend at ``1 - share``; held entries whose grant moved it: (weight, runtime).
        self._credit = 0.0
        self._crossings: dict[_Entry, tuple[float, float]] = {}

    # ------------------------------------------------------------------ reads

    by_key: Mapping[LaneKey, _Lane] = read_only(
        "_by_key", "The lanes by key (the live map, read-only). O(1)."
    )
    levels: Mapping[int, Level] = read_only(
        "_levels", "Every level's counts by number (the live map, read-only). O(1)."
    )
    level_order: Sequence[int] = read_only(
        "_level_order", "Every level ever used, highest first (the live list, read-only). O(1)."
    )
    members: Mapping[str, Member] = read_only(
        "_members", "Every member's counts by name (the live map, read-only). O(1)."
    )
    backlogged: int = read_only("_backlogged", "The lanes with a queued job. O(1).")
    ranking: _Ranking = read_only(
        "_ranking", "The real ranking (its heaps change only through its own methods). O(1)."
    )
    counterfactuals: tuple[_Ranking, ...] = read_only(
        "_counterfactuals",
        "The rankings without aging, tier, fair share (``track`` only). O(1).",
    )
    credit: float = read_only("_credit", "Bounded crossings' credit, GPU-s. O(1).")
    crossings: Mapping[_Entry, tuple[float, float]] = read_only(
        "_crossings", "Held entries whose grant moved the credit: ``(weight, runtime)``. O(1)."
    )

    def top_level(self) -> int | None:
        """The highest level with a backlogged lane, or None. O(levels above it)."""
        levels = self._levels
        for number in self._level_order:
            if levels[number].lanes:
                return number
        return None

    def count_reorders(self, level: Level, job: Job, resident: str | None) -> None:
        """Count at ``level`` the score terms without which ``job`` would not have won.

        ``Stats.reorders``: each counterfactual ranking's ``best`` is an offer
        ``(lane, entry, affinity)``; a term counts when that offer is another job.
        """
        # Without affinity: the real ranking's main heap, each lane offering its head.
        offer = self._ranking.best(None) if resident is not None else None
        if offer is not None and offer[1].job is not job:
            level.reordered("affinity")
        # The rankings without aging, without the tier bonus, without fair share.
        without = zip(("aging", "tier", "fair_share"), self._counterfactuals, strict=True)
        for cause, ranking in without:
            offer = ranking.best(resident)
            if offer is not None and offer[1].job is not job:
                level.reordered(cause)

    # ------------------------------------------------------------------ structure

    def level(self, level: int) -> Level:
        """The level's counts, made (and put in ``level_order``) on first use. O(levels)."""
        stats = self._levels.get(level)
        if stats is None:
            stats = self._levels[level] = Level(self._buckets)
            order = self._level_order
            order.insert(bisect.bisect_left(order, -level, key=lambda x: -x), level)
        return stats

    def member(self, member: str) -> Member:
        """The member's counts, made on first use. O(1)."""
        stats = self._members.get(member)
        if stats is None:
            stats = self._members[member] = Member()
        return stats

    def lane_for(self, key: LaneKey, member: str, level: int, s: float) -> _Lane:
        """The lane filed under ``key``, made (starting at ``s``) when there is none."""
        lane = self._by_key.get(key)
        if lane is None:
            self._idents += 1
            # Versions unique across lanes: a job's lane dropped and made again (a retry
            # without fair share) has heap items equal to the old lane's but for the version.
            ident = self._idents
            lane = _Lane(member, level, s, ident, self.member(member), ident << 32)
            self.level(level)
            self._by_key[key] = lane
        return lane

    def lane_of(self, job: Job, lift: bool) -> _Lane:
        """The lane a job is filed in, made when there is none (its level too).

        A new lane has no own s: the lift gives it one. Without a lift (restore), a lane
        starts at its first job's arrival, as it would alone at its level.
        """
        fair = self._fair_share
        key: LaneKey = (job.member, job.priority) if fair else job.id
        lane = self._by_key.get(key)
        self.level(job.priority)
        if lane is None:
            start = -math.inf if fair and lift else job.arrival
            lane = self.lane_for(key, job.member, job.priority, start)
        return lane

    def flush(self) -> None:
        """Push the fresh heap items of every lane changed since the last flush."""
        dirty = self._dirty
        if not dirty:
            return
        rankings = self._all_rankings
        window = self._window
        affinity = self._affinity
        for lane in dirty.values():
            if lane.live:
                head = lane.head()
                windowed, anywhere = lane.candidates(head, window, affinity)
                for ranking in rankings:
                    ranking.push(lane, head, windowed if ranking.window is not None else anywhere)
        dirty.clear()
        live = self._backlogged
        for ranking in rankings:
            ranking.compact(live)

    def _note_s(self, lane: _Lane) -> None:
        """Record a backlogged lane's current ``s`` for the lift's minimum (fair share only)."""
        self._levels[lane.level].note_s(lane, self._backlogged)

    def refile(self, lane: _Lane, now: float) -> None:
        """Re-rank a lane whose ``s`` changed at ``now``, when it is backlogged."""
        if lane.live:
            lane.log_s(now)
            self._note_s(lane)
            lane.touch(self._dirty)

    def drop_lane(self, lane: _Lane, job_id: str) -> None:
        """Without fair share, forget a job's own lane once it is empty and holds nothing."""
        if not self._fair_share and not lane.live and not lane.holding:
            del self._by_key[job_id]

    # ------------------------------------------------------------------ queue

    def file(self, entry: _Entry, now: float, *, requeue: bool, lift: bool) -> None:
        """File an entry in its lane (at the head for a requeue), lifting a new backlog."""
        job = entry.job
        lane = entry.lane
        level = self._levels[job.priority]
        fair = self._fair_share
        was_backlogged = lane.live > 0
        if not was_backlogged and fair and not requeue and lift:
            floor = level.lift_floor(job, self._divisor)
            lane.lift(min(now, floor))
        if requeue:
            lane.appendleft(entry)
        else:
            lane.append(entry)
        level.add(new_item(Arrival, (job.arrival, job.seq, entry.attempt, entry)))
        if not was_backlogged:
            self._backlogged += 1
            level.backlogged()
            lane.s_log.clear()
            lane.log_s(now)
            if fair:
                self._note_s(lane)
        if not was_backlogged or requeue:
            lane.touch(self._dirty)
        elif lane.leads(entry):
            # The head and s are unchanged, but the lane may now be eligible for this model.
            lane.touch(self._dirty)

    def unfile(self, entry: _Entry) -> None:
        """Take a queued entry out of its lane's accounting (the deques drop it lazily)."""
        job = entry.job
        lane = entry.lane
        emptied = lane.drop()
        self._levels[job.priority].remove(job.arrival, emptied)
        if emptied:
            self._backlogged -= 1
        lane.touch(self._dirty)

    # ------------------------------------------------------------------ crossings

    def cross(self, entry: _Entry, weight: float, runtime: float, back: float = 0.0) -> None:
        """A granted crossing moves the credit by ``weight * (runtime + back)``.

        ``runtime``: its expected runtime, corrected by the time really used when it ends
        (``uncross``); ``back``: the load it costs a higher level after it (``return_load``),
        an estimate that stays.
        """
        self._crossings[entry] = (weight, runtime)
        self._credit += weight * (runtime + back)

    def uncross(self, entry: _Entry, runtime: float) -> None:
        """A held entry ends: its crossing's credit is corrected by the time really used."""
        moved = self._crossings.pop(entry, None)
        if moved is not None:
            self._credit += moved[0] * (runtime - moved[1])

    # ------------------------------------------------------------------ restore

    def restore_credit(self, credit: float) -> None:
        """A restored state's crossing credit."""
        self._credit = credit

    def restore_held(self, entry: _Entry, crossing: tuple[float, float] | None) -> None:
        """Charge a held entry rebuilt from a snapshot to its lane (and its crossing)."""
        lane = entry.lane
        lane.hold_restored(entry.charged)
        if lane.live:
            self._note_s(lane)
            lane.touch(self._dirty)
        if crossing is not None and crossing[0]:
            self._crossings[entry] = crossing

    # ------------------------------------------------------------------ invariant

    def check(
        self,
        entries: Mapping[str, _Entry],
        queued: list[_Entry],
        held: list[_Entry],
        now: float | None,
    ) -> None:
        """Assert the owner's invariant against the queued and held entries (tests; O(n))."""
        running: dict[str, int] = {}
        holding: dict[int, int] = {}
        for entry in held:
            running[entry.job.member] = running.get(entry.job.member, 0) + 1
            holding[id(entry.lane)] = holding.get(id(entry.lane), 0) + 1
        for name, member in self._members.items():
            assert member.running == running.get(name, 0), name
        backlogged = 0
        for lane in self._by_key.values():
            lane.check(entries, holding.get(id(lane), 0), now)
            backlogged += lane.live > 0
        assert backlogged == self._backlogged
        assert all(e.state == RUNNING and e in held for e in self._crossings)
        assert sum(level.queued for level in self._levels.values()) == len(queued)
        assert sum(m.queued for m in self._members.values()) == len(queued)
        for entry in queued:
            assert entry.lane.live > 0
        assert self._level_order == sorted(self._levels, reverse=True)
