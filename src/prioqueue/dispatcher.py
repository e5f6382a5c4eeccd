"""``SizeOneDispatcher``: which waiting job goes next on a resource that runs one job at a time.

Theory of operation (the full model, with its invariants, is docs/design/dispatcher.md):

* Jobs wait in **lanes**, one per ``(member, level)``; a lane is FIFO. Lanes compete with one
  score, ``level + tier + affinity + (now - s) / divisor``, where ``s`` is the lane's
  **virtual start**: how long the lane has been denied its fair share, not how long each job
  has existed. The winning lane gives up its head (or its oldest job for the resident model,
  when it holds one within the affinity window).
* ``s`` advances by each finished job's **charge** (its runtime, by default) and is lifted when
  a lane becomes backlogged, so a member can neither bank credit while idle nor be punished
  for another member's backlog. ``s`` never exceeds ``now``.
* Non-preemptive: ``dispatch`` grants only while nothing runs. A grant may carry a lease; a
  job past its lease is requeued at the head of its lane by ``expire`` (and reported as failed
  after ``max_attempts`` grants, never silently dropped).
* Sans-IO: every call that depends on time takes ``now`` (monotonic seconds, never going
  backwards); nothing here sleeps, spawns or reads a clock.
* Nothing is lost and nothing runs twice: every call validates its arguments and computes
  everything that can fail (the lease, for one) before it changes any state.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from heapq import heapify as _heapify
from heapq import heappop as _heappop
from heapq import heappush as _heappush
from typing import Any, Literal

import attrs

from prioqueue import _lanes, _observe, _persist
from prioqueue._errors import (
    ConfigError,
    DuplicateJob,
    InvalidState,
    LeaseError,
    LeaseExpired,
    QueueFull,
    UnknownJob,
)
from prioqueue._forecast import DispatchRecord
from prioqueue._groups import (
    CancelRunning,
    GroupBook,
    GroupStatus,
    checked_group,
    checked_running,
    forecast_finish,
)
from prioqueue._lanes import GONE, QUEUED, RUNNING, _Entry, _Lane, _Ranking
from prioqueue._validate import charge_function, checked_name, finite, limit, positive_or_none
from prioqueue.lease import Lease
from prioqueue.priority import PriorityPolicy
from prioqueue.records import (
    AheadJob,
    Completed,
    Expired,
    Explanation,
    Grant,
    Job,
    JobState,
    Stats,
    Ticket,
)
from prioqueue.scoring import ScoreBreakdown, Scorer

__all__ = ["DEFAULT_RETRY_AFTER", "DEFAULT_WAIT_BUCKETS", "ChargeModel", "SizeOneDispatcher"]

#: Upper bounds (seconds) of the grant-wait histogram in ``Stats``; the last bucket is +inf.
DEFAULT_WAIT_BUCKETS: tuple[float, ...] = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
)  # fmt: skip

#: ``QueueFull.retry_after`` when no completion has been seen yet (seconds).
DEFAULT_RETRY_AFTER = 30.0

#: How a finished job advances its lane's virtual start: see ``SizeOneDispatcher``.
ChargeModel = Literal["runtime", "estimate"] | float | Callable[[Job, float], float]

_RECENT = 64  # completions kept for the service rate and the mean runtime


class _Level:
    """Per-level bookkeeping (private)."""

    __slots__ = (
        "arrivals",
        "backlog",
        "buckets",
        "dispatched",
        "lanes",
        "queued",
        "reorders",
        "sum_arrival",
        "total_wait",
    )

    def __init__(self, buckets: int) -> None:
        self.queued = 0
        self.lanes = 0  # backlogged lanes
        self.sum_arrival = 0.0
        self.dispatched = 0
        self.total_wait = 0.0
        self.reorders = [0, 0, 0, 0]  # aging, affinity, tier, fair share
        self.buckets = [0] * (buckets + 1)
        # Heaps with lazy deletion: (arrival, seq, id, entry) of queued entries, and
        # (s, ident, lane) of backlogged lanes (for the lift's minimum).
        self.arrivals: list[tuple[float, int, int, _Entry]] = []
        self.backlog: list[tuple[float, int, _Lane]] = []


class _Member:
    __slots__ = ("completed", "dispatched", "gpu_seconds", "queued")

    def __init__(self) -> None:
        self.queued = 0
        self.dispatched = 0
        self.completed = 0
        self.gpu_seconds = 0.0


class SizeOneDispatcher:
    """The waiting jobs of one size-1 resource, and which one goes next.

    Args:
        scorer: The score's weights (default ``Scorer()``: band spacing 100, tiers free 0 /
            pro 1 / max 2, affinity up to 10, one aging point per 60 s).
        policy: Turns ``submit(priority=...)`` values (ints, aliases, header strings) into
            priority numbers, clamped to the policy's range (default ``PriorityPolicy()``).
        charge: How a finished job advances its lane's virtual start: ``"runtime"`` (the
            reported or measured runtime), ``"estimate"`` (the job's estimate, else its
            runtime), a number (the same for every job: count-based fairness) or a callable
            ``(job, runtime) -> seconds``.
        lease_for: ``job -> seconds``, called at dispatch to size the grant's lease (a
            :class:`~prioqueue.lease.LeaseCalculator` works); None for no leases.
        max_queued: Most jobs that may wait at once; None for no limit.
        max_queued_per_member: Most jobs one member may have waiting; None for no limit.
        max_attempts: Grants a job gets before an expired lease fails it for good.
        fair_share: False turns every job into its own lane aging from its arrival (the
            design's plain per-job aging), for comparison.
        track_reorders: Keep the counterfactual rankings behind ``Stats`` reorder counts
            (a constant factor in cost; the counts stay 0 when off).
        history: Dispatches remembered for ``explain``'s overtakes.
        wait_buckets: Upper bounds of the grant-wait histogram, increasing.

    Raises:
        ConfigError: An option is out of range.
        TypeError: ``scorer`` or ``policy`` has the wrong type.

    Complexity: ``submit``, ``dispatch``, ``complete``, ``cancel`` and ``expire`` are
    amortised O(log n + M) in the number of lanes or queued jobs n and the number of models M
    queued in the lanes they touch; ``stats`` is O(levels + members); ``forecast`` and
    ``explain`` are diagnostic, O(L log L + k log L) for L lanes and k jobs predicted ahead.
    """

    def __init__(
        self,
        scorer: Scorer | None = None,
        *,
        policy: PriorityPolicy | None = None,
        charge: ChargeModel = "runtime",
        lease_for: Callable[[Job], float] | None = None,
        max_queued: int | None = None,
        max_queued_per_member: int | None = None,
        max_attempts: int = 3,
        fair_share: bool = True,
        track_reorders: bool = True,
        history: int = 10_000,
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
    ) -> None:
        scorer = Scorer() if scorer is None else scorer
        if not isinstance(scorer, Scorer):
            raise TypeError(f"scorer must be a Scorer, got {type(scorer).__name__}")
        policy = PriorityPolicy() if policy is None else policy
        if not isinstance(policy, PriorityPolicy):
            raise TypeError(f"policy must be a PriorityPolicy, got {type(policy).__name__}")
        if lease_for is not None and not callable(lease_for):
            raise ConfigError(f"lease_for must be a callable job -> seconds, got {lease_for!r}")
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if not isinstance(history, int) or isinstance(history, bool) or history < 0:
            raise ConfigError(f"history must be an int >= 0, got {history!r}")
        try:
            bounds = tuple(finite("wait_buckets", b) for b in wait_buckets)
        except (TypeError, ValueError):
            bounds = ()
        if not bounds or bounds[0] <= 0 or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ConfigError(
                f"wait_buckets must be finite positive bounds in increasing order, "
                f"got {wait_buckets!r}"
            )
        self._scorer = scorer
        self._policy = policy
        self._charge = charge_function(charge)
        self._lease_for = lease_for
        self._max_queued = limit("max_queued", max_queued)
        self._max_member = limit("max_queued_per_member", max_queued_per_member)
        self._max_attempts = max_attempts
        self._fair_share = bool(fair_share)
        self._track = bool(track_reorders)
        self._buckets = bounds
        config = scorer.config
        d = config.aging_divisor
        self._divisor = d
        window = config.max_affinity * d
        self._window = window
        affinity = scorer.affinity
        self._affinity = affinity
        self._ranking = _Ranking(_lanes.REAL, d, affinity, window)
        # The counterfactual rankings behind the reorder counts: without aging, without the
        # tier bonus, without fair share (the real ranking without affinity is its main heap).
        self._counterfactuals: tuple[_Ranking, ...] = (
            (
                _Ranking(_lanes.NO_AGING, d, affinity, window),
                _Ranking(_lanes.NO_TIER, d, affinity, window),
                _Ranking(_lanes.NO_FAIR, d, affinity, None),
            )
            if self._track
            else ()
        )
        self._all_rankings = (self._ranking, *self._counterfactuals)
        self._dirty: dict[int, _Lane] = {}
        self._idents = 0
        self._lanes: dict[tuple[str, int] | str, _Lane] = {}
        self._entries: dict[str, _Entry] = {}
        self._levels: dict[int, _Level] = {}
        self._members: dict[str, _Member] = {}
        self._backlogged = 0
        self._running: _Entry | None = None
        self._grant: Grant | None = None
        self._resident: str | None = None
        self._seq = 0
        self._now = -math.inf
        self._recent: deque[tuple[float, float, str | None]] = deque(maxlen=_RECENT)
        self._history: deque[DispatchRecord] = deque(maxlen=history)
        self._totals = {"dispatched": 0, "completed": 0, "cancelled": 0, "expired": 0}
        self._failed = 0
        self._swaps = 0
        self._groups = GroupBook()

    # ------------------------------------------------------------------ properties

    @property
    def scorer(self) -> Scorer:
        """The scorer (read-only)."""
        return self._scorer

    @property
    def policy(self) -> PriorityPolicy:
        """The priority policy (read-only)."""
        return self._policy

    @property
    def resident_model(self) -> str | None:
        """The model believed loaded: set by every dispatch of a job with a model."""
        return self._resident

    @property
    def running(self) -> Grant | None:
        """The grant of the job holding the resource, or None when it is free."""
        return self._grant

    @property
    def fair_share(self) -> bool:
        """Whether lanes are per member (True) or per job (False)."""
        return self._fair_share

    def __len__(self) -> int:
        """Return the number of queued jobs (the running one excluded). O(1)."""
        return len(self._entries) - (self._running is not None)

    def __contains__(self, job_id: object) -> bool:
        """Return whether the job is queued or running. O(1)."""
        return job_id in self._entries

    def job(self, job_id: str) -> Job:
        """Return a queued or running job.

        Raises:
            UnknownJob: The id is not queued or running.
        """
        return self._entry(job_id).job

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"``.

        Raises:
            UnknownJob: The id is not queued or running.
        """
        return "running" if self._entry(job_id).state == RUNNING else "queued"

    def set_resident_model(self, model: str | None) -> None:
        """Tell the dispatcher which model is loaded (None: nothing, e.g. after an idle unload).

        Raises:
            ValueError: ``model`` is not a non-empty str or None.
        """
        self._resident = None if model is None else checked_name("model", model)

    def next_deadline(self) -> float | None:
        """Return when ``expire`` next has work: the running lease's deadline, or None. O(1)."""
        grant = self._grant
        if grant is None or grant.lease is None:
            return None
        return grant.lease.deadline

    # ------------------------------------------------------------------ helpers

    def _tick(self, now: object) -> float:
        if now.__class__ is float and self._now <= now < math.inf:
            self._now = now
            return now
        t = finite("now", now)
        if t < self._now:
            raise ValueError(
                f"now ({t!r}) is earlier than a time already seen ({self._now!r}); "
                "pass monotonic seconds"
            )
        self._now = t
        return t

    def _entry(self, job_id: object) -> _Entry:
        entry = self._entries.get(job_id) if isinstance(job_id, str) else None
        if entry is None:
            raise UnknownJob(f"job {job_id!r} is not queued or running")
        return entry

    def _level(self, level: int) -> _Level:
        stats = self._levels.get(level)
        if stats is None:
            stats = self._levels[level] = _Level(len(self._buckets))
        return stats

    def _member(self, member: str) -> _Member:
        stats = self._members.get(member)
        if stats is None:
            stats = self._members[member] = _Member()
        return stats

    def _touch(self, lane: _Lane) -> None:
        """Mark a lane for re-ranking after any change of its head, candidates or ``s``.

        Its old heap items go stale at once (the version changes); fresh ones are pushed by
        ``_flush`` just before the next ranking query, so a lane changed twice between two
        dispatches (a dispatch, then a completion) is re-ranked once.
        """
        lane.version += 1
        self._dirty[id(lane)] = lane

    def _flush(self) -> None:
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

    def _retry_after(self) -> float:
        recent = self._recent
        if len(recent) >= 2:
            span = recent[-1][0] - recent[0][0]
            if span > 0:
                return max(1.0, math.ceil(span / (len(recent) - 1)))
        if recent:
            return max(1.0, math.ceil(recent[-1][1]))
        return DEFAULT_RETRY_AFTER

    def _lift_floor(self, level: _Level, job: Job) -> float:
        """Where a lane that becomes backlogged with ``job`` may start, before ``min(now, .)``.

        The most-starved backlogged lane at the level (smallest ``s``; on a tie, the lane
        created first) sets the floor: the
        newcomer starts level with it, later by the seconds its bounded offsets (tier bonus and
        affinity, as they stand now) exceed that lane's, so offsets alone can never carry a
        newcomer past the lane that has waited longest. ``inf`` when no lane is backlogged.
        """
        backlog = level.backlog
        while backlog:
            s, _, lane = backlog[0]
            if s == lane.s and lane.live:
                resident = self._resident
                mine = job.tier_bonus
                if resident is not None and job.model == resident:
                    mine += self._affinity(resident)
                theirs = lane.head().job.tier_bonus
                if resident is not None and self._ranking.candidate(lane, resident) is not None:
                    theirs += self._affinity(resident)
                return s + max(0.0, mine - theirs) * self._divisor
            _heappop(backlog)
        return math.inf

    def _new_lane(self, member: str, level: int, s: float) -> _Lane:
        """Make a lane (the caller files it under its key) with its member's statistics."""
        self._idents += 1
        lane = _Lane(member, level, s, self._idents)
        lane.owner = self._member(member)
        self._level(level)
        return lane

    def _note_s(self, lane: _Lane) -> None:
        """Record a backlogged lane's current ``s`` for the lift's minimum (fair share only).

        An item is current while the lane is backlogged with that very ``s``; older ones are
        dropped when they surface.
        """
        level = self._levels[lane.level]
        _heappush(level.backlog, (lane.s, lane.ident, lane))
        if len(level.backlog) > 2 * self._backlogged + 64:
            # One current item per backlogged lane (a lane that went idle and came back with
            # the same s was pushed twice).
            current = {item[2].ident: item for item in level.backlog if item[2].live}
            level.backlog = [(lane.s, key, lane) for key, (_, _, lane) in current.items()]
            _heapify(level.backlog)

    # ------------------------------------------------------------------ submit

    def submit(
        self,
        job_id: str,
        *,
        member: str,
        priority: int | str | bytes | None = 0,
        tier: str = "free",
        model: str | None = None,
        estimate: float | None = None,
        payload: Any = None,
        group: str | None = None,
        now: float,
    ) -> Ticket:
        """Queue a job.

        Args:
            job_id: A non-empty id, unique among the queued and running jobs.
            member: Who the job belongs to (fair share is per member inside a level).
            priority: The priority number, an alias (``"interactive"``) or a raw header value;
                resolved and clamped by the policy (unparseable means the policy's default).
            tier: The member's tier name, one of the scorer's tiers.
            model: The model the job needs loaded, or None.
            estimate: Expected runtime in seconds (> 0), or None.
            payload: An opaque value kept with the job (e.g. for ``lease_for``); it must be
                JSON-serialisable for ``snapshot``.
            group: A label shared by jobs that belong together (a film's shots), for
                ``group_status`` and ``cancel_group``; it changes no score and no lane.
            now: The current monotonic time.

        Returns:
            The ticket: the job as stored and the queue depth after it.

        Raises:
            DuplicateJob: A job with this id is queued or running.
            QueueFull: ``max_queued`` or ``max_queued_per_member`` is reached; the exception's
                ``retry_after`` estimates when a retry may succeed from the recent service
                rate.
            ValueError: An argument is out of range (unknown tier, non-finite time, ...).
            TypeError: ``priority`` has a type no header could have.

        Complexity: amortised O(log n + M).
        """
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty str, got {job_id!r}")
        member = checked_name("member", member)
        level = self._policy.parse(priority)
        tier_bonus = self._scorer.tier_bonus(tier)
        if model is not None:
            model = checked_name("model", model)
        estimate = positive_or_none("estimate", estimate)
        if group is not None:
            group = checked_group(group)
        t = self._tick(now)
        if job_id in self._entries:
            raise DuplicateJob(f"job {job_id!r} is already {self.state(job_id)}")
        queued = len(self)
        if self._max_queued is not None and queued >= self._max_queued:
            raise QueueFull(
                f"the queue holds {queued} jobs, its limit (max_queued={self._max_queued})",
                retry_after=self._retry_after(),
                limit=self._max_queued,
                scope="queue",
            )
        member_stats = self._member(member)
        if self._max_member is not None and member_stats.queued >= self._max_member:
            raise QueueFull(
                f"member {member!r} has {member_stats.queued} jobs queued, its limit "
                f"(max_queued_per_member={self._max_member})",
                retry_after=self._retry_after(),
                limit=self._max_member,
                scope="member",
            )
        self._seq += 1
        job = Job(
            id=job_id,
            member=member,
            priority=level,
            tier=tier,
            tier_bonus=tier_bonus,
            model=model,
            estimate=estimate,
            arrival=t,
            seq=self._seq,
            payload=payload,
        )
        self._enqueue(job, attempt=1, now=t, requeue=False)
        if group is not None:
            self._groups.add(job_id, group)
        return Ticket(job=job, queued=queued + 1)

    def _enqueue(
        self, job: Job, *, attempt: int, now: float, requeue: bool, lift: bool = True
    ) -> _Entry:
        key: tuple[str, int] | str = (job.member, job.priority) if self._fair_share else job.id
        lane = self._lanes.get(key)
        level = self._level(job.priority)
        if lane is None:
            # A new lane has no own s: the lift gives it one. Without a lift (restore), a lane
            # starts at its first job's arrival, as it would alone at its level.
            start = -math.inf if self._fair_share and lift else job.arrival
            lane = self._lanes[key] = self._new_lane(job.member, job.priority, start)
        entry = _Entry(job, lane, attempt)
        self._entries[job.id] = entry
        was_backlogged = lane.live > 0
        if not was_backlogged and self._fair_share and not requeue and lift:
            lane.s = max(lane.s, min(now, self._lift_floor(level, job)))
        if requeue:
            lane.appendleft(entry)
        else:
            lane.append(entry)
        level.queued += 1
        level.sum_arrival += job.arrival
        # id(entry) keeps a requeued job's new entry apart from its old, dead one.
        _heappush(level.arrivals, (job.arrival, job.seq, id(entry), entry))
        lane.owner.queued += 1
        if not was_backlogged:
            self._backlogged += 1
            level.lanes += 1
            lane.s_log.clear()
            lane.log_s(now)
            if self._fair_share:
                self._note_s(lane)
        if not was_backlogged or requeue:
            self._touch(lane)
        elif job.model is not None and lane.first_for(job.model) is entry:
            # The head and s are unchanged, but the lane may now be eligible for this model.
            self._touch(lane)
        if len(level.arrivals) > 2 * level.queued + 64:
            level.arrivals = [a for a in level.arrivals if a[3].state == QUEUED]
            _heapify(level.arrivals)
        return entry

    def _dequeue(self, entry: _Entry) -> None:
        """Take a queued entry out of its lane's accounting (the deques drop it lazily)."""
        job = entry.job
        lane = entry.lane
        lane.live -= 1
        level = self._levels[job.priority]
        level.queued -= 1
        level.sum_arrival -= job.arrival
        if level.queued == 0:
            level.sum_arrival = 0.0  # no float drift left behind
        lane.owner.queued -= 1
        if lane.live == 0:
            self._backlogged -= 1
            level.lanes -= 1
            lane.jobs.clear()
            lane.by_model.clear()
        self._touch(lane)

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, now: float) -> Grant | None:
        """Grant the resource to the best waiting job, when it is free.

        Args:
            now: The current monotonic time.

        Returns:
            The grant, or None when a job is running or none is queued. A running job past its
            lease keeps the resource until ``expire`` reclaims it.

        Raises:
            ValueError: ``now`` is not finite or goes backwards.
            LeaseError: ``lease_for`` raised or returned no positive finite number of
                seconds; the dispatcher is unchanged and the error names the job.

        Complexity: amortised O(log n + M) (times 4 with ``track_reorders``).
        """
        t = self._tick(now)
        if self._running is not None:
            return None
        self._flush()
        resident = self._resident
        best = self._ranking.best(resident)
        if best is None:
            return None
        lane, entry, aff = best
        job = entry.job
        lease = None if self._lease_for is None else self._lease(job, t)
        aging = (t - lane.s) / self._divisor
        # Positional arguments: band, tier_bonus, swap_affinity, aging (the hot path).
        score = ScoreBreakdown(job.priority, lane.head().job.tier_bonus, aff, aging)
        level = self._levels[job.priority]
        if self._track:
            self._count_reorders(level, job, lane, resident)
        swap = job.model is not None and job.model != resident
        # Positional: job, score, lease, granted_at, attempt, waited, swap.
        grant = Grant(job, score, lease, t, entry.attempt, t - job.arrival, swap)
        self._history.append(DispatchRecord(t, job, score, resident, lane.s))
        # State changes start here; nothing below can fail.
        entry.state = RUNNING
        entry.granted_at = t
        self._dequeue(entry)
        self._running = entry
        self._grant = grant
        if job.model is not None:
            self._resident = job.model
        if swap:
            self._swaps += 1
        wait = t - job.arrival
        level.dispatched += 1
        level.total_wait += wait
        level.buckets[bisect.bisect_left(self._buckets, wait)] += 1
        lane.owner.dispatched += 1
        self._totals["dispatched"] += 1
        self._groups.move(job.id, "running")
        return grant

    def _lease(self, job: Job, t: float) -> Lease:
        """Size the winner's lease; any failure becomes a ``LeaseError`` naming the job."""
        assert self._lease_for is not None
        try:
            seconds = self._lease_for(job)
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

    def _count_reorders(self, level: _Level, job: Job, lane: _Lane, resident: str | None) -> None:
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

    def _finish(self, entry: _Entry, runtime: float, now: float) -> float:
        """Free the resource from a running entry and charge its lane. Returns the charge."""
        job = entry.job
        value = self._charge(job, runtime)
        charge = value if isinstance(value, (int, float)) and not isinstance(value, bool) else -1
        if not 0 <= charge < math.inf:
            raise ValueError(
                f"the charge model returned {value!r} for job {job.id!r}; a charge must be a "
                "finite number of seconds >= 0"
            )
        charge = float(charge)
        lane = entry.lane
        entry.state = GONE
        del self._entries[job.id]
        self._running = None
        self._grant = None
        member = lane.owner
        member.gpu_seconds += charge
        if self._fair_share:
            lane.s = min(lane.s + charge, now)
            if lane.live and self._levels[lane.level].lanes == 1:
                # Alone at its level, the lane is re-anchored at now, exactly as a producer
                # that resubmits one job at a time would be lifted: lag accrued while other
                # levels used the GPU is not fair-share debt, so a bulk backlog cannot outrank
                # higher levels sooner than a one-at-a-time producer would.
                lane.s = now
            if lane.live:
                lane.log_s(now)
                self._note_s(lane)
                self._touch(lane)
        elif not lane.live:
            del self._lanes[job.id]
        self._recent.append((now, runtime, job.model))
        return charge

    def complete(self, job_id: str, *, now: float, runtime: float | None = None) -> Completed:
        """Mark the running job done and free the resource.

        Args:
            job_id: The running job.
            now: The current monotonic time.
            runtime: Seconds it ran (>= 0); None measures ``now - granted_at``.

        Returns:
            The job, its runtime and the charge added to its lane.

        Raises:
            UnknownJob: The id is not queued or running.
            InvalidState: The job is queued, not running.
            LeaseExpired: ``now`` is at or past the job's lease deadline; ``expire`` owns it.
            ValueError: ``now`` or ``runtime`` is out of range.

        Complexity: amortised O(log n + M).
        """
        t = finite("now", now)
        entry = self._entry(job_id)
        if entry.state != RUNNING:
            raise InvalidState(f"job {job_id!r} is queued, not running; cancel() removes it")
        grant = self._grant
        assert grant is not None
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
        self._tick(t)
        charge = self._finish(entry, max(measured, 0.0), t)
        self._groups.move(job_id, "done", used=max(measured, 0.0))
        entry.lane.owner.completed += 1
        self._totals["completed"] += 1
        return Completed(job=entry.job, runtime=measured, charge=charge)

    def cancel(self, job_id: str, *, now: float) -> Job:
        """Remove a queued job, or stop a running one (charged for the time it ran).

        Args:
            job_id: A queued or running job.
            now: The current monotonic time.

        Returns:
            The removed job.

        Raises:
            UnknownJob: The id is not queued or running.
            ValueError: ``now`` is out of range.

        Complexity: amortised O(log n + M).
        """
        t = finite("now", now)
        entry = self._entry(job_id)
        self._tick(t)
        self._remove(entry, t, "cancelled")
        self._totals["cancelled"] += 1
        return entry.job

    def fail(self, job_id: str, *, now: float) -> Job:
        """Remove a job whose work failed: ``cancel``, but counted as failed.

        A worker that reports a failed run calls this instead of ``complete``: a running job
        is charged for the time it ran, as by ``cancel``; ``Stats.failed`` and the job's
        group count it as failed, not cancelled (a ``Chain`` applies its failure policy).

        Args:
            job_id: A queued or running job.
            now: The current monotonic time.

        Returns:
            The removed job.

        Raises:
            UnknownJob: The id is not queued or running.
            ValueError: ``now`` is out of range.

        Complexity: amortised O(log n + M).
        """
        t = finite("now", now)
        entry = self._entry(job_id)
        self._tick(t)
        self._remove(entry, t, "failed")
        self._failed += 1
        return entry.job

    def _remove(self, entry: _Entry, t: float, outcome: Literal["cancelled", "failed"]) -> None:
        """Take a queued or running entry out for good (cancel and fail)."""
        if entry.state == RUNNING:
            used = t - entry.granted_at
            self._finish(entry, used, t)
            self._groups.move(entry.job.id, outcome, used=used)
            return
        entry.state = GONE
        del self._entries[entry.job.id]
        self._dequeue(entry)
        lane = entry.lane
        if not self._fair_share and not lane.live:
            del self._lanes[entry.job.id]
        self._groups.move(entry.job.id, outcome)

    def expire(self, now: float) -> list[Expired]:
        """Reclaim the resource from a job past its lease.

        The job goes back to the head of its lane, keeping the lane's age, or, after
        ``max_attempts`` grants, is reported as failed and forgotten.

        Args:
            now: The current monotonic time.

        Returns:
            The expired jobs (at most one: the resource runs one job at a time).

        Raises:
            ValueError: ``now`` is out of range.

        Complexity: amortised O(log n + M).
        """
        t = self._tick(now)
        entry, grant = self._running, self._grant
        if entry is None or grant is None or grant.lease is None or not grant.lease.expired(t):
            return []
        job = entry.job
        entry.state = GONE
        del self._entries[job.id]
        self._running = None
        self._grant = None
        self._totals["expired"] += 1
        requeued = entry.attempt < self._max_attempts
        held = t - entry.granted_at
        if requeued:
            self._enqueue(job, attempt=entry.attempt + 1, now=t, requeue=True)
            self._groups.move(job.id, "queued", used=held)
        else:
            self._groups.move(job.id, "failed", used=held)
            self._failed += 1
            if not self._fair_share and not entry.lane.live:
                del self._lanes[job.id]
        return [
            Expired(
                job=job, attempt=entry.attempt, deadline=grant.lease.deadline, requeued=requeued
            )
        ]

    # ------------------------------------------------------------------ diagnostics

    def forecast(self, *, now: float, limit: int | None = None) -> list[AheadJob]:
        """Predict the dispatch order of the queued jobs, with estimated starts.

        The prediction replays the dispatcher's rules on its current state (no new arrivals;
        runtimes from estimates or the recent mean; affinity at lane heads only). It is a
        forecast, not a promise.

        Args:
            now: The current monotonic time.
            limit: Predict at most this many jobs (None: all).

        Returns:
            The queued jobs in predicted order.

        Raises:
            ValueError: ``now`` is out of range or ``limit`` is negative.

        Complexity: O(L log L + k log L) for L backlogged lanes and k predicted jobs.
        """
        return _observe.forecast(self, self._tick(now), limit)

    def explain(self, job_id: str, *, now: float) -> Explanation:
        """Explain why a job waits: its score's terms, the jobs ahead, what overtook it.

        Args:
            job_id: A queued or running job.
            now: The current monotonic time.

        Returns:
            The explanation (``str()`` of it reads like ``sprio``).

        Raises:
            UnknownJob: The id is not queued or running.
            ValueError: ``now`` is out of range.

        Complexity: O(L log L + k log L + h) for L lanes, k jobs ahead, h remembered
        dispatches.
        """
        entry = self._entry(job_id)
        return _observe.explain(self, entry, self._tick(now))

    def stats(self, *, now: float) -> Stats:
        """Return a consistent picture of queues, waits, dispatches and reorders.

        Args:
            now: The current monotonic time.

        Returns:
            The statistics (levels highest first).

        Raises:
            ValueError: ``now`` is out of range.

        Complexity: O(levels + members), amortised (the oldest wait per level is kept in a
        heap with lazy deletion).
        """
        t = self._tick(now)
        return attrs.evolve(_observe.stats(self, t), groups=self._groups.active)

    # ------------------------------------------------------------------ groups

    def group_of(self, job_id: str) -> str | None:
        """Return the group of a queued or running job (None when it has none).

        Raises:
            UnknownJob: The id is not queued or running.

        Complexity: O(1).
        """
        self._entry(job_id)
        return self._groups.group_of(job_id)

    def group_status(self, group: str, *, now: float) -> GroupStatus:
        """Return how far a group has got: counts by state, GPU time and a finish forecast.

        Every job ever submitted in the group is counted once, in the state it is in now.
        The forecast is the same dry run as ``forecast()``: exact when the estimates are and
        nothing else arrives.

        Args:
            group: The group's label.
            now: The current monotonic time.

        Returns:
            The group's status.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: ``group`` is not a non-empty str, or ``now`` is out of range.

        Complexity: O(1) when nothing of the group is queued or running, else that of
        ``forecast()``.
        """
        group = checked_group(group)
        live = self._groups.live(group)
        t = self._tick(now)
        finish = forecast_finish(self, t, [job_id for job_id, _ in live])
        return self._groups.status(group, now=t, finish=finish)

    def cancel_group(self, group: str, *, now: float, running: CancelRunning = "keep") -> list[Job]:
        """Cancel every queued job of a group (and its running one, if asked).

        Jobs of other groups and members are untouched. The group stays known: its
        ``group_status`` counts the cancelled jobs.

        Args:
            group: The group's label.
            now: The current monotonic time.
            running: ``"keep"`` lets a running job of the group finish (complete it as
                usual); ``"cancel"`` stops it too, charged for the time it ran.

        Returns:
            The cancelled jobs, oldest submission first.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: ``group`` or ``running`` is invalid, or ``now`` is out of range.

        Complexity: O(k (log n + M)) for the k cancelled jobs.
        """
        group = checked_group(group)
        mode = checked_running(running)
        live = self._groups.live(group)
        t = self._tick(now)
        cancelled = []
        for job_id, state in live:
            if state == "running" and mode == "keep":
                continue
            cancelled.append(self.cancel(job_id, now=t))
        return cancelled

    def forget_group(self, group: str) -> None:
        """Drop a finished group's counts (groups are kept until then, like members).

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: A job of the group is still queued or running.

        Complexity: O(1).
        """
        self._groups.forget(checked_group(group))

    # ------------------------------------------------------------------ persistence

    def snapshot(self, *, now: float) -> dict[str, Any]:
        """Return the dispatcher's state as JSON-serialisable data, for ``restore``.

        It holds every queued job (in lane order), each lane's virtual start, the running job
        with its lease, and the resident model. Counters behind ``stats`` and the dispatch
        history are not kept: they restart at zero.

        Args:
            now: The current monotonic time (stored as ``taken_at``).

        Returns:
            A dict of plain JSON types.

        Raises:
            TypeError: A job's payload is not JSON-serialisable (the message names the job).
            ValueError: ``now`` is out of range.

        Complexity: O(n) in the queued jobs.
        """
        state = _persist.dump(self, self._tick(now))
        state["groups"] = self._groups.dump()
        return state

    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any],
        *,
        scorer: Scorer | None = None,
        now: float | None = None,
        **options: Any,
    ) -> SizeOneDispatcher:
        """Rebuild a dispatcher from ``snapshot()`` data: no queued job, lane age or lease lost.

        Args:
            state: What ``snapshot`` returned (possibly through JSON).
            scorer: The scorer of the new dispatcher (its tiers must know every job's tier).
            now: The new process's monotonic time. When given, every stored time is shifted by
                ``now - taken_at``, so waits, lane ages and the lease resume where they
                stopped (the downtime does not count). When None, times are kept as they are
                (same clock).
            **options: The constructor's other keyword arguments (``fair_share`` defaults to
                the snapshot's).

        Returns:
            The restored dispatcher.

        Raises:
            ValueError: ``state`` is not a valid snapshot (the message says what is wrong), or
                a job's tier is unknown to ``scorer``.

        Complexity: O(n log n) in the jobs.
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"invalid snapshot: expected a mapping, got {type(state).__name__}")
        try:
            options.setdefault("fair_share", bool(state["fair_share"]))
        except KeyError as exc:
            raise ValueError(f"invalid snapshot: missing {exc}") from None
        # The constructor's own errors (ConfigError, TypeError) are not the snapshot's fault.
        dispatcher = cls(scorer, **options)
        _persist.load(dispatcher, state, now)
        try:
            dispatcher._groups.load(state.get("groups"), dispatcher._state_or_none)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"invalid snapshot: groups: {exc}") from None
        return dispatcher

    def _state_or_none(self, job_id: str) -> str | None:
        entry = self._entries.get(job_id)
        if entry is None:
            return None
        return "running" if entry.state == RUNNING else "queued"

    # ------------------------------------------------------------------ invariants

    def _check(self) -> None:
        """Assert every internal invariant (for tests; O(n))."""
        queued = [e for e in self._entries.values() if e.state == QUEUED]
        running = [e for e in self._entries.values() if e.state == RUNNING]
        assert len(running) <= 1
        assert (running[0] if running else None) is self._running
        assert (self._grant is None) == (self._running is None)
        assert len(queued) == len(self)
        assert all(e.state in (QUEUED, RUNNING) for e in self._entries.values())
        backlogged = 0
        for lane in self._lanes.values():
            live = [e for e in lane.jobs if e.state == QUEUED]
            assert len(live) == lane.live, (lane.member, lane.level)
            assert all(self._entries.get(e.job.id) is e for e in live)
            for model, fifo in lane.by_model.items():
                assert [e for e in fifo if e.state == QUEUED] == [
                    e for e in live if e.job.model == model
                ]
            backlogged += lane.live > 0
            if self._fair_share and lane.live:
                assert lane.s <= self._now
        assert backlogged == self._backlogged
        assert sum(level.queued for level in self._levels.values()) == len(queued)
        assert sum(m.queued for m in self._members.values()) == len(queued)
        for entry in queued:
            assert entry.lane.live > 0
        self._groups._check(self._state_or_none)
