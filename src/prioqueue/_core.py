"""The shared state of both dispatchers: jobs, lanes, rankings, levels and members (private).

Theory of operation (the model is docs/design/dispatcher.md and docs/design/fleet.md):

* ``_Core`` owns the queue side: ``submit`` files a job in its lane (one per member and level),
  lifting the lane's virtual start ``s`` when it becomes backlogged; rankings (lazy heaps, see
  ``_lanes``) order the backlogged lanes; per-level and per-member bookkeeping feeds ``stats``.
* The grant side (workers, pops, charges, leases, take-backs) is ``_engine._Engine``; the
  public classes are ``FleetDispatcher`` and ``SizeOneDispatcher``.
* Sans-IO: every time-dependent call takes ``now`` (monotonic seconds, never going backwards,
  within ``+-1e15``).
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
from heapq import heapreplace as _heapreplace
from typing import Any, Literal

from prioqueue import _lanes, _lifecycle
from prioqueue._errors import ChargeError, ConfigError, DuplicateJob, QueueFull, UnknownJob
from prioqueue._groups import GroupBook, checked_group
from prioqueue._journaled import journaled
from prioqueue._lanes import QUEUED, RUNNING, _BonusCache, _Entry, _Lane, _Ranking
from prioqueue._validate import (
    TIME_LIMIT,
    charge_function,
    checked_name,
    finite,
    limit,
    positive_or_none,
)
from prioqueue._workers import LeaseFunction, _Worker, lease_function
from prioqueue.lifecycle import NO_BACKOFF, Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Expired, Job, JobState, Ticket
from prioqueue.scoring import Scorer

__all__: list[str] = []  # private module

#: Upper bounds (seconds) of the grant-wait histogram in ``Stats``; the last bucket is +inf.
DEFAULT_WAIT_BUCKETS: tuple[float, ...] = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
)  # fmt: skip

#: ``QueueFull.retry_after`` when no completion has been seen yet (seconds).
DEFAULT_RETRY_AFTER = 30.0

#: The expected runtime of a job with no estimate and no recent runtime of its model or level.
DEFAULT_EXPECTED_RUNTIME = 60.0

#: The default byte budget of the dispatch history kept for ``explain``.
DEFAULT_HISTORY_BYTES = 4 * 1024 * 1024

#: The largest magnitude of a priority level (after the policy's clamp).
LEVEL_LIMIT = 10**9

#: The default share of GPU time that crossings (grants that aging carries across a band)
#: may take from a higher level while it has work waiting (chosen by the simulator's sweep;
#: see docs/design/dispatcher.md, "Bounded crossings").
DEFAULT_CROSSING_SHARE = 0.05

#: The index of the deferred-crossing count in a level's ``reorders`` list.
DEFERRED = 4

#: How a finished job advances its lane's virtual start.
ChargeModel = Literal["runtime", "estimate"] | float | Callable[[Job, float], float]

_RECENT = 64  # completions kept for the service rate and the forecasts
_RECENT_PER_KEY = 8  # runtimes kept per model and per level for the expected charge


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
        # aging, affinity, tier, fair share, and crossings deferred (counted at the level of
        # the job that would have crossed)
        self.reorders = [0, 0, 0, 0, 0]
        self.buckets = [0] * (buckets + 1)
        # Heaps with lazy deletion: (arrival, seq, attempt, entry) of queued entries, and
        # (s, ident, lane) of backlogged lanes (for the lift's minimum).
        self.arrivals: list[tuple[float, int, int, _Entry]] = []
        self.backlog: list[tuple[float, int, _Lane]] = []


class _Member:
    __slots__ = ("completed", "dispatched", "gpu_seconds", "queued", "running")

    def __init__(self) -> None:
        self.queued = 0
        self.running = 0
        self.dispatched = 0
        self.completed = 0
        self.gpu_seconds = 0.0


class _Core:
    """Queue state shared by ``SizeOneDispatcher`` and ``FleetDispatcher`` (private).

    The constructor's arguments are documented on ``FleetDispatcher``.
    """

    def __init__(
        self,
        scorer: Scorer | None = None,
        *,
        policy: PriorityPolicy | None = None,
        charge: ChargeModel = "runtime",
        lease_for: object = None,
        max_queued: int | None = None,
        max_queued_per_member: int | None = None,
        max_running_per_member: int | None = None,
        max_attempts: int = 3,
        worker_timeout: float | None = None,
        warm_hold: float = 0.0,
        fair_share: bool = True,
        track_reorders: bool = True,
        crossing_share: float = DEFAULT_CROSSING_SHARE,
        history: int = 10_000,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
        budgets: Mapping[int, LevelBudget] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        scorer = Scorer() if scorer is None else scorer
        if not isinstance(scorer, Scorer):
            raise TypeError(f"scorer must be a Scorer, got {type(scorer).__name__}")
        policy = PriorityPolicy() if policy is None else policy
        if not isinstance(policy, PriorityPolicy):
            raise TypeError(f"policy must be a PriorityPolicy, got {type(policy).__name__}")
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if not isinstance(history, int) or isinstance(history, bool) or history < 0:
            raise ConfigError(f"history must be an int >= 0, got {history!r}")
        if (
            not isinstance(history_bytes, int)
            or isinstance(history_bytes, bool)
            or history_bytes < 0
        ):
            raise ConfigError(f"history_bytes must be an int >= 0, got {history_bytes!r}")
        try:
            bounds = tuple(finite("wait_buckets", b) for b in wait_buckets)
        except (TypeError, ValueError):
            bounds = ()
        if not bounds or bounds[0] <= 0 or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ConfigError(
                f"wait_buckets must be finite positive bounds in increasing order, "
                f"got {wait_buckets!r}"
            )
        try:
            timeout = positive_or_none("worker_timeout", worker_timeout)
            hold = finite("warm_hold", warm_hold)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if hold < 0:
            raise ConfigError(f"warm_hold must be a number of seconds >= 0, got {warm_hold!r}")
        share = (
            crossing_share
            if isinstance(crossing_share, (int, float)) and not isinstance(crossing_share, bool)
            else math.nan
        )
        if not 0 < share <= 1:
            raise ConfigError(
                f"crossing_share must be a number in (0, 1] (1: crossings are never deferred), "
                f"got {crossing_share!r}"
            )
        self._scorer = scorer
        self._policy = policy
        self._charge = charge_function(charge)
        # The default model needs no check: expected and measured runtimes are finite, >= 0.
        self._plain_charge = isinstance(charge, str) and charge == "runtime"
        self._lease_for: LeaseFunction | None = lease_function(lease_for)
        self._max_queued = limit("max_queued", max_queued)
        self._max_member = limit("max_queued_per_member", max_queued_per_member)
        self._max_running = limit("max_running_per_member", max_running_per_member)
        self._max_attempts = max_attempts
        self._worker_timeout = timeout
        self._warm_hold = hold
        self._fair_share = bool(fair_share)
        self._track = bool(track_reorders)
        # Bounded crossings: the share, and the credit (GPU-seconds) that deferred crossings
        # earn at ``share`` and granted crossings spend at ``1 - share``.
        self._share = float(share)
        self._credit = 0.0
        # Held entries whose grant moved the credit: (weight, expected runtime). A dict, not a
        # slot on every entry: most grants cross nothing.
        self._crossings: dict[_Entry, tuple[float, float]] = {}
        self._buckets = bounds
        config = scorer.config
        d = config.aging_divisor
        self._divisor = d
        window = config.max_affinity * d
        self._window = window
        affinity = _BonusCache(scorer.affinity).__getitem__
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
        self._level_order: list[int] = []  # every level ever used, highest first
        self._members: dict[str, _Member] = {}
        self._backlogged = 0
        self._held = 0  # entries held by workers
        # (deadline, seq, id(entry), entry) of held entries with a lease (lazy deletion).
        self._deadlines: list[tuple[float, int, int, _Entry]] = []
        self._workers: dict[str, _Worker] = {}
        self._live = 0  # workers joined and not timed out
        self._residents: dict[str, int] = {}  # resident model -> live workers with it
        self._seq = 0
        self._now = -TIME_LIMIT
        self._recent: deque[tuple[float, float, str | None]] = deque(maxlen=_RECENT)
        self._recent_model: dict[str, deque[float]] = {}
        self._recent_level: dict[int, deque[float]] = {}
        self._history_limit = history
        self._history_bytes = history_bytes
        self._history: deque[Any] = deque()
        self._history_size = 0
        self._dispatches = 0  # grants so far (the history's record numbers)
        self._totals = {"dispatched": 0, "completed": 0, "cancelled": 0, "expired": 0, "failed": 0}
        self._swaps = 0
        self._groups = GroupBook()
        # The job lifecycle (docs/design/lifecycle.md; the timers are ``_lifecycle``).
        self._budgets = _checked_budgets(budgets)
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigError(f"backoff must be a Backoff or None, got {backoff!r}")
        self._backoff = NO_BACKOFF if backoff is None else backoff
        self._timers: list[tuple[float, int, int, int, _Entry]] = []
        self._timer_count = 0
        self._next_timer = math.inf  # the earliest timer (maybe stale): _tick's one comparison
        self._parked: dict[int, int] = {}  # level -> delayed jobs
        self._lapsed: list[Expired] = []  # Expired(cause="ttl") not yet reported by expire()
        self._level_life: dict[int, list[int]] = {}  # level -> [ttl expired, refused]
        self._totals.update(ttl_expired=0, refused=0, retried=0)

    _name_in_grants = True  # SizeOneDispatcher's grants (and snapshots) carry no worker

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
    def fair_share(self) -> bool:
        """Whether lanes are per member (True) or per job (False)."""
        return self._fair_share

    def __len__(self) -> int:
        """Return the number of queued jobs (held ones excluded). O(1)."""
        return len(self._entries) - self._held

    def __contains__(self, job_id: object) -> bool:
        """Return whether the job is queued or held by a worker. O(1)."""
        return job_id in self._entries

    def job(self, job_id: str) -> Job:
        """Return a queued or running job.

        Raises:
            UnknownJob: The id is not queued or running.
        """
        return self._entry(job_id).job

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"`` (held by a worker, prefetched included).

        Raises:
            UnknownJob: The id is not queued or running.
        """
        return "running" if self._entry(job_id).state == RUNNING else "queued"

    # ------------------------------------------------------------------ helpers

    def _tick(self, now: object) -> float:
        if now.__class__ is float and self._now <= now <= TIME_LIMIT:  # type: ignore[operator,unused-ignore]
            self._now = now  # type: ignore[assignment,unused-ignore]
            return now  # type: ignore[return-value,unused-ignore]
        t = finite("now", now)
        if t < self._now:
            raise ValueError(
                f"now ({t!r}) is earlier than a time already seen ({self._now!r}); "
                "pass monotonic seconds"
            )
        self._now = t
        return t

    def _fire(self, now: object) -> None:
        """Fire the lifecycle's timers due at ``now`` (docs/design/lifecycle.md).

        The first thing every call taking ``now`` does, before any check but ``now``'s own (a
        bad ``now`` fires nothing): where a timer fires never depends on what the call then
        does. O(1) when nothing is due.
        """
        if (
            (now.__class__ is float or now.__class__ is int)
            and self._next_timer <= now <= TIME_LIMIT  # type: ignore[operator,unused-ignore]
            and now >= self._now  # type: ignore[operator,unused-ignore]
        ):
            _lifecycle.fire(self, float(now))  # type: ignore[arg-type,unused-ignore]

    def not_before(self, job_id: str) -> float | None:
        """When a delayed job becomes eligible, or None for a job that is eligible or held.

        A delayed job is one submitted with a future ``not_before``, or a retry waiting out
        its backoff (``fail(retry=True)``); ``state`` says ``"queued"`` for it.

        Raises:
            UnknownJob: The id is not queued, delayed or running.

        Complexity: O(1).
        """
        entry = self._entry(job_id)
        return entry.queued_at if entry.state == _lifecycle.PARKED else None

    def _entry(self, job_id: object) -> _Entry:
        entry = self._entries.get(job_id) if isinstance(job_id, str) else None
        if entry is None:
            raise UnknownJob(f"job {job_id!r} is not queued or running")
        return entry

    def _level(self, level: int) -> _Level:
        stats = self._levels.get(level)
        if stats is None:
            stats = self._levels[level] = _Level(len(self._buckets))
            order = self._level_order
            order.insert(bisect.bisect_left(order, -level, key=lambda x: -x), level)
        return stats

    def _top_level(self) -> int | None:
        """The highest level with a backlogged lane, or None. O(levels above it)."""
        levels = self._levels
        for number in self._level_order:
            if levels[number].lanes:
                return number
        return None

    def _member(self, member: str) -> _Member:
        stats = self._members.get(member)
        if stats is None:
            stats = self._members[member] = _Member()
        return stats

    def _touch(self, lane: _Lane) -> None:
        """Mark a lane for re-ranking after any change of its head, candidates or ``s``.

        Its old heap items go stale at once (the version changes); fresh ones are pushed by
        ``_flush`` just before the next ranking query, so a lane changed twice between two
        grants is re-ranked once.
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

    def _set_resident(self, worker: _Worker, model: str | None) -> None:
        if worker.resident == model:
            return
        if not worker.timed_out:
            self._drop_resident(worker)
        worker.resident = model
        if not worker.timed_out and model is not None:
            self._residents[model] = self._residents.get(model, 0) + 1

    def _drop_resident(self, worker: _Worker) -> None:
        old = worker.resident
        if old is not None:
            left = self._residents[old] - 1
            if left:
                self._residents[old] = left
            else:
                del self._residents[old]

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
        created first) sets the floor: the newcomer starts level with it, later by the seconds
        its bounded offsets (tier bonus, and affinity for a model resident on a live worker)
        exceed that lane's, so offsets alone can never carry a newcomer past the lane that has
        waited longest. ``inf`` when no lane is backlogged. O(log n + R) for R resident models.
        """
        backlog = level.backlog
        while backlog:
            s, ident, lane = backlog[0]
            if lane.live and s < lane.s:
                # A grant raised s (up-front charge) without re-filing the lane: do it now.
                # (Every decrease of s re-files the lane at once, so no item is ever above.)
                _heapreplace(backlog, (lane.s, ident, lane))
                continue
            if s == lane.s and lane.live:
                residents = self._residents
                affinity = self._affinity
                mine = job.tier_bonus
                if job.model is not None and job.model in residents:
                    mine += affinity(job.model)
                theirs = lane.head().job.tier_bonus
                best = 0.0
                for resident in residents:
                    bonus = affinity(resident)
                    if bonus > best and self._ranking.candidate(lane, resident) is not None:
                        best = bonus
                theirs += best
                return s + max(0.0, mine - theirs) * self._divisor
            _heappop(backlog)
        return math.inf

    def _new_lane(self, member: str, level: int, s: float) -> _Lane:
        """Make a lane (the caller files it under its key) with its member's statistics."""
        self._idents += 1
        lane = _Lane(member, level, s, self._idents)
        # Versions unique across lanes: a job's lane dropped and made again (a retry without
        # fair share) has heap items equal to the old lane's but for the version.
        lane.version = self._idents << 32
        lane.owner = self._member(member)
        self._level(level)
        return lane

    def _note_s(self, lane: _Lane) -> None:
        """Record a backlogged lane's current ``s`` for the lift's minimum (fair share only)."""
        level = self._levels[lane.level]
        _heappush(level.backlog, (lane.s, lane.ident, lane))
        if len(level.backlog) > 2 * self._backlogged + 64:
            current = {item[2].ident: item for item in level.backlog if item[2].live}
            level.backlog = [(lane.s, key, lane) for key, (_, _, lane) in current.items()]
            _heapify(level.backlog)

    # ------------------------------------------------------------------ submit

    @journaled
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
        ceiling: int | None = None,
        now: float,
        ttl: float | None = None,
        not_before: float | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | Mapping[str, Any] | None = None,
    ) -> Ticket:
        """Queue a job.

        Args:
            job_id: A non-empty id, unique among the queued and running jobs.
            member: Who the job belongs to (fair share is per member inside a level).
            priority: The priority number, an alias (``"interactive"``) or a raw header value;
                resolved and clamped by the policy (unparseable means the policy's default).
                The result must lie within ``+-10**9``.
            tier: The member's tier name, one of the scorer's tiers.
            model: The model the job needs loaded, or None.
            estimate: Expected runtime in seconds (> 0), or None.
            payload: An opaque value kept with the job (e.g. for ``lease_for``); it must be
                JSON-serialisable for ``snapshot``.
            group: A label shared by jobs that belong together (a film's shots), for
                ``group_status`` and ``cancel_group``; it changes no score and no lane.
            ceiling: The caller's priority ceiling (an operator's cap on this identity), or
                None. Applied after the policy's range, as in ``PriorityPolicy.parse``: a
                ceiling below the policy's ``minimum`` is kept (the minimum bounds what a
                caller asks for, not what an operator imposes).
            now: The current monotonic time.
            ttl: Seconds (> 0) the job may stay queued once eligible; past it the job leaves
                as expired (``expire`` reports it with ``cause="ttl"``). None: the level's
                ``LevelBudget.ttl``, else no limit.
            not_before: A time (same clock as ``now``) before which the job is not eligible:
                it is delayed, in no lane, and enters its lane at that time as a submit then
                would. None or a time not after ``now``: eligible now.
            max_attempts: Grants the job may get (an int >= 1; None: the dispatcher's), used by
                lease expiries and by ``fail(retry=True)`` alike.
            backoff: The job's retry delays, a ``Backoff`` or its JSON form (``as_dict()``;
                a journal keeps calls as JSON); None: the dispatcher's ``backoff``.

        Returns:
            The ticket: the job as stored and the queue depth after it.

        Raises:
            DuplicateJob: A job with this id is queued or running.
            QueueFull: ``max_queued``, ``max_queued_per_member`` or the level's
                ``LevelBudget.max_queued`` is reached; the exception's ``retry_after``
                estimates when a retry may succeed from the recent service rate.
            Overloaded: The forecast wait is over the level's ``LevelBudget.max_wait`` (a
                ``QueueFull`` with ``scope="wait"``).
            ValueError: An argument is out of range (unknown tier, non-finite time, a priority
                beyond ``+-10**9``, ...).
            TypeError: ``priority`` has a type no header could have, or ``ceiling`` is not
                an int (bools are refused).

        Complexity: amortised O(log n + M).
        """
        self._fire(now)
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty str, got {job_id!r}")
        member = checked_name("member", member)
        level = self._policy.parse(priority, ceiling)
        if not -LEVEL_LIMIT <= level <= LEVEL_LIMIT:
            shown = str(level) if len(str(level)) <= 30 else f"{str(level)[:27]}..."
            raise ValueError(
                f"priority must resolve to a level within +-{LEVEL_LIMIT}, got {shown} "
                "(bound it with PriorityPolicy(minimum=..., maximum=...))"
            )
        tier_bonus = self._scorer.tier_bonus(tier)
        if model is not None:
            model = checked_name("model", model)
        estimate = positive_or_none("estimate", estimate)
        if group is not None:
            group = checked_group(group)
        ttl = positive_or_none("ttl", ttl)
        if not_before is not None:
            not_before = finite("not_before", not_before)
        if max_attempts is not None and (
            not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1
        ):
            raise ValueError(f"max_attempts must be an int >= 1 or None, got {max_attempts!r}")
        if isinstance(backoff, Mapping):  # JSON data (a journal keeps calls as JSON)
            backoff = Backoff.from_mapping(backoff)
        elif backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(f"backoff must be a Backoff or None, got {type(backoff).__name__}")
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
        delayed = not_before is not None and not_before > t
        if self._budgets:
            budget = self._budgets.get(level)
            if budget is not None:
                _lifecycle.check_budget(self, level, delayed)
                if ttl is None:
                    ttl = budget.ttl
        member_stats = self._member(member)
        if self._max_member is not None and member_stats.queued >= self._max_member:
            raise QueueFull(
                f"member {member!r} has {member_stats.queued} jobs queued, its limit "
                f"(max_queued_per_member={self._max_member})",
                retry_after=self._retry_after(),
                limit=self._max_member,
                scope="member",
            )
        eligible = not_before if delayed and not_before is not None else t
        self._seq += 1
        job = Job(
            id=job_id,
            member=member,
            priority=level,
            tier=tier,
            tier_bonus=tier_bonus,
            model=model,
            estimate=estimate,
            arrival=eligible,
            seq=self._seq,
            payload=payload,
            deadline=None if ttl is None else eligible + ttl,
            not_before=not_before if delayed else None,
            max_attempts=max_attempts,
            backoff=backoff,
        )
        if delayed:
            _lifecycle.park(self, job, 1, eligible)
        else:
            self._enqueue(job, attempt=1, now=t, requeue=False)
        if group is not None:
            self._groups.add(job_id, group, member)
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
        entry = _Entry(job, lane, attempt, now if requeue else job.arrival, self._dispatches)
        self._entries[job.id] = entry
        if job.deadline is not None:
            _lifecycle.push(self, job.deadline, _lifecycle.LAPSE, entry)
        was_backlogged = lane.live > 0
        if not was_backlogged and self._fair_share and not requeue and lift:
            lane.settled = max(lane.settled, min(now, self._lift_floor(level, job)))
            lane.set_s()
        if requeue:
            lane.appendleft(entry)
        else:
            lane.append(entry)
        level.queued += 1
        level.sum_arrival += job.arrival
        # The attempt keeps a requeued job's new entry apart from its old, dead one (and, a
        # small int, costs no allocation).
        _heappush(level.arrivals, (job.arrival, job.seq, attempt, entry))
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
        elif lane.first_for(job.model) is entry:
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

    def _expected_runtime(self, job: Job) -> float:
        """The job's expected runtime: its estimate, else a recent mean, else the default.

        The recent mean is that of the last 8 runtimes of its model, else of its level. O(8).
        """
        if job.estimate is not None:
            return job.estimate
        if job.model is not None:
            recent = self._recent_model.get(job.model)
            if recent:
                return sum(recent) / len(recent)
        recent = self._recent_level.get(job.priority)
        if recent:
            return sum(recent) / len(recent)
        return DEFAULT_EXPECTED_RUNTIME

    def _checked_charge(self, job: Job, runtime: float, what: str) -> float:
        """The charge model's value, checked: finite and ``>= 0``, else ``ChargeError``."""
        value = self._charge(job, runtime)
        charge = value if isinstance(value, (int, float)) and not isinstance(value, bool) else -1
        if not 0 <= charge < math.inf:
            raise ChargeError(
                f"the charge model returned {value!r} for job {job.id!r} ({what}); a charge "
                "must be a finite number of seconds >= 0; nothing changed",
                job_id=job.id,
            )
        return float(charge)


def _checked_budgets(budgets: object) -> dict[int, LevelBudget]:
    """The per-level budgets as a dict; ``ConfigError`` naming the level that is wrong."""
    if budgets is None:
        return {}
    if not isinstance(budgets, Mapping):
        raise ConfigError(f"budgets must be a mapping level -> LevelBudget, got {budgets!r}")
    checked: dict[int, LevelBudget] = {}
    for level, budget in budgets.items():
        if not isinstance(level, int) or isinstance(level, bool):
            raise ConfigError(f"budgets: a level must be an int, got {level!r}")
        if not isinstance(budget, LevelBudget):
            raise ConfigError(f"budgets[{level}] must be a LevelBudget, got {budget!r}")
        if not budget.empty:
            checked[level] = budget
    return checked
